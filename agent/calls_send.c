// SPDX-License-Identifier: Apache-2.0
// calls_send.c - making an outgoing call: the checks, the call put in the
// pending table (calls.c), its message written or, to this worker itself,
// its request run on the pool; messages and notifications of the
// protocols' kinds.

#include <inttypes.h>
#include <string.h>

#include "ag_impl.h"
#include "proto.h"
#include "core/alloc.h"
#include "core/hash.h"

int64_t
tp__ag_call_timeout(const tp_agent *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->a_opts.rpc_timeout_ms : timeout_ms;
}

// ---- calls ---------------------------------------------------------------

tp_future *
tp__ag_future_failed(tp_error *err)
{
    tp_future *f;
    if (tp_future_create(&f) != TP_OK) {
        tp_error_unref(err);
        return NULL;
    }
    tp_future_set_error(f, err);
    tp_error_unref(err);
    return f;
}

// What a call sends: a REQUEST of a registered function, or a message of
// a protocol's kind with its header.
typedef struct ag_callspec {
    ag_kind cs_kind;
    const char *cs_name; // the function (REQUEST) or an optional name
    const void *cs_hdr;  // protocol kinds: section 0
    size_t cs_hdr_len;
    const char *cs_what; // for messages: the function or the kind's name
    bool cs_nowait;      // fail with TP_EAGAIN rather than connect
} ag_callspec;

// Called with a_mtx held (it may drop it to connect): a write slot on the
// outgoing connection to @p, or NULL with *@err_p (TP_EAGAIN with @nowait
// when that would mean connecting).
static ag_wslot *
call_slot_locked(tp_agent *a, ag_peer *p, bool nowait, tp_error **err_p)
{
    if (nowait && p->p_out == NULL) {
        tp__error_set(err_p, TP_EAGAIN, "no connection yet");
        return NULL;
    }
    ag_conn *conn = tp__ag_conn_get_locked(a, p, err_p);
    if (conn == NULL) {
        return NULL;
    }
    ag_wslot *w = tp__ag_slot_get_locked(conn);
    if (w == NULL) {
        tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    return w;
}

static tp_future *
agent_call(tp_agent *a, ag_peer *p, const ag_callspec *cs, const tp_args *in,
           int64_t timeout_ms)
{
    const char *fn_name = cs->cs_name;
    size_t fnlen = fn_name != NULL ? strlen(fn_name) : 0;
    bool named = cs->cs_kind == AG_KIND_REQUEST || fnlen > 0;
    if (named && (fn_name == NULL || !tp__ag_fn_name_valid(fn_name, fnlen))) {
        return tp__ag_future_failed(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rpc from %s to %s: malformed function name \"%s\"", ag_name(a),
            p->p_info.name, fn_name != NULL ? fn_name : "(null)"));
    }
    bool self = p == a->a_self;
    if (self && cs->cs_kind != AG_KIND_REQUEST) {
        return tp__ag_future_failed(tp__error_new(
            TP_EINVAL, 0, NULL, "rpc %s: a %s message to this worker itself",
            ag_name(a), cs->cs_what));
    }
    uint64_t nbytes = tp__ag_args_nbytes(in);
    if (!self && nbytes > a->a_opts.max_message_bytes) {
        // The callee would refuse it and close the pipe: fail only this
        // call, here (the caps are usually the same on every worker).
        return tp__ag_future_failed(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rpc \"%s\" from %s to %s (rank %d): its arguments are %" PRIu64
            " bytes, above the cap of %" PRIu64
            " bytes per message (max_message_bytes)",
            cs->cs_what, ag_name(a), p->p_info.name, p->p_info.rank, nbytes,
            a->a_opts.max_message_bytes));
    }
    ag_call *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return tp__ag_future_failed(tp__error_nomem());
    }
    if (tp_future_create(&c->c_fut) != TP_OK) {
        tp__free(c);
        return tp__ag_future_failed(tp__error_nomem());
    }
    size_t wlen = strlen(cs->cs_what);
    wlen = wlen < sizeof(c->c_fn_name) ? wlen : sizeof(c->c_fn_name) - 1;
    memcpy(c->c_fn_name, cs->cs_what, wlen);
    c->c_fn_name[wlen] = '\0';
    c->c_peer = p;
    c->c_timeout_ms = tp__ag_call_timeout(a, timeout_ms);
    // The call may end (and be freed) as soon as it is in the table: its
    // id is kept here for what follows.
    const uint64_t id =
        atomic_fetch_add_explicit(&a->a_next_id, 1, memory_order_relaxed);
    c->c_id = id;
    tp_future *result = tp_future_ref(c->c_fut);

    // A call to self runs on the pool with a copy of the arguments, as a
    // remote worker would see them.
    ag_req *r = NULL;
    tp_args *copy = NULL;
    tp_error *err = NULL;
    if (self) {
        r = tp__zalloc(sizeof(*r));
        if (r == NULL || tp__ag_args_clone(in, &copy, &err) != TP_OK) {
            tp__free(r);
            tp__ag_call_finish(c, NULL, err != NULL ? err : tp__error_nomem());
            return result;
        }
    }

    tp__mtx_lock(&a->a_mtx);
    if (a->a_state == AG_CLOSED) {
        tp__mtx_unlock(&a->a_mtx);
        tp__free(r);
        tp_args_unref(copy);
        tp__ag_call_finish(
            c, NULL,
            tp__error_new(TP_ECLOSED, 0, NULL,
                          "rpc \"%s\" from %s to %s: the agent is "
                          "shut down",
                          cs->cs_what, ag_name(a), p->p_info.name));
        return result;
    }
    // An RPC future is bound to the pool (its callbacks are user code),
    // under the lock: a_pool is stable while the agent is not closed. A
    // protocol's is not (proto.h): its callbacks run where it resolves.
    if (cs->cs_kind == AG_KIND_REQUEST) {
        tp__future_set_pool(c->c_fut, a->a_pool);
    }
    tp_pool *pool = a->a_pool;
    // Counted before the connection may be made (unlocked) or the pool
    // used: shutdown keeps the context and the pool until every such
    // thread is out.
    atomic_fetch_add_explicit(&a->a_writers, 1, memory_order_acquire);
    ag_wslot *w = NULL;
    if (!self) {
        w = call_slot_locked(a, p, cs->cs_nowait, &err);
        if (w == NULL) {
            tp__mtx_unlock(&a->a_mtx);
            tp__ag_writers_exit(a);
            tp_status st = tp_error_status(err);
            tp_error *e = tp__error_new(st, 0, err,
                                        "rpc \"%s\" from %s to %s "
                                        "(rank %d)",
                                        cs->cs_what, ag_name(a), p->p_info.name,
                                        p->p_info.rank);
            tp_error_unref(err);
            tp__ag_call_finish(c, NULL, e);
            return result;
        }
        c->c_conn = w->w_conn;
        p->p_stats.s_bytes_sent += tp__ag_args_nbytes(in);
    }
    c->c_start_ns = tp__now_ns();
    // tp__deadline_after_ms saturates (a huge timeout means none).
    c->c_deadline_ns = tp__deadline_after_ms(c->c_timeout_ms);
    c->c_fr_seq = tp__ag_fr_begin_locked(a, cs->cs_kind, p->p_info.rank, id,
                                         named ? fn_name : NULL, nbytes, true,
                                         c->c_start_ns);
    if (self) {
        tp__ag_fr_written_locked(a, c->c_fr_seq, true); // waiting for the pool
    } else {
        w->w_fr_seq = c->c_fr_seq;
    }
    tp__ag_pending_insert_locked(a, c);
    if (self) {
        a->a_self->p_stats.s_calls_received++;
        a->a_activity++;
    }
    tp__mtx_unlock(&a->a_mtx);
    // From here on the call may end at any time (reply, timeout, failure):
    // @c must not be touched.

    if (self) {
        atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
        r->r_agent = a;
        r->r_caller = a->a_self;
        r->r_kind = AG_KIND_REQUEST;
        r->r_call_id = id;
        r->r_fn_id = tp__hash64(fn_name, fnlen);
        r->r_args = copy;
        memcpy(r->r_fn_name, fn_name, fnlen + 1);
        tp__task_init(&r->r_task, tp__ag_req_run, r);
        if (tp__pool_submit(pool, &r->r_task) != TP_OK) {
            tp_error *e =
                tp__error_new(TP_ECLOSED, 0, NULL, "the agent is shut down");
            tp__ag_req_reply(r, NULL, e);
            tp_error_unref(e);
        }
        tp__ag_writers_exit(a);
        return result;
    }

    ag_hdr h;
    memset(&h, 0, sizeof(h));
    h.h_kind = cs->cs_kind;
    h.h_call_id = id;
    h.h_fn_id = fnlen > 0 ? tp__hash64(fn_name, fnlen) : 0;
    h.h_fn_name = fn_name;
    h.h_fn_name_len = (uint16_t)fnlen;
    h.h_src_rank = (uint32_t)a->a_rank;
    tp_args *ref = in != NULL ? tp_args_ref((tp_args *)in) : NULL;
    tp_status st =
        tp__ag_slot_send(w, &h, cs->cs_kind != AG_KIND_REQUEST, cs->cs_hdr,
                         cs->cs_hdr_len, ref, NULL, NULL, &err);
    if (st != TP_OK) {
        tp__mtx_lock(&a->a_mtx);
        tp__ag_slot_put_locked(w);
        ag_call *mine = tp__ag_pending_take_locked(a, id, NULL, st);
        tp__mtx_unlock(&a->a_mtx);
        if (mine != NULL) {
            tp_error *e = tp__error_new(
                st, 0, err, "rpc \"%s\" from %s to %s (rank %d)", cs->cs_what,
                ag_name(a), p->p_info.name, p->p_info.rank);
            tp__ag_call_finish(mine, NULL, e);
        }
        tp_error_unref(err);
    }
    tp__ag_writers_exit(a);
    return result;
}

tp_future *
tp__agent_call_kind(tp_agent *a, int to, uint8_t kind, const void *hdr,
                    size_t hdr_len, const char *name, const tp_args *in,
                    int64_t timeout_ms)
{
    const ag_kind_desc *kd = tp__ag_kind_get(kind);
    if (to < 0 || to >= a->a_world || kd == NULL || !ag_kind_is_proto(kind)) {
        return tp__ag_future_failed(tp__error_new(
            TP_EINVAL, 0, NULL, "rpc %s: message of kind %u to rank %d",
            ag_name(a), kind, to));
    }
    // Messages about the call name its function when it has one.
    ag_callspec cs = {.cs_kind = (ag_kind)kind,
                      .cs_name = name,
                      .cs_hdr = hdr,
                      .cs_hdr_len = hdr_len,
                      .cs_what = name != NULL && name[0] ? name : kd->k_name};
    return agent_call(a, &a->a_peers[to], &cs, in, timeout_ms);
}

tp_status
tp__agent_notify(tp_agent *a, int to, uint8_t kind, const void *hdr,
                 size_t hdr_len, bool nowait, tp_error **err_p)
{
    const ag_kind_desc *kd = tp__ag_kind_get(kind);
    if (to < 0 || to >= a->a_world || to == a->a_rank || kd == NULL ||
        !kd->k_note) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc %s: notification of kind %u to rank %d",
                             ag_name(a), kind, to);
    }
    ag_peer *p = &a->a_peers[to];
    tp_error *err = NULL;
    tp__mtx_lock(&a->a_mtx);
    if (a->a_state == AG_CLOSED) {
        tp__mtx_unlock(&a->a_mtx);
        return tp__error_set(err_p, TP_ECLOSED, "rpc %s: %s to %s: shut down",
                             ag_name(a), kd->k_name, p->p_info.name);
    }
    atomic_fetch_add_explicit(&a->a_writers, 1, memory_order_acquire);
    ag_wslot *w = call_slot_locked(a, p, nowait, &err);
    if (w != NULL) {
        // Counted as sent from now: the shutdown agreement then waits for
        // its arrival (a write that fails takes it back).
        a->a_notes_sent++;
        a->a_activity++;
        w->w_fr_seq = tp__ag_fr_begin_locked(a, (ag_kind)kind, to, 0, NULL,
                                             hdr_len, false, 0);
    }
    tp__mtx_unlock(&a->a_mtx);
    tp_status st = TP_OK;
    if (w != NULL) {
        ag_hdr h;
        memset(&h, 0, sizeof(h));
        h.h_kind = (ag_kind)kind;
        h.h_src_rank = (uint32_t)a->a_rank;
        st =
            tp__ag_slot_send(w, &h, true, hdr, hdr_len, NULL, NULL, NULL, &err);
        if (st != TP_OK) {
            tp__mtx_lock(&a->a_mtx);
            tp__ag_slot_put_locked(w);
            a->a_notes_sent--;
            tp__mtx_unlock(&a->a_mtx);
        }
    } else {
        st = tp_error_status(err);
    }
    tp__ag_writers_exit(a);
    if (st == TP_EAGAIN) {
        tp_error_unref(err); // not sent: the caller sends it otherwise
    } else if (st != TP_OK) {
        tp_error *e = tp__error_new(st, 0, err, "rpc %s: %s to %s (rank %d)",
                                    ag_name(a), kd->k_name, p->p_info.name, to);
        tp_error_unref(err);
        if (err_p != NULL) {
            *err_p = e;
        } else {
            tp_error_unref(e);
        }
    }
    return st;
}

tp_status
tp__agent_call_kind_now(tp_agent *a, int to, uint8_t kind, const void *hdr,
                        size_t hdr_len, const tp_args *in, int64_t timeout_ms,
                        tp_future **f_p)
{
    const ag_kind_desc *kd = tp__ag_kind_get(kind);
    if (to < 0 || to >= a->a_world || kd == NULL || !ag_kind_is_proto(kind) ||
        to == a->a_rank) {
        return TP_EINVAL;
    }
    ag_callspec cs = {.cs_kind = (ag_kind)kind,
                      .cs_hdr = hdr,
                      .cs_hdr_len = hdr_len,
                      .cs_what = kd->k_name,
                      .cs_nowait = true};
    tp_future *f = agent_call(a, &a->a_peers[to], &cs, in, timeout_ms);
    if (f == NULL) {
        return TP_ENOMEM;
    }
    const tp_error *e = tp_future_is_done(f) ? tp_future_error(f) : NULL;
    if (e != NULL && tp_error_status(e) == TP_EAGAIN) {
        tp_future_unref(f);
        return TP_EAGAIN;
    }
    *f_p = f;
    return TP_OK;
}

tp_future *
tp__ag_call_fn(tp_agent *a, ag_peer *p, const char *fn_name, const tp_args *in,
               int64_t timeout_ms)
{
    ag_callspec cs = {.cs_kind = AG_KIND_REQUEST,
                      .cs_name = fn_name,
                      .cs_what = fn_name != NULL ? fn_name : "(null)"};
    return agent_call(a, p, &cs, in, timeout_ms);
}
