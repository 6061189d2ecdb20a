/* SPDX-License-Identifier: Apache-2.0 */
/* ibv_impl.h (internal) - the InfiniBand verbs transport's state, shared by
 * its files:
 *
 *   proto.c     ring and credit bookkeeping (no verbs calls; proto.h)
 *   mr_cache.c  memory registrations cached by range
 *   conn.c      the data path: reads copied out of our inbox ring, writes
 *               copied into the outbox and written into the peer's inbox
 *               with RDMA_WRITE_WITH_IMM, acks, the completion channel on
 *               the loop, failure with one first error, close
 *   setup.c     the bootstrap over a tcp connection (the tcp transport's
 *               own hello and job-secret exchange, then our setup record:
 *               QP address, ring address and rkey), connect, listen, accept
 *   ibv.c       viability, the device, the domain, the ops table
 *   tunables.c  the tunables table (TP_IBV_*), the device name's parser
 *   verbs_real.c / verbs.h  the verbs calls behind a table of pointers
 *
 * Everything runs on the loop thread (transport.c guarantees it; listen
 * is synchronous and only creates the tcp listener): no locks.
 * docs/transport-ibv.md has the design. */
#ifndef TP_TRANSPORT_IBV_IMPL_H
#define TP_TRANSPORT_IBV_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "core/list.h"
#include "core/loop.h"
#include "transport/ibv/proto.h"
#include "transport/ibv/verbs.h"
#include "transport/transport.h"

// Constants of the protocol (docs/transport-ibv.md); the ring size and the
// pool's bound are tunables (TP_IBV_RING_SIZE, TP_IBV_POOL_MAX: x_ring_size,
// x_pool_max).
#define IBV_MAX_SEGS    64u                 // unacked writes per direction
#define IBV_SEG_MAX     (256u << 10)        // bytes per RDMA write
#define IBV_QUEUE_DEPTH (2u * IBV_MAX_SEGS) // send and receive queues
#define IBV_MAX_PENDING 128                 // per listener: handshaking + ready
#define IBV_PFX_LEN     640

// The setup record each side sends over the bootstrap connection once the
// tcp hellos (and job secret) are through: magic, version, max segments,
// ring size, ring address, rkey, reserved, QP address. Little-endian.
#define IBV_SETUP_MAGIC   "TPIBV\0\x01\x00" // 8 bytes
#define IBV_SETUP_VERSION 1u
#define IBV_SETUP_LEN     (8u + 4 + 4 + 8 + 8 + 4 + 4 + TP_IBV_QP_ADDR_LEN)
#define IBV_SETUP_READY   'R' // after the QP is ready to receive
_Static_assert(sizeof(IBV_SETUP_MAGIC) - 1 == 8, "setup magic is 8 bytes");
_Static_assert(IBV_SETUP_LEN == 88, "setup record layout");

enum ibv_state {
    IBV_TCP,   // the bootstrap tcp connection is being made
    IBV_XCHG,  // setup records in flight
    IBV_READY, // QP connected, ready bytes in flight
    IBV_OPEN,  // usable
    IBV_DEAD,  // failed or closed
};

// A registered ring pair (inbox + outbox) of a closed conn, kept for the
// next one: registering pins pages and costs milliseconds.
typedef struct ibv_ring {
    uint8_t *r_buf;
    const tp_ibv_mr *r_mr;
} ibv_ring;

typedef struct ibv_ctx {
    tp_transport *x_t;
    const tp_ibv_verbs *x_v;
    tp_ibv_dev *x_dev;
    tp_transport *x_tcp; // the bootstrap transport, on the same loop
    tp_ibv_mr_cache x_mrc;
    tp_list x_dead_accepts; // accept states of closed listeners (setup.c)
    uint64_t x_ring_size;   // TP_IBV_RING_SIZE: each conn's inbox (and outbox)
    unsigned x_pool_max;    // TP_IBV_POOL_MAX
    ibv_ring x_pool[TP_IBV_POOL_CAP];
    unsigned x_npool;
} ibv_ctx;

typedef struct ibv_listener ibv_listener;

// wr_id of an ack's write (data writes carry the stream position they end
// at, always below it).
#define IBV_WR_ACK UINT64_MAX

// The bootstrap side of a conn: the tcp conn, kept open once set up (its
// EOF is how a peer that closed or died shows), our aios on it and their
// buffers. Heap, apart from the conn, so that an aio still in flight when
// the conn is freed has somewhere to complete: the conn and each aio in
// flight count a reference; the last one frees it from a loop task. It
// holds the transport until then.
typedef struct ibv_boot {
    struct ibv_conn *b_conn; // NULL once the conn let go of it
    tp_transport *b_t;
    tp_conn *b_tcp;
    unsigned b_refs;
    tp_task b_free_task;
    tp_aio b_connect;
    tp_aio b_out;
    tp_aio b_in;
    uint8_t b_rec_out[IBV_SETUP_LEN];
    uint8_t b_rec_in[IBV_SETUP_LEN];
    uint8_t b_ready_out;
    uint8_t b_ready_in;
    uint8_t b_watch; // the byte the watch read would take
} ibv_boot;

typedef struct ibv_conn {
    tp_conn ic_base; // the generic part; must be first
    ibv_ctx *ic_x;
    int ic_state;
    ibv_boot *ic_boot;
    bool ic_sent_rec, ic_got_rec, ic_sent_ready, ic_got_ready;
    // Verbs.
    uint8_t *ic_buf; // inbox [0, x_ring_size), outbox after it
    size_t ic_buf_len;
    const tp_ibv_mr *ic_mr;
    tp_ibv_cq *ic_cq;
    int ic_cq_fd;
    tp_loop_fd ic_lfd;
    bool ic_lfd_on;
    tp_ibv_qp *ic_qp;
    uint64_t ic_peer_addr; // the peer's inbox
    uint32_t ic_peer_rkey;
    bool ic_recvs_posted;
    tp_ibv_proto ic_p;
    unsigned ic_sends;   // send work requests posted, not completed
    uint64_t ic_tx_done; // stream bytes whose writes completed
    // Data path.
    tp_list ic_readq;  // tp_aio, in order
    tp_list ic_writeq; // tp_aio, in order, bytes not all posted
    tp_list ic_sentq;  // tp_aio, all posted, waiting for completions
    tp_error *ic_err;  // the first fatal error
    bool ic_drain;     // dead by the peer: reads may still take the inbox
    // Set-up.
    ibv_listener *ic_lsn;  // listener side, until handed to an accept
    tp_list_node ic_lnode; // on il_hsq or il_readyq
    tp_aio *ic_connect_aio;
} ibv_conn;

// An accept in flight on the bootstrap listener. Heap, so that it can
// outlive the listener: the listener's close lets go of it (as_l = NULL)
// and ctx_fini frees it; while in flight it holds the transport.
typedef struct ibv_accept_state {
    tp_aio as_aio;
    ibv_listener *as_l;
    tp_transport *as_t;
    tp_list_node as_node; // on x_dead_accepts once let go of
} ibv_accept_state;

struct ibv_listener {
    tp_listener il_base; // the generic part; must be first
    ibv_ctx *il_x;
    tp_listener *il_tcp;         // the bootstrap listener
    ibv_accept_state *il_accept; // the bootstrap accept (setup.c)
    tp_task il_start_task;
    bool il_accepting; // il_accept in flight
    bool il_closed;
    tp_list il_acceptq; // tp_aio waiting for a connection
    tp_list il_hsq;     // ibv_conn setting up
    tp_list il_readyq;  // ibv_conn set up, waiting for an accept
    size_t il_npending;
};

static inline ibv_ctx *
ibv_ctx_of(tp_transport *t)
{
    return tp_transport_ctx(t);
}

static inline ibv_conn *
ibv_conn_of(tp_conn *c)
{
    return TP_CONTAINER_OF(c, ibv_conn, ic_base);
}

static inline ibv_listener *
ibv_listener_of(tp_listener *l)
{
    return TP_CONTAINER_OF(l, ibv_listener, il_base);
}

// conn.c
ibv_conn *tp__ibv_conn_new(tp_transport *t);
// ctx_fini: deregisters and frees the pooled rings.
void tp__ibv_pool_drain(ibv_ctx *x);
// Buffers, registration, CQ, QP and receives for a new conn.
tp_status tp__ibv_conn_verbs_init(ibv_conn *c, tp_error **err_p);
// The conn is set up: watch the completion channel and the bootstrap.
tp_status tp__ibv_conn_start(ibv_conn *c, tp_error **err_p);
// Releases the verbs resources and closes the bootstrap conn.
void tp__ibv_conn_release(ibv_conn *c);
void tp__ibv_conn_fail(ibv_conn *c, tp_error *err, bool drain);
// The peer went away (bootstrap EOF, @err taken): completions already
// queued are taken first, so what landed before stays readable.
void tp__ibv_drain_then_fail(ibv_conn *c, tp_error *err);
void tp__ibv_conn_read(tp_conn *bc, tp_aio *aio);
void tp__ibv_conn_write(tp_conn *bc, tp_aio *aio);
void tp__ibv_conn_close(tp_conn *bc);
void tp__ibv_conn_fini(tp_conn *bc);

// setup.c
// The conn lets go of its bootstrap (conn_fini).
void tp__ibv_boot_detach(ibv_conn *c);
tp_status tp__ibv_listen(tp_transport *t, tp_listener *bl, const char *addr,
                         tp_error **err_p);
void tp__ibv_accept(tp_listener *bl, tp_aio *aio);
void tp__ibv_listener_close(tp_listener *bl);
void tp__ibv_connect(tp_transport *t, const char *addr, tp_aio *aio);
// The bootstrap watch read finished (peer gone, or bytes it must not send).
void tp__ibv_watch_done(ibv_conn *c);
// ctx_fini: frees the accept states closed listeners let go of.
void tp__ibv_accepts_free(ibv_ctx *x);

// ibv.c
// Holds @t until a task posted now has run: posted right after dropping a
// bootstrap conn or listener, whose free task is then already queued, it
// keeps ctx_fini (which frees the bootstrap transport) behind that free.
void tp__ibv_release_later(tp_transport *t);

#endif
