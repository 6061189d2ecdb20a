// SPDX-License-Identifier: Apache-2.0
// rpc_shutdown_test.c - faults around connections and shutdown (issue
// 16), worker processes on loopback:
//   - graceful shutdown when a worker is already known dead (its pipe
//     failed): the agreement fails at once naming it, instead of waiting
//     out the shutdown timeout; charlie is killed after it served one
//     call from each;
//   - graceful shutdown when a worker's pipe failed but the worker lives
//     (an injected fault) and calls again later: the agreement waits for
//     it (a new connection answers) and both shut down cleanly;
//   - a call to a stopped worker whose connection attempt times out fails
//     with TP_ETIMEDOUT (the pipe's status), not TP_ECONNRESET.

#include "tp_test.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <tpipe/rpc.h>

#include "tp_test_job.h"

#define WAIT_MS 20000

static const char *const k_names[3] = {"alpha", "bravo", "charlie"};

static void
w_dead(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    tp_error *err = NULL;
    if (rank == 2) {
        // Serve the two calls, then die.
        tp_job_sleep_ms(tp_test_ms(300));
        kill(getpid(), SIGKILL);
    }
    TP_CHECK_OK(tp_rpc_sync_rank(a, 2, "tp.noop", NULL, WAIT_MS, NULL, &err),
                err);
    // Wait until charlie's death is seen: a call fails.
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    while (tp_rpc_sync_rank(a, 2, "tp.noop", NULL, 1000, NULL, &err) == TP_OK) {
        TP_CHECKF(tp_job_now_ms() < end, "rank %d: charlie still answers",
                  rank);
        tp_job_sleep_ms(10);
    }
    tp_error_unref(err);
    err = NULL;
    int64_t t0 = tp_job_now_ms();
    tp_status st = tp_rpc_shutdown(a, true, &err);
    int64_t dt = tp_job_now_ms() - t0;
    printf("rank %d: graceful shutdown: %s after %lld ms: %s\n", rank,
           tp_status_name(st), (long long)dt, tp_error_message(err));
    TP_CHECK_EQ(st, TP_ECONNRESET);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "charlie (rank 2)");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cannot take part");
    TP_CHECKF(dt < tp_test_ms(5000), "rank %d: the shutdown took %lld ms", rank,
              (long long)dt);
    tp_error_unref(err);
}

static void
test_dead_worker(void)
{
    tp_job j;
    tp_job_tcp(&j, 3, w_dead, NULL);
    j.names = k_names;
    j.expect_sig[2] = SIGKILL;
    tp_job_run(&j);
}

// alpha fails its first reply on purpose (TP_RPC_FAULTY=fail=reply:1):
// bravo's call fails and bravo takes alpha for dead. bravo then shuts
// down at once, while alpha works for a while, calls bravo again (a new
// connection) and shuts down too: bravo's agreement waits for alpha
// instead of failing and closing its listener under alpha's call.
static void
w_transient(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    if (rank == 0) {
        setenv("TP_RPC_FAULTY", "fail=reply:1", 1); // alpha only
    }
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    tp_error *err = NULL;
    if (rank == 1) {
        tp_status st =
            tp_rpc_sync_rank(a, 0, "tp.noop", NULL, WAIT_MS, NULL, &err);
        printf("bravo: call to alpha: %s: %s\n", tp_status_name(st),
               tp_error_message(err));
        TP_CHECK_EQ(st, TP_ECONNRESET); // alpha closed the pipe: EOF
        tp_error_unref(err);
        err = NULL;
    } else {
        tp_job_sleep_ms(tp_test_ms(800)); // bravo is in its shutdown
        TP_CHECK_OK(
            tp_rpc_sync_rank(a, 1, "tp.noop", NULL, WAIT_MS, NULL, &err), err);
    }
    tp_status st = tp_rpc_shutdown(a, true, &err);
    printf("%s: graceful shutdown: %s: %s\n", k_names[rank], tp_status_name(st),
           tp_error_message(err));
    TP_CHECK_OK(st, err);
}

static void
test_transient_failure(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_transient, NULL);
    j.names = k_names;
    tp_job_run(&j);
}

// bravo stops (SIGSTOP) before alpha ever connects to it: alpha's call
// fails when the connection attempt times out, as a timeout.
static void
w_stopped(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 1) {
        raise(SIGSTOP); // killed by the harness once alpha is done
        TP_CHECK(false);
    }
    tp_job_sleep_ms(100);
    tp_error *err = NULL;
    int64_t t0 = tp_job_now_ms();
    tp_status st = tp_rpc_sync_rank(a, 1, "tp.noop", NULL, WAIT_MS, NULL, &err);
    int64_t dt = tp_job_now_ms() - t0;
    printf("rank 0: call to a stopped worker: %s after %lld ms: %s\n",
           tp_status_name(st), (long long)dt, tp_error_message(err));
    TP_CHECK_EQ(st, TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "timed out");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
    TP_CHECKF(dt < tp_test_ms(WAIT_MS) / 2,
              "the call took %lld ms: the call's own deadline, not the "
              "connection attempt's",
              (long long)dt);
    tp_error_unref(err);
    tp_rpc_shutdown(a, false, NULL);
}

static void
test_stopped_worker(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_stopped, NULL);
    j.names = k_names;
    j.env[0] = "TP_CONNECT_TIMEOUT_MS=500";
    j.env[1] = "TP_HANDSHAKE_TIMEOUT_MS=500";
    j.kill_last[1] = true;
    j.expect_sig[1] = SIGKILL;
    tp_job_run(&j);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_dead_worker, 60),
    TP_TEST_CASE_T(test_transient_failure, 60),
    TP_TEST_CASE_T(test_stopped_worker, 60),
};

TP_TEST_MAIN(cases)
