/* SPDX-License-Identifier: Apache-2.0 */
/* rref.h - remote references (PyTorch's RRef and remote()) and remote
 * objects (PyTorch's RemoteModule), over the RPC agent (rpc.h).
 *
 * An RRef refers to a value that lives on one worker, its owner. The owner
 * holds the value; other workers hold user RRefs. tp_remote() runs a
 * registered function on a worker and returns at once an RRef to the
 * result, which stays on that worker; tp_rref_to_here() fetches a copy.
 * RRefs travel in RPC arguments and results (tp_args_add_rref): passing a
 * user RRef to a third worker forks it, and the owner keeps the value
 * until no RRef to it is left anywhere (PyTorch's RRef protocol:
 * docs/rref.md). Passing an RRef to its owner gives the owner its own RRef.
 *
 * Handles: a tp_rref * is a local handle, reference counted with
 * tp_rref_ref / tp_rref_unref (args holding an RRef count as a handle).
 * When the last handle on a worker goes, the owner is told; the owner
 * frees the value when no handle, no user and no fork in flight remains.
 *
 * Values: a tp_args (bytes + tensors + RRefs: immutable, as every args),
 * or an object of a registered remote type (tp_remote_type).
 *
 * Timeouts: TP_TIMEOUT_DEFAULT (-1) = the agent's rpc_timeout_ms; 0 = no
 * limit. Every blocking call here has one.
 *
 * Threads: any thread, but not a loop thread. Handles stay valid after
 * tp_rpc_shutdown (calls that need the agent then fail with TP_ECLOSED).
 */
#ifndef TPIPE_RREF_H
#define TPIPE_RREF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/future.h>
#include <tpipe/rpc.h>

#ifdef __cplusplus
extern "C" {
#endif

/** TP_RPC_MAX_RREFS - the most RRefs one tp_args carries. */
#define TP_RPC_MAX_RREFS 4096

typedef struct tp_rref tp_rref;

/* ---- creating ------------------------------------------------------- */

/**
 * tp_remote - run @fn_name on worker @to with @in (may be NULL) and return
 * at once, in *@rref_p, an RRef to its result, owned by @to (PyTorch's
 * rpc.remote). The function runs on @to's pool; its result (or error)
 * becomes the RRef's value. @to may be this worker (an owner RRef).
 * An error of the function, a creation that did not end within
 * @timeout_ms, or the owner's death surface on tp_rref_to_here and
 * tp_rref_wait_created, naming the owner.
 * Errors (here): TP_ENOENT (no such worker), TP_EINVAL (name), TP_ECLOSED,
 * TP_ENOMEM.
 */
TP_API tp_status tp_remote(tp_agent *a, const char *to, const char *fn_name,
                           const tp_args *in, int64_t timeout_ms,
                           tp_rref **rref_p, tp_error **err_p);
/** tp_remote_rank - as tp_remote, to the worker of rank @to. */
TP_API tp_status tp_remote_rank(tp_agent *a, int to, const char *fn_name,
                                const tp_args *in, int64_t timeout_ms,
                                tp_rref **rref_p, tp_error **err_p);
/**
 * tp_rref_create - a local RRef owning @value (PyTorch's RRef(value)):
 * takes a reference to @value. Errors: TP_EINVAL, TP_ECLOSED, TP_ENOMEM.
 */
TP_API tp_status tp_rref_create(tp_agent *a, tp_args *value, tp_rref **rref_p,
                                tp_error **err_p);

/* ---- handles -------------------------------------------------------- */

/** tp_rref_ref - a new handle; returns @r. */
TP_API tp_rref *tp_rref_ref(tp_rref *r);
/**
 * tp_rref_unref - drop a handle (NULL is fine). The last handle of a user
 * RRef tells the owner (in the background); the last reference anywhere
 * frees the value on the owner. Never blocks.
 */
TP_API void tp_rref_unref(tp_rref *r);

/* ---- what it is ------------------------------------------------------ */

/** tp_rref_is_owner - true on the worker that holds the value. */
TP_API bool tp_rref_is_owner(const tp_rref *r);
/** tp_rref_owner - the owner's worker info. */
TP_API tp_status tp_rref_owner(const tp_rref *r, tp_worker_info *wi_p);
/** tp_rref_owner_name - the owner's name (valid as long as @r). */
TP_API const char *tp_rref_owner_name(const tp_rref *r);
/**
 * tp_rref_confirmed_by_owner - true once the owner knows of this handle's
 * fork (always on the owner); false while a creation or fork is in flight.
 */
TP_API bool tp_rref_confirmed_by_owner(const tp_rref *r);
/**
 * tp_rref_error - the error this RRef is known to carry here (creation
 * failed or timed out, the owner died), NULL if none is known. Borrowed,
 * valid as long as @r. Does not ask the owner (tp_rref_wait_created does).
 */
TP_API const tp_error *tp_rref_error(const tp_rref *r);
/**
 * tp_rref_wait_created - wait until the value exists (or failed to): on
 * a user, until the owner confirmed its creation (remote) or this fork.
 * Returns TP_OK, or the creation's error (the function's, naming the
 * owner), TP_ETIMEDOUT (naming the RRef, the owner and the wait).
 */
TP_API tp_status tp_rref_wait_created(tp_rref *r, int64_t timeout_ms,
                                      tp_error **err_p);
/**
 * tp_rref_id - the RRef's global id (the creator's rank and a number) and
 * this handle's fork id ({0, 0} on the owner), for messages and tests.
 */
TP_API void tp_rref_id(const tp_rref *r, uint32_t *creator_p, uint64_t *local_p,
                       uint32_t *fork_creator_p, uint64_t *fork_local_p);

/* ---- the value ------------------------------------------------------- */

/**
 * tp_rref_to_here - a copy of the value, fetched from the owner: *@out_p
 * (caller owns; tensors in it are new tensors; NULL for an empty value).
 * On the owner, a copy of the local value. Waits for the value to be
 * created. Errors: the creation's error (naming the owner and the
 * function), TP_ETIMEDOUT ("to_here of RRef ... owned by W (rank r):
 * timed out after T ms"), the owner's death (connection scope, naming
 * it), TP_ENOTSUP (an object without a to_args copy), TP_ECLOSED.
 */
TP_API tp_status tp_rref_to_here(tp_rref *r, int64_t timeout_ms,
                                 tp_args **out_p, tp_error **err_p);
/**
 * tp_rref_to_here_async - as tp_rref_to_here, as a future resolving with
 * the tp_args * (borrowed from the future; tp_rpc_wait copies it out).
 */
TP_API tp_future *tp_rref_to_here_async(tp_rref *r, int64_t timeout_ms);
/**
 * tp_rref_local_value - the value itself, on the owner only: *@value_p
 * borrowed (valid while @r is held). Waits (@timeout_ms) for a creation
 * in progress. Errors: TP_EINVAL on a user ("... is owned by W (rank r)"),
 * TP_EINVAL for an object (tp_rref_local_object), the creation's error.
 */
TP_API tp_status tp_rref_local_value(tp_rref *r, int64_t timeout_ms,
                                     tp_args **value_p, tp_error **err_p);

/* ---- RRefs in args --------------------------------------------------- */

/**
 * tp_args_add_rref - append @r: the args take a handle of their own, as
 * tp_args_add_tensor takes a reference; the caller keeps its handle (drop
 * it with tp_rref_unref when done). Not once the args were given to a
 * call. Errors: TP_EINVAL (NULL, more than TP_RPC_MAX_RREFS),
 * TP_ENOMEM.
 */
TP_API tp_status tp_args_add_rref(tp_args *args, tp_rref *r);
/** tp_args_nrrefs - the number of RRefs in @args. */
TP_API size_t tp_args_nrrefs(const tp_args *args);
/** tp_args_rref - RRef @i, borrowed (tp_rref_ref to keep it). */
TP_API tp_rref *tp_args_rref(const tp_args *args, size_t i);

/* ---- proxies (rref.rpc_sync(), rref.rpc_async(), rref.remote()) ------ */

/**
 * tp_rref_rpc_async - run the registered function @fn_name on the owner
 * of @r with @in, the owner's RRef being RRef 0 of the args it sees
 * (tp_rref_local_value gives the value) and @in's RRefs after it.
 * Resolves as tp_rpc_async.
 */
TP_API tp_future *tp_rref_rpc_async(tp_rref *r, const char *fn_name,
                                    const tp_args *in, int64_t timeout_ms);
/** tp_rref_rpc_sync - as tp_rref_rpc_async, then wait (tp_rpc_sync). */
TP_API tp_status tp_rref_rpc_sync(tp_rref *r, const char *fn_name,
                                  const tp_args *in, int64_t timeout_ms,
                                  tp_args **out_p, tp_error **err_p);
/**
 * tp_rref_remote - as tp_rref_rpc_async, but the result stays on the
 * owner: a new RRef to it, returned at once (tp_remote).
 */
TP_API tp_status tp_rref_remote(tp_rref *r, const char *fn_name,
                                const tp_args *in, int64_t timeout_ms,
                                tp_rref **out_p, tp_error **err_p);

/* ---- remote objects (RemoteModule) ----------------------------------- */

/** tp_remote_method - a named method of a remote type. */
typedef struct tp_remote_method {
    const char *name; /* 1..255 of [A-Za-z0-9_.:/-] */
    /* Runs on the owner's pool with the object's state: result in *@out_p
     * (NULL: empty; ownership passes) or a failure status (and *@err_p). */
    tp_status (*fn)(const tp_rpc_call_info *call, void *state,
                    const tp_args *in, void *arg, tp_args **out_p,
                    tp_error **err_p);
} tp_remote_method;

/**
 * tp_remote_type - a type of remote objects, registered by name on every
 * worker that may own one. Initialise with size = sizeof(tp_remote_type).
 */
typedef struct tp_remote_type {
    size_t size;
    const char *name; /* 1..255 of [A-Za-z0-9_.:/-] */
    /* Constructor, on the owner's pool: *@state_p = the new object. */
    tp_status (*create)(const tp_rpc_call_info *call, const tp_args *in,
                        void *arg, void **state_p, tp_error **err_p);
    /* Destructor, on the owner's pool (or the thread of tp_rpc_shutdown),
     * once no RRef to the object is left. May be NULL. */
    void (*destroy)(void *state, void *arg);
    const tp_remote_method *methods; /* copied at registration */
    size_t nmethods;
    /* Optional: a copy of the object as args, for tp_rref_to_here. */
    tp_status (*to_args)(void *state, void *arg, tp_args **out_p,
                         tp_error **err_p);
    void *arg;
    /* Methods of one object run one at a time (else concurrently on the
     * owner's pool threads: then they must be thread-safe). */
    bool serialize;
} tp_remote_type;

/**
 * tp_remote_type_register - register @type in this process (copied; the
 * name must not be taken by another type). Errors: TP_EINVAL, TP_ENOMEM.
 */
TP_API tp_status tp_remote_type_register(const tp_remote_type *type,
                                         tp_error **err_p);
/**
 * tp_remote_create - construct an object of type @type on worker @to with
 * @in, and wait (@timeout_ms) until it exists (RemoteModule's
 * constructor). *@obj_p is an RRef whose value is the object; the object
 * is destroyed on @to once no RRef to it is left. Errors: the
 * constructor's, TP_ENOENT ("type T is not registered on W (rank r)"),
 * TP_ETIMEDOUT, as tp_remote otherwise.
 */
TP_API tp_status tp_remote_create(tp_agent *a, const char *to, const char *type,
                                  const tp_args *in, int64_t timeout_ms,
                                  tp_rref **obj_p, tp_error **err_p);
/**
 * tp_remote_call_async - call method @method of the object of @obj on its
 * owner with @in (RemoteModule's forward_async). Resolves as tp_rpc_async;
 * TP_ENOENT names a method the type does not have.
 */
TP_API tp_future *tp_remote_call_async(tp_rref *obj, const char *method,
                                       const tp_args *in, int64_t timeout_ms);
/** tp_remote_call - as tp_remote_call_async, then wait (forward). */
TP_API tp_status tp_remote_call(tp_rref *obj, const char *method,
                                const tp_args *in, int64_t timeout_ms,
                                tp_args **out_p, tp_error **err_p);
/**
 * tp_rref_local_object - the object's state, on the owner only (borrowed,
 * valid while @obj is held). Errors as tp_rref_local_value.
 */
TP_API tp_status tp_rref_local_object(tp_rref *obj, int64_t timeout_ms,
                                      void **state_p, tp_error **err_p);

/* ---- counters -------------------------------------------------------- */

/** tp_rref_stats - the RRef protocol's state on one worker. */
typedef struct tp_rref_stats {
    uint64_t owners;           /* values owned here, alive */
    uint64_t users;            /* user RRefs here not yet deleted */
    uint64_t forks;            /* users of our values known here */
    uint64_t pending_forks;    /* RRefs we passed on, not yet accepted */
    uint64_t pending_users;    /* our user RRefs not yet confirmed */
    uint64_t pending_messages; /* protocol messages queued to send */
    uint64_t created, deleted; /* owner values made and freed so far */
} tp_rref_stats;

/** tp_rref_get_stats - the counters of @a's RRef protocol. */
TP_API tp_status tp_rref_get_stats(const tp_agent *a, tp_rref_stats *st_p);

#ifdef __cplusplus
}
#endif
#endif
