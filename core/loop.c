// SPDX-License-Identifier: Apache-2.0
// loop.c - the loop thread: posted tasks, deferred completions, timers,
// pollers (spin, then sleep) and the I/O backend (epoll or io_uring).
//
// Locks: l_post_mtx only (protects the posted-task queue). It is never held
// while running a task or a callback.

#include "loop_int.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "alloc.h"
#include "log.h"

// valgrind.h is a header of macros only (no library); when it is installed
// its client request tells for sure whether we run under valgrind.
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define LOOP_HAVE_VALGRIND_H 1
#endif
#endif
#ifndef LOOP_HAVE_VALGRIND_H
#define LOOP_HAVE_VALGRIND_H 0
#endif

struct tp_loop {
    const tp_loop_backend *l_be;
    void *l_be_state;
    char l_name[32];
    tp_config l_cfg;
    pthread_t l_thread;

    // Posted tasks (any thread -> loop).
    tp_mtx l_post_mtx;
    tp_task *l_post_head;
    tp_task *l_post_tail;
    _Atomic int l_post_pending; // 1 if l_post_head may be non-NULL
    _Atomic int l_sleeping;     // 1 while the loop may block in wait
    _Atomic bool l_stop;
    int l_wake_fd;
    tp_loop_fd l_wake_lfd;

    // Loop-thread-only state.
    tp_task *l_batch; // posted tasks taken off the queue, not yet run
    tp_task *l_defer_head;
    tp_task *l_defer_tail;
    tp_timer **l_heap;
    size_t l_heap_len;
    size_t l_heap_cap;
    tp_loop_poller *l_pollers;
    uint64_t l_spin_ns; // TP_LOOP_SPIN_US
};

static _Thread_local tp_loop *loop_current;

void *
tp__loop_backend_state(tp_loop *loop)
{
    return loop->l_be_state;
}

void
tp__loop_set_backend_state(tp_loop *loop, void *state)
{
    loop->l_be_state = state;
}

bool
tp__loop_on_thread(const tp_loop *loop)
{
    return loop_current == loop;
}

bool
tp__loop_any_on_thread(void)
{
    return loop_current != NULL;
}

const char *
tp__loop_backend_name(const tp_loop *loop)
{
    return loop->l_be->name;
}

bool
tp__loop_under_valgrind(void)
{
#if LOOP_HAVE_VALGRIND_H
    if (RUNNING_ON_VALGRIND) {
        return true;
    }
#endif
    // Without the header: valgrind preloads its vgpreload_*.so objects
    // into every program it runs.
    const char *pre = getenv("LD_PRELOAD");
    return pre != NULL && strstr(pre, "vgpreload") != NULL;
}

bool
tp__loop_uring_viable(char *why, size_t why_len)
{
#if TP_HAVE_URING
    return tp__loop_uring_probe(why, why_len);
#else
    snprintf(why, why_len, "built without liburing");
    return false;
#endif
}

// ---- timers: a binary min-heap of armed timers --------------------------

static void
heap_swap(tp_loop *l, size_t a, size_t b)
{
    tp_timer *t = l->l_heap[a];
    l->l_heap[a] = l->l_heap[b];
    l->l_heap[b] = t;
    l->l_heap[a]->tm_index = a;
    l->l_heap[b]->tm_index = b;
}

static void
heap_up(tp_loop *l, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (l->l_heap[p]->tm_deadline_ns <= l->l_heap[i]->tm_deadline_ns) {
            break;
        }
        heap_swap(l, i, p);
        i = p;
    }
}

static void
heap_down(tp_loop *l, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= l->l_heap_len) {
            break;
        }
        if (c + 1 < l->l_heap_len &&
            l->l_heap[c + 1]->tm_deadline_ns < l->l_heap[c]->tm_deadline_ns) {
            c++;
        }
        if (l->l_heap[i]->tm_deadline_ns <= l->l_heap[c]->tm_deadline_ns) {
            break;
        }
        heap_swap(l, i, c);
        i = c;
    }
}

void
tp__timer_init(tp_timer *t, tp_timer_cb cb, void *arg)
{
    t->tm_deadline_ns = 0;
    t->tm_cb = cb;
    t->tm_arg = arg;
    t->tm_index = (size_t)-1;
}

void
tp__timer_stop(tp_loop *l, tp_timer *t)
{
    if (!tp__timer_armed(t)) {
        return;
    }
    TP_ASSERT_ON_LOOP(l);
    size_t i = t->tm_index;
    size_t last = l->l_heap_len - 1;
    if (i != last) {
        heap_swap(l, i, last);
    }
    l->l_heap_len--;
    t->tm_index = (size_t)-1;
    if (i < l->l_heap_len) {
        heap_down(l, i);
        heap_up(l, i);
    }
}

void
tp__timer_start(tp_loop *l, tp_timer *t, uint64_t deadline_ns)
{
    TP_ASSERT_ON_LOOP(l);
    tp__timer_stop(l, t);
    if (l->l_heap_len == l->l_heap_cap) {
        size_t cap = l->l_heap_cap ? l->l_heap_cap * 2 : 64;
        tp_timer **h = tp__realloc(l->l_heap, cap * sizeof(*h));
        // Timers are armed from completion paths that cannot fail; running
        // out of memory for a 64-pointer array is not recoverable here.
        TP_ASSERT(h != NULL);
        l->l_heap = h;
        l->l_heap_cap = cap;
    }
    t->tm_deadline_ns = deadline_ns;
    t->tm_index = l->l_heap_len;
    l->l_heap[l->l_heap_len++] = t;
    heap_up(l, t->tm_index);
}

// ns until the earliest timer is due (0 if due, UINT64_MAX if none).
static uint64_t
loop_next_timeout(const tp_loop *l)
{
    if (l->l_heap_len == 0) {
        return UINT64_MAX;
    }
    uint64_t now = tp__now_ns();
    uint64_t due = l->l_heap[0]->tm_deadline_ns;
    return due > now ? due - now : 0;
}

// Fires due timers; returns ns until the next one (UINT64_MAX if none).
static uint64_t
loop_run_timers(tp_loop *l)
{
    if (l->l_heap_len == 0) {
        return UINT64_MAX;
    }
    uint64_t now = tp__now_ns();
    while (l->l_heap_len > 0) {
        tp_timer *t = l->l_heap[0];
        if (t->tm_deadline_ns > now) {
            return t->tm_deadline_ns - now;
        }
        tp__timer_stop(l, t);
        t->tm_cb(t, t->tm_arg);
    }
    return UINT64_MAX;
}

// ---- tasks ---------------------------------------------------------------

static void
loop_wake(tp_loop *l)
{
    uint64_t one = 1;
    ssize_t n = write(l->l_wake_fd, &one, sizeof(one));
    TP_UNUSED(n); // EAGAIN means the counter is already non-zero: awake
}

void
tp__loop_post(tp_loop *l, tp_task *task)
{
    task->t_next = NULL;
    tp__mtx_lock(&l->l_post_mtx);
    if (l->l_post_tail != NULL) {
        l->l_post_tail->t_next = task;
    } else {
        l->l_post_head = task;
    }
    l->l_post_tail = task;
    tp__mtx_unlock(&l->l_post_mtx);
    // Dekker with the loop's sleep check: we publish "pending" then read
    // "sleeping"; the loop publishes "sleeping" then reads "pending".
    atomic_store_explicit(&l->l_post_pending, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&l->l_sleeping, memory_order_seq_cst)) {
        loop_wake(l);
    }
}

void
tp__loop_defer(tp_loop *l, tp_task *task)
{
    TP_ASSERT_ON_LOOP(l);
    task->t_next = NULL;
    if (l->l_defer_tail != NULL) {
        l->l_defer_tail->t_next = task;
    } else {
        l->l_defer_head = task;
    }
    l->l_defer_tail = task;
}

bool
tp__loop_has_deferred(const tp_loop *l)
{
    TP_ASSERT_ON_LOOP(l);
    return l->l_defer_head != NULL;
}

typedef struct loop_call {
    tp_task t;
    tp_task_fn fn;
    void *arg;
    tp_mtx mtx;
    tp_cv cv;
    bool done;
} loop_call;

static void
loop_call_run(void *arg)
{
    loop_call *c = arg;
    c->fn(c->arg);
    tp__mtx_lock(&c->mtx);
    c->done = true;
    tp__cv_signal(&c->cv);
    tp__mtx_unlock(&c->mtx);
}

void
tp__loop_call(tp_loop *l, tp_task_fn fn, void *arg)
{
    if (tp__loop_on_thread(l)) {
        fn(arg);
        return;
    }
    loop_call c = {.fn = fn, .arg = arg, .done = false};
    tp__mtx_init(&c.mtx);
    tp__cv_init(&c.cv);
    tp__task_init(&c.t, loop_call_run, &c);
    tp__loop_post(l, &c.t);
    tp__mtx_lock(&c.mtx);
    while (!c.done) {
        tp__cv_wait(&c.cv, &c.mtx);
    }
    tp__mtx_unlock(&c.mtx);
    tp__cv_fini(&c.cv);
    tp__mtx_fini(&c.mtx);
}

// Runs deferred tasks until the queue is empty (tasks may defer more).
static bool
loop_run_deferred(tp_loop *l)
{
    bool ran = false;
    while (l->l_defer_head != NULL) {
        tp_task *t = l->l_defer_head;
        l->l_defer_head = t->t_next;
        if (l->l_defer_head == NULL) {
            l->l_defer_tail = NULL;
        }
        t->t_next = NULL;
        t->t_fn(t->t_arg);
        ran = true;
    }
    return ran;
}

static bool
loop_run_posted(tp_loop *l)
{
    if (!atomic_load_explicit(&l->l_post_pending, memory_order_acquire)) {
        return false;
    }
    atomic_store_explicit(&l->l_post_pending, 0, memory_order_seq_cst);
    tp__mtx_lock(&l->l_post_mtx);
    tp_task *t = l->l_post_head;
    l->l_post_head = l->l_post_tail = NULL;
    tp__mtx_unlock(&l->l_post_mtx);
    bool ran = t != NULL;
    while (t != NULL) {
        l->l_batch = t->t_next;
        t->t_next = NULL;
        t->t_fn(t->t_arg);
        loop_run_deferred(l);
        t = l->l_batch;
    }
    return ran;
}

bool
tp__loop_has_pending_posts(tp_loop *l)
{
    TP_ASSERT_ON_LOOP(l);
    return l->l_batch != NULL ||
           atomic_load_explicit(&l->l_post_pending, memory_order_acquire);
}

static void
loop_wake_cb(tp_loop_fd *lfd, uint32_t events)
{
    tp_loop *l = lfd->lf_arg;
    uint64_t v;
    while (read(l->l_wake_fd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
    }
    loop_run_posted(l);
}

// ---- pollers -------------------------------------------------------------

void
tp__loop_poller_start(tp_loop *l, tp_loop_poller *p)
{
    TP_ASSERT_ON_LOOP(l);
    if (p->lp_active) {
        return;
    }
    p->lp_active = true;
    p->lp_prev = NULL;
    p->lp_next = l->l_pollers;
    if (l->l_pollers != NULL) {
        l->l_pollers->lp_prev = p;
    }
    l->l_pollers = p;
}

void
tp__loop_poller_stop(tp_loop *l, tp_loop_poller *p)
{
    TP_ASSERT_ON_LOOP(l);
    if (!p->lp_active) {
        return;
    }
    if (p->lp_prev != NULL) {
        p->lp_prev->lp_next = p->lp_next;
    } else {
        l->l_pollers = p->lp_next;
    }
    if (p->lp_next != NULL) {
        p->lp_next->lp_prev = p->lp_prev;
    }
    p->lp_next = p->lp_prev = NULL;
    p->lp_active = false;
}

// Polls every active poller once; a poller may stop itself (or others)
// while polled, so the next pointer is read first and re-validated.
static bool
loop_poll_all(tp_loop *l, uint64_t *spin_ns_p)
{
    bool progress = false;
    uint64_t spin = 0;
    tp_loop_poller *p = l->l_pollers;
    while (p != NULL) {
        tp_loop_poller *next = p->lp_next;
        spin = TP_MAX(spin, p->lp_spin_ns);
        if (p->lp_poll(p)) {
            progress = true;
            loop_run_deferred(l);
            // The list may have changed under us; restart next round.
            break;
        }
        p = next;
    }
    *spin_ns_p = spin;
    return progress;
}

// Spins before the loop sleeps, while anything happened within the spin
// budget: the pollers' budget (shm rings, checked every round with no
// syscall) and TP_LOOP_SPIN_US for fds (checked every round with a
// zero-timeout wait when there are no pollers, every 64 rounds otherwise).
// Spinning keeps a busy connection from paying a sleep and a wake-up per
// message; the budget bounds what an idle loop burns.
static void
loop_spin(tp_loop *l)
{
    uint64_t last_progress = tp__now_ns();
    unsigned round = 0;
    unsigned idle = 0; // rounds since the last progress
    while (!atomic_load_explicit(&l->l_stop, memory_order_relaxed)) {
        uint64_t budget = l->l_spin_ns;
        bool progress = false;
        round++;
        if (l->l_pollers != NULL) {
            uint64_t poll_spin = 0;
            progress = loop_poll_all(l, &poll_spin);
            budget = TP_MAX(budget, poll_spin);
        }
        if (budget == 0) {
            return;
        }
        if (l->l_pollers == NULL || (round & 63) == 0) {
            if (l->l_be->wait(l, 0) > 0) {
                progress = true;
            }
            loop_run_deferred(l);
            loop_run_timers(l);
            loop_run_deferred(l);
        }
        if (atomic_load_explicit(&l->l_post_pending, memory_order_relaxed)) {
            loop_run_posted(l);
            progress = true;
        }
        uint64_t now = tp__now_ns();
        if (progress) {
            last_progress = now;
            idle = 0;
        } else if (now - last_progress >= budget) {
            return;
        } else if (++idle == 1 || (idle & 7) == 0) {
            // Give the core away if another thread can use it (the peer's
            // loop, a lane copying, the pool thread we just handed a
            // request to): returns at once on an idle core. At once after
            // work, since that work usually woke somebody up (on 2 vCPUs
            // an RPC round trip has 4 spinning threads: yielding at once
            // cut its context switches per call from 12 to N and its
            // latency from 8 to M us), then every 8 rounds.
            sched_yield();
        }
        tp__cpu_relax();
    }
}

// Returns true if the loop may sleep: no posts, no poller had work.
static bool
loop_prepare_sleep(tp_loop *l)
{
    atomic_store_explicit(&l->l_sleeping, 1, memory_order_seq_cst);
    bool work =
        atomic_load_explicit(&l->l_post_pending, memory_order_seq_cst) != 0;
    for (tp_loop_poller *p = l->l_pollers; p != NULL; p = p->lp_next) {
        if (p->lp_prepare_sleep(p)) {
            work = true;
        }
    }
    // A poller's last check may have completed operations (deferred).
    return !work && l->l_defer_head == NULL;
}

static void
loop_after_sleep(tp_loop *l)
{
    atomic_store_explicit(&l->l_sleeping, 0, memory_order_relaxed);
    for (tp_loop_poller *p = l->l_pollers; p != NULL;) {
        tp_loop_poller *next = p->lp_next;
        p->lp_after_sleep(p);
        p = next;
    }
}

static void *
loop_thread_main(void *arg)
{
    tp_loop *l = arg;
    char tname[40];
    snprintf(tname, sizeof(tname), "tp-%s", l->l_name);
    tp__thread_set_name(tname); // truncated to 15 bytes by the kernel
    loop_current = l;
    if (l->l_be->thread_start != NULL) {
        l->l_be->thread_start(l);
    }
    for (;;) {
        loop_run_posted(l);
        loop_run_deferred(l);
        loop_run_timers(l);
        loop_run_deferred(l);
        if (atomic_load_explicit(&l->l_stop, memory_order_acquire) &&
            !atomic_load_explicit(&l->l_post_pending, memory_order_acquire)) {
            break;
        }
        if (l->l_pollers != NULL || l->l_spin_ns > 0) {
            loop_spin(l);
            loop_run_timers(l);
            loop_run_deferred(l);
        }
        if (l->l_defer_head != NULL ||
            atomic_load_explicit(&l->l_stop, memory_order_acquire)) {
            continue; // the spin may have run the stop task
        }
        // The deadline is read here, after the last callbacks ran: one of
        // them may have armed a timer (an op resubmitted with a timeout).
        uint64_t timeout = loop_next_timeout(l);
        if (timeout == 0) {
            continue;
        }
        if (!loop_prepare_sleep(l)) {
            timeout = 0;
        }
        l->l_be->wait(l, timeout);
        loop_after_sleep(l);
        loop_run_deferred(l);
    }
    loop_current = NULL;
    return NULL;
}

// ---- create / destroy ----------------------------------------------------

static const tp_loop_backend *
loop_pick_backend(const tp_config *cfg, const char *name, tp_error **err_p)
{
    char why[256] = "";
    switch (cfg->io_backend) {
    case TP_IO_BACKEND_EPOLL:
        return &tp__loop_epoll_backend;
    case TP_IO_BACKEND_URING:
#if TP_HAVE_URING
        if (tp__loop_uring_probe(why, sizeof(why))) {
            return &tp__loop_uring_backend;
        }
#else
        snprintf(why, sizeof(why), "built without liburing");
#endif
        tp__error_set(err_p, TP_ENOTSUP,
                      "loop %s: TP_IO_BACKEND=uring but io_uring is not "
                      "usable: %s",
                      name, why);
        return NULL;
    default:
#if TP_HAVE_URING
        if (tp__loop_uring_probe(why, sizeof(why))) {
            return &tp__loop_uring_backend;
        }
#else
        snprintf(why, sizeof(why), "built without liburing");
#endif
        TP_LOG_INFO("TP-LOOP-BACKEND",
                    "loop %s: io_uring not usable (%s); using epoll", name,
                    why);
        return &tp__loop_epoll_backend;
    }
}

tp_status
tp__loop_create(const tp_config *cfg, const char *name, tp_loop **loop_p,
                tp_error **err_p)
{
    tp__log_init();
    const tp_loop_backend *be = loop_pick_backend(cfg, name, err_p);
    if (be == NULL) {
        return TP_ENOTSUP;
    }
    tp_loop *l = tp__zalloc(sizeof(*l));
    if (l == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "loop %s: out of memory", name);
    }
    tp_status st;
    l->l_be = be;
    l->l_cfg = *cfg;
    l->l_spin_ns =
        (uint64_t)(cfg->loop_spin_us > 0 ? cfg->loop_spin_us : 0) * 1000u;
    snprintf(l->l_name, sizeof(l->l_name), "%s", name);
    tp__mtx_init(&l->l_post_mtx);
    l->l_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (l->l_wake_fd < 0) {
        st = tp__error_errno(err_p, errno, "loop %s: eventfd", name);
        goto fail_eventfd;
    }
    st = be->init(l, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "loop %s", name);
        goto fail_backend;
    }
    // The wake fd is registered before the thread starts; fd_add asserts
    // the loop thread, so pretend to be it for this one call.
    tp_loop *prev = loop_current;
    loop_current = l;
    st = tp__loop_fd_add(l, &l->l_wake_lfd, l->l_wake_fd, TP_EV_READ,
                         loop_wake_cb, l, err_p);
    loop_current = prev;
    if (st != TP_OK) {
        goto fail_wake;
    }
    int rv = pthread_create(&l->l_thread, NULL, loop_thread_main, l);
    if (rv != 0) {
        st = tp__error_errno(err_p, rv, "loop %s: pthread_create", name);
        goto fail_thread;
    }
    TP_LOG_DEBUG("TP-LOOP-START", "loop %s: started with backend %s", name,
                 be->name);
    *loop_p = l;
    return TP_OK;

fail_thread:
fail_wake:
    be->fini(l);
fail_backend:
    close(l->l_wake_fd);
fail_eventfd:
    tp__mtx_fini(&l->l_post_mtx);
    tp__free(l);
    return st;
}

static void
loop_stop_task(void *arg)
{
    tp_loop *l = arg;
    tp__loop_fd_remove(l, &l->l_wake_lfd);
    atomic_store_explicit(&l->l_stop, true, memory_order_release);
}

void
tp__loop_destroy(tp_loop *l)
{
    if (l == NULL) {
        return;
    }
    TP_ASSERT(!tp__loop_on_thread(l));
    tp_task stop;
    tp__task_init(&stop, loop_stop_task, l);
    tp__loop_post(l, &stop);
    pthread_join(l->l_thread, NULL);
    TP_ASSERT(l->l_heap_len == 0);
    TP_ASSERT(l->l_pollers == NULL);
    l->l_be->fini(l);
    close(l->l_wake_fd);
    tp__mtx_fini(&l->l_post_mtx);
    tp__free(l->l_heap);
    tp__free(l);
}

// ---- fds -------------------------------------------------------------------

tp_status
tp__loop_fd_add(tp_loop *l, tp_loop_fd *lfd, int fd, uint32_t events,
                tp_loop_fd_cb cb, void *arg, tp_error **err_p)
{
    TP_ASSERT_ON_LOOP(l);
    lfd->lf_fd = fd;
    lfd->lf_events = events;
    lfd->lf_cb = cb;
    lfd->lf_arg = arg;
    lfd->lf_token = 0;
    tp_status st = l->l_be->fd_add(l, lfd, err_p);
    lfd->lf_active = st == TP_OK;
    return st;
}

void
tp__loop_fd_remove(tp_loop *l, tp_loop_fd *lfd)
{
    TP_ASSERT_ON_LOOP(l);
    if (!lfd->lf_active) {
        return;
    }
    l->l_be->fd_remove(l, lfd);
    lfd->lf_active = false;
}
