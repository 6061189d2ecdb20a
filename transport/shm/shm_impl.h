/* SPDX-License-Identifier: Apache-2.0 */
/* shm_impl.h (internal) - the shared-memory transport's types and the
 * functions its files share: ring.c (addresses, rings), data.c (the data
 * path), handshake.c (hellos, connect), accept.c (listen, accept, close),
 * shm.c (the backend: viability, domain, ops table). See shm.c for the
 * design and docs/transport-shm.md. */
#ifndef TP_TRANSPORT_SHM_IMPL_H
#define TP_TRANSPORT_SHM_IMPL_H

#include "transport/transport.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/auth.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/shm/ring.h"

#define SHM_SCHEME     "shm://"
#define SHM_SCHEME_LEN 6
#define SHM_NAME_MAX   100
// Hello: TP_HELLO_LEN bytes (magic, u32le version, u32le flags), then
// u64le ring data size, u64le data offset, 8 reserved zero bytes. It
// carries two fds: the sender's outbox memfd and its wake eventfd.
#define SHM_HELLO_LEN     40u
#define SHM_PROTO_VERSION 1u
#define SHM_NFDS          2
// At most this many fds are accepted in a control message; more is a
// protocol error (and the extra fds are closed).
#define SHM_MAX_RECV_FDS 8
// A listener handshakes at most this many conns at once, and holds at most
// this many handshaken conns that no accept has taken yet.
#define SHM_MAX_HANDSHAKES 16
#define SHM_MAX_READY      64
// A unix connect() on a full backlog fails with EAGAIN: retry this often.
#define SHM_CONNECT_RETRY_NS 1000000u
// Bytes copied before the counter is published, so that the other side
// starts copying early (both copies then run concurrently).
#define SHM_CHUNK_MAX (64u * 1024u)
// Each side publishes the CPU its loop thread runs on (rh_producer_cpu of
// its outbox). When the peer's loop thread last ran on our CPU, spinning
// cannot help: the peer only runs once we stop. The poller then does not
// spin at all (see tp__shm_poll_cb).

typedef enum shm_state {
    SHM_C_NEW = 0,
    SHM_C_CONNECTING, // connector: connect() said EAGAIN, retrying
    SHM_C_WAIT_REPLY, // connector: hello sent, waiting for the listener's
    SHM_C_WAIT_HELLO, // acceptor: waiting for the connector's hello
    SHM_C_AUTH,       // both: hellos done, job-secret exchange (core/auth.h)
    SHM_C_READY,
    SHM_C_BROKEN, // c_err set; fds closed, rings still mapped
    SHM_C_CLOSED,
} shm_state;

typedef struct shm_listener shm_listener;

typedef struct shm_conn {
    tp_conn c_base; // first: transport.c allocates conn_size bytes
    shm_state c_state;
    char c_name[SHM_NAME_MAX + 1]; // abstract socket name (no scheme)
    int c_peer_pid;
    int c_sock; // unix socket: handshake, then death detection
    tp_loop_fd c_sock_lfd;
    int c_wake_fd; // our eventfd; the peer writes it to wake us
    tp_loop_fd c_wake_lfd;
    int c_peer_wake_fd; // the peer's eventfd
    int c_out_fd;       // our outbox memfd, until sent
    shm_ring c_out;     // we produce
    shm_ring c_in;      // we consume
    uint64_t c_out_head;
    uint64_t c_in_tail;
    uint64_t c_out_chunk;
    uint64_t c_in_chunk;
    tp_list c_readq; // tp_aio, in order
    tp_list c_writeq;
    tp_loop_poller c_poller;
    bool c_armed_read;       // we set rh_consumer_sleeping in c_in
    bool c_armed_write;      // we set rh_producer_waiting in c_out
    uint64_t c_spin_base_ns; // TP_SHM_SPIN_US
    int c_cpu;               // last CPU published in c_out, -1 none
    tp_error *c_err;         // why the conn broke (SHM_C_BROKEN)
    bool c_drain;            // broken by the peer: reads may still drain c_in
    // handshake
    tp_aio *c_connect_aio;
    tp_timer c_timer;
    uint64_t c_deadline_ns;
    uint8_t c_hs_buf[SHM_HELLO_LEN];
    size_t c_hs_got;
    int c_hs_fds[SHM_NFDS];
    int c_hs_nfds;
    uint32_t c_hs_flags; // the flags our hello carried
    tp__auth c_auth;
    // acceptor side, while owned by the listener
    shm_listener *c_listener;
    tp_list_node c_lnode;
    bool c_in_ready; // in l_ready (else in l_hs)
} shm_conn;

struct shm_listener {
    tp_listener l_base; // first
    int l_fd;
    tp_loop_fd l_lfd;
    char l_name[SHM_NAME_MAX + 1];
    tp_list l_acceptq; // tp_aio
    tp_list l_hs;      // shm_conn, handshaking
    tp_list l_ready;   // shm_conn, handshaken, waiting for an accept
    size_t l_nhs;
    size_t l_nready;
    bool l_serving; // in tp__shm_listener_serve (it may be re-entered)
    tp_task l_start_task;
};

static inline tp_loop *
shm_loop(const shm_conn *c)
{
    return c->c_base.c_transport->t_loop;
}

static inline const tp_config *
shm_cfg(const shm_conn *c)
{
    return &c->c_base.c_transport->t_cfg;
}

// ring.c: addresses and rings
tp_status tp__shm_parse_addr(const char *addr, char *name, tp_error **err_p);
socklen_t tp__shm_sockaddr(const char *name, struct sockaddr_un *sa);
int tp__shm_peer_pid(int fd);
void tp__shm_close_fd(int *fd);
uint64_t tp__shm_chunk(uint64_t ring_size);
void tp__shm_ring_unmap(shm_ring *r);
tp_status tp__shm_ring_create(shm_ring *r, uint64_t size, int *fd_p,
                              tp_error **err_p);
bool tp__shm_ring_map_peer(shm_ring *r, int fd, uint64_t size, char *why,
                           size_t why_len);
void tp__shm_notify(_Atomic uint32_t *flag, int fd);
void tp__shm_copy_iov(const shm_ring *r, uint64_t pos, const tp_aio *aio,
                      uint64_t off, uint64_t n, bool to_ring);

// data.c: the data path
void tp__shm_disarm(shm_conn *c);
void tp__shm_fail_all(shm_conn *c, tp_error *err);
void tp__shm_release_fds(shm_conn *c);
bool tp__shm_poll_cb(tp_loop_poller *p);
bool tp__shm_prepare_sleep_cb(tp_loop_poller *p);
void tp__shm_after_sleep_cb(tp_loop_poller *p);
void tp__shm_wake_cb(tp_loop_fd *lfd, uint32_t events);
void tp__shm_sock_check(shm_conn *c);
void tp__shm_conn_read(tp_conn *base, tp_aio *aio);
void tp__shm_conn_write(tp_conn *base, tp_aio *aio);

// handshake.c: hellos and connect
void tp__shm_conn_setup(shm_conn *c);
void tp__shm_set_names(shm_conn *c);
tp_status tp__shm_send_hello(shm_conn *c, tp_error **err_p);
int tp__shm_recv_hello(shm_conn *c, tp_status *st_p, char *why, size_t why_len);
bool tp__shm_hello_accept(shm_conn *c, char *why, size_t why_len);
tp_status tp__shm_conn_ready(shm_conn *c, tp_error **err_p);
void tp__shm_connect_fail(shm_conn *c, tp_error *err);
void tp__shm_connect_try(shm_conn *c);
void tp__shm_connector_on_reply(shm_conn *c);
int tp__shm_auth_pump(shm_conn *c, bool send_only, tp_error **err_p);
void tp__shm_connector_on_auth(shm_conn *c);
void tp__shm_connect(tp_transport *t, const char *addr, tp_aio *aio);

// accept.c: listen, accept and close
void tp__shm_listener_unlink(shm_conn *c);
void tp__shm_timer_cb(tp_timer *t, void *arg);
void tp__shm_sock_cb(tp_loop_fd *lfd, uint32_t events);
void tp__shm_listener_serve(shm_listener *l);
void tp__shm_accept(tp_listener *base, tp_aio *aio);
void tp__shm_listener_close(tp_listener *base);
tp_status tp__shm_listen(tp_transport *t, tp_listener *base, const char *addr,
                         tp_error **err_p);
void tp__shm_conn_close(tp_conn *base);
void tp__shm_conn_fini(tp_conn *base);

#endif
