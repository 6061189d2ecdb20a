// SPDX-License-Identifier: Apache-2.0
// proto.c - distributed autograd as the agent sees it (agent/proto.h):
// the send and receive hooks that record send and recv functions, the run
// hooks that make a request's context current while its function runs,
// the kinds BACKWARD (a remote part of a pass), RELEASE and ABORT
// (notes), peer failure, shutdown and debug info.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/pool.h"
#include "da_impl.h"

// ---- contexts carried by args ---------------------------------------------

static void
obj_ref(void *obj)
{
    tp__da_ctx_ref(obj);
}

static void
obj_unref(void *obj)
{
    tp__da_ctx_unref(obj);
}

static const tp__args_obj_ops da_obj_ops = {
    .ao_proto_id = DA_PROTO_ID,
    .ao_ref = obj_ref,
    .ao_unref = obj_unref,
};

// The context that po_recv attached to @args, borrowed (NULL: none).
static da_ctx *
args_ctx(const tp_args *args)
{
    size_t n = args != NULL ? tp__args_nobjs(args) : 0;
    for (size_t i = 0; i < n; i++) {
        const tp__args_obj_ops *ops = NULL;
        void *o = tp__args_obj(args, i, &ops);
        if (ops == &da_obj_ops) {
            return o;
        }
    }
    return NULL;
}

// ---- attach / detach -------------------------------------------------------

static tp_status
da_attach(tp_agent *a, void **state_p, tp_error **err_p)
{
    da_state *x = tp__zalloc(sizeof(*x));
    if (x == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    x->x_world = tp_rpc_world_size(a);
    x->x_dead =
        tp__zalloc((size_t)(x->x_world > 0 ? x->x_world : 1) * sizeof(bool));
    if (x->x_dead == NULL) {
        tp__free(x);
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    atomic_init(&x->x_refs, 1);
    atomic_init(&x->x_next_ctx, 0);
    atomic_init(&x->x_next_pass, 0);
    tp__mtx_init(&x->x_mtx);
    x->x_rank = tp__agent_rank(a);
    x->x_agent = tp__agent_ref(a);
    x->x_attached = true;
    *state_p = x;
    return TP_OK;
}

static void
da_detach(void *state)
{
    da_state *x = state;
    tp__mtx_lock(&x->x_mtx);
    x->x_attached = false;
    tp__mtx_unlock(&x->x_mtx);
    tp__da_ctx_release_all(x, -1);
    tp__da_state_unref(x);
}

// ---- hooks -----------------------------------------------------------------

static tp_status
da_send(void *state, int to, uint8_t kind, const tp_args *args,
        const tp_args *req, tp__ext *ext, void **tok_p, tp_error **err_p)
{
    da_state *x = state;
    (void)tok_p;
    if (kind >= DA_KIND_BACKWARD && kind <= DA_KIND_ABORT) {
        return TP_OK; // our own messages: gradients and notes, no context
    }
    // A reply belongs to its request's context; anything else to the
    // sending thread's.
    da_ctx *c = req != NULL ? args_ctx(req) : tp__da_current(x);
    if (c == NULL) {
        return TP_OK;
    }
    if (c->c_released) {
        if (req != NULL) {
            return TP_OK; // the context ended meanwhile: nothing to record
        }
        return tp__error_set(err_p, TP_ENOENT,
                             "dist autograd %s: the thread's context %" PRId64
                             " was released",
                             tp__da_name(x), c->c_id);
    }
    return tp__da_record_send(c, to, args, ext, err_p);
}

// A message from @from arrived: it is alive, whatever a failed connection
// made us think (a refused message, an injected fault); the agent clears
// its own mark the same way. Else one broken pipe kept its contexts from
// being learnt here for good.
static void
da_heard(da_state *x, int from)
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
da_recv(void *state, int from, const uint8_t *sec, size_t len, tp_args *args,
        tp_error **err_p)
{
    da_state *x = state;
    da_heard(x, from);
    if (sec == NULL) {
        return TP_OK;
    }
    da_ctx *c = NULL;
    tp_status st = tp__da_record_recv(x, from, sec, len, args, &c, err_p);
    if (st != TP_OK || c == NULL) {
        return st;
    }
    st = tp__args_add_obj_taken(args, c, &da_obj_ops);
    if (st != TP_OK) {
        tp__da_ctx_unref(c);
        return tp__error_set(err_p, st, "dist autograd: out of memory");
    }
    return TP_OK;
}

// Tokens of po_run_begin: the previous current context, or these.
static char tok_none, tok_unchanged;

static void *
da_run_begin(void *state, const tp_args *in)
{
    (void)state;
    da_ctx *c = args_ctx(in);
    if (c == NULL) {
        return &tok_unchanged;
    }
    da_ctx *prev = tp__da_set_current(tp__da_ctx_ref(c));
    return prev != NULL ? (void *)prev : &tok_none;
}

static void
da_run_end(void *state, void *tok)
{
    (void)state;
    if (tok == &tok_unchanged) {
        return;
    }
    tp__da_ctx_unref(tp__da_set_current(tok == &tok_none ? NULL : tok));
}

static void
da_peer_failed(void *state, int rank, const tp_error *err)
{
    da_state *x = state;
    (void)err;
    if (rank < 0 || rank >= x->x_world) {
        return;
    }
    tp__mtx_lock(&x->x_mtx);
    bool was = x->x_dead[rank];
    x->x_dead[rank] = true;
    if (!was) {
        atomic_fetch_add_explicit(&x->x_ndead, 1, memory_order_relaxed);
    }
    tp__mtx_unlock(&x->x_mtx);
    if (!was) {
        // Its contexts end here (PyTorch keeps them forever).
        tp__da_ctx_release_all(x, rank);
    }
}

static void
da_shutdown_end(void *state, bool agreed)
{
    (void)agreed;
    tp__da_ctx_release_all(state, -1);
}

static size_t
da_debug(void *state, char *buf, size_t len)
{
    da_state *x = state;
    tp_dist_autograd_stats s;
    tp__mtx_lock(&x->x_mtx);
    s = x->x_st;
    tp__mtx_unlock(&x->x_mtx);
    int n = snprintf(
        buf, len,
        "dist autograd: contexts %" PRIu64 ", send functions %" PRIu64
        ", recv functions %" PRIu64 ", backward parts %" PRIu64
        ", made %" PRIu64 ", released %" PRIu64 "\n",
        s.contexts, s.send_fns, s.recv_fns, s.backwards, s.created, s.released);
    return n > 0 ? (size_t)n : 0;
}

// ---- kinds -----------------------------------------------------------------

typedef struct bw_job {
    da_ctx *j_ctx;
    uint64_t j_send, j_pass;
    bool j_retain;
} bw_job;

// Names the peer in a decoder's TP_EPROTO (the agent closes that pipe).
static tp_status
hdr_bad(da_state *x, const tp__proto_msg *m, tp_error **err_p)
{
    const tp_worker_info *wi = tp__agent_worker(x->x_agent, m->pm_from);
    return tp__error_wrap(
        err_p, TP_EPROTO, "dist autograd %s: malformed %s from %s (rank %d)",
        tp__da_name(x), m->pm_kind == DA_KIND_BACKWARD ? "BACKWARD" : "note",
        wi != NULL ? wi->name : "?", m->pm_from);
}

static tp__proto_verdict
bw_on_loop(void *state, const tp__proto_msg *m, void **ctx_p,
           tp_args **result_p, tp_error **err_p)
{
    da_state *x = state;
    (void)result_p;
    da_bw b;
    if (tp__da_bw_decode(m->pm_hdr, m->pm_hdr_len, (uint32_t)x->x_world, &b,
                         err_p) != TP_OK) {
        hdr_bad(x, m, err_p);
        return TP__PROTO_DONE;
    }
    int64_t id = b.b_ctx;
    da_ctx *c = tp__da_ctx_find(x, id);
    if (c == NULL) {
        tp__error_set(err_p, TP_ENOENT,
                      "dist autograd %s: backward: no context %" PRId64
                      " here (released, or its creator died)",
                      tp__da_name(x), id);
        return TP__PROTO_DONE;
    }
    bw_job *j = tp__alloc(sizeof(*j));
    if (j == NULL) {
        tp__da_ctx_unref(c);
        tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
        return TP__PROTO_DONE;
    }
    j->j_ctx = c;
    j->j_send = b.b_send;
    j->j_pass = b.b_pass;
    j->j_retain = b.b_retain;
    tp__da_ctx_add_peer(c, m->pm_from);
    *ctx_p = j;
    return TP__PROTO_RUN;
}

static tp_future *
bw_run(void *state, const tp__proto_msg *m, void *ctx)
{
    (void)state;
    bw_job *j = ctx;
    tp_future *f = tp__da_backward_remote(j->j_ctx, m->pm_from, j->j_send,
                                          j->j_pass, j->j_retain, m->pm_args);
    tp__da_ctx_unref(j->j_ctx);
    tp__free(j);
    return f;
}

// A RELEASE propagates to the workers the context reached from here: on
// the pool, since a loop thread must not connect.
typedef struct release_job {
    tp_task n_task;
    da_ctx *n_ctx;
    int n_from;
} release_job;

static void
release_run(void *arg)
{
    release_job *n = arg;
    tp__da_ctx_release(n->n_ctx, true, n->n_from);
    tp__da_ctx_unref(n->n_ctx);
    tp__free(n);
}

static tp__proto_verdict
note_on_loop(void *state, const tp__proto_msg *m, void **ctx_p,
             tp_args **result_p, tp_error **err_p)
{
    da_state *x = state;
    (void)ctx_p;
    (void)result_p;
    da_note nt;
    if (tp__da_note_decode(m->pm_hdr, m->pm_hdr_len, (uint32_t)x->x_world, &nt,
                           err_p) != TP_OK) {
        hdr_bad(x, m, err_p);
        return TP__PROTO_DONE;
    }
    int64_t id = nt.n_ctx;
    da_ctx *c = tp__da_ctx_find(x, id);
    if (c == NULL) {
        return TP__PROTO_DONE; // unknown here, or already gone
    }
    if (m->pm_kind == DA_KIND_ABORT) {
        tp__da_pass_abort(c, nt.n_pass);
        tp__da_ctx_unref(c);
        return TP__PROTO_DONE;
    }
    release_job *n = tp__alloc(sizeof(*n));
    if (n == NULL) {
        tp__da_ctx_release(c, false, m->pm_from); // at least here
        tp__da_ctx_unref(c);
        return TP__PROTO_DONE;
    }
    n->n_ctx = c;
    n->n_from = m->pm_from;
    tp__task_init(&n->n_task, release_run, n);
    if (tp__agent_submit(x->x_agent, &n->n_task) != TP_OK) {
        tp__da_ctx_release(c, false, m->pm_from);
        tp__da_ctx_unref(c);
        tp__free(n);
    }
    return TP__PROTO_DONE;
}

static const tp__proto_kind da_kinds[] = {
    {.pk_kind = DA_KIND_BACKWARD,
     .pk_name = "DIST_AUTOGRAD_BACKWARD",
     .pk_on_loop = bw_on_loop,
     .pk_run = bw_run},
    {.pk_kind = DA_KIND_RELEASE,
     .pk_name = "DIST_AUTOGRAD_RELEASE",
     .pk_on_loop = note_on_loop,
     .pk_note = true},
    {.pk_kind = DA_KIND_ABORT,
     .pk_name = "DIST_AUTOGRAD_ABORT",
     .pk_on_loop = note_on_loop,
     .pk_note = true},
};

const tp__proto_ops tp__dist_autograd_proto = {
    .po_name = "dist_autograd",
    .po_id = DA_PROTO_ID,
    .po_kinds = da_kinds,
    .po_nkinds = sizeof(da_kinds) / sizeof(da_kinds[0]),
    .po_attach = da_attach,
    .po_detach = da_detach,
    .po_send = da_send,
    .po_recv = da_recv,
    .po_run_begin = da_run_begin,
    .po_run_end = da_run_end,
    .po_peer_failed = da_peer_failed,
    .po_shutdown_end = da_shutdown_end,
    .po_debug = da_debug,
};
