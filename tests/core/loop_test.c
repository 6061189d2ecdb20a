// SPDX-License-Identifier: Apache-2.0
// loop_test.c - the loop thread on both backends: posting, deferral,
// timers, fd readiness, pollers, idle CPU; and the aio completion rules.

#include <stdatomic.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/aio.h"
#include "core/config.h"
#include "core/loop.h"
#include "tp_test.h"

static int64_t test_spin_us; // TP_LOOP_SPIN_US for loops made here

static tp_loop *
make_loop(tp_io_backend be)
{
    tp_config cfg;
    tp__config_defaults(&cfg);
    cfg.io_backend = be;
    cfg.loop_spin_us = test_spin_us;
    tp_loop *l = NULL;
    tp_error *err = NULL;
    tp_status st = tp__loop_create(&cfg, "test", &l, &err);
    if (be == TP_IO_BACKEND_URING && st == TP_ENOTSUP) {
        return NULL;
    }
    TP_CHECK_OK(st, err);
    return l;
}

// Runs @fn for every backend usable here (uring only if viable).
static void
each_backend(void (*fn)(tp_loop *l))
{
    tp_loop *l = make_loop(TP_IO_BACKEND_EPOLL);
    TP_CHECK(strcmp(tp__loop_backend_name(l), "epoll") == 0);
    fn(l);
    tp__loop_destroy(l);
    l = make_loop(TP_IO_BACKEND_URING);
    if (l != NULL) {
        TP_CHECK(strcmp(tp__loop_backend_name(l), "uring") == 0);
        fn(l);
        tp__loop_destroy(l);
    }
}

static void
wait_until(_Atomic int *v, int want, int64_t ms)
{
    uint64_t deadline = tp__now_ns() + (uint64_t)tp_test_ms(ms) * 1000000u;
    while (atomic_load(v) < want) {
        TP_CHECKF(tp__now_ns() < deadline, "waited %lld ms for %d, have %d",
                  (long long)ms, want, atomic_load(v));
        usleep(100);
    }
}

// ---- posting -------------------------------------------------------------

typedef struct post_ctx {
    tp_loop *l;
    tp_task tasks[1000];
    int order[1000];
    _Atomic int n;
    _Atomic int done;
    _Atomic int off_loop;
} post_ctx;

static post_ctx pc;

static void
post_task(void *arg)
{
    int i = (int)(intptr_t)arg;
    if (!tp__loop_on_thread(pc.l)) {
        atomic_fetch_add(&pc.off_loop, 1);
    }
    int k = atomic_fetch_add(&pc.n, 1);
    pc.order[k] = i;
    atomic_fetch_add_explicit(&pc.done, 1, memory_order_release);
}

static void
posts_run_on_loop_in_order_one(tp_loop *l)
{
    memset(&pc, 0, sizeof(pc));
    pc.l = l;
    TP_CHECK(!tp__loop_on_thread(l));
    for (int i = 0; i < 1000; i++) {
        tp__task_init(&pc.tasks[i], post_task, (void *)(intptr_t)i);
        tp__loop_post(l, &pc.tasks[i]);
    }
    wait_until(&pc.done, 1000, 5000);
    TP_CHECK_EQ(atomic_load(&pc.off_loop), 0);
    for (int i = 0; i < 1000; i++) {
        TP_CHECK_EQ(pc.order[i], i);
    }
}

static void
posts_run_on_loop_in_order(void)
{
    each_backend(posts_run_on_loop_in_order_one);
}

// ---- deferral: never inside the current handler ---------------------------

typedef struct defer_ctx {
    tp_loop *l;
    tp_task outer, inner;
    _Atomic int in_outer;
    _Atomic int inner_ran_inside;
    _Atomic int inner_ran;
} defer_ctx;

static defer_ctx dc;

static void
defer_inner(void *arg)
{
    if (atomic_load(&dc.in_outer)) {
        atomic_store(&dc.inner_ran_inside, 1);
    }
    atomic_store(&dc.inner_ran, 1);
}

static void
defer_outer(void *arg)
{
    atomic_store(&dc.in_outer, 1);
    tp__task_init(&dc.inner, defer_inner, NULL);
    tp__loop_defer(dc.l, &dc.inner);
    atomic_store(&dc.in_outer, 0);
}

static void
defer_runs_after_handler_one(tp_loop *l)
{
    memset(&dc, 0, sizeof(dc));
    dc.l = l;
    tp__task_init(&dc.outer, defer_outer, NULL);
    tp__loop_post(l, &dc.outer);
    wait_until(&dc.inner_ran, 1, 5000);
    TP_CHECK_EQ(atomic_load(&dc.inner_ran_inside), 0);
}

static void
defer_runs_after_handler(void)
{
    each_backend(defer_runs_after_handler_one);
}

// ---- timers ----------------------------------------------------------------

typedef struct timer_ctx {
    tp_loop *l;
    tp_timer t[5];
    int fired[5];
    uint64_t at[5];
    _Atomic int n;
    _Atomic int done;
    uint64_t start;
} timer_ctx;

static timer_ctx tc;

static void
timer_cb(tp_timer *t, void *arg)
{
    int i = (int)(intptr_t)arg;
    tc.at[i] = tp__now_ns();
    int k = atomic_fetch_add(&tc.n, 1);
    tc.fired[k] = i;
    atomic_fetch_add_explicit(&tc.done, 1, memory_order_release);
}

static void
timer_arm(void *arg)
{
    // Deadlines 40, 10, 30, (stopped), 20 ms from now.
    static const int ms[5] = {40, 10, 30, 5, 20};
    tc.start = tp__now_ns();
    for (int i = 0; i < 5; i++) {
        tp__timer_init(&tc.t[i], timer_cb, (void *)(intptr_t)i);
        tp__timer_start(tc.l, &tc.t[i], tc.start + (uint64_t)ms[i] * 1000000u);
    }
    tp__timer_stop(tc.l, &tc.t[3]);
    TP_CHECK(!tp__timer_armed(&tc.t[3]));
}

static void
timers_fire_in_order_one(tp_loop *l)
{
    memset(&tc, 0, sizeof(tc));
    tc.l = l;
    tp__loop_call(l, timer_arm, NULL);
    wait_until(&tc.done, 4, 5000);
    usleep(20000);
    TP_CHECK_EQ(atomic_load(&tc.done), 4); // the stopped one never fires
    static const int want[4] = {1, 4, 2, 0};
    static const int ms[5] = {40, 10, 30, 5, 20};
    for (int i = 0; i < 4; i++) {
        TP_CHECK_EQ(tc.fired[i], want[i]);
        uint64_t due = tc.start + (uint64_t)ms[want[i]] * 1000000u;
        TP_CHECKF(tc.at[want[i]] >= due, "timer %d fired %lld ns early",
                  want[i], (long long)(due - tc.at[want[i]]));
    }
}

static void
timers_fire_in_order(void)
{
    each_backend(timers_fire_in_order_one);
}

// A timer armed by a deferred callback (as when a completion callback
// resubmits an operation with a timeout) fires even though the loop had
// computed its sleep before the callback ran.
static tp_task tl_outer, tl_inner;
static tp_timer tl_timer;
static _Atomic int tl_fired;
static tp_loop *tl_loop;

static void
tl_timer_cb(tp_timer *t, void *arg)
{
    atomic_store(&tl_fired, 1);
}

static void
tl_inner_fn(void *arg)
{
    tp__timer_init(&tl_timer, tl_timer_cb, NULL);
    tp__timer_start(tl_loop, &tl_timer, tp__now_ns() + 30000000u);
}

static void
tl_outer_fn(void *arg)
{
    tp__task_init(&tl_inner, tl_inner_fn, NULL);
    tp__loop_defer(tl_loop, &tl_inner);
}

static void
timer_armed_by_callback_fires_one(tp_loop *l)
{
    tl_loop = l;
    atomic_store(&tl_fired, 0);
    tp__task_init(&tl_outer, tl_outer_fn, NULL);
    tp__loop_post(l, &tl_outer);
    wait_until(&tl_fired, 1, 2000);
}

static void
timer_armed_by_callback_fires(void)
{
    test_spin_us = 0;
    each_backend(timer_armed_by_callback_fires_one);
    test_spin_us = 50;
    each_backend(timer_armed_by_callback_fires_one);
}

// ---- fds -------------------------------------------------------------------

typedef struct fd_ctx {
    tp_loop *l;
    int efd;
    tp_loop_fd lfd;
    _Atomic int reads;
} fd_ctx;

static fd_ctx fc;

static void
fd_cb(tp_loop_fd *lfd, uint32_t ev)
{
    TP_CHECK(tp__loop_on_thread(fc.l));
    if (ev & TP_EV_READ) {
        uint64_t v;
        // Edge-style: drain until EAGAIN.
        while (read(fc.efd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
            atomic_fetch_add(&fc.reads, (int)v);
        }
    }
}

static void
fd_add_task(void *arg)
{
    TP_CHECK_OK(
        tp__loop_fd_add(fc.l, &fc.lfd, fc.efd, TP_EV_READ, fd_cb, NULL, NULL),
        NULL);
}

static void
fd_remove_task(void *arg)
{
    tp__loop_fd_remove(fc.l, &fc.lfd);
}

static void
fd_readiness_one(tp_loop *l)
{
    memset(&fc, 0, sizeof(fc));
    fc.l = l;
    fc.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    TP_CHECK(fc.efd >= 0);
    tp__loop_call(l, fd_add_task, NULL);
    uint64_t one = 1;
    for (int i = 1; i <= 50; i++) {
        TP_CHECK(write(fc.efd, &one, sizeof(one)) == sizeof(one));
        wait_until(&fc.reads, i, 5000);
    }
    tp__loop_call(l, fd_remove_task, NULL);
    TP_CHECK(write(fc.efd, &one, sizeof(one)) == sizeof(one));
    usleep(50000);
    TP_CHECK_EQ(atomic_load(&fc.reads), 50); // no callback after remove
    close(fc.efd);
}

static void
fd_readiness(void)
{
    each_backend(fd_readiness_one);
}

// ---- pollers: spin, then sleep ---------------------------------------------

typedef struct poll_ctx {
    tp_loop *l;
    tp_loop_poller p;
    _Atomic int flag;     // "data" set by another thread
    _Atomic int sleeping; // the poller armed its wake-up
    int efd;
    tp_loop_fd lfd;
    _Atomic int seen;
    _Atomic int sleeps;
} poll_ctx;

static poll_ctx pl;

static bool
pl_poll(tp_loop_poller *p)
{
    if (atomic_exchange(&pl.flag, 0)) {
        atomic_fetch_add(&pl.seen, 1);
        return true;
    }
    return false;
}

static bool
pl_prepare_sleep(tp_loop_poller *p)
{
    atomic_store(&pl.sleeping, 1);
    atomic_fetch_add(&pl.sleeps, 1);
    return atomic_load(&pl.flag) != 0;
}

static void
pl_after_sleep(tp_loop_poller *p)
{
    atomic_store(&pl.sleeping, 0);
}

static void
pl_fd_cb(tp_loop_fd *lfd, uint32_t ev)
{
    uint64_t v;
    while (read(pl.efd, &v, sizeof(v)) > 0) {
    }
}

static void
pl_start(void *arg)
{
    pl.p.lp_poll = pl_poll;
    pl.p.lp_prepare_sleep = pl_prepare_sleep;
    pl.p.lp_after_sleep = pl_after_sleep;
    pl.p.lp_spin_ns = 2000000; // 2 ms
    TP_CHECK_OK(tp__loop_fd_add(pl.l, &pl.lfd, pl.efd, TP_EV_READ, pl_fd_cb,
                                NULL, NULL),
                NULL);
    tp__loop_poller_start(pl.l, &pl.p);
}

static void
pl_stop(void *arg)
{
    tp__loop_poller_stop(pl.l, &pl.p);
    tp__loop_fd_remove(pl.l, &pl.lfd);
}

static double
cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
poller_spins_then_sleeps_one(tp_loop *l)
{
    memset(&pl, 0, sizeof(pl));
    pl.l = l;
    pl.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    tp__loop_call(l, pl_start, NULL);
    // While spinning, a flag set by another thread is seen without a wake.
    for (int i = 1; i <= 100; i++) {
        atomic_store(&pl.flag, 1);
        if (atomic_load(&pl.sleeping)) {
            uint64_t one = 1;
            TP_CHECK(write(pl.efd, &one, 8) == 8);
        }
        wait_until(&pl.seen, i, 5000);
    }
    // Idle: after the spin budget the loop sleeps and burns no CPU.
    usleep(20000);
    double c0 = cpu_seconds();
    usleep(300000);
    double used = cpu_seconds() - c0;
    TP_CHECKF(used < 0.03, "idle loop with a poller used %.3f s CPU in 0.3 s",
              used);
    TP_CHECK(atomic_load(&pl.sleeps) > 0);
    tp__loop_call(l, pl_stop, NULL);
    close(pl.efd);
}

static void
poller_spins_then_sleeps(void)
{
    each_backend(poller_spins_then_sleeps_one);
}

static void
idle_loop_no_cpu(void)
{
    tp_loop *a = make_loop(TP_IO_BACKEND_EPOLL);
    tp_loop *b = make_loop(TP_IO_BACKEND_URING);
    usleep(20000);
    double c0 = cpu_seconds();
    usleep(300000);
    double used = cpu_seconds() - c0;
    TP_CHECKF(used < 0.02, "idle loops used %.3f s CPU in 0.3 s", used);
    tp__loop_destroy(a);
    tp__loop_destroy(b);
}

static double cpu_seconds(void);

// With TP_LOOP_SPIN_US set the loop spins on its fds after activity, still
// sees every event, and sleeps once idle.
static void
spinning_loop_sleeps_when_idle_one(tp_loop *l)
{
    fd_readiness_one(l);
    usleep(20000);
    double c0 = cpu_seconds();
    usleep(300000);
    double used = cpu_seconds() - c0;
    TP_CHECKF(used < 0.03, "idle spinning loop used %.3f s CPU in 0.3 s", used);
}

static void
spinning_loop_sleeps_when_idle(void)
{
    test_spin_us = 500;
    each_backend(spinning_loop_sleeps_when_idle_one);
}

// Destroying a loop that is still spinning after activity stops it (the
// stop task runs inside the spin).
static void
spinning_loop_destroy_while_busy_one(tp_loop *l)
{
    posts_run_on_loop_in_order_one(l);
}

static void
spinning_loop_destroy_while_busy(void)
{
    test_spin_us = 100000;
    each_backend(spinning_loop_destroy_while_busy_one);
}

static void
backend_selection(void)
{
    char why[256] = "";
    bool uring = tp__loop_uring_viable(why, sizeof(why));
    tp_loop *l = make_loop(TP_IO_BACKEND_AUTO);
    TP_CHECK(strcmp(tp__loop_backend_name(l), uring ? "uring" : "epoll") == 0);
    tp__loop_destroy(l);
    if (!uring) {
        TP_CHECK(strlen(why) > 0);
        tp_config cfg;
        tp__config_defaults(&cfg);
        cfg.io_backend = TP_IO_BACKEND_URING;
        tp_error *err = NULL;
        TP_CHECK_EQ(tp__loop_create(&cfg, "x", &l, &err), TP_ENOTSUP);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "io_uring");
        tp_error_unref(err);
    }
}

// ---- aio completion rules
// ----------------------------------------------------

typedef struct dummy {
    tp_loop *l;
    tp_aio *pending;
    bool finish_inline;
    _Atomic int in_start;
} dummy;

static dummy dm;

typedef struct cb_rec {
    _Atomic int calls;
    _Atomic int inside_start;
    _Atomic int on_loop;
} cb_rec;

static cb_rec rec;

static void
rec_cb(void *arg)
{
    atomic_fetch_add(&rec.calls, 1);
    if (atomic_load(&dm.in_start)) {
        atomic_fetch_add(&rec.inside_start, 1);
    }
    if (tp__loop_on_thread(dm.l)) {
        atomic_fetch_add(&rec.on_loop, 1);
    }
}

static void
dummy_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    TP_CHECK(dm.pending == aio);
    dm.pending = NULL;
    tp__aio_finish(
        aio,
        tp__error_new(reason, 0, NULL, "dummy: %s", tp_status_name(reason)), 0);
}

static void
dummy_start(void *obj, tp_aio *aio)
{
    atomic_store(&dm.in_start, 1);
    if (tp__aio_begin(aio, dm.l, dummy_cancel, NULL)) {
        if (dm.finish_inline) {
            tp__aio_finish(aio, NULL, 42);
        } else {
            dm.pending = aio;
        }
    }
    atomic_store(&dm.in_start, 0);
}

static void
aio_rules_one(tp_loop *l)
{
    memset(&dm, 0, sizeof(dm));
    memset(&rec, 0, sizeof(rec));
    dm.l = l;
    tp_aio *aio;
    TP_CHECK_OK(tp_aio_create(rec_cb, NULL, &aio), NULL);

    // 1. Finished inside the start call: the callback still runs later,
    // exactly once, on the loop thread.
    dm.finish_inline = true;
    tp__aio_submit(aio, l, dummy_start, NULL);
    tp_aio_wait(aio);
    TP_CHECK_EQ(atomic_load(&rec.calls), 1);
    TP_CHECK_EQ(atomic_load(&rec.inside_start), 0);
    TP_CHECK_EQ(atomic_load(&rec.on_loop), 1);
    TP_CHECK_OK(tp_aio_status(aio), tp_aio_error(aio));
    TP_CHECK_EQ(tp_aio_count(aio), 42);

    // 2. Cancel from another thread: completes once with TP_ECANCELED.
    dm.finish_inline = false;
    tp__aio_submit(aio, l, dummy_start, NULL);
    usleep(10000);
    tp_aio_cancel(aio);
    tp_aio_cancel(aio); // twice is fine
    tp_aio_wait(aio);
    TP_CHECK_EQ(atomic_load(&rec.calls), 2);
    TP_CHECK_EQ(tp_aio_status(aio), TP_ECANCELED);

    // 3. Timeout: completes once with TP_ETIMEDOUT, not early.
    tp_aio_set_timeout(aio, 50);
    uint64_t t0 = tp__now_ns();
    tp__aio_submit(aio, l, dummy_start, NULL);
    tp_aio_wait(aio);
    uint64_t dt = (tp__now_ns() - t0) / 1000000u;
    TP_CHECK_EQ(atomic_load(&rec.calls), 3);
    TP_CHECK_EQ(tp_aio_status(aio), TP_ETIMEDOUT);
    TP_CHECKF(dt >= 49, "timed out after %llu ms", (unsigned long long)dt);
    tp_aio_set_timeout(aio, 0);

    // 4. Destroy with an operation pending: it completes (canceled) first.
    tp__aio_submit(aio, l, dummy_start, NULL);
    usleep(5000);
    tp_aio_destroy(aio);
    TP_CHECK_EQ(atomic_load(&rec.calls), 4);
    TP_CHECK_EQ(atomic_load(&rec.inside_start), 0);
}

static void
aio_completion_rules(void)
{
    each_backend(aio_rules_one);
}

// Destroying an aio whose callback resubmits it after every completion
// but TP_ECLOSED (a read loop that also retries after a cancel) still
// returns: once destruction began, submissions complete at once with
// TP_ECLOSED.
static tp_aio *rs_aio;
static _Atomic int rs_calls;

static void
rs_cb(void *arg)
{
    atomic_fetch_add(&rs_calls, 1);
    if (tp_aio_status(rs_aio) != TP_ECLOSED) {
        tp__aio_submit(rs_aio, dm.l, dummy_start, NULL);
    }
}

static void
aio_destroy_while_resubmitting_one(tp_loop *l)
{
    memset(&dm, 0, sizeof(dm));
    dm.l = l;
    atomic_store(&rs_calls, 0);
    TP_CHECK_OK(tp_aio_create(rs_cb, NULL, &rs_aio), NULL);
    tp__aio_submit(rs_aio, l, dummy_start, NULL);
    usleep(5000);
    tp_aio_destroy(rs_aio); // the harness deadline catches a hang
    TP_CHECK(atomic_load(&rs_calls) >= 1);
}

static void
aio_destroy_while_resubmitting(void)
{
    each_backend(aio_destroy_while_resubmitting_one);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(posts_run_on_loop_in_order),
    TP_TEST_CASE(defer_runs_after_handler),
    TP_TEST_CASE(timers_fire_in_order),
    TP_TEST_CASE(timer_armed_by_callback_fires),
    TP_TEST_CASE(fd_readiness),
    TP_TEST_CASE(poller_spins_then_sleeps),
    TP_TEST_CASE(idle_loop_no_cpu),
    TP_TEST_CASE(spinning_loop_sleeps_when_idle),
    TP_TEST_CASE(spinning_loop_destroy_while_busy),
    TP_TEST_CASE(backend_selection),
    TP_TEST_CASE(aio_completion_rules),
    TP_TEST_CASE_T(aio_destroy_while_resubmitting, 10),
};

TP_TEST_MAIN(cases)
