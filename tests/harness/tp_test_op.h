/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test_op.h - an aio with a completion counter, waited for from the
 * test thread with a deadline: the shared helper of the transport tests. */
#ifndef TP_TEST_OP_H
#define TP_TEST_OP_H

#include <stdatomic.h>
#include <unistd.h>

#include "core/aio.h"
#include "tp_test.h"

typedef struct op {
    tp_aio *aio;
    _Atomic int done; // callbacks run so far
} op;

static inline void
op_cb(void *arg)
{
    op *o = arg;
    atomic_fetch_add_explicit(&o->done, 1, memory_order_release);
}

// A new op; @timeout_ms is the aio's own timeout (0: none).
static inline void
op_init(op *o, int64_t timeout_ms)
{
    atomic_init(&o->done, 0);
    TP_CHECK_OK(tp_aio_create(op_cb, o, &o->aio), NULL);
    tp_aio_set_timeout(o->aio, timeout_ms);
}

static inline void
op_fini(op *o)
{
    tp_aio_destroy(o->aio);
}

// Waits for @o's callback, failing the case after @ms (scaled by
// TP_TEST_TIMEOUT_MULTIPLIER; the aio timeout normally fires first), then
// until the callback has returned, and checks it ran exactly once.
static inline void
op_wait(op *o, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    while (atomic_load_explicit(&o->done, memory_order_acquire) == 0) {
        TP_CHECKF(tp__now_ns() < deadline,
                  "operation did not complete within %lld ms", (long long)ms);
        usleep(100);
    }
    tp_aio_wait(o->aio);
    TP_CHECK_EQ(atomic_load(&o->done), 1);
}

#endif
