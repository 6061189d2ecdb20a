// SPDX-License-Identifier: Apache-2.0
// kinds.c - the handlers of the RRef protocol's messages on the worker
// that receives them (docs/rref.md):
//
//   REMOTE        owner: register the creator's fork, run the function or
//                 constructor on the pool, keep the result as the value
//   FETCH         owner: the value (at once when it exists, else when it
//                 does)
//   FORK          owner: a user tells of the fork it received
//   CHILD_ACCEPT  parent: the fork it passed on is known; let go
//   DELETE        owner: a user RRef is gone
//   CALL          owner: run a function (the value as RRef 0) or a method
//
// Every first step runs on the loop thread in the order messages arrive on
// their pipe, which keeps one user's REMOTE, FORK, DELETE in order.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "agent/agent_int.h"
#include "core/alloc.h"
#include "core/log.h"
#include "rr_impl.h"

// ---- helpers ---------------------------------------------------------------

static tp_error *
decode(rr_ctx *x, const tp__proto_msg *m, rr_msg *out)
{
    tp_error *err = NULL;
    tp__rr_hdr_decode(m->pm_kind, m->pm_hdr, m->pm_hdr_len,
                      (uint32_t)m->pm_from, (uint32_t)x->x_world, out, &err);
    return err;
}

static tp__proto_verdict
done(tp_args *result, tp_args **result_p)
{
    *result_p = result;
    return TP__PROTO_DONE;
}

static tp__proto_verdict
fail(tp_error *err, tp_error **err_p)
{
    *err_p = err;
    return TP__PROTO_DONE;
}

static tp_future *
future_new(rr_ctx *x)
{
    tp_future *f = NULL;
    if (tp_future_create(&f) != TP_OK) {
        return NULL;
    }
    tp__agent_bind_future(x->x_agent, f);
    return f;
}

static void
call_info(rr_ctx *x, const tp__proto_msg *m, const char *name,
          tp_rpc_call_info *ci)
{
    memset(ci, 0, sizeof(*ci));
    ci->agent = x->x_agent;
    ci->fn_name = name;
    ci->caller = tp__agent_worker(x->x_agent, m->pm_from);
}

static const char *
my_name(rr_ctx *x)
{
    return tp__agent_worker(x->x_agent, x->x_rank)->name;
}

// ---- REMOTE ----------------------------------------------------------------

typedef struct remote_job {
    tp_rref *j_rref;   // held (r_holds)
    tp_rref *j_target; // PROXY: held (r_holds)
    tp_future *j_reply;
    tp_args *j_in; // PROXY: the args with the target first
    uint32_t j_flags;
} remote_job;

static void
job_free(remote_job *j)
{
    if (j->j_target != NULL) {
        tp__rr_owner_unhold(j->j_target);
    }
    tp__rr_owner_unhold(j->j_rref);
    tp_args_unref(j->j_in);
    tp_future_unref(j->j_reply);
    tp__free(j);
}

static tp__proto_verdict
remote_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp,
               void **ctx_p, tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    if (m->pm_name == NULL) {
        return fail(tp__error_new(TP_EPROTO, 0, NULL,
                                  "rref REMOTE without a function name"),
                    err_p);
    }
    remote_job *j = tp__zalloc(sizeof(*j));
    if (j == NULL) {
        return fail(tp__error_nomem(), err_p);
    }
    tp__mtx_lock(&x->x_mtx);
    tp_rref *t = NULL;
    if (h.m_flags & RR_REMOTE_PROXY) {
        t = (tp_rref *)tp__rr_map_get(&x->x_owned, h.m_target);
        if (t == NULL) {
            tp__mtx_unlock(&x->x_mtx);
            tp__free(j);
            return fail(tp__error_new(TP_ENOENT, 0, NULL,
                                      "rref: RRef (%u:%" PRIu64
                                      ") is not owned by %s (rank %d)",
                                      h.m_target.w, h.m_target.n, my_name(x),
                                      x->x_rank),
                        err_p);
        }
    }
    tp_rref *r = tp__rr_owner_get_locked(x, h.m_id, m->pm_from);
    if (r == NULL || r->r_creating ||
        tp__rr_fork_add_locked(x, r, h.m_fork, m->pm_from) != TP_OK) {
        bool dup = r != NULL && r->r_creating;
        if (r != NULL) {
            tp__rr_owner_maybe_delete_locked(x, r);
        }
        tp__mtx_unlock(&x->x_mtx);
        tp__rr_flush(x);
        tp__free(j);
        return fail(dup ? tp__error_new(TP_EPROTO, 0, NULL,
                                        "rref REMOTE: RRef (%u:%" PRIu64
                                        ") created twice",
                                        h.m_id.w, h.m_id.n)
                        : tp__error_nomem(),
                    err_p);
    }
    r->r_creating = true;
    r->r_creator = m->pm_from;
    r->r_is_object = (h.m_flags & RR_REMOTE_OBJECT) != 0;
    snprintf(r->r_what, sizeof(r->r_what), "%.*s", (int)m->pm_name_len,
             m->pm_name);
    r->r_holds++;
    j->j_rref = tp__rr_hold(r);
    if (t != NULL) {
        t->r_holds++;
        j->j_target = tp__rr_hold(t);
    }
    j->j_flags = h.m_flags;
    tp__mtx_unlock(&x->x_mtx);
    *ctx_p = j;
    (void)result_p;
    return TP__PROTO_RUN;
}

// The function's result is the value; the creator gets an ack or the
// error.
static void
remote_done(tp_future *f, void *arg)
{
    remote_job *j = arg;
    const tp_error *err = tp_future_error(f);
    rr_ctx *x = j->j_rref->r_ctx;
    if (err != NULL) {
        // Kept in the value for every later to_here, naming the owner.
        tp_error *e = tp__error_new(
            tp_error_status(err), 0, NULL,
            "rref: creating RRef (%u:%" PRIu64 ") on %s (rank %d) failed: %s",
            j->j_rref->r_id.w, j->j_rref->r_id.n, my_name(x), x->x_rank,
            tp_error_message(err));
        tp__rr_owner_set_value(j->j_rref, NULL, NULL, e);
        tp_future_set_error(j->j_reply, e);
        tp_error_unref(e);
    } else {
        tp_args *v = tp_future_value(f);
        if (v == NULL) {
            tp__ag_args_create_empty(0, &v); // NULL on ENOMEM: an empty value
        } else {
            tp_args_ref(v);
        }
        tp__rr_owner_set_value(j->j_rref, v, (tp_future_free_fn)tp_args_unref,
                               NULL);
        tp_future_set_value(j->j_reply, NULL, NULL);
    }
    tp_future_unref(f);
    job_free(j);
}

static tp_future *
remote_run(void *state, const tp__proto_msg *m, void *ctx)
{
    rr_ctx *x = state;
    remote_job *j = ctx;
    char name[TP_RPC_MAX_FN_NAME + 1];
    snprintf(name, sizeof(name), "%.*s", (int)m->pm_name_len, m->pm_name);
    j->j_reply = future_new(x);
    if (j->j_reply == NULL) {
        job_free(j);
        return NULL;
    }
    tp_future *reply = tp_future_ref(j->j_reply);
    if (j->j_flags & RR_REMOTE_OBJECT) {
        // A constructor: the object is the value.
        tp_error *err = NULL;
        rr_obj *o = NULL;
        const rr_type *t = tp__rr_type_find(name, strlen(name));
        if (t == NULL) {
            err = tp__error_new(TP_ENOENT, 0, NULL,
                                "remote type \"%s\" is not registered on %s "
                                "(rank %d)",
                                name, my_name(x), x->x_rank);
        } else {
            tp_rpc_call_info ci;
            call_info(x, m, tp__rr_type_name(t), &ci);
            tp__rr_obj_create(t, &ci, m->pm_args, &o, &err);
        }
        if (err != NULL) {
            tp__rr_owner_set_value(j->j_rref, NULL, NULL, err);
            tp_future_set_error(j->j_reply, err);
            tp_error_unref(err);
        } else {
            tp__rr_owner_set_value(j->j_rref, o, tp__rr_obj_free, NULL);
            tp_future_set_value(j->j_reply, NULL, NULL);
        }
        job_free(j);
        return reply;
    }
    const tp_args *in = m->pm_args;
    if (j->j_target != NULL) {
        if (tp__ag_args_copy(in, false, j->j_target, &tp__rr_obj_ops, &j->j_in,
                             NULL) != TP_OK) {
            tp_future_set_error(j->j_reply, tp__error_nomem());
            job_free(j);
            return reply;
        }
        in = j->j_in;
    }
    tp_future *f = tp__agent_run_fn(x->x_agent, m->pm_from, name, in);
    if (f == NULL || tp_future_then(f, remote_done, j) != TP_OK) {
        tp_future_unref(f);
        tp__rr_owner_set_value(j->j_rref, NULL, NULL, tp__error_nomem());
        tp_future_set_error(j->j_reply, tp__error_nomem());
        job_free(j);
    }
    return reply;
}

// ---- FETCH and CALL: waiting for the value ---------------------------------

typedef struct value_job {
    tp_task v_task;  // CALL: the call's own pool task
    tp_future *v_vf; // CALL: the value, for the task (referenced)
    tp_rref *v_rref; // held (r_holds)
    tp_future *v_reply;
    tp_args *v_in; // CALL: the args
    rr_ctx *v_ctx;
    tp__proto_msg v_msg; // CALL: for the call info (name copied)
    char v_name[TP_RPC_MAX_FN_NAME + 1];
    uint32_t v_flags;
    bool v_call;
} value_job;

// The owner RRef @id with a hold for an operation, or a placeholder when
// its creation has not arrived yet.
static tp_rref *
hold_value_locked(rr_ctx *x, rr_id id)
{
    tp_rref *r = tp__rr_owner_get_locked(x, id, (int)id.w);
    if (r != NULL) {
        r->r_holds++;
        tp__rr_hold(r);
    }
    return r;
}

static void
vjob_free(value_job *v)
{
    tp__rr_owner_unhold(v->v_rref);
    tp_args_unref(v->v_in);
    tp_future_unref(v->v_reply);
    tp__free(v);
}

static void
call_done(tp_future *f, void *arg)
{
    value_job *v = arg;
    const tp_error *err = tp_future_error(f);
    if (err != NULL) {
        tp_future_set_error(v->v_reply, err);
    } else {
        tp_args *res = tp_future_value(f);
        tp_future_set_value(v->v_reply, res != NULL ? tp_args_ref(res) : NULL,
                            (tp_future_free_fn)tp_args_unref);
    }
    tp_future_unref(f);
    vjob_free(v);
}

static void value_work(value_job *v, tp_future *vf);

static void
value_task(void *arg)
{
    value_job *v = arg;
    value_work(v, v->v_vf);
}

// Pool (a callback of the value's future): the value exists now. The
// future's callbacks run one after the other; a CALL (a function or a
// method, user code that may take long or wait) goes on to a pool task of
// its own, so calls on one value or object run concurrently (a type with
// `serialize` orders its methods itself).
static void
value_ready(tp_future *vf, void *arg)
{
    value_job *v = arg;
    rr_ctx *x = v->v_ctx;
    if (v->v_call && tp_future_error(vf) == NULL) {
        v->v_vf = vf;
        tp__task_init(&v->v_task, value_task, v);
        if (tp__agent_submit(x->x_agent, &v->v_task) == TP_OK) {
            return;
        }
    }
    value_work(v, vf);
}

static void
value_work(value_job *v, tp_future *vf)
{
    rr_ctx *x = v->v_ctx;
    const tp_error *verr = tp_future_error(vf);
    void *val = tp_future_value(vf);
    if (verr != NULL) {
        tp_future_set_error(v->v_reply, verr);
        vjob_free(v);
        tp_future_unref(vf);
        return;
    }
    tp_args *out = NULL;
    tp_error *err = NULL;
    if (v->v_flags & RR_CALL_COPY) {
        // to_here on the owner: a copy, as a remote worker would get.
        if (v->v_rref->r_is_object) {
            tp__rr_obj_to_args(val, &out, &err);
        } else {
            tp_status st = tp__ag_args_clone(val, &out, &err);
            (void)st;
        }
    } else if (!v->v_call) {
        // FETCH: the value itself goes back (its bytes and tensors are
        // written from where they are; RRefs in it are forked).
        if (v->v_rref->r_is_object) {
            tp__rr_obj_to_args(val, &out, &err);
        } else {
            out = val != NULL ? tp_args_ref(val) : NULL;
        }
    } else if (v->v_flags & RR_CALL_METHOD) {
        if (!v->v_rref->r_is_object) {
            err = tp__error_new(TP_EINVAL, 0, NULL,
                                "rref: method \"%s\" called on %s, whose "
                                "value is not an object",
                                v->v_name, my_name(x));
        } else {
            tp_rpc_call_info ci;
            call_info(x, &v->v_msg, v->v_name, &ci);
            void *toks[TP__PROTO_MAX];
            tp__agent_run_begin(x->x_agent, v->v_in, toks);
            tp__rr_obj_call(val, v->v_name, strlen(v->v_name), &ci, v->v_in,
                            &out, &err);
            tp__agent_run_end(x->x_agent, toks);
        }
    } else {
        tp_args *in = NULL;
        if (tp__ag_args_copy(v->v_in, false, v->v_rref, &tp__rr_obj_ops, &in,
                             NULL) != TP_OK) {
            err = tp_error_ref((tp_error *)tp__error_nomem());
        } else {
            tp_future *f =
                tp__agent_run_fn(x->x_agent, v->v_msg.pm_from, v->v_name, in);
            tp_args_unref(in);
            if (f != NULL && tp_future_then(f, call_done, v) == TP_OK) {
                tp_future_unref(vf);
                return;
            }
            tp_future_unref(f);
            err = tp_error_ref((tp_error *)tp__error_nomem());
        }
    }
    if (err != NULL) {
        tp_future_set_error(v->v_reply, err);
        tp_error_unref(err);
        tp_args_unref(out);
    } else {
        tp_future_set_value(v->v_reply, out, (tp_future_free_fn)tp_args_unref);
    }
    vjob_free(v);
    tp_future_unref(vf);
}

static tp_future *
value_run(rr_ctx *x, const tp__proto_msg *m, value_job *v)
{
    v->v_ctx = x;
    v->v_reply = future_new(x);
    tp_future *vf = tp__rr_owner_value(v->v_rref);
    if (v->v_reply == NULL || vf == NULL) {
        tp_future_unref(vf);
        vjob_free(v);
        return NULL;
    }
    if (v->v_call) {
        if (m->pm_args != NULL) {
            v->v_in = tp_args_ref(m->pm_args);
        } else if (tp__ag_args_create_empty(0, &v->v_in) != TP_OK) {
            tp_future_unref(vf);
            vjob_free(v);
            return NULL;
        }
        v->v_msg = *m;
        v->v_msg.pm_args = NULL;
        v->v_msg.pm_hdr = NULL;
        v->v_msg.pm_name = NULL;
        snprintf(v->v_name, sizeof(v->v_name), "%.*s", (int)m->pm_name_len,
                 m->pm_name != NULL ? m->pm_name : "");
    }
    tp_future *reply = tp_future_ref(v->v_reply);
    if (tp_future_then(vf, value_ready, v) != TP_OK) {
        tp_future_unref(vf);
        tp_future_set_error(v->v_reply, tp__error_nomem());
        vjob_free(v);
    }
    return reply;
}

// FETCH and CALL wait for the value without a pool thread: the reply
// future goes back to the agent (WAIT); the work runs in value_ready, on
// the thread that creates the value (or on the pool if it exists).
static tp__proto_verdict
wait_value(rr_ctx *x, const tp__proto_msg *m, value_job *v, void **ctx_p,
           tp_error **err_p)
{
    tp_future *f = value_run(x, m, v);
    if (f == NULL) {
        return fail(tp__error_nomem(), err_p);
    }
    *ctx_p = f;
    return TP__PROTO_WAIT;
}

static tp__proto_verdict
fetch_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp, void **ctx_p,
              tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    // The fast path: a value that exists goes back from here, the loop
    // thread (an object's copy is user code: the pool makes it).
    tp__mtx_lock(&x->x_mtx);
    tp_rref *r = (tp_rref *)tp__rr_map_get(&x->x_owned, h.m_id);
    tp_future *vf = r != NULL ? r->r_value : NULL;
    if (vf != NULL && tp_future_is_done(vf) && !r->r_is_object) {
        const tp_error *verr = tp_future_error(vf);
        tp_args *out = tp_future_value(vf);
        tp_error *err = NULL;
        if (verr != NULL) {
            err = tp_error_ref((tp_error *)verr);
        } else if (out != NULL) {
            tp_args_ref(out);
        }
        tp__mtx_unlock(&x->x_mtx);
        return err != NULL ? fail(err, err_p) : done(out, result_p);
    }
    value_job *v = tp__zalloc(sizeof(*v));
    r = v != NULL ? hold_value_locked(x, h.m_id) : NULL;
    tp__mtx_unlock(&x->x_mtx);
    if (r == NULL) {
        tp__free(v);
        return fail(tp__error_nomem(), err_p);
    }
    v->v_rref = r;
    // Answered by the thread that sets the value (a pool thread), with no
    // hand-over in between.
    return wait_value(x, m, v, ctx_p, err_p);
}

// Local versions for an owner on this worker: the same steps, started by
// the caller's thread instead of a message.
tp_future *
tp__rr_local_call(rr_ctx *x, tp_rref *r, uint32_t flags, const char *name,
                  tp_args *in)
{
    value_job *v = tp__zalloc(sizeof(*v));
    if (v == NULL) {
        tp_args_unref(in);
        return NULL;
    }
    tp__mtx_lock(&x->x_mtx);
    r->r_holds++;
    v->v_rref = tp__rr_hold(r);
    tp__mtx_unlock(&x->x_mtx);
    v->v_call = true;
    v->v_flags = flags;
    tp__proto_msg m = {.pm_agent = x->x_agent,
                       .pm_from = x->x_rank,
                       .pm_kind = RR_KIND_CALL,
                       .pm_name = name,
                       .pm_name_len = strlen(name),
                       .pm_args = in};
    tp_future *f = value_run(x, &m, v);
    tp_args_unref(in); // value_run took its own reference
    return f;
}

tp_future *
tp__rr_local_remote(rr_ctx *x, tp_rref *r, uint32_t flags, tp_rref *target,
                    const char *name, tp_args *in)
{
    remote_job *j = tp__zalloc(sizeof(*j));
    if (j == NULL) {
        tp_args_unref(in);
        return NULL;
    }
    tp__mtx_lock(&x->x_mtx);
    r->r_holds++;
    r->r_creating = true;
    j->j_rref = tp__rr_hold(r);
    if (target != NULL) {
        target->r_holds++;
        j->j_target = tp__rr_hold(target);
    }
    tp__mtx_unlock(&x->x_mtx);
    j->j_flags = flags;
    tp__proto_msg m = {.pm_agent = x->x_agent,
                       .pm_from = x->x_rank,
                       .pm_kind = RR_KIND_REMOTE,
                       .pm_name = name,
                       .pm_name_len = strlen(name),
                       .pm_args = in};
    tp_future *f = remote_run(x, &m, j);
    tp_args_unref(in);
    return f;
}

static tp__proto_verdict
call_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp, void **ctx_p,
             tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    (void)result_p;
    if (m->pm_name == NULL) {
        return fail(tp__error_new(TP_EPROTO, 0, NULL,
                                  "rref CALL without a function or method"),
                    err_p);
    }
    value_job *v = tp__zalloc(sizeof(*v));
    if (v == NULL) {
        return fail(tp__error_nomem(), err_p);
    }
    tp__mtx_lock(&x->x_mtx);
    tp_rref *r = hold_value_locked(x, h.m_id);
    tp__mtx_unlock(&x->x_mtx);
    if (r == NULL) {
        tp__free(v);
        return fail(tp__error_nomem(), err_p);
    }
    v->v_rref = r;
    v->v_call = true;
    v->v_flags = h.m_flags;
    return wait_value(x, m, v, ctx_p, err_p);
}

// ---- FORK, CHILD_ACCEPT, DELETE: bookkeeping on the loop -------------------

static tp__proto_verdict
fork_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp, void **ctx_p,
             tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    (void)ctx_p;
    tp__mtx_lock(&x->x_mtx);
    tp_rref *r = tp__rr_owner_get_locked(x, h.m_id, (int)h.m_id.w);
    tp_status st = r != NULL
                       ? tp__rr_fork_add_locked(x, r, h.m_fork, m->pm_from)
                       : TP_ENOMEM;
    tp__mtx_unlock(&x->x_mtx);
    if (st != TP_OK) {
        return fail(st == TP_ENOMEM
                        ? tp__error_nomem()
                        : tp__error_new(TP_EPROTO, 0, NULL,
                                        "rref FORK: fork (%u:%" PRIu64
                                        ") is known already",
                                        h.m_fork.w, h.m_fork.n),
                    err_p);
    }
    return done(NULL, result_p);
}

static tp__proto_verdict
child_accept_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp,
                     void **ctx_p, tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    (void)ctx_p;
    tp__mtx_lock(&x->x_mtx);
    bool known = tp__rr_child_done_locked(x, h.m_fork, m->pm_from);
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
    if (!known) {
        // A fork dropped meanwhile (the child was thought dead).
        TP_LOG_DEBUG("TP-RREF-CHILD",
                     "rref %s: rank %d accepted fork (%u:%" PRIu64
                     ") that is not pending here",
                     my_name(x), m->pm_from, h.m_fork.w, h.m_fork.n);
    }
    return done(NULL, result_p);
}

static tp__proto_verdict
delete_on_loop(rr_ctx *x, const tp__proto_msg *m, const rr_msg *hp,
               void **ctx_p, tp_args **result_p, tp_error **err_p)
{
    rr_msg h = *hp;
    (void)ctx_p;
    tp__mtx_lock(&x->x_mtx);
    rr_fork *f = (rr_fork *)tp__rr_map_get(&x->x_forks, h.m_fork);
    bool ok = f != NULL && rr_id_eq(f->f_rref->r_id, h.m_id) &&
              tp__rr_fork_del_locked(x, h.m_fork, m->pm_from);
    tp__mtx_unlock(&x->x_mtx);
    tp__rr_flush(x);
    if (!ok) {
        TP_LOG_DEBUG("TP-RREF-DELETE",
                     "rref %s: rank %d deleted fork (%u:%" PRIu64
                     ") of RRef (%u:%" PRIu64 "), which is not known here",
                     my_name(x), m->pm_from, h.m_fork.w, h.m_fork.n, h.m_id.w,
                     h.m_id.n);
    }
    return done(NULL, result_p);
}

// Loop thread: every kind's header is checked here first (a malformed
// one is answered with TP_EPROTO), then its own step runs.
static tp__proto_verdict
kind_on_loop(void *state, const tp__proto_msg *m, void **ctx_p,
             tp_args **result_p, tp_error **err_p)
{
    rr_ctx *x = state;
    rr_msg h;
    tp_error *err = decode(x, m, &h);
    if (err != NULL) {
        return fail(err, err_p);
    }
    switch (m->pm_kind) {
    case RR_KIND_REMOTE:
        return remote_on_loop(x, m, &h, ctx_p, result_p, err_p);
    case RR_KIND_FETCH:
        return fetch_on_loop(x, m, &h, ctx_p, result_p, err_p);
    case RR_KIND_CALL:
        return call_on_loop(x, m, &h, ctx_p, result_p, err_p);
    case RR_KIND_FORK:
        return fork_on_loop(x, m, &h, ctx_p, result_p, err_p);
    case RR_KIND_CHILD_ACCEPT:
        return child_accept_on_loop(x, m, &h, ctx_p, result_p, err_p);
    default:
        return delete_on_loop(x, m, &h, ctx_p, result_p, err_p);
    }
}

const tp__proto_kind tp__rr_kinds[RR_NKINDS] = {
    {RR_KIND_REMOTE, "RREF_REMOTE", kind_on_loop, remote_run, false},
    {RR_KIND_FETCH, "RREF_FETCH", kind_on_loop, NULL, false},
    {RR_KIND_FORK, "RREF_FORK", kind_on_loop, NULL, false},
    {RR_KIND_CHILD_ACCEPT, "RREF_CHILD_ACCEPT", kind_on_loop, NULL, true},
    {RR_KIND_DELETE, "RREF_DELETE", kind_on_loop, NULL, true},
    {RR_KIND_CALL, "RREF_CALL", kind_on_loop, NULL, false},
};
