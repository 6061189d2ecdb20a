// SPDX-License-Identifier: Apache-2.0
// bench_pipe_msgrate.c - `tpipe bench pipe --test msgrate` (OSU's
// osu_mbw_mr): --pairs forked pairs, each its own server and client,
// stream at once; the rows are the sums of their rates. Launched (tpipe
// run -n 2P, mpirun, srun), the pairs are the job's ranks p and p + P:
// every measuring rank waits for the others in the store, streams, and
// ranks 1..P-1 hand their rates to rank 0, which prints the sums.

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "bench_pipe.h"
#include "core/platform.h"
#include "tool.h"

// What a pair's child reports through its pipe(2).
typedef struct bp_pair_rec {
    int pp_outcome; // bp_outcome
    char pp_transport[32];
    char pp_err[512];
    double pp_gbps[BENCH_MAX_SIZES]; // median over its repetitions
    uint64_t pp_iters[BENCH_MAX_SIZES];
} bp_pair_rec;

// A pair's child: its own server (forked by bp_run_rep) and client; the
// stream cells' medians go to @wfd. Never returns.
static void
bp_pair_child(bp_run *r, int wfd)
{
    const bench_opts *c = &r->pr_opts->bo_com;
    static bp_pair_rec rec;
    size_t ncells = 2 * c->bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * c->bo_reps, sizeof(double));
    if (cells == NULL || vals == NULL) {
        _exit(1);
    }
    bench_cells_reset(c, cells, vals);
    // This child's copy of the options (main's, not const): the pair
    // prints no rows, the sums are the rows.
    ((bench_opts *)c)->bo_done_fn = NULL;
    bp_outcome out = BP_OK;
    for (unsigned rep = 0; rep < c->bo_reps && out == BP_OK; rep++) {
        out = bp_run_rep(r, cells);
    }
    rec.pp_outcome = (int)out;
    snprintf(rec.pp_transport, sizeof(rec.pp_transport), "%s", r->pr_transport);
    snprintf(rec.pp_err, sizeof(rec.pp_err), "%.500s", r->pr_err);
    for (size_t i = 0; i < c->bo_nsizes; i++) {
        bench_medians m;
        bench_cell *cell = &cells[c->bo_nsizes + i];
        rec.pp_gbps[i] = bench_cell_medians(cell, &m) ? m.bm_gbps : NAN;
        rec.pp_iters[i] = cell->bc_iters;
    }
    bool ok = write(wfd, &rec, sizeof(rec)) == (ssize_t)sizeof(rec);
    _exit(ok ? 0 : 1);
}

// The stream cells' one repetition: the sums over the pairs, each row
// printed (bo_done_fn).
static void
bp_mr_fill(const bench_opts *c, bench_cell *cells, const double *sum,
           const uint64_t *iters)
{
    for (size_t k = 0; k < c->bo_nsizes; k++) {
        bench_cell *cell = &cells[c->bo_nsizes + k];
        cell->bc_p50[0] = cell->bc_p90[0] = cell->bc_p99[0] = NAN;
        cell->bc_gbps[0] = sum[k];
        cell->bc_iters = iters[k];
        cell->bc_n = 1;
        if (c->bo_done_fn != NULL) {
            c->bo_done_fn(c->bo_done_arg, cell);
        }
    }
}

// How long rank 0 (or the parent of forked pairs) waits for a pair's
// result: its setup, per size a warm-up and the budget, plus the stall
// timeout.
static double
bp_mr_secs(const bench_opts *c)
{
    return (double)c->bo_reps * (double)c->bo_nsizes *
               (3.0 * c->bo_budget + 5.0) +
           2.0 * c->bo_stall_s + 10.0;
}

// Reads one record from @fd by @deadline (CLOCK_MONOTONIC ns); on failure
// @why says whether the pair timed out, exited early or the read failed.
static bool
bp_pair_read(int fd, uint64_t deadline, bp_pair_rec *rec, char *why,
             size_t why_len)
{
    size_t got = 0;
    snprintf(why, why_len, "no result in time");
    while (got < sizeof(*rec)) {
        uint64_t now = tp__now_ns();
        if (now >= deadline) {
            return false;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int prc = poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1));
        if (prc < 0 && errno == EINTR) {
            continue;
        }
        if (prc < 0) {
            snprintf(why, why_len, "poll: %s", strerror(errno));
            return false;
        }
        if (prc == 0) {
            return false;
        }
        ssize_t n = read(fd, (char *)rec + got, sizeof(*rec) - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
            snprintf(why, why_len, "%s",
                     n == 0 ? "exited without a result" : strerror(errno));
            return false;
        }
        got += (size_t)n;
    }
    return true;
}

// --test msgrate: o->bo_pairs children, each a pair (its own server and
// client, as a local stream), started at once; the stream cells get the
// sums of the pairs' GB/s (one repetition). BP_SKIP or BP_FAIL with
// r->pr_err set.
bp_outcome
bp_msgrate(bp_run *r, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    const bench_opts *c = &o->bo_com;
    pid_t pids[BP_MAX_PAIRS];
    int fds[BP_MAX_PAIRS];
    unsigned n = 0;
    bp_outcome out = BP_OK;
    fflush(stdout);
    fflush(stderr);
    for (; n < o->bo_pairs; n++) {
        int pfd[2];
        if (pipe(pfd) != 0) {
            snprintf(r->pr_err, sizeof(r->pr_err), "pipe: %s", strerror(errno));
            out = BP_FAIL;
            break;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            for (unsigned i = 0; i < n; i++) {
                close(fds[i]);
            }
            bp_pair_child(r, pfd[1]);
        }
        close(pfd[1]);
        if (pid < 0) {
            close(pfd[0]);
            snprintf(r->pr_err, sizeof(r->pr_err), "fork: %s", strerror(errno));
            out = BP_FAIL;
            break;
        }
        pids[n] = pid;
        fds[n] = pfd[0];
    }
    // Each pair: its setup, per size a warm-up and the budget, plus the
    // stall timeout.
    double secs = bp_mr_secs(c);
    uint64_t deadline = tp__now_ns() + (uint64_t)(secs * 1e9);
    double sum[BENCH_MAX_SIZES] = {0};
    uint64_t iters[BENCH_MAX_SIZES] = {0};
    for (unsigned i = 0; i < n; i++) {
        static bp_pair_rec rec;
        char why[128];
        if (out == BP_OK &&
            !bp_pair_read(fds[i], deadline, &rec, why, sizeof(why))) {
            snprintf(r->pr_err, sizeof(r->pr_err), "pair %u: %s (limit %.0f s)",
                     i, why, secs);
            out = BP_FAIL;
        } else if (out == BP_OK && rec.pp_outcome != BP_OK) {
            snprintf(r->pr_err, sizeof(r->pr_err), "pair %u: %s", i,
                     rec.pp_err);
            out = (bp_outcome)rec.pp_outcome;
        } else if (out == BP_OK) {
            snprintf(r->pr_transport, sizeof(r->pr_transport), "%s",
                     rec.pp_transport);
            for (size_t k = 0; k < c->bo_nsizes; k++) {
                sum[k] += rec.pp_gbps[k];
                iters[k] += rec.pp_iters[k];
            }
        }
        close(fds[i]);
    }
    for (unsigned i = 0; i < n; i++) {
        // A pair that wrote its result exits at once; one that hangs after
        // it is killed after a second (tool_reap), never waited on forever.
        (void)tool_reap(pids[i], 1000, out != BP_OK);
    }
    if (out == BP_OK) {
        bp_mr_fill(c, cells, sum, iters);
    }
    return out;
}

// ---- launched: the pairs are ranks of a job (p and p + P) ------------------

#define BP_MR_READY "tpipe/bench_pipe/msgrate/ready"
#define BP_MR_GO    "tpipe/bench_pipe/msgrate/go"
#define BP_MR_RES   "tpipe/bench_pipe/msgrate/res/"

// Every measuring rank arrives before any streams (the last one to arrive
// sets "go"), so the pairs stream at once. False with r->pr_err set.
static bool
bp_mr_barrier(bp_run *r, tp_store *st)
{
    const bp_opts *o = r->pr_opts;
    int64_t ms = (int64_t)(o->bo_com.bo_stall_s * 2000);
    int64_t n = 0;
    tp_error *err = NULL;
    const char *go[1] = {BP_MR_GO};
    if (tp_store_add(st, BP_MR_READY, 1, ms, &n, &err) != TP_OK ||
        (n == (int64_t)o->bo_pairs &&
         tp_store_set(st, BP_MR_GO, "1", 1, ms, &err) != TP_OK) ||
        tp_store_wait(st, go, 1, ms, &err) != TP_OK) {
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "rank %d: waiting for the other %u measuring rank(s) to be "
                 "ready: %s",
                 o->bo_rank, o->bo_pairs - 1, tp_error_message(err));
        tp_error_unref(err);
        return false;
    }
    return true;
}

// This rank's pair: streams to the server at @url once every pair is
// ready; the medians of the stream cells go into @rec.
static bp_outcome
bp_mr_measure(bp_run *r, tp_store *st, const char *url, bp_pair_rec *rec)
{
    // Main's options, not const: the pair's own cells print no rows (the
    // sums are the rows).
    bench_opts *c = (bench_opts *)&r->pr_opts->bo_com;
    size_t ncells = 2 * c->bo_nsizes;
    bench_cell *cells = calloc(ncells, sizeof(*cells));
    double *vals = calloc(ncells * 4 * c->bo_reps, sizeof(double));
    memset(rec, 0, sizeof(*rec));
    bp_outcome out = BP_FAIL;
    if (cells == NULL || vals == NULL) {
        snprintf(r->pr_err, sizeof(r->pr_err), "out of memory");
        goto done;
    }
    bench_cells_reset(c, cells, vals);
    if (!bp_mr_barrier(r, st)) {
        goto done;
    }
    void (*done_fn)(void *, bench_cell *) = c->bo_done_fn;
    c->bo_done_fn = NULL;
    out = bp_run_remote(r, url, cells);
    c->bo_done_fn = done_fn;
    snprintf(rec->pp_transport, sizeof(rec->pp_transport), "%s",
             r->pr_transport);
    for (size_t i = 0; i < c->bo_nsizes; i++) {
        bench_medians m;
        bench_cell *cell = &cells[c->bo_nsizes + i];
        rec->pp_gbps[i] = bench_cell_medians(cell, &m) ? m.bm_gbps : NAN;
        rec->pp_iters[i] = cell->bc_iters;
    }
done:
    rec->pp_outcome = (int)out;
    free(cells);
    free(vals);
    return out;
}

int
bp_msgrate_pair(const bp_opts *o, tp_store *st, const char *url)
{
    static bp_run r;
    static bp_pair_rec rec;
    memset(&r, 0, sizeof(r));
    r.pr_opts = o;
    r.pr_combo = &o->bo_combos[0];
    bp_outcome out = bp_mr_measure(&r, st, url, &rec);
    // "ok G I G I ..." (GB/s and messages per size) or "fail|skip MESSAGE".
    static char val[64 + BENCH_MAX_SIZES * 48 + sizeof(r.pr_err)];
    size_t n = 0;
    if (out == BP_OK) {
        n = (size_t)snprintf(val, sizeof(val), "ok");
        for (size_t i = 0; i < o->bo_com.bo_nsizes; i++) {
            n += (size_t)snprintf(val + n, sizeof(val) - n, " %.17g %llu",
                                  rec.pp_gbps[i],
                                  (unsigned long long)rec.pp_iters[i]);
        }
    } else {
        n = (size_t)snprintf(val, sizeof(val), "%s %s",
                             out == BP_SKIP ? "skip" : "fail", r.pr_err);
    }
    char key[64];
    snprintf(key, sizeof(key), BP_MR_RES "%d", o->bo_rank);
    tp_error *err = NULL;
    int rc = out == BP_FAIL ? TOOL_EXIT_FAIL : TOOL_EXIT_OK;
    if (tp_store_set(st, key, val, n < sizeof(val) ? n : sizeof(val) - 1,
                     (int64_t)(o->bo_com.bo_stall_s * 2000), &err) != TP_OK) {
        tool_err("bench pipe: rank %d: handing the result to rank 0: %s",
                 o->bo_rank, tp_error_message(err));
        tp_error_unref(err);
        rc = TOOL_EXIT_FAIL;
    }
    if (out == BP_FAIL) {
        tool_err("bench pipe: rank %d: %s: %s", o->bo_rank,
                 r.pr_combo->bc_label, r.pr_err);
    }
    return rc;
}

// Parses rank @rank's result @v (not NUL-terminated, from the store) and
// adds its rates to @sum and @iters. BP_OK, or the pair's outcome (or
// BP_FAIL for a malformed one) with r->pr_err set.
static bp_outcome
bp_mr_add(bp_run *r, int rank, const char *v, size_t len, double *sum,
          uint64_t *iters)
{
    const bench_opts *c = &r->pr_opts->bo_com;
    char buf[64 + BENCH_MAX_SIZES * 48 + 2048];
    snprintf(buf, sizeof(buf), "%.*s",
             (int)(len < sizeof(buf) ? len : sizeof(buf) - 1), v);
    if (strncmp(buf, "fail ", 5) == 0 || strncmp(buf, "skip ", 5) == 0) {
        snprintf(r->pr_err, sizeof(r->pr_err), "rank %d: %.1900s", rank,
                 buf + 5);
        return buf[0] == 's' ? BP_SKIP : BP_FAIL;
    }
    char *p = buf + 2;
    bool ok = strncmp(buf, "ok", 2) == 0;
    for (size_t k = 0; ok && k < c->bo_nsizes; k++) {
        char *end = NULL;
        double g = strtod(p, &end);
        ok = end != p && (isnan(g) || g >= 0);
        p = end;
        unsigned long long it = ok ? strtoull(p, &end, 10) : 0;
        ok = ok && end != p;
        p = end;
        if (ok) {
            sum[k] += g;
            iters[k] += it;
        }
    }
    if (!ok || *p != '\0') {
        snprintf(r->pr_err, sizeof(r->pr_err),
                 "rank %d: malformed result \"%.64s\" (%zu sizes expected)",
                 rank, buf, c->bo_nsizes);
        return BP_FAIL;
    }
    return BP_OK;
}

bp_outcome
bp_msgrate_launched(bp_run *r, tp_store *st, const char *url, bench_cell *cells)
{
    const bp_opts *o = r->pr_opts;
    const bench_opts *c = &o->bo_com;
    static bp_pair_rec rec;
    bp_outcome out = bp_mr_measure(r, st, url, &rec);
    if (out != BP_OK) {
        return out;
    }
    double sum[BENCH_MAX_SIZES] = {0};
    uint64_t iters[BENCH_MAX_SIZES] = {0};
    for (size_t k = 0; k < c->bo_nsizes; k++) {
        sum[k] = rec.pp_gbps[k];
        iters[k] = rec.pp_iters[k];
    }
    double secs = bp_mr_secs(c);
    for (unsigned p = 1; p < o->bo_pairs && out == BP_OK; p++) {
        char key[64];
        snprintf(key, sizeof(key), BP_MR_RES "%u", p);
        void *v = NULL;
        size_t len = 0;
        tp_error *err = NULL;
        if (tp_store_get(st, key, (int64_t)(secs * 1000), &v, &len, &err) !=
            TP_OK) {
            snprintf(r->pr_err, sizeof(r->pr_err),
                     "waiting for rank %u's result: %s", p,
                     tp_error_message(err));
            tp_error_unref(err);
            return BP_FAIL;
        }
        out = bp_mr_add(r, (int)p, v, len, sum, iters);
        tp_free(v);
    }
    if (out == BP_OK) {
        bp_mr_fill(c, cells, sum, iters);
    }
    return out;
}
