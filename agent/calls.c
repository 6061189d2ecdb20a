// SPDX-License-Identifier: Apache-2.0
// calls.c - outgoing calls: the pending table (chained on the call id),
// deadlines (one list per timeout value, in deadline order) and the timer
// thread that fails expired calls. Making a call: calls_send.c; the public
// tp_rpc_async/sync and tp_rpc_wait: calls_api.c.

#include <inttypes.h>
#include <stdio.h>

#include "ag_impl.h"
#include "core/alloc.h"
#include "core/log.h"

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

void
tp__ag_pending_insert_locked(tp_agent *a, ag_call *c)
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
