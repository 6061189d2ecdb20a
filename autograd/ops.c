// SPDX-License-Identifier: Apache-2.0
// ops.c - differentiable ops: forward through the raw kernels, then (when
// recording) a node whose backward function computes input gradients.
// Backward functions run with grad mode off, so the kernels they call
// record nothing. This file has the helpers all ops share and the
// elementwise ops; reductions and matmul are in ops_reduce.c, softmax,
// losses and embedding in ops_nn.c.

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

// ---- helpers ---------------------------------------------------------------

bool
tp__op_needs(const tp_node *n, int i)
{
    return n->n_next[i].e_node != NULL;
}

tp_status
tp__op_to_input(const tp_node *n, int i, tp_tensor *g, tp_tensor **gin,
                tp_error **err_p)
{
    const tp__shape_meta *m = &n->n_next[i].e_meta;
    tp_status st = tp__k_sum_to(g, m->m_ndim, m->m_shape, &gin[i], err_p);
    tp_tensor_unref(g);
    return st;
}

tp_status
tp__op_record(const tp_node_ops *ops, int nin, tp_tensor *const *in,
              tp_tensor **o, tp_node **node_p, tp_error **err_p)
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

tp_status
tp__op_save(tp_node *n, int slot, const tp_tensor *t, tp_tensor **o,
            tp_error **err_p)
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

tp_status
tp__op_saved_or_fail(const tp_node *n, int slot, tp_error **err_p)
{
    if (!n->n_saved[slot]) {
        return tp__error_set(err_p, TP_EINTERNAL, "%s: saved tensor missing",
                             tp_node_name(n));
    }
    return TP_OK;
}

// ---- binary ----------------------------------------------------------------

TP__BW_FN(add_bw)
{
    tp_status st = TP_OK;
    for (int i = 0; i < 2 && st == TP_OK; i++) {
        if (tp__op_needs(n, i)) {
            st = tp__op_to_input(n, i, tp_tensor_ref(gout[0]), gin, err_p);
        }
    }
    return st;
}

TP__BW_FN(sub_bw)
{
    tp_status st = TP_OK;
    if (tp__op_needs(n, 0)) {
        st = tp__op_to_input(n, 0, tp_tensor_ref(gout[0]), gin, err_p);
    }
    if (st == TP_OK && tp__op_needs(n, 1)) {
        tp_tensor *ng;
        st = tp__k_unary("sub", TP__NEG, gout[0], 0, &ng, err_p);
        if (st == TP_OK) {
            st = tp__op_to_input(n, 1, ng, gin, err_p);
        }
    }
    return st;
}

TP__BW_FN(mul_bw)
{
    tp_status st = TP_OK;
    for (int i = 0; i < 2 && st == TP_OK; i++) {
        if (!tp__op_needs(n, i)) {
            continue;
        }
        st = tp__op_saved_or_fail(n, 1 - i, err_p);
        tp_tensor *g;
        if (st == TP_OK) {
            st = tp__k_binary("mul", TP__MUL, gout[0], n->n_saved[1 - i], 0, &g,
                              err_p);
        }
        if (st == TP_OK) {
            st = tp__op_to_input(n, i, g, gin, err_p);
        }
    }
    return st;
}

TP__BW_FN(div_bw)
{
    // a / b: da = g / b, db = -g * a / b^2 = -(g * out) / b.
    tp_status st = tp__op_saved_or_fail(n, 1, err_p);
    if (st == TP_OK && tp__op_needs(n, 0)) {
        tp_tensor *g;
        st = tp__k_binary("div", TP__DIV, gout[0], n->n_saved[1], 0, &g, err_p);
        if (st == TP_OK) {
            st = tp__op_to_input(n, 0, g, gin, err_p);
        }
    }
    if (st == TP_OK && tp__op_needs(n, 1)) {
        tp_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
        st = tp__op_saved_or_fail(n, 2, err_p);
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
            st = tp__op_to_input(n, 1, t3, gin, err_p);
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
        st = tp__op_record(ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && (k == TP__MUL || k == TP__DIV)) {
        st = tp__op_save(n, 0, a, &o, err_p);
        if (st == TP_OK) {
            st = tp__op_save(n, 1, b, &o, err_p);
        }
        if (st == TP_OK && k == TP__DIV) {
            st = tp__op_save(n, 2, o, &o, err_p);
        }
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}

// TP_EINVAL naming the first of @a, @b (checked when @bn is not NULL) and
// @out_p that is NULL: the NULL checks of the public ops (issue 15).
static tp_status
null_args(const char *fn, const tp_tensor *a, const char *an,
          const tp_tensor *b, const char *bn, tp_tensor **out_p,
          tp_error **err_p)
{
    const char *what = a == NULL                 ? an
                       : bn != NULL && b == NULL ? bn
                       : out_p == NULL           ? "out_p"
                                                 : NULL;
    return what == NULL ? TP_OK : tp__tensor_null_arg(err_p, fn, what);
}

tp_status
tp_add(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_add", a, "a", b, "b", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return binary_op("add", TP__ADD, &add_ops, a, b, out_p, err_p);
}

tp_status
tp_sub(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_sub", a, "a", b, "b", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return binary_op("sub", TP__SUB, &sub_ops, a, b, out_p, err_p);
}

tp_status
tp_mul(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_mul", a, "a", b, "b", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return binary_op("mul", TP__MUL, &mul_ops, a, b, out_p, err_p);
}

tp_status
tp_div(tp_tensor *a, tp_tensor *b, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_div", a, "a", b, "b", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return binary_op("div", TP__DIV, &div_ops, a, b, out_p, err_p);
}

// ---- unary -----------------------------------------------------------------

// Unary backward: gin = BINOP(g, saved[0], s = n_d[0]), or a scalar
// multiply when n_i[0] says so.
TP__BW_FN(unary_bw)
{
    if (!tp__op_needs(n, 0)) {
        return TP_OK;
    }
    tp__binop k = (tp__binop)n->n_i[0];
    const char *name = tp_node_name(n);
    if (n->n_i[1]) { // scale only: neg, mul_scalar, add_scalar
        return tp__k_unary(name, TP__MULS, gout[0], n->n_d[0], &gin[0], err_p);
    }
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
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
        st = tp__op_record(ops, 1, &a, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = bw;
        n->n_i[1] = scale_only;
        n->n_d[0] = bw_s;
        if (sv != SAVE_NONE) {
            st = tp__op_save(n, 0, sv == SAVE_INPUT ? a : o, &o, err_p);
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
    tp_status ck = null_args("tp_neg", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("neg", TP__NEG, 0, &neg_ops, TP__MUL, true, -1.0, SAVE_NONE,
                    a, out_p, err_p);
}

tp_status
tp_mul_scalar(tp_tensor *a, double s, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_mul_scalar", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("mul_scalar", TP__MULS, s, &muls_ops, TP__MUL, true, s,
                    SAVE_NONE, a, out_p, err_p);
}

tp_status
tp_add_scalar(tp_tensor *a, double s, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_add_scalar", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("add_scalar", TP__ADDS, s, &adds_ops, TP__MUL, true, 1.0,
                    SAVE_NONE, a, out_p, err_p);
}

tp_status
tp_exp(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_exp", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("exp", TP__EXP, 0, &exp_ops, TP__MUL, false, 0, SAVE_OUTPUT,
                    a, out_p, err_p);
}

tp_status
tp_log(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_log", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("log", TP__LOG, 0, &log_ops, TP__DIV, false, 0, SAVE_INPUT,
                    a, out_p, err_p);
}

tp_status
tp_pow(tp_tensor *a, double p, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_pow", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("pow", TP__POW, p, &pow_ops, TP__POW_BW, false, p,
                    SAVE_INPUT, a, out_p, err_p);
}

tp_status
tp_sqrt(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_sqrt", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("sqrt", TP__SQRT, 0, &sqrt_ops, TP__SQRT_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_tanh(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_tanh", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("tanh", TP__TANH, 0, &tanh_ops, TP__TANH_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_sigmoid(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_sigmoid", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("sigmoid", TP__SIGMOID, 0, &sigmoid_ops, TP__SIGMOID_BW,
                    false, 0, SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_relu(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_relu", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return unary_op("relu", TP__RELU, 0, &relu_ops, TP__RELU_BW, false, 0,
                    SAVE_OUTPUT, a, out_p, err_p);
}

tp_status
tp_tensor_axpy(tp_tensor *y, double alpha, tp_tensor *x, tp_error **err_p)
{
    if (y == NULL || x == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_axpy",
                                   y == NULL ? "y" : "x");
    }
    if (y->t_requires_grad && tp_grad_mode_get()) {
        return tp__error_set(err_p, TP_EPERM,
                             "axpy: in-place update of a tensor that "
                             "requires grad while grad mode is on");
    }
    return tp__k_axpy(y, alpha, x, err_p);
}
