// SPDX-License-Identifier: Apache-2.0
// kernels_dense.c - CPU kernels for f32/f64 over dense rows: gemm
// (cblas when built with BLAS, a blocked kernel otherwise), batched matmul
// and softmax. Nothing here records autograd nodes.
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
    return tp__blas_sgemm() != NULL;
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
        if (CBLAS_FN() == NULL || !blas_layout(m, k, rsa, csa, &ta, &lda) ||   \
            !blas_layout(k, n, rsb, csb, &tb, &ldb) || m > INT32_MAX ||        \
            n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX ||               \
            ldb > INT32_MAX) {                                                 \
            return false;                                                      \
        }                                                                      \
        CBLAS_FN()                                                             \
        (CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1, a, (int)lda, b,     \
         (int)ldb, 0, c, (int)n);                                              \
        return true;                                                           \
    }
DEF_GEMM_BLAS(f32, float, tp__blas_sgemm)
DEF_GEMM_BLAS(f64, double, tp__blas_dgemm)
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
