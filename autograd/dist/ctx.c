// SPDX-License-Identifier: Apache-2.0
// ctx.c - distributed autograd contexts: ids (the creator's rank in the
// top 16 bits), the table of one agent, the thread's current context, and
// release here and on every worker a context reached.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "da_impl.h"

static _Thread_local da_ctx *tl_cur; // referenced

void
tp__da_state_ref(da_state *x)
{
    atomic_fetch_add_explicit(&x->x_refs, 1, memory_order_relaxed);
}

void
tp__da_state_unref(da_state *x)
{
    if (x == NULL ||
        atomic_fetch_sub_explicit(&x->x_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp__agent_unref(x->x_agent);
    tp__mtx_fini(&x->x_mtx);
    tp__free(x->x_dead);
    tp__free(x);
}

da_state *
tp__da_state_of(const tp_agent *a)
{
    return a != NULL ? tp__agent_proto_state(a, &tp__dist_autograd_proto)
                     : NULL;
}

const char *
tp__da_name(const da_state *x)
{
    const tp_worker_info *wi = tp__agent_worker(x->x_agent, x->x_rank);
    return wi != NULL ? wi->name : "?";
}

bool *
tp__da_ctx_peers(da_ctx *c)
{
    da_state *x = c->c_x;
    bool *peers = tp__alloc((size_t)x->x_world * sizeof(bool));
    if (peers != NULL) {
        tp__mtx_lock(&x->x_mtx);
        memcpy(peers, c->c_peers, (size_t)x->x_world * sizeof(bool));
        tp__mtx_unlock(&x->x_mtx);
    }
    return peers;
}

bool
tp__da_is_dead(da_state *x, int r)
{
    tp__mtx_lock(&x->x_mtx);
    bool dead = r >= 0 && r < x->x_world && x->x_dead[r];
    tp__mtx_unlock(&x->x_mtx);
    return dead;
}

da_ctx *
tp__da_ctx_ref(da_ctx *c)
{
    atomic_fetch_add_explicit(&c->c_refs, 1, memory_order_relaxed);
    return c;
}

// Drops send functions taken out of a context (its last reference, or a
// release, on a context out of the table).
static void
drop_sends(tp_node **sends, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        tp_node_unref(sends[i]);
    }
    tp__free(sends);
}

void
tp__da_ctx_unref(da_ctx *c)
{
    if (c == NULL ||
        atomic_fetch_sub_explicit(&c->c_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    drop_sends(c->c_sends, c->c_nsends);
    tp_grad_map_destroy(c->c_grads);
    tp__mtx_fini(&c->c_run);
    tp__free(c->c_peers);
    tp__da_state_unref(c->c_x);
    tp__free(c);
}

static da_ctx *
find_locked(da_state *x, int64_t id)
{
    for (da_ctx *c = x->x_ctxs; c != NULL; c = c->c_next) {
        if (c->c_id == id) {
            return c;
        }
    }
    return NULL;
}

da_ctx *
tp__da_ctx_find(da_state *x, int64_t id)
{
    tp__mtx_lock(&x->x_mtx);
    da_ctx *c = find_locked(x, id);
    if (c != NULL) {
        tp__da_ctx_ref(c);
    }
    tp__mtx_unlock(&x->x_mtx);
    return c;
}

da_ctx *
tp__da_ctx_find_or_fail(da_state *x, int64_t id, const char *what,
                        tp_error **err_p)
{
    da_ctx *c = tp__da_ctx_find(x, id);
    if (c == NULL) {
        tp__error_set(err_p, TP_ENOENT,
                      "dist autograd %s: %s: no context %" PRId64
                      " (unknown or already released)",
                      tp__da_name(x), what, id);
    }
    return c;
}

static da_ctx *
ctx_new(da_state *x, int64_t id)
{
    da_ctx *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->c_peers = tp__zalloc((size_t)x->x_world * sizeof(bool));
    if (c->c_peers == NULL || tp_grad_map_create(&c->c_grads) != TP_OK) {
        tp__free(c->c_peers);
        tp__free(c);
        return NULL;
    }
    atomic_init(&c->c_refs, 1); // the table's
    c->c_x = x;
    tp__da_state_ref(x);
    c->c_id = id;
    c->c_creator = (int)((uint64_t)id >> DA_CTX_BITS);
    tp__mtx_init(&c->c_run);
    return c;
}

static void
insert_locked(da_state *x, da_ctx *c)
{
    c->c_next = x->x_ctxs;
    x->x_ctxs = c;
    x->x_st.contexts++;
}

da_ctx *
tp__da_ctx_get_or_add(da_state *x, int64_t id, int from)
{
    int creator = (int)((uint64_t)id >> DA_CTX_BITS);
    tp__mtx_lock(&x->x_mtx);
    da_ctx *c = find_locked(x, id);
    if (c == NULL && x->x_attached && creator >= 0 && creator < x->x_world &&
        !x->x_dead[creator]) {
        c = ctx_new(x, id);
        if (c != NULL) {
            insert_locked(x, c);
        }
    }
    if (c != NULL) {
        tp__da_ctx_ref(c);
        if (from >= 0 && from < x->x_world) {
            c->c_peers[from] = true;
        }
    }
    tp__mtx_unlock(&x->x_mtx);
    return c;
}

void
tp__da_ctx_add_peer(da_ctx *c, int rank)
{
    da_state *x = c->c_x;
    if (rank < 0 || rank >= x->x_world) {
        return;
    }
    tp__mtx_lock(&x->x_mtx);
    c->c_peers[rank] = true;
    tp__mtx_unlock(&x->x_mtx);
}

// A RELEASE note for @id goes to @to; from a pool or user thread.
static void
send_release(da_state *x, int64_t id, int to)
{
    uint8_t hdr[DA_NOTE_HDR];
    tp__da_note_encode(&(da_note){.n_ctx = id}, hdr);
    tp_error *err = NULL;
    tp_status st = tp__agent_notify(x->x_agent, to, DA_KIND_RELEASE, hdr,
                                    sizeof(hdr), false, &err);
    if (st != TP_OK) {
        TP_LOG_DEBUG("TP-DA-RELEASE",
                     "dist autograd %s: context %" PRId64
                     " not released on rank %d: %s",
                     tp__da_name(x), id, to, tp_error_message(err));
    }
    tp_error_unref(err);
}

void
tp__da_ctx_release(da_ctx *c, bool propagate, int from)
{
    da_state *x = c->c_x;
    tp__mtx_lock(&x->x_mtx);
    if (c->c_released) {
        tp__mtx_unlock(&x->x_mtx);
        return;
    }
    c->c_released = true;
    for (da_ctx **pp = &x->x_ctxs; *pp != NULL; pp = &(*pp)->c_next) {
        if (*pp == c) {
            *pp = c->c_next;
            x->x_st.contexts--;
            break;
        }
    }
    x->x_st.released++;
    x->x_st.send_fns -= c->c_nsends;
    // The functions go now: a released context's graph cannot run again,
    // and the recv functions' nodes hold no reference to the context.
    tp_node **sends = c->c_sends;
    size_t nsends = c->c_nsends;
    c->c_sends = NULL;
    c->c_nsends = c->c_cap_sends = 0;
    int world = x->x_world;
    bool notify = propagate && x->x_attached;
    tp__mtx_unlock(&x->x_mtx);
    bool *peers = notify ? tp__da_ctx_peers(c) : NULL;
    drop_sends(sends, nsends);
    if (peers != NULL) {
        for (int r = 0; r < world; r++) {
            // Also to a peer marked dead: a broken pipe marks a live one
            // too, and its copy would stay until shutdown; the note then
            // connects again (to a dead peer it fails, logged).
            if (peers[r] && r != from && r != x->x_rank) {
                send_release(x, c->c_id, r);
            }
        }
        tp__free(peers);
    }
    tp__da_ctx_unref(c); // the table's
}

void
tp__da_ctx_release_all(da_state *x, int creator)
{
    for (;;) {
        tp__mtx_lock(&x->x_mtx);
        da_ctx *c = x->x_ctxs;
        while (c != NULL && creator >= 0 && c->c_creator != creator) {
            c = c->c_next;
        }
        if (c != NULL) {
            tp__da_ctx_ref(c);
        }
        tp__mtx_unlock(&x->x_mtx);
        if (c == NULL) {
            return;
        }
        tp__da_ctx_release(c, false, -1);
        tp__da_ctx_unref(c);
    }
}

// ---- the thread's current context ------------------------------------------

da_ctx *
tp__da_current(const da_state *x)
{
    return tl_cur != NULL && tl_cur->c_x == x ? tl_cur : NULL;
}

da_ctx *
tp__da_set_current(da_ctx *c)
{
    da_ctx *prev = tl_cur;
    tl_cur = c;
    return prev;
}

// ---- public API ------------------------------------------------------------

static tp_status
state_or_fail(const tp_agent *a, const char *what, da_state **x_p,
              tp_error **err_p)
{
    if (a == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "dist autograd %s: no agent",
                             what);
    }
    da_state *x = tp__da_state_of(a);
    if (x == NULL) {
        return tp__error_set(err_p, TP_ECLOSED,
                             "dist autograd %s: the agent is shut down", what);
    }
    *x_p = x;
    return TP_OK;
}

tp_status
tp_dist_autograd_context_create(tp_agent *a, int64_t *ctx_id_p,
                                tp_error **err_p)
{
    da_state *x = NULL;
    if (state_or_fail(a, "context_create", &x, err_p) != TP_OK) {
        return tp_error_status(*err_p);
    }
    if (ctx_id_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist autograd context_create: ctx_id_p is NULL");
    }
    da_ctx *cur = tp__da_current(x);
    if (cur != NULL && !cur->c_released) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist autograd %s: context %" PRId64
                             " is already current on this thread (contexts "
                             "do not nest; release it first)",
                             tp__da_name(x), cur->c_id);
    }
    uint64_t n = atomic_fetch_add(&x->x_next_ctx, 1);
    int64_t id = (int64_t)(((uint64_t)x->x_rank << DA_CTX_BITS) |
                           (n & ((UINT64_C(1) << DA_CTX_BITS) - 1)));
    da_ctx *c = ctx_new(x, id);
    if (c == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    tp__mtx_lock(&x->x_mtx);
    if (!x->x_attached) {
        tp__mtx_unlock(&x->x_mtx);
        tp__da_ctx_unref(c);
        return tp__error_set(err_p, TP_ECLOSED,
                             "dist autograd %s: the agent is shutting down",
                             tp__da_name(x));
    }
    insert_locked(x, c);
    x->x_st.created++;
    tp__mtx_unlock(&x->x_mtx);
    tp__da_ctx_unref(tp__da_set_current(tp__da_ctx_ref(c)));
    *ctx_id_p = id;
    return TP_OK;
}

tp_status
tp_dist_autograd_context_release(tp_agent *a, int64_t ctx_id, tp_error **err_p)
{
    da_state *x = NULL;
    if (state_or_fail(a, "context_release", &x, err_p) != TP_OK) {
        return tp_error_status(*err_p);
    }
    da_ctx *cur = tp__da_current(x);
    if (cur != NULL && cur->c_id == ctx_id) {
        tp__da_ctx_unref(tp__da_set_current(NULL));
    }
    int creator = (int)((uint64_t)ctx_id >> DA_CTX_BITS);
    if (ctx_id >= 0 && creator != x->x_rank && creator < x->x_world) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist autograd %s: context %" PRId64
                             " was made by rank %d: only its creator "
                             "releases it",
                             tp__da_name(x), ctx_id, creator);
    }
    da_ctx *c = tp__da_ctx_find_or_fail(x, ctx_id, "context_release", err_p);
    if (c == NULL) {
        return TP_ENOENT;
    }
    tp__da_ctx_release(c, true, -1);
    tp__da_ctx_unref(c);
    return TP_OK;
}

tp_status
tp_dist_autograd_set_current(tp_agent *a, int64_t ctx_id, tp_error **err_p)
{
    da_state *x = NULL;
    if (state_or_fail(a, "set_current", &x, err_p) != TP_OK) {
        return tp_error_status(*err_p);
    }
    da_ctx *c = NULL;
    if (ctx_id != -1) {
        c = tp__da_ctx_find_or_fail(x, ctx_id, "set_current", err_p);
        if (c == NULL) {
            return TP_ENOENT;
        }
    }
    tp__da_ctx_unref(tp__da_set_current(c));
    return TP_OK;
}

int64_t
tp_dist_autograd_current(const tp_agent *a)
{
    da_state *x = tp__da_state_of(a);
    da_ctx *c = x != NULL ? tp__da_current(x) : NULL;
    return c != NULL && !c->c_released ? c->c_id : -1;
}

tp_status
tp_dist_autograd_get_gradients(tp_agent *a, int64_t ctx_id, tp_grad_map **map_p,
                               tp_error **err_p)
{
    da_state *x = NULL;
    if (state_or_fail(a, "get_gradients", &x, err_p) != TP_OK) {
        return tp_error_status(*err_p);
    }
    da_ctx *c = tp__da_ctx_find_or_fail(x, ctx_id, "get_gradients", err_p);
    if (c == NULL) {
        return TP_ENOENT;
    }
    // No pass of this context may accumulate while the copy is made.
    tp__mtx_lock(&c->c_run);
    tp_status st = tp_grad_map_copy(c->c_grads, map_p, err_p);
    tp__mtx_unlock(&c->c_run);
    tp__da_ctx_unref(c);
    return st;
}

tp_status
tp_dist_autograd_get_stats(const tp_agent *a, tp_dist_autograd_stats *st_p)
{
    da_state *x = tp__da_state_of(a);
    if (x == NULL || st_p == NULL) {
        return TP_EINVAL;
    }
    tp__mtx_lock(&x->x_mtx);
    *st_p = x->x_st;
    tp__mtx_unlock(&x->x_mtx);
    return TP_OK;
}
