// SPDX-License-Identifier: Apache-2.0
// introspect.c - the public lists of include/tpipe/info.h: transports and
// channels from their registries, loop backends from the loop's probe.
// The pipe layer is the lowest one that sees both registries.

#include <stdio.h>
#include <string.h>
#include <tpipe/info.h>

#include "channel/channel.h"
#include "core/config.h"
#include "core/error.h"
#include "core/loop.h"
#include "transport/transport.h"

static tp_status
info_check(const char *fn, tp_backend_info *out, size_t cap, size_t *n_p,
           tp_error **err_p)
{
    if (n_p == NULL || (out == NULL && cap > 0)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: n_p is NULL, or out is NULL with cap > 0",
                             fn);
    }
    return TP_OK;
}

// The environment's tunables; a malformed value keeps its default (the
// caller hears of it from tp_config_visit).
static void
info_config(tp_config *cfg)
{
    tp_error *err = NULL;
    (void)tp__config_load(cfg, &err);
    tp_error_unref(err);
}

static void
info_entry(tp_backend_info *e, const char *name, unsigned priority)
{
    memset(e, 0, sizeof(*e));
    e->name = name;
    e->priority = priority;
}

// Creates the transport of @e on @loop to read its domain, then listens on
// its default address to read that.
static void
info_probe_transport(tp_backend_info *e, tp_loop *loop, const tp_config *cfg)
{
    tp_transport *t = NULL;
    tp_error *err = NULL;
    if (tp__transport_create(e->name, loop, cfg, &t, &err) != TP_OK) {
        snprintf(e->error, sizeof(e->error), "%s", tp_error_message(err));
        tp_error_unref(err);
        return;
    }
    snprintf(e->domain, sizeof(e->domain), "%s", tp__transport_domain(t));
    tp_listener *l = NULL;
    if (tp__transport_listen(t, NULL, &l, &err) != TP_OK) {
        snprintf(e->error, sizeof(e->error), "%s", tp_error_message(err));
        tp_error_unref(err);
    } else {
        snprintf(e->listen_addr, sizeof(e->listen_addr), "%s",
                 tp__listener_addr(l));
        tp__listener_destroy(l);
    }
    tp__transport_destroy(t);
}

tp_status
tp_info_transports(unsigned flags, tp_backend_info *out, size_t cap,
                   size_t *n_p, tp_error **err_p)
{
    tp_status st = info_check("tp_info_transports", out, cap, n_p, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_config cfg;
    info_config(&cfg);
    size_t n = 0;
    const tp_transport_ops *const *reg = tp__transport_registry(&n);
    *n_p = n;
    if (cap > n) {
        cap = n;
    }
    bool any = false;
    for (size_t i = 0; i < cap; i++) {
        tp_backend_info *e = &out[i];
        info_entry(e, reg[i]->name, (unsigned)i);
        e->viable = reg[i]->is_viable(&cfg, e->reason, sizeof(e->reason));
        e->same_host = (reg[i]->props & TP_TRANSPORT_PROP_SAME_HOST) != 0;
        if (e->viable) {
            e->reason[0] = '\0';
            any = true;
        }
    }
    if ((flags & TP_INFO_PROBE) == 0 || !any) {
        return TP_OK;
    }
    // One loop with the configured backend, shared by the probes.
    tp_loop *loop = NULL;
    tp_error *err = NULL;
    if (tp__loop_create(&cfg, "info", &loop, &err) != TP_OK) {
        for (size_t i = 0; i < cap; i++) {
            if (out[i].viable) {
                snprintf(out[i].error, sizeof(out[i].error),
                         "could not start a loop: %s", tp_error_message(err));
            }
        }
        tp_error_unref(err);
        return TP_OK;
    }
    for (size_t i = 0; i < cap; i++) {
        if (out[i].viable) {
            info_probe_transport(&out[i], loop, &cfg);
        }
    }
    tp__loop_destroy(loop);
    return TP_OK;
}

tp_status
tp_info_channels(unsigned flags, tp_backend_info *out, size_t cap, size_t *n_p,
                 tp_error **err_p)
{
    (void)flags;
    tp_status st = info_check("tp_info_channels", out, cap, n_p, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_config cfg;
    info_config(&cfg);
    size_t n = 0;
    const tp_channel_ops *const *reg = tp__channel_registry(&n);
    *n_p = n;
    if (cap > n) {
        cap = n;
    }
    for (size_t i = 0; i < cap; i++) {
        tp_backend_info *e = &out[i];
        info_entry(e, reg[i]->name, (unsigned)i);
        e->viable = reg[i]->is_viable(&cfg, e->reason, sizeof(e->reason));
        e->device_channel = !(reg[i]->devices & TP_CHAN_DEV_CPU_CPU);
        if (e->viable) {
            e->reason[0] = '\0';
        }
    }
    return TP_OK;
}

tp_status
tp_info_io_backends(unsigned flags, tp_backend_info *out, size_t cap,
                    size_t *n_p, tp_error **err_p)
{
    (void)flags;
    tp_status st = info_check("tp_info_io_backends", out, cap, n_p, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_config cfg;
    info_config(&cfg);
    *n_p = 2;
    char why[TP_INFO_TEXT_MAX] = "";
    bool uring = tp__loop_uring_viable(why, sizeof(why));
    bool want_uring = cfg.io_backend == TP_IO_BACKEND_URING ||
                      (cfg.io_backend == TP_IO_BACKEND_AUTO && uring);
    // Best first: uring, then epoll (always there).
    if (cap > 0) {
        info_entry(&out[0], "uring", 0);
        out[0].viable = uring;
        out[0].selected = want_uring && uring;
        if (!uring) {
            snprintf(out[0].reason, sizeof(out[0].reason), "%s", why);
        }
    }
    if (cap > 1) {
        info_entry(&out[1], "epoll", 1);
        out[1].viable = true;
        out[1].selected = !want_uring;
    }
    return TP_OK;
}
