// SPDX-License-Identifier: Apache-2.0
// conn.c - the agent's connections. A worker connects lazily to a peer on
// its first call (the "outgoing" pipe: requests out, replies in) and
// accepts the peer's own outgoing pipe (an "incoming" pipe: requests in,
// replies out), as PyTorch's TensorPipe agent does. A failed outgoing pipe
// is dropped; the next call to that worker connects again.
//
// Each connection reads in a loop on the context's loop thread: descriptor
// (checked, tensors allocated from its shapes) -> rest of the message ->
// the handler of its kind -> next descriptor. Writes go through reusable
// write slots (slot.c).

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ag_impl.h"
#include "proto.h"
#include "core/alloc.h"
#include "core/log.h"

// ---- connections ---------------------------------------------------------

// The count drops under a_mtx: a teardown waiting for the pipe to be
// quiet holds a_mtx to look, so it cannot see it quiet and free the agent
// while this thread still touches it.
void
tp__ag_conn_op_done(ag_conn *c)
{
    tp_agent *a = c->c_agent;
    tp__mtx_lock(&a->a_mtx);
    atomic_fetch_sub_explicit(&c->c_ops, 1, memory_order_acq_rel);
    if (a->a_state == AG_CLOSED) {
        tp__cv_broadcast(&a->a_quiet_cv);
    }
    tp__mtx_unlock(&a->a_mtx);
}

void
tp__ag_writers_exit(tp_agent *a)
{
    tp__mtx_lock(&a->a_mtx);
    if (atomic_fetch_sub_explicit(&a->a_writers, 1, memory_order_acq_rel) ==
            1 &&
        a->a_state == AG_CLOSED) {
        tp__cv_broadcast(&a->a_quiet_cv);
    }
    tp__mtx_unlock(&a->a_mtx);
}

static void conn_desc_cb(void *arg);
static void conn_read_cb(void *arg);

static ag_conn *
ag_conn_create(tp_agent *a, tp_pipe *pipe, bool outgoing)
{
    ag_conn *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    atomic_init(&c->c_ops, 0);
    atomic_init(&c->c_reqs, 0);
    c->c_agent = a;
    c->c_pipe = pipe;
    c->c_outgoing = outgoing;
    if (tp_aio_create(conn_desc_cb, c, &c->c_daio) != TP_OK ||
        tp_aio_create(conn_read_cb, c, &c->c_raio) != TP_OK) {
        tp_aio_destroy(c->c_daio);
        tp__free(c);
        return NULL;
    }
    return c;
}

void
tp__ag_conn_free(ag_conn *c)
{
    for (size_t i = 0; i < c->c_nslots; i++) {
        tp__ag_slot_free(c->c_allslots[i]);
    }
    tp__free(c->c_allslots);
    tp_aio_destroy(c->c_daio);
    tp_aio_destroy(c->c_raio);
    tp_message_destroy(c->c_rmsg);
    tp_args_unref(c->c_rargs);
    tp__free(c->c_metas);
    tp_pipe_unref(c->c_pipe);
    tp__free(c);
}

// The peer's name for messages: "worker1 (rank 1) at tcp://..." or the
// pipe's view of it for an incoming pipe that has not said who it is.
void
tp__ag_conn_describe(const ag_conn *c, char *buf, size_t len)
{
    if (c->c_peer != NULL) {
        snprintf(buf, len, "%s (rank %d)%s%s", c->c_peer->p_info.name,
                 c->c_peer->p_info.rank, c->c_url[0] ? " at " : "", c->c_url);
    } else {
        snprintf(buf, len, "%s", tp_pipe_peer(c->c_pipe));
    }
}

// Any thread: the connection is dead. Every call pending on it fails with
// @err (naming the peer); an outgoing connection is forgotten so the next
// call connects again. Idempotent.
void
tp__ag_conn_fail(ag_conn *c, const tp_error *err)
{
    tp_agent *a = c->c_agent;
    ag_call *failed = NULL;

    tp__mtx_lock(&a->a_mtx);
    if (c->c_failed) {
        tp__mtx_unlock(&a->a_mtx);
        return;
    }
    c->c_failed = true;
    ag_state state = a->a_state;
    ag_peer *p = c->c_peer;
    if (p != NULL && p != a->a_self && state != AG_CLOSED && !p->p_dead) {
        p->p_dead = true;
        snprintf(p->p_dead_why, sizeof(p->p_dead_why), "%s",
                 tp_error_message(err));
    }
    if (p != NULL && c->c_outgoing) {
        if (p->p_out == c) {
            p->p_out = NULL;
        }
        ag_call *call = p->p_calls;
        while (call != NULL) {
            ag_call *next = call->c_pnext;
            if (call->c_conn == c) {
                tp__ag_pending_unlink_locked(a, call, tp_error_status(err));
                call->c_hnext = failed;
                failed = call;
            }
            call = next;
        }
    }
    tp__mtx_unlock(&a->a_mtx);

    char who[AG_MAX_URL + 160];
    tp__ag_conn_describe(c, who, sizeof(who));
    if (failed != NULL || (state == AG_RUNNING && c->c_outgoing)) {
        TP_LOG_WARN("TP-RPC-PIPE", "rpc %s: pipe to %s failed: %s", ag_name(a),
                    who, tp_error_message(err));
    } else {
        // A peer closing its pipe to us (it shut down) is normal.
        TP_LOG_DEBUG("TP-RPC-PIPE", "rpc %s: pipe %s %s ended: %s", ag_name(a),
                     c->c_outgoing ? "to" : "from", who, tp_error_message(err));
    }
    // The calls fail with the connection's status; a timeout (connecting,
    // the handshake, TCP's own ETIMEDOUT) stays a timeout.
    tp_status st = tp_error_status(err);
    if (!TP_STATUS_IS_CONN(st) && st != TP_ETIMEDOUT) {
        st = TP_ECONNRESET;
    }
    if (state == AG_RUNNING && p != NULL && p != a->a_self) {
        // Before the shutdown agreement no peer closes a pipe: it died (or
        // broke the protocol). The protocols drop what it held.
        tp__ag_proto_peer_failed(a, p->p_info.rank, err);
    }
    while (failed != NULL) {
        ag_call *call = failed;
        failed = call->c_hnext;
        tp_error *e = tp__error_new(st, 0, err, "rpc \"%s\" from %s to %s",
                                    call->c_fn_name, ag_name(a), who);
        tp__ag_call_finish(call, NULL, e);
    }
    tp_pipe_close(c->c_pipe);
}

void
tp__ag_conn_protocol_error(ag_conn *c, tp_error *err)
{
    char who[AG_MAX_URL + 160];
    tp__ag_conn_describe(c, who, sizeof(who));
    tp_error *e =
        tp__error_new(TP_EPROTO, 0, err, "rpc %s: protocol error from %s",
                      ag_name(c->c_agent), who);
    TP_LOG_WARN("TP-RPC-PROTO", "%s; closing that pipe", tp_error_message(e));
    tp__ag_conn_fail(c, e);
    tp_error_unref(e);
}

// Loop thread (or the connecting thread, once): read the next descriptor.
static void
ag_conn_read_next(ag_conn *c)
{
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    tp_pipe_read_descriptor(c->c_pipe, c->c_daio);
}

void
tp__ag_peer_release(tp_agent *a, ag_peer *p, uint64_t n)
{
    if (n == 0) {
        return;
    }
    tp__mtx_lock(&a->a_mtx);
    TP_ASSERT(p->p_inflight >= n);
    p->p_inflight -= n;
    tp__mtx_unlock(&a->a_mtx);
}

// Loop thread: gives back what the message being read holds.
static void
conn_release(ag_conn *c)
{
    tp__ag_peer_release(c->c_agent, c->c_rpeer, c->c_rcharge);
    c->c_rcharge = 0;
    c->c_rpeer = NULL;
}

// Loop thread: checks the size that message @msg (header @h) announces
// against the caps, before anything of it is allocated, and counts it in
// its sender's bytes in flight. TP_EPROTO naming the peer and the cap.
static tp_status
conn_charge(ag_conn *c, const tp_message *msg, const ag_hdr *h,
            tp_error **err_p)
{
    tp_agent *a = c->c_agent;
    // The pipe bounds each length (TP_PIPE_MAX_*): the sum cannot wrap.
    uint64_t tbytes = 0, pbytes = 0;
    for (uint32_t i = 0; i < msg->npayloads; i++) {
        pbytes += msg->payloads[i].len;
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        tbytes += msg->tensors[i].len;
    }
    uint64_t total = msg->metadata_len + pbytes + tbytes;
    // The sender is checked against the pipe once the message is in; a
    // false claim closes the pipe then, and its charge is given back.
    ag_peer *p = c->c_peer != NULL ? c->c_peer : &a->a_peers[h->h_src_rank];
    const ag_kind_desc *kd = tp__ag_kind_get(h->h_kind);
    if (total > a->a_opts.max_message_bytes) {
        return tp__error_set(
            err_p, TP_EPROTO,
            "rpc %s of %" PRIu64 " bytes (%u tensors of %" PRIu64
            " bytes, %" PRIu64 " bytes of payload, %zu of metadata) from %s "
            "(rank %d) is above the cap of %" PRIu64
            " bytes per message (max_message_bytes, "
            "TP_RPC_MAX_MESSAGE_BYTES); nothing was allocated for it",
            kd->k_name, total, msg->ntensors, tbytes, pbytes, msg->metadata_len,
            p->p_info.name, p->p_info.rank, a->a_opts.max_message_bytes);
    }
    tp__mtx_lock(&a->a_mtx);
    uint64_t held = p->p_inflight;
    bool over = total > a->a_opts.max_peer_inflight_bytes - held;
    if (!over) {
        p->p_inflight += total;
    }
    tp__mtx_unlock(&a->a_mtx);
    if (over) {
        return tp__error_set(
            err_p, TP_EPROTO,
            "rpc %s of %" PRIu64 " bytes from %s (rank %d) while %" PRIu64
            " bytes it sent are held here is above the cap of %" PRIu64
            " bytes in flight per peer (max_peer_inflight_bytes, "
            "TP_RPC_MAX_PEER_INFLIGHT_BYTES); nothing was allocated for it",
            kd->k_name, total, p->p_info.name, p->p_info.rank, held,
            a->a_opts.max_peer_inflight_bytes);
    }
    c->c_rcharge = total;
    c->c_rpeer = p;
    return TP_OK;
}

// Loop thread: a descriptor arrived. Check it, allocate the tensors the
// message carries and read the rest.
static void
conn_desc_step(ag_conn *c)
{
    const tp_error *aerr = tp_aio_error(c->c_daio);
    if (aerr != NULL) {
        tp__ag_conn_fail(c, aerr);
        return;
    }
    tp_message *msg = tp_aio_get_output(c->c_daio, 0);
    c->c_rmsg = msg;
    if (msg->ntensors > c->c_metas_cap) {
        uint32_t cap = TP_MIN(msg->ntensors, (uint32_t)TP_RPC_MAX_TENSORS);
        ag_tensor_meta *m = tp__realloc(c->c_metas, cap * sizeof(*m));
        if (m == NULL && cap > 0) {
            tp__ag_conn_fail(c, tp__error_nomem());
            return;
        }
        c->c_metas = m;
        c->c_metas_cap = cap;
    }
    uint64_t lens_inline[16];
    uint64_t *lens = lens_inline;
    if (msg->ntensors > 16 && msg->ntensors <= TP_RPC_MAX_TENSORS) {
        lens = tp__alloc(msg->ntensors * sizeof(uint64_t));
        if (lens == NULL) {
            tp__ag_conn_fail(c, tp__error_nomem());
            return;
        }
    }
    ag_hdr h;
    tp_error *err = NULL;
    tp_status st;
    if (msg->ntensors > TP_RPC_MAX_TENSORS) {
        st = tp__error_set(&err, TP_EPROTO,
                           "rpc message with %u tensors (at most %d)",
                           msg->ntensors, TP_RPC_MAX_TENSORS);
    } else {
        for (uint32_t i = 0; i < msg->ntensors; i++) {
            lens[i] = msg->tensors[i].len;
        }
        st =
            tp__ag_wire_decode(msg->metadata, msg->metadata_len, msg->npayloads,
                               msg->ntensors, lens, &h, c->c_metas, &err);
    }
    if (lens != lens_inline) {
        tp__free(lens);
    }
    const ag_kind_desc *kd = st == TP_OK ? tp__ag_kind_get(h.h_kind) : NULL;
    if (st == TP_OK) {
        bool want_req = !c->c_outgoing;
        if (kd == NULL) {
            st = tp__error_set(&err, TP_EPROTO,
                               "rpc message of kind %u, which no protocol "
                               "of this agent handles",
                               (unsigned)h.h_kind);
        } else if (kd->k_request != want_req) {
            st = tp__error_set(&err, TP_EPROTO,
                               "rpc %s (kind %u) on a pipe that carries %s",
                               kd->k_name, (unsigned)h.h_kind,
                               want_req ? "requests" : "replies");
        } else if (h.h_kind == AG_KIND_ERROR && msg->npayloads == 1 &&
                   msg->payloads[0].len > AG_WIRE_MAX_ERRMSG) {
            st = tp__error_set(
                &err, TP_EPROTO, "rpc error reply of %llu bytes (at most %u)",
                (unsigned long long)msg->payloads[0].len, AG_WIRE_MAX_ERRMSG);
        } else if (h.h_src_rank >= (uint32_t)c->c_agent->a_world) {
            st = tp__error_set(&err, TP_EPROTO,
                               "rpc message from rank %u of a world of %d",
                               h.h_src_rank, c->c_agent->a_world);
        }
    }
    if (st == TP_OK) {
        st = conn_charge(c, msg, &h, &err);
    }
    if (st != TP_OK) {
        tp__ag_conn_protocol_error(c, err);
        tp_error_unref(err);
        return;
    }
    tp_args *args;
    if (tp__ag_args_create_empty(msg->ntensors, &args) != TP_OK) {
        conn_release(c);
        tp__ag_conn_fail(c, tp__error_nomem());
        return;
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const ag_tensor_meta *m = &c->c_metas[i];
        tp_tensor *t;
        // On the device the sender's device map chose (devmap.c); the
        // pipe says where it came from (a reply goes back there).
        st = tp_tensor_empty_on(m->tm_device, m->tm_dtype, m->tm_ndim,
                                m->tm_shape, &t, &err);
        tp_device src = msg->tensors[i].device;
        if (st == TP_OK && src.type != TP_DEVICE_CPU &&
            args->a_src_devs == NULL) {
            args->a_src_devs = tp__zalloc(msg->ntensors * sizeof(tp_device));
            if (args->a_src_devs == NULL) {
                tp_tensor_unref(t);
                st = tp__error_set(&err, TP_ENOMEM, "out of memory");
            }
        }
        if (st != TP_OK) {
            tp_args_unref(args);
            conn_release(c);
            tp_error *e = tp__error_new(
                st, 0, err, "rpc %s: tensor %u of a message from %s",
                ag_name(c->c_agent), i, tp_pipe_peer(c->c_pipe));
            if (m->tm_device.type == TP_DEVICE_CUDA) {
                // A device map to a device this worker lacks (not checked
                // at init when this worker set no CUDA options).
                TP_LOG_WARN("TP-RPC-DEVICE",
                            "%s (its device map sends it to cuda:%d); "
                            "closing that pipe",
                            tp_error_message(e), m->tm_device.index);
            }
            tp_error_unref(err);
            tp__ag_conn_fail(c, e);
            tp_error_unref(e);
            return;
        }
        if (args->a_src_devs != NULL) {
            args->a_src_devs[i] = src;
        }
        tp__ag_args_push_tensor(args, t);
        msg->tensors[i].data = m->tm_nbytes > 0 ? tp_tensor_data(t) : NULL;
        msg->tensors[i].device = m->tm_device;
    }
    c->c_rargs = args;
    // The header's pointers are into msg's metadata, which stays where it
    // is until the message is freed: the read step uses it as it is.
    c->c_rhdr = h;
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    tp_pipe_read(c->c_pipe, msg, c->c_raio);
}

static void
conn_desc_cb(void *arg)
{
    ag_conn *c = arg;
    conn_desc_step(c);
    tp__ag_conn_op_done(c);
}

// Whether the pipe of @c was opened by (or reached) the context of worker
// @p: an agent's pipe context is named after its worker, and the pipe
// names the peer "<context> at <url>". With a job secret, that context
// proved it belongs to the job (docs/security.md).
static bool
conn_peer_is(const ag_conn *c, const ag_peer *p)
{
    const char *peer = tp_pipe_peer(c->c_pipe);
    size_t n = strlen(p->p_info.name);
    return peer != NULL && strncmp(peer, p->p_info.name, n) == 0 &&
           strncmp(peer + n, " at ", 4) == 0;
}

// Loop thread: checks that @h comes from the peer of @c: an outgoing pipe
// carries its callee's replies; an incoming one the requests of the
// worker its first message named, which must be the worker whose context
// opened the pipe. A message claiming another worker's rank is refused.
static tp_status
conn_check_sender(ag_conn *c, const ag_hdr *h, tp_error **err_p)
{
    tp_agent *a = c->c_agent;
    ag_peer *sender = &a->a_peers[h->h_src_rank];
    if (!c->c_heard && !conn_peer_is(c, sender)) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc %s says it is from %s (rank %u), but the "
                             "pipe %s %s",
                             c->c_outgoing ? "reply" : "request",
                             sender->p_info.name, h->h_src_rank,
                             c->c_outgoing ? "reached" : "comes from",
                             tp_pipe_peer(c->c_pipe));
    }
    // c_peer is written once, before the pipe reads (outgoing) or here on
    // this loop thread (incoming): reading it here needs no lock.
    ag_peer *p = c->c_peer;
    if (p == NULL) {
        tp__mtx_lock(&a->a_mtx);
        c->c_peer = sender;
        tp__mtx_unlock(&a->a_mtx);
        p = sender;
    }
    if (p == sender && !c->c_heard) {
        // The first message of this pipe: the peer is alive, whatever an
        // earlier pipe's failure (a refused message, an injected fault)
        // made this worker think; the shutdown agreement waits for it.
        tp__mtx_lock(&a->a_mtx);
        c->c_heard = true;
        if (!c->c_failed) {
            p->p_dead = false;
        }
        tp__mtx_unlock(&a->a_mtx);
    }
    if (p != sender) {
        return tp__error_set(err_p, TP_EPROTO,
                             "rpc %s says it is from rank %u on a pipe %s "
                             "rank %d",
                             c->c_outgoing ? "reply" : "request", h->h_src_rank,
                             c->c_outgoing ? "to" : "from", p->p_info.rank);
    }
    return TP_OK;
}

// Loop thread: the rest of a message arrived.
static void
conn_read_step(ag_conn *c)
{
    tp_message *msg = c->c_rmsg;
    tp_args *args = c->c_rargs;
    c->c_rmsg = NULL;
    c->c_rargs = NULL;
    const tp_error *aerr = tp_aio_error(c->c_raio);
    if (aerr != NULL) {
        tp_args_unref(args);
        tp_message_destroy(msg);
        conn_release(c);
        tp__ag_conn_fail(c, aerr);
        return;
    }
    // Checked and decoded at the descriptor; its pointers are into the
    // metadata that the args now keep.
    const ag_hdr h = c->c_rhdr;
    args->a_msg = msg;
    if (msg->npayloads == 1) {
        args->a_bytes = msg->payloads[0].data;
        args->a_len = msg->payloads[0].len;
    }
    tp_error *err = NULL;
    tp_status st = conn_check_sender(c, &h, &err);
    if (st == TP_OK && h.h_kind != AG_KIND_ERROR) {
        // The protocols read their sections (RRefs in the args).
        st = tp__ag_proto_recv(c->c_agent, (int)h.h_src_rank, &h, args, &err);
    }
    if (st != TP_OK) {
        tp_args_unref(args);
        conn_release(c);
        if (st == TP_EPROTO) {
            tp__ag_conn_protocol_error(c, err);
        } else {
            tp__ag_conn_fail(c, err);
        }
        tp_error_unref(err);
        return;
    }
    // A request's ag_req takes the charge; anything else is handed over
    // (or dropped) by the time its dispatch returns.
    tp__ag_kind_get(h.h_kind)->k_dispatch(c, &h, args);
    conn_release(c);
    bool failed;
    tp__mtx_lock(&c->c_agent->a_mtx);
    failed = c->c_failed;
    tp__mtx_unlock(&c->c_agent->a_mtx);
    if (!failed) {
        ag_conn_read_next(c);
    }
}

static void
conn_read_cb(void *arg)
{
    ag_conn *c = arg;
    conn_read_step(c);
    tp__ag_conn_op_done(c);
}

// Loop thread: a peer connected to us.
void
tp__ag_accept_cb(void *arg)
{
    tp_agent *a = arg;
    if (tp_aio_error(a->a_accept_aio) != NULL) {
        TP_LOG_DEBUG("TP-RPC-ACCEPT", "rpc %s: accept ended: %s", ag_name(a),
                     tp_error_message(tp_aio_error(a->a_accept_aio)));
        return; // listener closed (shutdown) or failed
    }
    tp_pipe *pipe = tp_aio_get_output(a->a_accept_aio, 0);
    ag_conn *c = ag_conn_create(a, pipe, false);
    tp__mtx_lock(&a->a_mtx);
    bool closed = a->a_state == AG_CLOSED;
    if (c != NULL && !closed) {
        c->c_next = a->a_conns;
        a->a_conns = c;
    }
    tp__mtx_unlock(&a->a_mtx);
    if (c == NULL || closed) {
        if (c != NULL) {
            c->c_pipe = NULL;
            tp__ag_conn_free(c);
        }
        tp_pipe_close(pipe);
        tp_pipe_unref(pipe);
    } else {
        ag_conn_read_next(c);
    }
    if (!closed) {
        tp_pipe_listener_accept(a->a_listener, a->a_accept_aio);
    }
}

// The URL to dial for @p: the first of a transport this context has (tcp
// before shm: a tcp connection between two processes of one host moves to
// shm in the handshake when both allow it). NULL if none.
static const char *
peer_pick_url(const tp_agent *a, const ag_peer *p)
{
    for (int i = 0; i < p->p_nurls; i++) {
        const char *u = p->p_urls[i];
        const char *colon = strchr(u, ':');
        char scheme[16];
        size_t n = colon != NULL ? (size_t)(colon - u) : 0;
        if (n == 0 || n >= sizeof(scheme)) {
            continue;
        }
        memcpy(scheme, u, n);
        scheme[n] = '\0';
        if (tp_pipe_listener_addr(a->a_listener, scheme) != NULL) {
            return u;
        }
    }
    return NULL;
}

// A new outgoing connection to @p (no lock held: tp_context_connect waits
// for the loop thread, whose callbacks take a_mtx). The pipe connects in
// the background; writes queue until it is ready.
static ag_conn *
conn_connect(tp_agent *a, ag_peer *p, tp_error **err_p)
{
    const char *url = peer_pick_url(a, p);
    if (url == NULL) {
        tp__error_set(err_p, TP_EUNREACHABLE,
                      "no transport in common with %s (rank %d): it "
                      "listens on %s%s",
                      p->p_info.name, p->p_info.rank,
                      p->p_nurls > 0 ? p->p_urls[0] : "nothing",
                      p->p_nurls > 1 ? " and more" : "");
        return NULL;
    }
    tp_pipe *pipe;
    if (tp_context_connect(a->a_ctx, url, &pipe, err_p) != TP_OK) {
        return NULL;
    }
    ag_conn *c = ag_conn_create(a, pipe, true);
    if (c == NULL) {
        tp_pipe_close(pipe);
        tp_pipe_unref(pipe);
        tp__error_set(err_p, TP_ENOMEM, "out of memory");
        return NULL;
    }
    c->c_peer = p;
    snprintf(c->c_url, sizeof(c->c_url), "%s", url);
    return c;
}

// Called with a_mtx held; returns with it held (it may drop it to
// connect). The outgoing connection to @p, or NULL with *@err_p. A new
// connection starts reading replies before it is returned.
ag_conn *
tp__ag_conn_get_locked(tp_agent *a, ag_peer *p, tp_error **err_p)
{
    if (p->p_out != NULL) {
        return p->p_out;
    }
    // Connecting is rare: a good time to free failed connections that
    // nothing uses any more (a peer that restarts or keeps failing must
    // not make the agent grow).
    ag_conn *dead = NULL;
    for (ag_conn **cp = &a->a_conns; *cp != NULL;) {
        ag_conn *x = *cp;
        if (x->c_failed &&
            atomic_load_explicit(&x->c_ops, memory_order_acquire) == 0) {
            *cp = x->c_next;
            x->c_next = dead;
            dead = x;
        } else {
            cp = &x->c_next;
        }
    }
    tp__mtx_unlock(&a->a_mtx);
    while (dead != NULL) {
        ag_conn *x = dead;
        dead = x->c_next;
        tp__ag_conn_free(x);
    }
    ag_conn *c = conn_connect(a, p, err_p);
    tp__mtx_lock(&a->a_mtx);
    if (c == NULL) {
        return NULL;
    }
    if (p->p_out != NULL || a->a_state == AG_CLOSED) {
        // Another thread connected meanwhile (or we shut down): ours goes.
        ag_conn *mine = c;
        tp__mtx_unlock(&a->a_mtx);
        tp_pipe_close(mine->c_pipe);
        tp__ag_conn_free(mine);
        tp__mtx_lock(&a->a_mtx);
        if (a->a_state == AG_CLOSED) {
            tp__error_set(err_p, TP_ECLOSED, "the agent is shut down");
            return NULL;
        }
        if (p->p_out == NULL) {
            // The other thread's connection failed meanwhile.
            tp__error_set(err_p, TP_ECONNRESET,
                          "the connection to %s (rank %d) failed while this "
                          "call was connecting",
                          p->p_info.name, p->p_info.rank);
            return NULL;
        }
        return p->p_out;
    }
    c->c_next = a->a_conns;
    a->a_conns = c;
    p->p_out = c;
    // Reading replies starts now (queued until the pipe is ready); the
    // submission posts to the loop and never runs a callback inline.
    ag_conn_read_next(c);
    return c;
}
