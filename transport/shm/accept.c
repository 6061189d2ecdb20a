// SPDX-License-Identifier: Apache-2.0
// accept.c - the shm transport's listener: accepting and handshaking
// connections, and closing connections and listeners.

#include "transport/shm/shm_impl.h"

static _Atomic unsigned shm_name_counter;

// ---- accept -----------------------------------------------------------------

void
tp__shm_listener_unlink(shm_conn *c)
{
    shm_listener *l = c->c_listener;
    if (l == NULL) {
        return;
    }
    if (c->c_in_ready) {
        tp__list_remove(&l->l_ready, c);
        l->l_nready--;
    } else {
        tp__list_remove(&l->l_hs, c);
        l->l_nhs--;
    }
    c->c_listener = NULL;
    c->c_in_ready = false;
}

// A connection that did not complete the handshake: log why, drop it, and
// keep serving the others.
static void
shm_acceptor_reject(shm_conn *c, const char *why)
{
    shm_listener *l = c->c_listener;
    if (c->c_hs_got == 0 && strncmp(why, "connection closed", 17) == 0) {
        // Connected and closed without a byte (a canceled connect, a
        // probe): not bad input.
        TP_LOG_DEBUG("TP-SHM-HELLO",
                     "shm: listener %s: pid %d closed before its hello",
                     l->l_base.l_addr, c->c_peer_pid);
    } else {
        TP_LOG_WARN("TP-SHM-HELLO",
                    "shm: listener %s: rejected connection from pid %d: %s",
                    l->l_base.l_addr, c->c_peer_pid, why);
    }
    tp__shm_listener_unlink(c);
    tp__shm_conn_close(&c->c_base);
    tp__conn_unref(&c->c_base);
    tp__shm_listener_serve(l);
}

static void shm_acceptor_on_auth(shm_conn *c);

static void
shm_acceptor_on_hello(shm_conn *c)
{
    tp_status st = TP_EPROTO;
    char why[256];
    int r = tp__shm_recv_hello(c, &st, why, sizeof(why));
    if (r == 0) {
        return;
    }
    if (r < 0 || !tp__shm_hello_accept(c, why, sizeof(why))) {
        shm_acceptor_reject(c, why);
        return;
    }
    tp_error *err = NULL;
    bool secret = false;
    if (tp__auth_enabled(&secret, &err) != TP_OK) {
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    char what[sizeof(c->c_listener->l_base.l_addr) + 32];
    snprintf(what, sizeof(what), "shm: listener %s",
             c->c_listener->l_base.l_addr);
    r = tp__auth_decide(secret ? TP_AUTH_HELLO_FLAG : 0,
                        tp__get_u32le(c->c_hs_buf + 12), true, what, &err);
    if (r < 0) {
        // Nothing more goes to a peer without the secret: no hello, no fds.
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    if (tp__shm_send_hello(c, &err) != TP_OK) {
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    if (r == 1) {
        c->c_state = SHM_C_AUTH;
        tp__auth_start(&c->c_auth, true, "shm");
    }
    shm_acceptor_on_auth(c);
}

// Acceptor: the exchange (if any) progressed; when it is done, the
// connection is ready for an accept.
static void
shm_acceptor_on_auth(shm_conn *c)
{
    char why[256];
    tp_error *err = NULL;
    if (c->c_state == SHM_C_AUTH) {
        int r = tp__shm_auth_pump(c, false, &err);
        if (r == 0) {
            return;
        }
        if (r < 0) {
            snprintf(why, sizeof(why), "%s", tp_error_message(err));
            tp_error_unref(err);
            shm_acceptor_reject(c, why);
            return;
        }
    }
    if (tp__shm_conn_ready(c, &err) != TP_OK) {
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    TP_LOG_DEBUG("TP-SHM-ACCEPT", "shm: accepted peer %s", c->c_base.c_peer);
    shm_listener *l = c->c_listener;
    tp__list_remove(&l->l_hs, c);
    l->l_nhs--;
    tp__list_append(&l->l_ready, c);
    l->l_nready++;
    c->c_in_ready = true;
    // The connector may have closed right after its hello: that EOF came
    // with the readiness event just consumed, so look for it now.
    tp__shm_sock_check(c);
    tp__shm_listener_serve(l);
}

void
tp__shm_timer_cb(tp_timer *t, void *arg)
{
    shm_conn *c = arg;
    TP_UNUSED(t);
    char why[128];
    switch (c->c_state) {
    case SHM_C_CONNECTING:
        if (tp__now_ns() < c->c_deadline_ns) {
            tp__shm_connect_try(c);
            return;
        }
        tp__shm_connect_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                              "shm: connect to " SHM_SCHEME
                                              "%s: timed out after %" PRId64
                                              " ms (listener backlog full)",
                                              c->c_name,
                                              shm_cfg(c)->connect_timeout_ms));
        return;
    case SHM_C_WAIT_REPLY:
        tp__shm_connect_fail(c,
                             tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                           "shm: connect to " SHM_SCHEME
                                           "%s: no hello from peer pid %d "
                                           "within %" PRId64 " ms",
                                           c->c_name, c->c_peer_pid,
                                           shm_cfg(c)->handshake_timeout_ms));
        return;
    case SHM_C_WAIT_HELLO:
        snprintf(why, sizeof(why),
                 "timed out after %" PRId64 " ms with %zu of %u hello bytes",
                 shm_cfg(c)->handshake_timeout_ms, c->c_hs_got, SHM_HELLO_LEN);
        shm_acceptor_reject(c, why);
        return;
    case SHM_C_AUTH:
        if (c->c_listener != NULL) {
            snprintf(why, sizeof(why),
                     "timed out after %" PRId64 " ms in the job-secret "
                     "exchange",
                     shm_cfg(c)->handshake_timeout_ms);
            shm_acceptor_reject(c, why);
        } else {
            tp__shm_connect_fail(
                c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                 "shm: connect to " SHM_SCHEME
                                 "%s: peer pid %d did not "
                                 "complete the job-secret "
                                 "exchange within %" PRId64 " ms",
                                 c->c_name, c->c_peer_pid,
                                 shm_cfg(c)->handshake_timeout_ms));
        }
        return;
    default:
        return;
    }
}

void
tp__shm_sock_cb(tp_loop_fd *lfd, uint32_t events)
{
    shm_conn *c = lfd->lf_arg;
    TP_UNUSED(events);
    switch (c->c_state) {
    case SHM_C_WAIT_REPLY:
        tp__shm_connector_on_reply(c);
        return;
    case SHM_C_WAIT_HELLO:
        shm_acceptor_on_hello(c);
        return;
    case SHM_C_AUTH:
        if (c->c_listener != NULL) {
            shm_acceptor_on_auth(c);
        } else {
            tp__shm_connector_on_auth(c);
        }
        return;
    case SHM_C_READY:
        tp__shm_sock_check(c);
        return;
    default:
        return;
    }
}

static void
shm_acceptor_start(shm_listener *l, int fd)
{
    tp_transport *t = l->l_base.l_transport;
    int pid = tp__shm_peer_pid(fd);
    shm_conn *c = (shm_conn *)tp__conn_alloc(t);
    if (c == NULL) {
        TP_LOG_WARN("TP-SHM-HELLO",
                    "shm: listener %s: rejected connection from pid %d: out "
                    "of memory",
                    l->l_base.l_addr, pid);
        close(fd);
        return;
    }
    tp__shm_conn_setup(c);
    c->c_sock = fd;
    c->c_peer_pid = pid;
    memcpy(c->c_name, l->l_name, sizeof(c->c_name));
    tp__shm_set_names(c);
    c->c_listener = l;
    c->c_in_ready = false;
    tp__list_append(&l->l_hs, c);
    l->l_nhs++;
    c->c_state = SHM_C_WAIT_HELLO;
    tp_error *err = NULL;
    if (tp__loop_fd_add(t->t_loop, &c->c_sock_lfd, fd, TP_EV_READ,
                        tp__shm_sock_cb, c, &err) != TP_OK) {
        char why[256];
        snprintf(why, sizeof(why), "%s", tp_error_message(err));
        tp_error_unref(err);
        shm_acceptor_reject(c, why);
        return;
    }
    c->c_deadline_ns = tp__deadline_after_ms(t->t_cfg.handshake_timeout_ms);
    if (c->c_deadline_ns != UINT64_MAX) {
        tp__timer_start(t->t_loop, &c->c_timer, c->c_deadline_ns);
    }
}

// Hands handshaken conns to waiting accepts, then takes new connections
// from the kernel while there is room.
void
tp__shm_listener_serve(shm_listener *l)
{
    if (l->l_serving) {
        return; // the outer call re-checks the counts
    }
    l->l_serving = true;
    while (!tp__list_empty(&l->l_acceptq) && !tp__list_empty(&l->l_ready)) {
        tp_aio *aio = tp__list_pop_first(&l->l_acceptq);
        shm_conn *c = tp__list_first(&l->l_ready);
        tp__shm_listener_unlink(c);
        tp__aio_set_output(aio, 0, &c->c_base);
        tp__aio_finish(aio, NULL, 0);
    }
    while (l->l_lfd.lf_active && l->l_nhs < SHM_MAX_HANDSHAKES &&
           l->l_nready < SHM_MAX_READY) {
        int fd = accept4(l->l_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED) {
                continue;
            }
            if (e != EAGAIN && e != EWOULDBLOCK) {
                TP_LOG_WARN("TP-SHM-ACCEPT", "shm: listener %s: accept: %s",
                            l->l_base.l_addr, strerror(e));
            }
            break;
        }
        shm_acceptor_start(l, fd);
    }
    l->l_serving = false;
}

static void
shm_listen_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    tp__shm_listener_serve(lfd->lf_arg);
}

static void
shm_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    shm_listener *l = arg;
    tp__list_remove(&l->l_acceptq, aio);
    if (reason == TP_ETIMEDOUT) {
        tp__aio_finish_status(
            aio, reason, "shm: accept on %s: timed out after %" PRId64 " ms",
            l->l_base.l_addr, aio->a_timeout_ms);
    } else {
        tp__aio_finish_status(
            aio, reason, "shm: accept on %s: %s", l->l_base.l_addr,
            reason == TP_ECLOSED ? "listener closed" : "canceled");
    }
}

// Registers the listening socket with the loop (listen() may not touch
// the loop, so it posts this): from then on connections are handshaken as
// they arrive, whether or not an accept is pending, so a connector does
// not wait on the server's first accept.
static tp_status
shm_listener_start(shm_listener *l, tp_error **err_p)
{
    tp_transport *t = l->l_base.l_transport;
    if (l->l_lfd.lf_active || l->l_fd < 0) {
        return TP_OK;
    }
    if (tp__loop_fd_add(t->t_loop, &l->l_lfd, l->l_fd, TP_EV_READ,
                        shm_listen_cb, l, err_p) != TP_OK) {
        return tp__error_wrap(err_p, TP_EINTERNAL, "shm: listen on %s",
                              l->l_base.l_addr);
    }
    tp__shm_listener_serve(l);
    return TP_OK;
}

static void
shm_listener_start_task(void *arg)
{
    shm_listener *l = arg;
    tp_error *err = NULL;
    if (shm_listener_start(l, &err) != TP_OK) {
        // The first accept tries again and reports it.
        TP_LOG_WARN("TP-SHM-LISTEN", "%s", tp_error_message(err));
        tp_error_unref(err);
    }
}

void
tp__shm_accept(tp_listener *base, tp_aio *aio)
{
    shm_listener *l = (shm_listener *)base;
    tp_transport *t = base->l_transport;
    if (!tp__aio_begin(aio, t->t_loop, shm_accept_cancel, l)) {
        return;
    }
    tp_error *err = NULL;
    if (shm_listener_start(l, &err) != TP_OK) {
        tp__aio_finish(aio, err, 0);
        return;
    }
    tp__list_append(&l->l_acceptq, aio);
    tp__shm_listener_serve(l);
}

void
tp__shm_listener_close(tp_listener *base)
{
    shm_listener *l = (shm_listener *)base;
    tp_transport *t = base->l_transport;
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&l->l_acceptq)) != NULL) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "shm: accept on %s: listener closed",
                              base->l_addr);
    }
    shm_conn *c;
    while ((c = tp__list_first(&l->l_hs)) != NULL ||
           (c = tp__list_first(&l->l_ready)) != NULL) {
        tp__shm_listener_unlink(c);
        tp__shm_conn_close(&c->c_base);
        tp__conn_unref(&c->c_base);
    }
    tp__loop_fd_remove(t->t_loop, &l->l_lfd);
    tp__shm_close_fd(&l->l_fd);
}

tp_status
tp__shm_listen(tp_transport *t, tp_listener *base, const char *addr,
               tp_error **err_p)
{
    shm_listener *l = (shm_listener *)base;
    bool pick =
        addr == NULL || addr[0] == '\0' || strcmp(addr, SHM_SCHEME) == 0;
    char name[SHM_NAME_MAX + 1];
    if (!pick && tp__shm_parse_addr(addr, name, err_p) != TP_OK) {
        return TP_EINVAL;
    }
    bool secret = false;
    if (tp__auth_enabled(&secret, err_p) != TP_OK) {
        return tp__error_wrap(err_p, TP_EINVAL, "shm: listen on %s",
                              pick ? SHM_SCHEME : addr);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "shm: listen on %s: socket",
                               pick ? SHM_SCHEME : addr);
    }
    for (int attempt = 0;; attempt++) {
        if (pick) {
            uint32_t rnd = (uint32_t)tp__random_u64();
            snprintf(name, sizeof(name), "tpipe-%d-%u-%08x", (int)getpid(),
                     atomic_fetch_add_explicit(&shm_name_counter, 1,
                                               memory_order_relaxed),
                     rnd);
        }
        struct sockaddr_un sa;
        socklen_t len = tp__shm_sockaddr(name, &sa);
        if (bind(fd, (struct sockaddr *)&sa, len) == 0) {
            break;
        }
        int e = errno;
        if (pick && e == EADDRINUSE && attempt < 8) {
            continue;
        }
        close(fd);
        return tp__error_errno(err_p, e, "shm: listen on " SHM_SCHEME "%s",
                               name);
    }
    if (listen(fd, SOMAXCONN) != 0) {
        int e = errno;
        close(fd);
        return tp__error_errno(err_p, e, "shm: listen on " SHM_SCHEME "%s",
                               name);
    }
    l->l_fd = fd;
    memcpy(l->l_name, name, sizeof(name));
    snprintf(base->l_addr, sizeof(base->l_addr), SHM_SCHEME "%s", name);
    TP_LIST_INIT(&l->l_acceptq, tp_aio, a_node);
    TP_LIST_INIT(&l->l_hs, shm_conn, c_lnode);
    TP_LIST_INIT(&l->l_ready, shm_conn, c_lnode);
    // Posted before anything the caller can post for this listener (its
    // destroy included), so it runs first.
    tp__task_init(&l->l_start_task, shm_listener_start_task, l);
    tp__loop_post(t->t_loop, &l->l_start_task);
    return TP_OK;
}

// ---- close ------------------------------------------------------------------

void
tp__shm_conn_close(tp_conn *base)
{
    shm_conn *c = (shm_conn *)base;
    if (c->c_state == SHM_C_CLOSED) {
        return;
    }
    tp_loop *loop = shm_loop(c);
    if (c->c_connect_aio != NULL) {
        tp_aio *aio = c->c_connect_aio;
        c->c_connect_aio = NULL;
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "shm: connect to " SHM_SCHEME "%s: closed",
                              c->c_name);
    }
    if (!tp__list_empty(&c->c_readq) || !tp__list_empty(&c->c_writeq)) {
        tp_error *err = tp__error_new(TP_ECLOSED, 0, NULL,
                                      "shm: connection to peer %s closed",
                                      c->c_base.c_peer);
        tp__shm_fail_all(c, err);
        tp_error_unref(err);
    }
    tp__shm_listener_unlink(c);
    if (c->c_poller.lp_active) {
        tp__loop_poller_stop(loop, &c->c_poller);
    }
    if (c->c_state == SHM_C_READY) {
        tp__shm_disarm(c);
    }
    tp__timer_stop(loop, &c->c_timer);
    tp__shm_release_fds(c);
    tp__shm_ring_unmap(&c->c_out);
    tp__shm_ring_unmap(&c->c_in);
    c->c_state = SHM_C_CLOSED;
}

void
tp__shm_conn_fini(tp_conn *base)
{
    shm_conn *c = (shm_conn *)base;
    tp_error_unref(c->c_err);
    c->c_err = NULL;
}
