/* SPDX-License-Identifier: Apache-2.0 */
/* da_impl.h (internal) - distributed autograd (include/tpipe/
 * dist_autograd.h): a protocol of the RPC agent (agent/proto.h) above the
 * local engine (autograd/).
 *
 *   ctx.c       contexts: ids, the table, the thread's current context,
 *               release on every worker that took part, counters
 *   fns.c       send and recv functions (engine nodes) and the message
 *               section that records them
 *   proto.c     the protocol: hooks, message kinds, peer failure
 *   backward.c  the FAST-mode backward: local parts and their outstanding
 *               remote parts
 *
 * Locks: x_mtx guards the context table and every context's fields except
 * c_run (held while a local part runs the engine; never with x_mtx
 * held, and never while waiting for another worker: a recv function only
 * sends). Lock order: c_run, then x_mtx. */
#ifndef TP_AUTOGRAD_DIST_IMPL_H
#define TP_AUTOGRAD_DIST_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tpipe/autograd.h>
#include <tpipe/dist_autograd.h>

#include "agent/proto.h"
#include "core/error.h"
#include "core/platform.h"
#include "wire.h"

#define DA_PROTO_ID 2
/* Message kinds (32..47 are distributed autograd's). */
enum {
    DA_KIND_BACKWARD = 32, /* run a send function's part; reply when done */
    DA_KIND_RELEASE = 33,  /* note: a context ended */
    DA_KIND_ABORT = 34,    /* note: a backward pass failed: stop its parts */
};
typedef struct da_state da_state;
typedef struct da_ctx da_ctx;

struct da_ctx {
    _Atomic long c_refs;
    da_state *c_x;
    int64_t c_id;
    int c_creator;
    _Atomic bool c_released; /* out of the table; no new functions */
    bool *c_peers;           /* [world] workers it reached or came from */
    tp_grad_map *c_grads;
    tp_node **c_sends; /* send functions by id - 1 (referenced) */
    size_t c_nsends, c_cap_sends;
    uint64_t c_abort_pass; /* a failed pass: its parts stop (0: none) */
    tp_mtx c_run;          /* one local part at a time */
    da_ctx *c_next;        /* the table */
};

struct da_state {
    _Atomic long x_refs;
    tp_agent *x_agent; /* referenced */
    int x_rank, x_world;
    tp_mtx x_mtx;
    da_ctx *x_ctxs;
    _Atomic uint64_t x_next_ctx, x_next_pass;
    bool x_attached;
    bool *x_dead;       /* [world] */
    atomic_int x_ndead; /* ranks marked in x_dead (read without x_mtx) */
    tp_dist_autograd_stats x_st;
};

/* ---- ctx.c ------------------------------------------------------------ */
void tp__da_state_ref(da_state *x);
void tp__da_state_unref(da_state *x);
/* The protocol's state of @a (NULL: no agent or shut down). */
da_state *tp__da_state_of(const tp_agent *a);
da_ctx *tp__da_ctx_ref(da_ctx *c);
void tp__da_ctx_unref(da_ctx *c);
/* The context @id, referenced; NULL if unknown or released. */
da_ctx *tp__da_ctx_find(da_state *x, int64_t id);
/* As tp__da_ctx_find; TP_ENOENT in *@err_p saying @what found no context. */
da_ctx *tp__da_ctx_find_or_fail(da_state *x, int64_t id, const char *what,
                                tp_error **err_p);
/* The context @id, made here on first sight (a message from @from).
 * NULL: its creator is dead, or out of memory. */
da_ctx *tp__da_ctx_get_or_add(da_state *x, int64_t id, int from);
/* A copy of @c's c_peers (free it), or NULL without memory. */
bool *tp__da_ctx_peers(da_ctx *c);
/* Marks @rank as having taken part in @c. */
void tp__da_ctx_add_peer(da_ctx *c, int rank);
/* Ends @c here (out of the table, functions dropped); with @propagate, a
 * RELEASE note goes to every worker it reached except @from. */
void tp__da_ctx_release(da_ctx *c, bool propagate, int from);
/* Ends every context made by @creator (-1: every context). */
void tp__da_ctx_release_all(da_state *x, int creator);
const char *tp__da_name(const da_state *x);
/* Whether rank @r died (takes x_mtx). */
bool tp__da_is_dead(da_state *x, int r);

/* The calling thread's current context (borrowed), if of @x. */
da_ctx *tp__da_current(const da_state *x);
/* Makes @c (may be NULL) current on this thread; returns the previous. */
da_ctx *tp__da_set_current(da_ctx *c);

/* ---- fns.c ------------------------------------------------------------ */
/* Send hook: records a send function over @args' tensors that require
 * grad in @c (none: no function, send id 0) and writes the section. */
tp_status tp__da_record_send(da_ctx *c, int to, const tp_args *args,
                             tp__ext *ext, tp_error **err_p);
/* Receive hook: decodes a section (TP_EPROTO when malformed), wraps the
 * covered tensors of @args with a recv function; *@c_p the context. */
tp_status tp__da_record_recv(da_state *x, int from, const uint8_t *sec,
                             size_t len, tp_args *args, da_ctx **c_p,
                             tp_error **err_p);
/* The send function @id of @c, referenced (NULL: none). */
tp_node *tp__da_send_fn(da_ctx *c, uint64_t id);
/* Checks @grads against the tensors send function @n was recorded over:
 * count, dtypes and shapes. */
tp_status tp__da_send_check(tp_node *n, const tp_args *grads, tp_error **err_p);

/* ---- backward.c --------------------------------------------------------- */
/* The local part of a pass running on this thread (NULL: none). */
typedef struct da_part da_part;
da_part *tp__da_part_current(void);
/* A recv function's gradient goes back to @to's send function @send_id:
 * sent now, its reply waited for by the part's end. */
tp_status tp__da_part_send(da_part *p, da_ctx *c, int to, uint64_t send_id,
                           tp_tensor *const *grads, int n, tp_error **err_p);
/* Pool thread: BACKWARD @send_id of @c with @grads; a future resolving
 * (NULL value) once this part and the parts it started are done. */
tp_future *tp__da_backward_remote(da_ctx *c, int from, uint64_t send_id,
                                  uint64_t pass, bool retain,
                                  const tp_args *grads);
/* Marks @c's pass @pass aborted: its parts here stop at their next send
 * or recv function. */
void tp__da_pass_abort(da_ctx *c, uint64_t pass);

extern const tp__proto_ops tp__dist_autograd_proto;

#endif
