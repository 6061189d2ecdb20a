// SPDX-License-Identifier: Apache-2.0
// store_join_test.c - the limits of a rendezvous's join (store/join.c,
// docs/store.md "Joining a generation"), each a regression test of issue
// 15:
//   - a rank claimed again after the job's init finished, on a store the
//     job's rank 0 hosts, fails at once, naming the rank, the job and the
//     holder, instead of waiting out its deadline (a holder on another
//     host) or a second (a holder alive on this host);
//   - two jobs with their own job ids (TP_JOB_ID) on one store at once
//     are kept apart; a rank of a job whose store is hosted by another
//     running job's rank 0 (two jobs on one MASTER_ADDR:MASTER_PORT) fails
//     at once naming both;
//   - the keys of generations that are over (complete, failed, expired)
//     are removed when the job's rank 0 opens a new one: the store does
//     not grow with each job; what a generation's users published goes
//     too when it never completed (the store's prefix delete, on every
//     backend);
//   - the end of a job removes its own generation: tp__store_job_end, and
//     tp__store_job_leave by the last member to leave (no waiting), on a
//     file store and a mem store.
// Loopback only; every wait has a deadline.

#include "tp_test.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpipe/store.h>

#include "core/platform.h"
#include "store/join.h"
#include "store/store_int.h"

#define NS      "t.join/"
#define WAIT_MS 5000

static uint64_t
ms_since(uint64_t t0)
{
    return (tp__now_ns() - t0) / 1000000u;
}

static tp_store *
open_store(const char *url, int rank)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, rank, 2, tp_test_ms(WAIT_MS), &s, &err),
                err);
    return s;
}

static void
join_ok(tp_store *s, int rank, tp__store_member *j)
{
    tp_error *err = NULL;
    TP_CHECK_OK(tp__store_join(s, NS, rank, 2, 20000,
                               tp__deadline_after_ms(WAIT_MS), j, &err),
                err);
}

static char *
file_url(char *path, size_t plen, char *url, size_t ulen)
{
    snprintf(path, plen, "/tmp/tp_store_join_XXXXXX");
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    snprintf(url, ulen, "file://%s", path);
    return url;
}

// A rank whose slot is held by a process on another host, after the job's
// init finished, on a store that the job's rank 0 hosts: the job is
// running (its rank 0 answers), so this is a second claimant.
static void
test_dup_after_init_remote_holder(void)
{
    unsetenv("TP_JOB_ID");
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    tp_store *s0 = open_store(url, 0), *s1 = open_store(url, 1);
    tp__store_member j0;
    join_ok(s0, 0, &j0);
    // Rank 1 of the running job, as it would claim its slot from another
    // host (the key layout of docs/store.md).
    char key[128];
    snprintf(key, sizeof(key), NS "g/%lld/slot/1", (long long)j0.j_gen);
    const char *holder = "far-away-host pid 4242 #0";
    void *v = NULL;
    size_t n = 0;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_compare_set(s1, key, "", 0, holder, strlen(holder),
                                     WAIT_MS, &v, &n, &err),
                err);
    free(v);
    tp__store_join_done(&j0);

    tp_store *s2 = open_store(url, 1);
    tp__store_member j2;
    uint64_t t0 = tp__now_ns();
    tp_status st = tp__store_join(s2, NS, 1, 2, 20000,
                                  tp__deadline_after_ms(WAIT_MS), &j2, &err);
    uint64_t took = ms_since(t0);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECKF(took < 1000, "a duplicate rank 1 took %llu ms to fail",
              (unsigned long long)took);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 1");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "far-away-host pid 4242");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "generation");
    tp_error_unref(err);
    tp_store_close(s2);
    tp_store_close(s1);
    tp_store_close(s0);
}

// The same with the holder a live process of this host (a child, forked
// before this process hosts the store): at once too, naming it.
static void
test_dup_after_init_local_holder(void)
{
    unsetenv("TP_JOB_ID");
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    int joined[2], quit[2];
    TP_CHECK(pipe(joined) == 0 && pipe(quit) == 0);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        // Rank 1 of the job: joins, says so, holds its slot until told.
        close(joined[0]);
        close(quit[1]);
        tp_store *s = NULL;
        tp_error *err = NULL;
        tp__store_member j;
        if (tp_store_open(url, 1, 2, WAIT_MS, &s, &err) != TP_OK ||
            tp__store_join(s, NS, 1, 2, 20000, tp__deadline_after_ms(WAIT_MS),
                           &j, &err) != TP_OK) {
            _exit(1);
        }
        char c = 1;
        struct pollfd pfd = {.fd = quit[0], .events = POLLIN};
        bool ok = write(joined[1], &c, 1) == 1 && poll(&pfd, 1, 20000) == 1;
        tp_store_close(s);
        _exit(ok ? 0 : 1);
    }
    close(joined[1]);
    close(quit[0]);
    tp_store *s0 = open_store(url, 0);
    tp__store_member j0;
    join_ok(s0, 0, &j0);
    struct pollfd pfd = {.fd = joined[0], .events = POLLIN};
    char c = 0;
    TP_CHECK(poll(&pfd, 1, WAIT_MS) == 1 && read(joined[0], &c, 1) == 1);
    tp__store_join_done(&j0);

    tp_store *s2 = open_store(url, 1);
    tp__store_member j2;
    tp_error *err = NULL;
    uint64_t t0 = tp__now_ns();
    tp_status st = tp__store_join(s2, NS, 1, 2, 20000,
                                  tp__deadline_after_ms(WAIT_MS), &j2, &err);
    uint64_t took = ms_since(t0);
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECKF(took < 500, "a duplicate rank 1 took %llu ms to fail",
              (unsigned long long)took);
    char who[32];
    snprintf(who, sizeof(who), "pid %d #", (int)pid);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "rank 1");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), who);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "a second process");
    tp_error_unref(err);
    TP_CHECK(write(quit[1], &c, 1) == 1);
    int status = 0;
    TP_CHECK(waitpid(pid, &status, 0) == pid);
    TP_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(joined[0]);
    close(quit[1]);
    tp_store_close(s2);
    tp_store_close(s0);
}

// Two jobs with their own ids join one store at once, in the worst
// order: both rank 0s first, then both rank 1s. Each rank 1 joins its own
// job's generation, and neither rank 0 sees the other as a second rank 0.
static void
test_two_jobs_apart(void)
{
    char path[64], url[128];
    file_url(path, sizeof(path), url, sizeof(url));
    tp_store *a0 = open_store(url, 0), *a1 = open_store(url, 1);
    tp_store *b0 = open_store(url, 0), *b1 = open_store(url, 1);
    tp__store_member ja0, ja1, jb0, jb1;
    setenv("TP_JOB_ID", "job-a", 1);
    join_ok(a0, 0, &ja0);
    setenv("TP_JOB_ID", "job-b", 1);
    join_ok(b0, 0, &jb0);
    TP_CHECK(jb0.j_gen != ja0.j_gen);
    setenv("TP_JOB_ID", "job-a", 1);
    join_ok(a1, 1, &ja1);
    setenv("TP_JOB_ID", "job-b", 1);
    join_ok(b1, 1, &jb1);
    TP_CHECK_EQ(ja1.j_gen, ja0.j_gen);
    TP_CHECK_EQ(jb1.j_gen, jb0.j_gen);
    tp_error *err = NULL;
    TP_CHECK_OK(tp__store_join_check(&ja0, &err), err);
    TP_CHECK_OK(tp__store_join_check(&ja1, &err), err);
    TP_CHECK_OK(tp__store_join_check(&jb0, &err), err);
    TP_CHECK_OK(tp__store_join_check(&jb1, &err), err);
    unsetenv("TP_JOB_ID");
    tp_store_close(a0);
    tp_store_close(a1);
    tp_store_close(b0);
    tp_store_close(b1);
    unlink(path);
}

// Job B's rank 1 reaches a store hosted by job A's rank 0 (both given one
// MASTER_ADDR:MASTER_PORT; B's rank 0 could not bind it): B's rank 0 can
// never open a generation there, so it fails at once, naming both jobs.
static void
test_other_job_hosts_store(void)
{
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tp_test_free_port());
    setenv("TP_JOB_ID", "job-a", 1);
    tp_store *a0 = open_store(url, 0), *a1 = open_store(url, 1);
    tp__store_member ja0, ja1;
    join_ok(a0, 0, &ja0);
    join_ok(a1, 1, &ja1);
    tp__store_join_done(&ja0);

    setenv("TP_JOB_ID", "job-b", 1);
    tp_store *b1 = open_store(url, 1);
    tp__store_member jb1;
    tp_error *err = NULL;
    uint64_t t0 = tp__now_ns();
    tp_status st = tp__store_join(b1, NS, 1, 2, 20000,
                                  tp__deadline_after_ms(WAIT_MS), &jb1, &err);
    uint64_t took = ms_since(t0);
    unsetenv("TP_JOB_ID");
    TP_CHECK_EQ(st, TP_EINVAL);
    TP_CHECKF(took < 1000, "job b's rank 1 took %llu ms to fail",
              (unsigned long long)took);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "job-a");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "job-b");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "another job");
    tp_error_unref(err);
    tp_store_close(b1);
    tp_store_close(a1);
    tp_store_close(a0);
}

// Jobs one after another on a file store: a finished job's join keys go
// when the next job's rank 0 opens its generation, so the number of keys
// stays flat; a failed generation's go too.
static void
test_old_generations_removed(void)
{
    unsetenv("TP_JOB_ID");
    char path[64], url[128];
    file_url(path, sizeof(path), url, sizeof(url));
    tp_store *s0 = open_store(url, 0), *s1 = open_store(url, 1);
    int64_t keys[6] = {0};
    tp_error *err = NULL;
    for (int job = 0; job < 6; job++) {
        tp__store_member j0, j1;
        join_ok(s0, 0, &j0);
        join_ok(s1, 1, &j1);
        TP_CHECK_EQ(j1.j_gen, j0.j_gen);
        if (job == 3) {
            tp__store_join_fail(&j1, false, "rank 1 gave up");
        } else {
            tp__store_join_done(&j0);
        }
        TP_CHECK_OK(tp_store_num_keys(s0, WAIT_MS, &keys[job], &err), err);
    }
    // One generation's keys (and the counters) stay, whatever the number
    // of jobs before.
    for (int job = 2; job < 6; job++) {
        TP_CHECKF(keys[job] <= keys[1] + 2,
                  "job %d: %lld keys, job 1: %lld: old generations stay", job,
                  (long long)keys[job], (long long)keys[1]);
    }
    char key[128];
    void *v = NULL;
    size_t n = 0;
    snprintf(key, sizeof(key), NS "g/0/info");
    TP_CHECK_EQ(tp_store_get(s0, key, 1, &v, &n, &err), TP_ETIMEDOUT);
    tp_error_unref(err);
    tp_store_close(s1);
    tp_store_close(s0);
    unlink(path);
}

// The store's prefix delete (what removes a generation's keys), on every
// backend: only the keys that start with the prefix go.
static void
test_delete_prefix(void)
{
    char path[64], file[128], tcp[64], mem[64];
    file_url(path, sizeof(path), file, sizeof(file));
    snprintf(tcp, sizeof(tcp), "tcp://127.0.0.1:%d", tp_test_free_port());
    snprintf(mem, sizeof(mem), "mem://join%d", (int)getpid());
    const char *urls[] = {mem, file, tcp};
    for (size_t u = 0; u < 3; u++) {
        tp_store *s = open_store(urls[u], 0);
        tp_error *err = NULL;
        const char *keys[] = {"p/1/a", "p/1/b", "p/10/c", "p/1", "q"};
        for (size_t k = 0; k < 5; k++) {
            TP_CHECK_OK(tp_store_set(s, keys[k], "v", 1, WAIT_MS, &err), err);
        }
        int64_t n = -1, left = -1;
        TP_CHECK_OK(tp__store_delete_prefix(s, "p/1/", WAIT_MS, &n, &err), err);
        TP_CHECKF(n == 2, "%s: %lld keys removed, want 2", urls[u],
                  (long long)n);
        TP_CHECK_OK(tp_store_num_keys(s, WAIT_MS, &left, &err), err);
        TP_CHECK_EQ(left, 3);
        void *v = NULL;
        size_t len = 0;
        TP_CHECK_EQ(tp_store_get(s, "p/1/a", 1, &v, &len, &err), TP_ETIMEDOUT);
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_OK(tp_store_get(s, "p/10/c", WAIT_MS, &v, &len, &err), err);
        free(v);
        TP_CHECK_OK(tp__store_delete_prefix(s, "none/", WAIT_MS, &n, &err),
                    err);
        TP_CHECK_EQ(n, 0);
        tp_store_close(s);
    }
    unlink(path);
}

// What the users of a generation publish under "<ns>w<W>/<G>/" goes with a
// generation that never completed (failed), and stays with a complete one
// (it may still be in use).
static void
test_failed_generation_users_removed(void)
{
    unsetenv("TP_JOB_ID");
    char path[64], url[128];
    file_url(path, sizeof(path), url, sizeof(url));
    tp_store *s0 = open_store(url, 0), *s1 = open_store(url, 1);
    tp_error *err = NULL;
    char key[2][128];
    for (int job = 0; job < 2; job++) {
        tp__store_member j0, j1;
        join_ok(s0, 0, &j0);
        join_ok(s1, 1, &j1);
        snprintf(key[job], sizeof(key[job]), NS "w2/%lld/addr/0",
                 (long long)j0.j_gen);
        TP_CHECK_OK(tp_store_set(s0, key[job], "tcp://x", 7, WAIT_MS, &err),
                    err);
        if (job == 0) {
            tp__store_join_done(&j0);
        } else {
            tp__store_join_fail(&j1, false, "rank 1 gave up");
        }
    }
    tp__store_member j;
    join_ok(s0, 0, &j); // the next job's rank 0 removes what is over
    void *v = NULL;
    size_t n = 0;
    TP_CHECK_OK(tp_store_get(s0, key[0], WAIT_MS, &v, &n, &err), err);
    free(v);
    TP_CHECK_EQ(tp_store_get(s0, key[1], 1, &v, &n, &err), TP_ETIMEDOUT);
    tp_error_unref(err);
    tp_store_close(s1);
    tp_store_close(s0);
    unlink(path);
}

// The end of a job: each member leaves (tp__store_job_leave); the last one
// removes the generation's join keys and its users' keys, and nothing
// else; tp__store_job_end removes a generation outright.
static void
test_job_end_removes_its_keys(void)
{
    unsetenv("TP_JOB_ID");
    char path[64], file[128], mem[64];
    file_url(path, sizeof(path), file, sizeof(file));
    snprintf(mem, sizeof(mem), "mem://jobend%d", (int)getpid());
    const char *urls[] = {file, mem};
    for (size_t u = 0; u < 2; u++) {
        tp_store *s0 = open_store(urls[u], 0), *s1 = open_store(urls[u], 1);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_store_set(s0, "other", "v", 1, WAIT_MS, &err), err);
        int64_t before = -1;
        TP_CHECK_OK(tp_store_num_keys(s0, WAIT_MS, &before, &err), err);
        tp__store_member j0, j1;
        join_ok(s0, 0, &j0);
        join_ok(s1, 1, &j1);
        tp__store_join_done(&j0);
        char key[128];
        snprintf(key, sizeof(key), NS "w2/%lld/addr/1", (long long)j0.j_gen);
        TP_CHECK_OK(tp_store_set(s1, key, "tcp://x", 7, WAIT_MS, &err), err);
        int64_t n = -1;
        TP_CHECK_OK(tp__store_job_leave(s1, NS, 2, j1.j_gen, WAIT_MS, &err),
                    err);
        TP_CHECK_OK(tp_store_num_keys(s0, WAIT_MS, &n, &err), err);
        TP_CHECKF(n > before + 1,
                  "%s: the first to leave removed keys (%lld "
                  "left, %lld before the job)",
                  urls[u], (long long)n, (long long)before);
        TP_CHECK_OK(tp__store_job_leave(s0, NS, 2, j0.j_gen, WAIT_MS, &err),
                    err);
        // Left: "other" and the namespace's generation counter.
        TP_CHECK_OK(tp_store_num_keys(s0, WAIT_MS, &n, &err), err);
        TP_CHECKF(n == before + 1,
                  "%s: %lld keys after the last left, want "
                  "%lld",
                  urls[u], (long long)n, (long long)before + 1);
        void *v = NULL;
        size_t len = 0;
        TP_CHECK_OK(tp_store_get(s0, "other", WAIT_MS, &v, &len, &err), err);
        free(v);
        TP_CHECK_OK(tp_store_get(s0, NS "open", WAIT_MS, &v, &len, &err), err);
        free(v);
        // tp__store_job_end: a second job's generation goes at once.
        join_ok(s0, 0, &j0);
        join_ok(s1, 1, &j1);
        tp__store_join_done(&j0);
        tp__store_job_end(s0, NS, 2, j0.j_gen, WAIT_MS);
        TP_CHECK_OK(tp_store_num_keys(s0, WAIT_MS, &n, &err), err);
        TP_CHECKF(n == before + 1,
                  "%s: %lld keys after tp__store_job_end, "
                  "want %lld",
                  urls[u], (long long)n, (long long)before + 1);
        // A later job on the same store joins as usual.
        join_ok(s0, 0, &j0);
        join_ok(s1, 1, &j1);
        TP_CHECK_EQ(j0.j_gen, j1.j_gen);
        tp_store_close(s1);
        tp_store_close(s0);
    }
    unlink(path);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_job_end_removes_its_keys),
    TP_TEST_CASE(test_dup_after_init_remote_holder),
    TP_TEST_CASE(test_dup_after_init_local_holder),
    TP_TEST_CASE(test_two_jobs_apart),
    TP_TEST_CASE(test_other_job_hosts_store),
    TP_TEST_CASE(test_old_generations_removed),
    TP_TEST_CASE(test_delete_prefix),
    TP_TEST_CASE(test_failed_generation_users_removed),
};

TP_TEST_MAIN(cases)
