/* SPDX-License-Identifier: Apache-2.0 */
/* future.h - a refcounted value-or-error that resolves once. */
#ifndef TPIPE_FUTURE_H
#define TPIPE_FUTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/export.h>
#include <tpipe/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tp_future tp_future;
typedef void (*tp_future_free_fn)(void *value);
typedef void (*tp_future_cb)(tp_future *f, void *arg);

/**
 * tp_future_create - a new unresolved future, refcount 1.
 * Errors: TP_EINVAL (@f_p NULL), TP_ENOMEM.
 */
TP_API tp_status tp_future_create(tp_future **f_p);
/** tp_future_ref - take a reference; returns @f (NULL: NULL). */
TP_API tp_future *tp_future_ref(tp_future *f);
/**
 * tp_future_unref - drop a reference; the last one frees the future and
 * its value (through the free function given at resolution). NULL is fine.
 * Never blocks.
 */
TP_API void tp_future_unref(tp_future *f);
/**
 * tp_future_set_value - resolve @f with @value. Takes @value (freed with
 * @free_fn, which may be NULL, when the future is freed). Wakes waiters and
 * runs the callbacks added by tp_future_then on this thread, in the order
 * they were added, with no lock held.
 * Errors: TP_EINVAL if @f is NULL or was already resolved (ownership of
 * @value stays with the caller).
 * Thread safety: any thread.
 */
TP_API tp_status tp_future_set_value(tp_future *f, void *value,
                                     tp_future_free_fn free_fn);
/**
 * tp_future_set_error - resolve @f with @err (borrowed: the future takes
 * its own reference; NULL is TP_EINVAL and leaves @f unresolved). As
 * tp_future_set_value otherwise.
 */
TP_API tp_status tp_future_set_error(tp_future *f, const tp_error *err);
/** tp_future_is_done - true once resolved (false for NULL). Any thread. */
TP_API bool tp_future_is_done(const tp_future *f);
/**
 * tp_future_wait - block until @f is resolved or @timeout_ms passes
 * (0 = no deadline). Returns TP_OK if it resolved with a value, the
 * error's status if it resolved with an error (and a reference to that
 * error in @err_p), TP_ETIMEDOUT if the deadline passed first (with an
 * error saying how long it waited), TP_EINVAL if @f is NULL. Must not be
 * called from a loop thread.
 */
TP_API tp_status tp_future_wait(tp_future *f, int64_t timeout_ms,
                                tp_error **err_p);
/** tp_future_value - the value once resolved with one, else NULL. Borrowed. */
TP_API void *tp_future_value(const tp_future *f);
/** tp_future_error - the error once resolved with one, else NULL. Borrowed. */
TP_API const tp_error *tp_future_error(const tp_future *f);
/**
 * tp_future_then - run @cb(@f, @arg) exactly once when @f resolves: on the
 * thread that resolves it, or, if @f is already resolved and its callbacks
 * have all run, on the calling thread before this returns. Futures made by
 * the RPC agent and the layers above it (RPC, RRef) are bound to the
 * agent's worker pool: their callbacks always run on a pool thread, never
 * on a loop thread and never inside this call (unless the caller is itself
 * a pool thread and @f is resolved). Callbacks run in the order they were
 * added: one added while earlier callbacks are still running is queued
 * behind them and runs on the same thread.
 * Errors: TP_EINVAL (@f or @cb NULL), TP_ENOMEM (the callback will not
 * run).
 */
TP_API tp_status tp_future_then(tp_future *f, tp_future_cb cb, void *arg);
/**
 * tp_future_wait_all - block until every one of the @n futures @futs has
 * resolved, or one resolved with an error (fail-fast, as PyTorch's
 * torch.futures.wait_all), or @timeout_ms passed (0 = no deadline).
 * Returns TP_OK when all resolved with a value; the error's status (and a
 * new reference to it in @err_p) of the first future seen to fail; or
 * TP_ETIMEDOUT (saying how many were left). The futures are borrowed;
 * those still pending stay so (nothing is canceled). Futures of any
 * origin may be mixed (RPC, collectives' tp_work_get_future, made with
 * tp_future_create).
 * Errors: TP_EINVAL (a NULL future), TP_ENOMEM.
 * Thread safety: any thread but a loop thread.
 */
TP_API tp_status tp_future_wait_all(tp_future *const *futs, size_t n,
                                    int64_t timeout_ms, tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
