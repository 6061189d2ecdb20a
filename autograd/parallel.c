// SPDX-License-Identifier: Apache-2.0
// parallel.c - intra-op parallelism for the CPU kernels: a fixed set of
// worker threads and a blocking parallel-for over index ranges.
//
// Off by default (one thread): RPC handlers already run ops on several
// threads, and two layers of threads on the same cores oversubscribe them
// (PyTorch's OpenMP pool next to OpenBLAS's threads shows it). An
// application that runs one op at a time sets tp_compute_threads_set().
//
// Lock order: pool.busy before pool.mtx. busy is held by the one thread
// whose op owns the workers; any other caller (another thread, or a
// kernel called from inside a worker) finds it taken and runs serially, so
// parallel-for never waits for another parallel-for.

#include <string.h>

#include "ag_impl.h"
#include "error.h"
#include "platform.h"

#define MAX_THREADS 64

static struct {
    tp_mtx busy; // owner of the workers for one parallel-for
    tp_mtx mtx;  // guards the job fields below
    tp_cv cv_work, cv_done;
    atomic_int nthreads; // including the caller; read without the locks
    pthread_t th[MAX_THREADS];
    bool stop;
    uint64_t gen; // bumped for each job
    tp__par_fn fn;
    void *ctx;
    int64_t n;
    int nchunks;
    int next;    // next chunk to take
    int running; // chunks taken but not finished
} pool = {
    .busy = {PTHREAD_MUTEX_INITIALIZER},
    .mtx = {PTHREAD_MUTEX_INITIALIZER},
    .nthreads = 1,
};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static void
pool_init_cvs(void)
{
    tp__cv_init(&pool.cv_work);
    tp__cv_init(&pool.cv_done);
}

// Runs chunks of the current job until none are left. Called with
// pool.mtx held; returns with it held.
static void
run_chunks_locked(void)
{
    while (pool.next < pool.nchunks) {
        int c = pool.next++;
        int64_t b = pool.n * c / pool.nchunks;
        int64_t e = pool.n * (c + 1) / pool.nchunks;
        tp__par_fn fn = pool.fn;
        void *ctx = pool.ctx;
        pool.running++;
        tp__mtx_unlock(&pool.mtx);
        fn(ctx, b, e);
        tp__mtx_lock(&pool.mtx);
        pool.running--;
    }
    if (pool.running == 0) {
        tp__cv_broadcast(&pool.cv_done);
    }
}

static void *
worker_main(void *arg)
{
    uint64_t seen = 0;
    tp__thread_set_name("tp-compute");
    tp__mtx_lock(&pool.mtx);
    for (;;) {
        while (!pool.stop && pool.gen == seen) {
            tp__cv_wait(&pool.cv_work, &pool.mtx);
        }
        if (pool.stop) {
            break;
        }
        seen = pool.gen;
        run_chunks_locked();
    }
    tp__mtx_unlock(&pool.mtx);
    return NULL;
}

// Stops and joins the workers; pool.busy held.
static void
pool_stop_busy(void)
{
    tp__mtx_lock(&pool.mtx);
    pool.stop = true;
    tp__cv_broadcast(&pool.cv_work);
    tp__mtx_unlock(&pool.mtx);
    int n = atomic_load_explicit(&pool.nthreads, memory_order_relaxed);
    for (int i = 1; i < n; i++) {
        pthread_join(pool.th[i], NULL);
    }
    pool.stop = false;
    atomic_store_explicit(&pool.nthreads, 1, memory_order_relaxed);
}

tp_status
tp_compute_threads_set(int n, tp_error **err_p)
{
    if (n < 1 || n > MAX_THREADS) {
        return tp__error_set(err_p, TP_EINVAL,
                             "compute threads: %d is outside [1, %d]", n,
                             MAX_THREADS);
    }
    pthread_once(&pool_once, pool_init_cvs);
    tp__mtx_lock(&pool.busy);
    pool_stop_busy();
    tp_status st = TP_OK;
    int started = 1;
    for (; started < n; started++) {
        int rc = pthread_create(&pool.th[started], NULL, worker_main, NULL);
        if (rc != 0) {
            st = tp__error_errno(err_p, rc, "compute threads: thread %d",
                                 started);
            break;
        }
    }
    // What did start is used.
    atomic_store_explicit(&pool.nthreads, started, memory_order_release);
    tp__mtx_unlock(&pool.busy);
    return st;
}

int
tp_compute_threads_get(void)
{
    return atomic_load_explicit(&pool.nthreads, memory_order_acquire);
}

void
tp__parallel_for(int64_t n, int64_t grain, tp__par_fn fn, void *ctx)
{
    int64_t chunks = grain > 0 ? n / grain : n;
    // The count is read again under busy: set() changes it only with busy
    // held.
    if (atomic_load_explicit(&pool.nthreads, memory_order_acquire) <= 1 ||
        chunks < 2 || pthread_mutex_trylock(&pool.busy.m) != 0) {
        fn(ctx, 0, n);
        return;
    }
    int nt = atomic_load_explicit(&pool.nthreads, memory_order_relaxed);
    if (nt <= 1) {
        tp__mtx_unlock(&pool.busy);
        fn(ctx, 0, n);
        return;
    }
    tp__mtx_lock(&pool.mtx);
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.nchunks = (int)TP_MIN(chunks, (int64_t)nt);
    pool.next = 0;
    pool.running = 0;
    pool.gen++;
    tp__cv_broadcast(&pool.cv_work);
    run_chunks_locked();
    while (pool.next < pool.nchunks || pool.running > 0) {
        tp__cv_wait(&pool.cv_done, &pool.mtx);
    }
    tp__mtx_unlock(&pool.mtx);
    tp__mtx_unlock(&pool.busy);
}
