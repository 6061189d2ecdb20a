// SPDX-License-Identifier: Apache-2.0
// node.c - the backward graph: grad mode, nodes and their edges, and the
// autograd state of tensors (requires_grad, grad_fn). The engine that runs
// the graph is in engine.c, gradient maps in grad_map.c.
//
// Ownership in the graph: a non-leaf tensor holds its grad_fn; a node holds
// the nodes its edges point to, and saved tensors as detached aliases; an
// accumulate node holds its leaf. Nothing points back, so there are no
// cycles.
//
// Each use of a leaf gets its own accumulate node (tp__edge_target), so graphs
// built by different threads from shared leaves (parameters) have no node
// in common.

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

void
tp__tensor_ag_release(tp_tensor *t)
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
    t->t_ag_release = tp__tensor_ag_release;
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

bool
tp__node_is_accumulate(const tp_node *n)
{
    return n->n_ops == &acc_ops;
}

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

void
tp__node_release_saved(tp_node *n)
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
        tp__node_release_saved(n);
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

tp_status
tp__edge_target(tp_tensor *t, tp_node **node_p, int *nr_p, tp_error **err_p)
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
        tp_status st = tp__edge_target(inputs[i], &n->n_next[i].e_node,
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
    t->t_ag_release = tp__tensor_ag_release;
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
