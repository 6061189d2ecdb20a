// SPDX-License-Identifier: Apache-2.0
// engine.c - backward graph nodes, grad mode, gradient maps and the
// reverse-mode engine.
//
// Ownership in the graph: a non-leaf tensor holds its grad_fn; a node holds
// the nodes its edges point to, and saved tensors as detached aliases; an
// accumulate node holds its leaf. Nothing points back, so there are no
// cycles.
//
// Threads: each use of a leaf gets its own accumulate node, so graphs built
// by different threads from shared leaves (parameters) have no node in
// common and can run backward at the same time; the engine keeps its
// per-pass state in the nodes. What they do share is guarded: a leaf's
// .grad by leaf_grad_mtx, a gradient map by its m_mtx. Never both at once.

#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

// ---- grad mode -------------------------------------------------------------

// Per thread, like PyTorch's GradMode; this is a mode, not an error slot.
static _Thread_local bool grad_disabled;

bool
tp_grad_mode_set(bool enabled)
{
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

bool
tp_grad_mode_get(void)
{
    return !grad_disabled;
}

// ---- tensors' autograd state -----------------------------------------------

// Guards the .grad of every leaf while backward passes accumulate into it.
static tp_mtx leaf_grad_mtx = {PTHREAD_MUTEX_INITIALIZER};

static void
tensor_ag_release(tp_tensor *t)
{
    tp_tensor_unref(t->t_grad);
    tp_node_unref(t->t_grad_fn);
    t->t_grad = NULL;
    t->t_grad_fn = NULL;
}

bool
tp_tensor_requires_grad(const tp_tensor *t)
{
    return t->t_requires_grad;
}

bool
tp_tensor_is_leaf(const tp_tensor *t)
{
    return t->t_grad_fn == NULL;
}

tp_node *
tp_tensor_grad_fn(const tp_tensor *t)
{
    return t->t_grad_fn;
}

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

tp_status
tp_tensor_set_requires_grad(tp_tensor *t, bool requires, tp_error **err_p)
{
    if (t->t_grad_fn) {
        return tp__error_set(err_p, TP_EINVAL,
                             "set_requires_grad: only on leaf tensors "
                             "(use tp_detach)");
    }
    if (requires && !tp_dtype_is_floating(t->t_dtype)) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "set_requires_grad: only floating tensors can "
                             "require grad (got %s)",
                             tp_dtype_name(t->t_dtype));
    }
    t->t_requires_grad = requires;
    t->t_ag_release = tensor_ag_release;
    return TP_OK;
}

tp_status
tp_detach(tp_tensor *t, tp_tensor **out_p, tp_error **err_p)
{
    return tp__tensor_alias(t, out_p, err_p);
}

static void
meta_of(tp__shape_meta *m, const tp_tensor *t)
{
    m->m_set = true;
    m->m_dtype = t->t_dtype;
    m->m_ndim = t->t_ndim;
    memcpy(m->m_shape, t->t_shape, sizeof(m->m_shape));
}

// ---- nodes -----------------------------------------------------------------

static tp_status
acc_backward(tp_node *node, tp_tensor *const *grad_outputs,
             tp_tensor **grad_inputs, tp_error **err_p)
{
    // The engine handles accumulate nodes itself (it knows the target).
    return TP_OK;
}

static const tp_node_ops acc_ops = {
    .name = "AccumulateGrad",
    .backward = acc_backward,
};

static tp_node *
node_alloc(const tp_node_ops *ops, void *arg, int n_in, int n_out)
{
    tp_node *n = tp__zalloc(sizeof(*n));
    if (!n) {
        return NULL;
    }
    n->n_next = n_in ? tp__zalloc(sizeof(tp__edge) * (size_t)n_in) : NULL;
    n->n_out = tp__zalloc(sizeof(tp__shape_meta) * (size_t)(n_out ? n_out : 1));
    if ((n_in && !n->n_next) || !n->n_out) {
        tp__free(n->n_next);
        tp__free(n->n_out);
        tp__free(n);
        return NULL;
    }
    atomic_init(&n->n_refs, 1);
    n->n_ops = ops;
    n->n_arg = arg;
    n->n_nin = n_in;
    n->n_nout = n_out;
    return n;
}

// Drops the saved state, running ops->release, exactly once per node:
// after a pass without retain_graph, or when the node is freed.
static void
node_release_saved(tp_node *n)
{
    if (n->n_released) {
        return;
    }
    n->n_released = true;
    for (int i = 0; i < TP__NODE_SAVED; i++) {
        tp_tensor_unref(n->n_saved[i]);
        n->n_saved[i] = NULL;
    }
    if (n->n_ops->release) {
        n->n_ops->release(n);
    }
}

tp_node *
tp_node_ref(tp_node *node)
{
    if (node) {
        atomic_fetch_add_explicit(&node->n_refs, 1, memory_order_relaxed);
    }
    return node;
}

void
tp_node_unref(tp_node *node)
{
    // Iterative so that dropping a long chain (an RNN unrolled over many
    // steps) does not recurse once per node.
    tp_node *stack_small[64];
    tp_node **stack = stack_small;
    size_t cap = 64, top = 0;
    if (!node) {
        return;
    }
    stack[top++] = node;
    while (top > 0) {
        tp_node *n = stack[--top];
        if (atomic_fetch_sub_explicit(&n->n_refs, 1, memory_order_acq_rel) !=
            1) {
            continue;
        }
        // release (if it has not run yet) sees the node before destroy
        // frees what tp_node_arg points to.
        node_release_saved(n);
        if (n->n_ops->destroy) {
            n->n_ops->destroy(n);
        }
        tp_tensor_unref(n->n_leaf);
        for (int i = 0; i < n->n_nin; i++) {
            tp_node *next = n->n_next[i].e_node;
            if (!next) {
                continue;
            }
            if (top == cap) {
                tp_node **bigger = tp__alloc(sizeof(*bigger) * cap * 2);
                if (!bigger) {
                    // Out of memory while freeing: fall back to recursion.
                    tp_node_unref(next);
                    continue;
                }
                memcpy(bigger, stack, sizeof(*bigger) * cap);
                if (stack != stack_small) {
                    tp__free(stack);
                }
                stack = bigger;
                cap *= 2;
            }
            stack[top++] = next;
        }
        tp__free(n->n_next);
        tp__free(n->n_out);
        tp__free(n->n_buf);
        tp__free(n);
    }
    if (stack != stack_small) {
        tp__free(stack);
    }
}

// The node a gradient for @t goes to, with a new reference; NULL if @t
// does not require grad.
static tp_status
edge_target(tp_tensor *t, tp_node **node_p, int *nr_p, tp_error **err_p)
{
    *node_p = NULL;
    *nr_p = 0;
    if (!t->t_requires_grad) {
        return TP_OK;
    }
    if (t->t_grad_fn) {
        *node_p = tp_node_ref(t->t_grad_fn);
        *nr_p = t->t_output_nr;
        return TP_OK;
    }
    tp_node *acc = node_alloc(&acc_ops, NULL, 0, 1);
    if (!acc) {
        return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
    }
    acc->n_leaf = tp_tensor_ref(t);
    meta_of(&acc->n_out[0], t);
    *node_p = acc;
    return TP_OK;
}

tp_status
tp_node_create(const tp_node_ops *ops, void *arg, int n_inputs,
               tp_tensor *const *inputs, int n_outputs, tp_node **node_p,
               tp_error **err_p)
{
    if (!ops || !ops->backward || n_inputs < 0 || n_outputs < 0 ||
        (n_inputs && !inputs)) {
        return tp__error_set(err_p, TP_EINVAL, "node create: bad arguments");
    }
    tp_node *n = node_alloc(ops, arg, n_inputs, n_outputs);
    if (!n) {
        return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
    }
    for (int i = 0; i < n_inputs; i++) {
        tp_status st = edge_target(inputs[i], &n->n_next[i].e_node,
                                   &n->n_next[i].e_nr, err_p);
        if (st != TP_OK) {
            n->n_ops = &acc_ops; // do not run the caller's destroy
            tp_node_unref(n);
            return st;
        }
        meta_of(&n->n_next[i].e_meta, inputs[i]);
    }
    *node_p = n;
    return TP_OK;
}

void *
tp_node_arg(const tp_node *node)
{
    return node->n_arg;
}

const char *
tp_node_name(const tp_node *node)
{
    return node->n_ops->name ? node->n_ops->name : "?";
}

int
tp_node_num_inputs(const tp_node *node)
{
    return node->n_nin;
}

int
tp_node_num_outputs(const tp_node *node)
{
    return node->n_nout;
}

tp_node *
tp_node_next(const tp_node *node, int i, int *output_nr_p)
{
    if (i < 0 || i >= node->n_nin) {
        return NULL;
    }
    if (output_nr_p) {
        *output_nr_p = node->n_next[i].e_nr;
    }
    return node->n_next[i].e_node;
}

tp_status
tp_tensor_set_grad_fn(tp_tensor *t, tp_node *node, int output_nr,
                      tp_error **err_p)
{
    if (output_nr < 0 || output_nr >= node->n_nout) {
        return tp__error_set(err_p, TP_EINVAL,
                             "set_grad_fn: output %d of a %d-output node",
                             output_nr, node->n_nout);
    }
    if (!t->t_grad_fn && t->t_requires_grad) {
        return tp__error_set(err_p, TP_EINVAL,
                             "set_grad_fn: tensor is a leaf that requires "
                             "grad");
    }
    tp_node_ref(node);
    tp_node_unref(t->t_grad_fn);
    t->t_grad_fn = node;
    t->t_output_nr = output_nr;
    t->t_requires_grad = true;
    t->t_ag_release = tensor_ag_release;
    meta_of(&node->n_out[output_nr], t);
    return TP_OK;
}

bool
tp__ag_should_record(int n, tp_tensor *const *inputs)
{
    if (grad_disabled) {
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (inputs[i] && inputs[i]->t_requires_grad) {
            return true;
        }
    }
    return false;
}

tp_status
tp__ag_record(const tp_node_ops *ops, int n, tp_tensor *const *in,
              tp_tensor *out, tp_node **node_p, tp_error **err_p)
{
    tp_node *node;
    tp_status st = tp_node_create(ops, NULL, n, in, 1, &node, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp_tensor_set_grad_fn(out, node, 0, err_p);
    tp_node_unref(node); // @out holds it now (or nobody does)
    if (st != TP_OK) {
        return st;
    }
    *node_p = node;
    return TP_OK;
}

tp_status
tp__node_save(tp_node *node, int i, const tp_tensor *t, tp_error **err_p)
{
    tp_tensor *a;
    tp_status st = tp__tensor_alias(t, &a, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_tensor_unref(node->n_saved[i]);
    node->n_saved[i] = a;
    return TP_OK;
}

// ---- gradient maps ---------------------------------------------------------

struct tp_grad_map {
    tp_mtx m_mtx; // guards everything below; concurrent passes may share
    size_t m_n, m_cap;
    tp_tensor **m_keys;
    tp_tensor **m_grads;
};

tp_status
tp_grad_map_create(tp_grad_map **map_p)
{
    tp_grad_map *m = tp__zalloc(sizeof(*m));
    if (!m) {
        return TP_ENOMEM;
    }
    tp__mtx_init(&m->m_mtx);
    *map_p = m;
    return TP_OK;
}

void
tp_grad_map_destroy(tp_grad_map *m)
{
    if (!m) {
        return;
    }
    for (size_t i = 0; i < m->m_n; i++) {
        tp_tensor_unref(m->m_keys[i]);
        tp_tensor_unref(m->m_grads[i]);
    }
    tp__free(m->m_keys);
    tp__free(m->m_grads);
    tp__mtx_fini(&m->m_mtx);
    tp__free(m);
}

static tp_tensor **
grad_map_slot(const tp_grad_map *m, const tp_tensor *leaf)
{
    // Linear: maps hold the parameters of one worker's part of a model,
    // which is tens of tensors. A hash table can come when that changes.
    for (size_t i = 0; i < m->m_n; i++) {
        if (m->m_keys[i] == leaf) {
            return &m->m_grads[i];
        }
    }
    return NULL;
}

tp_tensor *
tp_grad_map_get(const tp_grad_map *m, const tp_tensor *leaf)
{
    tp_grad_map *mm = (tp_grad_map *)m; // the lock is not the contents
    tp__mtx_lock(&mm->m_mtx);
    tp_tensor **slot = grad_map_slot(m, leaf);
    tp_tensor *g = slot ? *slot : NULL;
    tp__mtx_unlock(&mm->m_mtx);
    return g;
}

size_t
tp_grad_map_size(const tp_grad_map *m)
{
    tp_grad_map *mm = (tp_grad_map *)m;
    tp__mtx_lock(&mm->m_mtx);
    size_t n = m->m_n;
    tp__mtx_unlock(&mm->m_mtx);
    return n;
}

tp_status
tp_grad_map_entry(const tp_grad_map *m, size_t i, tp_tensor **leaf_p,
                  tp_tensor **grad_p)
{
    tp_grad_map *mm = (tp_grad_map *)m;
    tp_status st = TP_EINVAL;
    tp__mtx_lock(&mm->m_mtx);
    if (i < m->m_n) {
        *leaf_p = m->m_keys[i];
        *grad_p = m->m_grads[i];
        st = TP_OK;
    }
    tp__mtx_unlock(&mm->m_mtx);
    return st;
}

static tp_status
grad_map_add_slot(tp_grad_map *m, tp_tensor *leaf, tp_tensor ***slot_p,
                  tp_error **err_p)
{
    if (m->m_n == m->m_cap) {
        size_t cap = m->m_cap ? m->m_cap * 2 : 8;
        tp_tensor **k = tp__realloc(m->m_keys, sizeof(*k) * cap);
        if (!k) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
        m->m_keys = k;
        tp_tensor **g = tp__realloc(m->m_grads, sizeof(*g) * cap);
        if (!g) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
        m->m_grads = g;
        m->m_cap = cap;
    }
    m->m_keys[m->m_n] = tp_tensor_ref(leaf);
    m->m_grads[m->m_n] = NULL;
    *slot_p = &m->m_grads[m->m_n];
    m->m_n++;
    return TP_OK;
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

static tp_status
run_accumulate_node(tp_node *n, const tp_backward_options *o, tp_error **err_p)
{
    tp_tensor *g = n->n_buf[0];
    n->n_buf[0] = NULL;
    if (!g || !n->n_leaf) {
        tp_tensor_unref(g);
        return TP_OK;
    }
    tp_status st;
    if (o->grads) {
        tp_grad_map *m = o->grads;
        tp__mtx_lock(&m->m_mtx);
        tp_tensor **slot = grad_map_slot(m, n->n_leaf);
        st = slot ? TP_OK : grad_map_add_slot(m, n->n_leaf, &slot, err_p);
        if (st == TP_OK) {
            st = accumulate(slot, g, true, err_p);
        } else {
            tp_tensor_unref(g);
        }
        tp__mtx_unlock(&m->m_mtx);
        return st;
    }
    tp__mtx_lock(&leaf_grad_mtx);
    n->n_leaf->t_ag_release = tensor_ag_release;
    st = accumulate(&n->n_leaf->t_grad, g, true, err_p);
    tp__mtx_unlock(&leaf_grad_mtx);
    return st;
}

static tp_status
run_node(tp_node *n, const tp_backward_options *o, engine_run *r,
         tp_error **err_p)
{
    if (n->n_ops == &acc_ops) {
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
        if (--e->e_node->n_deps == 0) {
            r->ready[r->nready++] = e->e_node;
        }
    }
    if (gin != gin_small) {
        tp__free(gin);
    }
    if (st == TP_OK && !o->retain_graph) {
        node_release_saved(n);
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
    if (n_roots < 0 || (n_roots && !roots)) {
        return tp__error_set(err_p, TP_EINVAL, "backward: bad roots");
    }
    engine_run r = {0};
    r.pass = atomic_fetch_add_explicit(&engine_pass_counter, 1,
                                       memory_order_relaxed) +
             1;
    tp_status st = TP_OK;
    tp_node **root_nodes =
        tp__zalloc(sizeof(tp_node *) * (size_t)(n_roots ? n_roots : 1));
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
            st = edge_target(rt->tensor, &node, &nr, err_p);
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
