/* SPDX-License-Identifier: Apache-2.0 */
/* channel.h - the channel contract: how the bytes of tensors move between
 * the two ends of a pipe. A backend (channel/<name>/: basic, xth, cma, mpt)
 * fills a const tp_channel_ops declared in its backend.cmake, from which
 * channel/registry.c's table is generated (docs/backends.md).
 *
 * The pipe owns the control flow. For each message it writes, it calls
 * `send` once per tensor longer than inline_max (basic: none), in tensor
 * order, before the
 * descriptor is encoded: the channel fills op->co_info (bytes carried in
 * the descriptor for that tensor) and starts moving the bytes. For each
 * message it reads, after the user supplied the destination buffers, it
 * calls `recv` once per such tensor with the info from the
 * descriptor. Both sides see the same sequence of calls, so a channel may
 * derive placement (which lane) from its own counters.
 *
 * Completion: the channel calls op->co_done(op, err) exactly once per op,
 * on the context's loop thread, never inside send/recv (post or defer).
 * err NULL = success; the channel passes its reference to the pipe.
 * `send` is done when the sender's buffer is no longer needed; `recv` when
 * the bytes are in the destination buffer.
 *
 * Threads: send/recv/close/destroy run on the context's loop thread. A
 * channel may copy on the context's pool (ce_pool) or use lane loops.
 *
 * Errors the channel detects (bad info from the peer, a lane died) go to
 * ce_fail, which closes the pipe; the pipe then calls close, after which
 * every pending op must complete (with the error given to close).
 *
 * Devices: each op says where its buffer is on this end (co_device), and
 * each channel declares the device pairs it can move bytes between
 * (devices, TP_CHAN_DEV_*). The pipe's channel is chosen among those
 * carrying TP_CHAN_DEV_CPU_CPU; a tensor on a CUDA device is staged
 * through host memory (pipe/pipe_cuda.c) and handed to that channel as a
 * CPU buffer, and the pipe never gives a channel an op on a device kind
 * its mask lacks (docs/cuda.md). A channel that moves device memory
 * itself (cuda_ipc, not built yet) would declare TP_CHAN_DEV_CUDA_CUDA.
 */
#ifndef TP_CHANNEL_CHANNEL_H
#define TP_CHANNEL_CHANNEL_H

#include <stdbool.h>
#include <stdint.h>

#include <tpipe/tensor.h>

#include "channel/chan_info.h"
#include "core/config.h"
#include "core/error.h"
#include "core/list.h"
#include "core/loop.h"
#include "core/pool.h"
#include "transport/transport.h"

#define TP_CHANNEL_ABI_V1 1u

// Device pairs a channel moves bytes between (tp_channel_ops.devices).
enum {
    TP_CHAN_DEV_CPU_CPU = 1u << 0,   // host memory on both ends
    TP_CHAN_DEV_CUDA_CUDA = 1u << 1, // CUDA device memory on both ends
    TP_CHAN_DEV_CPU_CUDA = 1u << 2,  // host on one end, CUDA on the other
};

typedef struct tp_chan tp_chan;
typedef struct tp_chan_op tp_chan_op;

struct tp_chan_op {
    // set by the pipe
    void *co_buf;
    uint64_t co_len;
    uint64_t co_seq;     // message sequence number (per direction, from 0)
    uint32_t co_index;   // tensor index in the message
    tp_device co_device; // where co_buf is on this end (cpu: host memory)
    tp__chan_info co_info;
    void (*co_done)(tp_chan_op *op, tp_error *err);
    void *co_arg;
    // channel private
    tp_list_node co_node;
    int co_parts;     // outstanding pieces (mpt chunks)
    tp_error *co_err; // first error of a piece
    tp_task co_task;
    void *co_priv;
};

// What the pipe gives a channel instance.
typedef struct tp_chan_env {
    tp_loop *ce_loop; // the context's loop
    tp_pool *ce_pool; // for copies off the loop
    const tp_config *ce_cfg;
    tp_conn **ce_conns; // the extra connections (ready), ce_nconns
    unsigned ce_nconns;
    const char *ce_peer;        // "worker1 at tcp://127.0.0.1:5000", for errors
    const char *ce_peer_domain; // the peer's descriptor of this channel
    void (*ce_fail)(void *pipe, tp_error *err); // takes err
    void *ce_pipe;
} tp_chan_env;

typedef struct tp_channel_ops {
    uint32_t abi_version; // TP_CHANNEL_ABI_V1
    const char *name;     // "basic", "xth", "cma", "mpt"
    // The device pairs it carries (TP_CHAN_DEV_*, at least one).
    uint32_t devices;
    // The tensor bytes go on the pipe's own connection, right after the
    // payloads (basic): send/recv are then not called.
    bool inline_data;
    // Optional (NULL: none): the channel's tunables (core/tunables.h),
    // listed by `tpipe info --config` and loaded into every tp_config.
    const tp_tunables *tunables;
    // Optional: tensors up to this many bytes go on the pipe's connection
    // like basic's (small tensors gain nothing from the channel's path).
    // Must be part of the domain descriptor: both ends must agree.
    uint64_t (*inline_max)(const tp_config *cfg);
    // Extra connections the pipe opens for an instance: on the pipe's
    // transport, or (lanes) one per lane on the context's lane transports.
    unsigned (*nconns)(const tp_config *cfg, bool *lanes_p);
    // Any thread: false = unusable here, @why says why.
    bool (*is_viable)(const tp_config *cfg, char *why, size_t why_len);
    // Any thread: the domain descriptor (equal on both ends = usable).
    tp_status (*domain)(const tp_config *cfg, char *buf, size_t len,
                        tp_error **err_p);
    // Loop thread, once the extra connections are ready.
    tp_status (*create)(const tp_chan_env *env, tp_chan **ch_p,
                        tp_error **err_p);
    // Optional (NULL: every op), device channels: whether @op's buffer can
    // go on this channel (cuda_ipc: its memory can be shared); false, with
    // @why, and the pipe stages that tensor through host memory instead.
    // Loop thread, before send.
    bool (*accepts)(tp_chan *ch, const tp_chan_op *op, char *why,
                    size_t why_len);
    void (*send)(tp_chan *ch, tp_chan_op *op);
    void (*recv)(tp_chan *ch, tp_chan_op *op);
    // The pipe failed with @err (borrowed): fail every pending op, stop
    // touching the connections (the pipe closes them).
    void (*close)(tp_chan *ch, const tp_error *err);
    // After close, once every op completed.
    void (*destroy)(tp_chan *ch);
} tp_channel_ops;

// Completes @op with @err (taken) from @loop's deferred queue (loop
// thread): for failures found inside send/recv/close.
void tp__chan_op_fail_later(tp_loop *loop, tp_chan_op *op, tp_error *err);

// The channels compiled in, best first (xth, cma, mpt, basic): each
// channel/<name>/backend.cmake declares one (docs/backends.md).
const tp_channel_ops *const *tp__channel_registry(size_t *n_p);
// The channel called @name, or NULL when it is not built.
const tp_channel_ops *tp__channel_find(const char *name);

#endif
