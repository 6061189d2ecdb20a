/* SPDX-License-Identifier: Apache-2.0 */
/* aio.h (internal) - the operation object of transports and channels,
 * modelled on nng's aio. Public half in include/tpipe/aio.h.
 *
 * Completion rules (STYLE.md §7), enforced here:
 *  1. Every started operation completes exactly once, also on error,
 *     timeout, cancel and close.
 *  2. The callback never runs inside the call that started the operation:
 *     tp__aio_finish only queues it on the loop's deferred queue.
 *  3. Callbacks run with no provider lock held (they run from the loop's
 *     top level).
 *  4. Cancel is a request: the operation still completes through its
 *     callback, with TP_ECANCELED.
 *
 * Provider side (always on the loop thread of the object the aio was
 * submitted to):
 *     if (!tp__aio_begin(aio, loop, my_cancel, conn)) return;
 *     ... queue it; later ...
 *     tp__aio_finish(aio, NULL, nbytes);           // success
 *     tp__aio_finish(aio, err, nbytes);            // takes err
 */
#ifndef TP_CORE_AIO_H
#define TP_CORE_AIO_H

#include <tpipe/aio.h>

#include "list.h"
#include "loop.h"

#define TP_AIO_MAX_IOV 8
#define TP_AIO_NOUT    2

// Called on the loop thread when an active aio is canceled (@reason is
// TP_ECANCELED, TP_ETIMEDOUT or TP_ECLOSED). The provider must remove the
// aio from its queues and tp__aio_finish it with an error of that status
// (naming the peer), or do nothing if it already finished it; where a
// copy on a pool still uses the aio's buffers, as soon as that returns.
typedef void (*tp_aio_cancel_fn)(tp_aio *aio, void *arg, tp_status reason);

struct tp_aio {
    // user
    tp_aio_cb a_cb;
    void *a_cb_arg;
    tp_iov a_iov[TP_AIO_MAX_IOV];
    unsigned a_niov;
    int64_t a_timeout_ms; // 0: none
    void *a_input[TP_AIO_NOUT];
    // result
    tp_error *a_err;
    uint64_t a_count;
    void *a_output[TP_AIO_NOUT];
    // provider (loop thread)
    tp_loop *a_loop;
    tp_aio_cancel_fn a_cancel_fn;
    void *a_cancel_arg;
    tp_timer a_timer;
    tp_list_node a_node;  // for the provider's queue
    void *a_prov_data[2]; // provider scratch (e.g. bytes done, iov idx)
    uint64_t a_prov_u64[2];
    tp_task a_start_task;  // used by submit paths that post to a loop
    tp_task a_done_task;   // deferred completion
    tp_task a_cancel_task; // cross-thread cancel
    void (*a_start_fn)(void *obj, tp_aio *aio);
    void *a_start_obj;
    // state
    _Atomic int a_state; // TP_AIO_* below
    _Atomic bool a_cancel_req;
    tp_mtx a_mtx;
    tp_cv a_cv;
    int a_nwaiters;         // threads in tp_aio_wait (under a_mtx)
    _Atomic int a_busy;     // submitted, callback not yet returned
    _Atomic uint64_t a_gen; // submission number
    _Atomic uint64_t a_cancel_gen;
    _Atomic bool a_cancel_posted;
    bool a_cancel_again;    // a cancel arrived while one ran (a_mtx)
    _Atomic bool a_stopped; // being destroyed: submissions fail at once
};

enum {
    TP_AIO_IDLE = 0,   // not submitted, or completed and callback done
    TP_AIO_QUEUED = 1, // submitted, not yet begun by the provider
    TP_AIO_ACTIVE = 2, // begun by the provider
    TP_AIO_DONE = 3,   // finished, callback pending or running
};

// Init/fini on caller storage (the public tp_aio_create wraps these).
void tp__aio_init(tp_aio *aio, tp_aio_cb cb, void *arg);
void tp__aio_fini(tp_aio *aio); // cancel + wait

// Submit @aio to @obj: runs @start(@obj, @aio) on @loop's thread, inline if
// the caller is already on it, else posted. Resets the result fields.
// Asserts the aio is not already in flight.
void tp__aio_submit(tp_aio *aio, tp_loop *loop,
                    void (*start)(void *obj, tp_aio *aio), void *obj);

// Provider, loop thread. Marks @aio active and arms its timeout. Returns
// false if a cancel was requested before it began; the aio has then been
// finished with TP_ECANCELED and the provider must not touch it again.
bool tp__aio_begin(tp_aio *aio, tp_loop *loop, tp_aio_cancel_fn fn, void *arg);
// Provider, loop thread: complete @aio. Takes @err (NULL = success). The
// callback runs later from the loop's deferred queue.
void tp__aio_finish(tp_aio *aio, tp_error *err, uint64_t count);
// As tp__aio_finish with a new error built from @st and the message.
void tp__aio_finish_status(tp_aio *aio, tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);
// Total bytes described by the iovs.
uint64_t tp__aio_iov_total(const tp_aio *aio);

// The index of the iov of @iov holding byte @*off_p (counted from the
// first iov's start); *@off_p becomes that byte's offset inside it. The
// byte must exist (below the iovs' total).
static inline unsigned
tp__iov_seek(const tp_iov *iov, uint64_t *off_p)
{
    unsigned i = 0;
    while (*off_p >= iov[i].iov_len) {
        *off_p -= iov[i].iov_len;
        i++;
    }
    return i;
}
static inline void
tp__aio_set_output(tp_aio *aio, int i, void *p)
{
    aio->a_output[i] = p;
}

#endif
