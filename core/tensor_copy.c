// SPDX-License-Identifier: Apache-2.0
// tensor_copy.c - raw copies: between layouts and dtypes, to_dtype,
// clone, contiguous, fill. No autograd recording.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "tensor_impl.h"

// ---- element stores --------------------------------------------------------

static void
store_i64(void *p, tp_dtype dt, int64_t v)
{
    switch (dt) {
    case TP_I8:
        *(int8_t *)p = (int8_t)v; // wraps, as an integer cast does
        break;
    case TP_U8:
        *(uint8_t *)p = (uint8_t)v;
        break;
    case TP_I32:
        *(int32_t *)p = (int32_t)v;
        break;
    case TP_I64:
        *(int64_t *)p = v;
        break;
    case TP_BOOL:
        *(uint8_t *)p = v != 0;
        break;
    default:
        break;
    }
}

// ---- raw copies ------------------------------------------------------------

static bool
same_int_class(tp_dtype a, tp_dtype b)
{
    return !tp_dtype_is_floating(a) && !tp_dtype_is_floating(b);
}

// Copies one row of @n elements with element strides @ds and @ss.
static void
copy_row(char *d, tp_dtype ddt, int64_t ds, const char *s, tp_dtype sdt,
         int64_t ss, int64_t n)
{
    int64_t des = (int64_t)tp_dtype_size(ddt);
    int64_t ses = (int64_t)tp_dtype_size(sdt);
    if (ddt == sdt) {
        if (ds == 1 && ss == 1) {
            memcpy(d, s, (size_t)(n * des));
            return;
        }
        switch (des) {
        case 1:
            for (int64_t i = 0; i < n; i++) {
                d[i * ds] = s[i * ss];
            }
            return;
        case 2:
            for (int64_t i = 0; i < n; i++) {
                ((uint16_t *)(void *)d)[i * ds] =
                    ((const uint16_t *)(const void *)s)[i * ss];
            }
            return;
        case 4:
            for (int64_t i = 0; i < n; i++) {
                ((uint32_t *)(void *)d)[i * ds] =
                    ((const uint32_t *)(const void *)s)[i * ss];
            }
            return;
        default:
            for (int64_t i = 0; i < n; i++) {
                ((uint64_t *)(void *)d)[i * ds] =
                    ((const uint64_t *)(const void *)s)[i * ss];
            }
            return;
        }
    }
    if (same_int_class(ddt, sdt)) {
        for (int64_t i = 0; i < n; i++) {
            store_i64(d + i * ds * des, ddt,
                      tp__load_i64(s + i * ss * ses, sdt));
        }
        return;
    }
    if (ddt == TP_F32 && sdt == TP_F64) {
        for (int64_t i = 0; i < n; i++) {
            ((float *)(void *)d)[i * ds] =
                (float)((const double *)(const void *)s)[i * ss];
        }
        return;
    }
    if (ddt == TP_F64 && sdt == TP_F32) {
        for (int64_t i = 0; i < n; i++) {
            ((double *)(void *)d)[i * ds] =
                ((const float *)(const void *)s)[i * ss];
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        tp__store_f64(d + i * ds * des, ddt,
                      tp__load_f64(s + i * ss * ses, sdt));
    }
}

tp_status
tp__copy_raw(tp_tensor *dst, const tp_tensor *src_in, tp_error **err_p)
{
    if (dst == NULL) {
        return tp__tensor_null_arg(err_p, "copy", "dst");
    }
    if (src_in == NULL) {
        return tp__tensor_null_arg(err_p, "copy", "src");
    }
    if (tp__tensor_check_cpu("copy", dst, err_p) != TP_OK ||
        tp__tensor_check_cpu("copy", src_in, err_p) != TP_OK) {
        return TP_ENOTSUP;
    }
    tp_tensor *src;
    tp_status st =
        tp__view_expand(src_in, dst->t_ndim, dst->t_shape, &src, NULL);
    if (st == TP_ENOMEM) {
        return tp__error_set(err_p, st, "copy: out of memory");
    }
    if (st != TP_OK) {
        char a[128], b[128];
        return tp__error_set(
            err_p, TP_EINVAL, "copy: cannot copy %s into %s",
            tp__shape_str(src_in->t_ndim, src_in->t_shape, a, sizeof(a)),
            tp__shape_str(dst->t_ndim, dst->t_shape, b, sizeof(b)));
    }
    int64_t numel = tp_tensor_numel(dst);
    char *d = tp__tensor_ptr(dst);
    const char *s = tp__tensor_ptr(src);
    if (numel == 0) {
        goto out;
    }
    if (tp_tensor_is_contiguous(dst) && tp_tensor_is_contiguous(src)) {
        copy_row(d, dst->t_dtype, 1, s, src->t_dtype, 1, numel);
        goto out;
    }
    int nd = dst->t_ndim;
    int64_t des = (int64_t)tp_dtype_size(dst->t_dtype);
    int64_t ses = (int64_t)tp_dtype_size(src->t_dtype);
    int64_t inner = nd ? dst->t_shape[nd - 1] : 1;
    int64_t dstr = nd ? dst->t_strides[nd - 1] : 1;
    int64_t sstr = nd ? src->t_strides[nd - 1] : 1;
    int64_t idx[TP_TENSOR_MAX_DIMS] = {0};
    for (int64_t r = 0; r < numel / inner; r++) {
        int64_t doff = 0, soff = 0;
        for (int i = 0; i < nd - 1; i++) {
            doff += idx[i] * dst->t_strides[i];
            soff += idx[i] * src->t_strides[i];
        }
        copy_row(d + doff * des, dst->t_dtype, dstr, s + soff * ses,
                 src->t_dtype, sstr, inner);
        for (int i = nd - 2; i >= 0; i--) {
            if (++idx[i] < dst->t_shape[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
out:
    tp_tensor_unref(src);
    return TP_OK;
}

tp_status
tp__to_dtype_raw(const tp_tensor *t, tp_dtype dt, tp_tensor **out_p,
                 tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "to_dtype", "t");
    }
    if (tp__tensor_check_cpu("to_dtype", t, err_p) != TP_OK) {
        return TP_ENOTSUP;
    }
    tp_tensor *c;
    tp_status st = tp_tensor_empty(dt, t->t_ndim, t->t_shape, &c, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__copy_raw(c, t, err_p);
    if (st != TP_OK) {
        tp_tensor_unref(c);
        return st;
    }
    *out_p = c;
    return TP_OK;
}

tp_status
tp__clone_raw(const tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "clone", "t");
    }
    return tp__to_dtype_raw(t, t->t_dtype, out_p, err_p);
}

tp_status
tp__contiguous_raw(const tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "contiguous", "t");
    }
    if (tp_tensor_is_contiguous(t)) {
        return tp__tensor_alias(t, out_p, err_p);
    }
    return tp__clone_raw(t, out_p, err_p);
}

void
tp__fill(tp_tensor *t, double v)
{
    int64_t numel = tp_tensor_numel(t);
    if (numel == 0) {
        return;
    }
    size_t es = tp_dtype_size(t->t_dtype);
    unsigned char one[8];
    tp__store_f64(one, t->t_dtype, v);
    if (tp_tensor_is_contiguous(t)) {
        char *p = tp__tensor_ptr(t);
        if (t->t_dtype == TP_F32) {
            float f = (float)v;
            for (int64_t i = 0; i < numel; i++) {
                ((float *)(void *)p)[i] = f;
            }
            return;
        }
        for (int64_t i = 0; i < numel; i++) {
            memcpy(p + (size_t)i * es, one, es);
        }
        return;
    }
    for (int64_t i = 0; i < numel; i++) {
        memcpy(tp__tensor_elem_ptr(t, i), one, es);
    }
}
