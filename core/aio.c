// SPDX-License-Identifier: Apache-2.0
// aio.c - the operation object and its completion rules (see aio.h).
//
// a_busy counts operations submitted and not yet through their callback;
// tp_aio_wait sleeps until it reaches zero. a_gen numbers submissions so a
// cancel posted for one operation never cancels a later one.

#include "aio.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"

static void aio_done_task(void *arg);
static void aio_cancel_task(void *arg);
static void aio_start_task(void *arg);
static void aio_timer_cb(tp_timer *t, void *arg);

void
tp__aio_init(tp_aio *aio, tp_aio_cb cb, void *arg)
{
    memset(aio, 0, sizeof(*aio));
    aio->a_cb = cb;
    aio->a_cb_arg = arg;
    tp__mtx_init(&aio->a_mtx);
    tp__cv_init(&aio->a_cv);
    tp__timer_init(&aio->a_timer, aio_timer_cb, aio);
    tp__task_init(&aio->a_done_task, aio_done_task, aio);
    tp__task_init(&aio->a_cancel_task, aio_cancel_task, aio);
    tp__task_init(&aio->a_start_task, aio_start_task, aio);
    tp__list_node_init(&aio->a_node);
    atomic_init(&aio->a_state, TP_AIO_IDLE);
    atomic_init(&aio->a_cancel_req, false);
    atomic_init(&aio->a_busy, 0);
    atomic_init(&aio->a_gen, 0);
    atomic_init(&aio->a_cancel_gen, 0);
    atomic_init(&aio->a_cancel_posted, false);
    atomic_init(&aio->a_stopped, false);
}

void
tp__aio_fini(tp_aio *aio)
{
    if (aio == NULL) {
        return;
    }
    // From now on a submission (e.g. a callback resubmitting after its
    // cancel) completes at once with TP_ECLOSED, so a loop that resubmits
    // until it sees TP_ECLOSED ends, and so does the wait below.
    atomic_store_explicit(&aio->a_stopped, true, memory_order_release);
    tp_aio_cancel(aio);
    tp_aio_wait(aio);
    // A cross-thread cancel may still be queued on the loop even though
    // the operation completed: wait until its task has run. Checked under
    // a_mtx, which the task releases last, so freeing after this is safe.
    tp__mtx_lock(&aio->a_mtx);
    while (atomic_load_explicit(&aio->a_cancel_posted, memory_order_acquire)) {
        tp__cv_wait(&aio->a_cv, &aio->a_mtx);
    }
    tp__mtx_unlock(&aio->a_mtx);
    tp_error_unref(aio->a_err);
    aio->a_err = NULL;
    tp__cv_fini(&aio->a_cv);
    tp__mtx_fini(&aio->a_mtx);
}

tp_status
tp_aio_create(tp_aio_cb cb, void *arg, tp_aio **aio_p)
{
    tp_aio *aio = tp__alloc(sizeof(*aio));
    if (aio == NULL) {
        return TP_ENOMEM;
    }
    tp__aio_init(aio, cb, arg);
    *aio_p = aio;
    return TP_OK;
}

void
tp_aio_destroy(tp_aio *aio)
{
    if (aio == NULL) {
        return;
    }
    tp__aio_fini(aio);
    tp__free(aio);
}

void
tp_aio_set_timeout(tp_aio *aio, int64_t timeout_ms)
{
    aio->a_timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
}

tp_status
tp_aio_set_iov(tp_aio *aio, unsigned n, const tp_iov *iov)
{
    if (n > TP_AIO_MAX_IOV || (n > 0 && iov == NULL)) {
        return TP_EINVAL;
    }
    for (unsigned i = 0; i < n; i++) {
        aio->a_iov[i] = iov[i];
    }
    aio->a_niov = n;
    return TP_OK;
}

const tp_error *
tp_aio_error(const tp_aio *aio)
{
    return aio->a_err;
}

tp_status
tp_aio_status(const tp_aio *aio)
{
    return tp_error_status(aio->a_err);
}

uint64_t
tp_aio_count(const tp_aio *aio)
{
    return aio->a_count;
}

void *
tp_aio_get_output(const tp_aio *aio, int i)
{
    return (i >= 0 && i < TP_AIO_NOUT) ? aio->a_output[i] : NULL;
}

uint64_t
tp__aio_iov_total(const tp_aio *aio)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < aio->a_niov; i++) {
        n += aio->a_iov[i].iov_len;
    }
    return n;
}

static void
aio_stopped_start(void *obj, tp_aio *aio)
{
    if (tp__aio_begin(aio, aio->a_loop, NULL, NULL)) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "operation submitted on an aio being "
                              "destroyed");
    }
}

static void
aio_start_task(void *arg)
{
    tp_aio *aio = arg;
    aio->a_start_fn(aio->a_start_obj, aio);
}

void
tp__aio_submit(tp_aio *aio, tp_loop *loop,
               void (*start)(void *obj, tp_aio *aio), void *obj)
{
    int st = atomic_load_explicit(&aio->a_state, memory_order_acquire);
    TP_ASSERT(st == TP_AIO_IDLE);
    // a_loop is published by the a_busy increment (release): threads that
    // see a_busy > 0 (cancel, wait) may read it.
    aio->a_loop = loop;
    atomic_fetch_add_explicit(&aio->a_busy, 1, memory_order_acq_rel);
    tp_error_unref(aio->a_err);
    aio->a_err = NULL;
    aio->a_count = 0;
    aio->a_output[0] = aio->a_output[1] = NULL;
    aio->a_prov_data[0] = aio->a_prov_data[1] = NULL;
    aio->a_prov_u64[0] = aio->a_prov_u64[1] = 0;
    if (atomic_load_explicit(&aio->a_stopped, memory_order_acquire)) {
        start = aio_stopped_start;
    }
    aio->a_start_fn = start;
    aio->a_start_obj = obj;
    aio->a_cancel_fn = NULL;
    atomic_fetch_add_explicit(&aio->a_gen, 1, memory_order_acq_rel);
    atomic_store_explicit(&aio->a_cancel_req, false, memory_order_relaxed);
    atomic_store_explicit(&aio->a_state, TP_AIO_QUEUED, memory_order_release);
    if (tp__loop_on_thread(loop) && !tp__loop_has_pending_posts(loop)) {
        start(obj, aio);
    } else {
        tp__loop_post(loop, &aio->a_start_task);
    }
}

bool
tp__aio_begin(tp_aio *aio, tp_loop *loop, tp_aio_cancel_fn fn, void *arg)
{
    TP_ASSERT_ON_LOOP(loop);
    TP_ASSERT(atomic_load_explicit(&aio->a_state, memory_order_relaxed) ==
              TP_AIO_QUEUED);
    TP_ASSERT(aio->a_loop == loop);
    if (atomic_load_explicit(&aio->a_cancel_req, memory_order_acquire)) {
        tp__aio_finish(aio,
                       tp__error_new(TP_ECANCELED, 0, NULL,
                                     "operation canceled before it started"),
                       0);
        return false;
    }
    aio->a_cancel_fn = fn;
    aio->a_cancel_arg = arg;
    atomic_store_explicit(&aio->a_state, TP_AIO_ACTIVE, memory_order_release);
    uint64_t deadline = tp__deadline_after_ms(aio->a_timeout_ms);
    if (deadline != UINT64_MAX) {
        tp__timer_start(loop, &aio->a_timer, deadline);
    }
    return true;
}

void
tp__aio_finish(tp_aio *aio, tp_error *err, uint64_t count)
{
    TP_ASSERT_ON_LOOP(aio->a_loop);
    int st = atomic_load_explicit(&aio->a_state, memory_order_relaxed);
    TP_ASSERT(st == TP_AIO_ACTIVE || st == TP_AIO_QUEUED);
    tp__timer_stop(aio->a_loop, &aio->a_timer);
    aio->a_err = err;
    aio->a_count = count;
    aio->a_cancel_fn = NULL;
    atomic_store_explicit(&aio->a_state, TP_AIO_DONE, memory_order_release);
    tp__loop_defer(aio->a_loop, &aio->a_done_task);
}

void
tp__aio_finish_status(tp_aio *aio, tp_status st, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    tp__aio_finish(aio, tp__error_new(st, 0, NULL, "%s", buf), 0);
}

static void
aio_done_task(void *arg)
{
    tp_aio *aio = arg;
    atomic_store_explicit(&aio->a_state, TP_AIO_IDLE, memory_order_release);
    if (aio->a_cb != NULL) {
        aio->a_cb(aio->a_cb_arg);
    }
    // The decrement happens under a_mtx, and waiters check a_busy only
    // under a_mtx: a waiter that sees zero (and may free the aio) has
    // acquired the mutex after this unlock, so nothing here touches freed
    // memory, and no wakeup is lost.
    tp__mtx_lock(&aio->a_mtx);
    atomic_fetch_sub_explicit(&aio->a_busy, 1, memory_order_release);
    if (aio->a_nwaiters > 0) {
        tp__cv_broadcast(&aio->a_cv);
    }
    tp__mtx_unlock(&aio->a_mtx);
}

static void
aio_cancel_now(tp_aio *aio, tp_status reason)
{
    int st = atomic_load_explicit(&aio->a_state, memory_order_acquire);
    if (st == TP_AIO_ACTIVE && aio->a_cancel_fn != NULL) {
        aio->a_cancel_fn(aio, aio->a_cancel_arg, reason);
    }
}

// Runs a cross-thread cancel on the loop. A cancel requested while this
// task runs (it found the task already posted) sets a_cancel_again, and
// the task goes round again, so no request is lost. a_cancel_posted is
// cleared last, under a_mtx: tp__aio_fini waits for that before freeing.
static void
aio_cancel_task(void *arg)
{
    tp_aio *aio = arg;
    for (;;) {
        if (atomic_load_explicit(&aio->a_cancel_gen, memory_order_acquire) ==
            atomic_load_explicit(&aio->a_gen, memory_order_acquire)) {
            aio_cancel_now(aio, TP_ECANCELED);
        }
        tp__mtx_lock(&aio->a_mtx);
        if (aio->a_cancel_again) {
            aio->a_cancel_again = false;
            tp__mtx_unlock(&aio->a_mtx);
            continue;
        }
        atomic_store_explicit(&aio->a_cancel_posted, false,
                              memory_order_release);
        tp__cv_broadcast(&aio->a_cv);
        tp__mtx_unlock(&aio->a_mtx);
        return;
    }
}

void
tp_aio_cancel(tp_aio *aio)
{
    if (atomic_load_explicit(&aio->a_busy, memory_order_acquire) == 0) {
        return;
    }
    atomic_store_explicit(&aio->a_cancel_req, true, memory_order_release);
    tp_loop *loop = aio->a_loop;
    if (loop == NULL) {
        return;
    }
    if (tp__loop_on_thread(loop)) {
        aio_cancel_now(aio, TP_ECANCELED);
        return;
    }
    atomic_store_explicit(
        &aio->a_cancel_gen,
        atomic_load_explicit(&aio->a_gen, memory_order_acquire),
        memory_order_release);
    tp__mtx_lock(&aio->a_mtx);
    bool post =
        !atomic_load_explicit(&aio->a_cancel_posted, memory_order_relaxed);
    if (post) {
        atomic_store_explicit(&aio->a_cancel_posted, true,
                              memory_order_relaxed);
    } else {
        aio->a_cancel_again = true;
    }
    tp__mtx_unlock(&aio->a_mtx);
    if (post) {
        tp__loop_post(loop, &aio->a_cancel_task);
    }
}

void
tp_aio_wait(tp_aio *aio)
{
    tp__mtx_lock(&aio->a_mtx);
    if (atomic_load_explicit(&aio->a_busy, memory_order_acquire) != 0) {
        TP_ASSERT(!tp__loop_on_thread(aio->a_loop));
    }
    aio->a_nwaiters++;
    while (atomic_load_explicit(&aio->a_busy, memory_order_acquire) != 0) {
        tp__cv_wait(&aio->a_cv, &aio->a_mtx);
    }
    aio->a_nwaiters--;
    tp__mtx_unlock(&aio->a_mtx);
}

static void
aio_timer_cb(tp_timer *t, void *arg)
{
    tp_aio *aio = arg;
    TP_UNUSED(t);
    aio_cancel_now(aio, TP_ETIMEDOUT);
}
