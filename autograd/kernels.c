// SPDX-License-Identifier: Apache-2.0
// kernels.c - CPU kernels for f32/f64: broadcasting elementwise ops,
// reductions, gemm (cblas when built with BLAS, a blocked kernel
// otherwise) and softmax. Nothing here records autograd nodes.
//
// This file is built with -O3 -ffp-contract=fast (see CMakeLists.txt) so
// that the dense inner loops vectorise.

#include <math.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

#if TP_HAVE_BLAS
#include <cblas.h>
#endif

// K_CLONES: see TP_CLONES (core/platform.h).
#define K_CLONES TP_CLONES

tp_status
tp__k_check_float(const char *op, const tp_tensor *t, tp_error **err_p)
{
    if (tp__tensor_check_cpu(op, t, err_p) != TP_OK) {
        return TP_ENOTSUP;
    }
    if (t->t_dtype != TP_F32 && t->t_dtype != TP_F64) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: dtype %s is not supported (f32, f64)", op,
                             tp_dtype_name(t->t_dtype));
    }
    return TP_OK;
}

tp_status
tp__broadcast_shape(const char *op, const tp_tensor *a, const tp_tensor *b,
                    int *nd_p, int64_t *shape, tp_error **err_p)
{
    int nd = TP_MAX(a->t_ndim, b->t_ndim);
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->t_ndim), ib = i - (nd - b->t_ndim);
        int64_t sa = ia >= 0 ? a->t_shape[ia] : 1;
        int64_t sb = ib >= 0 ? b->t_shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char x[128], y[128];
            return tp__error_set(
                err_p, TP_EINVAL, "%s: shapes %s and %s do not broadcast", op,
                tp__shape_str(a->t_ndim, a->t_shape, x, sizeof(x)),
                tp__shape_str(b->t_ndim, b->t_shape, y, sizeof(y)));
        }
        shape[i] = sa == 1 ? sb : sa;
    }
    *nd_p = nd;
    return TP_OK;
}

// ---- iteration -------------------------------------------------------------

// Up to three operands of one shape, with their strides; dims are merged
// where every operand is dense across them, so most loops run over one
// long inner row.
typedef struct iter {
    int nd;
    int64_t shape[TP_TENSOR_MAX_DIMS];
    int64_t st[3][TP_TENSOR_MAX_DIMS];
    int nops;
} iter;

static void
iter_init(iter *it, int nd, const int64_t *shape, int nops,
          const int64_t *const *strides)
{
    it->nops = nops;
    it->nd = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1) {
            continue; // size-1 dims never move
        }
        int k = it->nd;
        if (k > 0) {
            bool merge = true;
            for (int o = 0; o < nops; o++) {
                if (it->st[o][k - 1] != strides[o][d] * shape[d]) {
                    merge = false;
                }
            }
            if (merge) {
                it->shape[k - 1] *= shape[d];
                for (int o = 0; o < nops; o++) {
                    it->st[o][k - 1] = strides[o][d];
                }
                continue;
            }
        }
        it->shape[k] = shape[d];
        for (int o = 0; o < nops; o++) {
            it->st[o][k] = strides[o][d];
        }
        it->nd++;
    }
    if (it->nd == 0) {
        it->nd = 1;
        it->shape[0] = 1;
        for (int o = 0; o < nops; o++) {
            it->st[o][0] = 1;
        }
    }
}

// Calls @row for each inner row; offsets are in elements.
typedef void (*iter_row_fn)(void *ctx, const int64_t *off, int64_t n,
                            const int64_t *inner_st);

// Runs rows [r0, r1) of @it; when there is a single row, runs elements
// [r0, r1) of it instead.
static void
iter_run_range(const iter *it, int64_t r0, int64_t r1, iter_row_fn row,
               void *ctx)
{
    int nd = it->nd;
    int64_t inner = it->shape[nd - 1];
    int64_t inner_st[3], off[3];
    for (int o = 0; o < it->nops; o++) {
        inner_st[o] = it->st[o][nd - 1];
    }
    if (nd == 1) {
        for (int o = 0; o < it->nops; o++) {
            off[o] = r0 * inner_st[o];
        }
        row(ctx, off, r1 - r0, inner_st);
        return;
    }
    int64_t idx[TP_TENSOR_MAX_DIMS] = {0};
    int64_t rem = r0;
    for (int d = nd - 2; d >= 0; d--) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
    }
    for (int64_t r = r0; r < r1; r++) {
        for (int o = 0; o < it->nops; o++) {
            off[o] = 0;
            for (int d = 0; d < nd - 1; d++) {
                off[o] += idx[d] * it->st[o][d];
            }
        }
        row(ctx, off, inner, inner_st);
        for (int d = nd - 2; d >= 0; d--) {
            if (++idx[d] < it->shape[d]) {
                break;
            }
            idx[d] = 0;
        }
    }
}

static int64_t
iter_units(const iter *it)
{
    if (it->nd == 1) {
        return it->shape[0];
    }
    int64_t rows = 1;
    for (int d = 0; d < it->nd - 1; d++) {
        rows *= it->shape[d];
    }
    return rows;
}

static void
iter_run(const iter *it, iter_row_fn row, void *ctx)
{
    iter_run_range(it, 0, iter_units(it), row, ctx);
}

typedef struct par_iter {
    const iter *it;
    iter_row_fn row;
    void *ctx;
} par_iter;

static void
par_iter_chunk(void *c, int64_t b, int64_t e)
{
    par_iter *p = c;
    iter_run_range(p->it, b, e, p->row, p->ctx);
}

// As iter_run, split over the compute threads in pieces of at least 64K
// elements (below that, waking threads costs more than it saves). For
// kernels whose rows write disjoint outputs.
static void
iter_run_par(const iter *it, iter_row_fn row, void *ctx)
{
    int64_t per_unit = it->nd == 1 ? 1 : it->shape[it->nd - 1];
    int64_t grain =
        TP_MAX((int64_t)1, ((int64_t)1 << 16) / TP_MAX(per_unit, 1));
    par_iter p = {it, row, ctx};
    tp__parallel_for(iter_units(it), grain, par_iter_chunk, &p);
}

// ---- elementwise rows ------------------------------------------------------

typedef void (*bin_row_fn)(void *o, int64_t so, const void *a, int64_t sa,
                           const void *b, int64_t sb, int64_t n, double s);

// The dense cases get their own loops so the compiler vectorises them.
#define BIN_ROW(NAME, T, EXPR)                                                 \
    K_CLONES static void NAME(void *o_, int64_t so, const void *a_,            \
                              int64_t sa, const void *b_, int64_t sb,          \
                              int64_t n, double s_)                            \
    {                                                                          \
        T *restrict o = o_;                                                    \
        const T *restrict a = a_;                                              \
        const T *restrict b = b_;                                              \
        const T s = (T)s_;                                                     \
        (void)s;                                                               \
        if (so == 1 && sa == 1 && sb == 1) {                                   \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i], y = b[i];                                          \
                o[i] = (EXPR);                                                 \
            }                                                                  \
        } else if (so == 1 && sa == 1 && sb == 0) {                            \
            const T y = b[0];                                                  \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i];                                                    \
                o[i] = (EXPR);                                                 \
            }                                                                  \
        } else if (so == 1 && sa == 0 && sb == 1) {                            \
            const T x = a[0];                                                  \
            for (int64_t i = 0; i < n; i++) {                                  \
                T y = b[i];                                                    \
                o[i] = (EXPR);                                                 \
            }                                                                  \
        } else {                                                               \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i * sa], y = b[i * sb];                                \
                o[i * so] = (EXPR);                                            \
            }                                                                  \
        }                                                                      \
    }

#define BIN_ROWS(T, SFX, POW_)                                                 \
    BIN_ROW(add_##SFX, T, x + y)                                               \
    BIN_ROW(sub_##SFX, T, x - y)                                               \
    BIN_ROW(mul_##SFX, T, (x * y))                                             \
    BIN_ROW(div_##SFX, T, x / y)                                               \
    BIN_ROW(relubw_##SFX, T, y > (T)0 ? x : (T)0)                              \
    BIN_ROW(tanhbw_##SFX, T, (x * ((T)1 - y * y)))                             \
    BIN_ROW(sigbw_##SFX, T, (x * y * ((T)1 - y)))                              \
    BIN_ROW(sqrtbw_##SFX, T, (x * (T)0.5 / y))                                 \
    BIN_ROW(powbw_##SFX, T, (s == (T)0 ? (T)0 : x * s * POW_(y, s - (T)1)))

BIN_ROWS(float, f32, powf)
BIN_ROWS(double, f64, pow)

static const bin_row_fn bin_rows[TP__BINOP_COUNT][2] = {
    [TP__ADD] = {add_f32, add_f64},
    [TP__SUB] = {sub_f32, sub_f64},
    [TP__MUL] = {mul_f32, mul_f64},
    [TP__DIV] = {div_f32, div_f64},
    [TP__RELU_BW] = {relubw_f32, relubw_f64},
    [TP__TANH_BW] = {tanhbw_f32, tanhbw_f64},
    [TP__SIGMOID_BW] = {sigbw_f32, sigbw_f64},
    [TP__SQRT_BW] = {sqrtbw_f32, sqrtbw_f64},
    [TP__POW_BW] = {powbw_f32, powbw_f64},
};

typedef void (*un_row_fn)(void *o, const void *a, int64_t sa, int64_t n,
                          double s);

#define UN_ROW(NAME, T, EXPR)                                                  \
    K_CLONES static void NAME(void *o_, const void *a_, int64_t sa, int64_t n, \
                              double s_)                                       \
    {                                                                          \
        T *restrict o = o_;                                                    \
        const T *restrict a = a_;                                              \
        const T s = (T)s_;                                                     \
        (void)s;                                                               \
        if (sa == 1) {                                                         \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i];                                                    \
                o[i] = (EXPR);                                                 \
            }                                                                  \
        } else {                                                               \
            for (int64_t i = 0; i < n; i++) {                                  \
                T x = a[i * sa];                                               \
                o[i] = (EXPR);                                                 \
            }                                                                  \
        }                                                                      \
    }

#define UN_ROWS(T, SFX, EXP_, LOG_, SQRT_, TANH_, POW_)                        \
    UN_ROW(neg_##SFX, T, -x)                                                   \
    UN_ROW(exp_##SFX, T, EXP_(x))                                              \
    UN_ROW(log_##SFX, T, LOG_(x))                                              \
    UN_ROW(sqrt_##SFX, T, SQRT_(x))                                            \
    UN_ROW(tanh_##SFX, T, TANH_(x))                                            \
    UN_ROW(sig_##SFX, T, (T)1 / ((T)1 + EXP_(-x)))                             \
    UN_ROW(relu_##SFX, T, x > (T)0 ? x : (T)0)                                 \
    UN_ROW(pow_##SFX, T, POW_(x, s))                                           \
    UN_ROW(muls_##SFX, T, (x * s))                                             \
    UN_ROW(adds_##SFX, T, x + s)

UN_ROWS(float, f32, expf, logf, sqrtf, tanhf, powf)
UN_ROWS(double, f64, exp, log, sqrt, tanh, pow)

static const un_row_fn un_rows[TP__UNOP_COUNT][2] = {
    [TP__NEG] = {neg_f32, neg_f64},    [TP__EXP] = {exp_f32, exp_f64},
    [TP__LOG] = {log_f32, log_f64},    [TP__SQRT] = {sqrt_f32, sqrt_f64},
    [TP__TANH] = {tanh_f32, tanh_f64}, [TP__SIGMOID] = {sig_f32, sig_f64},
    [TP__RELU] = {relu_f32, relu_f64}, [TP__POW] = {pow_f32, pow_f64},
    [TP__MULS] = {muls_f32, muls_f64}, [TP__ADDS] = {adds_f32, adds_f64},
};

static int
dt_index(tp_dtype dt)
{
    return dt == TP_F64 ? 1 : 0;
}

typedef struct bin_ctx {
    bin_row_fn fn;
    char *o;
    const char *a, *b;
    size_t es;
    double s;
} bin_ctx;

static void
bin_ctx_row(void *ctx, const int64_t *off, int64_t n, const int64_t *ist)
{
    bin_ctx *c = ctx;
    c->fn(c->o + off[0] * (int64_t)c->es, ist[0],
          c->a + off[1] * (int64_t)c->es, ist[1],
          c->b + off[2] * (int64_t)c->es, ist[2], n, c->s);
}

// o = op(a, b) where all three have o's shape (a and b may be broadcast
// views); o may be any layout.
static void
binary_into(tp__binop k, tp_tensor *o, const tp_tensor *a, const tp_tensor *b,
            double s)
{
    if (tp_tensor_numel(o) == 0) {
        return;
    }
    const int64_t *strides[3] = {o->t_strides, a->t_strides, b->t_strides};
    iter it;
    iter_init(&it, o->t_ndim, o->t_shape, 3, strides);
    bin_ctx c = {bin_rows[k][dt_index(o->t_dtype)],
                 tp__tensor_ptr(o),
                 tp__tensor_ptr(a),
                 tp__tensor_ptr(b),
                 tp_dtype_size(o->t_dtype),
                 s};
    iter_run_par(&it, bin_ctx_row, &c);
}

tp_status
tp__k_binary(const char *op, tp__binop k, const tp_tensor *a,
             const tp_tensor *b, double s, tp_tensor **out_p, tp_error **err_p)
{
    tp_status st = tp__k_check_float(op, a, err_p);
    if (st == TP_OK) {
        st = tp__k_check_float(op, b, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    if (a->t_dtype != b->t_dtype) {
        return tp__error_set(err_p, TP_EINVAL, "%s: dtypes %s and %s differ",
                             op, tp_dtype_name(a->t_dtype),
                             tp_dtype_name(b->t_dtype));
    }
    int nd;
    int64_t shape[TP_TENSOR_MAX_DIMS];
    st = tp__broadcast_shape(op, a, b, &nd, shape, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *o = NULL, *ea = NULL, *eb = NULL;
    st = tp_tensor_empty(a->t_dtype, nd, shape, &o, err_p);
    if (st == TP_OK) {
        st = tp__view_expand(a, nd, shape, &ea, err_p);
    }
    if (st == TP_OK) {
        st = tp__view_expand(b, nd, shape, &eb, err_p);
    }
    if (st == TP_OK) {
        binary_into(k, o, ea, eb, s);
        *out_p = o;
        o = NULL;
    }
    tp_tensor_unref(ea);
    tp_tensor_unref(eb);
    tp_tensor_unref(o);
    return st;
}

typedef struct un_ctx {
    un_row_fn fn;
    char *o;
    const char *a;
    size_t es;
    double s;
} un_ctx;

static void
un_ctx_row(void *ctx, const int64_t *off, int64_t n, const int64_t *ist)
{
    un_ctx *c = ctx;
    c->fn(c->o + off[0] * (int64_t)c->es, c->a + off[1] * (int64_t)c->es,
          ist[1], n, c->s);
}

tp_status
tp__k_unary(const char *op, tp__unop k, const tp_tensor *a, double s,
            tp_tensor **out_p, tp_error **err_p)
{
    tp_status st = tp__k_check_float(op, a, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *o;
    st = tp_tensor_empty(a->t_dtype, a->t_ndim, a->t_shape, &o, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (tp_tensor_numel(o) > 0) {
        const int64_t *strides[2] = {o->t_strides, a->t_strides};
        iter it;
        iter_init(&it, o->t_ndim, o->t_shape, 2, strides);
        // The output is dense, so its inner stride is 1 after merging.
        un_ctx c = {un_rows[k][dt_index(a->t_dtype)], tp__tensor_ptr(o),
                    tp__tensor_ptr(a), tp_dtype_size(a->t_dtype), s};
        iter_run_par(&it, un_ctx_row, &c);
    }
    *out_p = o;
    return TP_OK;
}

// y += alpha * x in place, row by row. No restrict: y is read and written
// through the one pointer, and x may be any view (also of y's storage).
#define AXPY_ROW(NAME, T)                                                      \
    static void NAME(void *y_, int64_t sy, const void *x_, int64_t sx,         \
                     int64_t n, double alpha_)                                 \
    {                                                                          \
        T *y = y_;                                                             \
        const T *x = x_;                                                       \
        const T alpha = (T)alpha_;                                             \
        if (sy == 1 && sx == 1) {                                              \
            for (int64_t i = 0; i < n; i++) {                                  \
                y[i] += alpha * x[i];                                          \
            }                                                                  \
        } else {                                                               \
            for (int64_t i = 0; i < n; i++) {                                  \
                y[i * sy] += alpha * x[i * sx];                                \
            }                                                                  \
        }                                                                      \
    }

AXPY_ROW(axpy_f32, float)
AXPY_ROW(axpy_f64, double)

typedef struct axpy_ctx {
    void (*fn)(void *y, int64_t sy, const void *x, int64_t sx, int64_t n,
               double alpha);
    char *y;
    const char *x;
    size_t es;
    double alpha;
} axpy_ctx;

static void
axpy_ctx_row(void *ctx, const int64_t *off, int64_t n, const int64_t *ist)
{
    axpy_ctx *c = ctx;
    c->fn(c->y + off[0] * (int64_t)c->es, ist[0],
          c->x + off[1] * (int64_t)c->es, ist[1], n, c->alpha);
}

tp_status
tp__k_axpy(tp_tensor *y, double alpha, const tp_tensor *x, tp_error **err_p)
{
    tp_status st = tp__k_check_float("axpy", y, err_p);
    if (st == TP_OK) {
        st = tp__k_check_float("axpy", x, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    // A broadcast (stride-0) y has several elements in one place: an
    // in-place update of it has no meaning (PyTorch refuses it too).
    for (int d = 0; d < y->t_ndim; d++) {
        if (y->t_shape[d] > 1 && y->t_strides[d] == 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "axpy: the updated tensor is broadcast "
                                 "(stride 0 in dim %d)",
                                 d);
        }
    }
    tp_tensor *ex, *sx = NULL;
    st = tp__view_expand(x, y->t_ndim, y->t_shape, &ex, err_p);
    if (st != TP_OK) {
        return st;
    }
    // A copy when x needs converting or shares y's storage (so every x
    // element is read before any y element is written).
    if (x->t_dtype != y->t_dtype || x->t_storage == y->t_storage) {
        st = tp__to_dtype_raw(ex, y->t_dtype, &sx, err_p);
        tp_tensor_unref(ex);
        if (st != TP_OK) {
            return st;
        }
        ex = sx;
    }
    if (tp_tensor_numel(y) > 0) {
        const int64_t *strides[2] = {y->t_strides, ex->t_strides};
        iter it;
        iter_init(&it, y->t_ndim, y->t_shape, 2, strides);
        axpy_ctx c = {y->t_dtype == TP_F64 ? axpy_f64 : axpy_f32,
                      tp__tensor_ptr(y), tp__tensor_ptr(ex),
                      tp_dtype_size(y->t_dtype), alpha};
        iter_run_par(&it, axpy_ctx_row, &c);
    }
    tp_tensor_unref(ex);
    return TP_OK;
}

// ---- reductions ------------------------------------------------------------

typedef struct sum_ctx {
    const char *a;
    tp_dtype dt;
    double *acc;
} sum_ctx;

static void
sum_ctx_row(void *ctx, const int64_t *off, int64_t n, const int64_t *ist)
{
    sum_ctx *c = ctx;
    double *acc = c->acc + off[0];
    int64_t so = ist[0], sa = ist[1];
    if (c->dt == TP_F32) {
        const float *a = (const float *)(const void *)c->a + off[1];
        if (so == 0) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) {
                s += a[i * sa];
            }
            *acc += s;
        } else {
            for (int64_t i = 0; i < n; i++) {
                acc[i * so] += a[i * sa];
            }
        }
    } else {
        const double *a = (const double *)(const void *)c->a + off[1];
        if (so == 0) {
            double s = 0;
            for (int64_t i = 0; i < n; i++) {
                s += a[i * sa];
            }
            *acc += s;
        } else {
            for (int64_t i = 0; i < n; i++) {
                acc[i * so] += a[i * sa];
            }
        }
    }
}

tp_status
tp__k_sum(const tp_tensor *a, const bool *reduce, bool keepdim, double scale,
          tp_tensor **out_p, tp_error **err_p)
{
    tp_status st = tp__k_check_float("sum", a, err_p);
    if (st != TP_OK) {
        return st;
    }
    int nd = a->t_ndim, ond = 0;
    int64_t kshape[TP_TENSOR_MAX_DIMS], oshape[TP_TENSOR_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        kshape[d] = reduce[d] ? 1 : a->t_shape[d];
        if (!reduce[d] || keepdim) {
            oshape[ond++] = kshape[d];
        }
    }
    int64_t on = tp__shape_numel(nd, kshape);
    double *acc = tp__zalloc(sizeof(double) * (size_t)(on ? on : 1));
    if (!acc) {
        return tp__error_set(err_p, TP_ENOMEM, "sum: out of memory");
    }
    // Accumulator strides over a's shape: 0 along reduced dims.
    int64_t ast[TP_TENSOR_MAX_DIMS];
    tp__contiguous_strides(nd, kshape, ast);
    for (int d = 0; d < nd; d++) {
        if (reduce[d]) {
            ast[d] = 0;
        }
    }
    if (tp_tensor_numel(a) > 0) {
        const int64_t *strides[2] = {ast, a->t_strides};
        iter it;
        iter_init(&it, nd, a->t_shape, 2, strides);
        sum_ctx c = {tp__tensor_ptr(a), a->t_dtype, acc};
        iter_run(&it, sum_ctx_row, &c);
    }
    tp_tensor *o;
    st = tp_tensor_empty(a->t_dtype, ond, oshape, &o, err_p);
    if (st == TP_OK) {
        char *p = tp__tensor_ptr(o);
        for (int64_t i = 0; i < on; i++) {
            if (a->t_dtype == TP_F32) {
                ((float *)(void *)p)[i] = (float)(acc[i] * scale);
            } else {
                ((double *)(void *)p)[i] = acc[i] * scale;
            }
        }
        *out_p = o;
    }
    tp__free(acc);
    return st;
}

tp_status
tp__k_sum_to(const tp_tensor *g, int ndim, const int64_t *shape,
             tp_tensor **out_p, tp_error **err_p)
{
    if (tp__shape_equal(g->t_ndim, g->t_shape, ndim, shape)) {
        return tp__tensor_alias(g, out_p, err_p);
    }
    int lead = g->t_ndim - ndim;
    bool reduce[TP_TENSOR_MAX_DIMS] = {false};
    if (lead < 0) {
        return tp__error_set(err_p, TP_EINVAL, "sum_to: bad shapes");
    }
    for (int d = 0; d < g->t_ndim; d++) {
        reduce[d] = d < lead || (shape[d - lead] == 1 && g->t_shape[d] != 1);
    }
    tp_tensor *s;
    tp_status st = tp__k_sum(g, reduce, true, 1.0, &s, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__view_reshape(s, ndim, shape, out_p, err_p);
    tp_tensor_unref(s);
    return st;
}

// ---- gemm ------------------------------------------------------------------

static bool gemm_fallback_forced;

void
tp__gemm_force_fallback(bool on)
{
    gemm_fallback_forced = on;
}

bool
tp__gemm_have_blas(void)
{
    return TP_HAVE_BLAS != 0;
}

// Blocked fallback (the GotoBLAS structure): B is packed into KC x NR
// micro-panels and A into MR x KC micro-panels, each contiguous in the
// order the micro-kernel reads them, so the kernel streams both with unit
// stride and keeps the MR x NR tile of C in registers. One B micro-panel
// (16 KB for f32) stays in L1 while the kernel sweeps the A block in L2.
#define GEMM_MC 64
#define GEMM_KC 256
#define GEMM_NC 1024
#define GEMM_MR 4
#define GEMM_NR 16

// The micro-kernel must be inlined into each clone to get its ISA.
#if defined(__GNUC__)
#define GEMM_INLINE inline __attribute__((always_inline))
#else
#define GEMM_INLINE inline
#endif

#define DEF_GEMM(SFX, T)                                                       \
    static GEMM_INLINE void micro_##SFX(int64_t kc, const T *restrict ap,      \
                                        const T *restrict bp, T *c,            \
                                        int64_t ldc, int64_t mr, int64_t nr)   \
    {                                                                          \
        T acc[GEMM_MR][GEMM_NR] = {{0}};                                       \
        /* Copying the B row to a local first makes GCC vectorise along */     \
        /* q; without it, it vectorises along p with shuffles (10x      */     \
        /* slower).                                                     */     \
        for (int64_t p = 0; p < kc; p++) {                                     \
            T bv[GEMM_NR];                                                     \
            for (int q = 0; q < GEMM_NR; q++) {                                \
                bv[q] = bp[p * GEMM_NR + q];                                   \
            }                                                                  \
            for (int r = 0; r < GEMM_MR; r++) {                                \
                T av = ap[p * GEMM_MR + r];                                    \
                for (int q = 0; q < GEMM_NR; q++) {                            \
                    acc[r][q] += av * bv[q];                                   \
                }                                                              \
            }                                                                  \
        }                                                                      \
        for (int64_t r = 0; r < mr; r++) {                                     \
            for (int64_t q = 0; q < nr; q++) {                                 \
                c[r * ldc + q] += acc[r][q];                                   \
            }                                                                  \
        }                                                                      \
    }                                                                          \
                                                                               \
    /* One job per (jc, pc) block: B is packed, the threads split the   */     \
    /* rows of A in MC blocks, each packing its own A.                   */    \
    typedef struct gemm_job_##SFX {                                            \
        const T *a;                                                            \
        int64_t rsa, csa;                                                      \
        const T *bpack;                                                        \
        T *c;                                                                  \
        int64_t m, n, jc, nc, pc, kc;                                          \
    } gemm_job_##SFX;                                                          \
                                                                               \
    K_CLONES static void gemm_rows_##SFX(void *vjob, int64_t b0, int64_t b1)   \
    {                                                                          \
        const gemm_job_##SFX *j = vjob;                                        \
        int64_t kc = j->kc, nc = j->nc, n = j->n;                              \
        T *apack = tp__alloc(sizeof(T) * (GEMM_MC + GEMM_MR) * GEMM_KC);       \
        for (int64_t blk = b0; blk < b1; blk++) {                              \
            int64_t ic = blk * GEMM_MC;                                        \
            int64_t mc = TP_MIN(GEMM_MC, j->m - ic);                           \
            if (!apack) {                                                      \
                /* No memory to pack A: read it in place, slowly. */           \
                for (int64_t i = 0; i < mc; i++) {                             \
                    for (int64_t q = 0; q < nc; q++) {                         \
                        const T *bp = j->bpack + (q / GEMM_NR) * GEMM_NR * kc; \
                        T sum = 0;                                             \
                        for (int64_t p = 0; p < kc; p++) {                     \
                            sum += j->a[(ic + i) * j->rsa +                    \
                                        (j->pc + p) * j->csa] *                \
                                   bp[p * GEMM_NR + q % GEMM_NR];              \
                        }                                                      \
                        j->c[(ic + i) * n + j->jc + q] += sum;                 \
                    }                                                          \
                }                                                              \
                continue;                                                      \
            }                                                                  \
            for (int64_t ib = 0; ib < mc; ib += GEMM_MR) {                     \
                T *dst = apack + ib * kc;                                      \
                int64_t h = TP_MIN(GEMM_MR, mc - ib);                          \
                for (int64_t p = 0; p < kc; p++) {                             \
                    const T *src =                                             \
                        j->a + (ic + ib) * j->rsa + (j->pc + p) * j->csa;      \
                    for (int64_t r = 0; r < GEMM_MR; r++) {                    \
                        dst[p * GEMM_MR + r] = r < h ? src[r * j->rsa] : 0;    \
                    }                                                          \
                }                                                              \
            }                                                                  \
            for (int64_t jb = 0; jb < nc; jb += GEMM_NR) {                     \
                for (int64_t ib = 0; ib < mc; ib += GEMM_MR) {                 \
                    micro_##SFX(kc, apack + ib * kc, j->bpack + jb * kc,       \
                                j->c + (ic + ib) * n + j->jc + jb, n,          \
                                TP_MIN(GEMM_MR, mc - ib),                      \
                                TP_MIN(GEMM_NR, nc - jb));                     \
                }                                                              \
            }                                                                  \
        }                                                                      \
        tp__free(apack);                                                       \
    }                                                                          \
                                                                               \
    static void gemm_blocked_##SFX(                                            \
        int64_t m, int64_t n, int64_t k, const T *a, int64_t rsa, int64_t csa, \
        const T *b, int64_t rsb, int64_t csb, T *c, T *bpack)                  \
    {                                                                          \
        memset(c, 0, sizeof(T) * (size_t)(m * n));                             \
        for (int64_t jc = 0; jc < n; jc += GEMM_NC) {                          \
            int64_t nc = TP_MIN(GEMM_NC, n - jc);                              \
            for (int64_t pc = 0; pc < k; pc += GEMM_KC) {                      \
                int64_t kc = TP_MIN(GEMM_KC, k - pc);                          \
                for (int64_t jb = 0; jb < nc; jb += GEMM_NR) {                 \
                    T *dst = bpack + jb * kc;                                  \
                    int64_t w = TP_MIN(GEMM_NR, nc - jb);                      \
                    for (int64_t p = 0; p < kc; p++) {                         \
                        const T *src = b + (pc + p) * rsb + (jc + jb) * csb;   \
                        for (int64_t q = 0; q < GEMM_NR; q++) {                \
                            dst[p * GEMM_NR + q] = q < w ? src[q * csb] : 0;   \
                        }                                                      \
                    }                                                          \
                }                                                              \
                gemm_job_##SFX job = {a, rsa, csa, bpack, c, m,                \
                                      n, jc,  nc,  pc,    kc};                 \
                tp__parallel_for((m + GEMM_MC - 1) / GEMM_MC, 1,               \
                                 gemm_rows_##SFX, &job);                       \
            }                                                                  \
        }                                                                      \
    }

DEF_GEMM(f32, float)
DEF_GEMM(f64, double)

#if TP_HAVE_BLAS
// Row-major operand layout for cblas: false if it needs packing.
static bool
blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
            enum CBLAS_TRANSPOSE *tr, int64_t *ld)
{
    if (cols == 1) {
        cs = 1;
    }
    if (rows == 1) {
        rs = cols;
    }
    if (cs == 1 && rs >= TP_MAX(1, cols)) {
        *tr = CblasNoTrans;
        *ld = rs;
        return true;
    }
    if (rs == 1 && cs >= TP_MAX(1, rows)) {
        *tr = CblasTrans;
        *ld = cs;
        return true;
    }
    return false;
}
#endif

#define DEF_GEMM_ENTRY(SFX, T, CBLAS_FN)                                       \
    void tp__gemm_##SFX(int64_t m, int64_t n, int64_t k, const T *a,           \
                        int64_t rsa, int64_t csa, const T *b, int64_t rsb,     \
                        int64_t csb, T *c)                                     \
    {                                                                          \
        if (m == 0 || n == 0) {                                                \
            return;                                                            \
        }                                                                      \
        if (k == 0) {                                                          \
            memset(c, 0, sizeof(T) * (size_t)(m * n));                         \
            return;                                                            \
        }                                                                      \
        if (TP_HAVE_BLAS && !gemm_fallback_forced &&                           \
            gemm_blas_##SFX(m, n, k, a, rsa, csa, b, rsb, csb, c)) {           \
            return;                                                            \
        }                                                                      \
        T *bpack = tp__alloc(sizeof(T) * GEMM_KC * (GEMM_NC + GEMM_NR));       \
        if (bpack) {                                                           \
            gemm_blocked_##SFX(m, n, k, a, rsa, csa, b, rsb, csb, c, bpack);   \
        } else {                                                               \
            /* No memory for packing: the plain triple loop needs none. */     \
            for (int64_t i = 0; i < m; i++) {                                  \
                for (int64_t j = 0; j < n; j++) {                              \
                    T s = 0;                                                   \
                    for (int64_t p = 0; p < k; p++) {                          \
                        s += a[i * rsa + p * csa] * b[p * rsb + j * csb];      \
                    }                                                          \
                    c[i * n + j] = s;                                          \
                }                                                              \
            }                                                                  \
        }                                                                      \
        tp__free(bpack);                                                       \
    }

#if TP_HAVE_BLAS
#define DEF_GEMM_BLAS(SFX, T, CBLAS_FN)                                        \
    static bool gemm_blas_##SFX(int64_t m, int64_t n, int64_t k, const T *a,   \
                                int64_t rsa, int64_t csa, const T *b,          \
                                int64_t rsb, int64_t csb, T *c)                \
    {                                                                          \
        enum CBLAS_TRANSPOSE ta, tb;                                           \
        int64_t lda, ldb;                                                      \
        if (!blas_layout(m, k, rsa, csa, &ta, &lda) ||                         \
            !blas_layout(k, n, rsb, csb, &tb, &ldb) || m > INT32_MAX ||        \
            n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX ||               \
            ldb > INT32_MAX) {                                                 \
            return false;                                                      \
        }                                                                      \
        CBLAS_FN(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1, a,          \
                 (int)lda, b, (int)ldb, 0, c, (int)n);                         \
        return true;                                                           \
    }
DEF_GEMM_BLAS(f32, float, cblas_sgemm)
DEF_GEMM_BLAS(f64, double, cblas_dgemm)
#else
#define DEF_GEMM_NOBLAS(SFX, T)                                                \
    static bool gemm_blas_##SFX(int64_t m, int64_t n, int64_t k, const T *a,   \
                                int64_t rsa, int64_t csa, const T *b,          \
                                int64_t rsb, int64_t csb, T *c)                \
    {                                                                          \
        return false;                                                          \
    }
DEF_GEMM_NOBLAS(f32, float)
DEF_GEMM_NOBLAS(f64, double)
#endif

DEF_GEMM_ENTRY(f32, float, cblas_sgemm)
DEF_GEMM_ENTRY(f64, double, cblas_dgemm)

tp_status
tp__k_matmul(const tp_tensor *a, const tp_tensor *b, tp_tensor **out_p,
             tp_error **err_p)
{
    tp_status st = tp__k_check_float("matmul", a, err_p);
    if (st == TP_OK) {
        st = tp__k_check_float("matmul", b, err_p);
    }
    if (st != TP_OK) {
        return st;
    }
    char x[128], y[128];
    if (a->t_ndim < 2 || b->t_ndim < 2 || a->t_dtype != b->t_dtype ||
        a->t_shape[a->t_ndim - 1] != b->t_shape[b->t_ndim - 2]) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "matmul: cannot multiply %s %s by %s %s (need >= 2-d operands "
            "with matching inner sizes and one dtype)",
            tp_dtype_name(a->t_dtype),
            tp__shape_str(a->t_ndim, a->t_shape, x, sizeof(x)),
            tp_dtype_name(b->t_dtype),
            tp__shape_str(b->t_ndim, b->t_shape, y, sizeof(y)));
    }
    int64_t m = a->t_shape[a->t_ndim - 2], k = a->t_shape[a->t_ndim - 1];
    int64_t n = b->t_shape[b->t_ndim - 1];
    // Broadcast the batch dims.
    int bna = a->t_ndim - 2, bnb = b->t_ndim - 2;
    int bnd = TP_MAX(bna, bnb);
    int64_t bshape[TP_TENSOR_MAX_DIMS], ast[TP_TENSOR_MAX_DIMS],
        bst[TP_TENSOR_MAX_DIMS];
    for (int i = 0; i < bnd; i++) {
        int ia = i - (bnd - bna), ib = i - (bnd - bnb);
        int64_t sa = ia >= 0 ? a->t_shape[ia] : 1;
        int64_t sb = ib >= 0 ? b->t_shape[ib] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            return tp__error_set(
                err_p, TP_EINVAL, "matmul: batch dims of %s and %s differ",
                tp__shape_str(a->t_ndim, a->t_shape, x, sizeof(x)),
                tp__shape_str(b->t_ndim, b->t_shape, y, sizeof(y)));
        }
        bshape[i] = sa == 1 ? sb : sa;
        ast[i] = (ia >= 0 && sa != 1) ? a->t_strides[ia] : 0;
        bst[i] = (ib >= 0 && sb != 1) ? b->t_strides[ib] : 0;
    }
    int64_t oshape[TP_TENSOR_MAX_DIMS];
    memcpy(oshape, bshape, sizeof(int64_t) * (size_t)bnd);
    oshape[bnd] = m;
    oshape[bnd + 1] = n;
    tp_tensor *o;
    st = tp_tensor_empty(a->t_dtype, bnd + 2, oshape, &o, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t rsa = a->t_strides[a->t_ndim - 2],
            csa = a->t_strides[a->t_ndim - 1];
    int64_t rsb = b->t_strides[b->t_ndim - 2],
            csb = b->t_strides[b->t_ndim - 1];
    int64_t batches = tp__shape_numel(bnd, bshape);
    size_t es = tp_dtype_size(a->t_dtype);
    // A dense batched A times a shared 2-D B is one big gemm.
    if (bnb == 0 && tp_tensor_is_contiguous(a) && batches > 1) {
        m *= batches;
        rsa = k;
        csa = 1;
        batches = 1;
        bnd = 0;
    }
    int64_t idx[TP_TENSOR_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < batches; bi++) {
        int64_t aoff = 0, boff = 0;
        for (int i = 0; i < bnd; i++) {
            aoff += idx[i] * ast[i];
            boff += idx[i] * bst[i];
        }
        const char *ap = tp__tensor_ptr(a) + aoff * (int64_t)es;
        const char *bp = tp__tensor_ptr(b) + boff * (int64_t)es;
        char *cp = tp__tensor_ptr(o) + bi * m * n * (int64_t)es;
        if (a->t_dtype == TP_F32) {
            tp__gemm_f32(m, n, k, (const float *)(const void *)ap, rsa, csa,
                         (const float *)(const void *)bp, rsb, csb,
                         (float *)(void *)cp);
        } else {
            tp__gemm_f64(m, n, k, (const double *)(const void *)ap, rsa, csa,
                         (const double *)(const void *)bp, rsb, csb,
                         (double *)(void *)cp);
        }
        for (int i = bnd - 1; i >= 0; i--) {
            if (++idx[i] < bshape[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
    *out_p = o;
    return TP_OK;
}

// ---- softmax ---------------------------------------------------------------

#define DEF_SOFTMAX(SFX, T, EXP_)                                              \
    static void softmax_##SFX(const T *x, T *y, int64_t outer, int64_t d,      \
                              int64_t inner, bool log_)                        \
    {                                                                          \
        for (int64_t o = 0; o < outer; o++) {                                  \
            for (int64_t in = 0; in < inner; in++) {                           \
                const T *xr = x + o * d * inner + in;                          \
                T *yr = y + o * d * inner + in;                                \
                T mx = -INFINITY;                                              \
                for (int64_t i = 0; i < d; i++) {                              \
                    mx = xr[i * inner] > mx ? xr[i * inner] : mx;              \
                }                                                              \
                if (mx == -INFINITY) {                                         \
                    mx = 0; /* all -inf: keep the nan/inf semantics */         \
                }                                                              \
                double sum = 0;                                                \
                for (int64_t i = 0; i < d; i++) {                              \
                    T e = EXP_(xr[i * inner] - mx);                            \
                    sum += e;                                                  \
                    if (!log_) {                                               \
                        yr[i * inner] = e;                                     \
                    }                                                          \
                }                                                              \
                if (log_) {                                                    \
                    /* (x - max) - log(sum): no rounding of max + log. */      \
                    T ls = (T)log(sum);                                        \
                    for (int64_t i = 0; i < d; i++) {                          \
                        yr[i * inner] = (xr[i * inner] - mx) - ls;             \
                    }                                                          \
                } else {                                                       \
                    T inv = (T)(1.0 / sum);                                    \
                    for (int64_t i = 0; i < d; i++) {                          \
                        yr[i * inner] *= inv;                                  \
                    }                                                          \
                }                                                              \
            }                                                                  \
        }                                                                      \
    }

DEF_SOFTMAX(f32, float, expf)
DEF_SOFTMAX(f64, double, exp)

tp_status
tp__k_softmax(const tp_tensor *a, int dim, bool log_, tp_tensor **out_p,
              tp_error **err_p)
{
    const char *op = log_ ? "log_softmax" : "softmax";
    tp_status st = tp__k_check_float(op, a, err_p);
    if (st != TP_OK) {
        return st;
    }
    int d;
    if (a->t_ndim == 0 ? (dim != 0 && dim != -1)
                       : !tp__dim_norm(a->t_ndim, dim, &d)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: dim %d out of range for %d-d", op, dim,
                             a->t_ndim);
    }
    if (a->t_ndim == 0) {
        d = 0;
    }
    tp_tensor *c, *o;
    st = tp__contiguous_raw(a, &c, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp_tensor_empty(a->t_dtype, a->t_ndim, a->t_shape, &o, err_p);
    if (st == TP_OK && tp_tensor_numel(a) > 0) {
        int64_t outer = tp__shape_numel(d, a->t_shape);
        int64_t len = a->t_ndim ? a->t_shape[d] : 1;
        int64_t inner =
            a->t_ndim ? tp__shape_numel(a->t_ndim - d - 1, a->t_shape + d + 1)
                      : 1;
        if (a->t_dtype == TP_F32) {
            softmax_f32((const float *)(const void *)tp__tensor_ptr(c),
                        (float *)(void *)tp__tensor_ptr(o), outer, len, inner,
                        log_);
        } else {
            softmax_f64((const double *)(const void *)tp__tensor_ptr(c),
                        (double *)(void *)tp__tensor_ptr(o), outer, len, inner,
                        log_);
        }
    }
    tp_tensor_unref(c);
    if (st == TP_OK) {
        *out_p = o;
    }
    return st;
}
