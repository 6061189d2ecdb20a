// SPDX-License-Identifier: Apache-2.0
// ops_reduce.c - differentiable reductions (sum, mean) and matmul; see
// ops.c for how ops record their nodes.

#include <math.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

// ---- reductions ------------------------------------------------------------

// n_i[0]: dim (-1 for all), n_i[1]: keepdim; n_d[0]: scale (1 or 1/N).
TP__BW_FN(sum_bw)
{
    if (!tp__op_needs(n, 0)) {
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
        st = tp__op_record(mean ? &mean_ops : &sum_ops, 1, &a, &o, &n, err_p);
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
tp_sum(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_sum", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return reduce_op("sum", false, a, 0, true, false, out_p, err_p);
}

tp_status
tp_sum_dim(tp_tensor *a, int dim, bool keepdim, tp_tensor **out_p,
           tp_error **err_p)
{
    tp_status ck = null_args("tp_sum_dim", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return reduce_op("sum", false, a, dim, false, keepdim, out_p, err_p);
}

tp_status
tp_mean(tp_tensor *a, tp_tensor **out_p, tp_error **err_p)
{
    tp_status ck = null_args("tp_mean", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return reduce_op("mean", true, a, 0, true, false, out_p, err_p);
}

tp_status
tp_mean_dim(tp_tensor *a, int dim, bool keepdim, tp_tensor **out_p,
            tp_error **err_p)
{
    tp_status ck = null_args("tp_mean_dim", a, "a", NULL, NULL, out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    return reduce_op("mean", true, a, dim, false, keepdim, out_p, err_p);
}

// ---- matmul ----------------------------------------------------------------

static tp_status
transpose_last(const tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    return tp__view_transpose(t, -1, -2, out_p, err_p);
}

TP__BW_FN(matmul_bw)
{
    // C = A B: dA = G B^T, dB = A^T G (summed over broadcast batch dims).
    tp_status st = tp__op_saved_or_fail(n, 0, err_p);
    if (st == TP_OK) {
        st = tp__op_saved_or_fail(n, 1, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *a = n->n_saved[0], *b = n->n_saved[1], *g = gout[0];
    if (tp__op_needs(n, 0)) {
        tp_tensor *bt, *ga;
        st = transpose_last(b, &bt, err_p);
        if (st == TP_OK) {
            st = tp__k_matmul(g, bt, &ga, err_p);
            tp_tensor_unref(bt);
        }
        if (st == TP_OK) {
            st = tp__op_to_input(n, 0, ga, gin, err_p);
        }
    }
    if (st == TP_OK && tp__op_needs(n, 1)) {
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
            st = tp__op_to_input(n, 1, gb, gin, err_p);
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
    tp_status ck = null_args("tp_matmul", a, "a", b, "b", out_p, err_p);
    if (ck != TP_OK) {
        return ck;
    }
    tp_tensor *o, *in[2] = {a, b};
    tp_node *n;
    tp_status st = tp__k_matmul(a, b, &o, err_p);
    if (st == TP_OK) {
        st = tp__op_record(&matmul_ops, 2, in, &o, &n, err_p);
    }
    if (st == TP_OK) {
        st = tp__op_save(n, 0, a, &o, err_p);
    }
    if (st == TP_OK) {
        st = tp__op_save(n, 1, b, &o, err_p);
    }
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}
