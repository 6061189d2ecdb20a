// SPDX-License-Identifier: Apache-2.0
// rpc_gather_test.c - tp_rpc_barrier and tp_rpc_all_gather (issue 15)
// across 3 worker processes: rounds of different sizes in order, an empty
// value, and NULL arguments. Loopback only; every wait has a deadline.

#include "rpc_common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
worker_gather(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_init(k_names[rank], rank, world, &o, &a, &err), err);
    TP_CHECK_OK(tp_rpc_barrier(a, tp_test_ms(WAIT_MS), &err), err);
    void *vals[MAX_WORLD];
    size_t lens[MAX_WORLD];
    for (int round = 0; round < 5; round++) {
        char in[64];
        // Round 2 gives nothing; the others "r<round>-<name>" with the
        // rank's name repeated rank + 1 times.
        int n = 0;
        if (round != 2) {
            n = snprintf(in, sizeof(in), "r%d-", round);
            for (int i = 0; i <= rank; i++) {
                n += snprintf(in + n, sizeof(in) - (size_t)n, "%s",
                              k_names[rank]);
            }
        }
        TP_CHECK_OK(tp_rpc_all_gather(a, in, (size_t)n, tp_test_ms(WAIT_MS),
                                      vals, lens, &err),
                    err);
        for (int r = 0; r < world; r++) {
            char want[64];
            int wn = 0;
            want[0] = '\0';
            if (round != 2) {
                wn = snprintf(want, sizeof(want), "r%d-", round);
                for (int i = 0; i <= r; i++) {
                    wn += snprintf(want + wn, sizeof(want) - (size_t)wn, "%s",
                                   k_names[r]);
                }
            }
            TP_CHECKF(lens[r] == (size_t)wn &&
                          memcmp(vals[r], want, (size_t)wn) == 0,
                      "rank %d round %d: from %d \"%s\", want \"%s\"", rank,
                      round, r, (char *)vals[r], want);
            free(vals[r]);
        }
    }
    TP_CHECK_OK(tp_rpc_barrier(a, tp_test_ms(WAIT_MS), &err), err);
    TP_CHECK_EQ(tp_rpc_all_gather(a, "x", 1, -1, NULL, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_rpc_barrier(NULL, -1, &err), TP_EINVAL);
    tp_error_unref(err);
    leave(a);
}

static void
test_gather_3(void)
{
    run_tcp(3, worker_gather, NULL);
}

// A worker that never calls: the barrier times out, saying so.
static void
worker_barrier_timeout(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_init(k_names[rank], rank, world, &o, &a, &err), err);
    if (rank == 0) {
        TP_CHECK_EQ(tp_rpc_barrier(a, 300, &err), TP_ETIMEDOUT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "timed out");
        tp_error_unref(err);
        err = NULL;
    }
    leave(a);
}

static void
test_barrier_timeout(void)
{
    run_tcp(2, worker_barrier_timeout, NULL);
}

// A file store reused by a later job of another world size (2, then 3,
// then 2 again): each job's init works (issue 15).
static void
worker_reuse(int rank, int world, const char *url, void *arg)
{
    tp_agent_options o;
    opts_init(&o, url);
    o.init_timeout_ms = tp_test_ms(15000);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_init(k_names[rank], rank, world, &o, &a, &err), err);
    TP_CHECK_EQ(tp_rpc_world_size(a), world);
    TP_CHECK_OK(tp_rpc_barrier(a, tp_test_ms(WAIT_MS), &err), err);
    leave(a);
}

static void
test_file_store_reused(void)
{
    char path[] = "/tmp/tp_rpc_reuse_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    setenv("TP_SOCKET_IFNAME", "lo", 1);
    static const int sizes[] = {2, 3, 2};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        job j;
        job_tcp(&j, sizes[i], worker_reuse, NULL);
        snprintf(j.url, sizeof(j.url), "file://%s", path);
        job_run(&j);
    }
    unlink(path);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_gather_3, 60),
    TP_TEST_CASE_T(test_barrier_timeout, 60),
    TP_TEST_CASE_T(test_file_store_reused, 90),
};

TP_TEST_MAIN(cases)
