// SPDX-License-Identifier: Apache-2.0
// bench_rpc_launch.c - `tpipe bench rpc` as one rank of a launched job
// (tpipe run, torchrun, or mpirun/srun exporting RANK and WORLD_SIZE), on
// whatever hosts the ranks run: they meet with tp_rpc_init over
// TP_INIT_METHOD (default env://: rank 0 hosts the store at
// MASTER_ADDR:MASTER_PORT). Rank 0 (worker0) measures, rank 1 (worker1)
// is the callee, rank 2 (worker2) takes part in rref_fork; the others only
// serve.
//
// One agent per rank for every repetition: meeting again through the
// store for each one would race the next init against the last shutdown
// on every rank, so init is measured once. After init every rank gives its
// init time to tp_rpc_all_gather (rank 0 reports the slowest); the serving
// ranks then go into a graceful tp_rpc_shutdown, which returns once rank 0
// has finished and shut down too, bounded by an estimate of rank 0's run.
// Rank 0 shuts down gracefully after its last measurement, or abortively
// after a failure: the serving ranks' shutdown then fails at once (their
// peer is gone) instead of waiting out that bound.

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/rpc.h>

#include "bench_rpc.h"
#include "core/platform.h"
#include "tool.h"

// How long a serving rank waits in its graceful shutdown: every
// measurement of every repetition taking its budget (and a warm-up) plus
// one stalled call, and the stall timeout once more.
static int64_t
br_serve_ms(const br_opts *o)
{
    double n = (double)(o->bo_noop + o->bo_remote + o->bo_autograd +
                        o->bo_async + o->bo_fork) +
               (o->bo_echo ? (double)o->bo_nsizes : 0);
    double s =
        o->bo_reps * n * (2 * o->bo_budget + o->bo_stall_s) + 2 * o->bo_stall_s;
    return (int64_t)(s * 1000);
}

// Every rank's init time (us, as text) through tp_rpc_all_gather; rank 0
// keeps the slowest in *@max_p. False after writing to r->rr_err.
static bool
br_gather_init(br_run *r, tp_agent *a, double init_us, double *max_p)
{
    const bench_launch *l = &r->rr_opts->bo_launch;
    char mine[32];
    int n = snprintf(mine, sizeof(mine), "%.1f", init_us);
    void **vals = calloc((size_t)l->bl_world, sizeof(*vals));
    if (vals == NULL) {
        snprintf(r->rr_err, sizeof(r->rr_err), "init times: out of memory");
        return false;
    }
    tp_error *err = NULL;
    tp_status st = tp_rpc_all_gather(a, mine, (size_t)n, TP_TIMEOUT_DEFAULT,
                                     vals, NULL, &err);
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_all_gather of the init times (rank %d of %d)",
                 l->bl_rank, l->bl_world);
        free(vals);
        return false;
    }
    bool ok = true;
    double max = init_us;
    for (int k = 0; k < l->bl_world; k++) {
        char *end = NULL;
        double v = strtod(vals[k], &end);
        if (end == vals[k] || *end != '\0' || !(v >= 0) || !isfinite(v)) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "worker%d gave a malformed init time \"%.40s\"", k,
                     (const char *)vals[k]);
            ok = false;
        } else if (v > max) {
            max = v;
        }
        tp_free(vals[k]);
    }
    free(vals);
    *max_p = max;
    return ok;
}

// Rank 0: every repetition on agent @a. False after writing to r->rr_err.
static bool
br_launched_measure(br_run *r, tp_agent *a)
{
    const br_opts *o = r->rr_opts;
    bool two = o->bo_noop || o->bo_echo || o->bo_async || o->bo_init ||
               o->bo_remote || o->bo_autograd;
    bool ok = true;
    for (unsigned rep = 0; rep < o->bo_reps && ok; rep++) {
        tool_verbose(o->bo_verbose, "bench rpc", "%s: repetition %u of %u",
                     r->rr_tr->bt_name, rep + 1, o->bo_reps);
        if (two) {
            ok = br_measure_all(r, a, rep, false);
        }
        if (ok && o->bo_fork) {
            ok = br_measure_all(r, a, rep, true);
        }
        if (ok) {
            r->rr_nreps = rep + 1;
        }
    }
    if (ok) {
        ok = br_check_pipe(r, a);
    }
    if (o->bo_verbose) {
        char *info = tp_rpc_get_debug_info(a);
        fprintf(stderr, "tpipe: bench rpc: %s: worker0's debug info:\n%s%s",
                r->rr_tr->bt_name, info != NULL ? info : "(out of memory)\n",
                info != NULL && info[0] != '\0' &&
                        info[strlen(info) - 1] != '\n'
                    ? "\n"
                    : "");
        free(info);
    }
    return ok;
}

bool
br_run_launched(br_run *r)
{
    const br_opts *o = r->rr_opts;
    const bench_launch *l = &o->bo_launch;
    const char *tr = r->rr_tr->bt_name;
    char name[24];
    snprintf(name, sizeof(name), "worker%d", l->bl_rank);
    int64_t stall_ms = (int64_t)(o->bo_stall_s * 1000);
    tp_agent_options ao;
    br_agent_options(o, r->rr_tr, l->bl_url,
                     l->bl_rank == 0 ? stall_ms : br_serve_ms(o), &ao);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    br_watch(o, tr, "tp_rpc_init");
    uint64_t t0 = tp__now_ns();
    tp_status st = tp_rpc_init(name, l->bl_rank, l->bl_world, &ao, &a, &err);
    double init_us = (double)(tp__now_ns() - t0) / 1e3;
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_init(%s, rank %d of %d, %s)", name, l->bl_rank,
                 l->bl_world, l->bl_url);
        alarm(0);
        return false;
    }
    double init_max = init_us;
    br_watch(o, tr, "tp_rpc_all_gather of the init times");
    bool ok = br_gather_init(r, a, init_us, &init_max);
    if (ok && l->bl_rank == 0) {
        *br_val(r, BR_C_INIT, BR_F_P50, 0) = init_us;
        *br_val(r, BR_C_INIT, BR_F_RANKS_MAX, 0) = init_max;
        tool_verbose(o->bo_verbose, "bench rpc",
                     "%s: init %.0f us (the slowest rank %.0f us)", tr, init_us,
                     init_max);
        ok = br_launched_measure(r, a);
        br_watch(o, tr, "tp_rpc_shutdown");
    } else {
        // Serving: the shutdown's own deadline bounds the wait.
        alarm(0);
    }
    st = tp_rpc_shutdown(a, ok, &err);
    if (ok && st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "tp_rpc_shutdown(%s, graceful%s)", name,
                 l->bl_rank == 0 ? "" : ": waits for worker0's measurements");
        ok = false;
    } else {
        tp_error_unref(err);
    }
    alarm(0);
    return ok;
}
