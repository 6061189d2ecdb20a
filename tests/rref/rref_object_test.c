// SPDX-License-Identifier: Apache-2.0
// rref_object_test.c - remote objects (PyTorch's RemoteModule, rref.h)
// across 4 worker processes on loopback: the type "t.linear" (rref_util.c)
// constructed on another worker and on this one, its two methods sync and
// async, its parameters as RRefs updated on the owner, to_here through
// to_args, unknown methods and types, a failing constructor, destruction
// through RRef deletion; methods of a type without `serialize` run
// concurrently.

#include "tp_test.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#include "rref_util.h"

// Remote objects: construction, two methods, the parameters as RRefs and
// their update on the owner, errors, destruction through RRef deletion.
static void
w_objects(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        tp_args *in = args_i64(1);
        tp_rref *m = NULL;
        TP_CHECK_OK(
            tp_remote_create(a, "bravo", "t.linear", in, WAIT_MS, &m, &err),
            err);
        TP_CHECK(strcmp(tp_rref_owner_name(m), "bravo") == 0);
        // forward: w . x with w = 1..16 and x = 0..15.
        tp_args *x = NULL;
        TP_CHECK_OK(tp_args_create(NULL, 0, &x), NULL);
        tp_tensor *xt = f32_tensor(0);
        TP_CHECK_OK(tp_args_add_tensor(x, xt), NULL);
        tp_tensor_unref(xt);
        int64_t want = 0;
        for (int i = 0; i < NVALS; i++) {
            want += (int64_t)(1 + i) * i;
        }
        tp_args *out = NULL;
        TP_CHECK_OK(tp_remote_call(m, "forward", x, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_future *f = tp_remote_call_async(m, "forward", x, WAIT_MS);
        TP_CHECK_OK(tp_rpc_wait(f, tp_test_ms(WAIT_MS), &out, &err), err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_future_unref(f);
        // parameters: an RRef to w, owned by bravo.
        TP_CHECK_OK(tp_remote_call(m, "parameters", NULL, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(tp_args_nrrefs(out), 1);
        tp_rref *w = tp_rref_ref(tp_args_rref(out, 0));
        tp_args_unref(out);
        TP_CHECK(strcmp(tp_rref_owner_name(w), "bravo") == 0);
        out = here_ok(w);
        check_tensor(tp_args_tensor(out, 0), 1);
        tp_args_unref(out);
        // Updated on the owner through the parameter's RRef (what the
        // distributed optimizer does): forward sees it.
        tp_args *two = args_i64(2);
        TP_CHECK_OK(tp_rref_rpc_sync(w, "t.scale", two, WAIT_MS, NULL, &err),
                    err);
        tp_args_unref(two);
        TP_CHECK_OK(tp_remote_call(m, "forward", x, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 2 * want);
        tp_args_unref(out);
        // The object itself, copied by to_args: w = 2 * (1..16).
        out = here_ok(m);
        const float *wp = tp_tensor_data(tp_args_tensor(out, 0));
        for (int i = 0; i < NVALS; i++) {
            TP_CHECK(wp[i] == 2.0f * (float)(1 + i));
        }
        tp_args_unref(out);
        // Errors: a method the type lacks, a type a worker lacks, a
        // constructor that fails.
        TP_CHECK_EQ(tp_remote_call(m, "backward", x, WAIT_MS, &out, &err),
                    TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward");
        tp_error_unref(err);
        err = NULL;
        tp_rref *bad = NULL;
        TP_CHECK_EQ(
            tp_remote_create(a, "delta", "t.linear", in, WAIT_MS, &bad, &err),
            TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "t.linear");
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "delta");
        TP_CHECK(bad == NULL);
        tp_error_unref(err);
        err = NULL;
        tp_args *neg = args_i64(-1);
        TP_CHECK_EQ(tp_remote_create(a, "charlie", "t.linear", neg, WAIT_MS,
                                     &bad, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "negative init");
        tp_error_unref(err);
        err = NULL;
        tp_args_unref(neg);
        // A method on a plain value is refused here.
        TP_CHECK_EQ(tp_remote_call(w, "forward", x, WAIT_MS, &out, &err),
                    TP_EINVAL);
        tp_error_unref(err);
        err = NULL;
        // One object on bravo; an object owned here too.
        int64_t v[8];
        stats_of(a, 1, v);
        TP_CHECK_EQ(v[6], 1);
        tp_rref *local = NULL;
        TP_CHECK_OK(
            tp_remote_create(a, "alpha", "t.linear", in, WAIT_MS, &local, &err),
            err);
        void *state = NULL;
        TP_CHECK_OK(tp_rref_local_object(local, WAIT_MS, &state, &err), err);
        TP_CHECK(state != NULL);
        TP_CHECK_OK(tp_remote_call(local, "forward", x, WAIT_MS, &out, &err),
                    err);
        TP_CHECK_EQ(get_i64(out), want);
        tp_args_unref(out);
        tp_rref_unref(local);
        // Deleting the RRefs destroys the object on its owner.
        tp_rref_unref(w);
        tp_rref_unref(m);
        tp_args_unref(x);
        tp_args_unref(in);
        wait_settled(a, world, 0);
        TP_CHECK_EQ(atomic_load(&g_objects), 0);
    }
    leave(a);
}

static void
test_objects(void)
{
    run(4, w_objects, NULL);
}

// "t.gate": "wait" returns 1 once "open" was called (0 after 5 s).
typedef struct gate {
    atomic_int g_open;
} gate;

static tp_status
gate_create(const tp_rpc_call_info *call, const tp_args *in, void *arg,
            void **state_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    gate *g = calloc(1, sizeof(*g));
    TP_CHECK(g != NULL);
    *state_p = g;
    return TP_OK;
}

static void
gate_destroy(void *state, void *arg)
{
    (void)arg;
    free(state);
}

static tp_status
gate_wait(const tp_rpc_call_info *call, void *state, const tp_args *in,
          void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    gate *g = state;
    int64_t end = tp_job_now_ms() + 5000;
    while (atomic_load(&g->g_open) == 0 && tp_job_now_ms() < end) {
        tp_job_sleep_ms(1);
    }
    *out_p = args_i64(atomic_load(&g->g_open));
    return TP_OK;
}

static tp_status
gate_open(const tp_rpc_call_info *call, void *state, const tp_args *in,
          void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)in;
    (void)arg;
    (void)err_p;
    (void)out_p;
    atomic_store(&((gate *)state)->g_open, 1);
    return TP_OK;
}

static const tp_remote_method k_gate_methods[] = {
    {"wait", gate_wait},
    {"open", gate_open},
};

// A method that waits for another method of the same object: without
// `serialize` they run at once (before, calls on one object were drained
// one after the other and "wait" held up "open").
static void
w_concurrent(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_remote_type t = {
        .size = sizeof(t),
        .name = "t.gate",
        .create = gate_create,
        .destroy = gate_destroy,
        .methods = k_gate_methods,
        .nmethods = 2,
    };
    tp_error *err = NULL;
    TP_CHECK_OK(tp_remote_type_register(&t, &err), err);
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_rref *g = NULL;
        TP_CHECK_OK(
            tp_remote_create(a, "bravo", "t.gate", NULL, WAIT_MS, &g, &err),
            err);
        tp_future *w = tp_remote_call_async(g, "wait", NULL, WAIT_MS);
        tp_job_sleep_ms(50); // "wait" is running on bravo
        tp_args *out = NULL;
        TP_CHECK_OK(tp_remote_call(g, "open", NULL, WAIT_MS, &out, &err), err);
        tp_args_unref(out);
        TP_CHECK_OK(tp_rpc_wait(w, WAIT_MS, &out, &err), err);
        TP_CHECK_EQ(get_i64(out), 1);
        tp_args_unref(out);
        tp_future_unref(w);
        tp_rref_unref(g);
        wait_settled(a, world, 0);
    }
    leave(a);
}

static void
test_concurrent_methods(void)
{
    run(2, w_concurrent, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_objects, 60),
    TP_TEST_CASE_T(test_concurrent_methods, 60),
};

TP_TEST_MAIN(cases)
