// SPDX-License-Identifier: Apache-2.0
// bench_pipe_msgrate.c - `tpipe bench pipe --test msgrate` (OSU's
// osu_mbw_mr): --pairs forked pairs, each its own server and client,
// stream at once; the rows are the sums of their rates.

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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

// Reads one record from @fd by @deadline (CLOCK_MONOTONIC ns).
static bool
bp_pair_read(int fd, uint64_t deadline, bp_pair_rec *rec)
{
    size_t got = 0;
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
        if (prc <= 0) {
            return false;
        }
        ssize_t n = read(fd, (char *)rec + got, sizeof(*rec) - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) {
                continue;
            }
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
    double secs =
        (double)c->bo_reps * (double)c->bo_nsizes * (3.0 * c->bo_budget + 5.0) +
        2.0 * c->bo_stall_s + 10.0;
    uint64_t deadline = tp__now_ns() + (uint64_t)(secs * 1e9);
    double sum[BENCH_MAX_SIZES] = {0};
    uint64_t iters[BENCH_MAX_SIZES] = {0};
    for (unsigned i = 0; i < n; i++) {
        static bp_pair_rec rec;
        if (out == BP_OK && !bp_pair_read(fds[i], deadline, &rec)) {
            snprintf(r->pr_err, sizeof(r->pr_err),
                     "pair %u: no result within %.0f s", i, secs);
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
        if (out != BP_OK) {
            kill(pids[i], SIGKILL);
        }
        int st = 0;
        while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {
        }
    }
    for (size_t k = 0; out == BP_OK && k < c->bo_nsizes; k++) {
        bench_cell *cell = &cells[c->bo_nsizes + k];
        cell->bc_p50[0] = cell->bc_p90[0] = cell->bc_p99[0] = NAN;
        cell->bc_gbps[0] = sum[k];
        cell->bc_iters = iters[k];
        cell->bc_n = 1;
        if (c->bo_done_fn != NULL) {
            c->bo_done_fn(c->bo_done_arg, cell);
        }
    }
    return out;
}
