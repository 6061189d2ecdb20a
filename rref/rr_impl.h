/* SPDX-License-Identifier: Apache-2.0 */
/* rr_impl.h (internal) - the RRef protocol's state, shared by its files:
 *
 *   map.c     the tables (an intrusive hash map on ids)
 *   wire.c    headers and RRef sections (wire.h)
 *   ctx.c     a worker's RRef state: creating, holding, deleting RRefs,
 *             confirmations, forks, the messages queued to the pool
 *   proto.c   the agent protocol (agent/proto.h): the kinds' handlers,
 *             the hooks that fork RRefs passed in args, peer failure,
 *             shutdown, debug info
 *   rref.c    the public API of rref.h (remote, to_here, proxies, ...)
 *   object.c  remote types and objects (RemoteModule)
 *
 * The protocol is PyTorch's (docs/rref.md): the owner holds the value and
 * a set of forks (one per user RRef, by fork id, with the rank holding
 * it); a user RRef is confirmed when the owner knows its fork; a parent
 * keeps its RRef (a "pending child") until its child is confirmed; a user
 * RRef whose handles are all gone is deleted on the owner once it is
 * confirmed and has no pending child; an owner RRef goes when it has no
 * handle, no fork and no operation in progress.
 *
 * Locks: x_mtx of the worker's rr_ctx guards its tables, counters and
 * every tp_rref field marked (x). It is never held across a call into
 * the agent, a future, a pool submission or user code: messages to send
 * are collected under it (x_outbox) and sent after (tp__rr_flush). */
#ifndef TP_RR_IMPL_H
#define TP_RR_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tpipe/rref.h>

#include "agent/agent_int.h"
#include "agent/proto.h"
#include "core/error.h"
#include "core/platform.h"
#include "core/pool.h"
#include "wire.h"

// ---- tables -------------------------------------------------------------

typedef struct rr_node {
    struct rr_node *n_next;
    rr_id n_key;
} rr_node;

typedef struct rr_map {
    rr_node **m_b;
    size_t m_size; // power of two
    size_t m_count;
} rr_map;

tp_status tp__rr_map_init(rr_map *m);
void tp__rr_map_fini(rr_map *m);
rr_node *tp__rr_map_get(const rr_map *m, rr_id key);
// Inserts @n (n_key set; not present). Never fails: a table that cannot
// grow gets longer chains.
void tp__rr_map_put(rr_map *m, rr_node *n);
rr_node *tp__rr_map_del(rr_map *m, rr_id key);
// Iteration: tp__rr_map_first, then tp__rr_map_next until NULL. The current
// node may be deleted before tp__rr_map_next is called with its successor
// saved.
rr_node *tp__rr_map_first(const rr_map *m);
rr_node *tp__rr_map_next(const rr_map *m, const rr_node *n);

// ---- objects ------------------------------------------------------------

typedef struct rr_ctx rr_ctx;
typedef struct rr_doomed rr_doomed;

// A registered remote type (object.c).
typedef struct rr_type rr_type;

// An object: the value of an RRef made by tp_remote_create.
typedef struct rr_obj {
    const rr_type *o_type;
    void *o_state;
    tp_mtx o_mtx; // serialize: one method at a time
} rr_obj;

struct tp_rref {
    rr_node r_node;      // owner: in x_owned by id; user: in x_users by fork
    _Atomic long r_refs; // memory: handles + internal holds + tables
    rr_ctx *r_ctx;       // referenced
    rr_id r_id;
    rr_id r_fork; // user: its fork; owner: {0, 0}
    int r_owner;
    int r_creator;
    bool r_is_owner;
    bool r_is_object;
    char r_what[48]; // the function or type that made it (reports)
    // (x) both
    long r_users;    // handles (program and args)
    bool r_in_table; // in x_owned / x_users (holds a memory ref)
    // (x) user side
    bool r_released;      // no handle is left (or shutdown let it go)
    bool r_confirmed;     // the owner knows this fork
    bool r_deleted;       // DELETE queued (or not needed: owner gone)
    long r_nchildren;     // forks passed on, not yet accepted
    tp_error *r_err;      // creation failed / owner died (set once)
    tp_future *r_confirm; // users: resolves at confirmation (wait_created)
    // (x) owner side
    long r_nforks; // users known here
    long r_holds;  // operations in progress (a creation, a fetch)
    bool r_created;
    bool r_creating;            // a REMOTE for it arrived
    tp_future *r_value;         // resolves with tp_args * or rr_obj * or error
    struct rr_doomed *r_doomed; // for deleting it without allocating
};

// A user of an owner RRef, known by its fork id (x_forks).
typedef struct rr_fork {
    rr_node f_node;
    tp_rref *f_rref; // the owner RRef (memory ref)
    int f_holder;    // the rank holding the fork
} rr_fork;

// A fork passed on by this worker, not yet accepted (x_children).
typedef struct rr_child {
    rr_node c_node;
    tp_rref *c_parent; // memory ref, and r_nchildren counts it
    int c_to;          // the worker it went to
} rr_child;

// A protocol message to send from the pool.
typedef struct rr_note {
    struct rr_note *n_next;
    tp_task n_task;
    rr_ctx *n_ctx; // referenced
    uint8_t n_kind;
    int n_to;
    rr_msg n_msg;
    tp_rref *n_rref; // FORK: the user RRef to confirm (memory ref)
    int n_parent;    // FORK: who to tell once confirmed
} rr_note;

struct rr_ctx {
    _Atomic long x_refs; // the agent's attachment + every RRef
    tp_agent *x_agent;   // referenced
    int x_rank;
    int x_world;
    _Atomic uint64_t x_next; // ids and forks made here: (x_rank, n)
    tp_mtx x_mtx;
    bool x_attached;     // (x) false after detach: no more messages
    rr_map x_owned;      // (x) owner RRefs by id
    rr_map x_users;      // (x) user RRefs by fork, until deleted
    rr_map x_forks;      // (x) rr_fork by fork id
    rr_map x_children;   // (x) rr_child by fork id
    bool *x_dead;        // (x) by rank: peers that failed
    atomic_int x_ndead;  // ranks marked in x_dead (read without x_mtx)
    rr_note *x_outbox;   // (x) to send after unlocking
    rr_doomed *x_doomed; // (x) values of deleted RRefs, to free
    uint64_t x_nqueued;  // (x) notes queued, not yet sent
    uint64_t x_nunconfirmed;
    uint64_t x_created, x_deleted;
};

// ---- ctx.c --------------------------------------------------------------

extern const tp__args_obj_ops tp__rr_obj_ops; // RRefs in args
extern const tp__proto_ops tp__rref_proto;

rr_ctx *tp__rr_ctx_get(const tp_agent *a); // NULL: detached
rr_ctx *tp__rr_ctx_ref(rr_ctx *x);
void tp__rr_ctx_unref(rr_ctx *x);
// Frees @x's tables and memory (its agent reference is the caller's).
void tp__rr_ctx_free(rr_ctx *x);
rr_id tp__rr_next_id(rr_ctx *x);

// Memory references (not handles).
tp_rref *tp__rr_hold(tp_rref *r);
void tp__rr_release(tp_rref *r);

// A new owner RRef (id made here unless @id is given), not yet created:
// one handle for the caller, in x_owned. NULL without memory.
tp_rref *tp__rr_owner_new_locked(rr_ctx *x, rr_id id, int creator,
                                 const char *what);
// The owner RRef @id, or a new placeholder (the creation has not arrived
// yet). NULL without memory.
tp_rref *tp__rr_owner_get_locked(rr_ctx *x, rr_id id, int creator);
// A new user RRef in x_users with one handle; NULL without memory.
tp_rref *tp__rr_user_new_locked(rr_ctx *x, rr_id id, rr_id fork, int owner,
                                bool confirmed, bool object);
// The owner's value is known: @value (taken: tp_args * or rr_obj *, with
// @free_fn) or @err. Resolves r_value; drops the creation's hold.
void tp__rr_owner_set_value(tp_rref *r, void *value, tp_future_free_fn free_fn,
                            const tp_error *err);
// Owner: an operation in progress ended (a hold taken under the lock).
void tp__rr_owner_unhold(tp_rref *r);
// Owner: deletes the RRef if nothing keeps it.
void tp__rr_owner_maybe_delete_locked(rr_ctx *x, tp_rref *r);
// User: the owner confirmed it (@err NULL) or it failed (@err).
void tp__rr_user_confirm(tp_rref *r, const tp_error *err);
// User: queues DELETE once released, confirmed and without children.
void tp__rr_user_maybe_delete_locked(rr_ctx *x, tp_rref *r);
// Adds a fork of owner RRef @r held by @holder.
tp_status tp__rr_fork_add_locked(rr_ctx *x, tp_rref *r, rr_id fork, int holder);
// Removes fork @fork; false if unknown (or held by another rank).
bool tp__rr_fork_del_locked(rr_ctx *x, rr_id fork, int holder);
// Records that @parent passed fork @fork to @to.
tp_status tp__rr_child_add_locked(rr_ctx *x, tp_rref *parent, rr_id fork,
                                  int to);
// The child @fork was accepted (by @from, or anyone if @from < 0).
bool tp__rr_child_done_locked(rr_ctx *x, rr_id fork, int from);
// Queues a protocol message to send (tp__rr_flush sends it).
tp_status tp__rr_note_queue_locked(rr_ctx *x, uint8_t kind, int to,
                                   const rr_msg *m, tp_rref *rref, int parent);
// Sends what was queued. No lock held.
void tp__rr_flush(rr_ctx *x);
// "RRef (w:n) owned by NAME (rank r)" for messages.
void tp__rr_describe(const tp_rref *r, char *buf, size_t len);
// The owner's value future (referenced), NULL on a user.
tp_future *tp__rr_owner_value(tp_rref *r);

// ---- kinds.c --------------------------------------------------------------

#define RR_NKINDS 6
extern const tp__proto_kind tp__rr_kinds[RR_NKINDS];
// CALL on an owner RRef of this worker (@in taken; NULL: no args): a
// future with the result, resolved on the pool.
tp_future *tp__rr_local_call(rr_ctx *x, tp_rref *r, uint32_t flags,
                             const char *name, tp_args *in);
// REMOTE on this worker: runs @name (function, constructor or proxy of
// @target) on the pool into owner RRef @r (@in taken).
tp_future *tp__rr_local_remote(rr_ctx *x, tp_rref *r, uint32_t flags,
                               tp_rref *target, const char *name, tp_args *in);

// ---- object.c -------------------------------------------------------------

const rr_type *tp__rr_type_find(const char *name, size_t len);
const char *tp__rr_type_name(const rr_type *t);
// Constructs an object of @t; the value for tp__rr_owner_set_value.
tp_status tp__rr_obj_create(const rr_type *t, const tp_rpc_call_info *call,
                            const tp_args *in, rr_obj **obj_p,
                            tp_error **err_p);
void tp__rr_obj_free(void *obj); // a tp_future_free_fn
// Runs method @name of @o.
tp_status tp__rr_obj_call(rr_obj *o, const char *name, size_t len,
                          const tp_rpc_call_info *call, const tp_args *in,
                          tp_args **out_p, tp_error **err_p);
tp_status tp__rr_obj_to_args(rr_obj *o, tp_args **out_p, tp_error **err_p);

#endif
