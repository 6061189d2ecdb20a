/* SPDX-License-Identifier: Apache-2.0 */
/* cma_impl.h (internal to channel/cma/) - what the cma channel's files
 * share: the ack and hello formats, the copy sizes, the channel's state.
 * cma.c: the contract's entry points, the handshake that learns who the
 * peer is, the ack reader and writer; cma_copy.c: sends, receives and
 * their copies (process_vm_readv on the loop or the pool). */
#ifndef TP_CHANNEL_CMA_IMPL_H
#define TP_CHANNEL_CMA_IMPL_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "channel/chan_ack.h"
#include "channel/channel.h"
#include "channel/cma/cma_probe.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"

// Acks on the channel's connection: the reader copied tensor `index` of
// message `seq` (channel/chan_ack.h, shared with cuda_ipc).
#define CMA_ACK_FRAME TP_CHAN_ACK_FRAME
// The first bytes each end sends on the channel's connection: magic, the
// side socket's name, its token; then "ready" once it has connected to the
// peer's side socket and presented the peer's token.
#define CMA_HELLO_MAGIC "TPCMAHI\x01" // 8 bytes
#define CMA_READY_MAGIC "TPCMARDY"
#define CMA_MAGIC_LEN   8u
#define CMA_HELLO_LEN                                                          \
    (CMA_MAGIC_LEN + TP_CMA_SIDE_NAME_LEN + TP_CMA_SIDE_TOKEN_LEN)
#define CMA_RBUF_LEN TP_MAX(CMA_HELLO_LEN, CMA_ACK_FRAME)
_Static_assert(sizeof(CMA_HELLO_MAGIC) - 1 == CMA_MAGIC_LEN, "hello magic");
_Static_assert(sizeof(CMA_READY_MAGIC) - 1 == CMA_MAGIC_LEN, "ready magic");
// Copies up to this size run on the loop: a pool thread's wake-up (~40 us
// on this VM) costs more than the copy (64 B round trip: 60 us through the
// pool, 5 us inline). Larger ones are split in CMA_SPLIT parts copied in
// parallel: the first on the loop while it is at most CMA_LOOP_PART (so a
// large tensor does not stall the context's other pipes for long), the
// others on the copy pool.
#define CMA_INLINE_COPY (256u * 1024u)
#define CMA_LOOP_PART   (4u * 1024u * 1024u)
#define CMA_SPLIT       2u

typedef struct cma_copy {
    tp_chan *cc_ch;
    tp_chan_op *cc_op;
    pid_t cc_pid;
    uint64_t cc_addr;
    uint64_t cc_off, cc_len; // the part of the tensor this copy moves
    tp_task cc_task;
    tp_error *cc_err;
} cma_copy;

struct tp_chan {
    tp_chan_env c_env;
    tp_conn *c_conn;
    tp__chan_acks c_acks; // the sends waiting for acks, the frame writer
    // Who the peer is, from the kernel (see the top of this file).
    enum { CMA_HS_HELLO, CMA_HS_READY, CMA_HS_DONE } c_hs;
    tp__cma_side c_side;
    tp__cma_peer c_peer; // valid once c_hs is CMA_HS_DONE
    tp_list c_recvs;     // receives waiting for c_peer (co_node)
    // reader: the peer's hello, its ready, then acks
    tp_aio c_raio;
    uint8_t c_rbuf[CMA_RBUF_LEN];
    bool c_rbusy;
    bool c_closed;
    bool c_destroy_req;
    int c_copies; // copies on the pool
    tp_task c_free_task;
};

// cma.c
// Fails the pipe with @err (taken) unless the channel is closed.
void tp__cma_chan_fail(tp_chan *ch, tp_error *err);
// Frees the channel once destroyed and idle (no read, write or copy).
void tp__cma_chan_maybe_free(tp_chan *ch);

// cma_copy.c
void tp__cma_chan_send(tp_chan *ch, tp_chan_op *op);
void tp__cma_chan_recv(tp_chan *ch, tp_chan_op *op);
// Starts the copy of @op (the peer is known).
void tp__cma_chan_recv_start(tp_chan *ch, tp_chan_op *op);

#endif
