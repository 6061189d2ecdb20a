// SPDX-License-Identifier: Apache-2.0
// tensor.c - refcounted storage, tensor geometry, creation, raw views and
// copies between dtypes, random generators, and the byte ranges of a view.

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "cuda.h"
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
static bool
shape_fits(int ndim, const int64_t *shape)
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

static tp_status
check_shape(const char *what, tp_dtype dt, int ndim, const int64_t *shape,
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
    if (!shape_fits(ndim, shape)) {
        return tp__error_set(err_p, TP_EINVAL, "%s: shape too large", what);
    }
    return TP_OK;
}

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
    tp_status st = check_shape("tensor empty", dt, ndim, shape, err_p);
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
    tp_status st = check_shape("tensor from_blob", dt, ndim, shape, err_p);
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
    if (dev.type == TP_DEVICE_CPU) {
        return tp_tensor_empty(dt, ndim, shape, t_p, err_p);
    }
    if (dev.type != TP_DEVICE_CUDA) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tensor empty_on: unknown device type %d",
                             (int)dev.type);
    }
    tp_status st = check_shape("tensor empty_on", dt, ndim, shape, err_p);
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

static char *
elem_ptr(const tp_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->t_ndim - 1; d >= 0; d--) {
        off += (i % t->t_shape[d]) * t->t_strides[d];
        i /= t->t_shape[d];
    }
    return tp__tensor_ptr(t) + off * (int64_t)tp_dtype_size(t->t_dtype);
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
    if (i < 0 || i >= tp_tensor_numel(t) ||
        t->t_storage->s_device.type != TP_DEVICE_CPU) {
        return TP_EINVAL;
    }
    *v_p = tp__load_f64(elem_ptr(t, i), t->t_dtype);
    return TP_OK;
}

tp_status
tp_tensor_set_item(tp_tensor *t, int64_t i, double v)
{
    if (i < 0 || i >= tp_tensor_numel(t) ||
        t->t_storage->s_device.type != TP_DEVICE_CPU) {
        return TP_EINVAL;
    }
    tp__store_f64(elem_ptr(t, i), t->t_dtype, v);
    return TP_OK;
}

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
    // functions make. Shapes are bounded (shape_fits) and a tensor lies
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
    tp_status st = check_shape("as_strided", base->t_dtype, ndim, shape, err_p);
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
    if (known != numel || !shape_fits(ndim, shape)) {
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
    if (!shape_fits(ndim, shape)) {
        return tp__error_set(err_p, TP_EINVAL, "expand: shape too large");
    }
    return view_of(t, ndim, shape, strides, t->t_offset, out_p, err_p);
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
    return tp__to_dtype_raw(t, t->t_dtype, out_p, err_p);
}

tp_status
tp__contiguous_raw(const tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
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
        memcpy(elem_ptr(t, i), one, es);
    }
}

// ---- random ----------------------------------------------------------------

// xoshiro256** seeded through splitmix64: small, fast and reproducible
// across machines.
struct tp_generator {
    uint64_t g_s[4];
    bool g_have_spare; // Box-Muller makes normals in pairs
    double g_spare;
};

static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t
gen_next(tp_generator *g)
{
    uint64_t *s = g->g_s;
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

// Uniform in [0, 1).
static double
gen_uniform(tp_generator *g)
{
    return (double)(gen_next(g) >> 11) * 0x1.0p-53;
}

static double
gen_normal(tp_generator *g)
{
    if (g->g_have_spare) {
        g->g_have_spare = false;
        return g->g_spare;
    }
    double u1 = gen_uniform(g), u2 = gen_uniform(g);
    double r = sqrt(-2.0 * log(1.0 - u1)); // 1 - u1 is in (0, 1]
    double th = 2.0 * 3.14159265358979323846 * u2;
    g->g_spare = r * sin(th);
    g->g_have_spare = true;
    return r * cos(th);
}

tp_status
tp_generator_create(uint64_t seed, tp_generator **g_p)
{
    tp_generator *g = tp__zalloc(sizeof(*g));
    if (!g) {
        return TP_ENOMEM;
    }
    for (int i = 0; i < 4; i++) {
        g->g_s[i] = splitmix64(&seed);
    }
    *g_p = g;
    return TP_OK;
}

void
tp_generator_destroy(tp_generator *g)
{
    tp__free(g);
}

static tp_status
rand_fill(tp_dtype dt, int ndim, const int64_t *shape, double a, double b,
          bool normal, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    if (!g || !tp_dtype_is_floating(dt)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tensor rand: needs a generator and a floating "
                             "dtype (got %s)",
                             tp_dtype_name(dt));
    }
    tp_tensor *t;
    tp_status st = tp_tensor_empty(dt, ndim, shape, &t, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t n = tp_tensor_numel(t);
    char *p = tp__tensor_ptr(t);
    size_t es = tp_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double v =
            normal ? a + b * gen_normal(g) : a + (b - a) * gen_uniform(g);
        tp__store_f64(p + (size_t)i * es, dt, v);
    }
    *t_p = t;
    return TP_OK;
}

tp_status
tp_tensor_rand(tp_dtype dt, int ndim, const int64_t *shape, double lo,
               double hi, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    return rand_fill(dt, ndim, shape, lo, hi, false, g, t_p, err_p);
}

tp_status
tp_tensor_randn(tp_dtype dt, int ndim, const int64_t *shape, double mean,
                double std, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    return rand_fill(dt, ndim, shape, mean, std, true, g, t_p, err_p);
}
