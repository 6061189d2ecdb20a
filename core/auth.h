/* SPDX-License-Identifier: Apache-2.0 */
/* auth.h (internal) - the job secret and the challenge-response exchange
 * that every connection runs before anything it says is trusted.
 *
 * A job secret (TP_JOB_TOKEN, or the file named by TP_JOB_TOKEN_FILE) is
 * shared by the ranks of one job. Each side of a connection sends a fresh
 * 32-byte nonce, then HMAC-SHA256(secret, label | role | own nonce | peer
 * nonce) (OpenSSL's libcrypto), and checks the peer's MAC with the roles
 * swapped. The secret never travels; a reflected or replayed MAC fails
 * (the role and both fresh nonces are in it). Used by the tcp and shm
 * hellos (and so by every pipe, mpt lane and cma side connection) and by
 * the store protocol. docs/security.md. */
#ifndef TP_CORE_AUTH_H
#define TP_CORE_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tpipe/error.h>

// Bit 0 of a hello's flags: "this side has a job secret and will run the
// exchange after the hellos".
#define TP_AUTH_HELLO_FLAG 0x1u

#define TP_AUTH_NONCE_LEN 32u
#define TP_AUTH_MAC_LEN   32u
// Shortest secret accepted (bytes); `tpipe run` generates 64 hex digits.
#define TP_AUTH_MIN_SECRET 16u

typedef struct tp__auth {
    bool a_acceptor;
    char a_label[16];
    uint8_t a_out[TP_AUTH_NONCE_LEN + TP_AUTH_MAC_LEN]; // nonce, then MAC
    uint8_t a_in[TP_AUTH_NONCE_LEN + TP_AUTH_MAC_LEN];
    size_t a_out_ready; // bytes of a_out that may be sent
    size_t a_sent;
    size_t a_rcvd;
    bool a_ok; // the peer's MAC checked
} tp__auth;

// Whether a job secret is configured (read once per process from the
// environment). Fails (TP_EINVAL, naming the variable) when it is set but
// unusable: an unreadable or group/other-readable file, a secret shorter
// than TP_AUTH_MIN_SECRET bytes, or a build without libcrypto.
tp_status tp__auth_enabled(bool *on, tp_error **err_p);

// Reads the environment again (tests that change TP_JOB_TOKEN between
// cases; no connection may be in its set-up meanwhile).
void tp__auth_reload(void);

// Decides what to do after the hellos, given our and the peer's flags.
// Returns 1 when the exchange must run, 0 when neither side has a secret,
// or fails (TP_EPERM) when exactly one side has one. @what names the
// connection ("tcp: connect to X"); the message says which side lacks the
// secret. On the acceptor side the caller logs it and sends nothing more.
int tp__auth_decide(uint32_t our_flags, uint32_t peer_flags, bool acceptor,
                    const char *what, tp_error **err_p);

// Starts an exchange (a fresh nonce). @label names the protocol ("tcp",
// "shm", "store"): a MAC made for one protocol does not verify in another.
void tp__auth_start(tp__auth *a, bool acceptor, const char *label);

// Bytes to send now (0: none until more is received) / @n of them sent.
size_t tp__auth_out(tp__auth *a, const uint8_t **p);
void tp__auth_sent(tp__auth *a, size_t n);

// Room for the peer's next bytes (0: all received) / @n bytes received.
// The peer's MAC is checked when complete: TP_EPERM ("<peer>: job secret
// mismatch") when wrong. @peer names the peer for the message.
size_t tp__auth_in(tp__auth *a, uint8_t **p);
tp_status tp__auth_received(tp__auth *a, size_t n, const char *peer,
                            tp_error **err_p);

// Everything sent and the peer's MAC checked.
bool tp__auth_done(const tp__auth *a);

// The I/O of an exchange: @send: write up to @len bytes of @buf, else read
// up to @len into it. Returns the bytes moved, 0 at EOF (reads), or -1 with
// errno (EAGAIN: not now).
typedef ssize_t (*tp__auth_io)(void *ctx, bool send, void *buf, size_t len);

// Moves the exchange as far as @io allows (the one pump of the tcp, shm
// and fd exchanges): sends what is ready, reads what is due (nothing with
// @send_only: the nonce right behind a hello). *done_p when the exchange
// is complete. Fails naming @peer and the cause: a wrong proof (TP_EPERM),
// EOF (the peer refused this secret), an I/O error.
tp_status tp__auth_pump(tp__auth *a, tp__auth_io io, void *ctx, bool send_only,
                        const char *peer, bool *done_p, tp_error **err_p);

// The whole exchange on a blocking or non-blocking socket @fd, polling
// until @deadline_ns (tp__now_ns clock). For clients that do their own
// blocking I/O (the store client, tests).
tp_status tp__auth_run_fd(int fd, bool acceptor, const char *label,
                          uint64_t deadline_ns, const char *peer,
                          tp_error **err_p);

struct sockaddr;
// Warns once per process, when no secret is configured and @sa is not a
// loopback (or unix) address, that @what (e.g. "tcp listener
// tcp://10.0.0.1:29500") accepts connections without authentication:
// WARN TP-AUTH-OPEN, or a line on stderr when logging is off.
void tp__auth_warn_open(const char *what, const struct sockaddr *sa);

#endif
