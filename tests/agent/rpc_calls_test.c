// SPDX-License-Identifier: Apache-2.0
// rpc_calls_test.c - RPC calls across processes: by name and by rank, to
// self, with bytes and tensors (0 B .. 16 MiB, a strided view); unknown
// functions and remote errors; per-call, default and no timeouts and late
// replies; nested calls and a chain over three workers; async handlers
// that do not hold a pool thread; the threads handlers and future
// callbacks run on; 1000 calls in flight. The workers and their test
// functions: rpc_common.h.

#include "rpc_common.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/log.h>

// ---- cases: calls -----------------------------------------------------------

static void
echo_check(tp_agent *a, int to, tp_args *in, const char *what, int how)
{
    tp_args *r = NULL;
    switch (how % 4) {
    case 0:
        r = call_ok(a, k_names[to], "tp.echo", in, WAIT_MS);
        break;
    case 1:
        r = call_rank_ok(a, to, "tp.echo", in, WAIT_MS);
        break;
    case 2: {
        tp_future *f = tp_rpc_async(a, k_names[to], "tp.echo", in, WAIT_MS);
        r = wait_ok(f, what);
        tp_future_unref(f);
        break;
    }
    default: {
        tp_future *f = tp_rpc_async_rank(a, to, "tp.echo", in, WAIT_MS);
        r = wait_ok(f, what);
        // The future's own value is the same result.
        TP_CHECK(tp_future_value(f) == r);
        tp_future_unref(f);
        break;
    }
    }
    check_args(r, in, what);
    tp_args_unref(r);
}

static void
echo_all(tp_agent *a, int to)
{
    int how = 0;
    echo_check(a, to, NULL, "no args", how++);
    tp_args *in = args_str("");
    echo_check(a, to, in, "empty bytes", how++);
    tp_args_unref(in);
    in = args_str("hello");
    echo_check(a, to, in, "bytes", how++);
    tp_args_unref(in);

    uint8_t big[100000];
    for (size_t i = 0; i < sizeof(big); i++) {
        big[i] = pattern(i, 3);
    }
    in = args_bytes(big, sizeof(big));
    args_push(in, f32_tensor(3, 4, 1.0f));
    echo_check(a, to, in, "bytes + one tensor", how++);
    tp_args_unref(in);

    static const int64_t sizes[] = {0, 1, 64 << 10, 16 << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        in = args_str("one");
        args_push(in, u8_tensor(sizes[i], (uint32_t)i));
        char w[64];
        snprintf(w, sizeof(w), "one tensor of %lld bytes", (long long)sizes[i]);
        echo_check(a, to, in, w, how++);
        tp_args_unref(in);
    }
    in = args_str("several");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        args_push(in, u8_tensor(sizes[i], (uint32_t)(10 + i)));
    }
    int64_t shape[3] = {2, 3, 4};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 3, shape, -1.25, &t, &err), err);
    args_push(in, t);
    TP_CHECK_OK(tp_tensor_arange(TP_I64, -5, 5, 1, &t, &err), err);
    args_push(in, t);
    echo_check(a, to, in, "several tensors", how++);
    tp_args_unref(in);

    // A strided view (transposed) arrives with its logical contents.
    tp_tensor *base = f32_tensor(3, 5, 0.0f), *v = NULL;
    TP_CHECK_OK(tp_tensor_transpose(base, 0, 1, &v, &err), err);
    TP_CHECK(!tp_tensor_is_contiguous(v));
    in = args_str("view");
    args_push(in, v);
    echo_check(a, to, in, "transposed view", how++);
    tp_args_unref(in);
    tp_tensor_unref(base);
}

static void
add_check(tp_agent *a, int to)
{
    tp_args *in = args_str("");
    args_push(in, f32_tensor(4, 8, 1.0f));
    args_push(in, f32_tensor(4, 8, 100.0f));
    tp_args *r = call_rank_ok(a, to, "tp.add", in, WAIT_MS);
    TP_CHECK_EQ(tp_args_ntensors(r), 1);
    tp_tensor *s = tp_args_tensor(r, 0);
    TP_CHECK_EQ(tp_tensor_dtype(s), TP_F32);
    TP_CHECK_EQ(tp_tensor_ndim(s), 2);
    TP_CHECK_EQ(tp_tensor_size(s, 0), 4);
    TP_CHECK_EQ(tp_tensor_size(s, 1), 8);
    for (int64_t i = 0; i < 32; i++) {
        double v = 0;
        TP_CHECK_OK(tp_tensor_item(s, i, &v), NULL);
        TP_CHECKF(v == 101.0 + 1.0 * (double)i, "tp.add[%lld] = %g",
                  (long long)i, v);
    }
    tp_args_unref(r);
    tp_args_unref(in);

    tp_error *err = NULL;
    tp_tensor *x = NULL, *y = NULL;
    TP_CHECK_OK(tp_tensor_arange(TP_I64, 0, 1000, 1, &x, &err), err);
    TP_CHECK_OK(tp_tensor_arange(TP_I64, 0, 2000, 2, &y, &err), err);
    in = args_str("");
    args_push(in, x);
    args_push(in, y);
    r = call_ok(a, k_names[to], "tp.add", in, WAIT_MS);
    TP_CHECK_EQ(tp_args_ntensors(r), 1);
    TP_CHECK_EQ(tp_tensor_dtype(tp_args_tensor(r, 0)), TP_I64);
    const int64_t *d = tp_tensor_data(tp_args_tensor(r, 0));
    for (int64_t i = 0; i < 1000; i++) {
        TP_CHECK_EQ(d[i], 3 * i);
    }
    tp_args_unref(r);
    tp_args_unref(in);

    // Shapes that do not match fail, and only that call.
    in = args_str("");
    args_push(in, f32_tensor(2, 2, 0.0f));
    args_push(in, f32_tensor(3, 3, 0.0f));
    tp_args *out = NULL;
    tp_status st = tp_rpc_sync_rank(a, to, "tp.add", in, WAIT_MS, &out, &err);
    TP_CHECKF(st != TP_OK && !TP_STATUS_IS_CONN(st),
              "tp.add of 2x2 and 3x3: %s", tp_status_name(st));
    tp_error_unref(err);
    tp_args_unref(in);
}

static void
make_check(tp_agent *a, int to)
{
    tp_args *r = call_rank_ok(a, to, "t.make", NULL, WAIT_MS);
    char want[64];
    snprintf(want, sizeof(want), "made by %s", k_names[to]);
    check_str(r, want);
    TP_CHECK_EQ(tp_args_ntensors(r), 2);
    tp_tensor *t = tp_args_tensor(r, 0);
    TP_CHECK_EQ(tp_tensor_dtype(t), TP_I32);
    TP_CHECK_EQ(tp_tensor_numel(t), 100);
    const int32_t *d = tp_tensor_data(t);
    for (int i = 0; i < 100; i++) {
        TP_CHECK_EQ(d[i], i);
    }
    t = tp_args_tensor(r, 1);
    TP_CHECK_EQ(tp_tensor_dtype(t), TP_F64);
    TP_CHECK_EQ(tp_tensor_ndim(t), 2);
    TP_CHECK_EQ(tp_tensor_size(t, 0), 2);
    TP_CHECK_EQ(tp_tensor_size(t, 1), 3);
    const double *dd = tp_tensor_data(t);
    for (int i = 0; i < 6; i++) {
        TP_CHECK(dd[i] == 2.5);
    }
    tp_args_unref(r);
}

// Rank 0 calls rank 1 and itself; rank 1 calls rank 0 at the same time.
static void
worker_calls(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    int peer = 1 - rank;
    echo_all(a, peer);
    add_check(a, peer);
    make_check(a, peer);
    if (rank == 0) {
        echo_all(a, 0); // self
        add_check(a, 0);
        make_check(a, 0);
    }
    leave(a);
}

static void
test_calls(void)
{
    run_tcp(2, worker_calls, NULL);
}

// Unknown workers and functions, remote errors.
static void
worker_errors(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *e =
            call_fails(a, "bravo", "t.nope", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "t.nope");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        // A valid name nobody registered, on self too.
        e = call_fails(a, "alpha", "t.nope", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "t.nope");
        tp_error_unref(e);
        // An unknown worker, by name and by rank.
        e = call_fails(a, "zulu", "tp.noop", NULL, WAIT_MS, TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "zulu");
        tp_error_unref(e);
        tp_error *err = NULL;
        TP_CHECK_EQ(
            tp_rpc_sync_rank(a, 7, "tp.noop", NULL, WAIT_MS, NULL, &err),
            TP_ENOENT);
        tp_error_unref(err);
        err = NULL;
        tp_future *f = tp_rpc_async_rank(a, -3, "tp.noop", NULL, WAIT_MS);
        TP_CHECK(f != NULL);
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_ENOENT);
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);

        // The remote handler's status and message, with the worker.
        e = call_fails(a, "bravo", "t.fail", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bad thing 42");
        tp_error_unref(e);
        f = tp_rpc_async(a, "bravo", "t.fail", NULL, WAIT_MS);
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_EINVAL);
        TP_CHECK_EQ(tp_error_status(tp_future_error(f)), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(tp_future_error(f)),
                              "bad thing 42");
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);
        // Self: same shape of error.
        e = call_fails(a, "alpha", "t.fail", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "alpha");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bad thing 42");
        tp_error_unref(e);
        // A connection-scope status of a handler arrives as TP_EIO.
        e = call_fails(a, "bravo", "t.fail_conn", NULL, WAIT_MS, TP_EIO);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "conn thing 7");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        e = call_fails(a, "bravo", "t.fail_ctx", NULL, WAIT_MS, TP_EIO);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "ctx thing 8");
        tp_error_unref(e);
        // No error object: the status still arrives, naming the worker.
        e = call_fails(a, "bravo", "t.fail_noerr", NULL, WAIT_MS, TP_ENOTSUP);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        // Async handlers that fail.
        e = call_fails(a, "bravo", "t.async_err", NULL, WAIT_MS, TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "async bad 9");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "bravo");
        tp_error_unref(e);
        e = call_fails(a, "bravo", "t.async_null", NULL, WAIT_MS, TP_ENOMEM);
        tp_error_unref(e);
        // The pipe is fine after all of that.
        tp_args *in = args_str("still here");
        tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "still here");
        tp_args_unref(r);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_errors(void)
{
    run_tcp(2, worker_errors, NULL);
}

// ---- cases: timeouts --------------------------------------------------------

// Replies that arrive after their call timed out: the agent drops them
// and says so in a debug message, TP-RPC-LATE (it keeps no counter).
static atomic_int g_late;

static void
count_late(tp_log_level level, const char *id, const char *msg, void *arg)
{
    if (strcmp(id, "TP-RPC-LATE") == 0) {
        atomic_fetch_add(&g_late, 1);
    }
}

static void
worker_timeout(int rank, int world, const char *url, void *arg)
{
    if (rank == 0) { // before tp_rpc_init starts any thread
        tp_log_set_handler(count_late, NULL);
        tp_log_set_level(TP_LOG_LEVEL_DEBUG);
    }
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_args *in = args_i64(2000);
        int64_t t0 = now_ms();
        tp_error *e = call_fails(a, "bravo", "t.sleep", in, 200, TP_ETIMEDOUT);
        int64_t dt = now_ms() - t0;
        const char *m = tp_error_message(e);
        TP_CHECK_STR_CONTAINS(m, "RPC ran for more than set timeout (200 ms)");
        TP_CHECK_STR_CONTAINS(m, "t.sleep");
        TP_CHECK_STR_CONTAINS(m, "bravo");
        TP_CHECKF(dt < tp_test_ms(1500), "a 200 ms timeout fired after %lld ms",
                  (long long)dt);
        tp_error_unref(e);
        tp_args_unref(in);

        // The same through a future, by rank.
        in = args_i64(1500);
        tp_future *f = tp_rpc_async_rank(a, 1, "t.sleep", in, 300);
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_rpc_wait(f, WAIT_MS, NULL, &err), TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "(300 ms)");
        tp_error_unref(err);
        err = NULL;
        tp_future_unref(f);
        tp_args_unref(in);

        // Other calls work while the late replies are outstanding ...
        in = args_str("meanwhile");
        tp_args *r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "meanwhile");
        tp_args_unref(r);
        // ... and after they arrived and were dropped (two of them).
        tp_rpc_peer_stats ps0, ps1;
        TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &ps0), NULL);
        int64_t dl = now_ms() + tp_test_ms(WAIT_MS);
        while (atomic_load(&g_late) < 2) {
            TP_CHECKF(now_ms() < dl,
                      "%d of the 2 late replies arrived and were dropped",
                      atomic_load(&g_late));
            sleep_ms(5);
        }
        TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &ps1), NULL);
        TP_CHECK_EQ(ps1.pending, 0);
        TP_CHECK_EQ(ps1.timeouts, 2);
        TP_CHECKF(ps1.bytes_received == ps0.bytes_received,
                  "a dropped reply was counted as received (%llu -> %llu "
                  "bytes)",
                  (unsigned long long)ps0.bytes_received,
                  (unsigned long long)ps1.bytes_received);
        r = call_ok(a, "bravo", "tp.echo", in, WAIT_MS);
        check_str(r, "meanwhile");
        tp_args_unref(r);
        tp_args_unref(in);
        in = args_i64(10);
        r = call_ok(a, "bravo", "t.sleep", in, WAIT_MS);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_args_unref(in);

        // A self call times out the same way.
        in = args_i64(800);
        e = call_fails(a, "alpha", "t.sleep", in, 100, TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "(100 ms)");
        TP_CHECK_STR_CONTAINS(tp_error_message(e), "alpha");
        tp_error_unref(e);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_timeout_per_call(void)
{
    run_tcp(2, worker_timeout, NULL);
}

// rpc_timeout_ms 100 is the default; 0 per call means none.
static void
worker_timeout_default(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    if (rank == 0) {
        o.rpc_timeout_ms = 100;
    }
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 0) {
        tp_args *in = args_i64(500);
        int64_t t0 = now_ms();
        tp_error *e = call_fails(a, "bravo", "t.sleep", in, TP_TIMEOUT_DEFAULT,
                                 TP_ETIMEDOUT);
        int64_t dt = now_ms() - t0;
        TP_CHECK_STR_CONTAINS(tp_error_message(e),
                              "RPC ran for more than set timeout (100 ms)");
        TP_CHECKF(dt < tp_test_ms(1500), "a 100 ms timeout fired after %lld ms",
                  (long long)dt);
        tp_error_unref(e);
        // 0: no limit.
        tp_args *r = call_ok(a, "bravo", "t.sleep", in, 0);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future *f = tp_rpc_async_rank(a, 1, "t.sleep", in, 0);
        // Waiting less than the call takes is a wait timeout, not the
        // call's: the call still succeeds.
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_rpc_wait(f, 50, NULL, &err), TP_ETIMEDOUT);
        tp_error_unref(err);
        r = wait_ok(f, "t.sleep with no timeout");
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future_unref(f);
        // An explicit timeout longer than the call.
        r = call_ok(a, "bravo", "t.sleep", in, 5000);
        check_str(r, "slept");
        tp_args_unref(r);
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_timeout_default_and_none(void)
{
    run_tcp(2, worker_timeout_default, NULL);
}

// ---- cases: nested calls ----------------------------------------------------

#define NCHAINS 4
#define NHOPS   5

static void
worker_nested(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0 || rank == 1) {
        // A -> B -> A, from both ends at once.
        int peer = 1 - rank;
        for (int i = 0; i < 5; i++) {
            tp_args *in = args_str("");
            args_push(in, f32_tensor(2, 3, (float)i));
            args_push(in, f32_tensor(2, 3, 10.0f));
            tp_args *r = call_rank_ok(a, peer, "t.bounce", in, WAIT_MS);
            TP_CHECK_EQ(tp_args_ntensors(r), 1);
            for (int64_t k = 0; k < 6; k++) {
                double v = 0;
                TP_CHECK_OK(tp_tensor_item(tp_args_tensor(r, 0), k, &v), NULL);
                TP_CHECK(v == (double)i + 10.0 + (double)k);
            }
            tp_args_unref(r);
            tp_args_unref(in);
        }
    }
    if (rank == 0) {
        // Chains over the three workers, several at once.
        tp_future *f[NCHAINS];
        tp_args *in = args_i64(NHOPS);
        for (int i = 0; i < NCHAINS; i++) {
            f[i] = tp_rpc_async_rank(a, 1, "t.chain", in, WAIT_MS);
        }
        char want[256] = "";
        for (int h = 0, r = 1; h <= NHOPS; h++, r = (r + 1) % world) {
            strcat(want, k_names[r]);
            if (h < NHOPS) {
                strcat(want, ">");
            }
        }
        for (int i = 0; i < NCHAINS; i++) {
            tp_args *r = wait_ok(f[i], "t.chain");
            check_str(r, want);
            tp_args_unref(r);
            tp_future_unref(f[i]);
        }
        tp_args_unref(in);
    }
    leave(a);
}

static void
test_nested(void)
{
    run_tcp(3, worker_nested, NULL);
}

// ---- cases: async handlers --------------------------------------------------

static void
worker_async(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.num_worker_threads = ASYNC_THREADS;
    pthread_t completer;
    if (rank == 1) {
        TP_CHECK(pthread_create(&completer, NULL, async_completer, NULL) == 0);
    }
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 0) {
        tp_future *f[ASYNC_N];
        for (int i = 0; i < ASYNC_N; i++) {
            tp_args *in = args_i64(i);
            f[i] = tp_rpc_async(a, "bravo", "t.async", in, WAIT_MS);
            TP_CHECK(f[i] != NULL);
            tp_args_unref(in); // the call keeps its reference
        }
        for (int i = 0; i < ASYNC_N; i++) {
            tp_args *r = wait_ok(f[i], "t.async");
            TP_CHECK_EQ(want_i64(r), 7 * i);
            tp_args_unref(r);
            tp_future_unref(f[i]);
        }
    }
    leave(a);
    if (rank == 1) {
        pthread_join(completer, NULL);
        TP_CHECK_EQ(g_async_arrived, ASYNC_N);
    }
}

static void
test_async_handler(void)
{
    run_tcp(2, worker_async, NULL);
}

// ---- cases: threads ---------------------------------------------------------

typedef struct then_rec {
    atomic_int done;
    char name[32];
} then_rec;

static void
then_cb(tp_future *f, void *arg)
{
    then_rec *t = arg;
    thread_name(t->name, sizeof(t->name));
    atomic_store(&t->done, 1);
}

static void
worker_threads(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        char f[6][160];
        char main_name[32];
        thread_name(main_name, sizeof(main_name));
        unsigned long long ids[2];
        for (int to = 0; to < 2; to++) { // bravo, then self
            int dest = 1 - to;
            for (int k = 0; k < 2; k++) {
                tp_args *r = call_rank_ok(a, dest, "t.info", NULL, WAIT_MS);
                info_fields(r, f);
                TP_CHECK(strcmp(f[0], "t.info") == 0);
                TP_CHECK(strcmp(f[1], "alpha") == 0);
                TP_CHECK(strcmp(f[2], "0") == 0);
                ids[k] = strtoull(f[3], NULL, 10);
                TP_CHECKF(!is_io_thread_name(f[4]),
                          "handler on %s ran on thread \"%s\"", k_names[dest],
                          f[4]);
                TP_CHECKF(strcmp(f[4], main_name) != 0,
                          "handler on %s ran on a main thread (\"%s\")",
                          k_names[dest], f[4]);
                if (dest == 0) {
                    TP_CHECKF(strcmp(f[5], "other") == 0,
                              "a self call ran on the caller's thread");
                }
                tp_args_unref(r);
            }
            TP_CHECKF(ids[0] != ids[1], "two calls with call id %llu", ids[0]);
        }
        // Callbacks of RPC futures run on the pool too.
        for (int dest = 1; dest >= 0; dest--) {
            then_rec t = {.name = ""};
            atomic_init(&t.done, 0);
            tp_args *in = args_i64(200);
            tp_future *fu = tp_rpc_async_rank(a, dest, "t.info", in, WAIT_MS);
            TP_CHECK_OK(tp_future_then(fu, then_cb, &t), NULL);
            tp_args_unref(wait_ok(fu, "t.info"));
            int64_t dl = now_ms() + tp_test_ms(5000);
            while (atomic_load(&t.done) == 0) {
                TP_CHECK(now_ms() < dl);
                sleep_ms(1);
            }
            TP_CHECKF(!is_io_thread_name(t.name),
                      "an RPC future callback ran on thread \"%s\"", t.name);
            TP_CHECKF(strcmp(t.name, main_name) != 0,
                      "an RPC future callback ran on the main thread");
            tp_future_unref(fu);
            tp_args_unref(in);
        }
    }
    leave(a);
}

static void
test_threads(void)
{
    run_tcp(2, worker_threads, NULL);
}

// ---- cases: many calls ------------------------------------------------------

#define NMANY 1000

static tp_future *
many_send(tp_agent *a, int i, int to)
{
    if (i % 2 == 0) {
        int64_t v = (int64_t)i * 1000 + to;
        tp_args *in = args_i64(v);
        tp_future *f = tp_rpc_async_rank(a, to, "tp.echo", in, WAIT_MS);
        tp_args_unref(in);
        return f;
    }
    int64_t four = 4;
    tp_tensor *x = NULL, *y = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, &four, (double)i, &x, &err), err);
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, &four, 2.0 * i, &y, &err), err);
    tp_args *in = args_str("");
    args_push(in, x);
    args_push(in, y);
    tp_future *f = tp_rpc_async_rank(a, to, "tp.add", in, WAIT_MS);
    tp_args_unref(in);
    return f;
}

static void
many_check(tp_future *f, int i, int to)
{
    char w[64];
    snprintf(w, sizeof(w), "call %d to rank %d", i, to);
    tp_args *r = wait_ok(f, w);
    if (i % 2 == 0) {
        TP_CHECK_EQ(want_i64(r), (int64_t)i * 1000 + to);
    } else {
        TP_CHECK_EQ(tp_args_ntensors(r), 1);
        const double *d = tp_tensor_data(tp_args_tensor(r, 0));
        for (int k = 0; k < 4; k++) {
            TP_CHECKF(d[k] == 3.0 * i, "%s: %g", w, d[k]);
        }
    }
    tp_args_unref(r);
    tp_future_unref(f);
}

static void
worker_many(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    int n = rank == 0 ? NMANY : 100;
    tp_future **f = calloc((size_t)n, sizeof(*f));
    TP_CHECK(f != NULL);
    for (int i = 0; i < n; i++) {
        int to = (rank + 1 + i % (world - 1)) % world;
        f[i] = many_send(a, i, to);
        TP_CHECK(f[i] != NULL);
    }
    for (int i = 0; i < n; i++) {
        many_check(f[i], i, (rank + 1 + i % (world - 1)) % world);
    }
    free(f);
    leave(a);
}

static void
test_many_in_flight(void)
{
    run_tcp(4, worker_many, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_calls, 90),
    TP_TEST_CASE_T(test_errors, 60),
    TP_TEST_CASE_T(test_timeout_per_call, 60),
    TP_TEST_CASE_T(test_timeout_default_and_none, 60),
    TP_TEST_CASE_T(test_nested, 60),
    TP_TEST_CASE_T(test_async_handler, 60),
    TP_TEST_CASE_T(test_threads, 60),
    TP_TEST_CASE_T(test_many_in_flight, 90),
};

TP_TEST_MAIN(cases)
