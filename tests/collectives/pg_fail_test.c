/* SPDX-License-Identifier: Apache-2.0 */
/* pg_fail_test.c - process groups when things go wrong, across forked
 * ranks on loopback: a destroy while another thread waits on a work of
 * the group; the pipe engine's timeouts with a peer stopped by SIGSTOP
 * (the stuck sender returns at the timeout, a resumed rank reports the
 * real elapsed time, the group is named once); a rank that never calls a
 * collective, alive or stopped, is the one the pipe engine names (not a
 * caller that waits on it); the flight recorder.
 *
 * Every rank is a forked child of the case process, forked before any
 * thread exists. Every wait has a deadline. */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/tpipe.h>

#include "tp_test.h"
#include "tp_test_job.h"

// The collective timeout of the timeout cases, in ms.
#define T_MS 1500

static tp_job_latch g_latch = {{-1, -1}};
// absent_rank with a stop: rank 3's pid send has completed, so rank 0's
// SIGSTOP cannot catch that send in flight (it would time out).
static tp_job_latch g_sent = {{-1, -1}};

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

#define EXPECT_EINVAL(pg)                                                      \
    do {                                                                       \
        char *o_ = NULL;                                                       \
        tp_error *e_ = NULL;                                                   \
        TP_CHECK_EQ(tp_pg_get_debug_info(pg, NULL, &e_), TP_EINVAL);           \
        tp_error_unref(e_);                                                    \
        TP_CHECK_EQ(tp_pg_get_debug_info(NULL, &o_, NULL), TP_EINVAL);         \
    } while (0)

static tp_tensor *
tensor(tp_dtype dt, size_t count)
{
    int64_t shape[1] = {(int64_t)count};
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(dt, 1, shape, &t, &err), err);
    return t;
}

static int
count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL;
         p = strstr(p + 1, needle)) {
        n++;
    }
    return n;
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

// ---- pipe-engine timeouts
// -----------------------------------------------------

// Rank 0 learns rank 1's pid, stops it (SIGSTOP) while rank 1 waits in a
// broadcast of 64 MiB from rank 0, and enters the broadcast: its send to
// the stopped rank never completes. It must fail at about the timeout
// (not twice it). Rank 0 resumes rank 1 after 2.5 timeouts: rank 1's
// error must give the real time, not "0 ms". Neither message names the
// group twice.
static void
stuck_rank(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = init_pg(rank, world, url, T_MS);
    tp_error *err = NULL;
    tp_tensor *pid = tensor(TP_I64, 1);
    tp_tensor *big = tensor(TP_F32, (size_t)16 << 20);
    char what[96];
    snprintf(what, sizeof(what), "process group world (rank %d of %d)", rank,
             world);
    if (rank == 1) {
        *(int64_t *)tp_tensor_data(pid) = (int64_t)getpid();
        TP_CHECK_OK(tp_pg_send(pg, pid, 0, 1, NULL, &err), err);
        tp_job_latch_post(&g_latch);
        int64_t t0 = tp_job_now_ms();
        tp_status st = tp_pg_broadcast(pg, big, 0, NULL, &err);
        int64_t dt = tp_job_now_ms() - t0;
        const char *m = tp_error_message(err);
        TP_CHECKF(st != TP_OK, "broadcast with a stopped rank succeeded");
        TP_CHECKF(dt >= T_MS, "rank 1 failed after %" PRId64 " ms: %s", dt, m);
        TP_CHECKF(strstr(m, "after 0 ms") == NULL, "rank 1: %s", m);
        TP_CHECKF(count_of(m, what) == 1, "rank 1 names its group %d times: %s",
                  count_of(m, what), m);
        tp_error_unref(err);
    } else {
        TP_CHECK_OK(tp_pg_recv(pg, pid, 1, 1, NULL, &err), err);
        pid_t p1 = (pid_t) * (int64_t *)tp_tensor_data(pid);
        TP_CHECK_EQ(tp_job_latch_wait(&g_latch, 1, 20000), 1);
        tp_job_sleep_ms(200); // rank 1 waits in the broadcast
        TP_CHECK(kill(p1, SIGSTOP) == 0);
        int64_t t0 = tp_job_now_ms();
        tp_status st = tp_pg_broadcast(pg, big, 0, NULL, &err);
        int64_t dt = tp_job_now_ms() - t0;
        const char *m = tp_error_message(err);
        TP_CHECKF(st == TP_ETIMEDOUT, "rank 0: %s: %s", tp_status_name(st), m);
        TP_CHECKF(dt < T_MS * 3 / 2, "rank 0 failed after %" PRId64 " ms: %s",
                  dt, m);
        TP_CHECKF(count_of(m, what) == 1, "rank 0 names its group %d times: %s",
                  count_of(m, what), m);
        tp_error_unref(err);
        tp_job_sleep_ms(T_MS * 5 / 2 - (tp_job_now_ms() - t0));
        TP_CHECK(kill(p1, SIGCONT) == 0);
        tp_job_sleep_ms(500); // rank 1 fails; then this rank may go
    }
    tp_tensor_unref(pid);
    tp_tensor_unref(big);
    tp_pg_destroy(pg);
}

static void
test_stuck_peer(void)
{
    tp_job_latch_init(&g_latch);
    tp_job j = {.world = 2, .fn = stuck_rank};
    job_run(&j, "TP_COLL_ENGINE=pipe");
    tp_job_latch_fini(&g_latch);
}

// ---- a rank that never calls ---------------------------------------------

// The bound of the members' query on a timeout: a quarter of it.
#define Q_MS (T_MS / 4)

// After a barrier of all four (#0), ranks 0, 1 and 2 call an all_reduce
// (#1, 1.5 s timeout) that rank 3 never calls: it waits in user code
// (@arg NULL) or is stopped by rank 0 (SIGSTOP, @arg not NULL). With
// recursive doubling rank 0 waits on rank 2, which waits on rank 3: every
// caller's error must still name rank 3 (it never called #1; or it did
// not answer), no caller as the culprit, and come within the timeout and
// the query's bound. Rank 3 exits cleanly once the callers reported.
static void
absent_rank(int rank, int world, const char *url, void *arg)
{
    bool stop = arg != NULL;
    tp_pg *pg = init_pg(rank, world, url, T_MS);
    tp_error *err = NULL;
    tp_tensor *pid = tensor(TP_I64, 1);
    tp_tensor *t = tensor(TP_F32, 256);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    if (rank == 3) {
        if (stop) {
            *(int64_t *)tp_tensor_data(pid) = (int64_t)getpid();
            TP_CHECK_OK(tp_pg_send(pg, pid, 0, 1, NULL, &err), err);
            tp_job_latch_post(&g_sent);
        }
        // User code, away from the group, until the callers reported.
        TP_CHECK_EQ(tp_job_latch_wait(&g_latch, 3, 30000), 3);
    } else {
        pid_t p3 = 0;
        if (stop && rank == 0) {
            TP_CHECK_OK(tp_pg_recv(pg, pid, 3, 1, NULL, &err), err);
            p3 = (pid_t) * (int64_t *)tp_tensor_data(pid);
            TP_CHECK_EQ(tp_job_latch_wait(&g_sent, 1, 20000), 1);
            TP_CHECK(kill(p3, SIGSTOP) == 0);
        }
        int64_t t0 = tp_job_now_ms();
        tp_status st = tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err);
        int64_t dt = tp_job_now_ms() - t0;
        const char *m = tp_error_message(err);
        // TP_EREMOTE: another caller timed out first and said why.
        TP_CHECKF(st == TP_ETIMEDOUT || st == TP_EREMOTE, "rank %d: %s: %s",
                  rank, tp_status_name(st), m);
        TP_CHECKF(dt < T_MS + Q_MS + tp_test_ms(500),
                  "rank %d failed after %" PRId64 " ms: %s", rank, dt, m);
        TP_CHECK_STR_CONTAINS(
            m, stop ? "rank 3 (world rank 3) did not answer within 375 ms "
                      "(stopped or dead?)"
                    : "rank 3 (world rank 3) never called all_reduce #1 "
                      "(its last was #0)");
        for (int r = 0; r < 3; r++) {
            char who[64];
            snprintf(who, sizeof(who), "rank %d (world rank %d) never", r, r);
            TP_CHECKF(strstr(m, who) == NULL, "rank %d blames %d: %s", rank, r,
                      m);
            snprintf(who, sizeof(who), "rank %d (world rank %d) did not", r, r);
            TP_CHECKF(strstr(m, who) == NULL, "rank %d blames %d: %s", rank, r,
                      m);
        }
        TP_CHECKF(strstr(m, "waiting for a message from") == NULL,
                  "rank %d: %s", rank, m);
        tp_error_unref(err);
        if (stop && rank == 0) {
            // Ranks 1 and 2 reported: resume rank 3 and let it go.
            TP_CHECK_EQ(tp_job_latch_wait(&g_latch, 2, 30000), 2);
            TP_CHECK(kill(p3, SIGCONT) == 0);
            for (int i = 0; i < 3; i++) {
                tp_job_latch_post(&g_latch);
            }
        } else {
            tp_job_latch_post(&g_latch);
        }
    }
    tp_tensor_unref(pid);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
}

static void
test_absent_rank(void)
{
    tp_job_latch_init(&g_latch);
    tp_job j = {.world = 4, .fn = absent_rank};
    job_run(&j, "TP_COLL_ENGINE=pipe");
    tp_job_latch_fini(&g_latch);
}

static void
test_absent_rank_stopped(void)
{
    static int stop = 1;
    tp_job_latch_init(&g_latch);
    tp_job_latch_init(&g_sent);
    tp_job j = {.world = 4, .fn = absent_rank, .arg = &stop};
    job_run(&j, "TP_COLL_ENGINE=pipe");
    tp_job_latch_fini(&g_sent);
    tp_job_latch_fini(&g_latch);
}

// ---- flight recorder
// ---------------------------------------------------------

static char *
debug_info(tp_pg *pg)
{
    char *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pg_get_debug_info(pg, &s, &err), err);
    return s;
}

// Three collectives are listed with their kind, sequence number, root,
// bytes and state; then an all_reduce that rank 1 joins late is listed as
// running while rank 0 waits in it. With arg != NULL the recorder keeps
// two entries (TP_PG_FLIGHT_RECORDER=2).
static void
fr_rank(int rank, int world, const char *url, void *arg)
{
    tp_pg *pg = init_pg(rank, world, url, tp_test_ms(30000));
    tp_error *err = NULL;
    tp_tensor *f = tensor(TP_F32, 256), *l = tensor(TP_I64, 8);
    TP_CHECK_OK(tp_pg_all_reduce(pg, f, TP_REDUCE_SUM, NULL, &err), err);
    TP_CHECK_OK(tp_pg_broadcast(pg, l, 1, NULL, &err), err);
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    char *s = debug_info(pg);
    if (arg == NULL) {
        TP_CHECK_STR_CONTAINS(s, "last 3 of 3 collectives (capacity 64)");
        TP_CHECK_STR_CONTAINS(s, "op 1 all_reduce seq 0 root - bytes 1024 "
                                 "state done");
        TP_CHECK_STR_CONTAINS(s, "op 2 broadcast seq 1 root 1 bytes 64 "
                                 "state done");
    } else {
        TP_CHECK_STR_CONTAINS(s, "last 2 of 3 collectives (capacity 2)");
        TP_CHECKF(strstr(s, "all_reduce") == NULL, "%s", s);
    }
    TP_CHECK_STR_CONTAINS(s, "op 3 barrier seq 2 root - bytes 0 state done");
    free(s);
    tp_work *w = NULL;
    if (rank == 1) {
        TP_CHECK_EQ(tp_job_latch_wait(&g_latch, 1, 20000), 1);
    }
    TP_CHECK_OK(tp_pg_all_reduce(pg, f, TP_REDUCE_MAX, &w, &err), err);
    if (rank == 0) {
        // The group's thread starts it at once; it waits for rank 1.
        int64_t until = tp_job_now_ms() + tp_test_ms(10000);
        bool seen = false;
        while (!seen && tp_job_now_ms() < until) {
            s = debug_info(pg);
            seen = strstr(s, "op 4 all_reduce seq 3 root - bytes 1024 "
                             "state running") != NULL;
            if (!seen) {
                tp_job_sleep_ms(10);
            }
            free(s);
        }
        TP_CHECKF(seen, "op 4 not listed as running");
        tp_job_latch_post(&g_latch);
    }
    TP_CHECK_OK(tp_work_wait(w, tp_test_ms(20000), &err), err);
    tp_work_free(w);
    s = debug_info(pg);
    TP_CHECK_STR_CONTAINS(s, "op 4 all_reduce seq 3 root - bytes 1024 "
                             "state done");
    free(s);
    EXPECT_EINVAL(pg);
    tp_tensor_unref(f);
    tp_tensor_unref(l);
    tp_pg_destroy(pg);
}

static void
test_flight_recorder(void)
{
    const char *engines[] = {"TP_COLL_ENGINE=pipe", "TP_COLL_ENGINE=auto"};
    for (int e = 0; e < 3; e++) {
        tp_job_latch_init(&g_latch);
        tp_job j = {.world = 2, .fn = fr_rank};
        if (e == 2) {
            j.env[2] = "TP_PG_FLIGHT_RECORDER=2";
            j.arg = &g_latch;
        }
        job_run(&j, engines[e % 2]);
        tp_job_latch_fini(&g_latch);
    }
}

static const tp_test_case k_cases[] = {
    TP_TEST_CASE_T(test_destroy_waiting, 60),
    TP_TEST_CASE_T(test_stuck_peer, 60),
    TP_TEST_CASE_T(test_absent_rank, 60),
    TP_TEST_CASE_T(test_absent_rank_stopped, 60),
    TP_TEST_CASE_T(test_flight_recorder, 60),
};

TP_TEST_MAIN(k_cases)
