// SPDX-License-Identifier: Apache-2.0
// views.c - the public view, copy and conversion functions of tensor.h:
// the raw versions from core/tensor.c plus autograd recording.

#include <string.h>

#include "ag_impl.h"
#include "error.h"
#include "platform.h"

static bool
needs0(const tp_node *n)
{
    return n->n_next[0].e_node != NULL;
}

#define BW_FN(NAME)                                                            \
    static tp_status NAME(tp_node *n, tp_tensor *const *gout, tp_tensor **gin, \
                          tp_error **err_p)

static tp_status
finish(const tp_node_ops *ops, tp_tensor *in, tp_tensor *o, tp_node **node_p,
       tp_tensor **out_p, tp_error **err_p)
{
    *node_p = NULL;
    if (tp__ag_should_record(1, &in)) {
        tp_status st = tp__ag_record(ops, 1, &in, o, node_p, err_p);
        if (st != TP_OK) {
            tp_tensor_unref(o);
            return st;
        }
    }
    *out_p = o;
    return TP_OK;
}

// ---- reshape ---------------------------------------------------------------

BW_FN(reshape_bw)
{
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    if (!needs0(n)) {
        return TP_OK;
    }
    return tp__view_reshape(gout[0], m->m_ndim, m->m_shape, &gin[0], err_p);
}

static const tp_node_ops reshape_ops = {.name = "ReshapeBackward",
                                        .backward = reshape_bw};

tp_status
tp_tensor_reshape(tp_tensor *t, int ndim, const int64_t *shape,
                  tp_tensor **out_p, tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_reshape", "out_p");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__view_reshape(t, ndim, shape, &o, err_p);
    return st != TP_OK ? st : finish(&reshape_ops, t, o, &n, out_p, err_p);
}

// ---- permute / transpose ---------------------------------------------------

// n_i holds the permutation packed 4 bits per dim (8 dims fit in 32).
BW_FN(permute_bw)
{
    if (!needs0(n)) {
        return TP_OK;
    }
    int nd = n->n_next[0].e_meta.m_ndim;
    int inv[TP_TENSOR_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int p = (int)((n->n_i[0] >> (4 * i)) & 0xf);
        inv[p] = i;
    }
    return tp__view_permute(gout[0], inv, &gin[0], err_p);
}

static const tp_node_ops permute_ops = {.name = "PermuteBackward",
                                        .backward = permute_bw};

tp_status
tp_tensor_permute(tp_tensor *t, const int *perm, tp_tensor **out_p,
                  tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_permute", "out_p");
    }
    if (perm == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_permute", "perm");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__view_permute(t, perm, &o, err_p);
    if (st == TP_OK) {
        st = finish(&permute_ops, t, o, &n, out_p, err_p);
    }
    if (st == TP_OK && n) {
        int64_t packed = 0;
        for (int i = 0; i < t->t_ndim; i++) {
            int d;
            tp__dim_norm(t->t_ndim, perm[i], &d);
            packed |= (int64_t)d << (4 * i);
        }
        n->n_i[0] = packed;
    }
    return st;
}

// A transpose is its own inverse: the backward swaps the same two dims
// (n_i[0], n_i[1]) of the gradient.
BW_FN(transpose_bw)
{
    if (!needs0(n)) {
        return TP_OK;
    }
    return tp__view_transpose(gout[0], (int)n->n_i[0], (int)n->n_i[1], &gin[0],
                              err_p);
}

static const tp_node_ops transpose_ops = {.name = "TransposeBackward",
                                          .backward = transpose_bw};

tp_status
tp_tensor_transpose(tp_tensor *t, int d0, int d1, tp_tensor **out_p,
                    tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_transpose", "out_p");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__view_transpose(t, d0, d1, &o, err_p);
    if (st == TP_OK) {
        st = finish(&transpose_ops, t, o, &n, out_p, err_p);
    }
    if (st == TP_OK && n) {
        n->n_i[0] = d0;
        n->n_i[1] = d1;
    }
    return st;
}

// ---- narrow ----------------------------------------------------------------

// n_i[0]: dim, n_i[1]: start.
BW_FN(narrow_bw)
{
    if (!needs0(n)) {
        return TP_OK;
    }
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    tp_tensor *gx, *slice;
    tp_status st =
        tp_tensor_zeros(m->m_dtype, m->m_ndim, m->m_shape, &gx, err_p);
    if (st != TP_OK) {
        return st;
    }
    int d = (int)n->n_i[0];
    st = tp__view_narrow(gx, d, n->n_i[1], gout[0]->t_shape[d], &slice, err_p);
    if (st == TP_OK) {
        st = tp__copy_raw(slice, gout[0], err_p);
        tp_tensor_unref(slice);
    }
    if (st != TP_OK) {
        tp_tensor_unref(gx);
        return st;
    }
    gin[0] = gx;
    return TP_OK;
}

static const tp_node_ops narrow_ops = {.name = "NarrowBackward",
                                       .backward = narrow_bw};

tp_status
tp_tensor_narrow(tp_tensor *t, int d, int64_t start, int64_t len,
                 tp_tensor **out_p, tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_narrow", "out_p");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__view_narrow(t, d, start, len, &o, err_p);
    if (st == TP_OK) {
        st = finish(&narrow_ops, t, o, &n, out_p, err_p);
    }
    if (st == TP_OK && n) {
        int dd;
        tp__dim_norm(t->t_ndim, d, &dd);
        n->n_i[0] = dd;
        n->n_i[1] = start < 0 ? start + t->t_shape[dd] : start;
    }
    return st;
}

// ---- expand ----------------------------------------------------------------

BW_FN(expand_bw)
{
    const tp__shape_meta *m = &n->n_next[0].e_meta;
    if (!needs0(n)) {
        return TP_OK;
    }
    return tp__k_sum_to(gout[0], m->m_ndim, m->m_shape, &gin[0], err_p);
}

static const tp_node_ops expand_ops = {.name = "ExpandBackward",
                                       .backward = expand_bw};

tp_status
tp_tensor_expand(tp_tensor *t, int ndim, const int64_t *shape,
                 tp_tensor **out_p, tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_expand", "out_p");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__view_expand(t, ndim, shape, &o, err_p);
    return st != TP_OK ? st : finish(&expand_ops, t, o, &n, out_p, err_p);
}

// ---- copies ----------------------------------------------------------------

BW_FN(identity_bw)
{
    if (!needs0(n)) {
        return TP_OK;
    }
    return tp__tensor_alias(gout[0], &gin[0], err_p);
}

BW_FN(to_dtype_bw)
{
    if (!needs0(n)) {
        return TP_OK;
    }
    return tp__to_dtype_raw(gout[0], n->n_next[0].e_meta.m_dtype, &gin[0],
                            err_p);
}

static const tp_node_ops clone_ops = {.name = "CloneBackward",
                                      .backward = identity_bw};
static const tp_node_ops to_dtype_ops = {.name = "ToDtypeBackward",
                                         .backward = to_dtype_bw};

tp_status
tp_tensor_contiguous(tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_contiguous", "out_p");
    }
    if (tp_tensor_is_contiguous(t)) {
        *out_p = tp_tensor_ref(t);
        return TP_OK;
    }
    return tp_tensor_clone(t, out_p, err_p);
}

tp_status
tp_tensor_clone(tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_clone", "out_p");
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__clone_raw(t, &o, err_p);
    return st != TP_OK ? st : finish(&clone_ops, t, o, &n, out_p, err_p);
}

tp_status
tp_tensor_to_dtype(tp_tensor *t, tp_dtype dt, tp_tensor **out_p,
                   tp_error **err_p)
{
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_to_dtype", "out_p");
    }
    if ((unsigned)dt >= TP_DTYPE_COUNT) {
        return tp__error_set(err_p, TP_EINVAL, "to_dtype: invalid dtype %d",
                             (int)dt);
    }
    tp_tensor *o;
    tp_node *n;
    tp_status st = tp__to_dtype_raw(t, dt, &o, err_p);
    if (st != TP_OK) {
        return st;
    }
    // Gradients flow only between floating dtypes.
    if (!tp_dtype_is_floating(dt)) {
        *out_p = o;
        return TP_OK;
    }
    return finish(&to_dtype_ops, t, o, &n, out_p, err_p);
}

tp_status
tp_tensor_copy(tp_tensor *dst, const tp_tensor *src, tp_error **err_p)
{
    if (dst == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_copy", "dst");
    }
    if (src == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_copy", "src");
    }
    if (dst->t_requires_grad && tp_grad_mode_get()) {
        return tp__error_set(err_p, TP_EPERM,
                             "copy: in-place write to a tensor that requires "
                             "grad while grad mode is on");
    }
    return tp__copy_raw(dst, src, err_p);
}
