// SPDX-License-Identifier: Apache-2.0
// pool_test.c - the thread pool: every task runs exactly once, on a pool
// thread; destroy drains the queue; close refuses new work.

#include "tp_test.h"

#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc.h"
#include "platform.h"
#include "pool.h"

// A counter that waiting threads can sleep on, with a deadline.
typedef struct counter {
    tp_mtx c_mtx;
    tp_cv c_cv;
    int c_n;
} counter;

static void
counter_init(counter *c)
{
    tp__mtx_init(&c->c_mtx);
    tp__cv_init(&c->c_cv);
    c->c_n = 0;
}

static void
counter_fini(counter *c)
{
    tp__cv_fini(&c->c_cv);
    tp__mtx_fini(&c->c_mtx);
}

static void
counter_add(counter *c)
{
    tp__mtx_lock(&c->c_mtx);
    c->c_n++;
    tp__cv_broadcast(&c->c_cv);
    tp__mtx_unlock(&c->c_mtx);
}

static void
counter_add_task(void *arg)
{
    counter_add(arg);
}

static int
counter_get(counter *c)
{
    tp__mtx_lock(&c->c_mtx);
    int n = c->c_n;
    tp__mtx_unlock(&c->c_mtx);
    return n;
}

// Waits until the counter reaches @n or @timeout_ms (scaled) passes.
static bool
counter_wait(counter *c, int n, int64_t timeout_ms)
{
    uint64_t deadline = tp__deadline_after_ms(tp_test_ms(timeout_ms));
    tp__mtx_lock(&c->c_mtx);
    while (c->c_n < n) {
        if (!tp__cv_wait_until(&c->c_cv, &c->c_mtx, deadline)) {
            break;
        }
    }
    bool ok = c->c_n >= n;
    tp__mtx_unlock(&c->c_mtx);
    return ok;
}

static tp_pool *
make_pool(int n, const char *name)
{
    tp_pool *pool = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__pool_create(n, name, &pool, &err), err);
    TP_CHECK(pool != NULL);
    return pool;
}

#define NTASKS 1000

typedef struct once_ctx {
    tp_pool *pool;
    _Atomic int runs[NTASKS];
    _Atomic int off_thread; // tasks that saw tp__pool_on_thread false
    counter done;
} once_ctx;

typedef struct once_task {
    tp_task task;
    once_ctx *ctx;
    int index;
} once_task;

static void
once_task_run(void *arg)
{
    once_task *t = arg;
    atomic_fetch_add_explicit(&t->ctx->runs[t->index], 1, memory_order_relaxed);
    if (!tp__pool_on_thread(t->ctx->pool)) {
        atomic_fetch_add_explicit(&t->ctx->off_thread, 1, memory_order_relaxed);
    }
    counter_add(&t->ctx->done);
}

static void
test_pool_each_task_runs_once(void)
{
    static once_ctx ctx;
    static once_task tasks[NTASKS];

    counter_init(&ctx.done);
    ctx.pool = make_pool(4, "once");
    for (int i = 0; i < NTASKS; i++) {
        tasks[i].ctx = &ctx;
        tasks[i].index = i;
        tp__task_init(&tasks[i].task, once_task_run, &tasks[i]);
        TP_CHECK_OK(tp__pool_submit(ctx.pool, &tasks[i].task), NULL);
    }
    TP_CHECKF(counter_wait(&ctx.done, NTASKS, 10000), "%d of %d tasks ran",
              counter_get(&ctx.done), NTASKS);
    tp__pool_destroy(ctx.pool);
    // Exactly once: no task ran twice, none ran after the count was reached.
    TP_CHECK_EQ(counter_get(&ctx.done), NTASKS);
    for (int i = 0; i < NTASKS; i++) {
        TP_CHECKF(atomic_load(&ctx.runs[i]) == 1, "task %d ran %d times", i,
                  atomic_load(&ctx.runs[i]));
    }
    TP_CHECK_EQ(atomic_load(&ctx.off_thread), 0);
    counter_fini(&ctx.done);
}

typedef struct drain_ctx {
    counter gate;        // the first task waits until this reaches 1
    _Atomic int gate_ok; // the first task saw the gate open in time
    _Atomic int ran;
    _Atomic int order_ok; // tasks that ran in submission order
} drain_ctx;

static drain_ctx drain;

static void
drain_first_task(void *arg)
{
    // Holds the only thread so every later task is still queued when the
    // test calls destroy.
    if (counter_wait(&drain.gate, 1, 10000)) {
        atomic_store(&drain.gate_ok, 1);
    }
    atomic_fetch_add(&drain.ran, 1);
}

static void
drain_task(void *arg)
{
    int expect = (int)(intptr_t)arg;
    // One thread: FIFO order is observable.
    if (atomic_fetch_add(&drain.ran, 1) == expect) {
        atomic_fetch_add(&drain.order_ok, 1);
    }
}

static void *
drain_open_gate(void *arg)
{
    usleep(50 * 1000);
    counter_add(&drain.gate);
    return NULL;
}

static void
test_pool_destroy_drains_queue(void)
{
    counter_init(&drain.gate);
    tp_pool *pool = make_pool(1, "drain");
    TP_CHECK_OK(tp__pool_submit_fn(pool, drain_first_task, NULL), NULL);
    for (int i = 1; i <= 200; i++) {
        TP_CHECK_OK(tp__pool_submit_fn(pool, drain_task, (void *)(intptr_t)i),
                    NULL);
    }
    // The gate is closed: nothing has run, destroy has a queue to drain.
    TP_CHECK_EQ(atomic_load(&drain.ran), 0);
    pthread_t opener;
    TP_CHECK(pthread_create(&opener, NULL, drain_open_gate, NULL) == 0);
    tp__pool_destroy(pool);
    pthread_join(opener, NULL);
    TP_CHECK_EQ(atomic_load(&drain.gate_ok), 1);
    TP_CHECK_EQ(atomic_load(&drain.ran), 201);
    TP_CHECK_EQ(atomic_load(&drain.order_ok), 200);
    counter_fini(&drain.gate);
}

static _Atomic int closed_ran;

static void
closed_task(void *arg)
{
    atomic_fetch_add(&closed_ran, 1);
}

static void
test_pool_submit_after_close(void)
{
    tp_pool *pool = make_pool(2, "closed");
    tp_task task;
    tp__task_init(&task, closed_task, NULL);

    tp__pool_close(pool);
    tp__pool_close(pool); // idempotent
    TP_CHECK_EQ(tp__pool_submit(pool, &task), TP_ECLOSED);
    TP_CHECK_EQ(tp__pool_submit_fn(pool, closed_task, NULL), TP_ECLOSED);
    tp__pool_destroy(pool);
    TP_CHECK_EQ(atomic_load(&closed_ran), 0);
}

// Work queued before close still runs.
static void
test_pool_close_keeps_queued_work(void)
{
    counter done;
    counter_init(&done);
    tp_pool *pool = make_pool(2, "keep");
    for (int i = 0; i < 50; i++) {
        TP_CHECK_OK(tp__pool_submit_fn(pool, counter_add_task, &done), NULL);
    }
    tp__pool_close(pool);
    TP_CHECK(counter_wait(&done, 50, 10000));
    tp__pool_destroy(pool);
    TP_CHECK_EQ(counter_get(&done), 50);
    counter_fini(&done);
}

typedef struct where_ctx {
    tp_pool *pool;
    tp_pool *other;
    _Atomic int on_pool;
    _Atomic int on_other;
    _Atomic int named;
    counter done;
} where_ctx;

static void
where_task(void *arg)
{
    where_ctx *w = arg;
    char name[32] = "";

    if (tp__pool_on_thread(w->pool)) {
        atomic_fetch_add(&w->on_pool, 1);
    }
    if (tp__pool_on_thread(w->other)) {
        atomic_fetch_add(&w->on_other, 1);
    }
    pthread_getname_np(pthread_self(), name, sizeof(name));
    if (strncmp(name, "tp-where-", 9) == 0 && name[9] >= '0' &&
        name[9] <= '3' && name[10] == '\0') {
        atomic_fetch_add(&w->named, 1);
    }
    counter_add(&w->done);
}

static void
test_pool_tasks_run_on_pool_threads(void)
{
    static where_ctx w;
    counter_init(&w.done);
    w.pool = make_pool(4, "where");
    w.other = make_pool(1, "other");
    TP_CHECK(!tp__pool_on_thread(w.pool));
    TP_CHECK(!tp__pool_on_thread(w.other));
    TP_CHECK(!tp__pool_on_thread(NULL));

    for (int i = 0; i < 100; i++) {
        TP_CHECK_OK(tp__pool_submit_fn(w.pool, where_task, &w), NULL);
    }
    TP_CHECK(counter_wait(&w.done, 100, 10000));
    TP_CHECK_EQ(atomic_load(&w.on_pool), 100);
    TP_CHECK_EQ(atomic_load(&w.on_other), 0);
    TP_CHECK_EQ(atomic_load(&w.named), 100);
    tp__pool_destroy(w.other);
    tp__pool_destroy(w.pool);
    counter_fini(&w.done);
}

// All threads really run at once: four tasks each wait for the other three.
typedef struct meet_ctx {
    counter arrived;
    _Atomic int met;
    counter done;
} meet_ctx;

static void
meet_task(void *arg)
{
    meet_ctx *m = arg;
    counter_add(&m->arrived);
    if (counter_wait(&m->arrived, 4, 5000)) {
        atomic_fetch_add(&m->met, 1);
    }
    counter_add(&m->done);
}

static void
test_pool_threads_run_concurrently(void)
{
    static meet_ctx m;
    counter_init(&m.arrived);
    counter_init(&m.done);
    tp_pool *pool = make_pool(4, "meet");
    for (int i = 0; i < 4; i++) {
        TP_CHECK_OK(tp__pool_submit_fn(pool, meet_task, &m), NULL);
    }
    TP_CHECK(counter_wait(&m.done, 4, 10000));
    TP_CHECK_EQ(atomic_load(&m.met), 4);
    tp__pool_destroy(pool);
    counter_fini(&m.arrived);
    counter_fini(&m.done);
}

// A task may submit more work to its own pool.
typedef struct chain_ctx {
    tp_pool *pool;
    _Atomic int left;
    counter done;
} chain_ctx;

static void
chain_task(void *arg)
{
    chain_ctx *c = arg;
    if (atomic_fetch_sub(&c->left, 1) > 1) {
        TP_CHECK_OK(tp__pool_submit_fn(c->pool, chain_task, c), NULL);
    } else {
        counter_add(&c->done);
    }
}

static void
test_pool_submit_from_task(void)
{
    static chain_ctx c;
    counter_init(&c.done);
    atomic_store(&c.left, 100);
    c.pool = make_pool(2, "chain");
    TP_CHECK_OK(tp__pool_submit_fn(c.pool, chain_task, &c), NULL);
    TP_CHECK(counter_wait(&c.done, 1, 10000));
    TP_CHECK_EQ(atomic_load(&c.left), 0);
    tp__pool_destroy(c.pool);
    counter_fini(&c.done);
}

static void
test_pool_create_bad_args(void)
{
    tp_pool *pool = NULL;
    tp_error *err = NULL;

    TP_CHECK_EQ(tp__pool_create(0, "bad", &pool, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "pool bad: 0 threads");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp__pool_create(TP_POOL_MAX_THREADS + 1, "bad", &pool, &err),
                TP_EINVAL);
    tp_error_unref(err);
    TP_CHECK(pool == NULL); // output set only on success
    tp__pool_destroy(NULL);
}

// libuv's OOM test: fail the Nth allocation until creation succeeds.
static void
test_pool_alloc_failures(void)
{
#if TP_HAVE_TEST_FAULTS
    int failures = 0;
    for (long n = 1; n < 100; n++) {
        tp_pool *pool = NULL;
        tp_error *err = NULL;
        tp__alloc_fail_after(n);
        tp_status st = tp__pool_create(2, "oom", &pool, &err);
        tp__alloc_fail_after(0);
        if (st == TP_OK) {
            TP_CHECK_EQ(tp__pool_submit_fn(pool, closed_task, NULL), TP_OK);
            tp__alloc_fail_after(1);
            TP_CHECK_EQ(tp__pool_submit_fn(pool, closed_task, NULL), TP_ENOMEM);
            tp__alloc_fail_after(0);
            tp__pool_destroy(pool);
            TP_CHECK(failures > 0);
            TP_CHECK_EQ(atomic_load(&closed_ran), 1);
            return;
        }
        TP_CHECK_EQ(st, TP_ENOMEM);
        TP_CHECK_EQ(tp_error_status(err), TP_ENOMEM);
        TP_CHECK(pool == NULL);
        tp_error_unref(err);
        failures++;
    }
    tp_test_fail(__FILE__, __LINE__, "pool creation never succeeded");
#else
    tp_test_skip("built without TP_TEST_FAULTS");
#endif
}

static tp_pool *suicide_pool;

static void
suicide_task(void *arg)
{
    tp__pool_destroy(suicide_pool); // must abort: TP_ASSERT
}

// Destroying a pool from its own thread is a bug caught by TP_ASSERT.
static void
test_pool_destroy_from_own_thread_asserts(void)
{
    fflush(stderr);
    pid_t pid = fork();
    TP_CHECK(pid >= 0);
    if (pid == 0) {
        counter never;
        counter_init(&never);
        suicide_pool = make_pool(1, "suicide");
        TP_CHECK_OK(tp__pool_submit_fn(suicide_pool, suicide_task, NULL), NULL);
        counter_wait(&never, 1, 5000);
        _exit(0); // the assertion did not fire
    }
    uint64_t deadline = tp__deadline_after_ms(tp_test_ms(10000));
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 &&
           tp__now_ns() < deadline) {
        usleep(10 * 1000);
    }
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        tp_test_fail(__FILE__, __LINE__, "child did not exit");
    }
    TP_CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "child status 0x%x, expected SIGABRT", status);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_pool_each_task_runs_once),
    TP_TEST_CASE(test_pool_destroy_drains_queue),
    TP_TEST_CASE(test_pool_submit_after_close),
    TP_TEST_CASE(test_pool_close_keeps_queued_work),
    TP_TEST_CASE(test_pool_tasks_run_on_pool_threads),
    TP_TEST_CASE(test_pool_threads_run_concurrently),
    TP_TEST_CASE(test_pool_submit_from_task),
    TP_TEST_CASE(test_pool_create_bad_args),
    TP_TEST_CASE(test_pool_alloc_failures),
    TP_TEST_CASE(test_pool_destroy_from_own_thread_asserts),
};

TP_TEST_MAIN(cases)
