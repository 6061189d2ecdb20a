/* SPDX-License-Identifier: Apache-2.0 */
/* loop.h - the loop thread: a reactor with two backends (epoll and
 * io_uring via liburing), cross-thread posting, a deferred-completion
 * queue, timers and pollers (spin-then-sleep).
 *
 * Threading: a loop owns one thread. Everything registered with the loop
 * (fds, timers, pollers) is touched only on that thread; functions marked
 * "loop thread" assert it. Other threads hand work over with tp__loop_post,
 * which queues the task and wakes the loop through an eventfd only if the
 * loop is asleep (the Dekker pattern on l_sleeping, so a busy loop takes
 * posts without a syscall).
 *
 * Readiness model: both backends deliver edge-style readiness: a callback
 * fires when an fd becomes readable or writable; handlers do I/O until
 * EAGAIN. The epoll backend uses EPOLLET; the io_uring backend uses
 * multishot IORING_OP_POLL_ADD and waits with io_uring_wait_cqe_timeout.
 */
#ifndef TP_CORE_LOOP_H
#define TP_CORE_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "error.h"
#include "platform.h"

typedef struct tp_loop tp_loop;

typedef void (*tp_task_fn)(void *arg);

// A unit of work for a loop or a pool. Caller storage; must stay valid
// until it has run. A task may be queued on one queue at a time.
typedef struct tp_task {
    struct tp_task *t_next;
    tp_task_fn t_fn;
    void *t_arg;
} tp_task;

static inline void
tp__task_init(tp_task *t, tp_task_fn fn, void *arg)
{
    t->t_next = NULL;
    t->t_fn = fn;
    t->t_arg = arg;
}

// Readiness bits.
#define TP_EV_READ  0x1u
#define TP_EV_WRITE 0x2u
#define TP_EV_ERROR 0x4u // error or hang-up; handlers then read to learn why
// The peer shut down its side (or the fd hung up) at or before the time of
// this event (EPOLLRDHUP/EPOLLHUP, POLLRDHUP/POLLHUP). Together with the
// edge semantics this lets a reader treat a short read as "drained": any
// later arrival, data or FIN, brings a new event; one that came earlier is
// flagged here.
#define TP_EV_HUP 0x8u

typedef struct tp_loop_fd tp_loop_fd;
typedef void (*tp_loop_fd_cb)(tp_loop_fd *lfd, uint32_t events);

// An fd watched by a loop. Caller storage; valid until removed.
struct tp_loop_fd {
    int lf_fd;
    uint32_t lf_events;
    tp_loop_fd_cb lf_cb;
    void *lf_arg;
    // backend private
    uint64_t lf_token;
    bool lf_active;
};

typedef struct tp_timer tp_timer;
typedef void (*tp_timer_cb)(tp_timer *t, void *arg);

// A one-shot timer. Caller storage; tp__timer_init before first use.
struct tp_timer {
    uint64_t tm_deadline_ns;
    tp_timer_cb tm_cb;
    void *tm_arg;
    size_t tm_index; // position in the heap, SIZE_MAX when not armed
};

typedef struct tp_loop_poller tp_loop_poller;

// A poller is checked in a tight loop while the loop spins (before it
// sleeps): the shared-memory transport uses it to see ring updates without
// any syscall. Caller storage; loop thread only.
struct tp_loop_poller {
    // Returns true if it made progress (the loop then keeps spinning).
    bool (*lp_poll)(tp_loop_poller *p);
    // Called once before the loop sleeps: arm the wake-up (e.g. set the
    // "consumer sleeping" flag in shared memory), then re-check. Returns
    // true if work arrived meanwhile (the loop then does not sleep).
    bool (*lp_prepare_sleep)(tp_loop_poller *p);
    // Called after the loop woke (or decided not to sleep): disarm.
    void (*lp_after_sleep)(tp_loop_poller *p);
    // How long to spin, in ns, before sleeping while this poller is active.
    uint64_t lp_spin_ns;
    void *lp_arg;
    // loop private
    struct tp_loop_poller *lp_next;
    struct tp_loop_poller *lp_prev;
    bool lp_active;
};

// Creates a loop and starts its thread (named "tp-<name>"). The backend
// follows cfg->io_backend: auto probes io_uring and falls back to epoll
// with a logged reason (TP-LOOP-BACKEND: seccomp, an old kernel, valgrind);
// uring fails with the reason if io_uring is unusable.
tp_status tp__loop_create(const tp_config *cfg, const char *name,
                          tp_loop **loop_p, tp_error **err_p);
// Stops the thread after running every task posted so far, then frees.
// Everything registered must have been removed. Not from the loop thread.
void tp__loop_destroy(tp_loop *loop);
// "epoll" or "uring".
const char *tp__loop_backend_name(const tp_loop *loop);
// True if the caller runs on @loop's thread.
bool tp__loop_on_thread(const tp_loop *loop);
#define TP_ASSERT_ON_LOOP(loop) TP_ASSERT(tp__loop_on_thread(loop))
// True if the caller runs on the thread of any loop (where nothing may
// block: work that may wait is handed to a pool instead).
bool tp__loop_any_on_thread(void);
// Probes whether io_uring works here; on false, @why says why. Under
// valgrind it does not (see tp__loop_under_valgrind).
bool tp__loop_uring_viable(char *why, size_t why_len);
// True when the process runs under valgrind, which does not implement
// io_uring's shared rings (a loop on io_uring hangs there): io_uring is
// then reported not viable, so the auto backend picks epoll and says why.
bool tp__loop_under_valgrind(void);

// Any thread: run @task on the loop thread, later (never inside this call).
// Tasks posted by one thread run in the order posted.
void tp__loop_post(tp_loop *loop, tp_task *task);
// Loop thread: true if tasks posted by other threads are waiting to run.
// A submission made on the loop thread then queues behind them (posting
// instead of running inline), so operations start in the order they were
// submitted, whichever threads submitted them.
bool tp__loop_has_pending_posts(tp_loop *loop);
// Loop thread: run @task after the current handler returns, before the
// loop waits again. This is how completions avoid running inside the call
// that started an operation.
void tp__loop_defer(tp_loop *loop, tp_task *task);
// Loop thread: true if deferred tasks wait to run (a poller that made
// progress may return at once, so that completions run before it polls
// on).
bool tp__loop_has_deferred(const tp_loop *loop);
// Any thread: runs @fn(@arg) on the loop thread and waits for it to return
// (inline if already on the loop thread).
void tp__loop_call(tp_loop *loop, tp_task_fn fn, void *arg);

// Loop thread: watch @fd for @events (TP_EV_READ | TP_EV_WRITE).
tp_status tp__loop_fd_add(tp_loop *loop, tp_loop_fd *lfd, int fd,
                          uint32_t events, tp_loop_fd_cb cb, void *arg,
                          tp_error **err_p);
// Loop thread: stop watching; no callback for @lfd runs after this returns.
// Does not close the fd.
void tp__loop_fd_remove(tp_loop *loop, tp_loop_fd *lfd);

void tp__timer_init(tp_timer *t, tp_timer_cb cb, void *arg);
// Loop thread: (re)arm @t to fire at @deadline_ns (tp__now_ns() clock).
void tp__timer_start(tp_loop *loop, tp_timer *t, uint64_t deadline_ns);
// Loop thread: disarm; the callback will not run. Idempotent.
void tp__timer_stop(tp_loop *loop, tp_timer *t);
static inline bool
tp__timer_armed(const tp_timer *t)
{
    return t->tm_index != (size_t)-1;
}

// Loop thread: start/stop spinning on @p. Idempotent.
void tp__loop_poller_start(tp_loop *loop, tp_loop_poller *p);
void tp__loop_poller_stop(tp_loop *loop, tp_loop_poller *p);

#endif
