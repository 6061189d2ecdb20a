// SPDX-License-Identifier: Apache-2.0
// loop_uring.c - the io_uring backend (liburing): multishot
// IORING_OP_POLL_ADD gives edge-style readiness like EPOLLET; waiting and
// submitting are one syscall (io_uring_submit_and_wait_timeout).
//
// fds are named in user_data by a token (slot index | generation << 32),
// never by pointer, so a completion that arrives after its fd was removed
// (and its tp_loop_fd freed) is recognised as stale and dropped.

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "alloc.h"
#include "loop_int.h"

#define URING_ENTRIES   512
#define URING_IGNORE    UINT64_MAX
#define URING_POLL_MASK (POLLIN | POLLOUT | POLLRDHUP | POLLERR | POLLHUP)

typedef struct uring_slot {
    tp_loop_fd *us_lfd;
    uint32_t us_gen;
    uint32_t us_next_free;
} uring_slot;

typedef struct uring_state {
    struct io_uring ur_ring;
    uring_slot *ur_slots;
    uint32_t ur_nslots;
    uint32_t ur_free; // head of the free list, UINT32_MAX if none
    bool ur_disabled; // created disabled, enabled by the loop thread
} uring_state;

static pthread_once_t uring_probe_once = PTHREAD_ONCE_INIT;
static bool uring_probe_ok;
static bool uring_defer_ok; // SINGLE_ISSUER|DEFER_TASKRUN|R_DISABLED work

#define URING_DEFER_FLAGS                                                      \
    (IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |                 \
     IORING_SETUP_R_DISABLED)

static long
uring_enable(int ring_fd)
{
    // io_uring_enable_rings() is declared by liburing 2.3 but not
    // exported by its shared library: call the syscall.
    return syscall(__NR_io_uring_register, ring_fd,
                   IORING_REGISTER_ENABLE_RINGS, NULL, 0);
}
static char uring_probe_why[200];

static void
uring_probe_run(void)
{
    if (tp__loop_under_valgrind()) {
        // Valgrind does not see the kernel fill the shared rings: the
        // probe itself would wait forever for its first completion.
        snprintf(uring_probe_why, sizeof(uring_probe_why),
                 "running under valgrind, which does not support io_uring");
        return;
    }
    struct io_uring ring;
    int rv = io_uring_queue_init(4, &ring, 0);
    if (rv < 0) {
        snprintf(uring_probe_why, sizeof(uring_probe_why),
                 "io_uring_queue_init: %s (seccomp or an old kernel?)",
                 strerror(-rv));
        return;
    }
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct io_uring_probe *probe = io_uring_get_probe_ring(&ring);
    if (probe == NULL ||
        !io_uring_opcode_supported(probe, IORING_OP_POLL_ADD) ||
        !io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL)) {
        snprintf(uring_probe_why, sizeof(uring_probe_why),
                 "IORING_OP_POLL_ADD or IORING_OP_ASYNC_CANCEL not supported");
        goto out;
    }
    // A real round: multishot poll on an eventfd must fire and stay armed.
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_poll_multishot(sqe, efd, POLLIN);
    io_uring_sqe_set_data64(sqe, 1);
    uint64_t one = 1;
    if (write(efd, &one, sizeof(one)) != sizeof(one)) {
        snprintf(uring_probe_why, sizeof(uring_probe_why), "eventfd write");
        goto out;
    }
    struct __kernel_timespec ts = {.tv_sec = 1, .tv_nsec = 0};
    struct io_uring_cqe *cqe = NULL;
    rv = io_uring_submit_and_wait_timeout(&ring, &cqe, 1, &ts, NULL);
    if (rv < 0 || cqe == NULL) {
        snprintf(uring_probe_why, sizeof(uring_probe_why),
                 "multishot poll did not complete: %s",
                 strerror(rv < 0 ? -rv : ETIMEDOUT));
        goto out;
    }
    if (cqe->res < 0 || !(cqe->res & POLLIN) ||
        !(cqe->flags & IORING_CQE_F_MORE)) {
        snprintf(uring_probe_why, sizeof(uring_probe_why),
                 "multishot poll unsupported (res %d, flags 0x%x)", cqe->res,
                 cqe->flags);
        goto out;
    }
    uring_probe_ok = true;
    // The preferred ring set-up (see uring_init): created disabled, then
    // enabled by its one issuer. Kernels before 6.1, or filters that block
    // io_uring_register, refuse it: then a plain ring.
    struct io_uring dring;
    if (io_uring_queue_init(4, &dring, URING_DEFER_FLAGS) == 0) {
        uring_defer_ok = uring_enable(dring.ring_fd) == 0;
        io_uring_queue_exit(&dring);
    }
out:
    if (probe != NULL) {
        io_uring_free_probe(probe);
    }
    if (efd >= 0) {
        close(efd);
    }
    io_uring_queue_exit(&ring);
}

bool
tp__loop_uring_probe(char *why, size_t why_len)
{
    pthread_once(&uring_probe_once, uring_probe_run);
    if (!uring_probe_ok && why != NULL) {
        snprintf(why, why_len, "%s", uring_probe_why);
    }
    return uring_probe_ok;
}

static tp_status
uring_init(tp_loop *loop, tp_error **err_p)
{
    uring_state *s = tp__zalloc(sizeof(*s));
    if (s == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "io_uring: out of memory");
    }
    // The loop thread is the ring's only user: SINGLE_ISSUER with
    // DEFER_TASKRUN (Linux 6.1+) runs completion work only when the loop
    // asks for events, which is cheaper and, while the loop spins, prompt.
    // The ring starts disabled and is enabled on the loop thread
    // (uring_thread_start), which makes that thread its issuer. Older
    // kernels reject the flags: then a plain ring.
    int rv = -EINVAL;
    tp__loop_uring_probe(NULL, 0);
    if (uring_defer_ok) {
        rv = io_uring_queue_init(URING_ENTRIES, &s->ur_ring, URING_DEFER_FLAGS);
        s->ur_disabled = rv == 0;
    }
    if (rv != 0) {
        rv = io_uring_queue_init(URING_ENTRIES, &s->ur_ring, 0);
    }
    if (rv < 0) {
        tp__free(s);
        return tp__error_errno(err_p, -rv, "io_uring: io_uring_queue_init");
    }
    s->ur_free = UINT32_MAX;
    tp__loop_set_backend_state(loop, s);
    return TP_OK;
}

static void
uring_thread_start(tp_loop *loop)
{
    uring_state *s = tp__loop_backend_state(loop);
    if (s->ur_disabled) {
        // The probe enabled a ring the same way, so this cannot fail
        // unless the process changed its seccomp filter since.
        long rv = uring_enable(s->ur_ring.ring_fd);
        TP_ASSERT(rv == 0);
        s->ur_disabled = false;
    }
}

static void
uring_fini(tp_loop *loop)
{
    uring_state *s = tp__loop_backend_state(loop);
    io_uring_queue_exit(&s->ur_ring);
    tp__free(s->ur_slots);
    tp__free(s);
}

static struct io_uring_sqe *
uring_sqe(uring_state *s)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ur_ring);
    while (sqe == NULL) {
        io_uring_submit(&s->ur_ring);
        sqe = io_uring_get_sqe(&s->ur_ring);
    }
    return sqe;
}

static void
uring_arm(uring_state *s, tp_loop_fd *lfd)
{
    struct io_uring_sqe *sqe = uring_sqe(s);
    io_uring_prep_poll_multishot(sqe, lfd->lf_fd, URING_POLL_MASK);
    io_uring_sqe_set_data64(sqe, lfd->lf_token);
}

static tp_status
uring_fd_add(tp_loop *loop, tp_loop_fd *lfd, tp_error **err_p)
{
    uring_state *s = tp__loop_backend_state(loop);
    if (s->ur_free == UINT32_MAX) {
        uint32_t n = s->ur_nslots ? s->ur_nslots * 2 : 64;
        uring_slot *ns = tp__realloc(s->ur_slots, n * sizeof(*ns));
        if (ns == NULL) {
            return tp__error_set(err_p, TP_ENOMEM,
                                 "io_uring: out of memory for fd slots");
        }
        for (uint32_t i = s->ur_nslots; i < n; i++) {
            ns[i].us_lfd = NULL;
            ns[i].us_gen = 1;
            ns[i].us_next_free = i + 1 < n ? i + 1 : s->ur_free;
        }
        s->ur_free = s->ur_nslots;
        s->ur_slots = ns;
        s->ur_nslots = n;
    }
    uint32_t idx = s->ur_free;
    uring_slot *slot = &s->ur_slots[idx];
    s->ur_free = slot->us_next_free;
    slot->us_lfd = lfd;
    lfd->lf_token = ((uint64_t)slot->us_gen << 32) | idx;
    uring_arm(s, lfd);
    return TP_OK;
}

static void
uring_fd_remove(tp_loop *loop, tp_loop_fd *lfd)
{
    uring_state *s = tp__loop_backend_state(loop);
    uint32_t idx = (uint32_t)lfd->lf_token;
    uring_slot *slot = &s->ur_slots[idx];
    struct io_uring_sqe *sqe = uring_sqe(s);
    // IORING_OP_ASYNC_CANCEL, not IORING_OP_POLL_REMOVE: POLL_REMOVE fails
    // with -EALREADY when the poll has fired and its completion work is
    // still queued (an fd readable at once, as a rejected connection's
    // hello is), and the multishot poll then stays armed for good, holding
    // a reference to the file: close() would not close the socket and its
    // peer would never see EOF. ASYNC_CANCEL marks the poll cancelled, so
    // whoever owns it completes it with -ECANCELED and drops the file.
    io_uring_prep_cancel64(sqe, lfd->lf_token, 0);
    io_uring_sqe_set_data64(sqe, URING_IGNORE);
    // Submit now: the caller may close the fd right after this returns
    // (the poll then still holds the file until the cancel's completion
    // work runs, at the loop's next wait, which always asks for events).
    io_uring_submit(&s->ur_ring);
    slot->us_lfd = NULL;
    slot->us_gen++;
    slot->us_next_free = s->ur_free;
    s->ur_free = idx;
}

static tp_loop_fd *
uring_lookup(uring_state *s, uint64_t token)
{
    uint32_t idx = (uint32_t)token;
    if (token == URING_IGNORE || idx >= s->ur_nslots ||
        s->ur_slots[idx].us_gen != (uint32_t)(token >> 32)) {
        return NULL;
    }
    return s->ur_slots[idx].us_lfd;
}

static int
uring_wait_dispatch(tp_loop *loop, uint64_t timeout_ns)
{
    uring_state *s = tp__loop_backend_state(loop);
    struct io_uring_cqe *cqe = NULL;
    if (timeout_ns == 0) {
        // Also runs pending task work, which is what posts poll
        // completions: a spinning loop would otherwise not see them until
        // its next kernel entry.
        io_uring_submit_and_get_events(&s->ur_ring);
    } else if (timeout_ns == UINT64_MAX) {
        io_uring_submit_and_wait_timeout(&s->ur_ring, &cqe, 1, NULL, NULL);
    } else {
        struct __kernel_timespec ts = {
            .tv_sec = (long long)(timeout_ns / 1000000000u),
            .tv_nsec = (long long)(timeout_ns % 1000000000u)};
        io_uring_submit_and_wait_timeout(&s->ur_ring, &cqe, 1, &ts, NULL);
    }
    int n = 0;
    while (io_uring_peek_cqe(&s->ur_ring, &cqe) == 0) {
        uint64_t token = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        unsigned flags = cqe->flags;
        io_uring_cqe_seen(&s->ur_ring, cqe);
        tp_loop_fd *lfd = uring_lookup(s, token);
        if (lfd == NULL) {
            continue;
        }
        if (res < 0) {
            // The poll itself failed: let the owner find out why by doing
            // I/O. Re-arm after a transient failure (ENOMEM, EAGAIN...),
            // not after one that would fail again at once.
            n++;
            lfd->lf_cb(lfd, TP_EV_ERROR | TP_EV_HUP | TP_EV_READ | TP_EV_WRITE);
            if (res != -EBADF && res != -EINVAL && res != -ECANCELED &&
                uring_lookup(s, token) == lfd) {
                uring_arm(s, lfd);
            }
            continue;
        }
        {
            uint32_t e = 0;
            if (res & (POLLIN | POLLRDHUP)) {
                e |= TP_EV_READ;
            }
            if (res & POLLOUT) {
                e |= TP_EV_WRITE;
            }
            if (res & (POLLERR | POLLHUP)) {
                e |= TP_EV_ERROR | TP_EV_READ | TP_EV_WRITE;
            }
            if (res & (POLLRDHUP | POLLHUP)) {
                e |= TP_EV_HUP;
            }
            n++;
            lfd->lf_cb(lfd, e);
        }
        // A multishot poll that ended (no F_MORE) is re-armed while the fd
        // is still registered (the callback may have removed it).
        if (!(flags & IORING_CQE_F_MORE) && uring_lookup(s, token) == lfd &&
            lfd != NULL) {
            uring_arm(s, lfd);
        }
    }
    return n;
}

const tp_loop_backend tp__loop_uring_backend = {
    .name = "uring",
    .init = uring_init,
    .thread_start = uring_thread_start,
    .fini = uring_fini,
    .fd_add = uring_fd_add,
    .fd_remove = uring_fd_remove,
    .wait = uring_wait_dispatch,
};
