/* SPDX-License-Identifier: Apache-2.0 */
/* config.h - the table of every tunable, readable by applications. */
#ifndef TPIPE_CONFIG_H
#define TPIPE_CONFIG_H

#include <stddef.h>
#include <tpipe/export.h>
#include <tpipe/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/** tp_config_item - one tunable, as printed by `tpipe info --config`. */
typedef struct tp_config_item {
    const char *name;   /* "io_backend" */
    const char *env;    /* "TP_IO_BACKEND" */
    const char *def;    /* default, as text */
    const char *doc;    /* one line */
    const char *value;  /* effective value (environment applied) */
    const char *source; /* "default" or "env" */
} tp_config_item;

typedef void (*tp_config_visit_fn)(const tp_config_item *item, void *arg);

/**
 * tp_config_visit - call @fn once per tunable, in table order, with its
 * effective value from the environment. Returns TP_EINVAL (and @err_p)
 * when an environment value is malformed; @fn is still called for every
 * item, with the bad value shown.
 */
TP_API tp_status tp_config_visit(tp_config_visit_fn fn, void *arg,
                                 tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
