/* SPDX-License-Identifier: Apache-2.0 */
/* tensor_impl.h (internal) - the tensor and storage structs, raw
 * (non-recording) views and copies, and element conversion helpers; shared
 * by core/tensor.c (storage, creation), tensor_dtype.c (dtypes, element
 * conversion, shapes), tensor_view.c (byte ranges, views), tensor_copy.c
 * (raw copies) and tensor_rand.c (random generators), and used by the
 * kernels above core. */
#ifndef TP_CORE_TENSOR_IMPL_H
#define TP_CORE_TENSOR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <tpipe/tensor.h>

struct tp_node;

typedef struct tp_storage {
    atomic_long s_refs;
    void *s_data;
    size_t s_nbytes;
    tp_device s_device;
    tp_free_fn s_free; // NULL: s_data came from tp__alloc (or is not ours)
    void *s_free_arg;
    bool s_owned; // s_data is ours to free (through the block cache)
    size_t s_cap; // owned data: the size of the block
} tp_storage;

struct tp_tensor {
    atomic_long t_refs;
    tp_storage *t_storage;
    int64_t t_offset; // in elements
    tp_dtype t_dtype;
    int t_ndim;
    int64_t t_shape[TP_TENSOR_MAX_DIMS];
    int64_t t_strides[TP_TENSOR_MAX_DIMS]; // in elements

    // Autograd state, owned by autograd/. t_ag_release (set by autograd
    // whenever it stores something here) drops it when the tensor goes, so
    // core/ does not call into autograd/.
    bool t_requires_grad;
    tp_tensor *t_grad;         // leaves: accumulated gradient
    struct tp_node *t_grad_fn; // non-leaves: the node that made this
    int t_output_nr;           // which output of t_grad_fn
    void (*t_ag_release)(tp_tensor *t);
};

// A tensor over @st (a new reference is taken) with the given geometry and
// no autograd state.
tp_status tp__tensor_make(tp_storage *st, tp_dtype dt, int ndim,
                          const int64_t *shape, const int64_t *strides,
                          int64_t offset, tp_tensor **t_p, tp_error **err_p);
// A view of @t's storage with @t's geometry and no autograd state: what a
// node saves, so saving an op's output never makes a reference cycle.
tp_status tp__tensor_alias(const tp_tensor *t, tp_tensor **t_p,
                           tp_error **err_p);

// Shape helpers.
int64_t tp__shape_numel(int ndim, const int64_t *shape);
void tp__contiguous_strides(int ndim, const int64_t *shape, int64_t *strides);
bool tp__shape_equal(int na, const int64_t *a, int nb, const int64_t *b);
// Formats "[2, 3]" into @buf (always NUL-terminated).
const char *tp__shape_str(int ndim, const int64_t *shape, char *buf,
                          size_t len);
// Normalises a possibly negative dim; false if out of range.
bool tp__dim_norm(int ndim, int d, int *out);
// True if numel (sizes 0 counted as 1) times 16 fits in int64_t.
bool tp__shape_fits(int ndim, const int64_t *shape);
// TP_EINVAL with "@fn: @arg is NULL": a public function's NULL handle or
// out pointer.
tp_status tp__tensor_null_arg(tp_error **err_p, const char *fn,
                              const char *arg);
// TP_EINVAL naming @what unless @dt, @ndim and @shape make a valid tensor.
tp_status tp__check_shape(const char *what, tp_dtype dt, int ndim,
                          const int64_t *shape, tp_error **err_p);

// Raw views: no autograd recording.
tp_status tp__view_reshape(const tp_tensor *t, int ndim, const int64_t *shape,
                           tp_tensor **out_p, tp_error **err_p);
tp_status tp__view_permute(const tp_tensor *t, const int *perm,
                           tp_tensor **out_p, tp_error **err_p);
tp_status tp__view_transpose(const tp_tensor *t, int d0, int d1,
                             tp_tensor **out_p, tp_error **err_p);
tp_status tp__view_narrow(const tp_tensor *t, int d, int64_t start, int64_t len,
                          tp_tensor **out_p, tp_error **err_p);
tp_status tp__view_expand(const tp_tensor *t, int ndim, const int64_t *shape,
                          tp_tensor **out_p, tp_error **err_p);
// Raw copies: no autograd recording, no grad-mode checks.
tp_status tp__copy_raw(tp_tensor *dst, const tp_tensor *src, tp_error **err_p);
tp_status tp__contiguous_raw(const tp_tensor *t, tp_tensor **out_p,
                             tp_error **err_p);
tp_status tp__clone_raw(const tp_tensor *t, tp_tensor **out_p,
                        tp_error **err_p);
tp_status tp__to_dtype_raw(const tp_tensor *t, tp_dtype dt, tp_tensor **out_p,
                           tp_error **err_p);
// Frees the large blocks kept for reuse by tensor storage (tests, and
// applications that want the memory back).
void tp__tensor_cache_trim(void);
// Fills @t (any layout) with @v converted to its dtype.
void tp__fill(tp_tensor *t, double v);

// Element conversion. Inline: the f16/bf16 loops of the kernels and of
// the reductions call them per element (bf16 sum 1.2 -> 2.4 GB/s).
static inline uint32_t
tp__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float
tp__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t
tp__f32_to_f16(float f)
{
    uint32_t x = tp__f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 0xffu;
    uint32_t man = x & 0x7fffffu;

    if (exp == 0xff) { // inf or nan
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    }
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 0x1f) {
        return (uint16_t)(sign | 0x7c00u); // overflow to inf
    }
    if (e <= 0) {
        // Subnormal half (or zero): shift the mantissa with its implicit
        // bit, rounding to nearest even.
        if (e < -10) {
            return (uint16_t)sign;
        }
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) {
            h++;
        }
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h++; // may carry into the exponent, which is still correct
    }
    return (uint16_t)(sign | h);
}

static inline float
tp__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;

    if (exp == 0) {
        if (man == 0) {
            return tp__bits_f32(sign);
        }
        // Subnormal: value = man * 2^-24.
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    if (exp == 0x1f) {
        return tp__bits_f32(sign | 0x7f800000u | (man << 13));
    }
    return tp__bits_f32(sign | ((exp - 15 + 127) << 23) | (man << 13));
}

static inline uint16_t
tp__f32_to_bf16(float f)
{
    uint32_t x = tp__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((x >> 16) | 0x40u); // quiet nan
    }
    // Round to nearest even on the dropped 16 bits.
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static inline float
tp__bf16_to_f32(uint16_t h)
{
    return tp__bits_f32((uint32_t)h << 16);
}

double tp__load_f64(const void *p, tp_dtype dt);
// Reads an integer or bool element exactly (0 for floating dtypes).
int64_t tp__load_i64(const void *p, tp_dtype dt);
void tp__store_f64(void *p, tp_dtype dt, double v);

static inline char *
tp__tensor_ptr(const tp_tensor *t)
{
    return (char *)t->t_storage->s_data +
           t->t_offset * (int64_t)tp_dtype_size(t->t_dtype);
}

// The address of element @i (row-major order) of @t, any layout.
static inline char *
tp__tensor_elem_ptr(const tp_tensor *t, int64_t i)
{
    int64_t off = 0;
    for (int d = t->t_ndim - 1; d >= 0; d--) {
        off += (i % t->t_shape[d]) * t->t_strides[d];
        i /= t->t_shape[d];
    }
    return tp__tensor_ptr(t) + off * (int64_t)tp_dtype_size(t->t_dtype);
}

// TP_ENOTSUP (naming @op) unless @t lives in host memory: the CPU
// kernels and element accessors call this before touching data.
tp_status tp__tensor_check_cpu(const char *op, const tp_tensor *t,
                               tp_error **err_p);

#endif
