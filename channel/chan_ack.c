// SPDX-License-Identifier: Apache-2.0
// chan_ack.c - the ack frame, the frame queue and the acked send's lookup
// of the channels that copy from the sender's memory (chan_ack.h).

#include "channel/chan_ack.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"

void
tp__chan_ack_encode(uint8_t f[TP_CHAN_ACK_FRAME], uint64_t seq, uint32_t idx)
{
    f[0] = TP_CHAN_ACK_TYPE;
    f[1] = TP_CHAN_ACK_VERSION;
    tp__put_u16le(f + 2, 0);
    tp__put_u32le(f + 4, idx);
    tp__put_u64le(f + 8, TP_CHAN_ACK_BODY);
    tp__put_u64le(f + TP_CHAN_ACK_HDR, seq);
}

bool
tp__chan_ack_decode(const uint8_t f[TP_CHAN_ACK_FRAME], uint64_t *seq_p,
                    uint32_t *idx_p, char *why, size_t why_len)
{
    uint64_t body = tp__get_u64le(f + 8);
    if (f[0] != TP_CHAN_ACK_TYPE || f[1] != TP_CHAN_ACK_VERSION ||
        tp__get_u16le(f + 2) != 0 || body != TP_CHAN_ACK_BODY) {
        snprintf(why, why_len,
                 "type %u version %u reserved 0x%04x length %" PRIu64
                 " (want %u, %u, 0, %u)",
                 f[0], f[1], tp__get_u16le(f + 2), body, TP_CHAN_ACK_TYPE,
                 TP_CHAN_ACK_VERSION, TP_CHAN_ACK_BODY);
        return false;
    }
    *idx_p = tp__get_u32le(f + 4);
    *seq_p = tp__get_u64le(f + TP_CHAN_ACK_HDR);
    return true;
}

bool
tp__chan_wq_push(tp__chan_wq *q, const void *bytes, size_t len)
{
    if (q->wq_len + len > q->wq_cap) {
        size_t cap = q->wq_cap ? q->wq_cap * 2 : TP_CHAN_ACK_FRAME * 16;
        while (cap < q->wq_len + len) {
            cap *= 2;
        }
        uint8_t *n = tp__alloc(cap);
        if (n == NULL) {
            return false;
        }
        if (q->wq_len) {
            memcpy(n, q->wq_q, q->wq_len);
        }
        tp__free(q->wq_q);
        q->wq_q = n;
        q->wq_cap = cap;
    }
    memcpy(q->wq_q + q->wq_len, bytes, len);
    q->wq_len += len;
    return true;
}

bool
tp__chan_wq_push_ack(tp__chan_wq *q, uint64_t seq, uint32_t idx)
{
    uint8_t f[TP_CHAN_ACK_FRAME];
    tp__chan_ack_encode(f, seq, idx);
    return tp__chan_wq_push(q, f, sizeof(f));
}

bool
tp__chan_wq_take(tp__chan_wq *q, tp_iov *iov)
{
    if (q->wq_len == 0) {
        return false;
    }
    uint8_t *b = q->wq_buf;
    size_t cap = q->wq_buf_cap;
    q->wq_buf = q->wq_q;
    q->wq_buf_cap = q->wq_cap;
    *iov = (tp_iov){q->wq_buf, q->wq_len};
    q->wq_q = b;
    q->wq_cap = cap;
    q->wq_len = 0;
    return true;
}

void
tp__chan_wq_fini(tp__chan_wq *q)
{
    tp__free(q->wq_q);
    tp__free(q->wq_buf);
    memset(q, 0, sizeof(*q));
}

tp_chan_op *
tp__chan_take_acked(tp_list *sends, uint64_t seq, uint32_t idx)
{
    for (tp_chan_op *op = tp__list_first(sends); op != NULL;
         op = tp__list_next(sends, op)) {
        if (op->co_seq == seq && op->co_index == idx) {
            tp__list_remove(sends, op);
            return op;
        }
    }
    return NULL;
}

// ---- the ack side
// ------------------------------------------------------------

static void
acks_waio_cb(void *arg)
{
    tp__chan_acks *a = arg;
    a->ca_wbusy = false;
    if (a->ca_closed) {
        a->ca_write_ended(a->ca_owner);
        return;
    }
    // The receives acked by this write are done: their bytes are here
    // (even if the ack could not go: then only the sender's write fails).
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&a->ca_acked)) != NULL) {
        op->co_done(op, NULL);
    }
    if (tp_aio_status(&a->ca_waio) != TP_OK) {
        tp__chan_acks_down(a);
        a->ca_write_failed(a->ca_owner,
                           tp__error_new(tp_aio_status(&a->ca_waio), 0,
                                         tp_aio_error(&a->ca_waio),
                                         "%s: pipe to %s: sending acks",
                                         a->ca_name, a->ca_peer));
        return;
    }
    tp__chan_acks_flush(a);
}

void
tp__chan_acks_init(tp__chan_acks *a, const char *name, const tp_chan_env *env,
                   tp_conn *conn,
                   void (*write_failed)(void *owner, tp_error *err),
                   void (*write_ended)(void *owner), void *owner)
{
    memset(a, 0, sizeof(*a));
    a->ca_name = name;
    a->ca_down_code = "TP-CHAN-DOWN";
    a->ca_peer = env->ce_peer;
    a->ca_loop = env->ce_loop;
    a->ca_conn = conn;
    TP_LIST_INIT(&a->ca_sends, tp_chan_op, co_node);
    TP_LIST_INIT(&a->ca_acking, tp_chan_op, co_node);
    TP_LIST_INIT(&a->ca_acked, tp_chan_op, co_node);
    tp__aio_init(&a->ca_waio, acks_waio_cb, a);
    a->ca_write_failed = write_failed;
    a->ca_write_ended = write_ended;
    a->ca_owner = owner;
}

void
tp__chan_acks_fini(tp__chan_acks *a)
{
    tp__aio_fini(&a->ca_waio);
    tp__chan_wq_fini(&a->ca_wq);
    tp_error_unref(a->ca_err);
    a->ca_err = NULL;
}

bool
tp__chan_acks_push(tp__chan_acks *a, const void *bytes, size_t len)
{
    return tp__chan_wq_push(&a->ca_wq, bytes, len);
}

void
tp__chan_acks_flush(tp__chan_acks *a)
{
    tp_iov iov;
    if (a->ca_wbusy || a->ca_closed || a->ca_down ||
        !tp__chan_wq_take(&a->ca_wq, &iov)) {
        return;
    }
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&a->ca_acking)) != NULL) {
        tp__list_append(&a->ca_acked, op);
    }
    tp_aio_set_iov(&a->ca_waio, 1, &iov);
    a->ca_wbusy = true;
    tp__conn_write(a->ca_conn, &a->ca_waio);
}

bool
tp__chan_acks_ack(tp__chan_acks *a, tp_chan_op *op)
{
    if (a->ca_down) {
        op->co_done(op, NULL); // nobody to ack to: the bytes are here
        return true;
    }
    uint8_t f[TP_CHAN_ACK_FRAME];
    tp__chan_ack_encode(f, op->co_seq, op->co_index);
    if (!tp__chan_wq_push(&a->ca_wq, f, sizeof(f))) {
        return false;
    }
    tp__list_append(&a->ca_acking, op);
    tp__chan_acks_flush(a);
    return true;
}

tp_status
tp__chan_acks_got(tp__chan_acks *a, const uint8_t f[TP_CHAN_ACK_FRAME],
                  tp_error **err_p)
{
    uint64_t seq;
    uint32_t idx;
    char why[96];
    if (!tp__chan_ack_decode(f, &seq, &idx, why, sizeof(why))) {
        return tp__error_set(err_p, TP_EPROTO,
                             "%s: pipe to %s: protocol error: expected an "
                             "ack frame: %s",
                             a->ca_name, a->ca_peer, why);
    }
    tp_chan_op *op = tp__chan_take_acked(&a->ca_sends, seq, idx);
    if (op != NULL && a->ca_send_done != NULL) {
        a->ca_send_done(op);
    }
    if (op == NULL) {
        return tp__error_set(err_p, TP_EPROTO,
                             "%s: pipe to %s: protocol error: ack of message "
                             "%" PRIu64 " tensor %u, which is not waiting for "
                             "one",
                             a->ca_name, a->ca_peer, seq, idx);
    }
    op->co_done(op, NULL);
    return TP_OK;
}

void
tp__chan_acks_down(tp__chan_acks *a)
{
    a->ca_down = true;
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&a->ca_acking)) != NULL) {
        op->co_done(op, NULL);
    }
}

tp_error *
tp__chan_acks_broken(tp__chan_acks *a, tp_error *err, bool waiting)
{
    if (tp_error_status(err) == TP_EPROTO || waiting ||
        !tp__list_empty(&a->ca_sends)) {
        return err;
    }
    TP_LOG_DEBUG(a->ca_down_code,
                 "%s (no %s op waits on it: the pipe goes on; its next %s "
                 "tensor fails)",
                 tp_error_message(err), a->ca_name, a->ca_name);
    tp__chan_acks_down(a);
    if (a->ca_err == NULL) {
        a->ca_err = err;
    } else {
        tp_error_unref(err);
    }
    return NULL;
}

void
tp__chan_acks_close(tp__chan_acks *a, const tp_error *err)
{
    a->ca_closed = true;
    tp_list *lists[] = {&a->ca_sends, &a->ca_acking, &a->ca_acked};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        tp_chan_op *op;
        while ((op = tp__list_pop_first(lists[i])) != NULL) {
            if (i == 0 && a->ca_send_done != NULL) {
                a->ca_send_done(op);
            }
            tp__chan_op_fail_later(a->ca_loop, op, tp_error_ref(err));
        }
    }
    tp_aio_cancel(&a->ca_waio);
}
