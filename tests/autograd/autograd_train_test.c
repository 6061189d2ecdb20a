// SPDX-License-Identifier: Apache-2.0
// autograd_train_test.c - training steps end to end: out of memory at
// every allocation of a step, and small models trained to a low loss (a
// 2-layer MLP, a bag-of-embeddings classifier).

#include "ag_leak.h"
#include "ag_test_util.h"

#include "alloc.h" // tp__alloc_fail_after
#include "tp_config.h"

// ---- out of memory ---------------------------------------------------------

// A forward and backward pass whose every step can fail; cleans up on
// every path.
static tp_status
oom_step(tp_tensor *x, tp_tensor *w, tp_tensor *y, tp_grad_map *map,
         tp_error **err_p)
{
    tp_tensor *h = NULL, *r = NULL, *s = NULL, *d = NULL, *l = NULL;
    tp_status st = tp_matmul(x, w, &h, err_p);
    if (st == TP_OK) {
        st = tp_tanh(h, &r, err_p);
    }
    if (st == TP_OK) {
        st = tp_mean_dim(r, 0, true, &s, err_p);
    }
    if (st == TP_OK) {
        st = tp_sub(r, s, &d, err_p);
    }
    if (st == TP_OK) {
        st = tp_cross_entropy(d, y, &l, err_p);
    }
    if (st == TP_OK) {
        tp_backward_options o;
        tp_backward_options_init(&o);
        o.grads = map;
        tp_backward_root root = {.tensor = l};
        st = tp_backward_run(&o, 1, &root, err_p);
    }
    tp_tensor_unref(h);
    tp_tensor_unref(r);
    tp_tensor_unref(s);
    tp_tensor_unref(d);
    tp_tensor_unref(l);
    return st;
}

// Fails each allocation of a training step in turn: every failure must be
// TP_ENOMEM and leak nothing (checked under ASan); a step that absorbs the
// failure (the gemm can do without its packing buffers) must still give
// the right gradients.
static void
t_out_of_memory(void)
{
    if (!TP_HAVE_TEST_FAULTS) {
        tp_test_skip("built without TP_TEST_FAULTS");
    }
    int64_t xs[2] = {6, 5}, ws[2] = {5, 3};
    tp_tensor *x = rnd(TP_F64, 2, xs, -1, 1),
              *w = leaf(rnd(TP_F64, 2, ws, -1, 1));
    tp_tensor *y, *ref;
    TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, (const int64_t[]){6}, &y, NULL),
                NULL);
    for (int i = 0; i < 6; i++) {
        tp_tensor_set_item(y, i, i % 3);
    }
    // A clean step first: the reference gradient, and how many
    // allocations a step makes.
    tp__alloc_fail_after(0);
    TP_CHECK_OK(oom_step(x, w, y, NULL, NULL), NULL);
    long total = tp__alloc_fail_after(0);
    TP_CHECK_OK(tp_tensor_clone(tp_tensor_grad(w), &ref, NULL), NULL);
    TP_CHECK(total > 50);
    for (int use_map = 0; use_map < 2; use_map++) {
        int failures = 0;
        for (long nth = 1; nth <= total + 1; nth++) {
            tp_grad_map *map = NULL;
            if (use_map) {
                TP_CHECK_OK(tp_grad_map_create(&map), NULL);
            }
            tp_tensor_zero_grad(w);
            tp_error *err = NULL;
            tp__alloc_fail_after(nth);
            tp_status st = oom_step(x, w, y, map, &err);
            tp__alloc_fail_after(0);
            if (st == TP_OK) {
                // Not bit-exact: a gemm that cannot allocate its packing
                // buffers sums in another order instead of failing.
                tp_tensor *g =
                    map ? tp_grad_map_get(map, w) : tp_tensor_grad(w);
                TP_CHECK(g != NULL);
                for (int i = 0; i < 15; i++) {
                    check_close(at(g, i), at(ref, i), 1e-12, 1e-15, "oom", i);
                }
            } else {
                TP_CHECKF(st == TP_ENOMEM, "allocation %ld: %s: %s", nth,
                          tp_status_name(st), tp_error_message(err));
                failures++;
            }
            tp_error_unref(err);
            tp_grad_map_destroy(map);
        }
        TP_CHECK(failures > total / 2);
    }
    tp_tensor_unref(ref);
    tp_tensor_unref(x);
    tp_tensor_unref(w);
    tp_tensor_unref(y);
}

// ---- end to end: a 2-layer MLP ---------------------------------------------

// Two classes in 2-d split by the line x0 + 0.5 x1 = 0.2, with a margin.
static void
make_dataset(int64_t n, tp_tensor **x_p, tp_tensor **y_p)
{
    int64_t xs[2] = {n, 2};
    tp_tensor *x, *y;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 2, xs, &x, NULL), NULL);
    TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, &n, &y, NULL), NULL);
    tp_tensor *u = rnd(TP_F64, 2, (const int64_t[]){4 * n, 2}, -1, 1);
    int64_t k = 0;
    for (int64_t i = 0; i < 4 * n && k < n; i++) {
        double a = at(u, 2 * i), b = at(u, 2 * i + 1);
        double side = a + 0.5 * b - 0.2;
        if (fabs(side) < 0.1) {
            continue;
        }
        tp_tensor_set_item(x, 2 * k, a);
        tp_tensor_set_item(x, 2 * k + 1, b);
        tp_tensor_set_item(y, k, side > 0 ? 1 : 0);
        k++;
    }
    TP_CHECK_EQ(k, n);
    tp_tensor_unref(u);
    *x_p = x;
    *y_p = y;
}

static void
t_mlp_training(void)
{
    const int64_t n = 256, hidden = 16;
    tp_tensor *x, *y;
    make_dataset(n, &x, &y);
    int64_t s1[2] = {2, hidden}, b1s[1] = {hidden}, s2[2] = {hidden, 2},
            b2s[1] = {2};
    tp_tensor *w1 = leaf(rnd(TP_F32, 2, s1, -0.7, 0.7));
    tp_tensor *b1 = leaf(rnd(TP_F32, 1, b1s, -0.1, 0.1));
    tp_tensor *w2 = leaf(rnd(TP_F32, 2, s2, -0.25, 0.25));
    tp_tensor *b2 = leaf(rnd(TP_F32, 1, b2s, -0.1, 0.1));
    tp_tensor *params[4] = {w1, b1, w2, b2};
    double first = 0, last = 0;
    tp_error *err = NULL;
    for (int step = 0; step < 300; step++) {
        tp_tensor *h0, *h1, *h, *o0, *o, *loss;
        TP_CHECK_OK(tp_matmul(x, w1, &h0, &err), err);
        TP_CHECK_OK(tp_add(h0, b1, &h1, &err), err);
        TP_CHECK_OK(tp_relu(h1, &h, &err), err);
        TP_CHECK_OK(tp_matmul(h, w2, &o0, &err), err);
        TP_CHECK_OK(tp_add(o0, b2, &o, &err), err);
        TP_CHECK_OK(tp_cross_entropy(o, y, &loss, &err), err);
        last = at(loss, 0);
        if (step == 0) {
            first = last;
        }
        TP_CHECK_OK(tp_backward(1, &loss, NULL, false, &err), err);
        bool prev = tp_grad_mode_set(false);
        for (int p = 0; p < 4; p++) {
            TP_CHECK_OK(tp_tensor_axpy(params[p], -0.5,
                                       tp_tensor_grad(params[p]), &err),
                        err);
            tp_tensor_zero_grad(params[p]);
        }
        tp_grad_mode_set(prev);
        tp_tensor *ts[6] = {h0, h1, h, o0, o, loss};
        for (int i = 0; i < 6; i++) {
            tp_tensor_unref(ts[i]);
        }
    }
    // Accuracy with the trained weights, under no_grad.
    bool prev = tp_grad_mode_set(false);
    tp_tensor *h0, *h1, *h, *o0, *o;
    TP_CHECK_OK(tp_matmul(x, w1, &h0, NULL), NULL);
    TP_CHECK_OK(tp_add(h0, b1, &h1, NULL), NULL);
    TP_CHECK_OK(tp_relu(h1, &h, NULL), NULL);
    TP_CHECK_OK(tp_matmul(h, w2, &o0, NULL), NULL);
    TP_CHECK_OK(tp_add(o0, b2, &o, NULL), NULL);
    TP_CHECK(!tp_tensor_requires_grad(o));
    tp_grad_mode_set(prev);
    int correct = 0;
    for (int64_t i = 0; i < n; i++) {
        int pred = at(o, 2 * i + 1) > at(o, 2 * i) ? 1 : 0;
        correct += pred == (int)at(y, i);
    }
    printf("mlp: loss %.4f -> %.4f, accuracy %d/%lld\n", first, last, correct,
           (long long)n);
    TP_CHECKF(first > 0.5, "initial loss %g is already low", first);
    TP_CHECKF(last < 0.1, "loss %g did not drop below 0.1", last);
    TP_CHECKF(correct >= n * 97 / 100, "accuracy %d/%lld", correct,
              (long long)n);
    tp_tensor *ts[5] = {h0, h1, h, o0, o};
    for (int i = 0; i < 5; i++) {
        tp_tensor_unref(ts[i]);
    }
    for (int p = 0; p < 4; p++) {
        tp_tensor_unref(params[p]);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(y);
}

// An embedding model: a bag of token embeddings, mean-pooled, classified
// by a linear layer; the gradients scatter into the table.
static void
t_embedding_training(void)
{
    const int64_t n = 64, len = 4, vocab = 10, dim = 8;
    tp_tensor *idx, *y;
    TP_CHECK_OK(
        tp_tensor_empty(TP_I64, 2, (const int64_t[]){n, len}, &idx, NULL),
        NULL);
    TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, &n, &y, NULL), NULL);
    // Label: whether the sequence holds more tokens < 5 than >= 5.
    tp_tensor *u = rnd(TP_F64, 1, (const int64_t[]){n * len}, 0, 10);
    for (int64_t i = 0; i < n; i++) {
        int lowc = 0;
        for (int64_t j = 0; j < len; j++) {
            int tok = (int)at(u, i * len + j);
            lowc += tok < 5;
            tp_tensor_set_item(idx, i * len + j, tok);
        }
        if (lowc == 2) { // ties are ambiguous: make them low
            tp_tensor_set_item(idx, i * len, 0);
            lowc = 3;
        }
        tp_tensor_set_item(y, i, lowc > 2 ? 1 : 0);
    }
    tp_tensor_unref(u);
    tp_tensor *emb = leaf(rnd(TP_F32, 2, (const int64_t[]){vocab, dim}, -1, 1));
    tp_tensor *w = leaf(rnd(TP_F32, 2, (const int64_t[]){dim, 2}, -0.3, 0.3));
    double first = 0, last = 0;
    for (int step = 0; step < 200; step++) {
        tp_tensor *e, *pooled, *logits, *loss;
        TP_CHECK_OK(tp_embedding(emb, idx, &e, NULL), NULL); // [n, len, dim]
        TP_CHECK_OK(tp_mean_dim(e, 1, false, &pooled, NULL), NULL);
        TP_CHECK_OK(tp_matmul(pooled, w, &logits, NULL), NULL);
        TP_CHECK_OK(tp_cross_entropy(logits, y, &loss, NULL), NULL);
        last = at(loss, 0);
        if (step == 0) {
            first = last;
        }
        TP_CHECK_OK(tp_backward(1, &loss, NULL, false, NULL), NULL);
        bool prev = tp_grad_mode_set(false);
        TP_CHECK_OK(tp_tensor_axpy(emb, -1.0, tp_tensor_grad(emb), NULL), NULL);
        TP_CHECK_OK(tp_tensor_axpy(w, -1.0, tp_tensor_grad(w), NULL), NULL);
        tp_grad_mode_set(prev);
        tp_tensor_zero_grad(emb);
        tp_tensor_zero_grad(w);
        tp_tensor_unref(e);
        tp_tensor_unref(pooled);
        tp_tensor_unref(logits);
        tp_tensor_unref(loss);
    }
    printf("embedding model: loss %.4f -> %.4f\n", first, last);
    TP_CHECKF(last < first * 0.5 && last < 0.3, "loss %g -> %g", first, last);
    tp_tensor_unref(emb);
    tp_tensor_unref(w);
    tp_tensor_unref(idx);
    tp_tensor_unref(y);
}

AG_LEAK_CHECKED(t_out_of_memory)
AG_LEAK_CHECKED(t_mlp_training)
AG_LEAK_CHECKED(t_embedding_training)

static const tp_test_case cases[] = {
    AG_TEST(t_out_of_memory),
    AG_TEST(t_mlp_training),
    AG_TEST(t_embedding_training),
};

TP_TEST_MAIN(cases)
