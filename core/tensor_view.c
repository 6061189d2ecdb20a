// SPDX-License-Identifier: Apache-2.0
// tensor_view.c - the byte ranges of a view, as_strided, and the raw
// (non-recording) views: reshape, permute, transpose, narrow, expand.
// autograd/views.c records nodes around these.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "tensor_impl.h"

// ---- byte ranges -----------------------------------------------------------

typedef struct range_dim {
    int64_t size;
    int64_t stride;
} range_dim;

static int
range_dim_cmp(const void *a, const void *b)
{
    const range_dim *x = a, *y = b;
    return (x->stride > y->stride) - (x->stride < y->stride);
}

static int
i64_cmp(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// Views of a non-nesting layout (only tp_tensor_as_strided makes them) get
// their runs sorted when there are at most this many; beyond, one covering
// range, so a view of 2^38 overlapping runs costs neither time nor memory.
#define RANGES_SORT_MAX ((int64_t)1 << 20)

// Appends the run [b, b + len) to the output, merging it into the previous
// run when they touch or overlap (runs arrive in ascending order of b).
static void
ranges_put(tp_byte_range *ranges, size_t cap, size_t *n, uint64_t *last_end,
           uint64_t b, uint64_t len)
{
    if (*n > 0 && b <= *last_end) {
        if (b + len > *last_end) {
            if (*n - 1 < cap) {
                ranges[*n - 1].len = b + len - ranges[*n - 1].offset;
            }
            *last_end = b + len;
        }
        return;
    }
    if (*n < cap) {
        ranges[*n].offset = b;
        ranges[*n].len = len;
    }
    (*n)++;
    *last_end = b + len;
}

tp_status
tp_tensor_byte_ranges(const tp_tensor *t, tp_byte_range *ranges, size_t cap,
                      size_t *n_p)
{
    if (!t || !n_p || (cap && !ranges)) {
        return TP_EINVAL;
    }
    int64_t es = (int64_t)tp_dtype_size(t->t_dtype);
    range_dim dims[TP_TENSOR_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < t->t_ndim; i++) {
        if (t->t_shape[i] == 0) {
            *n_p = 0;
            return TP_OK;
        }
        // Size-1 and broadcast dims add no bytes.
        if (t->t_shape[i] == 1 || t->t_strides[i] == 0) {
            continue;
        }
        int64_t s = t->t_strides[i];
        dims[nd].size = t->t_shape[i];
        dims[nd].stride = s < 0 ? -s : s;
        nd++;
    }
    // Innermost first; merge dims that continue a dense run.
    qsort(dims, (size_t)nd, sizeof(dims[0]), range_dim_cmp);
    int64_t chunk = 1; // elements in one dense run
    int first = 0;
    if (nd > 0 && dims[0].stride == 1) {
        chunk = dims[0].size;
        first = 1;
        while (first < nd && dims[first].stride == chunk) {
            chunk *= dims[first].size;
            first++;
        }
    }
    // The remaining dims (outermost last) enumerate the runs in ascending
    // order of offset, without overlap, when each dim's stride is at least
    // the span of the dims inside it: true for every view our view
    // functions make. Shapes are bounded (tp__shape_fits) and a tensor lies
    // in its storage, so the run count and the span fit in int64_t.
    int64_t count = 1, span = chunk; // span: elements from first to last
    bool nests = true;
    for (int i = first; i < nd; i++) {
        if (dims[i].stride < span) {
            nests = false;
        }
        span += (dims[i].size - 1) * dims[i].stride;
        count *= dims[i].size;
    }
    int64_t base = t->t_offset;
    // A negative stride is never produced by our views; tp__tensor_make
    // callers could, so start from the lowest address in that case.
    for (int i = 0; i < t->t_ndim; i++) {
        if (t->t_strides[i] < 0) {
            base += t->t_strides[i] * (t->t_shape[i] - 1);
        }
    }
    size_t n = 0;
    uint64_t last_end = 0, len = (uint64_t)(chunk * es);
    int64_t *starts = NULL;
    if (!nests) {
        // Overlapping or interleaved dims: sort the runs if there are few
        // enough, else (or without memory for that) cover them all.
        if (count <= RANGES_SORT_MAX) {
            starts = tp__alloc(sizeof(int64_t) * (size_t)count);
        }
        if (!starts) {
            ranges_put(ranges, cap, &n, &last_end, (uint64_t)(base * es),
                       (uint64_t)(span * es));
            *n_p = n;
            return TP_OK;
        }
    }
    int64_t idx[TP_TENSOR_MAX_DIMS] = {0};
    for (int64_t r = 0; r < count; r++) {
        int64_t off = base;
        for (int i = first; i < nd; i++) {
            off += idx[i] * dims[i].stride;
        }
        if (starts) {
            starts[r] = off;
        } else {
            ranges_put(ranges, cap, &n, &last_end, (uint64_t)(off * es), len);
        }
        for (int i = first; i < nd; i++) {
            if (++idx[i] < dims[i].size) {
                break;
            }
            idx[i] = 0;
        }
    }
    if (starts) {
        qsort(starts, (size_t)count, sizeof(int64_t), i64_cmp);
        for (int64_t r = 0; r < count; r++) {
            ranges_put(ranges, cap, &n, &last_end, (uint64_t)(starts[r] * es),
                       len);
        }
        tp__free(starts);
    }
    *n_p = n;
    return TP_OK;
}

tp_status
tp_tensor_as_strided(const tp_tensor *base, int ndim, const int64_t *shape,
                     const int64_t *strides, int64_t offset, tp_tensor **out_p,
                     tp_error **err_p)
{
    if (base == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_as_strided", "base");
    }
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_as_strided", "out_p");
    }
    tp_status st =
        tp__check_shape("as_strided", base->t_dtype, ndim, shape, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t es = (int64_t)tp_dtype_size(base->t_dtype);
    int64_t cap = (int64_t)(base->t_storage->s_nbytes / (size_t)es);
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (!strides || strides[i] < 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "as_strided: strides must be >= 0");
        }
        empty = empty || shape[i] == 0;
    }
    // The last element's index, with every step checked: huge strides or
    // offsets must not wrap around into the storage.
    int64_t last = offset;
    bool overflow = false;
    for (int i = 0; i < ndim && !empty; i++) {
        int64_t step;
        overflow = overflow ||
                   __builtin_mul_overflow(shape[i] - 1, strides[i], &step) ||
                   __builtin_add_overflow(last, step, &last);
    }
    // An empty view touches nothing but its offset must still be in the
    // storage (or just past its end).
    bool bad = offset < 0 || overflow ||
               (empty ? offset > cap : (offset >= cap || last >= cap));
    if (bad) {
        return tp__error_set(err_p, TP_EINVAL,
                             "as_strided: view at offset %lld reaches "
                             "outside a storage of %lld elements%s",
                             (long long)offset, (long long)cap,
                             overflow ? " (index overflow)" : "");
    }
    return tp__tensor_make(base->t_storage, base->t_dtype, ndim, shape, strides,
                           offset, out_p, err_p);
}

// ---- raw views -------------------------------------------------------------

static tp_status
view_of(const tp_tensor *t, int ndim, const int64_t *shape,
        const int64_t *strides, int64_t offset, tp_tensor **out_p,
        tp_error **err_p)
{
    return tp__tensor_make(t->t_storage, t->t_dtype, ndim, shape, strides,
                           offset, out_p, err_p);
}

// Computes strides for viewing @t as @shape without a copy (PyTorch's
// computeStride); false if the layout does not allow it.
static bool
reshape_strides(const tp_tensor *t, int ndim, const int64_t *shape,
                int64_t *strides)
{
    int64_t numel = tp_tensor_numel(t);
    if (numel == 0) {
        tp__contiguous_strides(ndim, shape, strides);
        return true;
    }
    int view_d = ndim - 1;
    int64_t chunk_base_stride = t->t_ndim ? t->t_strides[t->t_ndim - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = t->t_ndim - 1; td >= 0; td--) {
        tensor_numel *= t->t_shape[td];
        if (td == 0 ||
            (t->t_shape[td - 1] != 1 &&
             t->t_strides[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 &&
                   (view_numel < tensor_numel || shape[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) {
                return false;
            }
            if (td > 0) {
                chunk_base_stride = t->t_strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    // Leading size-1 dims of the view.
    while (view_d >= 0) {
        strides[view_d] = 1;
        view_d--;
    }
    return true;
}

tp_status
tp__view_reshape(const tp_tensor *t, int ndim, const int64_t *shape_in,
                 tp_tensor **out_p, tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "reshape", "t");
    }
    if (ndim < 0 || ndim > TP_TENSOR_MAX_DIMS || (ndim && !shape_in)) {
        return tp__error_set(err_p, TP_EINVAL, "reshape: invalid ndim %d",
                             ndim);
    }
    int64_t shape[TP_TENSOR_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = shape_in[i];
        if (shape[i] == -1 && infer < 0) {
            infer = i;
        } else if (shape[i] < 0) {
            return tp__error_set(err_p, TP_EINVAL, "reshape: invalid size %lld",
                                 (long long)shape[i]);
        } else if (shape[i] > 1 && known > INT64_MAX / 16 / shape[i]) {
            // Checked like tp_tensor_empty's shapes, so the product (and
            // later the strides) cannot wrap to a plausible numel.
            return tp__error_set(err_p, TP_EINVAL, "reshape: shape too large");
        } else {
            known *= shape[i];
        }
    }
    int64_t numel = tp_tensor_numel(t);
    if (infer >= 0) {
        if (known == 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "reshape: cannot infer -1 with zero sizes");
        }
        shape[infer] = numel / known;
        known *= shape[infer];
    }
    if (known != numel || !tp__shape_fits(ndim, shape)) {
        char a[128], b[128];
        return tp__error_set(
            err_p, TP_EINVAL, "reshape: shape %s is invalid for input of %s",
            tp__shape_str(ndim, shape, a, sizeof(a)),
            tp__shape_str(t->t_ndim, t->t_shape, b, sizeof(b)));
    }
    int64_t strides[TP_TENSOR_MAX_DIMS];
    if (reshape_strides(t, ndim, shape, strides)) {
        return view_of(t, ndim, shape, strides, t->t_offset, out_p, err_p);
    }
    tp_tensor *c;
    tp_status st = tp__contiguous_raw(t, &c, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp__contiguous_strides(ndim, shape, strides);
    st = view_of(c, ndim, shape, strides, c->t_offset, out_p, err_p);
    tp_tensor_unref(c);
    return st;
}

tp_status
tp__view_permute(const tp_tensor *t, const int *perm, tp_tensor **out_p,
                 tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "permute", "t");
    }
    int64_t shape[TP_TENSOR_MAX_DIMS], strides[TP_TENSOR_MAX_DIMS];
    bool seen[TP_TENSOR_MAX_DIMS] = {false};
    for (int i = 0; i < t->t_ndim; i++) {
        int d;
        if (!tp__dim_norm(t->t_ndim, perm[i], &d) || seen[d]) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "permute: invalid permutation");
        }
        seen[d] = true;
        shape[i] = t->t_shape[d];
        strides[i] = t->t_strides[d];
    }
    return view_of(t, t->t_ndim, shape, strides, t->t_offset, out_p, err_p);
}

tp_status
tp__view_transpose(const tp_tensor *t, int d0, int d1, tp_tensor **out_p,
                   tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "transpose", "t");
    }
    int a, b;
    if (!tp__dim_norm(t->t_ndim, d0, &a) || !tp__dim_norm(t->t_ndim, d1, &b)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "transpose: dims %d, %d out of range for %d-d", d0,
                             d1, t->t_ndim);
    }
    int perm[TP_TENSOR_MAX_DIMS];
    for (int i = 0; i < t->t_ndim; i++) {
        perm[i] = i;
    }
    perm[a] = b;
    perm[b] = a;
    return tp__view_permute(t, perm, out_p, err_p);
}

tp_status
tp__view_narrow(const tp_tensor *t, int d, int64_t start, int64_t len,
                tp_tensor **out_p, tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "narrow", "t");
    }
    int dd;
    if (!tp__dim_norm(t->t_ndim, d, &dd)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "narrow: dim %d out of range for %d-d", d,
                             t->t_ndim);
    }
    if (start < 0) {
        start += t->t_shape[dd];
    }
    // Written so that a huge @len cannot overflow start + len.
    if (start < 0 || start > t->t_shape[dd] || len < 0 ||
        len > t->t_shape[dd] - start) {
        return tp__error_set(err_p, TP_EINVAL,
                             "narrow: start %lld, length %lld out of range "
                             "for size %lld",
                             (long long)start, (long long)len,
                             (long long)t->t_shape[dd]);
    }
    int64_t shape[TP_TENSOR_MAX_DIMS];
    memcpy(shape, t->t_shape, sizeof(shape));
    shape[dd] = len;
    return view_of(t, t->t_ndim, shape, t->t_strides,
                   t->t_offset + start * t->t_strides[dd], out_p, err_p);
}

tp_status
tp__view_expand(const tp_tensor *t, int ndim, const int64_t *shape_in,
                tp_tensor **out_p, tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "expand", "t");
    }
    if (ndim < t->t_ndim || ndim > TP_TENSOR_MAX_DIMS) {
        return tp__error_set(err_p, TP_EINVAL,
                             "expand: %d dims given for a %d-d tensor", ndim,
                             t->t_ndim);
    }
    int64_t shape[TP_TENSOR_MAX_DIMS], strides[TP_TENSOR_MAX_DIMS];
    int lead = ndim - t->t_ndim;
    for (int i = 0; i < ndim; i++) {
        int j = i - lead;
        int64_t want = shape_in[i];
        if (j < 0) {
            if (want < 0) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "expand: -1 for a new leading dim");
            }
            shape[i] = want;
            strides[i] = 0;
        } else if (want == -1 || want == t->t_shape[j]) {
            shape[i] = t->t_shape[j];
            strides[i] = t->t_strides[j];
        } else if (t->t_shape[j] == 1 && want >= 0) {
            shape[i] = want;
            strides[i] = 0;
        } else {
            char a[128], b[128];
            return tp__error_set(
                err_p, TP_EINVAL, "expand: cannot expand %s to %s",
                tp__shape_str(t->t_ndim, t->t_shape, a, sizeof(a)),
                tp__shape_str(ndim, shape_in, b, sizeof(b)));
        }
    }
    if (!tp__shape_fits(ndim, shape)) {
        return tp__error_set(err_p, TP_EINVAL, "expand: shape too large");
    }
    return view_of(t, ndim, shape, strides, t->t_offset, out_p, err_p);
}
