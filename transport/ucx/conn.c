// SPDX-License-Identifier: Apache-2.0
// conn.c - the UCX transport's data path but for reads (recv.c). Writes
// hand the caller's iovs to ucp_stream_send_nbx, as far as the peer's
// window allows (flow.c: the rest waits for credits, possibly in several
// sends), and complete in submission order once UCP is done with every
// byte. A connection error is recorded once in xc_err; every pending and
// later op fails with a reference to it. Cancel: a read or write that
// moved no byte fails alone; one that moved some, or a read posted to UCP
// (recv.c), closes the conn.

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/ucx/ucx_impl.h"

ucx_conn *
tp__ucx_conn_new(tp_transport *t)
{
    tp_conn *bc = tp__conn_alloc(t);
    if (bc == NULL) {
        return NULL;
    }
    ucx_conn *c = ucx_conn_of(bc);
    c->xc_ctx = ucx_ctx_of(t);
    c->xc_state = UCX_SETUP;
    c->xc_ep_status = UCS_OK;
    TP_LIST_INIT(&c->xc_readq, tp_aio, a_node);
    TP_LIST_INIT(&c->xc_writeq, tp_aio, a_node);
    tp__list_node_init(&c->xc_node);
    tp__list_node_init(&c->xc_lnode);
    tp__timer_init(&c->xc_timer, tp__ucx_setup_timer_cb, c);
    memcpy(c->xc_hello_out, TP_HELLO_MAGIC, UCX_HELLO_MAGIC_LEN);
    tp__put_u32le(c->xc_hello_out + 8, UCX_HELLO_VERSION);
    tp__put_u32le(c->xc_hello_out + 12, 0); // flags
    // What the peer may send ahead of our reads (flow.c).
    c->xc_rx_window = c->xc_ctx->x_window;
    tp__put_u64le(c->xc_hello_out + TP_HELLO_LEN, c->xc_rx_window);
    tp__list_append(&c->xc_ctx->x_conns, c);
    return c;
}

// UCP calls this inside progress: record it; tp__ucx_conn_dispatch acts.
void
tp__ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    TP_UNUSED(ep);
    ucx_conn *c = arg;
    if (c->xc_ep_status != UCS_OK) {
        return;
    }
    c->xc_ep_status = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
    // Take what the peer sent before it went away, so later reads get it
    // (UCP may drop it with the failed endpoint): a peer that writes and
    // closes is read to the end, as over a socket.
    for (;;) {
        size_t len = 0;
        ucs_status_ptr_t r = ucp_stream_recv_data_nb(ep, &len);
        if (r == NULL || UCS_PTR_IS_ERR(r)) {
            break;
        }
        struct ucx_held *h =
            tp__realloc(c->xc_held, (c->xc_nheld + 1) * sizeof(*h));
        if (h == NULL) {
            ucp_stream_data_release(ep, r);
            break;
        }
        c->xc_held = h;
        h[c->xc_nheld].h_data = r;
        h[c->xc_nheld].h_len = len;
        c->xc_nheld++;
    }
}

// ---- sends -----------------------------------------------------------------

unsigned
tp__ucx_iov_slice(const tp_iov *iov, uint64_t off, uint64_t n,
                  ucp_dt_iov_t *out)
{
    unsigned i = tp__iov_seek(iov, &off), k = 0;
    for (; n > 0; i++) {
        uint64_t take = TP_MIN(n, iov[i].iov_len - off);
        if (take > 0) {
            out[k].buffer = (uint8_t *)iov[i].iov_base + off;
            out[k].length = (size_t)take;
            k++;
        }
        n -= take;
        off = 0;
    }
    return k;
}

void
tp__ucx_op_free(ucx_op *o)
{
    tp_error_unref(o->o_err);
    tp__free(o);
}

// An op the conn let go of (bytes of our own, or a write whose conn failed
// while UCP still held its buffer) is finished here, when UCP is done.
static void
ucx_op_orphan_done(ucx_op *o)
{
    if (o->o_aio != NULL) {
        tp_error *err = o->o_err != NULL ? tp_error_ref(o->o_err)
                                         : tp__error_new(TP_ECLOSED, 0, NULL,
                                                         "ucx: write: "
                                                         "connection closed");
        tp__aio_finish(o->o_aio, err, 0);
    }
    tp__ucx_op_free(o);
}

static void
ucx_send_release(ucx_send *s)
{
    if (s->s_embedded) {
        s->s_op->o_first_busy = false;
    } else {
        tp__free(s);
    }
}

static void
ucx_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_send *s = user_data;
    ucx_op *o = s->s_op;
    ucp_request_free(request);
    ucx_send_release(s);
    TP_ASSERT(o->o_inflight > 0);
    o->o_inflight--;
    if (status != UCS_OK && o->o_status == UCS_OK) {
        o->o_status = status;
    }
    if (o->o_conn == NULL && o->o_inflight == 0) {
        ucx_op_orphan_done(o);
    }
    // else tp__ucx_conn_dispatch completes it in order, after progress.
}

void
tp__ucx_op_submit(ucx_conn *c, ucx_op *o, uint64_t n, unsigned am_id)
{
    TP_ASSERT(n > 0 && o->o_submitted + n <= o->o_len);
    ucx_send *s = &o->o_first;
    if (o->o_first_busy) {
        s = tp__alloc(sizeof(*s));
        if (s == NULL) {
            if (o->o_status == UCS_OK) {
                o->o_status = UCS_ERR_NO_MEMORY;
            }
            return;
        }
        s->s_embedded = false;
    } else {
        o->o_first_busy = true;
        s->s_embedded = true;
    }
    s->s_op = o;
    unsigned k = tp__ucx_iov_slice(o->o_iov, o->o_submitted, n, s->s_iov);
    o->o_submitted += n;
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_DATATYPE;
    p.cb.send = ucx_send_cb;
    p.user_data = s;
    ucs_status_ptr_t r;
    if (am_id != 0) {
        // The bytes are the header, with no data; REPLY makes UCP tell the
        // receiver which of its endpoints the message came on.
        TP_ASSERT(k == 1);
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
        p.datatype = ucp_dt_make_contig(1);
        r = ucp_am_send_nbx(c->xc_ep, am_id, s->s_iov[0].buffer,
                            s->s_iov[0].length, NULL, 0, &p);
    } else if (k == 1) {
        p.datatype = ucp_dt_make_contig(1);
        r = ucp_stream_send_nbx(c->xc_ep, s->s_iov[0].buffer,
                                s->s_iov[0].length, &p);
    } else {
        p.datatype = ucp_dt_make_iov();
        r = ucp_stream_send_nbx(c->xc_ep, s->s_iov, k, &p);
    }
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        o->o_inflight++;
        return;
    }
    ucx_send_release(s);
    if (UCS_PTR_IS_ERR(r) && o->o_status == UCS_OK) {
        o->o_status = UCS_PTR_STATUS(r);
    }
}

ucs_status_t
tp__ucx_send_bytes(ucx_conn *c, const uint8_t *p, size_t n, unsigned am_id)
{
    ucx_op *o = tp__zalloc(sizeof(*o));
    if (o == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    TP_ASSERT(n > 0 && n <= sizeof(o->o_bytes));
    memcpy(o->o_bytes, p, n);
    o->o_iov[0].iov_base = o->o_bytes;
    o->o_iov[0].iov_len = n;
    o->o_niov = 1;
    o->o_len = n;
    tp__ucx_op_submit(c, o, n, am_id);
    // Bytes of our own are orphans from the start: nobody waits for them
    // (a failure shows as an endpoint error), ucx_send_cb frees them.
    if (o->o_inflight == 0) {
        ucs_status_t st = o->o_status;
        tp__ucx_op_free(o);
        return st;
    }
    return UCS_OK;
}

// Takes @a off the write queue, keeping xc_tx_next on the queue.
static void
ucx_writeq_remove(ucx_conn *c, tp_aio *a)
{
    if (c->xc_tx_next == a) {
        c->xc_tx_next = tp__list_next(&c->xc_writeq, a);
    }
    tp__list_remove(&c->xc_writeq, a);
}

// Completes the writes at the head of the queue that UCP has finished, in
// order; a failed one fails the conn.
void
tp__ucx_writes_settle(ucx_conn *c)
{
    tp_aio *a;
    while (c->xc_state == UCX_OPEN &&
           (a = tp__list_first(&c->xc_writeq)) != NULL) {
        ucx_op *o = a->a_prov_data[0];
        if (!ucx_op_done(o)) {
            return;
        }
        ucx_writeq_remove(c, a);
        ucs_status_t st = o->o_status;
        tp__ucx_op_free(o);
        if (st == UCS_OK) {
            tp__aio_finish(a, NULL, a->a_prov_u64[1]);
            continue;
        }
        tp_error *err = tp__error_new(tp__ucx_status_tp(st), 0, NULL,
                                      "ucx: write to peer %s: %s",
                                      c->xc_base.c_peer, ucs_status_string(st));
        tp__aio_finish(a, tp_error_ref(err), 0);
        tp__ucx_conn_fail(c, err);
    }
}

// ---- failure and release ---------------------------------------------------

void
tp__ucx_conn_release(ucx_conn *c, bool force)
{
    ucx_ctx *x = c->xc_ctx;
    tp__timer_stop(x->x_t->t_loop, &c->xc_timer);
    tp__ucx_rx_drop(c);
    if (c->xc_ep != NULL) {
        tp__ucx_ep_close(x, c->xc_ep, force);
        c->xc_ep = NULL;
    }
    if (tp__list_node_active(&c->xc_node)) {
        tp__list_remove(&x->x_conns, c);
    }
    c->xc_state = UCX_DEAD;
}

void
tp__ucx_conn_fail(ucx_conn *c, tp_error *err)
{
    if (c->xc_err == NULL) {
        c->xc_err = err;
        TP_LOG_DEBUG("TP-UCX-CLOSE", "%s", tp_error_message(err));
    } else {
        tp_error_unref(err);
    }
    tp_aio *a;
    while ((a = tp__list_pop_first(&c->xc_readq)) != NULL) {
        tp__ucx_read_fail(a, c->xc_err);
    }
    // Held writes (past the peer's window) fail here with the rest.
    c->xc_tx_next = NULL;
    while ((a = tp__list_pop_first(&c->xc_writeq)) != NULL) {
        ucx_op *o = a->a_prov_data[0];
        if (o->o_inflight == 0) {
            tp__ucx_op_free(o);
            tp__aio_finish(a, tp_error_ref(c->xc_err), 0);
        } else {
            // UCP still reads the caller's buffer: the aio fails when UCP
            // lets go of it (the force close below cancels the sends).
            o->o_conn = NULL;
            o->o_err = tp_error_ref(c->xc_err);
            // No cancel reaches the conn from now on (it may be gone).
            a->a_cancel_fn = NULL;
        }
    }
    tp__ucx_conn_release(c, true);
}

// ---- dispatch --------------------------------------------------------------

void
tp__ucx_conn_dispatch(ucx_conn *c)
{
    if (c->xc_state == UCX_DEAD || !tp__ucx_credit_check(c)) {
        return;
    }
    if (c->xc_state == UCX_SETUP) {
        tp__ucx_setup_pump(c);
        return;
    }
    tp__ucx_tx_pump(c); // credits may have arrived; settles too
    tp__ucx_read_pump(c);
}

// ---- submission, cancel ----------------------------------------------------

static void
ucx_op_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ucx_conn *c = arg;
    bool is_read = aio->a_prov_data[1] == &c->xc_readq;
    if (is_read && tp__ucx_read_posted(aio)) {
        // Its receives are UCP's to complete (recv.c): the conn goes, and
        // the read fails once UCP lets go of the caller's buffer.
        tp__ucx_read_cancel_posted(
            c, aio,
            tp__error_new(reason, 0, NULL,
                          "ucx: read from peer %s %s with its receive posted "
                          "to UCX (%llu of %llu bytes moved, or more): UCX "
                          "cannot take back a posted receive, so the "
                          "connection could not be kept and is closed",
                          c->xc_base.c_peer,
                          reason == TP_ETIMEDOUT ? "timed out"
                          : reason == TP_ECLOSED ? "closed"
                                                 : "canceled",
                          (unsigned long long)aio->a_prov_u64[0],
                          (unsigned long long)aio->a_prov_u64[1]));
        return;
    }
    const char *what = is_read ? "read from" : "write to";
    uint64_t done = is_read ? aio->a_prov_u64[0] : 0;
    uint64_t handed =
        is_read ? 0 : ((ucx_op *)aio->a_prov_data[0])->o_submitted;
    ucx_op *o = is_read ? NULL : aio->a_prov_data[0];
    // A write UCP has started may have moved bytes: the stream is then
    // unframeable, as for a read with bytes moved. One still held whole
    // (behind the peer's window) has moved nothing.
    bool moved = is_read ? done > 0 : o->o_submitted > 0;
    char detail[200] = "";
    if (moved) {
        snprintf(detail, sizeof(detail),
                 is_read ? " with %llu of %llu bytes moved; the stream is "
                           "unusable and the connection closed"
                         : " with %llu of %llu bytes handed to UCX; the "
                           "stream is unusable and the connection closed",
                 (unsigned long long)(is_read ? done : handed),
                 (unsigned long long)aio->a_prov_u64[1]);
    }
    tp_error *err;
    if (reason == TP_ETIMEDOUT) {
        err = tp__error_new(
            TP_ETIMEDOUT, 0, NULL, "ucx: %s peer %s timed out after %lld ms%s",
            what, c->xc_base.c_peer, (long long)aio->a_timeout_ms, detail);
    } else {
        err = tp__error_new(
            reason, 0, NULL, "ucx: %s peer %s %s%s", what, c->xc_base.c_peer,
            reason == TP_ECLOSED ? "closed" : "canceled", detail);
    }
    if (is_read) {
        tp__list_remove(&c->xc_readq, aio);
    } else {
        ucx_writeq_remove(c, aio);
    }
    if (!moved) {
        if (o != NULL) {
            tp__ucx_op_free(o);
        }
        tp__aio_finish(aio, err, 0);
        return;
    }
    if (o != NULL && o->o_inflight > 0) {
        o->o_conn = NULL; // finished by ucx_send_cb with @err
        o->o_err = tp_error_ref(err);
        aio->a_cancel_fn = NULL; // off the conn's queues: no cancel again
    } else {
        if (o != NULL) {
            tp__ucx_op_free(o);
        }
        tp__aio_finish(aio, tp_error_ref(err), done);
    }
    tp__ucx_conn_fail(c, tp__error_new(TP_ECLOSED, 0, err,
                                       "ucx: connection to peer %s closed",
                                       c->xc_base.c_peer));
    tp_error_unref(err);
}

static bool
ucx_conn_begin(ucx_conn *c, tp_aio *aio, tp_list *q)
{
    if (!tp__aio_begin(aio, c->xc_ctx->x_t->t_loop, ucx_op_cancel, c)) {
        return false;
    }
    if (c->xc_err != NULL || c->xc_state != UCX_OPEN) {
        tp__aio_finish(aio,
                       c->xc_err != NULL
                           ? tp_error_ref(c->xc_err)
                           : tp__error_new(TP_ECLOSED, 0, NULL,
                                           "ucx: connection to peer %s closed",
                                           c->xc_base.c_peer),
                       0);
        return false;
    }
    aio->a_prov_data[1] = q;
    aio->a_prov_u64[0] = 0;
    aio->a_prov_u64[1] = tp__aio_iov_total(aio);
    tp__list_append(q, aio);
    return true;
}

void
tp__ucx_conn_read(tp_conn *bc, tp_aio *aio)
{
    ucx_conn *c = ucx_conn_of(bc);
    aio->a_prov_data[0] = NULL; // its ucx_rd once posted (recv.c)
    if (ucx_conn_begin(c, aio, &c->xc_readq)) {
        tp__ucx_read_pump(c);
    }
}

void
tp__ucx_conn_write(tp_conn *bc, tp_aio *aio)
{
    ucx_conn *c = ucx_conn_of(bc);
    ucx_op *o = tp__zalloc(sizeof(*o));
    if (o == NULL) {
        if (tp__aio_begin(aio, c->xc_ctx->x_t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "ucx: write to peer %s: out of memory",
                                  c->xc_base.c_peer);
        }
        return;
    }
    aio->a_prov_data[0] = o;
    if (!ucx_conn_begin(c, aio, &c->xc_writeq)) {
        tp__free(o);
        return;
    }
    o->o_aio = aio;
    o->o_conn = c;
    o->o_len = aio->a_prov_u64[1];
    // Skip empty iovs: UCP's iov datatype wants none.
    for (unsigned i = 0; i < aio->a_niov; i++) {
        if (aio->a_iov[i].iov_len > 0) {
            o->o_iov[o->o_niov++] = aio->a_iov[i];
        }
    }
    // Every write before it is wholly with UCP when xc_tx_next is NULL.
    if (c->xc_tx_next == NULL && o->o_len > 0) {
        c->xc_tx_next = aio;
    }
    tp__ucx_tx_pump(c); // as far as the peer's window allows; settles
}

// ---- close / fini ----------------------------------------------------------

void
tp__ucx_conn_close(tp_conn *bc)
{
    ucx_conn *c = ucx_conn_of(bc);
    TP_ASSERT(c->xc_connect_aio == NULL && c->xc_lsn == NULL);
    if (c->xc_state == UCX_DEAD) {
        return;
    }
    if (tp__list_empty(&c->xc_readq) && tp__list_empty(&c->xc_writeq) &&
        c->xc_ep_status == UCS_OK) {
        // Nothing pending: a flushing close, so the peer gets every byte
        // our completed writes handed to UCP before it sees the end.
        if (c->xc_err == NULL) {
            c->xc_err = tp__error_new(TP_ECLOSED, 0, NULL,
                                      "ucx: connection to peer %s closed "
                                      "locally",
                                      c->xc_base.c_peer);
        }
        tp__ucx_conn_release(c, false);
        return;
    }
    tp__ucx_conn_fail(c, tp__error_new(TP_ECLOSED, 0, NULL,
                                       "ucx: connection to peer %s closed "
                                       "locally",
                                       c->xc_base.c_peer));
}

void
tp__ucx_conn_fini(tp_conn *bc)
{
    ucx_conn *c = ucx_conn_of(bc);
    TP_ASSERT(c->xc_ep == NULL);
    TP_ASSERT(tp__list_empty(&c->xc_readq) && tp__list_empty(&c->xc_writeq));
    tp_error_unref(c->xc_err);
    c->xc_err = NULL;
}
