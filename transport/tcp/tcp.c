// SPDX-License-Identifier: Apache-2.0
// tcp.c - the TCP transport: non-blocking sockets on the loop thread.
// Its parts: tcp_impl.h.
//
// Everything here except tcp_is_viable, tcp_ctx_init and tp__tcp_listen runs on
// the loop thread (transport.c guarantees it), so there are no locks.
//
// Each socket is registered once with the loop for READ|WRITE; readiness
// is edge-style, so I/O runs until EAGAIN, and tc_readable/tc_writable
// remember whether the last attempt hit EAGAIN (then the next attempt
// waits for an event instead of making a syscall that would fail). A new
// operation is tried at once (optimistic I/O): a write submitted on the
// loop thread (unless submissions from other threads are queued ahead of
// it) is on the wire before conn_write returns.
//
// Reads and writes are queues of aios; a syscall gathers the remaining
// iovs of the queued aios in order (readv / sendmsg, at most TCP_MAX_IOV
// iovecs and TCP_IO_CAP bytes), straight into or out of the caller's
// buffers. a_prov_u64[0] counts the bytes an aio has moved, a_prov_u64[1]
// is its total, a_prov_data[0] the queue it is on. Only the head of a
// queue can have moved bytes without being complete.
//
// A connection error (EOF, reset, a canceled op that had moved bytes,
// close) is recorded once in tc_err; every pending op and every later op
// fails with a reference to that one error.
//
// Connection set-up: both sides send a 16-byte hello (TP_HELLO_MAGIC,
// u32le version, u32le flags) and read the peer's. A listener hands a
// connection to an accept aio only after a valid hello; a bad one is
// logged (TP-TCP-HELLO) and dropped. A listener takes connections from the
// kernel as soon as it exists, whether or not an accept is pending (so a
// connect completes without waiting for the peer to call accept); those not
// yet asked for wait, handshaked, in tl_readyq (at most TCP_MAX_PENDING per
// listener, with those still handshaking; beyond that they wait in the
// kernel's backlog).

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "transport/sockaddr.h"
#include "transport/tcp/tcp_impl.h"

// ---- transport -------------------------------------------------------------

static bool
tcp_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    TP_UNUSED(cfg);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            snprintf(why, why_len, "socket(AF_INET, SOCK_STREAM): %s (%s)",
                     strerror(e), tp__errno_name(e));
            return false;
        }
    }
    close(fd);
    return true;
}

static tp_status
tcp_ctx_init(tp_transport *t, tp_error **err_p)
{
    TP_UNUSED(err_p);
    // TCP reaches any host that routes to the address: universal.
    snprintf(t->t_domain, sizeof(t->t_domain), "tcp");
    return TP_OK;
}

static void
tcp_ctx_fini(tp_transport *t)
{
    TP_UNUSED(t);
}

static const tp_tunable tcp_tunable_rows[] = {
    {
        .tu_name = "tcp_sndbuf",
        .tu_env = "TP_TCP_SNDBUF",
        // 1M (both buffers): on loopback, smaller buffers keep the bytes in
        // cache between the two kernel copies (64 MiB stream: 256K 3.0,
        // 1M 2.8-2.95, 2M 2.55-2.6, 4M 2.45, autotuning 2.47 GB/s; 64 MiB
        // round trip 41-43 ms with 1M, 49-51 with 2M; 1 MiB round trips
        // the same within noise). Raise it for links whose
        // bandwidth-delay product is larger.
        .tu_def = "1M",
        .tu_doc = "SO_SNDBUF of tcp connections in bytes (0: kernel default)",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(tcp_tunables, tt_sndbuf),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
    {
        .tu_name = "tcp_rcvbuf",
        .tu_env = "TP_TCP_RCVBUF",
        .tu_def = "1M",
        .tu_doc = "SO_RCVBUF of tcp connections in bytes (0: kernel default)",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(tcp_tunables, tt_rcvbuf),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
    {
        .tu_name = "tcp_user_timeout_ms",
        .tu_env = "TP_TCP_USER_TIMEOUT_MS",
        .tu_def = "30000",
        .tu_doc = "a tcp connection whose peer stops acknowledging (host "
                  "gone, cable cut) fails after this long: TCP_USER_TIMEOUT "
                  "and keepalive probes (0: kernel defaults, ~15 min)",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_FIELD(tcp_tunables, tt_user_timeout_ms),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
};

const tp_tunables tp__tcp_tunables = {
    .ts_component = "tcp",
    .ts_rows = tcp_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(tcp_tunable_rows),
    .ts_store = TP_TUNABLES_OWN,
    .ts_size = sizeof(tcp_tunables),
};

const tp_transport_ops tp__transport_tcp_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "tcp",
    .props = TP_TRANSPORT_PROP_NETWORK,
    .ctx_size = 0,
    .listener_size = sizeof(tcp_listener),
    .conn_size = sizeof(tcp_conn),
    .tunables = &tp__tcp_tunables,
    .is_viable = tcp_is_viable,
    .ctx_init = tcp_ctx_init,
    .ctx_fini = tcp_ctx_fini,
    .listen = tp__tcp_listen,
    .accept = tp__tcp_accept,
    .listener_close = tp__tcp_listener_close,
    .connect = tp__tcp_connect,
    .conn_read = tp__tcp_conn_read,
    .conn_write = tp__tcp_conn_write,
    .conn_close = tp__tcp_conn_close,
    .conn_fini = tp__tcp_conn_fini,
};
