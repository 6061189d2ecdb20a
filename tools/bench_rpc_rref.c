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
#include "core/error.h"
#include "core/platform.h"
#include "tool.h"

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

// remote() + to_here of a no-op; the RRef is dropped untimed.
static tp_status
br_remote_once(tp_agent *a, void *arg, void **keep_p, tp_error **err_p)
{
    (void)arg;
    tp_rref *rr = NULL;
    tp_status st =
        tp_remote_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, &rr, err_p);
    *keep_p = rr;
    if (st != TP_OK) {
        return st;
    }
    tp_args *v = NULL;
    st = tp_rref_to_here(rr, TP_TIMEOUT_DEFAULT, &v, err_p);
    tp_args_unref(v);
    return st;
}

static void
br_drop_rref(void *keep)
{
    tp_rref_unref(keep);
}

bool
br_measure_remote(br_run *r, tp_agent *a, unsigned rep)
{
    static const br_op op = {
        .bo_test = "remote",
        .bo_what = "remote(worker1, \"tp.noop\") + to_here",
        .bo_run = br_remote_once,
        .bo_drop = br_drop_rref,
    };
    return br_measure_lat(r, a, rep, BR_C_REMOTE, &op) &&
           br_rref_settle(r, a, "remote");
}

// The echo of args holding a user RRef owned by worker1 by worker2: the
// RRef forked there and back. The result (its new fork) is dropped
// untimed.
static tp_status
br_fork_once(tp_agent *a, void *arg, void **keep_p, tp_error **err_p)
{
    tp_args *out = NULL;
    tp_status st =
        tp_rpc_sync_rank(a, 2, "tp.echo", arg, TP_TIMEOUT_DEFAULT, &out, err_p);
    *keep_p = out;
    if (st == TP_OK && tp_args_nrrefs(out) != 1) {
        return tp__error_set(err_p, TP_EPROTO,
                             "the echo came back with %zu RRefs",
                             tp_args_nrrefs(out));
    }
    return st;
}

static void
br_drop_args(void *keep)
{
    tp_args_unref(keep);
}

bool
br_measure_fork(br_run *r, tp_agent *a, unsigned rep)
{
    tp_error *err = NULL;
    tp_rref *rr = NULL;
    tp_args *in = NULL;
    br_watch(r->rr_opts, r->rr_tr->bt_name, "rref_fork");
    tp_status st =
        tp_remote_rank(a, 1, "tp.noop", NULL, TP_TIMEOUT_DEFAULT, &rr, &err);
    if (st == TP_OK) {
        st = tp_rref_wait_created(rr, TP_TIMEOUT_DEFAULT, &err);
    }
    if (st == TP_OK && ((st = tp_args_create(NULL, 0, &in)) != TP_OK ||
                        (st = tp_args_add_rref(in, rr)) != TP_OK)) {
        err = tp__error_new(st, 0, NULL, "building the args");
    }
    bool ok = st == TP_OK;
    if (!ok) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "rref_fork: an RRef owned by worker1");
    } else {
        br_op op = {
            .bo_test = "rref_fork",
            .bo_what = "rpc_sync(worker2, \"tp.echo\") of a user RRef",
            .bo_run = br_fork_once,
            .bo_drop = br_drop_args,
            .bo_arg = in,
        };
        ok = br_measure_lat(r, a, rep, BR_C_FORK, &op);
    }
    tp_args_unref(in);
    tp_rref_unref(rr);
    return ok && br_rref_settle(r, a, "rref_fork");
}
