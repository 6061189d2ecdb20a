// SPDX-License-Identifier: Apache-2.0
// setup.c - ibv connection set-up. A tcp connection from the tcp transport
// (its hello and its job-secret exchange, unchanged) carries our setup
// record each way: the QP's address, the inbox ring's address, size and
// rkey. Each side connects its QP to the peer's, then sends one ready
// byte; a conn is open when both ready bytes are through. The tcp
// connection stays open and idle: its EOF is how a peer that closed or
// died shows (a QP alone says nothing until a write fails).

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/ibv/ibv_impl.h"

static void ibv_listener_service(ibv_listener *l);

// "ibv: connect to X" or "ibv: listener ibv://Y: connection from peer X".
static void
ibv_setup_prefix(const ibv_conn *c, char *buf, size_t len)
{
    if (c->ic_lsn != NULL) {
        snprintf(buf, len, "ibv: listener %s: connection from peer %s",
                 c->ic_lsn->il_base.l_addr, c->ic_base.c_peer);
    } else {
        snprintf(buf, len, "ibv: connect to %s", c->ic_base.c_peer);
    }
}

static void
ibv_listener_detach(ibv_conn *c)
{
    ibv_listener *l = c->ic_lsn;
    if (l == NULL) {
        return;
    }
    if (tp__list_node_active(&c->ic_lnode)) {
        tp__list_remove(&l->il_hsq, c); // both lists share the node offset
        l->il_npending--;
    }
    c->ic_lsn = NULL;
}

// Set-up failed with @err (taken): the connect aio fails with it, or the
// listener logs and drops the conn.
static void
ibv_setup_fail(ibv_conn *c, tp_error *err)
{
    if (c->ic_state == IBV_DEAD) {
        tp_error_unref(err);
        return;
    }
    c->ic_state = IBV_DEAD;
    c->ic_err = tp_error_ref(err);
    tp__ibv_conn_release(c);
    ibv_listener *l = c->ic_lsn;
    if (l != NULL) {
        TP_LOG_WARN("TP-IBV-SETUP", "%s; connection dropped",
                    tp_error_message(err));
        tp_error_unref(err);
        ibv_listener_detach(c);
        tp__conn_unref(&c->ic_base);
        ibv_listener_service(l);
        return;
    }
    tp_aio *aio = c->ic_connect_aio;
    c->ic_connect_aio = NULL;
    if (aio != NULL) {
        tp__aio_finish(aio, err, 0);
    } else {
        tp_error_unref(err);
    }
    tp__conn_unref(&c->ic_base);
}

// Fails the set-up with "<prefix>: <what>: <cause>", keeping the cause's
// status (a connection-scope one if the cause has none).
static void
ibv_setup_fail_cause(ibv_conn *c, const tp_error *cause, tp_status st,
                     const char *what)
{
    char pfx[IBV_PFX_LEN];
    ibv_setup_prefix(c, pfx, sizeof(pfx));
    if (cause != NULL) {
        st = tp_error_status(cause);
    }
    ibv_setup_fail(c, tp__error_new(st, 0, cause, "%s: %s", pfx, what));
}

static void
ibv_boot_free_task(void *arg)
{
    ibv_boot *b = arg;
    tp_transport *t = b->b_t;
    tp__aio_fini(&b->b_connect);
    tp__aio_fini(&b->b_out);
    tp__aio_fini(&b->b_in);
    if (b->b_tcp != NULL) {
        tp__conn_unref(b->b_tcp);
        // The tcp conn's free task is queued now: hold the transport until
        // a task behind it has run.
        tp__ibv_release_later(t);
    }
    tp__free(b);
    tp__transport_release(t);
}

static void
ibv_boot_unref(ibv_boot *b)
{
    TP_ASSERT(b->b_refs > 0);
    if (--b->b_refs == 0) {
        // Not from here: we may be inside one of its aios' callbacks.
        tp__task_init(&b->b_free_task, ibv_boot_free_task, b);
        tp__loop_post(b->b_t->t_loop, &b->b_free_task);
    }
}

void
tp__ibv_boot_detach(ibv_conn *c)
{
    ibv_boot *b = c->ic_boot;
    if (b == NULL) {
        return;
    }
    c->ic_boot = NULL;
    b->b_conn = NULL;
    if (b->b_tcp != NULL) {
        tp__conn_close(b->b_tcp);
    }
    if (b->b_refs > 1) {
        tp_aio_cancel(&b->b_connect);
    }
    ibv_boot_unref(b);
}

static void
ibv_tcp_submit(ibv_conn *c, tp_aio *aio, bool write, void *p, size_t n,
               int64_t timeout_ms)
{
    ibv_boot *b = c->ic_boot;
    tp_iov iov = {p, n};
    tp_aio_set_iov(aio, 1, &iov);
    tp_aio_set_timeout(aio, timeout_ms);
    b->b_refs++; // dropped by the callback
    if (write) {
        tp__conn_write(b->b_tcp, aio);
    } else {
        tp__conn_read(b->b_tcp, aio);
    }
}

static int64_t
ibv_hs_timeout(const ibv_conn *c)
{
    int64_t ms = c->ic_base.c_transport->t_cfg.handshake_timeout_ms;
    return ms > 0 ? ms : 10000;
}

// The bootstrap is connected: set up the verbs side, send our record and
// read the peer's.
static void
ibv_exchange_begin(ibv_conn *c)
{
    c->ic_state = IBV_XCHG;
    ibv_boot *b = c->ic_boot;
    snprintf(c->ic_base.c_peer, sizeof(c->ic_base.c_peer), "%s",
             tp__conn_peer(b->b_tcp));
    snprintf(c->ic_base.c_local, sizeof(c->ic_base.c_local), "%s",
             tp__conn_local(b->b_tcp));
    tp_error *err = NULL;
    if (tp__ibv_conn_verbs_init(c, &err) != TP_OK) {
        ibv_setup_fail_cause(c, err, TP_EDEVICE, "setting up the queue pair");
        tp_error_unref(err);
        return;
    }
    uint8_t *r = b->b_rec_out;
    memcpy(r, IBV_SETUP_MAGIC, 8);
    tp__put_u32le(r + 8, IBV_SETUP_VERSION);
    tp__put_u32le(r + 12, IBV_MAX_SEGS);
    tp__put_u64le(r + 16, c->ic_x->x_ring_size);
    tp__put_u64le(r + 24, (uint64_t)(uintptr_t)c->ic_buf);
    tp__put_u32le(r + 32, c->ic_mr->mr_rkey);
    tp__put_u32le(r + 36, 0);
    // r + 40: the QP address, written by tp__ibv_conn_verbs_init.
    int64_t ms = ibv_hs_timeout(c);
    ibv_tcp_submit(c, &b->b_out, true, b->b_rec_out, IBV_SETUP_LEN, ms);
    ibv_tcp_submit(c, &b->b_in, false, b->b_rec_in, IBV_SETUP_LEN, ms);
}

// Checks the peer's record and connects our QP to its. False after failing.
static bool
ibv_record_take(ibv_conn *c)
{
    const uint8_t *r = c->ic_boot->b_rec_in;
    char what[200];
    if (memcmp(r, IBV_SETUP_MAGIC, 8) != 0) {
        snprintf(what, sizeof(what), "bad setup record: not a tpipe ibv peer");
        goto bad;
    }
    uint32_t version = tp__get_u32le(r + 8);
    if (version != IBV_SETUP_VERSION) {
        snprintf(what, sizeof(what),
                 "bad setup record: unsupported version %" PRIu32
                 " (this side speaks %u)",
                 version, IBV_SETUP_VERSION);
        goto bad;
    }
    uint32_t segs = tp__get_u32le(r + 12);
    uint64_t ring = tp__get_u64le(r + 16);
    if (ring != c->ic_x->x_ring_size) {
        // Each side's outbox mirrors the peer's inbox, sized before the
        // records cross: the two ends must agree.
        snprintf(what, sizeof(what),
                 "ring size mismatch: the peer's TP_IBV_RING_SIZE is %" PRIu64
                 " bytes, this side's %" PRIu64 " (set the same on both ends)",
                 ring, c->ic_x->x_ring_size);
        goto bad;
    }
    if (segs != IBV_MAX_SEGS) {
        snprintf(what, sizeof(what),
                 "bad setup record: %" PRIu32
                 " segments in flight (this side uses %u)",
                 segs, IBV_MAX_SEGS);
        goto bad;
    }
    c->ic_peer_addr = tp__get_u64le(r + 24);
    c->ic_peer_rkey = tp__get_u32le(r + 32);
    tp_ibv_qp_addr qa;
    memcpy(qa.qa_bytes, r + 40, TP_IBV_QP_ADDR_LEN);
    tp_error *err = NULL;
    if (c->ic_x->x_v->qp_connect(c->ic_qp, &qa, &err) != TP_OK) {
        ibv_setup_fail_cause(c, err, TP_ECONNREFUSED,
                             "connecting the queue pair");
        tp_error_unref(err);
        return false;
    }
    return true;
bad:
    ibv_setup_fail_cause(c, NULL, TP_EPROTO, what);
    return false;
}

static void
ibv_setup_done(ibv_conn *c)
{
    tp_error *err = NULL;
    if (tp__ibv_conn_start(c, &err) != TP_OK) {
        ibv_setup_fail_cause(c, err, TP_EDEVICE, "watching the CQ");
        tp_error_unref(err);
        return;
    }
    // The watch: the peer sends nothing more on the bootstrap, so this
    // read ends only when it closes or dies.
    ibv_tcp_submit(c, &c->ic_boot->b_in, false, &c->ic_boot->b_watch, 1, 0);
    ibv_listener *l = c->ic_lsn;
    if (l != NULL) {
        ibv_listener_detach(c);
        c->ic_lsn = l;
        tp__list_append(&l->il_readyq, c);
        l->il_npending++;
        ibv_listener_service(l);
        return;
    }
    tp_aio *aio = c->ic_connect_aio;
    c->ic_connect_aio = NULL;
    TP_LOG_DEBUG("TP-IBV-CONNECT", "ibv: connected to peer %s",
                 c->ic_base.c_peer);
    tp__aio_set_output(aio, 0, &c->ic_base);
    tp__aio_finish(aio, NULL, 0);
}

static void
ibv_step(ibv_conn *c)
{
    if (c->ic_state == IBV_XCHG && c->ic_sent_rec && c->ic_got_rec) {
        c->ic_state = IBV_READY;
        ibv_boot *b = c->ic_boot;
        b->b_ready_out = IBV_SETUP_READY;
        int64_t ms = ibv_hs_timeout(c);
        ibv_tcp_submit(c, &b->b_out, true, &b->b_ready_out, 1, ms);
        ibv_tcp_submit(c, &b->b_in, false, &b->b_ready_in, 1, ms);
        return;
    }
    if (c->ic_state == IBV_READY && c->ic_sent_ready && c->ic_got_ready) {
        ibv_setup_done(c);
    }
}

static void
ibv_tcp_out_cb(void *arg)
{
    ibv_boot *b = arg;
    ibv_conn *c = b->b_conn;
    const tp_error *err = tp_aio_error(&b->b_out);
    if (c != NULL && (c->ic_state == IBV_XCHG || c->ic_state == IBV_READY)) {
        if (err != NULL) {
            ibv_setup_fail_cause(c, err, TP_ECONNRESET,
                                 c->ic_state == IBV_XCHG
                                     ? "sending the setup record"
                                     : "sending the ready byte");
        } else if (c->ic_state == IBV_XCHG) {
            c->ic_sent_rec = true;
            ibv_step(c);
        } else {
            c->ic_sent_ready = true;
            ibv_step(c);
        }
    }
    ibv_boot_unref(b);
}

void
tp__ibv_watch_done(ibv_conn *c)
{
    const tp_error *err = tp_aio_error(&c->ic_boot->b_in);
    tp_error *e;
    if (err == NULL) {
        e = tp__error_new(TP_EPROTO, 0, NULL,
                          "ibv: peer %s sent unexpected bytes on the "
                          "bootstrap connection; connection closed",
                          c->ic_base.c_peer);
        TP_LOG_WARN("TP-IBV-PROTO", "%s", tp_error_message(e));
        tp__ibv_conn_fail(c, e, false);
        return;
    }
    if (tp_error_status(err) == TP_ECLOSED) {
        return; // we closed it
    }
    e = tp__error_new(TP_ECONNRESET, 0, err,
                      "ibv: peer %s closed the connection or died "
                      "(bootstrap connection lost)",
                      c->ic_base.c_peer);
    tp__ibv_drain_then_fail(c, e);
}

static void
ibv_tcp_in_cb(void *arg)
{
    ibv_boot *b = arg;
    ibv_conn *c = b->b_conn;
    const tp_error *err = tp_aio_error(&b->b_in);
    switch (c != NULL ? c->ic_state : IBV_DEAD) {
    case IBV_OPEN:
        tp__ibv_watch_done(c);
        break;
    case IBV_XCHG:
        if (err != NULL) {
            ibv_setup_fail_cause(c, err, TP_ECONNRESET,
                                 "receiving the setup record");
        } else if (ibv_record_take(c)) {
            c->ic_got_rec = true;
            ibv_step(c);
        }
        break;
    case IBV_READY:
        if (err != NULL) {
            ibv_setup_fail_cause(c, err, TP_ECONNRESET,
                                 "receiving the ready byte");
        } else if (b->b_ready_in != IBV_SETUP_READY) {
            ibv_setup_fail_cause(c, NULL, TP_EPROTO,
                                 "bad ready byte from the peer");
        } else {
            c->ic_got_ready = true;
            ibv_step(c);
        }
        break;
    default:
        break;
    }
    ibv_boot_unref(b);
}

static void ibv_tcp_connect_cb(void *arg);

static ibv_conn *
ibv_conn_setup_new(tp_transport *t)
{
    ibv_boot *b = tp__zalloc(sizeof(*b));
    if (b == NULL) {
        return NULL;
    }
    ibv_conn *c = tp__ibv_conn_new(t);
    if (c == NULL) {
        tp__free(b);
        return NULL;
    }
    b->b_conn = c;
    b->b_t = t;
    b->b_refs = 1; // the conn's
    tp__transport_hold(t);
    tp__aio_init(&b->b_connect, ibv_tcp_connect_cb, b);
    tp__aio_init(&b->b_out, ibv_tcp_out_cb, b);
    tp__aio_init(&b->b_in, ibv_tcp_in_cb, b);
    c->ic_boot = b;
    return c;
}

// ---- connect ---------------------------------------------------------------

static void
ibv_tcp_connect_cb(void *arg)
{
    ibv_boot *b = arg;
    ibv_conn *c = b->b_conn;
    tp_conn *tc = tp_aio_get_output(&b->b_connect, 0);
    const tp_error *err = tp_aio_error(&b->b_connect);
    if (c == NULL || c->ic_state != IBV_TCP) {
        if (err == NULL && tc != NULL) {
            tp__conn_unref(tc);
        }
    } else if (err != NULL) {
        char pfx[IBV_PFX_LEN];
        ibv_setup_prefix(c, pfx, sizeof(pfx));
        ibv_setup_fail(c, tp__error_new(tp_error_status(err), 0, err,
                                        "%s: bootstrap connection", pfx));
    } else {
        b->b_tcp = tc;
        ibv_exchange_begin(c);
    }
    ibv_boot_unref(b);
}

static void
ibv_connect_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ibv_conn *c = arg;
    TP_ASSERT(c->ic_connect_aio == aio);
    char pfx[IBV_PFX_LEN];
    ibv_setup_prefix(c, pfx, sizeof(pfx));
    tp_error *err;
    if (reason == TP_ETIMEDOUT) {
        err =
            tp__error_new(TP_ETIMEDOUT, 0, NULL, "%s: timed out after %lld ms",
                          pfx, (long long)aio->a_timeout_ms);
    } else {
        err = tp__error_new(reason, 0, NULL, "%s: %s", pfx,
                            reason == TP_ECLOSED ? "closed" : "canceled");
    }
    if (c->ic_state == IBV_TCP) {
        // The bootstrap connect completes on its own; its callback sees
        // the conn dead and drops what it made.
        tp_aio_cancel(&c->ic_boot->b_connect);
    }
    ibv_setup_fail(c, err);
}

// "ibv://host:port" (or "host:port") -> "tcp://host:port".
static void
ibv_tcp_addr(const char *addr, char *buf, size_t len)
{
    if (addr == NULL) {
        addr = "";
    }
    if (strncmp(addr, "ibv://", 6) == 0) {
        addr += 6;
    }
    snprintf(buf, len, "%s%s", addr[0] ? "tcp://" : "", addr);
}

void
tp__ibv_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    ibv_conn *c = ibv_conn_setup_new(t);
    if (c == NULL) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "ibv: connect to %s: out of memory", addr);
        }
        return;
    }
    if (!tp__aio_begin(aio, t->t_loop, ibv_connect_cancel, c)) {
        tp__conn_unref(&c->ic_base);
        return;
    }
    c->ic_connect_aio = aio;
    snprintf(c->ic_base.c_peer, sizeof(c->ic_base.c_peer), "%s",
             strncmp(addr, "ibv://", 6) == 0 ? addr + 6 : addr);
    char taddr[300];
    ibv_tcp_addr(addr, taddr, sizeof(taddr));
    ibv_boot *b = c->ic_boot;
    tp_aio_set_timeout(&b->b_connect, aio->a_timeout_ms);
    b->b_refs++; // dropped by ibv_tcp_connect_cb
    tp__transport_connect(c->ic_x->x_tcp, taddr, &b->b_connect);
}

// ---- listener --------------------------------------------------------------

static void ibv_accept_cb(void *arg);

static void
ibv_listener_arm(ibv_listener *l)
{
    ibv_accept_state *as = l->il_accept;
    if (l->il_closed || l->il_accepting || as == NULL ||
        l->il_npending >= IBV_MAX_PENDING) {
        return;
    }
    l->il_accepting = true;
    tp__transport_hold(as->as_t); // released by ibv_accept_cb
    tp__listener_accept(l->il_tcp, &as->as_aio);
}

static void
ibv_accept_cb(void *arg)
{
    ibv_accept_state *as = arg;
    ibv_listener *l = as->as_l;
    tp_transport *t = as->as_t;
    tp_conn *tc = tp_aio_get_output(&as->as_aio, 0);
    const tp_error *err = tp_aio_error(&as->as_aio);
    if (l == NULL) {
        if (err == NULL && tc != NULL) {
            tp__conn_unref(tc);
        }
        tp__transport_release(t);
        return;
    }
    l->il_accepting = false;
    if (err != NULL) {
        if (tp_error_status(err) != TP_ECLOSED) {
            TP_LOG_WARN("TP-IBV-ACCEPT", "ibv: listener %s: %s",
                        l->il_base.l_addr, tp_error_message(err));
            ibv_listener_arm(l);
        }
        tp__transport_release(t);
        return;
    }
    ibv_conn *c = ibv_conn_setup_new(t);
    if (c == NULL) {
        TP_LOG_WARN("TP-IBV-ACCEPT",
                    "ibv: listener %s: connection from peer %s dropped: out "
                    "of memory",
                    l->il_base.l_addr, tp__conn_peer(tc));
        tp__conn_unref(tc);
    } else {
        c->ic_boot->b_tcp = tc;
        c->ic_lsn = l;
        tp__list_append(&l->il_hsq, c);
        l->il_npending++;
        ibv_exchange_begin(c);
    }
    ibv_listener_arm(l);
    tp__transport_release(t);
}

static void
ibv_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ibv_listener *l = arg;
    tp__list_remove(&l->il_acceptq, aio);
    tp__aio_finish_status(aio, reason, "ibv: accept on %s: %s",
                          l->il_base.l_addr,
                          reason == TP_ETIMEDOUT ? "timed out"
                          : reason == TP_ECLOSED ? "listener closed"
                                                 : "canceled");
}

// Hands ready conns to waiting accepts; keeps a bootstrap accept going.
static void
ibv_listener_service(ibv_listener *l)
{
    while (!tp__list_empty(&l->il_acceptq) && !tp__list_empty(&l->il_readyq)) {
        tp_aio *aio = tp__list_first(&l->il_acceptq);
        ibv_conn *c = tp__list_first(&l->il_readyq);
        tp__list_remove(&l->il_acceptq, aio);
        tp__list_remove(&l->il_readyq, c);
        l->il_npending--;
        c->ic_lsn = NULL;
        TP_LOG_DEBUG("TP-IBV-ACCEPT",
                     "ibv: listener %s: connection from peer %s ready",
                     l->il_base.l_addr, c->ic_base.c_peer);
        tp__aio_set_output(aio, 0, &c->ic_base);
        tp__aio_finish(aio, NULL, 0);
    }
    ibv_listener_arm(l);
}

void
tp__ibv_accept(tp_listener *bl, tp_aio *aio)
{
    ibv_listener *l = ibv_listener_of(bl);
    if (!tp__aio_begin(aio, bl->l_transport->t_loop, ibv_accept_cancel, l)) {
        return;
    }
    tp__list_append(&l->il_acceptq, aio);
    ibv_listener_service(l);
}

static void
ibv_listener_start_task(void *arg)
{
    ibv_listener *l = arg;
    ibv_listener_arm(l);
}

tp_status
tp__ibv_listen(tp_transport *t, tp_listener *bl, const char *addr,
               tp_error **err_p)
{
    ibv_ctx *x = ibv_ctx_of(t);
    ibv_listener *l = ibv_listener_of(bl);
    l->il_x = x;
    TP_LIST_INIT(&l->il_acceptq, tp_aio, a_node);
    TP_LIST_INIT(&l->il_hsq, ibv_conn, ic_lnode);
    TP_LIST_INIT(&l->il_readyq, ibv_conn, ic_lnode);
    char taddr[300];
    ibv_tcp_addr(addr, taddr, sizeof(taddr));
    tp_error *err = NULL;
    tp_status st = tp__transport_listen(x->x_tcp, taddr[0] ? taddr : NULL,
                                        &l->il_tcp, &err);
    if (st != TP_OK) {
        tp__error_set(err_p, st, "ibv: listen on %s: bootstrap: %s",
                      addr && addr[0] ? addr : "(default)",
                      tp_error_message(err));
        tp_error_unref(err);
        return st;
    }
    ibv_accept_state *as = tp__zalloc(sizeof(*as));
    if (as == NULL) {
        tp__listener_destroy(l->il_tcp);
        l->il_tcp = NULL;
        return tp__error_set(err_p, TP_ENOMEM, "ibv: listen: out of memory");
    }
    tp__aio_init(&as->as_aio, ibv_accept_cb, as);
    as->as_l = l;
    as->as_t = t;
    tp__list_node_init(&as->as_node);
    l->il_accept = as;
    const char *ta = tp__listener_addr(l->il_tcp);
    snprintf(bl->l_addr, sizeof(bl->l_addr), "ibv://%s",
             strncmp(ta, "tcp://", 6) == 0 ? ta + 6 : ta);
    // Accepting starts on the loop (listen must not touch loop state), so
    // that peers set up before the first accept is posted.
    tp__task_init(&l->il_start_task, ibv_listener_start_task, l);
    tp__loop_post(t->t_loop, &l->il_start_task);
    return TP_OK;
}

void
tp__ibv_listener_close(tp_listener *bl)
{
    ibv_listener *l = ibv_listener_of(bl);
    if (l->il_closed) {
        return;
    }
    l->il_closed = true;
    tp_aio *aio;
    while ((aio = tp__list_first(&l->il_acceptq)) != NULL) {
        tp__list_remove(&l->il_acceptq, aio);
        tp__aio_finish_status(aio, TP_ECLOSED,
                              "ibv: accept on %s: listener closed", bl->l_addr);
    }
    ibv_conn *c;
    while ((c = tp__list_first(&l->il_readyq)) != NULL) {
        tp__list_remove(&l->il_readyq, c);
        l->il_npending--;
        c->ic_lsn = NULL;
        tp__ibv_conn_fail(c,
                          tp__error_new(TP_ECLOSED, 0, NULL,
                                        "ibv: listener %s closed", bl->l_addr),
                          false);
        tp__conn_unref(&c->ic_base);
    }
    while ((c = tp__list_first(&l->il_hsq)) != NULL) {
        ibv_setup_fail(c, tp__error_new(TP_ECLOSED, 0, NULL,
                                        "ibv: listener %s closed", bl->l_addr));
    }
    ibv_accept_state *as = l->il_accept;
    l->il_accept = NULL;
    if (as != NULL) {
        as->as_l = NULL;
        tp__list_append(&l->il_x->x_dead_accepts, as);
    }
    tp__listener_destroy(l->il_tcp);
    l->il_tcp = NULL;
    tp__ibv_release_later(bl->l_transport);
}

// ctx_fini: the accept states let go of by closed listeners.
void
tp__ibv_accepts_free(ibv_ctx *x)
{
    ibv_accept_state *as;
    while ((as = tp__list_first(&x->x_dead_accepts)) != NULL) {
        tp__list_remove(&x->x_dead_accepts, as);
        tp__aio_fini(&as->as_aio);
        tp__free(as);
    }
}
