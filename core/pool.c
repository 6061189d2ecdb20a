// SPDX-License-Identifier: Apache-2.0
// pool.c - a fixed-size thread pool: one mutex, one FIFO of tp_task, one
// condition variable that idle workers sleep on. Optionally (set_spin_us)
// one idle worker at a time polls the queue length for a while before it
// sleeps, so back-to-back tasks (RPC handlers) start without a wake-up.
//
// Locks: only p_mtx. Tasks run with no lock held.

#include "pool.h"

#include <stdio.h>
#include <string.h>

#include "alloc.h"

typedef struct pool_worker {
    pthread_t w_thread;
    tp_pool *w_pool;
    int w_index;
} pool_worker;

struct tp_pool {
    tp_mtx p_mtx;
    tp_cv p_cv;      // signaled when a task is queued or the pool closes
    tp_task *p_head; // FIFO linked through t_next
    tp_task *p_tail;
    bool p_closed;              // no new submissions
    int p_idle;                 // workers waiting on p_cv
    int p_waking;               // signaled workers that have not run yet
    int p_nthreads;             // workers started
    int p_busy;                 // workers running a task
    bool p_spinning;            // a worker is polling p_queued
    _Atomic unsigned p_queued;  // tasks in the FIFO, for the spinner
    _Atomic bool p_closed_flag; // p_closed, for the spinner
    uint64_t p_spin_ns;         // 0: never spin
    tp_cv p_idle_cv;            // signaled when p_busy drops to 0
    pool_worker *p_workers;
    char p_name[32];
};

// The pool whose worker is the calling thread, for tp__pool_on_thread and
// the destroy-from-own-thread assertion. Not an error channel.
static _Thread_local const tp_pool *pool_current;

static bool
pool_has_work(void *arg)
{
    tp_pool *pool = arg;
    return atomic_load_explicit(&pool->p_queued, memory_order_relaxed) > 0 ||
           atomic_load_explicit(&pool->p_closed_flag, memory_order_relaxed);
}

// Polls p_queued for up to p_spin_ns with p_mtx released. Called with
// p_mtx held and no other spinner; returns with it held. Submitters do not
// signal while a worker spins (it sees the count), so the spinner clears
// p_spinning only after retaking the lock, where it rechecks the queue.
static void
pool_spin_locked(tp_pool *pool)
{
    pool->p_spinning = true;
    tp__mtx_unlock(&pool->p_mtx);
    tp__spin_until(pool_has_work, pool, pool->p_spin_ns);
    tp__mtx_lock(&pool->p_mtx);
    pool->p_spinning = false;
}

// Wakes a sleeping worker for queued work, unless a spinner will take it
// or a worker already woken has not started yet: one wake-up in flight at
// a time, each woken worker waking the next if work is still queued. A
// burst of short tasks then wakes a few workers, not all of them (each
// wake-up is a futex call on the submitting thread and a context switch).
static void
pool_wake_one_locked(tp_pool *pool)
{
    if (pool->p_idle > pool->p_waking && !pool->p_spinning &&
        pool->p_waking == 0) {
        pool->p_waking++;
        tp__cv_signal(&pool->p_cv);
    }
}

static void *
pool_worker_main(void *arg)
{
    pool_worker *w = arg;
    tp_pool *pool = w->w_pool;
    char name[48];

    snprintf(name, sizeof(name), "tp-%s-%d", pool->p_name, w->w_index);
    tp__thread_set_name(name);
    pool_current = pool;

    tp__mtx_lock(&pool->p_mtx);
    for (;;) {
        // One spin per task run: a worker that spun in vain sleeps.
        bool spun = false;
        while (pool->p_head == NULL && !pool->p_closed) {
            if (pool->p_spin_ns > 0 && !pool->p_spinning && !spun) {
                pool_spin_locked(pool);
                spun = true;
                continue; // recheck under the lock
            }
            pool->p_idle++;
            tp__cv_wait(&pool->p_cv, &pool->p_mtx);
            pool->p_idle--;
            if (pool->p_waking > 0) {
                pool->p_waking--;
            }
        }
        tp_task *task = pool->p_head;
        if (task == NULL) {
            break; // closed and drained
        }
        pool->p_head = task->t_next;
        if (pool->p_head == NULL) {
            pool->p_tail = NULL;
        } else {
            // More work than this worker: a spinner would have taken it,
            // without one wake a sleeper.
            pool_wake_one_locked(pool);
        }
        atomic_fetch_sub_explicit(&pool->p_queued, 1, memory_order_relaxed);
        task->t_next = NULL;
        pool->p_busy++;
        // Read the task before running it: it may free its own storage.
        tp_task_fn fn = task->t_fn;
        void *fn_arg = task->t_arg;
        tp__mtx_unlock(&pool->p_mtx);
        fn(fn_arg);
        tp__mtx_lock(&pool->p_mtx);
        if (--pool->p_busy == 0 && pool->p_head == NULL) {
            tp__cv_broadcast(&pool->p_idle_cv);
        }
    }
    tp__mtx_unlock(&pool->p_mtx);
    pool_current = NULL;
    return NULL;
}

// Closes and joins the first @n workers; used by destroy and by a create
// that failed halfway.
static void
pool_join(tp_pool *pool, int n)
{
    tp__pool_close(pool);
    for (int i = 0; i < n; i++) {
        pthread_join(pool->p_workers[i].w_thread, NULL);
    }
}

static void
pool_free(tp_pool *pool)
{
    tp__cv_fini(&pool->p_idle_cv);
    tp__cv_fini(&pool->p_cv);
    tp__mtx_fini(&pool->p_mtx);
    tp__free(pool->p_workers);
    tp__free(pool);
}

tp_status
tp__pool_create(int nthreads, const char *name, tp_pool **pool_p,
                tp_error **err_p)
{
    if (name == NULL) {
        name = "pool";
    }
    if (nthreads < 1 || nthreads > TP_POOL_MAX_THREADS) {
        return tp__error_set(err_p, TP_EINVAL,
                             "pool %s: %d threads, expected 1..%d", name,
                             nthreads, TP_POOL_MAX_THREADS);
    }
    tp_pool *pool = tp__zalloc(sizeof(*pool));
    if (pool == NULL) {
        goto nomem;
    }
    pool->p_workers = tp__zalloc(sizeof(pool_worker) * (size_t)nthreads);
    if (pool->p_workers == NULL) {
        goto free_pool;
    }
    tp__mtx_init(&pool->p_mtx);
    tp__cv_init(&pool->p_cv);
    tp__cv_init(&pool->p_idle_cv);
    atomic_init(&pool->p_queued, 0);
    atomic_init(&pool->p_closed_flag, false);
    snprintf(pool->p_name, sizeof(pool->p_name), "%s", name);

    for (int i = 0; i < nthreads; i++) {
        pool_worker *w = &pool->p_workers[i];
        w->w_pool = pool;
        w->w_index = i;
        int rc = pthread_create(&w->w_thread, NULL, pool_worker_main, w);
        if (rc != 0) {
            tp_status st = tp__error_errno(
                err_p, rc, "pool %s: start thread %d of %d", name, i, nthreads);
            pool_join(pool, i);
            pool_free(pool);
            return st;
        }
        pool->p_nthreads = i + 1;
    }
    *pool_p = pool;
    return TP_OK;

free_pool:
    tp__free(pool);
nomem:
    if (err_p != NULL) {
        *err_p = tp__error_nomem();
    }
    return TP_ENOMEM;
}

tp_status
tp__pool_submit(tp_pool *pool, tp_task *task)
{
    tp__mtx_lock(&pool->p_mtx);
    if (pool->p_closed) {
        tp__mtx_unlock(&pool->p_mtx);
        return TP_ECLOSED;
    }
    task->t_next = NULL;
    if (pool->p_tail != NULL) {
        pool->p_tail->t_next = task;
    } else {
        pool->p_head = task;
    }
    pool->p_tail = task;
    atomic_fetch_add_explicit(&pool->p_queued, 1, memory_order_relaxed);
    pool_wake_one_locked(pool);
    tp__mtx_unlock(&pool->p_mtx);
    return TP_OK;
}

typedef struct pool_fn_task {
    tp_task ft_task;
    tp_task_fn ft_fn;
    void *ft_arg;
} pool_fn_task;

static void
pool_fn_task_run(void *arg)
{
    pool_fn_task *ft = arg;
    tp_task_fn fn = ft->ft_fn;
    void *fn_arg = ft->ft_arg;

    tp__free(ft);
    fn(fn_arg);
}

tp_status
tp__pool_submit_fn(tp_pool *pool, tp_task_fn fn, void *arg)
{
    pool_fn_task *ft = tp__alloc(sizeof(*ft));
    if (ft == NULL) {
        return TP_ENOMEM;
    }
    ft->ft_fn = fn;
    ft->ft_arg = arg;
    tp__task_init(&ft->ft_task, pool_fn_task_run, ft);
    tp_status st = tp__pool_submit(pool, &ft->ft_task);
    if (st != TP_OK) {
        tp__free(ft);
    }
    return st;
}

void
tp__pool_close(tp_pool *pool)
{
    tp__mtx_lock(&pool->p_mtx);
    pool->p_closed = true;
    atomic_store_explicit(&pool->p_closed_flag, true, memory_order_relaxed);
    // Idle workers wake up, run what is left and exit.
    tp__cv_broadcast(&pool->p_cv);
    tp__mtx_unlock(&pool->p_mtx);
}

void
tp__pool_destroy(tp_pool *pool)
{
    if (pool == NULL) {
        return;
    }
    // Joining our own thread would deadlock.
    TP_ASSERT(!tp__pool_on_thread(pool));
    pool_join(pool, pool->p_nthreads);
    TP_ASSERT(pool->p_head == NULL);
    pool_free(pool);
}

void
tp__pool_set_spin_us(tp_pool *pool, int64_t spin_us)
{
    tp__mtx_lock(&pool->p_mtx);
    pool->p_spin_ns = spin_us > 0 ? (uint64_t)spin_us * 1000u : 0;
    tp__mtx_unlock(&pool->p_mtx);
}

bool
tp__pool_wait_idle(tp_pool *pool, uint64_t deadline_ns)
{
    TP_ASSERT(!tp__pool_on_thread(pool));
    bool idle = true;
    tp__mtx_lock(&pool->p_mtx);
    while (pool->p_busy > 0 || pool->p_head != NULL) {
        if (!tp__cv_wait_until(&pool->p_idle_cv, &pool->p_mtx, deadline_ns) &&
            (pool->p_busy > 0 || pool->p_head != NULL)) {
            idle = false;
            break;
        }
    }
    tp__mtx_unlock(&pool->p_mtx);
    return idle;
}

bool
tp__pool_on_thread(const tp_pool *pool)
{
    return pool != NULL && pool_current == pool;
}
