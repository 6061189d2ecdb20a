/* SPDX-License-Identifier: Apache-2.0 */
/* reduce.h (internal) - the reductions of the collectives (all-reduce,
 * reduce, reduce-scatter): which (op, dtype) pairs they accept, the
 * elementwise step (core's kernels, core/elementwise.h) and avg's final
 * division.
 *
 * Supported (op, dtype) pairs, as checked by tp__reduce_check:
 *   sum, product, min, max: f32 f64 f16 bf16 i8 u8 i32 i64
 *   avg:                    f32 f64 f16 bf16 only (see below)
 *   band, bor, bxor:        i8 u8 i32 i64 bool
 *   min, max:               also bool (min = logical and, max = logical or)
 * bool takes no sum/product/avg: a bool "sum" is ambiguous (or vs count).
 *
 * avg is floating only, like torch.mean: an integer sum wraps before the
 * division, so an integer mean would be silently wrong on overflow (NCCL
 * does a wrapped sum then integer division; Gloo has no avg at all).
 *
 * Arithmetic (core/elementwise.h): integers wrap (two's complement, no UB); f16
 * and bf16 are widened to f32, combined and rounded to nearest even once per
 * step; float min/max propagate NaN (as torch.maximum/torch.minimum) and
 * otherwise return the first operand only if it is strictly smaller
 * (larger), so a tie such as min(-0, +0) gives the second. bool
 * inputs may be any byte; nonzero is true and outputs are 0 or 1.
 *
 * The kernels do not check their arguments: call tp__reduce_check once
 * per collective, before any data moves. Thread safety: all functions are
 * pure and may run on any thread concurrently on disjoint buffers. */
#ifndef TP_COLLECTIVES_REDUCE_H
#define TP_COLLECTIVES_REDUCE_H

#include <stddef.h>

#include <tpipe/collectives.h>
#include <tpipe/error.h>
#include <tpipe/tensor.h>

// tp_reduce_op comes from the public header.

// "sum", "product", "min", "max", "avg", "band", "bor", "bxor"; static,
// "?" for values outside the enum.
const char *tp__reduce_op_name(tp_reduce_op op);

// TP_OK if @op can reduce @dt (see the table above), else TP_EINVAL with a
// message naming the op and the dtype. Unknown op or dtype values are
// TP_EINVAL too. @err_p is optional.
tp_status tp__reduce_check(tp_reduce_op op, tp_dtype dt, tp_error **err_p);

// dst[i] = dst[i] OP src[i] for @n elements of @dt. avg accumulates as
// sum; finish with tp__reduce_avg_finish. @dst and @src must not overlap.
// Precondition: tp__reduce_check(op, dt) == TP_OK.
void tp__reduce(tp_reduce_op op, tp_dtype dt, void *dst, const void *src,
                size_t n);

// dst[i] = a[i] OP b[i]. @dst may be @a or @b (or both), but must not
// otherwise overlap them; @a and @b may overlap freely. The operand order
// is kept even when @dst is @b. Precondition as tp__reduce.
void tp__reduce3(tp_reduce_op op, tp_dtype dt, void *dst, const void *a,
                 const void *b, size_t n);

// buf[i] /= count, for a floating @dt (f16/bf16: divided in f32, rounded
// to nearest even once). @count > 0. Asserts on other dtypes: avg is
// rejected for them by tp__reduce_check.
void tp__reduce_avg_finish(tp_dtype dt, void *buf, size_t n, int count);

#endif
