/* SPDX-License-Identifier: Apache-2.0 */
/* pipe_impl.h (internal) - the structures shared by context.c (context)
 * and context_listen.c (listener, the first frame of accepted
 * connections) and the pipe's files:
 * pipe.c (object, failure, ready, public calls), pipe_hs_accept.c and
 * pipe_hs_connect.c (the two halves of the handshake), pipe_write.c and
 * pipe_read.c (the write and read engines).
 *
 * Threads: everything here is touched on the context's loop thread
 * (x_loop), except the fields marked atomic or "x_mtx". mpt lanes run on
 * their own loops (x_lane_loops); their completions are posted back. A
 * message's CUDA staging (pipe_wop, while w_prepping) and a read's
 * host-to-device copies (pipe_rop, while r_copying) run on the context's
 * copy pool, touching only the fields their comments name.
 */
#ifndef TP_PIPE_PIPE_IMPL_H
#define TP_PIPE_PIPE_IMPL_H

#include <stdatomic.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "core/aio.h"
#include "core/list.h"
#include "core/loop.h"
#include "core/platform.h"
#include "core/pool.h"
#include "pipe/wire.h"
#include "transport/transport.h"

#define TP_CTX_MAX_LANES 64
#define TP_REPORT_LEN    2048

typedef struct tp_pipe_hs tp_pipe_hs;

// A device channel (cuda_ipc): carries CUDA tensors, never host buffers;
// both ends of the handshake decide with this.
static inline bool
tp__chan_is_device(const tp_channel_ops *ops)
{
    return !(ops->devices & TP_CHAN_DEV_CPU_CPU) &&
           (ops->devices & TP_CHAN_DEV_CUDA_CUDA);
}

// A transport or channel the context knows, used or not.
typedef struct ctx_backend {
    char cb_name[TP_WIRE_MAX_NAME + 1];
    bool cb_used;
    char cb_why[256]; // why not used ("not viable here: ...")
    char cb_domain[TP_WIRE_MAX_DOMAIN + 1];
    tp_transport *cb_transport;           // transports
    const tp_channel_ops *cb_channel_ops; // channels
} ctx_backend;

// A context's page-locked staging buffers kept for the next messages
// (pipe_cuda.c), so steady traffic of CUDA tensors makes no
// cudaMallocHost or cudaFreeHost call: sizes are powers of two from
// 4 KiB, a free list per size linked through each buffer's first word,
// at most pc_cap bytes kept (TP_PIPE_CUDA_PINNED_CACHE). Any thread
// (pc_mtx): the loop (read staging, release) and the copy pool (write
// staging).
#define TP_PINNED_MIN_SHIFT 12
#define TP_PINNED_CLASSES   29 // 4 KiB .. 1 TiB
typedef struct tp__pinned_cache {
    tp_mtx pc_mtx;
    void *pc_free[TP_PINNED_CLASSES];
    uint64_t pc_bytes; // kept now
    uint64_t pc_cap;
} tp__pinned_cache;

struct tp_context {
    char x_name[TP_WIRE_MAX_CTXNAME + 1];
    tp_config x_cfg;
    tp__pipe_limits x_limits;
    tp__pinned_cache x_pinned;
    tp_loop *x_loop;
    tp_pool *x_pool;
    // every registered backend, best first; used ones have cb_used
    ctx_backend x_tr[TP_WIRE_MAX_BACKENDS];
    size_t x_ntr;
    ctx_backend x_ch[TP_WIRE_MAX_BACKENDS];
    size_t x_nch;
    // mpt lanes: one loop + lane transport each (when mpt is used); the
    // lane transport is x_lane_ops, the first used TP_TRANSPORT_PROP_NETWORK
    // transport of the context (NULL: none)
    const tp_transport_ops *x_lane_ops;
    unsigned x_nlanes;
    tp_loop *x_lane_loops[TP_CTX_MAX_LANES];
    tp_transport *x_lane_tr[TP_CTX_MAX_LANES];
    // loop thread
    tp_list x_pipes;     // live pipes (tp_pipe.p_ctx_node)
    tp_list x_listeners; // tp_pipe_listener.pl_node
    tp_list x_pending;   // accepted conns in their first frame (pc_node)
    bool x_closing;
    // x_mtx: objects that must finish before the context can go
    tp_mtx x_mtx;
    tp_cv x_cv;
    int x_nobjs;
};

// One transport listener of a pipe listener (or an mpt lane listener).
typedef struct pl_tl {
    tp_pipe_listener *tl_pl;
    tp_listener *tl_l;
    tp_aio tl_aio;
    bool tl_lane;
    unsigned tl_lane_idx;
    bool tl_busy; // accept aio in flight
    tp_task tl_task;
} pl_tl;

struct tp_pipe_listener {
    tp_context *pl_ctx;
    tp_list_node pl_node;
    pl_tl pl_tls[TP_WIRE_MAX_BACKENDS];
    size_t pl_ntls;
    pl_tl pl_lanes[TP_CTX_MAX_LANES];
    size_t pl_nlanes;
    char pl_addrs[TP_WIRE_MAX_BACKENDS][TP_WIRE_MAX_ADDR + 1];
    char pl_names[TP_WIRE_MAX_BACKENDS][TP_WIRE_MAX_NAME + 1];
    tp_list pl_ready;   // pipes ready to be accepted (p_accept_node)
    tp_list pl_accepts; // waiting accept aios (a_node)
    bool pl_closed;
    int pl_busy; // accept aios + handshakes in flight referencing pl
    bool pl_destroy_req;
    bool pl_free_queued; // pl_destroy_task deferred
    tp_task pl_destroy_task;
};

// An accepted connection whose first frame is being read.
typedef struct pending_conn {
    tp_context *pc_ctx;
    tp_pipe_listener *pc_pl;
    tp_conn *pc_conn;
    bool pc_lane;
    unsigned pc_lane_idx;
    tp_list_node pc_node;
    tp_aio pc_aio;
    uint8_t pc_hdr[TP_FRAME_HDR_LEN];
    uint8_t *pc_body;
    uint64_t pc_body_len;
    int pc_step; // 0: header, 1: body
    tp_task pc_task;
} pending_conn;

// Handshake state of the connecting side (and, on the accepting side of an
// upgrade, h_conn0 until the main join arrives).
typedef struct hs_extra {
    struct tp_pipe_hs *he_hs;
    unsigned he_idx;
    tp_aio he_aio;
    tp_conn *he_conn;
    uint8_t he_frame[TP_FRAME_HDR_LEN + TP_JOIN_LEN];
    int he_step; // 0 connect, 1 join written
    tp_task he_task;
} hs_extra;

struct tp_pipe_hs {
    tp_pipe *h_pipe;
    tp_transport *h_tr0; // the transport of the URL
    tp_conn *h_conn0;    // the first connection (brochure, answer)
    tp_aio h_aio;
    int h_step;
    uint8_t *h_buf;
    uint64_t h_len;
    uint8_t h_hdr[TP_FRAME_HDR_LEN];
    tp__answer h_ans;
    tp_conn *h_main; // upgraded main connection
    uint8_t h_join[TP_FRAME_HDR_LEN + TP_JOIN_LEN];
    hs_extra *h_extras;
    unsigned h_nextra_done;
};

// Host staging of one CUDA tensor (pipe_cuda.c).
typedef struct tp__cuda_stage {
    void *cs_host;  // NULL: the tensor is not staged
    size_t cs_size; // cs_host's size (pinned: its cache class)
    bool cs_pinned; // cudaMallocHost'd (else tp__alloc'd)
    bool cs_copy;   // read: copy to the device once the bytes are in
} tp__cuda_stage;

// A write in flight.
typedef struct pipe_wop {
    tp_list_node w_node;
    struct tp_pipe *w_pipe;
    tp_aio *w_user;
    const tp_message *w_msg;
    uint64_t w_seq;
    uint8_t *w_hdr; // frame header + descriptor (+ small payloads)
    uint64_t w_hdr_len;
    tp_iov *w_iovs; // the whole main-connection byte sequence
    unsigned w_niovs;
    unsigned w_next_iov; // next iov to submit
    tp_aio w_aio;        // main-connection write (reused per group)
    bool w_conn_busy;
    bool w_conn_done;
    tp_chan_op *w_ops; // one per channel tensor
    unsigned w_nops;
    unsigned w_ops_pending;
    tp__chan_info *w_infos;
    bool *w_via;             // per tensor: on the device channel (or NULL)
    tp__cuda_stage *w_stage; // per tensor (NULL: no CUDA tensor)
    bool w_started;          // bytes may have moved
    bool w_done;
    tp_error *w_err;
    tp_task w_free_task;
    // Messages with CUDA tensors synchronise and stage on the context's
    // pool, not the loop (pipe_write.c, wop_prep): w_prepping until the
    // loop has the result (w_stage, w_prep_err).
    bool w_prepping;
    bool w_prepped;
    tp_status w_cancel; // canceled or timed out while prepping
    tp_error *w_prep_err;
    tp_task w_prep_task;
} pipe_wop;

// A read (step 2) in flight.
typedef struct pipe_rop {
    tp_list_node r_node;
    struct tp_pipe *r_pipe;
    tp_aio *r_user;
    tp_message *r_msg;
    uint64_t r_seq;
    tp__chan_info *r_infos;
    bool *r_via;    // per tensor: on the device channel (NULL: none is)
    tp_iov *r_iovs; // inline bytes: payloads + basic tensors
    unsigned r_niovs;
    unsigned r_next_iov;
    tp_aio r_aio;
    bool r_conn_busy;
    bool r_conn_done;
    tp_chan_op *r_ops;
    tp__cuda_stage *r_stage; // per tensor (NULL: no CUDA destination)
    tp_error *r_stage_err;   // a CUDA destination that cannot be used
    unsigned r_nops;
    unsigned r_ops_pending;
    bool r_done;
    tp_error *r_err;
    tp_task r_free_task;
    // The host-to-device copies run on the context's pool once the bytes
    // are in (pipe_read.c, rop_copy_job): r_copying until the loop has the
    // result (r_err).
    bool r_copying;
    tp_task r_copy_task;
} pipe_rop;

enum {
    PIPE_HS = 0,     // handshake in progress
    PIPE_READY = 1,  // moving messages
    PIPE_FAILED = 2, // failed: draining, then dead
};

// Read-side states of the main connection.
enum {
    RD_IDLE = 0,     // next: a frame header, when a descriptor is wanted
    RD_HDR = 1,      // reading a frame header
    RD_BODY = 2,     // reading a descriptor body
    RD_GOT_DESC = 3, // descriptor delivered, waiting for tp_pipe_read
    RD_INLINE = 4,   // reading the inline bytes of a message
};

struct tp_pipe {
    tp_context *p_ctx;
    tp_list_node p_ctx_node;
    tp_list_node p_accept_node;
    tp_pipe_listener *p_pl; // accepting side, until accepted
    bool p_listener_side;
    char p_peer[TP_WIRE_MAX_CTXNAME + TP_WIRE_MAX_ADDR + 8];
    char p_url[TP_WIRE_MAX_ADDR + 1];
    int p_state;
    tp_error *p_err; // why the pipe failed
    // chosen
    ctx_backend *p_tr;
    ctx_backend *p_ch;
    const tp_channel_ops *p_chops;
    uint64_t p_inline_max; // tensors up to this size go on p_conn
    tp_chan *p_chan;
    // The device channel (NULL: none): carries the tensors whose buffer is
    // on a CUDA device on the writing end; without one they are staged
    // through host memory onto p_chan (pipe_cuda.c, docs/cuda.md).
    ctx_backend *p_dch;
    const tp_channel_ops *p_dchops;
    tp_chan *p_dchan;
    tp_conn *p_conn; // main connection
    // Extra connections: [0, p_nextra_ch) p_chan's, then p_dchan's.
    tp_conn **p_extra;
    unsigned p_nextra;
    unsigned p_nextra_ch;
    unsigned p_extra_got;
    uint64_t p_reg_main; // listener side: expected join ids
    uint64_t *p_reg_extra;
    char p_report[TP_REPORT_LEN];
    char p_peer_notes[TP_WIRE_MAX_REASON + 1];
    tp_pipe_hs *p_hs; // connecting-side handshake state
    tp_timer p_hs_timer;
    // writes
    tp_list p_writes;    // pipe_wop, in order
    pipe_wop *p_wcursor; // the write whose main-conn groups are being sent
    pipe_wop *p_wnext;   // the first write not started yet (NULL: none)
    uint64_t p_wseq;
    // reads
    tp_list p_rdesc; // tp_aio waiting for a descriptor (a_node)
    tp_list p_reads; // pipe_rop, in order
    int p_rstate;
    uint8_t p_rhdr[TP_FRAME_HDR_LEN];
    uint8_t *p_rbody;
    uint64_t p_rbody_len;
    tp_aio p_raio;
    bool p_raio_busy;
    tp_aio *p_rdesc_active;   // the descriptor read being served
    tp_status p_rdesc_reason; // why it was canceled (0: not)
    tp_message *p_rmsg;       // delivered, waiting for tp_pipe_read
    tp__chan_info *p_rinfos;
    bool *p_rvia; // per tensor of p_rmsg: on the device channel (or NULL)
    uint64_t p_rseq;
    pipe_rop *p_rcursor; // the read whose inline bytes are being read
    // lifetime
    int p_busy;                  // internal ops in flight (loop thread)
    _Atomic int p_holds;         // user hold + live hold + posted tasks
    _Atomic int p_urefs;         // user references
    _Atomic bool p_ctx_dead;     // the context is gone: no posting
    tp_task p_close_task;        // frees the drained pipe
    tp_task p_uclose_task;       // tp_pipe_close
    _Atomic bool p_close_posted; // p_uclose_task is queued or ran
    tp_mtx p_mtx;                // p_ready_cv waiters
    tp_cv p_cv;
    _Atomic int p_pub_state; // p_state published for tp_pipe_wait_ready
};

// ---- context.c ----
// Loop thread: a new pipe object (holds: user + live), registered.
tp_pipe *tp__pipe_new(tp_context *ctx);
void tp__ctx_obj_add(tp_context *ctx);
void tp__ctx_obj_done(tp_context *ctx);
// Appends to the NUL-terminated @buf of @cap bytes (truncating).
void tp__report_add(char *buf, size_t cap, const char *fmt, ...)
    TP_PRINTF(3, 4);
ctx_backend *tp__ctx_transport(tp_context *ctx, const char *name);

// ---- context_listen.c ----
// Loop thread: a pipe accepted by @pl finished its handshake.
void tp__listener_pipe_ready(tp_pipe_listener *pl, tp_pipe *p);
void tp__listener_pipe_gone(tp_pipe_listener *pl, tp_pipe *p);
// The address of lane @i of @l.
const char *tp__listener_lane_addr(const tp_pipe_listener *l, unsigned i);
// Loop thread: closes @pl's transport listeners and fails what waits on
// it (accepts, unaccepted pipes, handshakes, first frames).
void tp__pipe_listener_close(tp_pipe_listener *pl);
// Loop thread: frees @pl once it is closed and nothing is in flight.
void tp__pipe_listener_maybe_free(tp_pipe_listener *pl);

// ---- pipe.c ----
// Loop thread: fail @p with @err (takes it).
void tp__pipe_fail(tp_pipe *p, tp_error *err);
void tp__pipe_release_hold(tp_pipe *p);
// A new error "pipe to PEER: @what" (status @st, caused by @cause).
tp_error *tp__pipe_err(tp_pipe *p, tp_status st, const tp_error *cause,
                       const char *what);
// An internal operation of @p ended (p_busy); a failed pipe may drain.
void tp__pipe_busy_done(tp_pipe *p);
// A failed pipe with nothing in flight leaves the context.
void tp__pipe_check_drained(tp_pipe *p);
// (Re)arms the handshake deadline of @p, @ms from now.
void tp__pipe_arm_hs_timer(tp_pipe *p, int64_t ms);
// The handshake is done: start the channel, move messages.
void tp__pipe_ready(tp_pipe *p);

// ---- pipe_hs_accept.c ----
// Loop thread: the accepting side got a brochure on @conn (takes it).
void tp__pipe_accept_brochure(tp_context *ctx, tp_pipe_listener *pl,
                              tp_conn *conn, const uint8_t *body, uint64_t len);
// Loop thread: a join frame arrived; true if a pipe took @conn.
bool tp__pipe_join(tp_context *ctx, uint64_t reg_id, uint16_t index,
                   tp_conn *conn, bool lane, unsigned lane_idx);

// ---- pipe_write.c ----
// Starts the queued writes that may start now.
void tp__pipe_write_pump(tp_pipe *p);
// Completes finished writes in order (all of them, once the pipe failed
// and they are idle).
void tp__pipe_flush_writes(tp_pipe *p);

// ---- pipe_cuda.c (the cuda_basic path) ----
// @b (tensor or payload @i, "tensor"/"payload") is on a device this
// process can use: cpu (index 0) or an existing CUDA device. Errors:
// TP_EINVAL, TP_ENOTSUP (CUDA not usable here, with the reason).
tp_status tp__pipe_cuda_check(const tp_msg_buf *b, const char *what, uint32_t i,
                              tp_error **err_p);
// Write: synchronises each source device of @m's CUDA tensors, then
// copies each, except those the device channel carries (@via[i]; @via
// NULL: none), to new host memory (pinned if it can); *@stage_p NULL if
// there is none. Errors: the runtime's.
tp_status tp__pipe_cuda_stage_out(tp__pinned_cache *cache, const tp_message *m,
                                  const bool *via, tp__cuda_stage **stage_p,
                                  tp_error **err_p);
// Read: host buffers for each tensor of @m whose destination is not the
// CPU (allocating device buffers left NULL, pipe_owned), except those the
// device channel writes itself (@via[i]; @via NULL: none). A destination
// that cannot be used sets *@stage_err_p (the read fails once the bytes
// are in) and gets a host buffer the bytes are dropped into. Errors:
// TP_ENOMEM.
tp_status tp__pipe_cuda_stage_in(tp__pinned_cache *cache, tp_message *m,
                                 const bool *via, tp__cuda_stage **stage_p,
                                 tp_error **stage_err_p, tp_error **err_p);
// Read, once every byte is in: host-to-device copies.
tp_status tp__pipe_cuda_copy_in(tp_message *m, const tp__cuda_stage *stage,
                                tp_error **err_p);
void tp__pipe_cuda_free_stage(tp__cuda_stage *stage, uint32_t n);
void tp__pinned_cache_init(tp__pinned_cache *c, uint64_t cap);
// Frees every buffer kept (cudaFreeHost). Not on the loop thread.
void tp__pinned_cache_fini(tp__pinned_cache *c);
// Loop thread: frees @stage (of @m's tensors) on @ctx's copy pool when it
// holds page-locked memory (cudaFreeHost waits for the device) above
// TP_PIPE_CUDA_LOOP_MAX bytes, else (or when the pool is closed) at once.
void tp__pipe_cuda_release_stage(tp_context *ctx, const tp_message *m,
                                 tp__cuda_stage *stage);

// ---- pipe_read.c ----
// Starts reading the next descriptor if one is wanted.
void tp__pipe_read_pump(tp_pipe *p);
// Completes finished reads in order (see tp__pipe_flush_writes).
void tp__pipe_flush_reads(tp_pipe *p);
// Completion of p_raio (frame header and descriptor body reads).
void tp__pipe_raio_cb(void *arg);

#endif
