// SPDX-License-Identifier: Apache-2.0
// tensor.c - refcounted storage (with its cache of large blocks),
// tensor creation, geometry and accessors, devices. The rest of the tensor:
// tensor_dtype.c (dtypes, element conversion, shapes), tensor_view.c (byte
// ranges, as_strided, raw views), tensor_copy.c (raw copies between
// dtypes, fill), tensor_rand.c (random generators).

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "cuda.h"
#include "tensor_impl.h"

// ---- storage and tensors ---------------------------------------------------

// A small cache of freed large data blocks. A training loop makes the
// same large activations every step; glibc serves blocks over 32 MB with
// a fresh mmap each time, and touching that memory again costs a page
// fault per 4 KB, which halves the bandwidth of elementwise ops on such
// tensors. Blocks of at least 1 MB are kept (at most 8, 512 MB in all) and
// handed out again for requests they fit within 1/8.
#define CACHE_MIN_BYTES  ((size_t)1 << 20)
#define CACHE_MAX_BLOCKS 8
#define CACHE_MAX_BYTES  ((size_t)512 << 20)

static struct {
    tp_mtx mtx;
    size_t n, total;
    void *data[CACHE_MAX_BLOCKS];
    size_t size[CACHE_MAX_BLOCKS];
} block_cache = {.mtx = {PTHREAD_MUTEX_INITIALIZER}};

static void *
block_alloc(size_t nbytes, size_t *cap_p)
{
    *cap_p = nbytes;
    if (nbytes >= CACHE_MIN_BYTES) {
        void *p = NULL;
        tp__mtx_lock(&block_cache.mtx);
        for (size_t i = 0; i < block_cache.n; i++) {
            size_t sz = block_cache.size[i];
            if (sz >= nbytes && sz - nbytes <= nbytes / 8) {
                p = block_cache.data[i];
                *cap_p = sz;
                block_cache.total -= sz;
                block_cache.n--;
                block_cache.data[i] = block_cache.data[block_cache.n];
                block_cache.size[i] = block_cache.size[block_cache.n];
                break;
            }
        }
        tp__mtx_unlock(&block_cache.mtx);
        if (p) {
            return p;
        }
    }
    return tp__alloc(nbytes ? nbytes : 1);
}

static void
block_free(void *p, size_t cap)
{
    void *evict = NULL;
    if (cap >= CACHE_MIN_BYTES && cap <= CACHE_MAX_BYTES) {
        tp__mtx_lock(&block_cache.mtx);
        // Make room by dropping the oldest block if needed.
        if (block_cache.n == CACHE_MAX_BLOCKS ||
            block_cache.total + cap > CACHE_MAX_BYTES) {
            if (block_cache.n > 0) {
                evict = block_cache.data[0];
                block_cache.total -= block_cache.size[0];
                block_cache.n--;
                memmove(&block_cache.data[0], &block_cache.data[1],
                        block_cache.n * sizeof(void *));
                memmove(&block_cache.size[0], &block_cache.size[1],
                        block_cache.n * sizeof(size_t));
            }
        }
        if (block_cache.n < CACHE_MAX_BLOCKS &&
            block_cache.total + cap <= CACHE_MAX_BYTES) {
            block_cache.data[block_cache.n] = p;
            block_cache.size[block_cache.n] = cap;
            block_cache.n++;
            block_cache.total += cap;
            p = NULL;
        }
        tp__mtx_unlock(&block_cache.mtx);
    }
    tp__free(evict);
    tp__free(p);
}

void
tp__tensor_cache_trim(void)
{
    tp__mtx_lock(&block_cache.mtx);
    for (size_t i = 0; i < block_cache.n; i++) {
        tp__free(block_cache.data[i]);
    }
    block_cache.n = 0;
    block_cache.total = 0;
    tp__mtx_unlock(&block_cache.mtx);
}

void
tp_tensor_cache_trim(void)
{
    tp__tensor_cache_trim();
}

static tp_status
storage_create(size_t nbytes, tp_storage **st_p, tp_error **err_p)
{
    tp_storage *st = tp__zalloc(sizeof(*st));
    if (!st) {
        return tp__error_set(err_p, TP_ENOMEM, "tensor: out of memory");
    }
    // Never NULL data, even for zero bytes.
    st->s_data = block_alloc(nbytes, &st->s_cap);
    if (!st->s_data) {
        tp__free(st);
        return tp__error_set(err_p, TP_ENOMEM,
                             "tensor: out of memory for %zu bytes", nbytes);
    }
    atomic_init(&st->s_refs, 1);
    st->s_nbytes = nbytes;
    st->s_device.type = TP_DEVICE_CPU;
    st->s_owned = true;
    *st_p = st;
    return TP_OK;
}

static void
storage_unref(tp_storage *st)
{
    if (atomic_fetch_sub_explicit(&st->s_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    if (st->s_owned) {
        block_free(st->s_data, st->s_cap);
    } else if (st->s_free) {
        st->s_free(st->s_data, st->s_free_arg);
    }
    tp__free(st);
}

tp_status
tp__tensor_make(tp_storage *st, tp_dtype dt, int ndim, const int64_t *shape,
                const int64_t *strides, int64_t offset, tp_tensor **t_p,
                tp_error **err_p)
{
    tp_tensor *t = tp__zalloc(sizeof(*t));
    if (!t) {
        return tp__error_set(err_p, TP_ENOMEM, "tensor: out of memory");
    }
    atomic_init(&t->t_refs, 1);
    atomic_fetch_add_explicit(&st->s_refs, 1, memory_order_relaxed);
    t->t_storage = st;
    t->t_dtype = dt;
    t->t_ndim = ndim;
    t->t_offset = offset;
    for (int i = 0; i < ndim; i++) {
        t->t_shape[i] = shape[i];
        t->t_strides[i] = strides[i];
    }
    *t_p = t;
    return TP_OK;
}

tp_status
tp__tensor_alias(const tp_tensor *t, tp_tensor **t_p, tp_error **err_p)
{
    return tp__tensor_make(t->t_storage, t->t_dtype, t->t_ndim, t->t_shape,
                           t->t_strides, t->t_offset, t_p, err_p);
}

tp_status
tp_tensor_empty(tp_dtype dt, int ndim, const int64_t *shape, tp_tensor **t_p,
                tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_empty", "t_p");
    }
    tp_status st = tp__check_shape("tensor empty", dt, ndim, shape, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t strides[TP_TENSOR_MAX_DIMS];
    tp__contiguous_strides(ndim, shape, strides);
    size_t nbytes = (size_t)tp__shape_numel(ndim, shape) * tp_dtype_size(dt);
    tp_storage *s = NULL;
    st = storage_create(nbytes, &s, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__tensor_make(s, dt, ndim, shape, strides, 0, t_p, err_p);
    storage_unref(s); // the tensor holds the storage now (or nobody does)
    return st;
}

tp_status
tp_tensor_zeros(tp_dtype dt, int ndim, const int64_t *shape, tp_tensor **t_p,
                tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_zeros", "t_p");
    }
    tp_tensor *t;
    tp_status st = tp_tensor_empty(dt, ndim, shape, &t, err_p);
    if (st != TP_OK) {
        return st;
    }
    memset(t->t_storage->s_data, 0, t->t_storage->s_nbytes);
    *t_p = t;
    return TP_OK;
}

tp_status
tp_tensor_full(tp_dtype dt, int ndim, const int64_t *shape, double value,
               tp_tensor **t_p, tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_full", "t_p");
    }
    tp_tensor *t;
    tp_status st = tp_tensor_empty(dt, ndim, shape, &t, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp__fill(t, value);
    *t_p = t;
    return TP_OK;
}

tp_status
tp_tensor_ones(tp_dtype dt, int ndim, const int64_t *shape, tp_tensor **t_p,
               tp_error **err_p)
{
    return tp_tensor_full(dt, ndim, shape, 1.0, t_p, err_p);
}

tp_status
tp_tensor_arange(tp_dtype dt, double start, double end, double step,
                 tp_tensor **t_p, tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_arange", "t_p");
    }
    if (step == 0.0 || step != step || start != start || end != end) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tensor arange: invalid step or bounds");
    }
    double n = ceil((end - start) / step);
    if (n < 0) {
        n = 0;
    }
    if (n > 1e15) {
        return tp__error_set(err_p, TP_EINVAL, "tensor arange: too long");
    }
    int64_t len = (int64_t)n;
    tp_tensor *t;
    tp_status st = tp_tensor_empty(dt, 1, &len, &t, err_p);
    if (st != TP_OK) {
        return st;
    }
    char *p = t->t_storage->s_data;
    size_t es = tp_dtype_size(dt);
    for (int64_t i = 0; i < len; i++) {
        tp__store_f64(p + (size_t)i * es, dt, start + (double)i * step);
    }
    *t_p = t;
    return TP_OK;
}

tp_status
tp_tensor_from_blob(void *data, tp_dtype dt, int ndim, const int64_t *shape,
                    tp_free_fn free_fn, void *arg, tp_tensor **t_p,
                    tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_from_blob", "t_p");
    }
    tp_status st = tp__check_shape("tensor from_blob", dt, ndim, shape, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (!data) {
        return tp__error_set(err_p, TP_EINVAL, "tensor from_blob: NULL data");
    }
    tp_storage *s = tp__zalloc(sizeof(*s));
    if (!s) {
        return tp__error_set(err_p, TP_ENOMEM, "tensor: out of memory");
    }
    atomic_init(&s->s_refs, 1);
    s->s_data = data;
    s->s_nbytes = (size_t)tp__shape_numel(ndim, shape) * tp_dtype_size(dt);
    s->s_device.type = TP_DEVICE_CPU;
    int64_t strides[TP_TENSOR_MAX_DIMS];
    tp__contiguous_strides(ndim, shape, strides);
    st = tp__tensor_make(s, dt, ndim, shape, strides, 0, t_p, err_p);
    if (st != TP_OK) {
        // The caller keeps @data: free the storage without its callback.
        tp__free(s);
        return st;
    }
    s->s_free = free_fn;
    s->s_free_arg = arg;
    storage_unref(s);
    return TP_OK;
}

static void
tensor_cuda_free(void *data, void *arg)
{
    tp__cuda_free((int)(intptr_t)arg, data);
}

tp_status
tp_tensor_empty_on(tp_device dev, tp_dtype dt, int ndim, const int64_t *shape,
                   tp_tensor **t_p, tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_empty_on", "t_p");
    }
    if (dev.type == TP_DEVICE_CPU) {
        return tp_tensor_empty(dt, ndim, shape, t_p, err_p);
    }
    if (dev.type != TP_DEVICE_CUDA) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tensor empty_on: unknown device type %d",
                             (int)dev.type);
    }
    tp_status st = tp__check_shape("tensor empty_on", dt, ndim, shape, err_p);
    if (st != TP_OK) {
        return st;
    }
    size_t nbytes = (size_t)tp__shape_numel(ndim, shape) * tp_dtype_size(dt);
    void *data = NULL;
    st = tp__cuda_alloc(dev.index, nbytes, &data, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_storage *s = tp__zalloc(sizeof(*s));
    if (!s) {
        tp__cuda_free(dev.index, data);
        return tp__error_set(err_p, TP_ENOMEM, "tensor: out of memory");
    }
    atomic_init(&s->s_refs, 1);
    s->s_data = data;
    s->s_nbytes = nbytes;
    s->s_device = dev;
    int64_t strides[TP_TENSOR_MAX_DIMS];
    tp__contiguous_strides(ndim, shape, strides);
    st = tp__tensor_make(s, dt, ndim, shape, strides, 0, t_p, err_p);
    if (st != TP_OK) {
        tp__cuda_free(dev.index, data);
        tp__free(s);
        return st;
    }
    s->s_free = tensor_cuda_free;
    s->s_free_arg = (void *)(intptr_t)dev.index;
    storage_unref(s);
    return TP_OK;
}

tp_status
tp_tensor_to_device(tp_tensor *t, tp_device dev, tp_tensor **out_p,
                    tp_error **err_p)
{
    if (t == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_to_device", "t");
    }
    if (out_p == NULL) {
        return tp__tensor_null_arg(err_p, "tp_tensor_to_device", "out_p");
    }
    tp_device from = t->t_storage->s_device;
    if (from.type == dev.type &&
        (dev.type == TP_DEVICE_CPU || from.index == dev.index)) {
        *out_p = tp_tensor_ref(t);
        return TP_OK;
    }
    // The copy is one contiguous block: a strided CPU view is made
    // contiguous first; a strided device view is not supported.
    tp_tensor *src = NULL;
    tp_status st;
    if (from.type == TP_DEVICE_CPU) {
        st = tp__contiguous_raw(t, &src, err_p);
    } else if (!tp_tensor_is_contiguous(t)) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "tensor to_device: a non-contiguous cuda:%d "
                             "view cannot be copied; make it contiguous on "
                             "the device first",
                             from.index);
    } else {
        src = tp_tensor_ref(t);
        st = TP_OK;
    }
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *dst;
    st =
        tp_tensor_empty_on(dev, t->t_dtype, t->t_ndim, t->t_shape, &dst, err_p);
    if (st == TP_OK) {
        st = tp__cuda_copy(
            tp__tensor_ptr(dst), dev.type == TP_DEVICE_CPU ? -1 : dev.index,
            tp__tensor_ptr(src), from.type == TP_DEVICE_CPU ? -1 : from.index,
            tp_tensor_nbytes(dst), err_p);
        if (st != TP_OK) {
            tp_tensor_unref(dst);
        } else {
            *out_p = dst;
        }
    }
    tp_tensor_unref(src);
    return st;
}

tp_tensor *
tp_tensor_ref(tp_tensor *t)
{
    if (t) {
        atomic_fetch_add_explicit(&t->t_refs, 1, memory_order_relaxed);
    }
    return t;
}

void
tp_tensor_unref(tp_tensor *t)
{
    if (!t ||
        atomic_fetch_sub_explicit(&t->t_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    if (t->t_ag_release) {
        t->t_ag_release(t);
    }
    storage_unref(t->t_storage);
    tp__free(t);
}

tp_dtype
tp_tensor_dtype(const tp_tensor *t)
{
    return t->t_dtype;
}

int
tp_tensor_ndim(const tp_tensor *t)
{
    return t->t_ndim;
}

const int64_t *
tp_tensor_shape(const tp_tensor *t)
{
    return t->t_shape;
}

int64_t
tp_tensor_size(const tp_tensor *t, int d)
{
    int dd;
    if (!tp__dim_norm(t->t_ndim, d, &dd)) {
        return -1;
    }
    return t->t_shape[dd];
}

const int64_t *
tp_tensor_strides(const tp_tensor *t)
{
    return t->t_strides;
}

int64_t
tp_tensor_offset(const tp_tensor *t)
{
    return t->t_offset;
}

int64_t
tp_tensor_numel(const tp_tensor *t)
{
    return tp__shape_numel(t->t_ndim, t->t_shape);
}

size_t
tp_tensor_nbytes(const tp_tensor *t)
{
    return (size_t)tp_tensor_numel(t) * tp_dtype_size(t->t_dtype);
}

tp_device
tp_tensor_device(const tp_tensor *t)
{
    return t->t_storage->s_device;
}

bool
tp_tensor_is_contiguous(const tp_tensor *t)
{
    if (t == NULL) {
        return false; // so tp_tensor_contiguous(NULL) fails in the copy
    }
    int64_t expect = 1;
    for (int i = t->t_ndim - 1; i >= 0; i--) {
        if (t->t_shape[i] == 0) {
            return true;
        }
        if (t->t_shape[i] != 1 && t->t_strides[i] != expect) {
            return false;
        }
        expect *= t->t_shape[i];
    }
    return true;
}

void *
tp_tensor_data(const tp_tensor *t)
{
    return tp__tensor_ptr(t);
}

void *
tp_tensor_storage_data(const tp_tensor *t)
{
    return t->t_storage->s_data;
}

size_t
tp_tensor_storage_nbytes(const tp_tensor *t)
{
    return t->t_storage->s_nbytes;
}

bool
tp_tensor_shares_storage(const tp_tensor *a, const tp_tensor *b)
{
    return a->t_storage == b->t_storage;
}
tp_status
tp__tensor_check_cpu(const char *op, const tp_tensor *t, tp_error **err_p)
{
    if (t->t_storage->s_device.type != TP_DEVICE_CPU) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: the tensor is on cuda:%d; this operation "
                             "runs on CPU tensors only (copy it with "
                             "tp_tensor_to_device first)",
                             op, t->t_storage->s_device.index);
    }
    return TP_OK;
}

tp_status
tp_tensor_item(const tp_tensor *t, int64_t i, double *v_p)
{
    if (t == NULL) {
        return TP_EINVAL;
    }
    if (v_p == NULL) {
        return TP_EINVAL;
    }
    if (i < 0 || i >= tp_tensor_numel(t) ||
        t->t_storage->s_device.type != TP_DEVICE_CPU) {
        return TP_EINVAL;
    }
    *v_p = tp__load_f64(tp__tensor_elem_ptr(t, i), t->t_dtype);
    return TP_OK;
}

tp_status
tp_tensor_set_item(tp_tensor *t, int64_t i, double v)
{
    if (t == NULL) {
        return TP_EINVAL;
    }
    if (i < 0 || i >= tp_tensor_numel(t) ||
        t->t_storage->s_device.type != TP_DEVICE_CPU) {
        return TP_EINVAL;
    }
    tp__store_f64(tp__tensor_elem_ptr(t, i), t->t_dtype, v);
    return TP_OK;
}
