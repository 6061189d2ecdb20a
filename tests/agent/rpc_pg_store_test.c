// SPDX-License-Identifier: Apache-2.0
// rpc_pg_store_test.c - RPC (tp_rpc_init) and a process group (tp_pg_init)
// of the same worker processes on one tcp://127.0.0.1:PORT init method
// (issue 15): rank 0's process hosts one store server for both
// (store/shared.c), each layer keeps to its own keys and generations;
// calls and all_reduce both work, and both shut down cleanly in either
// order. Loopback only; every wait has a deadline. On a store that
// outlives the job (a file), a clean end leaves none of the job's keys:
// the RPC agent's rank 0 removes its generation after the graceful
// shutdown, the last member to destroy the group removes the group's.

#include "rpc_common.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/collectives.h>
#include <tpipe/store.h>

typedef struct order {
    bool pg_first;      // tp_pg_init before tp_rpc_init
    bool destroy_first; // tp_pg_destroy before the RPC shutdown
} order;

static tp_pg *
pg_join(int rank, int world, const char *url)
{
    tp_pg_options o;
    tp_pg_options_init(&o);
    o.init_timeout_ms = tp_test_ms(WAIT_MS);
    o.timeout_ms = tp_test_ms(WAIT_MS);
    tp_pg *pg = NULL;
    tp_error *err = NULL;
    tp_status st = tp_pg_init(url, rank, world, &o, &pg, &err);
    TP_CHECKF(st == TP_OK, "rank %d: tp_pg_init(%s): %s: %s", rank, url,
              tp_status_name(st), tp_error_message(err));
    TP_CHECK_EQ(tp_pg_rank(pg), rank);
    TP_CHECK_EQ(tp_pg_size(pg), world);
    return pg;
}

static void
worker_both(int rank, int world, const char *url, void *arg)
{
    const order *ord = arg;
    tp_agent *a = NULL;
    tp_pg *pg = NULL;
    if (ord->pg_first) {
        pg = pg_join(rank, world, url);
        a = join(rank, world, url);
    } else {
        a = join(rank, world, url);
        pg = pg_join(rank, world, url);
    }
    tp_error *err = NULL;
    for (int round = 0; round < 3; round++) {
        // A call to the next rank, answered by its "t.info".
        int to = (rank + 1) % world;
        tp_args *r = call_rank_ok(a, to, "t.info", NULL, tp_test_ms(WAIT_MS));
        char f[6][160];
        info_fields(r, f);
        TP_CHECK_STR_CONTAINS(f[0], "t.info");
        TP_CHECK_STR_CONTAINS(f[1], k_names[rank]);
        tp_args_unref(r);
        // all_reduce of rank + round + 1 over the group.
        int64_t n = 4;
        tp_tensor *t = NULL;
        TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, &n, &t, &err), err);
        int64_t *d = tp_tensor_data(t);
        for (int i = 0; i < n; i++) {
            d[i] = rank + round + i + 1;
        }
        TP_CHECK_OK(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err);
        for (int i = 0; i < n; i++) {
            int64_t want = 0;
            for (int q = 0; q < world; q++) {
                want += q + round + i + 1;
            }
            TP_CHECKF(d[i] == want, "rank %d round %d: [%d] = %lld, want %lld",
                      rank, round, i, (long long)d[i], (long long)want);
        }
        tp_tensor_unref(t);
    }
    TP_CHECK_OK(tp_pg_barrier(pg, NULL, &err), err);
    if (ord->destroy_first) {
        tp_pg_destroy(pg);
        leave(a);
    } else {
        leave(a);
        tp_pg_destroy(pg);
    }
}

static void
test_rpc_then_pg_3(void)
{
    static const order o = {.pg_first = false, .destroy_first = true};
    run_tcp(3, worker_both, (void *)&o);
}

static void
test_pg_then_rpc_2(void)
{
    static const order o = {.pg_first = true, .destroy_first = false};
    run_tcp(2, worker_both, (void *)&o);
}

static void
test_pg_then_rpc_3(void)
{
    static const order o = {.pg_first = true, .destroy_first = true};
    run_tcp(3, worker_both, (void *)&o);
}

// After the job: the file store @path holds only the namespaces'
// generation counters ("tp.rpc/open", "tp.pg/open"), none of the job's
// keys (join records, slots, addresses, "done", "exit/<r>", "left").
static void
check_job_keys_gone(const char *path, int world)
{
    char url[512];
    snprintf(url, sizeof(url), "file://%s", path);
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open(url, 1, world, tp_test_ms(WAIT_MS), &s, &err),
                err);
    char keys[10][64];
    snprintf(keys[0], sizeof(keys[0]), "tp.rpc/g/0/info");
    snprintf(keys[1], sizeof(keys[1]), "tp.rpc/g/0/slot/1");
    snprintf(keys[2], sizeof(keys[2]), "tp.rpc/g/0/done");
    snprintf(keys[3], sizeof(keys[3]), "tp.rpc/w%d/0/worker/0", world);
    snprintf(keys[4], sizeof(keys[4]), "tp.rpc/w%d/0/exit/1", world);
    snprintf(keys[5], sizeof(keys[5]), "tp.pg/g/0/info");
    snprintf(keys[6], sizeof(keys[6]), "tp.pg/g/0/slot/0");
    snprintf(keys[7], sizeof(keys[7]), "tp.pg/w%d/0/addr/1", world);
    snprintf(keys[8], sizeof(keys[8]), "tp.pg/w%d/0/left", world);
    snprintf(keys[9], sizeof(keys[9]), "tp.pg/g/0/done");
    for (int i = 0; i < 10; i++) {
        const char *k[1] = {keys[i]};
        bool set = true;
        TP_CHECK_OK(tp_store_check(s, k, 1, tp_test_ms(WAIT_MS), &set, &err),
                    err);
        TP_CHECKF(!set, "key \"%s\" is still in the store after the job",
                  keys[i]);
    }
    const char *opens[2] = {"tp.rpc/open", "tp.pg/open"};
    bool set = false;
    TP_CHECK_OK(tp_store_check(s, opens, 2, tp_test_ms(WAIT_MS), &set, &err),
                err);
    TP_CHECKF(set, "%s", "the generation counters are gone");
    int64_t n = -1;
    TP_CHECK_OK(tp_store_num_keys(s, tp_test_ms(WAIT_MS), &n, &err), err);
    TP_CHECKF(n == 2,
              "%lld keys in the store after the job, want 2 (the "
              "generation counters)",
              (long long)n);
    tp_store_close(s);
}

static void
run_file(int world, const order *o)
{
    char path[] = "/tmp/tp_rpc_pg_store_XXXXXX";
    int fd = mkstemp(path);
    TP_CHECK(fd >= 0);
    close(fd);
    // file:// says nothing about the network: keep the pipes on loopback.
    setenv("TP_SOCKET_IFNAME", "lo", 1);
    job j;
    job_tcp(&j, world, worker_both, (void *)o);
    snprintf(j.url, sizeof(j.url), "file://%s", path);
    job_run(&j);
    check_job_keys_gone(path, world);
    unlink(path);
}

static void
test_file_keys_gone_3(void)
{
    static const order o = {.pg_first = false, .destroy_first = true};
    run_file(3, &o);
}

static void
test_file_keys_gone_2(void)
{
    static const order o = {.pg_first = true, .destroy_first = false};
    run_file(2, &o);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_file_keys_gone_3, 60),
    TP_TEST_CASE_T(test_file_keys_gone_2, 60),
    TP_TEST_CASE_T(test_rpc_then_pg_3, 60),
    TP_TEST_CASE_T(test_pg_then_rpc_2, 60),
    TP_TEST_CASE_T(test_pg_then_rpc_3, 60),
};

TP_TEST_MAIN(cases)
