/* SPDX-License-Identifier: Apache-2.0 */
/* hash.h - XXH3 helpers (libxxhash). */
#ifndef TP_CORE_HASH_H
#define TP_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

// XXH3-64 of @len bytes at @p (seed 0).
uint64_t tp__hash64(const void *p, size_t len);
// XXH3-64 of a NUL-terminated string (without the NUL).
uint64_t tp__hash64_str(const char *s);
// XXH3-128 rendered as 32 lowercase hex digits into @out (33 bytes).
void tp__hash128_hex(const void *p, size_t len, char out[33]);

#endif
