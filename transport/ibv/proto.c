// SPDX-License-Identifier: Apache-2.0
// proto.c - the ibv transport's ring and credit logic (see proto.h): pure
// bookkeeping, no verbs calls, no I/O.

#include "transport/ibv/proto.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/platform.h"

tp_status
tp__ibv_proto_init(tp_ibv_proto *p, uint64_t rx_cap, uint64_t tx_cap,
                   uint32_t max_segs, uint32_t seg_max)
{
    memset(p, 0, sizeof(*p));
    if (rx_cap == 0 || tx_cap == 0 || max_segs == 0 || seg_max == 0 ||
        seg_max > TP_IBV_IMM_LEN_MAX || max_segs > TP_IBV_IMM_LEN_MAX) {
        return TP_EINVAL;
    }
    p->p_rx_segs = tp__zalloc(sizeof(uint32_t) * max_segs);
    p->p_tx_segs = tp__zalloc(sizeof(uint32_t) * max_segs);
    if (p->p_rx_segs == NULL || p->p_tx_segs == NULL) {
        tp__ibv_proto_fini(p);
        return TP_ENOMEM;
    }
    p->p_rx_cap = rx_cap;
    p->p_tx_cap = tx_cap;
    p->p_max_segs = max_segs;
    p->p_tx_seg_max = seg_max;
    return TP_OK;
}

void
tp__ibv_proto_fini(tp_ibv_proto *p)
{
    tp__free(p->p_rx_segs);
    tp__free(p->p_tx_segs);
    p->p_rx_segs = NULL;
    p->p_tx_segs = NULL;
}

bool
tp__ibv_proto_tx_next(const tp_ibv_proto *p, uint64_t want, uint64_t *off_p,
                      uint32_t *len_p)
{
    uint64_t used = p->p_tx_head - p->p_tx_tail;
    if (want == 0 || p->p_tx_nsegs >= p->p_max_segs || used >= p->p_tx_cap) {
        return false;
    }
    uint64_t off = p->p_tx_head % p->p_tx_cap;
    uint64_t n = p->p_tx_cap - used;  // free bytes
    n = TP_MIN(n, p->p_tx_cap - off); // up to the ring's end
    n = TP_MIN(n, want);
    n = TP_MIN(n, (uint64_t)p->p_tx_seg_max);
    *off_p = off;
    *len_p = (uint32_t)n;
    return true;
}

void
tp__ibv_proto_tx_commit(tp_ibv_proto *p, uint32_t len)
{
    TP_ASSERT(p->p_tx_nsegs < p->p_max_segs);
    uint32_t i = (p->p_tx_first + p->p_tx_nsegs) % p->p_max_segs;
    p->p_tx_segs[i] = len;
    p->p_tx_nsegs++;
    p->p_tx_head += len;
}

tp_status
tp__ibv_proto_on_imm(tp_ibv_proto *p, uint32_t imm, uint32_t *data_p, char *why,
                     size_t why_len)
{
    uint32_t n = imm & TP_IBV_IMM_LEN_MAX;
    if (imm & TP_IBV_IMM_ACK) {
        if (n == 0 || n > p->p_tx_nsegs) {
            snprintf(why, why_len,
                     "acknowledged %" PRIu32 " segments but %" PRIu32
                     " are in flight",
                     n, p->p_tx_nsegs);
            return TP_EPROTO;
        }
        for (uint32_t k = 0; k < n; k++) {
            p->p_tx_tail += p->p_tx_segs[p->p_tx_first];
            p->p_tx_first = (p->p_tx_first + 1) % p->p_max_segs;
        }
        p->p_tx_nsegs -= n;
        *data_p = 0;
        return TP_OK;
    }
    uint64_t used = p->p_rx_head - p->p_rx_tail;
    uint64_t off = p->p_rx_head % p->p_rx_cap;
    if (n == 0) {
        snprintf(why, why_len, "wrote an empty data segment");
        return TP_EPROTO;
    }
    if (n > p->p_rx_cap - used) {
        snprintf(why, why_len,
                 "wrote %" PRIu32 " bytes at ring offset %" PRIu64
                 " but only %" PRIu64 " of %" PRIu64 " bytes were free",
                 n, off, p->p_rx_cap - used, p->p_rx_cap);
        return TP_EPROTO;
    }
    if (n > p->p_rx_cap - off) {
        snprintf(why, why_len,
                 "wrote %" PRIu32 " bytes at ring offset %" PRIu64
                 ", past the end of the %" PRIu64 "-byte ring",
                 n, off, p->p_rx_cap);
        return TP_EPROTO;
    }
    if (p->p_rx_nsegs + p->p_rx_ackable >= p->p_max_segs) {
        snprintf(why, why_len,
                 "had more than %" PRIu32 " segments unacknowledged",
                 p->p_max_segs);
        return TP_EPROTO;
    }
    uint32_t i = (p->p_rx_first + p->p_rx_nsegs) % p->p_max_segs;
    p->p_rx_segs[i] = n;
    p->p_rx_nsegs++;
    p->p_rx_head += n;
    *data_p = n;
    return TP_OK;
}

uint64_t
tp__ibv_proto_rx_avail(const tp_ibv_proto *p, uint64_t *off_p)
{
    uint64_t off = p->p_rx_tail % p->p_rx_cap;
    *off_p = off;
    return TP_MIN(p->p_rx_head - p->p_rx_tail, p->p_rx_cap - off);
}

void
tp__ibv_proto_rx_consume(tp_ibv_proto *p, uint64_t n)
{
    TP_ASSERT(n <= p->p_rx_head - p->p_rx_tail);
    p->p_rx_tail += n;
    p->p_rx_seg_used += n;
    while (p->p_rx_nsegs > 0 &&
           p->p_rx_seg_used >= p->p_rx_segs[p->p_rx_first]) {
        p->p_rx_seg_used -= p->p_rx_segs[p->p_rx_first];
        p->p_rx_first = (p->p_rx_first + 1) % p->p_max_segs;
        p->p_rx_nsegs--;
        p->p_rx_ackable++;
    }
}

uint32_t
tp__ibv_proto_ack_take(tp_ibv_proto *p)
{
    if (p->p_rx_ackable == 0) {
        return 0;
    }
    if (p->p_rx_head != p->p_rx_tail &&
        p->p_rx_ackable < TP_MAX(p->p_max_segs / 2, 1u)) {
        return 0;
    }
    uint32_t n = p->p_rx_ackable;
    p->p_rx_ackable = 0;
    return TP_IBV_IMM_ACK | n;
}
