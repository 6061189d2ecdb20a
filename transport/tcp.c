// SPDX-License-Identifier: Apache-2.0
// tcp.c - the TCP transport: non-blocking sockets on the loop thread.
//
// Everything here except tcp_is_viable, tcp_ctx_init and tcp_listen runs on
// the loop thread (transport.c guarantees it), so there are no locks.
//
// Each socket is registered once with the loop for READ|WRITE; readiness
// is edge-style, so I/O runs until EAGAIN, and tc_readable/tc_writable
// remember whether the last attempt hit EAGAIN (then the next attempt
// waits for an event instead of making a syscall that would fail). A new
// operation is tried at once (optimistic I/O): a write submitted on the
// loop thread (unless submissions from other threads are queued ahead of
// it) is on the wire before conn_write returns.
//
// Reads and writes are queues of aios; a syscall gathers the remaining
// iovs of the queued aios in order (readv / sendmsg, at most TCP_MAX_IOV
// iovecs and TCP_IO_CAP bytes), straight into or out of the caller's
// buffers. a_prov_u64[0] counts the bytes an aio has moved, a_prov_u64[1]
// is its total, a_prov_data[0] the queue it is on. Only the head of a
// queue can have moved bytes without being complete.
//
// A connection error (EOF, reset, a canceled op that had moved bytes,
// close) is recorded once in tc_err; every pending op and every later op
// fails with a reference to that one error.
//
// Connection set-up: both sides send a 16-byte hello (TP_HELLO_MAGIC,
// u32le version, u32le flags) and read the peer's. A listener hands a
// connection to an accept aio only after a valid hello; a bad one is
// logged (TP-TCP-HELLO) and dropped. A listener takes connections from the
// kernel as soon as it exists, whether or not an accept is pending (so a
// connect completes without waiting for the peer to call accept); those not
// yet asked for wait, handshaked, in tl_readyq (at most TCP_MAX_PENDING per
// listener, with those still handshaking; beyond that they wait in the
// kernel's backlog).

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
#include "sockaddr.h"
#include "transport.h"

#define TCP_MAX_IOV         64
#define TCP_IO_CAP          (UINT64_C(1) << 30) // bytes per syscall
#define TCP_HELLO_VERSION   1u
#define TCP_HELLO_MAGIC_LEN 8u
#define TCP_MAX_PENDING     128 // per listener: handshaking + waiting for accept
#define TCP_ACCEPT_RETRY_MS 100
#define TCP_STASH           4096u       // read-ahead bytes per conn
#define TCP_STASH_MAX_READ  (64u << 10) // reads up to this size read ahead
#define TCP_PFX_LEN         640 // "tcp: listener <addr>: connection from peer <peer>"

_Static_assert(sizeof(TP_HELLO_MAGIC) - 1 == TCP_HELLO_MAGIC_LEN,
               "hello magic is 8 bytes");
_Static_assert(TP_HELLO_LEN == TCP_HELLO_MAGIC_LEN + 4 + 4,
               "hello = magic + u32le version + u32le flags");

enum tcp_state {
    TCP_IDLE,       // allocated, no socket yet
    TCP_CONNECTING, // connect() in progress
    TCP_HELLO,      // exchanging hellos
    TCP_OPEN,       // usable
    TCP_DEAD,       // failed or closed; fd released
};

typedef struct tcp_listener tcp_listener;

typedef struct tcp_conn {
    tp_conn tc_base; // the generic part; must be first
    tp_loop *tc_loop;
    int tc_fd;
    int tc_state;
    bool tc_readable; // false once drained, until the next READ event
    bool tc_hup_seen; // an event said the peer shut down or errored
    bool tc_writable;
    tp_loop_fd tc_lfd;
    tp_list tc_readq;  // tp_aio, in order
    tp_list tc_writeq; // tp_aio, in order
    tp_error *tc_err;  // the first fatal error
    // Read-ahead of small reads: bytes received beyond the queued reads.
    uint32_t tc_stash_off;
    uint32_t tc_stash_len;
    uint8_t tc_stash[TCP_STASH];
    // Set-up.
    uint8_t tc_hello_out[TP_HELLO_LEN];
    uint8_t tc_hello_in[TP_HELLO_LEN];
    unsigned tc_hello_sent;
    unsigned tc_hello_rcvd;
    tp_timer tc_timer;         // connect or handshake deadline
    int64_t tc_timer_ms;       // its length, for messages
    tcp_listener *tc_listener; // listener side, until handed to an accept
    tp_list_node tc_lnode;     // on tl_hsq or tl_readyq
    tp_aio *tc_connect_aio;    // connecting side, until connected
} tcp_conn;

struct tcp_listener {
    tp_listener tl_base; // the generic part; must be first
    tp_loop *tl_loop;
    int tl_fd;
    bool tl_registered; // fd added to the loop (tcp_listener_start_task)
    bool tl_acceptable; // false after accept4 said EAGAIN
    bool tl_closed;
    bool tl_in_service; // tcp_listener_service is running
    bool tl_again;      // ... and should run once more
    tp_loop_fd tl_lfd;
    tp_list tl_acceptq; // tp_aio waiting for a connection
    tp_list tl_hsq;     // tcp_conn exchanging hellos
    tp_list tl_readyq;  // tcp_conn handshaked, waiting for an accept
    size_t tl_npending; // conns on tl_hsq + tl_readyq
    tp_timer tl_timer;  // accept retry after EMFILE and the like
    int64_t tl_hs_timeout_ms;
    tp_task tl_start_task; // registers the socket with the loop
    tp_error *tl_err;      // registration failed: accepts fail with this
};

static void tcp_conn_fd_cb(tp_loop_fd *lfd, uint32_t events);
static void tcp_hello_pump(tcp_conn *c);
static void tcp_listener_service(tcp_listener *l);
static void tcp_conn_timer_cb(tp_timer *t, void *arg);

static tcp_conn *
tcp_conn_of(tp_conn *c)
{
    return TP_CONTAINER_OF(c, tcp_conn, tc_base);
}

static tcp_listener *
tcp_listener_of(tp_listener *l)
{
    return TP_CONTAINER_OF(l, tcp_listener, tl_base);
}

// ---- socket helpers --------------------------------------------------------

static void
tcp_set_buf(int fd, int opt, int force_opt, int64_t bytes)
{
    if (bytes <= 0) {
        return;
    }
    int v = bytes > INT_MAX / 2 ? INT_MAX / 2 : (int)bytes;
    // The *FORCE variant ignores net.core.[rw]mem_max but needs
    // CAP_NET_ADMIN; without it the plain option is capped by the sysctl.
    if (setsockopt(fd, SOL_SOCKET, force_opt, &v, sizeof(v)) != 0 &&
        setsockopt(fd, SOL_SOCKET, opt, &v, sizeof(v)) != 0) {
        TP_LOG_DEBUG("TP-TCP-SOCKOPT", "tcp: setsockopt buffer size %d: %s", v,
                     strerror(errno));
    }
}

static void
tcp_set_bufs(int fd, const tp_config *cfg)
{
    tcp_set_buf(fd, SO_SNDBUF, SO_SNDBUFFORCE, cfg->tcp_sndbuf);
    tcp_set_buf(fd, SO_RCVBUF, SO_RCVBUFFORCE, cfg->tcp_rcvbuf);
}

static void
tcp_set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        TP_LOG_DEBUG("TP-TCP-SOCKOPT", "tcp: setsockopt TCP_NODELAY: %s",
                     strerror(errno));
    }
}

// Fail fast when the peer host vanishes without a FIN or RST: keepalive
// probes find an idle dead peer, TCP_USER_TIMEOUT bounds unacknowledged
// data, both within cfg->tcp_user_timeout_ms (DESIGN: nothing waits for a
// 15-minute kernel timeout).
static void
tcp_set_liveness(int fd, const tp_config *cfg)
{
    if (cfg->tcp_user_timeout_ms <= 0) {
        return;
    }
    int ms = (int)TP_MIN(cfg->tcp_user_timeout_ms, (int64_t)INT32_MAX);
    int one = 1, cnt = 3;
    int idle = TP_MAX(1, ms / 3000), intvl = TP_MAX(1, ms / 6000);
    if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) !=
            0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0) {
        TP_LOG_DEBUG("TP-TCP-SOCKOPT",
                     "tcp: setsockopt keepalive/user "
                     "timeout: %s",
                     strerror(errno));
    }
}

static void
tcp_format_local(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    tp_sockaddr sa;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(buf, len, "?");
        return;
    }
    tp__sockaddr_from_sys(&sa, (struct sockaddr *)&ss, sl);
    tp__sockaddr_format(&sa, buf, len);
}

// ---- conns: common ---------------------------------------------------------

static tcp_conn *
tcp_conn_new(tp_transport *t)
{
    tp_conn *bc = tp__conn_alloc(t);
    if (bc == NULL) {
        return NULL;
    }
    tcp_conn *c = tcp_conn_of(bc);
    c->tc_loop = t->t_loop;
    c->tc_fd = -1;
    c->tc_state = TCP_IDLE;
    TP_LIST_INIT(&c->tc_readq, tp_aio, a_node);
    TP_LIST_INIT(&c->tc_writeq, tp_aio, a_node);
    tp__list_node_init(&c->tc_lnode);
    tp__timer_init(&c->tc_timer, tcp_conn_timer_cb, c);
    memcpy(c->tc_hello_out, TP_HELLO_MAGIC, TCP_HELLO_MAGIC_LEN);
    tp__put_u32le(c->tc_hello_out + 8, TCP_HELLO_VERSION);
    tp__put_u32le(c->tc_hello_out + 12, 0); // flags
    return c;
}

// Stops watching and closes the socket; the conn is dead from now on.
static void
tcp_conn_release(tcp_conn *c)
{
    tp__timer_stop(c->tc_loop, &c->tc_timer);
    if (c->tc_fd >= 0) {
        tp__loop_fd_remove(c->tc_loop, &c->tc_lfd);
        close(c->tc_fd);
        c->tc_fd = -1;
    }
    c->tc_state = TCP_DEAD;
}

// Fails the conn with @err (taken) unless it already failed: releases the
// socket and fails every pending read, then every pending write, each with
// a reference to the first error.
static void
tcp_conn_fail(tcp_conn *c, tp_error *err)
{
    if (c->tc_err == NULL) {
        c->tc_err = err;
        TP_LOG_DEBUG("TP-TCP-CLOSE", "%s", tp_error_message(err));
    } else {
        tp_error_unref(err);
    }
    tcp_conn_release(c);
    tp_aio *a;
    while ((a = tp__list_pop_first(&c->tc_readq)) != NULL) {
        tp__aio_finish(a, tp_error_ref(c->tc_err), a->a_prov_u64[0]);
    }
    while ((a = tp__list_pop_first(&c->tc_writeq)) != NULL) {
        tp__aio_finish(a, tp_error_ref(c->tc_err), a->a_prov_u64[0]);
    }
}

static void
tcp_conn_fail_errno(tcp_conn *c, int errnum, const char *what)
{
    tp_error *err = NULL;
    tp__error_errno(&err, errnum, "tcp: %s peer %s", what, c->tc_base.c_peer);
    tcp_conn_fail(c, err);
}

// ---- reads and writes ------------------------------------------------------

// Completes the aios at the head of @q that @n more bytes finish (and
// zero-length ones), and credits the rest to the new head.
static void
tcp_q_advance(tp_list *q, uint64_t n)
{
    tp_aio *a;
    while ((a = tp__list_first(q)) != NULL) {
        uint64_t need = a->a_prov_u64[1] - a->a_prov_u64[0];
        if (need > n) {
            a->a_prov_u64[0] += n;
            return;
        }
        n -= need;
        tp__list_remove(q, a);
        tp__aio_finish(a, NULL, a->a_prov_u64[1]);
    }
}

// The iovecs of the bytes still to move for the aios of @q, in order.
static int
tcp_q_gather(const tp_list *q, struct iovec *iov, uint64_t *want_p)
{
    int n = 0;
    uint64_t want = 0;
    for (tp_aio *a = tp__list_first(q);
         a != NULL && n < TCP_MAX_IOV && want < TCP_IO_CAP;
         a = tp__list_next(q, a)) {
        uint64_t skip = a->a_prov_u64[0];
        for (unsigned i = 0;
             i < a->a_niov && n < TCP_MAX_IOV && want < TCP_IO_CAP; i++) {
            uint64_t len = a->a_iov[i].iov_len;
            if (skip >= len) {
                skip -= len;
                continue;
            }
            uint64_t take = TP_MIN(len - skip, TCP_IO_CAP - want);
            iov[n].iov_base = (char *)a->a_iov[i].iov_base + skip;
            iov[n].iov_len = (size_t)take;
            n++;
            want += take;
            skip = 0;
        }
    }
    *want_p = want;
    return n;
}

// Copies read-ahead bytes into the queued reads, in order.
static void
tcp_stash_drain(tcp_conn *c)
{
    tp_aio *a;
    while (c->tc_stash_len > 0 && (a = tp__list_first(&c->tc_readq)) != NULL) {
        uint64_t skip = a->a_prov_u64[0];
        uint64_t moved = 0;
        for (unsigned i = 0; i < a->a_niov && c->tc_stash_len > 0; i++) {
            uint64_t len = a->a_iov[i].iov_len;
            if (skip >= len) {
                skip -= len;
                continue;
            }
            uint64_t take = TP_MIN(len - skip, (uint64_t)c->tc_stash_len);
            memcpy((char *)a->a_iov[i].iov_base + skip,
                   c->tc_stash + c->tc_stash_off, (size_t)take);
            c->tc_stash_off += (uint32_t)take;
            c->tc_stash_len -= (uint32_t)take;
            moved += take;
            skip = 0;
        }
        // Completes the head if it is full (and zero-length ones after
        // it); otherwise the stash is empty now.
        tcp_q_advance(&c->tc_readq, moved);
    }
    if (c->tc_stash_len == 0) {
        c->tc_stash_off = 0;
    }
}

static void
tcp_read_pump(tcp_conn *c)
{
    struct iovec iov[TCP_MAX_IOV + 1];
    for (;;) {
        tcp_q_advance(&c->tc_readq, 0);
        if (c->tc_stash_len > 0) {
            tcp_stash_drain(c);
        }
        if (!c->tc_readable || tp__list_empty(&c->tc_readq)) {
            return;
        }
        uint64_t want;
        int n = tcp_q_gather(&c->tc_readq, iov, &want);
        // Small reads also ask for up to TCP_STASH bytes of read-ahead, so
        // that a small header and the start of what follows (or several
        // small messages) take one syscall. Large reads go straight to the
        // caller's buffers only.
        //
        // A short read means the socket was drained when it ran, so the
        // next read would only say EAGAIN: skip that syscall and wait for
        // the next edge. This is safe because any data or FIN arriving
        // after the event we handled brings a new edge, and a FIN or error
        // that arrived before it is flagged in that event (TP_EV_HUP /
        // TP_EV_ERROR): once one was seen, only EAGAIN or EOF stop reads.
        uint64_t asked = want;
        if (want <= TCP_STASH_MAX_READ) {
            iov[n].iov_base = c->tc_stash;
            iov[n].iov_len = TCP_STASH;
            n++;
            asked += TCP_STASH;
        }
        ssize_t r = readv(c->tc_fd, iov, n);
        if (r > 0) {
            uint64_t got = (uint64_t)r;
            if (got < asked && !c->tc_hup_seen) {
                c->tc_readable = false;
            }
            if (got > want) {
                c->tc_stash_off = 0;
                c->tc_stash_len = (uint32_t)(got - want);
                got = want;
            }
            tcp_q_advance(&c->tc_readq, got);
            continue;
        }
        if (r == 0) {
            tcp_conn_fail(c, tp__error_new(TP_ECONNRESET, 0, NULL,
                                           "tcp: read from peer %s: "
                                           "connection closed by peer (EOF)",
                                           c->tc_base.c_peer));
            return;
        }
        int e = errno;
        if (e == EINTR) {
            continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            c->tc_readable = false;
            return;
        }
        tcp_conn_fail_errno(c, e, "read from");
        return;
    }
}

static void
tcp_write_pump(tcp_conn *c)
{
    struct iovec iov[TCP_MAX_IOV];
    for (;;) {
        tcp_q_advance(&c->tc_writeq, 0);
        if (!c->tc_writable || tp__list_empty(&c->tc_writeq)) {
            return;
        }
        uint64_t want;
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)tcp_q_gather(&c->tc_writeq, iov, &want);
        ssize_t r = sendmsg(c->tc_fd, &mh, MSG_NOSIGNAL);
        if (r > 0) {
            tcp_q_advance(&c->tc_writeq, (uint64_t)r);
            continue;
        }
        int e = r == 0 ? EAGAIN : errno;
        if (e == EINTR) {
            continue;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            c->tc_writable = false;
            return;
        }
        tcp_conn_fail_errno(c, e, "write to");
        return;
    }
}

static void
tcp_op_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tcp_conn *c = arg;
    tp_list *q = aio->a_prov_data[0];
    const char *what = q == &c->tc_readq ? "read from" : "write to";
    uint64_t done = aio->a_prov_u64[0];
    uint64_t total = aio->a_prov_u64[1];
    char detail[160] = "";
    if (done > 0) {
        snprintf(detail, sizeof(detail),
                 " with %llu of %llu bytes moved; the stream is unusable "
                 "and the connection closed",
                 (unsigned long long)done, (unsigned long long)total);
    }
    tp_error *err;
    if (reason == TP_ETIMEDOUT) {
        err = tp__error_new(
            TP_ETIMEDOUT, 0, NULL, "tcp: %s peer %s timed out after %lld ms%s",
            what, c->tc_base.c_peer, (long long)aio->a_timeout_ms, detail);
    } else if (reason == TP_ECLOSED) {
        err = tp__error_new(TP_ECLOSED, 0, NULL, "tcp: %s peer %s: closed%s",
                            what, c->tc_base.c_peer, detail);
    } else {
        err = tp__error_new(reason, 0, NULL, "tcp: %s peer %s canceled%s", what,
                            c->tc_base.c_peer, detail);
    }
    tp__list_remove(q, aio);
    if (done == 0) {
        tp__aio_finish(aio, err, 0);
        return;
    }
    // Bytes of this op are on the wire (or in the caller's buffer): the
    // byte stream can no longer be framed. Close the connection; the other
    // ops fail with a connection-scope error caused by this one.
    tp_error *cerr =
        tp__error_new(TP_ECLOSED, 0, err, "tcp: connection to peer %s closed",
                      c->tc_base.c_peer);
    tp__aio_finish(aio, err, done);
    tcp_conn_fail(c, cerr);
}

static void
tcp_conn_submit(tcp_conn *c, tp_aio *aio, tp_list *q)
{
    if (!tp__aio_begin(aio, c->tc_loop, tcp_op_cancel, c)) {
        return;
    }
    if (c->tc_err != NULL) {
        tp__aio_finish(aio, tp_error_ref(c->tc_err), 0);
        return;
    }
    TP_ASSERT(c->tc_state == TCP_OPEN);
    aio->a_prov_data[0] = q;
    aio->a_prov_u64[0] = 0;
    aio->a_prov_u64[1] = tp__aio_iov_total(aio);
    tp__list_append(q, aio);
}

static void
tcp_conn_read(tp_conn *bc, tp_aio *aio)
{
    tcp_conn *c = tcp_conn_of(bc);
    tcp_conn_submit(c, aio, &c->tc_readq);
    if (c->tc_state == TCP_OPEN) {
        tcp_read_pump(c);
    }
}

static void
tcp_conn_write(tp_conn *bc, tp_aio *aio)
{
    tcp_conn *c = tcp_conn_of(bc);
    tcp_conn_submit(c, aio, &c->tc_writeq);
    if (c->tc_state == TCP_OPEN) {
        tcp_write_pump(c);
    }
}

// ---- connection set-up (both sides) -------------------------------------

// "tcp: connect to X" or "tcp: listener tcp://Y: connection from peer X".
static void
tcp_setup_prefix(const tcp_conn *c, char *buf, size_t len)
{
    if (c->tc_listener != NULL) {
        snprintf(buf, len, "tcp: listener %s: connection from peer %s",
                 c->tc_listener->tl_base.l_addr, c->tc_base.c_peer);
    } else {
        snprintf(buf, len, "tcp: connect to %s", c->tc_base.c_peer);
    }
}

// Removes a listener-side conn from its listener's queues.
static void
tcp_listener_detach(tcp_conn *c)
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
static void
tcp_setup_fail(tcp_conn *c, tp_error *err)
{
    tcp_listener *l = c->tc_listener;
    if (l != NULL) {
        TP_LOG_WARN("TP-TCP-HELLO", "%s; connection dropped",
                    tp_error_message(err));
        tp_error_unref(err);
        tcp_listener_detach(c);
        tcp_conn_release(c);
        tp__conn_unref(&c->tc_base);
        tcp_listener_service(l); // there is room for another one now
        return;
    }
    tp_aio *aio = c->tc_connect_aio;
    c->tc_connect_aio = NULL;
    tcp_conn_release(c);
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
    tcp_setup_prefix(c, pfx, sizeof(pfx));
    tp_error *err = NULL;
    tp__error_errno(&err, errnum, "%s%s", pfx, what);
    tcp_setup_fail(c, err);
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
        tcp_setup_prefix(c, pfx, sizeof(pfx));
        tcp_hex(c->tc_hello_in, n, hex, sizeof(hex));
        tcp_setup_fail(c, tp__error_new(TP_EPROTO, 0, NULL,
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
        tcp_setup_prefix(c, pfx, sizeof(pfx));
        tcp_setup_fail(c, tp__error_new(TP_EPROTO, 0, NULL,
                                        "%s: bad hello: unsupported version "
                                        "%u (this side speaks %u)",
                                        pfx, version, TCP_HELLO_VERSION));
        return false;
    }
    // Flags: none defined in version 1; unknown ones are ignored so that
    // later versions can add optional features.
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
        tcp_listener_detach(c);
        c->tc_listener = l;
        tp__list_append(&l->tl_readyq, c);
        l->tl_npending++;
        TP_LOG_DEBUG("TP-TCP-ACCEPT",
                     "tcp: listener %s: connection from peer %s ready",
                     l->tl_base.l_addr, c->tc_base.c_peer);
        tcp_listener_service(l);
        return;
    }
    tp_aio *aio = c->tc_connect_aio;
    c->tc_connect_aio = NULL;
    TP_LOG_DEBUG("TP-TCP-CONNECT", "tcp: connected to peer %s from %s",
                 c->tc_base.c_peer, c->tc_base.c_local);
    tp__aio_set_output(aio, 0, &c->tc_base);
    tp__aio_finish(aio, NULL, 0);
}

// Sends our hello and reads the peer's, as far as the socket allows.
static void
tcp_hello_pump(tcp_conn *c)
{
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
            tcp_setup_prefix(c, pfx, sizeof(pfx));
            tcp_setup_fail(c,
                           tp__error_new(TP_ECONNRESET, 0, NULL,
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
        tcp_hello_done(c);
    }
}

// The connect or handshake deadline passed.
static void
tcp_conn_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    tcp_conn *c = arg;
    char pfx[TCP_PFX_LEN];
    tcp_setup_prefix(c, pfx, sizeof(pfx));
    if (c->tc_listener != NULL) {
        tcp_setup_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                        "%s: no valid hello within %lld ms "
                                        "(got %u of %u bytes)",
                                        pfx, (long long)c->tc_timer_ms,
                                        c->tc_hello_rcvd, TP_HELLO_LEN));
    } else {
        tcp_setup_fail(
            c, tp__error_new(
                   TP_ETIMEDOUT, 0, NULL, "%s: timed out after %lld ms%s", pfx,
                   (long long)c->tc_timer_ms,
                   c->tc_state == TCP_HELLO ? " (during the handshake)" : ""));
    }
}

static void
tcp_conn_fd_cb(tp_loop_fd *lfd, uint32_t events)
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
            tcp_write_pump(c);
        }
        if (c->tc_state == TCP_OPEN && c->tc_readable &&
            !tp__list_empty(&c->tc_readq)) {
            tcp_read_pump(c);
        }
        break;
    case TCP_HELLO:
        tcp_hello_pump(c);
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
        tcp_format_local(c->tc_fd, c->tc_base.c_local,
                         sizeof(c->tc_base.c_local));
        c->tc_state = TCP_HELLO;
        tcp_hello_pump(c);
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
    tcp_setup_fail(c, err);
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
            tcp_setup_fail(c, r->r_err);
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
    atomic_fetch_sub_explicit(&t->t_nobjs, 1, memory_order_release);
    return NULL;
}

static void
tcp_connect_resolve(tcp_conn *c, const char *addr)
{
    size_t n = strlen(addr) + 1;
    tcp_resolve *r = tp__zalloc(sizeof(*r) + n);
    if (r == NULL) {
        tcp_setup_fail(c, tp__error_new(TP_ENOMEM, 0, NULL,
                                        "tcp: connect to %s: out of memory",
                                        addr));
        return;
    }
    memcpy(r->r_addr, addr, n);
    r->r_conn = c;
    r->r_transport = c->tc_base.c_transport;
    tp__task_init(&r->r_task, tcp_resolve_done, r);
    tp__conn_ref(&c->tc_base);
    atomic_fetch_add_explicit(&r->r_transport->t_nobjs, 1,
                              memory_order_relaxed);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    int rv = pthread_create(&th, &attr, tcp_resolve_thread, r);
    pthread_attr_destroy(&attr);
    if (rv != 0) {
        atomic_fetch_sub_explicit(&r->r_transport->t_nobjs, 1,
                                  memory_order_release);
        tp__conn_unref(&c->tc_base);
        tp__free(r);
        tcp_setup_fail_errno(c, rv, ": starting the name resolver thread");
    }
}

static void
tcp_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    tcp_conn *c = tcp_conn_new(t);
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
    tcp_set_nodelay(fd);
    tcp_set_liveness(fd, &t->t_cfg);
    // Buffer sizes before connect(), so the window scale is negotiated
    // for them.
    tcp_set_bufs(fd, &t->t_cfg);
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
                        tcp_conn_fd_cb, c, &err) != TP_OK) {
        tcp_setup_fail(c,
                       tp__error_new(tp_error_status(err), 0, err,
                                     "tcp: connect to %s", c->tc_base.c_peer));
        tp_error_unref(err);
        return;
    }
    if (c->tc_state == TCP_HELLO) {
        tcp_format_local(fd, c->tc_base.c_local, sizeof(c->tc_base.c_local));
        tcp_hello_pump(c);
    }
}

// ---- conn close / fini -----------------------------------------------------

static void
tcp_conn_close(tp_conn *bc)
{
    tcp_conn *c = tcp_conn_of(bc);
    // A conn still being set up holds its own reference, so the generic
    // layer cannot close or free it; if that ever changed, detach it here
    // without dropping a reference the caller no longer has.
    TP_ASSERT(c->tc_connect_aio == NULL && c->tc_listener == NULL);
    if (c->tc_state == TCP_DEAD || c->tc_state == TCP_IDLE) {
        tcp_conn_release(c);
        return;
    }
    tcp_conn_fail(c, tp__error_new(TP_ECLOSED, 0, NULL,
                                   "tcp: connection to peer %s closed "
                                   "locally",
                                   c->tc_base.c_peer));
}

static void
tcp_conn_fini(tp_conn *bc)
{
    tcp_conn *c = tcp_conn_of(bc);
    TP_ASSERT(c->tc_fd < 0);
    TP_ASSERT(tp__list_empty(&c->tc_readq) && tp__list_empty(&c->tc_writeq));
    tp_error_unref(c->tc_err);
    c->tc_err = NULL;
}

// ---- listener --------------------------------------------------------------

static void
tcp_listener_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    tcp_listener *l = arg;
    l->tl_acceptable = true;
    tcp_listener_service(l);
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
    tcp_conn *c = tcp_conn_new(l->tl_base.l_transport);
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
    tcp_format_local(fd, c->tc_base.c_local, sizeof(c->tc_base.c_local));
    c->tc_fd = fd;
    c->tc_state = TCP_HELLO;
    c->tc_readable = true;
    c->tc_writable = true;
    c->tc_listener = l;
    tp__list_append(&l->tl_hsq, c);
    l->tl_npending++;
    tcp_set_nodelay(fd);
    tcp_set_liveness(fd, &l->tl_base.l_transport->t_cfg);
    tp_error *err = NULL;
    if (tp__loop_fd_add(l->tl_loop, &c->tc_lfd, fd, TP_EV_READ | TP_EV_WRITE,
                        tcp_conn_fd_cb, c, &err) != TP_OK) {
        char pfx[TCP_PFX_LEN];
        tcp_setup_prefix(c, pfx, sizeof(pfx));
        tcp_setup_fail(c,
                       tp__error_new(tp_error_status(err), 0, err, "%s", pfx));
        tp_error_unref(err);
        return;
    }
    if (l->tl_hs_timeout_ms > 0) {
        c->tc_timer_ms = l->tl_hs_timeout_ms;
        tp__timer_start(l->tl_loop, &c->tc_timer,
                        tp__deadline_after_ms(c->tc_timer_ms));
    }
    tcp_hello_pump(c);
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
static void
tcp_listener_service(tcp_listener *l)
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
                tcp_conn_release(c);
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
    tcp_listener_service(l);
}

// Loop thread, posted by tcp_listen (which must not touch the loop): the
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
    tcp_listener_service(l);
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

static void
tcp_accept(tp_listener *bl, tp_aio *aio)
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
    tcp_listener_service(l);
}

static void
tcp_listener_drop_conns(tp_list *q)
{
    tcp_conn *c;
    while ((c = tp__list_first(q)) != NULL) {
        tcp_listener_detach(c);
        tcp_conn_release(c);
        tp__conn_unref(&c->tc_base);
    }
}

static void
tcp_listener_close(tp_listener *bl)
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
static tp_status
tcp_listen(tp_transport *t, tp_listener *bl, const char *addr, tp_error **err_p)
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
    tcp_set_bufs(fd, &t->t_cfg);
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

// ---- transport -------------------------------------------------------------

static bool
tcp_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    TP_UNUSED(cfg);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, why_len, "socket(AF_INET, SOCK_STREAM): %s (%s)",
                     strerror(e), tp__errno_name(e));
            return false;
        }
    }
    close(fd);
    return true;
}

static tp_status
tcp_ctx_init(tp_transport *t, tp_error **err_p)
{
    TP_UNUSED(err_p);
    // TCP reaches any host that routes to the address: universal.
    snprintf(t->t_domain, sizeof(t->t_domain), "tcp");
    return TP_OK;
}

static void
tcp_ctx_fini(tp_transport *t)
{
    TP_UNUSED(t);
}

const tp_transport_ops tp__transport_tcp_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "tcp",
    .ctx_size = 0,
    .listener_size = sizeof(tcp_listener),
    .conn_size = sizeof(tcp_conn),
    .is_viable = tcp_is_viable,
    .ctx_init = tcp_ctx_init,
    .ctx_fini = tcp_ctx_fini,
    .listen = tcp_listen,
    .accept = tcp_accept,
    .listener_close = tcp_listener_close,
    .connect = tcp_connect,
    .conn_read = tcp_conn_read,
    .conn_write = tcp_conn_write,
    .conn_close = tcp_conn_close,
    .conn_fini = tcp_conn_fini,
};
