// SPDX-License-Identifier: Apache-2.0
// rref.c - the public RRef API (rref.h): remote(), local RRefs, handles,
// to_here, local values, RRefs in args, proxies, remote objects' calls.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "agent/wire.h"
#include "core/alloc.h"
#include "core/platform.h"
#include "rr_impl.h"

static rr_ctx *
ctx_of(tp_agent *a, tp_error **err_p)
{
    rr_ctx *x = tp__rr_ctx_get(a);
    if (x == NULL) {
        tp__error_set(err_p, TP_ECLOSED, "rref: the agent is shut down");
    }
    return x;
}

static tp_future *
failed_future(tp_error *err)
{
    tp_future *f = NULL;
    if (tp_future_create(&f) == TP_OK) {
        tp_future_set_error(f, err);
    }
    tp_error_unref(err);
    return f;
}

// ---- creating --------------------------------------------------------------

typedef struct remote_wait {
    tp_rref *w_rref; // held
    char w_fn[TP_RPC_MAX_FN_NAME + 1];
} remote_wait;

// The creator's REMOTE was answered: the user RRef is confirmed, or
// carries why its creation failed.
static void
remote_reply(tp_future *f, void *arg)
{
    remote_wait *w = arg;
    const tp_error *err = tp_future_error(f);
    tp_error *e = NULL;
    if (err != NULL) {
        char who[TP_RPC_MAX_NAME + 96];
        tp__rr_describe(w->w_rref, who, sizeof(who));
        e = tp__error_new(tp_error_status(err), 0, err,
                          "rref: creating %s with \"%s\"%s", who, w->w_fn,
                          tp_error_status(err) == TP_ETIMEDOUT ? " timed out"
                                                               : "");
    }
    tp__rr_user_confirm(w->w_rref, e);
    tp_error_unref(e);
    tp__rr_release(w->w_rref);
    tp__free(w);
    tp_future_unref(f);
}

// remote(), construction of an object (RR_REMOTE_OBJECT) and rref.remote()
// (RR_REMOTE_PROXY of @target, which must be owned by @to).
static tp_status
remote_start(tp_agent *a, int to, const char *name, const tp_args *in,
             int64_t timeout_ms, uint32_t flags, tp_rref *target,
             tp_rref **rref_p, tp_error **err_p)
{
    if (rref_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "rref: remote without rref_p");
    }
    *rref_p = NULL;
    rr_ctx *x = ctx_of(a, err_p);
    if (x == NULL) {
        return TP_ECLOSED;
    }
    size_t nlen = name != NULL ? strlen(name) : 0;
    if (name == NULL || !tp__ag_fn_name_valid(name, nlen)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rref: remote %s \"%s\": 1..255 of "
                             "[A-Za-z0-9_.:/-]",
                             (flags & RR_REMOTE_OBJECT) ? "type" : "function",
                             name != NULL ? name : "(null)");
    }
    const tp_worker_info *wi = tp__agent_worker(a, to);
    if (wi == NULL) {
        return tp__error_set(err_p, TP_ENOENT,
                             "rref: remote \"%s\": no worker of rank %d", name,
                             to);
    }
    rr_id id = tp__rr_next_id(x);
    tp_rref *r;
    if (to == x->x_rank) {
        // Owned here: the function runs on our pool with a copy of the
        // arguments, as for a call to self.
        tp_args *copy = NULL;
        tp_status st = tp__ag_args_clone(in, &copy, err_p);
        if (st != TP_OK) {
            return st;
        }
        tp__mtx_lock(&x->x_mtx);
        r = tp__rr_owner_new_locked(x, id, x->x_rank, name);
        if (r != NULL) {
            r->r_users = 1;
            r->r_is_object = (flags & RR_REMOTE_OBJECT) != 0;
            tp__rr_hold(r);
        }
        tp__mtx_unlock(&x->x_mtx);
        if (r == NULL) {
            tp_args_unref(copy);
            return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
        }
        tp_future *f = tp__rr_local_remote(x, r, flags, target, name, copy);
        tp_future_unref(f); // the value says how it went
        *rref_p = r;
        return TP_OK;
    }
    remote_wait *w = tp__zalloc(sizeof(*w));
    if (w == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    tp__mtx_lock(&x->x_mtx);
    r = tp__rr_user_new_locked(x, id, id, to, false,
                               (flags & RR_REMOTE_OBJECT) != 0);
    tp__mtx_unlock(&x->x_mtx);
    if (r == NULL) {
        tp__free(w);
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    snprintf(r->r_what, sizeof(r->r_what), "%s", name);
    w->w_rref = tp__rr_hold(r);
    snprintf(w->w_fn, sizeof(w->w_fn), "%s", name);
    rr_msg m = {.m_id = id, .m_fork = id, .m_flags = flags};
    if (target != NULL) {
        m.m_target = target->r_id;
    }
    uint8_t hdr[64];
    tp__rr_hdr_encode(RR_KIND_REMOTE, &m, hdr);
    tp_future *f = tp__agent_call_kind(a, to, RR_KIND_REMOTE, hdr,
                                       tp__rr_hdr_size(RR_KIND_REMOTE), name,
                                       in, timeout_ms);
    if (f == NULL || tp_future_then(f, remote_reply, w) != TP_OK) {
        tp_future_unref(f);
        tp__rr_user_confirm(r, tp__error_nomem());
        tp__rr_release(r);
        tp__free(w);
    }
    *rref_p = r;
    return TP_OK;
}

tp_status
tp_remote_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
               int64_t timeout_ms, tp_rref **rref_p, tp_error **err_p)
{
    return remote_start(a, to, fn_name, in, timeout_ms, 0, NULL, rref_p, err_p);
}

tp_status
tp_remote(tp_agent *a, const char *to, const char *fn_name, const tp_args *in,
          int64_t timeout_ms, tp_rref **rref_p, tp_error **err_p)
{
    tp_worker_info wi;
    if (to == NULL || tp_rpc_get_worker_info(a, to, &wi) != TP_OK) {
        if (rref_p != NULL) {
            *rref_p = NULL;
        }
        return tp__error_set(
            err_p, TP_ENOENT, "rref: remote \"%s\": no worker named \"%s\"",
            fn_name != NULL ? fn_name : "(null)", to != NULL ? to : "(null)");
    }
    return tp_remote_rank(a, wi.rank, fn_name, in, timeout_ms, rref_p, err_p);
}

tp_status
tp_rref_create(tp_agent *a, tp_args *value, tp_rref **rref_p, tp_error **err_p)
{
    if (rref_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "rref: create without rref_p");
    }
    *rref_p = NULL;
    rr_ctx *x = ctx_of(a, err_p);
    if (x == NULL) {
        return TP_ECLOSED;
    }
    tp_args *v = value;
    if (v == NULL && tp__ag_args_create_empty(0, &v) != TP_OK) {
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    } else if (value != NULL) {
        tp_args_ref(value);
    }
    tp__mtx_lock(&x->x_mtx);
    tp_rref *r =
        tp__rr_owner_new_locked(x, tp__rr_next_id(x), x->x_rank, "RRef(value)");
    if (r != NULL) {
        r->r_users = 1;
        r->r_created = true;
        r->r_creating = true;
        tp__rr_hold(r);
    }
    tp__mtx_unlock(&x->x_mtx);
    if (r == NULL) {
        tp_args_unref(v);
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    tp_future_set_value(r->r_value, v, (tp_future_free_fn)tp_args_unref);
    *rref_p = r;
    return TP_OK;
}

// ---- handles ---------------------------------------------------------------

tp_rref *
tp_rref_ref(tp_rref *r)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    r->r_users++;
    tp__mtx_unlock(&x->x_mtx);
    return tp__rr_hold(r);
}

void
tp_rref_unref(tp_rref *r)
{
    if (r == NULL) {
        return;
    }
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    TP_ASSERT(r->r_users > 0);
    if (--r->r_users == 0) {
        if (r->r_is_owner) {
            tp__rr_owner_maybe_delete_locked(x, r);
        } else {
            r->r_released = true;
            tp__rr_user_maybe_delete_locked(x, r);
        }
    }
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
    tp__rr_release(r); // may free @r and the context: last
}

// ---- what it is ------------------------------------------------------------

bool
tp_rref_is_owner(const tp_rref *r)
{
    return r->r_is_owner;
}

tp_status
tp_rref_owner(const tp_rref *r, tp_worker_info *wi_p)
{
    const tp_worker_info *wi = tp__agent_worker(r->r_ctx->x_agent, r->r_owner);
    if (wi == NULL || wi_p == NULL) {
        return TP_EINVAL;
    }
    *wi_p = *wi;
    return TP_OK;
}

const char *
tp_rref_owner_name(const tp_rref *r)
{
    const tp_worker_info *wi = tp__agent_worker(r->r_ctx->x_agent, r->r_owner);
    return wi != NULL ? wi->name : "";
}

bool
tp_rref_confirmed_by_owner(const tp_rref *r)
{
    return r->r_is_owner || tp_future_is_done(r->r_confirm);
}

const tp_error *
tp_rref_error(const tp_rref *r)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    const tp_error *e = r->r_err;
    if (e == NULL && r->r_is_owner && r->r_value != NULL &&
        tp_future_is_done(r->r_value)) {
        e = tp_future_error(r->r_value);
    }
    tp__mtx_unlock(&x->x_mtx);
    return e;
}

void
tp_rref_id(const tp_rref *r, uint32_t *creator_p, uint64_t *local_p,
           uint32_t *fork_creator_p, uint64_t *fork_local_p)
{
    if (creator_p != NULL) {
        *creator_p = r->r_id.w;
    }
    if (local_p != NULL) {
        *local_p = r->r_id.n;
    }
    if (fork_creator_p != NULL) {
        *fork_creator_p = r->r_fork.w;
    }
    if (fork_local_p != NULL) {
        *fork_local_p = r->r_fork.n;
    }
}

// Waits for @f (at most @timeout_ms, 0: none), naming @r and @what in a
// timeout's message.
static tp_status
wait_named(tp_rref *r, tp_future *f, int64_t timeout_ms, const char *what,
           tp_error **err_p)
{
    tp_error *err = NULL;
    tp_status st = tp_rpc_wait(f, timeout_ms, NULL, &err);
    if (st == TP_ETIMEDOUT && !tp_future_is_done(f)) {
        tp_error_unref(err);
        char who[TP_RPC_MAX_NAME + 96];
        tp__rr_describe(r, who, sizeof(who));
        return tp__error_set(err_p, TP_ETIMEDOUT,
                             "%s of %s: timed out after %lld ms", what, who,
                             (long long)timeout_ms);
    }
    if (st != TP_OK) {
        if (err_p != NULL) {
            *err_p = err;
        } else {
            tp_error_unref(err);
        }
    }
    return st;
}

tp_status
tp_rref_wait_created(tp_rref *r, int64_t timeout_ms, tp_error **err_p)
{
    int64_t t = tp__agent_timeout(r->r_ctx->x_agent, timeout_ms);
    if (r->r_is_owner) {
        tp_future *v = tp__rr_owner_value(r);
        if (v == NULL) {
            return tp__error_set(err_p, TP_ECLOSED,
                                 "rref: the value is gone (shut down)");
        }
        tp_status st = wait_named(r, v, t, "waiting for the creation", err_p);
        tp_future_unref(v);
        return st;
    }
    return wait_named(r, r->r_confirm, t, "waiting for the creation", err_p);
}

// ---- the value -------------------------------------------------------------

// The value of owner RRef @r once it exists (@timeout_ms), with a
// reference to its future in *@vf_p.
static tp_status
owner_wait(tp_rref *r, int64_t timeout_ms, tp_future **vf_p, tp_error **err_p)
{
    tp_future *v = tp__rr_owner_value(r);
    if (v == NULL) {
        return tp__error_set(err_p, TP_ECLOSED,
                             "rref: the value is gone (shut down)");
    }
    int64_t t = tp__agent_timeout(r->r_ctx->x_agent, timeout_ms);
    tp_status st = wait_named(r, v, t, "waiting for the value", err_p);
    if (st != TP_OK) {
        tp_future_unref(v);
        return st;
    }
    *vf_p = v;
    return TP_OK;
}

static tp_status
owner_copy(tp_rref *r, tp_future *v, tp_args **out_p, tp_error **err_p)
{
    if (r->r_is_object) {
        return tp__rr_obj_to_args(tp_future_value(v), out_p, err_p);
    }
    return tp__ag_args_clone(tp_future_value(v), out_p, err_p);
}

static tp_status
not_owner(const tp_rref *r, const char *what, tp_error **err_p)
{
    char who[TP_RPC_MAX_NAME + 96];
    tp__rr_describe(r, who, sizeof(who));
    return tp__error_set(
        err_p, TP_EINVAL, "rref: %s only on the owner: %s, this is %s", what,
        who, tp__agent_worker(r->r_ctx->x_agent, r->r_ctx->x_rank)->name);
}

// The FETCH of a user RRef; NULL only without memory.
static tp_future *
fetch(tp_rref *r, int64_t timeout_ms)
{
    rr_msg m = {.m_id = r->r_id};
    uint8_t hdr[RR_ID_BYTES];
    tp__rr_hdr_encode(RR_KIND_FETCH, &m, hdr);
    return tp__agent_call_kind(r->r_ctx->x_agent, r->r_owner, RR_KIND_FETCH,
                               hdr, sizeof(hdr), NULL, NULL, timeout_ms);
}

// A known error of user RRef @r (creation failed, owner died), as a new
// error naming it.
static tp_error *
known_error(tp_rref *r, const char *what)
{
    rr_ctx *x = r->r_ctx;
    tp__mtx_lock(&x->x_mtx);
    tp_error *e = r->r_err != NULL ? tp_error_ref(r->r_err) : NULL;
    bool closed = !x->x_attached;
    tp__mtx_unlock(&x->x_mtx);
    if (e == NULL && !closed) {
        return NULL;
    }
    char who[TP_RPC_MAX_NAME + 96];
    tp__rr_describe(r, who, sizeof(who));
    tp_error *w =
        e != NULL
            ? tp__error_new(tp_error_status(e), 0, e, "%s of %s", what, who)
            : tp__error_new(TP_ECLOSED, 0, NULL,
                            "%s of %s: the agent is shut down", what, who);
    tp_error_unref(e);
    return w;
}

tp_status
tp_rref_to_here(tp_rref *r, int64_t timeout_ms, tp_args **out_p,
                tp_error **err_p)
{
    if (out_p != NULL) {
        *out_p = NULL;
    }
    if (r->r_is_owner) {
        tp_future *v = NULL;
        tp_status st = owner_wait(r, timeout_ms, &v, err_p);
        if (st == TP_OK) {
            tp_args *c = NULL;
            st = owner_copy(r, v, &c, err_p);
            if (st == TP_OK && out_p != NULL) {
                *out_p = c;
            } else {
                tp_args_unref(c);
            }
            tp_future_unref(v);
        }
        return st;
    }
    tp_error *known = known_error(r, "to_here");
    if (known != NULL) {
        tp_status st = tp_error_status(known);
        if (err_p != NULL) {
            *err_p = known;
        } else {
            tp_error_unref(known);
        }
        return st;
    }
    int64_t t = tp__agent_timeout(r->r_ctx->x_agent, timeout_ms);
    tp_future *f = fetch(r, t);
    if (f == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    tp_error *err = NULL;
    tp_status st = tp__agent_wait(r->r_ctx->x_agent, f, t, out_p, &err);
    bool ended = tp_future_is_done(f);
    tp_future_unref(f);
    if (st != TP_OK) {
        char who[TP_RPC_MAX_NAME + 96];
        tp__rr_describe(r, who, sizeof(who));
        if (st == TP_ETIMEDOUT && ended) {
            // The call's own deadline: say which RRef, owner, how long.
            tp__error_set(err_p, st, "to_here of %s: timed out after %lld ms",
                          who, (long long)t);
        } else if (err_p != NULL) {
            *err_p = tp__error_new(st, 0, err, "to_here of %s", who);
        }
        tp_error_unref(err);
    }
    return st;
}

typedef struct here_job {
    tp_rref *h_rref; // held
    tp_future *h_out;
    int64_t h_timeout;
} here_job;

static void
here_done(tp_future *f, void *arg)
{
    here_job *h = arg;
    const tp_error *err = tp_future_error(f);
    if (err != NULL) {
        char who[TP_RPC_MAX_NAME + 96];
        tp__rr_describe(h->h_rref, who, sizeof(who));
        tp_error *e =
            tp_error_status(err) == TP_ETIMEDOUT
                ? tp__error_new(TP_ETIMEDOUT, 0, NULL,
                                "to_here of %s: timed out after %lld ms", who,
                                (long long)h->h_timeout)
                : tp__error_new(tp_error_status(err), 0, err, "to_here of %s",
                                who);
        tp_future_set_error(h->h_out, e);
        tp_error_unref(e);
    } else {
        tp_args *v = tp_future_value(f);
        tp_future_set_value(h->h_out, v != NULL ? tp_args_ref(v) : NULL,
                            (tp_future_free_fn)tp_args_unref);
    }
    tp_future_unref(f);
    tp_future_unref(h->h_out);
    tp__rr_release(h->h_rref);
    tp__free(h);
}

tp_future *
tp_rref_to_here_async(tp_rref *r, int64_t timeout_ms)
{
    if (r->r_is_owner) {
        // A copy of the local value: made on the pool once it exists.
        return tp__rr_local_call(r->r_ctx, r, RR_CALL_COPY, "to_here", NULL);
    }
    tp_error *known = known_error(r, "to_here");
    if (known != NULL) {
        return failed_future(known);
    }
    here_job *h = tp__zalloc(sizeof(*h));
    tp_future *out = NULL;
    if (h == NULL || tp_future_create(&out) != TP_OK) {
        tp__free(h);
        return NULL;
    }
    tp__agent_bind_future(r->r_ctx->x_agent, out);
    h->h_timeout = tp__agent_timeout(r->r_ctx->x_agent, timeout_ms);
    tp_future *f = fetch(r, h->h_timeout);
    h->h_rref = tp__rr_hold(r);
    h->h_out = tp_future_ref(out);
    if (f == NULL || tp_future_then(f, here_done, h) != TP_OK) {
        tp_future_unref(f);
        tp_future_set_error(out, tp__error_nomem());
        tp_future_unref(h->h_out);
        tp__rr_release(h->h_rref);
        tp__free(h);
    }
    return out;
}

// The value on the owner, once created: an args (@object false) or an
// object's state (@object true), borrowed (it lives as long as the RRef:
// its future is r_value).
static tp_status
owner_local(tp_rref *r, bool object, int64_t timeout_ms, void **out_p,
            tp_error **err_p)
{
    const char *what = object ? "local_object" : "local_value";
    if (!r->r_is_owner) {
        return not_owner(r, what, err_p);
    }
    if (r->r_is_object != object) {
        return tp__error_set(
            err_p, TP_EINVAL, "rref: %s of %s (use tp_rref_%s)", what,
            object ? "a value that is not a remote object" : "a remote object",
            object ? "local_value" : "local_object");
    }
    tp_future *v = NULL;
    tp_status st = owner_wait(r, timeout_ms, &v, err_p);
    if (st == TP_OK) {
        void *val = tp_future_value(v);
        *out_p = object ? ((rr_obj *)val)->o_state : val;
        tp_future_unref(v);
    }
    return st;
}

tp_status
tp_rref_local_value(tp_rref *r, int64_t timeout_ms, tp_args **value_p,
                    tp_error **err_p)
{
    void *v = NULL;
    tp_status st = owner_local(r, false, timeout_ms, &v, err_p);
    if (st == TP_OK) {
        *value_p = v;
    }
    return st;
}

tp_status
tp_rref_local_object(tp_rref *obj, int64_t timeout_ms, void **state_p,
                     tp_error **err_p)
{
    return owner_local(obj, true, timeout_ms, state_p, err_p);
}

// ---- RRefs in args ---------------------------------------------------------

tp_status
tp_args_add_rref(tp_args *args, tp_rref *r)
{
    if (args == NULL || r == NULL || tp_args_nrrefs(args) >= TP_RPC_MAX_RREFS) {
        return TP_EINVAL;
    }
    return tp__args_add_obj(args, r, &tp__rr_obj_ops);
}

size_t
tp_args_nrrefs(const tp_args *args)
{
    size_t n = 0;
    for (size_t i = 0; i < tp__args_nobjs(args); i++) {
        const tp__args_obj_ops *ops = NULL;
        tp__args_obj(args, i, &ops);
        n += ops == &tp__rr_obj_ops;
    }
    return n;
}

tp_rref *
tp_args_rref(const tp_args *args, size_t i)
{
    for (size_t k = 0; k < tp__args_nobjs(args); k++) {
        const tp__args_obj_ops *ops = NULL;
        void *o = tp__args_obj(args, k, &ops);
        if (ops == &tp__rr_obj_ops && i-- == 0) {
            return o;
        }
    }
    return NULL;
}

// ---- proxies and methods ---------------------------------------------------

// CALL on the owner of @r: a registered function (RRef 0 = the value) or
// a method of the object.
static tp_future *
call(tp_rref *r, uint32_t flags, const char *name, const tp_args *in,
     int64_t timeout_ms)
{
    size_t nlen = name != NULL ? strlen(name) : 0;
    if (name == NULL || !tp__ag_fn_name_valid(name, nlen)) {
        return failed_future(
            tp__error_new(TP_EINVAL, 0, NULL, "rref: %s name \"%s\"",
                          (flags & RR_CALL_METHOD) ? "method" : "function",
                          name != NULL ? name : "(null)"));
    }
    if ((flags & RR_CALL_METHOD) && !r->r_is_object) {
        char who[TP_RPC_MAX_NAME + 96];
        tp__rr_describe(r, who, sizeof(who));
        return failed_future(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rref: method \"%s\" of %s, whose value is not a remote object",
            name, who));
    }
    rr_ctx *x = r->r_ctx;
    if (r->r_is_owner) {
        tp_args *copy = NULL;
        tp_error *err = NULL;
        if (tp__ag_args_clone(in, &copy, &err) != TP_OK) {
            return failed_future(err);
        }
        return tp__rr_local_call(x, r, flags, name, copy);
    }
    tp_error *known = known_error(r, name);
    if (known != NULL) {
        return failed_future(known);
    }
    rr_msg m = {.m_id = r->r_id, .m_flags = flags};
    uint8_t hdr[RR_ID_BYTES + 8];
    tp__rr_hdr_encode(RR_KIND_CALL, &m, hdr);
    tp_future *f = tp__agent_call_kind(x->x_agent, r->r_owner, RR_KIND_CALL,
                                       hdr, sizeof(hdr), name, in, timeout_ms);
    if (f != NULL) {
        // The program's future: its callbacks run on the pool.
        tp__agent_bind_future(x->x_agent, f);
    }
    return f;
}

static tp_status
call_sync(tp_rref *r, uint32_t flags, const char *name, const tp_args *in,
          int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    int64_t t = tp__agent_timeout(r->r_ctx->x_agent, timeout_ms);
    tp_future *f = call(r, flags, name, in, t);
    if (f == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rref: out of memory");
    }
    tp_status st = tp__agent_wait(r->r_ctx->x_agent, f, t, out_p, err_p);
    tp_future_unref(f);
    return st;
}

tp_future *
tp_rref_rpc_async(tp_rref *r, const char *fn_name, const tp_args *in,
                  int64_t timeout_ms)
{
    return call(r, 0, fn_name, in, timeout_ms);
}

tp_status
tp_rref_rpc_sync(tp_rref *r, const char *fn_name, const tp_args *in,
                 int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return call_sync(r, 0, fn_name, in, timeout_ms, out_p, err_p);
}

tp_status
tp_rref_remote(tp_rref *r, const char *fn_name, const tp_args *in,
               int64_t timeout_ms, tp_rref **out_p, tp_error **err_p)
{
    return remote_start(r->r_ctx->x_agent, r->r_owner, fn_name, in, timeout_ms,
                        RR_REMOTE_PROXY, r, out_p, err_p);
}

tp_future *
tp_remote_call_async(tp_rref *obj, const char *method, const tp_args *in,
                     int64_t timeout_ms)
{
    return call(obj, RR_CALL_METHOD, method, in, timeout_ms);
}

tp_status
tp_remote_call(tp_rref *obj, const char *method, const tp_args *in,
               int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return call_sync(obj, RR_CALL_METHOD, method, in, timeout_ms, out_p, err_p);
}

tp_status
tp_remote_create(tp_agent *a, const char *to, const char *type,
                 const tp_args *in, int64_t timeout_ms, tp_rref **obj_p,
                 tp_error **err_p)
{
    tp_worker_info wi;
    if (obj_p != NULL) {
        *obj_p = NULL;
    }
    if (to == NULL || tp_rpc_get_worker_info(a, to, &wi) != TP_OK) {
        return tp__error_set(
            err_p, TP_ENOENT, "rref: create \"%s\": no worker named \"%s\"",
            type != NULL ? type : "(null)", to != NULL ? to : "(null)");
    }
    tp_rref *r = NULL;
    tp_status st = remote_start(a, wi.rank, type, in, timeout_ms,
                                RR_REMOTE_OBJECT, NULL, &r, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp_rref_wait_created(r, timeout_ms, err_p);
    if (st != TP_OK) {
        tp_rref_unref(r);
        return st;
    }
    *obj_p = r;
    return TP_OK;
}
