// SPDX-License-Identifier: Apache-2.0
// tcp_server_hello.c - the start of every store server connection: the
// 16-byte hellos (ours queued at accept, the peer's checked byte by byte)
// and, when both sides have a job secret, the exchange of core/auth.h
// pumped from the loop. No request is read before both are done. Loop
// thread only.

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "core/log.h"
#include "core/wire.h"
#include "tcp_server_int.h"

void
tp__srv_hello(uint8_t *h, uint32_t flags)
{
    memcpy(h, TP_STORE_HELLO_MAGIC, 8);
    tp__put_u32le(h + 8, TP_STORE_HELLO_VERSION);
    tp__put_u32le(h + 12, flags);
}

// The hello: ours was queued at accept; read the peer's, refusing a
// stranger at its first wrong byte. False when waiting for an event (or
// dead).
bool
tp__srv_conn_step_hello(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    if (c->sc_out_off < c->sc_out_len && !tp__srv_conn_flush(c) &&
        c->sc_state == SC_DEAD) {
        return false;
    }
    while (c->sc_hello_rcvd < TP_STORE_HELLO_LEN && c->sc_readable) {
        ssize_t n = recv(c->sc_fd, c->sc_hello + c->sc_hello_rcvd,
                         TP_STORE_HELLO_LEN - c->sc_hello_rcvd, 0);
        if (n > 0) {
            c->sc_hello_rcvd += (unsigned)n;
            size_t m = TP_MIN(c->sc_hello_rcvd, 8u);
            if (memcmp(c->sc_hello, TP_STORE_HELLO_MAGIC, m) != 0) {
                TP_LOG_WARN("TP-STORE-HELLO",
                            "store server %s: peer %s: not a tpipe store "
                            "client (bad hello); connection dropped",
                            srv->srv_addr, c->sc_peer);
                tp__srv_conn_close(c);
                return false;
            }
        } else if (n == 0) {
            TP_LOG_INFO("TP-STORE-HELLO",
                        "store server %s: peer %s: closed during the hello",
                        srv->srv_addr, c->sc_peer);
            tp__srv_conn_close(c);
            return false;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->sc_readable = false;
        } else if (errno != EINTR) {
            TP_LOG_INFO("TP-STORE-HELLO",
                        "store server %s: peer %s: reading the hello: %s (%s)",
                        srv->srv_addr, c->sc_peer, strerror(errno),
                        tp__errno_name(errno));
            tp__srv_conn_close(c);
            return false;
        }
    }
    if (c->sc_hello_rcvd < TP_STORE_HELLO_LEN ||
        c->sc_out_off < c->sc_out_len) {
        return false;
    }
    uint32_t version = tp__get_u32le(c->sc_hello + 8);
    if (version != TP_STORE_HELLO_VERSION) {
        TP_LOG_WARN("TP-STORE-HELLO",
                    "store server %s: peer %s: store protocol version %u, "
                    "this server speaks %u; connection dropped",
                    srv->srv_addr, c->sc_peer, version, TP_STORE_HELLO_VERSION);
        tp__srv_conn_close(c);
        return false;
    }
    c->sc_peer_flags = tp__get_u32le(c->sc_hello + 12);
    char what[sizeof(srv->srv_addr) + TP_SOCKADDR_STRLEN + 32];
    snprintf(what, sizeof(what), "store server %s: peer %s", srv->srv_addr,
             c->sc_peer);
    tp_error *err = NULL;
    int run = tp__auth_decide(srv->srv_hello_flags, c->sc_peer_flags, true,
                              what, &err);
    if (run < 0) {
        // Exactly one side has a secret: nothing more is sent.
        TP_LOG_WARN("TP-STORE-AUTH", "%s", tp_error_message(err));
        tp_error_unref(err);
        tp__srv_conn_close(c);
        return false;
    }
    if (run > 0) {
        tp__auth_start(&c->sc_auth, true, "store");
        c->sc_state = SC_AUTH;
        return true;
    }
    c->sc_req_start = 0;
    c->sc_state = SC_READ;
    tp__srv_conn_arm(c);
    return true;
}

// The job-secret exchange, pumped as far as the socket allows; no request
// is read before it completes. False when waiting for an event (or dead).
bool
tp__srv_conn_step_auth(srv_conn *c)
{
    tp_store_server *srv = c->sc_srv;
    for (;;) {
        const uint8_t *op;
        uint8_t *ip;
        size_t no = c->sc_writable ? tp__auth_out(&c->sc_auth, &op) : 0;
        size_t ni = c->sc_readable ? tp__auth_in(&c->sc_auth, &ip) : 0;
        if (no == 0 && ni == 0) {
            break;
        }
        ssize_t n;
        if (no > 0) {
            n = send(c->sc_fd, op, no, MSG_NOSIGNAL);
            if (n > 0) {
                tp__auth_sent(&c->sc_auth, (size_t)n);
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                c->sc_writable = false;
                continue;
            }
        } else {
            n = recv(c->sc_fd, ip, ni, 0);
            if (n > 0) {
                tp_error *err = NULL;
                if (tp__auth_received(&c->sc_auth, (size_t)n, c->sc_peer,
                                      &err) != TP_OK) {
                    TP_LOG_WARN("TP-STORE-AUTH",
                                "store server %s: %s; connection dropped",
                                srv->srv_addr, tp_error_message(err));
                    tp_error_unref(err);
                    tp__srv_conn_close(c);
                    return false;
                }
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                c->sc_readable = false;
                continue;
            }
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        TP_LOG_INFO("TP-STORE-AUTH",
                    "store server %s: peer %s: %s during the job-secret "
                    "exchange",
                    srv->srv_addr, c->sc_peer,
                    n == 0 ? "closed the connection" : strerror(errno));
        tp__srv_conn_close(c);
        return false;
    }
    if (!tp__auth_done(&c->sc_auth)) {
        return false;
    }
    c->sc_req_start = 0;
    c->sc_state = SC_READ;
    tp__srv_conn_arm(c);
    return true;
}
