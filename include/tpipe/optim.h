/* SPDX-License-Identifier: Apache-2.0 */
/* optim.h - optimizers (torch.optim's update rules, PyTorch 1.13) over
 * parameters and a gradient source, and the DistributedOptimizer over
 * parameter RRefs held by several workers (docs/optim.md). */
#ifndef TPIPE_OPTIM_H
#define TPIPE_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/autograd.h>
#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#ifdef __cplusplus
extern "C" {
#endif

/** tp_optim_kind - the update rule. */
typedef enum tp_optim_kind {
    TP_OPTIM_SGD = 0,
    TP_OPTIM_ADAGRAD = 1,
    TP_OPTIM_ADAM = 2,
    TP_OPTIM_ADAMW = 3,
    TP_OPTIM_RMSPROP = 4,
} tp_optim_kind;

/**
 * tp_optim_options - starts with its size; tp_optim_options_init sets
 * PyTorch 1.13's defaults for a kind. Fields a kind does not use are
 * ignored.
 */
typedef struct tp_optim_options {
    size_t size;
    tp_optim_kind kind;
    double lr;           /* SGD: required (NaN until set); Adam(W) 1e-3,
                            Adagrad 1e-2, RMSprop 1e-2 */
    double weight_decay; /* 0; AdamW 1e-2 (decoupled) */
    double momentum;     /* SGD, RMSprop: 0 */
    double dampening;    /* SGD: 0 */
    bool nesterov;       /* SGD: false (needs momentum > 0, dampening 0) */
    double beta1, beta2; /* Adam(W): 0.9, 0.999 */
    double eps;          /* Adam(W) 1e-8, Adagrad 1e-10, RMSprop 1e-8 */
    bool amsgrad;        /* Adam(W): false */
    double lr_decay;     /* Adagrad: 0 */
    double initial_accumulator_value; /* Adagrad: 0 */
    double alpha;                     /* RMSprop: 0.99 */
    bool centered;                    /* RMSprop: false */
    bool maximize;                    /* all: false */
} tp_optim_options;

/** tp_optim_options_init - PyTorch 1.13's defaults for @kind. */
TP_API void tp_optim_options_init(tp_optim_options *o, tp_optim_kind kind);
/** tp_optim_kind_name - "sgd", "adagrad", "adam", "adamw", "rmsprop". */
TP_API const char *tp_optim_kind_name(tp_optim_kind kind);

/** tp_optim - an optimizer over a fixed list of parameters; opaque. */
typedef struct tp_optim tp_optim;

/**
 * tp_optim_create - an optimizer of @o's kind over @params (contiguous
 * CPU leaf f32/f64 tensors that require grad).
 * Ownership: @o and @params are borrowed; a reference to each parameter
 *   is taken. The caller owns *@opt_p (tp_optim_destroy).
 * Errors: TP_EINVAL naming the option and its value (negative lr, eps,
 * weight_decay, momentum, lr_decay, initial_accumulator_value, alpha;
 * betas outside [0, 1); SGD without lr; nesterov without momentum or
 * with dampening; an unknown kind; @o NULL or too short), or the
 * parameter (none; NULL; not a leaf requiring grad; not contiguous;
 * given twice), TP_ENOTSUP (dtype, CUDA), TP_ENOMEM.
 * Thread safety: any thread.
 */
TP_API tp_status tp_optim_create(const tp_optim_options *o, size_t n_params,
                                 tp_tensor *const *params, tp_optim **opt_p,
                                 tp_error **err_p);
/**
 * tp_optim_step - one update of every parameter from its gradient: in
 * @grads (a context's map, tp_dist_autograd_get_gradients) or, with
 * @grads NULL, its .grad. Parameters without a gradient are skipped (their
 * state does not advance), as PyTorch does. Updates the parameters' data
 * in place; a parameter's state is allocated at its first step with a
 * gradient. A step that fails changes no parameter and no state.
 * Errors: TP_EINVAL (a gradient whose shape or dtype differs, naming the
 * parameter), TP_ENOMEM.
 * Thread safety: not concurrently with another step of the same
 * optimizer, nor with other uses of its parameters' data.
 */
TP_API tp_status tp_optim_step(tp_optim *opt, const tp_grad_map *grads,
                               tp_error **err_p);
/**
 * tp_optim_zero_grad - drops the .grad of every parameter (PyTorch's
 * zero_grad(set_to_none=True)). NULL is fine.
 */
TP_API void tp_optim_zero_grad(tp_optim *opt);
/** tp_optim_destroy - frees @opt and its state; NULL is fine. */
TP_API void tp_optim_destroy(tp_optim *opt);

/* ---- DistributedOptimizer ---------------------------------------------- */

/** tp_dist_optim - one optimizer per owner of the parameters; opaque. */
typedef struct tp_dist_optim tp_dist_optim;

/**
 * tp_dist_optim_create - PyTorch's DistributedOptimizer: @params are
 * RRefs whose values are each one parameter tensor (args holding exactly
 * one tensor), owned by any workers; on each owner one tp_optim of @o is
 * created (a remote object, "tp.optim.local", registered by every agent)
 * over the parameters it owns, owner after owner. Waits up to
 * @timeout_ms in all (TP_TIMEOUT_DEFAULT: the agent's rpc_timeout_ms).
 * Ownership: @o and @params are borrowed; the caller owns *@opt_p.
 * Errors: the option errors of tp_optim_create (before any RPC),
 * TP_EINVAL (no parameters, a NULL one), an owner's failure naming it
 * (tp_optim_create's errors there, a value that is not one tensor, RPC
 * errors); the optimizers already made are then dropped.
 * Thread safety: any thread but a loop thread.
 */
TP_API tp_status tp_dist_optim_create(tp_agent *a, const tp_optim_options *o,
                                      size_t n_params, tp_rref *const *params,
                                      int64_t timeout_ms, tp_dist_optim **opt_p,
                                      tp_error **err_p);
/**
 * tp_dist_optim_step - every owner steps its optimizer with the gradients
 * of distributed autograd context @ctx_id on that owner, all owners in
 * parallel; steps of one owner's optimizer never interleave (two trainers
 * stepping the same owner run one after the other). Returns when all are
 * done; each call ends by @timeout_ms.
 * Errors: the first failing owner's (in the owners' order), naming it
 * and the context: TP_ENOENT (unknown context there), tp_optim_step's,
 * RPC errors.
 * Thread safety: any thread but a loop thread, several at once.
 */
TP_API tp_status tp_dist_optim_step(tp_dist_optim *opt, int64_t ctx_id,
                                    int64_t timeout_ms, tp_error **err_p);
/**
 * tp_dist_optim_destroy - drops the RRefs to the remote optimizers (each
 * owner frees its optimizer then); NULL is fine. Before tp_rpc_shutdown.
 */
TP_API void tp_dist_optim_destroy(tp_dist_optim *opt);

#ifdef __cplusplus
}
#endif
#endif
