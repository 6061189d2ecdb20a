// SPDX-License-Identifier: Apache-2.0
// conn.c - the TCP transport's data path: socket options, reads and
// writes gathered from queues of aios (with a small read-ahead stash),
// failure with one first error, close.

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

void
tp__tcp_set_bufs(int fd, const tp_config *cfg)
{
    const tcp_tunables *tt = tp__tcp_tunables_of(cfg);
    tcp_set_buf(fd, SO_SNDBUF, SO_SNDBUFFORCE, tt->tt_sndbuf);
    tcp_set_buf(fd, SO_RCVBUF, SO_RCVBUFFORCE, tt->tt_rcvbuf);
}

void
tp__tcp_set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
        TP_LOG_DEBUG("TP-TCP-SOCKOPT", "tcp: setsockopt TCP_NODELAY: %s",
                     strerror(errno));
    }
}

// Fail fast when the peer host vanishes without a FIN or RST: keepalive
// probes find an idle dead peer, TCP_USER_TIMEOUT bounds unacknowledged
// data, both within TP_TCP_USER_TIMEOUT_MS (DESIGN: nothing waits for a
// 15-minute kernel timeout).
void
tp__tcp_set_liveness(int fd, const tp_config *cfg)
{
    int64_t user_timeout_ms = tp__tcp_tunables_of(cfg)->tt_user_timeout_ms;
    if (user_timeout_ms <= 0) {
        return;
    }
    int ms = (int)TP_MIN(user_timeout_ms, (int64_t)INT32_MAX);
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

void
tp__tcp_format_local(int fd, char *buf, size_t len)
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

tcp_conn *
tp__tcp_conn_new(tp_transport *t)
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
    tp__timer_init(&c->tc_timer, tp__tcp_conn_timer_cb, c);
    memcpy(c->tc_hello_out, TP_HELLO_MAGIC, TCP_HELLO_MAGIC_LEN);
    tp__put_u32le(c->tc_hello_out + 8, TCP_HELLO_VERSION);
    tp__put_u32le(c->tc_hello_out + 12, 0); // flags
    return c;
}

// Stops watching and closes the socket; the conn is dead from now on.
void
tp__tcp_conn_release(tcp_conn *c)
{
    tp__timer_stop(c->tc_loop, &c->tc_timer);
    if (c->tc_fd >= 0) {
        tp__loop_fd_remove(c->tc_loop, &c->tc_lfd);
        // shutdown first: with io_uring a poll request still being
        // cancelled holds a reference to the socket, so close() alone may
        // leave it open and the peer never sees our FIN (a peer waiting
        // for our close then hangs: seen in pipe_proto_test, ~4 % of runs).
        shutdown(c->tc_fd, SHUT_RDWR);
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
    tp__tcp_conn_release(c);
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

void
tp__tcp_read_pump(tcp_conn *c)
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

void
tp__tcp_write_pump(tcp_conn *c)
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

void
tp__tcp_conn_read(tp_conn *bc, tp_aio *aio)
{
    tcp_conn *c = tcp_conn_of(bc);
    tcp_conn_submit(c, aio, &c->tc_readq);
    if (c->tc_state == TCP_OPEN) {
        tp__tcp_read_pump(c);
    }
}

void
tp__tcp_conn_write(tp_conn *bc, tp_aio *aio)
{
    tcp_conn *c = tcp_conn_of(bc);
    tcp_conn_submit(c, aio, &c->tc_writeq);
    if (c->tc_state == TCP_OPEN) {
        tp__tcp_write_pump(c);
    }
}

// ---- conn close / fini -----------------------------------------------------

void
tp__tcp_conn_close(tp_conn *bc)
{
    tcp_conn *c = tcp_conn_of(bc);
    // A conn still being set up holds its own reference, so the generic
    // layer cannot close or free it; if that ever changed, detach it here
    // without dropping a reference the caller no longer has.
    TP_ASSERT(c->tc_connect_aio == NULL && c->tc_listener == NULL);
    if (c->tc_state == TCP_DEAD || c->tc_state == TCP_IDLE) {
        tp__tcp_conn_release(c);
        return;
    }
    tcp_conn_fail(c, tp__error_new(TP_ECLOSED, 0, NULL,
                                   "tcp: connection to peer %s closed "
                                   "locally",
                                   c->tc_base.c_peer));
}

void
tp__tcp_conn_fini(tp_conn *bc)
{
    tcp_conn *c = tcp_conn_of(bc);
    TP_ASSERT(c->tc_fd < 0);
    TP_ASSERT(tp__list_empty(&c->tc_readq) && tp__list_empty(&c->tc_writeq));
    tp_error_unref(c->tc_err);
    c->tc_err = NULL;
}
