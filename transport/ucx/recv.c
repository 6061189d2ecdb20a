// SPDX-License-Identifier: Apache-2.0
// recv.c - the UCX transport's reads. A read gets its bytes one of two
// ways:
//  - taken: received data is taken from UCP (ucp_stream_recv_data_nb, a
//    pointer into UCP's receive descriptor) and copied into the caller's
//    iovs. tpipe knows every byte moved, so a read that times out or is
//    canceled before any byte moved leaves the stream usable.
//  - posted: a read with no deadline that still needs at least
//    TP_UCX_RECV_POST bytes when UCP holds no more is handed to UCP
//    (ucp_stream_recv_nbx with WAITALL, into the caller's iovs): UCP then
//    copies each byte once, from the fabric's receive buffer straight into
//    the caller's (its "expected" path), where taken data is copied twice
//    (into UCP's descriptor, then out of it). UCX 1.13 cannot take back a
//    posted stream receive: the caller's buffer is UCP's until it
//    completes. So a posted read that is canceled closes the connection
//    (a force close makes UCP complete its receives), and completes, with
//    the cancel's status, only once UCP has let go of its buffer.
// A posted read keeps up to UCX_RD_POSTS receives with UCP, each of at
// most a quarter of the window: together they cover what the peer may
// send ahead (flow.c), and each one completed is consumed (a credit).

#include <string.h>

#include "core/alloc.h"
#include "transport/ucx/ucx_impl.h"

// ---- taken data ------------------------------------------------------------

static void
ucx_rx_release(ucx_conn *c)
{
    if (c->xc_rx != NULL) {
        ucp_stream_data_release(c->xc_ep, c->xc_rx);
        c->xc_rx = NULL;
        c->xc_rx_len = c->xc_rx_off = 0;
    }
}

static void
ucx_held_release(ucx_conn *c)
{
    for (size_t i = c->xc_held_next; i < c->xc_nheld; i++) {
        ucp_stream_data_release(c->xc_ep, c->xc_held[i].h_data);
    }
    tp__free(c->xc_held);
    c->xc_held = NULL;
    c->xc_nheld = c->xc_held_next = 0;
}

int64_t
tp__ucx_consume(ucx_conn *c, uint8_t *dst, uint64_t n, ucs_status_t *st_p)
{
    uint64_t copied = 0;
    while (copied < n) {
        if (c->xc_rx == NULL && c->xc_held_next < c->xc_nheld) {
            struct ucx_held *h = &c->xc_held[c->xc_held_next++];
            c->xc_rx = h->h_data;
            c->xc_rx_len = h->h_len;
            c->xc_rx_off = 0;
        }
        if (c->xc_rx == NULL) {
            if (c->xc_ep == NULL || c->xc_ep_status != UCS_OK) {
                *st_p = c->xc_ep == NULL ? UCS_ERR_CANCELED : c->xc_ep_status;
                return copied > 0 ? (int64_t)copied : -1;
            }
            size_t len = 0;
            ucs_status_ptr_t r = ucp_stream_recv_data_nb(c->xc_ep, &len);
            if (r == NULL) {
                break;
            }
            if (UCS_PTR_IS_ERR(r)) {
                *st_p = UCS_PTR_STATUS(r);
                return copied > 0 ? (int64_t)copied : -1;
            }
            c->xc_rx = r;
            c->xc_rx_len = len;
            c->xc_rx_off = 0;
        }
        uint64_t take = TP_MIN(n - copied, c->xc_rx_len - c->xc_rx_off);
        memcpy(dst + copied, c->xc_rx + c->xc_rx_off, (size_t)take);
        copied += take;
        c->xc_rx_off += (size_t)take;
        if (c->xc_rx_off == c->xc_rx_len) {
            ucx_rx_release(c);
        }
    }
    return (int64_t)copied;
}

void
tp__ucx_rx_drop(ucx_conn *c)
{
    ucx_rx_release(c);
    ucx_held_release(c);
}

// ---- posted reads ----------------------------------------------------------

// The @i-th oldest post of @rd.
static ucx_rpost *
ucx_rd_at(ucx_rd *rd, unsigned i)
{
    return &rd->r_post[(rd->r_head + i) % UCX_RD_POSTS];
}

// Bytes UCP put in the buffer by posts completed but not yet taken
// (receives complete in stream order, so these follow a_prov_u64[0]).
static uint64_t
ucx_rd_filled(ucx_rd *rd)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < rd->r_npost; i++) {
        ucx_rpost *rp = ucx_rd_at(rd, i);
        if (rp->rp_done) {
            n += rp->rp_got;
        }
    }
    return n;
}

static void
ucx_rd_free(ucx_rd *rd)
{
    tp_error_unref(rd->r_err);
    tp__free(rd);
}

// UCP calls this inside progress, or inside the force close of the
// endpoint (which completes every posted receive): record; the read pump
// takes it, or, for a read its conn let go of, finish the read once UCP
// holds none of its buffer.
static void
ucx_rpost_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    ucx_rpost *rp = user_data;
    ucx_rd *rd = rp->rp_rd;
    ucp_request_free(request);
    rp->rp_done = true;
    rp->rp_status = status;
    rp->rp_got = length;
    TP_ASSERT(rd->r_inflight > 0);
    rd->r_inflight--;
    if (rd->r_orphan && rd->r_inflight == 0) {
        tp_aio *a = rd->r_aio;
        uint64_t count = a->a_prov_u64[0] + ucx_rd_filled(rd);
        tp_error *err = rd->r_err;
        rd->r_err = NULL;
        ucx_rd_free(rd);
        tp__aio_finish(a, err, count);
    }
}

// Posts receives into @a's iovs past r_posted while the ring has room.
// A receive UCP completes at once is marked done here.
static ucs_status_t
ucx_rd_post(ucx_conn *c, tp_aio *a, ucx_rd *rd)
{
    uint64_t total = a->a_prov_u64[1];
    uint64_t chunk = TP_MAX(c->xc_rx_window / 4, 1);
    while (rd->r_npost < UCX_RD_POSTS && rd->r_posted < total) {
        ucx_rpost *rp = ucx_rd_at(rd, rd->r_npost);
        uint64_t len = TP_MIN(chunk, total - rd->r_posted);
        memset(rp, 0, sizeof(*rp));
        rp->rp_rd = rd;
        rp->rp_len = len;
        unsigned k = tp__ucx_iov_slice(a->a_iov, rd->r_posted, len, rp->rp_iov);
        ucp_request_param_t p;
        memset(&p, 0, sizeof(p));
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_FLAGS;
        p.cb.recv_stream = ucx_rpost_cb;
        p.user_data = rp;
        p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
        size_t got = 0;
        ucs_status_ptr_t r;
        if (k == 1) {
            p.datatype = ucp_dt_make_contig(1);
            r = ucp_stream_recv_nbx(c->xc_ep, rp->rp_iov[0].buffer,
                                    rp->rp_iov[0].length, &got, &p);
        } else {
            p.datatype = ucp_dt_make_iov();
            r = ucp_stream_recv_nbx(c->xc_ep, rp->rp_iov, k, &got, &p);
        }
        if (UCS_PTR_IS_ERR(r)) {
            return UCS_PTR_STATUS(r); // nothing posted
        }
        rd->r_npost++;
        rd->r_posted += len;
        if (r == NULL) {
            rp->rp_done = true; // UCP held the bytes already: copied
            rp->rp_status = UCS_OK;
            rp->rp_got = got;
        } else {
            rd->r_inflight++;
        }
    }
    return UCS_OK;
}

// Takes @rd's completed posts, in order, into @a's count. false: the
// conn failed (@rd may be gone).
static bool
ucx_rd_settle(ucx_conn *c, tp_aio *a, ucx_rd *rd)
{
    while (rd->r_npost > 0) {
        ucx_rpost *rp = ucx_rd_at(rd, 0);
        if (!rp->rp_done) {
            return true;
        }
        ucs_status_t st = rp->rp_status;
        uint64_t got = rp->rp_got, len = rp->rp_len;
        rd->r_head = (rd->r_head + 1) % UCX_RD_POSTS;
        rd->r_npost--;
        a->a_prov_u64[0] += got;
        if (st != UCS_OK || got != len) {
            // The endpoint failed (or closed): UCP completed the receive
            // with what it had.
            tp__ucx_conn_fail(
                c, tp__error_new(
                       TP_ECONNRESET, 0, NULL,
                       "ucx: read from peer %s: connection closed "
                       "by peer or failed (%s) with %llu of %llu "
                       "bytes received",
                       c->xc_base.c_peer,
                       ucs_status_string(st != UCS_OK ? st : UCS_ERR_IO_ERROR),
                       (unsigned long long)a->a_prov_u64[0],
                       (unsigned long long)a->a_prov_u64[1]));
            return false;
        }
        tp__ucx_rx_consumed(c, got);
        if (c->xc_state != UCX_OPEN) {
            return false;
        }
    }
    return true;
}

// Whether @a, which needs more bytes than UCP holds now, is to be posted:
// it has no deadline (a posted receive cannot be taken back when it
// expires) and needs at least TP_UCX_RECV_POST bytes more.
static bool
ucx_read_may_post(const ucx_conn *c, const tp_aio *a)
{
    uint64_t min = c->xc_ctx->x_post_min;
    return min > 0 && a->a_timeout_ms == 0 &&
           a->a_prov_u64[1] - a->a_prov_u64[0] >= min;
}

bool
tp__ucx_read_posted(const tp_aio *a)
{
    return a->a_prov_data[0] != NULL;
}

void
tp__ucx_read_fail(tp_aio *a, tp_error *err)
{
    ucx_rd *rd = a->a_prov_data[0];
    if (rd == NULL) {
        tp__aio_finish(a, tp_error_ref(err), a->a_prov_u64[0]);
        return;
    }
    a->a_prov_data[0] = NULL;
    if (rd->r_inflight == 0) {
        uint64_t count = a->a_prov_u64[0] + ucx_rd_filled(rd);
        ucx_rd_free(rd);
        tp__aio_finish(a, tp_error_ref(err), count);
        return;
    }
    // UCP still writes into the caller's buffer: ucx_rpost_cb finishes
    // the read when UCP lets go of it (the conn's force close makes it).
    // No cancel reaches the conn from now on: it may be gone by then.
    rd->r_orphan = true;
    rd->r_err = tp_error_ref(err);
    a->a_cancel_fn = NULL;
}

void
tp__ucx_read_cancel_posted(ucx_conn *c, tp_aio *a, tp_error *err)
{
    tp__list_remove(&c->xc_readq, a);
    tp__ucx_read_fail(a, err);
    tp__ucx_conn_fail(c, tp__error_new(TP_ECLOSED, 0, err,
                                       "ucx: connection to peer %s closed",
                                       c->xc_base.c_peer));
    tp_error_unref(err);
}

// ---- the read queue --------------------------------------------------------

void
tp__ucx_read_pump(ucx_conn *c)
{
    tp_aio *a;
    while (c->xc_state == UCX_OPEN &&
           (a = tp__list_first(&c->xc_readq)) != NULL) {
        ucx_rd *rd = a->a_prov_data[0];
        if (rd != NULL) {
            if (!ucx_rd_settle(c, a, rd)) {
                return;
            }
            if (a->a_prov_u64[0] < a->a_prov_u64[1]) {
                ucs_status_t st = ucx_rd_post(c, a, rd);
                if (st != UCS_OK) {
                    tp__ucx_conn_fail(
                        c, tp__error_new(tp__ucx_status_tp(st), 0, NULL,
                                         "ucx: read from peer %s: posting a "
                                         "receive: %s",
                                         c->xc_base.c_peer,
                                         ucs_status_string(st)));
                    return;
                }
                if (rd->r_npost > 0 && ucx_rd_at(rd, 0)->rp_done) {
                    continue; // UCP completed it at once
                }
                break; // UCP fills the buffer; ucx_rpost_cb says when
            }
            a->a_prov_data[0] = NULL;
            ucx_rd_free(rd);
        }
        uint64_t moved = a->a_prov_u64[0];
        if (moved == a->a_prov_u64[1]) {
            tp__list_remove(&c->xc_readq, a);
            tp__aio_finish(a, NULL, moved);
            continue;
        }
        // The iov holding byte @moved.
        uint64_t skip = moved;
        unsigned i = tp__iov_seek(a->a_iov, &skip);
        ucs_status_t st = UCS_OK;
        int64_t got = tp__ucx_consume(c, (uint8_t *)a->a_iov[i].iov_base + skip,
                                      a->a_iov[i].iov_len - skip, &st);
        if (got < 0) {
            tp__ucx_conn_fail(c, tp__error_new(TP_ECONNRESET, 0, NULL,
                                               "ucx: read from peer %s: %s",
                                               c->xc_base.c_peer,
                                               ucs_status_string(st)));
            return;
        }
        if (got == 0) {
            if (!ucx_read_may_post(c, a)) {
                break;
            }
            // UCP holds nothing more: let it receive into the caller's
            // iovs (without memory, the read goes on taking data).
            rd = tp__zalloc(sizeof(*rd));
            if (rd == NULL) {
                break;
            }
            rd->r_aio = a;
            rd->r_posted = a->a_prov_u64[0];
            a->a_prov_data[0] = rd;
            continue;
        }
        a->a_prov_u64[0] += (uint64_t)got;
        tp__ucx_rx_consumed(c, (uint64_t)got);
    }
    // The peer is gone and what it sent before is consumed: a read still
    // waiting fails (a conn with no read pending keeps the received data
    // for later reads, like a socket holding data before its EOF).
    if (c->xc_state == UCX_OPEN && c->xc_ep_status != UCS_OK &&
        !tp__list_empty(&c->xc_readq)) {
        tp__ucx_conn_fail(c, tp__error_new(TP_ECONNRESET, 0, NULL,
                                           "ucx: read from peer %s: connection "
                                           "closed by peer or failed (%s)",
                                           c->xc_base.c_peer,
                                           ucs_status_string(c->xc_ep_status)));
    }
}
