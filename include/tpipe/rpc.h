/* SPDX-License-Identifier: Apache-2.0 */
/* rpc.h - the RPC agent: PyTorch's init_rpc / rpc_sync / rpc_async with the
 * TensorPipe agent's options, over tpipe pipes.
 *
 * A job has world_size workers, each with a unique name and a rank. Every
 * worker calls tp_rpc_init (a collective: it returns when every worker has
 * published its name and addresses through the store named by the init
 * method), then calls functions registered by name on other workers (or on
 * itself), and finally tp_rpc_shutdown.
 *
 * Functions are C callbacks registered by name in the process
 * (tp_rpc_register, usually before tp_rpc_init so that no call can arrive
 * before its function exists). A call carries the XXH3-64 id of the name
 * and the name itself; only registered functions run. Builtins registered
 * by the library: "tp.noop" (returns nothing), "tp.echo" (returns its
 * arguments: the same bytes and tensors), "tp.add" (two tensors of one
 * dtype and shape in, their elementwise sum out).
 *
 * Arguments and results are tp_args: opaque bytes plus a list of tensors.
 * Tensors travel out of band, straight from their storage into the pipe
 * (zero copy; a non-contiguous view is made contiguous first). The bytes
 * and tensors given to a call must not change until its future resolves.
 *
 * Threads: handlers and the callbacks added to RPC futures with
 * tp_future_then run on the agent's worker pool (num_worker_threads), never
 * on a loop thread. A handler may make RPCs itself (nested calls A -> B ->
 * A do not deadlock while the pools have free threads).
 *
 * Timeouts (every int64_t timeout_ms): TP_TIMEOUT_DEFAULT (-1) = the
 * agent's rpc_timeout_ms; 0 = no limit; > 0 = milliseconds. A call that
 * times out fails with TP_ETIMEDOUT and a message naming the function, the
 * worker and the timeout ("... RPC ran for more than set timeout (5000 ms)
 * and will now be marked with an error"); a reply arriving later is
 * dropped.
 *
 * Errors of calls (in the future or *err_p): TP_ETIMEDOUT; TP_ENOENT for
 * an unknown worker or a function the callee has not registered; the
 * status a remote handler failed with (connection- and context-scope
 * statuses of a handler arrive as TP_EIO) with "worker B (rank 1):
 * <handler's message>"; the connection's status when the pipe to the
 * worker failed (the peer died: within about a second, naming it);
 * TP_ECLOSED after shutdown.
 */
#ifndef TPIPE_RPC_H
#define TPIPE_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/export.h>
#include <tpipe/future.h>
#include <tpipe/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/** TP_RPC_MAX_NAME - the longest worker name, in bytes (without the NUL). */
#define TP_RPC_MAX_NAME 127
/** TP_RPC_MAX_FN_NAME - the longest function name, in bytes. */
#define TP_RPC_MAX_FN_NAME 255
/** TP_RPC_MAX_TENSORS - the most tensors one tp_args carries. */
#define TP_RPC_MAX_TENSORS 1024

typedef struct tp_agent tp_agent;
typedef struct tp_args tp_args;

/* ---- arguments and results ---------------------------------------- */

/**
 * tp_args_create - new args holding a copy of @len bytes at @bytes (NULL
 * with @len 0: no bytes) and no tensors; refcount 1.
 * Errors: TP_ENOMEM, TP_EINVAL (@bytes NULL with @len > 0).
 */
TP_API tp_status tp_args_create(const void *bytes, size_t len,
                                tp_args **args_p);
/**
 * tp_args_add_tensor - append @t (a reference is taken). CPU tensors only.
 * Errors: TP_EINVAL (NULL, more than TP_RPC_MAX_TENSORS), TP_ENOTSUP
 * (device), TP_ENOMEM. Not once the args were given to a call.
 */
TP_API tp_status tp_args_add_tensor(tp_args *args, tp_tensor *t);
/** tp_args_ref / tp_args_unref - shared ownership; unref of NULL is fine. */
TP_API tp_args *tp_args_ref(tp_args *args);
TP_API void tp_args_unref(tp_args *args);
/** tp_args_bytes - the bytes (borrowed) and their length in *@len_p. */
TP_API const void *tp_args_bytes(const tp_args *args, size_t *len_p);
/** tp_args_ntensors - the number of tensors. */
TP_API size_t tp_args_ntensors(const tp_args *args);
/** tp_args_tensor - tensor @i, borrowed (tp_tensor_ref to keep it). */
TP_API tp_tensor *tp_args_tensor(const tp_args *args, size_t i);

/* ---- options ---------------------------------------------------------- */

/**
 * tp_agent_options - PyTorch's TensorPipeRpcBackendOptions. Initialise with
 * tp_agent_options_init, then change fields. Every field's default comes
 * from its environment variable when that is set (a field the program sets
 * after tp_agent_options_init wins): docs/rpc.md lists them.
 * @size (set by tp_agent_options_init to sizeof(tp_agent_options)) lets
 * the struct grow: a library newer than the caller gives the fields past
 * @size their defaults; a size it does not know (a caller built against
 * another version, or a struct not initialised) makes tp_rpc_init fail
 * with TP_EINVAL.
 */
typedef struct tp_agent_options {
    size_t size;
    /* TP_NUM_WORKER_THREADS (16): threads running handlers */
    int num_worker_threads;
    /* TP_RPC_TIMEOUT_MS (60000): default deadline of a call; 0 = none */
    int64_t rpc_timeout_ms;
    /* TP_INIT_METHOD ("env://"): "env://", "tcp://HOST:PORT",
     * "file:///PATH" (store.h) */
    const char *init_method;
    /* TP_TRANSPORTS, TP_CHANNELS: comma-separated allow lists (NULL or ""
     * = every one that works here, best first), as _transports/_channels */
    const char *transports;
    const char *channels;
    /* TP_RPC_INIT_TIMEOUT_MS (60000): deadline of tp_rpc_init */
    int64_t init_timeout_ms;
    /* TP_RPC_SHUTDOWN_TIMEOUT_MS (60000): deadline of a graceful shutdown */
    int64_t shutdown_timeout_ms;
    /* TP_RPC_MAX_MESSAGE_BYTES (8G): the largest message (metadata, bytes
     * and tensors) accepted from a peer, checked against what the message
     * announces before anything is allocated; a bigger one closes that
     * pipe with TP_EPROTO. Calls and results above it fail here. */
    uint64_t max_message_bytes;
    /* TP_RPC_MAX_PEER_INFLIGHT_BYTES (16G): bytes of messages received
     * from one peer and not yet handed over (a reply until its future is
     * resolved, a request until its handler's reply is sent); a message
     * that would pass it closes that pipe with TP_EPROTO (never blocks).
     * At least max_message_bytes. */
    uint64_t max_peer_inflight_bytes;
    /* TP_RPC_FAULTY (NULL: none): for tests, PyTorch's faulty agent. A
     * comma-separated list of "fail=KINDS:N" (the first N sends of those
     * kinds fail as a broken connection would) and "delay=KINDS:MS"
     * (their sends wait MS ms); KINDS: kind names or numbers joined by
     * '+' ("call", "reply", "RREF_FETCH", ...: docs/rpc.md). */
    const char *faulty;
    /* TP_RPC_FLIGHT_RECORDER (64): how many of the last messages sent
     * (calls, replies, notifications) the agent keeps for
     * tp_rpc_get_recent_ops and the debug info; 0 = off. At most
     * 1048576. */
    int flight_recorder;
    /* TP_RPC_DEVICE_MAPS (NULL: none): PyTorch's set_device_map for every
     * worker, "WORKER=L:R[,L:R...][;WORKER=...]": a CUDA tensor on this
     * worker's cuda:L sent to WORKER arrives on its cuda:R (set_device_map
     * ("w1", {0: 1, 1: 0}) is "w1=0:1,1:0"). Its results come back
     * through the inverse. Without a map covering its device, a CUDA
     * tensor is refused when sent, naming the worker. tp_rpc_init fails
     * (TP_EINVAL, naming the worker) on a map that is not one-to-one, a
     * local device that does not exist or is not in @devices, a worker
     * not in the job, or a remote device that worker lacks. docs/rpc.md */
    const char *device_maps;
    /* TP_RPC_DEVICES (NULL: those of the maps): the CUDA devices this
     * worker uses, "0,1" (PyTorch's devices) */
    const char *devices;
} tp_agent_options;

/** tp_agent_options_init - defaults, then the environment. */
TP_API void tp_agent_options_init(tp_agent_options *o);

/* ---- workers ---------------------------------------------------------- */

/** tp_worker_info - a worker of the job (PyTorch's WorkerInfo). */
typedef struct tp_worker_info {
    char name[TP_RPC_MAX_NAME + 1];
    int rank;
} tp_worker_info;

/**
 * tp_rpc_init - join the job as worker @name with @rank of @world_size
 * (-1 for both: from the environment, env:// only). Names: letters,
 * digits, '_', '-' and ':', 1..127 bytes. Blocks until every worker has
 * joined or options->init_timeout_ms passed. @o may be NULL (defaults).
 * Errors: TP_EINVAL (name, rank, options; a name used by two ranks fails
 * init on every worker, naming both ranks), TP_ETIMEDOUT (naming the
 * ranks that never joined), store and listen errors.
 */
TP_API tp_status tp_rpc_init(const char *name, int rank, int world_size,
                             const tp_agent_options *o, tp_agent **agent_p,
                             tp_error **err_p);

/**
 * tp_rpc_get_worker_info - the worker named @name (NULL: this one).
 * Errors: TP_ENOENT; TP_EINVAL when @a or @wi_p is NULL.
 */
TP_API tp_status tp_rpc_get_worker_info(const tp_agent *a, const char *name,
                                        tp_worker_info *wi_p);
/** tp_rpc_get_worker_info_by_rank - the worker of @rank. TP_ENOENT;
 * TP_EINVAL when @a or @wi_p is NULL. */
TP_API tp_status tp_rpc_get_worker_info_by_rank(const tp_agent *a, int rank,
                                                tp_worker_info *wi_p);
/** tp_rpc_world_size - the number of workers (TP_EINVAL, negative, when @a
 * is NULL). */
TP_API int tp_rpc_world_size(const tp_agent *a);
/**
 * tp_rpc_get_worker_infos - every worker, ordered by rank, in
 * @infos[0..world_size-1]; @n is the capacity. Returns the world size
 * (more than @n: only the first @n were written); TP_EINVAL (negative)
 * when @a is NULL, or @infos is NULL with @n > 0.
 */
TP_API int tp_rpc_get_worker_infos(const tp_agent *a, tp_worker_info *infos,
                                   int n);

/* ---- functions -------------------------------------------------------- */

/** tp_rpc_call_info - what a handler knows about its call. */
typedef struct tp_rpc_call_info {
    tp_agent *agent;     /* the agent running it (for nested calls) */
    const char *fn_name; /* the function's name */
    const tp_worker_info *caller;
    uint64_t call_id; /* unique per caller */
} tp_rpc_call_info;

/**
 * tp_rpc_fn - a synchronous handler. Returns TP_OK with the result in
 * *@out_p (NULL: an empty result; ownership passes to the agent), or a
 * failure status and, optionally, an error in *@err_p (tp_error_create)
 * whose message reaches the caller. Runs on a pool thread.
 */
typedef tp_status (*tp_rpc_fn)(const tp_rpc_call_info *call, const tp_args *in,
                               void *arg, tp_args **out_p, tp_error **err_p);
/**
 * tp_rpc_async_fn - an asynchronous handler (PyTorch's @async_execution):
 * returns a future (ownership passes to the agent) that resolves later,
 * from any thread, with a tp_args * value (tp_future_set_value(f, args,
 * (tp_future_free_fn)tp_args_unref); NULL: empty) or an error. The pool
 * thread is free meanwhile. NULL return: TP_ENOMEM to the caller.
 */
typedef tp_future *(*tp_rpc_async_fn)(const tp_rpc_call_info *call,
                                      const tp_args *in, void *arg);

/**
 * tp_rpc_register - register @fn as @fn_name (1..255 bytes of letters,
 * digits and "_-.:/") in this process, for every agent. Registering the
 * same name again with the same @fn and @arg is a no-op.
 * Errors: TP_EINVAL (name; taken by another function; XXH3-64 collision
 * with another name), TP_ENOMEM.
 */
TP_API tp_status tp_rpc_register(const char *fn_name, tp_rpc_fn fn, void *arg,
                                 tp_error **err_p);
/** tp_rpc_register_async - as tp_rpc_register for an async handler. */
TP_API tp_status tp_rpc_register_async(const char *fn_name, tp_rpc_async_fn fn,
                                       void *arg, tp_error **err_p);

/* ---- calls ------------------------------------------------------------ */

/**
 * tp_rpc_async - call @fn_name on worker @to (a name) with @in (may be
 * NULL: no arguments; referenced until the call ends). Returns a new future
 * (the caller owns one reference) that resolves with the result, a
 * tp_args * (borrowed from the future: tp_args_ref to keep it), or an
 * error. NULL only when memory for the future itself ran out.
 */
TP_API tp_future *tp_rpc_async(tp_agent *a, const char *to, const char *fn_name,
                               const tp_args *in, int64_t timeout_ms);
/** tp_rpc_async_rank - as tp_rpc_async, to the worker of rank @to. */
TP_API tp_future *tp_rpc_async_rank(tp_agent *a, int to, const char *fn_name,
                                    const tp_args *in, int64_t timeout_ms);
/**
 * tp_rpc_sync - as tp_rpc_async, then wait. On success *@out_p (may be
 * NULL if unwanted) is the result (caller owns: tp_args_unref).
 */
TP_API tp_status tp_rpc_sync(tp_agent *a, const char *to, const char *fn_name,
                             const tp_args *in, int64_t timeout_ms,
                             tp_args **out_p, tp_error **err_p);
/** tp_rpc_sync_rank - as tp_rpc_sync, to the worker of rank @to. */
TP_API tp_status tp_rpc_sync_rank(tp_agent *a, int to, const char *fn_name,
                                  const tp_args *in, int64_t timeout_ms,
                                  tp_args **out_p, tp_error **err_p);
/**
 * tp_rpc_wait - wait for an RPC future (spinning briefly, then sleeping),
 * at most @timeout_ms (0: no limit); as tp_future_wait, and on success
 * *@out_p (may be NULL) is a new reference to the result.
 */
TP_API tp_status tp_rpc_wait(tp_future *f, int64_t timeout_ms, tp_args **out_p,
                             tp_error **err_p);

/* ---- shutdown --------------------------------------------------------- */

/**
 * tp_rpc_shutdown - end the agent and free it (@a is invalid afterwards,
 * whatever the result).
 * graceful: waits until every worker has called tp_rpc_shutdown and no
 *   call is outstanding on any worker (at most shutdown_timeout_ms; then
 *   TP_ETIMEDOUT naming the workers that did not arrive), then closes.
 * not graceful: pending calls fail at once with TP_ECLOSED, running
 *   handlers finish (their results are dropped), and the agent closes.
 * Not from a handler or an RPC future callback.
 */
TP_API tp_status tp_rpc_shutdown(tp_agent *a, bool graceful, tp_error **err_p);

/* ---- counters --------------------------------------------------------- */

/** tp_rpc_peer_stats - counters of this agent's traffic with one worker. */
typedef struct tp_rpc_peer_stats {
    tp_worker_info peer;
    uint64_t calls_sent;     /* calls made to the peer */
    uint64_t calls_received; /* calls the peer made here */
    uint64_t bytes_sent;     /* bytes + tensor bytes of messages sent */
    uint64_t bytes_received;
    uint64_t errors;   /* calls to the peer that failed */
    uint64_t timeouts; /* ... of which timed out */
    uint64_t pending;  /* calls to the peer still outstanding */
    /* round-trip latency of calls to the peer that succeeded, in us */
    double latency_min_us, latency_p50_us, latency_p99_us, latency_max_us;
    double latency_mean_us;
    char transport[16]; /* of the pipe to the peer ("" if none) */
    char channel[16];
} tp_rpc_peer_stats;

/**
 * tp_rpc_get_peer_stats - the counters for the worker of @rank.
 * Errors: TP_ENOENT.
 */
TP_API tp_status tp_rpc_get_peer_stats(const tp_agent *a, int rank,
                                       tp_rpc_peer_stats *st_p);
/**
 * tp_rpc_get_debug_info - a multi-line text (PyTorch's _get_debug_info):
 * the agent's name, rank, options, pending calls, a line per peer with
 * its counters and pipe, and the flight recorder's messages (oldest
 * first). Caller frees with tp_free(). NULL on ENOMEM.
 */
TP_API char *tp_rpc_get_debug_info(const tp_agent *a);

/* ---- flight recorder ---------------------------------------------------- */

/** tp_rpc_op_state - where a recorded message stands. */
typedef enum tp_rpc_op_state {
    TP_RPC_OP_SENT = 0,      /* handed to the pipe, write not completed */
    TP_RPC_OP_WAITING = 1,   /* a call: written, waiting for its reply */
    TP_RPC_OP_DONE = 2,      /* replied to (a call), or written */
    TP_RPC_OP_FAILED = 3,    /* the write or the call failed */
    TP_RPC_OP_TIMED_OUT = 4, /* a call that passed its deadline */
} tp_rpc_op_state;

/** tp_rpc_op_state_name - "sent", "waiting reply", "done", "failed",
 * "timed out" (a static string; "?" for other values). */
TP_API const char *tp_rpc_op_state_name(tp_rpc_op_state s);

/** tp_rpc_op_record - one message this agent sent, as the flight recorder
 * (options.flight_recorder) keeps it. */
typedef struct tp_rpc_op_record {
    uint64_t seq;     /* 1, 2, ...: the order of recording */
    char kind[32];    /* the message kind's name: "REQUEST", "RESPONSE",
                       * "ERROR", "RREF_FETCH", ... (docs/rpc-wire.md) */
    char name[64];    /* the function called or replied to ("" if none;
                       * cut at 63 bytes) */
    uint64_t call_id; /* the call it is or answers (0: a notification) */
    tp_worker_info peer;
    uint64_t bytes; /* bytes + tensor bytes it carries */
    tp_rpc_op_state state;
    int64_t start_us;     /* when it was sent: microseconds since the Unix
                           * epoch (CLOCK_REALTIME) */
    uint64_t duration_us; /* until it ended, or so far when SENT/WAITING */
} tp_rpc_op_record;

/**
 * tp_rpc_get_recent_ops - copies the most recent min(@cap, held) records of
 * the flight recorder, oldest first, into @out and their number into
 * *@n_p (0 when the recorder is off).
 * Errors: TP_EINVAL (@a or @n_p NULL, @out NULL with @cap > 0).
 * Thread safety: any thread; a consistent snapshot.
 */
TP_API tp_status tp_rpc_get_recent_ops(const tp_agent *a, tp_rpc_op_record *out,
                                       size_t cap, size_t *n_p);

/**
 * tp_rpc_all_gather - PyTorch's _all_gather over the workers: each worker
 * gives @len bytes at @in (small: at most TP_STORE_MAX_VALUE; copied) and
 * receives every worker's, by rank: @vals[r] (tp_free() each; NUL-terminated
 * beyond the length) and @lens[r] (@lens may be NULL); @vals and @lens
 * hold tp_rpc_world_size entries. Goes through the job's store.
 * Collective: every worker makes the same all_gather and barrier calls in
 * the same order.
 * @timeout_ms: TP_TIMEOUT_DEFAULT (the agent's rpc_timeout_ms), 0 (none)
 *   or > 0.
 * Errors: TP_EINVAL (NULL @a or @vals), TP_ETIMEDOUT naming the worker
 *   whose value is missing ("timed out"), the store's errors. On error
 *   nothing is returned.
 * Thread safety: any thread, one collective call at a time per worker.
 */
TP_API tp_status tp_rpc_all_gather(tp_agent *a, const void *in, size_t len,
                                   int64_t timeout_ms, void **vals,
                                   size_t *lens, tp_error **err_p);

/**
 * tp_rpc_barrier - wait until every worker has called tp_rpc_barrier (an
 * all_gather of nothing); as tp_rpc_all_gather for timeout, errors and
 * ordering.
 */
TP_API tp_status tp_rpc_barrier(tp_agent *a, int64_t timeout_ms,
                                tp_error **err_p);

#ifdef __cplusplus
}
#endif
#endif
