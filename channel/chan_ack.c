// SPDX-License-Identifier: Apache-2.0
// chan_ack.c - the ack frame, the frame queue and the acked send's lookup
// of the channels that copy from the sender's memory (chan_ack.h).

#include "channel/chan_ack.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
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
