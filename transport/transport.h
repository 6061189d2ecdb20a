/* SPDX-License-Identifier: Apache-2.0 */
/* transport.h - the transport contract and its generic layer.
 *
 * A transport moves a reliable, ordered byte stream between two endpoints.
 * A backend (transport/<name>/) fills a const tp_transport_ops and
 * declares it in its backend.cmake, from which the registry's table is
 * generated (docs/backends.md). The generic layer (transport.c):
 *  - owns the public-facing objects tp_transport, tp_listener, tp_conn;
 *  - runs every backend op that touches loop state on the loop thread, so
 *    backends need no locks of their own (posting from other threads);
 *  - frees conns and listeners on the loop thread once their last
 *    reference is dropped, after closing them.
 *
 * Stream semantics: a read completes when every byte of its iovs has been
 * received (exact-length reads, lengths 64-bit); a write completes when
 * every byte has been handed to the kernel / ring. Reads complete in the
 * order submitted, writes too. A read or write that fails or is canceled
 * after moving some bytes leaves the stream unusable: the backend then
 * closes the connection, and every other pending op fails with that error.
 * One that moved none leaves it usable, with one documented exception:
 * ucx posts large reads with no deadline to UCX, which cannot take them
 * back, so canceling one closes the connection (docs/transport-ucx.md).
 *
 * Errors name the transport and the peer address:
 *   "tcp: read from peer 127.0.0.1:5555: connection closed by peer (EOF)".
 * Connection-scope statuses: TP_ECONNRESET (peer died / EOF),
 * TP_ECLOSED (closed locally), TP_EPROTO (bad bytes in the handshake).
 */
#ifndef TP_TRANSPORT_TRANSPORT_H
#define TP_TRANSPORT_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/aio.h"
#include "core/config.h"
#include "core/loop.h"

#define TP_TRANSPORT_ABI_V1 1u

// The first bytes each side sends on a new connection (the transport
// hello): magic, version, flags. A listener that reads anything else
// rejects that connection (TP_EPROTO) and keeps serving others.
#define TP_HELLO_MAGIC "TPIPE\0\x01\x00" // 8 bytes
#define TP_HELLO_LEN   16u

// Properties of a transport (tp_transport_ops.props): the layers above
// choose by property, never by name (the mpt channel's lanes take the
// first transport of a context that is TP_TRANSPORT_PROP_NETWORK).
// Reaches peers on other hosts (tcp, ucx).
#define TP_TRANSPORT_PROP_NETWORK (1u << 0)
// Reaches only peers on this host, through memory (shm): a channel that
// adds network lanes is pointless over it.
#define TP_TRANSPORT_PROP_SAME_HOST (1u << 1)

typedef struct tp_transport tp_transport;
typedef struct tp_listener tp_listener;
typedef struct tp_conn tp_conn;

typedef struct tp_transport_ops {
    uint32_t abi_version; // TP_TRANSPORT_ABI_V1
    const char *name;     // "tcp", "shm"
    unsigned props;       // TP_TRANSPORT_PROP_* (what it reaches)
    size_t ctx_size;      // private bytes allocated after tp_transport
    size_t listener_size; // bytes of the backend listener (embeds tp_listener)
    size_t conn_size;     // bytes of the backend conn (embeds tp_conn)
    // Optional (NULL: none): the backend's tunables (core/tunables.h),
    // listed by `tpipe info --config` and loaded into every tp_config.
    const tp_tunables *tunables;

    // Any thread, may block briefly. false = unusable on this host; @why
    // says why ("memfd_create: operation not permitted").
    bool (*is_viable)(const tp_config *cfg, char *why, size_t why_len);
    // Any thread. Fill the private context (tp_transport_ctx(t)). Compute
    // the domain descriptor into t->t_domain.
    tp_status (*ctx_init)(tp_transport *t, tp_error **err_p);
    // Loop thread, after every listener and conn is gone.
    void (*ctx_fini)(tp_transport *t);

    // Any thread, synchronous: create the listening endpoint for @addr
    // (NULL or "" = the transport's default) in the tp_listener @l
    // (allocated by the generic layer, listener_size bytes, zeroed), and
    // write the bound address into l->l_addr. Must not touch loop state.
    tp_status (*listen)(tp_transport *t, tp_listener *l, const char *addr,
                        tp_error **err_p);
    // Loop thread. Output 0 of @aio: a new tp_conn * (refcount 1) after
    // the hello was exchanged. Bad hellos are dropped (logged), not
    // reported to the aio.
    void (*accept)(tp_listener *l, tp_aio *aio);
    // Loop thread: stop listening; pending accepts fail with TP_ECLOSED.
    void (*listener_close)(tp_listener *l);

    // Loop thread. Output 0: a new tp_conn * (refcount 1), in conn_size
    // bytes the backend allocates with tp__conn_alloc. Refused: error
    // TP_ECONNREFUSED naming @addr. Honors aio timeout, else
    // cfg->connect_timeout_ms.
    void (*connect)(tp_transport *t, const char *addr, tp_aio *aio);
    // Loop thread. Exact-length read / write (see above).
    void (*conn_read)(tp_conn *c, tp_aio *aio);
    void (*conn_write)(tp_conn *c, tp_aio *aio);
    // Loop thread: fail pending ops with TP_ECLOSED and release the fd.
    // Idempotent.
    void (*conn_close)(tp_conn *c);
    // Loop thread, after conn_close: free backend resources (not @c).
    void (*conn_fini)(tp_conn *c);
} tp_transport_ops;

struct tp_transport {
    const tp_transport_ops *t_ops;
    tp_loop *t_loop;
    tp_config t_cfg;
    char t_domain[256];
    // Live listeners + conns (+ backend helper threads that may still post
    // to t_loop): taken with tp__transport_hold, dropped with
    // tp__transport_release, which changes it under t_mtx and wakes
    // tp__transport_destroy on t_cv when it reaches zero.
    tp_mtx t_mtx;
    tp_cv t_cv;
    _Atomic int t_nobjs;
    // Fault injection for conns made from now on (fault.h); NULL = none.
    struct tp_fault *t_fault;
};

static inline void *
tp_transport_ctx(tp_transport *t)
{
    return (void *)(t + 1);
}

struct tp_listener {
    tp_transport *l_transport;
    char l_addr[256]; // bound address, e.g. "tcp://127.0.0.1:40123"
    _Atomic int l_refs;
    bool l_closed; // loop thread
    tp_task l_free_task;
};

struct tp_conn {
    tp_transport *c_transport;
    char c_peer[256];  // "127.0.0.1:5555", "[::1]:80", "shm pid 1234"
    char c_local[256]; // local address
    _Atomic int c_refs;
    _Atomic bool c_closed_req;
    tp_task c_close_task;
    tp_task c_free_task;
    struct tp_conn_fault *c_fault; // loop thread; NULL = no fault (fault.h)
};

// ---- registry (transport/registry.c) ----
// The backends compiled in, best first (shm, tcp, then ucx where built):
// each transport/<name>/backend.cmake declares one (docs/backends.md).
const tp_transport_ops *const *tp__transport_registry(size_t *n_p);
const tp_transport_ops *tp__transport_find(const char *name);

// ---- generic layer (transport/transport.c), any thread unless noted ----
// Create an instance of backend @name on @loop. @cfg is copied.
tp_status tp__transport_create(const char *name, tp_loop *loop,
                               const tp_config *cfg, tp_transport **t_p,
                               tp_error **err_p);
// Waits until every listener and conn is freed (their last references
// dropped, their free tasks run on the loop) and every hold released,
// logging TP-TRANSPORT-WAIT every 5 s while it waits; then frees. Not from
// the loop thread.
void tp__transport_destroy(tp_transport *t);
// Loop thread: destroys a transport that a backend created for itself on
// the same loop (ibv's tcp bootstrap), from that backend's ctx_fini, once
// every listener and conn of it has been freed (else it logs and leaks it).
void tp__transport_destroy_nested(tp_transport *t);
const char *tp__transport_name(const tp_transport *t);
const char *tp__transport_domain(const tp_transport *t);

tp_status tp__transport_listen(tp_transport *t, const char *addr,
                               tp_listener **l_p, tp_error **err_p);
const char *tp__listener_addr(const tp_listener *l);
void tp__listener_accept(tp_listener *l, tp_aio *aio);
// Close (pending accepts fail with TP_ECLOSED) and drop the reference.
void tp__listener_destroy(tp_listener *l);

void tp__transport_connect(tp_transport *t, const char *addr, tp_aio *aio);
void tp__conn_read(tp_conn *c, tp_aio *aio);
void tp__conn_write(tp_conn *c, tp_aio *aio);
// Non-blocking: pending ops fail with TP_ECLOSED.
void tp__conn_close(tp_conn *c);
tp_conn *tp__conn_ref(tp_conn *c);
// Last reference: close, then free on the loop thread.
void tp__conn_unref(tp_conn *c);
const char *tp__conn_peer(const tp_conn *c);
const char *tp__conn_local(const tp_conn *c);

// Backend helpers (loop thread).
tp_conn *tp__conn_alloc(tp_transport *t); // zeroed conn_size, refcount 1

// Any thread: count one more object that keeps @t (and its loop) alive:
// tp__transport_destroy waits until each hold is released. Conns
// (tp__conn_alloc) and listeners are counted by the generic layer; a
// backend holds @t for a helper thread that posts to the loop.
void tp__transport_hold(tp_transport *t);
// Any thread: drop a hold. @t may be freed as soon as this returns (by a
// destroy waiting for it): touch nothing of it afterwards.
void tp__transport_release(tp_transport *t);

#endif
