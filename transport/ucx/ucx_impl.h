/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_impl.h (internal) - the UCX transport's state, shared by its files:
 *
 *   ucx.c     the UCP context and worker (one per transport), progress
 *             from the loop (the worker's event fd + a loop poller),
 *             viability, the domain and the ops table
 *   conn.c    a connection's reads (received data taken from UCP with
 *             ucp_stream_recv_data_nb and copied into the caller's iovs),
 *             writes (ucp_stream_send_nbx from the caller's iovs), failure
 *             with one first error, close
 *   setup.c   listening (ucp_listener on a sockaddr), connect (ucp_ep on a
 *             sockaddr), the 16-byte hello and the job-secret exchange over
 *             the stream, accept queues
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

#define UCX_HELLO_VERSION   1u
#define UCX_HELLO_MAGIC_LEN 8u
#define UCX_MAX_PENDING     128 // per listener: handshaking + ready
#define UCX_PFX_LEN         640
#define UCX_CLOSE_WAIT_MS   2000 // ctx_fini waits this long for ep closes

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
    tp_list x_conns;    // every live ucx_conn (xc_node)
    tp_list x_lsns;     // every open ucx_listener (xl_node)
    unsigned x_closing; // ep close requests in flight
} ucx_ctx;

typedef struct ucx_listener ucx_listener;

// One send handed to UCP: a write aio's, or set-up bytes of our own.
typedef struct ucx_op {
    tp_aio *o_aio;           // NULL: set-up bytes
    struct ucx_conn *o_conn; // NULL once the conn let go of it (orphan)
    bool o_done;             // UCP has finished with the buffer
    ucs_status_t o_status;
    tp_error *o_err; // an orphan's aio fails with this
    ucp_dt_iov_t o_iov[TP_AIO_MAX_IOV];
    uint8_t o_bytes[TP_AUTH_NONCE_LEN + TP_AUTH_MAC_LEN + TP_HELLO_LEN];
} ucx_op;

typedef struct ucx_conn {
    tp_conn xc_base; // the generic part; must be first
    ucx_ctx *xc_ctx;
    ucp_ep_h xc_ep;
    int xc_state;
    tp_list_node xc_node; // on x_conns
    tp_list xc_readq;     // tp_aio, in order
    tp_list xc_writeq;    // tp_aio, in order (a_prov_data[0]: its ucx_op)
    tp_error *xc_err;     // the first fatal error
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
    uint8_t xc_hello_out[TP_HELLO_LEN];
    uint8_t xc_hello_in[TP_HELLO_LEN];
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
// Copies up to @n received bytes to @dst; returns the count, or -1 after
// the endpoint failed (the status in *st_p).
int64_t tp__ucx_consume(ucx_conn *c, uint8_t *dst, uint64_t n,
                        ucs_status_t *st_p);
// Sends @n bytes (copied) ahead of any later send.
ucs_status_t tp__ucx_send_bytes(ucx_conn *c, const uint8_t *p, size_t n);
void tp__ucx_conn_release(ucx_conn *c, bool force);
void tp__ucx_conn_fail(ucx_conn *c, tp_error *err);
void tp__ucx_read_pump(ucx_conn *c);
void tp__ucx_conn_dispatch(ucx_conn *c);
void tp__ucx_conn_read(tp_conn *bc, tp_aio *aio);
void tp__ucx_conn_write(tp_conn *bc, tp_aio *aio);
void tp__ucx_conn_close(tp_conn *bc);
void tp__ucx_conn_fini(tp_conn *bc);

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
