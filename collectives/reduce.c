// SPDX-License-Identifier: Apache-2.0
// reduce.c - the collectives' reductions: which (op, dtype) pairs a
// collective accepts, the elementwise step (core's kernels,
// core/elementwise.h) and the final division of avg.
//
// This file is built with -O3 -ffp-contract=fast (see CMakeLists.txt) so
// that the avg division loops vectorise; there is no multiply-add here.

#include <stdint.h>

#include "collectives/reduce.h"
#include "core/elementwise.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/tensor_impl.h"

#define REDUCE_OP_COUNT (TP_REDUCE_BXOR + 1)

// The kernel each op runs; avg accumulates as sum (finished by
// tp__reduce_avg_finish) and exists for floating dtypes only (reduce.h
// says why).
static const tp__ew_op reduce_ew_op[REDUCE_OP_COUNT] = {
    [TP_REDUCE_SUM] = TP__EW_SUM, [TP_REDUCE_PRODUCT] = TP__EW_PROD,
    [TP_REDUCE_MIN] = TP__EW_MIN, [TP_REDUCE_MAX] = TP__EW_MAX,
    [TP_REDUCE_AVG] = TP__EW_SUM, [TP_REDUCE_BAND] = TP__EW_BAND,
    [TP_REDUCE_BOR] = TP__EW_BOR, [TP_REDUCE_BXOR] = TP__EW_BXOR,
};

static bool
reduce_supported(tp_reduce_op op, tp_dtype dt)
{
    if ((unsigned)op >= REDUCE_OP_COUNT || (unsigned)dt >= TP_DTYPE_COUNT) {
        return false;
    }
    if (op == TP_REDUCE_AVG && !tp_dtype_is_floating(dt)) {
        return false;
    }
    return tp__elementwise_supported(reduce_ew_op[op], dt);
}

// ---- API ----

const char *
tp__reduce_op_name(tp_reduce_op op)
{
    switch (op) {
    case TP_REDUCE_SUM:
        return "sum";
    case TP_REDUCE_PRODUCT:
        return "product";
    case TP_REDUCE_MIN:
        return "min";
    case TP_REDUCE_MAX:
        return "max";
    case TP_REDUCE_AVG:
        return "avg";
    case TP_REDUCE_BAND:
        return "band";
    case TP_REDUCE_BOR:
        return "bor";
    case TP_REDUCE_BXOR:
        return "bxor";
    }
    return "?";
}

tp_status
tp__reduce_check(tp_reduce_op op, tp_dtype dt, tp_error **err_p)
{
    if ((unsigned)op >= REDUCE_OP_COUNT) {
        return tp__error_set(err_p, TP_EINVAL,
                             "reduce: unknown op %d (dtype %s)", (int)op,
                             tp_dtype_name(dt));
    }
    if ((unsigned)dt >= TP_DTYPE_COUNT) {
        return tp__error_set(err_p, TP_EINVAL,
                             "reduce: unknown dtype %d (op %s)", (int)dt,
                             tp__reduce_op_name(op));
    }
    if (!reduce_supported(op, dt)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "reduce: op %s is not supported for dtype %s",
                             tp__reduce_op_name(op), tp_dtype_name(dt));
    }
    return TP_OK;
}

void
tp__reduce(tp_reduce_op op, tp_dtype dt, void *dst, const void *src, size_t n)
{
    TP_ASSERT(reduce_supported(op, dt)); // callers run tp__reduce_check first
    tp__elementwise(reduce_ew_op[op], dt, dst, src, n);
}

void
tp__reduce3(tp_reduce_op op, tp_dtype dt, void *dst, const void *a,
            const void *b, size_t n)
{
    TP_ASSERT(reduce_supported(op, dt));
    tp__elementwise3(reduce_ew_op[op], dt, dst, a, b, n);
}

void
tp__reduce_avg_finish(tp_dtype dt, void *buf, size_t n, int count)
{
    // avg is floating only (tp__reduce_check rejects it for other dtypes).
    TP_ASSERT(tp_dtype_is_floating(dt));
    TP_ASSERT(count > 0);
    switch (dt) {
    case TP_F32: {
        float *p = buf;
        float c = (float)count;
        for (size_t i = 0; i < n; i++) {
            p[i] = p[i] / c;
        }
        return;
    }
    case TP_F64: {
        double *p = buf;
        double c = (double)count;
        for (size_t i = 0; i < n; i++) {
            p[i] = p[i] / c;
        }
        return;
    }
    case TP_F16: {
        uint16_t *p = buf;
        float c = (float)count;
        for (size_t i = 0; i < n; i++) {
            p[i] = tp__f32_to_f16(tp__f16_to_f32(p[i]) / c);
        }
        return;
    }
    case TP_BF16: {
        uint16_t *p = buf;
        float c = (float)count;
        for (size_t i = 0; i < n; i++) {
            p[i] = tp__f32_to_bf16(tp__bf16_to_f32(p[i]) / c);
        }
        return;
    }
    default:
        return;
    }
}
