// SPDX-License-Identifier: Apache-2.0
// rpc_lifecycle_test.c - the end of RPC workers: graceful shutdown with
// uneven work, abrupt shutdown with calls pending, a worker that never
// shuts down, a peer killed with calls pending; and the per-peer counters
// and debug info. The workers and their test functions: rpc_common.h.

#include "rpc_common.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent_int.h" // tp__agent_nconns

// ---- cases: shutdown --------------------------------------------------------

// alpha and charlie shut down at once; bravo, released by alpha right
// before its shutdown, keeps calling charlie for a second.
static void
worker_graceful(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        release(a, 1);
    }
    if (rank == 1) {
        wait_release(WAIT_MS);
        int64_t t0 = now_ms();
        int calls = 0;
        tp_args *in = args_str("late");
        while (now_ms() - t0 < 1000) {
            tp_args *r = call_ok(a, "charlie", "tp.echo", in, WAIT_MS);
            check_str(r, "late");
            tp_args_unref(r);
            calls++;
        }
        TP_CHECKF(calls >= 5, "only %d calls in a second", calls);
        tp_args_unref(in);
        // A call still outstanding when this worker shuts down: the
        // graceful shutdown waits for it.
        in = args_i64(tp_test_ms(500));
        tp_future *f = tp_rpc_async(a, "charlie", "t.sleep", in, WAIT_MS);
        TP_CHECKF(tp_job_latch_wait(&g_entered, 1, WAIT_MS) == 1,
                  "t.sleep did not start on charlie");
        TP_CHECKF(!tp_future_is_done(f), "t.sleep ended before the shutdown");
        leave(a);
        TP_CHECKF(tp_future_is_done(f), "graceful shutdown returned with a "
                                        "call outstanding");
        tp_args *r = wait_ok(f, "t.sleep outstanding at shutdown");
        check_str(r, "slept");
        tp_args_unref(r);
        tp_future_unref(f);
        tp_args_unref(in);
        return;
    }
    leave(a);
}

static void
test_shutdown_graceful_uneven(void)
{
    run_tcp(3, worker_graceful, NULL);
}

// alpha shuts down abruptly with three calls running in handlers on bravo
// (each has told the job it started, and blocks until alpha is closed).
static void
worker_abrupt(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    tp_error *err = NULL;
    if (rank == 0) {
        tp_future *f[3];
        tp_args *in = args_i64(WAIT_MS);
        for (int i = 0; i < 3; i++) {
            f[i] = tp_rpc_async(a, "bravo", "t.block", in, WAIT_MS);
        }
        int got = tp_job_latch_wait(&g_entered, 3, WAIT_MS);
        TP_CHECKF(got == 3, "only %d of 3 t.block handlers started on bravo",
                  got);
        for (int i = 0; i < 3; i++) {
            TP_CHECKF(!tp_future_is_done(f[i]),
                      "call %d ended before the shutdown", i);
        }
        int64_t t0 = now_ms();
        tp_status st = tp_rpc_shutdown(a, false, &err);
        int64_t dt = now_ms() - t0;
        TP_CHECKF(st == TP_OK, "abrupt shutdown: %s: %s", tp_status_name(st),
                  tp_error_message(err));
        TP_CHECKF(dt < tp_test_ms(2000),
                  "abrupt shutdown took %lld ms with calls pending",
                  (long long)dt);
        for (int i = 0; i < 3; i++) {
            st = tp_rpc_wait(f[i], tp_test_ms(2000), NULL, &err);
            TP_CHECKF(st == TP_ECLOSED, "pending call %d: %s (%s)", i,
                      tp_status_name(st), tp_error_message(err));
            tp_error_unref(err);
            err = NULL;
            tp_future_unref(f[i]);
        }
        tp_args_unref(in);
        // Now bravo's handlers may return.
        for (int i = 0; i < 3; i++) {
            tp_job_latch_post(&g_unblock);
        }
        return;
    }
    // bravo: the handlers finish once alpha is closed (their replies have
    // nowhere to go), then it closes too, without waiting for alpha.
    int64_t dl = now_ms() + tp_test_ms(WAIT_MS);
    while (atomic_load(&g_block_done) < 3) {
        TP_CHECKF(now_ms() < dl, "t.block handlers did not finish");
        sleep_ms(5);
    }
    tp_status st = tp_rpc_shutdown(a, false, &err);
    TP_CHECKF(st == TP_OK, "abrupt shutdown of bravo: %s: %s",
              tp_status_name(st), tp_error_message(err));
}

static void
test_shutdown_abrupt(void)
{
    run_tcp(2, worker_abrupt, NULL);
}

// charlie never shuts down: the others' graceful shutdowns give up at
// shutdown_timeout_ms, naming it.
static void
worker_no_shutdown(int rank, int world, const char *url, void *arg)
{
    // alpha hosts the store: it waits longer, so that bravo's shutdown
    // ends on its own deadline rather than on the store going away.
    int64_t limit = rank == 0 ? 3000 : 1500;
    tp_agent_options o;
    opts_init(&o, url);
    o.shutdown_timeout_ms = limit;
    tp_agent *a = join_opts(rank, world, &o);
    if (rank == 2) {
        sleep_ms(tp_test_ms(60000)); // killed by the parent
        TP_CHECKF(false, "charlie was not killed");
    }
    tp_args_unref(call_ok(a, "charlie", "tp.noop", NULL, WAIT_MS));
    tp_error *err = NULL;
    int64_t t0 = now_ms();
    tp_status st = tp_rpc_shutdown(a, true, &err);
    int64_t dt = now_ms() - t0;
    TP_CHECKF(st == TP_ETIMEDOUT,
              "rank %d: graceful shutdown without charlie: %s (%s)", rank,
              tp_status_name(st), tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "charlie");
    TP_CHECKF(dt >= limit - 500 && dt < limit + tp_test_ms(3500),
              "rank %d: shutdown gave up after %lld ms (timeout %lld)", rank,
              (long long)dt, (long long)limit);
    tp_error_unref(err);
}

static void
test_shutdown_timeout(void)
{
    job j;
    job_tcp(&j, 3, worker_no_shutdown, NULL);
    j.kill_last[2] = true;
    job_run(&j);
}

// ---- cases: a peer killed with calls pending --------------------------------

static void
worker_killed(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 1) {
        sleep_ms(tp_test_ms(60000)); // t.die kills it before
        TP_CHECKF(false, "bravo is still alive");
    }
    if (rank == 2) {
        wait_release(WAIT_MS);
        sleep_ms(100);
        tp_error *err = NULL;
        (void)tp_rpc_shutdown(a, false, &err);
        tp_error_unref(err);
        return;
    }
    tp_future *f[5];
    tp_args *in = args_i64(30000);
    for (int i = 0; i < 4; i++) {
        f[i] = tp_rpc_async(a, "bravo", "t.sleep", in, 0);
    }
    // They are running in handlers on bravo before it dies.
    int got = tp_job_latch_wait(&g_entered, 4, WAIT_MS);
    TP_CHECKF(got == 4, "only %d of 4 t.sleep calls started on bravo", got);
    f[4] = tp_rpc_async(a, "bravo", "t.die", NULL, 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < 5; i++) {
        tp_error *err = NULL;
        tp_status st = tp_rpc_wait(f[i], tp_test_ms(15000), NULL, &err);
        int64_t dt = now_ms() - t0;
        TP_CHECKF(TP_STATUS_IS_CONN(st),
                  "call %d to the killed bravo: %s (%s), want a "
                  "connection-scope status",
                  i, tp_status_name(st), tp_error_message(err));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECKF(dt < 5000, "call %d failed %lld ms after bravo died", i,
                  (long long)dt);
        tp_error_unref(err);
        tp_future_unref(f[i]);
    }
    tp_args_unref(in);
    // Others keep working; new calls to bravo fail fast.
    in = args_str("alive");
    for (int i = 0; i < 10; i++) {
        tp_args *r = call_ok(a, "charlie", "tp.echo", in, WAIT_MS);
        check_str(r, "alive");
        tp_args_unref(r);
    }
    int64_t t1 = now_ms();
    tp_error *err = NULL;
    tp_status st = tp_rpc_sync(a, "bravo", "tp.echo", in, WAIT_MS, NULL, &err);
    TP_CHECKF(st != TP_OK && st != TP_ETIMEDOUT,
              "call to the dead bravo: %s (%s)", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    TP_CHECKF(now_ms() - t1 < 5000, "a call to the dead bravo took %lld ms",
              (long long)(now_ms() - t1));
    tp_error_unref(err);
    err = NULL;
    // Calling the dead worker again and again makes a connection each
    // time, which fails: the failed ones are freed, not kept.
    for (int i = 0; i < 50; i++) {
        st = tp_rpc_sync(a, "bravo", "tp.noop", NULL, WAIT_MS, NULL, &err);
        TP_CHECKF(st != TP_OK && st != TP_ETIMEDOUT,
                  "call %d to the dead bravo: %s (%s)", i, tp_status_name(st),
                  tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
    }
    size_t nconns = tp__agent_nconns(a);
    TP_CHECKF(nconns <= 6, "%zu connections kept after 50 failed calls",
              nconns);
    tp_args_unref(in);
    tp_rpc_peer_stats ps;
    TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &ps), NULL);
    TP_CHECKF(ps.errors >= 5, "errors to bravo: %llu",
              (unsigned long long)ps.errors);
    TP_CHECK_EQ(ps.pending, 0);
    release(a, 2);
    (void)tp_rpc_shutdown(a, false, &err);
    tp_error_unref(err);
}

static void
test_peer_killed(void)
{
    job j;
    job_tcp(&j, 3, worker_killed, NULL);
    j.expect_sig[1] = SIGKILL;
    job_run(&j);
}

// ---- cases: counters --------------------------------------------------------

#define NSTAT 10

static void
worker_stats(int rank, int world, const char *url, void *arg)
{
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        char payload[1000];
        memset(payload, 'p', sizeof(payload));
        tp_args *in = args_bytes(payload, sizeof(payload));
        for (int i = 0; i < NSTAT; i++) {
            tp_args_unref(call_ok(a, "bravo", "tp.echo", in, WAIT_MS));
        }
        tp_args_unref(in);
        tp_error_unref(
            call_fails(a, "bravo", "t.fail", NULL, WAIT_MS, TP_EINVAL));
        // bravo's view: NSTAT + 1 calls received (+1 if it counts the
        // t.stats call itself).
        tp_args *r = call_ok(a, "bravo", "t.stats", NULL, WAIT_MS);
        size_t n = 0;
        const void *p = tp_args_bytes(r, &n);
        tp_rpc_peer_stats bs;
        TP_CHECK_EQ(n, sizeof(bs));
        memcpy(&bs, p, sizeof(bs));
        tp_args_unref(r);
        TP_CHECK(strcmp(bs.peer.name, "alpha") == 0);
        TP_CHECK_EQ(bs.peer.rank, 0);
        TP_CHECKF(bs.calls_received == NSTAT + 1 ||
                      bs.calls_received == NSTAT + 2,
                  "bravo: calls_received %llu, want %d",
                  (unsigned long long)bs.calls_received, NSTAT + 1);
        TP_CHECK_EQ(bs.calls_sent, 0);
        TP_CHECKF(bs.bytes_received >= NSTAT * sizeof(payload),
                  "bravo: bytes_received %llu",
                  (unsigned long long)bs.bytes_received);
        TP_CHECKF(bs.bytes_sent >= NSTAT * sizeof(payload),
                  "bravo: bytes_sent %llu", (unsigned long long)bs.bytes_sent);

        tp_error_unref(
            call_fails(a, "bravo", "t.nope", NULL, WAIT_MS, TP_ENOENT));
        in = args_i64(1000);
        tp_error_unref(
            call_fails(a, "bravo", "t.sleep", in, 100, TP_ETIMEDOUT));
        tp_args_unref(in);

        tp_rpc_peer_stats st;
        memset(&st, 0, sizeof(st));
        TP_CHECK_OK(tp_rpc_get_peer_stats(a, 1, &st), NULL);
        TP_CHECK(strcmp(st.peer.name, "bravo") == 0);
        TP_CHECK_EQ(st.peer.rank, 1);
        int sent = NSTAT + 4; // echo, t.fail, t.stats, t.nope, t.sleep
        TP_CHECKF(st.calls_sent == (uint64_t)sent, "calls_sent %llu, want %d",
                  (unsigned long long)st.calls_sent, sent);
        TP_CHECK_EQ(st.calls_received, 0);
        TP_CHECKF(st.errors == 3,
                  "errors %llu, want 3 (t.fail, t.nope, "
                  "t.sleep)",
                  (unsigned long long)st.errors);
        TP_CHECK_EQ(st.timeouts, 1);
        TP_CHECK_EQ(st.pending, 0);
        TP_CHECK(st.bytes_sent >= NSTAT * 1000);
        TP_CHECK(st.bytes_received >= NSTAT * 1000);
        TP_CHECK(st.latency_min_us > 0);
        TP_CHECK(st.latency_min_us <= st.latency_p50_us);
        TP_CHECK(st.latency_p50_us <= st.latency_p99_us);
        TP_CHECK(st.latency_p99_us <= st.latency_max_us);
        TP_CHECK(st.latency_mean_us >= st.latency_min_us &&
                 st.latency_mean_us <= st.latency_max_us);
        TP_CHECKF(st.transport[0] != '\0', "no transport named for bravo");
        TP_CHECK_EQ(tp_rpc_get_peer_stats(a, 2, &st), TP_ENOENT);
        TP_CHECK_EQ(tp_rpc_get_peer_stats(a, -1, &st), TP_ENOENT);

        char *dbg = tp_rpc_get_debug_info(a);
        TP_CHECK(dbg != NULL);
        TP_CHECK_STR_CONTAINS(dbg, "alpha");
        TP_CHECK_STR_CONTAINS(dbg, "bravo");
        free(dbg);
    }
    leave(a);
}

static void
test_counters(void)
{
    run_tcp(2, worker_stats, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_shutdown_graceful_uneven, 60),
    TP_TEST_CASE_T(test_shutdown_abrupt, 60),
    TP_TEST_CASE_T(test_shutdown_timeout, 60),
    TP_TEST_CASE_T(test_peer_killed, 60),
    TP_TEST_CASE_T(test_counters, 60),
};

TP_TEST_MAIN(cases)
