/* SPDX-License-Identifier: Apache-2.0 */
/* chan_ack.h - what channels whose receiver reads the sender's memory
 * (cma, cuda_ipc) share: the ack frame the receiver sends on the channel's
 * own connection once it copied a tensor (the sender's op completes on
 * it), the queue of frames waiting for that connection, and the lookup of
 * the send an ack names. Loop thread only.
 *
 * Ack frame, 24 bytes, laid out like a pipe frame (docs/channel-cma.md):
 * u8 type 5, u8 version 2, u16 zero, u32 tensor index, u64 body length 8,
 * u64 message sequence number.
 */
#ifndef TP_CHANNEL_CHAN_ACK_H
#define TP_CHANNEL_CHAN_ACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "channel/channel.h"

#define TP_CHAN_ACK_TYPE    5u
#define TP_CHAN_ACK_VERSION 2u
#define TP_CHAN_ACK_HDR     16u
#define TP_CHAN_ACK_BODY    8u
#define TP_CHAN_ACK_FRAME   (TP_CHAN_ACK_HDR + TP_CHAN_ACK_BODY)

void tp__chan_ack_encode(uint8_t f[TP_CHAN_ACK_FRAME], uint64_t seq,
                         uint32_t idx);
// Checks an ack frame from the peer: false, with @why naming the fields,
// when it is anything else.
bool tp__chan_ack_decode(const uint8_t f[TP_CHAN_ACK_FRAME], uint64_t *seq_p,
                         uint32_t *idx_p, char *why, size_t why_len);

// Frames queued while a write is in flight, swapped into the write buffer
// when it ends (so the queue never moves under a write).
typedef struct tp__chan_wq {
    uint8_t *wq_q; // queued frames
    size_t wq_len, wq_cap;
    uint8_t *wq_buf; // the frames being written
    size_t wq_buf_cap;
} tp__chan_wq;

// Appends @len bytes; false if out of memory.
bool tp__chan_wq_push(tp__chan_wq *q, const void *bytes, size_t len);
bool tp__chan_wq_push_ack(tp__chan_wq *q, uint64_t seq, uint32_t idx);
// Moves the queued frames to the write buffer: *@iov covers them. False
// when nothing is queued.
bool tp__chan_wq_take(tp__chan_wq *q, tp_iov *iov);
void tp__chan_wq_fini(tp__chan_wq *q);

// Removes and returns the op of @sends (linked by co_node) for tensor
// @idx of message @seq; NULL when none waits for that ack.
tp_chan_op *tp__chan_take_acked(tp_list *sends, uint64_t seq, uint32_t idx);

#endif
