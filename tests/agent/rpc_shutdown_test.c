// SPDX-License-Identifier: Apache-2.0
// rpc_shutdown_test.c - graceful shutdown when a worker is already known
// dead (its pipe failed): the agreement fails at once naming it, instead
// of waiting out the shutdown timeout (issue 16). 3 worker processes on
// loopback; charlie is killed after it served one call from each.

#include "tp_test.h"

#include <signal.h>
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

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_dead_worker, 60),
};

TP_TEST_MAIN(cases)
