// SPDX-License-Identifier: Apache-2.0
// conn.c - the ibv transport's data path (see ibv_impl.h): writes are
// copied into the outbox and written into the peer's inbox ring with
// RDMA_WRITE_WITH_IMM as far as the credits allow (proto.c); a write
// completes when the writes that carry its last byte have completed, so
// its bytes are in the peer's memory. Reads are copied out of our inbox in
// order; wholly consumed segments are acknowledged. Completions come
// through the CQ's completion channel, watched by the loop.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "transport/ibv/ibv_impl.h"

static void ibv_cq_cb(tp_loop_fd *lfd, uint32_t events);

ibv_conn *
tp__ibv_conn_new(tp_transport *t)
{
    tp_conn *bc = tp__conn_alloc(t);
    if (bc == NULL) {
        return NULL;
    }
    ibv_conn *c = ibv_conn_of(bc);
    c->ic_x = ibv_ctx_of(t);
    c->ic_state = IBV_TCP;
    c->ic_cq_fd = -1;
    TP_LIST_INIT(&c->ic_readq, tp_aio, a_node);
    TP_LIST_INIT(&c->ic_writeq, tp_aio, a_node);
    TP_LIST_INIT(&c->ic_sentq, tp_aio, a_node);
    tp__list_node_init(&c->ic_lnode);
    return c;
}

static tp_status
ibv_post_recvs(ibv_conn *c, unsigned n, tp_error **err_p)
{
    const tp_ibv_verbs *v = c->ic_x->x_v;
    for (unsigned i = 0; i < n; i++) {
        tp_status st = v->post_recv(c->ic_qp, 0, err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    return TP_OK;
}

tp_status
tp__ibv_conn_verbs_init(ibv_conn *c, tp_error **err_p)
{
    ibv_ctx *x = c->ic_x;
    const tp_ibv_verbs *v = x->x_v;
    tp_status st = tp__ibv_proto_init(&c->ic_p, x->x_ring_size, x->x_ring_size,
                                      IBV_MAX_SEGS, IBV_SEG_MAX);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "ibv: ring state: out of memory");
    }
    c->ic_buf_len = 2 * x->x_ring_size;
    if (x->x_npool > 0) {
        // A ring pair of a closed conn, still registered. Its QP was
        // destroyed before it came here, so no stale write can land.
        ibv_ring *r = &x->x_pool[--x->x_npool];
        c->ic_buf = r->r_buf;
        c->ic_mr = r->r_mr;
    } else {
        void *buf = NULL;
        st = v->buf_alloc(x->x_dev, c->ic_buf_len, &buf, err_p);
        if (st != TP_OK) {
            c->ic_buf_len = 0;
            return st;
        }
        c->ic_buf = buf;
        st = tp__ibv_mr_get(&x->x_mrc, c->ic_buf, c->ic_buf_len, true,
                            &c->ic_mr, err_p);
        if (st != TP_OK) {
            return st;
        }
    }
    st = v->cq_create(x->x_dev, (int)(2 * IBV_QUEUE_DEPTH), &c->ic_cq,
                      &c->ic_cq_fd, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_ibv_qp_addr qa;
    st = v->qp_create(x->x_dev, c->ic_cq, (int)IBV_QUEUE_DEPTH,
                      (int)IBV_QUEUE_DEPTH, &c->ic_qp, &qa, err_p);
    if (st != TP_OK) {
        return st;
    }
    memcpy(c->ic_boot->b_rec_out + 40, qa.qa_bytes, TP_IBV_QP_ADDR_LEN);
    // Receives go up before the peer learns where to write.
    st = ibv_post_recvs(c, IBV_QUEUE_DEPTH, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->ic_recvs_posted = true;
    return TP_OK;
}

tp_status
tp__ibv_conn_start(ibv_conn *c, tp_error **err_p)
{
    tp_loop *loop = c->ic_base.c_transport->t_loop;
    tp_status st = tp__loop_fd_add(loop, &c->ic_lfd, c->ic_cq_fd, TP_EV_READ,
                                   ibv_cq_cb, c, err_p);
    if (st != TP_OK) {
        return st;
    }
    c->ic_lfd_on = true;
    st = c->ic_x->x_v->cq_req_notify(c->ic_cq);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "ibv: arming the CQ of peer %s",
                             c->ic_base.c_peer);
    }
    c->ic_state = IBV_OPEN;
    return TP_OK;
}

void
tp__ibv_conn_release(ibv_conn *c)
{
    ibv_ctx *x = c->ic_x;
    const tp_ibv_verbs *v = x->x_v;
    if (c->ic_lfd_on) {
        tp__loop_fd_remove(c->ic_base.c_transport->t_loop, &c->ic_lfd);
        c->ic_lfd_on = false;
    }
    if (c->ic_qp != NULL) {
        v->qp_destroy(c->ic_qp);
        c->ic_qp = NULL;
    }
    if (c->ic_cq != NULL) {
        v->cq_destroy(c->ic_cq);
        c->ic_cq = NULL;
        c->ic_cq_fd = -1;
    }
    if (c->ic_boot != NULL && c->ic_boot->b_tcp != NULL) {
        tp__conn_close(c->ic_boot->b_tcp);
    }
    // The inbox stays while reads may drain it; conn_fini frees it.
}

static void
ibv_ring_free(ibv_ctx *x, uint8_t *buf, const tp_ibv_mr *mr)
{
    tp__ibv_mr_put(&x->x_mrc, mr);
    x->x_v->buf_free(x->x_dev, buf, 2 * x->x_ring_size);
}

void
tp__ibv_pool_drain(ibv_ctx *x)
{
    while (x->x_npool > 0) {
        ibv_ring *r = &x->x_pool[--x->x_npool];
        ibv_ring_free(x, r->r_buf, r->r_mr);
    }
}

// Called once the QP is destroyed (tp__ibv_conn_release).
static void
ibv_conn_free_buf(ibv_conn *c)
{
    ibv_ctx *x = c->ic_x;
    TP_ASSERT(c->ic_qp == NULL);
    if (c->ic_buf != NULL && c->ic_mr != NULL && x->x_npool < x->x_pool_max) {
        x->x_pool[x->x_npool].r_buf = c->ic_buf;
        x->x_pool[x->x_npool].r_mr = c->ic_mr;
        x->x_npool++;
        c->ic_buf = NULL;
        c->ic_mr = NULL;
        return;
    }
    if (c->ic_mr != NULL) {
        tp__ibv_mr_put(&x->x_mrc, c->ic_mr);
        c->ic_mr = NULL;
    }
    if (c->ic_buf != NULL) {
        x->x_v->buf_free(x->x_dev, c->ic_buf, c->ic_buf_len);
        c->ic_buf = NULL;
    }
}

static void
ibv_fail_queue(tp_list *q, const tp_error *err)
{
    tp_aio *aio;
    while ((aio = tp__list_first(q)) != NULL) {
        tp__list_remove(q, aio);
        tp__aio_finish(aio, tp_error_ref((tp_error *)err), aio->a_prov_u64[0]);
    }
}

static void ibv_pump_reads(ibv_conn *c);

// Fails the conn with @err (taken): the first error is kept, pending ops
// fail with it. @drain: the peer went away (not a local error), so reads
// may still take what already sits in the inbox.
void
tp__ibv_conn_fail(ibv_conn *c, tp_error *err, bool drain)
{
    if (c->ic_state == IBV_DEAD) {
        tp_error_unref(err);
        return;
    }
    c->ic_state = IBV_DEAD;
    c->ic_err = err;
    c->ic_drain = drain;
    TP_LOG_DEBUG("TP-IBV-FAIL", "%s", tp_error_message(err));
    if (drain) {
        ibv_pump_reads(c);
    }
    tp__ibv_conn_release(c);
    ibv_fail_queue(&c->ic_readq, err);
    ibv_fail_queue(&c->ic_writeq, err);
    ibv_fail_queue(&c->ic_sentq, err);
}

// ---- reads -------------------------------------------------------------

// Copies @n bytes between @ring + off and the aio's iovs from byte @done.
static void
ibv_copy_iov(tp_aio *aio, uint64_t done, uint8_t *ring, uint64_t n, bool to_iov)
{
    uint64_t skip = done;
    for (unsigned i = 0; i < aio->a_niov && n > 0; i++) {
        uint64_t len = aio->a_iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        uint8_t *p = (uint8_t *)aio->a_iov[i].iov_base + skip;
        uint64_t k = TP_MIN(len - skip, n);
        if (to_iov) {
            memcpy(p, ring, k);
        } else {
            memcpy(ring, p, k);
        }
        ring += k;
        n -= k;
        skip = 0;
    }
}

static void
ibv_pump_reads(ibv_conn *c)
{
    if (c->ic_buf == NULL) {
        return;
    }
    tp_aio *aio;
    while ((aio = tp__list_first(&c->ic_readq)) != NULL) {
        uint64_t total = aio->a_prov_u64[1];
        while (aio->a_prov_u64[0] < total) {
            uint64_t off;
            uint64_t avail = tp__ibv_proto_rx_avail(&c->ic_p, &off);
            if (avail == 0) {
                return;
            }
            uint64_t done = aio->a_prov_u64[0];
            uint64_t n = TP_MIN(avail, total - done);
            ibv_copy_iov(aio, done, c->ic_buf + off, n, true);
            tp__ibv_proto_rx_consume(&c->ic_p, n);
            aio->a_prov_u64[0] = done + n;
        }
        tp__list_remove(&c->ic_readq, aio);
        tp__aio_finish(aio, NULL, total);
    }
}

// ---- writes ------------------------------------------------------------

static void
ibv_fail_post(ibv_conn *c, tp_error *cause, const char *what)
{
    tp__ibv_conn_fail(c,
                      tp__error_new(TP_ECONNRESET, 0, cause,
                                    "ibv: %s to peer %s failed", what,
                                    c->ic_base.c_peer),
                      false);
    tp_error_unref(cause);
}

// Posts an ack if one is due and a send slot is free.
static void
ibv_send_ack(ibv_conn *c)
{
    if (c->ic_state != IBV_OPEN || c->ic_sends >= IBV_QUEUE_DEPTH) {
        return;
    }
    uint32_t imm = tp__ibv_proto_ack_take(&c->ic_p);
    if (imm == 0) {
        return;
    }
    tp_error *err = NULL;
    if (c->ic_x->x_v->post_write_imm(c->ic_qp, IBV_WR_ACK, c->ic_buf, c->ic_mr,
                                     0, c->ic_peer_addr, c->ic_peer_rkey, imm,
                                     &err) != TP_OK) {
        ibv_fail_post(c, err, "posting an ack");
        return;
    }
    c->ic_sends++;
}

// Writes whose last byte is in the peer's memory complete.
static void
ibv_complete_sent(ibv_conn *c)
{
    tp_aio *aio;
    while ((aio = tp__list_first(&c->ic_sentq)) != NULL &&
           aio->a_prov_u64[1] <= c->ic_tx_done) {
        tp__list_remove(&c->ic_sentq, aio);
        tp__aio_finish(aio, NULL, aio->a_prov_u64[0]);
    }
}

static void
ibv_pump_writes(ibv_conn *c)
{
    const tp_ibv_verbs *v = c->ic_x->x_v;
    uint8_t *outbox = c->ic_buf + c->ic_x->x_ring_size;
    tp_aio *aio;
    while (c->ic_state == IBV_OPEN &&
           (aio = tp__list_first(&c->ic_writeq)) != NULL) {
        uint64_t total = aio->a_prov_u64[1];
        while (aio->a_prov_u64[0] < total) {
            uint64_t off;
            uint32_t len;
            // One send slot stays free for acks.
            if (c->ic_sends + 1 >= IBV_QUEUE_DEPTH ||
                !tp__ibv_proto_tx_next(&c->ic_p, total - aio->a_prov_u64[0],
                                       &off, &len)) {
                return;
            }
            uint64_t done = aio->a_prov_u64[0];
            ibv_copy_iov(aio, done, outbox + off, len, false);
            tp__ibv_proto_tx_commit(&c->ic_p, len);
            tp_error *err = NULL;
            if (v->post_write_imm(c->ic_qp, c->ic_p.p_tx_head, outbox + off,
                                  c->ic_mr, len, c->ic_peer_addr + off,
                                  c->ic_peer_rkey, len, &err) != TP_OK) {
                ibv_fail_post(c, err, "posting a write");
                return;
            }
            c->ic_sends++;
            aio->a_prov_u64[0] = done + len;
        }
        // All posted: it completes with the write that ends at this
        // stream position.
        tp__list_remove(&c->ic_writeq, aio);
        aio->a_prov_u64[1] = c->ic_p.p_tx_head;
        aio->a_prov_u64[0] = total; // bytes moved, for a later failure
        aio->a_prov_data[0] = &c->ic_sentq;
        tp__list_append(&c->ic_sentq, aio);
    }
    // Zero-length writes, and writes behind no new bytes, complete now.
    ibv_complete_sent(c);
}

// ---- completions -------------------------------------------------------

static void
ibv_wc_error(ibv_conn *c, const tp_ibv_wc *wc)
{
    if (c->ic_state == IBV_DEAD) {
        return;
    }
    tp__ibv_conn_fail(
        c,
        tp__error_new(TP_ECONNRESET, 0, NULL,
                      "ibv: peer %s: %s work request failed: %s",
                      c->ic_base.c_peer,
                      wc->wc_opcode == TP_IBV_WC_RECV ? "receive" : "write",
                      wc->wc_why[0] ? wc->wc_why : "error"),
        false);
}

// Handles one completion; false once the conn is dead.
static bool
ibv_handle_wc(ibv_conn *c, const tp_ibv_wc *wc)
{
    if (wc->wc_status != TP_IBV_WC_OK) {
        ibv_wc_error(c, wc);
        return false;
    }
    if (wc->wc_opcode == TP_IBV_WC_SEND) {
        TP_ASSERT(c->ic_sends > 0);
        c->ic_sends--;
        if (wc->wc_wr_id != IBV_WR_ACK && wc->wc_wr_id > c->ic_tx_done) {
            c->ic_tx_done = wc->wc_wr_id;
        }
        return true;
    }
    tp_error *err = NULL;
    if (c->ic_x->x_v->post_recv(c->ic_qp, 0, &err) != TP_OK) {
        ibv_fail_post(c, err, "reposting a receive");
        return false;
    }
    char why[160];
    uint32_t n;
    if (tp__ibv_proto_on_imm(&c->ic_p, wc->wc_imm, &n, why, sizeof(why)) !=
        TP_OK) {
        err = tp__error_new(TP_EPROTO, 0, NULL,
                            "ibv: peer %s %s (immediate 0x%08" PRIx32
                            "); connection closed (protocol error)",
                            c->ic_base.c_peer, why, wc->wc_imm);
        TP_LOG_WARN("TP-IBV-PROTO", "%s", tp_error_message(err));
        tp__ibv_conn_fail(c, err, false);
        return false;
    }
    return true;
}

// Takes every completion, then moves data and credits.
static void
ibv_progress(ibv_conn *c)
{
    const tp_ibv_verbs *v = c->ic_x->x_v;
    tp_ibv_wc wc[16];
    while (c->ic_state == IBV_OPEN) {
        int n = v->cq_poll(c->ic_cq, 16, wc);
        if (n < 0) {
            tp__ibv_conn_fail(c,
                              tp__error_new(TP_ECONNRESET, 0, NULL,
                                            "ibv: peer %s: polling the CQ "
                                            "failed",
                                            c->ic_base.c_peer),
                              false);
            return;
        }
        for (int i = 0; i < n; i++) {
            if (!ibv_handle_wc(c, &wc[i])) {
                return;
            }
        }
        if (n == 0) {
            break;
        }
    }
    if (c->ic_state != IBV_OPEN) {
        return;
    }
    ibv_complete_sent(c);
    ibv_pump_reads(c);
    ibv_send_ack(c);
    ibv_pump_writes(c);
}

void
tp__ibv_drain_then_fail(ibv_conn *c, tp_error *err)
{
    ibv_progress(c);
    tp__ibv_conn_fail(c, err, true);
}

static void
ibv_cq_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    ibv_conn *c = lfd->lf_arg;
    const tp_ibv_verbs *v = c->ic_x->x_v;
    (void)v->cq_get_events(c->ic_cq);
    // Re-arm before polling, so a completion that arrives after the last
    // poll raises a new event.
    if (v->cq_req_notify(c->ic_cq) != TP_OK) {
        tp__ibv_conn_fail(c,
                          tp__error_new(TP_ECONNRESET, 0, NULL,
                                        "ibv: peer %s: re-arming the CQ "
                                        "failed",
                                        c->ic_base.c_peer),
                          false);
        return;
    }
    ibv_progress(c);
}

// ---- ops ---------------------------------------------------------------

static void
ibv_io_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    ibv_conn *c = arg;
    tp_list *q = aio->a_prov_data[0];
    bool rd = q == &c->ic_readq;
    const char *what = rd ? "read from" : "write to";
    char why[96];
    if (reason == TP_ETIMEDOUT) {
        snprintf(why, sizeof(why), "timed out after %" PRId64 " ms",
                 aio->a_timeout_ms);
    } else if (reason == TP_ECLOSED) {
        snprintf(why, sizeof(why), "connection closed");
    } else {
        snprintf(why, sizeof(why), "canceled");
    }
    uint64_t done = aio->a_prov_u64[0];
    uint64_t total = aio->a_prov_u64[1];
    tp__list_remove(q, aio);
    if (q == &c->ic_sentq) {
        // Every byte is posted and will land: the write has happened.
        tp__aio_finish(aio, NULL, done);
        return;
    }
    if (done == 0) {
        tp__aio_finish(aio,
                       tp__error_new(reason, 0, NULL, "ibv: %s peer %s: %s",
                                     what, c->ic_base.c_peer, why),
                       0);
        return;
    }
    // Some bytes moved: the stream is broken.
    tp__aio_finish(aio,
                   tp__error_new(reason, 0, NULL,
                                 "ibv: %s peer %s: %s after %" PRIu64
                                 " of %" PRIu64 " bytes; the stream is "
                                 "broken, connection closed",
                                 what, c->ic_base.c_peer, why, done, total),
                   done);
    tp__ibv_conn_fail(
        c,
        tp__error_new(TP_ECLOSED, 0, NULL,
                      "ibv: connection to peer %s closed: a %s %s after "
                      "moving %" PRIu64 " of %" PRIu64 " bytes",
                      c->ic_base.c_peer, rd ? "read" : "write", why, done,
                      total),
        false);
}

static void
ibv_submit(ibv_conn *c, tp_aio *aio, tp_list *q)
{
    if (!tp__aio_begin(aio, c->ic_base.c_transport->t_loop, ibv_io_cancel, c)) {
        return;
    }
    bool rd = q == &c->ic_readq;
    aio->a_prov_data[0] = q;
    aio->a_prov_u64[0] = 0;
    aio->a_prov_u64[1] = tp__aio_iov_total(aio);
    if (c->ic_state == IBV_OPEN) {
        tp__list_append(q, aio);
        if (rd) {
            ibv_pump_reads(c);
            ibv_send_ack(c);
        } else {
            ibv_pump_writes(c);
        }
        return;
    }
    if (c->ic_state == IBV_DEAD && c->ic_err != NULL) {
        if (rd && c->ic_drain) {
            tp__list_append(q, aio);
            ibv_pump_reads(c);
            if (tp__list_node_active(&aio->a_node)) {
                tp__list_remove(q, aio);
                tp__aio_finish(aio, tp_error_ref(c->ic_err),
                               aio->a_prov_u64[0]);
            }
            return;
        }
        tp__aio_finish(aio, tp_error_ref(c->ic_err), 0);
        return;
    }
    tp__aio_finish_status(aio, TP_ECLOSED, "ibv: %s peer %s: connection closed",
                          rd ? "read from" : "write to", c->ic_base.c_peer);
}

void
tp__ibv_conn_read(tp_conn *bc, tp_aio *aio)
{
    ibv_conn *c = ibv_conn_of(bc);
    ibv_submit(c, aio, &c->ic_readq);
}

void
tp__ibv_conn_write(tp_conn *bc, tp_aio *aio)
{
    ibv_conn *c = ibv_conn_of(bc);
    ibv_submit(c, aio, &c->ic_writeq);
}

void
tp__ibv_conn_close(tp_conn *bc)
{
    ibv_conn *c = ibv_conn_of(bc);
    if (c->ic_state == IBV_DEAD) {
        return;
    }
    tp__ibv_conn_fail(c,
                      tp__error_new(TP_ECLOSED, 0, NULL,
                                    "ibv: connection to peer %s closed",
                                    c->ic_base.c_peer),
                      false);
}

void
tp__ibv_conn_fini(tp_conn *bc)
{
    ibv_conn *c = ibv_conn_of(bc);
    tp__ibv_conn_release(c);
    ibv_conn_free_buf(c);
    tp__ibv_proto_fini(&c->ic_p);
    tp__ibv_boot_detach(c);
    tp_error_unref(c->ic_err);
    c->ic_err = NULL;
}
