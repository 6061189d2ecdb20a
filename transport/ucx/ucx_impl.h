/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_impl.h (internal) - the UCX transport's state, shared by its files:
 *
 *   ucx.c     the UCP context and worker (one per transport), progress
 *             from the loop (the worker's event fd + a loop poller),
 *             viability, the domain and the ops table
 *   conn.c    a connection's writes (ucp_stream_send_nbx from the
 *             caller's iovs), cancel, failure with one first error, close
 *   recv.c    reads: received data taken from UCP with
 *             ucp_stream_recv_data_nb and copied into the caller's iovs;
 *             large reads with no deadline posted to UCP instead
 *             (ucp_stream_recv_nbx into the caller's iovs, one copy)
 *   flow.c    flow control: writes hold past the peer's window, credits
 *             (active messages carrying the reader's consumed-bytes
 *             count) release them
 *   setup.c   listening (ucp_listener on a sockaddr), connect (ucp_ep on a
 *             sockaddr), the 24-byte hello (with the window) and the
 *             job-secret exchange over the stream, accept queues
 *
 * Everything runs on the loop thread (transport.c guarantees it; listen
 * hops there with tp__loop_call), so the worker is single-threaded and
 * there are no locks. UCX callbacks run inside ucp_worker_progress on the
 * loop thread; they only record what happened, and ucx_dispatch acts on it
 * after progress returns (never calling UCP from inside a callback).
 * docs/transport-ucx.md has the rules. */
#ifndef TP_TRANSPORT_UCX_IMPL_H
#define TP_TRANSPORT_UCX_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include <ucp/api/ucp.h>

#include "core/auth.h"
#include "core/list.h"
#include "core/loop.h"
#include "transport/transport.h"

// 2: the hello carries the sender's window; credits (flow.c) follow.
#define UCX_HELLO_VERSION   2u
#define UCX_HELLO_MAGIC_LEN 8u
// The tpipe hello (magic, version, flags) + u64le window.
#define UCX_HELLO_LEN (TP_HELLO_LEN + 8u)
// The active message id of credits and their length (u64le consumed).
#define UCX_AM_CREDIT     0x7470u
#define UCX_CREDIT_LEN    8u
#define UCX_WINDOW_MIN    (64 * 1024)
#define UCX_WINDOW_MAX    (1024 * 1024 * 1024)
#define UCX_MAX_PENDING   128 // per listener: handshaking + ready
#define UCX_PFX_LEN       640
#define UCX_CLOSE_WAIT_MS 2000 // ctx_fini waits this long for ep closes
// A posted read (recv.c) keeps at most this many receives with UCP, each
// of at most a quarter of the conn's window (so all of them cover what
// the peer may send ahead, and each completed one earns the peer a
// credit).
#define UCX_RD_POSTS 4

_Static_assert(sizeof(TP_HELLO_MAGIC) - 1 == UCX_HELLO_MAGIC_LEN,
               "hello magic is 8 bytes");
_Static_assert(TP_HELLO_LEN == UCX_HELLO_MAGIC_LEN + 4 + 4,
               "hello = magic + u32le version + u32le flags");

enum ucx_state {
    UCX_SETUP, // ep created, exchanging hellos (and the job secret)
    UCX_OPEN,  // usable
    UCX_DEAD,  // failed or closed; ep released
};

typedef struct ucx_ctx {
    tp_transport *x_t;
    ucp_context_h x_ucp;
    ucp_worker_h x_worker;
    int x_efd;
    bool x_started; // efd and poller on the loop (loop thread)
    bool x_in_progress;
    tp_loop_fd x_lfd;
    tp_loop_poller x_poller;
    tp_list x_conns;     // every live ucx_conn (xc_node)
    tp_list x_lsns;      // every open ucx_listener (xl_node)
    unsigned x_closing;  // ep close requests in flight
    uint64_t x_window;   // TP_UCX_WINDOW: what each conn lets its peer send
    uint64_t x_post_min; // TP_UCX_RECV_POST: reads posted from this size
} ucx_ctx;

typedef struct ucx_listener ucx_listener;
typedef struct ucx_op ucx_op;

// One UCP send request: a part of an op's bytes (a write larger than the
// window goes out in several). Its iov array lives until UCP is done.
typedef struct ucx_send {
    ucx_op *s_op;
    bool s_embedded; // the op's own s_first (not allocated)
    ucp_dt_iov_t s_iov[TP_AIO_MAX_IOV];
} ucx_send;

// A write aio's bytes, or bytes of our own (hello, job-secret proof,
// credit), handed to UCP in one or more sends.
struct ucx_op {
    tp_aio *o_aio;           // NULL: bytes of our own
    struct ucx_conn *o_conn; // NULL once the conn let go of it (orphan)
    uint64_t o_len;          // bytes in o_iov
    uint64_t o_submitted;    // handed to UCP so far
    unsigned o_inflight;     // sends UCP still holds
    ucs_status_t o_status;   // the first failed send's
    tp_error *o_err;         // an orphan's aio fails with this
    unsigned o_niov;
    tp_iov o_iov[TP_AIO_MAX_IOV]; // the non-empty iovs
    bool o_first_busy;            // s_first is with UCP
    ucx_send o_first;
    uint8_t o_bytes[TP_AUTH_NONCE_LEN + TP_AUTH_MAC_LEN + UCX_HELLO_LEN];
};

// Whether UCP is done with every byte of @o it will get: all submitted
// (or a send failed, so no more will be) and none in flight.
static inline bool
ucx_op_done(const ucx_op *o)
{
    return o->o_inflight == 0 &&
           (o->o_submitted == o->o_len || o->o_status != UCS_OK);
}

typedef struct ucx_rd ucx_rd;

// One receive posted to UCP (ucp_stream_recv_nbx, WAITALL): UCP writes
// into the read's buffer until it completes. Its iov array lives as long.
typedef struct ucx_rpost {
    ucx_rd *rp_rd;
    uint64_t rp_len;        // bytes posted
    size_t rp_got;          // bytes UCP put there (when done)
    ucs_status_t rp_status; // UCP's completion status (when done)
    bool rp_done;           // UCP completed it
    ucp_dt_iov_t rp_iov[TP_AIO_MAX_IOV];
} ucx_rpost;

// A read whose bytes are received by UCP straight into the caller's iovs
// (recv.c): its posts, in stream order, in a ring. Allocated apart from
// the conn, as UCP may hold its receives after the conn let go of it.
struct ucx_rd {
    tp_aio *r_aio;
    bool r_orphan;       // the conn let go of it: finished when UCP is done
    tp_error *r_err;     // an orphan's read fails with this
    uint64_t r_posted;   // read offset up to which receives were posted
    unsigned r_head;     // r_post[r_head] is the oldest post
    unsigned r_npost;    // posts in the ring (done or not)
    unsigned r_inflight; // posts UCP still holds
    ucx_rpost r_post[UCX_RD_POSTS];
};

typedef struct ucx_conn {
    tp_conn xc_base; // the generic part; must be first
    ucx_ctx *xc_ctx;
    ucp_ep_h xc_ep;
    int xc_state;
    tp_list_node xc_node; // on x_conns
    tp_list xc_readq;     // tp_aio, in order
    tp_list xc_writeq;    // tp_aio, in order (a_prov_data[0]: its ucx_op)
    tp_error *xc_err;     // the first fatal error
    // Flow control (flow.c). Writer: user bytes handed to UCP, the peer's
    // consumed count from its latest credit, the peer's window (from its
    // hello), the first write not wholly handed to UCP.
    uint64_t xc_tx_sent;
    uint64_t xc_tx_acked;
    uint64_t xc_tx_window;
    tp_aio *xc_tx_next;
    // Reader: user bytes our reads took, the count last credited to the
    // peer, our window (sent in our hello).
    uint64_t xc_rx_consumed;
    uint64_t xc_rx_credited;
    uint64_t xc_rx_window;
    // A credit the peer had no right to send, recorded by the active
    // message handler (inside progress) for tp__ucx_credit_check: its
    // header length and value.
    bool xc_credit_bad;
    bool xc_credit_bad_shape; // not one eager UCX_CREDIT_LEN header
    size_t xc_credit_bad_len;
    uint64_t xc_credit_bad_val;
    // The endpoint error handler ran with this status (UCS_OK: not yet).
    ucs_status_t xc_ep_status;
    // Received data held from ucp_stream_recv_data_nb, partly consumed.
    uint8_t *xc_rx;
    size_t xc_rx_len;
    size_t xc_rx_off;
    // Data taken from UCP when the endpoint failed (before UCP could drop
    // it), for the reads that follow: xc_held[0..xc_nheld).
    struct ucx_held {
        uint8_t *h_data;
        size_t h_len;
    } * xc_held;
    size_t xc_nheld;
    size_t xc_held_next;
    // Set-up.
    uint8_t xc_hello_out[UCX_HELLO_LEN];
    uint8_t xc_hello_in[UCX_HELLO_LEN];
    bool xc_hello_sent;
    unsigned xc_hello_rcvd;
    int xc_auth_state; // 0: hellos, 1: job-secret exchange, 2: done
    tp__auth xc_auth;
    tp_timer xc_timer;     // connect or handshake deadline
    int64_t xc_timer_ms;   // its length, for messages
    ucx_listener *xc_lsn;  // listener side, until handed to an accept
    tp_list_node xc_lnode; // on xl_hsq or xl_readyq
    tp_aio *xc_connect_aio;
    ucp_conn_request_h xc_conn_req; // listener side, until its ep exists
} ucx_conn;

struct ucx_listener {
    tp_listener xl_base; // the generic part; must be first
    ucx_ctx *xl_ctx;
    ucp_listener_h xl_ucp;
    tp_list_node xl_node; // on x_lsns
    tp_list xl_acceptq;   // tp_aio waiting for a connection
    tp_list xl_hsq;       // ucx_conn exchanging hellos
    tp_list xl_readyq;    // ucx_conn handshaked, waiting for an accept
    size_t xl_npending;
    int64_t xl_hs_timeout_ms;
    bool xl_closed;
    // listen's result on the loop thread (tp__loop_call)
    const char *xl_req_addr;
    tp_status xl_st;
    tp_error *xl_err;
    char xl_why[512];
};

// ucx's own tunables (TP_TUNABLES_OWN), inside every tp_config.
typedef struct ucx_tunables {
    int64_t ut_window;   // TP_UCX_WINDOW bytes
    int64_t ut_post_min; // TP_UCX_RECV_POST bytes (0: never post)
} ucx_tunables;

extern const tp_tunables tp__ucx_tunables;

static inline ucx_ctx *
ucx_ctx_of(tp_transport *t)
{
    return tp_transport_ctx(t);
}

static inline ucx_conn *
ucx_conn_of(tp_conn *c)
{
    return TP_CONTAINER_OF(c, ucx_conn, xc_base);
}

static inline ucx_listener *
ucx_listener_of(tp_listener *l)
{
    return TP_CONTAINER_OF(l, ucx_listener, xl_base);
}

// ucx.c
// Loop thread: registers the worker's event fd and the poller (once).
tp_status tp__ucx_ctx_start(ucx_ctx *x, tp_error **err_p);
// Loop thread: progresses the worker until idle, then acts on what the
// callbacks recorded (ucx_dispatch). Reentrant calls do nothing.
void tp__ucx_progress(ucx_ctx *x);
// Closes @ep (force when @force); the request is counted in x_closing.
void tp__ucx_ep_close(ucx_ctx *x, ucp_ep_h ep, bool force);
// "ucx: <status text>"-style text of a UCS status.
const char *tp__ucx_status_str(ucs_status_t st);
tp_status tp__ucx_status_tp(ucs_status_t st);

// conn.c
ucx_conn *tp__ucx_conn_new(tp_transport *t);
void tp__ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status);
// Sends @n bytes (copied) ahead of any later send: on the stream, or as
// the header of an active message with id @am_id when nonzero.
ucs_status_t tp__ucx_send_bytes(ucx_conn *c, const uint8_t *p, size_t n,
                                unsigned am_id);
// Hands bytes [o_submitted, o_submitted + @n) of @o to UCP: one stream
// send (an active message with @am_id when nonzero, the bytes as its
// header). Failures are recorded in o_status.
void tp__ucx_op_submit(ucx_conn *c, ucx_op *o, uint64_t n, unsigned am_id);
void tp__ucx_op_free(ucx_op *o);
void tp__ucx_writes_settle(ucx_conn *c);
void tp__ucx_conn_release(ucx_conn *c, bool force);
void tp__ucx_conn_fail(ucx_conn *c, tp_error *err);
void tp__ucx_conn_dispatch(ucx_conn *c);
void tp__ucx_conn_read(tp_conn *bc, tp_aio *aio);
void tp__ucx_conn_write(tp_conn *bc, tp_aio *aio);
void tp__ucx_conn_close(tp_conn *bc);
void tp__ucx_conn_fini(tp_conn *bc);

// recv.c
// Copies up to @n received bytes to @dst; returns the count, or -1 after
// the endpoint failed (the status in *st_p).
// The non-empty parts of @iov that hold bytes [@off, @off + @n) into @out
// (at most TP_AIO_MAX_IOV); returns how many.
unsigned tp__ucx_iov_slice(const tp_iov *iov, uint64_t off, uint64_t n,
                           ucp_dt_iov_t *out);
int64_t tp__ucx_consume(ucx_conn *c, uint8_t *dst, uint64_t n,
                        ucs_status_t *st_p);
// Releases the received data the conn holds (before its ep goes).
void tp__ucx_rx_drop(ucx_conn *c);
// Moves received data into the queued reads, in order; completes them.
void tp__ucx_read_pump(ucx_conn *c);
// A read taken off the queue because the conn failed with @err (a
// reference is taken): finished now, or, with receives UCP still holds,
// when UCP completes them (the conn may be gone by then).
void tp__ucx_read_fail(tp_aio *a, tp_error *err);
// Whether @a has receives posted (it cannot be taken back then).
bool tp__ucx_read_posted(const tp_aio *a);
// Cancels @a, whose receives are posted: fails it with @err (taken) once
// UCP lets go of its buffer, and closes the conn, as UCX cannot take a
// posted stream receive back.
void tp__ucx_read_cancel_posted(ucx_conn *c, tp_aio *a, tp_error *err);

// flow.c
// Registers the credit handler on the worker.
tp_status tp__ucx_flow_init(ucx_ctx *x, tp_error **err_p);
// Hands queued writes to UCP as far as the peer's window allows.
void tp__ucx_tx_pump(ucx_conn *c);
// Counts @n bytes taken by reads; credits the peer past the threshold.
void tp__ucx_rx_consumed(ucx_conn *c, uint64_t n);
// Sends a credit for @consumed bytes (the tests forge one with it).
ucs_status_t tp__ucx_credit_send(ucx_conn *c, uint64_t consumed);
// Fails @c if the peer sent a credit it had no right to (false then).
bool tp__ucx_credit_check(ucx_conn *c);

// setup.c
void tp__ucx_setup_pump(ucx_conn *c);
void tp__ucx_setup_fail(ucx_conn *c, tp_error *err);
void tp__ucx_setup_timer_cb(tp_timer *t, void *arg);
void tp__ucx_listener_make_eps(ucx_listener *l);
void tp__ucx_listener_service(ucx_listener *l);
tp_status tp__ucx_listen(tp_transport *t, tp_listener *bl, const char *addr,
                         tp_error **err_p);
void tp__ucx_accept(tp_listener *bl, tp_aio *aio);
void tp__ucx_listener_close(tp_listener *bl);
void tp__ucx_connect(tp_transport *t, const char *addr, tp_aio *aio);

#endif
