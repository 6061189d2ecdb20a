// SPDX-License-Identifier: Apache-2.0
// listener.c - TCP listeners: the socket, taking connections from the
// kernel at once (handshaking, then ready, at most TCP_MAX_PENDING), and
// accept aios served from the ready queue.

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/sockaddr.h"
#include "transport/tcp/tcp_impl.h"

// ---- listener --------------------------------------------------------------

static void
tcp_listener_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    tcp_listener *l = arg;
    l->tl_acceptable = true;
    tp__tcp_listener_service(l);
}

// Takes one connection from the kernel and starts its handshake.
static void
tcp_listener_accept1(tcp_listener *l)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = accept4(l->tl_fd, (struct sockaddr *)&ss, &sl,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        switch (e) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            l->tl_acceptable = false;
            return;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case EPERM:
        case ENETDOWN:
        case ENETUNREACH:
        case EHOSTDOWN:
        case EHOSTUNREACH:
        case ENONET:
        case ENOPROTOOPT:
        case EOPNOTSUPP:
            // That connection died before we took it; try the next.
            return;
        default:
            // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection stays in the
            // backlog and no new edge will come for it: retry later.
            TP_LOG_WARN("TP-TCP-ACCEPT",
                        "tcp: listener %s: accept: %s (%s); retrying in "
                        "%d ms",
                        l->tl_base.l_addr, strerror(e), tp__errno_name(e),
                        TCP_ACCEPT_RETRY_MS);
            l->tl_acceptable = false;
            tp__timer_start(l->tl_loop, &l->tl_timer,
                            tp__deadline_after_ms(TCP_ACCEPT_RETRY_MS));
            return;
        }
    }
    tcp_conn *c = tp__tcp_conn_new(l->tl_base.l_transport);
    if (c == NULL) {
        close(fd);
        TP_LOG_WARN("TP-TCP-ACCEPT",
                    "tcp: listener %s: out of memory for a new connection; "
                    "dropped it",
                    l->tl_base.l_addr);
        return;
    }
    tp_sockaddr peer;
    tp__sockaddr_from_sys(&peer, (struct sockaddr *)&ss, sl);
    tp__sockaddr_format(&peer, c->tc_base.c_peer, sizeof(c->tc_base.c_peer));
    tp__tcp_format_local(fd, c->tc_base.c_local, sizeof(c->tc_base.c_local));
    c->tc_fd = fd;
    c->tc_state = TCP_HELLO;
    c->tc_readable = true;
    c->tc_writable = true;
    c->tc_listener = l;
    tp__list_append(&l->tl_hsq, c);
    l->tl_npending++;
    tp__tcp_set_nodelay(fd);
    tp__tcp_set_liveness(fd, &l->tl_base.l_transport->t_cfg);
    tp_error *err = NULL;
    if (tp__loop_fd_add(l->tl_loop, &c->tc_lfd, fd, TP_EV_READ | TP_EV_WRITE,
                        tp__tcp_conn_fd_cb, c, &err) != TP_OK) {
        char pfx[TCP_PFX_LEN];
        tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
        tp__tcp_setup_fail(
            c, tp__error_new(tp_error_status(err), 0, err, "%s", pfx));
        tp_error_unref(err);
        return;
    }
    if (l->tl_hs_timeout_ms > 0) {
        c->tc_timer_ms = l->tl_hs_timeout_ms;
        tp__timer_start(l->tl_loop, &c->tc_timer,
                        tp__deadline_after_ms(c->tc_timer_ms));
    }
    tp__tcp_hello_pump(c);
}

// False if the peer of a handshaked, not yet accepted connection has
// closed or reset it (one MSG_PEEK per accepted connection).
static bool
tcp_conn_alive(tcp_conn *c)
{
    uint8_t b;
    ssize_t n;
    do {
        n = recv(c->tc_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

// Hands handshaked connections to waiting accepts, and takes new ones
// from the kernel while there is room. Reentrant calls (a handshake that
// completes or fails inside) only ask for another round.
void
tp__tcp_listener_service(tcp_listener *l)
{
    if (l->tl_in_service) {
        l->tl_again = true;
        return;
    }
    l->tl_in_service = true;
    do {
        l->tl_again = false;
        while (!tp__list_empty(&l->tl_acceptq) &&
               !tp__list_empty(&l->tl_readyq)) {
            tcp_conn *c = tp__list_pop_first(&l->tl_readyq);
            l->tl_npending--;
            if (!tcp_conn_alive(c)) {
                // Its peer left while it waited: hand out only live ones.
                TP_LOG_DEBUG("TP-TCP-ACCEPT",
                             "tcp: listener %s: connection from peer %s "
                             "closed before it was accepted; dropped",
                             l->tl_base.l_addr, c->tc_base.c_peer);
                c->tc_listener = NULL;
                tp__tcp_conn_release(c);
                tp__conn_unref(&c->tc_base);
                continue;
            }
            tp_aio *aio = tp__list_pop_first(&l->tl_acceptq);
            c->tc_listener = NULL;
            tp__aio_set_output(aio, 0, &c->tc_base);
            tp__aio_finish(aio, NULL, 0);
        }
        while (!l->tl_closed && l->tl_registered && l->tl_acceptable &&
               l->tl_npending < TCP_MAX_PENDING) {
            tcp_listener_accept1(l);
        }
    } while (l->tl_again);
    l->tl_in_service = false;
}

static void
tcp_listener_fd_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    tcp_listener *l = lfd->lf_arg;
    l->tl_acceptable = true;
    tp__tcp_listener_service(l);
}

// Loop thread, posted by tp__tcp_listen (which must not touch the loop): the
// socket joins the loop, and connections are taken and handshaked from
// then on, whether or not an accept is pending.
static void
tcp_listener_start_task(void *arg)
{
    tcp_listener *l = arg;
    if (l->tl_closed || l->tl_fd < 0) {
        return;
    }
    tp_error *err = NULL;
    if (tp__loop_fd_add(l->tl_loop, &l->tl_lfd, l->tl_fd, TP_EV_READ,
                        tcp_listener_fd_cb, l, &err) != TP_OK) {
        l->tl_err = tp__error_new(tp_error_status(err), 0, err,
                                  "tcp: accept on %s", l->tl_base.l_addr);
        tp_error_unref(err);
        TP_LOG_ERROR("TP-TCP-LISTEN", "%s", tp_error_message(l->tl_err));
        tp_aio *aio;
        while ((aio = tp__list_pop_first(&l->tl_acceptq)) != NULL) {
            tp__aio_finish(aio, tp_error_ref(l->tl_err), 0);
        }
        return;
    }
    l->tl_registered = true;
    l->tl_acceptable = true;
    tp__tcp_listener_service(l);
}

static void
tcp_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tcp_listener *l = arg;
    tp__list_remove(&l->tl_acceptq, aio);
    if (reason == TP_ETIMEDOUT) {
        tp__aio_finish_status(aio, TP_ETIMEDOUT,
                              "tcp: accept on %s timed out after %lld ms",
                              l->tl_base.l_addr, (long long)aio->a_timeout_ms);
    } else {
        tp__aio_finish_status(aio, reason, "tcp: accept on %s %s",
                              l->tl_base.l_addr,
                              reason == TP_ECLOSED ? "closed" : "canceled");
    }
}

void
tp__tcp_accept(tp_listener *bl, tp_aio *aio)
{
    tcp_listener *l = tcp_listener_of(bl);
    if (!tp__aio_begin(aio, l->tl_loop, tcp_accept_cancel, l)) {
        return;
    }
    if (l->tl_err != NULL) {
        tp__aio_finish(aio, tp_error_ref(l->tl_err), 0);
        return;
    }
    tp__list_append(&l->tl_acceptq, aio);
    tp__tcp_listener_service(l);
}

static void
tcp_listener_drop_conns(tp_list *q)
{
    tcp_conn *c;
    while ((c = tp__list_first(q)) != NULL) {
        tp__tcp_listener_detach(c);
        tp__tcp_conn_release(c);
        tp__conn_unref(&c->tc_base);
    }
}

void
tp__tcp_listener_close(tp_listener *bl)
{
    tcp_listener *l = tcp_listener_of(bl);
    l->tl_closed = true;
    tp__timer_stop(l->tl_loop, &l->tl_timer);
    if (l->tl_registered) {
        tp__loop_fd_remove(l->tl_loop, &l->tl_lfd);
        l->tl_registered = false;
    }
    if (l->tl_fd >= 0) {
        close(l->tl_fd);
        l->tl_fd = -1;
    }
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&l->tl_acceptq)) != NULL) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "tcp: accept on %s: listener closed",
                              l->tl_base.l_addr);
    }
    tcp_listener_drop_conns(&l->tl_hsq);
    tcp_listener_drop_conns(&l->tl_readyq);
    tp_error_unref(l->tl_err);
    l->tl_err = NULL;
}

// Any thread; may block in getaddrinfo for a host name.
tp_status
tp__tcp_listen(tp_transport *t, tp_listener *bl, const char *addr,
               tp_error **err_p)
{
    tcp_listener *l = tcp_listener_of(bl);
    l->tl_loop = t->t_loop;
    l->tl_fd = -1;
    l->tl_hs_timeout_ms = t->t_cfg.handshake_timeout_ms;
    TP_LIST_INIT(&l->tl_acceptq, tp_aio, a_node);
    TP_LIST_INIT(&l->tl_hsq, tcp_conn, tc_lnode);
    TP_LIST_INIT(&l->tl_readyq, tcp_conn, tc_lnode);
    tp__timer_init(&l->tl_timer, tcp_listener_timer_cb, l);

    tp_hostport hp;
    tp_status st = tp__sockaddr_split(addr, TP_SOCKADDR_EMPTY_HOST, &hp, err_p);
    if (st != TP_OK) {
        return st;
    }
    char why[512] = "";
    if (hp.hp_host[0] == '\0') {
        char chosen[TP_SOCKADDR_STRLEN];
        st = tp__sockaddr_choose(&t->t_cfg, AF_UNSPEC, chosen, sizeof(chosen),
                                 why, sizeof(why), err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "tcp: listen on \"%s\"",
                                  addr != NULL ? addr : "");
        }
        // The chosen host is in URL form: drop the brackets of IPv6.
        size_t n = strlen(chosen);
        hp.hp_bracketed = chosen[0] == '[' && n >= 2;
        if (hp.hp_bracketed) {
            snprintf(hp.hp_host, sizeof(hp.hp_host), "%.*s", (int)(n - 2),
                     chosen + 1);
        } else {
            snprintf(hp.hp_host, sizeof(hp.hp_host), "%s", chosen);
        }
    }
    // listen() may block, so a host name is resolved here.
    tp_sockaddr sa;
    st = tp__sockaddr_from_hostport(&hp, addr, TP_SOCKADDR_RESOLVE, &sa, err_p);
    if (st != TP_OK) {
        return st;
    }
    char shown[TP_SOCKADDR_STRLEN];
    tp__sockaddr_format(&sa, shown, sizeof(shown));

    int fd = socket(sa.u.sa.sa_family,
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return tp__error_errno(err_p, errno, "tcp: listen on %s: socket",
                               shown);
    }
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
        st = tp__error_errno(
            err_p, errno, "tcp: listen on %s: setsockopt SO_REUSEADDR", shown);
        goto fail_fd;
    }
    // Accepted sockets inherit the buffer sizes (and so the window scale
    // they advertise in the SYN-ACK) from the listening socket.
    tp__tcp_set_bufs(fd, &t->t_cfg);
    bool secret = false;
    st = tp__auth_enabled(&secret, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "tcp: listen on %s", shown);
        goto fail_fd;
    }
    if (bind(fd, &sa.u.sa, sa.len) != 0) {
        st = tp__error_errno(err_p, errno, "tcp: listen on %s", shown);
        goto fail_fd;
    }
    if (listen(fd, SOMAXCONN) != 0) {
        st = tp__error_errno(err_p, errno, "tcp: listen on %s", shown);
        goto fail_fd;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        st = tp__error_errno(err_p, errno, "tcp: listen on %s: getsockname",
                             shown);
        goto fail_fd;
    }
    tp_sockaddr bound;
    tp__sockaddr_from_sys(&bound, (struct sockaddr *)&ss, sl);
    // getsockname does not report the scope of a link-local address
    // under every kernel: keep the one we bound to.
    if (bound.u.sa.sa_family == AF_INET6 && sa.u.sa.sa_family == AF_INET6 &&
        bound.u.in6.sin6_scope_id == 0) {
        bound.u.in6.sin6_scope_id = sa.u.in6.sin6_scope_id;
    }
    tp__sockaddr_format_url(&bound, "tcp", l->tl_base.l_addr,
                            sizeof(l->tl_base.l_addr));
    char what[sizeof(l->tl_base.l_addr) + 16];
    snprintf(what, sizeof(what), "tcp listener %s", l->tl_base.l_addr);
    tp__auth_warn_open(what, &bound.u.sa);
    l->tl_fd = fd;
    tp__task_init(&l->tl_start_task, tcp_listener_start_task, l);
    tp__loop_post(l->tl_loop, &l->tl_start_task);
    if (why[0] != '\0') {
        TP_LOG_INFO("TP-TCP-IFACE", "tcp: listening on %s: %s",
                    l->tl_base.l_addr, why);
    } else {
        TP_LOG_DEBUG("TP-TCP-LISTEN", "tcp: listening on %s",
                     l->tl_base.l_addr);
    }
    return TP_OK;

fail_fd:
    close(fd);
    return st;
}
