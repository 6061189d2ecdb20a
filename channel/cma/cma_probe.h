/* SPDX-License-Identifier: Apache-2.0 */
/* cma_probe.h (internal) - the low-level part of the cma channel (cross
 * memory attach): whether process_vm_readv can work here, the domain
 * descriptor two peers compare, and the one-copy read from a peer's memory.
 * See docs/channel-cma.md. */
#ifndef TP_CHANNEL_CMA_PROBE_H
#define TP_CHANNEL_CMA_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

// tp__cma_read moves at most this many bytes per process_vm_readv call.
// The kernel caps one call at MAX_RW_COUNT (2 GiB - 4 KiB) and would return
// a short count above it; a power of two well below keeps calls full.
#define TP_CMA_CHUNK (UINT64_C(1) << 30)
// Chunks passed to tp__cma_read_chunked must be below this (2 GiB).
#define TP_CMA_CHUNK_LIMIT (UINT64_C(1) << 31)
// Enough for any descriptor tp__cma_domain writes.
#define TP_CMA_DOMAIN_MAX 256

// Whether cma can work in this process: /proc is readable, a self-test
// process_vm_readv of a local buffer succeeds and returns the right bytes,
// the process is dumpable, its real, effective and saved uids (and gids)
// agree, and the Yama ptrace scope lets peers attach. With scope 1 it makes
// tp__cma_allow_peers()'s prctl, and refuses if it fails. On false @why (if
// @why_len > 0) says why, e.g. "process_vm_readv: operation not permitted
// (seccomp? Docker's default profile blocks it)", "process not dumpable (prctl
// PR_GET_DUMPABLE = 0)", "ptrace scope 2 (/proc/sys/kernel/yama/
// ptrace_scope): only admin may attach (...)". Thread safety: any thread.
bool tp__cma_viable(char *why, size_t why_len);

// Lets any process of the same uid read this one under Yama ptrace scope 1
// (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)); without it only ancestors
// may. Best effort: a failure is logged (TP-CMA-PTRACER) and the next call
// tries again. Idempotent: one prctl per process (a forked child, which
// does not inherit the exception, makes its own). Does nothing when Yama is
// absent or its scope is not 1. Thread safety: any thread.
void tp__cma_allow_peers(void);

// The Yama ptrace scope (/proc/sys/kernel/yama/ptrace_scope): 0 if Yama is
// absent, else 0..3; -1 if the file exists but cannot be read (then @why,
// if @why_len > 0, says why).
int tp__cma_ptrace_scope(char *why, size_t why_len);

// Writes the domain descriptor into @buf (@len bytes, TP_CMA_DOMAIN_MAX is
// enough): "cma:<boot id>:pidns=<ino>:userns=<ino>:netns=<ino>:uid=<r>/<e>/<s>:
// gid=<r>/<e>/<s>:yama=<scope>". Two processes can reach each other with
// cma only if their descriptors are equal (and both are viable). @buf is
// written only on success. Errors: TP_EIO or the errno's status if /proc
// is unreadable, TP_EINVAL if @len is too small. Thread safety: any thread.
tp_status tp__cma_domain(char *buf, size_t len, tp_error **err_p);

// Copies @len bytes from address @remote in process @pid into @dst with
// process_vm_readv, one iovec and at most TP_CMA_CHUNK bytes per call,
// continuing after short reads. @dst is borrowed. A bad remote address
// never crashes: it is an error. Errors name the pid, the range, the offset
// reached and the errno: TP_EIO (EFAULT: bad address), TP_EPERM (EPERM:
// not allowed), TP_ECONNRESET (ESRCH: process gone), TP_EINVAL (bad
// arguments), others from the errno. On error the bytes before the offset
// reached have been copied. Thread safety: any thread.
tp_status tp__cma_read(pid_t pid, uint64_t remote, void *dst, uint64_t len,
                       tp_error **err_p);

// tp__cma_read with @chunk bytes at most per call; 0 < @chunk <
// TP_CMA_CHUNK_LIMIT, else TP_EINVAL. Exposed for tests.
tp_status tp__cma_read_chunked(pid_t pid, uint64_t remote, void *dst,
                               uint64_t len, uint64_t chunk, tp_error **err_p);

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
