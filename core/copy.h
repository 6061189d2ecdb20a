/* SPDX-License-Identifier: Apache-2.0 */
/* copy.h - bulk copies for the data path. */
#ifndef TP_CORE_COPY_H
#define TP_CORE_COPY_H

#include <stddef.h>

// Copies @n bytes like memcpy, with non-temporal (streaming) stores where
// the CPU has them: the destination lines are written without first being
// read into the cache. For large destinations that this core will not read
// back soon (a receiver's tensor buffer), that saves a third of the memory
// traffic of a plain copy. Ends with a store fence, so the data is ordered
// before any later release store. Falls back to memcpy elsewhere and for
// small copies.
void tp__memcpy_stream(void *dst, const void *src, size_t n);

// Copies at or above this size (in one operation) are worth streaming.
#define TP_COPY_STREAM_MIN ((size_t)1 << 20)

#endif
