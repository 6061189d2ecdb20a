// SPDX-License-Identifier: Apache-2.0
// future.c - a refcounted value-or-error that resolves once.
//
// Locks: only f_mtx, one per future. Callbacks run with it released.
//
// Callback order: the resolving thread takes the list of callbacks under
// the lock and runs them after unlocking. While it does (f_draining), a
// tp_future_then from any thread appends to the list instead of running
// its callback at once, and the resolving thread runs it after the earlier
// ones. Running it inline on the caller would let it overtake callbacks
// added before it; this way "in the order added" holds even when then()
// races with resolution.

#include <tpipe/future.h>

#include <stdatomic.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "pool.h"

typedef struct future_cb {
    struct future_cb *fc_next;
    tp_future_cb fc_fn;
    void *fc_arg;
} future_cb;

struct tp_future {
    _Atomic long f_refs;
    tp_mtx f_mtx;
    tp_cv f_cv; // broadcast on resolution
    // Written once, under f_mtx, before f_done is set (release); readers
    // that see f_done (acquire) may read them without the lock.
    void *f_value;
    tp_future_free_fn f_free_fn;
    tp_error *f_err;
    _Atomic bool f_done;
    bool f_draining;  // the resolver is running callbacks
    future_cb *f_cbs; // pending callbacks, FIFO
    future_cb **f_cbs_tail;
    tp_pool *f_pool; // if set, callbacks run there (tp__future_set_pool)
    tp_task f_task;  // the pool task that drains the callbacks
};

tp_status
tp_future_create(tp_future **f_p)
{
    if (f_p == NULL) {
        return TP_EINVAL;
    }
    tp_future *f = tp__zalloc(sizeof(*f));
    if (f == NULL) {
        return TP_ENOMEM;
    }
    atomic_init(&f->f_refs, 1);
    atomic_init(&f->f_done, false);
    tp__mtx_init(&f->f_mtx);
    tp__cv_init(&f->f_cv);
    f->f_cbs = NULL;
    f->f_cbs_tail = &f->f_cbs;
    *f_p = f;
    return TP_OK;
}

tp_future *
tp_future_ref(tp_future *f)
{
    if (f == NULL) {
        return NULL;
    }
    // Taking a reference needs no ordering: the caller already holds one.
    atomic_fetch_add_explicit(&f->f_refs, 1, memory_order_relaxed);
    return f;
}

void
tp_future_unref(tp_future *f)
{
    if (f == NULL) {
        return;
    }
    // Release our writes; the last owner acquires everyone's before freeing.
    if (atomic_fetch_sub_explicit(&f->f_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    if (f->f_free_fn != NULL) {
        f->f_free_fn(f->f_value);
    }
    tp_error_unref(f->f_err);
    // Callbacks of a future that never resolved never run.
    future_cb *cb = f->f_cbs;
    while (cb != NULL) {
        future_cb *next = cb->fc_next;
        tp__free(cb);
        cb = next;
    }
    tp__cv_fini(&f->f_cv);
    tp__mtx_fini(&f->f_mtx);
    tp__free(f);
}

// Runs the callbacks queued on @f, then any queued while they ran, until
// none is left. Called with f_mtx held and f_draining set; returns with it
// released and f_draining cleared.
static void
future_drain_unlock(tp_future *f)
{
    for (;;) {
        future_cb *cb = f->f_cbs;
        f->f_cbs = NULL;
        f->f_cbs_tail = &f->f_cbs;
        if (cb == NULL) {
            f->f_draining = false;
            tp__mtx_unlock(&f->f_mtx);
            return;
        }
        tp__mtx_unlock(&f->f_mtx);
        while (cb != NULL) {
            future_cb *next = cb->fc_next;
            cb->fc_fn(f, cb->fc_arg);
            tp__free(cb);
            cb = next;
        }
        tp__mtx_lock(&f->f_mtx);
    }
}

// Pool task: drains the callbacks of a future resolved on another thread.
static void
future_drain_task(void *arg)
{
    tp_future *f = arg;

    tp__mtx_lock(&f->f_mtx);
    future_drain_unlock(f);
    tp_future_unref(f);
}

// Called with f_mtx held, @f resolved and callbacks queued: drains them
// (f_draining), then unlocks. A future bound to a pool runs its callbacks
// there (user code must not run on the loop thread that resolved it),
// unless the caller is one of the pool's threads or the pool no longer
// takes work (shutting down): then they run here.
static void
future_drain_start_unlock(tp_future *f)
{
    // A callback may drop the last reference the caller relied on; keep
    // the future alive until the list is drained.
    tp_future_ref(f);
    f->f_draining = true;
    if (f->f_pool != NULL && !tp__pool_on_thread(f->f_pool)) {
        tp__task_init(&f->f_task, future_drain_task, f);
        if (tp__pool_submit(f->f_pool, &f->f_task) == TP_OK) {
            tp__mtx_unlock(&f->f_mtx);
            return;
        }
    }
    future_drain_unlock(f);
    tp_future_unref(f);
}

void
tp__future_set_pool(tp_future *f, tp_pool *pool)
{
    tp__mtx_lock(&f->f_mtx);
    f->f_pool = pool;
    tp__mtx_unlock(&f->f_mtx);
}

// Resolves @f with @value/@free_fn or @err (already referenced for the
// future). Returns TP_EINVAL, taking nothing, if already resolved.
static tp_status
future_resolve(tp_future *f, void *value, tp_future_free_fn free_fn,
               tp_error *err)
{
    tp__mtx_lock(&f->f_mtx);
    if (atomic_load_explicit(&f->f_done, memory_order_relaxed)) {
        tp__mtx_unlock(&f->f_mtx);
        return TP_EINVAL;
    }
    f->f_value = value;
    f->f_free_fn = free_fn;
    f->f_err = err;
    atomic_store_explicit(&f->f_done, true, memory_order_release);
    tp__cv_broadcast(&f->f_cv);
    if (f->f_cbs == NULL) {
        tp__mtx_unlock(&f->f_mtx);
        return TP_OK;
    }
    future_drain_start_unlock(f);
    return TP_OK;
}

tp_status
tp_future_set_value(tp_future *f, void *value, tp_future_free_fn free_fn)
{
    if (f == NULL) {
        return TP_EINVAL;
    }
    return future_resolve(f, value, free_fn, NULL);
}

tp_status
tp_future_set_error(tp_future *f, const tp_error *err)
{
    // A future resolved "with an error" that is NULL would look like a
    // value to waiters; refuse it.
    if (f == NULL || err == NULL) {
        return TP_EINVAL;
    }
    tp_error *ref = tp_error_ref(err);
    tp_status st = future_resolve(f, NULL, NULL, ref);
    if (st != TP_OK) {
        tp_error_unref(ref);
    }
    return st;
}

bool
tp_future_is_done(const tp_future *f)
{
    if (f == NULL) {
        return false;
    }
    // C11 atomic_load takes a non-const pointer; reading does not modify.
    tp_future *mf = (tp_future *)f;
    return atomic_load_explicit(&mf->f_done, memory_order_acquire);
}

tp_status
tp_future_wait(tp_future *f, int64_t timeout_ms, tp_error **err_p)
{
    if (f == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_future_wait: f is NULL");
    }
    uint64_t deadline = tp__deadline_after_ms(timeout_ms);

    tp__mtx_lock(&f->f_mtx);
    while (!atomic_load_explicit(&f->f_done, memory_order_relaxed)) {
        if (!tp__cv_wait_until(&f->f_cv, &f->f_mtx, deadline) &&
            !atomic_load_explicit(&f->f_done, memory_order_relaxed)) {
            tp__mtx_unlock(&f->f_mtx);
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "future not resolved after %lld ms",
                                 (long long)timeout_ms);
        }
    }
    tp_error *err = f->f_err;
    tp__mtx_unlock(&f->f_mtx);
    if (err == NULL) {
        return TP_OK;
    }
    if (err_p != NULL) {
        *err_p = tp_error_ref(err);
    }
    return tp_error_status(err);
}

void *
tp_future_value(const tp_future *f)
{
    return f != NULL && tp_future_is_done(f) ? f->f_value : NULL;
}

const tp_error *
tp_future_error(const tp_future *f)
{
    return f != NULL && tp_future_is_done(f) ? f->f_err : NULL;
}

tp_status
tp_future_then(tp_future *f, tp_future_cb cb, void *arg)
{
    if (f == NULL || cb == NULL) {
        return TP_EINVAL;
    }
    tp__mtx_lock(&f->f_mtx);
    bool resolved = atomic_load_explicit(&f->f_done, memory_order_relaxed) &&
                    !f->f_draining;
    // A resolved future bound to a pool still runs the callback there
    // (the caller may be a loop thread, which must not run user code),
    // unless the caller is one of the pool's own threads.
    bool to_pool =
        resolved && f->f_pool != NULL && !tp__pool_on_thread(f->f_pool);
    if (resolved && !to_pool) {
        tp__mtx_unlock(&f->f_mtx);
        // @f is not touched after @cb, which may drop the last reference.
        cb(f, arg);
        return TP_OK;
    }
    future_cb *node = tp__alloc(sizeof(*node));
    if (node == NULL) {
        tp__mtx_unlock(&f->f_mtx);
        return TP_ENOMEM;
    }
    node->fc_next = NULL;
    node->fc_fn = cb;
    node->fc_arg = arg;
    *f->f_cbs_tail = node;
    f->f_cbs_tail = &node->fc_next;
    if (!to_pool) {
        tp__mtx_unlock(&f->f_mtx);
        return TP_OK;
    }
    // Drained by a pool task, as on resolution: callbacks added meanwhile
    // queue behind this one (f_draining), so the order holds.
    future_drain_start_unlock(f);
    return TP_OK;
}

// ---- wait_all
// The waiter of tp_future_wait_all, shared with one callback per future:
// it goes with the last of them, so callbacks that run after the wait
// returned (fail-fast, timeout) touch live memory.
typedef struct wait_all {
    _Atomic long wa_refs;
    tp_mtx wa_mtx; // a leaf lock
    tp_cv wa_cv;
    size_t wa_left;      // futures not resolved yet
    tp_error *wa_err;    // the first error, once one failed
    size_t wa_err_index; // its future's index
} wait_all;

typedef struct wait_all_arg {
    wait_all *a_wa;
    size_t a_index;
} wait_all_arg;

static void
wait_all_unref(wait_all *wa)
{
    if (atomic_fetch_sub_explicit(&wa->wa_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp_error_unref(wa->wa_err);
    tp__cv_fini(&wa->wa_cv);
    tp__mtx_fini(&wa->wa_mtx);
    tp__free(wa);
}

static void
wait_all_cb(tp_future *f, void *arg)
{
    wait_all_arg *a = arg;
    wait_all *wa = a->a_wa;
    const tp_error *e = tp_future_error(f);
    tp__mtx_lock(&wa->wa_mtx);
    wa->wa_left--;
    if (e != NULL && wa->wa_err == NULL) {
        wa->wa_err = tp_error_ref(e);
        wa->wa_err_index = a->a_index;
    }
    tp__cv_broadcast(&wa->wa_cv);
    tp__mtx_unlock(&wa->wa_mtx);
    tp__free(a);
    wait_all_unref(wa);
}

tp_status
tp_future_wait_all(tp_future *const *futs, size_t n, int64_t timeout_ms,
                   tp_error **err_p)
{
    if (n > 0 && futs == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_future_wait_all: NULL list");
    }
    for (size_t i = 0; i < n; i++) {
        if (futs[i] == NULL) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "tp_future_wait_all: future %zu is NULL", i);
        }
    }
    uint64_t deadline = tp__deadline_after_ms(timeout_ms);
    wait_all *wa = tp__zalloc(sizeof(*wa));
    if (wa == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "tp_future_wait_all");
    }
    atomic_init(&wa->wa_refs, 1); // this call's
    tp__mtx_init(&wa->wa_mtx);
    tp__cv_init(&wa->wa_cv);
    wa->wa_left = n;
    tp_status st = TP_OK;
    for (size_t i = 0; i < n; i++) {
        wait_all_arg *a = tp__alloc(sizeof(*a));
        if (a == NULL) {
            st = TP_ENOMEM;
            break;
        }
        a->a_wa = wa;
        a->a_index = i;
        atomic_fetch_add_explicit(&wa->wa_refs, 1, memory_order_relaxed);
        if (tp_future_then(futs[i], wait_all_cb, a) != TP_OK) {
            atomic_fetch_sub_explicit(&wa->wa_refs, 1, memory_order_relaxed);
            tp__free(a);
            st = TP_ENOMEM;
            break;
        }
    }
    if (st != TP_OK) {
        wait_all_unref(wa);
        return tp__error_set(err_p, st, "tp_future_wait_all");
    }
    tp__mtx_lock(&wa->wa_mtx);
    while (wa->wa_left > 0 && wa->wa_err == NULL) {
        if (!tp__cv_wait_until(&wa->wa_cv, &wa->wa_mtx, deadline) &&
            wa->wa_left > 0 && wa->wa_err == NULL) {
            break;
        }
    }
    size_t left = wa->wa_left;
    tp_error *e = wa->wa_err != NULL ? tp_error_ref(wa->wa_err) : NULL;
    tp__mtx_unlock(&wa->wa_mtx);
    wait_all_unref(wa);
    if (e != NULL) {
        st = tp_error_status(e);
        if (err_p != NULL) {
            *err_p = e;
        } else {
            tp_error_unref(e);
        }
        return st;
    }
    if (left > 0) {
        return tp__error_set(err_p, TP_ETIMEDOUT,
                             "tp_future_wait_all: %zu of %zu futures not "
                             "resolved after %lld ms",
                             left, n, (long long)timeout_ms);
    }
    return TP_OK;
}
