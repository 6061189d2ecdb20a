// SPDX-License-Identifier: Apache-2.0
// autograd_ops_test.c - every op: forward against a float64 reference
// computed here, and backward against central differences (gradcheck) on
// random inputs: several shapes, broadcasting, non-contiguous views and
// zero-size dims.

#include "ag_leak.h"
#include "ag_test_util.h"
#include "autograd/ag_impl.h" // tp__gemm_force_fallback

#include <pthread.h>

// ---- elementwise -----------------------------------------------------------

typedef tp_status (*op2_fn)(tp_tensor *, tp_tensor *, tp_tensor **,
                            tp_error **);
typedef tp_status (*op1_fn)(tp_tensor *, tp_tensor **, tp_error **);

static double
r_add(double x, double y)
{
    return x + y;
}
static double
r_sub(double x, double y)
{
    return x - y;
}
static double
r_mul(double x, double y)
{
    return x * y;
}
static double
r_div(double x, double y)
{
    return x / y;
}

static const struct bin_case {
    const char *name;
    op2_fn op;
    double (*ref)(double, double);
} bin_cases[] = {
    {"add", tp_add, r_add},
    {"sub", tp_sub, r_sub},
    {"mul", tp_mul, r_mul},
    {"div", tp_div, r_div},
};

// Shape pairs: same, trailing broadcast, both sides broadcast, 0-d,
// zero-size.
static const struct shape_pair {
    int na, nb;
    int64_t a[3], b[3];
} pairs[] = {
    {2, 2, {3, 4}, {3, 4}}, {2, 1, {3, 4}, {4}}, {3, 2, {2, 1, 4}, {3, 1}},
    {0, 2, {0}, {2, 3}},    {2, 1, {0, 4}, {4}}, {1, 3, {1}, {2, 0, 1}},
};

static void
t_binary_forward(void)
{
    for (size_t c = 0; c < AG_LEN(bin_cases); c++) {
        for (size_t p = 0; p < AG_LEN(pairs); p++) {
            for (int nc = 0; nc < 2; nc++) {
                const struct shape_pair *sp = &pairs[p];
                tp_tensor *a = nc ? rnd_nc(TP_F32, sp->na, sp->a, 0.5, 2)
                                  : rnd(TP_F32, sp->na, sp->a, 0.5, 2);
                tp_tensor *b = rnd(TP_F32, sp->nb, sp->b, 0.5, 2), *o;
                tp_error *err = NULL;
                TP_CHECK_OK(bin_cases[c].op(a, b, &o, &err), err);
                int ond = tp_tensor_ndim(o);
                const int64_t *os = tp_tensor_shape(o);
                TP_CHECK_EQ(ond, AG_MAX(sp->na, sp->nb));
                for (int64_t i = 0; i < tp_tensor_numel(o); i++) {
                    double want = bin_cases[c].ref(at(a, bidx(a, ond, os, i)),
                                                   at(b, bidx(b, ond, os, i)));
                    check_close(at(o, i), (float)want, 1e-6, 0,
                                bin_cases[c].name, i);
                }
                tp_tensor_unref(a);
                tp_tensor_unref(b);
                tp_tensor_unref(o);
            }
        }
    }
}

static tp_status
f_bin(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return ((const struct bin_case *)ctx)->op(in[0], in[1], out, err_p);
}

static void
t_binary_gradcheck(void)
{
    for (size_t c = 0; c < AG_LEN(bin_cases); c++) {
        for (size_t p = 0; p < AG_LEN(pairs); p++) {
            for (int nc = 0; nc < 2; nc++) {
                const struct shape_pair *sp = &pairs[p];
                tp_tensor *in[2];
                in[0] = leaf(nc ? rnd_nc(TP_F64, sp->na, sp->a, 0.5, 2)
                                : rnd(TP_F64, sp->na, sp->a, 0.5, 2));
                in[1] = leaf(rnd(TP_F64, sp->nb, sp->b, 0.5, 2));
                gradcheck(bin_cases[c].name, f_bin, (void *)&bin_cases[c], 2,
                          in);
                tp_tensor_unref(in[0]);
                tp_tensor_unref(in[1]);
            }
        }
    }
    // The same tensor on both sides: gradients from both uses add up.
    int64_t s[1] = {5};
    tp_tensor *x = leaf(rnd(TP_F64, 1, s, 0.5, 2)), *in[2] = {x, x};
    gradcheck("mul(x, x)", f_bin, (void *)&bin_cases[2], 2, in);
    // And by value: d sum(x * x) / dx = 2x.
    tp_tensor *o, *l;
    tp_tensor_zero_grad(x);
    TP_CHECK_OK(tp_mul(x, x, &o, NULL), NULL);
    TP_CHECK_OK(tp_sum(o, &l, NULL), NULL);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
    TP_CHECK(tp_tensor_grad(x) != NULL);
    for (int i = 0; i < 5; i++) {
        check_close(at(tp_tensor_grad(x), i), 2 * at(x, i), 1e-15, 0,
                    "mul(x, x) grad", i);
    }
    tp_tensor_unref(l);
    tp_tensor_unref(o);
    tp_tensor_unref(x);
}

static tp_status
u_add_scalar(tp_tensor *a, tp_tensor **o, tp_error **e)
{
    return tp_add_scalar(a, 1.5, o, e);
}
static tp_status
u_mul_scalar(tp_tensor *a, tp_tensor **o, tp_error **e)
{
    return tp_mul_scalar(a, -2.5, o, e);
}
static tp_status
u_pow(tp_tensor *a, tp_tensor **o, tp_error **e)
{
    return tp_pow(a, 2.5, o, e);
}
static tp_status
u_pow_neg(tp_tensor *a, tp_tensor **o, tp_error **e)
{
    return tp_pow(a, -1.5, o, e);
}
static double
r_add_scalar(double x)
{
    return x + 1.5;
}
static double
r_mul_scalar(double x)
{
    return x * -2.5;
}
static double
r_neg(double x)
{
    return -x;
}
static double
r_pow(double x)
{
    return pow(x, 2.5);
}
static double
r_pow_neg(double x)
{
    return pow(x, -1.5);
}
static double
r_sigmoid(double x)
{
    return 1 / (1 + exp(-x));
}
static double
r_relu(double x)
{
    return x > 0 ? x : 0;
}

static const struct un_case {
    const char *name;
    op1_fn op;
    double (*ref)(double);
    double lo, hi;
} un_cases[] = {
    {"neg", tp_neg, r_neg, -2, 2},
    {"exp", tp_exp, exp, -2, 2},
    {"log", tp_log, log, 0.2, 3},
    {"pow", u_pow, r_pow, 0.2, 3},
    {"pow_neg", u_pow_neg, r_pow_neg, 0.5, 3},
    {"sqrt", tp_sqrt, sqrt, 0.2, 3},
    {"tanh", tp_tanh, tanh, -2, 2},
    {"sigmoid", tp_sigmoid, r_sigmoid, -3, 3},
    {"relu", tp_relu, r_relu, -2, 2},
    {"add_scalar", u_add_scalar, r_add_scalar, -2, 2},
    {"mul_scalar", u_mul_scalar, r_mul_scalar, -2, 2},
};

static const struct shape1 {
    int nd;
    int64_t s[3];
} shapes1[] = {
    {2, {3, 4}}, {1, {7}}, {3, {2, 3, 2}}, {0, {0}}, {2, {0, 3}},
};

static void
t_unary_forward(void)
{
    for (size_t c = 0; c < AG_LEN(un_cases); c++) {
        for (size_t s = 0; s < AG_LEN(shapes1); s++) {
            for (int nc = 0; nc < 2; nc++) {
                const struct un_case *u = &un_cases[c];
                const struct shape1 *sh = &shapes1[s];
                tp_tensor *a = nc ? rnd_nc(TP_F32, sh->nd, sh->s, u->lo, u->hi)
                                  : rnd(TP_F32, sh->nd, sh->s, u->lo, u->hi);
                tp_tensor *o;
                tp_error *err = NULL;
                TP_CHECK_OK(u->op(a, &o, &err), err);
                check_shape(o, sh->nd, sh->s);
                for (int64_t i = 0; i < tp_tensor_numel(o); i++) {
                    check_close(at(o, i), u->ref(at(a, i)), 2e-6, 1e-7, u->name,
                                i);
                }
                tp_tensor_unref(a);
                tp_tensor_unref(o);
            }
        }
    }
}

static tp_status
f_un(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return ((const struct un_case *)ctx)->op(in[0], out, err_p);
}

static void
t_unary_gradcheck(void)
{
    for (size_t c = 0; c < AG_LEN(un_cases); c++) {
        for (size_t s = 0; s < AG_LEN(shapes1); s++) {
            for (int nc = 0; nc < 2; nc++) {
                const struct un_case *u = &un_cases[c];
                const struct shape1 *sh = &shapes1[s];
                tp_tensor *in =
                    leaf(nc ? rnd_nc(TP_F64, sh->nd, sh->s, u->lo, u->hi)
                            : rnd(TP_F64, sh->nd, sh->s, u->lo, u->hi));
                gradcheck(u->name, f_un, (void *)u, 1, &in);
                tp_tensor_unref(in);
            }
        }
    }
}

static void
t_dtype_errors(void)
{
    int64_t s[1] = {3};
    tp_tensor *a, *b, *o = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_I32, 1, s, &a, NULL), NULL);
    TP_CHECK_EQ(tp_exp(a, &o, &err), TP_ENOTSUP);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "exp: dtype i32");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 1, s, &b, NULL), NULL);
    tp_tensor_unref(a);
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s, &a, NULL), NULL);
    TP_CHECK_EQ(tp_add(a, b, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "dtypes f64 and f32");
    tp_error_unref(err);
    err = NULL;
    int64_t s4[1] = {4};
    tp_tensor_unref(b);
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s4, &b, NULL), NULL);
    TP_CHECK_EQ(tp_mul(a, b, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "mul: shapes [3] and [4] do not broadcast");
    tp_error_unref(err);
    TP_CHECK(o == NULL);
    TP_CHECK_OK(tp_tensor_set_requires_grad(a, false, NULL), NULL);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// ---- reductions ------------------------------------------------------------

struct red_ctx {
    bool mean, all, keepdim;
    int dim;
};

static tp_status
f_red(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    const struct red_ctx *r = ctx;
    if (r->all) {
        return r->mean ? tp_mean(in[0], out, err_p) : tp_sum(in[0], out, err_p);
    }
    return r->mean ? tp_mean_dim(in[0], r->dim, r->keepdim, out, err_p)
                   : tp_sum_dim(in[0], r->dim, r->keepdim, out, err_p);
}

// Reference: reduce @a over dim @d (or all) in float64.
static void
check_reduction(const tp_tensor *a, const struct red_ctx *r, const tp_tensor *o)
{
    int nd = tp_tensor_ndim(a);
    const int64_t *s = tp_tensor_shape(a);
    int64_t n = tp_tensor_numel(a);
    if (r->all) {
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += at(a, i);
        }
        TP_CHECK_EQ(tp_tensor_ndim(o), 0);
        check_close(at(o, 0), r->mean ? sum / (double)n : sum, 1e-5, 1e-6,
                    "reduce all", 0);
        return;
    }
    int d = r->dim < 0 ? r->dim + nd : r->dim;
    int64_t outer = numel_of(d, s), len = s[d];
    int64_t inner = numel_of(nd - d - 1, s + d + 1);
    TP_CHECK_EQ(tp_tensor_ndim(o), r->keepdim ? nd : nd - 1);
    TP_CHECK_EQ(tp_tensor_numel(o), outer * inner);
    for (int64_t o1 = 0; o1 < outer; o1++) {
        for (int64_t i1 = 0; i1 < inner; i1++) {
            double sum = 0;
            for (int64_t k = 0; k < len; k++) {
                sum += at(a, (o1 * len + k) * inner + i1);
            }
            double want = r->mean ? sum / (double)len : sum;
            check_close(at(o, o1 * inner + i1), want, 1e-5, 1e-6, "reduce",
                        o1 * inner + i1);
        }
    }
}

static void
t_reductions(void)
{
    static const struct shape1 shapes[] = {
        {3, {3, 4, 2}}, {2, {5, 3}}, {1, {6}}, {2, {0, 3}}, {0, {0}},
    };
    for (size_t s = 0; s < AG_LEN(shapes); s++) {
        const struct shape1 *sh = &shapes[s];
        for (int mean = 0; mean < 2; mean++) {
            for (int d = -1; d <= sh->nd; d++) {
                // d == sh->nd stands for "all".
                for (int keep = 0; keep < 2; keep++) {
                    struct red_ctx r = {mean, d == sh->nd, keep, d};
                    if (sh->nd == 0 && !r.all) {
                        continue;
                    }
                    for (int nc = 0; nc < 2; nc++) {
                        tp_tensor *a = nc ? rnd_nc(TP_F32, sh->nd, sh->s, -1, 1)
                                          : rnd(TP_F32, sh->nd, sh->s, -1, 1);
                        tp_tensor *o, *in;
                        tp_error *err = NULL;
                        TP_CHECK_OK(f_red(&a, &r, &o, &err), err);
                        check_reduction(a, &r, o);
                        tp_tensor_unref(o);
                        tp_tensor_unref(a);
                        in = leaf(nc ? rnd_nc(TP_F64, sh->nd, sh->s, -1, 1)
                                     : rnd(TP_F64, sh->nd, sh->s, -1, 1));
                        gradcheck(mean ? "mean" : "sum", f_red, &r, 1, &in);
                        tp_tensor_unref(in);
                    }
                }
            }
        }
    }
    int64_t s2[2] = {2, 3};
    tp_tensor *a = rnd(TP_F32, 2, s2, 0, 1), *o;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_sum_dim(a, 2, false, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "sum: dim 2 out of range");
    tp_error_unref(err);
    tp_tensor_unref(a);
}

// ---- matmul ----------------------------------------------------------------

static const struct mm_case {
    int na, nb;
    int64_t a[3], b[3];
    bool nca, ncb;
} mm_cases[] = {
    {2, 2, {3, 4}, {4, 5}, false, false},
    {2, 2, {3, 4}, {4, 5}, true, true},
    {2, 2, {1, 6}, {6, 1}, false, false},
    {3, 2, {2, 3, 4}, {4, 5}, false, false},
    {3, 2, {2, 3, 4}, {4, 5}, true, false},
    {3, 3, {2, 3, 4}, {2, 4, 2}, false, true},
    {3, 3, {1, 3, 4}, {2, 4, 2}, false, false},
    {2, 3, {3, 4}, {2, 4, 2}, false, false},
    {2, 2, {0, 4}, {4, 3}, false, false},
    {2, 2, {3, 0}, {0, 2}, false, false},
    {3, 2, {2, 2, 37}, {37, 19}, false, false}, // odd sizes: kernel edges
    // Batched x shared 2-D with k = 0 and n = 0 (B's gradient folds A's
    // batch into rows).
    {3, 2, {2, 3, 0}, {0, 5}, false, false},
    {3, 2, {2, 3, 4}, {4, 0}, false, false},
    {3, 2, {2, 3, 4}, {4, 0}, true, false},
};

// float64 reference of one output element.
static double
mm_ref(const tp_tensor *a, const tp_tensor *b, const tp_tensor *o, int64_t i)
{
    int ond = tp_tensor_ndim(o);
    const int64_t *os = tp_tensor_shape(o);
    int64_t n = os[ond - 1], m = os[ond - 2];
    int64_t k = tp_tensor_shape(a)[tp_tensor_ndim(a) - 1];
    int64_t col = i % n, row = (i / n) % m, batch = i / (m * n);
    // Batch index broadcast into a and b by their own batch shapes.
    int bnd = ond - 2;
    int64_t bi[TP_TENSOR_MAX_DIMS];
    for (int d = bnd - 1; d >= 0; d--) {
        bi[d] = batch % os[d];
        batch /= os[d];
    }
    const tp_tensor *ops[2] = {a, b};
    int64_t base[2];
    for (int t = 0; t < 2; t++) {
        int nd = tp_tensor_ndim(ops[t]);
        const int64_t *s = tp_tensor_shape(ops[t]);
        int64_t lin = 0;
        for (int d = 0; d < nd - 2; d++) {
            lin = lin * s[d] + (s[d] == 1 ? 0 : bi[d + bnd - (nd - 2)]);
        }
        base[t] = lin * s[nd - 2] * s[nd - 1];
    }
    double sum = 0;
    for (int64_t p = 0; p < k; p++) {
        sum += at(a, base[0] + row * k + p) * at(b, base[1] + p * n + col);
    }
    return sum;
}

static tp_status
f_mm(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return tp_matmul(in[0], in[1], out, err_p);
}

static void
t_matmul(void)
{
    for (size_t c = 0; c < AG_LEN(mm_cases); c++) {
        const struct mm_case *mc = &mm_cases[c];
        for (int dt = 0; dt < 2; dt++) {
            tp_dtype t = dt ? TP_F64 : TP_F32;
            tp_tensor *a = mc->nca ? rnd_nc(t, mc->na, mc->a, -1, 1)
                                   : rnd(t, mc->na, mc->a, -1, 1);
            tp_tensor *b = mc->ncb ? rnd_nc(t, mc->nb, mc->b, -1, 1)
                                   : rnd(t, mc->nb, mc->b, -1, 1);
            tp_tensor *o, *in[2];
            tp_error *err = NULL;
            TP_CHECK_OK(tp_matmul(a, b, &o, &err), err);
            for (int64_t i = 0; i < tp_tensor_numel(o); i++) {
                check_close(at(o, i), mm_ref(a, b, o, i), dt ? 1e-12 : 1e-5,
                            1e-6, "matmul", i);
            }
            if (dt) {
                in[0] = leaf(a);
                in[1] = leaf(b);
                gradcheck("matmul", f_mm, NULL, 2, in);
            }
            tp_tensor_unref(o);
            tp_tensor_unref(a);
            tp_tensor_unref(b);
        }
    }
    int64_t s1[2] = {2, 3}, s2[2] = {4, 2};
    tp_tensor *a = rnd(TP_F32, 2, s1, 0, 1), *b = rnd(TP_F32, 2, s2, 0, 1), *o;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_matmul(a, b, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "matmul: cannot multiply");
    tp_error_unref(err);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// A large product checked at sampled entries: this exercises full blocks
// of both the BLAS and the blocked path.
static void
t_matmul_large(void)
{
    int64_t sa[2] = {300, 270}, sb[2] = {270, 1100};
    tp_tensor *a = rnd(TP_F32, 2, sa, -1, 1), *b = rnd(TP_F32, 2, sb, -1, 1);
    tp_tensor *o;
    TP_CHECK_OK(tp_matmul(a, b, &o, NULL), NULL);
    for (int64_t i = 0; i < tp_tensor_numel(o); i += 997) {
        check_close(at(o, i), mm_ref(a, b, o, i), 1e-4, 1e-4, "matmul", i);
    }
    tp_tensor_unref(o);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// The same cases through the blocked kernel when BLAS is built in (with
// BLAS absent, they already ran through it).
static void
t_matmul_fallback(void)
{
    if (!tp__gemm_have_blas()) {
        tp_test_skip("built without BLAS: t_matmul covered the fallback");
    }
    tp__gemm_force_fallback(true);
    t_matmul();
    t_matmul_large();
    tp__gemm_force_fallback(false);
}

struct par_worker {
    tp_tensor *a, *b;
    int bad;
};

static void *
par_worker_main(void *arg)
{
    struct par_worker *w = arg;
    for (int it = 0; it < 20; it++) {
        tp_tensor *o;
        TP_CHECK_OK(tp_add(w->a, w->b, &o, NULL), NULL);
        const float *pa = tp_tensor_data(w->a), *pb = tp_tensor_data(w->b);
        const float *po = tp_tensor_data(o);
        for (int64_t i = 0; i < tp_tensor_numel(o); i += 101) {
            w->bad += po[i] != pa[i] + pb[i];
        }
        tp_tensor_unref(o);
    }
    return NULL;
}

// With compute threads, large elementwise ops and the blocked gemm split
// their work; results must match the serial ones exactly.
static void
t_compute_threads(void)
{
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_compute_threads_get(), 1);
    TP_CHECK_EQ(tp_compute_threads_set(0, &err), TP_EINVAL);
    tp_error_unref(err);
    int64_t s[2] = {700, 1000}, r[1] = {1000}, ms[2] = {300, 200};
    tp_tensor *a = rnd(TP_F32, 2, s, -1, 1), *b = rnd(TP_F32, 1, r, -1, 1);
    tp_tensor *ma = rnd(TP_F32, 2, ms, -1, 1), *mb;
    TP_CHECK_OK(tp_tensor_transpose(ma, 0, 1, &mb, NULL), NULL);
    tp_tensor *serial[4], *par[4];
    tp__gemm_force_fallback(true);
    for (int pass = 0; pass < 2; pass++) {
        tp_tensor **out = pass ? par : serial;
        if (pass) {
            TP_CHECK_OK(tp_compute_threads_set(3, &err), err);
            TP_CHECK_EQ(tp_compute_threads_get(), 3);
        }
        TP_CHECK_OK(tp_mul(a, b, &out[0], NULL), NULL); // broadcast rows
        TP_CHECK_OK(tp_exp(a, &out[1], NULL), NULL);    // one dense row
        TP_CHECK_OK(tp_matmul(ma, mb, &out[2], NULL), NULL);
        tp_tensor *at;
        TP_CHECK_OK(tp_tensor_transpose(a, 0, 1, &at, NULL), NULL);
        TP_CHECK_OK(tp_sigmoid(at, &out[3], NULL), NULL); // strided
        tp_tensor_unref(at);
    }
    tp__gemm_force_fallback(false);
    for (int i = 0; i < 4; i++) {
        TP_CHECK_EQ(tp_tensor_numel(serial[i]), tp_tensor_numel(par[i]));
        TP_CHECKF(memcmp(tp_tensor_data(serial[i]), tp_tensor_data(par[i]),
                         tp_tensor_nbytes(par[i])) == 0,
                  "result %d differs with threads", i);
        tp_tensor_unref(serial[i]);
        tp_tensor_unref(par[i]);
    }
    // Ops on several threads at once share the workers safely.
    int64_t big[1] = {1 << 19};
    struct par_worker pw[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        pw[i].a = rnd(TP_F32, 1, big, -1, 1);
        pw[i].b = rnd(TP_F32, 1, big, -1, 1);
        pw[i].bad = 0;
        TP_CHECK(pthread_create(&th[i], NULL, par_worker_main, &pw[i]) == 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        TP_CHECK_EQ(pw[i].bad, 0);
        tp_tensor_unref(pw[i].a);
        tp_tensor_unref(pw[i].b);
    }
    TP_CHECK_OK(tp_compute_threads_set(1, NULL), NULL);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(ma);
    tp_tensor_unref(mb);
}

// ---- views -----------------------------------------------------------------

struct view_ctx {
    int kind;
};

static tp_status
f_view(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    int kind = ((const struct view_ctx *)ctx)->kind;
    int64_t rs[3] = {2, -1, 2}, es[3] = {2, 3, 4};
    int perm[3] = {1, 2, 0};
    tp_tensor *v, *w;
    tp_status st;
    switch (kind) {
    case 0:
        return tp_tensor_reshape(in[0], 3, rs, out, err_p);
    case 1:
        return tp_tensor_transpose(in[0], 0, 1, out, err_p);
    case 2:
        // [3, 4] -> [3, 4, 1] -> permute -> [4, 1, 3]
        es[0] = 3;
        es[1] = 4;
        es[2] = 1;
        st = tp_tensor_reshape(in[0], 3, es, &v, err_p);
        if (st != TP_OK) {
            return st;
        }
        st = tp_tensor_permute(v, perm, out, err_p);
        tp_tensor_unref(v);
        return st;
    case 3:
        return tp_tensor_narrow(in[0], 1, 1, 2, out, err_p);
    case 4:
        // [3, 4] narrowed to [3, 1], expanded to [2, 3, 4]
        st = tp_tensor_narrow(in[0], 1, 2, 1, &v, err_p);
        if (st != TP_OK) {
            return st;
        }
        st = tp_tensor_expand(v, 3, es, out, err_p);
        tp_tensor_unref(v);
        return st;
    case 5:
        st = tp_tensor_transpose(in[0], 0, 1, &v, err_p);
        if (st != TP_OK) {
            return st;
        }
        st = tp_tensor_contiguous(v, &w, err_p);
        tp_tensor_unref(v);
        if (st != TP_OK) {
            return st;
        }
        // Multiply so the clone's gradient path is not the identity alone.
        st = tp_mul(w, w, out, err_p);
        tp_tensor_unref(w);
        return st;
    case 7:
        // A zero-size narrow: [3, 0].
        return tp_tensor_narrow(in[0], 1, 2, 0, out, err_p);
    case 8:
        // [3, 4] narrowed to [3, 1], expanded to [0, 3, 4].
        st = tp_tensor_narrow(in[0], 1, 2, 1, &v, err_p);
        if (st != TP_OK) {
            return st;
        }
        es[0] = 0;
        st = tp_tensor_expand(v, 3, es, out, err_p);
        tp_tensor_unref(v);
        return st;
    default:
        st = tp_tensor_to_dtype(in[0], TP_F32, &v, err_p);
        if (st != TP_OK) {
            return st;
        }
        st = tp_tensor_to_dtype(v, TP_F64, out, err_p);
        tp_tensor_unref(v);
        return st;
    }
}

static void
t_view_gradcheck(void)
{
    int64_t s[2] = {3, 4};
    for (int kind = 0; kind < 9; kind++) {
        for (int nc = 0; nc < 2; nc++) {
            struct view_ctx vc = {kind};
            tp_tensor *in = leaf(nc ? rnd_nc(TP_F64, 2, s, -1, 1)
                                    : rnd(TP_F64, 2, s, -1, 1));
            if (kind == 6) {
                // Through f32 and back: check the gradient is routed and
                // converted, with a float-sized tolerance via exact values.
                tp_tensor *o, *g;
                TP_CHECK_OK(f_view(&in, &vc, &o, NULL), NULL);
                g = rnd(TP_F64, 2, s, -1, 1);
                TP_CHECK_OK(tp_backward(1, &o, &g, false, NULL), NULL);
                TP_CHECK_EQ(tp_tensor_dtype(tp_tensor_grad(in)), TP_F64);
                check_shape(tp_tensor_grad(in), 2, s);
                for (int i = 0; i < 12; i++) {
                    TP_CHECK(at(tp_tensor_grad(in), i) ==
                             (double)(float)at(g, i));
                }
                tp_tensor_unref(o);
                tp_tensor_unref(g);
            } else {
                gradcheck("view", f_view, &vc, 1, &in);
            }
            tp_tensor_unref(in);
        }
    }
}

// ---- softmax ---------------------------------------------------------------

struct sm_ctx {
    int dim;
    bool log;
};

static tp_status
f_sm(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    const struct sm_ctx *c = ctx;
    return c->log ? tp_log_softmax(in[0], c->dim, out, err_p)
                  : tp_softmax(in[0], c->dim, out, err_p);
}

static void
t_softmax(void)
{
    static const struct shape1 shapes[] = {
        {2, {3, 5}},
        {3, {2, 3, 4}},
        {1, {6}},
        {2, {0, 4}},
    };
    for (size_t s = 0; s < AG_LEN(shapes); s++) {
        const struct shape1 *sh = &shapes[s];
        for (int d = -1; d < sh->nd; d++) {
            for (int lg = 0; lg < 2; lg++) {
                for (int nc = 0; nc < 2; nc++) {
                    struct sm_ctx c = {d, lg};
                    // Large offsets check the max subtraction.
                    tp_tensor *a = nc ? rnd_nc(TP_F32, sh->nd, sh->s, 80, 90)
                                      : rnd(TP_F32, sh->nd, sh->s, 80, 90);
                    tp_tensor *o, *in;
                    TP_CHECK_OK(f_sm(&a, &c, &o, NULL), NULL);
                    int dd = d < 0 ? d + sh->nd : d;
                    int64_t outer = numel_of(dd, sh->s), len = sh->s[dd];
                    int64_t inner = numel_of(sh->nd - dd - 1, sh->s + dd + 1);
                    for (int64_t o1 = 0; o1 < outer; o1++) {
                        for (int64_t i1 = 0; i1 < inner; i1++) {
                            double mx = -INFINITY, sum = 0;
                            for (int64_t k = 0; k < len; k++) {
                                mx = fmax(mx,
                                          at(a, (o1 * len + k) * inner + i1));
                            }
                            for (int64_t k = 0; k < len; k++) {
                                sum += exp(at(a, (o1 * len + k) * inner + i1) -
                                           mx);
                            }
                            for (int64_t k = 0; k < len; k++) {
                                int64_t idx = (o1 * len + k) * inner + i1;
                                double x = at(a, idx) - mx;
                                double want = lg ? x - log(sum) : exp(x) / sum;
                                check_close(at(o, idx), want, 1e-5, 1e-6,
                                            lg ? "log_softmax" : "softmax",
                                            idx);
                            }
                        }
                    }
                    tp_tensor_unref(o);
                    tp_tensor_unref(a);
                    in = leaf(nc ? rnd_nc(TP_F64, sh->nd, sh->s, -2, 2)
                                 : rnd(TP_F64, sh->nd, sh->s, -2, 2));
                    gradcheck(lg ? "log_softmax" : "softmax", f_sm, &c, 1, &in);
                    tp_tensor_unref(in);
                }
            }
        }
    }
}

// ---- losses and embedding --------------------------------------------------

static tp_status
f_mse(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return tp_mse_loss(in[0], in[1], out, err_p);
}

static void
t_mse_loss(void)
{
    static const struct shape_pair ps[] = {
        {2, 2, {4, 3}, {4, 3}},
        {2, 1, {4, 3}, {3}},
        {1, 1, {1}, {5}},
    };
    for (size_t p = 0; p < AG_LEN(ps); p++) {
        tp_tensor *a = rnd(TP_F32, ps[p].na, ps[p].a, -1, 1);
        tp_tensor *b = rnd(TP_F32, ps[p].nb, ps[p].b, -1, 1), *o, *in[2];
        TP_CHECK_OK(tp_mse_loss(a, b, &o, NULL), NULL);
        int nd = AG_MAX(ps[p].na, ps[p].nb);
        int64_t os[3];
        for (int d = 0; d < nd; d++) {
            int ia = d - (nd - ps[p].na), ib = d - (nd - ps[p].nb);
            int64_t x = ia >= 0 ? ps[p].a[ia] : 1;
            int64_t y = ib >= 0 ? ps[p].b[ib] : 1;
            os[d] = x == 1 ? y : x;
        }
        double sum = 0;
        int64_t n = numel_of(nd, os);
        for (int64_t i = 0; i < n; i++) {
            double d = at(a, bidx(a, nd, os, i)) - at(b, bidx(b, nd, os, i));
            sum += d * d;
        }
        check_close(at(o, 0), sum / (double)n, 1e-5, 1e-7, "mse", 0);
        tp_tensor_unref(o);
        tp_tensor_unref(a);
        tp_tensor_unref(b);
        for (int nc = 0; nc < 2; nc++) {
            in[0] = leaf(nc ? rnd_nc(TP_F64, ps[p].na, ps[p].a, -1, 1)
                            : rnd(TP_F64, ps[p].na, ps[p].a, -1, 1));
            in[1] = leaf(rnd(TP_F64, ps[p].nb, ps[p].b, -1, 1));
            gradcheck("mse_loss", f_mse, NULL, 2, in);
            tp_tensor_unref(in[0]);
            tp_tensor_unref(in[1]);
        }
    }
    // Zero-size: the loss is nan (a mean of nothing); backward gives
    // empty gradients.
    int64_t z[2] = {0, 3};
    tp_tensor *in[2] = {leaf(rnd(TP_F64, 2, z, -1, 1)),
                        leaf(rnd(TP_F64, 2, z, -1, 1))};
    tp_tensor *o;
    TP_CHECK_OK(tp_mse_loss(in[0], in[1], &o, NULL), NULL);
    TP_CHECK(isnan(at(o, 0)));
    TP_CHECK_OK(tp_backward(1, &o, NULL, false, NULL), NULL);
    for (int i = 0; i < 2; i++) {
        TP_CHECK(tp_tensor_grad(in[i]) != NULL);
        check_shape(tp_tensor_grad(in[i]), 2, z);
    }
    tp_tensor_unref(o);
    tp_tensor_unref(in[0]);
    tp_tensor_unref(in[1]);
}

static tp_tensor *
targets(tp_dtype dt, int64_t n, int64_t classes)
{
    tp_tensor *t;
    TP_CHECK_OK(tp_tensor_empty(dt, 1, &n, &t, NULL), NULL);
    for (int64_t i = 0; i < n; i++) {
        tp_tensor_set_item(t, i, (double)((i * 7 + 3) % classes));
    }
    return t;
}

static tp_status
f_nll(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return tp_nll_loss(in[0], in[1], out, err_p);
}

static tp_status
f_ce(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return tp_cross_entropy(in[0], in[1], out, err_p);
}

static void
t_nll_cross_entropy(void)
{
    int64_t s[2] = {6, 4};
    for (int dt = 0; dt < 2; dt++) {
        tp_tensor *x = rnd(TP_F32, 2, s, -2, 2);
        tp_tensor *t = targets(dt ? TP_I64 : TP_I32, 6, 4), *o1, *o2;
        TP_CHECK_OK(tp_nll_loss(x, t, &o1, NULL), NULL);
        TP_CHECK_OK(tp_cross_entropy(x, t, &o2, NULL), NULL);
        double nll = 0, ce = 0;
        for (int64_t i = 0; i < 6; i++) {
            int64_t c = (int64_t)at(t, i);
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < 4; j++) {
                mx = fmax(mx, at(x, i * 4 + j));
            }
            for (int64_t j = 0; j < 4; j++) {
                sum += exp(at(x, i * 4 + j) - mx);
            }
            nll -= at(x, i * 4 + c);
            ce -= at(x, i * 4 + c) - mx - log(sum);
        }
        check_close(at(o1, 0), nll / 6, 1e-6, 1e-7, "nll_loss", 0);
        check_close(at(o2, 0), ce / 6, 1e-5, 1e-7, "cross_entropy", 0);
        tp_tensor_unref(o1);
        tp_tensor_unref(o2);
        tp_tensor_unref(x);
        tp_tensor *in[2] = {leaf(rnd(TP_F64, 2, s, -2, 2)), t};
        gradcheck("nll_loss", f_nll, NULL, 2, in);
        gradcheck("cross_entropy", f_ce, NULL, 2, in);
        tp_tensor_unref(in[0]);
        tp_tensor_unref(t);
    }
    // Out-of-range targets are errors, not crashes.
    tp_tensor *x = rnd(TP_F32, 2, s, -2, 2), *t = targets(TP_I64, 6, 4), *o;
    tp_error *err = NULL;
    tp_tensor_set_item(t, 3, 4);
    TP_CHECK_EQ(tp_nll_loss(x, t, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "target 4 of sample 3");
    tp_error_unref(err);
    tp_tensor_set_item(t, 3, -1);
    TP_CHECK_EQ(tp_cross_entropy(x, t, &o, NULL), TP_EINVAL);
    tp_tensor_unref(t);
    tp_tensor_unref(x);

    // Non-contiguous logits and a strided target.
    for (int dt = 0; dt < 2; dt++) {
        tp_tensor *tt = targets(dt ? TP_I64 : TP_I32, 12, 4), *ts;
        TP_CHECK_OK(tp_tensor_narrow(tt, 0, 0, 6, &ts, NULL), NULL);
        tp_tensor *in[2] = {leaf(rnd_nc(TP_F64, 2, s, -2, 2)), ts};
        gradcheck("nll_loss nc", f_nll, NULL, 2, in);
        gradcheck("cross_entropy nc", f_ce, NULL, 2, in);
        tp_tensor_unref(in[0]);
        tp_tensor_unref(ts);
        tp_tensor_unref(tt);
    }
    // N = 0: nan loss, an empty gradient.
    int64_t s0[2] = {0, 4};
    tp_tensor *x0 = leaf(rnd(TP_F64, 2, s0, -2, 2));
    tp_tensor *t0 = targets(TP_I64, 0, 4);
    for (int ce = 0; ce < 2; ce++) {
        tp_tensor_zero_grad(x0);
        TP_CHECK_OK(ce ? tp_cross_entropy(x0, t0, &o, NULL)
                       : tp_nll_loss(x0, t0, &o, NULL),
                    NULL);
        TP_CHECK(isnan(at(o, 0)));
        TP_CHECK_OK(tp_backward(1, &o, NULL, false, NULL), NULL);
        TP_CHECK(tp_tensor_grad(x0) != NULL);
        check_shape(tp_tensor_grad(x0), 2, s0);
        tp_tensor_unref(o);
    }
    tp_tensor_unref(x0);
    tp_tensor_unref(t0);

    // Targets changed after forward do not change (or break) backward:
    // the op keeps its own copy.
    x = leaf(rnd(TP_F64, 2, s, -2, 2));
    t = targets(TP_I64, 6, 4);
    TP_CHECK_OK(tp_nll_loss(x, t, &o, NULL), NULL);
    for (int i = 0; i < 6; i++) {
        tp_tensor_set_item(t, i, 1000 + i);
    }
    TP_CHECK_OK(tp_backward(1, &o, NULL, false, NULL), NULL);
    for (int64_t i = 0; i < 6; i++) {
        for (int64_t j = 0; j < 4; j++) {
            double want = j == (i * 7 + 3) % 4 ? -1.0 / 6 : 0.0;
            check_close(at(tp_tensor_grad(x), i * 4 + j), want, 1e-15, 0,
                        "nll grad after target change", i * 4 + j);
        }
    }
    tp_tensor_unref(o);
    tp_tensor_unref(t);
    tp_tensor_unref(x);
}

static tp_status
f_emb(tp_tensor *const *in, void *ctx, tp_tensor **out, tp_error **err_p)
{
    return tp_embedding(in[0], in[1], out, err_p);
}

static void
t_embedding(void)
{
    int64_t ws[2] = {7, 3}, is[2] = {2, 4};
    for (int nc = 0; nc < 2; nc++) {
        tp_tensor *w =
            nc ? rnd_nc(TP_F32, 2, ws, -1, 1) : rnd(TP_F32, 2, ws, -1, 1);
        tp_tensor *idx, *o;
        TP_CHECK_OK(tp_tensor_empty(TP_I64, 2, is, &idx, NULL), NULL);
        static const int rows[8] = {3, 0, 6, 3, 3, 1, 0, 5}; // repeats
        for (int i = 0; i < 8; i++) {
            tp_tensor_set_item(idx, i, rows[i]);
        }
        TP_CHECK_OK(tp_embedding(w, idx, &o, NULL), NULL);
        int64_t os[3] = {2, 4, 3};
        check_shape(o, 3, os);
        for (int i = 0; i < 8; i++) {
            for (int j = 0; j < 3; j++) {
                TP_CHECK(at(o, i * 3 + j) == at(w, rows[i] * 3 + j));
            }
        }
        tp_tensor_unref(o);
        tp_tensor_unref(w);
        tp_tensor *in[2] = {
            leaf(nc ? rnd_nc(TP_F64, 2, ws, -1, 1) : rnd(TP_F64, 2, ws, -1, 1)),
            idx};
        gradcheck("embedding", f_emb, NULL, 2, in);
        // Row 3 was picked three times, row 2 never.
        TP_CHECK(at(tp_tensor_grad(in[0]), 2 * 3) == 0.0);
        tp_tensor_set_item(idx, 5, 7);
        tp_error *err = NULL;
        TP_CHECK_EQ(tp_embedding(in[0], idx, &o, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "index 7");
        tp_error_unref(err);
        tp_tensor_unref(in[0]);
        tp_tensor_unref(idx);
    }

    // Indices changed after forward do not change (or break) backward:
    // the op keeps its own copy.
    tp_tensor *w = leaf(rnd(TP_F64, 2, ws, -1, 1)), *idx, *o;
    TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, (const int64_t[]){3}, &idx, NULL),
                NULL);
    for (int i = 0; i < 3; i++) {
        tp_tensor_set_item(idx, i, 2 * i);
    }
    TP_CHECK_OK(tp_embedding(w, idx, &o, NULL), NULL);
    for (int i = 0; i < 3; i++) {
        ((int64_t *)tp_tensor_data(idx))[i] = INT64_C(1) << 40;
    }
    tp_tensor *g;
    TP_CHECK_OK(tp_tensor_ones(TP_F64, 2, (const int64_t[]){3, 3}, &g, NULL),
                NULL);
    TP_CHECK_OK(tp_backward(1, &o, &g, false, NULL), NULL);
    for (int r = 0; r < 7; r++) {
        for (int j = 0; j < 3; j++) {
            TP_CHECK(at(tp_tensor_grad(w), r * 3 + j) ==
                     (r % 2 == 0 && r < 6 ? 1.0 : 0.0));
        }
    }
    tp_tensor_unref(g);
    tp_tensor_unref(o);
    // Indices are read as integers: INT64_MAX is reported exactly.
    ((int64_t *)tp_tensor_data(idx))[0] = 0;
    ((int64_t *)tp_tensor_data(idx))[1] = INT64_MAX;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_embedding(w, idx, &o, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "index 9223372036854775807");
    tp_error_unref(err);
    tp_tensor_unref(idx);
    // Zero-size indices: a [2, 0, 3] result and a zero gradient.
    int64_t zs[2] = {2, 0}, os[3] = {2, 0, 3};
    TP_CHECK_OK(tp_tensor_empty(TP_I32, 2, zs, &idx, NULL), NULL);
    TP_CHECK_OK(tp_embedding(w, idx, &o, NULL), NULL);
    check_shape(o, 3, os);
    tp_tensor_unref(o);
    tp_tensor *in[2] = {w, idx};
    gradcheck("embedding empty", f_emb, NULL, 2, in);
    tp_tensor_unref(idx);
    tp_tensor_unref(w);
}

// pow(a, 0) is 1 everywhere, so its gradient is 0, also at a = 0 (where
// 0 * 0^-1 would be nan), as in PyTorch.
static void
t_pow_zero(void)
{
    int64_t s[1] = {4};
    tp_tensor *a, *o, *l;
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s, &a, NULL), NULL);
    tp_tensor_set_item(a, 3, 2.5);
    leaf(a);
    TP_CHECK_OK(tp_pow(a, 0, &o, NULL), NULL);
    TP_CHECK_OK(tp_sum(o, &l, NULL), NULL);
    TP_CHECK(at(l, 0) == 4.0);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
    for (int i = 0; i < 4; i++) {
        TP_CHECK(at(tp_tensor_grad(a), i) == 0.0);
    }
    tp_tensor_unref(l);
    tp_tensor_unref(o);
    tp_tensor_unref(a);
}

static void
t_axpy(void)
{
    int64_t s[2] = {3, 4}, r[1] = {4};
    tp_tensor *y = rnd(TP_F32, 2, s, -1, 1), *x = rnd(TP_F32, 1, r, -1, 1);
    tp_tensor *y0;
    TP_CHECK_OK(tp_tensor_clone(y, &y0, NULL), NULL);
    TP_CHECK_OK(tp_tensor_axpy(y, -0.5, x, NULL), NULL);
    for (int i = 0; i < 12; i++) {
        check_close(at(y, i), at(y0, i) - 0.5 * at(x, i % 4), 1e-6, 1e-7,
                    "axpy", i);
    }
    // In-place on a tensor that requires grad needs a no_grad scope.
    leaf(y);
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_tensor_axpy(y, 1, x, &err), TP_EPERM);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "grad mode");
    tp_error_unref(err);
    bool prev = tp_grad_mode_set(false);
    TP_CHECK_OK(tp_tensor_axpy(y, 1, x, NULL), NULL);
    tp_grad_mode_set(prev);
    tp_tensor_unref(y);
    tp_tensor_unref(y0);
    tp_tensor_unref(x);

    // A broadcast (stride-0) y cannot be updated in place.
    tp_tensor *row = rnd(TP_F64, 1, r, -1, 1), *ey;
    TP_CHECK_OK(tp_tensor_expand(row, 2, s, &ey, NULL), NULL);
    x = rnd(TP_F64, 2, s, -1, 1);
    err = NULL;
    TP_CHECK_EQ(tp_tensor_axpy(ey, 1, x, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "broadcast");
    tp_error_unref(err);
    tp_tensor_unref(ey);
    tp_tensor_unref(row);
    tp_tensor_unref(x);

    // x aliasing y: y += 2y, and y += y^T on a square matrix.
    int64_t sq[2] = {3, 3};
    y = rnd(TP_F64, 2, sq, -1, 1);
    TP_CHECK_OK(tp_tensor_clone(y, &y0, NULL), NULL);
    TP_CHECK_OK(tp_tensor_axpy(y, 2, y, NULL), NULL);
    for (int i = 0; i < 9; i++) {
        check_close(at(y, i), 3 * at(y0, i), 1e-15, 0, "axpy self", i);
    }
    tp_tensor_unref(y0);
    TP_CHECK_OK(tp_tensor_clone(y, &y0, NULL), NULL);
    tp_tensor *yt;
    TP_CHECK_OK(tp_tensor_transpose(y, 0, 1, &yt, NULL), NULL);
    TP_CHECK_OK(tp_tensor_axpy(y, 1, yt, NULL), NULL);
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) {
            check_close(at(y, i * 3 + j), at(y0, i * 3 + j) + at(y0, j * 3 + i),
                        1e-15, 0, "axpy transpose", i * 3 + j);
        }
    }
    tp_tensor_unref(yt);
    tp_tensor_unref(y0);
    tp_tensor_unref(y);
}

AG_LEAK_CHECKED(t_binary_forward)
AG_LEAK_CHECKED(t_binary_gradcheck)
AG_LEAK_CHECKED(t_unary_forward)
AG_LEAK_CHECKED(t_unary_gradcheck)
AG_LEAK_CHECKED(t_dtype_errors)
AG_LEAK_CHECKED(t_reductions)
AG_LEAK_CHECKED(t_matmul)
AG_LEAK_CHECKED(t_matmul_large)
AG_LEAK_CHECKED(t_matmul_fallback)
AG_LEAK_CHECKED(t_compute_threads)
AG_LEAK_CHECKED(t_view_gradcheck)
AG_LEAK_CHECKED(t_softmax)
AG_LEAK_CHECKED(t_mse_loss)
AG_LEAK_CHECKED(t_nll_cross_entropy)
AG_LEAK_CHECKED(t_embedding)
AG_LEAK_CHECKED(t_axpy)
AG_LEAK_CHECKED(t_pow_zero)

static const tp_test_case cases[] = {
    AG_TEST(t_binary_forward),  AG_TEST(t_binary_gradcheck),
    AG_TEST(t_unary_forward),   AG_TEST(t_unary_gradcheck),
    AG_TEST(t_dtype_errors),    AG_TEST(t_reductions),
    AG_TEST(t_matmul),          AG_TEST(t_matmul_large),
    AG_TEST(t_matmul_fallback), AG_TEST(t_compute_threads),
    AG_TEST(t_view_gradcheck),  AG_TEST(t_softmax),
    AG_TEST(t_mse_loss),        AG_TEST(t_nll_cross_entropy),
    AG_TEST(t_embedding),       AG_TEST(t_axpy),
    AG_TEST(t_pow_zero),
};

TP_TEST_MAIN(cases)
