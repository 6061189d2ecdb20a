// SPDX-License-Identifier: Apache-2.0
// elementwise_test.c - core's elementwise kernels (core/elementwise.h) as
// their users other than the collectives see them: tp.add's sum (f16/bf16
// as the former convert-to-f32-and-back path, integers wrapping, bool's
// "or" as max) and the operand aliasing rules. Every (op, dtype) pair is
// checked against a scalar reference by tests/collectives/reduce_test.c.

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tp_test.h"

#include "core/elementwise.h"
#include "core/tensor_impl.h"

static void
test_supported_table(void)
{
    static const tp_dtype nums[] = {TP_F32, TP_F64, TP_F16, TP_BF16,
                                    TP_I8,  TP_U8,  TP_I32, TP_I64};
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        tp_dtype dt = nums[i];
        bool integer = !tp_dtype_is_floating(dt);
        TP_CHECK(tp__elementwise_supported(TP__EW_SUM, dt));
        TP_CHECK(tp__elementwise_supported(TP__EW_PROD, dt));
        TP_CHECK(tp__elementwise_supported(TP__EW_MIN, dt));
        TP_CHECK(tp__elementwise_supported(TP__EW_MAX, dt));
        TP_CHECK(tp__elementwise_supported(TP__EW_BAND, dt) == integer);
        TP_CHECK(tp__elementwise_supported(TP__EW_BOR, dt) == integer);
        TP_CHECK(tp__elementwise_supported(TP__EW_BXOR, dt) == integer);
    }
    TP_CHECK(!tp__elementwise_supported(TP__EW_SUM, TP_BOOL));
    TP_CHECK(!tp__elementwise_supported(TP__EW_PROD, TP_BOOL));
    TP_CHECK(tp__elementwise_supported(TP__EW_MAX, TP_BOOL));
    TP_CHECK(tp__elementwise_supported(TP__EW_BXOR, TP_BOOL));
    TP_CHECK(!tp__elementwise_supported(TP__EW_OP_COUNT, TP_F32));
    TP_CHECK(!tp__elementwise_supported(TP__EW_SUM, (tp_dtype)99));
}

// The former tp.add on f16/bf16: both operands converted to f32 by core's
// raw conversion, added in f32, the sum converted back.
static void
half_sum_check(tp_dtype dt)
{
    int64_t n = 65536;
    tp_tensor *a = NULL, *b = NULL, *got = NULL, *fa = NULL, *fb = NULL;
    tp_tensor *fz = NULL, *want = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_empty(dt, 1, &n, &a, &err), err);
    TP_CHECK_OK(tp_tensor_empty(dt, 1, &n, &b, &err), err);
    TP_CHECK_OK(tp_tensor_empty(dt, 1, &n, &got, &err), err);
    TP_CHECK_OK(tp_tensor_empty(TP_F32, 1, &n, &fz, &err), err);
    uint16_t *pa = tp_tensor_data(a), *pb = tp_tensor_data(b);
    // Every bit pattern against a scrambled one, in four rotations.
    for (int rot = 0; rot < 4; rot++) {
        for (int64_t i = 0; i < n; i++) {
            pa[i] = (uint16_t)i;
            pb[i] = (uint16_t)(i * 40503 + rot * 12345);
        }
        tp__elementwise3(TP__EW_SUM, dt, tp_tensor_data(got), pa, pb,
                         (size_t)n);
        TP_CHECK_OK(tp__to_dtype_raw(a, TP_F32, &fa, &err), err);
        TP_CHECK_OK(tp__to_dtype_raw(b, TP_F32, &fb, &err), err);
        const float *x = tp_tensor_data(fa), *y = tp_tensor_data(fb);
        float *z = tp_tensor_data(fz);
        for (int64_t i = 0; i < n; i++) {
            z[i] = x[i] + y[i];
        }
        TP_CHECK_OK(tp__to_dtype_raw(fz, dt, &want, &err), err);
        const uint16_t *g = tp_tensor_data(got), *w = tp_tensor_data(want);
        for (int64_t i = 0; i < n; i++) {
            // Which NaN payload a NaN + NaN keeps may depend on operand
            // order in the vector code; any NaN is the same sum.
            float gf =
                dt == TP_F16 ? tp__f16_to_f32(g[i]) : tp__bf16_to_f32(g[i]);
            float wf =
                dt == TP_F16 ? tp__f16_to_f32(w[i]) : tp__bf16_to_f32(w[i]);
            TP_CHECKF(g[i] == w[i] || (isnan(gf) && isnan(wf)),
                      "%s %04x + %04x: got %04x, want %04x", tp_dtype_name(dt),
                      pa[i], pb[i], g[i], w[i]);
        }
        tp_tensor_unref(fa);
        tp_tensor_unref(fb);
        tp_tensor_unref(want);
        fa = fb = want = NULL;
    }
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(got);
    tp_tensor_unref(fz);
}

static void
test_half_sum_as_f32_round_trip(void)
{
    half_sum_check(TP_F16);
    half_sum_check(TP_BF16);
}

// bool "or" (tp.add on bool) is the max kernel: any nonzero byte is true.
static void
test_bool_max_is_or(void)
{
    static uint8_t x[65536], y[65536], z[65536];
    for (int i = 0; i < 65536; i++) {
        x[i] = (uint8_t)(i & 0xff);
        y[i] = (uint8_t)(i >> 8);
    }
    tp__elementwise3(TP__EW_MAX, TP_BOOL, z, x, y, 65536);
    for (int i = 0; i < 65536; i++) {
        TP_CHECK_EQ(z[i], (uint8_t)((x[i] | y[i]) != 0));
    }
}

// Integer sums wrap, as the former tp.add's (type)(x + y).
static void
test_int_sum_wraps(void)
{
    int8_t a8[3] = {127, -128, 5}, b8[3] = {1, -1, -7}, c8[3];
    tp__elementwise3(TP__EW_SUM, TP_I8, c8, a8, b8, 3);
    TP_CHECK_EQ(c8[0], -128);
    TP_CHECK_EQ(c8[1], 127);
    TP_CHECK_EQ(c8[2], -2);
    uint8_t au[2] = {255, 3}, bu[2] = {2, 4}, cu[2];
    tp__elementwise3(TP__EW_SUM, TP_U8, cu, au, bu, 2);
    TP_CHECK_EQ(cu[0], 1);
    TP_CHECK_EQ(cu[1], 7);
    int32_t a32[2] = {INT32_MAX, INT32_MIN}, b32[2] = {1, -1}, c32[2];
    tp__elementwise3(TP__EW_SUM, TP_I32, c32, a32, b32, 2);
    TP_CHECK_EQ(c32[0], INT32_MIN);
    TP_CHECK_EQ(c32[1], INT32_MAX);
    int64_t a64[2] = {INT64_MAX, 40}, b64[2] = {1, 2}, c64[2];
    tp__elementwise3(TP__EW_SUM, TP_I64, c64, a64, b64, 2);
    TP_CHECK_EQ(c64[0], INT64_MIN);
    TP_CHECK_EQ(c64[1], 42);
}

// dst may be either operand or both; the operand order is kept (min of
// -0 and +0 gives the second operand).
static void
test_aliasing(void)
{
    float a[5000], b[5000], d[5000];
    for (int i = 0; i < 5000; i++) {
        a[i] = (float)i;
        b[i] = (float)(2 * i);
    }
    memcpy(d, a, sizeof(d));
    tp__elementwise3(TP__EW_SUM, TP_F32, d, d, b, 5000); // d = a + b
    for (int i = 0; i < 5000; i++) {
        TP_CHECK(d[i] == (float)(3 * i));
    }
    memcpy(d, b, sizeof(d));
    tp__elementwise3(TP__EW_SUM, TP_F32, d, a, d, 5000); // d = a + b
    for (int i = 0; i < 5000; i++) {
        TP_CHECK(d[i] == (float)(3 * i));
    }
    tp__elementwise3(TP__EW_SUM, TP_F32, d, d, d, 5000); // bounced
    for (int i = 0; i < 5000; i++) {
        TP_CHECK(d[i] == (float)(6 * i));
    }
    tp__elementwise(TP__EW_SUM, TP_F32, d, d, 5000);
    for (int i = 0; i < 5000; i++) {
        TP_CHECK(d[i] == (float)(12 * i));
    }

    float mz = -0.0f, pz = 0.0f, r;
    r = mz;
    tp__elementwise3(TP__EW_MIN, TP_F32, &r, &r, &pz, 1); // min(-0, +0)
    TP_CHECK(!signbit(r));
    r = pz;
    tp__elementwise3(TP__EW_MIN, TP_F32, &r, &mz, &r, 1); // min(-0, +0)
    TP_CHECK(!signbit(r));
    r = mz;
    tp__elementwise3(TP__EW_MIN, TP_F32, &r, &pz, &r, 1); // min(+0, -0)
    TP_CHECK(signbit(r));
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_supported_table),
    TP_TEST_CASE(test_half_sum_as_f32_round_trip),
    TP_TEST_CASE(test_bool_max_is_or),
    TP_TEST_CASE(test_int_sum_wraps),
    TP_TEST_CASE(test_aliasing),
};

TP_TEST_MAIN(cases)
