/* SPDX-License-Identifier: Apache-2.0 */
/* pg_init_test.c - the rendezvous of tp_pg_init (store/join.h, issue 15):
 * a world-size disagreement and a rank used twice fail every member at
 * once (not at the init deadline) naming the sizes or the rank; a file
 * store reused by jobs of sizes 2, 3, 2, by jobs with a rank that never
 * joined, and after a job killed in its init (a generation left open).
 *
 * Every rank is a forked child of the case process (tp_test_job.h);
 * loopback only; every wait has a deadline. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/store.h>
#include <tpipe/tensor.h>

#include "tp_test.h"
#include "tp_test_job.h"

// The init deadline of every case: a failure that waits for it is a bug.
#define INIT_MS 20000
// "At once": a conflict fails every member well within this.
#define PROMPT_MS 4000

// Posted by a worker whose init failed with the expected message.
static tp_job_latch g_failed;

static void
run(tp_job *j, int64_t limit_ms)
{
    int e = 0;
    while (j->env[e] != NULL) {
        e++;
    }
    j->env[e] = "TP_SOCKET_IFNAME=lo";
    j->limit_ms = limit_ms;
    tp_job_run(j);
}

static void
file_url(char *url, size_t n)
{
    static int seq;
    snprintf(url, n, "file:///tmp/tp-pg-init-test-%d-%d-%lld", (int)getpid(),
             seq++, (long long)tp_job_now_ms());
}

static void
file_unlink(const char *url)
{
    unlink(url + strlen("file://"));
}

static tp_status
init(const char *url, int rank, int world, int64_t init_ms, tp_pg **pg_p,
     tp_error **err_p)
{
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = init_ms;
    o.timeout_ms = tp_test_ms(20000);
    return tp_pg_init(url, rank, world, &o, pg_p, err_p);
}

// all_reduce of one int64 holding rank + 1: the sum is w(w+1)/2.
static void
check_all_reduce(tp_pg *pg, int rank, int world)
{
    int64_t one = 1;
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_I64, 1, &one, &t, &err), err);
    *(int64_t *)tp_tensor_data(t) = rank + 1;
    TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
    TP_CHECK_EQ(*(int64_t *)tp_tensor_data(t),
                (int64_t)world * (world + 1) / 2);
    tp_tensor_unref(t);
}

// A full job: init, one all_reduce, destroy.
static void
rank_ok(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(init(url, rank, world, tp_test_ms(INIT_MS), &pg, &err), err);
    TP_CHECK_EQ(tp_pg_size(pg), world);
    check_all_reduce(pg, rank, world);
    tp_pg_destroy(pg);
}

// Init must fail within PROMPT_MS with TP_EINVAL and a message holding
// @want (and @want2 unless NULL).
static void
expect_prompt_failure(const char *url, int rank, int world, const char *want,
                      const char *want2)
{
    int64_t t0 = tp_job_now_ms();
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = init(url, rank, world, tp_test_ms(INIT_MS), &pg, &err);
    int64_t took = tp_job_now_ms() - t0;
    TP_CHECKF(st == TP_EINVAL,
              "rank %d (world %d): init gave %s after %lld ms: %s, want "
              "TP_EINVAL",
              rank, world, tp_status_name(st), (long long)took,
              tp_error_message(err));
    TP_CHECKF(took < PROMPT_MS, "rank %d: failed only after %lld ms: %s", rank,
              (long long)took, tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
    if (want2 != NULL) {
        TP_CHECK_STR_CONTAINS(tp_error_message(err), want2);
    }
    tp_error_unref(err);
}

// ---- world sizes that disagree ---------------------------------------------

// Rank 1 says the world has 3 ranks, rank 0 says 2: both fail at once.
static void
rank_size_2_3(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    (void)world;
    expect_prompt_failure(url, rank, rank == 1 ? 3 : 2,
                          "rank 1 says the world size is 3, rank 0 says 2",
                          NULL);
}

static void
test_world_size_file(void)
{
    tp_job j = {.world = 2, .fn = rank_size_2_3};
    file_url(j.url, sizeof(j.url));
    run(&j, 30000);
    file_unlink(j.url);
}

// Three processes on a tcp store rank 0 hosts: rank 1 says 2, ranks 0
// and 2 say 3. Rank 2 fails with the message too (rank 0 keeps the store
// up until it has read it).
static void
rank_size_3_2(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    (void)world;
    expect_prompt_failure(url, rank, rank == 1 ? 2 : 3,
                          "rank 1 says the world size is 2, rank 0 says 3",
                          NULL);
}

static void
test_world_size_tcp(void)
{
    tp_job j;
    tp_job_tcp(&j, 3, rank_size_3_2, NULL);
    run(&j, 30000);
}

// ---- a rank used twice
// -------------------------------------------------------

// Process 2 of the job claims rank @arg as well (world 2). The other rank
// starts 300 ms late: two rank 1s both wait for rank 0's generation and
// race for the slot; two rank 0s have both opened theirs before rank 1
// comes. At least one process fails at once naming the rank; the others
// either fail the same way or work together.
static void
rank_twice(int proc, int world, const char *url, void *arg)
{
    int dup = (int)(intptr_t)arg;
    int rank = proc == 2 ? dup : proc;
    (void)world;
    if (rank != dup) {
        tp_job_sleep_ms(300);
    }
    char want[64];
    snprintf(want, sizeof(want), "rank %d is claimed by two processes", dup);
    int64_t t0 = tp_job_now_ms();
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = init(url, rank, 2, tp_test_ms(INIT_MS), &pg, &err);
    int64_t took = tp_job_now_ms() - t0;
    if (st == TP_OK) {
        check_all_reduce(pg, rank, 2);
        // A running job: a tcp store rank 0 hosts stays up while the
        // other claimant decides (store/join.c, JOIN_TAKEN_WAIT_MS).
        tp_job_sleep_ms(2000);
        tp_pg_destroy(pg);
        return;
    }
    TP_CHECKF(took < PROMPT_MS,
              "process %d (rank %d): failed after %lld ms: %s", proc, rank,
              (long long)took, tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
    tp_error_unref(err);
    tp_job_latch_post(&g_failed);
}

static void
run_twice(int dup, bool tcp)
{
    tp_job_latch_init(&g_failed);
    tp_job j;
    tp_job_tcp(&j, 3, rank_twice, (void *)(intptr_t)dup);
    if (!tcp) {
        file_url(j.url, sizeof(j.url));
    }
    run(&j, 30000);
    TP_CHECKF(tp_job_latch_wait(&g_failed, 1, 100) == 1,
              "no process failed naming rank %d", dup);
    tp_job_latch_fini(&g_failed);
    if (!tcp) {
        file_unlink(j.url);
    }
}

static void
test_rank_twice_file(void)
{
    run_twice(1, false);
}

static void
test_rank_twice_tcp(void)
{
    run_twice(1, true);
}

// Two processes as rank 0 on a file store (each opens a generation).
static void
test_rank0_twice_file(void)
{
    run_twice(0, false);
}

// ---- a file store reused by later jobs -------------------------------------

// Only ranks 0..nstart-1 start: init times out after 1 s naming a rank.
static void
rank_alone(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = init(url, rank, world, 1000, &pg, &err);
    TP_CHECKF(st == TP_ETIMEDOUT, "rank %d: %s: %s, want TP_ETIMEDOUT", rank,
              tp_status_name(st), tp_error_message(err));
    tp_error_unref(err);
}

// A job whose rank 0 never starts: rank 1 times out.
static void
rank_only1(int rank, int world, const char *url, void *arg)
{
    if (rank == 1) {
        rank_alone(rank, world, url, arg);
    }
}

static void
job_on(const char *url, int world, int nstart, tp_job_fn fn)
{
    tp_job j = {.world = world, .nstart = nstart, .fn = fn};
    snprintf(j.url, sizeof(j.url), "%s", url);
    run(&j, 40000);
}

// Sizes 2, 3, 2, then a size-2 job whose rank 1 never joins, one whose
// rank 0 never joins, and a size-2 job that must still work.
static void
test_file_reused(void)
{
    char url[256];
    file_url(url, sizeof(url));
    job_on(url, 2, 0, rank_ok);
    job_on(url, 3, 0, rank_ok);
    job_on(url, 2, 0, rank_ok);
    job_on(url, 2, 1, rank_alone); // only rank 0
    job_on(url, 2, 0, rank_ok);
    job_on(url, 2, 0, rank_only1);
    job_on(url, 2, 0, rank_ok);
    job_on(url, 3, 0, rank_ok);
    job_on(url, 2, 0, rank_ok);
    file_unlink(url);
}

// A job killed in its init left generation G open (rank 0's slot taken,
// its deadline far ahead). The next job's rank 1 may join G before the
// new rank 0 opens G + 1; it must move there, not wait for G's rank 0.
static void
rank_late0(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    if (rank == 0) {
        tp_job_sleep_ms(500); // rank 1 joins the stale generation first
    }
    rank_ok(rank, world, url, NULL);
}

static void
test_file_killed_job(void)
{
    char url[256];
    file_url(url, sizeof(url));
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, 0, 1, tp_test_ms(10000), &s, &err), err);
    int64_t n = 0;
    TP_CHECK_OK(tp_store_add(s, "tp.pg/open", 1, -1, &n, &err), err);
    TP_CHECK_EQ(n, 1);
    // What a rank 0 killed in its init leaves: its slot and the world
    // size, with a deadline 10 minutes ahead.
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char info[64];
    int len = snprintf(info, sizeof(info), "2 %lld",
                       (long long)ts.tv_sec * 1000 + 600000);
    TP_CHECK_OK(
        tp_store_set(s, "tp.pg/g/0/slot/0", "gone pid 1 #0", 13, -1, &err),
        err);
    TP_CHECK_OK(tp_store_set(s, "tp.pg/g/0/info", info, (size_t)len, -1, &err),
                err);
    tp_store_close(s);
    tp_job j = {.world = 2, .fn = rank_late0};
    snprintf(j.url, sizeof(j.url), "%s", url);
    run(&j, 30000);
    file_unlink(url);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_world_size_file, 60),
    TP_TEST_CASE_T(test_world_size_tcp, 60),
    TP_TEST_CASE_T(test_rank_twice_file, 60),
    TP_TEST_CASE_T(test_rank_twice_tcp, 60),
    TP_TEST_CASE_T(test_rank0_twice_file, 60),
    TP_TEST_CASE_T(test_file_reused, 240),
    TP_TEST_CASE_T(test_file_killed_job, 60),
};

TP_TEST_MAIN(cases)
