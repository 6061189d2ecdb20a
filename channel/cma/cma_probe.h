/* SPDX-License-Identifier: Apache-2.0 */
/* cma_probe.h (internal) - the cma channel's side socket. Whether cross
 * memory attach can work here, the domain descriptor two peers compare and
 * the one-copy read are core's (core/host.h, included here). See
 * docs/channel-cma.md. */
#ifndef TP_CHANNEL_CMA_PROBE_H
#define TP_CHANNEL_CMA_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"
#include "core/host.h"

// ---- the side socket: the kernel names the peer ----------------------------
//
// A cma descriptor names the sender's pid; a peer could name any process
// this one can read. So each end learns its peer's pid from the kernel
// instead: it listens on an abstract unix socket with a random name, tells
// the peer the name and a random token over the channel's connection, and
// takes SO_PEERCRED (and a pidfd) of the connection that presents the
// token. See docs/channel-cma.md, "Trust".

// Hex characters of a side socket's name, and bytes of its token.
#define TP_CMA_SIDE_NAME_LEN  32
#define TP_CMA_SIDE_TOKEN_LEN 16

typedef struct tp__cma_side {
    int cs_fd;                          // the listening socket, -1 when closed
    char cs_name[TP_CMA_SIDE_NAME_LEN]; // not NUL-terminated
    uint8_t cs_token[TP_CMA_SIDE_TOKEN_LEN]; // the peer must present it
} tp__cma_side;

// What the kernel says about the process at the other end of a side
// connection (SO_PEERCRED at connect time).
typedef struct tp__cma_peer {
    pid_t cp_pid;
    uid_t cp_uid;
    gid_t cp_gid;
    int cp_pidfd; // the same process (SO_PEERPIDFD, else pidfd_open); -1
} tp__cma_peer;

// Any thread. Listens on "\0tpipe-cma-<name>" with a random name and token
// (getrandom). On error @s->cs_fd is -1. Errors: from socket/bind/listen,
// naming the call.
tp_status tp__cma_side_listen(tp__cma_side *s, tp_error **err_p);

// Any thread, does not block. Connects to the side socket @name (hex
// only, else TP_EPROTO) and writes @token on it, then closes the
// connection (the listener keeps what was written and the credentials).
tp_status tp__cma_side_connect(const char name[TP_CMA_SIDE_NAME_LEN],
                               const uint8_t token[TP_CMA_SIDE_TOKEN_LEN],
                               tp_error **err_p);

// Any thread, does not block. Takes the connections waiting on @s until
// one presents @s's token, and fills *@peer_p from the kernel (the caller
// closes cp_pidfd with tp__cma_peer_fini). Connections with another token
// (any local process can connect to an abstract socket) are closed.
// Errors: TP_EPROTO when no waiting connection has the token, others from
// accept/getsockopt.
tp_status tp__cma_side_accept(tp__cma_side *s, tp__cma_peer *peer_p,
                              tp_error **err_p);

// Closes the listening socket. Idempotent.
void tp__cma_side_close(tp__cma_side *s);

// Closes cp_pidfd. Idempotent.
void tp__cma_peer_fini(tp__cma_peer *peer);

// Any thread: false once the process of @peer has exited (its pidfd is
// readable). Without a pidfd, true. A read that succeeded and is followed
// by true came from that process: its pid cannot be reused while it lives.
bool tp__cma_peer_alive(const tp__cma_peer *peer);

#endif
