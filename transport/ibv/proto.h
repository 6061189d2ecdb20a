/* SPDX-License-Identifier: Apache-2.0 */
/* proto.h (internal) - the ibv transport's ring and credit logic, with no
 * verbs calls (unit-tested on its own in tests/transport/ibv_test.c).
 *
 * Each side has an inbox ring in registered memory that the peer writes
 * into with RDMA_WRITE_WITH_IMM. The sender keeps a mirror of the peer's
 * inbox positions: it writes at tx_head, never past tx_tail + capacity,
 * never across the ring's end within one write (a wrap is two writes).
 * Each write is a segment; its immediate carries its length. The receiver
 * copies segments out in order into the caller's buffers, and once a
 * segment is wholly consumed it can be acknowledged: an ack is a zero-byte
 * write with immediate carrying a count of segments, which frees their
 * bytes at the sender (the byte credits) and their slots (the segment
 * credits).
 *
 * Immediate (32 bits): bit 31 clear = data of N bytes (1 .. 2^31-1);
 * bit 31 set = ack of N segments (1 .. max_segs).
 *
 * Work requests are bounded: at most max_segs data segments are unacked at
 * once, and every ack acknowledges at least one of the peer's segments, so
 * at most 2 * max_segs writes with immediate are in flight towards a side;
 * each side posts that many receives and reposts one per completion, so a
 * write never finds the peer without a receive (no RNR).
 *
 * Anything the peer could not have sent (a zero-length data segment, more
 * bytes than the ring has free, a segment crossing the ring's end, an ack
 * of more segments than are in flight) is a protocol error: the caller
 * closes that connection with TP_EPROTO naming the peer. */
#ifndef TP_TRANSPORT_IBV_PROTO_H
#define TP_TRANSPORT_IBV_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define TP_IBV_IMM_ACK     UINT32_C(0x80000000)
#define TP_IBV_IMM_LEN_MAX UINT32_C(0x7fffffff)

typedef struct tp_ibv_proto {
    // Receive side: our inbox.
    uint64_t p_rx_cap;
    uint64_t p_rx_head;     // stream bytes the peer has written
    uint64_t p_rx_tail;     // stream bytes we have consumed
    uint32_t *p_rx_segs;    // ring of received segment lengths
    uint32_t p_rx_first;    // index of the oldest unconsumed segment
    uint32_t p_rx_nsegs;    // segments received, not yet wholly consumed
    uint64_t p_rx_seg_used; // bytes of the oldest segment consumed
    uint32_t p_rx_ackable;  // wholly consumed, not yet acknowledged
    // Send side: the peer's inbox.
    uint64_t p_tx_cap;
    uint64_t p_tx_head; // stream bytes written (posted)
    uint64_t p_tx_tail; // stream bytes acknowledged (free again)
    uint32_t *p_tx_segs;
    uint32_t p_tx_first;
    uint32_t p_tx_nsegs;   // unacknowledged segments
    uint32_t p_tx_seg_max; // bytes per segment
    uint32_t p_max_segs;
} tp_ibv_proto;

// Rings of @rx_cap (ours) and @tx_cap (the peer's) bytes, at most
// @max_segs unacked segments each way, @seg_max bytes per segment.
tp_status tp__ibv_proto_init(tp_ibv_proto *p, uint64_t rx_cap, uint64_t tx_cap,
                             uint32_t max_segs, uint32_t seg_max);
void tp__ibv_proto_fini(tp_ibv_proto *p);

// Send side: where the next write of up to @want bytes goes. Returns false
// when there is no credit (the peer's ring is full or max_segs segments
// are unacked); else *off_p (offset in the peer's ring) and *len_p.
bool tp__ibv_proto_tx_next(const tp_ibv_proto *p, uint64_t want,
                           uint64_t *off_p, uint32_t *len_p);
// The write planned by tx_next was posted.
void tp__ibv_proto_tx_commit(tp_ibv_proto *p, uint32_t len);

// Both sides: an immediate arrived. Data: *data_p = its length (the bytes
// are now readable). Ack: *data_p = 0 and credits come back. TP_EPROTO
// with @why filled when the peer could not have sent it.
tp_status tp__ibv_proto_on_imm(tp_ibv_proto *p, uint32_t imm, uint32_t *data_p,
                               char *why, size_t why_len);

// Receive side: contiguous readable bytes at *off_p (offset in our ring).
uint64_t tp__ibv_proto_rx_avail(const tp_ibv_proto *p, uint64_t *off_p);
// @n of those bytes were copied out.
void tp__ibv_proto_rx_consume(tp_ibv_proto *p, uint64_t n);
// An ack is due (segments consumed and either the inbox is empty or half
// of max_segs wait): returns its immediate and resets the count, else 0.
uint32_t tp__ibv_proto_ack_take(tp_ibv_proto *p);

#endif
