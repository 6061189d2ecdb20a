/* SPDX-License-Identifier: Apache-2.0 */
/* autograd.h - differentiable tensor ops and the reverse-mode engine. */
#ifndef TPIPE_AUTOGRAD_H
#define TPIPE_AUTOGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/export.h>
#include <tpipe/error.h>
#include <tpipe/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Model. Every op below that gets an input requiring grad while grad mode
 * is on records a node (its backward function and the tensors it saved) as
 * the grad_fn of its output. tp_backward walks those nodes from the roots
 * in dependency order and accumulates gradients into the leaves (tensors
 * made with requires_grad set): into their .grad, or into a tp_grad_map.
 *
 * Ops: inputs are borrowed; *out_p gets a new reference. They fail with
 * TP_EINVAL on shapes that do not fit (the message names the op and the
 * shapes), TP_ENOTSUP on dtypes other than f32/f64, TP_ENOMEM.
 *
 * Thread safety: ops may run on any threads at once, also on shared
 * inputs: threads may build graphs from the same leaves (parameters) and
 * run backward on them concurrently, accumulating into the same .grad or
 * tp_grad_map. A graph itself (the nodes reachable from one non-leaf
 * tensor) is used by one thread at a time: two passes must not run at
 * once through the same non-leaf node. Read .grad after the passes that
 * write it have returned.
 */

/** tp_node - a node of the backward graph; refcounted, opaque. */
typedef struct tp_node tp_node;

/**
 * tp_backward_fn - computes the gradients of a node's inputs.
 * @grad_outputs: one per node output, borrowed; an output that received no
 *   gradient is passed as zeros of its shape if the node knows it (it was
 *   given to tp_tensor_set_grad_fn), else NULL.
 * @grad_inputs: one slot per input, all NULL on entry; store a new
 *   reference of the input's dtype and shape, or leave NULL for "no
 *   gradient".
 * Return TP_OK or an error (with *@err_p set); the engine then stops and
 * reports "backward of <name>: <message>".
 */
typedef tp_status (*tp_backward_fn)(tp_node *node,
                                    tp_tensor *const *grad_outputs,
                                    tp_tensor **grad_inputs, tp_error **err_p);

/**
 * tp_node_ops - what a node does. This is how a later layer adds
 * "boundary" nodes (distributed autograd's send/recv functions) without
 * autograd/ knowing about RPC: a recv node has no inputs and its backward
 * ships the gradient away; a send node's inputs are the tensors that were
 * sent and the engine is started at it (tp_backward_run) with the
 * gradients that came back.
 */
typedef struct tp_node_ops {
    const char *name;        /* "MulBackward"; shown in errors */
    tp_backward_fn backward; /* required */
    /* Optional: drop saved state. Runs at most once per node: after its
     * backward ran in a pass without retain_graph, or else when the node
     * is freed; always before destroy, so tp_node_arg is still valid. */
    void (*release)(tp_node *node);
    /* Optional: the node is being freed (after release); free what
     * tp_node_arg points to. */
    void (*destroy)(tp_node *node);
} tp_node_ops;

/**
 * tp_node_create - a node with @n_inputs edges (to where the gradients of
 * @inputs go: their grad_fn, or the accumulator of a leaf that requires
 * grad; no edge for inputs that do not) and @n_outputs outputs.
 * @ops must outlive the node; @arg is the caller's (see tp_node_arg).
 * Ownership: the caller owns the one reference; @inputs are borrowed.
 * Errors: TP_EINVAL, TP_ENOMEM.
 */
TP_API tp_status tp_node_create(const tp_node_ops *ops, void *arg, int n_inputs,
                                tp_tensor *const *inputs, int n_outputs,
                                tp_node **node_p, tp_error **err_p);
/** tp_node_ref - take a reference; returns @node. NULL is fine. */
TP_API tp_node *tp_node_ref(tp_node *node);
/** tp_node_unref - drop a reference (the last frees it); NULL is fine. */
TP_API void tp_node_unref(tp_node *node);
/** tp_node_arg - the @arg given to tp_node_create (NULL for built-in ops). */
TP_API void *tp_node_arg(const tp_node *node);
/** tp_node_name - the ops name ("MulBackward"); static, never NULL. */
TP_API const char *tp_node_name(const tp_node *node);
/** tp_node_num_inputs - the number of edges (inputs) of @node. */
TP_API int tp_node_num_inputs(const tp_node *node);
/** tp_node_num_outputs - the number of outputs of @node. */
TP_API int tp_node_num_outputs(const tp_node *node);
/**
 * tp_node_next - the node that input @i's gradient flows to (borrowed;
 * NULL if none), and which of its outputs (@output_nr_p may be NULL).
 */
TP_API tp_node *tp_node_next(const tp_node *node, int i, int *output_nr_p);

/**
 * tp_tensor_set_grad_fn - make @t output @output_nr of @node (takes a
 * reference to @node) and mark it requiring grad. Records @t's shape as
 * that output's shape. Errors: TP_EINVAL (bad output_nr, @t is a leaf
 * that requires grad).
 */
TP_API tp_status tp_tensor_set_grad_fn(tp_tensor *t, tp_node *node,
                                       int output_nr, tp_error **err_p);
/** tp_tensor_grad_fn - the node that made @t, or NULL (borrowed). */
TP_API tp_node *tp_tensor_grad_fn(const tp_tensor *t);
/**
 * tp_tensor_requires_grad - true for leaves marked so and for outputs
 * of recorded ops.
 */
TP_API bool tp_tensor_requires_grad(const tp_tensor *t);
/** tp_tensor_is_leaf - true if @t has no grad_fn. */
TP_API bool tp_tensor_is_leaf(const tp_tensor *t);
/**
 * tp_tensor_set_requires_grad - mark a leaf. Errors: TP_EINVAL on a
 * non-leaf, TP_ENOTSUP on a non-floating dtype.
 */
TP_API tp_status tp_tensor_set_requires_grad(tp_tensor *t, bool requires,
                                             tp_error **err_p);
/** tp_tensor_grad - the gradient accumulated in @t, or NULL (borrowed). */
TP_API tp_tensor *tp_tensor_grad(const tp_tensor *t);
/** tp_tensor_zero_grad - drops @t's accumulated gradient. */
TP_API void tp_tensor_zero_grad(tp_tensor *t);
/** tp_detach - a view of @t's data that is a leaf not requiring grad. */
TP_API tp_status tp_detach(tp_tensor *t, tp_tensor **out_p, tp_error **err_p);

/**
 * tp_grad_mode_set - turn recording on or off for the calling thread;
 * returns the previous value. A no_grad scope is
 * `bool prev = tp_grad_mode_set(false); ...; tp_grad_mode_set(prev);`.
 */
TP_API bool tp_grad_mode_set(bool enabled);
/** tp_grad_mode_get - whether the calling thread records (default on). */
TP_API bool tp_grad_mode_get(void);

/**
 * tp_grad_map - gradients keyed by leaf tensor, filled by tp_backward_run
 * instead of .grad (distributed autograd keeps one per context). It holds
 * a reference to each key and gradient. Thread safety: passes on several
 * threads may accumulate into one map at once; read it (get, entry) after
 * they have returned, since accumulation replaces the gradient tensors
 * that get and entry lend out.
 */
typedef struct tp_grad_map tp_grad_map;
/** tp_grad_map_create - an empty map. Errors: TP_ENOMEM. */
TP_API tp_status tp_grad_map_create(tp_grad_map **map_p);
/** tp_grad_map_destroy - frees @map and drops its references; NULL ok. */
TP_API void tp_grad_map_destroy(tp_grad_map *map);
/** tp_grad_map_get - the gradient of @leaf, or NULL (borrowed). */
TP_API tp_tensor *tp_grad_map_get(const tp_grad_map *map,
                                  const tp_tensor *leaf);
/** tp_grad_map_size - the number of leaves in @map. */
TP_API size_t tp_grad_map_size(const tp_grad_map *map);
/** tp_grad_map_entry - entry @i (< size): key and gradient, borrowed. */
TP_API tp_status tp_grad_map_entry(const tp_grad_map *map, size_t i,
                                   tp_tensor **leaf_p, tp_tensor **grad_p);
/**
 * tp_grad_map_copy - a new map with the same entries as @src: it holds its
 * own references to the same leaves and the same gradient tensors (they
 * are shared, not copied).
 * Ownership: @src is borrowed; the caller owns *@dst_p (free it with
 *   tp_grad_map_destroy).
 * Later passes that accumulate into @src replace @src's entries with new
 * tensors and never write into the old ones, so they do not change the
 * copy; an in-place change to a shared gradient tensor (tp_tensor_axpy,
 * tp_tensor_copy) shows in both maps.
 * Errors: TP_EINVAL (NULL @src or @dst_p), TP_ENOMEM.
 * Thread safety: any thread; it takes @src's lock, so passes may be
 *   accumulating into @src meanwhile (the copy then holds the entries of
 *   one moment between two accumulations).
 */
TP_API tp_status tp_grad_map_copy(const tp_grad_map *src, tp_grad_map **dst_p,
                                  tp_error **err_p);

/**
 * tp_backward_root - one place the engine starts: either @tensor (which
 * must require grad) or output @output_nr of @node; @grad is its gradient
 * (borrowed; NULL means 1 and needs a one-element tensor).
 */
typedef struct tp_backward_root {
    tp_tensor *tensor;
    tp_node *node;
    int output_nr;
    tp_tensor *grad;
} tp_backward_root;

/**
 * tp_leaf_grad_cb - told that @leaf's gradient for the running pass is
 * final; see tp_backward_options.on_leaf_grad.
 * @leaf: the leaf tensor (borrowed).
 * @grad: its gradient after the pass's last contribution: its .grad, or
 *   its entry in the options' grad map (borrowed; valid until the hook
 *   returns; take a reference to keep it). NULL if the leaf has none (no
 *   gradient reached it in this pass and it had none before).
 */
typedef void (*tp_leaf_grad_cb)(tp_tensor *leaf, tp_tensor *grad, void *arg);

/** tp_backward_options - starts with its size; see _init for defaults. */
typedef struct tp_backward_options {
    size_t size;
    bool retain_graph;  /* keep saved tensors for another pass (false) */
    tp_grad_map *grads; /* accumulate here instead of .grad (NULL) */
    /*
     * Optional (NULL): called once per leaf that the pass reaches, as soon
     * as that leaf's gradient for the pass is final: right after the last
     * of the pass's gradients for it was added (each use of a leaf in the
     * graph delivers its own, so a leaf used twice is reported once, after
     * both). The engine reports a leaf while it runs the node that
     * delivered that last gradient, before it goes on to other nodes, so in
     * a layered network the last layer's parameters come before the first
     * layer's. Data-parallel training uses it to start reducing gradient
     * buckets while the pass still runs (PyTorch DDP's reducer).
     *
     * Runs on the thread running the pass, inside tp_backward_run, with
     * grad mode off and no autograd lock held. It must not run a backward
     * pass, nor change the leaf's .grad or map entry. The pass does not
     * touch that gradient again, so the hook may start asynchronous work
     * that reads it or even writes it in place (an all_reduce), as long as
     * no other pass accumulates into the same leaf before that work ends.
     * If the pass fails, some leaves are not reported.
     */
    tp_leaf_grad_cb on_leaf_grad;
    void *on_leaf_grad_arg; /* passed to on_leaf_grad as @arg */
} tp_backward_options;
/**
 * tp_backward_options_init - defaults: no retain_graph, into .grad, no
 * on_leaf_grad.
 */
TP_API void tp_backward_options_init(tp_backward_options *o);

/**
 * tp_backward_run - runs the graph reachable from @roots once, in
 * dependency order, on the calling thread, with grad mode off inside
 * backward functions. Gradients reaching a tensor several ways add up.
 * Without retain_graph the saved tensors of the nodes it ran are dropped
 * and a second pass through them fails with TP_EINVAL.
 * Errors: TP_EINVAL ("backward: no roots" if @n_roots <= 0; a root that
 * does not require grad, named by its index: "backward: root 1 does not
 * require grad and has no grad_fn"; a gradient whose dtype or shape
 * differs from its tensor's; graph already freed), any error of a
 * backward function, wrapped as "backward of <op>: ...". On error the
 * leaves may have received part of the gradients.
 */
TP_API tp_status tp_backward_run(const tp_backward_options *o, int n_roots,
                                 const tp_backward_root *roots,
                                 tp_error **err_p);
/**
 * tp_backward - tp_backward_run from the tensors @roots with gradients
 * @grad_roots (NULL, or an array whose NULL entries mean 1), into .grad.
 */
TP_API tp_status tp_backward(int n_roots, tp_tensor *const *roots,
                             tp_tensor *const *grad_roots, bool retain_graph,
                             tp_error **err_p);

/**
 * tp_compute_threads_set - how many threads the CPU kernels use inside one
 * op (elementwise ops on large tensors, the blocked gemm), the caller
 * included; 1 (the default) runs every op on the calling thread. BLAS
 * threads are set through BLAS (OPENBLAS_NUM_THREADS). Ops called on
 * several threads at once do not share the workers: the others run
 * serially. Blocks until running ops finish with the old workers.
 * Errors: TP_EINVAL (outside [1, 64]), thread creation errors (the
 * threads that did start are used).
 * Thread safety: any thread; not across fork() once workers exist.
 */
TP_API tp_status tp_compute_threads_set(int n, tp_error **err_p);
/** tp_compute_threads_get - the current count (1 by default). */
TP_API int tp_compute_threads_get(void);

/* ---- ops ---------------------------------------------------------------- */

/* Elementwise with broadcasting (PyTorch rules); same dtype required. */
/** tp_add - @a + @b, broadcast. */
TP_API tp_status tp_add(tp_tensor *a, tp_tensor *b, tp_tensor **out_p,
                        tp_error **err_p);
/** tp_sub - @a - @b, broadcast. */
TP_API tp_status tp_sub(tp_tensor *a, tp_tensor *b, tp_tensor **out_p,
                        tp_error **err_p);
/** tp_mul - @a * @b, broadcast. */
TP_API tp_status tp_mul(tp_tensor *a, tp_tensor *b, tp_tensor **out_p,
                        tp_error **err_p);
/** tp_div - @a / @b, broadcast. */
TP_API tp_status tp_div(tp_tensor *a, tp_tensor *b, tp_tensor **out_p,
                        tp_error **err_p);
/** tp_add_scalar - @a + @s. */
TP_API tp_status tp_add_scalar(tp_tensor *a, double s, tp_tensor **out_p,
                               tp_error **err_p);
/** tp_mul_scalar - @a * @s. */
TP_API tp_status tp_mul_scalar(tp_tensor *a, double s, tp_tensor **out_p,
                               tp_error **err_p);
/* Elementwise unary. */
/** tp_neg - -@a. */
TP_API tp_status tp_neg(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_exp - e^@a. */
TP_API tp_status tp_exp(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_log - the natural logarithm of @a. */
TP_API tp_status tp_log(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_pow - @a to the scalar power @p. */
TP_API tp_status tp_pow(tp_tensor *a, double p, tp_tensor **out_p,
                        tp_error **err_p);
/** tp_sqrt - the square root of @a. */
TP_API tp_status tp_sqrt(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_tanh - tanh(@a). */
TP_API tp_status tp_tanh(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_sigmoid - 1 / (1 + e^-@a). */
TP_API tp_status tp_sigmoid(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_relu - max(@a, 0); the gradient at 0 is 0. */
TP_API tp_status tp_relu(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);

/* Reductions: over all elements (0-d result), or along @dim. */
/** tp_sum - the sum of all elements, a 0-d tensor (0 if empty). */
TP_API tp_status tp_sum(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/**
 * tp_sum_dim - sums along @dim (negative counts from the end); keeps
 * it as size 1 if @keepdim.
 */
TP_API tp_status tp_sum_dim(tp_tensor *a, int dim, bool keepdim,
                            tp_tensor **out_p, tp_error **err_p);
/** tp_mean - the mean of all elements (nan if empty). */
TP_API tp_status tp_mean(tp_tensor *a, tp_tensor **out_p, tp_error **err_p);
/** tp_mean_dim - the mean along @dim, as tp_sum_dim. */
TP_API tp_status tp_mean_dim(tp_tensor *a, int dim, bool keepdim,
                             tp_tensor **out_p, tp_error **err_p);

/**
 * tp_matmul - 2-D [m,k]x[k,n], or batched [...,m,k]x[...,k,n] with the
 * batch dims broadcast (a 2-D operand is shared by all batches). Uses
 * cblas_sgemm/dgemm when built with BLAS, a blocked kernel otherwise.
 */
TP_API tp_status tp_matmul(tp_tensor *a, tp_tensor *b, tp_tensor **out_p,
                           tp_error **err_p);

/**
 * tp_softmax - exp(@a) / sum(exp(@a)) along @dim, computed with the
 * maximum subtracted.
 */
TP_API tp_status tp_softmax(tp_tensor *a, int dim, tp_tensor **out_p,
                            tp_error **err_p);
/** tp_log_softmax - log(softmax(@a)) along @dim, as (a - max) - log(sum). */
TP_API tp_status tp_log_softmax(tp_tensor *a, int dim, tp_tensor **out_p,
                                tp_error **err_p);
/** tp_mse_loss - mean((@a - @target)^2), a 0-d tensor. */
TP_API tp_status tp_mse_loss(tp_tensor *a, tp_tensor *target, tp_tensor **out_p,
                             tp_error **err_p);
/**
 * tp_nll_loss - -mean(@logp[i, @target[i]]) for @logp [N, C] and integer
 * (i32/i64) @target [N]; TP_EINVAL if a target is outside [0, C).
 */
TP_API tp_status tp_nll_loss(tp_tensor *logp, tp_tensor *target,
                             tp_tensor **out_p, tp_error **err_p);
/** tp_cross_entropy - tp_nll_loss(log_softmax(@logits, 1), @target). */
TP_API tp_status tp_cross_entropy(tp_tensor *logits, tp_tensor *target,
                                  tp_tensor **out_p, tp_error **err_p);
/**
 * tp_embedding - rows of @weight [V, D] picked by integer @indices of any
 * shape: the result has shape indices.shape + [D]. Its gradient scatters
 * (adds) into the rows of @weight. TP_EINVAL for an index outside [0, V).
 */
TP_API tp_status tp_embedding(tp_tensor *weight, tp_tensor *indices,
                              tp_tensor **out_p, tp_error **err_p);

/**
 * tp_tensor_axpy - @y += @alpha * @x in place (@x broadcast to @y, and
 * converted to its dtype; @x may share @y's storage), for optimizer
 * steps. Not recorded. Errors: TP_EPERM if @y requires grad and grad mode
 * is on (wrap the step in a no_grad scope), TP_EINVAL (shapes, or @y is
 * broadcast: a stride-0 dim of size > 1), TP_ENOTSUP.
 */
TP_API tp_status tp_tensor_axpy(tp_tensor *y, double alpha, tp_tensor *x,
                                tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
