/* SPDX-License-Identifier: Apache-2.0 */
/* tensor.h - n-dimensional arrays over refcounted storage. */
#ifndef TPIPE_TENSOR_H
#define TPIPE_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/export.h>
#include <tpipe/error.h>

#ifdef __cplusplus
extern "C" {
#endif

/** TP_TENSOR_MAX_DIMS - the largest number of dimensions a tensor has. */
#define TP_TENSOR_MAX_DIMS 8

/** tp_dtype - element types. The numeric values are part of the wire. */
typedef enum tp_dtype {
    TP_F32 = 0,
    TP_F64 = 1,
    TP_F16 = 2,
    TP_BF16 = 3,
    TP_I8 = 4,
    TP_U8 = 5,
    TP_I32 = 6,
    TP_I64 = 7,
    TP_BOOL = 8,
} tp_dtype;
#define TP_DTYPE_COUNT 9

/** tp_device_type - where a storage lives. */
typedef enum tp_device_type {
    TP_DEVICE_CPU = 0,
    TP_DEVICE_CUDA = 1, /* only created when built with CUDA */
} tp_device_type;

/** tp_device - a device type and index (0 for CPU). */
typedef struct tp_device {
    tp_device_type type;
    int index;
} tp_device;

/**
 * tp_tensor - a view (dtype, shape, strides in elements, offset) of a
 * refcounted storage. Opaque and refcounted; starts at refcount 1. Views
 * share the storage, which is freed with the last tensor that uses it.
 * Thread safety: ref/unref from any thread; a tensor's data and autograd
 * state are not synchronised, so one thread at a time may use it.
 */
typedef struct tp_tensor tp_tensor;

/** tp_generator - a seeded random generator (not thread-safe). */
typedef struct tp_generator tp_generator;

/** tp_free_fn - frees a caller's buffer given to tp_tensor_from_blob. */
typedef void (*tp_free_fn)(void *data, void *arg);

/** tp_byte_range - @len bytes at @offset from the storage base. */
typedef struct tp_byte_range {
    uint64_t offset;
    uint64_t len;
} tp_byte_range;

/** tp_dtype_size - bytes per element of @dt (0 for an invalid value). */
TP_API size_t tp_dtype_size(tp_dtype dt);
/** tp_dtype_name - "f32", "i64", ...; static, "?" for invalid values. */
TP_API const char *tp_dtype_name(tp_dtype dt);
/** tp_dtype_is_floating - true for f32, f64, f16 and bf16. */
TP_API bool tp_dtype_is_floating(tp_dtype dt);

/* ---- creation --------------------------------------------------------- *
 * Every function of this header that returns a tp_status refuses a NULL
 * tensor or a NULL out pointer with TP_EINVAL ("tp_tensor_empty: t_p is
 * NULL"); the accessors (tp_tensor_dtype, tp_tensor_shape, ...) need a
 * tensor.
 */

/**
 * tp_tensor_empty - a new contiguous CPU tensor of @ndim dims (0..8) with
 * uninitialised data. Each size must be >= 0; zero-size tensors are fine.
 * Ownership: the caller owns the one reference in *@t_p.
 * Errors: TP_EINVAL (bad dtype, ndim or size; @t_p NULL), TP_ENOMEM.
 * Thread safety: any thread (as are all creation functions).
 */
TP_API tp_status tp_tensor_empty(tp_dtype dt, int ndim, const int64_t *shape,
                                 tp_tensor **t_p, tp_error **err_p);
/** tp_tensor_zeros - as tp_tensor_empty, filled with 0. */
TP_API tp_status tp_tensor_zeros(tp_dtype dt, int ndim, const int64_t *shape,
                                 tp_tensor **t_p, tp_error **err_p);
/** tp_tensor_ones - as tp_tensor_empty, filled with 1. */
TP_API tp_status tp_tensor_ones(tp_dtype dt, int ndim, const int64_t *shape,
                                tp_tensor **t_p, tp_error **err_p);
/** tp_tensor_full - as tp_tensor_empty, filled with @value (converted). */
TP_API tp_status tp_tensor_full(tp_dtype dt, int ndim, const int64_t *shape,
                                double value, tp_tensor **t_p,
                                tp_error **err_p);
/**
 * tp_tensor_arange - the 1-D tensor start, start+step, ... < end (> end for
 * a negative step). Errors: TP_EINVAL (step 0), TP_ENOMEM.
 */
TP_API tp_status tp_tensor_arange(tp_dtype dt, double start, double end,
                                  double step, tp_tensor **t_p,
                                  tp_error **err_p);
/**
 * tp_tensor_from_blob - a contiguous tensor over the caller's @data.
 * Ownership: takes @data when this succeeds: @free_fn(@data, @arg) runs
 *   when the last tensor using it goes (at once if @free_fn is NULL, never).
 *   On failure ownership stays with the caller.
 * Errors: TP_EINVAL, TP_ENOMEM.
 */
TP_API tp_status tp_tensor_from_blob(void *data, tp_dtype dt, int ndim,
                                     const int64_t *shape, tp_free_fn free_fn,
                                     void *arg, tp_tensor **t_p,
                                     tp_error **err_p);

/**
 * tp_generator_create - a generator seeded with @seed (same seed, same
 * numbers on every machine). Free with tp_generator_destroy.
 * Errors: TP_EINVAL (@g_p NULL), TP_ENOMEM.
 */
TP_API tp_status tp_generator_create(uint64_t seed, tp_generator **g_p);
/** tp_generator_destroy - frees @g; NULL is fine. */
TP_API void tp_generator_destroy(tp_generator *g);
/**
 * tp_tensor_rand - uniform in [@lo, @hi) drawn from @g (floating dtypes).
 * Errors: TP_EINVAL (non-floating dtype, NULL generator), TP_ENOMEM.
 */
TP_API tp_status tp_tensor_rand(tp_dtype dt, int ndim, const int64_t *shape,
                                double lo, double hi, tp_generator *g,
                                tp_tensor **t_p, tp_error **err_p);
/** tp_tensor_randn - normal with @mean and @std drawn from @g. */
TP_API tp_status tp_tensor_randn(tp_dtype dt, int ndim, const int64_t *shape,
                                 double mean, double std, tp_generator *g,
                                 tp_tensor **t_p, tp_error **err_p);

/* ---- references and properties ----------------------------------------- */

/** tp_tensor_ref - take a reference; returns @t. NULL is fine. */
TP_API tp_tensor *tp_tensor_ref(tp_tensor *t);
/**
 * tp_tensor_unref - drop a reference; the last one frees the view and,
 * with the last view, the storage (running its free callback). NULL is
 * fine. Never blocks.
 */
TP_API void tp_tensor_unref(tp_tensor *t);

/** tp_tensor_dtype - the element type of @t. */
TP_API tp_dtype tp_tensor_dtype(const tp_tensor *t);
/** tp_tensor_ndim - the number of dims of @t (0 for a scalar). */
TP_API int tp_tensor_ndim(const tp_tensor *t);
/** tp_tensor_shape - the sizes; borrowed, valid while @t lives. */
TP_API const int64_t *tp_tensor_shape(const tp_tensor *t);
/** tp_tensor_size - the size of dim @d (negative counts from the end). */
TP_API int64_t tp_tensor_size(const tp_tensor *t, int d);
/** tp_tensor_strides - the strides in elements; borrowed. */
TP_API const int64_t *tp_tensor_strides(const tp_tensor *t);
/** tp_tensor_offset - the offset of element 0 in the storage (elements). */
TP_API int64_t tp_tensor_offset(const tp_tensor *t);
/** tp_tensor_numel - the number of elements (1 for 0-d, 0 if a size is 0). */
TP_API int64_t tp_tensor_numel(const tp_tensor *t);
/** tp_tensor_nbytes - numel * element size (the bytes of a dense copy). */
TP_API size_t tp_tensor_nbytes(const tp_tensor *t);
/**
 * tp_tensor_empty_on - as tp_tensor_empty, with storage on @dev: host
 * memory for TP_DEVICE_CPU, device memory of CUDA device @dev.index for
 * TP_DEVICE_CUDA (builds with CUDA, on a machine with a device; otherwise
 * TP_ENOTSUP saying why). CUDA tensors can be viewed (reshape, narrow,
 * transpose, ...), moved with tp_tensor_to_device and sent through pipes;
 * the CPU ops and element accessors refuse them (TP_ENOTSUP / TP_EINVAL).
 */
TP_API tp_status tp_tensor_empty_on(tp_device dev, tp_dtype dt, int ndim,
                                    const int64_t *shape, tp_tensor **t_p,
                                    tp_error **err_p);
/**
 * tp_tensor_to_device - a copy of @t on @dev (a new reference to @t if it
 * is already there). Host to device, device to host and device to device;
 * a strided host view is made contiguous first. Synchronous.
 * Errors: TP_ENOTSUP (no CUDA here, or a strided device view),
 * TP_ENOMEM, TP_EDEVICE.
 */
TP_API tp_status tp_tensor_to_device(tp_tensor *t, tp_device dev,
                                     tp_tensor **out_p, tp_error **err_p);
/** tp_tensor_device - where @t's storage lives. */
TP_API tp_device tp_tensor_device(const tp_tensor *t);
/** tp_tensor_is_contiguous - row-major dense (sizes 0/1 are ignored). */
TP_API bool tp_tensor_is_contiguous(const tp_tensor *t);
/**
 * tp_tensor_data - address of element 0 (storage base + offset). Borrowed;
 * valid while a tensor over the same storage lives.
 */
TP_API void *tp_tensor_data(const tp_tensor *t);
/** tp_tensor_storage_data - the base address of the storage. */
TP_API void *tp_tensor_storage_data(const tp_tensor *t);
/** tp_tensor_storage_nbytes - the size of the whole storage. */
TP_API size_t tp_tensor_storage_nbytes(const tp_tensor *t);
/** tp_tensor_shares_storage - true if @a and @b view the same storage. */
TP_API bool tp_tensor_shares_storage(const tp_tensor *a, const tp_tensor *b);
/**
 * tp_tensor_item - element at row-major index @i converted to double.
 * For tests and small reads; Errors: TP_EINVAL (index out of range).
 */
TP_API tp_status tp_tensor_item(const tp_tensor *t, int64_t i, double *v_p);
/** tp_tensor_set_item - writes @v (converted) at row-major index @i. */
TP_API tp_status tp_tensor_set_item(tp_tensor *t, int64_t i, double v);

/**
 * tp_tensor_byte_ranges - the storage byte ranges that @t's elements
 * occupy, ascending and coalesced, so a pipe sends only those bytes (a
 * narrow slice of a large storage yields just the slice; a broadcast
 * (expanded) dim contributes its bytes once). Exact for every view the
 * view functions make. A tp_tensor_as_strided view whose dims interleave
 * or overlap gets its runs sorted and merged when there are at most 2^20,
 * else one range from its lowest to its highest byte: the ranges always
 * cover every byte the view reads.
 * Fills at most @cap entries of @ranges and sets *@n_p to the number of
 * ranges there are; call again with a larger array if *@n_p > @cap.
 * Errors: none (TP_OK always; TP_EINVAL for NULL arguments).
 */
TP_API tp_status tp_tensor_byte_ranges(const tp_tensor *t,
                                       tp_byte_range *ranges, size_t cap,
                                       size_t *n_p);

/**
 * tp_tensor_as_strided - a view of @base's storage with the given shape,
 * strides (elements, >= 0) and offset (elements from the storage start).
 * For rebuilding a tensor whose byte ranges arrived in a storage of the
 * same layout. Not recorded by autograd; the view is a leaf.
 * Errors: TP_EINVAL if an element would lie outside the storage (index
 *   arithmetic that overflows counts as outside), or @offset is past the
 *   end (an empty view may sit at the end), or the shape is too large.
 */
TP_API tp_status tp_tensor_as_strided(const tp_tensor *base, int ndim,
                                      const int64_t *shape,
                                      const int64_t *strides, int64_t offset,
                                      tp_tensor **out_p, tp_error **err_p);

/**
 * tp_tensor_cache_trim - frees the large data blocks that tensor storage
 * keeps for reuse (freed blocks of 1 MB and more, at most 8 blocks and
 * 512 MB in all).
 * Thread safety: any thread.
 */
TP_API void tp_tensor_cache_trim(void);

/* ---- copies, conversion, views -------------------------------------------
 * The functions below record autograd nodes (see autograd.h) when grad
 * mode is on and their input requires grad; the view functions return a
 * tensor sharing the input's storage. Each takes a new reference out in
 * the last-but-one argument; inputs are borrowed.
 */

/**
 * tp_tensor_copy - writes @src into @dst, converting dtype and
 * broadcasting @src to @dst's shape. Not recorded by autograd.
 * Errors: TP_EINVAL (shapes), TP_EPERM (@dst requires grad while grad
 * mode is on).
 */
TP_API tp_status tp_tensor_copy(tp_tensor *dst, const tp_tensor *src,
                                tp_error **err_p);
/** tp_tensor_to_dtype - a contiguous copy of @t converted to @dt. */
TP_API tp_status tp_tensor_to_dtype(tp_tensor *t, tp_dtype dt,
                                    tp_tensor **out_p, tp_error **err_p);
/** tp_tensor_contiguous - @t itself (a new ref) if contiguous, else a copy. */
TP_API tp_status tp_tensor_contiguous(tp_tensor *t, tp_tensor **out_p,
                                      tp_error **err_p);
/** tp_tensor_clone - a contiguous copy with its own storage. */
TP_API tp_status tp_tensor_clone(tp_tensor *t, tp_tensor **out_p,
                                 tp_error **err_p);
/**
 * tp_tensor_reshape - @t with a new shape of the same numel; one size may
 * be -1. A view when the strides allow it, else a contiguous copy.
 */
TP_API tp_status tp_tensor_reshape(tp_tensor *t, int ndim, const int64_t *shape,
                                   tp_tensor **out_p, tp_error **err_p);
/** tp_tensor_transpose - view with dims @d0 and @d1 swapped. */
TP_API tp_status tp_tensor_transpose(tp_tensor *t, int d0, int d1,
                                     tp_tensor **out_p, tp_error **err_p);
/** tp_tensor_permute - view whose dim i is @t's dim @perm[i]. */
TP_API tp_status tp_tensor_permute(tp_tensor *t, const int *perm,
                                   tp_tensor **out_p, tp_error **err_p);
/**
 * tp_tensor_narrow - view of @len entries of dim @d from @start (negative
 * counts from the end). Errors: TP_EINVAL unless 0 <= start and
 * len <= size - start.
 */
TP_API tp_status tp_tensor_narrow(tp_tensor *t, int d, int64_t start,
                                  int64_t len, tp_tensor **out_p,
                                  tp_error **err_p);
/**
 * tp_tensor_expand - view broadcast to @shape (size-1 dims get stride 0;
 * new leading dims may be added; -1 keeps a size).
 */
TP_API tp_status tp_tensor_expand(tp_tensor *t, int ndim, const int64_t *shape,
                                  tp_tensor **out_p, tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
