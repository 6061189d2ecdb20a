// SPDX-License-Identifier: Apache-2.0
// calls_api.c - the public entry points of calls: workers by name,
// tp_rpc_async/sync (by name and by rank), tp_rpc_wait and tp__agent_wait.

#include <string.h>

#include "ag_impl.h"
#include "core/config.h"

ag_peer *
tp__ag_peer_by_name(tp_agent *a, const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (int i = 0; i < a->a_world; i++) {
        if (strcmp(a->a_peers[i].p_info.name, name) == 0) {
            return &a->a_peers[i];
        }
    }
    return NULL;
}

tp_future *
tp_rpc_async(tp_agent *a, const char *to, const char *fn_name,
             const tp_args *in, int64_t timeout_ms)
{
    if (a == NULL || to == NULL) {
        return tp__ag_future_failed(tp__error_new(
            TP_EINVAL, 0, NULL, "rpc \"%s\": %s", fn_name ? fn_name : "",
            a == NULL ? "NULL agent" : "NULL worker name"));
    }
    ag_peer *p = tp__ag_peer_by_name(a, to);
    if (p == NULL) {
        return tp__ag_future_failed(tp__error_new(
            TP_ENOENT, 0, NULL, "rpc \"%s\" from %s: no worker named \"%s\"",
            fn_name != NULL ? fn_name : "(null)", ag_name(a),
            to != NULL ? to : "(null)"));
    }
    return tp__ag_call_fn(a, p, fn_name, in, timeout_ms);
}

tp_future *
tp_rpc_async_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                  int64_t timeout_ms)
{
    if (a == NULL) {
        return tp__ag_future_failed(tp__error_new(TP_EINVAL, 0, NULL,
                                                  "rpc \"%s\": NULL agent",
                                                  fn_name ? fn_name : ""));
    }
    if (to < 0 || to >= a->a_world) {
        return tp__ag_future_failed(tp__error_new(
            TP_ENOENT, 0, NULL,
            "rpc \"%s\" from %s: no worker of rank %d (world size %d)",
            fn_name != NULL ? fn_name : "(null)", ag_name(a), to, a->a_world));
    }
    return tp__ag_call_fn(a, &a->a_peers[to], fn_name, in, timeout_ms);
}

static bool
future_done(void *arg)
{
    return tp_future_is_done(arg);
}

tp_status
tp_rpc_wait(tp_future *f, int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    if (out_p != NULL) {
        *out_p = NULL;
    }
    if (f == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc: no future (NULL, or the call could not "
                             "allocate one)");
    }
    // Spin briefly: a reply within microseconds should not pay for a
    // sleep and a wake-up. TP_LOOP_SPIN_US bounds it, as for the loops.
    if (!tp_future_is_done(f)) {
        static _Atomic int64_t spin_ns = -1;
        int64_t sns = atomic_load_explicit(&spin_ns, memory_order_relaxed);
        if (sns < 0) {
            tp_config cfg;
            tp__config_defaults(&cfg);
            tp_error *e = NULL;
            if (tp__config_load(&cfg, &e) != TP_OK) {
                tp_error_unref(e);
            }
            sns = cfg.loop_spin_us * 1000;
            atomic_store_explicit(&spin_ns, sns, memory_order_relaxed);
        }
        tp__spin_until(future_done, f, (uint64_t)sns);
    }
    tp_status st = tp_future_wait(f, timeout_ms, err_p);
    if (st == TP_OK && out_p != NULL) {
        tp_args *v = tp_future_value(f);
        *out_p = v != NULL ? tp_args_ref(v) : NULL;
    }
    return st;
}

tp_status
tp__agent_wait(tp_agent *a, tp_future *f, int64_t timeout_ms, tp_args **out_p,
               tp_error **err_p)
{
    // The call ends by itself at its deadline (the timer thread); the
    // wait's own deadline is only a backstop.
    if (a == NULL) {
        return tp_rpc_wait(f, timeout_ms, out_p, err_p); // its error
    }
    int64_t t = tp__ag_call_timeout(a, timeout_ms);
    int64_t wait_ms =
        t > 0 && t < INT64_MAX - AG_SYNC_GRACE_MS ? t + AG_SYNC_GRACE_MS : 0;
    tp_status st = tp_rpc_wait(f, wait_ms, out_p, err_p);
    if (st == TP_ETIMEDOUT && !tp_future_is_done(f)) {
        // Only if the timer thread failed to end the call: say so.
        tp__error_wrap(err_p, st,
                       "rpc from %s: the call did not end %d ms after its "
                       "%lld ms deadline",
                       ag_name(a), AG_SYNC_GRACE_MS, (long long)t);
    }
    return st;
}

static tp_status
rpc_sync_wait(tp_agent *a, tp_future *f, int64_t timeout_ms, tp_args **out_p,
              tp_error **err_p)
{
    tp_status st = tp__agent_wait(a, f, timeout_ms, out_p, err_p);
    tp_future_unref(f);
    return st;
}

tp_status
tp_rpc_sync(tp_agent *a, const char *to, const char *fn_name, const tp_args *in,
            int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}

tp_status
tp_rpc_sync_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                 int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async_rank(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}
