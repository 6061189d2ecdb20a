// SPDX-License-Identifier: Apache-2.0
// tcp_server.c - the tcp store server: an accept thread (poll on the
// listening socket and an eventfd for stop) and one thread per client that
// reads a request, runs it on the engine and writes the reply. A waiting
// get or wait sleeps on the engine in slices of WAIT_SLICE_MS and checks
// between them whether its client hung up or the server is stopping.
//
// A malformed request (bad magic or op, a length over its bound, a key
// with a NUL) is logged (TP-STORE-PROTO) and closes that connection only.
// Every length is checked against its bound before anything is allocated.
//
// Lock order: srv_mtx before kv_mtx (never nested in practice).

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/wire.h"
#include "core/alloc.h"
#include "store_int.h"
#include "tcp_io.h"
#include "transport/sockaddr.h"

#define WAIT_SLICE_MS 200

typedef struct srv_conn {
    struct srv_conn *sc_next;
    struct tp_store_server *sc_srv;
    int sc_fd;
    char sc_peer[TP_SOCKADDR_STRLEN];
} srv_conn;

struct tp_store_server {
    tp__kv srv_kv;
    int srv_lfd;
    int srv_efd; // eventfd: stop the accept thread
    pthread_t srv_accept;
    int64_t srv_max_value;
    char srv_addr[TP_SOCKADDR_STRLEN + 16];
    tp_mtx srv_mtx;
    tp_cv srv_cv;        // srv_nconns reached 0
    srv_conn *srv_conns; // under srv_mtx
    int srv_nconns;      // live client threads, under srv_mtx
    _Atomic bool srv_stopping;
};

// ---- one request ----

// Why a connection ends: a clean close, an I/O error or a protocol error.
typedef struct conn_end {
    tp_status ce_st;
    char ce_why[160];
} conn_end;

static bool
conn_read(srv_conn *c, void *p, size_t n, conn_end *e)
{
    e->ce_st = tp__io_read_all(c->sc_fd, p, n, UINT64_MAX, e->ce_why,
                               sizeof(e->ce_why));
    return e->ce_st == TP_OK;
}

static bool
conn_proto(conn_end *e, const char *what)
{
    e->ce_st = TP_EPROTO;
    snprintf(e->ce_why, sizeof(e->ce_why), "%s", what);
    return false;
}

// Reads a key: u32 length (1..TP_STORE_MAX_KEY) and bytes without a NUL.
static bool
conn_read_key(srv_conn *c, char *key, conn_end *e)
{
    uint8_t b[4];
    if (!conn_read(c, b, 4, e)) {
        return false;
    }
    uint32_t n = tp__get_u32le(b);
    if (n == 0 || n > TP_STORE_MAX_KEY) {
        return conn_proto(e, "key length out of bounds");
    }
    if (!conn_read(c, key, n, e)) {
        return false;
    }
    key[n] = 0;
    if (strlen(key) != n) {
        return conn_proto(e, "key holds a NUL byte");
    }
    return true;
}

// Reads a value: u64 length (<= max value), then the bytes (malloc'ed).
static bool
conn_read_val(srv_conn *c, uint8_t **v_p, size_t *n_p, conn_end *e)
{
    uint8_t b[8];
    if (!conn_read(c, b, 8, e)) {
        return false;
    }
    uint64_t n = tp__get_u64le(b);
    if (n > (uint64_t)c->sc_srv->srv_max_value) {
        return conn_proto(e, "value longer than TP_STORE_MAX_VALUE");
    }
    uint8_t *v = tp__alloc((size_t)n + 1);
    if (v == NULL) {
        e->ce_st = TP_ENOMEM;
        snprintf(e->ce_why, sizeof(e->ce_why), "out of memory");
        return false;
    }
    if (!conn_read(c, v, (size_t)n, e)) {
        tp__free(v);
        return false;
    }
    *v_p = v;
    *n_p = (size_t)n;
    return true;
}

static bool
conn_write(srv_conn *c, const void *p, size_t n, conn_end *e)
{
    e->ce_st = tp__io_write_all(c->sc_fd, p, n, UINT64_MAX, e->ce_why,
                                sizeof(e->ce_why));
    return e->ce_st == TP_OK;
}

static bool
conn_reply_ok(srv_conn *c, const void *body, size_t n, conn_end *e)
{
    uint8_t h[TP_STORE_RHDR_LEN] = {0};
    tp__put_u32le(h, TP_STORE_MAGIC);
    h[4] = TP_STORE_R_OK;
    return conn_write(c, h, sizeof(h), e) && conn_write(c, body, n, e);
}

static bool
conn_reply_val(srv_conn *c, const uint8_t *v, size_t n, conn_end *e)
{
    uint8_t l[8];
    tp__put_u64le(l, (uint64_t)n);
    return conn_reply_ok(c, l, 8, e) && conn_write(c, v, n, e);
}

// Replies with the error @err (consumed): a timeout or another error.
static bool
conn_reply_err(srv_conn *c, tp_status st, tp_error *err, conn_end *e)
{
    uint8_t b[TP_STORE_RHDR_LEN + 8 + TP_STORE_MAX_MSG];
    memset(b, 0, TP_STORE_RHDR_LEN);
    tp__put_u32le(b, TP_STORE_MAGIC);
    size_t off = TP_STORE_RHDR_LEN;
    if (st == TP_ETIMEDOUT) {
        b[4] = TP_STORE_R_TIMEOUT;
    } else {
        b[4] = TP_STORE_R_ERROR;
        tp__put_u32le(b + off, (uint32_t)(int32_t)st);
        off += 4;
    }
    const char *msg = tp_error_message(err);
    size_t n = strnlen(msg, TP_STORE_MAX_MSG);
    tp__put_u32le(b + off, (uint32_t)n);
    memcpy(b + off + 4, msg, n);
    tp_error_unref(err);
    return conn_write(c, b, off + 4 + n, e);
}

// True if the client hung up (or the server is stopping): a waiting
// request is then abandoned.
static bool
conn_gone(srv_conn *c)
{
    if (atomic_load_explicit(&c->sc_srv->srv_stopping, memory_order_acquire)) {
        return true;
    }
    struct pollfd p = {.fd = c->sc_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 &&
           (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

static uint64_t
conn_slice(uint64_t deadline_ns)
{
    uint64_t s = tp__now_ns() + (uint64_t)WAIT_SLICE_MS * 1000000u;
    return s < deadline_ns ? s : deadline_ns;
}

static bool
conn_get(srv_conn *c, const char *key, uint64_t deadline_ns, conn_end *e)
{
    tp__kv *kv = &c->sc_srv->srv_kv;
    for (;;) {
        uint8_t *v = NULL;
        size_t n = 0;
        tp_error *err = NULL;
        tp_status st =
            tp__kv_get(kv, key, conn_slice(deadline_ns), &v, &n, &err);
        if (st == TP_OK) {
            bool ok = conn_reply_val(c, v, n, e);
            tp__free(v);
            return ok;
        }
        if (st != TP_ETIMEDOUT || tp__now_ns() >= deadline_ns) {
            return conn_reply_err(c, st, err, e);
        }
        tp_error_unref(err);
        if (conn_gone(c)) {
            return conn_proto(e, "client left while waiting");
        }
    }
}

static bool
conn_wait(srv_conn *c, const char *const *keys, size_t n, uint64_t deadline_ns,
          conn_end *e)
{
    tp__kv *kv = &c->sc_srv->srv_kv;
    for (;;) {
        tp_error *err = NULL;
        tp_status st = tp__kv_wait(kv, keys, n, conn_slice(deadline_ns), &err);
        if (st == TP_OK) {
            return conn_reply_ok(c, NULL, 0, e);
        }
        if (st != TP_ETIMEDOUT || tp__now_ns() >= deadline_ns) {
            return conn_reply_err(c, st, err, e);
        }
        tp_error_unref(err);
        if (conn_gone(c)) {
            return conn_proto(e, "client left while waiting");
        }
    }
}

static bool
conn_wait_req(srv_conn *c, uint64_t deadline_ns, char *key, conn_end *e)
{
    uint8_t b[4];
    if (!conn_read(c, b, 4, e)) {
        return false;
    }
    uint32_t n = tp__get_u32le(b);
    if (n == 0 || n > TP_STORE_MAX_WAIT) {
        return conn_proto(e, "wait: number of keys out of bounds");
    }
    char **keys = tp__zalloc((size_t)n * sizeof(*keys));
    bool ok = keys != NULL;
    if (!ok) {
        e->ce_st = TP_ENOMEM;
        snprintf(e->ce_why, sizeof(e->ce_why), "out of memory");
    }
    for (uint32_t i = 0; ok && i < n; i++) {
        ok = conn_read_key(c, key, e);
        if (ok && (keys[i] = tp__strdup(key)) == NULL) {
            e->ce_st = TP_ENOMEM;
            snprintf(e->ce_why, sizeof(e->ce_why), "out of memory");
            ok = false;
        }
    }
    if (ok) {
        ok = conn_wait(c, (const char *const *)keys, n, deadline_ns, e);
    }
    for (uint32_t i = 0; keys != NULL && i < n; i++) {
        tp__free(keys[i]);
    }
    tp__free(keys);
    return ok;
}

// Serves one request; false ends the connection (reason in @e).
static bool
conn_serve_one(srv_conn *c, char *key, conn_end *e)
{
    uint8_t h[TP_STORE_HDR_LEN];
    if (!conn_read(c, h, sizeof(h), e)) {
        return false;
    }
    if (tp__get_u32le(h) != TP_STORE_MAGIC) {
        return conn_proto(e, "bad magic");
    }
    uint64_t tmo = tp__get_u64le(h + 8);
    uint64_t deadline_ns =
        tp__deadline_after_ms(tmo > (uint64_t)INT64_MAX ? 0 : (int64_t)tmo);
    tp__kv *kv = &c->sc_srv->srv_kv;
    tp_error *err = NULL;
    tp_status st;
    uint8_t *v = NULL, *v2 = NULL, *out = NULL;
    size_t n = 0, n2 = 0, nout = 0;
    uint8_t b[8];
    bool ok;
    switch (h[4]) {
    case TP_STORE_OP_SET:
        ok = conn_read_key(c, key, e) && conn_read_val(c, &v, &n, e);
        if (ok) {
            st = tp__kv_set(kv, key, v, n, &err);
            ok = st == TP_OK ? conn_reply_ok(c, NULL, 0, e)
                             : conn_reply_err(c, st, err, e);
        }
        break;
    case TP_STORE_OP_GET:
        ok = conn_read_key(c, key, e) && conn_get(c, key, deadline_ns, e);
        break;
    case TP_STORE_OP_ADD:
        ok = conn_read_key(c, key, e) && conn_read(c, b, 8, e);
        if (ok) {
            int64_t nv = 0;
            st = tp__kv_add(kv, key, (int64_t)tp__get_u64le(b), &nv, &err);
            tp__put_u64le(b, (uint64_t)nv);
            ok = st == TP_OK ? conn_reply_ok(c, b, 8, e)
                             : conn_reply_err(c, st, err, e);
        }
        break;
    case TP_STORE_OP_WAIT:
        ok = conn_wait_req(c, deadline_ns, key, e);
        break;
    case TP_STORE_OP_CAS:
        ok = conn_read_key(c, key, e) && conn_read_val(c, &v, &n, e) &&
             conn_read_val(c, &v2, &n2, e);
        if (ok) {
            st = tp__kv_compare_set(kv, key, v, n, v2, n2, &out, &nout, &err);
            ok = st == TP_OK ? conn_reply_val(c, out, nout, e)
                             : conn_reply_err(c, st, err, e);
        }
        break;
    case TP_STORE_OP_DELETE:
        ok = conn_read_key(c, key, e);
        if (ok) {
            bool d = false;
            tp__kv_delete(kv, key, &d);
            b[0] = d ? 1 : 0;
            ok = conn_reply_ok(c, b, 1, e);
        }
        break;
    case TP_STORE_OP_NUM_KEYS:
        tp__put_u64le(b, (uint64_t)tp__kv_num_keys(kv));
        ok = conn_reply_ok(c, b, 8, e);
        break;
    default:
        ok = conn_proto(e, "unknown operation");
        break;
    }
    tp__free(v);
    tp__free(v2);
    tp__free(out);
    return ok;
}

static void *
conn_main(void *arg)
{
    srv_conn *c = arg;
    tp_store_server *srv = c->sc_srv;
    tp__thread_set_name("tp-store-conn");
    char *key = tp__alloc(TP_STORE_MAX_KEY + 1);
    conn_end e = {TP_OK, ""};
    if (key != NULL) {
        while (conn_serve_one(c, key, &e)) {
        }
    }
    tp__free(key);
    if (e.ce_st == TP_EPROTO) {
        TP_LOG_WARN("TP-STORE-PROTO",
                    "store server %s: peer %s: protocol error: %s; closing "
                    "the connection",
                    srv->srv_addr, c->sc_peer, e.ce_why);
    } else if (e.ce_st != TP_ECLOSED && e.ce_st != TP_OK) {
        TP_LOG_INFO("TP-STORE-CONN", "store server %s: peer %s: %s",
                    srv->srv_addr, c->sc_peer, e.ce_why);
    }
    tp__mtx_lock(&srv->srv_mtx);
    srv_conn **pp = &srv->srv_conns;
    while (*pp != c) {
        pp = &(*pp)->sc_next;
    }
    *pp = c->sc_next;
    close(c->sc_fd);
    tp__free(c);
    if (--srv->srv_nconns == 0) {
        tp__cv_broadcast(&srv->srv_cv);
    }
    tp__mtx_unlock(&srv->srv_mtx);
    return NULL;
}

// ---- accepting ----

static void
srv_accept_one(tp_store_server *srv)
{
    tp_sockaddr pa;
    pa.len = sizeof(pa.u.ss);
    int fd = accept4(srv->srv_lfd, &pa.u.sa, &pa.len, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
            TP_LOG_WARN("TP-STORE-ACCEPT", "store server %s: accept: %s",
                        srv->srv_addr, strerror(errno));
            tp__io_sleep_ms(10); // let connections end; do not spin
        }
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    srv_conn *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        close(fd);
        return;
    }
    c->sc_srv = srv;
    c->sc_fd = fd;
    tp__sockaddr_format(&pa, c->sc_peer, sizeof(c->sc_peer));
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 256 * 1024);
    tp__mtx_lock(&srv->srv_mtx);
    c->sc_next = srv->srv_conns;
    srv->srv_conns = c;
    srv->srv_nconns++;
    pthread_t th;
    int r = pthread_create(&th, &at, conn_main, c);
    if (r != 0) {
        srv->srv_conns = c->sc_next;
        srv->srv_nconns--;
        close(fd);
        tp__free(c);
        TP_LOG_WARN("TP-STORE-ACCEPT", "store server %s: thread: %s",
                    srv->srv_addr, strerror(r));
    }
    tp__mtx_unlock(&srv->srv_mtx);
    pthread_attr_destroy(&at);
}

static void *
srv_accept_main(void *arg)
{
    tp_store_server *srv = arg;
    tp__thread_set_name("tp-store-srv");
    for (;;) {
        struct pollfd p[2] = {{.fd = srv->srv_lfd, .events = POLLIN},
                              {.fd = srv->srv_efd, .events = POLLIN}};
        int r = poll(p, 2, -1);
        if (r < 0 && errno != EINTR) {
            break;
        }
        if (atomic_load_explicit(&srv->srv_stopping, memory_order_acquire)) {
            break;
        }
        if (r > 0 && (p[0].revents & POLLIN)) {
            srv_accept_one(srv);
        }
    }
    return NULL;
}

tp_status
tp_store_server_start(const char *addr, tp_store_server **srv_p,
                      tp_error **err_p)
{
    tp_config cfg;
    tp_status st = tp__config_load(&cfg, err_p);
    if (st != TP_OK) {
        return st;
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
    srv->srv_max_value = cfg.store_max_value;
    srv->srv_efd = -1;
    char shown[TP_SOCKADDR_STRLEN];
    tp__sockaddr_format_url(&sa, "tcp", shown, sizeof(shown));
    srv->srv_lfd = socket(sa.u.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    srv->srv_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (srv->srv_efd < 0) {
        st = tp__error_errno(err_p, errno, "store server %s: eventfd", shown);
        goto close_lfd;
    }
    tp__kv_init(&srv->srv_kv);
    tp__mtx_init(&srv->srv_mtx);
    tp__cv_init(&srv->srv_cv);
    atomic_init(&srv->srv_stopping, false);
    int r = pthread_create(&srv->srv_accept, NULL, srv_accept_main, srv);
    if (r != 0) {
        st = tp__error_errno(err_p, r, "store server %s: thread", shown);
        goto fini;
    }
    TP_LOG_INFO("TP-STORE-LISTEN", "store server listening on %s",
                srv->srv_addr);
    *srv_p = srv;
    return TP_OK;

fini:
    tp__cv_fini(&srv->srv_cv);
    tp__mtx_fini(&srv->srv_mtx);
    tp__kv_fini(&srv->srv_kv);
    close(srv->srv_efd);
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
    atomic_store_explicit(&srv->srv_stopping, true, memory_order_release);
    uint64_t one = 1;
    ssize_t w = write(srv->srv_efd, &one, sizeof(one));
    TP_UNUSED(w);
    pthread_join(srv->srv_accept, NULL);
    close(srv->srv_lfd);
    tp__kv_close(&srv->srv_kv);
    tp__mtx_lock(&srv->srv_mtx);
    for (srv_conn *c = srv->srv_conns; c != NULL; c = c->sc_next) {
        shutdown(c->sc_fd, SHUT_RDWR);
    }
    while (srv->srv_nconns > 0) {
        tp__cv_wait(&srv->srv_cv, &srv->srv_mtx);
    }
    tp__mtx_unlock(&srv->srv_mtx);
    close(srv->srv_efd);
    tp__cv_fini(&srv->srv_cv);
    tp__mtx_fini(&srv->srv_mtx);
    tp__kv_fini(&srv->srv_kv);
    tp__free(srv);
}
