// SPDX-License-Identifier: Apache-2.0
// tensor_test.c - the tensor type: creation, refcounted storage, views,
// copies between dtypes, random generators and byte ranges.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <tpipe/tensor.h>

#include "tensor_impl.h" // tp__tensor_cache_trim
#include "ag_leak.h"
#include "tp_test.h"

static double
at(const tp_tensor *t, int64_t i)
{
    double v = NAN;
    TP_CHECK_OK(tp_tensor_item(t, i, &v), NULL);
    return v;
}

static tp_tensor *
arange_shaped(tp_dtype dt, int nd, const int64_t *shape)
{
    tp_tensor *r, *t;
    tp_error *err = NULL;
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        n *= shape[i];
    }
    TP_CHECK_OK(tp_tensor_arange(dt, 0, (double)n, 1, &r, &err), err);
    TP_CHECK_OK(tp_tensor_reshape(r, nd, shape, &t, &err), err);
    tp_tensor_unref(r);
    return t;
}

static void
t_dtypes(void)
{
    static const size_t sizes[] = {4, 8, 2, 2, 1, 1, 4, 8, 1};
    static const char *names[] = {"f32", "f64", "f16", "bf16", "i8",
                                  "u8",  "i32", "i64", "bool"};
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        TP_CHECK_EQ(tp_dtype_size((tp_dtype)d), sizes[d]);
        TP_CHECK(strcmp(tp_dtype_name((tp_dtype)d), names[d]) == 0);
        TP_CHECK_EQ(tp_dtype_is_floating((tp_dtype)d), d <= TP_BF16);
    }
    TP_CHECK_EQ(tp_dtype_size((tp_dtype)42), 0);
}

static void
t_create_fill(void)
{
    tp_tensor *t;
    tp_error *err = NULL;
    int64_t shape[3] = {2, 3, 4};
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        TP_CHECK_OK(tp_tensor_zeros((tp_dtype)d, 3, shape, &t, &err), err);
        TP_CHECK_EQ(tp_tensor_numel(t), 24);
        TP_CHECK_EQ(tp_tensor_nbytes(t), 24 * tp_dtype_size((tp_dtype)d));
        TP_CHECK(tp_tensor_is_contiguous(t));
        TP_CHECK_EQ(tp_tensor_strides(t)[0], 12);
        TP_CHECK_EQ(tp_tensor_strides(t)[2], 1);
        for (int i = 0; i < 24; i++) {
            TP_CHECK(at(t, i) == 0.0);
        }
        tp_tensor_unref(t);
        TP_CHECK_OK(tp_tensor_ones((tp_dtype)d, 3, shape, &t, &err), err);
        for (int i = 0; i < 24; i++) {
            TP_CHECK(at(t, i) == 1.0);
        }
        tp_tensor_unref(t);
        TP_CHECK_OK(tp_tensor_full((tp_dtype)d, 3, shape, 3.0, &t, &err), err);
        TP_CHECK(at(t, 23) == (d == TP_BOOL ? 1.0 : 3.0));
        tp_tensor_unref(t);
    }
    TP_CHECK_OK(tp_tensor_arange(TP_F64, 1, 2, 0.25, &t, &err), err);
    TP_CHECK_EQ(tp_tensor_numel(t), 4);
    TP_CHECK(at(t, 3) == 1.75);
    tp_tensor_unref(t);
    TP_CHECK_OK(tp_tensor_arange(TP_I64, 5, 0, -2, &t, &err), err);
    TP_CHECK_EQ(tp_tensor_numel(t), 3);
    TP_CHECK(at(t, 2) == 1.0);
    tp_tensor_unref(t);

    // A 0-d tensor has one element; a zero-size one has none.
    TP_CHECK_OK(tp_tensor_full(TP_F32, 0, NULL, 7, &t, &err), err);
    TP_CHECK_EQ(tp_tensor_numel(t), 1);
    TP_CHECK(at(t, 0) == 7.0);
    tp_tensor_unref(t);
    int64_t z[2] = {0, 5};
    TP_CHECK_OK(tp_tensor_ones(TP_F32, 2, z, &t, &err), err);
    TP_CHECK_EQ(tp_tensor_numel(t), 0);
    TP_CHECK(tp_tensor_data(t) != NULL);
    tp_tensor_unref(t);
}

static void
t_create_errors(void)
{
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    int64_t bad[2] = {2, -1};
    TP_CHECK_EQ(tp_tensor_empty(TP_F32, 2, bad, &t, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "negative size");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_tensor_empty(TP_F32, 9, bad, &t, &err), TP_EINVAL);
    tp_error_unref(err);
    TP_CHECK_EQ(tp_tensor_empty((tp_dtype)77, 1, bad, &t, NULL), TP_EINVAL);
    TP_CHECK_EQ(tp_tensor_arange(TP_F32, 0, 1, 0, &t, NULL), TP_EINVAL);
    TP_CHECK(t == NULL); // outputs are set only on success
}

static int blob_frees;

static void
blob_free(void *data, void *arg)
{
    TP_CHECK(arg == &blob_frees);
    blob_frees++;
    free(data);
}

static void
t_from_blob_lifetime(void)
{
    float *buf = malloc(sizeof(float) * 6);
    for (int i = 0; i < 6; i++) {
        buf[i] = (float)i;
    }
    int64_t shape[2] = {2, 3};
    tp_tensor *t, *v;
    tp_error *err = NULL;
    blob_frees = 0;
    TP_CHECK_OK(tp_tensor_from_blob(buf, TP_F32, 2, shape, blob_free,
                                    &blob_frees, &t, &err),
                err);
    TP_CHECK(tp_tensor_data(t) == buf);
    TP_CHECK_OK(tp_tensor_transpose(t, 0, 1, &v, &err), err);
    TP_CHECK(tp_tensor_shares_storage(t, v));
    tp_tensor_unref(t);
    TP_CHECK_EQ(blob_frees, 0); // the view keeps the storage
    TP_CHECK(at(v, 1) == 3.0);  // v[0][1] = t[1][0]
    tp_tensor_ref(v);
    tp_tensor_unref(v);
    TP_CHECK_EQ(blob_frees, 0);
    tp_tensor_unref(v);
    TP_CHECK_EQ(blob_frees, 1);

    // Failure leaves the buffer with the caller: no callback.
    int64_t bad[1] = {-3};
    TP_CHECK_EQ(tp_tensor_from_blob(buf, TP_F32, 1, bad, blob_free, &blob_frees,
                                    &t, NULL),
                TP_EINVAL);
    TP_CHECK_EQ(blob_frees, 1);
}

static void
t_views(void)
{
    int64_t shape[3] = {2, 3, 4};
    tp_tensor *t = arange_shaped(TP_F32, 3, shape);
    tp_tensor *v, *w;
    tp_error *err = NULL;

    // permute [2,3,4] -> [4,2,3]: v[i][j][k] = t[j][k][i]
    int perm[3] = {2, 0, 1};
    TP_CHECK_OK(tp_tensor_permute(t, perm, &v, &err), err);
    TP_CHECK(tp_tensor_shares_storage(t, v));
    TP_CHECK(!tp_tensor_is_contiguous(v));
    TP_CHECK_EQ(tp_tensor_shape(v)[0], 4);
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < 2; j++) {
            for (int k = 0; k < 3; k++) {
                TP_CHECK(at(v, i * 6 + j * 3 + k) == j * 12 + k * 4 + i);
            }
        }
    }
    // Reshaping a non-contiguous view copies; a contiguous one does not.
    int64_t flat[1] = {24};
    TP_CHECK_OK(tp_tensor_reshape(v, 1, flat, &w, &err), err);
    TP_CHECK(!tp_tensor_shares_storage(v, w));
    TP_CHECK(at(w, 1) == 4.0);
    tp_tensor_unref(w);
    int64_t infer[2] = {-1, 6};
    TP_CHECK_OK(tp_tensor_reshape(t, 2, infer, &w, &err), err);
    TP_CHECK(tp_tensor_shares_storage(t, w));
    TP_CHECK_EQ(tp_tensor_shape(w)[0], 4);
    tp_tensor_unref(w);
    // ... unless the strides allow it: the narrowed [2, 2, 4] is not
    // contiguous, but its last two dims are dense together.
    tp_tensor *nv;
    TP_CHECK_OK(tp_tensor_narrow(t, 1, 1, 2, &nv, &err), err);
    TP_CHECK(!tp_tensor_is_contiguous(nv));
    int64_t s28[2] = {2, 8};
    TP_CHECK_OK(tp_tensor_reshape(nv, 2, s28, &w, &err), err);
    TP_CHECK(tp_tensor_shares_storage(nv, w));
    TP_CHECK_EQ(tp_tensor_offset(w), 4);
    TP_CHECK_EQ(tp_tensor_strides(w)[0], 12);
    TP_CHECK_EQ(tp_tensor_strides(w)[1], 1);
    for (int i = 0; i < 16; i++) {
        TP_CHECK(at(w, i) == at(nv, i));
    }
    tp_tensor_unref(w);
    tp_tensor_unref(nv);
    int64_t wrong[1] = {25};
    TP_CHECK_EQ(tp_tensor_reshape(t, 1, wrong, &w, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "[25]");
    tp_error_unref(err);
    err = NULL;
    tp_tensor_unref(v);

    // narrow along the middle dim: [2, 2, 4] starting at 1
    TP_CHECK_OK(tp_tensor_narrow(t, 1, 1, 2, &v, &err), err);
    TP_CHECK_EQ(tp_tensor_offset(v), 4);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 2; j++) {
            for (int k = 0; k < 4; k++) {
                TP_CHECK(at(v, i * 8 + j * 4 + k) == i * 12 + (j + 1) * 4 + k);
            }
        }
    }
    // A narrowed, transposed view reshaped where strides allow it.
    TP_CHECK_OK(tp_tensor_transpose(v, 0, 2, &w, &err), err); // [4,2,2]
    TP_CHECK(at(w, 1 * 4 + 1 * 2 + 0) == 0 * 12 + 2 * 4 + 1);
    tp_tensor_unref(w);
    TP_CHECK_EQ(tp_tensor_narrow(t, 1, 2, 2, &w, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    tp_tensor_unref(v);

    // expand [3,1] -> [2,3,5] with stride 0
    int64_t s31[2] = {3, 1}, big[3] = {2, 3, 5};
    tp_tensor *c = arange_shaped(TP_F64, 2, s31);
    TP_CHECK_OK(tp_tensor_expand(c, 3, big, &v, &err), err);
    TP_CHECK_EQ(tp_tensor_strides(v)[0], 0);
    TP_CHECK_EQ(tp_tensor_strides(v)[2], 0);
    for (int i = 0; i < 30; i++) {
        TP_CHECK(at(v, i) == (double)((i / 5) % 3));
    }
    int64_t bad[2] = {4, 5};
    TP_CHECK_EQ(tp_tensor_expand(c, 2, bad, &w, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cannot expand");
    tp_error_unref(err);
    tp_tensor_unref(v);
    tp_tensor_unref(c);
    tp_tensor_unref(t);
}

static void
t_contiguous_clone_copy(void)
{
    int64_t shape[2] = {3, 4};
    tp_tensor *t = arange_shaped(TP_I32, 2, shape);
    tp_tensor *v, *c, *k;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_transpose(t, 0, 1, &v, &err), err);
    TP_CHECK_OK(tp_tensor_contiguous(v, &c, &err), err);
    TP_CHECK(tp_tensor_is_contiguous(c));
    TP_CHECK(!tp_tensor_shares_storage(c, v));
    for (int i = 0; i < 12; i++) {
        TP_CHECK(at(c, i) == at(v, i));
    }
    const int32_t *p = tp_tensor_data(c);
    TP_CHECK_EQ(p[1], 4); // c[0][1] = t[1][0]
    // contiguous of a contiguous tensor is the same tensor
    TP_CHECK_OK(tp_tensor_contiguous(t, &k, &err), err);
    TP_CHECK(k == t);
    tp_tensor_unref(k);
    // clone is independent storage
    TP_CHECK_OK(tp_tensor_clone(t, &k, &err), err);
    TP_CHECK_OK(tp_tensor_set_item(k, 0, 99), NULL);
    TP_CHECK(at(t, 0) == 0.0);
    tp_tensor_unref(k);
    // copy into a strided view, broadcasting a row, converting dtype
    int64_t row[1] = {3};
    tp_tensor *r;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, row, 2.7, &r, &err), err);
    TP_CHECK_OK(tp_tensor_copy(v, r, &err), err); // v is [4,3] over t
    for (int i = 0; i < 12; i++) {
        TP_CHECK(at(t, i) == 2.0); // truncation toward zero
    }
    int64_t wrong[1] = {5};
    tp_tensor_unref(r);
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, wrong, &r, &err), err);
    TP_CHECK_EQ(tp_tensor_copy(v, r, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "cannot copy");
    tp_error_unref(err);
    tp_tensor_unref(r);
    tp_tensor_unref(c);
    tp_tensor_unref(v);
    tp_tensor_unref(t);
}

static double
convert_ref(double v, tp_dtype to)
{
    switch (to) {
    case TP_I8:
        return v < -128 ? -128 : v > 127 ? 127 : trunc(v);
    case TP_U8:
        return v < 0 ? 0 : v > 255 ? 255 : trunc(v);
    case TP_I32:
    case TP_I64:
        return trunc(v);
    case TP_BOOL:
        return v != 0;
    case TP_F32:
        return (float)v;
    default:
        return v;
    }
}

static void
t_dtype_conversion(void)
{
    // Values exact in every floating type, so the float->int results only
    // depend on truncation and saturation.
    static const double vals[] = {0, 1, -1, 2.5, -3.75, 100, 300, -200};
    int64_t n = 8;
    for (int from = 0; from < TP_DTYPE_COUNT; from++) {
        tp_tensor *src, *dst;
        TP_CHECK_OK(tp_tensor_empty((tp_dtype)from, 1, &n, &src, NULL), NULL);
        for (int i = 0; i < 8; i++) {
            tp_tensor_set_item(src, i, vals[i]);
        }
        for (int to = 0; to < TP_DTYPE_COUNT; to++) {
            TP_CHECK_OK(tp_tensor_to_dtype(src, (tp_dtype)to, &dst, NULL),
                        NULL);
            TP_CHECK_EQ(tp_tensor_dtype(dst), to);
            for (int i = 0; i < 8; i++) {
                double s = at(src, i);
                double want = convert_ref(s, (tp_dtype)to);
                // Integer to narrower integer wraps like a C cast.
                if (!tp_dtype_is_floating((tp_dtype)from) &&
                    (to == TP_I8 || to == TP_U8)) {
                    want = to == TP_I8 ? (double)(int8_t)(int64_t)s
                                       : (double)(uint8_t)(int64_t)s;
                }
                TP_CHECKF(at(dst, i) == want, "%s -> %s: %g gave %g, want %g",
                          tp_dtype_name((tp_dtype)from),
                          tp_dtype_name((tp_dtype)to), s, at(dst, i), want);
            }
            tp_tensor_unref(dst);
        }
        tp_tensor_unref(src);
    }
}

static void
t_half_bits(void)
{
    static const struct {
        float f;
        uint16_t h, bf;
    } cases[] = {
        {1.0f, 0x3c00, 0x3f80},
        {-2.0f, 0xc000, 0xc000},
        {65504.0f, 0x7bff, 0x4780},
        {1e6f, 0x7c00, 0x4974},                   // f16 overflows to inf
        {5.9604644775390625e-8f, 0x0001, 0x3380}, // smallest f16 subnormal
        {0.333333343f, 0x3555, 0x3eab},
        {1.00048828125f, 0x3c00, 0x3f80}, // tie rounds to even
    };
    int64_t n = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tp_tensor *f, *h, *b, *back;
        TP_CHECK_OK(tp_tensor_full(TP_F32, 1, &n, cases[i].f, &f, NULL), NULL);
        TP_CHECK_OK(tp_tensor_to_dtype(f, TP_F16, &h, NULL), NULL);
        TP_CHECK_OK(tp_tensor_to_dtype(f, TP_BF16, &b, NULL), NULL);
        uint16_t hb = *(uint16_t *)tp_tensor_data(h);
        uint16_t bb = *(uint16_t *)tp_tensor_data(b);
        TP_CHECKF(hb == cases[i].h, "f16(%g) = 0x%04x, want 0x%04x",
                  (double)cases[i].f, hb, cases[i].h);
        TP_CHECKF(bb == cases[i].bf, "bf16(%g) = 0x%04x, want 0x%04x",
                  (double)cases[i].f, bb, cases[i].bf);
        TP_CHECK_OK(tp_tensor_to_dtype(h, TP_F32, &back, NULL), NULL);
        if (cases[i].h == 0x3c00) {
            TP_CHECK(at(back, 0) == 1.0);
        }
        tp_tensor_unref(back);
        tp_tensor_unref(f);
        tp_tensor_unref(h);
        tp_tensor_unref(b);
    }
    // i64 -> i64 conversions keep every bit (no detour through double).
    tp_tensor *a, *c;
    TP_CHECK_OK(tp_tensor_empty(TP_I64, 1, &n, &a, NULL), NULL);
    *(int64_t *)tp_tensor_data(a) = (INT64_C(1) << 60) + 1;
    TP_CHECK_OK(tp_tensor_to_dtype(a, TP_I64, &c, NULL), NULL);
    TP_CHECK(*(int64_t *)tp_tensor_data(c) == (INT64_C(1) << 60) + 1);
    tp_tensor_unref(a);
    tp_tensor_unref(c);
}

static void
t_random(void)
{
    tp_generator *g1, *g2, *g3;
    int64_t n = 20000;
    tp_tensor *a, *b, *c;
    TP_CHECK_OK(tp_generator_create(42, &g1), NULL);
    TP_CHECK_OK(tp_generator_create(42, &g2), NULL);
    TP_CHECK_OK(tp_generator_create(43, &g3), NULL);
    TP_CHECK_OK(tp_tensor_rand(TP_F64, 1, &n, -1, 3, g1, &a, NULL), NULL);
    TP_CHECK_OK(tp_tensor_rand(TP_F64, 1, &n, -1, 3, g2, &b, NULL), NULL);
    TP_CHECK_OK(tp_tensor_rand(TP_F64, 1, &n, -1, 3, g3, &c, NULL), NULL);
    TP_CHECK(memcmp(tp_tensor_data(a), tp_tensor_data(b), 8 * n) == 0);
    TP_CHECK(memcmp(tp_tensor_data(a), tp_tensor_data(c), 8 * n) != 0);
    double sum = 0, lo = 1e9, hi = -1e9;
    for (int64_t i = 0; i < n; i++) {
        double v = at(a, i);
        sum += v;
        lo = fmin(lo, v);
        hi = fmax(hi, v);
    }
    TP_CHECK(lo >= -1 && hi < 3 && lo < -0.99 && hi > 2.99);
    TP_CHECKF(fabs(sum / n - 1.0) < 0.03, "uniform mean %g", sum / n);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(c);
    TP_CHECK_OK(tp_tensor_randn(TP_F32, 1, &n, 2, 3, g1, &a, NULL), NULL);
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = at(a, i);
        s1 += v;
        s2 += v * v;
    }
    double mean = s1 / n, sd = sqrt(s2 / n - mean * mean);
    TP_CHECKF(fabs(mean - 2) < 0.1 && fabs(sd - 3) < 0.1,
              "normal mean %g sd %g", mean, sd);
    tp_tensor_unref(a);
    TP_CHECK_EQ(tp_tensor_rand(TP_I32, 1, &n, 0, 1, g1, &a, NULL), TP_EINVAL);
    tp_generator_destroy(g1);
    tp_generator_destroy(g2);
    tp_generator_destroy(g3);
}

static uint64_t
ranges_total(const tp_byte_range *r, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        s += r[i].len;
        if (i > 0) {
            TP_CHECK(r[i].offset > r[i - 1].offset + r[i - 1].len);
        }
    }
    return s;
}

static void
t_byte_ranges(void)
{
    int64_t shape[2] = {1000, 1000};
    tp_tensor *t, *v, *w;
    tp_byte_range r[2048];
    size_t n;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 2, shape, &t, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(t, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 1);
    TP_CHECK_EQ(r[0].offset, 0);
    TP_CHECK_EQ(r[0].len, 4000000);

    // A row slice is one run in the middle of the storage.
    TP_CHECK_OK(tp_tensor_narrow(t, 0, 10, 5, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 1);
    TP_CHECK_EQ(r[0].offset, 10 * 4000);
    TP_CHECK_EQ(r[0].len, 5 * 4000);
    // Its transpose covers the same bytes.
    TP_CHECK_OK(tp_tensor_transpose(v, 0, 1, &w, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(w, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 1);
    TP_CHECK_EQ(r[0].len, 5 * 4000);
    tp_tensor_unref(w);
    tp_tensor_unref(v);

    // A column slice is one run per row, never the whole storage.
    TP_CHECK_OK(tp_tensor_narrow(t, 1, 100, 3, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 1000);
    TP_CHECK_EQ(r[0].offset, 400);
    TP_CHECK_EQ(r[1].offset, 4000 + 400);
    TP_CHECK_EQ(ranges_total(r, n), tp_tensor_nbytes(v));
    // Asking with a small array reports how many there are.
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 4, &n), NULL);
    TP_CHECK_EQ(n, 1000);
    tp_tensor_unref(v);

    // Every other column: element-sized runs.
    int64_t s2[2] = {4, 6};
    tp_tensor *small;
    TP_CHECK_OK(tp_tensor_empty(TP_F64, 2, s2, &small, NULL), NULL);
    int64_t s3[3] = {4, 3, 2};
    TP_CHECK_OK(tp_tensor_reshape(small, 3, s3, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_narrow(v, 2, 0, 1, &w, NULL), NULL); // [4,3,1]
    TP_CHECK_OK(tp_tensor_byte_ranges(w, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 12);
    TP_CHECK_EQ(r[1].offset, 16);
    TP_CHECK_EQ(ranges_total(r, n), 12 * 8);
    tp_tensor_unref(w);
    tp_tensor_unref(v);

    // A broadcast view ships its source bytes once.
    int64_t s1[2] = {1, 6}, e[3] = {7, 5, 6};
    TP_CHECK_OK(tp_tensor_narrow(small, 0, 2, 1, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_reshape(v, 2, s1, &w, NULL), NULL);
    tp_tensor_unref(v);
    TP_CHECK_OK(tp_tensor_expand(w, 3, e, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 1);
    TP_CHECK_EQ(r[0].offset, 2 * 6 * 8);
    TP_CHECK_EQ(r[0].len, 6 * 8);
    tp_tensor_unref(v);
    tp_tensor_unref(w);

    // A receiver rebuilds a column slice in a storage of the sender's
    // layout from the ranges alone.
    TP_CHECK_OK(tp_tensor_narrow(small, 1, 2, 3, &v, NULL), NULL); // [4,3]
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 2048, &n), NULL);
    tp_tensor *rx, *rv;
    int64_t span = (int64_t)(r[n - 1].offset + r[n - 1].len - r[0].offset);
    int64_t rs[1] = {span / 8};
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, rs, &rx, NULL), NULL);
    for (int i = 0; i < 24; i++) {
        tp_tensor_set_item(small, i, i * 1.5);
    }
    for (size_t k = 0; k < n; k++) {
        memcpy((char *)tp_tensor_data(rx) + (r[k].offset - r[0].offset),
               (char *)tp_tensor_storage_data(v) + r[k].offset, r[k].len);
    }
    TP_CHECK_OK(tp_tensor_as_strided(
                    rx, 2, tp_tensor_shape(v), tp_tensor_strides(v),
                    tp_tensor_offset(v) - (int64_t)r[0].offset / 8, &rv, NULL),
                NULL);
    for (int i = 0; i < 12; i++) {
        TP_CHECK(at(rv, i) == at(v, i));
    }
    int64_t big[2] = {4, 100};
    TP_CHECK_EQ(
        tp_tensor_as_strided(rx, 2, big, tp_tensor_strides(v), 0, &w, NULL),
        TP_EINVAL);
    tp_tensor_unref(rv);
    tp_tensor_unref(rx);
    tp_tensor_unref(v);

    // Zero-size views cover nothing; 0-d views one element.
    TP_CHECK_OK(tp_tensor_narrow(small, 0, 1, 0, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 2048, &n), NULL);
    TP_CHECK_EQ(n, 0);
    tp_tensor_unref(v);
    tp_tensor_unref(small);
    tp_tensor_unref(t);
}

// Random chains of views: the ranges must be exactly the bytes the
// elements occupy (checked against a bitmap built from the strides),
// ascending, and neither overlapping nor touching.
static void
t_byte_ranges_random(void)
{
    tp_generator *g;
    TP_CHECK_OK(tp_generator_create(7, &g), NULL);
    int64_t bs[4] = {5, 4, 6, 3};
    tp_tensor *base;
    TP_CHECK_OK(tp_tensor_empty(TP_I32, 4, bs, &base, NULL), NULL);
    size_t nbytes = tp_tensor_storage_nbytes(base);
    unsigned char *want = malloc(nbytes), *got = malloc(nbytes);
    tp_byte_range r[512];
    int64_t one = 1;
    for (int trial = 0; trial < 400; trial++) {
        tp_tensor *t = tp_tensor_ref(base), *v = NULL;
        tp_tensor *u;
        TP_CHECK_OK(tp_tensor_rand(TP_F64, 1, &one, 0, 1, g, &u, NULL), NULL);
        int steps = 1 + (int)(at(u, 0) * 4);
        tp_tensor_unref(u);
        for (int k = 0; k < steps; k++) {
            TP_CHECK_OK(
                tp_tensor_rand(TP_F64, 1, (int64_t[]){3}, 0, 1, g, &u, NULL),
                NULL);
            double a = at(u, 0), b = at(u, 1), c = at(u, 2);
            tp_tensor_unref(u);
            int nd = tp_tensor_ndim(t);
            int d = (int)(b * nd);
            int64_t size = tp_tensor_shape(t)[d];
            if (a < 0.4 && size > 0) { // narrow
                int64_t start = (int64_t)(c * (double)size);
                int64_t len = (int64_t)(b * (double)(size - start + 1));
                TP_CHECK_OK(tp_tensor_narrow(t, d, start, len, &v, NULL), NULL);
            } else if (a < 0.7) { // permute by rotation
                int perm[4];
                for (int i = 0; i < nd; i++) {
                    perm[i] = (i + 1 + (int)(c * 3)) % nd;
                }
                TP_CHECK_OK(tp_tensor_permute(t, perm, &v, NULL), NULL);
            } else if (a < 0.85) { // transpose
                TP_CHECK_OK(tp_tensor_transpose(t, d, (int)(c * nd), &v, NULL),
                            NULL);
            } else if (size == 0) {
                v = tp_tensor_ref(t);
            } else { // broadcast a size-1 slice
                tp_tensor *s1;
                int64_t shape[4];
                TP_CHECK_OK(tp_tensor_narrow(t, d, 0, 1, &s1, NULL), NULL);
                memcpy(shape, tp_tensor_shape(t), sizeof(shape));
                shape[d] = 3;
                TP_CHECK_OK(tp_tensor_expand(s1, nd, shape, &v, NULL), NULL);
                tp_tensor_unref(s1);
            }
            tp_tensor_unref(t);
            t = v;
        }
        memset(want, 0, nbytes);
        memset(got, 0, nbytes);
        int nd = tp_tensor_ndim(t);
        const int64_t *sh = tp_tensor_shape(t), *st = tp_tensor_strides(t);
        for (int64_t i = 0; i < tp_tensor_numel(t); i++) {
            int64_t off = tp_tensor_offset(t), rem = i;
            for (int d = nd - 1; d >= 0; d--) {
                off += (rem % sh[d]) * st[d];
                rem /= sh[d];
            }
            memset(want + off * 4, 1, 4);
        }
        size_t n;
        TP_CHECK_OK(tp_tensor_byte_ranges(t, r, 512, &n), NULL);
        TP_CHECK(n <= 512);
        for (size_t k = 0; k < n; k++) {
            TP_CHECK(r[k].len > 0 && r[k].offset + r[k].len <= nbytes);
            if (k > 0) {
                TP_CHECK(r[k].offset > r[k - 1].offset + r[k - 1].len);
            }
            memset(got + r[k].offset, 1, r[k].len);
        }
        TP_CHECKF(memcmp(want, got, nbytes) == 0,
                  "trial %d: ranges differ from the elements' bytes", trial);
        tp_tensor_unref(t);
    }
    free(want);
    free(got);
    tp_tensor_unref(base);
    tp_generator_destroy(g);
}

// Sizes, strides and offsets near INT64_MAX are errors, never views whose
// index arithmetic wrapped around.
static void
t_view_overflow(void)
{
    int64_t s4[1] = {4};
    tp_tensor *t, *v = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 1, s4, &t, NULL), NULL);
    // narrow: start + len would overflow.
    TP_CHECK_EQ(tp_tensor_narrow(t, 0, 1, INT64_MAX, &v, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "out of range");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_tensor_narrow(t, 0, 5, 0, &v, NULL), TP_EINVAL);
    TP_CHECK_OK(tp_tensor_narrow(t, 0, 4, 0, &v, NULL), NULL);
    TP_CHECK_EQ(tp_tensor_numel(v), 0);
    tp_tensor_unref(v);

    // as_strided: a stride or offset that wraps the bounds check.
    int64_t s2[1] = {2}, big[1] = {INT64_MAX}, one[1] = {1};
    TP_CHECK_EQ(tp_tensor_as_strided(t, 1, s2, big, 1, &v, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "outside a storage of 4");
    tp_error_unref(err);
    int64_t s3[1] = {3}, half[1] = {INT64_MAX / 2 + 1};
    TP_CHECK_EQ(tp_tensor_as_strided(t, 1, s3, half, 0, &v, NULL), TP_EINVAL);
    TP_CHECK_EQ(tp_tensor_as_strided(t, 1, s2, one, INT64_MAX, &v, NULL),
                TP_EINVAL);
    TP_CHECK_EQ(tp_tensor_as_strided(t, 1, s2, one, 3, &v, NULL), TP_EINVAL);
    TP_CHECK_OK(tp_tensor_as_strided(t, 1, s2, one, 2, &v, NULL), NULL);
    tp_tensor_unref(v);
    // An empty view may sit at the end of the storage, not beyond it.
    int64_t s0[1] = {0};
    TP_CHECK_OK(tp_tensor_as_strided(t, 1, s0, big, 4, &v, NULL), NULL);
    tp_tensor_unref(v);
    TP_CHECK_EQ(tp_tensor_as_strided(t, 1, s0, one, 5, &v, NULL), TP_EINVAL);

    // reshape: the product of the sizes must not wrap to numel.
    tp_tensor *d;
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s2, &d, NULL), NULL);
    int64_t wrap[2] = {44118, INT64_C(418122854021251)};
    TP_CHECK_EQ(tp_tensor_reshape(d, 2, wrap, &v, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "too large");
    tp_error_unref(err);
    err = NULL;
    int64_t wrap_infer[3] = {44118, INT64_C(418122854021251), -1};
    TP_CHECK_EQ(tp_tensor_reshape(d, 3, wrap_infer, &v, NULL), TP_EINVAL);
    // expand: new leading dims count too.
    int64_t lead[3] = {INT64_C(1) << 40, INT64_C(1) << 40, 2};
    TP_CHECK_EQ(tp_tensor_expand(d, 3, lead, &v, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "too large");
    tp_error_unref(err);
    int64_t lead_ok[2] = {3, 2};
    TP_CHECK_OK(tp_tensor_expand(d, 2, lead_ok, &v, NULL), NULL);
    tp_tensor_unref(v);
    tp_tensor_unref(d);
    tp_tensor_unref(t);
}

// The bytes an element walk of @t touches, as a 0/1 map of the storage.
static void
touched_bytes(const tp_tensor *t, unsigned char *map, size_t nbytes)
{
    int nd = tp_tensor_ndim(t);
    const int64_t *sh = tp_tensor_shape(t), *st = tp_tensor_strides(t);
    int64_t es = (int64_t)tp_dtype_size(tp_tensor_dtype(t));
    memset(map, 0, nbytes);
    for (int64_t i = 0; i < tp_tensor_numel(t); i++) {
        int64_t off = tp_tensor_offset(t), rem = i;
        for (int d = nd - 1; d >= 0; d--) {
            off += (rem % sh[d]) * st[d];
            rem /= sh[d];
        }
        TP_CHECK(off >= 0 && (size_t)((off + 1) * es) <= nbytes);
        memset(map + off * es, 1, (size_t)es);
    }
}

// Checks the ranges of @t are ascending, apart, inside the storage, and
// cover exactly the bytes its elements touch.
static void
check_ranges_exact(const tp_tensor *t, const char *what)
{
    size_t nbytes = tp_tensor_storage_nbytes(t), n;
    unsigned char *want = malloc(nbytes + 1), *got = malloc(nbytes + 1);
    touched_bytes(t, want, nbytes);
    TP_CHECK_OK(tp_tensor_byte_ranges(t, NULL, 0, &n), NULL);
    tp_byte_range *r = malloc(sizeof(*r) * (n + 1));
    size_t n2;
    TP_CHECK_OK(tp_tensor_byte_ranges(t, r, n, &n2), NULL);
    TP_CHECK_EQ(n2, n);
    memset(got, 0, nbytes);
    for (size_t k = 0; k < n; k++) {
        TP_CHECK(r[k].len > 0 && r[k].offset + r[k].len <= nbytes);
        if (k > 0) {
            TP_CHECK(r[k].offset > r[k - 1].offset + r[k - 1].len);
        }
        memset(got + r[k].offset, 1, r[k].len);
    }
    for (size_t b = 0; b < nbytes; b++) {
        TP_CHECKF(want[b] == got[b], "%s: byte %zu is %s the ranges", what, b,
                  want[b] ? "missing from" : "wrongly in");
    }
    free(r);
    free(want);
    free(got);
}

// Views made by as_strided need not nest (a dim's stride below the span of
// the dims inside it); their ranges must still cover every byte read.
static void
t_byte_ranges_as_strided(void)
{
    int64_t s16[1] = {16};
    tp_tensor *u, *v;
    tp_byte_range r[16];
    size_t n;
    TP_CHECK_OK(tp_tensor_zeros(TP_U8, 1, s16, &u, NULL), NULL);
    // Elements 0, 4, 3, 7, 6, 10: bytes 0, 3-4, 6-7, 10.
    int64_t sh[2] = {3, 2}, st[2] = {3, 4};
    TP_CHECK_OK(tp_tensor_as_strided(u, 2, sh, st, 0, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 16, &n), NULL);
    TP_CHECK_EQ(n, 4);
    TP_CHECK_EQ(r[0].offset, 0);
    TP_CHECK_EQ(r[0].len, 1);
    TP_CHECK_EQ(r[1].offset, 3);
    TP_CHECK_EQ(r[1].len, 2);
    TP_CHECK_EQ(r[2].offset, 6);
    TP_CHECK_EQ(r[2].len, 2);
    TP_CHECK_EQ(r[3].offset, 10);
    TP_CHECK_EQ(r[3].len, 1);
    check_ranges_exact(v, "interleaved");
    tp_tensor_unref(v);
    tp_tensor_unref(u);

    // 2^57 elements in 2^38 overlapping runs over 3 MB: one covering
    // range, at once.
    int64_t s3m[1] = {3 << 20};
    TP_CHECK_OK(tp_tensor_empty(TP_U8, 1, s3m, &u, NULL), NULL);
    int64_t hs[3] = {1 << 19, 1 << 19, 1 << 19}, ones[3] = {1, 1, 1};
    TP_CHECK_OK(tp_tensor_as_strided(u, 3, hs, ones, 5, &v, NULL), NULL);
    TP_CHECK_OK(tp_tensor_byte_ranges(v, r, 16, &n), NULL);
    TP_CHECK_EQ(n, 1);
    TP_CHECK_EQ(r[0].offset, 5);
    TP_CHECK_EQ(r[0].len, 3 * ((1 << 19) - 1) + 1);
    tp_tensor_unref(v);
    tp_tensor_unref(u);

    // Random as_strided views, nesting or not, against the bytes touched.
    tp_generator *g;
    TP_CHECK_OK(tp_generator_create(11, &g), NULL);
    for (int trial = 0; trial < 500; trial++) {
        tp_tensor *rn;
        TP_CHECK_OK(
            tp_tensor_rand(TP_F64, 1, (int64_t[]){10}, 0, 1, g, &rn, NULL),
            NULL);
        tp_dtype dt = at(rn, 0) < 0.5 ? TP_U8 : TP_I32;
        int nd = 1 + (int)(at(rn, 1) * 3);
        int64_t shape[3], strides[3], last = 0;
        for (int d = 0; d < nd; d++) {
            shape[d] = 1 + (int64_t)(at(rn, 2 + d) * 4);
            strides[d] = (int64_t)(at(rn, 5 + d) * 7);
            last += (shape[d] - 1) * strides[d];
        }
        int64_t offset = (int64_t)(at(rn, 8) * 5);
        int64_t cap = offset + last + 1 + (int64_t)(at(rn, 9) * 4);
        tp_tensor_unref(rn);
        TP_CHECK_OK(tp_tensor_zeros(dt, 1, &cap, &u, NULL), NULL);
        TP_CHECK_OK(
            tp_tensor_as_strided(u, nd, shape, strides, offset, &v, NULL),
            NULL);
        char what[64];
        snprintf(what, sizeof(what), "trial %d", trial);
        check_ranges_exact(v, what);
        tp_tensor_unref(v);
        tp_tensor_unref(u);
    }
    tp_generator_destroy(g);
}

// Large blocks are reused after a tensor goes (no new page faults), and
// zeros() still gives zeros on a reused block.
static void
t_block_cache(void)
{
    int64_t n = 1 << 20; // 4 MB of f32
    tp_tensor *a, *b;
    tp__tensor_cache_trim();
    TP_CHECK_OK(tp_tensor_full(TP_F32, 1, &n, 5, &a, NULL), NULL);
    void *pa = tp_tensor_storage_data(a);
    tp_tensor_unref(a);
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 1, &n, &b, NULL), NULL);
    TP_CHECK(tp_tensor_storage_data(b) == pa);
    TP_CHECK(at(b, 12345) == 0.0);
    tp_tensor_unref(b);
    // A much smaller request does not take the big block.
    int64_t m = n / 2;
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 1, &m, &b, NULL), NULL);
    TP_CHECK(tp_tensor_storage_data(b) != pa);
    tp_tensor_unref(b);
    tp__tensor_cache_trim();
}

AG_LEAK_CHECKED(t_dtypes)
AG_LEAK_CHECKED(t_create_fill)
AG_LEAK_CHECKED(t_create_errors)
AG_LEAK_CHECKED(t_from_blob_lifetime)
AG_LEAK_CHECKED(t_views)
AG_LEAK_CHECKED(t_contiguous_clone_copy)
AG_LEAK_CHECKED(t_dtype_conversion)
AG_LEAK_CHECKED(t_half_bits)
AG_LEAK_CHECKED(t_random)
AG_LEAK_CHECKED(t_byte_ranges)
AG_LEAK_CHECKED(t_byte_ranges_random)
AG_LEAK_CHECKED(t_block_cache)
AG_LEAK_CHECKED(t_view_overflow)
AG_LEAK_CHECKED(t_byte_ranges_as_strided)

static const tp_test_case cases[] = {
    AG_TEST(t_dtypes),
    AG_TEST(t_create_fill),
    AG_TEST(t_create_errors),
    AG_TEST(t_from_blob_lifetime),
    AG_TEST(t_views),
    AG_TEST(t_contiguous_clone_copy),
    AG_TEST(t_dtype_conversion),
    AG_TEST(t_half_bits),
    AG_TEST(t_random),
    AG_TEST(t_byte_ranges),
    AG_TEST(t_byte_ranges_random),
    AG_TEST(t_block_cache),
    AG_TEST(t_view_overflow),
    AG_TEST(t_byte_ranges_as_strided),
};

TP_TEST_MAIN(cases)
