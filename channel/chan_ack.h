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

// ---- the ack side of a channel's connection --------------------------------
// The sends waiting for their ack, and the writer of this end's frames
// (acks, and cma's hello and ready) with the receives whose ack is in
// them: a receive completes once its ack is written, so a reader that
// exits right after its read has sent it. Reading stays the channel's (cma
// reads its handshake first); it hands each ack frame to
// tp__chan_acks_got. Loop thread.
typedef struct tp__chan_acks {
    const char *ca_name; // "cma", "cuda_ipc": errors
    const char *ca_peer; // the pipe's peer, for errors
    tp_loop *ca_loop;
    tp_conn *ca_conn;
    tp_list ca_sends;  // sends waiting for their ack (co_node)
    tp_list ca_acking; // copied receives whose ack is queued (co_node)
    tp_list ca_acked;  // copied receives whose ack is being written
    tp__chan_wq ca_wq;
    tp_aio ca_waio;
    bool ca_wbusy;
    bool ca_closed; // tp__chan_acks_close ran
    bool ca_down;   // the connection broke (tp__chan_acks_down): no writes
    // Why it broke, while no op depended on it (tp__chan_acks_broken): the
    // channel's next op fails with it.
    tp_error *ca_err;
    const char *ca_down_code; // the log code of that ("TP-CMA-DOWN")
    // A write failed (@err, taken: the channel decides whether the pipe
    // fails; the receives in it have completed); a write ended after close
    // (the channel may free itself once idle).
    void (*ca_write_failed)(void *owner, tp_error *err);
    void (*ca_write_ended)(void *owner);
    void *ca_owner;
    // Optional: a send leaves ca_sends (acked, or failed by close), just
    // before it completes.
    void (*ca_send_done)(tp_chan_op *op);
} tp__chan_acks;

void tp__chan_acks_init(tp__chan_acks *a, const char *name,
                        const tp_chan_env *env, tp_conn *conn,
                        void (*write_failed)(void *owner, tp_error *err),
                        void (*write_ended)(void *owner), void *owner);
// After close, once no write is in flight (ca_wbusy false).
void tp__chan_acks_fini(tp__chan_acks *a);
// Queues @len raw bytes (cma's hello and ready); false: out of memory.
bool tp__chan_acks_push(tp__chan_acks *a, const void *bytes, size_t len);
// Writes what is queued, unless a write is in flight, closed or down.
void tp__chan_acks_flush(tp__chan_acks *a);
// @op, a receive whose bytes are in, is acked; it completes once the ack
// is written (at once, successfully, when the connection is down: there
// is nobody to ack to). False (op not taken): out of memory.
bool tp__chan_acks_ack(tp__chan_acks *a, tp_chan_op *op);
// An ack frame from the peer: the send it names completes (removed from
// ca_sends, its op done). TP_EPROTO with the reason when the frame is
// malformed or names no waiting send.
tp_status tp__chan_acks_got(tp__chan_acks *a,
                            const uint8_t f[TP_CHAN_ACK_FRAME],
                            tp_error **err_p);
// The connection broke: nothing more is written; a queued ack's receive
// completes (its bytes are here).
void tp__chan_acks_down(tp__chan_acks *a);
// The connection broke with @err (taken). Only the tensors that travel on
// the channel depend on it: a protocol error, a send waiting for its ack,
// or @waiting (the channel's own ops that need the connection) returns
// @err, for the channel to fail the pipe with. Otherwise the side goes
// down (tp__chan_acks_down), keeps @err in ca_err (logged at debug level
// with ca_down_code) and returns NULL: a peer that read its last message
// and exited does not fail the writes whose bytes it already has.
tp_error *tp__chan_acks_broken(tp__chan_acks *a, tp_error *err, bool waiting);
// The pipe failed with @err (borrowed): every send and every receive
// waiting on an ack fails with it; the write in flight is cancelled.
void tp__chan_acks_close(tp__chan_acks *a, const tp_error *err);

#endif
