// SPDX-License-Identifier: Apache-2.0
// kernels.c - CPU kernels for f32/f64: the strided iterator, broadcasting
// elementwise ops, axpy and reductions. gemm, matmul and softmax are in
// kernels_dense.c. Nothing here records autograd nodes.
//
// This file is built with -O3 -ffp-contract=fast (see CMakeLists.txt) so
// that the dense inner loops vectorise.

#include <math.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "core/elementwise.h"
#include "error.h"
#include "platform.h"

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

// add: the dense case is core's sum kernel (core/elementwise.h), the one
// the collectives and the agent's tp.add run; broadcast and strided rows
// keep the loops above.
#define ADD_ROW(SFX, T, DT)                                                    \
    BIN_ROW(add_strided_##SFX, T, x + y)                                       \
    static void add_##SFX(void *o, int64_t so, const void *a, int64_t sa,      \
                          const void *b, int64_t sb, int64_t n, double s)      \
    {                                                                          \
        if (so == 1 && sa == 1 && sb == 1) {                                   \
            tp__elementwise3(TP__EW_SUM, DT, o, a, b, (size_t)n);              \
            return;                                                            \
        }                                                                      \
        add_strided_##SFX(o, so, a, sa, b, sb, n, s);                          \
    }

ADD_ROW(f32, float, TP_F32)
ADD_ROW(f64, double, TP_F64)

#define BIN_ROWS(T, SFX, POW_)                                                 \
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
