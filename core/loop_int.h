/* SPDX-License-Identifier: Apache-2.0 */
/* loop_int.h - what loop.c shares with its backends (loop_epoll.c,
 * loop_uring.c). Backends run only on the loop thread, except init/fini. */
#ifndef TP_CORE_LOOP_INT_H
#define TP_CORE_LOOP_INT_H

#include "loop.h"

typedef struct tp_loop_backend {
    const char *name;
    tp_status (*init)(tp_loop *loop, tp_error **err_p);
    // Optional: called first thing on the loop thread.
    void (*thread_start)(tp_loop *loop);
    void (*fini)(tp_loop *loop);
    tp_status (*fd_add)(tp_loop *loop, tp_loop_fd *lfd, tp_error **err_p);
    void (*fd_remove)(tp_loop *loop, tp_loop_fd *lfd);
    // Wait up to @timeout_ns (0 = just poll, UINT64_MAX = no limit) and
    // dispatch ready fds through lf_cb. Returns the number dispatched.
    int (*wait)(tp_loop *loop, uint64_t timeout_ns);
} tp_loop_backend;

extern const tp_loop_backend tp__loop_epoll_backend;
#if TP_HAVE_URING
extern const tp_loop_backend tp__loop_uring_backend;
bool tp__loop_uring_probe(char *why, size_t why_len);
#endif

// Backend private state pointer.
void *tp__loop_backend_state(tp_loop *loop);
void tp__loop_set_backend_state(tp_loop *loop, void *state);

#endif
