/* SPDX-License-Identifier: Apache-2.0 */
/* pool.h (internal) - a fixed-size thread pool running tp_task FIFO.
 *
 * Lifecycle (STYLE.md §6): create -> close -> destroy. close stops new
 * submissions without blocking; tasks already queued still run. destroy
 * closes, runs every queued task, joins the threads and frees.
 *
 * Used by the agent for RPC handlers and user continuations (the
 * work half of libuv's work/done split: results go back to a loop with
 * tp__loop_post). Tasks may block; they must not destroy their own pool.
 */
#ifndef TP_CORE_POOL_H
#define TP_CORE_POOL_H

#include <stdbool.h>

#include "error.h"
#include "loop.h"

typedef struct tp_pool tp_pool;

#define TP_POOL_MAX_THREADS 1024

// Starts @nthreads threads (1..TP_POOL_MAX_THREADS) named "tp-<name>-N"
// (N from 0; truncated to 15 bytes by the OS). @name is copied.
// Errors: TP_EINVAL (bad count), TP_ENOMEM, or the status of a failed
// pthread_create (no thread is left running then).
tp_status tp__pool_create(int nthreads, const char *name, tp_pool **pool_p,
                          tp_error **err_p);

// Queues @task (caller storage, valid until it has started running; the
// task may free its own storage). Tasks run in submission order of the
// queue, on any pool thread, never inside this call.
// Errors: TP_ECLOSED after tp__pool_close (the task will not run).
// Thread safety: any thread, including pool threads.
tp_status tp__pool_submit(tp_pool *pool, tp_task *task);

// As tp__pool_submit with a task allocated here and freed before @fn runs.
// Errors: TP_ECLOSED, TP_ENOMEM (@fn will not run).
tp_status tp__pool_submit_fn(tp_pool *pool, tp_task_fn fn, void *arg);

// Stops accepting work; later submissions fail with TP_ECLOSED. Tasks
// already queued still run. Never blocks. Idempotent. Any thread.
void tp__pool_close(tp_pool *pool);

// Closes, waits until every queued task has run and the threads exited,
// then frees. NULL is fine. Must not be called from a pool thread
// (TP_ASSERT).
void tp__pool_destroy(tp_pool *pool);

// True if the caller runs on one of @pool's threads.
bool tp__pool_on_thread(const tp_pool *pool);

// Idle workers poll the queue for @spin_us microseconds before sleeping
// (at most one worker spins at a time, yielding the CPU between polls), so
// a task submitted soon after the last one starts without a thread wake-up
// (~40 us on a VM). 0 (the default) = sleep at once. Before any submit.
void tp__pool_set_spin_us(tp_pool *pool, int64_t spin_us);

// Waits until no task is queued or running, at most until @deadline_ns
// (a tp__now_ns() value). Returns false at the deadline. Not from a pool
// thread.
bool tp__pool_wait_idle(tp_pool *pool, uint64_t deadline_ns);

// Futures (future.c): callbacks of @f, when it is resolved on a thread
// that is not one of @pool's, run on @pool instead of on the resolving
// thread (and inline if @pool no longer takes work).
struct tp_future;
void tp__future_set_pool(struct tp_future *f, tp_pool *pool);

#endif
