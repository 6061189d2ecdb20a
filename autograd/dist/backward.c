// SPDX-License-Identifier: Apache-2.0
// backward.c - the FAST-mode backward pass (PyTorch's design note): the
// initiator runs its local engine from the roots; a recv function it
// reaches sends its gradients to the worker that sent the tensors, whose
// send function's part runs there on the pool and may reach recv
// functions in turn. A part is done when its local engine returned and
// every part it started replied; the first failure ends it at once, and
// the initiator then tells every worker of the context to stop that pass.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <tpipe/rpc.h>

#include "core/alloc.h"
#include "core/log.h"
#include "da_impl.h"

struct da_part {
    _Atomic long p_refs;
    da_state *p_x; // referenced
    da_ctx *p_ctx; // referenced
    uint64_t p_pass;
    bool p_retain;
    tp_mtx p_mtx;
    int p_pending; // remote parts outstanding + the local run
    bool p_resolved;
    tp_future *p_done; // NULL value, or the first error
};

static _Thread_local da_part *tl_part;

da_part *
tp__da_part_current(void)
{
    return tl_part;
}

static da_part *
part_new(da_ctx *c, uint64_t pass, bool retain)
{
    da_part *p = tp__zalloc(sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    if (tp_future_create(&p->p_done) != TP_OK) {
        tp__free(p);
        return NULL;
    }
    // Not bound to the pool: a remote part's reply is written by the
    // thread that finishes it (a loop thread when the last piece is a
    // reply), saving a hand-over per hop; nothing here blocks.
    atomic_init(&p->p_refs, 1);
    p->p_x = c->c_x;
    tp__da_state_ref(p->p_x);
    p->p_ctx = tp__da_ctx_ref(c);
    p->p_pass = pass;
    p->p_retain = retain;
    p->p_pending = 1;
    tp__mtx_init(&p->p_mtx);
    tp__mtx_lock(&p->p_x->x_mtx);
    p->p_x->x_st.backwards++;
    tp__mtx_unlock(&p->p_x->x_mtx);
    return p;
}

static void
part_unref(da_part *p)
{
    if (atomic_fetch_sub_explicit(&p->p_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp__mtx_lock(&p->p_x->x_mtx);
    p->p_x->x_st.backwards--;
    tp__mtx_unlock(&p->p_x->x_mtx);
    tp_future_unref(p->p_done);
    tp__da_ctx_unref(p->p_ctx);
    tp__da_state_unref(p->p_x);
    tp__mtx_fini(&p->p_mtx);
    tp__free(p);
}

/* Whether @c's pass @pass was aborted. */
static bool
da_pass_aborted(da_ctx *c, uint64_t pass)
{
    da_state *x = c->c_x;
    tp__mtx_lock(&x->x_mtx);
    bool ab = c->c_abort_pass == pass || c->c_released;
    tp__mtx_unlock(&x->x_mtx);
    return ab;
}

void
tp__da_pass_abort(da_ctx *c, uint64_t pass)
{
    da_state *x = c->c_x;
    tp__mtx_lock(&x->x_mtx);
    c->c_abort_pass = pass;
    tp__mtx_unlock(&x->x_mtx);
}

// One of @p's pending pieces ended (@err NULL: fine). The first error, or
// the last piece, resolves p_done.
static void
part_piece_done(da_part *p, const tp_error *err)
{
    bool resolve = false;
    tp__mtx_lock(&p->p_mtx);
    p->p_pending--;
    if (!p->p_resolved && (err != NULL || p->p_pending == 0)) {
        p->p_resolved = true;
        resolve = true;
    }
    tp__mtx_unlock(&p->p_mtx);
    if (!resolve) {
        return;
    }
    if (err != NULL) {
        tp__da_pass_abort(p->p_ctx, p->p_pass); // the local parts stop too
        tp_future_set_error(p->p_done, err);
    } else {
        tp_future_set_value(p->p_done, NULL, NULL);
    }
}

// A remote part replied (any thread, often a loop thread: no blocking).
static void
sub_done(tp_future *f, void *arg)
{
    da_part *p = arg;
    part_piece_done(p, tp_future_error(f));
    tp_future_unref(f);
    part_unref(p);
}

tp_status
tp__da_part_send(da_part *p, da_ctx *c, int to, uint64_t send_id,
                 tp_tensor *const *grads, int n, tp_error **err_p)
{
    da_state *x = c->c_x;
    const tp_worker_info *wi = tp__agent_worker(x->x_agent, to);
    const char *who = wi != NULL ? wi->name : "?";
    if (da_pass_aborted(c, p->p_pass)) {
        return tp__error_set(err_p, TP_ECANCELED,
                             "dist autograd %s: backward of context %" PRId64
                             " stopped: the pass failed on another worker",
                             tp__da_name(x), c->c_id);
    }
    if (tp__da_is_dead(x, to)) {
        return tp__error_set(err_p, TP_ECONNRESET,
                             "dist autograd %s: backward of context %" PRId64
                             " needs %s (rank %d), which died",
                             tp__da_name(x), c->c_id, who, to);
    }
    tp_args *args = NULL;
    tp_status st = tp_args_create(NULL, 0, &args);
    for (int i = 0; i < n && st == TP_OK; i++) {
        if (grads[i] == NULL) {
            st = TP_EINVAL;
            break;
        }
        st = tp_args_add_tensor(args, grads[i]);
    }
    if (st != TP_OK) {
        tp_args_unref(args);
        return tp__error_set(err_p, st,
                             "dist autograd %s: gradients for %s (rank %d)",
                             tp__da_name(x), who, to);
    }
    uint8_t hdr[DA_BW_HDR];
    tp__da_bw_encode(&(da_bw){.b_ctx = c->c_id,
                              .b_send = send_id,
                              .b_pass = p->p_pass,
                              .b_retain = p->p_retain},
                     hdr);
    tp_future *f =
        tp__agent_call_kind(x->x_agent, to, DA_KIND_BACKWARD, hdr, sizeof(hdr),
                            NULL, args, TP_TIMEOUT_DEFAULT);
    tp_args_unref(args);
    if (f == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    tp__da_ctx_add_peer(c, to);
    tp__mtx_lock(&p->p_mtx);
    p->p_pending++;
    tp__mtx_unlock(&p->p_mtx);
    atomic_fetch_add_explicit(&p->p_refs, 1, memory_order_relaxed);
    if (tp_future_then(f, sub_done, p) != TP_OK) {
        part_piece_done(p, tp__error_nomem());
        tp_future_unref(f);
        part_unref(p);
    }
    return TP_OK;
}

// Runs the local engine of @p from @roots; the local piece ends.
static void
part_run(da_part *p, int n, const tp_backward_root *roots)
{
    da_ctx *c = p->p_ctx;
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.retain_graph = p->p_retain;
    o.grads = c->c_grads;
    tp_error *err = NULL;
    tp__mtx_lock(&c->c_run);
    da_part *prev = tl_part;
    tl_part = p;
    tp_status st = TP_OK;
    if (da_pass_aborted(c, p->p_pass)) {
        st = tp__error_set(&err, TP_ECANCELED,
                           "stopped: the pass failed on another worker");
    } else {
        st = tp_backward_run(&o, n, roots, &err);
    }
    tl_part = prev;
    tp__mtx_unlock(&c->c_run);
    if (st != TP_OK) {
        da_state *x = p->p_x;
        tp_error *e = tp__error_new(st, 0, err,
                                    "dist autograd backward of context "
                                    "%" PRId64 " on %s (rank %d)",
                                    c->c_id, tp__da_name(x), x->x_rank);
        tp_error_unref(err);
        err = e;
    }
    part_piece_done(p, err);
    tp_error_unref(err);
}

tp_future *
tp__da_backward_remote(da_ctx *c, int from, uint64_t send_id, uint64_t pass,
                       bool retain, const tp_args *grads)
{
    da_state *x = c->c_x;
    da_part *p = part_new(c, pass, retain);
    if (p == NULL) {
        return NULL;
    }
    tp_future *done = tp_future_ref(p->p_done);
    tp_error *err = NULL;
    tp_node *node = tp__da_send_fn(c, send_id);
    if (node == NULL) {
        tp__error_set(&err, TP_ENOENT,
                      "dist autograd %s: context %" PRId64
                      " has no send function %" PRIu64
                      " (released, or the graph ran without retain_graph)",
                      tp__da_name(x), c->c_id, send_id);
    } else if (tp__da_send_check(node, grads, &err) != TP_OK) {
        const tp_worker_info *wi = tp__agent_worker(x->x_agent, from);
        tp__error_wrap(&err, TP_EPROTO,
                       "dist autograd %s: backward from %s (rank %d)",
                       tp__da_name(x), wi != NULL ? wi->name : "?", from);
    }
    if (err != NULL) {
        part_piece_done(p, err);
        tp_error_unref(err);
    } else {
        int n = tp_node_num_outputs(node);
        tp_backward_root *roots = tp__zalloc((size_t)n * sizeof(*roots));
        if (roots == NULL) {
            part_piece_done(p, tp__error_nomem());
        } else {
            for (int i = 0; i < n; i++) {
                roots[i].node = node;
                roots[i].output_nr = i;
                roots[i].grad = tp_args_tensor(grads, (size_t)i);
            }
            part_run(p, n, roots);
            tp__free(roots);
        }
    }
    tp_node_unref(node);
    part_unref(p);
    return done;
}

// ---- the initiator ---------------------------------------------------------

// Tells every worker @c reached that pass @pass failed (best effort).
static void
abort_everywhere(da_ctx *c, uint64_t pass)
{
    da_state *x = c->c_x;
    int world = x->x_world;
    bool *peers = tp__da_ctx_peers(c);
    if (peers == NULL) {
        return;
    }
    uint8_t hdr[DA_NOTE_HDR];
    tp__da_note_encode(&(da_note){.n_ctx = c->c_id, .n_pass = pass}, hdr);
    for (int r = 0; r < world; r++) {
        if (!peers[r] || r == x->x_rank || tp__da_is_dead(x, r)) {
            continue;
        }
        tp_error *err = NULL;
        (void)tp__agent_notify(x->x_agent, r, DA_KIND_ABORT, hdr, sizeof(hdr),
                               false, &err);
        tp_error_unref(err);
    }
    tp__free(peers);
}

tp_status
tp_dist_autograd_backward(tp_agent *a, int64_t ctx_id, int n_roots,
                          tp_tensor *const *roots, bool retain_graph,
                          tp_error **err_p)
{
    da_state *x = tp__da_state_of(a);
    if (x == NULL) {
        return tp__error_set(err_p, a == NULL ? TP_EINVAL : TP_ECLOSED,
                             "dist autograd backward: %s",
                             a == NULL ? "no agent" : "the agent is shut down");
    }
    if (n_roots <= 0 || roots == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "dist autograd %s: backward of context %" PRId64
                             ": no roots",
                             tp__da_name(x), ctx_id);
    }
    for (int i = 0; i < n_roots; i++) {
        tp_tensor *t = roots[i];
        if (t == NULL || !tp_tensor_requires_grad(t)) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "dist autograd %s: backward of context "
                                 "%" PRId64 ": root %d does not require grad",
                                 tp__da_name(x), ctx_id, i);
        }
        if (tp_tensor_numel(t) != 1) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "dist autograd %s: backward of context "
                                 "%" PRId64 ": root %d has %" PRId64
                                 " elements (a root is a scalar, such as a "
                                 "loss)",
                                 tp__da_name(x), ctx_id, i, tp_tensor_numel(t));
        }
    }
    da_ctx *c = tp__da_ctx_find_or_fail(x, ctx_id, "backward", err_p);
    if (c == NULL) {
        return TP_ENOENT;
    }
    uint64_t pass = ((uint64_t)x->x_rank << DA_CTX_BITS) |
                    (atomic_fetch_add(&x->x_next_pass, 1) + 1);
    da_part *p = part_new(c, pass, retain_graph);
    tp_backward_root *rs = tp__zalloc((size_t)n_roots * sizeof(*rs));
    if (p == NULL || rs == NULL) {
        if (p != NULL) {
            part_unref(p);
        }
        tp__free(rs);
        tp__da_ctx_unref(c);
        return tp__error_set(err_p, TP_ENOMEM, "dist autograd: out of memory");
    }
    for (int i = 0; i < n_roots; i++) {
        rs[i].tensor = roots[i];
    }
    part_run(p, n_roots, rs);
    tp__free(rs);
    // Each remote part ends by its call's deadline; this wait is a
    // backstop.
    int64_t t = tp__agent_timeout(a, TP_TIMEOUT_DEFAULT);
    tp_error *err = NULL;
    tp_status st = tp_future_wait(p->p_done, t > 0 ? 2 * t + 1000 : 0, &err);
    if (st != TP_OK) {
        tp__da_pass_abort(c, pass);
        abort_everywhere(c, pass);
        if (err_p != NULL) {
            *err_p = err;
            err = NULL;
        }
    }
    tp_error_unref(err);
    part_unref(p);
    tp__da_ctx_unref(c);
    return st;
}
