/* SPDX-License-Identifier: Apache-2.0 */
/* dist_autograd.h - distributed autograd over the RPC agent: contexts,
 * send/recv functions recorded by RPCs, remote() and to_here, and a FAST
 * mode backward that crosses workers (docs/dist_autograd.md). */
#ifndef TPIPE_DIST_AUTOGRAD_H
#define TPIPE_DIST_AUTOGRAD_H

#include <stdbool.h>
#include <stdint.h>
#include <tpipe/autograd.h>
#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Model (PyTorch's torch.distributed.autograd, FAST mode). A context
 * groups the send and recv functions of one forward pass and the
 * gradients of one backward pass. Its id is unique in the job: the
 * creator's rank in the top 16 bits, a counter below. A thread has a
 * current context (none at first): while one is current, every RPC,
 * tp_remote or to_here whose args or result hold tensors that require
 * grad records a send function on the sender and a recv function on the
 * receiver, and the receiver runs the function with that context
 * current. Gradients go to the context's map on each worker, never to
 * .grad.
 *
 * A context ends on every worker that took part when its creator releases
 * it, when the agent shuts down, or when its creator dies.
 */

/**
 * tp_dist_autograd_context_create - a new context, made current on the
 * calling thread (`with dist_autograd.context() as context_id:`).
 * Errors: TP_EINVAL (no agent; a context is already current
 * here: contexts do not nest), TP_ECLOSED, TP_ENOMEM.
 */
TP_API tp_status tp_dist_autograd_context_create(tp_agent *a, int64_t *ctx_id_p,
                                                 tp_error **err_p);
/**
 * tp_dist_autograd_context_release - ends context @ctx_id, made on this
 * worker, here and on every worker it reached (asynchronously there), and
 * clears it as current on this thread. Errors: TP_ENOENT (unknown or
 * released), TP_EINVAL (made by another worker).
 */
TP_API tp_status tp_dist_autograd_context_release(tp_agent *a, int64_t ctx_id,
                                                  tp_error **err_p);
/**
 * tp_dist_autograd_set_current - makes @ctx_id current on the calling
 * thread (-1: none), e.g. on a thread of the user's own pool.
 * Errors: TP_ENOENT (unknown or released).
 */
TP_API tp_status tp_dist_autograd_set_current(tp_agent *a, int64_t ctx_id,
                                              tp_error **err_p);
/** tp_dist_autograd_current - the calling thread's context, or -1. */
TP_API int64_t tp_dist_autograd_current(const tp_agent *a);

/**
 * tp_dist_autograd_backward - runs the backward pass of context @ctx_id
 * from @roots (each a one-element tensor that requires grad, gradient 1)
 * across every worker the graph reaches, and returns when all of them are
 * done. Gradients accumulate in the context's map on each worker.
 * Without @retain_graph a second pass through the same graph fails.
 * Errors: TP_EINVAL (no roots, a root that does not require grad or has
 * more than one element), TP_ENOENT (unknown context), a remote part's
 * failure naming the worker and its cause, TP_ECONNRESET when a worker
 * of the pass dies (within about a second), TP_ETIMEDOUT (the agent's
 * rpc_timeout_ms per remote part).
 */
TP_API tp_status tp_dist_autograd_backward(tp_agent *a, int64_t ctx_id,
                                           int n_roots, tp_tensor *const *roots,
                                           bool retain_graph, tp_error **err_p);
/**
 * tp_dist_autograd_get_gradients - the gradients that context @ctx_id
 * accumulated on this worker: *@map_p is a new map (free it with
 * tp_grad_map_destroy) holding references to the leaves and gradients.
 * Errors: TP_ENOENT (unknown or released), TP_ENOMEM.
 */
TP_API tp_status tp_dist_autograd_get_gradients(tp_agent *a, int64_t ctx_id,
                                                tp_grad_map **map_p,
                                                tp_error **err_p);

/** tp_dist_autograd_stats - the protocol's state on one worker. */
typedef struct tp_dist_autograd_stats {
    uint64_t contexts;  /* alive here (made here or reached) */
    uint64_t send_fns;  /* send functions recorded, alive */
    uint64_t recv_fns;  /* recv functions recorded, alive */
    uint64_t backwards; /* backward parts running here */
    uint64_t created;   /* contexts made here so far */
    uint64_t released;  /* contexts ended here so far (any cause) */
} tp_dist_autograd_stats;

/** tp_dist_autograd_get_stats - the counters of @a's protocol. */
TP_API tp_status tp_dist_autograd_get_stats(const tp_agent *a,
                                            tp_dist_autograd_stats *st_p);

#ifdef __cplusplus
}
#endif
#endif
