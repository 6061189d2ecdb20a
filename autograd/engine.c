// SPDX-License-Identifier: Apache-2.0
// engine.c - the reverse-mode engine: one backward pass over the graph
// (node.c) from its roots, accumulating into the leaves' .grad or a
// gradient map (grad_map.c).
//
// Threads: graphs built by different threads from shared leaves have no
// node in common (node.c), so passes on them can run at the same time; the
// engine keeps its per-pass state in the nodes. What they do share is
// guarded: a leaf's .grad by leaf_grad_mtx, a gradient map by its lock.
// Never both at once.

#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

// ---- leaves' .grad ---------------------------------------------------------

// Guards the .grad of every leaf while backward passes accumulate into it.
static tp_mtx leaf_grad_mtx = {PTHREAD_MUTEX_INITIALIZER};

tp_tensor *
tp_tensor_grad(const tp_tensor *t)
{
    return t->t_grad;
}

void
tp_tensor_zero_grad(tp_tensor *t)
{
    tp__mtx_lock(&leaf_grad_mtx);
    tp_tensor *g = t->t_grad;
    t->t_grad = NULL;
    tp__mtx_unlock(&leaf_grad_mtx);
    tp_tensor_unref(g);
}

// ---- the engine ------------------------------------------------------------

void
tp_backward_options_init(tp_backward_options *o)
{
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
}

// Adds @g into *@slot (taking @g's reference). A gradient is stored as is
// only when nobody else can see it; otherwise it is copied, so that later
// in-place accumulation or optimizer steps never write into a tensor the
// caller still holds.
static tp_status
accumulate(tp_tensor **slot, tp_tensor *g, bool private_copy, tp_error **err_p)
{
    tp_status st = TP_OK;
    if (!*slot) {
        if (private_copy &&
            (atomic_load_explicit(&g->t_refs, memory_order_acquire) != 1 ||
             atomic_load_explicit(&g->t_storage->s_refs,
                                  memory_order_acquire) != 1 ||
             !tp_tensor_is_contiguous(g))) {
            tp_tensor *c;
            st = tp__clone_raw(g, &c, err_p);
            tp_tensor_unref(g);
            if (st != TP_OK) {
                return st;
            }
            g = c;
        }
        *slot = g;
        return TP_OK;
    }
    tp_tensor *sum;
    st = tp__k_binary("accumulate", TP__ADD, *slot, g, 0.0, &sum, err_p);
    tp_tensor_unref(g);
    if (st != TP_OK) {
        return st;
    }
    tp_tensor_unref(*slot);
    *slot = sum;
    return TP_OK;
}

typedef struct engine_run {
    uint64_t pass;
    tp_node **nodes; // every node reached, in discovery order
    size_t n, cap;
    tp_node **ready;
    size_t nready;
} engine_run;

static _Atomic uint64_t engine_pass_counter;

static tp_status
run_push(engine_run *r, tp_node *n, tp_error **err_p)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        tp_node **v = tp__realloc(r->nodes, sizeof(*v) * cap);
        if (!v) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
        r->nodes = v;
        r->cap = cap;
    }
    r->nodes[r->n++] = n;
    return TP_OK;
}

// Visits every node reachable from @root once, counting dependencies
// (edges into each node from reached nodes).
static tp_status
discover(engine_run *r, tp_node *root, tp_error **err_p)
{
    size_t start = r->n;
    if (root->n_pass == r->pass) {
        return TP_OK;
    }
    root->n_pass = r->pass;
    root->n_deps = 0;
    tp_status st = run_push(r, root, err_p);
    // r->nodes doubles as the work list: nodes from start on still have
    // their edges to follow.
    for (size_t i = start; st == TP_OK && i < r->n; i++) {
        tp_node *n = r->nodes[i];
        for (int e = 0; e < n->n_nin; e++) {
            tp_node *next = n->n_next[e].e_node;
            if (!next) {
                continue;
            }
            if (next->n_pass != r->pass) {
                next->n_pass = r->pass;
                next->n_deps = 0;
                st = run_push(r, next, err_p);
                if (st != TP_OK) {
                    break;
                }
            }
            next->n_deps++;
        }
    }
    return st;
}

static tp_status
node_buf(tp_node *n, tp_error **err_p)
{
    if (!n->n_buf) {
        n->n_buf = tp__zalloc(sizeof(tp_tensor *) *
                              (size_t)(n->n_nout ? n->n_nout : 1));
        if (!n->n_buf) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
    }
    return TP_OK;
}

static bool
meta_matches(const tp__shape_meta *m, const tp_tensor *g)
{
    return !m->m_set ||
           (m->m_dtype == g->t_dtype &&
            tp__shape_equal(m->m_ndim, m->m_shape, g->t_ndim, g->t_shape));
}

// Adds @g (taken; NULL adds nothing) into @leaf's gradient: its .grad, or
// its entry in o->grads. If @final_p, stores there a new reference to the
// gradient after that (NULL if the leaf has none), read under the same
// lock so that a concurrent pass cannot free it first.
static tp_status
leaf_accumulate(tp_tensor *leaf, tp_tensor *g, const tp_backward_options *o,
                tp_tensor **final_p, tp_error **err_p)
{
    tp_status st = TP_OK;
    tp_tensor **slot = NULL;
    if (o->grads) {
        tp__grad_map_lock(o->grads);
        if (g) {
            st = tp__grad_map_slot_locked(o->grads, leaf, &slot, err_p);
        } else {
            slot = tp__grad_map_find_locked(o->grads, leaf);
        }
    } else {
        tp__mtx_lock(&leaf_grad_mtx);
        if (g) {
            leaf->t_ag_release = tp__tensor_ag_release;
        }
        slot = &leaf->t_grad;
    }
    if (st == TP_OK && g) {
        st = accumulate(slot, g, true, err_p);
        g = NULL;
    }
    if (st == TP_OK && final_p) {
        *final_p = slot ? tp_tensor_ref(*slot) : NULL;
    }
    if (o->grads) {
        tp__grad_map_unlock(o->grads);
    } else {
        tp__mtx_unlock(&leaf_grad_mtx);
    }
    tp_tensor_unref(g); // not taken by accumulate: the slot failed
    return st;
}

// Runs the accumulate node @n: adds its gradient into the leaf and, when
// this was the leaf's last accumulate node in the pass, reports the leaf
// to o->on_leaf_grad (outside every lock, on this thread).
static tp_status
run_accumulate_node(tp_node *n, const tp_backward_options *o, tp_error **err_p)
{
    tp_tensor *g = NULL;
    if (n->n_buf) {
        g = n->n_buf[0];
        n->n_buf[0] = NULL;
    }
    if (!n->n_leaf) {
        tp_tensor_unref(g);
        return TP_OK;
    }
    bool report = false;
    if (o->on_leaf_grad && n->n_acc_head) {
        report = --n->n_acc_head->n_acc_left == 0;
    }
    if (!g && !report) {
        return TP_OK;
    }
    tp_tensor *final = NULL;
    tp_status st =
        leaf_accumulate(n->n_leaf, g, o, report ? &final : NULL, err_p);
    if (st == TP_OK && report) {
        o->on_leaf_grad(n->n_leaf, final, o->on_leaf_grad_arg);
    }
    tp_tensor_unref(final);
    return st;
}

static int
acc_by_leaf(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)(*(tp_node *const *)a)->n_leaf;
    uintptr_t y = (uintptr_t)(*(tp_node *const *)b)->n_leaf;
    return x < y ? -1 : x > y;
}

// For on_leaf_grad: groups the accumulate nodes of the pass by leaf (each
// use of a leaf has its own), pointing each at its group's first node,
// which counts the group's nodes that have yet to run.
static tp_status
group_leaves(engine_run *r, tp_error **err_p)
{
    size_t nacc = 0;
    for (size_t i = 0; i < r->n; i++) {
        if (r->nodes[i]->n_leaf) {
            nacc++;
        }
    }
    tp_node **acc = tp__alloc(sizeof(*acc) * (nacc ? nacc : 1));
    if (!acc) {
        return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
    }
    nacc = 0;
    for (size_t i = 0; i < r->n; i++) {
        tp_node *n = r->nodes[i];
        n->n_acc_head = NULL;
        if (n->n_leaf) {
            acc[nacc++] = n;
        }
    }
    qsort(acc, nacc, sizeof(*acc), acc_by_leaf);
    tp_node *head = NULL;
    for (size_t i = 0; i < nacc; i++) {
        if (!head || head->n_leaf != acc[i]->n_leaf) {
            head = acc[i];
            head->n_acc_left = 0;
        }
        acc[i]->n_acc_head = head;
        head->n_acc_left++;
    }
    tp__free(acc);
    return TP_OK;
}

static tp_status
run_node(tp_node *n, const tp_backward_options *o, engine_run *r,
         tp_error **err_p)
{
    if (tp__node_is_accumulate(n)) {
        return run_accumulate_node(n, o, err_p);
    }
    const char *name = tp_node_name(n);
    if (n->n_released) {
        return tp__error_set(err_p, TP_EINVAL,
                             "backward of %s: trying to backward through the "
                             "graph a second time (its saved tensors were "
                             "freed; pass retain_graph the first time)",
                             name);
    }
    tp_status st = TP_OK;
    int nin = n->n_nin;
    tp_tensor *gin_small[4] = {NULL};
    tp_tensor **gin = gin_small;
    if (nin > 4) {
        gin = tp__zalloc(sizeof(*gin) * (size_t)nin);
        if (!gin) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
    }
    // Outputs that got no gradient get zeros of their shape.
    for (int i = 0; i < n->n_nout && st == TP_OK; i++) {
        tp__shape_meta *m = &n->n_out[i];
        if (!n->n_buf[i] && m->m_set) {
            st = tp_tensor_zeros(m->m_dtype, m->m_ndim, m->m_shape,
                                 &n->n_buf[i], err_p);
        }
    }
    if (st == TP_OK) {
        tp_error *berr = NULL;
        st = n->n_ops->backward(n, n->n_buf, gin, &berr);
        if (st != TP_OK) {
            if (!berr) {
                berr = tp__error_new(st, 0, NULL, "%s", tp_status_name(st));
            }
            if (err_p) {
                *err_p = berr;
                tp__error_wrap(err_p, st, "backward of %s", name);
            } else {
                tp_error_unref(berr);
            }
        }
    }
    for (int i = 0; i < n->n_nout; i++) {
        tp_tensor_unref(n->n_buf[i]);
        n->n_buf[i] = NULL;
    }
    // Hand each input gradient to the node its edge points to.
    for (int i = 0; i < nin; i++) {
        tp__edge *e = &n->n_next[i];
        tp_tensor *g = gin[i];
        gin[i] = NULL;
        if (st != TP_OK || !e->e_node) {
            tp_tensor_unref(g);
            continue;
        }
        if (g && !meta_matches(&e->e_meta, g)) {
            char a[128], b[128];
            st = tp__error_set(
                err_p, TP_EINVAL,
                "backward of %s: gradient of input %d is %s %s, "
                "expected %s %s",
                name, i, tp_dtype_name(g->t_dtype),
                tp__shape_str(g->t_ndim, g->t_shape, a, sizeof(a)),
                tp_dtype_name(e->e_meta.m_dtype),
                tp__shape_str(e->e_meta.m_ndim, e->e_meta.m_shape, b,
                              sizeof(b)));
            tp_tensor_unref(g);
            continue;
        }
        if (g) {
            st = node_buf(e->e_node, err_p);
            if (st == TP_OK) {
                st = accumulate(&e->e_node->n_buf[e->e_nr], g, false, err_p);
            } else {
                tp_tensor_unref(g);
            }
        }
        if (--e->e_node->n_deps > 0) {
            continue;
        }
        if (!tp__node_is_accumulate(e->e_node)) {
            r->ready[r->nready++] = e->e_node;
        } else if (st == TP_OK) {
            // Run it now rather than when popped, so that the leaf's
            // gradient is complete (and reported) as soon as it can be:
            // data-parallel training starts reducing it then (PyTorch
            // gives AccumulateGrad the highest priority for this).
            st = run_accumulate_node(e->e_node, o, err_p);
        }
    }
    if (gin != gin_small) {
        tp__free(gin);
    }
    if (st == TP_OK && !o->retain_graph) {
        tp__node_release_saved(n);
    }
    return st;
}

tp_status
tp_backward_run(const tp_backward_options *o_in, int n_roots,
                const tp_backward_root *roots, tp_error **err_p)
{
    tp_backward_options o;
    tp_backward_options_init(&o);
    if (o_in) {
        memcpy(&o, o_in, TP_MIN(o_in->size, sizeof(o)));
    }
    if (n_roots <= 0) {
        return tp__error_set(err_p, TP_EINVAL, "backward: no roots");
    }
    if (!roots) {
        return tp__error_set(err_p, TP_EINVAL, "backward: bad roots");
    }
    engine_run r = {0};
    r.pass = atomic_fetch_add_explicit(&engine_pass_counter, 1,
                                       memory_order_relaxed) +
             1;
    tp_status st = TP_OK;
    tp_node **root_nodes = tp__zalloc(sizeof(tp_node *) * (size_t)n_roots);
    if (!root_nodes) {
        return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
    }
    bool prev_mode = tp_grad_mode_set(false);

    // Resolve each root to a node, and check its gradient.
    for (int i = 0; i < n_roots && st == TP_OK; i++) {
        const tp_backward_root *rt = &roots[i];
        tp_node *node = rt->node;
        int nr = rt->output_nr;
        const tp__shape_meta *m = NULL;
        if (rt->tensor) {
            if (!rt->tensor->t_requires_grad) {
                st = tp__error_set(err_p, TP_EINVAL,
                                   "backward: root %d does not require grad "
                                   "and has no grad_fn",
                                   i);
                break;
            }
            // A new reference; for a leaf root, a fresh accumulate node
            // that only this pass holds.
            st = tp__edge_target(rt->tensor, &node, &nr, err_p);
            if (st != TP_OK) {
                break;
            }
        } else if (!node || nr < 0 || nr >= node->n_nout) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "backward: root %d has no tensor or node", i);
            break;
        } else {
            tp_node_ref(node);
        }
        root_nodes[i] = node;
        m = &node->n_out[nr];
        tp_tensor *g = rt->grad;
        if (g) {
            if (!meta_matches(m, g)) {
                char a[128], b[128];
                st = tp__error_set(
                    err_p, TP_EINVAL,
                    "backward: gradient of root %d is %s %s, expected %s %s", i,
                    tp_dtype_name(g->t_dtype),
                    tp__shape_str(g->t_ndim, g->t_shape, a, sizeof(a)),
                    tp_dtype_name(m->m_dtype),
                    tp__shape_str(m->m_ndim, m->m_shape, b, sizeof(b)));
                break;
            }
            tp_tensor_ref(g);
        } else {
            if (!rt->tensor || tp_tensor_numel(rt->tensor) != 1) {
                st = tp__error_set(err_p, TP_EINVAL,
                                   "backward: grad can be implicitly created "
                                   "only for one-element outputs (root %d)",
                                   i);
                break;
            }
            st = tp_tensor_ones(rt->tensor->t_dtype, rt->tensor->t_ndim,
                                rt->tensor->t_shape, &g, err_p);
            if (st != TP_OK) {
                break;
            }
        }
        st = node_buf(node, err_p);
        if (st != TP_OK) {
            tp_tensor_unref(g);
            break;
        }
        st = accumulate(&node->n_buf[nr], g, false, err_p);
    }
    for (int i = 0; i < n_roots && st == TP_OK; i++) {
        st = discover(&r, root_nodes[i], err_p);
    }
    if (st == TP_OK && o.on_leaf_grad) {
        st = group_leaves(&r, err_p);
    }
    if (st == TP_OK) {
        r.ready = tp__alloc(sizeof(tp_node *) * (r.n ? r.n : 1));
        if (!r.ready) {
            st = tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
    }
    if (st == TP_OK) {
        for (size_t i = 0; i < r.n; i++) {
            if (r.nodes[i]->n_deps == 0) {
                r.ready[r.nready++] = r.nodes[i];
            }
        }
        // Every node is pushed exactly once, when its last dependency
        // ran, so the ready stack never holds more than r.n entries.
        while (st == TP_OK && r.nready > 0) {
            tp_node *n = r.ready[--r.nready];
            st = node_buf(n, err_p);
            if (st == TP_OK) {
                st = run_node(n, &o, &r, err_p);
            }
        }
    }
    // Drop gradients left in buffers (after an error) and the scratch.
    for (size_t i = 0; i < r.n; i++) {
        tp_node *n = r.nodes[i];
        if (n->n_buf) {
            for (int k = 0; k < (n->n_nout ? n->n_nout : 1); k++) {
                tp_tensor_unref(n->n_buf[k]);
            }
            tp__free(n->n_buf);
            n->n_buf = NULL;
        }
    }
    // Roots whose node was never discovered (an error came first).
    for (int i = 0; i < n_roots; i++) {
        tp_node *n = root_nodes[i];
        if (n && n->n_buf) {
            for (int k = 0; k < (n->n_nout ? n->n_nout : 1); k++) {
                tp_tensor_unref(n->n_buf[k]);
            }
            tp__free(n->n_buf);
            n->n_buf = NULL;
        }
    }
    tp__free(r.nodes);
    tp__free(r.ready);
    for (int i = 0; i < n_roots; i++) {
        tp_node_unref(root_nodes[i]);
    }
    tp__free(root_nodes);
    tp_grad_mode_set(prev_mode);
    return st;
}

tp_status
tp_backward(int n_roots, tp_tensor *const *roots, tp_tensor *const *grad_roots,
            bool retain_graph, tp_error **err_p)
{
    tp_backward_root small[8];
    tp_backward_root *rs = small;
    if (n_roots > 0 && !roots) {
        return tp__error_set(err_p, TP_EINVAL, "backward: bad roots");
    }
    if (n_roots > 8) {
        rs = tp__zalloc(sizeof(*rs) * (size_t)n_roots);
        if (!rs) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
    }
    for (int i = 0; i < n_roots; i++) {
        memset(&rs[i], 0, sizeof(rs[i]));
        rs[i].tensor = roots[i];
        rs[i].grad = grad_roots ? grad_roots[i] : NULL;
    }
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.retain_graph = retain_graph;
    tp_status st = tp_backward_run(&o, n_roots, rs, err_p);
    if (rs != small) {
        tp__free(rs);
    }
    return st;
}
