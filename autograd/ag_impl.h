/* SPDX-License-Identifier: Apache-2.0 */
/* ag_impl.h (internal) - what the files of autograd/ share: the node layout,
 * graph and gradient-map internals, op helpers and the raw kernels. */
#ifndef TP_AUTOGRAD_AG_IMPL_H
#define TP_AUTOGRAD_AG_IMPL_H

#include <tpipe/autograd.h>

#include "tensor_impl.h"

#define TP__NODE_SAVED 3

typedef struct tp__shape_meta {
    bool m_set;
    tp_dtype m_dtype;
    int m_ndim;
    int64_t m_shape[TP_TENSOR_MAX_DIMS];
} tp__shape_meta;

typedef struct tp__edge {
    tp_node *e_node;       // NULL: the input needs no gradient
    int e_nr;              // which output of e_node
    tp__shape_meta e_meta; // the input's shape, to check gradients
} tp__edge;

struct tp_node {
    atomic_long n_refs;
    const tp_node_ops *n_ops;
    void *n_arg;
    int n_nin;
    tp__edge *n_next;
    int n_nout;
    tp__shape_meta *n_out;

    // Saved state of built-in ops: detached aliases (never the output
    // itself, so no reference cycle) and scalar parameters.
    tp_tensor *n_saved[TP__NODE_SAVED];
    int64_t n_i[4];
    double n_d[2];
    bool n_released; // saved state dropped after a pass

    tp_tensor *n_leaf; // accumulate nodes: the leaf (strong reference)

    // Engine scratch for the pass that is running.
    uint64_t n_pass;
    int n_deps;
    tp_tensor **n_buf; // n_nout accumulated gradients
    // Accumulate nodes, with on_leaf_grad: the first accumulate node of
    // the same leaf in the pass, and (in that one) how many of them have
    // yet to run.
    tp_node *n_acc_head;
    int n_acc_left;
};

// ---- the graph (node.c) ----------------------------------------------------

// The t_ag_release of tensors with autograd state: drops .grad, grad_fn.
void tp__tensor_ag_release(tp_tensor *t);
// True for the accumulate node of a leaf (n_leaf is set), which the engine
// runs itself.
bool tp__node_is_accumulate(const tp_node *n);
// Drops the saved state, running ops->release, exactly once per node:
// after a pass without retain_graph, or when the node is freed.
void tp__node_release_saved(tp_node *n);
// The node a gradient for @t goes to, with a new reference (for a leaf, a
// fresh accumulate node); NULL if @t does not require grad.
tp_status tp__edge_target(tp_tensor *t, tp_node **node_p, int *nr_p,
                          tp_error **err_p);
// True if grad mode is on and any of @inputs requires grad.
bool tp__ag_should_record(int n, tp_tensor *const *inputs);
// Creates a node of @ops with edges to @inputs, makes @out its output 0,
// and returns it borrowed in *@node_p (owned by @out) so the op can save
// what its backward needs.
tp_status tp__ag_record(const tp_node_ops *ops, int n, tp_tensor *const *in,
                        tp_tensor *out, tp_node **node_p, tp_error **err_p);
// Saves a detached alias of @t in slot @i.
tp_status tp__node_save(tp_node *node, int i, const tp_tensor *t,
                        tp_error **err_p);

// ---- op helpers (ops.c), shared by ops.c, ops_reduce.c and ops_nn.c -----

// True if input @i of @n has an edge (its gradient is wanted).
bool tp__op_needs(const tp_node *n, int i);
// Reduces @g (taken) to the shape of input @i and stores it in @gin[i].
tp_status tp__op_to_input(const tp_node *n, int i, tp_tensor *g,
                          tp_tensor **gin, tp_error **err_p);
// Records @ops over @in for the fresh output *@o if needed. On failure
// drops *@o. *@node_p is NULL when nothing was recorded.
tp_status tp__op_record(const tp_node_ops *ops, int nin, tp_tensor *const *in,
                        tp_tensor **o, tp_node **node_p, tp_error **err_p);
// Saves @t in slot @slot of @n if @n is not NULL. On failure drops *@o.
tp_status tp__op_save(tp_node *n, int slot, const tp_tensor *t, tp_tensor **o,
                      tp_error **err_p);
// TP_EINTERNAL if slot @slot of @n holds no saved tensor.
tp_status tp__op_saved_or_fail(const tp_node *n, int slot, tp_error **err_p);

// Defines the backward function NAME of a built-in op.
#define TP__BW_FN(NAME)                                                        \
    static tp_status NAME(tp_node *n, tp_tensor *const *gout, tp_tensor **gin, \
                          tp_error **err_p)

// ---- gradient maps (grad_map.c) --------------------------------------------

// The map's lock, held around tp__grad_map_slot_locked and the use of the
// slot it returns.
void tp__grad_map_lock(tp_grad_map *m);
void tp__grad_map_unlock(tp_grad_map *m);
// The gradient slot of @leaf in @m, or NULL if it has none.
tp_tensor **tp__grad_map_find_locked(const tp_grad_map *m,
                                     const tp_tensor *leaf);
// The gradient slot of @leaf in @m, added (holding NULL, with a reference
// to @leaf) if there was none.
tp_status tp__grad_map_slot_locked(tp_grad_map *m, tp_tensor *leaf,
                                   tp_tensor ***slot_p, tp_error **err_p);

// ---- raw kernels (kernels*.c): no recording, f32/f64 ----------------------

typedef enum tp__binop {
    TP__ADD,
    TP__SUB,
    TP__MUL,
    TP__DIV,
    TP__RELU_BW,    // a * (b > 0)
    TP__TANH_BW,    // a * (1 - b^2)
    TP__SIGMOID_BW, // a * b * (1 - b)
    TP__SQRT_BW,    // a * 0.5 / b
    TP__POW_BW,     // a * s * b^(s - 1)
    TP__BINOP_COUNT
} tp__binop;

typedef enum tp__unop {
    TP__NEG,
    TP__EXP,
    TP__LOG,
    TP__SQRT,
    TP__TANH,
    TP__SIGMOID,
    TP__RELU,
    TP__POW,  // x^s
    TP__MULS, // x * s
    TP__ADDS, // x + s
    TP__UNOP_COUNT
} tp__unop;

// Checks @t is f32 or f64; names @op in the error.
tp_status tp__k_check_float(const char *op, const tp_tensor *t,
                            tp_error **err_p);
// The broadcast shape of two shapes (PyTorch rules).
tp_status tp__broadcast_shape(const char *op, const tp_tensor *a,
                              const tp_tensor *b, int *nd_p, int64_t *shape,
                              tp_error **err_p);
tp_status tp__k_binary(const char *op, tp__binop k, const tp_tensor *a,
                       const tp_tensor *b, double s, tp_tensor **out_p,
                       tp_error **err_p);
tp_status tp__k_unary(const char *op, tp__unop k, const tp_tensor *a, double s,
                      tp_tensor **out_p, tp_error **err_p);
// Sums over the dims with reduce[d] set; keeps them as size 1 if @keepdim.
tp_status tp__k_sum(const tp_tensor *a, const bool *reduce, bool keepdim,
                    double scale, tp_tensor **out_p, tp_error **err_p);
// Sums @g down to @shape (the reverse of broadcasting @shape to g's).
tp_status tp__k_sum_to(const tp_tensor *g, int ndim, const int64_t *shape,
                       tp_tensor **out_p, tp_error **err_p);
tp_status tp__k_matmul(const tp_tensor *a, const tp_tensor *b,
                       tp_tensor **out_p, tp_error **err_p);
tp_status tp__k_softmax(const tp_tensor *a, int dim, bool log,
                        tp_tensor **out_p, tp_error **err_p);
// y += alpha * x (x broadcast to y, and converted; it may alias y); y any
// layout but broadcast (stride 0 in a dim of size > 1: TP_EINVAL).
tp_status tp__k_axpy(tp_tensor *y, double alpha, const tp_tensor *x,
                     tp_error **err_p);
// The gemm used by matmul; exposed for the benchmark. C[m,n] (row-major,
// dense) = A[m,k] B[k,n] with element strides (rs, cs) for A and B.
void tp__gemm_f32(int64_t m, int64_t n, int64_t k, const float *a, int64_t rsa,
                  int64_t csa, const float *b, int64_t rsb, int64_t csb,
                  float *c);
void tp__gemm_f64(int64_t m, int64_t n, int64_t k, const double *a, int64_t rsa,
                  int64_t csa, const double *b, int64_t rsb, int64_t csb,
                  double *c);
// Intra-op parallelism (parallel.c): calls fn on [0, n) split into at
// most tp_compute_threads_get() ranges of at least @grain indices, on the
// calling thread and the workers; returns when all are done. Serial when
// one thread is configured or the workers are in use.
typedef void (*tp__par_fn)(void *ctx, int64_t begin, int64_t end);
void tp__parallel_for(int64_t n, int64_t grain, tp__par_fn fn, void *ctx);

// Forces the blocked fallback even when BLAS is built in (benchmarks).
void tp__gemm_force_fallback(bool on);
bool tp__gemm_have_blas(void);
/* cblas_sgemm/dgemm as loaded by blas.c (row-major order 101, no
 * transpose 111, transpose 112), or NULL: no BLAS could be loaded. */
typedef void (*tp__sgemm_fn)(int order, int ta, int tb, int m, int n, int k,
                             float alpha, const float *a, int lda,
                             const float *b, int ldb, float beta, float *c,
                             int ldc);
typedef void (*tp__dgemm_fn)(int order, int ta, int tb, int m, int n, int k,
                             double alpha, const double *a, int lda,
                             const double *b, int ldb, double beta, double *c,
                             int ldc);
tp__sgemm_fn tp__blas_sgemm(void);
tp__dgemm_fn tp__blas_dgemm(void);
/* The OPENBLAS_CORETYPE this library set at load, or NULL. */
const char *tp__blas_coretype(void);

#endif
