// SPDX-License-Identifier: Apache-2.0
// setup.c - TCP connection set-up on both sides: the 16-byte hello
// exchange with its deadline, the socket's loop events, and connect (a
// name resolved on a thread of its own).

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

// ---- connection set-up (both sides) -------------------------------------

// "tcp: connect to X" or "tcp: listener tcp://Y: connection from peer X".
void
tp__tcp_setup_prefix(const tcp_conn *c, char *buf, size_t len)
{
    if (c->tc_listener != NULL) {
        snprintf(buf, len, "tcp: listener %s: connection from peer %s",
                 c->tc_listener->tl_base.l_addr, c->tc_base.c_peer);
    } else {
        snprintf(buf, len, "tcp: connect to %s", c->tc_base.c_peer);
    }
}

// Removes a listener-side conn from its listener's queues.
void
tp__tcp_listener_detach(tcp_conn *c)
{
    tcp_listener *l = c->tc_listener;
    if (l == NULL) {
        return;
    }
    if (tp__list_node_active(&c->tc_lnode)) {
        // The node is on tl_hsq or tl_readyq; removal only needs the
        // node offset, which both lists share.
        tp__list_remove(&l->tl_hsq, c);
        l->tl_npending--;
    }
    c->tc_listener = NULL;
}

// The set-up failed with @err (taken): the connect aio fails with it, or
// the listener logs and drops the connection. The conn is released and its
// reference dropped.
void
tp__tcp_setup_fail(tcp_conn *c, tp_error *err)
{
    tcp_listener *l = c->tc_listener;
    if (l != NULL) {
        TP_LOG_WARN("TP-TCP-HELLO", "%s; connection dropped",
                    tp_error_message(err));
        tp_error_unref(err);
        tp__tcp_listener_detach(c);
        tp__tcp_conn_release(c);
        tp__conn_unref(&c->tc_base);
        tp__tcp_listener_service(l); // there is room for another one now
        return;
    }
    tp_aio *aio = c->tc_connect_aio;
    c->tc_connect_aio = NULL;
    tp__tcp_conn_release(c);
    if (aio != NULL) {
        tp__aio_finish(aio, err, 0);
    } else {
        tp_error_unref(err);
    }
    tp__conn_unref(&c->tc_base);
}

static void
tcp_setup_fail_errno(tcp_conn *c, int errnum, const char *what)
{
    char pfx[TCP_PFX_LEN];
    tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
    tp_error *err = NULL;
    tp__error_errno(&err, errnum, "%s%s", pfx, what);
    tp__tcp_setup_fail(c, err);
}

static void
tcp_hex(const uint8_t *p, unsigned n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < n && off + 4 < len; i++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%02x", i ? " " : "",
                                p[i]);
    }
}

// Checks the hello bytes received so far. Returns false (after failing
// the set-up) if they are wrong.
static bool
tcp_hello_check(tcp_conn *c)
{
    unsigned n = c->tc_hello_rcvd;
    unsigned m = TP_MIN(n, TCP_HELLO_MAGIC_LEN);
    char pfx[TCP_PFX_LEN];
    char hex[64];
    if (memcmp(c->tc_hello_in, TP_HELLO_MAGIC, m) != 0) {
        tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
        tcp_hex(c->tc_hello_in, n, hex, sizeof(hex));
        tp__tcp_setup_fail(c, tp__error_new(TP_EPROTO, 0, NULL,
                                            "%s: bad hello: not a tpipe peer "
                                            "(wrong magic; got %s)",
                                            pfx, hex));
        return false;
    }
    if (n < TP_HELLO_LEN) {
        return true;
    }
    uint32_t version = tp__get_u32le(c->tc_hello_in + 8);
    if (version != TCP_HELLO_VERSION) {
        tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
        tp__tcp_setup_fail(c,
                           tp__error_new(TP_EPROTO, 0, NULL,
                                         "%s: bad hello: unsupported version "
                                         "%u (this side speaks %u)",
                                         pfx, version, TCP_HELLO_VERSION));
        return false;
    }
    // Flags: bit 0 says the peer has a job secret (tcp_auth_begin); other
    // bits are ignored so that later versions can add optional features.
    return true;
}

static void
tcp_hello_done(tcp_conn *c)
{
    tp__timer_stop(c->tc_loop, &c->tc_timer);
    c->tc_state = TCP_OPEN;
    tcp_listener *l = c->tc_listener;
    if (l != NULL) {
        // Move from the handshake queue to the ready queue.
        tp__tcp_listener_detach(c);
        c->tc_listener = l;
        tp__list_append(&l->tl_readyq, c);
        l->tl_npending++;
        TP_LOG_DEBUG("TP-TCP-ACCEPT",
                     "tcp: listener %s: connection from peer %s ready",
                     l->tl_base.l_addr, c->tc_base.c_peer);
        tp__tcp_listener_service(l);
        return;
    }
    tp_aio *aio = c->tc_connect_aio;
    c->tc_connect_aio = NULL;
    TP_LOG_DEBUG("TP-TCP-CONNECT", "tcp: connected to peer %s from %s",
                 c->tc_base.c_peer, c->tc_base.c_local);
    tp__aio_set_output(aio, 0, &c->tc_base);
    tp__aio_finish(aio, NULL, 0);
}

// The hellos are exchanged: decides whether the job-secret exchange runs
// (core/auth.h). Returns false after failing the set-up.
static bool
tcp_auth_begin(tcp_conn *c)
{
    char pfx[TCP_PFX_LEN];
    tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
    tp_error *err = NULL;
    uint32_t ours = tp__get_u32le(c->tc_hello_out + 12);
    uint32_t theirs = tp__get_u32le(c->tc_hello_in + 12);
    int r = tp__auth_decide(ours, theirs, c->tc_listener != NULL, pfx, &err);
    if (r < 0) {
        tp__tcp_setup_fail(c, err);
        return false;
    }
    // r == 1 means we have a secret: the exchange began with our hello.
    c->tc_auth_state = r == 1 ? 1 : 2;
    return true;
}

// tp__auth_io over the conn's socket, honouring (and updating) what the
// loop said it is ready for.
static ssize_t
tcp_auth_io(void *ctx, bool send_, void *buf, size_t len)
{
    tcp_conn *c = ctx;
    if (send_ ? !c->tc_writable : !c->tc_readable) {
        errno = EAGAIN;
        return -1;
    }
    ssize_t n = send_ ? send(c->tc_fd, buf, len, MSG_NOSIGNAL)
                      : recv(c->tc_fd, buf, len, 0);
    if (send_ && n == 0) {
        errno = EAGAIN;
        n = -1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (send_) {
            c->tc_writable = false;
        } else {
            c->tc_readable = false;
        }
    }
    return n;
}

// Runs the job-secret exchange as far as the socket allows (@send_only:
// only our nonce, right behind our hello, so that the exchange adds half a
// round trip, not one and a half). Returns false after failing the set-up.
static bool
tcp_auth_pump(tcp_conn *c, bool send_only)
{
    char pfx[TCP_PFX_LEN];
    tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
    tp_error *err = NULL;
    bool done = false;
    if (tp__auth_pump(&c->tc_auth, tcp_auth_io, c, send_only, pfx, &done,
                      &err) != TP_OK) {
        tp__tcp_setup_fail(c, err);
        return false;
    }
    if (done) {
        c->tc_auth_state = 2;
    }
    return true;
}

// Sends our hello and reads the peer's, as far as the socket allows; then
// the job-secret exchange when both sides have a secret.
void
tp__tcp_hello_pump(tcp_conn *c)
{
    if (c->tc_hello_sent == 0 && c->tc_hello_rcvd == 0) {
        // A misconfigured secret refuses every connection rather than
        // running without one.
        bool on = false;
        tp_error *err = NULL;
        if (tp__auth_enabled(&on, &err) != TP_OK) {
            char pfx[TCP_PFX_LEN];
            tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
            tp__tcp_setup_fail(
                c, tp__error_new(tp_error_status(err), 0, err, "%s", pfx));
            tp_error_unref(err);
            return;
        }
        tp__put_u32le(c->tc_hello_out + 12, on ? TP_AUTH_HELLO_FLAG : 0);
        if (on) {
            tp__auth_start(&c->tc_auth, c->tc_listener != NULL, "tcp");
        }
    }
    if (c->tc_auth_state == 1) {
        if (tcp_auth_pump(c, false) && c->tc_auth_state == 2) {
            tcp_hello_done(c);
        }
        return;
    }
    while (c->tc_hello_sent < TP_HELLO_LEN && c->tc_writable) {
        ssize_t n = send(c->tc_fd, c->tc_hello_out + c->tc_hello_sent,
                         TP_HELLO_LEN - c->tc_hello_sent, MSG_NOSIGNAL);
        if (n > 0) {
            c->tc_hello_sent += (unsigned)n;
            continue;
        }
        int e = n == 0 ? EAGAIN : errno;
        if (e == EINTR) {
            continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            c->tc_writable = false;
            break;
        }
        tcp_setup_fail_errno(c, e, ": sending the hello");
        return;
    }
    if ((tp__get_u32le(c->tc_hello_out + 12) & TP_AUTH_HELLO_FLAG) &&
        c->tc_hello_sent == TP_HELLO_LEN && !tcp_auth_pump(c, true)) {
        return;
    }
    while (c->tc_hello_rcvd < TP_HELLO_LEN && c->tc_readable) {
        ssize_t n = recv(c->tc_fd, c->tc_hello_in + c->tc_hello_rcvd,
                         TP_HELLO_LEN - c->tc_hello_rcvd, 0);
        if (n > 0) {
            c->tc_hello_rcvd += (unsigned)n;
            if (!tcp_hello_check(c)) {
                return;
            }
            continue;
        }
        if (n == 0) {
            char pfx[TCP_PFX_LEN];
            tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
            tp__tcp_setup_fail(
                c, tp__error_new(TP_ECONNRESET, 0, NULL,
                                 "%s: connection closed by peer "
                                 "during the handshake (EOF after "
                                 "%u of %u hello bytes)",
                                 pfx, c->tc_hello_rcvd, TP_HELLO_LEN));
            return;
        }
        int e = errno;
        if (e == EINTR) {
            continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            c->tc_readable = false;
            break;
        }
        tcp_setup_fail_errno(c, e, ": reading the hello");
        return;
    }
    if (c->tc_hello_sent == TP_HELLO_LEN && c->tc_hello_rcvd == TP_HELLO_LEN) {
        if (!tcp_auth_begin(c)) {
            return;
        }
        if (c->tc_auth_state == 1 &&
            (!tcp_auth_pump(c, false) || c->tc_auth_state != 2)) {
            return;
        }
        tcp_hello_done(c);
    }
}

// The connect or handshake deadline passed.
void
tp__tcp_conn_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    tcp_conn *c = arg;
    char pfx[TCP_PFX_LEN];
    tp__tcp_setup_prefix(c, pfx, sizeof(pfx));
    if (c->tc_listener != NULL) {
        tp__tcp_setup_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                            "%s: no valid hello within %lld ms "
                                            "(got %u of %u bytes)",
                                            pfx, (long long)c->tc_timer_ms,
                                            c->tc_hello_rcvd, TP_HELLO_LEN));
    } else {
        tp__tcp_setup_fail(
            c, tp__error_new(
                   TP_ETIMEDOUT, 0, NULL, "%s: timed out after %lld ms%s", pfx,
                   (long long)c->tc_timer_ms,
                   c->tc_state == TCP_HELLO ? " (during the handshake)" : ""));
    }
}

void
tp__tcp_conn_fd_cb(tp_loop_fd *lfd, uint32_t events)
{
    tcp_conn *c = lfd->lf_arg;
    if (events & (TP_EV_READ | TP_EV_ERROR)) {
        c->tc_readable = true;
    }
    if (events & (TP_EV_HUP | TP_EV_ERROR)) {
        c->tc_hup_seen = true;
    }
    if (events & (TP_EV_WRITE | TP_EV_ERROR)) {
        c->tc_writable = true;
    }
    switch (c->tc_state) {
    case TCP_OPEN:
        if (c->tc_writable && !tp__list_empty(&c->tc_writeq)) {
            tp__tcp_write_pump(c);
        }
        if (c->tc_state == TCP_OPEN && c->tc_readable &&
            !tp__list_empty(&c->tc_readq)) {
            tp__tcp_read_pump(c);
        }
        break;
    case TCP_HELLO:
        tp__tcp_hello_pump(c);
        break;
    case TCP_CONNECTING: {
        if (!(events & (TP_EV_WRITE | TP_EV_ERROR))) {
            break;
        }
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (getsockopt(c->tc_fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0) {
            soerr = errno;
        }
        if (soerr == EINPROGRESS || soerr == EALREADY) {
            break;
        }
        if (soerr != 0) {
            tcp_setup_fail_errno(c, soerr, "");
            break;
        }
        tp__tcp_format_local(c->tc_fd, c->tc_base.c_local,
                             sizeof(c->tc_base.c_local));
        c->tc_state = TCP_HELLO;
        tp__tcp_hello_pump(c);
        break;
    }
    default:
        break;
    }
}

// ---- connect ---------------------------------------------------------------

static void
tcp_connect_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tcp_conn *c = arg;
    TP_ASSERT(c->tc_connect_aio == aio);
    const char *phase =
        c->tc_state == TCP_HELLO ? " (during the handshake)" : "";
    tp_error *err;
    if (reason == TP_ETIMEDOUT) {
        err = tp__error_new(TP_ETIMEDOUT, 0, NULL,
                            "tcp: connect to %s timed out after %lld ms%s",
                            c->tc_base.c_peer, (long long)aio->a_timeout_ms,
                            phase);
    } else {
        err = tp__error_new(
            reason, 0, NULL, "tcp: connect to %s %s%s", c->tc_base.c_peer,
            reason == TP_ECLOSED ? "closed" : "canceled", phase);
    }
    tp__tcp_setup_fail(c, err);
}

static void tcp_connect_to(tcp_conn *c, const tp_sockaddr *sa);

// A host name is resolved on a short-lived thread of its own (getaddrinfo
// blocks, and the loop thread never blocks); the result is posted back to
// the loop. The resolver holds a reference on the conn; if the connect was
// canceled or timed out meanwhile, the result is dropped.
typedef struct tcp_resolve {
    tcp_conn *r_conn;
    tp_transport *r_transport;
    tp_task r_task;
    tp_sockaddr r_sa;
    tp_error *r_err;
    char r_addr[];
} tcp_resolve;

static void
tcp_resolve_done(void *arg)
{
    tcp_resolve *r = arg;
    tcp_conn *c = r->r_conn;
    if (c->tc_connect_aio != NULL && c->tc_state == TCP_IDLE) {
        if (r->r_err != NULL) {
            tp__tcp_setup_fail(c, r->r_err);
        } else {
            tcp_connect_to(c, &r->r_sa);
        }
    } else {
        tp_error_unref(r->r_err);
    }
    tp__conn_unref(&c->tc_base);
    tp__free(r);
}

static void *
tcp_resolve_thread(void *arg)
{
    tcp_resolve *r = arg;
    tp__thread_set_name("tp-resolve");
    if (tp__sockaddr_parse(r->r_addr, TP_SOCKADDR_RESOLVE, &r->r_sa,
                           &r->r_err) != TP_OK &&
        r->r_err == NULL) {
        r->r_err =
            tp__error_new(TP_EINVAL, 0, NULL,
                          "tcp: connect to %s: cannot resolve", r->r_addr);
    }
    // After the post, @r may already be freed and the conn gone; the
    // loop is still alive because the transport counts this thread as one
    // of its objects until the post has returned (tp__transport_destroy
    // waits for them before the loop may be destroyed).
    tp_transport *t = r->r_transport;
    tp__loop_post(r->r_conn->tc_loop, &r->r_task);
    tp__transport_release(t);
    return NULL;
}

static void
tcp_connect_resolve(tcp_conn *c, const char *addr)
{
    size_t n = strlen(addr) + 1;
    tcp_resolve *r = tp__zalloc(sizeof(*r) + n);
    if (r == NULL) {
        tp__tcp_setup_fail(c, tp__error_new(TP_ENOMEM, 0, NULL,
                                            "tcp: connect to %s: out of memory",
                                            addr));
        return;
    }
    memcpy(r->r_addr, addr, n);
    r->r_conn = c;
    r->r_transport = c->tc_base.c_transport;
    tp__task_init(&r->r_task, tcp_resolve_done, r);
    tp__conn_ref(&c->tc_base);
    tp__transport_hold(r->r_transport);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rv = pthread_create(&th, &attr, tcp_resolve_thread, r);
    pthread_attr_destroy(&attr);
    if (rv != 0) {
        tp__transport_release(r->r_transport);
        tp__conn_unref(&c->tc_base);
        tp__free(r);
        tcp_setup_fail_errno(c, rv, ": starting the name resolver thread");
    }
}

void
tp__tcp_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    tcp_conn *c = tp__tcp_conn_new(t);
    if (c == NULL) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "tcp: connect to %s: out of memory", addr);
        }
        return;
    }
    if (!tp__aio_begin(aio, t->t_loop, tcp_connect_cancel, c)) {
        tp__conn_unref(&c->tc_base);
        return;
    }
    c->tc_connect_aio = aio;
    snprintf(c->tc_base.c_peer, sizeof(c->tc_base.c_peer), "%s", addr);
    bool secret = false;
    tp_error *err = NULL;
    if (tp__auth_enabled(&secret, &err) != TP_OK) {
        // Refused before any byte goes out, naming the variable.
        tp__tcp_setup_fail(c, tp__error_new(tp_error_status(err), 0, err,
                                            "tcp: connect to %s", addr));
        tp_error_unref(err);
        return;
    }
    // The aio's own timeout, if it has one, is armed by tp__aio_begin and
    // reaches tcp_connect_cancel; otherwise the configured default applies,
    // name resolution included.
    if (aio->a_timeout_ms <= 0 && t->t_cfg.connect_timeout_ms > 0) {
        c->tc_timer_ms = t->t_cfg.connect_timeout_ms;
        tp__timer_start(c->tc_loop, &c->tc_timer,
                        tp__deadline_after_ms(c->tc_timer_ms));
    }

    // Numeric addresses are parsed here; anything else (a host name, or
    // a malformed address, which the resolver then reports) is resolved
    // off the loop thread.
    tp_sockaddr sa;
    if (tp__sockaddr_parse(addr, 0, &sa, NULL) != TP_OK) {
        tcp_connect_resolve(c, addr);
        return;
    }
    tcp_connect_to(c, &sa);
}

static void
tcp_connect_to(tcp_conn *c, const tp_sockaddr *sa_in)
{
    tp_transport *t = c->tc_base.c_transport;
    tp_sockaddr sa = *sa_in;
    tp_error *err = NULL;
    tp__sockaddr_format(&sa, c->tc_base.c_peer, sizeof(c->tc_base.c_peer));

    int fd = socket(sa.u.sa.sa_family,
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        tcp_setup_fail_errno(c, errno, ": socket");
        return;
    }
    c->tc_fd = fd;
    tp__tcp_set_nodelay(fd);
    tp__tcp_set_liveness(fd, &t->t_cfg);
    // Buffer sizes before connect(), so the window scale is negotiated
    // for them.
    tp__tcp_set_bufs(fd, &t->t_cfg);
    int rv;
    do {
        rv = connect(fd, &sa.u.sa, sa.len);
    } while (rv != 0 && errno == EINTR);
    if (rv != 0 && errno != EINPROGRESS) {
        tcp_setup_fail_errno(c, errno, "");
        return;
    }
    c->tc_state = rv == 0 ? TCP_HELLO : TCP_CONNECTING;
    c->tc_readable = true;
    c->tc_writable = true;
    if (tp__loop_fd_add(c->tc_loop, &c->tc_lfd, fd, TP_EV_READ | TP_EV_WRITE,
                        tp__tcp_conn_fd_cb, c, &err) != TP_OK) {
        tp__tcp_setup_fail(c, tp__error_new(tp_error_status(err), 0, err,
                                            "tcp: connect to %s",
                                            c->tc_base.c_peer));
        tp_error_unref(err);
        return;
    }
    if (c->tc_state == TCP_HELLO) {
        tp__tcp_format_local(fd, c->tc_base.c_local,
                             sizeof(c->tc_base.c_local));
        tp__tcp_hello_pump(c);
    }
}
