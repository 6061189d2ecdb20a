// SPDX-License-Identifier: Apache-2.0
// ctx.c - a worker's RRef state (rr_impl.h): owner and user RRefs, forks,
// pending children, confirmations, deletion, and the protocol messages
// queued to the agent's pool.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/loop.h"
#include "rr_impl.h"

// The value of a deleted owner RRef, freed with no lock held: an
// object's destructor is user code, so it runs on the pool (or on the
// thread of tp__rr_flush when the pool is gone). Allocated with the RRef, so
// deleting never needs memory.
struct rr_doomed {
    struct rr_doomed *d_next;
    tp_task d_task;
    tp_future *d_value;
};

// ---- the context ---------------------------------------------------------

rr_ctx *
tp__rr_ctx_get(const tp_agent *a)
{
    return a != NULL ? tp__agent_proto_state(a, &tp__rref_proto) : NULL;
}

rr_ctx *
tp__rr_ctx_ref(rr_ctx *x)
{
    atomic_fetch_add_explicit(&x->x_refs, 1, memory_order_relaxed);
    return x;
}

void
tp__rr_ctx_free(rr_ctx *x)
{
    tp__rr_map_fini(&x->x_owned);
    tp__rr_map_fini(&x->x_users);
    tp__rr_map_fini(&x->x_forks);
    tp__rr_map_fini(&x->x_children);
    tp__free(x->x_dead);
    tp__mtx_fini(&x->x_mtx);
    tp__free(x);
}

void
tp__rr_ctx_unref(rr_ctx *x)
{
    if (atomic_fetch_sub_explicit(&x->x_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp_agent *a = x->x_agent;
    tp__rr_ctx_free(x);
    tp__agent_unref(a);
}

rr_id
tp__rr_next_id(rr_ctx *x)
{
    rr_id id = {(uint32_t)x->x_rank,
                atomic_fetch_add_explicit(&x->x_next, 1, memory_order_relaxed)};
    return id;
}

void
tp__rr_describe(const tp_rref *r, char *buf, size_t len)
{
    const tp_worker_info *o = tp__agent_worker(r->r_ctx->x_agent, r->r_owner);
    snprintf(buf, len, "RRef (%u:%" PRIu64 ") owned by %s (rank %d)", r->r_id.w,
             r->r_id.n, o != NULL ? o->name : "?", r->r_owner);
}

// ---- memory -----------------------------------------------------------------

tp_rref *
tp__rr_hold(tp_rref *r)
{
    atomic_fetch_add_explicit(&r->r_refs, 1, memory_order_relaxed);
    return r;
}

void
tp__rr_release(tp_rref *r)
{
    if (r == NULL ||
        atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    // The value went when the owner RRef was deleted (unless the RRef
    // never reached a table: then it goes here).
    tp_future_unref(r->r_value);
    tp__free(r->r_doomed);
    tp_future_unref(r->r_confirm);
    tp_error_unref(r->r_err);
    rr_ctx *x = r->r_ctx;
    tp__free(r);
    tp__rr_ctx_unref(x);
}

static tp_rref *
rref_alloc(rr_ctx *x, rr_id id, int owner, const char *what)
{
    tp_rref *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    atomic_init(&r->r_refs, 1);
    r->r_ctx = tp__rr_ctx_ref(x);
    r->r_id = id;
    r->r_owner = owner;
    r->r_creator = (int)id.w;
    snprintf(r->r_what, sizeof(r->r_what), "%s", what != NULL ? what : "");
    return r;
}

// ---- owner RRefs -----------------------------------------------------------

tp_rref *
tp__rr_owner_new_locked(rr_ctx *x, rr_id id, int creator, const char *what)
{
    tp_rref *r = rref_alloc(x, id, x->x_rank, what);
    if (r == NULL) {
        return NULL;
    }
    r->r_doomed = tp__zalloc(sizeof(*r->r_doomed));
    if (r->r_doomed == NULL || tp_future_create(&r->r_value) != TP_OK) {
        tp__rr_release(r);
        return NULL;
    }
    tp__agent_bind_future(x->x_agent, r->r_value);
    r->r_is_owner = true;
    r->r_creator = creator;
    r->r_confirmed = true;
    r->r_node.n_key = id;
    tp__rr_map_put(&x->x_owned, &r->r_node);
    r->r_in_table = true; // the table's memory ref is the one from alloc
    x->x_created++;
    return r;
}

tp_rref *
tp__rr_owner_get_locked(rr_ctx *x, rr_id id, int creator)
{
    rr_node *n = tp__rr_map_get(&x->x_owned, id);
    if (n != NULL) {
        return (tp_rref *)n;
    }
    return tp__rr_owner_new_locked(x, id, creator, "");
}

tp_future *
tp__rr_owner_value(tp_rref *r)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    tp_future *f = r->r_value != NULL ? tp_future_ref(r->r_value) : NULL;
    tp__mtx_unlock(&x->x_mtx);
    return f;
}

static void
doomed_run(void *arg)
{
    rr_doomed *d = arg;
    tp_future_unref(d->d_value);
    tp__free(d);
}

void
tp__rr_owner_maybe_delete_locked(rr_ctx *x, tp_rref *r)
{
    if (!r->r_is_owner || !r->r_in_table || r->r_users > 0 || r->r_nforks > 0 ||
        r->r_holds > 0) {
        return;
    }
    tp__rr_map_del(&x->x_owned, r->r_id);
    r->r_in_table = false;
    x->x_deleted++;
    // The value goes now, not with the last memory reference (a message
    // in flight may still hold one).
    rr_doomed *d = r->r_doomed;
    r->r_doomed = NULL;
    d->d_value = r->r_value;
    r->r_value = NULL;
    d->d_next = x->x_doomed;
    x->x_doomed = d;
    // The table's memory reference: never the last one here (the caller
    // reached @r through a table, a fork or a handle it still holds).
    atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_acq_rel);
}

void
tp__rr_owner_set_value(tp_rref *r, void *value, tp_future_free_fn free_fn,
                       const tp_error *err)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    tp_future *f = r->r_value != NULL ? tp_future_ref(r->r_value) : NULL;
    r->r_created = true;
    tp__mtx_unlock(&x->x_mtx);
    tp_status st = TP_EINVAL;
    if (f != NULL) {
        st = err != NULL ? tp_future_set_error(f, err)
                         : tp_future_set_value(f, value, free_fn);
    }
    if (st != TP_OK && err == NULL && free_fn != NULL) {
        free_fn(value); // already resolved (a failed placeholder) or gone
    }
    tp_future_unref(f);
}

void
tp__rr_owner_unhold(tp_rref *r)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    r->r_holds--;
    tp__rr_owner_maybe_delete_locked(x, r);
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
    tp__rr_release(r);
}

tp_status
tp__rr_fork_add_locked(rr_ctx *x, tp_rref *r, rr_id fork, int holder)
{
    if (tp__rr_map_get(&x->x_forks, fork) != NULL) {
        return TP_EINVAL; // a fork id is used once
    }
    rr_fork *f = tp__zalloc(sizeof(*f));
    if (f == NULL) {
        return TP_ENOMEM;
    }
    f->f_node.n_key = fork;
    f->f_rref = tp__rr_hold(r);
    f->f_holder = holder;
    tp__rr_map_put(&x->x_forks, &f->f_node);
    r->r_nforks++;
    return TP_OK;
}

bool
tp__rr_fork_del_locked(rr_ctx *x, rr_id fork, int holder)
{
    rr_fork *f = (rr_fork *)tp__rr_map_get(&x->x_forks, fork);
    if (f == NULL || (holder >= 0 && f->f_holder != holder)) {
        return false;
    }
    tp__rr_map_del(&x->x_forks, fork);
    tp_rref *r = f->f_rref;
    r->r_nforks--;
    tp__rr_owner_maybe_delete_locked(x, r);
    tp__free(f);
    // The fork's memory reference. Freeing an RRef here is safe: its
    // value already went to x_doomed, and the context outlives the lock
    // (the caller holds a reference to it).
    tp__rr_release(r);
    return true;
}

// ---- user RRefs ------------------------------------------------------------

tp_rref *
tp__rr_user_new_locked(rr_ctx *x, rr_id id, rr_id fork, int owner,
                       bool confirmed, bool object)
{
    tp_rref *r = rref_alloc(x, id, owner, NULL);
    if (r == NULL) {
        return NULL;
    }
    if (tp_future_create(&r->r_confirm) != TP_OK) {
        tp__rr_release(r);
        return NULL;
    }
    tp__agent_bind_future(x->x_agent, r->r_confirm);
    r->r_fork = fork;
    r->r_is_object = object;
    r->r_users = 1;
    r->r_confirmed = confirmed;
    r->r_node.n_key = fork;
    tp__rr_map_put(&x->x_users, &r->r_node);
    r->r_in_table = true;
    tp__rr_hold(r); // the table's; the caller's handle is the first ref
    if (!confirmed) {
        x->x_nunconfirmed++;
    } else {
        tp_future_set_value(r->r_confirm, NULL, NULL);
    }
    return r;
}

void
tp__rr_user_maybe_delete_locked(rr_ctx *x, tp_rref *r)
{
    if (r->r_is_owner || !r->r_released || !r->r_confirmed ||
        r->r_nchildren > 0 || r->r_deleted) {
        return;
    }
    r->r_deleted = true;
    bool owner_alive = !x->x_dead[r->r_owner] && x->x_attached;
    if (owner_alive) {
        rr_msg m = {.m_id = r->r_id, .m_fork = r->r_fork};
        if (tp__rr_note_queue_locked(x, RR_KIND_DELETE, r->r_owner, &m, NULL,
                                     -1) != TP_OK) {
            char who[TP_RPC_MAX_NAME + 96];
            tp__rr_describe(r, who, sizeof(who));
            TP_LOG_WARN("TP-RREF-DELETE",
                        "rref: no memory to tell the owner that %s fork "
                        "(%u:%" PRIu64 ") is gone; the value stays there",
                        who, r->r_fork.w, r->r_fork.n);
        }
    }
    if (r->r_in_table) {
        tp__rr_map_del(&x->x_users, r->r_fork);
        r->r_in_table = false;
        atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_acq_rel);
    }
}

void
tp__rr_user_confirm(tp_rref *r, const tp_error *err)
{
    rr_ctx *x = r->r_ctx;
    bool signal = false;
    tp__mtx_lock(&x->x_mtx);
    if (!r->r_confirmed) {
        r->r_confirmed = true;
        x->x_nunconfirmed--;
        signal = true;
    }
    if (err != NULL && r->r_err == NULL) {
        r->r_err = tp_error_ref((tp_error *)err);
    }
    tp__rr_user_maybe_delete_locked(x, r);
    tp__mtx_unlock(&x->x_mtx);
    if (signal) {
        if (err != NULL) {
            tp_future_set_error(r->r_confirm, err);
        } else {
            tp_future_set_value(r->r_confirm, NULL, NULL);
        }
    }
    tp__rr_flush(x);
}

// ---- pending children ------------------------------------------------------

tp_status
tp__rr_child_add_locked(rr_ctx *x, tp_rref *parent, rr_id fork, int to)
{
    rr_child *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return TP_ENOMEM;
    }
    c->c_node.n_key = fork;
    c->c_parent = tp__rr_hold(parent);
    c->c_to = to;
    tp__rr_map_put(&x->x_children, &c->c_node);
    parent->r_nchildren++;
    return TP_OK;
}

bool
tp__rr_child_done_locked(rr_ctx *x, rr_id fork, int from)
{
    rr_child *c = (rr_child *)tp__rr_map_get(&x->x_children, fork);
    if (c == NULL || (from >= 0 && c->c_to != from)) {
        return false;
    }
    tp__rr_map_del(&x->x_children, fork);
    tp_rref *p = c->c_parent;
    p->r_nchildren--;
    if (p->r_is_owner) {
        tp__rr_owner_maybe_delete_locked(x, p);
    } else {
        tp__rr_user_maybe_delete_locked(x, p);
    }
    tp__free(c);
    tp__rr_release(p);
    return true;
}

// ---- messages --------------------------------------------------------------

static void note_run(void *arg);

tp_status
tp__rr_note_queue_locked(rr_ctx *x, uint8_t kind, int to, const rr_msg *m,
                         tp_rref *rref, int parent)
{
    rr_note *n = tp__zalloc(sizeof(*n));
    if (n == NULL) {
        return TP_ENOMEM;
    }
    n->n_ctx = tp__rr_ctx_ref(x);
    n->n_kind = kind;
    n->n_to = to;
    n->n_msg = *m;
    n->n_rref = rref != NULL ? tp__rr_hold(rref) : NULL;
    n->n_parent = parent;
    n->n_next = x->x_outbox;
    x->x_outbox = n;
    x->x_nqueued++;
    return TP_OK;
}

static void
note_free(rr_note *n)
{
    tp__rr_release(n->n_rref);
    tp__rr_ctx_unref(n->n_ctx);
    tp__free(n);
}

static void
note_done(tp_future *f, void *arg)
{
    rr_note *n = arg;
    rr_ctx *x = n->n_ctx;
    const tp_error *err = tp_future_error(f);
    if (n->n_kind == RR_KIND_FORK) {
        // The owner knows the fork (or failed to learn it): the user RRef
        // is confirmed, and its parent may let go of its own.
        tp__rr_user_confirm(n->n_rref, err);
        tp__mtx_lock(&x->x_mtx);
        rr_msg m = {.m_fork = n->n_rref->r_fork};
        if (x->x_attached && !x->x_dead[n->n_parent]) {
            if (n->n_parent == x->x_rank) {
                tp__rr_child_done_locked(x, m.m_fork, -1);
            } else {
                tp__rr_note_queue_locked(x, RR_KIND_CHILD_ACCEPT, n->n_parent,
                                         &m, NULL, -1);
            }
        }
        tp__mtx_unlock(&x->x_mtx);
        tp__rr_flush(x);
    } else if (err != NULL) {
        TP_LOG_DEBUG("TP-RREF-MSG", "rref: %s", tp_error_message(err));
    }
    tp_future_unref(f);
    note_free(n);
}

// Sends note @n (a protocol message) and waits for its answer in the
// background. Off a loop thread; on one only once the call was made
// (@f, from tp__agent_call_kind_now).
static void
note_sent(rr_note *n, tp_future *f)
{
    rr_ctx *x = n->n_ctx;
    // Counted as a call from here on (the agent's pending calls).
    tp__mtx_lock(&x->x_mtx);
    x->x_nqueued--;
    tp__mtx_unlock(&x->x_mtx);
    if (f == NULL || tp_future_then(f, note_done, n) != TP_OK) {
        if (f == NULL) {
            tp_future *ff = NULL;
            if (tp_future_create(&ff) == TP_OK) {
                tp_future_set_error(ff, tp__error_nomem());
                note_done(ff, n); // takes ff
                return;
            }
        }
        tp_future_unref(f);
        note_free(n);
    }
}

// DELETE and CHILD_ACCEPT are notifications (no reply): once handed to
// the agent (which counts them until they arrive), the note is done.
static bool
note_is_notification(const rr_note *n)
{
    return n->n_kind == RR_KIND_DELETE || n->n_kind == RR_KIND_CHILD_ACCEPT;
}

// Sends a notification; false only for TP_EAGAIN (@nowait and no
// connection yet: the pool sends it).
static bool
note_notify(rr_note *n, bool nowait)
{
    rr_ctx *x = n->n_ctx;
    uint8_t hdr[64];
    tp__rr_hdr_encode(n->n_kind, &n->n_msg, hdr);
    tp_error *err = NULL;
    tp_status st = tp__agent_notify(x->x_agent, n->n_to, n->n_kind, hdr,
                                    tp__rr_hdr_size(n->n_kind), nowait, &err);
    if (st == TP_EAGAIN) {
        return false;
    }
    if (st != TP_OK) {
        // The peer is gone or we shut down: nothing waits for it.
        TP_LOG_DEBUG("TP-RREF-MSG", "rref: %s", tp_error_message(err));
        tp_error_unref(err);
    }
    tp__mtx_lock(&x->x_mtx);
    x->x_nqueued--;
    tp__mtx_unlock(&x->x_mtx);
    note_free(n);
    return true;
}

static void
note_run(void *arg)
{
    rr_note *n = arg;
    if (note_is_notification(n)) {
        note_notify(n, false);
        return;
    }
    uint8_t hdr[64];
    tp__rr_hdr_encode(n->n_kind, &n->n_msg, hdr);
    note_sent(n, tp__agent_call_kind(n->n_ctx->x_agent, n->n_to, n->n_kind, hdr,
                                     tp__rr_hdr_size(n->n_kind), NULL, NULL,
                                     TP_TIMEOUT_DEFAULT));
}

// A loop thread sends @n at once when the connection exists (writing
// does not block); false: it needs the pool.
static bool
note_try_now(rr_note *n)
{
    if (note_is_notification(n)) {
        return note_notify(n, true);
    }
    uint8_t hdr[64];
    tp__rr_hdr_encode(n->n_kind, &n->n_msg, hdr);
    tp_future *f = NULL;
    if (tp__agent_call_kind_now(n->n_ctx->x_agent, n->n_to, n->n_kind, hdr,
                                tp__rr_hdr_size(n->n_kind), NULL,
                                TP_TIMEOUT_DEFAULT, &f) != TP_OK) {
        return false;
    }
    note_sent(n, f);
    return true;
}

// A note that cannot be sent (shutting down): what it would have
// settled is settled here.
static void
note_drop(rr_note *n)
{
    rr_ctx *x = n->n_ctx;
    tp__mtx_lock(&x->x_mtx);
    x->x_nqueued--;
    tp__mtx_unlock(&x->x_mtx);
    if (n->n_kind == RR_KIND_FORK) {
        tp_error *e = tp__error_new(TP_ECLOSED, 0, NULL,
                                    "rref: the agent shut down before the "
                                    "owner confirmed this fork");
        tp__rr_user_confirm(n->n_rref, e);
        tp_error_unref(e);
    }
    note_free(n);
}

void
tp__rr_flush(rr_ctx *x)
{
    tp__mtx_lock(&x->x_mtx);
    rr_note *list = x->x_outbox;
    x->x_outbox = NULL;
    rr_doomed *doomed = x->x_doomed;
    x->x_doomed = NULL;
    tp__mtx_unlock(&x->x_mtx);
    // Off a loop thread (the program's, a pool thread) the work is done
    // here: no hand-over. A loop thread must not block: it goes to the
    // pool.
    bool inline_ok = !tp__loop_any_on_thread();
    while (doomed != NULL) {
        rr_doomed *d = doomed;
        doomed = d->d_next;
        tp__task_init(&d->d_task, doomed_run, d);
        if (inline_ok || tp__agent_submit(x->x_agent, &d->d_task) != TP_OK) {
            doomed_run(d);
        }
    }
    // Queued newest first: send in the order they were queued.
    rr_note *rev = NULL;
    while (list != NULL) {
        rr_note *next = list->n_next;
        list->n_next = rev;
        rev = list;
        list = next;
    }
    while (rev != NULL) {
        rr_note *n = rev;
        rev = n->n_next;
        if (inline_ok) {
            note_run(n);
            continue;
        }
        if (note_try_now(n)) {
            continue;
        }
        tp__task_init(&n->n_task, note_run, n);
        if (tp__agent_submit(x->x_agent, &n->n_task) != TP_OK) {
            note_drop(n);
        }
    }
}
