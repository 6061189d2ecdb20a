// SPDX-License-Identifier: Apache-2.0
// calls.c - outgoing calls: the pending table (chained on the call id),
// deadlines (one list per timeout value, in deadline order) and the timer
// thread that fails expired calls, tp_rpc_async/sync and tp_rpc_wait.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "ag_impl.h"
#include "proto.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/hash.h"
#include "core/log.h"

static int64_t
agent_timeout(const tp_agent *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->a_opts.rpc_timeout_ms : timeout_ms;
}

// ---- the pending table ---------------------------------------------------

static ag_call **
table_slot_locked(tp_agent *a, uint64_t id)
{
    // Ids are sequential: the low bits spread them.
    return &a->a_table[id & (a->a_table_size - 1)];
}

static bool
table_grow_locked(tp_agent *a)
{
    size_t nsize = a->a_table_size * 2;
    ag_call **nt = tp__zalloc(nsize * sizeof(*nt));
    if (nt == NULL) {
        return false; // chains just get longer
    }
    for (size_t i = 0; i < a->a_table_size; i++) {
        ag_call *c = a->a_table[i];
        while (c != NULL) {
            ag_call *next = c->c_hnext;
            ag_call **slot = &nt[c->c_id & (nsize - 1)];
            c->c_hnext = *slot;
            *slot = c;
            c = next;
        }
    }
    tp__free(a->a_table);
    a->a_table = nt;
    a->a_table_size = nsize;
    return true;
}

static void
timer_insert_locked(tp_agent *a, ag_call *c)
{
    if (c->c_timeout_ms == 0) {
        c->c_tclass = NULL;
        return;
    }
    ag_tclass *tc = a->a_tclasses;
    while (tc != NULL && tc->t_ms != c->c_timeout_ms) {
        tc = tc->t_next;
    }
    if (tc == NULL) {
        tc = tp__zalloc(sizeof(*tc));
        if (tc == NULL) {
            // Out of memory for a class: the timer thread will never see
            // this call, so it only ends by its reply or a failure.
            TP_LOG_WARN("TP-RPC-TIMER",
                        "rpc %s: no memory for a timeout class: call %" PRIu64
                        " has no deadline",
                        ag_name(a), c->c_id);
            c->c_tclass = NULL;
            return;
        }
        tc->t_ms = c->c_timeout_ms;
        tc->t_next = a->a_tclasses;
        a->a_tclasses = tc;
    }
    c->c_tclass = tc;
    c->c_tnext = NULL;
    c->c_tprev = tc->t_tail;
    if (tc->t_tail != NULL) {
        tc->t_tail->c_tnext = c;
    } else {
        tc->t_head = c;
    }
    tc->t_tail = c;
    if (c->c_deadline_ns < a->a_timer_until) {
        tp__cv_signal(&a->a_timer_cv);
    }
}

static void
timer_remove_locked(ag_call *c)
{
    ag_tclass *tc = c->c_tclass;
    if (tc == NULL) {
        return;
    }
    if (c->c_tprev != NULL) {
        c->c_tprev->c_tnext = c->c_tnext;
    } else {
        tc->t_head = c->c_tnext;
    }
    if (c->c_tnext != NULL) {
        c->c_tnext->c_tprev = c->c_tprev;
    } else {
        tc->t_tail = c->c_tprev;
    }
    c->c_tclass = NULL;
}

static void
pending_insert_locked(tp_agent *a, ag_call *c)
{
    if (a->a_npending >= a->a_table_size) {
        table_grow_locked(a);
    }
    ag_call **slot = table_slot_locked(a, c->c_id);
    c->c_hnext = *slot;
    *slot = c;
    ag_peer *p = c->c_peer;
    c->c_pprev = NULL;
    c->c_pnext = p->p_calls;
    if (p->p_calls != NULL) {
        p->p_calls->c_pprev = c;
    }
    p->p_calls = c;
    p->p_stats.s_pending++;
    p->p_stats.s_calls_sent++;
    a->a_npending++;
    a->a_activity++;
    timer_insert_locked(a, c);
}

void
tp__ag_pending_unlink_locked(tp_agent *a, ag_call *c, tp_status st)
{
    ag_call **pp = table_slot_locked(a, c->c_id);
    while (*pp != c) {
        pp = &(*pp)->c_hnext;
    }
    *pp = c->c_hnext;
    ag_peer *p = c->c_peer;
    if (c->c_pprev != NULL) {
        c->c_pprev->c_pnext = c->c_pnext;
    } else {
        p->p_calls = c->c_pnext;
    }
    if (c->c_pnext != NULL) {
        c->c_pnext->c_pprev = c->c_pprev;
    }
    timer_remove_locked(c);
    tp__ag_fr_end_locked(a, c->c_fr_seq, st);
    p->p_stats.s_pending--;
    if (st == TP_OK) {
        tp__ag_lat_record_locked(&p->p_stats, tp__now_ns() - c->c_start_ns);
    } else {
        p->p_stats.s_errors++;
        if (st == TP_ETIMEDOUT) {
            p->p_stats.s_timeouts++;
        }
    }
    if (--a->a_npending == 0) {
        tp__cv_broadcast(&a->a_idle_cv);
    }
}

// Takes call @id out of the table, or NULL if it already ended (or, when
// @conn is not NULL, if it was not sent on @conn: a peer cannot answer
// another peer's calls).
ag_call *
tp__ag_pending_take_locked(tp_agent *a, uint64_t id, const ag_conn *conn,
                           tp_status st)
{
    ag_call *c = *table_slot_locked(a, id);
    while (c != NULL && c->c_id != id) {
        c = c->c_hnext;
    }
    if (c != NULL && conn != NULL && c->c_conn != conn) {
        return NULL;
    }
    if (c != NULL) {
        tp__ag_pending_unlink_locked(a, c, st);
    }
    return c;
}

// Resolves and frees a call taken out of the table. Takes @result and
// @err. No lock held.
void
tp__ag_call_finish(ag_call *c, tp_args *result, tp_error *err)
{
    if (err != NULL) {
        tp_future_set_error(c->c_fut, err);
        tp_error_unref(err);
        tp_args_unref(result);
    } else {
        tp_future_set_value(c->c_fut, result, (tp_future_free_fn)tp_args_unref);
    }
    tp_future_unref(c->c_fut);
    tp__free(c);
}

// ---- the timer thread ----------------------------------------------------

// Takes the faulty mode's slots due by @now off a_delayed; the earliest
// later one lowers *@next_p.
static ag_wslot *
delayed_take_locked(tp_agent *a, uint64_t now, uint64_t *next_p)
{
    ag_wslot *due = NULL;
    for (ag_wslot **wp = &a->a_delayed; *wp != NULL;) {
        ag_wslot *w = *wp;
        if (w->w_due_ns <= now) {
            *wp = w->w_dnext;
            w->w_dnext = due;
            due = w;
        } else {
            *next_p = TP_MIN(*next_p, w->w_due_ns);
            wp = &w->w_dnext;
        }
    }
    return due;
}

static void
delayed_run(ag_wslot *w)
{
    while (w != NULL) {
        ag_wslot *next = w->w_dnext;
        w->w_dnext = NULL;
        tp__ag_slot_run_delayed(w);
        w = next;
    }
}

void *
tp__ag_timer_main(void *arg)
{
    tp_agent *a = arg;
    char tname[16];
    snprintf(tname, sizeof(tname), "tp-rpc-timer");
    tp__thread_set_name(tname);

    tp__mtx_lock(&a->a_mtx);
    while (!a->a_timer_stop) {
        uint64_t now = tp__now_ns();
        uint64_t next = UINT64_MAX;
        ag_call *expired = NULL;
        for (ag_tclass *tc = a->a_tclasses; tc != NULL; tc = tc->t_next) {
            while (tc->t_head != NULL && tc->t_head->c_deadline_ns <= now) {
                ag_call *c = tc->t_head;
                tp__ag_pending_unlink_locked(a, c, TP_ETIMEDOUT);
                c->c_hnext = expired;
                expired = c;
            }
            if (tc->t_head != NULL) {
                next = TP_MIN(next, tc->t_head->c_deadline_ns);
            }
        }
        // Classes whose calls all ended go (callers passing a different
        // timeout each time must not make the list grow); while there are
        // many, the thread also wakes each second to sweep them.
        size_t nclasses = 0;
        for (ag_tclass **tp = &a->a_tclasses; *tp != NULL;) {
            ag_tclass *tc = *tp;
            if (tc->t_head == NULL) {
                *tp = tc->t_next;
                tp__free(tc);
            } else {
                nclasses++;
                tp = &tc->t_next;
            }
        }
        if (nclasses > 16) {
            next = TP_MIN(next, now + 1000000000u);
        }
        ag_wslot *due = delayed_take_locked(a, now, &next);
        if (due != NULL) {
            tp__mtx_unlock(&a->a_mtx);
            delayed_run(due);
            tp__mtx_lock(&a->a_mtx);
            continue;
        }
        if (expired != NULL) {
            tp__mtx_unlock(&a->a_mtx);
            tp__ag_fr_log_timeouts(a, expired);
            while (expired != NULL) {
                ag_call *c = expired;
                expired = c->c_hnext;
                tp_error *err = tp__error_new(
                    TP_ETIMEDOUT, 0, NULL,
                    "rpc \"%s\" from %s to %s (rank %d): RPC ran for more "
                    "than set timeout (%lld ms) and will now be marked with "
                    "an error",
                    c->c_fn_name, ag_name(a), c->c_peer->p_info.name,
                    c->c_peer->p_info.rank, (long long)c->c_timeout_ms);
                tp__ag_call_finish(c, NULL, err);
            }
            tp__mtx_lock(&a->a_mtx);
            continue;
        }
        a->a_timer_until = next;
        tp__cv_wait_until(&a->a_timer_cv, &a->a_mtx, next);
        a->a_timer_until = 0;
    }
    // Shutting down: what the faulty mode still holds goes now (the
    // pipes are still open; they close once this thread is joined).
    ag_wslot *rest = delayed_take_locked(a, UINT64_MAX, NULL);
    tp__mtx_unlock(&a->a_mtx);
    delayed_run(rest);
    return NULL;
}

// ---- calls ---------------------------------------------------------------

static tp_future *
future_failed(tp_error *err)
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
        return future_failed(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rpc from %s to %s: malformed function name \"%s\"", ag_name(a),
            p->p_info.name, fn_name != NULL ? fn_name : "(null)"));
    }
    bool self = p == a->a_self;
    if (self && cs->cs_kind != AG_KIND_REQUEST) {
        return future_failed(tp__error_new(
            TP_EINVAL, 0, NULL, "rpc %s: a %s message to this worker itself",
            ag_name(a), cs->cs_what));
    }
    uint64_t nbytes = tp__ag_args_nbytes(in);
    if (!self && nbytes > a->a_opts.max_message_bytes) {
        // The callee would refuse it and close the pipe: fail only this
        // call, here (the caps are usually the same on every worker).
        return future_failed(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rpc \"%s\" from %s to %s (rank %d): its arguments are %" PRIu64
            " bytes, above the cap of %" PRIu64
            " bytes per message (max_message_bytes)",
            cs->cs_what, ag_name(a), p->p_info.name, p->p_info.rank, nbytes,
            a->a_opts.max_message_bytes));
    }
    ag_call *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return future_failed(tp__error_nomem());
    }
    if (tp_future_create(&c->c_fut) != TP_OK) {
        tp__free(c);
        return future_failed(tp__error_nomem());
    }
    size_t wlen = strlen(cs->cs_what);
    wlen = wlen < sizeof(c->c_fn_name) ? wlen : sizeof(c->c_fn_name) - 1;
    memcpy(c->c_fn_name, cs->cs_what, wlen);
    c->c_fn_name[wlen] = '\0';
    c->c_peer = p;
    c->c_timeout_ms = agent_timeout(a, timeout_ms);
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
    pending_insert_locked(a, c);
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
        return future_failed(tp__error_new(
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

static tp_future *
agent_call_fn(tp_agent *a, ag_peer *p, const char *fn_name, const tp_args *in,
              int64_t timeout_ms)
{
    ag_callspec cs = {.cs_kind = AG_KIND_REQUEST,
                      .cs_name = fn_name,
                      .cs_what = fn_name != NULL ? fn_name : "(null)"};
    return agent_call(a, p, &cs, in, timeout_ms);
}

ag_peer *
tp__ag_peer_by_name(tp_agent *a, const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (int i = 0; i < a->a_world; i++) {
        if (strcmp(a->a_peers[i].p_info.name, name) == 0) {
            return &a->a_peers[i];
        }
    }
    return NULL;
}

tp_future *
tp_rpc_async(tp_agent *a, const char *to, const char *fn_name,
             const tp_args *in, int64_t timeout_ms)
{
    if (a == NULL || to == NULL) {
        return future_failed(tp__error_new(
            TP_EINVAL, 0, NULL, "rpc \"%s\": %s", fn_name ? fn_name : "",
            a == NULL ? "NULL agent" : "NULL worker name"));
    }
    ag_peer *p = tp__ag_peer_by_name(a, to);
    if (p == NULL) {
        return future_failed(tp__error_new(
            TP_ENOENT, 0, NULL, "rpc \"%s\" from %s: no worker named \"%s\"",
            fn_name != NULL ? fn_name : "(null)", ag_name(a),
            to != NULL ? to : "(null)"));
    }
    return agent_call_fn(a, p, fn_name, in, timeout_ms);
}

tp_future *
tp_rpc_async_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                  int64_t timeout_ms)
{
    if (a == NULL) {
        return future_failed(tp__error_new(TP_EINVAL, 0, NULL,
                                           "rpc \"%s\": NULL agent",
                                           fn_name ? fn_name : ""));
    }
    if (to < 0 || to >= a->a_world) {
        return future_failed(tp__error_new(
            TP_ENOENT, 0, NULL,
            "rpc \"%s\" from %s: no worker of rank %d (world size %d)",
            fn_name != NULL ? fn_name : "(null)", ag_name(a), to, a->a_world));
    }
    return agent_call_fn(a, &a->a_peers[to], fn_name, in, timeout_ms);
}

static bool
future_done(void *arg)
{
    return tp_future_is_done(arg);
}

tp_status
tp_rpc_wait(tp_future *f, int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    if (out_p != NULL) {
        *out_p = NULL;
    }
    if (f == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc: no future (NULL, or the call could not "
                             "allocate one)");
    }
    // Spin briefly: a reply within microseconds should not pay for a
    // sleep and a wake-up. TP_LOOP_SPIN_US bounds it, as for the loops.
    if (!tp_future_is_done(f)) {
        static _Atomic int64_t spin_ns = -1;
        int64_t sns = atomic_load_explicit(&spin_ns, memory_order_relaxed);
        if (sns < 0) {
            tp_config cfg;
            tp__config_defaults(&cfg);
            tp_error *e = NULL;
            if (tp__config_load(&cfg, &e) != TP_OK) {
                tp_error_unref(e);
            }
            sns = cfg.loop_spin_us * 1000;
            atomic_store_explicit(&spin_ns, sns, memory_order_relaxed);
        }
        tp__spin_until(future_done, f, (uint64_t)sns);
    }
    tp_status st = tp_future_wait(f, timeout_ms, err_p);
    if (st == TP_OK && out_p != NULL) {
        tp_args *v = tp_future_value(f);
        *out_p = v != NULL ? tp_args_ref(v) : NULL;
    }
    return st;
}

tp_status
tp__agent_wait(tp_agent *a, tp_future *f, int64_t timeout_ms, tp_args **out_p,
               tp_error **err_p)
{
    // The call ends by itself at its deadline (the timer thread); the
    // wait's own deadline is only a backstop.
    if (a == NULL) {
        return tp_rpc_wait(f, timeout_ms, out_p, err_p); // its error
    }
    int64_t t = agent_timeout(a, timeout_ms);
    int64_t wait_ms =
        t > 0 && t < INT64_MAX - AG_SYNC_GRACE_MS ? t + AG_SYNC_GRACE_MS : 0;
    tp_status st = tp_rpc_wait(f, wait_ms, out_p, err_p);
    if (st == TP_ETIMEDOUT && !tp_future_is_done(f)) {
        // Only if the timer thread failed to end the call: say so.
        tp__error_wrap(err_p, st,
                       "rpc from %s: the call did not end %d ms after its "
                       "%lld ms deadline",
                       ag_name(a), AG_SYNC_GRACE_MS, (long long)t);
    }
    return st;
}

static tp_status
rpc_sync_wait(tp_agent *a, tp_future *f, int64_t timeout_ms, tp_args **out_p,
              tp_error **err_p)
{
    tp_status st = tp__agent_wait(a, f, timeout_ms, out_p, err_p);
    tp_future_unref(f);
    return st;
}

tp_status
tp_rpc_sync(tp_agent *a, const char *to, const char *fn_name, const tp_args *in,
            int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}

tp_status
tp_rpc_sync_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                 int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async_rank(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}
