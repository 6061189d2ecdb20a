// SPDX-License-Identifier: Apache-2.0
// ops.c - differentiable ops: forward through the raw kernels, then (when
// recording) a node whose backward function computes input gradients.
// Backward functions run with grad mode off, so the kernels they call
// record nothing.

#include <math.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

// ---- helpers ---------------------------------------------------------------

static bool
needs(const tp_node *n, int i)
{
    return n->n_next[i].e_node != NULL;
}

// Reduces @g (taken) to the shape of input @i and stores it in @gin[i].
static tp_status
to_input(const tp_node *n, int i, tp_tensor *g, tp_tensor **gin,
         tp_error **err_p)
{
    const tp__shape_meta *m = &n->n_next[i].e_meta;
    tp_status st = tp__k_sum_to(g, m->m_ndim, m->m_shape, &gin[i], err_p);
    tp_tensor_unref(g);
    return st;
}

// Records @ops over @in for the fresh output *@o if needed. On failure
// drops *@o. *@node_p is NULL when nothing was recorded.
static tp_status
record(const tp_node_ops *ops, int nin, tp_tensor *const *in, tp_tensor **o,
       tp_node **node_p, tp_error **err_p)
{
    *node_p = NULL;
    if (!tp__ag_should_record(nin, in)) {
        return TP_OK;
    }
    tp_status st = tp__ag_record(ops, nin, in, *o, node_p, err_p);
    if (st != TP_OK) {
        tp_tensor_unref(*o);
        *o = NULL;
    }
    return st;
}

static tp_status
save(tp_node *n, int slot, const tp_tensor *t, tp_tensor **o, tp_error **err_p)
{
    if (!n) {
        return TP_OK;
    }
    tp_status st = tp__node_save(n, slot, t, err_p);
    if (st != TP_OK) {
        tp_tensor_unref(*o);
        *o = NULL;
    }
    return st;
}

static tp_status
saved_or_fail(const tp_node *n, int slot, tp_error **err_p)
{
    if (!n->n_saved[slot]) {
        return tp__error_set(err_p, TP_EINTERNAL, "%s: saved tensor missing",
                             tp_node_name(n));
    }
    return TP_OK;
}

#define BW_FN(NAME)                                                            \
    static tp_status NAME(tp_node *n, tp_tensor *const *gout, tp_tensor **gin, \
                          tp_error **err_p)

// ---- binary ----------------------------------------------------------------

BW_FN(add_bw)
{
    tp_status st = TP_OK;
    for (int i = 0; i < 2 && st == TP_OK; i++) {
        if (needs(n, i)) {
            st = to_input(n, i, tp_tensor_ref(gout[0]), gin, err_p);
        }
    }
    return st;
}

BW_FN(sub_bw)
{
    tp_status st = TP_OK;
    if (needs(n, 0)) {
        st = to_input(n, 0, tp_tensor_ref(gout[0]), gin, err_p);
    }
    if (st == TP_OK && needs(n, 1)) {
        tp_tensor *ng;
        st = tp__k_unary("sub", TP__NEG, gout[0], 0, &ng, err_p);
        if (st == TP_OK) {
            st = to_input(n, 1, ng, gin, err_p);
        }
    }
    return st;
}

BW_FN(mul_bw)
{
    tp_status st = TP_OK;
    for (int i = 0; i < 2 && st == TP_OK; i++) {
        if (!needs(n, i)) {
            continue;
        }
        st = saved_or_fail(n, 1 - i, err_p);
        tp_tensor *g;
        if (st == TP_OK) {
            st = tp__k_binary("mul", TP__MUL, gout[0], n->n_saved[1 - i], 0, &g,
                              err_p);
        }
        if (st == TP_OK) {
            st = to_input(n, i, g, gin, err_p);
        }
    }
    return st;
}

BW_FN(div_bw)
{
    // a / b: da = g / b, db = -g * a / b^2 = -(g * out) / b.
    tp_status st = saved_or_fail(n, 1, err_p);
    if (st == TP_OK && needs(n, 0)) {
        tp_tensor *g;
        st = tp__k_binary("div", TP__DIV, gout[0], n->n_saved[1], 0, &g, err_p);
        if (st == TP_OK) {
            st = to_input(n, 0, g, gin, err_p);
        }
    }
    if (st == TP_OK && needs(n, 1)) {
        tp_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
        st = saved_or_fail(n, 2, err_p);
        if (st == TP_OK) {
            st = tp__k_binary("div", TP__MUL, gout[0], n->n_saved[2], 0, &t1,
                              err_p);
        }
        if (st == TP_OK) {
            st = tp__k_binary("div", TP__DIV, t1, n->n_saved[1], 0, &t2, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_unary("div", TP__NEG, t2, 0, &t3, err_p);
        }
        if (st == TP_OK) {
            st = to_input(n, 1, t3, gin, err_p);
        }
        tp_tensor_unref(t1);
        tp_tensor_unref(t2);
    }
    return st;
}

static const tp_node_ops add_ops = {.name = "AddBackward", .backward = add_bw};
static const tp_node_ops sub_ops = {.name = "SubBackward", .backward = sub_bw};
static const tp_node_ops mul_ops = {.name = "MulBackward", .backward = mul_bw};
static const tp_node_ops div_ops = {.name = "DivBackward", .backward = div_bw};

static tp_status
binary_op(const char *name, tp__binop k, const tp_node_ops *ops, tp_tensor *a,
          tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_tensor *o, *in[2] = {a, b};
    tp_node *n;
    tp_status st = tp__k_binary(name, k, a, b, 0, &o, err_p);
    if (st == TP_OK) {
        st = record(ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && (k == TP__MUL || k == TP__DIV)) {
        st = save(n, 0, a, &o, err_p);
        if (st == TP_OK) {
            st = save(n, 1, b, &o, err_p);
        }
        if (st == TP_OK && k == TP__DIV) {
            st = save(n, 2, o, &o, err_p);
        }
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_add(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    return binary_op("add", TP__ADD, &add_ops, a, b, out_p, err_p);
}

tp_status
tp_sub(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    return binary_op("sub", TP__SUB, &sub_ops, a, b, out_p, err_p);
}

tp_status
tp_mul(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    return binary_op("mul", TP__MUL, &mul_ops, a, b, out_p, err_p);
}

tp_status
tp_div(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    return binary_op("div", TP__DIV, &div_ops, a, b, out_p, err_p);
}

// ---- unary -----------------------------------------------------------------

// Unary backward: gin = BINOP(g, saved[0], s = n_d[0]), or a scalar
// multiply when n_i[0] says so.
BW_FN(unary_bw)
{
    if (!needs(n, 0)) {
        return TP_OK;
    }
    tp__binop k = (tp__binop)n->n_i[0];
    const char *name = tp_node_name(n);
    if (n->n_i[1]) { // scale only: neg, mul_scalar, add_scalar
        return tp__k_unary(name, TP__MULS, gout[0], n->n_d[0], &gin[0], err_p);
    }
    tp_status st = saved_or_fail(n, 0, err_p);
    if (st != TP_OK) {
        return st;
    }
    return tp__k_binary(name, k, gout[0], n->n_saved[0], n->n_d[0], &gin[0],
                        err_p);
}

static const tp_node_ops neg_ops = {.name = "NegBackward",
                                    .backward = unary_bw};
static const tp_node_ops muls_ops = {.name = "MulScalarBackward",
                                     .backward = unary_bw};
static const tp_node_ops adds_ops = {.name = "AddScalarBackward",
                                     .backward = unary_bw};
static const tp_node_ops exp_ops = {.name = "ExpBackward",
                                    .backward = unary_bw};
static const tp_node_ops log_ops = {.name = "LogBackward",
                                    .backward = unary_bw};
static const tp_node_ops pow_ops = {.name = "PowBackward",
                                    .backward = unary_bw};
static const tp_node_ops sqrt_ops = {.name = "SqrtBackward",
                                     .backward = unary_bw};
static const tp_node_ops tanh_ops = {.name = "TanhBackward",
                                     .backward = unary_bw};
static const tp_node_ops sigmoid_ops = {.name = "SigmoidBackward",
                                        .backward = unary_bw};
static const tp_node_ops relu_ops = {.name = "ReluBackward",
                                     .backward = unary_bw};

typedef enum save_what { SAVE_NONE, SAVE_INPUT, SAVE_OUTPUT } save_what;

static tp_status
unary_op(const char *name, tp__unop k, double s, const tp_node_ops *ops,
         tp__binop bw, bool scale_only, double bw_s, save_what sv, tp_tensor *a,
         tp_tensor **out_p, tp_error **err_p)
{
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__k_unary(name, k, a, s, &o, err_p);
    if (st == TP_OK) {
        st = record(ops, 1, &a, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = bw;
        n->n_i[1] = scale_only;
        n->n_d[0] = bw_s;
        if (sv != SAVE_NONE) {
            st = save(n, 0, sv == SAVE_INPUT ? a : o, &o, err_p);
        }
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_neg(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("neg", TP__NEG, 0, &neg_ops, TP__MUL, true, -1.0, SAVE_NONE,
                    a, out_p, err_p);
}

tp_status
tp_mul_scalar(tp_tensor *a, double s, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("mul_scalar", TP__MULS, s, &muls_ops, TP__MUL, true, s,
                    SAVE_NONE, a, out_p, err_p);
}

tp_status
tp_add_scalar(tp_tensor *a, double s, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("add_scalar", TP__ADDS, s, &adds_ops, TP__MUL, true, 1.0,
                    SAVE_NONE, a, out_p, err_p);
}

tp_status
tp_exp(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("exp", TP__EXP, 0, &exp_ops, TP__MUL, false, 0, SAVE_OUTPUT,
                    a, out_p, err_p);
}

tp_status
tp_log(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("log", TP__LOG, 0, &log_ops, TP__DIV, false, 0, SAVE_INPUT,
                    a, out_p, err_p);
}

tp_status
tp_pow(tp_tensor *a, double p, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("pow", TP__POW, p, &pow_ops, TP__POW_BW, false, p,
                    SAVE_INPUT, a, out_p, err_p);
}

tp_status
tp_sqrt(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("sqrt", TP__SQRT, 0, &sqrt_ops, TP__SQRT_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_tanh(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("tanh", TP__TANH, 0, &tanh_ops, TP__TANH_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_sigmoid(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("sigmoid", TP__SIGMOID, 0, &sigmoid_ops, TP__SIGMOID_BW,
                    false, 0, SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_relu(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return unary_op("relu", TP__RELU, 0, &relu_ops, TP__RELU_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

// ---- reductions ------------------------------------------------------------

// n_i[0]: dim (-1 for all), n_i[1]: keepdim; n_d[0]: scale (1 or 1/N).
BW_FN(sum_bw)
{
    if (!needs(n, 0)) {
        return TP_OK;
    }
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    tp_tensor *g = NULL, *r = NULL;
    tp_status st;
    if (n->n_d[0] != 1.0) {
        st = tp__k_unary("mean", TP__MULS, gout[0], n->n_d[0], &g, err_p);
    } else {
        st = tp__tensor_alias(gout[0], &g, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    if (n->n_i[0] >= 0 && !n->n_i[1]) {
        // Put the reduced dim back as size 1 so g broadcasts.
        int64_t shape[TP_TENSOR_MAX_DIMS];
        memcpy(shape, m->m_shape, sizeof(shape));
        shape[n->n_i[0]] = 1;
        st = tp__view_reshape(g, m->m_ndim, shape, &r, err_p);
        tp_tensor_unref(g);
        if (st != TP_OK) {
            return st;
        }
        g = r;
    }
    st = tp__view_expand(g, m->m_ndim, m->m_shape, &gin[0], err_p);
    tp_tensor_unref(g);
    return st;
}

static const tp_node_ops sum_ops = {.name = "SumBackward", .backward = sum_bw};
static const tp_node_ops mean_ops = {.name = "MeanBackward",
                                     .backward = sum_bw};

static tp_status
reduce_op(const char *name, bool mean, tp_tensor *a, int dim, bool all,
          bool keepdim, tp_tensor **out_p, tp_error **err_p)
{
    bool reduce[TP_TENSOR_MAX_DIMS] = {false};
    int d = -1;
    if (!all) {
        if (!tp__dim_norm(a->t_ndim, dim, &d)) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: dim %d out of range for %d-d", name, dim,
                                 a->t_ndim);
        }
    }
    int64_t count = 1;
    for (int i = 0; i < a->t_ndim; i++) {
        reduce[i] = all || i == d;
        if (reduce[i]) {
            count *= a->t_shape[i];
        }
    }
    // The mean of nothing is nan, as in PyTorch.
    double scale = mean ? (count ? 1.0 / (double)count : NAN) : 1.0;
    tp_tensor *o;
    tp_node *n;
    tp_status st =
        tp__k_sum(a, reduce, all ? false : keepdim, scale, &o, err_p);
    if (st == TP_OK) {
        st = record(mean ? &mean_ops : &sum_ops, 1, &a, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = d;
        n->n_i[1] = keepdim;
        n->n_d[0] = scale;
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_sum(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return reduce_op("sum", false, a, 0, true, false, out_p, err_p);
}

tp_status
tp_sum_dim(tp_tensor *a, int dim, bool keepdim, tp_tensor **out_p,
           tp_error **err_p)
{
    return reduce_op("sum", false, a, dim, false, keepdim, out_p, err_p);
}

tp_status
tp_mean(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    return reduce_op("mean", true, a, 0, true, false, out_p, err_p);
}

tp_status
tp_mean_dim(tp_tensor *a, int dim, bool keepdim, tp_tensor **out_p,
            tp_error **err_p)
{
    return reduce_op("mean", true, a, dim, false, keepdim, out_p, err_p);
}

// ---- matmul ----------------------------------------------------------------

static tp_status
transpose_last(const tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    return tp__view_transpose(t, -1, -2, out_p, err_p);
}

BW_FN(matmul_bw)
{
    // C = A B: dA = G B^T, dB = A^T G (summed over broadcast batch dims).
    tp_status st = saved_or_fail(n, 0, err_p);
    if (st == TP_OK) {
        st = saved_or_fail(n, 1, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *a = n->n_saved[0], *b = n->n_saved[1], *g = gout[0];
    if (needs(n, 0)) {
        tp_tensor *bt, *ga;
        st = transpose_last(b, &bt, err_p);
        if (st == TP_OK) {
            st = tp__k_matmul(g, bt, &ga, err_p);
            tp_tensor_unref(bt);
        }
        if (st == TP_OK) {
            st = to_input(n, 0, ga, gin, err_p);
        }
    }
    if (st == TP_OK && needs(n, 1)) {
        tp_tensor *a2 = NULL, *g2 = NULL, *at = NULL, *gb = NULL;
        if (b->t_ndim == 2 && a->t_ndim > 2) {
            // Shared 2-D B: fold A's batch into rows, one gemm.
            // Explicit row counts: -1 cannot be inferred when k or n is 0.
            int64_t k = a->t_shape[a->t_ndim - 1];
            int64_t nn = g->t_shape[g->t_ndim - 1];
            int64_t rows = tp__shape_numel(a->t_ndim - 1, a->t_shape);
            int64_t sa[2] = {rows, k}, sg[2] = {rows, nn};
            st = tp__view_reshape(a, 2, sa, &a2, err_p);
            if (st == TP_OK) {
                st = tp__view_reshape(g, 2, sg, &g2, err_p);
            }
        } else {
            st = tp__tensor_alias(a, &a2, err_p);
            if (st == TP_OK) {
                st = tp__tensor_alias(g, &g2, err_p);
            }
        }
        if (st == TP_OK) {
            st = transpose_last(a2, &at, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_matmul(at, g2, &gb, err_p);
        }
        if (st == TP_OK) {
            st = to_input(n, 1, gb, gin, err_p);
        }
        tp_tensor_unref(a2);
        tp_tensor_unref(g2);
        tp_tensor_unref(at);
    }
    return st;
}

static const tp_node_ops matmul_ops = {.name = "MatmulBackward",
                                       .backward = matmul_bw};

tp_status
tp_matmul(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_tensor *o, *in[2] = {a, b};
    tp_node *n;
    tp_status st = tp__k_matmul(a, b, &o, err_p);
    if (st == TP_OK) {
        st = record(&matmul_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK) {
        st = save(n, 0, a, &o, err_p);
    }
    if (st == TP_OK) {
        st = save(n, 1, b, &o, err_p);
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

// ---- softmax ---------------------------------------------------------------

static tp_status
sum_keep(const tp_tensor *t, int dim, tp_tensor **out_p, tp_error **err_p)
{
    bool reduce[TP_TENSOR_MAX_DIMS] = {false};
    if (t->t_ndim > 0) {
        reduce[dim] = true;
    }
    return tp__k_sum(t, reduce, true, 1.0, out_p, err_p);
}

// n_i[0]: dim, n_i[1]: log; saved[0]: the output y.
BW_FN(softmax_bw)
{
    if (!needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = saved_or_fail(n, 0, err_p);
    if (st != TP_OK) {
        return st;
    }
    const char *name = tp_node_name(n);
    tp_tensor *y = n->n_saved[0], *g = gout[0];
    tp_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
    int dim = (int)n->n_i[0];
    if (n->n_i[1]) {
        // log_softmax: g - exp(y) * sum(g)
        st = sum_keep(g, dim, &t1, err_p);
        if (st == TP_OK) {
            st = tp__k_unary(name, TP__EXP, y, 0, &t2, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_binary(name, TP__MUL, t2, t1, 0, &t3, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_binary(name, TP__SUB, g, t3, 0, &gin[0], err_p);
        }
    } else {
        // softmax: y * (g - sum(g * y))
        st = tp__k_binary(name, TP__MUL, g, y, 0, &t1, err_p);
        if (st == TP_OK) {
            st = sum_keep(t1, dim, &t2, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_binary(name, TP__SUB, g, t2, 0, &t3, err_p);
        }
        if (st == TP_OK) {
            st = tp__k_binary(name, TP__MUL, y, t3, 0, &gin[0], err_p);
        }
    }
    tp_tensor_unref(t1);
    tp_tensor_unref(t2);
    tp_tensor_unref(t3);
    return st;
}

static const tp_node_ops softmax_ops = {.name = "SoftmaxBackward",
                                        .backward = softmax_bw};
static const tp_node_ops log_softmax_ops = {.name = "LogSoftmaxBackward",
                                            .backward = softmax_bw};

static tp_status
softmax_op(tp_tensor *a, int dim, bool log_, tp_tensor **out_p,
           tp_error **err_p)
{
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__k_softmax(a, dim, log_, &o, err_p);
    if (st == TP_OK) {
        st = record(log_ ? &log_softmax_ops : &softmax_ops, 1, &a, &o, &n,
                    err_p);
    }
    if (st == TP_OK && n) {
        int d = 0;
        if (a->t_ndim > 0) {
            tp__dim_norm(a->t_ndim, dim, &d);
        }
        n->n_i[0] = d;
        n->n_i[1] = log_;
        st = save(n, 0, o, &o, err_p);
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_softmax(tp_tensor *a, int dim, tp_tensor **out_p, tp_error **err_p)
{
    return softmax_op(a, dim, false, out_p, err_p);
}

tp_status
tp_log_softmax(tp_tensor *a, int dim, tp_tensor **out_p, tp_error **err_p)
{
    return softmax_op(a, dim, true, out_p, err_p);
}

// ---- losses ----------------------------------------------------------------

static tp_status
scalar_of(const tp_tensor *g, double *v_p)
{
    return tp_tensor_item(g, 0, v_p);
}

// saved[0]: d = a - target; n_d[0]: 1/N.
BW_FN(mse_bw)
{
    tp_status st = saved_or_fail(n, 0, err_p);
    double gv;
    if (st != TP_OK) {
        return st;
    }
    if (scalar_of(gout[0], &gv) != TP_OK) {
        return tp__error_set(err_p, TP_EINVAL, "mse_loss: bad gradient");
    }
    tp_tensor *gd;
    st = tp__k_unary("mse_loss", TP__MULS, n->n_saved[0], 2.0 * gv * n->n_d[0],
                     &gd, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (needs(n, 0)) {
        st = to_input(n, 0, tp_tensor_ref(gd), gin, err_p);
    }
    if (st == TP_OK && needs(n, 1)) {
        tp_tensor *ng;
        st = tp__k_unary("mse_loss", TP__NEG, gd, 0, &ng, err_p);
        if (st == TP_OK) {
            st = to_input(n, 1, ng, gin, err_p);
        }
    }
    tp_tensor_unref(gd);
    return st;
}

static const tp_node_ops mse_ops = {.name = "MseLossBackward",
                                    .backward = mse_bw};

tp_status
tp_mse_loss(tp_tensor *a, tp_tensor *target, tp_tensor **out_p,
            tp_error **err_p)
{
    tp_tensor *d = NULL, *sq = NULL, *o = NULL, *in[2] = {a, target};
    tp_node *n;
    bool all[TP_TENSOR_MAX_DIMS];
    tp_status st = tp__k_binary("mse_loss", TP__SUB, a, target, 0, &d, err_p);
    if (st == TP_OK) {
        st = tp__k_binary("mse_loss", TP__MUL, d, d, 0, &sq, err_p);
    }
    int64_t cnt = d ? tp_tensor_numel(d) : 0;
    double scale = cnt ? 1.0 / (double)cnt : NAN;
    if (st == TP_OK) {
        for (int i = 0; i < TP_TENSOR_MAX_DIMS; i++) {
            all[i] = true;
        }
        st = tp__k_sum(sq, all, false, scale, &o, err_p);
    }
    if (st == TP_OK) {
        st = record(&mse_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_d[0] = scale;
        st = save(n, 0, d, &o, err_p);
    }
    tp_tensor_unref(d);
    tp_tensor_unref(sq);
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

// Element @i of a contiguous i32/i64 tensor, read exactly (no detour
// through double, which cannot hold every i64).
static int64_t
load_index(const tp_tensor *idx, int64_t i)
{
    size_t es = tp_dtype_size(idx->t_dtype);
    return tp__load_i64(tp__tensor_ptr(idx) + (size_t)i * es, idx->t_dtype);
}

static bool
is_index_dtype(tp_dtype dt)
{
    return dt == TP_I32 || dt == TP_I64;
}

// saved[0]: target; n_i[0]: N, n_i[1]: C.
BW_FN(nll_bw)
{
    if (!needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = saved_or_fail(n, 0, err_p);
    double gv;
    if (st != TP_OK) {
        return st;
    }
    if (scalar_of(gout[0], &gv) != TP_OK) {
        return tp__error_set(err_p, TP_EINVAL, "nll_loss: bad gradient");
    }
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    tp_tensor *gx;
    st = tp_tensor_zeros(m->m_dtype, m->m_ndim, m->m_shape, &gx, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t N = n->n_i[0], C = n->n_i[1];
    double v = -gv / (double)N;
    for (int64_t i = 0; i < N; i++) {
        // The targets are a private copy checked in forward; check again
        // so that no write can ever land outside gx.
        int64_t t = load_index(n->n_saved[0], i);
        if (t < 0 || t >= C || tp_tensor_set_item(gx, i * C + t, v) != TP_OK) {
            tp_tensor_unref(gx);
            return tp__error_set(err_p, TP_EINVAL,
                                 "nll_loss: target %lld of sample %lld is "
                                 "outside [0, %lld)",
                                 (long long)t, (long long)i, (long long)C);
        }
    }
    gin[0] = gx;
    return TP_OK;
}

static const tp_node_ops nll_ops = {.name = "NllLossBackward",
                                    .backward = nll_bw};

tp_status
tp_nll_loss(tp_tensor *logp, tp_tensor *target, tp_tensor **out_p,
            tp_error **err_p)
{
    tp_status st = tp__k_check_float("nll_loss", logp, err_p);
    if (st != TP_OK) {
        return st;
    }
    char x[128], y[128];
    if (logp->t_ndim != 2 || target->t_ndim != 1 ||
        target->t_shape[0] != logp->t_shape[0] ||
        !is_index_dtype(target->t_dtype)) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "nll_loss: needs input [N, C] and i32/i64 target [N], got %s "
            "and %s %s",
            tp__shape_str(logp->t_ndim, logp->t_shape, x, sizeof(x)),
            tp_dtype_name(target->t_dtype),
            tp__shape_str(target->t_ndim, target->t_shape, y, sizeof(y)));
    }
    int64_t N = logp->t_shape[0], C = logp->t_shape[1];
    // A private contiguous copy of the (small) targets: read directly here
    // and saved for backward, so later writes to @target change nothing.
    tp_tensor *tc;
    st = tp__clone_raw(target, &tc, err_p);
    if (st != TP_OK) {
        return st;
    }
    double sum = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = load_index(tc, i);
        double v;
        if (t < 0 || t >= C) {
            tp_tensor_unref(tc);
            return tp__error_set(err_p, TP_EINVAL,
                                 "nll_loss: target %lld of sample %lld is "
                                 "outside [0, %lld)",
                                 (long long)t, (long long)i, (long long)C);
        }
        tp_tensor_item(logp, i * C + t, &v);
        sum += v;
    }
    tp_tensor *o, *in[2] = {logp, target};
    tp_node *n;
    st = tp_tensor_full(logp->t_dtype, 0, NULL, N ? -sum / (double)N : NAN, &o,
                        err_p);
    if (st == TP_OK) {
        st = record(&nll_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = N;
        n->n_i[1] = C;
        st = save(n, 0, tc, &o, err_p);
    }
    tp_tensor_unref(tc);
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_cross_entropy(tp_tensor *logits, tp_tensor *target, tp_tensor **out_p,
                 tp_error **err_p)
{
    tp_tensor *lp;
    tp_status st = tp_log_softmax(logits, 1, &lp, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "cross_entropy");
    }
    st = tp_nll_loss(lp, target, out_p, err_p);
    tp_tensor_unref(lp);
    return st;
}

// ---- embedding -------------------------------------------------------------

// saved[0]: indices; n_i[0]: V, n_i[1]: D.
BW_FN(embedding_bw)
{
    if (!needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = saved_or_fail(n, 0, err_p);
    if (st != TP_OK) {
        return st;
    }
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    tp_tensor *gw, *g;
    st = tp_tensor_zeros(m->m_dtype, m->m_ndim, m->m_shape, &gw, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__contiguous_raw(gout[0], &g, err_p);
    if (st != TP_OK) {
        tp_tensor_unref(gw);
        return st;
    }
    int64_t rows = tp_tensor_numel(n->n_saved[0]), V = n->n_i[0];
    int64_t D = n->n_i[1];
    for (int64_t r = 0; r < rows; r++) {
        // The indices are a private copy checked in forward; check again
        // so that a bad index can never write outside gw.
        int64_t t = load_index(n->n_saved[0], r);
        if (t < 0 || t >= V) {
            tp_tensor_unref(g);
            tp_tensor_unref(gw);
            return tp__error_set(err_p, TP_EINVAL,
                                 "embedding: index %lld is outside [0, %lld)",
                                 (long long)t, (long long)V);
        }
        if (gw->t_dtype == TP_F32) {
            float *dst = (float *)tp_tensor_data(gw) + t * D;
            const float *src = (const float *)tp_tensor_data(g) + r * D;
            for (int64_t j = 0; j < D; j++) {
                dst[j] += src[j];
            }
        } else {
            double *dst = (double *)tp_tensor_data(gw) + t * D;
            const double *src = (const double *)tp_tensor_data(g) + r * D;
            for (int64_t j = 0; j < D; j++) {
                dst[j] += src[j];
            }
        }
    }
    tp_tensor_unref(g);
    gin[0] = gw;
    return TP_OK;
}

static const tp_node_ops embedding_ops = {.name = "EmbeddingBackward",
                                          .backward = embedding_bw};

tp_status
tp_embedding(tp_tensor *weight, tp_tensor *indices, tp_tensor **out_p,
             tp_error **err_p)
{
    tp_status st = tp__k_check_float("embedding", weight, err_p);
    if (st != TP_OK) {
        return st;
    }
    char x[128];
    if (weight->t_ndim != 2 || !is_index_dtype(indices->t_dtype) ||
        indices->t_ndim + 1 > TP_TENSOR_MAX_DIMS) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "embedding: needs weight [V, D] and i32/i64 indices, got %s and "
            "%s",
            tp__shape_str(weight->t_ndim, weight->t_shape, x, sizeof(x)),
            tp_dtype_name(indices->t_dtype));
    }
    int64_t V = weight->t_shape[0], D = weight->t_shape[1];
    int64_t rows = tp_tensor_numel(indices);
    // A private contiguous copy of the (small) indices: read directly here
    // and saved for backward, so later writes to @indices change nothing.
    tp_tensor *ic;
    st = tp__clone_raw(indices, &ic, err_p);
    if (st != TP_OK) {
        return st;
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = load_index(ic, r);
        if (t < 0 || t >= V) {
            tp_tensor_unref(ic);
            return tp__error_set(err_p, TP_EINVAL,
                                 "embedding: index %lld is outside [0, %lld)",
                                 (long long)t, (long long)V);
        }
    }
    int64_t shape[TP_TENSOR_MAX_DIMS];
    memcpy(shape, indices->t_shape, sizeof(int64_t) * (size_t)indices->t_ndim);
    shape[indices->t_ndim] = D;
    tp_tensor *o, *in[2] = {weight, indices};
    tp_node *n;
    st =
        tp_tensor_empty(weight->t_dtype, indices->t_ndim + 1, shape, &o, err_p);
    if (st != TP_OK) {
        tp_tensor_unref(ic);
        return st;
    }
    size_t es = tp_dtype_size(weight->t_dtype);
    for (int64_t r = 0; r < rows; r++) {
        int64_t t = load_index(ic, r);
        // Rows are usually dense; the views handle any layout of weight.
        if (weight->t_strides[1] == 1 || D <= 1) {
            memcpy((char *)tp_tensor_data(o) + (size_t)(r * D) * es,
                   tp__tensor_ptr(weight) +
                       (size_t)(t * weight->t_strides[0]) * es,
                   (size_t)D * es);
            continue;
        }
        for (int64_t j = 0; j < D; j++) {
            double v;
            tp_tensor_item(weight, t * D + j, &v);
            tp__store_f64((char *)tp_tensor_data(o) + (size_t)(r * D + j) * es,
                          o->t_dtype, v);
        }
    }
    st = record(&embedding_ops, 2, in, &o, &n, err_p);
    if (st == TP_OK && n) {
        n->n_i[0] = V;
        n->n_i[1] = D;
        st = save(n, 0, ic, &o, err_p);
    }
    tp_tensor_unref(ic);
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

tp_status
tp_tensor_axpy(tp_tensor *y, double alpha, tp_tensor *x, tp_error **err_p)
{
    if (y->t_requires_grad && tp_grad_mode_get()) {
        return tp__error_set(err_p, TP_EPERM,
                             "axpy: in-place update of a tensor that "
                             "requires grad while grad mode is on");
    }
    return tp__k_axpy(y, alpha, x, err_p);
}
