/* SPDX-License-Identifier: Apache-2.0 */
/* ag_test_util.h - helpers shared by the autograd tests: random tensors,
 * non-contiguous views, broadcast indexing for references, gradcheck. */
#ifndef TP_AG_TEST_UTIL_H
#define TP_AG_TEST_UTIL_H

#include <math.h>
#include <tpipe/autograd.h>
#include <tpipe/tensor.h>

#include "tp_test.h"

#define AG_LEN(a)    (sizeof(a) / sizeof((a)[0]))
#define AG_MAX(a, b) ((a) > (b) ? (a) : (b))

static tp_generator *ag_gen;

static inline tp_generator *
gen(void)
{
    if (!ag_gen) {
        TP_CHECK_OK(tp_generator_create(20261121, &ag_gen), NULL);
    }
    return ag_gen;
}

static inline double
at(const tp_tensor *t, int64_t i)
{
    double v = NAN;
    TP_CHECK_OK(tp_tensor_item(t, i, &v), NULL);
    return v;
}

static inline int64_t
numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        n *= shape[i];
    }
    return n;
}

// Uniform in [lo, hi), contiguous.
static inline tp_tensor *
rnd(tp_dtype dt, int nd, const int64_t *shape, double lo, double hi)
{
    tp_tensor *t;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_rand(dt, nd, shape, lo, hi, gen(), &t, &err), err);
    return t;
}

// Uniform values in a non-contiguous view of the given shape: the last
// two dims transposed over a dense base when both are > 1, else every
// other element of a dense base (shape + [2] narrowed to [..., 1] and
// reshaped back, a view with stride 2 in the last moving dim). Only
// shapes of at most one element are contiguous.
static inline tp_tensor *
rnd_nc(tp_dtype dt, int nd, const int64_t *shape, double lo, double hi)
{
    tp_tensor *base, *v, *w;
    tp_error *err = NULL;
    if (nd >= 2 && shape[nd - 1] > 1 && shape[nd - 2] > 1) {
        int64_t s[TP_TENSOR_MAX_DIMS];
        memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
        s[nd - 1] = shape[nd - 2];
        s[nd - 2] = shape[nd - 1];
        base = rnd(dt, nd, s, lo, hi);
        TP_CHECK_OK(tp_tensor_transpose(base, -1, -2, &v, &err), err);
        tp_tensor_unref(base);
    } else {
        TP_CHECK(nd < TP_TENSOR_MAX_DIMS);
        int64_t s2[TP_TENSOR_MAX_DIMS];
        memcpy(s2, shape, sizeof(int64_t) * (size_t)nd);
        s2[nd] = 2;
        base = rnd(dt, nd + 1, s2, lo, hi);
        TP_CHECK_OK(tp_tensor_narrow(base, nd, 1, 1, &w, &err), err);
        TP_CHECK_OK(tp_tensor_reshape(w, nd, shape, &v, &err), err);
        TP_CHECK(tp_tensor_shares_storage(v, base));
        tp_tensor_unref(base);
        tp_tensor_unref(w);
    }
    TP_CHECKF(tp_tensor_numel(v) <= 1 || !tp_tensor_is_contiguous(v),
              "rnd_nc: %d-d view is contiguous", nd);
    return v;
}

static inline tp_tensor *
leaf(tp_tensor *t)
{
    TP_CHECK_OK(tp_tensor_set_requires_grad(t, true, NULL), NULL);
    return t;
}

// Row-major index into @in of output element @i of shape @oshape, with
// @in broadcast to it (PyTorch rules).
static inline int64_t
bidx(const tp_tensor *in, int ond, const int64_t *oshape, int64_t i)
{
    int64_t oi[TP_TENSOR_MAX_DIMS];
    for (int d = ond - 1; d >= 0; d--) {
        oi[d] = i % oshape[d];
        i /= oshape[d];
    }
    int nd = tp_tensor_ndim(in), lead = ond - nd;
    const int64_t *s = tp_tensor_shape(in);
    int64_t r = 0;
    for (int d = 0; d < nd; d++) {
        r = r * s[d] + (s[d] == 1 ? 0 : oi[d + lead]);
    }
    return r;
}

static inline void
check_shape(const tp_tensor *t, int nd, const int64_t *shape)
{
    TP_CHECK_EQ(tp_tensor_ndim(t), nd);
    for (int i = 0; i < nd; i++) {
        TP_CHECKF(tp_tensor_shape(t)[i] == shape[i],
                  "dim %d is %lld, want %lld", i,
                  (long long)tp_tensor_shape(t)[i], (long long)shape[i]);
    }
}

static inline void
check_close(double got, double want, double rtol, double atol, const char *what,
            int64_t i)
{
    bool ok = (isnan(want) && isnan(got)) ||
              fabs(got - want) <= atol + rtol * fabs(want);
    TP_CHECKF(ok, "%s: element %lld is %.10g, want %.10g", what, (long long)i,
              got, want);
}

// ---- gradcheck -------------------------------------------------------------

typedef tp_status (*ag_fn)(tp_tensor *const *in, void *ctx, tp_tensor **out,
                           tp_error **err_p);

static inline double
weighted_sum(const tp_tensor *out, const tp_tensor *w)
{
    double s = 0;
    for (int64_t i = 0; i < tp_tensor_numel(out); i++) {
        s += at(out, i) * at(w, i);
    }
    return s;
}

// Compares the gradients tp_backward gives for L = sum(f(in) * W), W
// random, with central differences, for every input that requires grad.
// Inputs should be f64.
static inline void
gradcheck(const char *what, ag_fn f, void *ctx, int nin, tp_tensor *const *in)
{
    tp_tensor *out, *w;
    tp_error *err = NULL;
    for (int i = 0; i < nin; i++) {
        tp_tensor_zero_grad(in[i]);
    }
    TP_CHECK_OK(f(in, ctx, &out, &err), err);
    TP_CHECKF(tp_tensor_requires_grad(out), "%s: output has no grad", what);
    TP_CHECK_OK(tp_tensor_randn(TP_F64, tp_tensor_ndim(out),
                                tp_tensor_shape(out), 0, 1, gen(), &w, &err),
                err);
    TP_CHECK_OK(tp_backward(1, &out, &w, false, &err), err);
    tp_tensor_unref(out);
    const double eps = 1e-6;
    bool prev = tp_grad_mode_set(false);
    for (int i = 0; i < nin; i++) {
        if (!tp_tensor_requires_grad(in[i])) {
            continue;
        }
        tp_tensor *g = tp_tensor_grad(in[i]);
        if (g) {
            check_shape(g, tp_tensor_ndim(in[i]), tp_tensor_shape(in[i]));
        }
        for (int64_t j = 0; j < tp_tensor_numel(in[i]); j++) {
            double v = at(in[i], j), lp, lm;
            tp_tensor *o;
            tp_tensor_set_item(in[i], j, v + eps);
            TP_CHECK_OK(f(in, ctx, &o, &err), err);
            lp = weighted_sum(o, w);
            tp_tensor_unref(o);
            tp_tensor_set_item(in[i], j, v - eps);
            TP_CHECK_OK(f(in, ctx, &o, &err), err);
            lm = weighted_sum(o, w);
            tp_tensor_unref(o);
            tp_tensor_set_item(in[i], j, v);
            double num = (lp - lm) / (2 * eps);
            double ana = g ? at(g, j) : 0.0;
            TP_CHECKF(fabs(num - ana) <= 1e-5 + 1e-4 * fabs(num),
                      "%s: d/d input %d [%lld]: analytic %.9g, numeric %.9g",
                      what, i, (long long)j, ana, num);
        }
    }
    tp_grad_mode_set(prev);
    tp_tensor_unref(w);
}

#endif
