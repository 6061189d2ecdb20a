/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_impl.h (internal) - the TCP transport's state, shared by its files:
 *
 *   conn.c      socket options, a connection's reads, writes, failure and
 *               close (the data path)
 *   setup.c     connection set-up on both sides: the hello exchange, the
 *               socket events, connect (with name resolution)
 *   listener.c  listening, accepting, the queues of handshaking and ready
 *               connections
 *   tcp.c       viability and the backend's ops table
 *
 * Everything runs on the loop thread (transport.c guarantees it) but
 * tcp_is_viable, tcp_ctx_init and tp__tcp_listen: no locks.
 * docs/transport-tcp.md has the rules (edge-style readiness, optimistic I/O,
 * one first error). */
#ifndef TP_TRANSPORT_TCP_IMPL_H
#define TP_TRANSPORT_TCP_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "core/auth.h"
#include "core/list.h"
#include "core/loop.h"
#include "transport/transport.h"

#define TCP_MAX_IOV         64
#define TCP_IO_CAP          (UINT64_C(1) << 30) // bytes per syscall
#define TCP_HELLO_VERSION   1u
#define TCP_HELLO_MAGIC_LEN 8u
#define TCP_MAX_PENDING     128 // per listener: handshaking + waiting for accept
#define TCP_ACCEPT_RETRY_MS 100
#define TCP_STASH           4096u       // read-ahead bytes per conn
#define TCP_STASH_MAX_READ  (64u << 10) // reads up to this size read ahead
#define TCP_PFX_LEN         640 // "tcp: listener <addr>: connection from peer <peer>"

_Static_assert(sizeof(TP_HELLO_MAGIC) - 1 == TCP_HELLO_MAGIC_LEN,
               "hello magic is 8 bytes");
_Static_assert(TP_HELLO_LEN == TCP_HELLO_MAGIC_LEN + 4 + 4,
               "hello = magic + u32le version + u32le flags");

enum tcp_state {
    TCP_IDLE,       // allocated, no socket yet
    TCP_CONNECTING, // connect() in progress
    TCP_HELLO,      // exchanging hellos
    TCP_OPEN,       // usable
    TCP_DEAD,       // failed or closed; fd released
};

typedef struct tcp_listener tcp_listener;

typedef struct tcp_conn {
    tp_conn tc_base; // the generic part; must be first
    tp_loop *tc_loop;
    int tc_fd;
    int tc_state;
    bool tc_readable; // false once drained, until the next READ event
    bool tc_hup_seen; // an event said the peer shut down or errored
    bool tc_writable;
    tp_loop_fd tc_lfd;
    tp_list tc_readq;  // tp_aio, in order
    tp_list tc_writeq; // tp_aio, in order
    tp_error *tc_err;  // the first fatal error
    // Read-ahead of small reads: bytes received beyond the queued reads.
    uint32_t tc_stash_off;
    uint32_t tc_stash_len;
    uint8_t tc_stash[TCP_STASH];
    // Set-up.
    uint8_t tc_hello_out[TP_HELLO_LEN];
    uint8_t tc_hello_in[TP_HELLO_LEN];
    unsigned tc_hello_sent;
    unsigned tc_hello_rcvd;
    int tc_auth_state; // 0: hellos, 1: job-secret exchange, 2: done
    tp__auth tc_auth;
    tp_timer tc_timer;         // connect or handshake deadline
    int64_t tc_timer_ms;       // its length, for messages
    tcp_listener *tc_listener; // listener side, until handed to an accept
    tp_list_node tc_lnode;     // on tl_hsq or tl_readyq
    tp_aio *tc_connect_aio;    // connecting side, until connected
} tcp_conn;

struct tcp_listener {
    tp_listener tl_base; // the generic part; must be first
    tp_loop *tl_loop;
    int tl_fd;
    bool tl_registered; // fd added to the loop (tcp_listener_start_task)
    bool tl_acceptable; // false after accept4 said EAGAIN
    bool tl_closed;
    bool tl_in_service; // tp__tcp_listener_service is running
    bool tl_again;      // ... and should run once more
    tp_loop_fd tl_lfd;
    tp_list tl_acceptq; // tp_aio waiting for a connection
    tp_list tl_hsq;     // tcp_conn exchanging hellos
    tp_list tl_readyq;  // tcp_conn handshaked, waiting for an accept
    size_t tl_npending; // conns on tl_hsq + tl_readyq
    tp_timer tl_timer;  // accept retry after EMFILE and the like
    int64_t tl_hs_timeout_ms;
    tp_task tl_start_task; // registers the socket with the loop
    tp_error *tl_err;      // registration failed: accepts fail with this
};

static inline tcp_conn *
tcp_conn_of(tp_conn *c)
{
    return TP_CONTAINER_OF(c, tcp_conn, tc_base);
}

static inline tcp_listener *
tcp_listener_of(tp_listener *l)
{
    return TP_CONTAINER_OF(l, tcp_listener, tl_base);
}

// conn.c
void tp__tcp_set_bufs(int fd, const tp_config *cfg);
void tp__tcp_set_nodelay(int fd);
void tp__tcp_set_liveness(int fd, const tp_config *cfg);
void tp__tcp_format_local(int fd, char *buf, size_t len);
tcp_conn *tp__tcp_conn_new(tp_transport *t);
void tp__tcp_conn_release(tcp_conn *c);
void tp__tcp_read_pump(tcp_conn *c);
void tp__tcp_write_pump(tcp_conn *c);
void tp__tcp_conn_read(tp_conn *bc, tp_aio *aio);
void tp__tcp_conn_write(tp_conn *bc, tp_aio *aio);
void tp__tcp_conn_close(tp_conn *bc);
void tp__tcp_conn_fini(tp_conn *bc);

// tcp's own tunables (TP_TUNABLES_OWN), inside every tp_config: read them
// with tp__tcp_tunables_of(cfg).
typedef struct tcp_tunables {
    int64_t tt_sndbuf;          // TP_TCP_SNDBUF bytes, 0 = kernel default
    int64_t tt_rcvbuf;          // TP_TCP_RCVBUF
    int64_t tt_user_timeout_ms; // TP_TCP_USER_TIMEOUT_MS, 0 = kernel's
} tcp_tunables;

extern const tp_tunables tp__tcp_tunables;

static inline const tcp_tunables *
tp__tcp_tunables_of(const tp_config *cfg)
{
    return tp__config_own_const(cfg, &tp__tcp_tunables);
}

// setup.c
// "tcp: connect to X" or "tcp: listener tcp://Y: connection from peer X".
void tp__tcp_setup_prefix(const tcp_conn *c, char *buf, size_t len);
// Fails a connection during set-up with @err (taken).
void tp__tcp_setup_fail(tcp_conn *c, tp_error *err);
// Takes a listener-side connection off its listener's queues.
void tp__tcp_listener_detach(tcp_conn *c);
void tp__tcp_conn_fd_cb(tp_loop_fd *lfd, uint32_t events);
void tp__tcp_conn_timer_cb(tp_timer *t, void *arg);
void tp__tcp_hello_pump(tcp_conn *c);
void tp__tcp_connect(tp_transport *t, const char *addr, tp_aio *aio);

// listener.c
void tp__tcp_listener_service(tcp_listener *l);
tp_status tp__tcp_listen(tp_transport *t, tp_listener *bl, const char *addr,
                         tp_error **err_p);
void tp__tcp_accept(tp_listener *bl, tp_aio *aio);
void tp__tcp_listener_close(tp_listener *bl);

#endif
