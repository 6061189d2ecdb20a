/* SPDX-License-Identifier: Apache-2.0 */
/* alloc.h - every allocation goes through here so tests can fail the Nth. */
#ifndef TP_CORE_ALLOC_H
#define TP_CORE_ALLOC_H

#include <stddef.h>

void *tp__alloc(size_t n);
void *tp__zalloc(size_t n);
void *tp__realloc(void *p, size_t n);
void tp__free(void *p);
char *tp__strdup(const char *s);
// printf into a new string; NULL on OOM.
char *tp__asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Test hook: make the @nth allocation from now fail (1 = the next one);
// 0 disables. Returns the number of allocations since the last call.
long tp__alloc_fail_after(long nth);

#endif
