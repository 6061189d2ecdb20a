// SPDX-License-Identifier: Apache-2.0
// ops_nn.c - differentiable softmax, losses (mse, nll, cross entropy) and
// embedding; see ops.c for how ops record their nodes.

#include <math.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

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
TP__BW_FN(softmax_bw)
{
    if (!tp__op_needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
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
        st = tp__op_record(log_ ? &log_softmax_ops : &softmax_ops, 1, &a, &o,
                           &n, err_p);
    }
    if (st == TP_OK && n) {
        int d = 0;
        if (a->t_ndim > 0) {
            tp__dim_norm(a->t_ndim, dim, &d);
        }
        n->n_i[0] = d;
        n->n_i[1] = log_;
        st = tp__op_save(n, 0, o, &o, err_p);
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
tp_softmax(tp_tensor *a, int dim, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_softmax", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return softmax_op(a, dim, false, out_p, err_p);
}

tp_status
tp_log_softmax(tp_tensor *a, int dim, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck =
        null_args("tp_log_softmax", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return softmax_op(a, dim, true, out_p, err_p);
}

// ---- losses ----------------------------------------------------------------

static tp_status
scalar_of(const tp_tensor *g, double *v_p)
{
    return tp_tensor_item(g, 0, v_p);
}

// saved[0]: d = a - target; n_d[0]: 1/N.
TP__BW_FN(mse_bw)
{
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
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
    if (tp__op_needs(n, 0)) {
        st = tp__op_to_input(n, 0, tp_tensor_ref(gd), gin, err_p);
    }
    if (st == TP_OK && tp__op_needs(n, 1)) {
        tp_tensor *ng;
        st = tp__k_unary("mse_loss", TP__NEG, gd, 0, &ng, err_p);
        if (st == TP_OK) {
            st = tp__op_to_input(n, 1, ng, gin, err_p);
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
    tp_status ck =
        null_args("tp_mse_loss", a, "a", target, "target", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
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
        st = tp__op_record(&mse_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_d[0] = scale;
        st = tp__op_save(n, 0, d, &o, err_p);
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
TP__BW_FN(nll_bw)
{
    if (!tp__op_needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
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
    tp_status ck =
        null_args("tp_nll_loss", logp, "logp", target, "target", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
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
        st = tp__op_record(&nll_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = N;
        n->n_i[1] = C;
        st = tp__op_save(n, 0, tc, &o, err_p);
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
    tp_status ck = null_args("tp_cross_entropy", logits, "logits", target,
                             "target", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
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
TP__BW_FN(embedding_bw)
{
    if (!tp__op_needs(n, 0)) {
        return TP_OK;
    }
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
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
    tp_status ck = null_args("tp_embedding", weight, "weight", indices,
                             "indices", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
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
    st = tp__op_record(&embedding_ops, 2, in, &o, &n, err_p);
    if (st == TP_OK && n) {
        n->n_i[0] = V;
        n->n_i[1] = D;
        st = tp__op_save(n, 0, ic, &o, err_p);
    }
    tp_tensor_unref(ic);
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}
