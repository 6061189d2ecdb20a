// SPDX-License-Identifier: Apache-2.0
// setup.c - UCX connection set-up: listeners (a ucp_listener on a
// sockaddr; UCP's connection manager takes connections as they come),
// connect (a ucp_ep on a sockaddr), then the hello (the 16-byte tpipe
// hello + the u64le window of flow.c) and, with a job secret, the
// exchange of core/auth.h, both over the UCP stream.
// A listener hands a connection to an accept only after a valid hello.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/sockaddr.h"
#include "transport/ucx/ucx_impl.h"

// "ucx: connect to X" or "ucx: listener ucx://Y: connection from peer X".
static void
ucx_setup_prefix(const ucx_conn *c, char *buf, size_t len)
{
    if (c->xc_lsn != NULL) {
        snprintf(buf, len, "ucx: listener %s: connection from peer %s",
                 c->xc_lsn->xl_base.l_addr, c->xc_base.c_peer);
    } else {
        snprintf(buf, len, "ucx: connect to %s", c->xc_base.c_peer);
    }
}

static void
ucx_listener_detach(ucx_conn *c)
{
    ucx_listener *l = c->xc_lsn;
    if (l == NULL) {
        return;
    }
    if (tp__list_node_active(&c->xc_lnode)) {
        tp__list_remove(&l->xl_hsq, c); // both lists share the node offset
        l->xl_npending--;
    }
    if (c->xc_conn_req != NULL && l->xl_ucp != NULL) {
        ucp_listener_reject(l->xl_ucp, c->xc_conn_req);
    }
    c->xc_conn_req = NULL;
    c->xc_lsn = NULL;
}

void
tp__ucx_setup_fail(ucx_conn *c, tp_error *err)
{
    ucx_listener *l = c->xc_lsn;
    if (l != NULL) {
        TP_LOG_WARN("TP-UCX-HELLO", "%s; connection dropped",
                    tp_error_message(err));
        tp_error_unref(err);
        ucx_listener_detach(c);
        tp__ucx_conn_release(c, true);
        tp__conn_unref(&c->xc_base);
        return;
    }
    tp_aio *aio = c->xc_connect_aio;
    c->xc_connect_aio = NULL;
    tp__ucx_conn_release(c, true);
    if (aio != NULL) {
        tp__aio_finish(aio, err, 0);
    } else {
        tp_error_unref(err);
    }
    tp__conn_unref(&c->xc_base);
}

static void
ucx_setup_failf(ucx_conn *c, tp_status st, const char *what, ucs_status_t ust)
{
    char pfx[UCX_PFX_LEN];
    ucx_setup_prefix(c, pfx, sizeof(pfx));
    tp__ucx_setup_fail(c, tp__error_new(st, 0, NULL, "%s: %s (%s)", pfx, what,
                                        ucs_status_string(ust)));
}

static void
ucx_hex(const uint8_t *p, unsigned n, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (unsigned i = 0; i < n && off + 4 < len; i++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%02x", i ? " " : "",
                                p[i]);
    }
}

static bool
ucx_hello_check(ucx_conn *c)
{
    unsigned n = c->xc_hello_rcvd;
    unsigned m = TP_MIN(n, UCX_HELLO_MAGIC_LEN);
    char pfx[UCX_PFX_LEN];
    if (memcmp(c->xc_hello_in, TP_HELLO_MAGIC, m) != 0) {
        char hex[64];
        ucx_setup_prefix(c, pfx, sizeof(pfx));
        ucx_hex(c->xc_hello_in, n, hex, sizeof(hex));
        tp__ucx_setup_fail(c, tp__error_new(TP_EPROTO, 0, NULL,
                                            "%s: bad hello: not a tpipe peer "
                                            "(wrong magic; got %s)",
                                            pfx, hex));
        return false;
    }
    if (n >= TP_HELLO_LEN) {
        uint32_t version = tp__get_u32le(c->xc_hello_in + 8);
        if (version != UCX_HELLO_VERSION) {
            ucx_setup_prefix(c, pfx, sizeof(pfx));
            tp__ucx_setup_fail(c,
                               tp__error_new(TP_EPROTO, 0, NULL,
                                             "%s: bad hello: unsupported "
                                             "version %u (this side speaks %u)",
                                             pfx, version, UCX_HELLO_VERSION));
            return false;
        }
    }
    if (n == UCX_HELLO_LEN) {
        // The peer's window: how much it takes ahead of its reads.
        uint64_t w = tp__get_u64le(c->xc_hello_in + TP_HELLO_LEN);
        if (w < UCX_WINDOW_MIN || w > UCX_WINDOW_MAX) {
            ucx_setup_prefix(c, pfx, sizeof(pfx));
            tp__ucx_setup_fail(c,
                               tp__error_new(TP_EPROTO, 0, NULL,
                                             "%s: bad hello: window %llu "
                                             "bytes (not %d..%d)",
                                             pfx, (unsigned long long)w,
                                             UCX_WINDOW_MIN, UCX_WINDOW_MAX));
            return false;
        }
        c->xc_tx_window = w;
    }
    return true;
}

// Logs which lanes UCP chose for @c's endpoint (TP-UCX-LANES, INFO): the
// lane lines of ucp_ep_print_info, joined. Debian's UCX logs nothing, so
// this is how a user sees that (for example) UCX 1.13 carries data over
// tcp when shared-memory transports cannot report a peer's failure.
static void
ucx_log_lanes(const ucx_conn *c)
{
    if (!tp__log_enabled(TP_LOG_LEVEL_INFO)) {
        return;
    }
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(c->xc_ep, f);
    fclose(f);
    char lanes[512] = "";
    size_t off = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *lane = strstr(line, "lane[");
        if (lane == NULL || off + 3 >= sizeof(lanes)) {
            continue;
        }
        if (off > 0 && off + 2 < sizeof(lanes)) {
            lanes[off++] = ';';
            lanes[off++] = ' ';
        }
        // Copied with runs of blanks squeezed to one.
        for (const char *p = lane; *p != '\0' && off + 1 < sizeof(lanes); p++) {
            if (*p != ' ' || (off > 0 && lanes[off - 1] != ' ')) {
                lanes[off++] = *p;
            }
        }
        while (off > 0 && lanes[off - 1] == ' ') {
            off--;
        }
        lanes[off] = '\0';
    }
    free(text);
    TP_LOG_INFO("TP-UCX-LANES", "ucx: connection %s peer %s: %s",
                c->xc_lsn != NULL ? "from" : "to", c->xc_base.c_peer,
                off > 0 ? lanes : "(no lane information)");
}

static void
ucx_setup_done(ucx_conn *c)
{
    tp__timer_stop(c->xc_ctx->x_t->t_loop, &c->xc_timer);
    c->xc_state = UCX_OPEN;
    ucx_log_lanes(c);
    ucp_ep_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR;
    if (ucp_ep_query(c->xc_ep, &attr) == UCS_OK) {
        tp_sockaddr sa;
        tp__sockaddr_from_sys(&sa, (struct sockaddr *)&attr.local_sockaddr,
                              sizeof(attr.local_sockaddr));
        tp__sockaddr_format(&sa, c->xc_base.c_local,
                            sizeof(c->xc_base.c_local));
    }
    ucx_listener *l = c->xc_lsn;
    if (l != NULL) {
        tp__list_remove(&l->xl_hsq, c);
        tp__list_append(&l->xl_readyq, c);
        TP_LOG_DEBUG("TP-UCX-ACCEPT",
                     "ucx: listener %s: connection from peer %s ready",
                     l->xl_base.l_addr, c->xc_base.c_peer);
        tp__ucx_listener_service(l);
        return;
    }
    tp_aio *aio = c->xc_connect_aio;
    c->xc_connect_aio = NULL;
    TP_LOG_DEBUG("TP-UCX-CONNECT", "ucx: connected to peer %s",
                 c->xc_base.c_peer);
    tp__aio_set_output(aio, 0, &c->xc_base);
    tp__aio_finish(aio, NULL, 0);
}

// Sends what the job-secret exchange has ready. False after failing.
static bool
ucx_auth_send(ucx_conn *c)
{
    const uint8_t *op;
    size_t n;
    while ((n = tp__auth_out(&c->xc_auth, &op)) > 0) {
        ucs_status_t st = tp__ucx_send_bytes(c, op, n, 0);
        if (st != UCS_OK) {
            ucx_setup_failf(c, TP_ECONNRESET, "sending the job-secret proof",
                            st);
            return false;
        }
        tp__auth_sent(&c->xc_auth, n);
    }
    return true;
}

// Runs the set-up as far as the received data allows.
void
tp__ucx_setup_pump(ucx_conn *c)
{
    char pfx[UCX_PFX_LEN];
    if (c->xc_ep == NULL) {
        return; // listener side: the ep is made by tp__ucx_listener_make_eps
    }
    if (!c->xc_hello_sent) {
        bool on = false;
        tp_error *err = NULL;
        if (tp__auth_enabled(&on, &err) != TP_OK) {
            ucx_setup_prefix(c, pfx, sizeof(pfx));
            tp__ucx_setup_fail(
                c, tp__error_new(tp_error_status(err), 0, err, "%s", pfx));
            tp_error_unref(err);
            return;
        }
        tp__put_u32le(c->xc_hello_out + 12, on ? TP_AUTH_HELLO_FLAG : 0);
        ucs_status_t st =
            tp__ucx_send_bytes(c, c->xc_hello_out, UCX_HELLO_LEN, 0);
        if (st != UCS_OK) {
            ucx_setup_failf(c, TP_ECONNREFUSED, "sending the hello", st);
            return;
        }
        c->xc_hello_sent = true;
        if (on) {
            // Our nonce right behind our hello: the exchange adds half a
            // round trip.
            tp__auth_start(&c->xc_auth, c->xc_lsn != NULL, "ucx");
            if (!ucx_auth_send(c)) {
                return;
            }
        }
    }
    ucs_status_t st = UCS_OK;
    while (c->xc_hello_rcvd < UCX_HELLO_LEN) {
        // The tpipe hello first, so a peer of another version is told so
        // before we wait for bytes it may never send.
        unsigned want =
            c->xc_hello_rcvd < TP_HELLO_LEN ? TP_HELLO_LEN : UCX_HELLO_LEN;
        int64_t got = tp__ucx_consume(c, c->xc_hello_in + c->xc_hello_rcvd,
                                      want - c->xc_hello_rcvd, &st);
        if (got <= 0) {
            break;
        }
        c->xc_hello_rcvd += (unsigned)got;
        if (!ucx_hello_check(c)) {
            return;
        }
    }
    if (c->xc_hello_rcvd == UCX_HELLO_LEN && c->xc_auth_state == 0) {
        tp_error *err = NULL;
        ucx_setup_prefix(c, pfx, sizeof(pfx));
        int r = tp__auth_decide(tp__get_u32le(c->xc_hello_out + 12),
                                tp__get_u32le(c->xc_hello_in + 12),
                                c->xc_lsn != NULL, pfx, &err);
        if (r < 0) {
            tp__ucx_setup_fail(c, err);
            return;
        }
        c->xc_auth_state = r == 1 ? 1 : 2;
    }
    while (c->xc_auth_state == 1 && st == UCS_OK) {
        if (!ucx_auth_send(c)) {
            return;
        }
        uint8_t *ip;
        size_t nin = tp__auth_in(&c->xc_auth, &ip);
        if (nin > 0) {
            int64_t got = tp__ucx_consume(c, ip, nin, &st);
            if (got <= 0) {
                break;
            }
            ucx_setup_prefix(c, pfx, sizeof(pfx));
            tp_error *err = NULL;
            if (tp__auth_received(&c->xc_auth, (size_t)got, pfx, &err) !=
                TP_OK) {
                tp__ucx_setup_fail(c, err);
                return;
            }
            continue;
        }
        if (!ucx_auth_send(c)) {
            return;
        }
        if (tp__auth_done(&c->xc_auth)) {
            c->xc_auth_state = 2;
        }
    }
    if (c->xc_auth_state == 2) {
        ucx_setup_done(c);
        return;
    }
    if (st == UCS_OK && c->xc_ep_status != UCS_OK) {
        st = c->xc_ep_status;
    }
    if (st != UCS_OK) {
        // No hello yet: for a connect, nobody (usable) listens there.
        bool refused = c->xc_lsn == NULL && c->xc_hello_rcvd == 0;
        if (c->xc_auth_state == 1) {
            ucx_setup_prefix(c, pfx, sizeof(pfx));
            tp__ucx_setup_fail(c, tp__error_new(TP_EPERM, 0, NULL,
                                                "%s: closed by the peer during "
                                                "authentication (it does not "
                                                "accept this job secret; %s)",
                                                pfx, ucs_status_string(st)));
            return;
        }
        ucx_setup_failf(c, refused ? TP_ECONNREFUSED : TP_ECONNRESET,
                        refused ? "connection refused"
                                : "connection closed by peer during the "
                                  "handshake",
                        st);
    }
}

void
tp__ucx_setup_timer_cb(tp_timer *t, void *arg)
{
    TP_UNUSED(t);
    ucx_conn *c = arg;
    char pfx[UCX_PFX_LEN];
    ucx_setup_prefix(c, pfx, sizeof(pfx));
    if (c->xc_lsn != NULL) {
        tp__ucx_setup_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                            "%s: no valid hello within %lld ms "
                                            "(got %u of %u bytes)",
                                            pfx, (long long)c->xc_timer_ms,
                                            c->xc_hello_rcvd, UCX_HELLO_LEN));
    } else {
        tp__ucx_setup_fail(c, tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                            "%s: timed out after %lld ms", pfx,
                                            (long long)c->xc_timer_ms));
    }
}

static void
ucx_ep_params(ucx_conn *c, ucp_ep_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->field_mask =
        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p->err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p->err_handler.cb = tp__ucx_ep_err_cb;
    p->err_handler.arg = c;
}

// ---- listener --------------------------------------------------------------

// Creates the endpoints of connection requests taken by ucx_conn_req_cb
// (after progress: UCP is not called from inside its callbacks).
void
tp__ucx_listener_make_eps(ucx_listener *l)
{
    ucx_conn *c = tp__list_first(&l->xl_hsq);
    while (c != NULL) {
        ucx_conn *next = tp__list_next(&l->xl_hsq, c);
        if (c->xc_ep == NULL && c->xc_conn_req != NULL) {
            ucp_ep_params_t p;
            ucx_ep_params(c, &p);
            p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
            p.conn_request = c->xc_conn_req;
            c->xc_conn_req = NULL;
            ucs_status_t st = ucp_ep_create(c->xc_ctx->x_worker, &p, &c->xc_ep);
            if (st != UCS_OK) {
                c->xc_ep = NULL;
                ucx_setup_failf(c, TP_ECONNRESET, "ucp_ep_create", st);
            } else {
                tp__ucx_setup_pump(c);
            }
        }
        c = next;
    }
}

void
tp__ucx_listener_service(ucx_listener *l)
{
    while (!tp__list_empty(&l->xl_acceptq) && !tp__list_empty(&l->xl_readyq)) {
        ucx_conn *c = tp__list_pop_first(&l->xl_readyq);
        l->xl_npending--;
        c->xc_lsn = NULL;
        if (c->xc_ep_status != UCS_OK && c->xc_rx == NULL) {
            TP_LOG_DEBUG("TP-UCX-ACCEPT",
                         "ucx: listener %s: connection from peer %s "
                         "closed before it was accepted; dropped",
                         l->xl_base.l_addr, c->xc_base.c_peer);
            tp__ucx_conn_release(c, true);
            tp__conn_unref(&c->xc_base);
            continue;
        }
        tp_aio *aio = tp__list_pop_first(&l->xl_acceptq);
        tp__aio_set_output(aio, 0, &c->xc_base);
        tp__aio_finish(aio, NULL, 0);
    }
}

// UCP's callback, inside progress: a client asks to connect.
static void
ucx_conn_req_cb(ucp_conn_request_h req, void *arg)
{
    ucx_listener *l = arg;
    if (l->xl_closed || l->xl_npending >= UCX_MAX_PENDING) {
        ucp_listener_reject(l->xl_ucp, req);
        return;
    }
    ucx_conn *c = tp__ucx_conn_new(l->xl_base.l_transport);
    if (c == NULL) {
        ucp_listener_reject(l->xl_ucp, req);
        return;
    }
    ucp_conn_request_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(req, &attr) == UCS_OK) {
        tp_sockaddr sa;
        tp__sockaddr_from_sys(&sa, (struct sockaddr *)&attr.client_address,
                              sizeof(attr.client_address));
        tp__sockaddr_format(&sa, c->xc_base.c_peer, sizeof(c->xc_base.c_peer));
    } else {
        snprintf(c->xc_base.c_peer, sizeof(c->xc_base.c_peer), "?");
    }
    // The listener's address is ours (UCP does not say which of its
    // sockets took the connection).
    const char *la = strstr(l->xl_base.l_addr, "://");
    snprintf(c->xc_base.c_local, sizeof(c->xc_base.c_local), "%s",
             la != NULL ? la + 3 : l->xl_base.l_addr);
    c->xc_conn_req = req;
    c->xc_lsn = l;
    tp__list_append(&l->xl_hsq, c);
    l->xl_npending++;
    if (l->xl_hs_timeout_ms > 0) {
        c->xc_timer_ms = l->xl_hs_timeout_ms;
        tp__timer_start(l->xl_ctx->x_t->t_loop, &c->xc_timer,
                        tp__deadline_after_ms(c->xc_timer_ms));
    }
    // The conn is on x_conns: after progress, tp__ucx_conn_dispatch runs
    // tp__ucx_setup_pump, which waits for the ep (made by make_eps below).
}

static void
ucx_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ucx_listener *l = arg;
    tp__list_remove(&l->xl_acceptq, aio);
    if (reason == TP_ETIMEDOUT) {
        tp__aio_finish_status(aio, TP_ETIMEDOUT,
                              "ucx: accept on %s timed out after %lld ms",
                              l->xl_base.l_addr, (long long)aio->a_timeout_ms);
    } else {
        tp__aio_finish_status(aio, reason, "ucx: accept on %s %s",
                              l->xl_base.l_addr,
                              reason == TP_ECLOSED ? "closed" : "canceled");
    }
}

void
tp__ucx_accept(tp_listener *bl, tp_aio *aio)
{
    ucx_listener *l = ucx_listener_of(bl);
    if (!tp__aio_begin(aio, l->xl_ctx->x_t->t_loop, ucx_accept_cancel, l)) {
        return;
    }
    if (l->xl_closed) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "ucx: accept on %s: listener closed",
                              l->xl_base.l_addr);
        return;
    }
    tp__list_append(&l->xl_acceptq, aio);
    tp__ucx_listener_service(l);
}

static void
ucx_listener_drop_conns(tp_list *q)
{
    ucx_conn *c;
    while ((c = tp__list_first(q)) != NULL) {
        ucx_listener_detach(c);
        tp__ucx_conn_release(c, true);
        tp__conn_unref(&c->xc_base);
    }
}

void
tp__ucx_listener_close(tp_listener *bl)
{
    ucx_listener *l = ucx_listener_of(bl);
    if (l->xl_closed) {
        return;
    }
    l->xl_closed = true;
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&l->xl_acceptq)) != NULL) {
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "ucx: accept on %s: listener closed",
                              l->xl_base.l_addr);
    }
    ucx_listener_drop_conns(&l->xl_hsq);
    ucx_listener_drop_conns(&l->xl_readyq);
    if (l->xl_ucp != NULL) {
        ucp_listener_destroy(l->xl_ucp);
        l->xl_ucp = NULL;
    }
    if (tp__list_node_active(&l->xl_node)) {
        tp__list_remove(&l->xl_ctx->x_lsns, l);
    }
    tp_error_unref(l->xl_err);
    l->xl_err = NULL;
}

typedef struct ucx_listen_req {
    ucx_listener *lr_l;
    tp_sockaddr lr_sa;
    char lr_shown[TP_SOCKADDR_STRLEN];
} ucx_listen_req;

// Loop thread (tp__loop_call): the worker is used on that thread only.
static void
ucx_listen_task(void *arg)
{
    ucx_listen_req *r = arg;
    ucx_listener *l = r->lr_l;
    ucx_ctx *x = l->xl_ctx;
    l->xl_st = tp__ucx_ctx_start(x, &l->xl_err);
    if (l->xl_st != TP_OK) {
        return;
    }
    ucp_listener_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                   UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = &r->lr_sa.u.sa;
    p.sockaddr.addrlen = r->lr_sa.len;
    p.conn_handler.cb = ucx_conn_req_cb;
    p.conn_handler.arg = l;
    ucs_status_t st = ucp_listener_create(x->x_worker, &p, &l->xl_ucp);
    if (st != UCS_OK) {
        l->xl_ucp = NULL;
        l->xl_st = tp__error_set(&l->xl_err,
                                 st == UCS_ERR_BUSY ? TP_EADDRINUSE
                                                    : tp__ucx_status_tp(st),
                                 "ucx: listen on %s: %s", r->lr_shown,
                                 st == UCS_ERR_BUSY ? "address already in use"
                                                    : ucs_status_string(st));
        return;
    }
    ucp_listener_attr_t attr;
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    tp_sockaddr bound = r->lr_sa;
    if (ucp_listener_query(l->xl_ucp, &attr) == UCS_OK) {
        tp__sockaddr_from_sys(&bound, (struct sockaddr *)&attr.sockaddr,
                              sizeof(attr.sockaddr));
        // Keep the scope of a link-local address we bound to.
        if (bound.u.sa.sa_family == AF_INET6 &&
            r->lr_sa.u.sa.sa_family == AF_INET6 &&
            bound.u.in6.sin6_scope_id == 0) {
            bound.u.in6.sin6_scope_id = r->lr_sa.u.in6.sin6_scope_id;
        }
    }
    tp__sockaddr_format_url(&bound, "ucx", l->xl_base.l_addr,
                            sizeof(l->xl_base.l_addr));
    tp__list_append(&x->x_lsns, l);
    char what[sizeof(l->xl_base.l_addr) + 16];
    snprintf(what, sizeof(what), "ucx listener %s", l->xl_base.l_addr);
    tp__auth_warn_open(what, &bound.u.sa);
    l->xl_st = TP_OK;
}

// "ucx://REST" -> REST; REST without a scheme as is; NULL for another
// scheme.
static const char *
ucx_strip_scheme(const char *addr)
{
    if (addr == NULL) {
        return "";
    }
    if (strncmp(addr, "ucx://", 6) == 0) {
        return addr + 6;
    }
    return strstr(addr, "://") != NULL ? NULL : addr;
}

// Any thread: resolves here (may block), creates the UCP listener on the
// loop thread.
tp_status
tp__ucx_listen(tp_transport *t, tp_listener *bl, const char *addr,
               tp_error **err_p)
{
    ucx_listener *l = ucx_listener_of(bl);
    l->xl_ctx = ucx_ctx_of(t);
    l->xl_hs_timeout_ms = t->t_cfg.handshake_timeout_ms;
    tp__list_node_init(&l->xl_node);
    TP_LIST_INIT(&l->xl_acceptq, tp_aio, a_node);
    TP_LIST_INIT(&l->xl_hsq, ucx_conn, xc_lnode);
    TP_LIST_INIT(&l->xl_readyq, ucx_conn, xc_lnode);
    const char *rest = ucx_strip_scheme(addr);
    if (rest == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "ucx: bad address \"%s\": not a ucx:// address",
                             addr);
    }
    tp_hostport hp;
    tp_status st = tp__sockaddr_split(rest, TP_SOCKADDR_EMPTY_HOST, &hp, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "ucx: listen on \"%s\"", addr);
    }
    char why[512] = "";
    if (hp.hp_host[0] == '\0') {
        char chosen[TP_SOCKADDR_STRLEN];
        st = tp__sockaddr_choose(&t->t_cfg, AF_UNSPEC, chosen, sizeof(chosen),
                                 why, sizeof(why), err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "ucx: listen on \"%s\"",
                                  addr != NULL ? addr : "");
        }
        size_t n = strlen(chosen);
        hp.hp_bracketed = chosen[0] == '[' && n >= 2;
        if (hp.hp_bracketed) {
            snprintf(hp.hp_host, sizeof(hp.hp_host), "%.*s", (int)(n - 2),
                     chosen + 1);
        } else {
            snprintf(hp.hp_host, sizeof(hp.hp_host), "%s", chosen);
        }
    }
    ucx_listen_req r;
    memset(&r, 0, sizeof(r));
    r.lr_l = l;
    st = tp__sockaddr_from_hostport(&hp, rest, TP_SOCKADDR_RESOLVE, &r.lr_sa,
                                    err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "ucx: listen on \"%s\"", addr);
    }
    tp__sockaddr_format(&r.lr_sa, r.lr_shown, sizeof(r.lr_shown));
    bool secret = false;
    st = tp__auth_enabled(&secret, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "ucx: listen on %s", r.lr_shown);
    }
    tp__loop_call(t->t_loop, ucx_listen_task, &r);
    if (l->xl_st != TP_OK) {
        if (err_p != NULL) {
            *err_p = l->xl_err;
        } else {
            tp_error_unref(l->xl_err);
        }
        l->xl_err = NULL;
        l->xl_closed = true; // nothing to close
        return l->xl_st;
    }
    if (why[0] != '\0') {
        TP_LOG_INFO("TP-UCX-IFACE", "ucx: listening on %s: %s",
                    l->xl_base.l_addr, why);
    } else {
        TP_LOG_DEBUG("TP-UCX-LISTEN", "ucx: listening on %s",
                     l->xl_base.l_addr);
    }
    return TP_OK;
}

// ---- connect ---------------------------------------------------------------

static void
ucx_connect_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ucx_conn *c = arg;
    TP_ASSERT(c->xc_connect_aio == aio);
    tp_error *err;
    if (reason == TP_ETIMEDOUT) {
        err = tp__error_new(TP_ETIMEDOUT, 0, NULL,
                            "ucx: connect to %s timed out after %lld ms",
                            c->xc_base.c_peer, (long long)aio->a_timeout_ms);
    } else {
        err = tp__error_new(reason, 0, NULL, "ucx: connect to %s %s",
                            c->xc_base.c_peer,
                            reason == TP_ECLOSED ? "closed" : "canceled");
    }
    tp__ucx_setup_fail(c, err);
}

void
tp__ucx_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    ucx_ctx *x = ucx_ctx_of(t);
    tp_error *err = NULL;
    if (tp__ucx_ctx_start(x, &err) != TP_OK) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish(aio, err, 0);
        } else {
            tp_error_unref(err);
        }
        return;
    }
    ucx_conn *c = tp__ucx_conn_new(t);
    if (c == NULL) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "ucx: connect to %s: out of memory", addr);
        }
        return;
    }
    if (!tp__aio_begin(aio, t->t_loop, ucx_connect_cancel, c)) {
        tp__ucx_conn_release(c, true);
        tp__conn_unref(&c->xc_base);
        return;
    }
    c->xc_connect_aio = aio;
    snprintf(c->xc_base.c_peer, sizeof(c->xc_base.c_peer), "%s", addr);
    const char *rest = ucx_strip_scheme(addr);
    tp_sockaddr sa;
    if (rest == NULL) {
        tp__ucx_setup_fail(c, tp__error_new(TP_EINVAL, 0, NULL,
                                            "ucx: bad address \"%s\": not a "
                                            "ucx:// address",
                                            addr));
        return;
    }
    // Numeric addresses only: a name would need a resolver off the loop
    // thread, and listener addresses are always numeric.
    if (tp__sockaddr_parse(rest, 0, &sa, &err) != TP_OK) {
        tp__ucx_setup_fail(c, tp__error_new(TP_EINVAL, 0, err,
                                            "ucx: connect to \"%s\" (a numeric "
                                            "address, as listeners give)",
                                            addr));
        tp_error_unref(err);
        return;
    }
    tp__sockaddr_format(&sa, c->xc_base.c_peer, sizeof(c->xc_base.c_peer));
    bool secret = false;
    if (tp__auth_enabled(&secret, &err) != TP_OK) {
        tp__ucx_setup_fail(c, tp__error_new(tp_error_status(err), 0, err,
                                            "ucx: connect to %s", addr));
        tp_error_unref(err);
        return;
    }
    if (aio->a_timeout_ms <= 0 && t->t_cfg.connect_timeout_ms > 0) {
        c->xc_timer_ms = t->t_cfg.connect_timeout_ms;
        tp__timer_start(t->t_loop, &c->xc_timer,
                        tp__deadline_after_ms(c->xc_timer_ms));
    }
    ucp_ep_params_t p;
    ucx_ep_params(c, &p);
    p.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = &sa.u.sa;
    p.sockaddr.addrlen = sa.len;
    ucs_status_t st = ucp_ep_create(x->x_worker, &p, &c->xc_ep);
    if (st != UCS_OK) {
        c->xc_ep = NULL;
        ucx_setup_failf(c,
                        tp__ucx_status_tp(st) == TP_ECONNRESET
                            ? TP_ECONNREFUSED
                            : tp__ucx_status_tp(st),
                        "ucp_ep_create", st);
        return;
    }
    tp__ucx_setup_pump(c);
}
