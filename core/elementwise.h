/* SPDX-License-Identifier: Apache-2.0 */
/* elementwise.h (internal) - the one set of dense elementwise kernels:
 * dst = dst OP src and dst = a OP b over contiguous buffers of one dtype.
 * The collectives' reductions (collectives/reduce.c), the agent's tp.add
 * and autograd's dense add all run these loops.
 *
 * Supported (op, dtype) pairs (tp__elementwise_supported):
 *   sum, prod, min, max: f32 f64 f16 bf16 i8 u8 i32 i64
 *   band, bor, bxor:     i8 u8 i32 i64 bool
 *   min, max:            also bool (min = logical and, max = logical or)
 * bool takes no sum/prod: a bool "sum" is ambiguous (or vs count); a
 * caller that wants "or" asks for max.
 *
 * Arithmetic: integers wrap (two's complement, no UB); f16 and bf16 are
 * widened to f32, combined and rounded to nearest even once per element;
 * float min/max propagate NaN (as torch.maximum/torch.minimum) and
 * otherwise return the first operand only if it is strictly smaller
 * (larger), so a tie such as min(-0, +0) gives the second. bool inputs
 * may be any byte; nonzero is true and outputs are 0 or 1.
 *
 * The kernels do not check their arguments: ask tp__elementwise_supported
 * (or a caller's own check built on it) first. Thread safety: all
 * functions are pure and may run on any thread concurrently on disjoint
 * buffers. */
#ifndef TP_CORE_ELEMENTWISE_H
#define TP_CORE_ELEMENTWISE_H

#include <stdbool.h>
#include <stddef.h>

#include <tpipe/tensor.h>

// Core's own op list, so that core needs nothing from the layers above
// (the collectives map tp_reduce_op onto it).
typedef enum tp__ew_op {
    TP__EW_SUM,
    TP__EW_PROD,
    TP__EW_MIN,
    TP__EW_MAX,
    TP__EW_BAND,
    TP__EW_BOR,
    TP__EW_BXOR,
} tp__ew_op;
#define TP__EW_OP_COUNT (TP__EW_BXOR + 1)

// True if @op has a kernel for @dt (the table above); false for values
// outside either enum.
bool tp__elementwise_supported(tp__ew_op op, tp_dtype dt);

// dst[i] = dst[i] OP src[i] for @n elements of @dt. @dst and @src may be
// the same buffer but must not otherwise overlap.
// Precondition: tp__elementwise_supported(op, dt).
void tp__elementwise(tp__ew_op op, tp_dtype dt, void *dst, const void *src,
                     size_t n);

// dst[i] = a[i] OP b[i]. @dst may be @a or @b (or both), but must not
// otherwise overlap them; @a and @b may overlap freely. The operand order
// is kept even when @dst is @b. Precondition as tp__elementwise.
void tp__elementwise3(tp__ew_op op, tp_dtype dt, void *dst, const void *a,
                      const void *b, size_t n);

#endif
