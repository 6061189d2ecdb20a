// SPDX-License-Identifier: Apache-2.0
// loop_epoll.c - the epoll backend: edge-triggered (EPOLLET) readiness.

#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "alloc.h"
#include "loop_int.h"

#define EPOLL_BATCH 64

typedef struct epoll_state {
    int ep_fd;
    struct epoll_event ep_events[EPOLL_BATCH];
    int ep_n;   // events in the batch being dispatched
    int ep_pos; // index being dispatched
} epoll_state;

static tp_status
epoll_init(tp_loop *loop, tp_error **err_p)
{
    epoll_state *s = tp__zalloc(sizeof(*s));
    if (s == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "epoll: out of memory");
    }
    s->ep_fd = epoll_create1(EPOLL_CLOEXEC);
    if (s->ep_fd < 0) {
        int e = errno;
        tp__free(s);
        return tp__error_errno(err_p, e, "epoll: epoll_create1");
    }
    tp__loop_set_backend_state(loop, s);
    return TP_OK;
}

static void
epoll_fini(tp_loop *loop)
{
    epoll_state *s = tp__loop_backend_state(loop);
    close(s->ep_fd);
    tp__free(s);
}

static tp_status
epoll_fd_add(tp_loop *loop, tp_loop_fd *lfd, tp_error **err_p)
{
    epoll_state *s = tp__loop_backend_state(loop);
    struct epoll_event ev = {0};
    ev.events = EPOLLET | EPOLLRDHUP;
    if (lfd->lf_events & TP_EV_READ) {
        ev.events |= EPOLLIN;
    }
    if (lfd->lf_events & TP_EV_WRITE) {
        ev.events |= EPOLLOUT;
    }
    ev.data.ptr = lfd;
    if (epoll_ctl(s->ep_fd, EPOLL_CTL_ADD, lfd->lf_fd, &ev) != 0) {
        return tp__error_errno(err_p, errno, "epoll: add fd %d", lfd->lf_fd);
    }
    return TP_OK;
}

static void
epoll_fd_remove(tp_loop *loop, tp_loop_fd *lfd)
{
    epoll_state *s = tp__loop_backend_state(loop);
    epoll_ctl(s->ep_fd, EPOLL_CTL_DEL, lfd->lf_fd, NULL);
    // Events already fetched for this fd must not be dispatched.
    for (int i = s->ep_pos + 1; i < s->ep_n; i++) {
        if (s->ep_events[i].data.ptr == lfd) {
            s->ep_events[i].data.ptr = NULL;
        }
    }
}

static int
epoll_wait_dispatch(tp_loop *loop, uint64_t timeout_ns)
{
    epoll_state *s = tp__loop_backend_state(loop);
    int ms;
    if (timeout_ns == UINT64_MAX) {
        ms = -1;
    } else {
        uint64_t m = (timeout_ns + 999999u) / 1000000u;
        ms = m > 3600000u ? 3600000 : (int)m;
    }
    int n = epoll_wait(s->ep_fd, s->ep_events, EPOLL_BATCH, ms);
    if (n <= 0) {
        return 0; // EINTR or timeout
    }
    s->ep_n = n;
    for (s->ep_pos = 0; s->ep_pos < n; s->ep_pos++) {
        struct epoll_event *ev = &s->ep_events[s->ep_pos];
        tp_loop_fd *lfd = ev->data.ptr;
        if (lfd == NULL) {
            continue;
        }
        uint32_t e = 0;
        if (ev->events & (EPOLLIN | EPOLLRDHUP)) {
            e |= TP_EV_READ;
        }
        if (ev->events & EPOLLOUT) {
            e |= TP_EV_WRITE;
        }
        if (ev->events & (EPOLLERR | EPOLLHUP)) {
            e |= TP_EV_ERROR | TP_EV_READ | TP_EV_WRITE;
        }
        if (ev->events & (EPOLLRDHUP | EPOLLHUP)) {
            e |= TP_EV_HUP;
        }
        lfd->lf_cb(lfd, e);
    }
    s->ep_n = 0;
    s->ep_pos = 0;
    return n;
}

const tp_loop_backend tp__loop_epoll_backend = {
    .name = "epoll",
    .init = epoll_init,
    .fini = epoll_fini,
    .fd_add = epoll_fd_add,
    .fd_remove = epoll_fd_remove,
    .wait = epoll_wait_dispatch,
};
