// SPDX-License-Identifier: Apache-2.0
// bench_collective_rank.c - `tpipe bench collective`: a forked rank,
// which checks each op's result and measures it (bench_collective.c).

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/platform.h"
#include "tool.h"
#include "bench_collective.h"

// ---- a rank ----------------------------------------------------------------

typedef struct bc_rank {
    const bc_opts *r_opts;
    int r_rank, r_world, r_fd;
    tp_pg *r_pg;
    tp_tensor *r_in, *r_out; // the op's buffers (NULL where unused)
    tp_tensor *r_time;       // f64 [1]: batch times, reduced with max
    tp_tensor *r_flag;       // i32 [1]: a wrong result somewhere
} bc_rank;

// Sends "<rank> <message>\n" to this process in one write (atomic).
static void bc_send(const bc_rank *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
bc_send(const bc_rank *r, const char *fmt, ...)
{
    char line[BC_LINE_MAX];
    int n = snprintf(line, sizeof(line), "%d ", r->r_rank);
    va_list ap;
    va_start(ap, fmt);
    size_t cap = sizeof(line) - (size_t)n - 1; // the newline's byte spared
    int m = vsnprintf(line + n, cap, fmt, ap);
    va_end(ap);
    // Truncated: vsnprintf wrote cap - 1 bytes and a NUL.
    size_t len = (size_t)n + (m < 0             ? 0
                              : (size_t)m < cap ? (size_t)m
                                                : cap - 1);
    // Errors carry library messages: keep them on one line.
    for (size_t i = (size_t)n; i < len; i++) {
        if (line[i] == '\n') {
            line[i] = ' ';
        }
    }
    line[len++] = '\n';
    if (write(r->r_fd, line, len) < 0) {
        // This process is gone; the rank dies with it (PR_SET_PDEATHSIG).
    }
}

// Reports "error <what>: <message> (<status>)", drops @err and exits.
static void __attribute__((noreturn))
bc_rank_fail(bc_rank *r, const char *what, tp_status st, tp_error *err)
{
    bc_send(r, "error %s: %s (%s)", what,
            err != NULL ? tp_error_message(err) : "no error message",
            tp_status_name(st));
    tp_error_unref(err);
    _exit(TOOL_EXIT_FAIL);
}

static void
bc_set(tp_tensor *t, uint64_t i, double v)
{
    void *p = tp_tensor_data(t);
    switch (tp_tensor_dtype(t)) {
    case TP_F32:
        ((float *)p)[i] = (float)v;
        break;
    case TP_F64:
        ((double *)p)[i] = v;
        break;
    case TP_I32:
        ((int32_t *)p)[i] = (int32_t)v;
        break;
    default:
        ((int64_t *)p)[i] = (int64_t)v;
        break;
    }
}

static double
bc_get(const tp_tensor *t, uint64_t i)
{
    const void *p = tp_tensor_data(t);
    switch (tp_tensor_dtype(t)) {
    case TP_F32:
        return ((const float *)p)[i];
    case TP_F64:
        return ((const double *)p)[i];
    case TP_I32:
        return ((const int32_t *)p)[i];
    default:
        return (double)((const int64_t *)p)[i];
    }
}

// Inputs of the check: small integers, exact in every dtype (also their
// sums over 64 ranks).
// all_reduce, reduce, reduce_scatter: rank r's element i.
static double
bc_val_sum(int r, uint64_t i)
{
    return (double)(r + 1) + (double)(i % 7);
}

// The sum of bc_val_sum over @n ranks.
static double
bc_val_sum_all(int n, uint64_t i)
{
    return (double)n * (n + 1) / 2 + (double)n * (double)(i % 7);
}

// all_gather, gather, scatter: element i of rank r's block.
static double
bc_val_block(int r, uint64_t i)
{
    return (double)r * 1000 + (double)(i % 997);
}

// all_to_all: element i of the block rank @src sends to rank @dst.
static double
bc_val_a2a(int src, int dst, uint64_t i)
{
    return ((double)src * BC_MAX_WORLD + dst) * 8 + (double)(i % 8);
}

// broadcast: the root's element i (the others start at -1).
static double
bc_val_bcast(uint64_t i)
{
    return (double)(i % 1009) + 1;
}

// Fills the buffers with the check's inputs.
static void
bc_fill_check(bc_rank *r, const bc_cell *c)
{
    int me = r->r_rank;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
    case BC_REDUCE:
    case BC_REDUCE_SCATTER:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i, bc_val_sum(me, i));
        }
        break;
    case BC_BROADCAST:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i, me == 0 ? bc_val_bcast(i) : -1);
        }
        break;
    case BC_ALL_GATHER:
    case BC_GATHER:
        for (uint64_t i = 0; i < c->c_block; i++) {
            bc_set(r->r_in, i, bc_val_block(me, i));
        }
        break;
    case BC_SCATTER:
        for (uint64_t i = 0; r->r_in != NULL && i < c->c_count; i++) {
            bc_set(r->r_in, i,
                   bc_val_block((int)(i / c->c_block), i % c->c_block));
        }
        break;
    case BC_ALL_TO_ALL:
        for (uint64_t i = 0; i < c->c_count; i++) {
            bc_set(r->r_in, i,
                   bc_val_a2a(me, (int)(i / c->c_block), i % c->c_block));
        }
        break;
    default:
        break;
    }
}

// Compares @t's element @i with @want; on a mismatch writes it to @why.
static bool
bc_expect(const tp_tensor *t, const char *name, uint64_t i, double want,
          char *why, size_t len)
{
    double got = bc_get(t, i);
    if (got == want) {
        return true;
    }
    snprintf(why, len, "wrong result: %s[%llu] = %.17g, want %.17g", name,
             (unsigned long long)i, got, want);
    return false;
}

// Checks the result of the op on the check's inputs. False with the first
// wrong element in @why.
static bool
bc_verify(const bc_rank *r, const bc_cell *c, char *why, size_t len)
{
    int me = r->r_rank, n = r->r_world;
    bool ok = true;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok =
                bc_expect(r->r_in, "buffer", i, bc_val_sum_all(n, i), why, len);
        }
        break;
    case BC_REDUCE:
        // The root holds the sum; the others' buffers are unchanged.
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_in, "buffer", i,
                           me == 0 ? bc_val_sum_all(n, i) : bc_val_sum(me, i),
                           why, len);
        }
        break;
    case BC_REDUCE_SCATTER:
        for (uint64_t i = 0; ok && i < c->c_block; i++) {
            uint64_t j = (uint64_t)me * c->c_block + i;
            ok = bc_expect(r->r_out, "output", i, bc_val_sum_all(n, j), why,
                           len);
        }
        break;
    case BC_BROADCAST:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_in, "buffer", i, bc_val_bcast(i), why, len);
        }
        break;
    case BC_ALL_GATHER:
    case BC_GATHER:
        for (uint64_t i = 0; r->r_out != NULL && ok && i < c->c_count; i++) {
            ok = bc_expect(r->r_out, "output", i,
                           bc_val_block((int)(i / c->c_block), i % c->c_block),
                           why, len);
        }
        break;
    case BC_SCATTER:
        for (uint64_t i = 0; ok && i < c->c_block; i++) {
            ok =
                bc_expect(r->r_out, "output", i, bc_val_block(me, i), why, len);
        }
        break;
    case BC_ALL_TO_ALL:
        for (uint64_t i = 0; ok && i < c->c_count; i++) {
            ok =
                bc_expect(r->r_out, "output", i,
                          bc_val_a2a((int)(i / c->c_block), me, i % c->c_block),
                          why, len);
        }
        break;
    default:
        break;
    }
    return ok;
}

// One blocking call of the cell's op.
static tp_status
bc_call(bc_rank *r, const bc_cell *c, tp_error **err_p)
{
    tp_pg *pg = r->r_pg;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
        return tp_pg_all_reduce(pg, r->r_in, TP_REDUCE_SUM, NULL, err_p);
    case BC_ALL_GATHER:
        return tp_pg_all_gather(pg, r->r_out, r->r_in, NULL, err_p);
    case BC_REDUCE_SCATTER:
        return tp_pg_reduce_scatter(pg, r->r_out, r->r_in, TP_REDUCE_SUM, NULL,
                                    err_p);
    case BC_BROADCAST:
        return tp_pg_broadcast(pg, r->r_in, 0, NULL, err_p);
    case BC_REDUCE:
        return tp_pg_reduce(pg, r->r_in, 0, TP_REDUCE_SUM, NULL, err_p);
    case BC_ALL_TO_ALL:
        return tp_pg_all_to_all(pg, r->r_out, r->r_in, NULL, NULL, NULL, err_p);
    case BC_BARRIER:
        return tp_pg_barrier(pg, NULL, err_p);
    case BC_GATHER:
        return tp_pg_gather(pg, r->r_out, r->r_in, 0, NULL, err_p);
    case BC_SCATTER:
        return tp_pg_scatter(pg, r->r_out, r->r_in, 0, NULL, err_p);
    default:
        break;
    }
    return TP_EINVAL;
}

static tp_tensor *
bc_tensor(bc_rank *r, const bc_cell *c, uint64_t count)
{
    int64_t shape[1] = {(int64_t)count};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    tp_status st = tp_tensor_empty(r->r_opts->bo_dtype, 1, shape, &t, &err);
    if (st != TP_OK) {
        char what[160], name[96];
        bc_cell_name(c, name, sizeof(name));
        snprintf(what, sizeof(what), "%s: tp_tensor_empty(%llu elements)", name,
                 (unsigned long long)count);
        bc_rank_fail(r, what, st, err);
    }
    return t;
}

// The cell's buffers (see bc_usage for what size means per op).
static void
bc_alloc(bc_rank *r, const bc_cell *c)
{
    bool root = r->r_rank == 0;
    r->r_in = r->r_out = NULL;
    switch (c->c_kind) {
    case BC_ALL_REDUCE:
    case BC_BROADCAST:
    case BC_REDUCE:
        r->r_in = bc_tensor(r, c, c->c_count);
        break;
    case BC_ALL_GATHER:
        r->r_in = bc_tensor(r, c, c->c_block);
        r->r_out = bc_tensor(r, c, c->c_count);
        break;
    case BC_REDUCE_SCATTER:
        r->r_in = bc_tensor(r, c, c->c_count);
        r->r_out = bc_tensor(r, c, c->c_block);
        break;
    case BC_ALL_TO_ALL:
        r->r_in = bc_tensor(r, c, c->c_count);
        r->r_out = bc_tensor(r, c, c->c_count);
        break;
    case BC_GATHER:
        r->r_in = bc_tensor(r, c, c->c_block);
        r->r_out = root ? bc_tensor(r, c, c->c_count) : NULL;
        break;
    case BC_SCATTER:
        r->r_in = root ? bc_tensor(r, c, c->c_count) : NULL;
        r->r_out = bc_tensor(r, c, c->c_block);
        break;
    default:
        break;
    }
}

static void
bc_zero(tp_tensor *t)
{
    if (t != NULL) {
        memset(tp_tensor_data(t), 0, tp_tensor_nbytes(t));
    }
}

// Runs @n calls; on failure reports "<cell>: <phase>: <call>" and exits.
static void
bc_calls(bc_rank *r, const bc_cell *c, uint64_t n, const char *phase)
{
    for (uint64_t i = 0; i < n; i++) {
        tp_error *err = NULL;
        tp_status st = bc_call(r, c, &err);
        if (st != TP_OK) {
            char what[256], name[96];
            bc_cell_name(c, name, sizeof(name));
            snprintf(what, sizeof(what), "%s: %s: call %llu of %llu: %s", name,
                     phase, (unsigned long long)i + 1, (unsigned long long)n,
                     bc_ops[c->c_kind].op_call);
            bc_rank_fail(r, what, st, err);
        }
    }
}

// The max over ranks of @v (every rank gets it).
static double
bc_max_all(bc_rank *r, const bc_cell *c, double v, const char *phase)
{
    *(double *)tp_tensor_data(r->r_time) = v;
    tp_error *err = NULL;
    tp_status st =
        tp_pg_all_reduce(r->r_pg, r->r_time, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[256], name[96];
        bc_cell_name(c, name, sizeof(name));
        snprintf(what, sizeof(what), "%s: %s: tp_pg_all_reduce(max)", name,
                 phase);
        bc_rank_fail(r, what, st, err);
    }
    return *(double *)tp_tensor_data(r->r_time);
}

// Step 1: the op once on known inputs, checked on every rank.
static void
bc_check(bc_rank *r, const bc_cell *c)
{
    char why[256] = "", name[96];
    bc_cell_name(c, name, sizeof(name));
    bc_fill_check(r, c);
    bc_calls(r, c, 1, "check");
    bool ok = bc_verify(r, c, why, sizeof(why));
    *(int32_t *)tp_tensor_data(r->r_flag) = ok ? 0 : 1;
    tp_error *err = NULL;
    tp_status st =
        tp_pg_all_reduce(r->r_pg, r->r_flag, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[256];
        snprintf(what, sizeof(what), "%s: check: tp_pg_all_reduce(max)", name);
        bc_rank_fail(r, what, st, err);
    }
    if (!ok) {
        bc_send(r, "error %s: check: %s", name, why);
        _exit(TOOL_EXIT_FAIL);
    }
    if (*(int32_t *)tp_tensor_data(r->r_flag) != 0) {
        // Another rank saw a wrong value and says which.
        bc_send(r, "abort");
        _exit(TOOL_EXIT_FAIL);
    }
}

// Step 3: doubles a batch until it takes budget / 20, then sizes the
// measurement to the budget. Every rank takes the same decisions (the
// batch time is the max over ranks).
static uint64_t
bc_calibrate(bc_rank *r, const bc_cell *c)
{
    double budget = r->r_opts->bo_budget;
    uint64_t k = 1;
    double per = 0;
    for (;;) {
        uint64_t t0 = tp__now_ns();
        bc_calls(r, c, k, "calibration");
        double dt = (double)(tp__now_ns() - t0) / 1e9;
        dt = bc_max_all(r, c, dt, "calibration");
        per = dt / (double)k;
        if (dt >= budget / 20 || k >= BC_MAX_ITERS / 2) {
            break;
        }
        k *= 2;
    }
    double n = per > 0 ? budget / per : (double)BC_MAX_ITERS;
    if (n < BC_MIN_ITERS) {
        n = BC_MIN_ITERS;
    }
    if (n > BC_MAX_ITERS) {
        n = BC_MAX_ITERS;
    }
    return (uint64_t)n;
}

static void
bc_measure(bc_rank *r, const bc_cell *c, size_t idx, unsigned rep)
{
    const bc_opts *o = r->r_opts;
    char name[96];
    bc_cell_name(c, name, sizeof(name));
    bc_alloc(r, c);
    bc_check(r, c);
    bc_zero(r->r_in);
    bc_zero(r->r_out);
    bc_calls(r, c, o->bo_warmup, "warm-up");
    uint64_t iters = o->bo_iters ? o->bo_iters : bc_calibrate(r, c);

    tp_error *err = NULL;
    tp_status st = tp_pg_barrier(r->r_pg, NULL, &err);
    if (st != TP_OK) {
        char what[160];
        snprintf(what, sizeof(what), "%s: tp_pg_barrier before the timed calls",
                 name);
        bc_rank_fail(r, what, st, err);
    }
    uint64_t t0 = tp__now_ns();
    bc_calls(r, c, iters, "timed");
    double us = (double)(tp__now_ns() - t0) / 1e3 / (double)iters;

    // The slowest rank's mean, to rank 0.
    *(double *)tp_tensor_data(r->r_time) = us;
    st = tp_pg_reduce(r->r_pg, r->r_time, 0, TP_REDUCE_MAX, NULL, &err);
    if (st != TP_OK) {
        char what[160];
        snprintf(what, sizeof(what), "%s: tp_pg_reduce(max) of the times",
                 name);
        bc_rank_fail(r, what, st, err);
    }
    if (r->r_rank == 0) {
        bc_send(r, "result %zu %.6g %llu %u", idx,
                *(double *)tp_tensor_data(r->r_time), (unsigned long long)iters,
                rep);
    }
    tp_tensor_unref(r->r_in);
    tp_tensor_unref(r->r_out);
    r->r_in = r->r_out = NULL;
}

// A rank's life: join, measure every cell (launched: --reps times, in one
// group), report "done". Never returns.
void
bc_rank_main(const bc_opts *o, const bc_cell *cells, size_t ncells, int rank,
             const char *url, int fd)
{
    bc_rank r = {
        .r_opts = o, .r_rank = rank, .r_world = o->bo_world, .r_fd = fd};
    if (strcmp(o->bo_engine, "auto") != 0) {
        setenv("TP_COLL_ENGINE", o->bo_engine, 1);
    }
    // Rank r on CPU r mod the CPUs this process may use, as mpirun binds
    // by default: two ranks that land on one CPU hand every phase over
    // through the scheduler, and the numbers then depend on placement.
    // Launched: the rank among this node's (LOCAL_RANK).
    const bench_launch *l = &o->bo_launch;
    int local = l->bl_on ? l->bl_local_rank : rank;
    if (!o->bo_no_bind) {
        cpu_set_t allowed, one;
        if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0 &&
            CPU_COUNT(&allowed) > 0) {
            int want = local % CPU_COUNT(&allowed), seen = 0;
            for (int c = 0; c < CPU_SETSIZE; c++) {
                if (CPU_ISSET(c, &allowed) && seen++ == want) {
                    CPU_ZERO(&one);
                    CPU_SET(c, &one);
                    (void)sched_setaffinity(0, sizeof(one), &one);
                    break;
                }
            }
        }
    }
    // Every forked rank is on this host: its pipes stay on loopback
    // (unless the user chose an interface or address). A launched job's
    // ranks may be on other hosts.
    if (!l->bl_on && getenv("TP_SOCKET_ADDR") == NULL) {
        setenv("TP_SOCKET_IFNAME", "lo", 0);
    }
    tp_pg_options po;
    tp_pg_options_init(&po);
    int64_t limit_ms = (int64_t)(o->bo_timeout_s * 1000);
    po.timeout_ms = limit_ms;
    po.init_timeout_ms = limit_ms < 60000 ? limit_ms : 60000;
    tp_error *err = NULL;
    tp_status st = tp_pg_init(url, rank, o->bo_world, &po, &r.r_pg, &err);
    if (st != TP_OK) {
        char what[700];
        snprintf(what, sizeof(what), "tp_pg_init(%s, rank %d of %d)", url, rank,
                 o->bo_world);
        bc_rank_fail(&r, what, st, err);
    }
    const char *engine = tp_pg_engine(r.r_pg);
    if (strcmp(o->bo_engine, "auto") != 0 &&
        strcmp(engine, o->bo_engine) != 0) {
        bc_send(&r,
                "error asked for engine %s (TP_COLL_ENGINE) but the group "
                "runs on %s",
                o->bo_engine, engine);
        _exit(TOOL_EXIT_FAIL);
    }
    if (rank == 0) {
        bc_send(&r, "engine %s", engine);
    }
    int64_t one[1] = {1};
    if ((st = tp_tensor_empty(TP_F64, 1, one, &r.r_time, &err)) != TP_OK ||
        (st = tp_tensor_empty(TP_I32, 1, one, &r.r_flag, &err)) != TP_OK) {
        bc_rank_fail(&r, "tp_tensor_empty", st, err);
    }
    unsigned reps = l->bl_on ? o->bo_reps : 1;
    for (unsigned rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < ncells; i++) {
            bc_measure(&r, &cells[i], i, rep);
        }
    }
    tp_tensor_unref(r.r_time);
    tp_tensor_unref(r.r_flag);
    tp_pg_destroy(r.r_pg);
    bc_send(&r, "done");
    _exit(TOOL_EXIT_OK);
}
