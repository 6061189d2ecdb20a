// SPDX-License-Identifier: Apache-2.0
// tensor_dtype.c - dtypes (names, sizes), element loads and stores
// between dtypes, and shapes (numel, strides, checks).

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "tensor_impl.h"

// ---- dtypes ----------------------------------------------------------------

static const struct {
    const char *name;
    size_t size;
    bool floating;
} dtype_info[TP_DTYPE_COUNT] = {
    [TP_F32] = {"f32", 4, true},    [TP_F64] = {"f64", 8, true},
    [TP_F16] = {"f16", 2, true},    [TP_BF16] = {"bf16", 2, true},
    [TP_I8] = {"i8", 1, false},     [TP_U8] = {"u8", 1, false},
    [TP_I32] = {"i32", 4, false},   [TP_I64] = {"i64", 8, false},
    [TP_BOOL] = {"bool", 1, false},
};

static bool
dtype_valid(tp_dtype dt)
{
    return (unsigned)dt < TP_DTYPE_COUNT;
}

size_t
tp_dtype_size(tp_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].size : 0;
}

const char *
tp_dtype_name(tp_dtype dt)
{
    return dtype_valid(dt) ? dtype_info[dt].name : "?";
}

bool
tp_dtype_is_floating(tp_dtype dt)
{
    return dtype_valid(dt) && dtype_info[dt].floating;
}

// ---- element conversion ----------------------------------------------------

double
tp__load_f64(const void *p, tp_dtype dt)
{
    switch (dt) {
    case TP_F32:
        return *(const float *)p;
    case TP_F64:
        return *(const double *)p;
    case TP_F16:
        return tp__f16_to_f32(*(const uint16_t *)p);
    case TP_BF16:
        return tp__bf16_to_f32(*(const uint16_t *)p);
    case TP_I8:
        return *(const int8_t *)p;
    case TP_U8:
        return *(const uint8_t *)p;
    case TP_I32:
        return *(const int32_t *)p;
    case TP_I64:
        return (double)*(const int64_t *)p;
    case TP_BOOL:
        return *(const uint8_t *)p ? 1.0 : 0.0;
    }
    return 0.0;
}

// Float to integer conversion truncates toward zero like C (and PyTorch),
// saturating instead of invoking undefined behaviour on overflow or nan.
static int64_t
sat_i64(double v, double lo, double hi)
{
    if (v != v) {
        return 0;
    }
    if (v <= lo) {
        return (int64_t)lo;
    }
    if (v >= hi) {
        return (int64_t)hi;
    }
    return (int64_t)v;
}

void
tp__store_f64(void *p, tp_dtype dt, double v)
{
    switch (dt) {
    case TP_F32:
        *(float *)p = (float)v;
        break;
    case TP_F64:
        *(double *)p = v;
        break;
    case TP_F16:
        *(uint16_t *)p = tp__f32_to_f16((float)v);
        break;
    case TP_BF16:
        *(uint16_t *)p = tp__f32_to_bf16((float)v);
        break;
    case TP_I8:
        *(int8_t *)p = (int8_t)sat_i64(v, -128.0, 127.0);
        break;
    case TP_U8:
        *(uint8_t *)p = (uint8_t)sat_i64(v, 0.0, 255.0);
        break;
    case TP_I32:
        *(int32_t *)p = (int32_t)sat_i64(v, -2147483648.0, 2147483647.0);
        break;
    case TP_I64:
        // 2^63 is not representable as int64; saturate just below it.
        *(int64_t *)p =
            sat_i64(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case TP_BOOL:
        *(uint8_t *)p = v != 0.0;
        break;
    }
}

int64_t
tp__load_i64(const void *p, tp_dtype dt)
{
    switch (dt) {
    case TP_I8:
        return *(const int8_t *)p;
    case TP_U8:
        return *(const uint8_t *)p;
    case TP_I32:
        return *(const int32_t *)p;
    case TP_I64:
        return *(const int64_t *)p;
    case TP_BOOL:
        return *(const uint8_t *)p != 0;
    default:
        return 0;
    }
}

// ---- shapes ----------------------------------------------------------------

int64_t
tp__shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    return n;
}

void
tp__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i] > 1 ? shape[i] : 1;
    }
}

bool
tp__shape_equal(int na, const int64_t *a, int nb, const int64_t *b)
{
    if (na != nb) {
        return false;
    }
    for (int i = 0; i < na; i++) {
        if (a[i] != b[i]) {
            return false;
        }
    }
    return true;
}

const char *
tp__shape_str(int ndim, const int64_t *shape, char *buf, size_t len)
{
    size_t o = 0;
    int n = snprintf(buf, len, "[");
    o = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && o < len; i++) {
        n = snprintf(buf + o, len - o, "%s%lld", i ? ", " : "",
                     (long long)shape[i]);
        o += n > 0 ? (size_t)n : 0;
    }
    if (o < len) {
        snprintf(buf + o, len - o, "]");
    }
    return buf;
}

bool
tp__dim_norm(int ndim, int d, int *out)
{
    if (d < 0) {
        d += ndim;
    }
    if (d < 0 || d >= ndim) {
        return false;
    }
    *out = d;
    return true;
}

// True if every size is >= 0 and the product of the sizes (zeros counted
// as 1, so the strides of a zero-size tensor cannot overflow either) times
// 16 fits in int64_t: then numel, strides and byte counts never overflow.
bool
tp__shape_fits(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t s = shape[i] > 1 ? shape[i] : 1;
        if (shape[i] < 0 || n > INT64_MAX / 16 / s) {
            return false;
        }
        n *= s;
    }
    return true;
}

tp_status
tp__tensor_null_arg(tp_error **err_p, const char *fn, const char *arg)
{
    return tp__error_set(err_p, TP_EINVAL, "%s: %s is NULL", fn, arg);
}

tp_status
tp__check_shape(const char *what, tp_dtype dt, int ndim, const int64_t *shape,
                tp_error **err_p)
{
    if (!dtype_valid(dt)) {
        return tp__error_set(err_p, TP_EINVAL, "%s: invalid dtype %d", what,
                             (int)dt);
    }
    if (ndim < 0 || ndim > TP_TENSOR_MAX_DIMS || (ndim > 0 && !shape)) {
        return tp__error_set(err_p, TP_EINVAL, "%s: invalid ndim %d", what,
                             ndim);
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: negative size %lld in dim %d", what,
                                 (long long)shape[i], i);
        }
    }
    if (!tp__shape_fits(ndim, shape)) {
        return tp__error_set(err_p, TP_EINVAL, "%s: shape too large", what);
    }
    return TP_OK;
}
