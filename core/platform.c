// SPDX-License-Identifier: Apache-2.0
// platform.c - thin wrappers over pthreads; failures here are our bugs.

#include "platform.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

void
tp__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "tpipe: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}

void
tp__mtx_init(tp_mtx *m)
{
    // Adaptive: a contended lock spins briefly before sleeping. Our
    // critical sections are short and taken from loop, pool and user
    // threads at once (an RPC burst); sleeping on each collision cost a
    // futex wait + wake pair per call.
    pthread_mutexattr_t attr;
    TP_ASSERT(pthread_mutexattr_init(&attr) == 0);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    TP_ASSERT(pthread_mutex_init(&m->m, &attr) == 0);
    pthread_mutexattr_destroy(&attr);
}

void
tp__mtx_fini(tp_mtx *m)
{
    pthread_mutex_destroy(&m->m);
}

void
tp__mtx_lock(tp_mtx *m)
{
    TP_ASSERT(pthread_mutex_lock(&m->m) == 0);
}

void
tp__mtx_unlock(tp_mtx *m)
{
    TP_ASSERT(pthread_mutex_unlock(&m->m) == 0);
}

void
tp__cv_init(tp_cv *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    TP_ASSERT(pthread_cond_init(&c->c, &a) == 0);
    pthread_condattr_destroy(&a);
}

void
tp__cv_fini(tp_cv *c)
{
    pthread_cond_destroy(&c->c);
}

void
tp__cv_wait(tp_cv *c, tp_mtx *m)
{
    TP_ASSERT(pthread_cond_wait(&c->c, &m->m) == 0);
}

bool
tp__cv_wait_until(tp_cv *c, tp_mtx *m, uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        tp__cv_wait(c, m);
        return true;
    }
    struct timespec ts;
    ts.tv_sec = (time_t)(deadline_ns / 1000000000u);
    ts.tv_nsec = (long)(deadline_ns % 1000000000u);
    int rv = pthread_cond_timedwait(&c->c, &m->m, &ts);
    TP_ASSERT(rv == 0 || rv == ETIMEDOUT);
    return rv == 0;
}

void
tp__cv_signal(tp_cv *c)
{
    pthread_cond_signal(&c->c);
}

void
tp__cv_broadcast(tp_cv *c)
{
    pthread_cond_broadcast(&c->c);
}

void
tp__thread_set_name(const char *name)
{
    char buf[16];
    snprintf(buf, sizeof(buf), "%s", name);
    pthread_setname_np(pthread_self(), buf);
}

uint64_t
tp__random_u64(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
            // Only before the pool is initialised, early at boot.
            v = tp__now_ns() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)&v;
        }
    }
    return v;
}

bool
tp__spin_until(bool (*done)(void *arg), void *arg, uint64_t spin_ns)
{
    uint64_t end = tp__now_ns() + spin_ns;
    for (unsigned round = 1;; round++) {
        if (done(arg)) {
            return true;
        }
        if (round == 1 || (round & 7) == 0) {
            sched_yield();
            if (tp__now_ns() >= end) {
                return done(arg);
            }
        } else {
            tp__cpu_relax();
        }
    }
}
