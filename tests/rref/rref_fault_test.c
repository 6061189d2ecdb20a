// SPDX-License-Identifier: Apache-2.0
// rref_fault_test.c - the RRef protocol under the agent's faulty mode
// (TP_RPC_FAULTY, PyTorch's FaultyTensorPipeAgent), worker processes on
// loopback:
//   - a FETCH held longer than to_here's timeout: to_here times out naming
//     the owner, a later to_here on the same RRef gets the value, and no
//     RRef state is left anywhere;
//   - the first REMOTE send fails: the RRef carries the injected error, a
//     second remote() works, and the owner keeps no value of the failed
//     one;
//   - FORK and CHILD_ACCEPT held: a user RRef passed to a third worker
//     and dropped everywhere is still deleted on its owner.
// The faulty spec is set on the worker that sends the chosen kind only,
// before tp_rpc_init reads it.

#include "tp_test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#include "rref_util.h"
#include "tp_test_job.h"

// Sets TP_RPC_FAULTY to @fmt (one %lld: @ms) in this worker only.
static void
set_faulty(const char *fmt, int64_t ms)
{
    char spec[128];
    snprintf(spec, sizeof(spec), fmt, (long long)ms);
    TP_CHECK(setenv("TP_RPC_FAULTY", spec, 1) == 0);
}

// ---- to_here's timeout -----------------------------------------------------

// alpha's FETCH waits 1.5 s (scaled) before it leaves: a to_here with a
// 300 ms timeout fails, one with a long timeout gets the value.
static void
w_here_timeout(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    int64_t delay = tp_test_ms(1500);
    if (rank == 0) {
        set_faulty("delay=RREF_FETCH:%lld", delay);
    }
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 7);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rref_wait_created(r, WAIT_MS, &err), err);
        tp_args *v = NULL;
        int64_t t0 = tp_job_now_ms();
        tp_status st = tp_rref_to_here(r, tp_test_ms(300), &v, &err);
        int64_t dt = tp_job_now_ms() - t0;
        printf("to_here (300 ms): %s after %lld ms: %s\n", tp_status_name(st),
               (long long)dt, tp_error_message(err));
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        TP_CHECK(v == NULL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "to_here of RRef");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo (rank 1)");
        TP_CHECKF(dt < delay, "the timeout came after %lld ms", (long long)dt);
        tp_error_unref(err);
        err = NULL;
        // The same RRef: its FETCH is held as well, then answered.
        t0 = tp_job_now_ms();
        v = here_ok(r);
        dt = tp_job_now_ms() - t0;
        printf("to_here (long): after %lld ms\n", (long long)dt);
        check_tensor(tp_args_tensor(v, 0), 7);
        TP_CHECKF(dt >= delay - 100,
                  "the held FETCH was answered after %lld ms", (long long)dt);
        tp_args_unref(v);
        TP_CHECK(tp_rref_error(r) == NULL);
        tp_rref_unref(r);
        // The late answer to the first FETCH came and went: nothing stays.
        tp_job_sleep_ms(delay);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_to_here_timeout(void)
{
    run(2, w_here_timeout, NULL);
}

// ---- remote()'s REMOTE fails -------------------------------------------

static void
w_remote_fails(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    if (rank == 0) {
        set_faulty("fail=RREF_REMOTE:%lld", 1);
    }
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        int64_t before[8];
        stats_of(a, 1, before);
        tp_args *in = args_i64(3);
        tp_rref *r1 = NULL;
        tp_error *err = NULL;
        TP_CHECK_OK(tp_remote(a, "bravo", "t.make", in, WAIT_MS, &r1, &err),
                    err);
        tp_status st = tp_rref_wait_created(r1, WAIT_MS, &err);
        printf("first remote: %s: %s\n", tp_status_name(st),
               tp_error_message(err));
        TP_CHECK_EQ(st, TP_ECONNRESET);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "failed on purpose");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "RREF_REMOTE");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo (rank 1)");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK(tp_rref_error(r1) != NULL);
        tp_args *v = NULL;
        TP_CHECK_EQ(tp_rref_to_here(r1, WAIT_MS, &v, &err), TP_ECONNRESET);
        tp_error_unref(err);
        err = NULL;
        // The retry.
        tp_rref *r2 = NULL;
        TP_CHECK_OK(tp_remote(a, "bravo", "t.make", in, WAIT_MS, &r2, &err),
                    err);
        TP_CHECK_OK(tp_rref_wait_created(r2, WAIT_MS, &err), err);
        v = here_ok(r2);
        check_tensor(tp_args_tensor(v, 0), 3);
        tp_args_unref(v);
        // bravo made one value (the retry's) and holds only that.
        int64_t now[8];
        stats_of(a, 1, now);
        TP_CHECK_EQ(now[0], 1);
        TP_CHECK_EQ(now[7], before[7] + 1);
        tp_rref_unref(r1);
        tp_rref_unref(r2);
        tp_args_unref(in);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_remote_fails(void)
{
    run(2, w_remote_fails, NULL);
}

// ---- FORK and CHILD_ACCEPT held --------------------------------------------

// alpha's user RRef of a value on bravo goes to charlie ("t.keep"):
// charlie's FORK to bravo and its CHILD_ACCEPT to alpha each wait 300 ms
// (scaled). alpha drops its handle at once, charlie later; the value
// must still be deleted on bravo.
static void
w_fork_delayed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    int64_t delay = tp_test_ms(300);
    if (rank == 2) {
        set_faulty("delay=RREF_FORK+RREF_CHILD_ACCEPT:%lld", delay);
    }
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *r = remote_ok(a, "bravo", "t.make", 5);
        tp_error *err = NULL;
        TP_CHECK_OK(tp_rref_wait_created(r, WAIT_MS, &err), err);
        tp_args *in = args_rref(r, 0);
        tp_rref_unref(r); // the args hold it now
        TP_CHECK_OK(tp_rpc_sync_rank(a, 2, "t.keep", in, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(in); // alpha's last handle
        int64_t t0 = tp_job_now_ms();
        // alpha keeps its RRef as the parent of charlie's fork until
        // charlie's CHILD_ACCEPT, which comes after both delays.
        int64_t v[8];
        stats_of(a, 0, v);
        TP_CHECK_EQ(v[3], 1);
        int64_t dl = t0 + tp_test_ms(WAIT_MS);
        for (;;) {
            stats_of(a, 0, v);
            if (v[3] == 0) {
                break;
            }
            TP_CHECKF(tp_job_now_ms() < dl, "alpha's fork never accepted");
            tp_job_sleep_ms(5);
        }
        int64_t dt = tp_job_now_ms() - t0;
        printf("the fork was accepted after %lld ms\n", (long long)dt);
        TP_CHECKF(dt >= 2 * delay - 100,
                  "accepted after %lld ms: FORK and CHILD_ACCEPT not held",
                  (long long)dt);
        // bravo still has the value, for charlie.
        stats_of(a, 1, v);
        TP_CHECK_EQ(v[0], 1);
        tp_args *x = args_i64(0);
        TP_CHECK_EQ(call_i64(a, 2, "t.here_kept", x), 5);
        tp_args_unref(x);
        x = args_i64(0);
        tp_args *out = NULL;
        TP_CHECK_OK(tp_rpc_sync_rank(a, 2, "t.drop", x, WAIT_MS, &out, &err),
                    err);
        tp_args_unref(out);
        tp_args_unref(x);
        wait_settled(a, world, 0);
    }
    leave(a);
}

// "t.here_kept": to_here of the RRef kept in slot (in); its first float.
static tp_status
fn_here_kept(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    tp_rref *r = atomic_load(&g_kept[get_i64(in)]);
    TP_CHECK(r != NULL);
    tp_args *v = NULL;
    tp_status st = tp_rref_to_here(r, WAIT_MS, &v, err_p);
    if (st != TP_OK) {
        return st;
    }
    const float *p = tp_tensor_data(tp_args_tensor(v, 0));
    *out_p = args_i64((int64_t)p[0]);
    tp_args_unref(v);
    return TP_OK;
}

static void
setup_fork(int rank)
{
    setup(rank);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_register("t.here_kept", fn_here_kept, NULL, &err), err);
}

static void
test_fork_delayed(void)
{
    tp_job j;
    tp_job_tcp(&j, 3, w_fork_delayed, NULL);
    j.setup = setup_fork;
    j.names = k_names;
    tp_job_run(&j);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_to_here_timeout, 60),
    TP_TEST_CASE_T(test_remote_fails, 60),
    TP_TEST_CASE_T(test_fork_delayed, 60),
};

TP_TEST_MAIN(cases)
