/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_server_int.h (internal) - what the tcp store server's files share:
 * tcp_server.c (the loop, accepting, connections and their I/O),
 * tcp_server_hello.c (the hellos, the job-secret exchange),
 * tcp_server_req.c (parsing requests, running them on the engine,
 * replies, parked requests) and tcp_server_opts.c (the bounds).
 * Everything here runs on the server's loop thread. */
#ifndef TP_STORE_TCP_SERVER_INT_H
#define TP_STORE_TCP_SERVER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/auth.h"
#include "core/loop.h"
#include "store_int.h"
#include "transport/sockaddr.h"

// Where a connection is. Requests are served one at a time: the next one
// is parsed only once the reply to the last has been written.
typedef enum srv_state {
    SC_HELLO,  // exchanging hellos
    SC_AUTH,   // the job-secret exchange (core/auth.h)
    SC_READ,   // reading (and parsing) a request
    SC_PARKED, // a get or wait waiting for its keys or its deadline
    SC_WRITE,  // writing a reply
    SC_DEAD,   // closed; freed by its task
} srv_state;

typedef struct srv_conn {
    struct srv_conn *sc_next; // srv_conns
    struct srv_conn *sc_prev;
    struct srv_conn *sc_pnext; // srv_parked, while SC_PARKED
    struct srv_conn *sc_pprev;
    struct tp_store_server *sc_srv;
    tp_loop_fd sc_lfd;
    tp_timer sc_timer; // idle, request, wait or write deadline (by state)
    tp_task sc_task;   // runs conn_pump later, or frees a dead conn
    bool sc_task_queued;
    int sc_fd;
    srv_state sc_state;
    bool sc_readable; // no EAGAIN since the last read edge
    bool sc_writable;
    uint8_t *sc_in; // bytes received and not yet consumed
    size_t sc_in_len;
    size_t sc_in_cap;
    uint8_t *sc_out; // the reply being written
    size_t sc_out_len;
    size_t sc_out_off;
    size_t sc_out_cap;
    bool sc_out_oom;
    uint64_t sc_req_start; // tp__now_ns() of the request's first byte; 0
    uint8_t sc_hello[TP_STORE_HELLO_LEN]; // the peer's
    unsigned sc_hello_rcvd;
    uint32_t sc_peer_flags;
    tp__auth sc_auth;
    // The parked request (SC_PARKED): a get (one key) or a wait.
    uint8_t sc_op;
    char **sc_keys;
    uint32_t sc_nkeys;
    uint64_t sc_deadline; // UINT64_MAX: none
    char sc_peer[TP_SOCKADDR_STRLEN];
} srv_conn;

// The server's bounds (tcp_server_opts.c; docs/store.md). 0: none.
typedef struct srv_limits {
    int64_t sl_max_conns;
    int64_t sl_idle_ms;    // close a connection idle this long
    int64_t sl_request_ms; // a request must arrive whole within this
    int64_t sl_max_bytes;  // key and value bytes stored
    int64_t sl_max_value;
} srv_limits;

struct tp_store_server {
    tp__kv srv_kv;
    tp_loop *srv_loop;
    int srv_lfd;
    tp_loop_fd srv_lwatch;
    bool srv_lwatched;
    tp_timer srv_accept_timer; // retry after EMFILE and friends
    bool srv_stopping;
    uint32_t srv_hello_flags; // TP_AUTH_HELLO_FLAG with a job secret
    srv_limits srv_lim;
    uint64_t srv_refused;        // connections refused at the cap
    uint64_t srv_refused_log_ns; // when a refusal was last logged
    char srv_addr[TP_SOCKADDR_STRLEN + 16];
    srv_conn *srv_conns;
    size_t srv_nconns;
    srv_conn *srv_parked;
};

// ---- tcp_server_opts.c ----

// The bounds from @o (may be NULL), else TP_STORE_* variables, else the
// defaults; @max_value is TP_STORE_MAX_VALUE from the config.
tp_status tp__srv_limits_load(const tp_store_server_options *o,
                              int64_t max_value, srv_limits *l,
                              tp_error **err_p);

// ---- tcp_server.c ----

// Closes @c (its task frees it later); @c stays readable memory until
// then, so a caller may still look at sc_state.
void tp__srv_conn_close(srv_conn *c);
// Runs the connection's state machine after the current handler.
void tp__srv_conn_schedule(srv_conn *c);
// (Re)arms the connection's timer for its state.
void tp__srv_conn_arm(srv_conn *c);
// Writes the pending output; true once it is all sent. May close @c.
bool tp__srv_conn_flush(srv_conn *c);
// Appends to the reply being built; an allocation failure is remembered
// (sc_out_oom) and closes the connection when the reply is sent.
void tp__srv_out_put(srv_conn *c, const void *p, size_t n);

// ---- tcp_server_hello.c ----

// Our hello with @flags, TP_STORE_HELLO_LEN bytes at @h.
void tp__srv_hello(uint8_t *h, uint32_t flags);
// One step of the hello / of the job-secret exchange: true when the
// connection moved on to its next state, false when it waits for an event
// (or died).
bool tp__srv_conn_step_hello(srv_conn *c);
bool tp__srv_conn_step_auth(srv_conn *c);

// ---- tcp_server_req.c ----

typedef enum srv_parse {
    SRV_PARSE_OK,   // a whole request is buffered
    SRV_PARSE_MORE, // *need_p bytes are needed (in all) to go on
    SRV_PARSE_BAD,  // protocol error (*why_p)
} srv_parse;

// A parsed request: offsets into sc_in.
typedef struct srv_req {
    uint8_t r_op;
    uint64_t r_timeout_ms;
    size_t r_len; // bytes of the whole request
    size_t r_key; // offset of the first key's bytes
    uint32_t r_klen;
    size_t r_v1; // offsets of the values' bytes
    uint64_t r_n1;
    size_t r_v2;
    uint64_t r_n2;
    int64_t r_delta;
    uint32_t r_nkeys; // wait: keys, from r_key - 4 on
} srv_req;

// Parses the request at the start of @c's input. Every length is checked
// against its bound before it is used.
srv_parse tp__srv_req_parse(const srv_conn *c, srv_req *r, size_t *need_p,
                            const char **why_p);
// Runs @r: the connection then holds a reply (SC_WRITE) or is parked
// (SC_PARKED).
void tp__srv_req_run(srv_conn *c, const srv_req *r);
// The deadline of a parked request passed: reply (a timeout, or the value
// if it came at the last moment).
void tp__srv_req_expire(srv_conn *c);
// Drops a parked request (its connection closes).
void tp__srv_req_unpark(srv_conn *c);
// The engine's watch: wakes the parked requests waiting for @key.
void tp__srv_req_watch(void *arg, const char *key);

#endif
