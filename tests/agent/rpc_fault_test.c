// SPDX-License-Identifier: Apache-2.0
// rpc_fault_test.c - the faulty mode (TP_RPC_FAULTY, PyTorch's faulty
// agent), worker processes on loopback:
//   - "fail=call:2": the first two calls fail as a broken connection would
//     (TP_ECONNRESET, the injected cause), the third works;
//   - "delay=reply:1000": a call with a shorter timeout times out, a later
//     one with a longer timeout works;
//   - the spec's parsing: kinds by alias, protocol name and number; clear
//     errors.

#include "tp_test.h"

#include <string.h>

#include <tpipe/rpc.h>

#include "agent/ag_impl.h"
#include "tp_test_job.h"

#define WAIT_MS 20000

static const char *const k_names[2] = {"alpha", "bravo"};

static void
w_fail(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 0) {
        for (int i = 0; i < 3; i++) {
            tp_error *err = NULL;
            tp_status st =
                tp_rpc_sync(a, "bravo", "tp.noop", NULL, WAIT_MS, NULL, &err);
            printf("call %d: %s: %s\n", i + 1, tp_status_name(st),
                   tp_error_message(err));
            if (i < 2) {
                TP_CHECK_EQ(st, TP_ECONNRESET);
                TP_CHECK_STR_CONTAINS(tp_error_message(err),
                                      "failed on purpose");
                TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo (rank 1)");
                TP_CHECK_STR_CONTAINS(tp_error_message(err),
                                      i == 0 ? "failure 1 of 2"
                                             : "failure 2 of 2");
            } else {
                TP_CHECK_OK(st, err);
            }
            tp_error_unref(err);
        }
    }
    tp_job_rpc_leave(a, rank);
}

static void
test_fail_sends(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_fail, NULL);
    j.names = k_names;
    j.env[0] = "TP_RPC_FAULTY=fail=call:2";
    tp_job_run(&j);
}

static void
w_delay(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a =
        tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t t0 = tp_job_now_ms();
        tp_status st = tp_rpc_sync(a, "bravo", "tp.noop", NULL, tp_test_ms(300),
                                   NULL, &err);
        printf("short call: %s after %lld ms: %s\n", tp_status_name(st),
               (long long)(tp_job_now_ms() - t0), tp_error_message(err));
        TP_CHECK_EQ(st, TP_ETIMEDOUT);
        tp_error_unref(err);
        err = NULL;
        t0 = tp_job_now_ms();
        st = tp_rpc_sync(a, "bravo", "tp.noop", NULL, WAIT_MS, NULL, &err);
        int64_t dt = tp_job_now_ms() - t0;
        TP_CHECK_OK(st, err);
        TP_CHECKF(dt >= 900, "the delayed reply came after %lld ms",
                  (long long)dt);
    }
    tp_job_rpc_leave(a, rank);
}

static void
test_delay_replies(void)
{
    tp_job j;
    tp_job_tcp(&j, 2, w_delay, NULL);
    j.names = k_names;
    j.env[0] = "TP_RPC_FAULTY=delay=reply:1000";
    tp_job_run(&j);
}

static void
test_parse(void)
{
    ag_faulty f;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__ag_faulty_parse("fail=call:2,delay=reply:500", &f, &err),
                err);
    TP_CHECK_EQ(f.f_nrules, 2);
    TP_CHECK(f.f_rules[0].r_fail && f.f_rules[0].r_n == 2);
    TP_CHECK(f.f_rules[0].r_kinds[AG_KIND_REQUEST]);
    TP_CHECK(!f.f_rules[1].r_fail && f.f_rules[1].r_n == 500);
    TP_CHECK(f.f_rules[1].r_kinds[AG_KIND_RESPONSE]);
    TP_CHECK(f.f_rules[1].r_kinds[AG_KIND_ERROR]);
    // Protocol kinds by name (any case) and by number.
    TP_CHECK_OK(
        tp__ag_faulty_parse(
            "fail=RREF_FETCH+dist_autograd_backward:1,delay=20:5", &f, &err),
        err);
    TP_CHECK(f.f_rules[0].r_kinds[17] && f.f_rules[0].r_kinds[32]);
    TP_CHECK(f.f_rules[1].r_kinds[20]);
    TP_CHECK_OK(tp__ag_faulty_parse(NULL, &f, &err), err);
    TP_CHECK_EQ(f.f_nrules, 0);
    static const struct {
        const char *spec, *want;
    } bad[] = {
        {"fail=cal:2", "unknown message kind \"cal\""},
        {"fail=cal:2", "RREF_FETCH"},
        {"fail=call", "expected fail=KINDS:N"},
        {"fail=call:x", "a count"},
        {"drop=call:1", "expected fail= or delay="},
        {"delay=99:5", "unknown message kind \"99\""},
        {"fail=call:1,", "expected fail=KINDS:N"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err = NULL;
        TP_CHECK_EQ(tp__ag_faulty_parse(bad[i].spec, &f, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), bad[i].want);
        tp_error_unref(err);
    }
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_parse),
    TP_TEST_CASE_T(test_fail_sends, 60),
    TP_TEST_CASE_T(test_delay_replies, 60),
};

TP_TEST_MAIN(cases)
