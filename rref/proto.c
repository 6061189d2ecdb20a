// SPDX-License-Identifier: Apache-2.0
// proto.c - the RRef protocol as the agent sees it (agent/proto.h): its
// message kinds, the hooks that fork the RRefs passed in args and make
// RRefs of the ones received, peer failure, the shutdown agreement and
// debug info.
//
// Loop-thread steps (pk_on_loop, po_recv) only touch tables under x_mtx
// and queue messages; the functions of REMOTE and CALL, and a FETCH that
// must wait for its value, go on to the pool.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "rr_impl.h"

// ---- RRefs in args: what the agent keeps ------------------------------------

static void
obj_ref(void *obj)
{
    tp_rref_ref(obj);
}

static void
obj_unref(void *obj)
{
    tp_rref_unref(obj);
}

const tp__args_obj_ops tp__rr_obj_ops = {
    .ao_proto_id = 1,
    .ao_ref = obj_ref,
    .ao_unref = obj_unref,
};

// ---- attach / detach -------------------------------------------------------

static tp_status
rr_attach(tp_agent *a, void **state_p, tp_error **err_p)
{
    rr_ctx *x = tp__zalloc(sizeof(*x));
    if (x == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    atomic_init(&x->x_refs, 1);
    atomic_init(&x->x_next, 1);
    tp__mtx_init(&x->x_mtx);
    x->x_rank = tp__agent_rank(a);
    x->x_world = tp_rpc_world_size(a);
    x->x_dead = tp__zalloc((size_t)x->x_world * sizeof(bool));
    if (x->x_dead == NULL || tp__rr_map_init(&x->x_owned) != TP_OK ||
        tp__rr_map_init(&x->x_users) != TP_OK ||
        tp__rr_map_init(&x->x_forks) != TP_OK ||
        tp__rr_map_init(&x->x_children) != TP_OK) {
        tp__rr_ctx_free(x);
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    x->x_agent = tp__agent_ref(a);
    x->x_attached = true;
    *state_p = x;
    return TP_OK;
}

// Empties a table of RRefs, dropping each one's table reference.
static void
drop_table_locked(rr_map *m)
{
    rr_node *n = tp__rr_map_first(m);
    while (n != NULL) {
        rr_node *next = tp__rr_map_next(m, n);
        tp_rref *r = (tp_rref *)n;
        tp__rr_map_del(m, n->n_key);
        r->r_in_table = false;
        tp__rr_release(r);
        n = next;
    }
}

static void
rr_detach(void *state)
{
    rr_ctx *x = state;
    tp__rr_ctx_ref(x); // outlives the lock below
    tp__mtx_lock(&x->x_mtx);
    x->x_attached = false;
    // Forks and children end with the agent: nothing can confirm or
    // delete them any more (and, detached, nothing is sent).
    for (rr_node *n = tp__rr_map_first(&x->x_forks); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_forks, n);
        tp__rr_fork_del_locked(x, n->n_key, -1);
        n = next;
    }
    for (rr_node *n = tp__rr_map_first(&x->x_children); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_children, n);
        tp__rr_child_done_locked(x, n->n_key, -1);
        n = next;
    }
    // Owner RRefs that the program or a running function still holds stay
    // usable locally (their value goes with the last reference); the
    // others go now.
    for (rr_node *n = tp__rr_map_first(&x->x_owned); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_owned, n);
        tp_rref *r = tp__rr_hold((tp_rref *)n); // the table's may be the last
        tp__rr_owner_maybe_delete_locked(x, r);
        if (r->r_in_table) {
            tp__rr_map_del(&x->x_owned, r->r_id);
            r->r_in_table = false;
            atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_acq_rel);
        }
        tp__rr_release(r);
        n = next;
    }
    drop_table_locked(&x->x_users);
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x); // frees the doomed values, drops the queued messages
    tp__rr_ctx_unref(x);
    tp__rr_ctx_unref(x); // the attachment
}

// ---- sending args: forks ---------------------------------------------------

// What a sent message did, undone if it is never written.
typedef struct rr_sendtok {
    size_t t_n;
    struct {
        rr_id e_fork;
        bool e_owner; // a fork of our own RRef (else a pending child)
        int e_to;
    } t_e[];
} rr_sendtok;

static void
sendtok_undo_locked(rr_ctx *x, const rr_sendtok *t)
{
    for (size_t i = 0; i < t->t_n; i++) {
        if (t->t_e[i].e_owner) {
            tp__rr_fork_del_locked(x, t->t_e[i].e_fork, t->t_e[i].e_to);
        } else {
            tp__rr_child_done_locked(x, t->t_e[i].e_fork, t->t_e[i].e_to);
        }
    }
}

static tp_status
rr_send(void *state, int to, uint8_t kind, const tp_args *args,
        const tp_args *req, tp__ext *ext, void **tok_p, tp_error **err_p)
{
    (void)kind;
    (void)req;
    rr_ctx *x = state;
    size_t nobj = tp__args_nobjs(args);
    if (nobj == 0) {
        return TP_OK;
    }
    size_t n = 0;
    for (size_t i = 0; i < nobj; i++) {
        const tp__args_obj_ops *ops = NULL;
        tp__args_obj(args, i, &ops);
        n += ops == &tp__rr_obj_ops;
    }
    if (n == 0) {
        return TP_OK;
    }
    rr_desc *d = tp__alloc(n * sizeof(*d));
    rr_sendtok *t = tp__alloc(sizeof(*t) + n * sizeof(t->t_e[0]));
    uint8_t *sec = tp__alloc(tp__rr_sec_size(n));
    if (d == NULL || t == NULL || sec == NULL) {
        tp__free(d);
        tp__free(t);
        tp__free(sec);
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    t->t_n = 0;
    tp_status st = TP_OK;
    size_t k = 0;
    tp__mtx_lock(&x->x_mtx);
    for (size_t i = 0; i < nobj && st == TP_OK; i++) {
        const tp__args_obj_ops *ops = NULL;
        tp_rref *r = tp__args_obj(args, i, &ops);
        if (ops != &tp__rr_obj_ops) {
            continue;
        }
        char who[TP_RPC_MAX_NAME + 96];
        if (r->r_ctx != x) {
            tp__rr_describe(r, who, sizeof(who));
            st = tp__error_set(err_p, TP_EINVAL,
                               "rref: %s belongs to another agent", who);
            break;
        }
        if (!r->r_is_owner && x->x_dead[r->r_owner]) {
            tp__rr_describe(r, who, sizeof(who));
            st = tp__error_set(err_p, TP_ECONNRESET,
                               "rref: cannot pass %s: its owner died", who);
            break;
        }
        rr_id fork = tp__rr_next_id(x);
        d[k] = (rr_desc){.d_id = r->r_id,
                         .d_fork = fork,
                         .d_owner = (uint32_t)r->r_owner,
                         .d_flags = r->r_is_object ? RR_DESC_OBJECT : 0};
        if (r->r_is_owner) {
            // Ours: the receiver's fork is known at once.
            st = tp__rr_fork_add_locked(x, r, fork, to);
        } else {
            // A user's: kept until the child is confirmed (to the owner
            // itself: until the owner says it has it).
            st = tp__rr_child_add_locked(x, r, fork, to);
        }
        if (st == TP_OK) {
            t->t_e[t->t_n].e_fork = fork;
            t->t_e[t->t_n].e_owner = r->r_is_owner;
            t->t_e[t->t_n].e_to = to;
            t->t_n++;
            k++;
        } else {
            tp__error_set(err_p, st, "rref: out of memory");
        }
    }
    if (st != TP_OK) {
        sendtok_undo_locked(x, t);
    }
    tp__mtx_unlock(&x->x_mtx);
    if (st == TP_OK) {
        tp__rr_sec_encode(d, k, sec);
        st = tp__ext_append(ext, sec, tp__rr_sec_size(k));
        if (st != TP_OK) {
            tp__error_set(err_p, st, "rref: %zu RRefs in one message", k);
            tp__mtx_lock(&x->x_mtx);
            sendtok_undo_locked(x, t);
            tp__mtx_unlock(&x->x_mtx);
        }
    }
    tp__free(d);
    tp__free(sec);
    if (st != TP_OK) {
        tp__free(t);
        tp__rr_flush(x);
        return st;
    }
    *tok_p = t;
    return TP_OK;
}

static void
rr_sent(void *state, void *tok, const tp_error *err)
{
    rr_ctx *x = state;
    rr_sendtok *t = tok;
    if (err != NULL) {
        // Never written (or lost with its pipe): the forks did not happen.
        tp__mtx_lock(&x->x_mtx);
        sendtok_undo_locked(x, t);
        tp__mtx_unlock(&x->x_mtx);
        tp__rr_flush(x);
    }
    tp__free(t);
}

// ---- receiving args: RRefs -------------------------------------------------

// A message from @from arrived: it is alive, whatever a failed connection
// made us think (a refused message, an injected fault); the agent clears
// its own mark the same way. Else one broken pipe kept every later user
// RRef of its values from telling it of its deletion: a leaked value.
static void
rr_heard(rr_ctx *x, int from)
{
    if (atomic_load_explicit(&x->x_ndead, memory_order_relaxed) == 0 ||
        from < 0 || from >= x->x_world) {
        return;
    }
    tp__mtx_lock(&x->x_mtx);
    if (x->x_dead[from]) {
        x->x_dead[from] = false;
        atomic_fetch_sub_explicit(&x->x_ndead, 1, memory_order_relaxed);
    }
    tp__mtx_unlock(&x->x_mtx);
}

static tp_status
rr_recv(void *state, int from, const uint8_t *sec, size_t len, tp_args *args,
        tp_error **err_p)
{
    rr_ctx *x = state;
    rr_heard(x, from);
    if (sec == NULL) {
        return TP_OK;
    }
    size_t n = 0;
    tp_status st =
        tp__rr_sec_check(sec, len, (uint32_t)from, (uint32_t)x->x_world,
                         TP_RPC_MAX_RREFS, &n, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp__mtx_lock(&x->x_mtx);
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        rr_desc d;
        tp__rr_sec_desc(sec, i, &d);
        tp_rref *r; // with one handle, given to the args below
        if ((int)d.d_owner == x->x_rank) {
            // Our own RRef came back: the owner RRef itself. The sender
            // keeps its own until we say we have it.
            r = tp__rr_owner_get_locked(x, d.d_id, (int)d.d_id.w);
            if (r != NULL) {
                r->r_is_object |= (d.d_flags & RR_DESC_OBJECT) != 0;
                r->r_users++;
                tp__rr_hold(r);
                rr_msg m = {.m_fork = d.d_fork};
                st = tp__rr_note_queue_locked(x, RR_KIND_CHILD_ACCEPT, from, &m,
                                              NULL, -1);
            }
        } else {
            if (tp__rr_map_get(&x->x_users, d.d_fork) != NULL) {
                st = tp__error_set(err_p, TP_EPROTO,
                                   "rref %zu: fork (%u:%" PRIu64
                                   ") received twice",
                                   i, d.d_fork.w, d.d_fork.n);
                break;
            }
            bool from_owner = (int)d.d_owner == from;
            bool owner_dead = x->x_dead[d.d_owner];
            r = tp__rr_user_new_locked(x, d.d_id, d.d_fork, (int)d.d_owner,
                                       from_owner || owner_dead,
                                       (d.d_flags & RR_DESC_OBJECT) != 0);
            if (r != NULL && owner_dead) {
                r->r_err =
                    tp__error_new(TP_ECONNRESET, 0, NULL,
                                  "rref: the owner (rank %u) died", d.d_owner);
            }
            if (r != NULL && !from_owner) {
                // The owner must learn of the fork before the sender may
                // let go; then the sender is told (note_done).
                rr_msg m = {.m_id = d.d_id, .m_fork = d.d_fork};
                st = owner_dead
                         ? tp__rr_note_queue_locked(x, RR_KIND_CHILD_ACCEPT,
                                                    from, &m, NULL, -1)
                         : tp__rr_note_queue_locked(
                               x, RR_KIND_FORK, (int)d.d_owner, &m, r, from);
            }
        }
        if (r == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
            break;
        }
        if (st == TP_OK) {
            st = tp__args_add_obj_taken(args, r, &tp__rr_obj_ops);
        }
        if (st != TP_OK) {
            // The handle goes again (tp_rref_unref takes the lock: later).
            tp__rr_hold(r);
            r->r_users--;
            atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_relaxed);
            if (r->r_is_owner) {
                tp__rr_owner_maybe_delete_locked(x, r);
            } else {
                r->r_released = r->r_users == 0;
                tp__rr_user_maybe_delete_locked(x, r);
            }
            tp__rr_release(r); // the context outlives this (attached)
            if (err_p != NULL && *err_p == NULL) {
                tp__error_set(err_p, st, "rref: out of memory");
            }
        }
    }
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
    return st;
}

// ---- peer failure ----------------------------------------------------------

// A list of pointers collected under the lock and used after it. Without
// memory an element is dropped (logged): what it would settle then waits
// for its own deadline.
typedef struct rr_vec {
    void **v_p;
    size_t v_n, v_cap;
} rr_vec;

static void
vec_push(rr_vec *v, void *p)
{
    if (v->v_n == v->v_cap) {
        size_t cap = v->v_cap == 0 ? 16 : v->v_cap * 2;
        void **np = tp__realloc(v->v_p, cap * sizeof(*np));
        if (np == NULL) {
            TP_LOG_WARN("TP-RREF-NOMEM",
                        "rref: out of memory while settling after a failure");
            return;
        }
        v->v_p = np;
        v->v_cap = cap;
    }
    v->v_p[v->v_n++] = p;
}

static void
rr_peer_failed(void *state, int rank, const tp_error *err)
{
    rr_ctx *x = state;
    const tp_worker_info *wi = tp__agent_worker(x->x_agent, rank);
    tp__mtx_lock(&x->x_mtx);
    if (x->x_dead[rank] || !x->x_attached) {
        tp__mtx_unlock(&x->x_mtx);
        return;
    }
    x->x_dead[rank] = true;
    atomic_fetch_add_explicit(&x->x_ndead, 1, memory_order_relaxed);
    tp_error *why = tp__error_new(TP_ECONNRESET, 0, err,
                                  "rref: the owner %s (rank %d) failed",
                                  wi != NULL ? wi->name : "?", rank);
    // Its forks of our values go (PyTorch would keep them forever).
    size_t nforks = 0;
    for (rr_node *n = tp__rr_map_first(&x->x_forks); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_forks, n);
        if (((rr_fork *)n)->f_holder == rank) {
            // Deleting may free an RRef, never another fork node.
            tp__rr_fork_del_locked(x, n->n_key, rank);
            nforks++;
        }
        n = next;
    }
    // Forks we passed to it will never be accepted.
    for (rr_node *n = tp__rr_map_first(&x->x_children); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_children, n);
        if (((rr_child *)n)->c_to == rank) {
            tp__rr_child_done_locked(x, n->n_key, rank);
        }
        n = next;
    }
    // Our RRefs to its values: they carry the error now; nothing to
    // delete there.
    rr_vec unconfirmed = {0};
    for (rr_node *n = tp__rr_map_first(&x->x_users); n != NULL;
         n = tp__rr_map_next(&x->x_users, n)) {
        tp_rref *r = (tp_rref *)n;
        if (r->r_owner == rank) {
            if (r->r_err == NULL) {
                r->r_err = tp_error_ref(why);
            }
            if (!r->r_confirmed) {
                vec_push(&unconfirmed, tp__rr_hold(r));
            }
        }
    }
    // Values it was creating that never arrived: their waiters fail.
    rr_vec lost = {0};
    for (rr_node *n = tp__rr_map_first(&x->x_owned); n != NULL;
         n = tp__rr_map_next(&x->x_owned, n)) {
        tp_rref *r = (tp_rref *)n;
        if (r->r_creator == rank && !r->r_created && r->r_value != NULL) {
            vec_push(&lost, tp_future_ref(r->r_value));
        }
    }
    tp__mtx_unlock(&x->x_mtx);
    TP_LOG_INFO("TP-RREF-PEER",
                "rref: %s (rank %d) failed: dropped %zu of its forks of "
                "values here",
                wi != NULL ? wi->name : "?", rank, nforks);
    for (size_t i = 0; i < unconfirmed.v_n; i++) {
        tp__rr_user_confirm(unconfirmed.v_p[i], why);
        tp__rr_release(unconfirmed.v_p[i]);
    }
    tp__free(unconfirmed.v_p);
    tp_error *lerr = tp__error_new(TP_ECONNRESET, 0, err,
                                   "rref: its creator %s (rank %d) failed "
                                   "before it was created",
                                   wi != NULL ? wi->name : "?", rank);
    for (size_t i = 0; i < lost.v_n; i++) {
        tp_future_set_error(lost.v_p[i], lerr);
        tp_future_unref(lost.v_p[i]);
    }
    tp__free(lost.v_p);
    tp_error_unref(lerr);
    tp_error_unref(why);
    tp__rr_flush(x);
}

// ---- shutdown --------------------------------------------------------------

static void
rr_shutdown_begin(void *state)
{
    rr_ctx *x = state;
    tp__mtx_lock(&x->x_mtx);
    // As PyTorch: the user RRefs the program still holds are let go, so
    // that their owners can free the values (the handles stay valid
    // here; their values are gone).
    for (rr_node *n = tp__rr_map_first(&x->x_users); n != NULL;) {
        rr_node *next = tp__rr_map_next(&x->x_users, n);
        tp_rref *r = (tp_rref *)n;
        tp__rr_hold(r);
        r->r_released = true;
        tp__rr_user_maybe_delete_locked(x, r);
        // Not freed here: the caller of this hook holds the context, and
        // a user RRef in the table has a table reference besides ours.
        atomic_fetch_sub_explicit(&r->r_refs, 1, memory_order_acq_rel);
        n = next;
    }
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
}

static uint64_t
rr_pending(void *state)
{
    rr_ctx *x = state;
    tp__mtx_lock(&x->x_mtx);
    uint64_t n =
        x->x_nqueued + x->x_nunconfirmed + (uint64_t)x->x_children.m_count;
    tp__mtx_unlock(&x->x_mtx);
    return n;
}

static void
rr_shutdown_end(void *state, bool agreed)
{
    rr_ctx *x = state;
    const char *me = tp__agent_worker(x->x_agent, x->x_rank)->name;
    tp__mtx_lock(&x->x_mtx);
    size_t alive = x->x_owned.m_count;
    char line[512];
    size_t shown = 0;
    rr_vec waiting = {0};
    for (rr_node *n = tp__rr_map_first(&x->x_owned); n != NULL;
         n = tp__rr_map_next(&x->x_owned, n)) {
        tp_rref *r = (tp_rref *)n;
        if (!r->r_created && r->r_value != NULL) {
            vec_push(&waiting, tp_future_ref(r->r_value));
        }
        if (shown < 8) {
            const tp_worker_info *c =
                tp__agent_worker(x->x_agent, r->r_creator);
            snprintf(line, sizeof(line),
                     "rref %s: at shutdown the value of RRef (%u:%" PRIu64
                     ")%s%s%s, created by %s (rank %d), is still alive: %ld "
                     "handle(s) here, %ld user fork(s)",
                     me, r->r_id.w, r->r_id.n, r->r_what[0] ? " (" : "",
                     r->r_what, r->r_what[0] ? ")" : "",
                     c != NULL ? c->name : "?", r->r_creator, r->r_users,
                     r->r_nforks);
            TP_LOG_WARN("TP-RREF-LEAK", "%s", line);
            shown++;
        }
    }
    uint64_t children = x->x_children.m_count;
    tp__mtx_unlock(&x->x_mtx);
    if (alive > shown) {
        TP_LOG_WARN("TP-RREF-LEAK",
                    "rref %s: ... and %zu more owner RRefs alive at shutdown",
                    me, alive - shown);
    }
    if (agreed && children > 0) {
        TP_LOG_WARN("TP-RREF-LEAK",
                    "rref %s: %" PRIu64 " forks passed on were never "
                    "accepted",
                    me, children);
    }
    tp_error *e =
        tp__error_new(TP_ECLOSED, 0, NULL,
                      "rref %s: shut down before the value was created", me);
    for (size_t i = 0; i < waiting.v_n; i++) {
        tp_future_set_error(waiting.v_p[i], e);
        tp_future_unref(waiting.v_p[i]);
    }
    tp__free(waiting.v_p);
    tp_error_unref(e);
}

static size_t
rr_debug(void *state, char *buf, size_t len)
{
    rr_ctx *x = state;
    tp_rref_stats s;
    tp__mtx_lock(&x->x_mtx);
    s.owners = x->x_owned.m_count;
    s.users = x->x_users.m_count;
    s.forks = x->x_forks.m_count;
    s.pending_forks = x->x_children.m_count;
    s.pending_users = x->x_nunconfirmed;
    s.pending_messages = x->x_nqueued;
    tp__mtx_unlock(&x->x_mtx);
    int n = snprintf(
        buf, len,
        "rrefs: owners %" PRIu64 ", users %" PRIu64
        ", forks of owned values %" PRIu64 ", pending forks %" PRIu64
        ", pending confirmations %" PRIu64 ", messages queued %" PRIu64 "\n",
        s.owners, s.users, s.forks, s.pending_forks, s.pending_users,
        s.pending_messages);
    return n > 0 ? (size_t)n : 0;
}

tp_status
tp_rref_get_stats(const tp_agent *a, tp_rref_stats *st_p)
{
    rr_ctx *x = tp__rr_ctx_get(a);
    if (x == NULL || st_p == NULL) {
        return TP_ECLOSED;
    }
    tp__mtx_lock(&x->x_mtx);
    st_p->owners = x->x_owned.m_count;
    st_p->users = x->x_users.m_count;
    st_p->forks = x->x_forks.m_count;
    st_p->pending_forks = x->x_children.m_count;
    st_p->pending_users = x->x_nunconfirmed;
    st_p->pending_messages = x->x_nqueued;
    st_p->created = x->x_created;
    st_p->deleted = x->x_deleted;
    tp__mtx_unlock(&x->x_mtx);
    return TP_OK;
}

const tp__proto_ops tp__rref_proto = {
    .po_name = "rref",
    .po_id = 1,
    .po_kinds = tp__rr_kinds,
    .po_nkinds = RR_NKINDS,
    .po_attach = rr_attach,
    .po_detach = rr_detach,
    .po_send = rr_send,
    .po_sent = rr_sent,
    .po_recv = rr_recv,
    .po_peer_failed = rr_peer_failed,
    .po_shutdown_begin = rr_shutdown_begin,
    .po_pending = rr_pending,
    .po_shutdown_end = rr_shutdown_end,
    .po_debug = rr_debug,
};
