// SPDX-License-Identifier: Apache-2.0
// api_null_test.c - public functions given a NULL handle or a NULL out
// pointer return TP_EINVAL (with a message naming the argument where the
// function has an error out-parameter) instead of crashing (issue 15).

#include <string.h>

#include <tpipe/autograd.h>
#include <tpipe/collectives.h>
#include <tpipe/future.h>
#include <tpipe/pipe.h>
#include <tpipe/tensor.h>

#include "tp_test.h"

// Checks @st is TP_EINVAL and the error in *@err_p (if any) says which
// argument is NULL; drops it. @err_p, not the error: the call in @st's
// argument sets it, and the order of argument evaluation is unspecified.
static void
check_einval(tp_status st, tp_error **err_p, const char *what)
{
    tp_error *err = err_p != NULL ? *err_p : NULL;
    TP_CHECKF(st == TP_EINVAL, "%s: got %s, expected TP_EINVAL", what,
              tp_status_name(st));
    if (err != NULL) {
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "NULL");
        tp_error_unref(err);
        *err_p = NULL;
    }
}

static void
tensor_null_out_and_handle(void)
{
    int64_t shape[] = {2, 3};
    tp_error *err = NULL;
    check_einval(tp_tensor_empty(TP_F32, 2, shape, NULL, &err), &err,
                 "tp_tensor_empty");
    err = NULL;
    check_einval(tp_tensor_zeros(TP_F32, 2, shape, NULL, &err), &err,
                 "tp_tensor_zeros");
    err = NULL;
    check_einval(tp_tensor_ones(TP_F32, 2, shape, NULL, &err), &err,
                 "tp_tensor_ones");
    err = NULL;
    check_einval(tp_tensor_full(TP_F32, 2, shape, 2.0, NULL, &err), &err,
                 "tp_tensor_full");
    err = NULL;
    check_einval(tp_tensor_arange(TP_F32, 0, 4, 1, NULL, &err), &err,
                 "tp_tensor_arange");
    float buf[6];
    err = NULL;
    check_einval(
        tp_tensor_from_blob(buf, TP_F32, 2, shape, NULL, NULL, NULL, &err),
        &err, "tp_tensor_from_blob");
    tp_device cpu = {.type = TP_DEVICE_CPU, .index = 0};
    err = NULL;
    check_einval(tp_tensor_empty_on(cpu, TP_F32, 2, shape, NULL, &err), &err,
                 "tp_tensor_empty_on");
    check_einval(tp_generator_create(1, NULL), NULL, "tp_generator_create");
    tp_generator *g = NULL;
    TP_CHECK_EQ(tp_generator_create(1, &g), TP_OK);
    err = NULL;
    check_einval(tp_tensor_rand(TP_F32, 2, shape, 0, 1, g, NULL, &err), &err,
                 "tp_tensor_rand");
    tp_generator_destroy(g);

    tp_tensor *out = NULL;
    err = NULL;
    check_einval(tp_tensor_to_device(NULL, cpu, &out, &err), &err,
                 "tp_tensor_to_device");
    err = NULL;
    check_einval(tp_tensor_as_strided(NULL, 2, shape, shape, 0, &out, &err),
                 &err, "tp_tensor_as_strided");
    err = NULL;
    check_einval(tp_tensor_clone(NULL, &out, &err), &err, "tp_tensor_clone");
    err = NULL;
    check_einval(tp_tensor_contiguous(NULL, &out, &err), &err,
                 "tp_tensor_contiguous");
    err = NULL;
    check_einval(tp_tensor_to_dtype(NULL, TP_F64, &out, &err), &err,
                 "tp_tensor_to_dtype");
    err = NULL;
    check_einval(tp_tensor_reshape(NULL, 2, shape, &out, &err), &err,
                 "tp_tensor_reshape");
    err = NULL;
    check_einval(tp_tensor_transpose(NULL, 0, 1, &out, &err), &err,
                 "tp_tensor_transpose");
    int perm[] = {1, 0};
    err = NULL;
    check_einval(tp_tensor_permute(NULL, perm, &out, &err), &err,
                 "tp_tensor_permute");
    err = NULL;
    check_einval(tp_tensor_narrow(NULL, 0, 0, 1, &out, &err), &err,
                 "tp_tensor_narrow");
    err = NULL;
    check_einval(tp_tensor_expand(NULL, 2, shape, &out, &err), &err,
                 "tp_tensor_expand");
    TP_CHECK(out == NULL);
    double v;
    check_einval(tp_tensor_item(NULL, 0, &v), NULL, "tp_tensor_item");
    check_einval(tp_tensor_set_item(NULL, 0, 1.0), NULL, "tp_tensor_set_item");

    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 2, shape, &t, &err), err);
    check_einval(tp_tensor_item(t, 0, NULL), NULL, "tp_tensor_item v_p");
    err = NULL;
    check_einval(tp_tensor_to_device(t, cpu, NULL, &err), &err,
                 "tp_tensor_to_device out_p");
    err = NULL;
    check_einval(tp_tensor_as_strided(t, 2, shape, shape, 0, NULL, &err), &err,
                 "tp_tensor_as_strided out_p");
    tp_tensor_unref(t);
}

// The view, copy and conversion functions (autograd/views.c) with a NULL
// out pointer, tp_tensor_copy with a NULL tensor.
static void
tensor_views_null_out(void)
{
    int64_t shape[] = {2, 3};
    int64_t big[] = {4, 2, 3};
    int perm[] = {1, 0};
    tp_error *err = NULL;
    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 2, shape, &t, &err), err);
    check_einval(tp_tensor_reshape(t, 2, shape, NULL, &err), &err,
                 "tp_tensor_reshape out_p");
    check_einval(tp_tensor_permute(t, perm, NULL, &err), &err,
                 "tp_tensor_permute out_p");
    tp_tensor *out = NULL;
    check_einval(tp_tensor_permute(t, NULL, &out, &err), &err,
                 "tp_tensor_permute perm");
    check_einval(tp_tensor_transpose(t, 0, 1, NULL, &err), &err,
                 "tp_tensor_transpose out_p");
    check_einval(tp_tensor_narrow(t, 0, 0, 1, NULL, &err), &err,
                 "tp_tensor_narrow out_p");
    check_einval(tp_tensor_expand(t, 3, big, NULL, &err), &err,
                 "tp_tensor_expand out_p");
    check_einval(tp_tensor_contiguous(t, NULL, &err), &err,
                 "tp_tensor_contiguous out_p");
    check_einval(tp_tensor_clone(t, NULL, &err), &err, "tp_tensor_clone out_p");
    check_einval(tp_tensor_to_dtype(t, TP_F64, NULL, &err), &err,
                 "tp_tensor_to_dtype out_p");
    check_einval(tp_tensor_to_dtype(t, TP_I32, NULL, &err), &err,
                 "tp_tensor_to_dtype (integer) out_p");
    check_einval(tp_tensor_copy(NULL, t, &err), &err, "tp_tensor_copy dst");
    check_einval(tp_tensor_copy(t, NULL, &err), &err, "tp_tensor_copy src");
    TP_CHECK(out == NULL);
    tp_tensor_unref(t);
}

// The differentiable ops (autograd/ops*.c) with a NULL input or out
// pointer.
static void
ops_null(void)
{
    int64_t shape[] = {2, 2};
    tp_error *err = NULL;
    tp_tensor *t = NULL, *out = NULL;
    TP_CHECK_OK(tp_tensor_ones(TP_F32, 2, shape, &t, &err), err);
    tp_status (*binary[])(tp_tensor *, tp_tensor *, tp_tensor **,
                          tp_error **) = {tp_add, tp_sub,    tp_mul,
                                          tp_div, tp_matmul, tp_mse_loss};
    for (size_t i = 0; i < sizeof(binary) / sizeof(binary[0]); i++) {
        check_einval(binary[i](NULL, t, &out, &err), &err, "binary a");
        check_einval(binary[i](t, NULL, &out, &err), &err, "binary b");
        check_einval(binary[i](t, t, NULL, &err), &err, "binary out_p");
    }
    tp_status (*unary[])(tp_tensor *, tp_tensor **, tp_error **) = {
        tp_neg,     tp_exp,  tp_log, tp_sqrt, tp_tanh,
        tp_sigmoid, tp_relu, tp_sum, tp_mean};
    for (size_t i = 0; i < sizeof(unary) / sizeof(unary[0]); i++) {
        check_einval(unary[i](NULL, &out, &err), &err, "unary a");
        check_einval(unary[i](t, NULL, &err), &err, "unary out_p");
    }
    check_einval(tp_mul_scalar(NULL, 2, &out, &err), &err, "tp_mul_scalar");
    check_einval(tp_add_scalar(t, 2, NULL, &err), &err, "tp_add_scalar");
    check_einval(tp_pow(NULL, 2, &out, &err), &err, "tp_pow");
    check_einval(tp_sum_dim(NULL, 0, false, &out, &err), &err, "tp_sum_dim");
    check_einval(tp_mean_dim(t, 0, false, NULL, &err), &err, "tp_mean_dim");
    check_einval(tp_softmax(NULL, 1, &out, &err), &err, "tp_softmax");
    check_einval(tp_log_softmax(t, 1, NULL, &err), &err, "tp_log_softmax");
    check_einval(tp_nll_loss(t, NULL, &out, &err), &err, "tp_nll_loss");
    check_einval(tp_cross_entropy(NULL, t, &out, &err), &err,
                 "tp_cross_entropy");
    check_einval(tp_embedding(t, NULL, &out, &err), &err, "tp_embedding");
    check_einval(tp_tensor_axpy(NULL, 1.0, t, &err), &err, "tp_tensor_axpy y");
    check_einval(tp_tensor_axpy(t, 1.0, NULL, &err), &err, "tp_tensor_axpy x");
    TP_CHECK(out == NULL);
    tp_tensor_unref(t);
}

static void
future_null(void)
{
    check_einval(tp_future_create(NULL), NULL, "tp_future_create");
    TP_CHECK(tp_future_ref(NULL) == NULL);
    check_einval(tp_future_set_value(NULL, NULL, NULL), NULL,
                 "tp_future_set_value");
    tp_error *e = tp_error_create(TP_EIO, NULL, "x");
    check_einval(tp_future_set_error(NULL, e), NULL, "tp_future_set_error");
    tp_error_unref(e);
    TP_CHECK(!tp_future_is_done(NULL));
    tp_error *err = NULL;
    check_einval(tp_future_wait(NULL, 10, &err), &err, "tp_future_wait");
    TP_CHECK(tp_future_value(NULL) == NULL);
    TP_CHECK(tp_future_error(NULL) == NULL);
    check_einval(tp_future_then(NULL, NULL, NULL), NULL, "tp_future_then");
    tp_future *f = NULL;
    TP_CHECK_EQ(tp_future_create(&f), TP_OK);
    check_einval(tp_future_then(f, NULL, NULL), NULL, "tp_future_then cb");
    tp_future_unref(f);
}

static void
pipe_null(void)
{
    tp_error *err = NULL;
    check_einval(tp_context_create(NULL, NULL, &err), &err,
                 "tp_context_create");
    tp_pipe_listener *l = NULL;
    err = NULL;
    check_einval(tp_context_listen(NULL, NULL, 0, &l, &err), &err,
                 "tp_context_listen");
    check_einval(tp_message_create(1, 1, NULL), NULL, "tp_message_create");
    err = NULL;
    check_einval(tp_pipe_wait_ready(NULL, 10, &err), &err,
                 "tp_pipe_wait_ready");
    TP_CHECK(tp_context_name(NULL) == NULL);
    TP_CHECK(tp_context_report(NULL) == NULL);
    TP_CHECK(tp_pipe_listener_addr(NULL, NULL) == NULL);
    TP_CHECK(tp_pipe_report(NULL) == NULL);
    TP_CHECK(tp_pipe_transport(NULL) == NULL);
    TP_CHECK(tp_pipe_channel(NULL) == NULL);
    TP_CHECK(tp_pipe_device_channel(NULL) == NULL);
    TP_CHECK(tp_pipe_peer(NULL) == NULL);
    TP_CHECK(tp_pipe_ref(NULL) == NULL);
    tp_pipe_unref(NULL);
    tp_pipe_close(NULL);
    tp_context_destroy(NULL);
    tp_context_options_init(NULL);
    tp_message_destroy(NULL);

    tp_context *ctx = NULL;
    TP_CHECK_OK(tp_context_create(NULL, &ctx, &err), err);
    err = NULL;
    check_einval(tp_context_listen(ctx, NULL, 0, NULL, &err), &err,
                 "tp_context_listen l_p");
    tp_pipe *p = NULL;
    err = NULL;
    check_einval(tp_context_connect(NULL, "tcp://127.0.0.1:1", &p, &err), &err,
                 "tp_context_connect ctx");
    err = NULL;
    check_einval(tp_context_connect(ctx, NULL, &p, &err), &err,
                 "tp_context_connect url");
    err = NULL;
    check_einval(tp_context_connect(ctx, "tcp://127.0.0.1:1", NULL, &err), &err,
                 "tp_context_connect pipe_p");
    TP_CHECK(p == NULL);
    tp_context_destroy(ctx);
}

static void
collectives_null(void)
{
    int64_t n = 4;
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 1, &n, &t, &err), err);
    tp_work *w = NULL;
    check_einval(tp_pg_barrier(NULL, &w, &err), &err, "tp_pg_barrier");
    err = NULL;
    check_einval(tp_pg_all_reduce(NULL, t, TP_REDUCE_SUM, &w, &err), &err,
                 "tp_pg_all_reduce");
    err = NULL;
    check_einval(tp_pg_broadcast(NULL, t, 0, &w, &err), &err,
                 "tp_pg_broadcast");
    err = NULL;
    check_einval(tp_work_wait(NULL, 10, &err), &err, "tp_work_wait");
    char *info = NULL;
    err = NULL;
    tp_status st = tp_pg_get_debug_info(NULL, &info, &err);
    TP_CHECK_EQ(st, TP_EINVAL);
    tp_error_unref(err);
    TP_CHECK(w == NULL);
    TP_CHECK_EQ(tp_pg_rank(NULL), -1);
    tp_pg_destroy(NULL);
    tp_tensor_unref(t);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(tensor_null_out_and_handle),
    TP_TEST_CASE(tensor_views_null_out),
    TP_TEST_CASE(ops_null),
    TP_TEST_CASE(future_null),
    TP_TEST_CASE(pipe_null),
    TP_TEST_CASE(collectives_null),
};

TP_TEST_MAIN(cases)
