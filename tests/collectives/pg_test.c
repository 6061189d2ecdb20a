/* SPDX-License-Identifier: Apache-2.0 */
/* pg_test.c - process groups and collectives across forked ranks on
 * loopback: every collective x reduction x dtype against a sequential
 * reference at world sizes 1, 2, 3, 4 and 8 (oversubscribed), sizes 0, 1,
 * odd and 64 MiB, on both engines and with the pipe engine's large-message
 * algorithms forced; subgroups; async work in flight; point-to-point with
 * tags and any-source; argument errors; TP_DEBUG_COLLECTIVES mismatches;
 * timeouts; a rank killed in the middle of an all_reduce; init through
 * tcp://, env:// and file://; 64 ranks (slow_ cases).
 *
 * Every rank is a forked child of the case process, forked before any
 * thread exists. Every wait has a deadline. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/pipe.h>
#include <tpipe/tpipe.h>

#include "core/wire.h"
#include "tp_test.h"
#include "tp_test_job.h"

#define MAX_WORLD 64

static int64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// ---- jobs of forked ranks -------------------------------------------------

// Runs @j (tp_test_job.h) on loopback only, whatever the init method; a
// minute unless the case says otherwise.
static void
job_run(tp_job *j)
{
    int e = 0;
    while (e < TP_JOB_MAX_ENV - 1 && j->env[e] != NULL) {
        e++;
    }
    TP_CHECK(j->env[e] == NULL);
    j->env[e] = "TP_SOCKET_IFNAME=lo";
    if (j->limit_ms == 0) {
        j->limit_ms = 60000;
    }
    tp_job_run(j);
}

static void
file_url(char *url, size_t n)
{
    static int seq;
    snprintf(url, n, "file:///tmp/tp-pg-test-%d-%d-%lld", (int)getpid(), seq++,
             (long long)now_ms());
}

static void
tcp_url(char *url, size_t n)
{
    snprintf(url, n, "tcp://127.0.0.1:%d", tp_test_free_port());
}

static tp_pg *
init_pg(int rank, int world, const char *url, int64_t timeout_ms)
{
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = tp_test_ms(30000);
    if (timeout_ms != 0) {
        o.timeout_ms = timeout_ms;
    } else {
        o.timeout_ms = tp_test_ms(60000);
    }
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = tp_pg_init(url, rank, world, &o, &pg, &err);
    TP_CHECK_OK(st, err);
    TP_CHECK_EQ(tp_pg_rank(pg), rank);
    TP_CHECK_EQ(tp_pg_size(pg), world);
    return pg;
}

// ---- data and references --------------------------------------------------

static const tp_dtype k_dtypes[] = {TP_F32, TP_F64, TP_F16, TP_BF16,
                                    TP_I8,  TP_U8,  TP_I32, TP_I64};
static const tp_reduce_op k_ops[] = {
    TP_REDUCE_SUM, TP_REDUCE_PRODUCT, TP_REDUCE_MIN, TP_REDUCE_MAX,
    TP_REDUCE_AVG, TP_REDUCE_BAND,    TP_REDUCE_BOR, TP_REDUCE_BXOR,
};

static const char *
op_name(tp_reduce_op op)
{
    static const char *const names[] = {"sum", "product", "min", "max",
                                        "avg", "band",    "bor", "bxor"};
    return names[op];
}

static bool
is_float(tp_dtype dt)
{
    return dt == TP_F32 || dt == TP_F64 || dt == TP_F16 || dt == TP_BF16;
}

static bool
op_ok(tp_reduce_op op, tp_dtype dt)
{
    if (op == TP_REDUCE_AVG) {
        return is_float(dt);
    }
    if (op == TP_REDUCE_BAND || op == TP_REDUCE_BOR || op == TP_REDUCE_BXOR) {
        return !is_float(dt);
    }
    return true;
}

// Element @i of rank @r's input for @op (small integers: exact in every
// float type, including sums and products over 8 ranks in bf16).
static int64_t
value(tp_reduce_op op, int r, size_t i, int salt)
{
    if (op == TP_REDUCE_PRODUCT) {
        static const int v[4] = {1, -1, 2, 1};
        return v[(r + (int)i + salt) % 4];
    }
    return (int64_t)(((size_t)r * 7 + i * 3 + (size_t)salt) % 11) - 3;
}

// Wraps @v to the range of integer dtype @dt (two's complement).
static int64_t
wrap(tp_dtype dt, int64_t v)
{
    switch (dt) {
    case TP_I8:
        return (int8_t)(uint8_t)(uint64_t)v;
    case TP_U8:
        return (uint8_t)(uint64_t)v;
    case TP_I32:
        return (int32_t)(uint32_t)(uint64_t)v;
    default:
        return v;
    }
}

// The reference of element @i: op over ranks 0..n-1 of value().
static double
reference(tp_dtype dt, tp_reduce_op op, int n, size_t i, int salt)
{
    int64_t acc = wrap(dt, value(op, 0, i, salt));
    for (int r = 1; r < n; r++) {
        int64_t v = wrap(dt, value(op, r, i, salt));
        switch (op) {
        case TP_REDUCE_SUM:
        case TP_REDUCE_AVG:
            acc = (int64_t)((uint64_t)acc + (uint64_t)v);
            break;
        case TP_REDUCE_PRODUCT:
            acc = (int64_t)((uint64_t)acc * (uint64_t)v);
            break;
        case TP_REDUCE_MIN:
            acc = v < acc ? v : acc;
            break;
        case TP_REDUCE_MAX:
            acc = v > acc ? v : acc;
            break;
        case TP_REDUCE_BAND:
            acc &= v;
            break;
        case TP_REDUCE_BOR:
            acc |= v;
            break;
        case TP_REDUCE_BXOR:
            acc ^= v;
            break;
        }
        acc = wrap(dt, acc);
    }
    if (op == TP_REDUCE_AVG) {
        return (double)acc / n;
    }
    return (double)acc;
}

static tp_tensor *
tensor(tp_dtype dt, size_t count)
{
    int64_t shape[1] = {(int64_t)count};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(dt, 1, shape, &t, &err), err);
    return t;
}

static void
fill(tp_tensor *t, tp_reduce_op op, int r, int salt, size_t from)
{
    int64_t n = tp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = value(op, r, (size_t)i + from, salt);
        TP_CHECK(tp_tensor_set_item(
                     t, i, (double)wrap(tp_tensor_dtype(t), v)) == TP_OK);
    }
}

static void
expect_eq(const char *what, tp_tensor *t, int64_t i, double want, bool approx)
{
    double got = 0;
    TP_CHECK(tp_tensor_item(t, i, &got) == TP_OK);
    // avg: the quotient rounded to the dtype (f16/bf16 have 11/8 bits).
    tp_dtype dt = tp_tensor_dtype(t);
    double rel = dt == TP_F16 || dt == TP_BF16 ? 1e-2 : 1e-6;
    bool ok =
        approx ? fabs(got - want) <= rel * fabs(want) + 1e-9 : got == want;
    TP_CHECKF(ok, "%s: element %" PRId64 " is %g, want %g", what, i, got, want);
}

// ---- the matrix
// --------------------------------------------------------------

static const size_t k_sizes[] = {0, 1, 1037};

static void
check_reduce_kinds(tp_pg *pg, int rank, int n)
{
    tp_error *err = NULL;
    char what[160];
    int salt = 0;
    for (size_t d = 0; d < sizeof(k_dtypes) / sizeof(k_dtypes[0]); d++) {
        for (size_t o = 0; o < sizeof(k_ops) / sizeof(k_ops[0]); o++) {
            tp_dtype dt = k_dtypes[d];
            tp_reduce_op op = k_ops[o];
            if (!op_ok(op, dt)) {
                continue;
            }
            bool approx = op == TP_REDUCE_AVG;
            for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
                size_t count = k_sizes[s];
                salt++;
                // all_reduce
                tp_tensor *t = tensor(dt, count);
                fill(t, op, rank, salt, 0);
                TP_CHECK_OK(tp_pg_all_reduce(pg, t, op, NULL, &err), err);
                snprintf(what, sizeof(what), "all_reduce %s %s n=%d count=%zu",
                         tp_dtype_name(dt), op_name(op), n, count);
                for (size_t i = 0; i < count; i++) {
                    expect_eq(what, t, (int64_t)i,
                              reference(dt, op, n, i, salt), approx);
                }
                // reduce to the last rank: others unchanged
                int root = n - 1;
                fill(t, op, rank, salt, 0);
                TP_CHECK_OK(tp_pg_reduce(pg, t, root, op, NULL, &err), err);
                snprintf(what, sizeof(what), "reduce %s %s n=%d count=%zu",
                         tp_dtype_name(dt), op_name(op), n, count);
                for (size_t i = 0; i < count; i++) {
                    double want =
                        rank == root
                            ? reference(dt, op, n, i, salt)
                            : (double)wrap(dt, value(op, rank, i, salt));
                    expect_eq(what, t, (int64_t)i, want,
                              approx && rank == root);
                }
                tp_tensor_unref(t);
                // reduce_scatter: block r of rank q's input = value(q,
                // r*count+i)
                tp_tensor *in = tensor(dt, count * (size_t)n);
                tp_tensor *out = tensor(dt, count);
                fill(in, op, rank, salt, 0);
                TP_CHECK_OK(tp_pg_reduce_scatter(pg, out, in, op, NULL, &err),
                            err);
                snprintf(what, sizeof(what),
                         "reduce_scatter %s %s n=%d count=%zu",
                         tp_dtype_name(dt), op_name(op), n, count);
                for (size_t i = 0; i < count; i++) {
                    expect_eq(
                        what, out, (int64_t)i,
                        reference(dt, op, n, (size_t)rank * count + i, salt),
                        approx);
                }
                tp_tensor_unref(in);
                tp_tensor_unref(out);
            }
        }
    }
}

static void
check_data_kinds(tp_pg *pg, int rank, int n)
{
    static const tp_dtype dts[] = {TP_F32, TP_I8, TP_F16, TP_I64};
    tp_error *err = NULL;
    char what[160];
    for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
        tp_dtype dt = dts[d];
        for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
            size_t count = k_sizes[s];
            for (int root = 0; root<n; root += n> 1 ? n - 1 : 1) {
                int salt = (int)(d * 10 + s) + root;
                // broadcast
                tp_tensor *t = tensor(dt, count);
                fill(t, TP_REDUCE_SUM, rank, salt, 0);
                TP_CHECK_OK(tp_pg_broadcast(pg, t, root, NULL, &err), err);
                snprintf(what, sizeof(what),
                         "broadcast %s n=%d count=%zu root=%d",
                         tp_dtype_name(dt), n, count, root);
                for (size_t i = 0; i < count; i++) {
                    expect_eq(
                        what, t, (int64_t)i,
                        (double)wrap(dt, value(TP_REDUCE_SUM, root, i, salt)),
                        false);
                }
                tp_tensor_unref(t);
                // gather / scatter
                tp_tensor *small = tensor(dt, count);
                tp_tensor *big = tensor(dt, count * (size_t)n);
                fill(small, TP_REDUCE_SUM, rank, salt, 0);
                TP_CHECK_OK(tp_pg_gather(pg, rank == root ? big : NULL, small,
                                         root, NULL, &err),
                            err);
                snprintf(what, sizeof(what), "gather %s n=%d count=%zu root=%d",
                         tp_dtype_name(dt), n, count, root);
                if (rank == root) {
                    for (int q = 0; q < n; q++) {
                        for (size_t i = 0; i < count; i++) {
                            expect_eq(what, big,
                                      (int64_t)((size_t)q * count + i),
                                      (double)wrap(
                                          dt, value(TP_REDUCE_SUM, q, i, salt)),
                                      false);
                        }
                    }
                }
                fill(big, TP_REDUCE_SUM, rank, salt, 0);
                TP_CHECK_OK(tp_pg_scatter(pg, small, rank == root ? big : NULL,
                                          root, NULL, &err),
                            err);
                snprintf(what, sizeof(what),
                         "scatter %s n=%d count=%zu root=%d", tp_dtype_name(dt),
                         n, count, root);
                for (size_t i = 0; i < count; i++) {
                    expect_eq(
                        what, small, (int64_t)i,
                        (double)wrap(dt, value(TP_REDUCE_SUM, root,
                                               (size_t)rank * count + i, salt)),
                        false);
                }
                tp_tensor_unref(small);
                tp_tensor_unref(big);
            }
            int salt = (int)(d * 10 + s);
            // all_gather
            tp_tensor *in = tensor(dt, count);
            tp_tensor *out = tensor(dt, count * (size_t)n);
            fill(in, TP_REDUCE_SUM, rank, salt, 0);
            TP_CHECK_OK(tp_pg_all_gather(pg, out, in, NULL, &err), err);
            snprintf(what, sizeof(what), "all_gather %s n=%d count=%zu",
                     tp_dtype_name(dt), n, count);
            for (int q = 0; q < n; q++) {
                for (size_t i = 0; i < count; i++) {
                    expect_eq(
                        what, out, (int64_t)((size_t)q * count + i),
                        (double)wrap(dt, value(TP_REDUCE_SUM, q, i, salt)),
                        false);
                }
            }
            tp_tensor_unref(in);
            tp_tensor_unref(out);
            // all_to_all, equal: block j of rank q = value(q, j*count + i)
            in = tensor(dt, count * (size_t)n);
            out = tensor(dt, count * (size_t)n);
            fill(in, TP_REDUCE_SUM, rank, salt, 0);
            TP_CHECK_OK(tp_pg_all_to_all(pg, out, in, NULL, NULL, NULL, &err),
                        err);
            snprintf(what, sizeof(what), "all_to_all %s n=%d count=%zu",
                     tp_dtype_name(dt), n, count);
            for (int q = 0; q < n; q++) {
                for (size_t i = 0; i < count; i++) {
                    expect_eq(
                        what, out, (int64_t)((size_t)q * count + i),
                        (double)wrap(dt, value(TP_REDUCE_SUM, q,
                                               (size_t)rank * count + i, salt)),
                        false);
                }
            }
            tp_tensor_unref(in);
            tp_tensor_unref(out);
        }
    }
    // all_to_all, unequal: rank q sends (q + j) % 3 + count rows to rank j.
    for (size_t s = 0; s < sizeof(k_sizes) / sizeof(k_sizes[0]); s++) {
        int64_t base = (int64_t)k_sizes[s] % 5;
        int64_t insp[MAX_WORLD], outsp[MAX_WORLD];
        int64_t inrows = 0, outrows = 0;
        for (int j = 0; j < n; j++) {
            insp[j] = (rank + j) % 3 + base;
            outsp[j] = (j + rank) % 3 + base;
            inrows += insp[j];
            outrows += outsp[j];
        }
        int64_t ishape[2] = {inrows, 2}, oshape[2] = {outrows, 2};
        tp_tensor *in = NULL, *out = NULL;
        TP_CHECK_OK(tp_tensor_zeros(TP_I32, 2, ishape, &in, &err), err);
        TP_CHECK_OK(tp_tensor_zeros(TP_I32, 2, oshape, &out, &err), err);
        // element k of the block for rank j: rank*1000 + j*100 + k
        int64_t off = 0;
        for (int j = 0; j < n; j++) {
            for (int64_t k = 0; k < insp[j] * 2; k++) {
                tp_tensor_set_item(in, off + k,
                                   rank * 1000 + j * 100 + (double)k);
            }
            off += insp[j] * 2;
        }
        TP_CHECK_OK(tp_pg_all_to_all(pg, out, in, outsp, insp, NULL, &err),
                    err);
        off = 0;
        for (int q = 0; q < n; q++) {
            for (int64_t k = 0; k < outsp[q] * 2; k++) {
                expect_eq("all_to_all unequal", out, off + k,
                          q * 1000 + rank * 100 + (double)k, false);
            }
            off += outsp[q] * 2;
        }
        tp_tensor_unref(in);
        tp_tensor_unref(out);
    }
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
}

static void
matrix_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    check_reduce_kinds(pg, rank, world);
    check_data_kinds(pg, rank, world);
    tp_pg_destroy(pg);
}

static void
run_matrix(int world, const char *const *env)
{
    tp_job j = {.world = world, .fn = matrix_rank, .limit_ms = 240000};
    for (int e = 0; env != NULL && env[e] != NULL; e++) {
        j.env[e] = env[e];
    }
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

static const char *const k_env_pipe[] = {"TP_COLL_ENGINE=pipe", NULL};
static const char *const k_env_pipe_large[] = {
    "TP_COLL_ENGINE=pipe", "TP_COLL_SMALL_MAX=64", "TP_COLL_CHUNK=4096", NULL};
static const char *const k_env_auto[] = {"TP_COLL_ENGINE=auto", NULL};

static void
test_matrix_world1(void)
{
    run_matrix(1, k_env_pipe);
    run_matrix(1, k_env_auto);
}

static void
test_matrix_world2(void)
{
    run_matrix(2, k_env_pipe);
    run_matrix(2, k_env_pipe_large);
    run_matrix(2, k_env_auto);
}

static void
test_matrix_world3(void)
{
    run_matrix(3, k_env_pipe);
    run_matrix(3, k_env_pipe_large);
    run_matrix(3, k_env_auto);
}

static void
test_matrix_world4(void)
{
    run_matrix(4, k_env_pipe);
    run_matrix(4, k_env_pipe_large);
    run_matrix(4, k_env_auto);
}

static void
test_matrix_world8(void)
{
    run_matrix(8, k_env_pipe_large);
    run_matrix(8, k_env_auto);
}

// ---- 64 MiB
// ------------------------------------------------------------------

static void
big_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    size_t count = (64u << 20) / sizeof(float);
    tp_tensor *t = tensor(TP_F32, count);
    float *f = tp_tensor_data(t);
    for (size_t i = 0; i < count; i++) {
        f[i] = (float)((i + (size_t)rank * 5) % 1000);
    }
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    for (size_t i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < world; r++) {
            want += (float)((i + (size_t)r * 5) % 1000);
        }
        TP_CHECKF(f[i] == want, "all_reduce 64 MiB: element %zu is %g, want %g",
                  i, (double)f[i], (double)want);
    }
    // broadcast from the last rank
    for (size_t i = 0; i < count; i++) {
        f[i] = (float)(rank * 3 + (int)(i % 7));
    }
    TP_CHECK_OK(tp_pg_broadcast(pg, t, world - 1, NULL, &err), err);
    for (size_t i = 0; i < count; i += 4099) {
        TP_CHECK(f[i] == (float)((world - 1) * 3 + (int)(i % 7)));
    }
    // reduce_scatter of 64 MiB: block r of every rank, summed.
    // (64 MiB rounded down to whole blocks: a view of the first n x block)
    size_t block = count / (size_t)world;
    tp_tensor *whole = t;
    TP_CHECK_OK(tp_tensor_narrow(whole, 0, 0, (int64_t)(block * (size_t)world),
                                 &t, &err),
                err);
    tp_tensor *part = tensor(TP_F32, block);
    float *pp = tp_tensor_data(part);
    for (size_t i = 0; i < block * (size_t)world; i++) {
        f[i] = (float)((i + (size_t)rank * 3) % 501);
    }
    TP_CHECK_OK(tp_pg_reduce_scatter(pg, part, t, TP_REDUCE_SUM, NULL, &err),
                err);
    for (size_t i = 0; i < block; i++) {
        size_t g = (size_t)rank * block + i;
        float want = 0;
        for (int r = 0; r < world; r++) {
            want += (float)((g + (size_t)r * 3) % 501);
        }
        TP_CHECKF(pp[i] == want, "reduce_scatter 64 MiB: [%zu] = %g, want %g",
                  i, (double)pp[i], (double)want);
    }
    // all_gather back into 64 MiB.
    for (size_t i = 0; i < block; i++) {
        pp[i] = (float)(rank * 1000 + (int)(i % 997));
    }
    TP_CHECK_OK(tp_pg_all_gather(pg, t, part, NULL, &err), err);
    for (size_t i = 0; i < block * (size_t)world; i++) {
        float want = (float)((int)(i / block) * 1000 + (int)(i % block % 997));
        TP_CHECKF(f[i] == want, "all_gather 64 MiB: [%zu] = %g, want %g", i,
                  (double)f[i], (double)want);
    }
    // all_to_all of 64 MiB: block j of rank q goes to rank j.
    tp_tensor *o2 = tensor(TP_F32, block * (size_t)world);
    float *po = tp_tensor_data(o2);
    for (size_t i = 0; i < block * (size_t)world; i++) {
        f[i] = (float)(rank * 100 + (int)(i / block) * 10 + (int)(i % 7));
    }
    TP_CHECK_OK(tp_pg_all_to_all(pg, o2, t, NULL, NULL, NULL, &err), err);
    for (size_t i = 0; i < block * (size_t)world; i++) {
        size_t q = i / block, k = i % block;
        float want = (float)((int)q * 100 + rank * 10 +
                             (int)(((size_t)rank * block + k) % 7));
        TP_CHECKF(po[i] == want, "all_to_all 64 MiB: [%zu] = %g, want %g", i,
                  (double)po[i], (double)want);
    }
    tp_tensor_unref(o2);
    tp_tensor_unref(part);
    tp_tensor_unref(t);
    tp_tensor_unref(whole);
    tp_pg_destroy(pg);
}

static void
test_64mib(void)
{
    static const char *const *envs[] = {k_env_pipe, k_env_auto};
    for (size_t e = 0; e < 2; e++) {
        tp_job j = {.world = 2, .fn = big_rank, .limit_ms = 120000};
        j.env[0] = envs[e][0];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
    tp_job j = {.world = 3, .fn = big_rank, .limit_ms = 120000};
    j.env[0] = "TP_COLL_ENGINE=pipe";
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

// ---- subgroups
// -------------------------------------------------------------------

static void
subgroup_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    const int members[2] = {3, 1}; // any order; group rank by sorted order
    tp_pg *sub = NULL;
    if (rank == 1 || rank == 3) {
        TP_CHECK_OK(tp_pg_new_group(pg, members, 2, NULL, &sub, &err), err);
        TP_CHECK(sub != NULL);
        TP_CHECK_EQ(tp_pg_size(sub), 2);
        TP_CHECK_EQ(tp_pg_rank(sub), rank == 1 ? 0 : 1);
        TP_CHECK_EQ(tp_pg_world_rank(sub, 1), 3);
        // a second group of the same ranks is a different group
        tp_pg *sub2 = NULL;
        TP_CHECK_OK(tp_pg_new_group(pg, members, 2, NULL, &sub2, &err), err);
        tp_tensor *t = tensor(TP_I64, 5);
        tp_tensor *t2 = tensor(TP_I64, 5);
        fill(t, TP_REDUCE_SUM, rank, 1, 0);
        fill(t2, TP_REDUCE_SUM, rank, 2, 0);
        tp_work *w2 = NULL;
        // async on sub2 first, then blocking on sub: independent groups
        TP_CHECK_OK(tp_pg_all_reduce(sub2, t2, TP_REDUCE_MAX, &w2, &err), err);
        TP_CHECK_OK(tp_pg_all_reduce(sub, t, TP_REDUCE_SUM, NULL, &err), err);
        TP_CHECK_OK(tp_work_wait(w2, tp_test_ms(30000), &err), err);
        tp_work_free(w2);
        for (int i = 0; i < 5; i++) {
            double want = (double)(value(TP_REDUCE_SUM, 1, (size_t)i, 1) +
                                   value(TP_REDUCE_SUM, 3, (size_t)i, 1));
            expect_eq("subgroup sum", t, i, want, false);
            int64_t a = value(TP_REDUCE_SUM, 1, (size_t)i, 2);
            int64_t b = value(TP_REDUCE_SUM, 3, (size_t)i, 2);
            expect_eq("subgroup max", t2, i, (double)(a > b ? a : b), false);
        }
        TP_CHECK_OK(tp_pg_barrier(sub, NULL, &err), err);
        tp_tensor_unref(t);
        tp_tensor_unref(t2);
        tp_pg_destroy(sub2);
        tp_pg_destroy(sub);
    } else {
        // Non-members get no handle and are not blocked: they talk among
        // themselves meanwhile.
        TP_CHECK_OK(tp_pg_new_group(pg, members, 2, NULL, &sub, &err), err);
        TP_CHECK(sub == NULL);
        const int pair[2] = {0, 2};
        tp_pg *other = NULL;
        TP_CHECK_OK(tp_pg_new_group(pg, pair, 2, NULL, &other, &err), err);
        tp_tensor *t = tensor(TP_F32, 3);
        fill(t, TP_REDUCE_SUM, rank, 0, 0);
        TP_CHECK_OK(tp_pg_all_reduce(other, t, TP_REDUCE_SUM, NULL, &err), err);
        expect_eq("other pair", t, 0,
                  (double)(value(TP_REDUCE_SUM, 0, 0, 0) +
                           value(TP_REDUCE_SUM, 2, 0, 0)),
                  false);
        tp_tensor_unref(t);
        tp_pg_destroy(other);
    }
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    tp_pg_destroy(pg);
}

static void
test_subgroups(void)
{
    const char *const *envs[] = {k_env_pipe, k_env_auto};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 4, .fn = subgroup_rank};
        j.env[0] = envs[e][0];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// ---- async
// ---------------------------------------------------------------------

#define NASYNC 64

static void
async_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t[NASYNC];
    tp_work *w[NASYNC];
    for (int k = 0; k < NASYNC; k++) {
        t[k] = tensor(TP_I32, (size_t)(k * 37 % 300));
        fill(t[k], TP_REDUCE_SUM, rank, k, 0);
        if (k % 8 == 7) {
            TP_CHECK_OK(tp_pg_broadcast(pg, t[k], k % world, &w[k], &err), err);
        } else {
            TP_CHECK_OK(tp_pg_all_reduce(pg, t[k], TP_REDUCE_SUM, &w[k], &err),
                        err);
        }
    }
    // A blocking collective behind them runs after them.
    tp_tensor *last = tensor(TP_F64, 4);
    fill(last, TP_REDUCE_SUM, rank, 99, 0);
    TP_CHECK_OK(tp_pg_all_reduce(pg, last, TP_REDUCE_SUM, NULL, &err), err);
    for (int k = NASYNC - 1; k >= 0; k--) {
        TP_CHECK(tp_work_is_completed(w[k]));
        TP_CHECK_OK(tp_work_wait(w[k], tp_test_ms(30000), &err), err);
        TP_CHECK(tp_work_error(w[k]) == NULL);
        int64_t count = tp_tensor_numel(t[k]);
        for (int64_t i = 0; i < count; i++) {
            double want =
                k % 8 == 7
                    ? (double)value(TP_REDUCE_SUM, k % world, (size_t)i, k)
                    : reference(TP_I32, TP_REDUCE_SUM, world, (size_t)i, k);
            expect_eq("async", t[k], i, want, false);
        }
        tp_work_free(w[k]);
        tp_tensor_unref(t[k]);
    }
    expect_eq("blocking behind async", last, 3,
              reference(TP_F64, TP_REDUCE_SUM, world, 3, 99), false);
    tp_tensor_unref(last);
    // A work freed before it completed still runs; its tensor stays alive.
    tp_tensor *x = tensor(TP_F32, 1000);
    tp_work *wx = NULL;
    TP_CHECK_OK(tp_pg_all_reduce(pg, x, TP_REDUCE_SUM, &wx, &err), err);
    tp_tensor_unref(x);
    tp_work_free(wx);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    tp_pg_destroy(pg);
}

static void
test_async(void)
{
    const char *const *envs[] = {k_env_pipe, k_env_auto};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 3, .fn = async_rank};
        j.env[0] = envs[e][0];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// ---- point to point
// --------------------------------------------------------------

static void
p2p_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    if (rank == 0) {
        // Tags: receive tag 2 before tag 1 from rank 1.
        tp_tensor *a = tensor(TP_I32, 10), *b = tensor(TP_I32, 10);
        TP_CHECK_OK(tp_pg_recv(pg, b, 1, 2, NULL, &err), err);
        TP_CHECK_OK(tp_pg_recv(pg, a, 1, 1, NULL, &err), err);
        expect_eq("tag 1", a, 9, 109, false);
        expect_eq("tag 2", b, 9, 209, false);
        // Any source: one message from every other rank.
        bool seen[MAX_WORLD] = {false};
        for (int k = 1; k < world; k++) {
            tp_tensor *t = tensor(TP_I64, 3);
            tp_work *w = NULL;
            TP_CHECK_OK(tp_pg_recv(pg, t, TP_ANY_SOURCE, 7, &w, &err), err);
            TP_CHECK_OK(tp_work_wait(w, tp_test_ms(30000), &err), err);
            int src = tp_work_source(w);
            TP_CHECK(src >= 1 && src < world && !seen[src]);
            seen[src] = true;
            expect_eq("any source", t, 2, src * 10 + 2, false);
            tp_work_free(w);
            tp_tensor_unref(t);
        }
        // Many in flight, completed in any order.
        tp_work *w[32];
        tp_tensor *t[32];
        for (int k = 0; k < 32; k++) {
            t[k] = tensor(TP_U8, (size_t)k * 1000);
            TP_CHECK_OK(tp_pg_recv(pg, t[k], 1, 100 + k, &w[k], &err), err);
        }
        for (int k = 31; k >= 0; k--) {
            TP_CHECK_OK(tp_work_wait(w[k], tp_test_ms(30000), &err), err);
            if (k > 0) {
                expect_eq("many", t[k], k * 1000 - 1, (k * 1000 - 1 + k) % 256,
                          false);
            }
            tp_work_free(w[k]);
            tp_tensor_unref(t[k]);
        }
        // A size mismatch fails the recv, naming the sizes.
        tp_tensor *small = tensor(TP_U8, 4);
        tp_status st = tp_pg_recv(pg, small, 1, 9, NULL, &err);
        TP_CHECK_EQ(st, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "8 bytes");
        tp_error_unref(err);
        err = NULL;
        tp_tensor_unref(small);
        // to itself
        tp_tensor *me = tensor(TP_F32, 2);
        tp_tensor_set_item(me, 1, 5);
        tp_tensor *me2 = tensor(TP_F32, 2);
        tp_work *ws = NULL;
        TP_CHECK_OK(tp_pg_send(pg, me, 0, 3, &ws, &err), err);
        TP_CHECK_OK(tp_pg_recv(pg, me2, 0, 3, NULL, &err), err);
        TP_CHECK_OK(tp_work_wait(ws, tp_test_ms(10000), &err), err);
        tp_work_free(ws);
        expect_eq("self", me2, 1, 5, false);
        tp_tensor_unref(me);
        tp_tensor_unref(me2);
        tp_tensor_unref(a);
        tp_tensor_unref(b);
    } else {
        if (rank == 1) {
            tp_tensor *a = tensor(TP_I32, 10), *b = tensor(TP_I32, 10);
            for (int i = 0; i < 10; i++) {
                tp_tensor_set_item(a, i, 100 + i);
                tp_tensor_set_item(b, i, 200 + i);
            }
            TP_CHECK_OK(tp_pg_send(pg, a, 0, 1, NULL, &err), err);
            TP_CHECK_OK(tp_pg_send(pg, b, 0, 2, NULL, &err), err);
            tp_tensor_unref(a);
            tp_tensor_unref(b);
        }
        tp_tensor *t = tensor(TP_I64, 3);
        for (int i = 0; i < 3; i++) {
            tp_tensor_set_item(t, i, rank * 10 + i);
        }
        TP_CHECK_OK(tp_pg_send(pg, t, 0, 7, NULL, &err), err);
        tp_tensor_unref(t);
        if (rank == 1) {
            tp_work *w[32];
            tp_tensor *ts[32];
            for (int k = 0; k < 32; k++) {
                ts[k] = tensor(TP_U8, (size_t)k * 1000);
                uint8_t *p = tp_tensor_data(ts[k]);
                for (int i = 0; i < k * 1000; i++) {
                    p[i] = (uint8_t)((i + k) % 256);
                }
                TP_CHECK_OK(tp_pg_send(pg, ts[k], 0, 100 + k, &w[k], &err),
                            err);
            }
            for (int k = 0; k < 32; k++) {
                TP_CHECK_OK(tp_work_wait(w[k], tp_test_ms(30000), &err), err);
                tp_work_free(w[k]);
                tp_tensor_unref(ts[k]);
            }
            tp_tensor *eight = tensor(TP_U8, 8);
            tp_status st = tp_pg_send(pg, eight, 0, 9, NULL, &err);
            // The sender's write completes (the receiver drops it).
            TP_CHECKF(st == TP_OK || st == TP_EINVAL, "send: %s",
                      tp_error_message(err));
            tp_error_unref(err);
            err = NULL;
            tp_tensor_unref(eight);
        }
    }
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    tp_pg_destroy(pg);
}

static void
test_p2p(void)
{
    tp_job j = {.world = 3, .fn = p2p_rank};
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

// ---- errors
// ---------------------------------------------------------------------

static void
expect_err(tp_status st, tp_error *err, tp_status want, const char *needle)
{
    TP_CHECKF(st == want, "status %s, want %s: %s", tp_status_name(st),
              tp_status_name(want), tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    tp_error_unref(err);
}

// @expr is evaluated before its error is looked at (argument order is
// unspecified in C).
#define EXPECT_ERR(expr, want, needle)                                         \
    do {                                                                       \
        err = NULL;                                                            \
        tp_status st_ = (expr);                                                \
        expect_err(st_, err, (want), (needle));                                \
        err = NULL;                                                            \
    } while (0)

static void
args_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *f = tensor(TP_F32, 4), *i8 = tensor(TP_I8, 8);
    tp_tensor *f8 = tensor(TP_F32, 8), *f3 = tensor(TP_F32, 3);
    EXPECT_ERR(tp_pg_broadcast(pg, f, 2, NULL, &err), TP_EINVAL, "root 2");
    EXPECT_ERR(tp_pg_all_reduce(pg, i8, TP_REDUCE_AVG, NULL, &err), TP_EINVAL,
               "avg");
    EXPECT_ERR(tp_pg_all_reduce(pg, f, TP_REDUCE_BXOR, NULL, &err), TP_EINVAL,
               "bxor");
    EXPECT_ERR(tp_pg_all_gather(pg, i8, f, NULL, &err), TP_EINVAL, "dtype");
    EXPECT_ERR(tp_pg_all_gather(pg, f3, f, NULL, &err), TP_EINVAL, "elements");
    EXPECT_ERR(tp_pg_reduce_scatter(pg, f, f3, TP_REDUCE_SUM, NULL, &err),
               TP_EINVAL, "elements");
    const int64_t bad_splits[2] = {5, 5};
    EXPECT_ERR(tp_pg_all_to_all(pg, f8, f8, bad_splits, bad_splits, NULL, &err),
               TP_EINVAL, "split");
    EXPECT_ERR(tp_pg_all_to_all(pg, f3, f3, NULL, NULL, NULL, &err), TP_EINVAL,
               "divisible");
    // A strided view is refused by point-to-point (collectives take it:
    // pg_future_test.c).
    tp_tensor *view = NULL;
    const int64_t sh[1] = {2}, strd[1] = {2};
    TP_CHECK_OK(tp_tensor_as_strided(f, 1, sh, strd, 0, &view, &err), err);
    EXPECT_ERR(tp_pg_send(pg, view, 0, 0, NULL, &err), TP_EINVAL, "contiguous");
    EXPECT_ERR(tp_pg_send(pg, f, 5, 0, NULL, &err), TP_EINVAL, "rank 5");
    EXPECT_ERR(tp_pg_recv(pg, f, 0, -1, NULL, &err), TP_EINVAL, "tag");
    EXPECT_ERR(tp_pg_all_reduce(NULL, f, TP_REDUCE_SUM, NULL, &err), TP_EINVAL,
               "NULL");
    // all_to_all: what this rank sends itself must be what it expects.
    const int64_t in_sp[2] = {2, 2}, out_sp[2] = {1, 3};
    tp_tensor *f4 = tensor(TP_F32, 4);
    EXPECT_ERR(tp_pg_all_to_all(pg, f4, f4, rank == 0 ? out_sp : in_sp,
                                rank == 0 ? in_sp : out_sp, NULL, &err),
               TP_EINVAL, "sends itself");
    tp_tensor_unref(f4);
    const int dup[2] = {1, 1};
    tp_pg *sub = NULL;
    EXPECT_ERR(tp_pg_new_group(pg, dup, 2, NULL, &sub, &err), TP_EINVAL,
               "twice");
    // Nothing was sent: the group still works.
    TP_CHECK_OK(tp_pg_all_reduce(pg, f, TP_REDUCE_SUM, NULL, &err), err);
    tp_tensor_unref(view);
    tp_tensor_unref(f);
    tp_tensor_unref(i8);
    tp_tensor_unref(f8);
    tp_tensor_unref(f3);
    tp_pg_destroy(pg);
}

static void
test_arg_errors(void)
{
    tp_job j = {.world = 2, .fn = args_rank};
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

static void
mismatch_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t = tensor(TP_F32, 16);
    tp_status st = rank == 0
                       ? tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err)
                       : tp_pg_broadcast(pg, t, 0, NULL, &err);
    TP_CHECKF(st == TP_EINVAL, "status %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "mismatch");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 0: all_reduce(f32");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 1: broadcast(f32");
    tp_error_unref(err);
    err = NULL;
    // The group is broken: later collectives fail at once.
    st = tp_pg_barrier(pg, NULL, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    tp_error_unref(err);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
test_debug_mismatch(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 2, .fn = mismatch_rank};
        j.env[0] = "TP_DEBUG_COLLECTIVES=1";
        j.env[1] = engines[e];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

static void
timeout_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 300);
    tp_error *err = NULL;
    if (rank == 1) {
        // Never enters the barrier; waits for rank 0 to finish.
        usleep(1500 * 1000);
        tp_pg_destroy(pg);
        return;
    }
    int64_t t0 = now_ms();
    tp_status st = tp_pg_barrier(pg, NULL, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_ETIMEDOUT, "status %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK(dt >= 250 && dt < tp_test_ms(5000));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 1");
    tp_error_unref(err);
    tp_pg_destroy(pg);
}

static void
test_timeout(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 2, .fn = timeout_rank};
        j.env[0] = engines[e];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// Malformed messages from a raw pipe close that pipe only: rank 0 keeps
// working with rank 1's real pipes.
static void
noop_cb(void *arg)
{
    (void)arg;
}

static void
send_raw(const char *url, const void *meta, uint64_t meta_len, void *tensor,
         uint64_t tensor_len)
{
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(NULL, &ctx, &err), err);
    tp_pipe *p = NULL;
    TP_CHECK_OK(tp_context_connect(ctx, url, &p, &err), err);
    tp_msg_buf t = {.data = tensor, .len = tensor_len};
    tp_message m = {.metadata = (void *)meta,
                    .metadata_len = meta_len,
                    .tensors = tensor_len > 0 ? &t : NULL,
                    .ntensors = tensor_len > 0 ? 1 : 0};
    // Each aio has its own 10 s timeout: tp_aio_wait is bounded.
    tp_aio *w = NULL, *r = NULL;
    TP_CHECK_OK(tp_aio_create(noop_cb, NULL, &w), NULL);
    TP_CHECK_OK(tp_aio_create(noop_cb, NULL, &r), NULL);
    tp_aio_set_timeout(w, tp_test_ms(10000));
    tp_aio_set_timeout(r, tp_test_ms(10000));
    tp_pipe_write(p, &m, w);
    tp_aio_wait(w);
    // The receiver closes the pipe: our read fails (not by timeout).
    tp_pipe_read_descriptor(p, r);
    tp_aio_wait(r);
    TP_CHECKF(tp_aio_status(r) != TP_OK && tp_aio_status(r) != TP_ETIMEDOUT,
              "read after a malformed message: %s",
              tp_status_name(tp_aio_status(r)));
    tp_aio_destroy(w);
    tp_aio_destroy(r);
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
}

static void
malformed_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t = tensor(TP_I32, 4);
    fill(t, TP_REDUCE_SUM, rank, 0, 0);
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    if (rank == 1) {
        tp_store *st = NULL;
        TP_CHECK_OK(tp_store_open(url, 1, world, tp_test_ms(10000), &st, &err),
                    err);
        void *v = NULL;
        size_t len = 0;
        // the first job of this world size on the store (pg.c)
        char key[64];
        snprintf(key, sizeof(key), "tp.pg/w%d/0/addr/0", world);
        TP_CHECK_OK(tp_store_get(st, key, tp_test_ms(10000), &v, &len, &err),
                    err);
        char addr[256];
        snprintf(addr, sizeof(addr), "%s", (const char *)v);
        char *nl = strchr(addr, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }
        free(v);
        tp_store_close(st);
        uint8_t h[40] = {0};
        send_raw(addr, "short", 5, NULL, 0); // not a header
        tp__put_u32le(h, 0x4c435054u);
        h[4] = 1;
        tp__put_u32le(h + 8, 0); // claims to come from rank 0 itself
        send_raw(addr, h, sizeof(h), NULL, 0);
        tp__put_u32le(h + 8, 1);
        tp__put_u64le(h + 32, 100); // 100 bytes announced, no tensor
        send_raw(addr, h, sizeof(h), NULL, 0);
        char junk[16];
        tp__put_u64le(h + 32, 8); // 8 announced, 16 sent
        send_raw(addr, h, sizeof(h), junk, sizeof(junk));
        h[5] = 9; // unknown kind
        send_raw(addr, h, sizeof(h), NULL, 0);
    }
    // Both still work together.
    fill(t, TP_REDUCE_SUM, rank, 3, 0);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    expect_eq("after malformed", t, 3,
              reference(TP_I32, TP_REDUCE_SUM, world, 3, 3), false);
    tp_tensor *x = tensor(TP_U8, 64);
    if (rank == 1) {
        TP_CHECK_OK(tp_pg_send(pg, x, 0, 1, NULL, &err), err);
    } else {
        TP_CHECK_OK(tp_pg_recv(pg, x, 1, 1, NULL, &err), err);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
test_malformed(void)
{
    tp_job j = {.world = 2, .fn = malformed_rank};
    j.env[0] = "TP_COLL_ENGINE=pipe";
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

typedef struct waiter {
    tp_work *w;
    tp_status st;
} waiter;

static void *
waiter_main(void *arg)
{
    waiter *wt = arg;
    tp_error *err = NULL;
    wt->st = tp_work_wait(wt->w, tp_test_ms(20000), &err);
    tp_error_unref(err);
    return NULL;
}

// Destroying a group finishes its pending point-to-point works with
// TP_ECLOSED (also while another thread waits on one); their handles stay
// valid after the group is gone.
static void
destroy_pending_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    const int me[1] = {rank};
    tp_pg *sub = NULL;
    TP_CHECK_OK(tp_pg_new_group(pg, me, 1, NULL, &sub, &err), err);
    tp_tensor *a = tensor(TP_F32, 4), *b = tensor(TP_F32, 4);
    tp_work *wa = NULL, *wb = NULL, *wc = NULL;
    TP_CHECK_OK(tp_pg_recv(sub, a, 0, 7, &wa, &err), err);
    TP_CHECK_OK(tp_pg_recv(pg, b, TP_ANY_SOURCE, 7, &wb, &err), err);
    // one already complete: a send to itself, unmatched (unexpected)
    TP_CHECK_OK(tp_pg_send(pg, a, rank, 9, &wc, &err), err);
    // Another thread waits on a recv of a second subgroup while this one
    // destroys it.
    tp_pg *sub2 = NULL;
    TP_CHECK_OK(tp_pg_new_group(pg, me, 1, NULL, &sub2, &err), err);
    tp_tensor *c = tensor(TP_F32, 4);
    waiter wt = {.st = TP_OK};
    TP_CHECK_OK(tp_pg_recv(sub2, c, 0, 7, &wt.w, &err), err);
    pthread_t th;
    TP_CHECK(pthread_create(&th, NULL, waiter_main, &wt) == 0);
    usleep(50 * 1000);
    tp_pg_destroy(sub2);
    TP_CHECK(pthread_join(th, NULL) == 0);
    TP_CHECK_EQ(wt.st, TP_ECLOSED);
    tp_work_free(wt.w);
    tp_tensor_unref(c);
    tp_pg_destroy(sub);
    TP_CHECK(tp_work_is_completed(wa));
    TP_CHECK_EQ(tp_work_wait(wa, 1000, &err), TP_ECLOSED);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "destroyed");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK(!tp_work_is_completed(wb));
    tp_pg_destroy(pg);
    TP_CHECK_EQ(tp_work_wait(wb, 1000, &err), TP_ECLOSED);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(tp_work_wait(wc, 1000, &err), err);
    tp_work_free(wa);
    tp_work_free(wb);
    tp_work_free(wc);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

static void
test_destroy_pending(void)
{
    tp_job j = {.world = 2, .fn = destroy_pending_rank};
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

// Ranks disagree on a count without TP_DEBUG_COLLECTIVES: the ranks that
// see it fail, and tell the others (pipe engine: an abort), so nobody
// waits for the deadline.
static void
count_mismatch_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    size_t cnt = rank == 1 ? 8 : 4;
    tp_tensor *in = tensor(TP_F32, cnt);
    tp_tensor *out = tensor(TP_F32, cnt * (size_t)world);
    int64_t t0 = now_ms();
    tp_status st = tp_pg_all_gather(pg, out, in, NULL, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st != TP_OK,
              "rank %d: all_gather with mismatched counts "
              "succeeded",
              rank);
    TP_CHECKF(dt < tp_test_ms(2000), "rank %d failed after %" PRId64 " ms: %s",
              rank, dt, tp_error_message(err));
    tp_error_unref(err);
    tp_tensor_unref(in);
    tp_tensor_unref(out);
    // Stay until everyone has failed (an exit is no failure of theirs).
    usleep(300 * 1000);
    tp_pg_destroy(pg);
}

static void
test_count_mismatch(void)
{
    tp_job j = {.world = 3, .fn = count_mismatch_rank};
    j.env[0] = "TP_COLL_ENGINE=pipe";
    file_url(j.url, sizeof(j.url));
    job_run(&j);
}

// Rank 2 never enters the barrier; rank 1 has a short timeout, rank 0 a
// long one: rank 1's failure must reach rank 0 (which waits on rank 2, a
// live rank) within a second, naming rank 2.
static void
gave_up_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, rank == 1 ? 300 : 60000);
    tp_error *err = NULL;
    if (rank == 2) {
        usleep(2500 * 1000);
        tp_pg_destroy(pg);
        return;
    }
    int64_t t0 = now_ms();
    tp_status st = tp_pg_barrier(pg, NULL, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st != TP_OK, "barrier without rank 2 succeeded");
    TP_CHECKF(dt < 300 + tp_test_ms(1500),
              "rank %d failed after %" PRId64 " ms: %s", rank, dt,
              tp_error_message(err));
    TP_CHECKF(strstr(tp_error_message(err), "rank 2") != NULL,
              "rank %d: error does not name rank 2: %s", rank,
              tp_error_message(err));
    tp_error_unref(err);
    tp_pg_destroy(pg);
}

static void
test_gave_up(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 3, .fn = gave_up_rank};
        j.env[0] = engines[e];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// Rank 2 dies while the others are in an all_reduce.
static void
kill_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t = tensor(TP_F32, 1 << 16);
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    if (rank == 2) {
        usleep(200 * 1000);
        raise(SIGKILL);
    }
    int64_t t0 = now_ms();
    tp_status st = tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st != TP_OK, "all_reduce with a dead member succeeded");
    // 200 ms before the death + detection within a second.
    TP_CHECKF(dt < 1200 + tp_test_ms(800), "failed after %" PRId64 " ms: %s",
              dt, tp_error_message(err));
    TP_CHECKF(strstr(tp_error_message(err), "rank 2") != NULL,
              "error does not name rank 2: %s", tp_error_message(err));
    tp_error_unref(err);
    err = NULL;
    // Later collectives fail at once; point-to-point with a live rank works.
    t0 = now_ms();
    st = tp_pg_barrier(pg, NULL, &err);
    TP_CHECK(st != TP_OK && now_ms() - t0 < 1000);
    tp_error_unref(err);
    err = NULL;
    tp_tensor *x = tensor(TP_I32, 2);
    if (rank == 0) {
        TP_CHECK_OK(tp_pg_send(pg, x, 1, 5, NULL, &err), err);
    } else {
        TP_CHECK_OK(tp_pg_recv(pg, x, 0, 5, NULL, &err), err);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
test_rank_killed(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = 3, .fn = kill_rank, .expect_sig[2] = SIGKILL};
        j.env[0] = engines[e];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// ---- init methods
// ---------------------------------------------------------------

static void
small_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t = tensor(TP_I64, 3);
    fill(t, TP_REDUCE_SUM, rank, 0, 0);
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    expect_eq("sum", t, 2, reference(TP_I64, TP_REDUCE_SUM, world, 2, 0),
              false);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
env_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    char r[16], w[16];
    snprintf(r, sizeof(r), "%d", rank);
    snprintf(w, sizeof(w), "%d", world);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", w, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", url, 1);
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pg_init("env://", -1, -1, NULL, &pg, &err), err);
    TP_CHECK_EQ(tp_pg_rank(pg), rank);
    TP_CHECK_EQ(tp_pg_size(pg), world);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    tp_pg_destroy(pg);
}

static void
missing_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = 500;
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = tp_pg_init(url, rank, world, &o, &pg, &err);
    TP_CHECKF(st == TP_ETIMEDOUT, "status %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "ranks 2 did not join");
    tp_error_unref(err);
}

static void
test_init_methods(void)
{
    tp_job j = {.world = 3, .fn = small_rank};
    tcp_url(j.url, sizeof(j.url));
    job_run(&j);
    tp_job je = {.world = 2, .fn = env_rank};
    snprintf(je.url, sizeof(je.url), "%d", tp_test_free_port());
    job_run(&je);
    tp_job jm = {.world = 3, .nstart = 2, .fn = missing_rank};
    file_url(jm.url, sizeof(jm.url));
    job_run(&jm);
    // bad arguments
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    EXPECT_ERR(tp_pg_init(jm.url, 3, 2, NULL, &pg, &err), TP_EINVAL,
               "rank 3 of world size 2");
}

// ---- 64 ranks (slow)
// -----------------------------------------------------------

static void
slow_world64(void)
{
    tp_job j = {.world = 64, .fn = small_rank, .limit_ms = 300000};
    file_url(j.url, sizeof(j.url));
    job_run(&j);
    tp_job j2 = {.world = 64, .fn = small_rank, .limit_ms = 300000};
    j2.env[0] = "TP_COLL_ENGINE=pipe";
    file_url(j2.url, sizeof(j2.url));
    job_run(&j2);
}

static const tp_test_case k_cases[] = {
    TP_TEST_CASE_T(test_matrix_world1, 120),
    TP_TEST_CASE_T(test_matrix_world2, 240),
    TP_TEST_CASE_T(test_matrix_world3, 300),
    TP_TEST_CASE_T(test_matrix_world4, 300),
    TP_TEST_CASE_T(test_matrix_world8, 400),
    TP_TEST_CASE_T(test_64mib, 240),
    TP_TEST_CASE_T(test_subgroups, 120),
    TP_TEST_CASE_T(test_async, 120),
    TP_TEST_CASE_T(test_p2p, 120),
    TP_TEST_CASE_T(test_arg_errors, 60),
    TP_TEST_CASE_T(test_debug_mismatch, 60),
    TP_TEST_CASE_T(test_timeout, 60),
    TP_TEST_CASE_T(test_rank_killed, 60),
    TP_TEST_CASE_T(test_gave_up, 60),
    TP_TEST_CASE_T(test_malformed, 60),
    TP_TEST_CASE_T(test_destroy_pending, 60),
    TP_TEST_CASE_T(test_count_mismatch, 60),
    TP_TEST_CASE_T(test_init_methods, 120),
    TP_TEST_CASE_T(slow_world64, 600),
};

TP_TEST_MAIN(k_cases)
