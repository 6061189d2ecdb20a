// SPDX-License-Identifier: Apache-2.0
// reduce_test.c - the reduction kernels of collectives/reduce.c: every
// supported (op, dtype) against a scalar reference computed in double (for
// floating dtypes, rounded once to the dtype) or in 64-bit integers
// (truncated to the width), on seeded random data, for sizes with odd
// tails, unaligned starts, the in-place and 3-operand forms with every
// aliasing pattern, guard bytes after the end, NaN propagation, signed
// zeros, integer wraparound, the supported-pair table, errors and avg.

#include "tp_test.h"

#include <math.h>

#include <tpipe/tensor.h>

#include "collectives/reduce.h"
#include "core/tensor_impl.h"

#define NOPS  8
#define GUARD 64 // bytes checked after each buffer

static const tp_reduce_op all_ops[NOPS] = {
    TP_REDUCE_SUM, TP_REDUCE_PRODUCT, TP_REDUCE_MIN, TP_REDUCE_MAX,
    TP_REDUCE_AVG, TP_REDUCE_BAND,    TP_REDUCE_BOR, TP_REDUCE_BXOR,
};
static const tp_dtype all_types[] = {
    TP_F32, TP_F64, TP_F16, TP_BF16, TP_I8, TP_U8, TP_I32, TP_I64, TP_BOOL,
};
static const size_t sizes[] = {0, 1, 7, 33, 1000, 4099};

// ---- the documented table, written out independently of reduce.c ----

static bool
is_float(tp_dtype dt)
{
    return dt == TP_F32 || dt == TP_F64 || dt == TP_F16 || dt == TP_BF16;
}

static bool
is_int(tp_dtype dt)
{
    return dt == TP_I8 || dt == TP_U8 || dt == TP_I32 || dt == TP_I64;
}

static bool
expect_supported(tp_reduce_op op, tp_dtype dt)
{
    switch (op) {
    case TP_REDUCE_SUM:
    case TP_REDUCE_PRODUCT:
        return is_float(dt) || is_int(dt);
    case TP_REDUCE_MIN:
    case TP_REDUCE_MAX:
        return is_float(dt) || is_int(dt) || dt == TP_BOOL;
    case TP_REDUCE_AVG:
        return is_float(dt);
    case TP_REDUCE_BAND:
    case TP_REDUCE_BOR:
    case TP_REDUCE_BXOR:
        return is_int(dt) || dt == TP_BOOL;
    }
    return false;
}

// ---- random data ----

static uint64_t rng_state;

static uint64_t
rng_next(void)
{
    // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static void
fill_random(tp_dtype dt, void *p, size_t n)
{
    size_t esz = tp_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        char *e = (char *)p + i * esz;
        uint64_t r = rng_next();
        if (is_float(dt)) {
            // [-4, 4) with some exact zeros of both signs and small ints,
            // so min/max see ties and signed zeros.
            double v = ((double)(r >> 11) / 9007199254740992.0) * 8.0 - 4.0;
            switch (r & 15) {
            case 0:
                v = 0.0;
                break;
            case 1:
                v = -0.0;
                break;
            case 2:
                v = (double)((int)(r >> 40) % 5 - 2);
                break;
            default:
                break;
            }
            tp__store_f64(e, dt, v);
        } else if (dt == TP_BOOL) {
            // Any nonzero byte is true.
            uint8_t b = (uint8_t)(r >> 32);
            *(uint8_t *)e = (r & 1) ? 0 : b;
        } else {
            memcpy(e, &r, esz); // full range: sums and products wrap
        }
    }
}

// ---- the scalar reference ----

static double
ref_fmin(double x, double y)
{
    if (isnan(x) || isnan(y)) {
        return NAN;
    }
    return x < y ? x : y;
}

static double
ref_fmax(double x, double y)
{
    if (isnan(x) || isnan(y)) {
        return NAN;
    }
    return x > y ? x : y;
}

static void
store_int(tp_dtype dt, void *p, uint64_t v)
{
    switch (dt) {
    case TP_I8:
    case TP_U8:
    case TP_BOOL: {
        uint8_t x = (uint8_t)v;
        memcpy(p, &x, 1);
        return;
    }
    case TP_I32: {
        uint32_t x = (uint32_t)v;
        memcpy(p, &x, 4);
        return;
    }
    case TP_I64:
        memcpy(p, &v, 8);
        return;
    default:
        TP_CHECKF(false, "store_int: dtype %s", tp_dtype_name(dt));
    }
}

// out = x OP y for one element.
static void
ref_elem(tp_reduce_op op, tp_dtype dt, const void *x, const void *y, void *out)
{
    if (is_float(dt)) {
        double a = tp__load_f64(x, dt), b = tp__load_f64(y, dt), r = 0;
        switch (op) {
        case TP_REDUCE_SUM:
        case TP_REDUCE_AVG:
            r = a + b; // then rounded to the dtype: see below
            break;
        case TP_REDUCE_PRODUCT:
            r = a * b;
            break;
        case TP_REDUCE_MIN:
            r = ref_fmin(a, b);
            break;
        case TP_REDUCE_MAX:
            r = ref_fmax(a, b);
            break;
        default:
            TP_CHECKF(false, "ref: %s on %s", tp__reduce_op_name(op),
                      tp_dtype_name(dt));
        }
        // Min/max select an input: keep its exact bits (signed zeros).
        if ((op == TP_REDUCE_MIN || op == TP_REDUCE_MAX) && !isnan(r)) {
            // The first operand only if strictly better: ties (-0 vs +0)
            // give the second, as torch.maximum's "a > b ? a : b".
            bool take_x = op == TP_REDUCE_MIN ? a < b : a > b;
            memcpy(out, take_x ? x : y, tp_dtype_size(dt));
            return;
        }
        // double -> dtype through f32 for f16/bf16: a double rounding that
        // is innocuous (24 >= 2 * 11 + 2), i.e. equal to rounding once.
        tp__store_f64(out, dt, r);
        return;
    }
    if (dt == TP_BOOL) {
        bool a = *(const uint8_t *)x != 0, b = *(const uint8_t *)y != 0;
        bool r = false;
        switch (op) {
        case TP_REDUCE_MIN:
        case TP_REDUCE_BAND:
            r = a && b;
            break;
        case TP_REDUCE_MAX:
        case TP_REDUCE_BOR:
            r = a || b;
            break;
        case TP_REDUCE_BXOR:
            r = a != b;
            break;
        default:
            TP_CHECKF(false, "ref: %s on bool", tp__reduce_op_name(op));
        }
        *(uint8_t *)out = r ? 1 : 0;
        return;
    }
    int64_t a = tp__load_i64(x, dt), b = tp__load_i64(y, dt);
    uint64_t r = 0;
    switch (op) {
    case TP_REDUCE_SUM:
        r = (uint64_t)a + (uint64_t)b; // wraps mod 2^64, then truncated
        break;
    case TP_REDUCE_PRODUCT:
        r = (uint64_t)a * (uint64_t)b;
        break;
    case TP_REDUCE_MIN:
        r = (uint64_t)(a < b ? a : b);
        break;
    case TP_REDUCE_MAX:
        r = (uint64_t)(a > b ? a : b);
        break;
    case TP_REDUCE_BAND:
        r = (uint64_t)a & (uint64_t)b;
        break;
    case TP_REDUCE_BOR:
        r = (uint64_t)a | (uint64_t)b;
        break;
    case TP_REDUCE_BXOR:
        r = (uint64_t)a ^ (uint64_t)b;
        break;
    default:
        TP_CHECKF(false, "ref: %s on %s", tp__reduce_op_name(op),
                  tp_dtype_name(dt));
    }
    store_int(dt, out, r);
}

static void
ref_array(tp_reduce_op op, tp_dtype dt, void *out, const void *a, const void *b,
          size_t n)
{
    size_t esz = tp_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        ref_elem(op, dt, (const char *)a + i * esz, (const char *)b + i * esz,
                 (char *)out + i * esz);
    }
}

static bool
elem_is_nan(tp_dtype dt, const void *p)
{
    return is_float(dt) && isnan(tp__load_f64(p, dt));
}

// Bitwise equality, except that any NaN matches any NaN.
static void
check_equal(const char *what, tp_reduce_op op, tp_dtype dt, const void *got,
            const void *want, size_t n)
{
    size_t esz = tp_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        const char *g = (const char *)got + i * esz;
        const char *w = (const char *)want + i * esz;
        if (elem_is_nan(dt, w) && elem_is_nan(dt, g)) {
            continue;
        }
        if (memcmp(g, w, esz) != 0) {
            uint64_t gv = 0, wv = 0;
            memcpy(&gv, g, esz);
            memcpy(&wv, w, esz);
            TP_CHECKF(false,
                      "%s: %s %s n=%zu: element %zu is 0x%" PRIx64
                      " (%g), expected 0x%" PRIx64 " (%g)",
                      what, tp__reduce_op_name(op), tp_dtype_name(dt), n, i, gv,
                      tp__load_f64(g, dt), wv, tp__load_f64(w, dt));
        }
    }
}

// ---- buffers with an unaligned start and guard bytes after the end ----

typedef struct buf {
    char *b_base;
    char *b_data; // b_base + skew elements
    size_t b_len; // n * esz
} buf;

static void
buf_init(buf *b, tp_dtype dt, size_t n, size_t skew)
{
    size_t esz = tp_dtype_size(dt);
    b->b_len = n * esz;
    b->b_base = malloc(64 + skew * esz + b->b_len + GUARD);
    TP_CHECK(b->b_base != NULL);
    // malloc is 16-aligned; start 64 in, then skew by whole elements.
    b->b_data = b->b_base + 64 + skew * esz;
    memset(b->b_data + b->b_len, 0xa5, GUARD);
}

static void
buf_check_guard(const buf *b, const char *what)
{
    for (size_t i = 0; i < GUARD; i++) {
        TP_CHECKF((unsigned char)b->b_data[b->b_len + i] == 0xa5,
                  "%s: byte %zu past the end was written", what, i);
    }
}

static void
buf_fini(buf *b)
{
    free(b->b_base);
}

// Runs every form on random a, b of @n elements and compares with the
// reference. @skew shifts the starts off the vector alignment.
static void
run_forms(tp_reduce_op op, tp_dtype dt, size_t n, size_t skew)
{
    size_t esz = tp_dtype_size(dt);
    buf a, b, d, want, want_self, a0, b0;
    buf_init(&a, dt, n, skew);
    buf_init(&b, dt, n, skew);
    buf_init(&d, dt, n, skew);
    buf_init(&want, dt, n, 0);
    buf_init(&want_self, dt, n, 0);
    buf_init(&a0, dt, n, 0);
    buf_init(&b0, dt, n, 0);
    fill_random(dt, a0.b_data, n);
    fill_random(dt, b0.b_data, n);
    ref_array(op, dt, want.b_data, a0.b_data, b0.b_data, n);
    ref_array(op, dt, want_self.b_data, a0.b_data, a0.b_data, n);

    // tp__reduce: d = d OP s.
    memcpy(a.b_data, a0.b_data, n * esz);
    memcpy(b.b_data, b0.b_data, n * esz);
    tp__reduce(op, dt, a.b_data, b.b_data, n);
    check_equal("reduce", op, dt, a.b_data, want.b_data, n);
    check_equal("reduce src kept", op, dt, b.b_data, b0.b_data, n);
    buf_check_guard(&a, "reduce");

    // tp__reduce with dst == src: d = d OP d.
    memcpy(a.b_data, a0.b_data, n * esz);
    tp__reduce(op, dt, a.b_data, a.b_data, n);
    check_equal("reduce self", op, dt, a.b_data, want_self.b_data, n);
    buf_check_guard(&a, "reduce self");

    // tp__reduce3, dst distinct: a and b untouched.
    memcpy(a.b_data, a0.b_data, n * esz);
    memcpy(b.b_data, b0.b_data, n * esz);
    memset(d.b_data, 0x5a, n * esz);
    tp__reduce3(op, dt, d.b_data, a.b_data, b.b_data, n);
    check_equal("reduce3", op, dt, d.b_data, want.b_data, n);
    check_equal("reduce3 a kept", op, dt, a.b_data, a0.b_data, n);
    check_equal("reduce3 b kept", op, dt, b.b_data, b0.b_data, n);
    buf_check_guard(&d, "reduce3");

    // tp__reduce3, dst == a.
    tp__reduce3(op, dt, a.b_data, a.b_data, b.b_data, n);
    check_equal("reduce3 dst=a", op, dt, a.b_data, want.b_data, n);
    check_equal("reduce3 dst=a b kept", op, dt, b.b_data, b0.b_data, n);
    buf_check_guard(&a, "reduce3 dst=a");

    // tp__reduce3, dst == b: the operand order is still a OP b.
    memcpy(a.b_data, a0.b_data, n * esz);
    tp__reduce3(op, dt, b.b_data, a.b_data, b.b_data, n);
    check_equal("reduce3 dst=b", op, dt, b.b_data, want.b_data, n);
    check_equal("reduce3 dst=b a kept", op, dt, a.b_data, a0.b_data, n);
    buf_check_guard(&b, "reduce3 dst=b");

    // tp__reduce3, dst == a == b.
    tp__reduce3(op, dt, a.b_data, a.b_data, a.b_data, n);
    check_equal("reduce3 dst=a=b", op, dt, a.b_data, want_self.b_data, n);
    buf_check_guard(&a, "reduce3 dst=a=b");

    // tp__reduce3, a == b, dst distinct.
    memcpy(a.b_data, a0.b_data, n * esz);
    tp__reduce3(op, dt, d.b_data, a.b_data, a.b_data, n);
    check_equal("reduce3 a=b", op, dt, d.b_data, want_self.b_data, n);

    buf_fini(&a);
    buf_fini(&b);
    buf_fini(&d);
    buf_fini(&want);
    buf_fini(&want_self);
    buf_fini(&a0);
    buf_fini(&b0);
}

// ---- cases ----

static void
test_all_ops_all_dtypes(void)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    int pairs = 0;
    for (size_t o = 0; o < NOPS; o++) {
        for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
            tp_reduce_op op = all_ops[o];
            tp_dtype dt = all_types[t];
            if (!expect_supported(op, dt)) {
                continue;
            }
            TP_CHECK_OK(tp__reduce_check(op, dt, NULL), NULL);
            pairs++;
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                run_forms(op, dt, sizes[s], 0);
                run_forms(op, dt, sizes[s], 1);
                run_forms(op, dt, sizes[s], 3);
            }
        }
    }
    // 4 float dtypes x 5 ops + 4 ints x 7 ops + bool x 5 ops.
    TP_CHECK_EQ(pairs, 4 * 5 + 4 * 7 + 5);
}

static void
test_check_table(void)
{
    for (size_t o = 0; o < NOPS; o++) {
        for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
            tp_reduce_op op = all_ops[o];
            tp_dtype dt = all_types[t];
            tp_error *err = NULL;
            tp_status st = tp__reduce_check(op, dt, &err);
            if (expect_supported(op, dt)) {
                TP_CHECK_OK(st, err);
                TP_CHECK(err == NULL);
                continue;
            }
            TP_CHECKF(st == TP_EINVAL, "%s on %s: %s", tp__reduce_op_name(op),
                      tp_dtype_name(dt), tp_status_name(st));
            TP_CHECK(err != NULL);
            TP_CHECK_EQ(tp_error_status(err), TP_EINVAL);
            TP_CHECK_STR_CONTAINS(tp_error_message(err),
                                  tp__reduce_op_name(op));
            TP_CHECK_STR_CONTAINS(tp_error_message(err), tp_dtype_name(dt));
            tp_error_unref(err);
            // err_p is optional.
            TP_CHECK_EQ(tp__reduce_check(op, dt, NULL), TP_EINVAL);
        }
    }
}

static void
test_check_unknown_values(void)
{
    tp_error *err = NULL;
    TP_CHECK_EQ(tp__reduce_check((tp_reduce_op)8, TP_F32, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unknown op 8");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "f32");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__reduce_check((tp_reduce_op)-1, TP_I32, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unknown op -1");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__reduce_check(TP_REDUCE_SUM, (tp_dtype)9, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unknown dtype 9");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "sum");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__reduce_check(TP_REDUCE_MAX, (tp_dtype)-3, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "unknown dtype -3");
    tp_error_unref(err);
    TP_CHECK_EQ(tp__reduce_check((tp_reduce_op)100, TP_F32, NULL), TP_EINVAL);
}

static void
test_op_names(void)
{
    static const char *const names[NOPS] = {
        "sum", "product", "min", "max", "avg", "band", "bor", "bxor",
    };
    for (size_t o = 0; o < NOPS; o++) {
        TP_CHECKF(strcmp(tp__reduce_op_name(all_ops[o]), names[o]) == 0,
                  "op %zu is \"%s\"", o, tp__reduce_op_name(all_ops[o]));
    }
    TP_CHECK(strcmp(tp__reduce_op_name((tp_reduce_op)8), "?") == 0);
    TP_CHECK(strcmp(tp__reduce_op_name((tp_reduce_op)-1), "?") == 0);
}

// NaN in dst, in src, in both, at the start, in the vector body and in
// the tail; the non-NaN lanes must be unaffected.
static void
test_nan_propagation(void)
{
    static const tp_dtype fdts[] = {TP_F32, TP_F64, TP_F16, TP_BF16};
    static const tp_reduce_op ops[] = {TP_REDUCE_MIN, TP_REDUCE_MAX};
    enum { N = 33 };
    for (size_t t = 0; t < 4; t++) {
        for (size_t o = 0; o < 2; o++) {
            tp_dtype dt = fdts[t];
            tp_reduce_op op = ops[o];
            _Alignas(16) char a[N * 8], b[N * 8], d[N * 8], a2[N * 8];
            size_t esz = tp_dtype_size(dt);
            for (size_t i = 0; i < N; i++) {
                tp__store_f64(a + i * esz, dt, (double)i - 10.0);
                tp__store_f64(b + i * esz, dt, 10.0 - (double)i);
            }
            // NaN only in a at 0 and 16, only in b at 1 and 31, in both
            // at 32; the comparison result would pick the other side.
            tp__store_f64(a + 0 * esz, dt, NAN);
            tp__store_f64(a + 16 * esz, dt, NAN);
            tp__store_f64(b + 1 * esz, dt, NAN);
            tp__store_f64(b + 31 * esz, dt, NAN);
            tp__store_f64(a + 32 * esz, dt, NAN);
            tp__store_f64(b + 32 * esz, dt, NAN);
            for (int form = 0; form < 3; form++) {
                memcpy(a2, a, N * esz);
                if (form == 0) {
                    tp__reduce(op, dt, a2, b, N);
                    memcpy(d, a2, N * esz);
                } else if (form == 1) {
                    tp__reduce3(op, dt, d, a, b, N);
                } else {
                    memcpy(d, b, N * esz);
                    tp__reduce3(op, dt, d, a2, d, N);
                }
                for (size_t i = 0; i < N; i++) {
                    double x = tp__load_f64(a + i * esz, dt);
                    double y = tp__load_f64(b + i * esz, dt);
                    double g = tp__load_f64(d + i * esz, dt);
                    if (isnan(x) || isnan(y)) {
                        TP_CHECKF(isnan(g), "%s %s form %d: [%zu] = %g",
                                  tp__reduce_op_name(op), tp_dtype_name(dt),
                                  form, i, g);
                    } else {
                        double w =
                            op == TP_REDUCE_MIN ? fmin(x, y) : fmax(x, y);
                        TP_CHECKF(g == w, "%s %s form %d: [%zu] = %g not %g",
                                  tp__reduce_op_name(op), tp_dtype_name(dt),
                                  form, i, g, w);
                    }
                }
            }
            // Sum and product propagate NaN too (IEEE).
            tp__reduce3(TP_REDUCE_SUM, dt, d, a, b, N);
            TP_CHECK(isnan(tp__load_f64(d + 1 * esz, dt)));
            TP_CHECK(isnan(tp__load_f64(d + 16 * esz, dt)));
        }
    }
}

// min/max of -0 and +0: every aliasing form gives what the distinct form
// gives (the operand order is kept when dst is b).
static void
test_signed_zero_order(void)
{
    static const tp_dtype fdts[] = {TP_F32, TP_F64, TP_F16, TP_BF16};
    static const tp_reduce_op ops[] = {TP_REDUCE_MIN, TP_REDUCE_MAX};
    enum { N = 37 };
    for (size_t t = 0; t < 4; t++) {
        for (size_t o = 0; o < 2; o++) {
            tp_dtype dt = fdts[t];
            tp_reduce_op op = ops[o];
            size_t esz = tp_dtype_size(dt);
            _Alignas(16) char a[N * 8], b[N * 8], want[N * 8], got[N * 8];
            _Alignas(16) char tmp[N * 8];
            for (size_t i = 0; i < N; i++) {
                tp__store_f64(a + i * esz, dt, (i & 1) ? -0.0 : 0.0);
                tp__store_f64(b + i * esz, dt, (i & 1) ? 0.0 : -0.0);
            }
            ref_array(op, dt, want, a, b, N);
            tp__reduce3(op, dt, got, a, b, N);
            check_equal("zeros distinct", op, dt, got, want, N);
            memcpy(got, a, N * esz);
            tp__reduce3(op, dt, got, got, b, N);
            check_equal("zeros dst=a", op, dt, got, want, N);
            memcpy(got, a, N * esz);
            tp__reduce(op, dt, got, b, N);
            check_equal("zeros reduce", op, dt, got, want, N);
            memcpy(got, b, N * esz);
            memcpy(tmp, a, N * esz);
            tp__reduce3(op, dt, got, tmp, got, N);
            check_equal("zeros dst=b", op, dt, got, want, N);
            // On ties the second operand wins: check that this case can
            // tell the two orders apart at all.
            TP_CHECK(memcmp(want, b, N * esz) == 0);
        }
    }
}

static void
test_integer_wraparound(void)
{
    {
        int8_t d[3] = {127, -128, 100}, s[3] = {1, -1, 100};
        tp__reduce(TP_REDUCE_SUM, TP_I8, d, s, 3);
        TP_CHECK_EQ(d[0], -128);
        TP_CHECK_EQ(d[1], 127);
        TP_CHECK_EQ(d[2], -56);
        int8_t p[2] = {-128, 16}, q[2] = {-1, 16};
        tp__reduce(TP_REDUCE_PRODUCT, TP_I8, p, q, 2);
        TP_CHECK_EQ(p[0], -128);
        TP_CHECK_EQ(p[1], 0);
    }
    {
        uint8_t d[2] = {255, 0}, s[2] = {1, 255};
        tp__reduce(TP_REDUCE_SUM, TP_U8, d, s, 2);
        TP_CHECK_EQ(d[0], 0);
        TP_CHECK_EQ(d[1], 255);
        uint8_t p[1] = {255}, q[1] = {255};
        tp__reduce(TP_REDUCE_PRODUCT, TP_U8, p, q, 1);
        TP_CHECK_EQ(p[0], 1);
        // u8 is unsigned: 200 > 100.
        uint8_t m[1] = {200}, n[1] = {100};
        tp__reduce(TP_REDUCE_MAX, TP_U8, m, n, 1);
        TP_CHECK_EQ(m[0], 200);
    }
    {
        // Long enough for the vector loop, with the wrap in every lane.
        enum { N = 19 };
        int32_t d[N], s[N], p[N], q[N];
        for (int i = 0; i < N; i++) {
            d[i] = INT32_MAX;
            s[i] = 1 + i;
            p[i] = 65536;
            q[i] = 65536 * (i + 1);
        }
        tp__reduce(TP_REDUCE_SUM, TP_I32, d, s, N);
        tp__reduce(TP_REDUCE_PRODUCT, TP_I32, p, q, N);
        for (int i = 0; i < N; i++) {
            TP_CHECK_EQ(d[i], (int64_t)INT32_MIN + i);
            TP_CHECK_EQ(p[i], 0);
        }
    }
    {
        int64_t d[2] = {INT64_MAX, INT64_MIN}, s[2] = {1, -1};
        tp__reduce3(TP_REDUCE_SUM, TP_I64, d, d, s, 2);
        TP_CHECK(d[0] == INT64_MIN);
        TP_CHECK(d[1] == INT64_MAX);
        int64_t p[1] = {INT64_MIN}, q[1] = {-1};
        tp__reduce(TP_REDUCE_PRODUCT, TP_I64, p, q, 1);
        TP_CHECK(p[0] == INT64_MIN);
        int64_t m[1] = {((int64_t)1 << 62) + 1};
        tp__reduce3(TP_REDUCE_PRODUCT, TP_I64, m, m, m, 1);
        // (2^62 + 1)^2 = 2^124 + 2^63 + 1 = 2^63 + 1 (mod 2^64).
        TP_CHECK(m[0] == INT64_MIN + 1);
    }
}

static void
test_bool(void)
{
    // Any nonzero byte is true; results are exactly 0 or 1.
    uint8_t a[4] = {0, 0, 2, 0x80}, b[4] = {0, 7, 0, 0x40};
    uint8_t d[4];
    tp__reduce3(TP_REDUCE_BAND, TP_BOOL, d, a, b, 4);
    TP_CHECK(d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == 1);
    tp__reduce3(TP_REDUCE_MIN, TP_BOOL, d, a, b, 4);
    TP_CHECK(d[0] == 0 && d[1] == 0 && d[2] == 0 && d[3] == 1);
    tp__reduce3(TP_REDUCE_BOR, TP_BOOL, d, a, b, 4);
    TP_CHECK(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 1);
    tp__reduce3(TP_REDUCE_MAX, TP_BOOL, d, a, b, 4);
    TP_CHECK(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 1);
    tp__reduce3(TP_REDUCE_BXOR, TP_BOOL, d, a, b, 4);
    TP_CHECK(d[0] == 0 && d[1] == 1 && d[2] == 1 && d[3] == 0);
}

static void
test_avg_finish(void)
{
    static const tp_dtype fdts[] = {TP_F32, TP_F64, TP_F16, TP_BF16};
    static const int counts[] = {1, 2, 3, 7, 1000};
    rng_state = 42;
    for (size_t t = 0; t < 4; t++) {
        for (size_t c = 0; c < 5; c++) {
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                tp_dtype dt = fdts[t];
                size_t n = sizes[s], esz = tp_dtype_size(dt);
                buf g, w;
                buf_init(&g, dt, n, 1);
                buf_init(&w, dt, n, 0);
                fill_random(dt, g.b_data, n);
                for (size_t i = 0; i < n; i++) {
                    double v = tp__load_f64(g.b_data + i * esz, dt);
                    // Rounded once to the dtype (via f32 for f16/bf16:
                    // innocuous double rounding, as in the reference).
                    tp__store_f64(w.b_data + i * esz, dt, v / counts[c]);
                }
                tp__reduce_avg_finish(dt, g.b_data, n, counts[c]);
                check_equal("avg_finish", TP_REDUCE_AVG, dt, g.b_data, w.b_data,
                            n);
                buf_check_guard(&g, "avg_finish");
                buf_fini(&g);
                buf_fini(&w);
            }
        }
    }
}

// An all-reduce of 3 ranks done the way the ring does it: avg = sum, then
// one division at the end.
static void
test_avg_end_to_end(void)
{
    enum { N = 45 };
    float r0[N], r1[N], r2[N];
    uint16_t h0[N], h1[N], h2[N];
    for (int i = 0; i < N; i++) {
        r0[i] = (float)i;
        r1[i] = 2.0f * (float)i;
        r2[i] = 1.0f;
        h0[i] = tp__f32_to_f16((float)i);
        h1[i] = tp__f32_to_f16(2.0f * (float)i);
        h2[i] = tp__f32_to_f16(1.0f);
    }
    TP_CHECK_OK(tp__reduce_check(TP_REDUCE_AVG, TP_F32, NULL), NULL);
    tp__reduce(TP_REDUCE_AVG, TP_F32, r0, r1, N);
    tp__reduce3(TP_REDUCE_AVG, TP_F32, r0, r2, r0, N);
    tp__reduce_avg_finish(TP_F32, r0, N, 3);
    tp__reduce(TP_REDUCE_AVG, TP_F16, h0, h1, N);
    tp__reduce(TP_REDUCE_AVG, TP_F16, h0, h2, N);
    tp__reduce_avg_finish(TP_F16, h0, N, 3);
    for (int i = 0; i < N; i++) {
        float want = (3.0f * (float)i + 1.0f) / 3.0f;
        TP_CHECKF(r0[i] == want, "f32 [%d] = %g, expected %g", i, r0[i], want);
        uint16_t hw = tp__f32_to_f16(want);
        TP_CHECKF(h0[i] == hw, "f16 [%d] = %g, expected %g", i,
                  tp__f16_to_f32(h0[i]), tp__f16_to_f32(hw));
    }
}

// f16 and bf16 round to nearest even once per step.
static void
test_half_rounding(void)
{
    // f16: 2048 + 1 is a tie between 2048 and 2050: even is 2048;
    // 2050 + 1 ties between 2050 and 2052: even is 2052.
    uint16_t d[2] = {tp__f32_to_f16(2048.0f), tp__f32_to_f16(2050.0f)};
    uint16_t s[2] = {tp__f32_to_f16(1.0f), tp__f32_to_f16(1.0f)};
    tp__reduce(TP_REDUCE_SUM, TP_F16, d, s, 2);
    TP_CHECK(tp__f16_to_f32(d[0]) == 2048.0f);
    TP_CHECK(tp__f16_to_f32(d[1]) == 2052.0f);
    // bf16 has 8 significant bits: 256 + 1 -> 256, 258 + 1 -> 260.
    uint16_t e[2] = {tp__f32_to_bf16(256.0f), tp__f32_to_bf16(258.0f)};
    uint16_t f[2] = {tp__f32_to_bf16(1.0f), tp__f32_to_bf16(1.0f)};
    tp__reduce(TP_REDUCE_SUM, TP_BF16, e, f, 2);
    TP_CHECK(tp__bf16_to_f32(e[0]) == 256.0f);
    TP_CHECK(tp__bf16_to_f32(e[1]) == 260.0f);
    // f16 overflow goes to inf.
    uint16_t big[1] = {tp__f32_to_f16(60000.0f)};
    uint16_t two[1] = {tp__f32_to_f16(2.0f)};
    tp__reduce(TP_REDUCE_PRODUCT, TP_F16, big, two, 1);
    TP_CHECK(isinf(tp__f16_to_f32(big[0])));
}

static void
test_empty(void)
{
    // n == 0 touches nothing, so NULL buffers are fine.
    for (size_t o = 0; o < NOPS; o++) {
        for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
            if (expect_supported(all_ops[o], all_types[t])) {
                tp__reduce(all_ops[o], all_types[t], NULL, NULL, 0);
                tp__reduce3(all_ops[o], all_types[t], NULL, NULL, NULL, 0);
            }
        }
    }
    for (size_t t = 0; t < 4; t++) {
        tp__reduce_avg_finish(all_types[t], NULL, 0, 3);
    }
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_all_ops_all_dtypes, 120),
    TP_TEST_CASE(test_check_table),
    TP_TEST_CASE(test_check_unknown_values),
    TP_TEST_CASE(test_op_names),
    TP_TEST_CASE(test_nan_propagation),
    TP_TEST_CASE(test_signed_zero_order),
    TP_TEST_CASE(test_integer_wraparound),
    TP_TEST_CASE(test_bool),
    TP_TEST_CASE(test_avg_finish),
    TP_TEST_CASE(test_avg_end_to_end),
    TP_TEST_CASE(test_half_rounding),
    TP_TEST_CASE(test_empty),
};

TP_TEST_MAIN(cases)
