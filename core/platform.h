/* SPDX-License-Identifier: Apache-2.0 */
/* platform.h - mutexes, condition variables, clocks, assertions. */
#ifndef TP_CORE_PLATFORM_H
#define TP_CORE_PLATFORM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tp_config.h"

#define TP_UNUSED(x)    ((void)(x))
#define TP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define TP_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define TP_MAX(a, b)    ((a) > (b) ? (a) : (b))
#define TP_CONTAINER_OF(ptr, type, member)                                     \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))
#define TP_LIKELY(x)    __builtin_expect(!!(x), 1)
#define TP_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define TP_PRINTF(f, a) __attribute__((format(printf, f, a)))

// TP_CLONES: on x86-64 with GCC, a dense kernel is also built for
// x86-64-v3 (AVX2/FMA) and picked at load time (function multiversioning
// through ifunc), so it is not held to the SSE2 baseline the library is
// compiled for. Not under ThreadSanitizer: the ifunc resolvers run during
// relocation, before the TSan runtime is up, and their instrumentation
// crashes every program that links them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&         \
    defined(__gnu_linux__) && !defined(__SANITIZE_THREAD__)
#define TP_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TP_CLONES
#endif

// TP_ASSERT is for bugs in our own code only, never for peer input.
void tp__assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));
#define TP_ASSERT(e) ((e) ? (void)0 : tp__assert_fail(#e, __FILE__, __LINE__))

typedef struct tp_mtx {
    pthread_mutex_t m;
} tp_mtx;
typedef struct tp_cv {
    pthread_cond_t c;
} tp_cv;

void tp__mtx_init(tp_mtx *m);
void tp__mtx_fini(tp_mtx *m);
void tp__mtx_lock(tp_mtx *m);
void tp__mtx_unlock(tp_mtx *m);
// Condition variables use CLOCK_MONOTONIC.
void tp__cv_init(tp_cv *c);
void tp__cv_fini(tp_cv *c);
void tp__cv_wait(tp_cv *c, tp_mtx *m);
// Returns false on timeout. deadline_ns is a tp__now_ns() value.
bool tp__cv_wait_until(tp_cv *c, tp_mtx *m, uint64_t deadline_ns);
void tp__cv_signal(tp_cv *c);
void tp__cv_broadcast(tp_cv *c);

// Monotonic clock in nanoseconds.
static inline uint64_t
tp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// A deadline timeout_ms from now; 0 or negative means none (UINT64_MAX).
static inline uint64_t
tp__deadline_after_ms(int64_t timeout_ms)
{
    // Saturates: a timeout too long to represent means none.
    if (timeout_ms <= 0 || (uint64_t)timeout_ms > UINT64_MAX / 2000000u) {
        return UINT64_MAX;
    }
    return tp__now_ns() + (uint64_t)timeout_ms * 1000000u;
}

// The timeout of a call that must end by @deadline: the milliseconds left,
// rounded up and at least 1 (a deadline that passed still gives the call
// one try), or 0 (no limit) for no deadline (UINT64_MAX).
static inline int64_t
tp__ms_left(uint64_t deadline)
{
    if (deadline == UINT64_MAX) {
        return 0;
    }
    uint64_t now = tp__now_ns();
    return now >= deadline ? 1
                           : (int64_t)((deadline - now + 999999u) / 1000000u);
}

// Polls @done(@arg) for up to @spin_ns, yielding the CPU at the first
// round (the caller usually just handed work to another thread, which may
// need this core) and every 8 rounds after. Returns true once @done is
// true, false when the time is up. For the spin-then-sleep waits of the
// pool and of RPC futures (the loop's own spin is in loop.c).
bool tp__spin_until(bool (*done)(void *arg), void *arg, uint64_t spin_ns);

// A random nonzero 64-bit number from getrandom (time and address bits if
// the kernel's pool is not ready yet). For ids a peer must not guess.
uint64_t tp__random_u64(void);

static inline void
tp__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Name the calling thread (shown by top -H and gdb); truncated to 15 bytes.
void tp__thread_set_name(const char *name);

#endif
