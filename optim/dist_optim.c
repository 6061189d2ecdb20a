// SPDX-License-Identifier: Apache-2.0
// dist_optim.c - the DistributedOptimizer (PyTorch's
// torch.distributed.optim.DistributedOptimizer): the parameters are RRefs
// owned by any workers; on each owner a remote object of the type
// "tp.optim.local" holds a tp_optim over the parameters it owns, and a
// step runs every owner's "step" method in parallel, which applies that
// owner's gradients of a distributed autograd context.
//
// The remote type must exist on every worker that owns parameters, and an
// owner may never call tp_dist_optim_create itself. So the optim layer
// installs itself into every RPC agent as a protocol without messages
// (agent/proto.h; "optim" in TP_AGENT_PROTOCOLS): its attach, which runs
// in tp_rpc_init, registers the type once per process. The generated
// protocol list references tp__optim_proto, so a static link keeps this
// file (a constructor attribute would be dropped: STYLE.md, section 9).
//
// Wire (docs/optim.md): the constructor's args are the options
// (tp__op_options_encode, 88 bytes) and an i64le wait in milliseconds, with
// the owner's parameter RRefs; "step" takes an i64le context id and
// returns nothing.
//
// Locks: one, do_step_mtx, held by a step on its owner (and nothing else
// is taken under it but the gradient map's own lock). Like PyTorch's
// _LocalOptimizer.global_lock it is one per process, not per optimizer:
// each trainer makes its own DistributedOptimizer, so one owner holds one
// optimizer per trainer over the same parameters, and their steps must
// not interleave either.

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <tpipe/dist_autograd.h>

#include "agent/proto.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/wire.h"
#include "op_impl.h"

#define DO_TYPE     "tp.optim.local"
#define DO_ARGS_LEN (OP_OPTIONS_WIRE_LEN + 8)

// ---- the owner's side: the remote type --------------------------------------

typedef struct do_local {
    tp_optim *l_opt;
} do_local;

static tp_status
local_create(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             void **state_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    size_t len = 0;
    const uint8_t *b = tp_args_bytes(in, &len);
    tp_optim_options o;
    if (len != DO_ARGS_LEN) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist optim: constructor args of %zu bytes, "
                             "expected %d",
                             len, DO_ARGS_LEN);
    }
    tp_status st = tp__op_options_decode(b, OP_OPTIONS_WIRE_LEN, &o, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t wait_ms = (int64_t)tp__get_u64le(b + OP_OPTIONS_WIRE_LEN);
    size_t n = tp_args_nrrefs(in);
    tp_tensor **ps = tp__zalloc((n > 0 ? n : 1) * sizeof(*ps));
    if (ps == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "dist optim: out of memory for %zu parameters", n);
    }
    // The owner's own RRefs: their values are the args that forward uses,
    // holding the very tensors that distributed autograd's gradient maps
    // are keyed by.
    for (size_t i = 0; i < n && st == TP_OK; i++) {
        tp_args *v = NULL;
        st = tp_rref_local_value(tp_args_rref(in, i), wait_ms, &v, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "dist optim: parameter RRef %zu", i);
        } else if (tp_args_ntensors(v) != 1) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "dist optim: parameter RRef %zu: its value "
                               "holds %zu tensors, expected exactly one",
                               i, tp_args_ntensors(v));
        } else {
            ps[i] = tp_args_tensor(v, 0);
        }
    }
    do_local *l = NULL;
    if (st == TP_OK) {
        l = tp__zalloc(sizeof(*l));
        if (l == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "dist optim: out of memory");
        }
    }
    if (st == TP_OK) {
        st = tp_optim_create(&o, n, ps, &l->l_opt, err_p);
    }
    tp__free(ps);
    if (st != TP_OK) {
        // The caller gets it as the constructor's error, naming this worker.
        tp__free(l);
        return st;
    }
    *state_p = l;
    return TP_OK;
}

static void
local_destroy(void *state, void *arg)
{
    (void)arg;
    do_local *l = state;
    tp_optim_destroy(l->l_opt);
    tp__free(l);
}

static pthread_mutex_t do_step_mtx = PTHREAD_MUTEX_INITIALIZER;

// "step": in = i64le context id. Under do_step_mtx: the steps of every
// optimizer of this process run one at a time.
static tp_status
local_step(const tp_rpc_call_info *call, void *state, const tp_args *in,
           void *arg, tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    do_local *l = state;
    size_t len = 0;
    const uint8_t *b = tp_args_bytes(in, &len);
    if (len != 8) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist optim step: args of %zu bytes, expected "
                             "8 (a context id)",
                             len);
    }
    int64_t ctx_id = (int64_t)tp__get_u64le(b);
    tp_grad_map *map = NULL;
    tp_status st =
        tp_dist_autograd_get_gradients(call->agent, ctx_id, &map, err_p);
    if (st == TP_OK) {
        pthread_mutex_lock(&do_step_mtx);
        st = tp_optim_step(l->l_opt, map, err_p);
        pthread_mutex_unlock(&do_step_mtx);
        tp_grad_map_destroy(map);
    }
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "context %" PRId64, ctx_id);
    }
    *out_p = NULL;
    return TP_OK;
}

static const tp_remote_method do_methods[] = {
    {.name = "step", .fn = local_step},
};

static pthread_once_t do_register_once = PTHREAD_ONCE_INIT;
static tp_status do_register_st = TP_OK;
static tp_error *do_register_err; // kept for the process's lifetime

static void
do_register(void)
{
    tp_remote_type t = {
        .size = sizeof(t),
        .name = DO_TYPE,
        .create = local_create,
        .destroy = local_destroy,
        .methods = do_methods,
        .nmethods = sizeof(do_methods) / sizeof(do_methods[0]),
        // Not `serialize`: do_step_mtx is wider (every optimizer here).
    };
    do_register_st = tp_remote_type_register(&t, &do_register_err);
}

// ---- the protocol that registers the type in every agent --------------------

static tp_status
optim_attach(tp_agent *a, void **state_p, tp_error **err_p)
{
    (void)a;
    pthread_once(&do_register_once, do_register);
    if (do_register_st != TP_OK) {
        return tp__error_set(err_p, do_register_st,
                             "optim: registering the remote type \"%s\": %s",
                             DO_TYPE, tp_error_message(do_register_err));
    }
    // No per-agent state: the type is registered for the process.
    *state_p = NULL;
    return TP_OK;
}

static void
optim_detach(void *state)
{
    (void)state;
}

// A protocol without message kinds or a section: po_id only has to be
// unique among the protocols (rref 1, dist_autograd 2).
const tp__proto_ops tp__optim_proto = {
    .po_name = "optim",
    .po_id = 7,
    .po_attach = optim_attach,
    .po_detach = optim_detach,
};

// ---- the caller's side ------------------------------------------------------

typedef struct do_owner {
    tp_worker_info w_info;
    tp_rref *w_obj; // the remote optimizer on that owner
} do_owner;

struct tp_dist_optim {
    size_t d_nowners;
    do_owner *d_owners;
};

// Creates the optimizer of owner @w over the parameters of @params it
// owns, into w->w_obj.
static tp_status
owner_create(tp_agent *a, const tp_optim_options *o, size_t n_params,
             tp_rref *const *params, do_owner *w, uint64_t deadline,
             tp_error **err_p)
{
    uint8_t b[DO_ARGS_LEN];
    int64_t wait = tp__ms_left(deadline);
    tp__op_options_encode(o, b);
    tp__put_u64le(b + OP_OPTIONS_WIRE_LEN, (uint64_t)wait);
    tp_args *in = NULL;
    if (tp_args_create(b, sizeof(b), &in) != TP_OK) {
        return tp__error_set(err_p, TP_ENOMEM, "dist optim: out of memory");
    }
    tp_status st = TP_OK;
    size_t n = 0;
    for (size_t i = 0; i < n_params && st == TP_OK; i++) {
        tp_worker_info wi;
        if (tp_rref_owner(params[i], &wi) == TP_OK &&
            wi.rank == w->w_info.rank) {
            st = tp_args_add_rref(in, params[i]);
            n++;
        }
    }
    if (st != TP_OK) {
        tp_args_unref(in);
        return tp__error_set(err_p, st,
                             "dist optim: the parameters owned by %s (rank "
                             "%d): %s",
                             w->w_info.name, w->w_info.rank,
                             st == TP_ENOMEM ? "out of memory"
                                             : "more than TP_RPC_MAX_RREFS");
    }
    st = tp_remote_create(a, w->w_info.name, DO_TYPE, in, wait, &w->w_obj,
                          err_p);
    tp_args_unref(in);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st,
                              "dist optim: creating the %s optimizer of the "
                              "%zu parameters owned by %s (rank %d)",
                              tp_optim_kind_name(o->kind), n, w->w_info.name,
                              w->w_info.rank);
    }
    return TP_OK;
}

tp_status
tp_dist_optim_create(tp_agent *a, const tp_optim_options *o, size_t n_params,
                     tp_rref *const *params, int64_t timeout_ms,
                     tp_dist_optim **opt_p, tp_error **err_p)
{
    tp_optim_options opts;
    if (a == NULL || opt_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "dist optim: no agent");
    }
    // Options are checked here first: a bad value fails before any RPC.
    tp_status st = tp__op_options_load(o, &opts, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "dist optim");
    }
    if (n_params == 0 || params == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist optim %s: got an empty parameter list",
                             tp_optim_kind_name(opts.kind));
    }
    tp_dist_optim *d = tp__zalloc(sizeof(*d));
    if (d != NULL) {
        d->d_owners = tp__zalloc(n_params * sizeof(*d->d_owners));
    }
    if (d == NULL || d->d_owners == NULL) {
        if (d != NULL) {
            tp__free(d->d_owners);
        }
        tp__free(d);
        return tp__error_set(err_p, TP_ENOMEM, "dist optim: out of memory");
    }
    // Owners in the order of their first parameter.
    for (size_t i = 0; i < n_params && st == TP_OK; i++) {
        tp_worker_info wi;
        if (params[i] == NULL) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "dist optim: parameter %zu is NULL", i);
            break;
        }
        st = tp_rref_owner(params[i], &wi);
        if (st != TP_OK) {
            st = tp__error_set(err_p, st, "dist optim: parameter %zu: no owner",
                               i);
            break;
        }
        size_t k = 0;
        while (k < d->d_nowners && d->d_owners[k].w_info.rank != wi.rank) {
            k++;
        }
        if (k == d->d_nowners) {
            d->d_owners[d->d_nowners++].w_info = wi;
        }
    }
    uint64_t deadline = tp__deadline_after_ms(tp__agent_timeout(a, timeout_ms));
    for (size_t k = 0; k < d->d_nowners && st == TP_OK; k++) {
        st = owner_create(a, &opts, n_params, params, &d->d_owners[k], deadline,
                          err_p);
    }
    if (st != TP_OK) {
        tp_dist_optim_destroy(d);
        return st;
    }
    *opt_p = d;
    return TP_OK;
}

tp_status
tp_dist_optim_step(tp_dist_optim *opt, int64_t ctx_id, int64_t timeout_ms,
                   tp_error **err_p)
{
    if (opt == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "dist optim step: no optimizer");
    }
    uint8_t b[8];
    tp__put_u64le(b, (uint64_t)ctx_id);
    tp_args *in = NULL;
    tp_future **fs = tp__zalloc(opt->d_nowners * sizeof(*fs));
    if (fs == NULL || tp_args_create(b, sizeof(b), &in) != TP_OK) {
        tp__free(fs);
        return tp__error_set(err_p, TP_ENOMEM,
                             "dist optim step: out of memory");
    }
    // Every owner at once; then wait for all of them, keeping the first
    // failure in the owners' order.
    for (size_t k = 0; k < opt->d_nowners; k++) {
        fs[k] = tp_remote_call_async(opt->d_owners[k].w_obj, "step", in,
                                     timeout_ms);
    }
    tp_status st = TP_OK;
    for (size_t k = 0; k < opt->d_nowners; k++) {
        const do_owner *w = &opt->d_owners[k];
        tp_error *e = NULL;
        tp_status s = TP_ENOMEM;
        if (fs[k] != NULL) {
            // The call ends by its own deadline (@timeout_ms).
            s = tp_rpc_wait(fs[k], 0, NULL, &e);
            tp_future_unref(fs[k]);
        }
        if (s != TP_OK && st == TP_OK) {
            // The cause's message follows after ": ".
            tp_error *we = tp__error_new(s, 0, e,
                                         "dist optim step of context %" PRId64
                                         ": owner %s (rank %d)%s",
                                         ctx_id, w->w_info.name, w->w_info.rank,
                                         e != NULL ? "" : ": out of memory");
            st = s;
            if (err_p != NULL) {
                *err_p = we;
            } else {
                tp_error_unref(we);
            }
        }
        tp_error_unref(e);
    }
    tp_args_unref(in);
    tp__free(fs);
    return st;
}

void
tp_dist_optim_destroy(tp_dist_optim *opt)
{
    if (opt == NULL) {
        return;
    }
    // The last RRef to each remote optimizer: its owner destroys it.
    for (size_t k = 0; k < opt->d_nowners; k++) {
        tp_rref_unref(opt->d_owners[k].w_obj);
    }
    tp__free(opt->d_owners);
    tp__free(opt);
}
