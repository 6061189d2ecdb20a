/* SPDX-License-Identifier: Apache-2.0 */
/* proto.h (internal) - how a protocol above the agent plugs into it: the
 * RRef protocol (rref/) and, next, distributed autograd. The agent never
 * names a protocol: the build generates the list of protocols
 * (gen/tp_protocols.c from TP_AGENT_PROTOCOLS in agent/CMakeLists.txt) and
 * every agent installs each of them at init, before it accepts a pipe.
 *
 * A protocol has
 *   - message kinds of its own (requests answered by RESPONSE or ERROR,
 *     like a call): a handler on the loop thread, in the order messages
 *     arrive on their pipe, and optionally a second step on the pool;
 *   - hooks on every message that carries args (calls, replies and its
 *     own kinds): on send it may write a section of the message's
 *     extension bytes, on receive it reads that section back and may
 *     attach objects to the args (RRefs) or replace their tensors;
 *   - a part in the graceful-shutdown agreement (work still in flight) and
 *     in failure handling (a peer that died);
 *   - lines in tp_rpc_get_debug_info.
 * Args carry objects of a protocol (tp__args_add_obj) beside their bytes
 * and tensors; the agent keeps them and releases them with the args.
 *
 * Wire: the extension bytes of a message are sections, each an 8-byte
 * header (u8 id, u8 0, u16 0, u32le length) and its bytes, ids ascending:
 * id 0 is a protocol kind's own header, id N (1..7) the section of the
 * protocol with po_id N (docs/rpc-wire.md).
 *
 * Threads: hooks are called with no agent lock held. po_recv and
 * pk_on_loop run on a loop thread: they must not block, wait, or call
 * another worker (tp__agent_call_kind may connect, which waits for the
 * loop); they hand such work to the pool (tp__agent_submit). */
#ifndef TP_AGENT_PROTO_H
#define TP_AGENT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/future.h>
#include <tpipe/rpc.h>

#include "core/error.h"
#include "core/pool.h"

/* The most protocols an agent installs, and the highest section id. */
#define TP__PROTO_MAX    4
#define TP__PROTO_MAX_ID 7
/* Message kinds a protocol may own: 16..31 RRef, 32..47 dist autograd. */
#define TP__PROTO_KIND_MIN 16
#define TP__PROTO_KIND_MAX 47

/* ---- objects carried by args ---------------------------------------- */

typedef struct tp__args_obj_ops {
    uint8_t ao_proto_id; /* the protocol whose section describes it */
    void (*ao_ref)(void *obj);
    void (*ao_unref)(void *obj);
} tp__args_obj_ops;

/* Appends @obj to @args (takes a new reference with ao_ref). Not once the
 * args were given to a call. Errors: TP_EINVAL (too many), TP_ENOMEM. */
tp_status tp__args_add_obj(tp_args *args, void *obj,
                           const tp__args_obj_ops *ops);
/* As tp__args_add_obj, taking the caller's reference to @obj instead of
 * a new one (for a protocol that holds its own lock). */
tp_status tp__args_add_obj_taken(tp_args *args, void *obj,
                                 const tp__args_obj_ops *ops);
/* The number of objects, and object @i (borrowed; NULL past the end). */
size_t tp__args_nobjs(const tp_args *args);
void *tp__args_obj(const tp_args *args, size_t i,
                   const tp__args_obj_ops **ops_p);

/* ---- extension bytes being written ---------------------------------- */

typedef struct tp__ext {
    uint8_t *x_buf;
    size_t x_len, x_cap;
    uint8_t x_inline[256];
} tp__ext;

void tp__ext_init(tp__ext *x);
void tp__ext_fini(tp__ext *x);
/* Appends @n bytes to the section being written. TP_ENOMEM, TP_EINVAL
 * (the extension would pass AG_WIRE_MAX_EXT). */
tp_status tp__ext_append(tp__ext *x, const void *p, size_t n);

/* ---- protocol message kinds ------------------------------------------ */

/* What a kind's handler sees of a message. Valid during the call; @args
 * may be kept with tp_args_ref (it keeps the header bytes alive too). */
typedef struct tp__proto_msg {
    tp_agent *pm_agent;
    int pm_from; /* the sender's rank (checked against its pipe) */
    uint8_t pm_kind;
    const uint8_t *pm_hdr; /* section 0; NULL with pm_hdr_len 0: none */
    size_t pm_hdr_len;
    const char *pm_name; /* the name field (not NUL-terminated), or NULL */
    size_t pm_name_len;
    tp_args *pm_args; /* borrowed */
} tp__proto_msg;

typedef enum tp__proto_verdict {
    TP__PROTO_DONE = 0, /* answered: *result_p (may be NULL) or *err_p */
    TP__PROTO_RUN = 1,  /* go on with pk_run on the pool */
    TP__PROTO_WAIT = 2, /* answered when the future in *ctx_p (taken,
                           bound to the pool) resolves, on the thread that
                           resolves it: no pool hand-over */
} tp__proto_verdict;

typedef struct tp__proto_kind {
    uint8_t pk_kind;
    const char *pk_name; /* "RREF_FETCH", for messages */
    /* Loop thread, in arrival order on the pipe; must not block. Returns
     * DONE with a result (*result_p, taken; NULL = empty) or an error
     * (*err_p set: an ERROR reply naming this worker; TP_EPROTO, for a
     * malformed header, closes the pipe with a protocol error naming the
     * peer instead), RUN with a context for pk_run in *ctx_p, or WAIT with
     * a future in *ctx_p. */
    tp__proto_verdict (*pk_on_loop)(void *state, const tp__proto_msg *m,
                                    void **ctx_p, tp_args **result_p,
                                    tp_error **err_p);
    /* Pool thread: returns a future resolving with a tp_args * (or NULL)
     * or an error, whose reply goes back; NULL means out of memory. May
     * be NULL if pk_on_loop never returns RUN. */
    tp_future *(*pk_run)(void *state, const tp__proto_msg *m, void *ctx);
    /* A notification: sent with tp__agent_notify, answered by nothing;
     * pk_on_loop must return DONE (its result or error is dropped). */
    bool pk_note;
} tp__proto_kind;

/* ---- the protocol --------------------------------------------------- */

typedef struct tp__proto_ops {
    const char *po_name;
    uint8_t po_id; /* its section id, 1..TP__PROTO_MAX_ID */
    const tp__proto_kind *po_kinds;
    size_t po_nkinds;
    /* tp_rpc_init, before the agent accepts pipes: the protocol's state
     * for @a. It may keep a reference to @a (tp__agent_ref). */
    tp_status (*po_attach)(tp_agent *a, void **state_p, tp_error **err_p);
    /* tp_rpc_shutdown, once no hook of this agent runs any more and the
     * pool is gone: the agent forgets @state. */
    void (*po_detach)(void *state);
    /* A message of @kind (the agent's REQUEST 1 or RESPONSE 2, or a
     * protocol's kind) carrying @args (may be NULL) goes to rank @to (not
     * this worker), on the sending thread, before it is written; @req is the
     * request a reply answers (its args as received, with the objects
     * po_recv attached), NULL for any other message. Appends the
     * section's bytes to @ext (none: no section). A token in *tok_p
     * (NULL: none) is given back to po_sent exactly once. An error fails
     * the message. */
    tp_status (*po_send)(void *state, int to, uint8_t kind, const tp_args *args,
                         const tp_args *req, tp__ext *ext, void **tok_p,
                         tp_error **err_p);
    /* The message of @tok was written (@err NULL) or will never be (its
     * error). Any thread, no lock held. */
    void (*po_sent)(void *state, void *tok, const tp_error *err);
    /* A message carrying @args arrived from rank @from, with this
     * protocol's section (@sec NULL, @len 0: none). Loop thread. TP_EPROTO
     * (malformed section) closes the pipe. */
    tp_status (*po_recv)(void *state, int from, const uint8_t *sec, size_t len,
                         tp_args *args, tp_error **err_p);
    /* A connection to or from @rank failed while the agent was running:
     * the peer is gone (or broken). Any thread, no lock held; may be
     * called more than once for one peer. */
    void (*po_peer_failed)(void *state, int rank, const tp_error *err);
    /* A function (a registered one, or a remote object's method) is about
     * to run with @in on this thread (a pool thread), for a message that
     * arrived; po_run_end(@tok) follows on the same thread once it
     * returned (an async function: once it handed back its future). Lets
     * a protocol make state carried by @in current on the thread while
     * the function runs (distributed autograd's context). Optional. */
    void *(*po_run_begin)(void *state, const tp_args *in);
    void (*po_run_end)(void *state, void *tok);
    /* Graceful shutdown: before the first round of the agreement. */
    void (*po_shutdown_begin)(void *state);
    /* Work of the protocol in flight here (messages expected from other
     * workers): the agreement ends only when every worker reports none. */
    uint64_t (*po_pending)(void *state);
    /* After the agreement (@agreed false: it failed or the shutdown is not
     * graceful), before the pipes close. */
    void (*po_shutdown_end)(void *state, bool agreed);
    /* Appends lines for tp_rpc_get_debug_info; returns the bytes written
     * (snprintf-style, may be more than @len). */
    size_t (*po_debug)(void *state, char *buf, size_t len);
} tp__proto_ops;

/* The protocols of this build (generated). */
extern const tp__proto_ops *const tp__agent_protos[];
extern const size_t tp__agent_nprotos;

/* ---- the agent, for protocols --------------------------------------- */

/* The state po_attach returned for @ops on @a; NULL after detach. */
void *tp__agent_proto_state(const tp_agent *a, const tp__proto_ops *ops);
tp_agent *tp__agent_ref(tp_agent *a);
void tp__agent_unref(tp_agent *a);
int tp__agent_rank(const tp_agent *a);
/* The worker of @rank (NULL if out of range); stable for the agent's
 * life. */
const tp_worker_info *tp__agent_worker(const tp_agent *a, int rank);
/* The effective timeout of a call (TP_TIMEOUT_DEFAULT: rpc_timeout_ms). */
int64_t tp__agent_timeout(const tp_agent *a, int64_t timeout_ms);
/* Runs @task on the agent's pool. TP_ECLOSED once shutting down. */
tp_status tp__agent_submit(tp_agent *a, tp_task *task);
/* A pool-bound future for protocol results made outside a call. */
void tp__agent_bind_future(tp_agent *a, tp_future *f);
/*
 * Runs the function registered as @name with @in on this pool thread, as
 * a call from worker @caller would (an async handler's future is bound to
 * the pool). A future with the result (tp_args * or NULL) or an error
 * naming the function and this worker; NULL only without memory.
 */
tp_future *tp__agent_run_fn(tp_agent *a, int caller, const char *name,
                            const tp_args *in);
/*
 * Brackets a function that a protocol runs itself with @in (not through
 * tp__agent_run_fn, which does it): every protocol's po_run_begin, then
 * po_run_end in reverse order with the tokens kept in @toks.
 */
void tp__agent_run_begin(tp_agent *a, const tp_args *in,
                         void *toks[TP__PROTO_MAX]);
void tp__agent_run_end(tp_agent *a, void *toks[TP__PROTO_MAX]);
/*
 * Sends a message of protocol kind @kind to @to (another worker) with the
 * header @hdr (section 0), an optional @name, and @in (may be NULL),
 * answered like a call: the future resolves with the reply's tp_args * or
 * an error naming the worker (deadline, peer failure, shutdown as for
 * tp_rpc_async). NULL only without memory for the future. Unlike RPC
 * futures, it is not bound to the pool: its callbacks run on the thread
 * that resolves it, often a loop thread (the protocol's own callbacks
 * must not block; bind it with tp__agent_bind_future before handing it to
 * user code). May connect: not from a loop thread.
 */
tp_future *tp__agent_call_kind(tp_agent *a, int to, uint8_t kind,
                               const void *hdr, size_t hdr_len,
                               const char *name, const tp_args *in,
                               int64_t timeout_ms);
/*
 * Waits for the future @f of a call made with @timeout_ms (an RPC or a
 * protocol message), as tp_rpc_sync does: the call ends by its own
 * deadline; this wait adds a grace period as a backstop. On success
 * *@out_p (may be NULL) is a new reference to the result. @f is not
 * unreferenced.
 */
tp_status tp__agent_wait(tp_agent *a, tp_future *f, int64_t timeout_ms,
                         tp_args **out_p, tp_error **err_p);
/*
 * Sends the notification @kind (a kind with pk_note) to @to: a one-way
 * message, no reply, no future. TP_OK once it is handed to the pipe (a
 * write that fails later is only logged: the peer is gone); TP_EAGAIN,
 * sending nothing, with @nowait when the connection to @to does not exist
 * yet (from a loop thread, which must not connect); TP_ECLOSED, memory
 * or connection errors otherwise. The graceful shutdown's agreement waits
 * until every notification sent was received.
 */
tp_status tp__agent_notify(tp_agent *a, int to, uint8_t kind, const void *hdr,
                           size_t hdr_len, bool nowait, tp_error **err_p);
/*
 * As tp__agent_call_kind without a name, for any thread including a loop
 * thread: TP_EAGAIN, sending nothing, when the connection to @to does not
 * exist yet (the caller then sends from the pool). *@f_p on TP_OK.
 */
tp_status tp__agent_call_kind_now(tp_agent *a, int to, uint8_t kind,
                                  const void *hdr, size_t hdr_len,
                                  const tp_args *in, int64_t timeout_ms,
                                  tp_future **f_p);

#endif
