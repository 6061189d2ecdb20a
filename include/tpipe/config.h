/* SPDX-License-Identifier: Apache-2.0 */
/* config.h - the tunables of every component, readable by applications. */
#ifndef TPIPE_CONFIG_H
#define TPIPE_CONFIG_H

#include <stddef.h>
#include <tpipe/export.h>
#include <tpipe/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/** tp_config_item - one tunable, as printed by `tpipe info --config`.
 * Every string is borrowed for the duration of the callback. */
typedef struct tp_config_item {
    const char *name;   /* "io_backend" */
    const char *env;    /* "TP_IO_BACKEND" */
    const char *def;    /* default, as text */
    const char *doc;    /* one line */
    const char *value;  /* effective value (environment applied) */
    const char *source; /* "default" or "env" */
    /* Added after the fields above: the component that declares it
     * ("core", "tcp", "pipe", "agent") and what it accepts ("auto|epoll|
     * uring", "64K..1G bytes, a power of two"). */
    const char *component;
    const char *accepted;
} tp_config_item;

typedef void (*tp_config_visit_fn)(const tp_config_item *item, void *arg);

/**
 * tp_config_visit - call @fn once per tunable of every component (core
 * first, then the transports, channels, pipe, store, agent, collectives),
 * in table order, with its effective value from the environment. Returns
 * TP_EINVAL (and @err_p) when an environment value is malformed; @fn is
 * still called for every item, with the bad value shown. Variables that
 * their component reads itself at another time (TP_INIT_METHOD,
 * TP_TRANSPORTS, TP_FAULT, the RPC agent's options) are listed with their
 * raw value and checked by that component, not here.
 */
TP_API tp_status tp_config_visit(tp_config_visit_fn fn, void *arg,
                                 tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
