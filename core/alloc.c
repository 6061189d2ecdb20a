// SPDX-License-Identifier: Apache-2.0
// alloc.c - allocation with a fail-the-Nth hook for OOM tests.

#include "alloc.h"

#include <tpipe/error.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_config.h"

static _Atomic long alloc_count;
static _Atomic long alloc_fail_at; // 0 = never

static bool
alloc_should_fail(void)
{
#if TP_HAVE_TEST_FAULTS
    long at = atomic_load_explicit(&alloc_fail_at, memory_order_relaxed);
    long n = atomic_fetch_add_explicit(&alloc_count, 1, memory_order_relaxed);
    return at != 0 && n + 1 == at;
#else
    return false;
#endif
}

long
tp__alloc_fail_after(long nth)
{
    long n = atomic_exchange_explicit(&alloc_count, 0, memory_order_relaxed);
    atomic_store_explicit(&alloc_fail_at, nth, memory_order_relaxed);
    return n;
}

void *
tp__alloc(size_t n)
{
    if (alloc_should_fail()) {
        return NULL;
    }
    return malloc(n == 0 ? 1 : n);
}

void *
tp__zalloc(size_t n)
{
    if (alloc_should_fail()) {
        return NULL;
    }
    return calloc(1, n == 0 ? 1 : n);
}

void *
tp__realloc(void *p, size_t n)
{
    if (alloc_should_fail()) {
        return NULL;
    }
    return realloc(p, n == 0 ? 1 : n);
}

void
tp__free(void *p)
{
    free(p);
}

// Public: what tp__alloc and friends returned to a caller. The same
// allocator as tp__free, so a future allocation hook covers both.
void
tp_free(void *p)
{
    tp__free(p);
}

char *
tp__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = tp__alloc(n);
    if (d != NULL) {
        memcpy(d, s, n);
    }
    return d;
}

char *
tp__asprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return NULL;
    }
    char *s = tp__alloc((size_t)n + 1);
    if (s == NULL) {
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}
