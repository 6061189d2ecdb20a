// SPDX-License-Identifier: Apache-2.0
// flow.c - flow control of the UCX transport. The UCP stream API has none:
// the peer's UCX takes stream data it has no receive for without a bound.
// So each conn's reader grants its peer a window (TP_UCX_WINDOW, sent in
// its hello): the writer hands UCP at most that many bytes past what the
// reader has consumed, and holds the rest of its writes. The reader
// returns credits apart from the byte stream, as UCP active messages
// (id UCX_AM_CREDIT, an 8-byte header: u64le count of bytes its reads
// took, cumulative), each time a quarter of its window has been consumed
// since the last one. A credit is checked: one past the bytes sent, or of
// another length, closes the conn with TP_EPROTO naming the peer.
//
// Active messages arrive inside ucp_worker_progress: the handler only
// records the count (or the fault) on the conn; tp__ucx_conn_dispatch acts
// after progress returns (tp__ucx_credit_check, then tp__ucx_tx_pump).

#include <string.h>

#include "core/log.h"
#include "core/wire.h"
#include "transport/ucx/ucx_impl.h"

// The live conn whose endpoint is @ep (a credit names its endpoint only).
// Credits come once per quarter window per conn, so a walk is cheap.
static ucx_conn *
ucx_conn_by_ep(ucx_ctx *x, ucp_ep_h ep)
{
    for (ucx_conn *c = tp__list_first(&x->x_conns); c != NULL;
         c = tp__list_next(&x->x_conns, c)) {
        if (c->xc_ep == ep) {
            return c;
        }
    }
    return NULL;
}

// UCP calls this inside progress: record; tp__ucx_credit_check acts.
static ucs_status_t
ucx_credit_am_cb(void *arg, const void *header, size_t header_length,
                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    TP_UNUSED(data);
    ucx_ctx *x = arg;
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 ||
        param->reply_ep == NULL) {
        TP_LOG_WARN("TP-UCX-CREDIT",
                    "ucx: a credit message without its endpoint (%zu header "
                    "bytes); dropped",
                    header_length);
        return UCS_OK;
    }
    ucx_conn *c = ucx_conn_by_ep(x, param->reply_ep);
    if (c == NULL || c->xc_credit_bad) {
        return UCS_OK; // its conn is gone, or failing already
    }
    if (header_length != UCX_CREDIT_LEN || length != 0 ||
        (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
        c->xc_credit_bad = true;
        c->xc_credit_bad_shape = true;
        c->xc_credit_bad_len = header_length + length;
        return UCS_OK;
    }
    uint64_t consumed = tp__get_u64le(header);
    if (consumed > c->xc_tx_sent) {
        c->xc_credit_bad = true;
        c->xc_credit_bad_len = header_length;
        c->xc_credit_bad_val = consumed;
    } else if (consumed > c->xc_tx_acked) {
        // Counts are cumulative: an older one arriving late says nothing.
        c->xc_tx_acked = consumed;
    }
    return UCS_OK;
}

tp_status
tp__ucx_flow_init(ucx_ctx *x, tp_error **err_p)
{
    ucp_am_handler_param_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask =
        UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
        UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.id = UCX_AM_CREDIT;
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    p.cb = ucx_credit_am_cb;
    p.arg = x;
    ucs_status_t st = ucp_worker_set_am_recv_handler(x->x_worker, &p);
    if (st != UCS_OK) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "ucx: ucp_worker_set_am_recv_handler: %s",
                             ucs_status_string(st));
    }
    return TP_OK;
}

bool
tp__ucx_credit_check(ucx_conn *c)
{
    if (!c->xc_credit_bad) {
        return true;
    }
    tp_error *err;
    if (c->xc_credit_bad_shape) {
        // By shape, not by length: 8 bytes as payload or by rendezvous
        // are as wrong, and are no count to report.
        err = tp__error_new(TP_EPROTO, 0, NULL,
                            "ucx: connection to peer %s: protocol error: a "
                            "credit of %zu bytes (not a %u-byte header in "
                            "one eager message)",
                            c->xc_base.c_peer, c->xc_credit_bad_len,
                            UCX_CREDIT_LEN);
    } else {
        err = tp__error_new(TP_EPROTO, 0, NULL,
                            "ucx: connection to peer %s: protocol error: a "
                            "credit for %llu bytes consumed, but %llu were "
                            "sent",
                            c->xc_base.c_peer,
                            (unsigned long long)c->xc_credit_bad_val,
                            (unsigned long long)c->xc_tx_sent);
    }
    TP_LOG_WARN("TP-UCX-CREDIT", "%s", tp_error_message(err));
    if (c->xc_state == UCX_SETUP) {
        tp__ucx_setup_fail(c, err);
    } else {
        tp__ucx_conn_fail(c, err);
    }
    return false;
}

void
tp__ucx_tx_pump(ucx_conn *c)
{
    while (c->xc_state == UCX_OPEN && c->xc_tx_next != NULL) {
        tp_aio *a = c->xc_tx_next;
        ucx_op *o = a->a_prov_data[0];
        if (o->o_submitted < o->o_len) {
            uint64_t out = c->xc_tx_sent - c->xc_tx_acked;
            if (out >= c->xc_tx_window) {
                break; // held until a credit comes
            }
            uint64_t n =
                TP_MIN(c->xc_tx_window - out, o->o_len - o->o_submitted);
            tp__ucx_op_submit(c, o, n, 0);
            c->xc_tx_sent += n;
            if (o->o_status != UCS_OK) {
                tp__ucx_conn_fail(
                    c, tp__error_new(tp__ucx_status_tp(o->o_status), 0, NULL,
                                     "ucx: write to peer %s: %s",
                                     c->xc_base.c_peer,
                                     ucs_status_string(o->o_status)));
                return;
            }
            if (o->o_submitted < o->o_len) {
                break; // the window is full
            }
        }
        c->xc_tx_next = tp__list_next(&c->xc_writeq, a);
    }
    tp__ucx_writes_settle(c);
}

ucs_status_t
tp__ucx_credit_send(ucx_conn *c, uint64_t consumed)
{
    uint8_t b[UCX_CREDIT_LEN];
    tp__put_u64le(b, consumed);
    return tp__ucx_send_bytes(c, b, sizeof(b), UCX_AM_CREDIT);
}

void
tp__ucx_rx_consumed(ucx_conn *c, uint64_t n)
{
    c->xc_rx_consumed += n;
    // A quarter window: few credits, and the writer is never stalled for
    // lack of one while the reader keeps reading.
    if (c->xc_rx_consumed - c->xc_rx_credited < c->xc_rx_window / 4 ||
        c->xc_ep == NULL || c->xc_ep_status != UCS_OK) {
        return;
    }
    ucs_status_t st = tp__ucx_credit_send(c, c->xc_rx_consumed);
    if (st != UCS_OK) {
        tp__ucx_conn_fail(c, tp__error_new(tp__ucx_status_tp(st), 0, NULL,
                                           "ucx: sending a credit to peer "
                                           "%s: %s",
                                           c->xc_base.c_peer,
                                           ucs_status_string(st)));
        return;
    }
    c->xc_rx_credited = c->xc_rx_consumed;
}
