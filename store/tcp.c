// SPDX-License-Identifier: Apache-2.0
// tcp.c - the tcp store client: one blocking socket, one request and one
// reply at a time (store.c serialises calls), every wait bounded by poll
// with the call's deadline. Wire format in docs/store.md and store_int.h.
//
// A client whose connection failed (reset, malformed reply, no reply
// within the grace period after the deadline) stays failed: the stream is
// out of step, so later calls fail with TP_ECLOSED and the first reason.

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/auth.h"
#include "core/wire.h"
#include "store_int.h"
#include "tcp_io.h"
#include "transport/sockaddr.h"

// How long after the deadline a client waits for the server's own timeout
// reply before giving up on the connection.
#define TCP_REPLY_GRACE_NS (2000u * 1000000u)
// The longest wait for the server's hello: a foreign program that says
// nothing fails within it, not at the store's (long) deadline.
#define TCP_HELLO_TIMEOUT_MS 10000

typedef struct tcp_client {
    int t_fd;
    tp_sockaddr t_sa; // the server, to reconnect after an idle close
    int64_t t_max_value;
    bool t_auth; // a job secret is configured
    char t_addr[TP_SOCKADDR_STRLEN + 8];
    tp_store_server *t_srv; // owned, may be NULL
    char t_broken[256];     // "" while the connection is usable
} tcp_client;

bool
tp__store_tcp_hosts(const void *impl)
{
    return ((const tcp_client *)impl)->t_srv != NULL;
}

// ---- connecting ----

static tp_status
tcp_connect_once(const tp_sockaddr *sa, uint64_t deadline_ns, int *fd_p,
                 int *errno_p)
{
    int fd = socket(sa->u.sa.sa_family,
                    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *errno_p = errno;
        return TP_EINTERNAL;
    }
    if (connect(fd, &sa->u.sa, sa->len) != 0 && errno != EINPROGRESS) {
        *errno_p = errno;
        close(fd);
        return TP_ECONNREFUSED;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int r = poll(&p, 1, tp__io_poll_ms(deadline_ns));
    if (r <= 0) {
        *errno_p = r == 0 ? ETIMEDOUT : errno;
        close(fd);
        return TP_ETIMEDOUT;
    }
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
    if (soerr != 0) {
        *errno_p = soerr;
        close(fd);
        return TP_ECONNREFUSED;
    }
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return TP_OK;
}

// Moves @e (may be NULL) to *@err_p, or drops it when @err_p is NULL.
static void
tcp_give_error(tp_error *e, tp_error **err_p)
{
    if (err_p != NULL) {
        *err_p = e;
    } else {
        tp_error_unref(e);
    }
}

// The hello exchange on a fresh connection (docs/store.md): ours, then
// the server's, checked byte by byte so that a foreign program fails at
// once; then, when both sides have a job secret, the exchange of
// core/auth.h (a secret on one side only fails). TP_EAGAIN: the server
// closed before its hello (try again).
static tp_status
tcp_handshake(tcp_client *t, uint64_t deadline_ns, tp_error **err_p)
{
    uint64_t dl =
        TP_MIN(deadline_ns, tp__deadline_after_ms(TCP_HELLO_TIMEOUT_MS));
    uint8_t h[TP_STORE_HELLO_LEN];
    memcpy(h, TP_STORE_HELLO_MAGIC, 8);
    tp__put_u32le(h + 8, TP_STORE_HELLO_VERSION);
    uint32_t ours = t->t_auth ? TP_AUTH_HELLO_FLAG : 0;
    tp__put_u32le(h + 12, ours);
    char why[128];
    tp_status st =
        tp__io_write_all(t->t_fd, h, sizeof(h), dl, why, sizeof(why));
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "sending the hello: %s", why);
    }
    size_t got = 0;
    while (got < TP_STORE_HELLO_LEN) {
        struct pollfd p = {.fd = t->t_fd, .events = POLLIN};
        int r = poll(&p, 1, tp__io_poll_ms(dl));
        if (r == 0) {
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "no store hello from %s within %d ms (%zu "
                                 "of %u bytes): is it a tpipe store?",
                                 t->t_addr, TCP_HELLO_TIMEOUT_MS, got,
                                 TP_STORE_HELLO_LEN);
        }
        ssize_t n =
            r < 0 ? -1 : recv(t->t_fd, h + got, sizeof(h) - got, MSG_DONTWAIT);
        if (n == 0 && got == 0) {
            return tp__error_set(err_p, TP_EAGAIN,
                                 "the server closed the connection before "
                                 "its hello");
        }
        if (n == 0) {
            return tp__error_set(err_p, TP_ECONNRESET,
                                 "%s closed the connection in the middle of "
                                 "its hello",
                                 t->t_addr);
        }
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                continue;
            }
            return tp__error_errno(err_p, errno, "reading the hello of %s",
                                   t->t_addr);
        }
        got += (size_t)n;
        if (memcmp(h, TP_STORE_HELLO_MAGIC, TP_MIN(got, (size_t)8)) != 0) {
            char hex[3 * 8 + 1] = "";
            for (size_t i = 0; i < TP_MIN(got, (size_t)8); i++) {
                snprintf(hex + 3 * i, sizeof(hex) - 3 * i, "%s%02x",
                         i ? " " : "", h[i]);
            }
            return tp__error_set(err_p, TP_EPROTO,
                                 "not a tpipe store: the server sent %s "
                                 "instead of the store hello",
                                 hex);
        }
    }
    uint32_t version = tp__get_u32le(h + 8);
    uint32_t flags = tp__get_u32le(h + 12);
    if (version != TP_STORE_HELLO_VERSION) {
        return tp__error_set(err_p, TP_EPROTO,
                             "the store at %s speaks store protocol version "
                             "%u, this build speaks %u",
                             t->t_addr, version, TP_STORE_HELLO_VERSION);
    }
    if (flags & TP_STORE_HELLO_FULL) {
        return tp__error_set(err_p, TP_ECONNREFUSED,
                             "the store at %s refused the connection: it "
                             "serves as many connections as it allows "
                             "(TP_STORE_MAX_CONNS)",
                             t->t_addr);
    }
    bool mine = (ours & TP_AUTH_HELLO_FLAG) != 0;
    bool theirs = (flags & TP_AUTH_HELLO_FLAG) != 0;
    if (!mine && theirs) {
        return tp__error_set(err_p, TP_EPERM,
                             "the store at %s requires the job secret "
                             "(TP_JOB_TOKEN or TP_JOB_TOKEN_FILE)",
                             t->t_addr);
    }
    if (mine && !theirs) {
        return tp__error_set(err_p, TP_EPERM,
                             "the store at %s has no job secret; refusing "
                             "to trust it",
                             t->t_addr);
    }
    if (mine) {
        return tp__auth_run_fd(t->t_fd, false, "store", dl, t->t_addr, err_p);
    }
    return TP_OK;
}

tp_status
tp__store_tcp_open(const char *addr, int64_t max_value, uint64_t deadline_ns,
                   tp_store_server *srv, void **impl_p, tp_error **err_p)
{
    tp_sockaddr sa;
    tp_status st = tp__sockaddr_parse(addr, TP_SOCKADDR_RESOLVE, &sa, err_p);
    if (st != TP_OK) {
        return st;
    }
    bool auth = false;
    st = tp__auth_enabled(&auth, err_p);
    if (st != TP_OK) {
        return st;
    }
    tcp_client *t = tp__zalloc(sizeof(*t));
    if (t == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    t->t_fd = -1;
    t->t_sa = sa;
    t->t_auth = auth;
    t->t_max_value = max_value;
    t->t_srv = srv;
    snprintf(t->t_addr, sizeof(t->t_addr), "%s", addr);
    uint64_t start = tp__now_ns();
    uint64_t backoff_ms = 10;
    int last_errno = 0;
    int attempts = 0;
    for (;;) {
        attempts++;
        // One attempt lasts at most 5 s so a lost SYN is retried.
        uint64_t one = tp__now_ns() + 5000u * 1000000u;
        if (tcp_connect_once(&sa, one < deadline_ns ? one : deadline_ns,
                             &t->t_fd, &last_errno) == TP_OK) {
            tp_error *herr = NULL;
            st = tcp_handshake(t, deadline_ns, &herr);
            if (st == TP_OK) {
                break;
            }
            close(t->t_fd);
            t->t_fd = -1;
            if (st != TP_EAGAIN) {
                tp__free(t);
                tcp_give_error(herr, err_p);
                return st;
            }
            tp_error_unref(herr);
            last_errno = ECONNRESET;
        }
        uint64_t now = tp__now_ns();
        if (now >= deadline_ns) {
            tp__free(t);
            errno = last_errno;
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "timed out after %llu ms waiting for the "
                                 "server (%d attempts), last: %s",
                                 (unsigned long long)((now - start) / 1000000u),
                                 attempts, strerror(last_errno));
        }
        uint64_t left_ms = (deadline_ns - now) / 1000000u;
        tp__io_sleep_ms(backoff_ms < left_ms ? backoff_ms : left_ms + 1);
        backoff_ms = backoff_ms * 2 > 500 ? 500 : backoff_ms * 2;
    }
    *impl_p = t;
    return TP_OK;
}

static void
tcp_close(void *impl)
{
    tcp_client *t = impl;
    if (t->t_fd >= 0) {
        close(t->t_fd);
    }
    tp__store_server_release(t->t_srv);
    tp__free(t);
}

// ---- one request ----

typedef struct tcp_req {
    uint8_t *r_buf;
    size_t r_len;
    size_t r_cap;
    bool r_oom;
} tcp_req;

static void
req_put(tcp_req *r, const void *p, size_t n)
{
    if (r->r_oom) {
        return;
    }
    if (r->r_len + n > r->r_cap) {
        size_t cap = r->r_cap ? r->r_cap : 256;
        while (cap < r->r_len + n) {
            cap *= 2;
        }
        uint8_t *b = tp__realloc(r->r_buf, cap);
        if (b == NULL) {
            r->r_oom = true;
            return;
        }
        r->r_buf = b;
        r->r_cap = cap;
    }
    if (n > 0) {
        memcpy(r->r_buf + r->r_len, p, n);
    }
    r->r_len += n;
}

static void
req_hdr(tcp_req *r, uint8_t op, int64_t timeout_ms)
{
    uint8_t h[TP_STORE_HDR_LEN] = {0};
    tp__put_u32le(h, TP_STORE_MAGIC);
    h[4] = op;
    tp__put_u64le(h + 8, (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms));
    req_put(r, h, sizeof(h));
}

static void
req_key(tcp_req *r, const char *key)
{
    uint8_t l[4];
    size_t n = strlen(key);
    tp__put_u32le(l, (uint32_t)n);
    req_put(r, l, 4);
    req_put(r, key, n);
}

static void
req_val(tcp_req *r, const void *v, size_t n)
{
    uint8_t l[8];
    tp__put_u64le(l, (uint64_t)n);
    req_put(r, l, 8);
    req_put(r, v, n);
}

static tp_status
tcp_broken(tcp_client *t, tp_status st, tp_error **err_p, const char *fmt,
           const char *detail)
{
    snprintf(t->t_broken, sizeof(t->t_broken), fmt, detail);
    return tp__error_set(err_p, st, "%s", t->t_broken);
}

// The server closed the connection as idle (TP_STORE_R_IDLE): connect
// again, once, within @deadline_ns. Nothing of a request sent on the old
// connection was run, so the caller sends it again.
static tp_status
tcp_reconnect(tcp_client *t, uint64_t deadline_ns, tp_error **err_p)
{
    close(t->t_fd);
    t->t_fd = -1;
    int e = 0;
    uint64_t one = tp__now_ns() + 5000u * 1000000u;
    if (tcp_connect_once(&t->t_sa, TP_MIN(one, deadline_ns), &t->t_fd, &e) !=
        TP_OK) {
        char why[128];
        snprintf(why, sizeof(why), "%s (%s)", strerror(e), tp__errno_name(e));
        return tcp_broken(t, tp__status_from_errno(e), err_p,
                          "reconnecting after the server closed the idle "
                          "connection: %s",
                          why);
    }
    tp_error *herr = NULL;
    tp_status st = tcp_handshake(t, deadline_ns, &herr);
    if (st != TP_OK) {
        st = tcp_broken(t, st, err_p,
                        "reconnecting after the server closed the idle "
                        "connection: %s",
                        tp_error_message(herr));
        tp_error_unref(herr);
    }
    return st;
}

// Before a request: true if the server has closed the connection since
// the last call (it sends TP_STORE_R_IDLE first, then closes). Any other
// byte waiting here breaks the connection (*@st_p).
static bool
tcp_closed_while_idle(tcp_client *t, tp_status *st_p, tp_error **err_p)
{
    struct pollfd p = {.fd = t->t_fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) {
        return false;
    }
    uint8_t h[TP_STORE_RHDR_LEN];
    ssize_t n = recv(t->t_fd, h, sizeof(h), MSG_DONTWAIT);
    if (n == (ssize_t)sizeof(h) && tp__get_u32le(h) == TP_STORE_MAGIC &&
        h[4] == TP_STORE_R_IDLE) {
        return true;
    }
    if (n == 0) {
        // Closed with no notice (a stopped server): try again, the same
        // way; a server that is gone refuses.
        return true;
    }
    *st_p = tcp_broken(t, TP_EPROTO, err_p, "%s",
                       "unexpected bytes from the server between requests");
    return false;
}

// Sends @r and reads the reply header. On TP_OK the caller reads the
// op-specific body; timeout and error replies are turned into errors here.
static tp_status
tcp_roundtrip(tcp_client *t, tcp_req *r, uint64_t deadline_ns, uint64_t *rdl_p,
              tp_error **err_p)
{
    if (t->t_broken[0] != '\0') {
        tp__free(r->r_buf);
        return tp__error_set(err_p, TP_ECLOSED,
                             "the connection failed earlier: %s", t->t_broken);
    }
    if (r->r_oom) {
        tp__free(r->r_buf);
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    uint64_t rdl = deadline_ns == UINT64_MAX ? UINT64_MAX
                                             : deadline_ns + TCP_REPLY_GRACE_NS;
    char why[128];
    tp_status st = TP_OK;
    if (tcp_closed_while_idle(t, &st, err_p)) {
        st = tcp_reconnect(t, deadline_ns, err_p);
    }
    uint8_t h[TP_STORE_RHDR_LEN];
    // Twice at most: the server may close the connection as idle just as
    // the request leaves (it answers TP_STORE_R_IDLE without running it).
    for (int round = 0; st == TP_OK; round++) {
        st = tp__io_write_all(t->t_fd, r->r_buf, r->r_len, rdl, why,
                              sizeof(why));
        if (st != TP_OK) {
            st = tcp_broken(t, st, err_p, "send to the server: %s", why);
            break;
        }
        st = tp__io_read_all(t->t_fd, h, sizeof(h), rdl, why, sizeof(why));
        if (st != TP_OK) {
            st = tcp_broken(t, st, err_p, "reply from the server: %s", why);
            break;
        }
        if (tp__get_u32le(h) != TP_STORE_MAGIC || h[4] != TP_STORE_R_IDLE ||
            round > 0) {
            break;
        }
        st = tcp_reconnect(t, deadline_ns, err_p);
    }
    tp__free(r->r_buf);
    if (st != TP_OK) {
        return st;
    }
    if (tp__get_u32le(h) != TP_STORE_MAGIC || h[4] > TP_STORE_R_ERROR) {
        return tcp_broken(t, TP_EPROTO, err_p, "%s",
                          "malformed reply from the server");
    }
    *rdl_p = rdl;
    if (h[4] == TP_STORE_R_OK) {
        return TP_OK;
    }
    int32_t rst = TP_ETIMEDOUT;
    uint8_t b[4];
    if (h[4] == TP_STORE_R_ERROR) {
        st = tp__io_read_all(t->t_fd, b, 4, rdl, why, sizeof(why));
        if (st != TP_OK) {
            return tcp_broken(t, st, err_p, "reply from the server: %s", why);
        }
        rst = (int32_t)tp__get_u32le(b);
        if (rst >= 0 || rst < -100) {
            return tcp_broken(t, TP_EPROTO, err_p, "%s",
                              "malformed error reply from the server");
        }
    }
    st = tp__io_read_all(t->t_fd, b, 4, rdl, why, sizeof(why));
    uint32_t n = st == TP_OK ? tp__get_u32le(b) : 0;
    if (st != TP_OK || n > TP_STORE_MAX_MSG) {
        return tcp_broken(t, st != TP_OK ? st : TP_EPROTO, err_p,
                          "reply from the server: %s",
                          st != TP_OK ? why : "error text too long");
    }
    char msg[TP_STORE_MAX_MSG + 1];
    st = tp__io_read_all(t->t_fd, msg, n, rdl, why, sizeof(why));
    if (st != TP_OK) {
        return tcp_broken(t, st, err_p, "reply from the server: %s", why);
    }
    msg[n] = 0;
    return tp__error_set(err_p, (tp_status)rst, "%s", msg);
}

static tp_status
tcp_read_body(tcp_client *t, void *p, size_t n, uint64_t rdl, tp_error **err_p)
{
    char why[128];
    tp_status st = tp__io_read_all(t->t_fd, p, n, rdl, why, sizeof(why));
    if (st != TP_OK) {
        return tcp_broken(t, st, err_p, "reply from the server: %s", why);
    }
    return TP_OK;
}

static tp_status
tcp_read_value(tcp_client *t, uint64_t rdl, uint8_t **val_p, size_t *len_p,
               tp_error **err_p)
{
    uint8_t b[8];
    tp_status st = tcp_read_body(t, b, 8, rdl, err_p);
    if (st != TP_OK) {
        return st;
    }
    uint64_t n = tp__get_u64le(b);
    if (n > (uint64_t)t->t_max_value) {
        return tcp_broken(t, TP_EPROTO, err_p, "%s",
                          "reply value longer than TP_STORE_MAX_VALUE");
    }
    uint8_t *v = tp__alloc((size_t)n + 1);
    if (v == NULL) {
        // The stream can no longer be followed: the value is unread.
        return tcp_broken(t, TP_ENOMEM, err_p, "%s", "out of memory");
    }
    st = tcp_read_body(t, v, (size_t)n, rdl, err_p);
    if (st != TP_OK) {
        tp__free(v);
        return st;
    }
    v[n] = 0;
    *val_p = v;
    *len_p = (size_t)n;
    return TP_OK;
}

static tp_status
tcp_set(void *impl, const char *key, const void *val, size_t len,
        int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_SET, timeout_ms);
    req_key(&r, key);
    req_val(&r, val, len);
    uint64_t rdl;
    return tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
}

static tp_status
tcp_get(void *impl, const char *key, int64_t timeout_ms, uint64_t deadline_ns,
        uint8_t **val_p, size_t *len_p, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_GET, timeout_ms);
    req_key(&r, key);
    uint64_t rdl;
    tp_status st = tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
    return st != TP_OK ? st : tcp_read_value(impl, rdl, val_p, len_p, err_p);
}

// Sends @r and reads the answer's body, one signed 64-bit value (add,
// delete_prefix, num_keys).
static tp_status
tcp_roundtrip_i64(void *impl, tcp_req *r, uint64_t deadline_ns, int64_t *v_p,
                  tp_error **err_p)
{
    uint64_t rdl;
    uint8_t d[8];
    tp_status st = tcp_roundtrip(impl, r, deadline_ns, &rdl, err_p);
    if (st == TP_OK) {
        st = tcp_read_body(impl, d, 8, rdl, err_p);
    }
    if (st == TP_OK) {
        *v_p = (int64_t)tp__get_u64le(d);
    }
    return st;
}

static tp_status
tcp_add(void *impl, const char *key, int64_t delta, int64_t timeout_ms,
        uint64_t deadline_ns, int64_t *value_p, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_ADD, timeout_ms);
    req_key(&r, key);
    uint8_t d[8];
    tp__put_u64le(d, (uint64_t)delta);
    req_put(&r, d, 8);
    return tcp_roundtrip_i64(impl, &r, deadline_ns, value_p, err_p);
}

static tp_status
tcp_wait(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
         uint64_t deadline_ns, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_WAIT, timeout_ms);
    uint8_t b[4];
    tp__put_u32le(b, (uint32_t)n);
    req_put(&r, b, 4);
    for (size_t i = 0; i < n; i++) {
        req_key(&r, keys[i]);
    }
    uint64_t rdl;
    return tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
}

static tp_status
tcp_compare_set(void *impl, const char *key, const void *exp, size_t elen,
                const void *des, size_t dlen, int64_t timeout_ms,
                uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
                tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_CAS, timeout_ms);
    req_key(&r, key);
    req_val(&r, exp, elen);
    req_val(&r, des, dlen);
    uint64_t rdl;
    tp_status st = tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
    return st != TP_OK ? st : tcp_read_value(impl, rdl, val_p, len_p, err_p);
}

static tp_status
tcp_delete(void *impl, const char *key, int64_t timeout_ms,
           uint64_t deadline_ns, bool *deleted_p, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_DELETE, timeout_ms);
    req_key(&r, key);
    uint64_t rdl;
    uint8_t d = 0;
    tp_status st = tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
    if (st == TP_OK) {
        st = tcp_read_body(impl, &d, 1, rdl, err_p);
    }
    if (st == TP_OK) {
        *deleted_p = d != 0;
    }
    return st;
}

static tp_status
tcp_delete_prefix(void *impl, const char *prefix, int64_t timeout_ms,
                  uint64_t deadline_ns, int64_t *n_p, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_DELETE_PREFIX, timeout_ms);
    req_key(&r, prefix);
    return tcp_roundtrip_i64(impl, &r, deadline_ns, n_p, err_p);
}

static tp_status
tcp_num_keys(void *impl, int64_t timeout_ms, uint64_t deadline_ns, int64_t *n_p,
             tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_NUM_KEYS, timeout_ms);
    return tcp_roundtrip_i64(impl, &r, deadline_ns, n_p, err_p);
}

static tp_status
tcp_append(void *impl, const char *key, const void *val, size_t len,
           int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_APPEND, timeout_ms);
    req_key(&r, key);
    req_val(&r, val, len);
    uint64_t rdl;
    return tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
}

static tp_status
tcp_check(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
          uint64_t deadline_ns, bool *all_p, tp_error **err_p)
{
    tcp_req r = {0};
    req_hdr(&r, TP_STORE_OP_CHECK, timeout_ms);
    uint8_t b[4];
    tp__put_u32le(b, (uint32_t)n);
    req_put(&r, b, 4);
    for (size_t i = 0; i < n; i++) {
        req_key(&r, keys[i]);
    }
    uint64_t rdl;
    uint8_t d = 0;
    tp_status st = tcp_roundtrip(impl, &r, deadline_ns, &rdl, err_p);
    if (st == TP_OK) {
        st = tcp_read_body(impl, &d, 1, rdl, err_p);
    }
    if (st == TP_OK) {
        *all_p = d != 0;
    }
    return st;
}

const tp__store_ops tp__store_tcp_ops = {
    .so_set = tcp_set,
    .so_get = tcp_get,
    .so_add = tcp_add,
    .so_wait = tcp_wait,
    .so_compare_set = tcp_compare_set,
    .so_delete = tcp_delete,
    .so_delete_prefix = tcp_delete_prefix,
    .so_num_keys = tcp_num_keys,
    .so_append = tcp_append,
    .so_check = tcp_check,
    .so_close = tcp_close,
};
