/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_ipc_impl.h (internal to channel/cuda_ipc/) - what the cuda_ipc
 * channel's files share. cuda_ipc.c: the contract's entry points, the
 * domain, the ack reader and writer; cuda_ipc_copy.c: sends (the tensor's
 * memory handle in the descriptor), receives (open, copy on the context's
 * pool) and the table of this process's sends, through which a receiver
 * in the same process finds the sender's pointer; cuda_ipc_cache.c: the
 * peer's allocations opened here, kept open for the next tensor.
 *
 * Channel info, 96 bytes (version 1), all integers little-endian:
 *   u8 version, u8 the sender's device index, u16 zero, u32 sender pid,
 *   u64 token (the send's entry in the sender's table),
 *   u64 offset of the tensor in its allocation, u64 allocation size,
 *   64 bytes cudaIpcMemHandle_t of the allocation.
 */
#ifndef TP_CHANNEL_CUDA_IPC_IMPL_H
#define TP_CHANNEL_CUDA_IPC_IMPL_H

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "channel/chan_ack.h"
#include "channel/channel.h"
#include "core/alloc.h"
#include "core/cuda.h"
#include "core/log.h"
#include "core/wire.h"

#define CIPC_INFO_VERSION 1u
#define CIPC_INFO_LEN     (32u + TP_CUDA_IPC_HANDLE_LEN)
_Static_assert(CIPC_INFO_LEN <= TP_CHAN_INFO_MAX, "fits the descriptor");

// The channel info of one tensor, decoded.
typedef struct tp__cipc_info {
    int ci_dev;         // the sender's device index (as it numbers them)
    uint32_t ci_pid;    // the sender's process
    uint64_t ci_token;  // its send's entry in its table
    uint64_t ci_offset; // the tensor in the allocation
    uint64_t ci_size;   // the allocation, as the sender says
    uint8_t ci_handle[TP_CUDA_IPC_HANDLE_LEN];
} tp__cipc_info;

void tp__cipc_info_encode(const tp__cipc_info *in, tp__chan_info *out);
// Checks @in (from the peer) for a tensor of @len bytes: length, version,
// reserved field, the tensor inside the allocation. False with @why
// naming the field otherwise.
bool tp__cipc_info_decode(const tp__chan_info *in, uint64_t len,
                          tp__cipc_info *out, char *why, size_t why_len);

// One of the peer's allocations, opened here (cuda_ipc_cache.c).
typedef struct cipc_map {
    uint8_t m_handle[TP_CUDA_IPC_HANDLE_LEN];
    int m_dev; // opened on
    void *m_base;
    size_t m_size;   // what the handle names (the driver's range)
    int m_refs;      // copies using it
    uint64_t m_used; // last use (LRU); 0: a free slot
} cipc_map;

typedef struct cipc_cache {
    pthread_mutex_t cc_mtx;
    cipc_map *cc_maps; // cc_n slots
    unsigned cc_n;
    unsigned cc_cap; // idle mappings kept (TP_CUDA_IPC_CACHE)
    uint64_t cc_tick;
    uint64_t cc_opens, cc_hits;
} cipc_cache;

void tp__cipc_cache_init(cipc_cache *c, unsigned cap);
// The mapping of @handle on @dev: cached, or opened now; *@size_p is the
// allocation's size. Held until tp__cipc_cache_put.
tp_status tp__cipc_cache_get(cipc_cache *c, const uint8_t *handle, int dev,
                             void **base_p, size_t *size_p, tp_error **err_p);
void tp__cipc_cache_put(cipc_cache *c, void *base, int dev);
// Closes every mapping (none may be in use).
void tp__cipc_cache_fini(cipc_cache *c);

// A copy on the pool: the receive @cp_op from the peer's memory.
typedef struct cipc_copy {
    tp_chan *cp_ch;
    tp_chan_op *cp_op;
    tp__cipc_info cp_info;
    tp_error *cp_err;
    tp_task cp_task;
} cipc_copy;

// An export kept from accepts for the send (tp_chan.c_exports).
typedef struct cipc_export {
    const void *x_buf;
    uint64_t x_len;
    int x_dev;
    uint32_t x_index; // the tensor in its message
    uint64_t x_off;
    size_t x_size;
    uint8_t x_handle[TP_CUDA_IPC_HANDLE_LEN];
} cipc_export;

#define CIPC_EXPORTS_MAX 16

struct tp_chan {
    tp_chan_env c_env;
    tp_conn *c_conn;
    tp__chan_acks c_acks; // the sends waiting for acks, the ack writer
    tp_aio c_raio;
    uint8_t c_rbuf[TP_CHAN_ACK_FRAME];
    bool c_rbusy;
    bool c_closed;
    bool c_destroy_req;
    int c_copies;             // copies on the pool
    int64_t c_reader_wait_ms; // TP_CUDA_IPC_READER_WAIT_MS
    // When the failed sends stop waiting for same-process readers (set by
    // the first wait; 0: none yet). Loop thread.
    uint64_t c_reader_deadline;
    cipc_cache c_cache;
    // The exports accepts made for the tensors of the message being
    // started (wop_route asks for all of them, then sends them in order),
    // each taken by the send of that tensor, so a tensor's handle is asked
    // for once, not twice. Live: [c_xnext, c_nexports). An accepts for a
    // tensor index not past the last kept one starts a new message and
    // drops them all; a send drops those of lower indexes (never sent).
    // Loop thread.
    cipc_export c_exports[CIPC_EXPORTS_MAX];
    unsigned c_nexports, c_xnext;
    tp_task c_free_task;
};

// cuda_ipc.c
// Fails the pipe with @err (taken) unless the channel is closed.
void tp__cipc_fail(tp_chan *ch, tp_error *err);
void tp__cipc_maybe_free(tp_chan *ch);

// cuda_ipc_copy.c
// Whether @op's memory can be shared (exported); else @why, and the pipe
// stages that tensor.
bool tp__cipc_accepts(tp_chan *ch, const tp_chan_op *op, char *why,
                      size_t why_len);
void tp__cipc_send(tp_chan *ch, tp_chan_op *op);
void tp__cipc_recv(tp_chan *ch, tp_chan_op *op);
// A send completed or failed: its entry leaves the table.
void tp__cipc_send_done(tp_chan_op *op);

#endif
