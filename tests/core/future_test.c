// SPDX-License-Identifier: Apache-2.0
// future_test.c - tp_future: resolution, waiting with deadlines, callbacks
// (order, exactly once, thread), ownership of the value, races.

#include "tp_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include <tpipe/future.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "pool.h"

static tp_future *
make_future(void)
{
    tp_future *f = NULL;
    TP_CHECK_OK(tp_future_create(&f), NULL);
    TP_CHECK(f != NULL);
    TP_CHECK(!tp_future_is_done(f));
    return f;
}

static int64_t
elapsed_ms(uint64_t start_ns)
{
    return (int64_t)((tp__now_ns() - start_ns) / 1000000u);
}

static void
test_set_value_then_wait(void)
{
    static int x = 42;
    tp_future *f = make_future();
    TP_CHECK(tp_future_value(f) == NULL);
    TP_CHECK_OK(tp_future_set_value(f, &x, NULL), NULL);
    TP_CHECK(tp_future_is_done(f));
    tp_error *err = NULL;
    TP_CHECK_OK(tp_future_wait(f, tp_test_ms(1000), &err), err);
    TP_CHECK(err == NULL);
    TP_CHECK(tp_future_value(f) == &x);
    TP_CHECK(tp_future_error(f) == NULL);
    // No deadline is fine once resolved.
    TP_CHECK_OK(tp_future_wait(f, 0, NULL), NULL);
    tp_future_unref(f);
}

static void
test_wait_timeout(void)
{
    tp_future *f = make_future();
    tp_error *err = NULL;
    uint64_t start = tp__now_ns();
    TP_CHECK_EQ(tp_future_wait(f, 100, &err), TP_ETIMEDOUT);
    int64_t ms = elapsed_ms(start);
    TP_CHECKF(ms >= 99, "returned after %lld ms", (long long)ms);
    TP_CHECKF(ms < 100 + tp_test_ms(2000), "returned after %lld ms",
              (long long)ms);
    TP_CHECK_EQ(tp_error_status(err), TP_ETIMEDOUT);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "future not resolved after 100 ms");
    tp_error_unref(err);
    TP_CHECK(!tp_future_is_done(f));
    // A timeout does not resolve the future.
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    TP_CHECK_OK(tp_future_wait(f, 100, NULL), NULL);
    tp_future_unref(f);
}

static void
test_set_error_then_wait(void)
{
    tp_future *f = make_future();
    tp_error *cause =
        tp__error_new(TP_ECONNRESET, 0, NULL, "tcp: peer 127.0.0.1:1 reset");
    TP_CHECK_OK(tp_future_set_error(f, cause), NULL);
    // The future holds its own reference.
    tp_error_unref(cause);

    tp_error *err = NULL;
    TP_CHECK_EQ(tp_future_wait(f, tp_test_ms(1000), &err), TP_ECONNRESET);
    TP_CHECK(err != NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "peer 127.0.0.1:1 reset");
    TP_CHECK(tp_future_error(f) == err);
    TP_CHECK(tp_future_value(f) == NULL);
    tp_error_unref(err);
    tp_future_unref(f);

    // NULL is not an error.
    f = make_future();
    TP_CHECK_EQ(tp_future_set_error(f, NULL), TP_EINVAL);
    TP_CHECK(!tp_future_is_done(f));
    tp_future_unref(f);
}

typedef struct cb_log {
    tp_mtx mtx;
    int ids[64];
    int n;
    pthread_t threads[64];
} cb_log;

typedef struct cb_entry {
    cb_log *log;
    int id;
} cb_entry;

static void
log_cb(tp_future *f, void *arg)
{
    cb_entry *e = arg;
    TP_CHECK(tp_future_is_done(f));
    tp__mtx_lock(&e->log->mtx);
    TP_CHECK(e->log->n < 64);
    e->log->threads[e->log->n] = pthread_self();
    e->log->ids[e->log->n++] = e->id;
    tp__mtx_unlock(&e->log->mtx);
}

static int
log_count(cb_log *log)
{
    tp__mtx_lock(&log->mtx);
    int n = log->n;
    tp__mtx_unlock(&log->mtx);
    return n;
}

static void
test_then_in_order_exactly_once(void)
{
    static cb_log log;
    static cb_entry e[5];
    tp__mtx_init(&log.mtx);
    for (int i = 0; i < 5; i++) {
        e[i].log = &log;
        e[i].id = i;
    }
    tp_future *f = make_future();
    for (int i = 0; i < 3; i++) {
        TP_CHECK_OK(tp_future_then(f, log_cb, &e[i]), NULL);
    }
    TP_CHECK_EQ(log_count(&log), 0); // nothing runs before resolution
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    TP_CHECK_EQ(log_count(&log), 3);
    // Added after resolution: runs on this thread before then() returns.
    TP_CHECK_OK(tp_future_then(f, log_cb, &e[3]), NULL);
    TP_CHECK_EQ(log_count(&log), 4);
    TP_CHECK(pthread_equal(log.threads[3], pthread_self()));
    // A second resolution runs nothing again.
    TP_CHECK_EQ(tp_future_set_value(f, NULL, NULL), TP_EINVAL);
    TP_CHECK_OK(tp_future_then(f, log_cb, &e[4]), NULL);
    TP_CHECK_EQ(log_count(&log), 5);
    for (int i = 0; i < 5; i++) {
        TP_CHECK_EQ(log.ids[i], i);
    }
    tp_future_unref(f);
    TP_CHECK_EQ(log_count(&log), 5);
    tp__mtx_fini(&log.mtx);
}

// Callbacks of a future that never resolves never run; unref frees them.
static void
test_then_never_resolved(void)
{
    static cb_log log;
    static cb_entry e = {&log, 0};
    tp__mtx_init(&log.mtx);
    tp_future *f = make_future();
    TP_CHECK_OK(tp_future_then(f, log_cb, &e), NULL);
    tp_future_unref(f);
    TP_CHECK_EQ(log_count(&log), 0);
    tp__mtx_fini(&log.mtx);
}

static _Atomic int freed_count;
static void *_Atomic freed_value;

static void
count_free(void *value)
{
    atomic_store(&freed_value, value);
    atomic_fetch_add(&freed_count, 1);
}

static void
test_set_twice_einval(void)
{
    static int a = 1;
    static int b = 2;
    tp_future *f = make_future();
    TP_CHECK_OK(tp_future_set_value(f, &a, count_free), NULL);
    TP_CHECK_EQ(tp_future_set_value(f, &b, count_free), TP_EINVAL);
    tp_error *err = tp__error_new(TP_EIO, 0, NULL, "late");
    TP_CHECK_EQ(tp_future_set_error(f, err), TP_EINVAL);
    tp_error_unref(err);
    TP_CHECK(tp_future_value(f) == &a);
    TP_CHECK(tp_future_error(f) == NULL);
    TP_CHECK_EQ(atomic_load(&freed_count), 0);
    tp_future_unref(f);
    // Only the accepted value is freed; &b stayed with the caller.
    TP_CHECK_EQ(atomic_load(&freed_count), 1);
    TP_CHECK(atomic_load(&freed_value) == &a);
}

static void
test_value_freed_on_last_unref(void)
{
    int *value = tp__alloc(sizeof(int));
    TP_CHECK(value != NULL);
    *value = 7;
    tp_future *f = make_future();
    TP_CHECK(tp_future_ref(f) == f);
    tp_future_ref(f);
    TP_CHECK_OK(tp_future_set_value(f, value, count_free), NULL);
    tp_future_unref(f);
    tp_future_unref(f);
    TP_CHECK_EQ(atomic_load(&freed_count), 0);
    TP_CHECK(*(int *)tp_future_value(f) == 7);
    tp_future_unref(f);
    TP_CHECK_EQ(atomic_load(&freed_count), 1);
    TP_CHECK(atomic_load(&freed_value) == value);
    tp__free(value);
    tp_future_unref(NULL);
}

typedef struct delayed_set {
    tp_future *f;
    int delay_ms;
    pthread_t thread;
} delayed_set;

static void *
delayed_set_main(void *arg)
{
    delayed_set *d = arg;
    usleep((useconds_t)d->delay_ms * 1000);
    TP_CHECK_OK(tp_future_set_value(d->f, d, NULL), NULL);
    return NULL;
}

static void
test_resolve_from_other_thread_wakes_waiter(void)
{
    delayed_set d = {.f = make_future(), .delay_ms = 50};
    TP_CHECK(pthread_create(&d.thread, NULL, delayed_set_main, &d) == 0);
    uint64_t start = tp__now_ns();
    tp_error *err = NULL;
    TP_CHECK_OK(tp_future_wait(d.f, tp_test_ms(5000), &err), err);
    int64_t ms = elapsed_ms(start);
    TP_CHECKF(ms < tp_test_ms(4000), "woke after %lld ms", (long long)ms);
    TP_CHECK(tp_future_value(d.f) == &d);
    pthread_join(d.thread, NULL);
    tp_future_unref(d.f);
}

typedef struct waiter {
    tp_future *f;
    pthread_t thread;
    tp_status st;
} waiter;

static void *
waiter_main(void *arg)
{
    waiter *w = arg;
    w->st = tp_future_wait(w->f, tp_test_ms(5000), NULL);
    return NULL;
}

static void
test_many_waiters_all_wake(void)
{
    tp_future *f = make_future();
    waiter w[4];
    for (int i = 0; i < 4; i++) {
        w[i].f = f;
        w[i].st = TP_EINTERNAL;
        TP_CHECK(pthread_create(&w[i].thread, NULL, waiter_main, &w[i]) == 0);
    }
    usleep(20 * 1000);
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    for (int i = 0; i < 4; i++) {
        pthread_join(w[i].thread, NULL);
        TP_CHECK_EQ(w[i].st, TP_OK);
    }
    tp_future_unref(f);
}

static void
test_then_runs_on_resolving_thread(void)
{
    static cb_log log;
    static cb_entry e = {&log, 0};
    tp__mtx_init(&log.mtx);
    delayed_set d = {.f = make_future(), .delay_ms = 0};
    TP_CHECK_OK(tp_future_then(d.f, log_cb, &e), NULL);
    TP_CHECK(pthread_create(&d.thread, NULL, delayed_set_main, &d) == 0);
    pthread_join(d.thread, NULL);
    TP_CHECK_EQ(log_count(&log), 1);
    TP_CHECK(pthread_equal(log.threads[0], d.thread));
    tp_future_unref(d.f);
    tp__mtx_fini(&log.mtx);
}

#define NRACERS 8

typedef struct race {
    tp_future *f;
    pthread_barrier_t start;
    _Atomic int wins;
    _Atomic int losses;
    int values[NRACERS];
} race;

typedef struct racer {
    race *r;
    int index;
    pthread_t thread;
} racer;

static void *
racer_main(void *arg)
{
    racer *me = arg;
    race *r = me->r;
    pthread_barrier_wait(&r->start);
    tp_status st;
    if (me->index % 2 == 0) {
        st = tp_future_set_value(r->f, &r->values[me->index], count_free);
    } else {
        tp_error *err = tp__error_new(TP_EIO, 0, NULL, "racer %d", me->index);
        st = tp_future_set_error(r->f, err);
        tp_error_unref(err);
    }
    if (st == TP_OK) {
        atomic_fetch_add(&r->wins, 1);
    } else if (st == TP_EINVAL) {
        atomic_fetch_add(&r->losses, 1);
    }
    return NULL;
}

static void
test_racing_resolvers_one_wins(void)
{
    static race r;
    racer racers[NRACERS];
    for (int iter = 0; iter < 100; iter++) {
        r.f = make_future();
        atomic_store(&r.wins, 0);
        atomic_store(&r.losses, 0);
        atomic_store(&freed_count, 0);
        atomic_store(&freed_value, NULL);
        TP_CHECK(pthread_barrier_init(&r.start, NULL, NRACERS) == 0);
        for (int i = 0; i < NRACERS; i++) {
            racers[i].r = &r;
            racers[i].index = i;
            TP_CHECK(pthread_create(&racers[i].thread, NULL, racer_main,
                                    &racers[i]) == 0);
        }
        for (int i = 0; i < NRACERS; i++) {
            pthread_join(racers[i].thread, NULL);
        }
        pthread_barrier_destroy(&r.start);
        TP_CHECK_EQ(atomic_load(&r.wins), 1);
        TP_CHECK_EQ(atomic_load(&r.losses), NRACERS - 1);
        TP_CHECK(tp_future_is_done(r.f));
        // Exactly one of value or error, and it is the winner's.
        void *value = tp_future_value(r.f);
        const tp_error *err = tp_future_error(r.f);
        TP_CHECK((value == NULL) != (err == NULL));
        tp_future_unref(r.f);
        if (value != NULL) {
            TP_CHECK_EQ(atomic_load(&freed_count), 1);
            TP_CHECK(atomic_load(&freed_value) == value);
        } else {
            TP_CHECK_EQ(atomic_load(&freed_count), 0);
        }
    }
}

// then() racing with resolution: every callback runs exactly once and in
// the order added, whichever thread ends up running it.
typedef struct then_race {
    tp_future *f;
    cb_log log;
    cb_entry e[32];
    pthread_barrier_t start;
} then_race;

static void *
then_race_adder(void *arg)
{
    then_race *t = arg;
    pthread_barrier_wait(&t->start);
    for (int i = 0; i < 32; i++) {
        TP_CHECK_OK(tp_future_then(t->f, log_cb, &t->e[i]), NULL);
    }
    return NULL;
}

static void
test_then_races_with_resolution(void)
{
    static then_race t;
    tp__mtx_init(&t.log.mtx);
    for (int iter = 0; iter < 200; iter++) {
        t.f = make_future();
        t.log.n = 0;
        for (int i = 0; i < 32; i++) {
            t.e[i].log = &t.log;
            t.e[i].id = i;
        }
        TP_CHECK(pthread_barrier_init(&t.start, NULL, 2) == 0);
        pthread_t adder;
        TP_CHECK(pthread_create(&adder, NULL, then_race_adder, &t) == 0);
        pthread_barrier_wait(&t.start);
        TP_CHECK_OK(tp_future_set_value(t.f, NULL, NULL), NULL);
        pthread_join(adder, NULL);
        pthread_barrier_destroy(&t.start);
        TP_CHECK_EQ(log_count(&t.log), 32);
        for (int i = 0; i < 32; i++) {
            TP_CHECKF(t.log.ids[i] == i, "iteration %d: position %d ran %d",
                      iter, i, t.log.ids[i]);
        }
        tp_future_unref(t.f);
    }
    tp__mtx_fini(&t.log.mtx);
}

// A callback that adds another callback: the new one runs after it,
// exactly once.
static cb_log nested_log;
static cb_entry nested_inner = {&nested_log, 1};

static void
nested_outer_cb(tp_future *f, void *arg)
{
    log_cb(f, arg);
    TP_CHECK_OK(tp_future_then(f, log_cb, &nested_inner), NULL);
}

static void
test_then_from_callback(void)
{
    static cb_entry outer = {&nested_log, 0};
    static cb_entry last = {&nested_log, 2};
    tp__mtx_init(&nested_log.mtx);
    tp_future *f = make_future();
    TP_CHECK_OK(tp_future_then(f, nested_outer_cb, &outer), NULL);
    TP_CHECK_OK(tp_future_then(f, log_cb, &last), NULL);
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    TP_CHECK_EQ(log_count(&nested_log), 3);
    // outer, then last (added before inner), then inner.
    TP_CHECK_EQ(nested_log.ids[0], 0);
    TP_CHECK_EQ(nested_log.ids[1], 2);
    TP_CHECK_EQ(nested_log.ids[2], 1);
    tp_future_unref(f);
    tp__mtx_fini(&nested_log.mtx);
}

static _Atomic int unref_cb_runs;

static void
unref_cb(tp_future *f, void *arg)
{
    atomic_fetch_add(&unref_cb_runs, 1);
    tp_future_unref(f);
}

// A callback may drop the last reference (a common cleanup pattern); the
// resolver must not touch the future afterwards (ASan checks this).
static void
test_callback_drops_last_reference(void)
{
    int *value = tp__alloc(sizeof(int));
    TP_CHECK(value != NULL);
    tp_future *f = make_future();
    TP_CHECK_OK(tp_future_then(f, unref_cb, NULL), NULL);
    TP_CHECK_OK(tp_future_then(f, unref_cb, NULL), NULL);
    tp_future_ref(f); // one reference per callback
    TP_CHECK_OK(tp_future_set_value(f, value, count_free), NULL);
    TP_CHECK_EQ(atomic_load(&unref_cb_runs), 2);
    TP_CHECK_EQ(atomic_load(&freed_count), 1);
    tp__free(value);

    // The same on an already resolved future.
    f = make_future();
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    TP_CHECK_OK(tp_future_then(f, unref_cb, NULL), NULL);
    TP_CHECK_EQ(atomic_load(&unref_cb_runs), 3);
}

static void
test_alloc_failures(void)
{
#if TP_HAVE_TEST_FAULTS
    tp_future *f = NULL;
    tp__alloc_fail_after(1);
    TP_CHECK_EQ(tp_future_create(&f), TP_ENOMEM);
    tp__alloc_fail_after(0);
    TP_CHECK(f == NULL);

    static cb_log log;
    static cb_entry e = {&log, 0};
    tp__mtx_init(&log.mtx);
    f = make_future();
    tp__alloc_fail_after(1);
    TP_CHECK_EQ(tp_future_then(f, log_cb, &e), TP_ENOMEM);
    tp__alloc_fail_after(0);
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    TP_CHECK_EQ(log_count(&log), 0); // the failed then() never runs
    tp_future_unref(f);
    tp__mtx_fini(&log.mtx);
#else
    tp_test_skip("built without TP_TEST_FAULTS");
#endif
}

// A future bound to a pool runs its callbacks on the pool, also when it is
// already resolved at the time of tp_future_then (the caller may be a loop
// thread): never inline on a thread that is not the pool's, and in the
// order they were added.
typedef struct bound_cb {
    tp_pool *pool;
    atomic_int order[4];
    atomic_int n;
    atomic_int off_pool;
    pthread_t caller;
    atomic_int on_caller;
} bound_cb;

static bound_cb g_bound;

static void
bound_log_cb(tp_future *f, void *arg)
{
    (void)f;
    int i = atomic_fetch_add(&g_bound.n, 1);
    if (i < 4) {
        atomic_store(&g_bound.order[i], (int)(intptr_t)arg);
    }
    if (!tp__pool_on_thread(g_bound.pool)) {
        atomic_fetch_add(&g_bound.off_pool, 1);
    }
    if (pthread_equal(pthread_self(), g_bound.caller)) {
        atomic_fetch_add(&g_bound.on_caller, 1);
    }
}

static void
test_then_bound_to_pool_never_inline(void)
{
    tp_error *err = NULL;
    memset(&g_bound, 0, sizeof(g_bound));
    TP_CHECK_OK(tp__pool_create(2, "fut", &g_bound.pool, &err), err);
    g_bound.caller = pthread_self();
    tp_future *f = make_future();
    tp__future_set_pool(f, g_bound.pool);
    // Added before resolution, resolved on this (non-pool) thread.
    TP_CHECK_OK(tp_future_then(f, bound_log_cb, (void *)(intptr_t)1), NULL);
    TP_CHECK_OK(tp_future_set_value(f, NULL, NULL), NULL);
    uint64_t start = tp__now_ns();
    while (atomic_load(&g_bound.n) < 1) {
        TP_CHECKF(elapsed_ms(start) < tp_test_ms(5000),
                  "the first callback did not run");
        usleep(100);
    }
    usleep(20000); // the pool's drain of the first callback is over
    // Added after resolution: still on the pool, in order.
    TP_CHECK_OK(tp_future_then(f, bound_log_cb, (void *)(intptr_t)2), NULL);
    TP_CHECK_OK(tp_future_then(f, bound_log_cb, (void *)(intptr_t)3), NULL);
    while (atomic_load(&g_bound.n) < 3) {
        TP_CHECKF(elapsed_ms(start) < tp_test_ms(5000),
                  "only %d of 3 callbacks ran", atomic_load(&g_bound.n));
        usleep(100);
    }
    TP_CHECK_EQ(atomic_load(&g_bound.off_pool), 0);
    TP_CHECK_EQ(atomic_load(&g_bound.on_caller), 0);
    for (int i = 0; i < 3; i++) {
        TP_CHECK_EQ(atomic_load(&g_bound.order[i]), i + 1);
    }
    tp_future_unref(f);
    tp__pool_close(g_bound.pool);
    tp__pool_destroy(g_bound.pool);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_set_value_then_wait),
    TP_TEST_CASE(test_wait_timeout),
    TP_TEST_CASE(test_set_error_then_wait),
    TP_TEST_CASE(test_then_in_order_exactly_once),
    TP_TEST_CASE(test_then_never_resolved),
    TP_TEST_CASE(test_set_twice_einval),
    TP_TEST_CASE(test_value_freed_on_last_unref),
    TP_TEST_CASE(test_resolve_from_other_thread_wakes_waiter),
    TP_TEST_CASE(test_many_waiters_all_wake),
    TP_TEST_CASE(test_then_runs_on_resolving_thread),
    TP_TEST_CASE(test_racing_resolvers_one_wins),
    TP_TEST_CASE(test_then_races_with_resolution),
    TP_TEST_CASE(test_then_from_callback),
    TP_TEST_CASE(test_callback_drops_last_reference),
    TP_TEST_CASE(test_alloc_failures),
    TP_TEST_CASE(test_then_bound_to_pool_never_inline),
};

TP_TEST_MAIN(cases)
