// SPDX-License-Identifier: Apache-2.0
// rpc_pg_store_test.c - RPC (tp_rpc_init) and a process group (tp_pg_init)
// of the same worker processes on one tcp://127.0.0.1:PORT init method
// (issue 15): rank 0's process hosts one store server for both
// (store/shared.c), each layer keeps to its own keys and generations;
// calls and all_reduce both work, and both shut down cleanly in either
// order. Loopback only; every wait has a deadline.

#include "rpc_common.h"

#include <stdlib.h>
#include <string.h>

#include <tpipe/collectives.h>

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

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_rpc_then_pg_3, 60),
    TP_TEST_CASE_T(test_pg_then_rpc_2, 60),
    TP_TEST_CASE_T(test_pg_then_rpc_3, 60),
};

TP_TEST_MAIN(cases)
