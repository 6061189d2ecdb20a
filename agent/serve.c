// SPDX-License-Identifier: Apache-2.0
// serve.c - incoming messages and handlers. A request goes to the pool
// (handlers never run on a loop thread) and its handler's result goes back
// as a RESPONSE or ERROR message; a reply resolves its pending call.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ag_impl.h"
#include "proto.h"
#include "core/alloc.h"
#include "core/hash.h"
#include "core/log.h"

static void req_async_done(tp_future *f, void *arg);

// Drops request @r (answered or not): its args, its hold on the
// connection and on the agent.
static void
req_free(ag_req *r)
{
    tp_agent *a = r->r_agent;
    tp_args_unref(r->r_args);
    tp__ag_peer_release(a, r->r_caller, r->r_charge);
    if (r->r_conn != NULL) {
        atomic_fetch_sub_explicit(&r->r_conn->c_reqs, 1, memory_order_relaxed);
        tp__ag_conn_op_done(r->r_conn);
    }
    tp__free(r);
    tp__ag_agent_unref(a);
}

// Loop thread: a protocol's handler found message @kind from the peer of
// @c malformed (TP_EPROTO): that pipe closes, naming the peer, as for a
// malformed agent header. False (and nothing done) for other errors.
static bool
proto_malformed(ag_conn *c, const ag_kind_desc *kd, const tp_error *err)
{
    if (err == NULL || tp_error_status(err) != TP_EPROTO) {
        return false;
    }
    tp_error *e = tp__error_new(TP_EPROTO, 0, err, "%s", kd->k_name);
    tp__ag_conn_protocol_error(c, e);
    tp_error_unref(e);
    return true;
}

// Loop thread: a notification: its handler runs here; nothing answers.
static void
serve_note(ag_conn *c, const ag_kind_desc *kd, const ag_hdr *h, tp_args *args)
{
    tp_agent *a = c->c_agent;
    void *state = tp__ag_proto_state_at(a, kd->k_proto_idx);
    tp__proto_msg m = {
        .pm_agent = a,
        .pm_from = c->c_peer->p_info.rank,
        .pm_kind = (uint8_t)h->h_kind,
        .pm_hdr = h->h_sec[0],
        .pm_hdr_len = h->h_sec_len[0],
        .pm_args = args,
    };
    void *ctx = NULL;
    tp_args *result = NULL;
    tp_error *err = NULL;
    if (state != NULL) {
        tp__proto_verdict v =
            kd->k_proto->pk_on_loop(state, &m, &ctx, &result, &err);
        TP_ASSERT(v == TP__PROTO_DONE);
    }
    if (err != NULL && !proto_malformed(c, kd, err)) {
        TP_LOG_DEBUG("TP-RPC-NOTE", "rpc %s: %s from %s: %s", ag_name(a),
                     kd->k_name, c->c_peer->p_info.name, tp_error_message(err));
    }
    tp_error_unref(err);
    tp_args_unref(result);
    tp_args_unref(args);
}

// What a protocol's handler sees of request @r.
static void
req_proto_msg(ag_req *r, tp__proto_msg *m)
{
    memset(m, 0, sizeof(*m));
    m->pm_agent = r->r_agent;
    m->pm_from = r->r_caller->p_info.rank;
    m->pm_kind = (uint8_t)r->r_kind;
    m->pm_hdr = r->r_hdr;
    m->pm_hdr_len = r->r_hdr_len;
    m->pm_name = r->r_fn_name_len > 0 ? r->r_fn_name : NULL;
    m->pm_name_len = r->r_fn_name_len;
    m->pm_args = r->r_args;
}

// Loop thread: the first step of a protocol's message. False when it was
// answered here (@r is gone); true when it goes on to the pool.
static bool
req_proto_on_loop(ag_req *r)
{
    const ag_kind_desc *kd = tp__ag_kind_get(r->r_kind);
    void *state = tp__ag_proto_state_at(r->r_agent, kd->k_proto_idx);
    tp__proto_msg m;
    req_proto_msg(r, &m);
    void *ctx = NULL;
    tp_args *result = NULL;
    tp_error *err = NULL;
    tp__proto_verdict v =
        state != NULL ? kd->k_proto->pk_on_loop(state, &m, &ctx, &result, &err)
                      : TP__PROTO_DONE;
    if (v == TP__PROTO_RUN) {
        r->r_proto_ctx = ctx;
        return true;
    }
    if (v == TP__PROTO_WAIT) {
        // Answered by whoever resolves the future (a pool thread).
        if (tp_future_then(ctx, req_async_done, r) != TP_OK) {
            tp_future_unref(ctx);
            err = tp__error_new(TP_ENOMEM, 0, NULL, "%s on %s", kd->k_name,
                                ag_name(r->r_agent));
            tp__ag_req_reply(r, NULL, err);
            tp_error_unref(err);
        }
        return false;
    }
    if (state == NULL) {
        err = tp__error_new(TP_ECLOSED, 0, NULL, "%s: the agent is shut down",
                            kd->k_name);
    }
    if (err != NULL) {
        tp_args_unref(result);
        result = NULL;
    }
    if (proto_malformed(r->r_conn, kd, err)) {
        req_free(r);
        tp_error_unref(err);
        return false;
    }
    tp__ag_req_reply(r, result, err);
    tp_error_unref(err);
    return false;
}

// Loop thread: a request arrived; hand it to the pool.
void
tp__ag_serve_request(ag_conn *c, const ag_hdr *h, tp_args *args)
{
    tp_agent *a = c->c_agent;
    ag_peer *caller = c->c_peer; // checked against h_src_rank

    const ag_kind_desc *kd = tp__ag_kind_get(h->h_kind);
    tp__mtx_lock(&a->a_mtx);
    bool closed = a->a_state == AG_CLOSED;
    caller->p_stats.s_calls_received++;
    caller->p_stats.s_bytes_received += tp__ag_args_nbytes(args);
    a->a_activity++;
    a->a_notes_recv += kd->k_note ? 1 : 0;
    tp__mtx_unlock(&a->a_mtx);
    if (closed) {
        tp_args_unref(args);
        return;
    }
    if (kd->k_note) {
        serve_note(c, kd, h, args);
        return;
    }
    ag_req *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        tp_args_unref(args);
        tp__ag_conn_fail(c, tp__error_nomem());
        return;
    }
    atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_reqs, 1, memory_order_relaxed);
    r->r_agent = a;
    r->r_conn = c;
    r->r_caller = caller;
    r->r_kind = h->h_kind;
    r->r_call_id = h->h_call_id;
    r->r_fn_id = h->h_fn_id;
    r->r_args = args;
    r->r_hdr = h->h_sec[0];
    r->r_hdr_len = h->h_sec_len[0];
    memcpy(r->r_fn_name, h->h_fn_name, h->h_fn_name_len);
    r->r_fn_name[h->h_fn_name_len] = '\0';
    r->r_fn_name_len = h->h_fn_name_len;
    // The request holds its bytes in flight until its reply is sent.
    r->r_charge = c->c_rcharge;
    c->c_rcharge = 0;
    if (r->r_kind != AG_KIND_REQUEST && !req_proto_on_loop(r)) {
        return; // answered here, on the loop thread
    }
    tp__task_init(&r->r_task, tp__ag_req_run, r);
    if (tp__pool_submit(a->a_pool, &r->r_task) != TP_OK) {
        // Shutting down: the caller's call fails with our pipe's close.
        c->c_rcharge = r->r_charge; // given back by the read step
        tp_args_unref(args);
        tp__free(r);
        atomic_fetch_sub_explicit(&c->c_reqs, 1, memory_order_relaxed);
        tp__ag_conn_op_done(c);
        tp__ag_agent_unref(a);
    }
}

// Loop thread: a reply arrived; resolve its call (dropped if the call
// already ended: timed out, or failed).
void
tp__ag_serve_reply(ag_conn *c, const ag_hdr *h, tp_args *args)
{
    tp_agent *a = c->c_agent;
    tp_error *err = NULL;
    tp_status st = TP_OK;

    if (h->h_kind == AG_KIND_ERROR) {
        st = (tp_status)h->h_status;
    }
    tp__mtx_lock(&a->a_mtx);
    ag_call *call = tp__ag_pending_take_locked(a, h->h_call_id, c, st);
    if (call != NULL) {
        call->c_peer->p_stats.s_bytes_received += tp__ag_args_nbytes(args);
    }
    tp__mtx_unlock(&a->a_mtx);
    if (call == NULL) {
        TP_LOG_DEBUG("TP-RPC-LATE",
                     "rpc %s: dropped a reply to call %" PRIu64
                     " that already ended (timed out or failed)",
                     ag_name(a), h->h_call_id);
        tp_args_unref(args);
        return;
    }
    if (h->h_kind == AG_KIND_ERROR) {
        size_t len = 0;
        const char *text = tp_args_bytes(args, &len);
        err = tp__error_new(st, 0, NULL, "rpc \"%s\" on %s (rank %d): %.*s",
                            call->c_fn_name, call->c_peer->p_info.name,
                            call->c_peer->p_info.rank, (int)len,
                            text != NULL ? text : "");
        tp_args_unref(args);
        args = NULL;
    }
    tp__ag_call_finish(call, args, err);
}

// ---- handlers ------------------------------------------------------------

// Sends the reply of @r on its connection (any thread): the result
// @result (taken) or @err (borrowed). TP_OK also when there is nothing to
// send on (shutting down, the pipe failed); else the error of a message
// that could not be built, in *@err_p.
static tp_status
req_send(ag_req *r, tp_args *result, const tp_error *err, tp_error **err_p)
{
    tp_agent *a = r->r_agent;
    ag_conn *c = r->r_conn;
    char *errmsg = NULL;
    tp_args *holder = NULL; // keeps errmsg alive until the write is done
    ag_hdr h;
    memset(&h, 0, sizeof(h));
    h.h_call_id = r->r_call_id;
    h.h_src_rank = (uint32_t)a->a_rank;
    if (err != NULL) {
        h.h_kind = AG_KIND_ERROR;
        tp_status st = tp_error_status(err);
        // The caller's connection is fine: a handler's connection- or
        // context-scope status arrives as TP_EIO.
        h.h_status = (st < 0 && st > -20) ? st : TP_EIO;
        errmsg = tp__asprintf("%.*s", (int)(AG_WIRE_MAX_ERRMSG - 1),
                              tp_error_message(err));
        tp_args_unref(result);
        result = NULL;
        if (errmsg == NULL || tp__ag_args_create_empty(0, &holder) != TP_OK) {
            tp__free(errmsg);
            return tp__error_set(err_p, TP_ENOMEM, "out of memory");
        }
        holder->a_owned = errmsg;
        result = holder; // no bytes, no tensors: only owns errmsg
    } else {
        h.h_kind = AG_KIND_RESPONSE;
        uint64_t nb = tp__ag_args_nbytes(result);
        if (nb > a->a_opts.max_message_bytes) {
            // The caller would refuse it: it gets this error instead.
            tp_args_unref(result);
            return tp__error_set(err_p, TP_EINVAL,
                                 "the result is %" PRIu64
                                 " bytes, above the cap of %" PRIu64
                                 " bytes per message (max_message_bytes)",
                                 nb, a->a_opts.max_message_bytes);
        }
    }
    tp__mtx_lock(&a->a_mtx);
    ag_wslot *w = NULL;
    if (a->a_state != AG_CLOSED && !c->c_failed) {
        w = tp__ag_slot_get_locked(c);
        if (w != NULL) {
            atomic_fetch_add_explicit(&a->a_writers, 1, memory_order_acquire);
            uint64_t nb = tp__ag_args_nbytes(result);
            if (c->c_peer != NULL) {
                c->c_peer->p_stats.s_bytes_sent += nb;
            }
            w->w_fr_seq = tp__ag_fr_begin_locked(
                a, h.h_kind, c->c_peer != NULL ? c->c_peer->p_info.rank : -1,
                r->r_call_id, r->r_fn_name,
                nb + (errmsg != NULL ? strlen(errmsg) : 0), false, 0);
        }
    }
    tp__mtx_unlock(&a->a_mtx);
    if (w == NULL) {
        tp_args_unref(result); // shutting down, or the pipe failed
        return TP_OK;
    }
    tp_status st = tp__ag_slot_send(w, &h, false, NULL, 0, result, r->r_args,
                                    errmsg, err_p);
    if (st != TP_OK) {
        tp__mtx_lock(&a->a_mtx);
        tp__ag_slot_put_locked(w);
        tp__mtx_unlock(&a->a_mtx);
    }
    tp__ag_writers_exit(a);
    return st;
}

// Sends the reply of @r (any thread): the result @result (taken) or
// @err (borrowed), then frees @r.
void
tp__ag_req_reply(ag_req *r, tp_args *result, const tp_error *err)
{
    tp_agent *a = r->r_agent;

    if (r->r_conn == NULL) {
        // A call to self: complete it here.
        tp_status st = err != NULL ? tp_error_status(err) : TP_OK;
        tp__mtx_lock(&a->a_mtx);
        ag_call *call = tp__ag_pending_take_locked(a, r->r_call_id, NULL, st);
        tp__mtx_unlock(&a->a_mtx);
        if (call != NULL) {
            tp_error *e = NULL;
            if (err != NULL) {
                // As for a remote caller: the call's own connection is
                // fine, a handler's connection- or context-scope status
                // arrives as TP_EIO.
                st = (st < 0 && st > -20) ? st : TP_EIO;
                e = tp__error_new(st, 0, NULL, "rpc \"%s\" on %s (rank %d): %s",
                                  call->c_fn_name, ag_name(a), a->a_rank,
                                  tp_error_message(err));
            }
            tp__ag_call_finish(call, result, e);
        } else {
            tp_args_unref(result);
        }
    } else {
        tp_error *serr = NULL;
        bool was_result = err == NULL;
        tp_status st = req_send(r, result, err, &serr);
        if (st != TP_OK && was_result) {
            // The result could not be sent (memory, a protocol's refusal
            // of an object in it): the caller gets that error instead.
            tp_error *e = tp__error_new(
                st, 0, serr, "%s could not send the result", ag_name(a));
            tp_error_unref(serr);
            serr = NULL;
            st = req_send(r, NULL, e, &serr);
            tp_error_unref(e);
        }
        if (st != TP_OK) {
            // The caller will time out; tell why here.
            TP_LOG_ERROR("TP-RPC-REPLY",
                         "rpc %s: could not send the reply to call %" PRIu64
                         ": %s",
                         ag_name(a), r->r_call_id, tp_error_message(serr));
        }
        tp_error_unref(serr);
    }
    req_free(r);
}

// Loop thread: a message could not be sent for a reason of its own (a
// pipe limit, memory). A request fails its call; a result is replaced by
// an error reply, so the caller learns why instead of waiting for its
// deadline; a failed error reply is only logged.
void
tp__ag_write_failed_locally(ag_conn *c, ag_kind kind, uint64_t call_id,
                            const tp_error *err)
{
    tp_agent *a = c->c_agent;
    char who[AG_MAX_URL + 160];
    tp__ag_conn_describe(c, who, sizeof(who));
    const ag_kind_desc *kd = tp__ag_kind_get(kind);
    if (kd->k_note) {
        TP_LOG_WARN("TP-RPC-NOTE", "rpc %s: %s to %s not sent: %s", ag_name(a),
                    kd->k_name, who, tp_error_message(err));
        return;
    }
    // A request of any kind (a function's or a protocol's) fails its own
    // call; only a reply is answered with an error reply.
    if (kd->k_request) {
        tp_status st = tp_error_status(err);
        tp__mtx_lock(&a->a_mtx);
        ag_call *call = tp__ag_pending_take_locked(a, call_id, c, st);
        tp__mtx_unlock(&a->a_mtx);
        if (call != NULL) {
            tp__ag_call_finish(
                call, NULL,
                tp__error_new(st, 0, err,
                              "rpc \"%s\" from %s to %s: sending "
                              "the request",
                              call->c_fn_name, ag_name(a), who));
        }
        return;
    }
    if (kind == AG_KIND_ERROR) {
        TP_LOG_WARN("TP-RPC-REPLY",
                    "rpc %s: could not send the error reply to call %" PRIu64
                    " of %s: %s",
                    ag_name(a), call_id, who, tp_error_message(err));
        return;
    }
    ag_req *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        TP_LOG_ERROR("TP-RPC-REPLY",
                     "rpc %s: could not send the reply to call %" PRIu64
                     " of %s: %s (and no memory to say so)",
                     ag_name(a), call_id, who, tp_error_message(err));
        return;
    }
    atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_reqs, 1, memory_order_relaxed);
    r->r_agent = a;
    r->r_conn = c;
    r->r_call_id = call_id;
    tp_error *e = tp__error_new(tp_error_status(err), 0, err,
                                "%s could not send the result", ag_name(a));
    tp__ag_req_reply(r, NULL, e);
    tp_error_unref(e);
}

// Future callback of an async handler (on the thread that resolved it).
static void
req_async_done(tp_future *f, void *arg)
{
    ag_req *r = arg;
    const tp_error *err = tp_future_error(f);
    tp_args *result = NULL;
    if (err == NULL && tp_future_value(f) != NULL) {
        result = tp_args_ref(tp_future_value(f));
    }
    tp__ag_req_reply(r, result, err);
    tp_future_unref(f);
}

// Pool thread: the second step of a protocol's message.
static void
req_proto_run(ag_req *r)
{
    const ag_kind_desc *kd = tp__ag_kind_get(r->r_kind);
    void *state = tp__ag_proto_state_at(r->r_agent, kd->k_proto_idx);
    tp__proto_msg m;
    req_proto_msg(r, &m);
    tp_future *f =
        state != NULL ? kd->k_proto->pk_run(state, &m, r->r_proto_ctx) : NULL;
    if (f == NULL || tp_future_then(f, req_async_done, r) != TP_OK) {
        tp_future_unref(f);
        tp_error *err =
            tp__error_new(state != NULL ? TP_ENOMEM : TP_ECLOSED, 0, NULL,
                          "%s on %s", kd->k_name, ag_name(r->r_agent));
        tp__ag_req_reply(r, NULL, err);
        tp_error_unref(err);
    }
}

// The function registered as @name (@id: its hash), or NULL with an error
// naming the function and worker @a.
static const ag_fn *
fn_find(tp_agent *a, uint64_t id, const char *name, tp_error **err_p)
{
    const ag_fn *fn = tp__ag_registry_find(id);
    if (fn == NULL || strcmp(fn->fn_name, name) != 0) {
        *err_p = tp__error_new(TP_ENOENT, 0, NULL,
                               "function \"%s\" is not registered on %s "
                               "(rank %d)",
                               name, ag_name(a), a->a_rank);
        return NULL;
    }
    return fn;
}

// Runs the synchronous handler @fn: TP_OK with its result in *@out_p, or
// its failure with an error carrying that status (the handler's own, or
// one naming @fn).
static tp_status
fn_call_sync(const ag_fn *fn, const tp_rpc_call_info *ci, const tp_args *in,
             tp_args **out_p, tp_error **err_p)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    tp_status st = fn->fn_sync(ci, in, fn->fn_arg, &out, &err);
    if (st == TP_OK) {
        tp_error_unref(err); // a success with an error object: ignored
        *out_p = out;
        return TP_OK;
    }
    tp_args_unref(out);
    if (err == NULL) {
        err = tp__error_new(st, 0, NULL, "function \"%s\" failed: %s",
                            fn->fn_name, tp_status_describe(st));
    } else if (tp_error_status(err) != st) {
        tp_error *e = tp__error_new(st, 0, err, "function \"%s\"", fn->fn_name);
        tp_error_unref(err);
        err = e;
    }
    *err_p = err;
    return st;
}

static tp_error *
fn_no_future(const ag_fn *fn)
{
    return tp__error_new(TP_ENOMEM, 0, NULL,
                         "async function \"%s\" returned no future",
                         fn->fn_name);
}

// Pool thread: run the handler of @r.
void
tp__ag_req_run(void *arg)
{
    ag_req *r = arg;
    tp_agent *a = r->r_agent;
    tp_error *err = NULL;
    if (r->r_kind != AG_KIND_REQUEST) {
        req_proto_run(r);
        return;
    }
    const ag_fn *fn = fn_find(a, r->r_fn_id, r->r_fn_name, &err);
    if (fn == NULL) {
        tp__ag_req_reply(r, NULL, err);
        tp_error_unref(err);
        return;
    }
    r->r_info.agent = a;
    r->r_info.fn_name = fn->fn_name;
    r->r_info.caller = &r->r_caller->p_info;
    r->r_info.call_id = r->r_call_id;
    tp_args *out = NULL;
    void *toks[TP__PROTO_MAX];
    tp__agent_run_begin(a, r->r_args, toks);
    if (fn->fn_async != NULL) {
        tp_future *f = fn->fn_async(&r->r_info, r->r_args, fn->fn_arg);
        tp__agent_run_end(a, toks);
        if (f != NULL && tp_future_then(f, req_async_done, r) == TP_OK) {
            return;
        }
        err = f == NULL ? fn_no_future(fn)
                        : tp__error_new(TP_ENOMEM, 0, NULL, "function \"%s\"",
                                        fn->fn_name);
        tp_future_unref(f);
    } else {
        fn_call_sync(fn, &r->r_info, r->r_args, &out, &err);
        tp__agent_run_end(a, toks);
    }
    tp__ag_req_reply(r, out, err);
    tp_error_unref(err);
}

tp_future *
tp__agent_run_fn(tp_agent *a, int caller, const char *name, const tp_args *in)
{
    tp_error *err = NULL;
    tp_args *out = NULL;
    const ag_fn *fn = fn_find(a, tp__hash64(name, strlen(name)), name, &err);
    if (fn != NULL) {
        tp_rpc_call_info ci = {
            .agent = a,
            .fn_name = fn->fn_name,
            .caller = tp__agent_worker(a, caller),
        };
        void *toks[TP__PROTO_MAX];
        tp__agent_run_begin(a, in, toks);
        tp_status st = TP_OK;
        if (fn->fn_async != NULL) {
            tp_future *f = fn->fn_async(&ci, in, fn->fn_arg);
            tp__agent_run_end(a, toks);
            if (f != NULL) {
                tp__agent_bind_future(a, f);
                return f;
            }
            err = fn_no_future(fn);
        } else {
            st = fn_call_sync(fn, &ci, in, &out, &err);
            tp__agent_run_end(a, toks);
        }
        if (st != TP_OK) {
            tp_error *e = tp__error_new(tp_error_status(err), 0, err,
                                        "function \"%s\" on %s (rank %d)",
                                        fn->fn_name, ag_name(a), a->a_rank);
            tp_error_unref(err);
            err = e;
        }
    }
    tp_future *f = NULL;
    if (tp_future_create(&f) == TP_OK) {
        tp__agent_bind_future(a, f);
        if (err != NULL) {
            tp_future_set_error(f, err);
        } else {
            tp_future_set_value(f, out, (tp_future_free_fn)tp_args_unref);
            out = NULL;
        }
    }
    tp_args_unref(out);
    tp_error_unref(err);
    return f;
}
