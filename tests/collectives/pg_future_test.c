/* SPDX-License-Identifier: Apache-2.0 */
/* pg_future_test.c - process groups across forked ranks on loopback:
 * a work's future (tp_work_get_future) chained with tp_future_then, and
 * the same error as the work's when it fails; tp_future_wait_all over
 * collective and plain futures (all, fail-fast, timeout);
 * tp_pg_new_subgroups; tp_pg_all_reduce_coalesced; strided (transposed)
 * tensors in collectives.
 *
 * Every rank is a forked child of the case process, forked before any
 * thread exists. Every wait has a deadline. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/tpipe.h>

#include "tp_test.h"
#include "tp_test_job.h"

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
    snprintf(url, n, "file:///tmp/tp-pg-future-test-%d-%d-%lld", (int)getpid(),
             seq++, (long long)tp_job_now_ms());
}

static tp_pg *
init_pg(int rank, int world, const char *url, int64_t timeout_ms)
{
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = tp_test_ms(30000);
    o.timeout_ms = timeout_ms != 0 ? timeout_ms : tp_test_ms(60000);
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pg_init(url, rank, world, &o, &pg, &err), err);
    return pg;
}

// Two barriers, then the destroy: a pipe made for the first message
// between two ranks (the first barrier's) may still be finishing its
// channel's handshake on the sender when the receiver has its message and
// leaves; the second barrier runs on pipes that are set up.
static void
finish(tp_pg *pg)
{
    tp_error *err = NULL;
    for (int i = 0; i < 2; i++) {
        TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    }
    tp_pg_destroy(pg);
}

static tp_tensor *
tensor(tp_dtype dt, int64_t count)
{
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(dt, 1, &count, &t, &err), err);
    return t;
}

static const char *const k_engines[] = {"TP_COLL_ENGINE=pipe",
                                        "TP_COLL_ENGINE=auto"};

// Runs @fn on @world ranks, once per engine.
static void
run_engines(int world, tp_job_fn fn)
{
    for (int e = 0; e < 2; e++) {
        tp_job j = {.world = world, .fn = fn};
        j.env[0] = k_engines[e];
        file_url(j.url, sizeof(j.url));
        job_run(&j);
    }
}

// ---- tp_work_get_future
// ---------------------------------------------------------

typedef struct chain {
    tp_future *c_next; // resolved by the callback
    int c_world;
    atomic_int c_calls;
} chain;

// Checks the all_reduce's result (its future's value) and resolves the
// next future of the chain with it.
static void
chain_cb(tp_future *f, void *arg)
{
    chain *c = arg;
    atomic_fetch_add(&c->c_calls, 1);
    tp_tensor *t = tp_future_value(f);
    bool ok = tp_future_error(f) == NULL && t != NULL;
    for (int64_t i = 0; ok && i < tp_tensor_numel(t); i++) {
        double want = (double)(i * c->c_world) +
                      (double)c->c_world * (c->c_world - 1) / 2.0;
        double v = 0;
        ok = tp_tensor_item(t, i, &v) == TP_OK && v == want;
    }
    if (ok) {
        tp_future_set_value(c->c_next, tp_tensor_ref(t), NULL);
    } else {
        tp_error *e = tp_error_create(TP_EINTERNAL, tp_future_error(f),
                                      "wrong all_reduce result");
        tp_future_set_error(c->c_next, e);
        tp_error_unref(e);
    }
}

static void
future_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_tensor *t = tensor(TP_F32, 1000);
    for (int64_t i = 0; i < 1000; i++) {
        tp_tensor_set_item(t, i, (double)(i + rank));
    }
    tp_work *w = NULL;
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, &w, &err), err);
    tp_future *f = NULL;
    TP_CHECK_OK(tp_work_get_future(w, &f, &err), err);
    tp_future *f2 = NULL;
    TP_CHECK_OK(tp_work_get_future(w, &f2, &err), err);
    TP_CHECK(f == f2); // one future per work
    tp_future_unref(f2);
    chain c = {.c_world = world};
    atomic_init(&c.c_calls, 0);
    TP_CHECK_OK(tp_future_create(&c.c_next), NULL);
    TP_CHECK_OK(tp_future_then(f, chain_cb, &c), NULL);
    // The handle may go before the future resolves.
    tp_work_free(w);
    TP_CHECK_OK(tp_future_wait(c.c_next, tp_test_ms(30000), &err), err);
    TP_CHECK(tp_future_value(c.c_next) == t);
    TP_CHECK_OK(tp_future_wait(f, tp_test_ms(1000), &err), err);
    TP_CHECK(tp_future_value(f) == t);
    TP_CHECK_EQ(atomic_load(&c.c_calls), 1);
    tp_future_unref(c.c_next); // the tensor's reference: a leak the test
    tp_tensor_unref(t);        // accepts (the value had no free function)
    tp_future_unref(f);

    // A future taken after completion is resolved already; a barrier's
    // value is NULL.
    TP_CHECK_OK(tp_pg_barrier(pg, &w, &err), err);
    TP_CHECK_OK(tp_work_wait(w, tp_test_ms(30000), &err), err);
    TP_CHECK_OK(tp_work_get_future(w, &f, &err), err);
    TP_CHECK(tp_future_is_done(f));
    TP_CHECK(tp_future_error(f) == NULL && tp_future_value(f) == NULL);
    tp_future_unref(f);
    tp_work_free(w);

    // Point-to-point works have none.
    if (world > 1) {
        tp_tensor *x = tensor(TP_I32, 4);
        if (rank < 2) {
            TP_CHECK_OK(rank == 0 ? tp_pg_send(pg, x, 1, 3, &w, &err)
                                  : tp_pg_recv(pg, x, 0, 3, &w, &err),
                        err);
            tp_status st = tp_work_get_future(w, &f, &err);
            TP_CHECK_EQ(st, TP_ENOTSUP);
            tp_error_unref(err);
            err = NULL;
            TP_CHECK_OK(tp_work_wait(w, tp_test_ms(30000), &err), err);
            tp_work_free(w);
        }
        tp_tensor_unref(x);
    }
    finish(pg);
}

static void
test_work_future(void)
{
    run_engines(1, future_rank);
    run_engines(3, future_rank);
}

// A collective that times out: its future fails with the work's error.
static void
future_timeout_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 300);
    tp_error *err = NULL;
    if (rank == 1) {
        // Never calls the all_reduce; waits for rank 0 to finish.
        tp_job_sleep_ms(1500);
        tp_pg_destroy(pg);
        return;
    }
    tp_tensor *t = tensor(TP_F32, 16);
    tp_work *w = NULL;
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, &w, &err), err);
    tp_future *f = NULL;
    TP_CHECK_OK(tp_work_get_future(w, &f, &err), err);
    // wait_all fails fast: it does not wait for a future that never
    // resolves once the collective's failed.
    tp_future *never = NULL;
    TP_CHECK_OK(tp_future_create(&never), NULL);
    tp_future *both[2] = {never, f};
    int64_t t0 = tp_job_now_ms();
    tp_error *aerr = NULL;
    tp_status ast = tp_future_wait_all(both, 2, tp_test_ms(20000), &aerr);
    TP_CHECKF(ast == TP_ETIMEDOUT, "status %s: %s", tp_status_name(ast),
              tp_error_message(aerr));
    TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(10000));
    TP_CHECK(aerr == tp_future_error(f));
    tp_error_unref(aerr);
    tp_future_set_value(never, NULL, NULL);
    tp_future_unref(never);
    tp_status st = tp_future_wait(f, tp_test_ms(10000), &err);
    TP_CHECKF(st == TP_ETIMEDOUT, "status %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "all_reduce");
    tp_error *werr = NULL;
    TP_CHECK_EQ(tp_work_wait(w, tp_test_ms(1000), &werr), TP_ETIMEDOUT);
    TP_CHECK(werr == err); // the same error object
    TP_CHECK(tp_future_error(f) == tp_work_error(w));
    tp_error_unref(werr);
    tp_error_unref(err);
    tp_future_unref(f);
    tp_work_free(w);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
test_future_timeout(void)
{
    run_engines(2, future_timeout_rank);
}

// ---- tp_future_wait_all
// ---------------------------------------------------------

// Several asynchronous collectives of two groups, waited for together.
static void
wait_all_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    enum { N = 6 };
    tp_tensor *t[N];
    tp_future *f[N];
    for (int k = 0; k < N; k++) {
        t[k] = tensor(TP_I64, 100 + k);
        for (int64_t i = 0; i < 100 + k; i++) {
            tp_tensor_set_item(t[k], i, (double)(rank * k + i));
        }
        tp_work *w = NULL;
        TP_CHECK_OK(tp_pg_all_reduce(pg, t[k], TP_REDUCE_SUM, &w, &err), err);
        TP_CHECK_OK(tp_work_get_future(w, &f[k], &err), err);
        tp_work_free(w);
    }
    TP_CHECK_OK(tp_future_wait_all(f, N, tp_test_ms(30000), &err), err);
    for (int k = 0; k < N; k++) {
        TP_CHECK(tp_future_is_done(f[k]) && tp_future_value(f[k]) == t[k]);
        double v = 0;
        TP_CHECK_OK(tp_tensor_item(t[k], 7, &v), NULL);
        TP_CHECK_EQ((int64_t)v,
                    (int64_t)(k * world * (world - 1) / 2 + 7 * world));
        tp_future_unref(f[k]);
        tp_tensor_unref(t[k]);
    }
    finish(pg);
}

static void
test_wait_all(void)
{
    run_engines(3, wait_all_rank);
}

static void *
fail_later(void *arg)
{
    tp_job_sleep_ms(50);
    tp_error *e = tp_error_create(TP_ECONNRESET, NULL, "peer gone");
    tp_future_set_error(arg, e);
    tp_error_unref(e);
    return NULL;
}

// Plain futures: none, all resolved, fail-fast, timeout, bad arguments.
static void
test_wait_all_plain(void)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp_future_wait_all(NULL, 0, 1000, &err), err);
    tp_future *f[3];
    for (int i = 0; i < 3; i++) {
        TP_CHECK_OK(tp_future_create(&f[i]), NULL);
    }
    tp_future_set_value(f[0], NULL, NULL);
    // timeout: two left
    tp_status st = tp_future_wait_all(f, 3, 100, &err);
    TP_CHECK_EQ(st, TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "2 of 3");
    tp_error_unref(err);
    err = NULL;
    // fail-fast: f[2] fails on another thread; f[1] never resolves
    pthread_t th;
    TP_CHECK_EQ(pthread_create(&th, NULL, fail_later, f[2]), 0);
    int64_t t0 = tp_job_now_ms();
    st = tp_future_wait_all(f, 3, tp_test_ms(20000), &err);
    TP_CHECK_EQ(st, TP_ECONNRESET);
    TP_CHECK(tp_job_now_ms() - t0 < tp_test_ms(10000));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "peer gone");
    tp_error_unref(err);
    err = NULL;
    pthread_join(th, NULL);
    // a future already failed: at once
    st = tp_future_wait_all(&f[2], 1, 0, &err);
    TP_CHECK_EQ(st, TP_ECONNRESET);
    tp_error_unref(err);
    err = NULL;
    tp_future_set_value(f[1], NULL, NULL);
    TP_CHECK_OK(tp_future_wait_all(f, 2, 0, &err), err);
    tp_future *bad[2] = {f[0], NULL};
    TP_CHECK_EQ(tp_future_wait_all(bad, 2, 0, &err), TP_EINVAL);
    tp_error_unref(err);
    for (int i = 0; i < 3; i++) {
        tp_future_unref(f[i]);
    }
}

// ---- new_subgroups, all_reduce_coalesced
// --------------------------------------------------------

// (a macro: the call must set err before it is read)
#define EXPECT_EINVAL(call, needle) expect_einval((call), &err, (needle))

static void
expect_einval(tp_status st, tp_error **err_p, const char *needle)
{
    tp_error *err = *err_p;
    *err_p = NULL;
    TP_CHECKF(st == TP_EINVAL, "status %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    tp_error_unref(err);
}

static void
subgroups_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    tp_pg *sub = NULL;
    EXPECT_EINVAL(tp_pg_new_subgroups(pg, 3, NULL, &sub, &err),
                  "not a multiple");
    EXPECT_EINVAL(tp_pg_new_subgroups(pg, 0, NULL, &sub, &err),
                  "not a multiple");
    err = NULL;
    TP_CHECK(sub == NULL);
    int sizes[] = {2, 1, 4};
    for (int s = 0; s < 3; s++) {
        int gs = sizes[s];
        TP_CHECK_OK(tp_pg_new_subgroups(pg, gs, NULL, &sub, &err), err);
        TP_CHECK(sub != NULL);
        TP_CHECK_EQ(tp_pg_size(sub), gs);
        TP_CHECK_EQ(tp_pg_rank(sub), rank % gs);
        int k = rank / gs;
        char name[32];
        snprintf(name, sizeof(name), "subgroup%d", k);
        TP_CHECK(strcmp(tp_pg_name(sub), name) == 0);
        for (int i = 0; i < gs; i++) {
            TP_CHECK_EQ(tp_pg_world_rank(sub, i), k * gs + i);
        }
        tp_tensor *t = tensor(TP_I32, 3);
        tp_tensor_set_item(t, 1, (double)rank);
        TP_CHECK_OK(tp_pg_all_reduce(sub, t, TP_REDUCE_SUM, NULL, &err), err);
        double v = 0;
        TP_CHECK_OK(tp_tensor_item(t, 1, &v), NULL);
        // the sum of the world ranks k*gs .. k*gs+gs-1
        TP_CHECK_EQ((int64_t)v, (int64_t)(k * gs * gs + gs * (gs - 1) / 2));
        tp_tensor_unref(t);
        tp_pg_destroy(sub);
        sub = NULL;
    }
    finish(pg);
}

static void
test_new_subgroups(void)
{
    run_engines(4, subgroups_rank);
}

static void
coalesced_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    enum { N = 4 };
    int64_t counts[N] = {5, 0, 1000, 17};
    tp_tensor *ts[N];
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < N; k++) {
            if (k == 3) {
                int64_t shape[2] = {1, counts[k]}; // 2-D
                TP_CHECK_OK(tp_tensor_zeros(TP_F64, 2, shape, &ts[k], &err),
                            err);
            } else {
                ts[k] = tensor(TP_F64, counts[k]);
            }
            for (int64_t i = 0; i < counts[k]; i++) {
                tp_tensor_set_item(ts[k], i, (double)(rank + k * i));
            }
        }
        if (round == 0) {
            TP_CHECK_OK(tp_pg_all_reduce_coalesced(pg, ts, N, TP_REDUCE_SUM,
                                                   NULL, &err),
                        err);
        } else {
            // asynchronous, through its future
            tp_work *w = NULL;
            TP_CHECK_OK(
                tp_pg_all_reduce_coalesced(pg, ts, N, TP_REDUCE_AVG, &w, &err),
                err);
            tp_future *f = NULL;
            TP_CHECK_OK(tp_work_get_future(w, &f, &err), err);
            tp_work_free(w);
            TP_CHECK_OK(tp_future_wait(f, tp_test_ms(30000), &err), err);
            TP_CHECK(tp_future_value(f) == NULL);
            tp_future_unref(f);
        }
        for (int k = 0; k < N; k++) {
            for (int64_t i = 0; i < counts[k]; i++) {
                double v = 0;
                TP_CHECK_OK(tp_tensor_item(ts[k], i, &v), NULL);
                double sum =
                    (double)world * (world - 1) / 2.0 + (double)(world * k * i);
                double want = round == 0 ? sum : sum / world;
                TP_CHECKF(v == want, "round %d tensor %d [%lld]: %g, want %g",
                          round, k, (long long)i, v, want);
            }
        }
        for (int k = 0; k < N; k++) {
            tp_tensor_unref(ts[k]);
        }
    }
    // argument errors, before anything is sent
    tp_tensor *a = tensor(TP_F32, 4), *b = tensor(TP_I32, 4);
    tp_tensor *ab[2] = {a, b};
    EXPECT_EINVAL(
        tp_pg_all_reduce_coalesced(pg, ab, 2, TP_REDUCE_SUM, NULL, &err),
        "tensor 1 has dtype");
    EXPECT_EINVAL(
        tp_pg_all_reduce_coalesced(pg, ab, 0, TP_REDUCE_SUM, NULL, &err),
        "0 tensors");
    err = NULL;
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    finish(pg);
}

static void
test_coalesced(void)
{
    run_engines(3, coalesced_rank);
}

// ---- strided tensors
// ------------------------------------------------------------

// A transposed view of a fresh [rows, cols] tensor, element (i, j) of the
// base = @base_of(i, j); the view's (j, i) is that element.
static tp_tensor *
transposed(tp_dtype dt, int64_t rows, int64_t cols, double salt)
{
    int64_t shape[2] = {rows, cols};
    tp_tensor *b = NULL, *v = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(dt, 2, shape, &b, &err), err);
    for (int64_t i = 0; i < rows * cols; i++) {
        tp_tensor_set_item(b, i, salt + (double)i);
    }
    TP_CHECK_OK(tp_tensor_transpose(b, 0, 1, &v, &err), err);
    tp_tensor_unref(b);
    TP_CHECK(!tp_tensor_is_contiguous(v));
    return v;
}

// Element (i, j) of the base of @v (its view index is j * rows + i).
static double
base_item(tp_tensor *v, int64_t rows, int64_t i, int64_t j)
{
    double x = 0;
    TP_CHECK_OK(tp_tensor_item(v, j * rows + i, &x), NULL);
    return x;
}

static void
strided_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, 0);
    tp_error *err = NULL;
    const int64_t R = 4, C = 6, N = R * C;
    // all_reduce, blocking and through a future (the value is the view)
    for (int a = 0; a < 2; a++) {
        tp_tensor *v = transposed(TP_F32, R, C, rank * 100.0);
        if (a == 0) {
            TP_CHECK_OK(tp_pg_all_reduce(pg, v, TP_REDUCE_SUM, NULL, &err),
                        err);
        } else {
            tp_work *w = NULL;
            TP_CHECK_OK(tp_pg_all_reduce(pg, v, TP_REDUCE_SUM, &w, &err), err);
            tp_future *f = NULL;
            TP_CHECK_OK(tp_work_get_future(w, &f, &err), err);
            TP_CHECK_OK(tp_future_wait(f, tp_test_ms(30000), &err), err);
            TP_CHECK(tp_future_value(f) == v);
            tp_future_unref(f);
            tp_work_free(w);
        }
        TP_CHECK(!tp_tensor_is_contiguous(v));
        for (int64_t i = 0; i < R; i++) {
            for (int64_t j = 0; j < C; j++) {
                double want = 100.0 * world * (world - 1) / 2.0 +
                              (double)(world * (i * C + j));
                TP_CHECK_EQ((int64_t)base_item(v, R, i, j), (int64_t)want);
            }
        }
        tp_tensor_unref(v);
    }
    // broadcast from the last rank
    tp_tensor *v = transposed(TP_I32, R, C, rank * 1000.0);
    TP_CHECK_OK(tp_pg_broadcast(pg, v, world - 1, NULL, &err), err);
    TP_CHECK_EQ((int64_t)base_item(v, R, 2, 5),
                (int64_t)((world - 1) * 1000 + 2 * C + 5));
    tp_tensor_unref(v);
    // all_gather: a strided input into a strided output ([world*C, R]
    // viewed from [R, world*C]... both transposed)
    tp_tensor *in = transposed(TP_I64, R, C, rank * 1000.0);
    tp_tensor *out = transposed(TP_I64, R * world, C, -1.0);
    TP_CHECK_OK(tp_pg_all_gather(pg, out, in, NULL, &err), err);
    for (int r = 0; r < world; r++) {
        for (int64_t k = 0; k < N; k++) {
            // block r of out (in out's view order) = rank r's in, in view
            // order: view index k of in is base (k % R, k / R)
            double x = 0;
            TP_CHECK_OK(tp_tensor_item(out, r * N + k, &x), NULL);
            double want = r * 1000.0 + (double)((k % R) * C + k / R);
            TP_CHECKF(x == want, "all_gather block %d [%lld]: %g, want %g", r,
                      (long long)k, x, want);
        }
    }
    tp_tensor_unref(in);
    tp_tensor_unref(out);
    // point-to-point still wants contiguous tensors
    tp_tensor *s = transposed(TP_F32, 2, 3, 0);
    tp_status st = tp_pg_send(pg, s, (rank + 1) % world, 1, NULL, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "not contiguous");
    tp_error_unref(err);
    tp_tensor_unref(s);
    finish(pg);
}

static void
test_strided(void)
{
    run_engines(3, strided_rank);
}

static const tp_test_case k_cases[] = {
    TP_TEST_CASE_T(test_work_future, 120),
    TP_TEST_CASE_T(test_future_timeout, 60),
    TP_TEST_CASE_T(test_wait_all, 120),
    TP_TEST_CASE_T(test_wait_all_plain, 60),
    TP_TEST_CASE_T(test_new_subgroups, 120),
    TP_TEST_CASE_T(test_coalesced, 120),
    TP_TEST_CASE_T(test_strided, 120),
};

TP_TEST_MAIN(k_cases)
