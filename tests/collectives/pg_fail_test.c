/* SPDX-License-Identifier: Apache-2.0 */
/* pg_fail_test.c - process groups when things go wrong, across forked
 * ranks on loopback: a destroy while another thread waits on a work of
 * the group.
 *
 * Every rank is a forked child of the case process, forked before any
 * thread exists. Every wait has a deadline. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/tpipe.h>

#include "tp_test.h"
#include "tp_test_job.h"

static tp_job_latch g_latch = {{-1, -1}};

static void
job_run(tp_job *j, const char *engine)
{
    j->env[0] = "TP_SOCKET_IFNAME=lo";
    j->env[1] = engine;
    if (j->limit_ms == 0) {
        j->limit_ms = 60000;
    }
    snprintf(j->url, sizeof(j->url), "file:///tmp/tp-pg-fail-%d-%lld",
             (int)getpid(), (long long)tp_job_now_ms());
    tp_job_run(j);
}

static tp_pg *
init_pg(int rank, int world, const char *url, int64_t timeout_ms)
{
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = tp_test_ms(30000);
    o.timeout_ms = timeout_ms;
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pg_init(url, rank, world, &o, &pg, &err), err);
    return pg;
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

// ---- teardown ---------------------------------------------------------------

typedef struct waiter {
    tp_work *w;
    tp_status st;
    char msg[512];
    int64_t ms;
} waiter;

static void *
waiter_main(void *arg)
{
    waiter *wt = arg;
    tp_error *err = NULL;
    int64_t t0 = tp_job_now_ms();
    wt->st = tp_work_wait(wt->w, tp_test_ms(20000), &err);
    wt->ms = tp_job_now_ms() - t0;
    snprintf(wt->msg, sizeof(wt->msg), "%s", tp_error_message(err));
    tp_error_unref(err);
    return NULL;
}

// Rank 0 destroys its world group while one thread waits on an
// asynchronous all_reduce (rank 1 never joins it) and another on a recv
// from rank 1 (never sent): both wake with TP_ECLOSED, and their handles
// are freed after the group is gone.
static void
destroy_waiting_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, tp_test_ms(30000));
    if (rank == 1) {
        TP_CHECK_EQ(tp_job_latch_wait(&g_latch, 1, 20000), 1);
        tp_pg_destroy(pg);
        return;
    }
    tp_error *err = NULL;
    tp_tensor *a = tensor(TP_F32, 1024), *b = tensor(TP_F32, 4);
    waiter wc = {.st = TP_OK}, wp = {.st = TP_OK};
    TP_CHECK_OK(tp_pg_all_reduce(pg, a, TP_REDUCE_SUM, &wc.w, &err), err);
    TP_CHECK_OK(tp_pg_recv(pg, b, 1, 3, &wp.w, &err), err);
    pthread_t tc, tq;
    TP_CHECK(pthread_create(&tc, NULL, waiter_main, &wc) == 0);
    TP_CHECK(pthread_create(&tq, NULL, waiter_main, &wp) == 0);
    tp_job_sleep_ms(300); // both inside tp_work_wait, probing rank 1
    int64_t t0 = tp_job_now_ms();
    tp_pg_destroy(pg);
    int64_t dt = tp_job_now_ms() - t0;
    TP_CHECK(pthread_join(tc, NULL) == 0);
    TP_CHECK(pthread_join(tq, NULL) == 0);
    TP_CHECKF(dt < tp_test_ms(2000), "destroy took %" PRId64 " ms", dt);
    TP_CHECKF(wc.st == TP_ECLOSED, "all_reduce waiter: %s: %s",
              tp_status_name(wc.st), wc.msg);
    TP_CHECK_STR_CONTAINS(wc.msg, "destroyed");
    TP_CHECKF(wp.st == TP_ECLOSED, "recv waiter: %s: %s", tp_status_name(wp.st),
              wp.msg);
    TP_CHECK_STR_CONTAINS(wp.msg, "destroyed");
    // The handles outlive the group.
    TP_CHECK(tp_work_is_completed(wc.w));
    TP_CHECK_EQ(tp_work_wait(wc.w, 1000, NULL), TP_ECLOSED);
    tp_work_free(wc.w);
    tp_work_free(wp.w);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_job_latch_post(&g_latch);
}

static void
test_destroy_waiting(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 2; e++) {
        tp_job_latch_init(&g_latch);
        tp_job j = {.world = 2, .fn = destroy_waiting_rank};
        job_run(&j, engines[e]);
        tp_job_latch_fini(&g_latch);
    }
}

static const tp_test_case k_cases[] = {
    TP_TEST_CASE_T(test_destroy_waiting, 60),
};

TP_TEST_MAIN(k_cases)
