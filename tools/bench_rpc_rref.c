// SPDX-License-Identifier: Apache-2.0
// bench_rpc_rref.c - the RRef tests of `tpipe bench rpc` (rref.h):
//   remote     tp_remote(worker1, "tp.noop") then tp_rref_to_here, timed
//              together (PyTorch's remote_to_here); the RRef is dropped
//              after the timing (its DELETE runs in the background)
//   rref_fork  rpc_sync(worker2, "tp.echo") with a user RRef owned by
//              worker1: forked to worker2 and back on every call
// After each, worker0 waits (bounded) until its RRef counters are back to
// zero, so that the next test does not pay this one's background work.

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tpipe/rref.h>

#include "bench_rpc.h"
#include "core/platform.h"
#include "tool.h"

#define BR_MIN_RREF 100u

// Waits until worker0 holds no RRef state (users, pending forks or
// confirmations, queued messages).
static bool
br_rref_settle(br_run *r, tp_agent *a, const char *what)
{
    uint64_t dl = tp__now_ns() + (uint64_t)(r->rr_opts->bo_stall_s * 1e9);
    for (;;) {
        tp_rref_stats s;
        if (tp_rref_get_stats(a, &s) != TP_OK) {
            snprintf(r->rr_err, sizeof(r->rr_err), "%s: no RRef counters",
                     what);
            return false;
        }
        if (s.users == 0 && s.pending_forks == 0 && s.pending_users == 0 &&
            s.pending_messages == 0) {
            return true;
        }
        if (tp__now_ns() > dl) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "%s: RRef work still in flight after %g s (users %llu, "
                     "pending forks %llu, confirmations %llu, messages %llu)",
                     what, r->rr_opts->bo_stall_s, (unsigned long long)s.users,
                     (unsigned long long)s.pending_forks,
                     (unsigned long long)s.pending_users,
                     (unsigned long long)s.pending_messages);
            return false;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

// One remote() + to_here; TP_OK or the error in *@err_p.
static tp_status
br_remote_once(tp_agent *a, tp_error **err_p)
{
    tp_rref *rr = NULL;
    tp_status st =
        tp_remote_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, &rr, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_args *v = NULL;
    st = tp_rref_to_here(rr, TP_TIMEOUT_DEFAULT, &v, err_p);
    tp_args_unref(v);
    tp_rref_unref(rr);
    return st;
}

bool
br_measure_remote(br_run *r, tp_agent *a, unsigned rep)
{
    const br_opts *o = r->rr_opts;
    br_lat l = {0};
    tp_error *err = NULL;
    tp_status st = TP_OK;
    br_watch(o, r->rr_tr->bt_name, "remote");
    for (int i = 0; i < 100 && st == TP_OK; i++) {
        st = br_remote_once(a, &err);
    }
    uint64_t start = tp__now_ns(), budget = (uint64_t)(o->bo_budget * 1e9);
    while (st == TP_OK &&
           (l.bl_n < BR_MIN_RREF || tp__now_ns() - start < budget)) {
        tp_rref *rr = NULL;
        uint64_t t0 = tp__now_ns();
        st = tp_remote_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, &rr,
                            &err);
        tp_args *v = NULL;
        if (st == TP_OK) {
            st = tp_rref_to_here(rr, TP_TIMEOUT_DEFAULT, &v, &err);
        }
        uint64_t t1 = tp__now_ns();
        tp_args_unref(v);
        tp_rref_unref(rr);
        if (st == TP_OK && !br_lat_add(&l, (double)(t1 - t0) / 1e3)) {
            snprintf(r->rr_err, sizeof(r->rr_err), "remote: out of memory");
            free(l.bl_v);
            return false;
        }
        if ((l.bl_n & 1023) == 0) {
            br_watch_again();
        }
    }
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "remote: remote(worker1, \"tp.noop\") + to_here after %zu",
                 l.bl_n);
        free(l.bl_v);
        return false;
    }
    br_lat_record(r, BR_C_REMOTE, rep, &l, 0);
    tool_verbose(o->bo_verbose, "bench rpc",
                 "%s: remote: %zu remote+to_here, p50 %.2f us",
                 r->rr_tr->bt_name, l.bl_n,
                 *br_val(r, BR_C_REMOTE, BR_F_P50, rep));
    free(l.bl_v);
    return br_rref_settle(r, a, "remote");
}

bool
br_measure_fork(br_run *r, tp_agent *a, unsigned rep)
{
    const br_opts *o = r->rr_opts;
    br_lat l = {0};
    tp_error *err = NULL;
    br_watch(o, r->rr_tr->bt_name, "rref_fork");
    tp_rref *rr = NULL;
    tp_args *in = NULL;
    tp_status st =
        tp_remote_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, &rr, &err);
    if (st == TP_OK) {
        st = tp_rref_wait_created(rr, TP_TIMEOUT_DEFAULT, &err);
    }
    if (st == TP_OK && ((st = tp_args_create(NULL, 0, &in)) != TP_OK ||
                        (st = tp_args_add_rref(in, rr)) != TP_OK)) {
        err = NULL;
    }
    uint64_t start = 0, budget = (uint64_t)(o->bo_budget * 1e9);
    for (unsigned i = 0; st == TP_OK && (i < 100 || l.bl_n < BR_MIN_RREF ||
                                         tp__now_ns() - start < budget);
         i++) {
        if (i == 100) {
            start = tp__now_ns(); // after the warm-up
        }
        tp_args *out = NULL;
        uint64_t t0 = tp__now_ns();
        st = tp_rpc_sync_rank(a, 2, "tp.echo", in, TP_TIMEOUT_DEFAULT, &out,
                              &err);
        uint64_t t1 = tp__now_ns();
        if (st == TP_OK && tp_args_nrrefs(out) != 1) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "rref_fork: the echo came back with %zu RRefs",
                     tp_args_nrrefs(out));
            tp_args_unref(out);
            goto fail;
        }
        tp_args_unref(out);
        if (st == TP_OK && i >= 100 &&
            !br_lat_add(&l, (double)(t1 - t0) / 1e3)) {
            snprintf(r->rr_err, sizeof(r->rr_err), "rref_fork: out of memory");
            goto fail;
        }
        if ((i & 1023) == 0) {
            br_watch_again();
        }
    }
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "rref_fork: an RRef of worker1 to worker2 and back after %zu",
                 l.bl_n);
        goto fail;
    }
    tp_args_unref(in);
    tp_rref_unref(rr);
    br_lat_record(r, BR_C_FORK, rep, &l, 0);
    tool_verbose(o->bo_verbose, "bench rpc",
                 "%s: rref_fork: %zu round trips, p50 %.2f us",
                 r->rr_tr->bt_name, l.bl_n,
                 *br_val(r, BR_C_FORK, BR_F_P50, rep));
    free(l.bl_v);
    return br_rref_settle(r, a, "rref_fork");
fail:
    tp_args_unref(in);
    tp_rref_unref(rr);
    free(l.bl_v);
    return false;
}
