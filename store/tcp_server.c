// SPDX-License-Identifier: Apache-2.0
// tcp_server.c - the tcp store server on one event loop (core/loop.h): the
// listening socket and every client connection are fds watched by the
// loop's one thread, each connection a small state machine (read a
// request, run it, write the reply; a get or wait whose keys are missing
// parks on the connection until the engine's watch wakes it or its timer
// fires). Nothing blocks the loop thread, so idle connections cost an fd
// and a few hundred bytes, not a thread. The hellos and the job secret:
// tcp_server_hello.c; requests: tcp_server_req.c; bounds:
// tcp_server_opts.c.
//
// A malformed request (bad magic or op, a length over its bound, a key
// with a NUL) is logged (TP-STORE-PROTO) and closes that connection only.
//
// Everything but start and stop runs on the loop thread; the engine's
// kv_mtx is the only lock (taken inside the tp__kv calls only).

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "core/wire.h"
#include "tcp_server_int.h"

#define ACCEPT_RETRY_MS 100
// Input buffered beyond a request (pipelined by a client) is read only up
// to this, so a client that sends while it waits cannot grow our memory.
#define CONN_IN_SLACK (64 * 1024)
// Buffers larger than this are freed when they empty.
#define CONN_BUF_KEEP (16 * 1024)

static void conn_pump(srv_conn *c);

// ---- connections ----

static void
conn_task_fn(void *arg)
{
    srv_conn *c = arg;
    c->sc_task_queued = false;
    if (c->sc_state == SC_DEAD) {
        tp__free(c);
        return;
    }
    conn_pump(c);
}

void
tp__srv_conn_schedule(srv_conn *c)
{
    if (!c->sc_task_queued) {
        c->sc_task_queued = true;
        tp__loop_defer(c->sc_srv->srv_loop, &c->sc_task);
    }
}

void
tp__srv_conn_close(srv_conn *c)
{
    if (c->sc_state == SC_DEAD) {
        return;
    }
    tp_store_server *srv = c->sc_srv;
    tp__srv_req_unpark(c);
    tp__timer_stop(srv->srv_loop, &c->sc_timer);
    tp__loop_fd_remove(srv->srv_loop, &c->sc_lfd);
    shutdown(c->sc_fd, SHUT_RDWR);
    close(c->sc_fd);
    c->sc_fd = -1;
    if (c->sc_prev != NULL) {
        c->sc_prev->sc_next = c->sc_next;
    } else {
        srv->srv_conns = c->sc_next;
    }
    if (c->sc_next != NULL) {
        c->sc_next->sc_prev = c->sc_prev;
    }
    srv->srv_nconns--;
    tp__free(c->sc_in);
    tp__free(c->sc_out);
    c->sc_in = c->sc_out = NULL;
    c->sc_state = SC_DEAD;
    tp__srv_conn_schedule(c); // frees it
}

void
tp__srv_out_put(srv_conn *c, const void *p, size_t n)
{
    if (c->sc_out_oom || n == 0) {
        return;
    }
    if (c->sc_out_len + n > c->sc_out_cap) {
        size_t cap = c->sc_out_cap ? c->sc_out_cap : 256;
        while (cap < c->sc_out_len + n) {
            cap *= 2;
        }
        uint8_t *b = tp__realloc(c->sc_out, cap);
        if (b == NULL) {
            c->sc_out_oom = true;
            return;
        }
        c->sc_out = b;
        c->sc_out_cap = cap;
    }
    memcpy(c->sc_out + c->sc_out_len, p, n);
    c->sc_out_len += n;
}

// Arms the connection's timer for its state.
void
tp__srv_conn_arm(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    uint64_t dl = UINT64_MAX;
    switch (c->sc_state) {
    case SC_HELLO:
    case SC_AUTH:
        if (srv->srv_lim.sl_request_ms > 0) {
            dl = c->sc_req_start +
                 (uint64_t)srv->srv_lim.sl_request_ms * 1000000u;
        }
        break;
    case SC_READ:
        if (c->sc_in_len == 0) {
            dl = srv->srv_lim.sl_idle_ms > 0
                     ? tp__deadline_after_ms(srv->srv_lim.sl_idle_ms)
                     : UINT64_MAX;
        } else if (srv->srv_lim.sl_request_ms > 0) {
            dl = c->sc_req_start +
                 (uint64_t)srv->srv_lim.sl_request_ms * 1000000u;
        }
        break;
    case SC_WRITE: // a reply that makes no progress for the idle time
        dl = srv->srv_lim.sl_idle_ms > 0
                 ? tp__deadline_after_ms(srv->srv_lim.sl_idle_ms)
                 : UINT64_MAX;
        break;
    case SC_PARKED: // armed by the request itself
    case SC_DEAD:
        return;
    }
    if (dl == UINT64_MAX) {
        tp__timer_stop(srv->srv_loop, &c->sc_timer);
    } else {
        tp__timer_start(srv->srv_loop, &c->sc_timer, dl);
    }
}

// Reads what the socket has, up to @want more bytes, growing the input
// buffer with what arrives. Returns 1 if bytes came, 0 on EAGAIN, -1 if the
// connection closed (it is closed then).
static int
conn_read(srv_conn *c, size_t want)
{
    if (c->sc_in_len + want > c->sc_in_cap) {
        size_t cap = TP_MAX(c->sc_in_cap * 2, c->sc_in_len + 4096);
        cap = TP_MIN(cap, c->sc_in_len + want);
        uint8_t *b = tp__realloc(c->sc_in, cap);
        if (b == NULL) {
            TP_LOG_WARN("TP-STORE-CONN",
                        "store server %s: peer %s: out of memory for a "
                        "request; closing the connection",
                        c->sc_srv->srv_addr, c->sc_peer);
            tp__srv_conn_close(c);
            return -1;
        }
        c->sc_in = b;
        c->sc_in_cap = cap;
    }
    ssize_t n;
    do {
        n = recv(c->sc_fd, c->sc_in + c->sc_in_len, c->sc_in_cap - c->sc_in_len,
                 0);
    } while (n < 0 && errno == EINTR);
    if (n > 0) {
        c->sc_in_len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        c->sc_readable = false;
        return 0;
    }
    tp_store_server *srv = c->sc_srv;
    if (n == 0 && c->sc_state == SC_READ && c->sc_in_len == 0) {
        TP_LOG_DEBUG("TP-STORE-CONN", "store server %s: peer %s: closed",
                     srv->srv_addr, c->sc_peer);
    } else if (n == 0) {
        TP_LOG_INFO("TP-STORE-CONN",
                    "store server %s: peer %s: closed the connection %s",
                    srv->srv_addr, c->sc_peer,
                    c->sc_state == SC_PARKED ? "while waiting"
                                             : "in the middle of a request");
    } else {
        TP_LOG_INFO("TP-STORE-CONN", "store server %s: peer %s: %s (%s)",
                    srv->srv_addr, c->sc_peer, strerror(errno),
                    tp__errno_name(errno));
    }
    tp__srv_conn_close(c);
    return -1;
}

// Writes the reply; true once it is all sent (then the buffer is reset).
bool
tp__srv_conn_flush(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    if (c->sc_out_oom) {
        TP_LOG_WARN("TP-STORE-CONN",
                    "store server %s: peer %s: out of memory for a reply; "
                    "closing the connection",
                    srv->srv_addr, c->sc_peer);
        tp__srv_conn_close(c);
        return false;
    }
    bool progress = false;
    while (c->sc_out_off < c->sc_out_len && c->sc_writable) {
        ssize_t n = send(c->sc_fd, c->sc_out + c->sc_out_off,
                         c->sc_out_len - c->sc_out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->sc_out_off += (size_t)n;
            progress = true;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->sc_writable = false;
        } else if (n < 0 && errno != EINTR) {
            TP_LOG_INFO("TP-STORE-CONN",
                        "store server %s: peer %s: sending a reply: %s (%s)",
                        srv->srv_addr, c->sc_peer, strerror(errno),
                        tp__errno_name(errno));
            tp__srv_conn_close(c);
            return false;
        }
    }
    if (c->sc_out_off < c->sc_out_len) {
        if (progress) {
            tp__srv_conn_arm(c);
        }
        return false;
    }
    c->sc_out_len = c->sc_out_off = 0;
    if (c->sc_out_cap > CONN_BUF_KEEP) {
        tp__free(c->sc_out);
        c->sc_out = NULL;
        c->sc_out_cap = 0;
    }
    return true;
}

static void
conn_consume(srv_conn *c, size_t n)
{
    memmove(c->sc_in, c->sc_in + n, c->sc_in_len - n);
    c->sc_in_len -= n;
    if (c->sc_in_len == 0 && c->sc_in_cap > CONN_BUF_KEEP) {
        tp__free(c->sc_in);
        c->sc_in = NULL;
        c->sc_in_cap = 0;
    }
}

// One step of reading a request: parse what is buffered, run a whole
// request, or read more. False when the connection waits for an event
// (or died).
static bool
conn_step_read(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    srv_req r;
    size_t need = 0;
    const char *why = NULL;
    srv_parse rc = tp__srv_req_parse(c, &r, &need, &why);
    if (rc == SRV_PARSE_BAD) {
        TP_LOG_WARN("TP-STORE-PROTO",
                    "store server %s: peer %s: protocol error: %s; closing "
                    "the connection",
                    srv->srv_addr, c->sc_peer, why);
        tp__srv_conn_close(c);
        return false;
    }
    if (rc == SRV_PARSE_OK) {
        tp__srv_req_run(c, &r);
        conn_consume(c, r.r_len);
        c->sc_req_start = 0;
        return true;
    }
    if (c->sc_in_len > 0 && c->sc_req_start == 0) {
        c->sc_req_start = tp__now_ns();
    }
    int got = c->sc_readable ? conn_read(c, need - c->sc_in_len) : 0;
    if (got == 0) {
        tp__srv_conn_arm(c);
    }
    return got > 0;
}

// A parked connection reads only to learn whether its client left (and to
// keep a little pipelined input).
static void
conn_step_parked(srv_conn *c)
{
    while (c->sc_readable && c->sc_in_len < CONN_IN_SLACK) {
        if (conn_read(c, CONN_IN_SLACK - c->sc_in_len) <= 0) {
            return;
        }
    }
}

static void
conn_pump(srv_conn *c)
{
    for (;;) {
        switch (c->sc_state) {
        case SC_DEAD:
            return;
        case SC_HELLO:
            if (!tp__srv_conn_step_hello(c)) {
                tp__srv_conn_arm(c);
                return;
            }
            break;
        case SC_AUTH:
            if (!tp__srv_conn_step_auth(c)) {
                tp__srv_conn_arm(c);
                return;
            }
            break;
        case SC_PARKED:
            conn_step_parked(c);
            return;
        case SC_WRITE:
            if (!tp__srv_conn_flush(c)) {
                return;
            }
            c->sc_state = SC_READ;
            tp__srv_conn_arm(c);
            break;
        case SC_READ:
            if (!conn_step_read(c)) {
                return;
            }
            break;
        }
    }
}

static void
conn_fd_cb(tp_loop_fd *lfd, uint32_t events)
{
    srv_conn *c = lfd->lf_arg;
    if (events & (TP_EV_READ | TP_EV_ERROR | TP_EV_HUP)) {
        c->sc_readable = true;
    }
    if (events & (TP_EV_WRITE | TP_EV_ERROR)) {
        c->sc_writable = true;
    }
    if (c->sc_state == SC_PARKED && (events & TP_EV_HUP) &&
        c->sc_in_len >= CONN_IN_SLACK) {
        TP_LOG_INFO("TP-STORE-CONN",
                    "store server %s: peer %s: closed the connection while "
                    "waiting",
                    c->sc_srv->srv_addr, c->sc_peer);
        tp__srv_conn_close(c);
        return;
    }
    conn_pump(c);
}

// Best effort, before a close: one non-blocking send of a last reply
// header (+ a TP_ETIMEDOUT error text for TP_STORE_R_ERROR).
static void
conn_send_last(srv_conn *c, uint8_t status, const char *msg)
{
    uint8_t b[TP_STORE_RHDR_LEN + 8 + 256] = {0};
    size_t n = TP_STORE_RHDR_LEN;
    tp__put_u32le(b, TP_STORE_MAGIC);
    b[4] = status;
    if (msg != NULL) {
        size_t ml = TP_MIN(strlen(msg), (size_t)256);
        tp__put_u32le(b + n, (uint32_t)(int32_t)TP_ETIMEDOUT);
        tp__put_u32le(b + n + 4, (uint32_t)ml);
        memcpy(b + n + 8, msg, ml);
        n += 8 + ml;
    }
    ssize_t w = send(c->sc_fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    TP_UNUSED(w);
}

static void
conn_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    srv_conn *c = arg;
    tp_store_server *srv = c->sc_srv;
    switch (c->sc_state) {
    case SC_PARKED:
        tp__srv_req_expire(c);
        return;
    case SC_AUTH:
        TP_LOG_WARN("TP-STORE-AUTH",
                    "store server %s: peer %s: job-secret exchange not done "
                    "within %lld ms (TP_STORE_REQUEST_TIMEOUT_MS); "
                    "connection dropped",
                    srv->srv_addr, c->sc_peer,
                    (long long)srv->srv_lim.sl_request_ms);
        break;
    case SC_HELLO:
        TP_LOG_WARN("TP-STORE-HELLO",
                    "store server %s: peer %s: no hello within %lld ms "
                    "(TP_STORE_REQUEST_TIMEOUT_MS; %u of %u bytes); "
                    "connection dropped",
                    srv->srv_addr, c->sc_peer,
                    (long long)srv->srv_lim.sl_request_ms, c->sc_hello_rcvd,
                    TP_STORE_HELLO_LEN);
        break;
    case SC_READ:
        if (c->sc_in_len == 0) {
            // Bytes that arrived with this timer are not idleness.
            if (c->sc_readable || conn_read(c, 4096) != 0) {
                tp__srv_conn_schedule(c);
                return;
            }
            TP_LOG_INFO("TP-STORE-IDLE",
                        "store server %s: peer %s: idle for %lld ms "
                        "(TP_STORE_IDLE_TIMEOUT_MS); closing the connection",
                        srv->srv_addr, c->sc_peer,
                        (long long)srv->srv_lim.sl_idle_ms);
            conn_send_last(c, TP_STORE_R_IDLE, NULL);
        } else {
            TP_LOG_WARN("TP-STORE-PROTO",
                        "store server %s: peer %s: request not complete "
                        "within %lld ms (TP_STORE_REQUEST_TIMEOUT_MS; %zu "
                        "bytes received); closing the connection",
                        srv->srv_addr, c->sc_peer,
                        (long long)srv->srv_lim.sl_request_ms, c->sc_in_len);
            char msg[256];
            snprintf(msg, sizeof(msg),
                     "store server %s: request not complete within %lld ms "
                     "(TP_STORE_REQUEST_TIMEOUT_MS); connection closed",
                     srv->srv_addr, (long long)srv->srv_lim.sl_request_ms);
            conn_send_last(c, TP_STORE_R_ERROR, msg);
        }
        break;
    case SC_WRITE:
        TP_LOG_WARN("TP-STORE-CONN",
                    "store server %s: peer %s: did not read its reply for "
                    "%lld ms; closing the connection",
                    srv->srv_addr, c->sc_peer,
                    (long long)srv->srv_lim.sl_idle_ms);
        break;
    case SC_DEAD:
        return;
    }
    tp__srv_conn_close(c);
}

// ---- accepting ----

static void
srv_conn_new(tp_store_server *srv, int fd, const tp_sockaddr *peer)
{
    srv_conn *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        TP_LOG_WARN("TP-STORE-ACCEPT",
                    "store server %s: out of memory for a connection; "
                    "dropped it",
                    srv->srv_addr);
        close(fd);
        return;
    }
    c->sc_srv = srv;
    c->sc_fd = fd;
    c->sc_state = SC_HELLO;
    c->sc_req_start = tp__now_ns();
    c->sc_readable = true;
    c->sc_writable = true;
    tp__sockaddr_format(peer, c->sc_peer, sizeof(c->sc_peer));
    tp__task_init(&c->sc_task, conn_task_fn, c);
    tp__timer_init(&c->sc_timer, conn_timer_cb, c);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    tp_error *err = NULL;
    if (tp__loop_fd_add(srv->srv_loop, &c->sc_lfd, fd, TP_EV_READ | TP_EV_WRITE,
                        conn_fd_cb, c, &err) != TP_OK) {
        TP_LOG_WARN("TP-STORE-ACCEPT", "store server %s: peer %s: %s",
                    srv->srv_addr, c->sc_peer, tp_error_message(err));
        tp_error_unref(err);
        close(fd);
        tp__free(c);
        return;
    }
    c->sc_next = srv->srv_conns;
    if (srv->srv_conns != NULL) {
        srv->srv_conns->sc_prev = c;
    }
    srv->srv_conns = c;
    srv->srv_nconns++;
    uint8_t h[TP_STORE_HELLO_LEN];
    tp__srv_hello(h, srv->srv_hello_flags);
    tp__srv_out_put(c, h, sizeof(h));
    tp__srv_conn_arm(c);
    tp__srv_conn_schedule(c);
}

// At the connection cap: close the new connection at once, after a hello
// flagged TP_STORE_HELLO_FULL. Logged at most once a second, with the
// number refused so far.
static void
srv_refuse(tp_store_server *srv, int fd, const tp_sockaddr *pa)
{
    srv->srv_refused++;
    uint64_t now = tp__now_ns();
    if (srv->srv_refused_log_ns == 0 ||
        now - srv->srv_refused_log_ns >= 1000000000u) {
        char peer[TP_SOCKADDR_STRLEN];
        tp__sockaddr_format(pa, peer, sizeof(peer));
        TP_LOG_WARN("TP-STORE-MAX-CONNS",
                    "store server %s: refused peer %s: %zu connections open, "
                    "the most allowed (TP_STORE_MAX_CONNS=%lld; %llu refused "
                    "so far)",
                    srv->srv_addr, peer, srv->srv_nconns,
                    (long long)srv->srv_lim.sl_max_conns,
                    (unsigned long long)srv->srv_refused);
        srv->srv_refused_log_ns = now;
    }
    // A hello flagged "full" tells a tpipe client why (best effort).
    uint8_t h[TP_STORE_HELLO_LEN];
    tp__srv_hello(h, srv->srv_hello_flags | TP_STORE_HELLO_FULL);
    ssize_t w = send(fd, h, sizeof(h), MSG_NOSIGNAL | MSG_DONTWAIT);
    TP_UNUSED(w);
    close(fd);
}

static void
srv_accept_all(tp_store_server *srv)
{
    while (!srv->srv_stopping) {
        tp_sockaddr pa;
        pa.len = sizeof(pa.u.ss);
        int fd = accept4(srv->srv_lfd, &pa.u.sa, &pa.len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) {
                return;
            }
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                // The connection stays in the backlog and no new edge
                // comes for it: retry later.
                TP_LOG_WARN("TP-STORE-ACCEPT",
                            "store server %s: accept: %s (%s); retrying in "
                            "%d ms",
                            srv->srv_addr, strerror(e), tp__errno_name(e),
                            ACCEPT_RETRY_MS);
                tp__timer_start(srv->srv_loop, &srv->srv_accept_timer,
                                tp__deadline_after_ms(ACCEPT_RETRY_MS));
                return;
            }
            continue; // that connection died before we took it
        }
        if ((int64_t)srv->srv_nconns >= srv->srv_lim.sl_max_conns) {
            srv_refuse(srv, fd, &pa);
            continue;
        }
        srv_conn_new(srv, fd, &pa);
    }
}

static void
srv_listen_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    srv_accept_all(lfd->lf_arg);
}

static void
srv_accept_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    srv_accept_all(arg);
}

// Loop thread: the listening socket joins the loop.
typedef struct srv_start_call {
    tp_store_server *ssc_srv;
    tp_status ssc_st;
    tp_error *ssc_err;
} srv_start_call;

static void
srv_start_fn(void *arg)
{
    srv_start_call *sc = arg;
    tp_store_server *srv = sc->ssc_srv;
    sc->ssc_st = tp__loop_fd_add(srv->srv_loop, &srv->srv_lwatch, srv->srv_lfd,
                                 TP_EV_READ, srv_listen_cb, srv, &sc->ssc_err);
    if (sc->ssc_st == TP_OK) {
        srv->srv_lwatched = true;
        srv_accept_all(srv);
    }
}

// Loop thread: stop accepting, close every connection (their tasks free
// them right after this returns).
static void
srv_stop_fn(void *arg)
{
    tp_store_server *srv = arg;
    srv->srv_stopping = true;
    tp__timer_stop(srv->srv_loop, &srv->srv_accept_timer);
    if (srv->srv_lwatched) {
        tp__loop_fd_remove(srv->srv_loop, &srv->srv_lwatch);
        srv->srv_lwatched = false;
    }
    while (srv->srv_conns != NULL) {
        tp__srv_conn_close(srv->srv_conns);
    }
}

tp_status
tp_store_server_start(const char *addr, tp_store_server **srv_p,
                      tp_error **err_p)
{
    return tp_store_server_start_opts(addr, NULL, srv_p, err_p);
}

tp_status
tp_store_server_start_opts(const char *addr,
                           const tp_store_server_options *opts,
                           tp_store_server **srv_p, tp_error **err_p)
{
    tp_config cfg;
    tp_status st = tp__config_load(&cfg, err_p);
    if (st != TP_OK) {
        return st;
    }
    srv_limits lim;
    st = tp__srv_limits_load(opts, cfg.store_max_value, &lim, err_p);
    if (st != TP_OK) {
        return st;
    }
    bool auth = false;
    st = tp__auth_enabled(&auth, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "store server %s", addr);
    }
    tp_hostport hp;
    st = tp__sockaddr_split(addr, TP_SOCKADDR_EMPTY_HOST, &hp, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "store server");
    }
    bool wildcard = hp.hp_host[0] == '\0';
    if (wildcard) {
        snprintf(hp.hp_host, sizeof(hp.hp_host), "0.0.0.0");
    }
    tp_sockaddr sa;
    st = tp__sockaddr_from_hostport(&hp, addr, TP_SOCKADDR_RESOLVE, &sa, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "store server");
    }
    tp_store_server *srv = tp__zalloc(sizeof(*srv));
    if (srv == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "store server: out of memory");
    }
    srv->srv_lim = lim;
    srv->srv_hello_flags = auth ? TP_AUTH_HELLO_FLAG : 0;
    char shown[TP_SOCKADDR_STRLEN];
    tp__sockaddr_format_url(&sa, "tcp", shown, sizeof(shown));
    srv->srv_lfd = socket(sa.u.sa.sa_family,
                          SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (srv->srv_lfd < 0) {
        st = tp__error_errno(err_p, errno, "store server %s: socket", shown);
        goto free_srv;
    }
    int one = 1;
    setsockopt(srv->srv_lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(srv->srv_lfd, &sa.u.sa, sa.len) != 0) {
        st = tp__error_errno(err_p, errno, "store server %s: bind", shown);
        goto close_lfd;
    }
    if (listen(srv->srv_lfd, 1024) != 0) {
        st = tp__error_errno(err_p, errno, "store server %s: listen", shown);
        goto close_lfd;
    }
    tp_sockaddr bound;
    bound.len = sizeof(bound.u.ss);
    getsockname(srv->srv_lfd, &bound.u.sa, &bound.len);
    if (wildcard) {
        // Show an address the other hosts can reach.
        char host[TP_SOCKADDR_STRLEN - 16], why[160];
        tp_error *e2 = NULL;
        if (tp__sockaddr_choose(&cfg, AF_INET, host, sizeof(host), why,
                                sizeof(why), &e2) != TP_OK) {
            tp_error_unref(e2);
            snprintf(host, sizeof(host), "127.0.0.1");
        }
        snprintf(srv->srv_addr, sizeof(srv->srv_addr), "tcp://%s:%u", host,
                 (unsigned)tp__sockaddr_port(&bound));
    } else {
        tp__sockaddr_format_url(&bound, "tcp", srv->srv_addr,
                                sizeof(srv->srv_addr));
    }
    tp__kv_init(&srv->srv_kv);
    tp__kv_set_watch(&srv->srv_kv, tp__srv_req_watch, srv);
    tp__kv_set_max_bytes(&srv->srv_kv, (uint64_t)lim.sl_max_bytes);
    tp__timer_init(&srv->srv_accept_timer, srv_accept_timer_cb, srv);
    // The loop only waits: spinning before it sleeps would burn a core
    // for a server that mostly idles.
    cfg.loop_spin_us = 0;
    st = tp__loop_create(&cfg, "store-srv", &srv->srv_loop, err_p);
    if (st != TP_OK) {
        st = tp__error_wrap(err_p, st, "store server %s", shown);
        goto fini;
    }
    srv_start_call sc = {srv, TP_OK, NULL};
    tp__loop_call(srv->srv_loop, srv_start_fn, &sc);
    if (sc.ssc_st != TP_OK) {
        st = tp__error_set(err_p, sc.ssc_st, "store server %s: %s", shown,
                           tp_error_message(sc.ssc_err));
        tp_error_unref(sc.ssc_err);
        goto destroy_loop;
    }
    TP_LOG_INFO("TP-STORE-LISTEN", "store server listening on %s%s",
                srv->srv_addr, auth ? " (job secret required)" : "");
    char what[sizeof(srv->srv_addr) + 32];
    snprintf(what, sizeof(what), "store server %s", srv->srv_addr);
    tp__auth_warn_open(what, &bound.u.sa);
    *srv_p = srv;
    return TP_OK;

destroy_loop:
    tp__loop_destroy(srv->srv_loop);
fini:
    tp__kv_fini(&srv->srv_kv);
close_lfd:
    close(srv->srv_lfd);
free_srv:
    tp__free(srv);
    return st;
}

const char *
tp_store_server_addr(const tp_store_server *srv)
{
    return srv->srv_addr;
}

void
tp_store_server_stop(tp_store_server *srv)
{
    if (srv == NULL) {
        return;
    }
    tp__loop_call(srv->srv_loop, srv_stop_fn, srv);
    tp__loop_destroy(srv->srv_loop);
    close(srv->srv_lfd);
    tp__kv_fini(&srv->srv_kv);
    tp__free(srv);
}
