/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test_op.h - an aio with a completion counter that the test thread
 * waits for with a deadline, by sleeping on a condition variable (never by
 * polling: some cases measure this process's CPU time). The shared helper
 * of the transport tests. */
#ifndef TP_TEST_OP_H
#define TP_TEST_OP_H

#include <stdatomic.h>
#include <stdbool.h>

#include <tpipe/pipe.h>

#include "core/aio.h"
#include "tp_test.h"

typedef struct op {
    tp_aio *aio;
    _Atomic int done; // callbacks run so far (written under mtx)
    tp_mtx mtx;
    tp_cv cv;
} op;

static inline void
op_cb(void *arg)
{
    op *o = arg;
    tp__mtx_lock(&o->mtx);
    atomic_fetch_add_explicit(&o->done, 1, memory_order_release);
    tp__cv_broadcast(&o->cv);
    tp__mtx_unlock(&o->mtx);
}

// A new op; @timeout_ms is the aio's own timeout (0: none).
static inline void
op_init(op *o, int64_t timeout_ms)
{
    atomic_init(&o->done, 0);
    tp__mtx_init(&o->mtx);
    tp__cv_init(&o->cv);
    TP_CHECK_OK(tp_aio_create(op_cb, o, &o->aio), NULL);
    tp_aio_set_timeout(o->aio, timeout_ms);
}

static inline void
op_fini(op *o)
{
    tp_aio_destroy(o->aio);
    tp__cv_fini(&o->cv);
    tp__mtx_fini(&o->mtx);
}

// Waits up to @ms (scaled by TP_TEST_TIMEOUT_MULTIPLIER) for @o's
// callback; true if it ran, and then it has also returned.
static inline bool
op_wait_for(op *o, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    tp__mtx_lock(&o->mtx);
    while (atomic_load_explicit(&o->done, memory_order_acquire) == 0 &&
           tp__cv_wait_until(&o->cv, &o->mtx, deadline)) {
    }
    bool done = atomic_load_explicit(&o->done, memory_order_acquire) > 0;
    tp__mtx_unlock(&o->mtx);
    if (done) {
        tp_aio_wait(o->aio); // until the callback has returned
    }
    return done;
}

// As op_wait_for, failing the case after @ms (the aio timeout normally
// fires first), and checking the callback ran exactly once.
static inline void
op_wait(op *o, int64_t ms)
{
    TP_CHECKF(op_wait_for(o, ms), "operation did not complete within %lld ms",
              (long long)ms);
    TP_CHECK_EQ(atomic_load(&o->done), 1);
}

// A pipe accepted on @l within @ms (the case fails otherwise).
static inline tp_pipe *
op_pipe_accept(tp_pipe_listener *l, int64_t ms)
{
    op acc;
    op_init(&acc, ms);
    tp_pipe_listener_accept(l, acc.aio);
    op_wait(&acc, ms);
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_pipe *p = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    return p;
}

#endif
