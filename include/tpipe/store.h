/* SPDX-License-Identifier: Apache-2.0 */
/* store.h - the rendezvous key-value store and init methods.
 *
 * A store maps keys (NUL-terminated strings of 1..4096 bytes) to values
 * (byte strings of up to TP_STORE_MAX_VALUE bytes, 64 MiB by default).
 * Backends, chosen by the init method given to tp_store_open:
 *   env://              MASTER_ADDR, MASTER_PORT, and RANK, WORLD_SIZE (or
 *                       SLURM_PROCID/SLURM_NTASKS, or OMPI_COMM_WORLD_RANK/
 *                       OMPI_COMM_WORLD_SIZE when those are absent); then as
 *                       tcp://MASTER_ADDR:MASTER_PORT.
 *   tcp://HOST:PORT     rank 0 runs the server (a thread of its process,
 *                       bound to HOST:PORT; PORT must not be 0 since the
 *                       others could not learn it), every rank connects,
 *                       retrying until the deadline. Append "?server=0"
 *                       when a standalone server (`tpipe store`) runs
 *                       there: then no rank hosts it.
 *   file:///PATH        one shared file, serialised with fcntl OFD locks.
 *   mem://NAME          in-process only (tests): stores of the same NAME in
 *                       one process share their keys.
 *
 * Timeouts (every int64_t timeout_ms below):
 *   TP_TIMEOUT_DEFAULT (-1)  the store's default: the timeout_ms given to
 *                            tp_store_open, itself defaulting to
 *                            TP_STORE_TIMEOUT_MS (300000 ms, 5 min);
 *   0                        no limit (an explicit choice, never a default);
 *   > 0                      that many milliseconds.
 * A timeout fails with TP_ETIMEDOUT and a message naming the store address,
 * the operation, the keys, the rank and the time waited, e.g.
 *   store tcp://10.0.0.5:29500: get "X" (rank 3): timed out after 30000 ms:
 *   key not set
 * (every timeout message holds "timed out", for grep).
 *
 * Values returned by the store (tp_store_get, tp_store_compare_set) are
 * the caller's; free them with tp_free() (free() works too while the
 * program and the library share a C runtime). They carry one
 * extra NUL byte after the value (not counted in the length) so text values
 * can be used as C strings.
 *
 * Errors: TP_EINVAL (bad arguments, a NULL store or output pointer, key
 * or value too long, add on a value that is not a decimal integer),
 * TP_ETIMEDOUT, TP_ENOMEM (also: the server's TP_STORE_MAX_BYTES reached), and
 * for tcp the connection-scope errors (TP_ECONNREFUSED, TP_ECONNRESET,
 * TP_EPROTO: not a tpipe store): a store whose connection failed fails every
 * later call. TP_EPERM when the job secret (TP_JOB_TOKEN) is missing on one
 * side or differs.
 *
 * Thread safety: a tp_store may be used from several threads; its calls are
 * serialised (a blocking get holds up the other threads' calls on the same
 * store until it completes: open one store per waiting thread).
 */
#ifndef TPIPE_STORE_H
#define TPIPE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/export.h>

#ifdef __cplusplus
extern "C" {
#endif

/** TP_STORE_MAX_KEY - the longest key, in bytes (without the NUL). */
#define TP_STORE_MAX_KEY 4096

typedef struct tp_store tp_store;
typedef struct tp_store_server tp_store_server;

/**
 * tp_store_open - open the store named by @init_method as @rank of
 * @world_size processes.
 *
 * @rank and @world_size: -1 takes them from the environment (RANK/
 *   WORLD_SIZE, Slurm's or OpenMPI's variables; an error when none is set),
 *   with every init method; they are used for messages, to decide which
 *   rank hosts the tcp server (rank 0) and by the rendezvous of RPC and
 *   process groups. World size 0, or a rank outside 0..world size - 1, is
 *   refused with TP_EINVAL on every backend. A malformed init method is
 *   reported before the ranks are looked at.
 * @timeout_ms: the default of every later call and the deadline of
 *   connecting (TP_TIMEOUT_DEFAULT: TP_STORE_TIMEOUT_MS).
 * Ownership: on success *@store_p is the caller's; free with
 *   tp_store_close.
 * Errors: TP_EINVAL (malformed init method or variables), TP_ETIMEDOUT
 *   (server not reachable before the deadline); on rank 0 of tcp:// and
 *   env://, bind errors name the address and the errno ("address already
 *   in use (EADDRINUSE)").
 * Thread safety: any thread. Blocks until connected.
 */
TP_API tp_status tp_store_open(const char *init_method, int rank,
                               int world_size, int64_t timeout_ms,
                               tp_store **store_p, tp_error **err_p);

/**
 * tp_store_close - close the connection (and, on the rank hosting it, stop
 * the tcp server) and free @store. NULL is fine. No call may be running on
 * @store. Blocks until the server threads have exited.
 */
TP_API void tp_store_close(tp_store *store);

/** tp_store_addr - the store's address ("tcp://127.0.0.1:29500"); borrowed
 * for the store's lifetime. */
TP_API const char *tp_store_addr(const tp_store *store);

/**
 * tp_store_set - set @key to @len bytes at @val (copied), replacing any
 * value, and wake the waiters of @key.
 */
TP_API tp_status tp_store_set(tp_store *store, const char *key, const void *val,
                              size_t len, int64_t timeout_ms, tp_error **err_p);

/**
 * tp_store_get - wait until @key is set, then return a copy of its value:
 * *@val_p (tp_free() it; NUL-terminated beyond *@len_p) and *@len_p.
 * Errors: TP_ETIMEDOUT if @key is still not set at the deadline.
 */
TP_API tp_status tp_store_get(tp_store *store, const char *key,
                              int64_t timeout_ms, void **val_p, size_t *len_p,
                              tp_error **err_p);

/**
 * tp_store_add - atomically add @delta to the integer at @key (missing
 * counts as 0; stored as decimal text, as PyTorch does) and return the new
 * value in *@value_p. Errors: TP_EINVAL if the value is not an integer.
 */
TP_API tp_status tp_store_add(tp_store *store, const char *key, int64_t delta,
                              int64_t timeout_ms, int64_t *value_p,
                              tp_error **err_p);

/**
 * tp_store_wait - wait until each of the @n keys is set.
 * Errors: TP_ETIMEDOUT naming the keys still missing.
 */
TP_API tp_status tp_store_wait(tp_store *store, const char *const *keys,
                               size_t n, int64_t timeout_ms, tp_error **err_p);

/**
 * tp_store_compare_set - PyTorch's compare_set: if @key holds @expected, or
 * is missing and @expected is empty (@elen 0), set it to @desired. Returns
 * the value @key holds afterwards in *@val_p and *@len_p (tp_free() it); when
 * @key is missing and @expected is not empty, nothing is set and @expected is
 * returned.
 */
TP_API tp_status tp_store_compare_set(tp_store *store, const char *key,
                                      const void *expected, size_t elen,
                                      const void *desired, size_t dlen,
                                      int64_t timeout_ms, void **val_p,
                                      size_t *len_p, tp_error **err_p);

/**
 * tp_store_delete_key - remove @key; *@deleted_p (may be NULL) says
 * whether it existed.
 */
TP_API tp_status tp_store_delete_key(tp_store *store, const char *key,
                                     int64_t timeout_ms, bool *deleted_p,
                                     tp_error **err_p);

/** tp_store_num_keys - the number of keys set. */
TP_API tp_status tp_store_num_keys(tp_store *store, int64_t timeout_ms,
                                   int64_t *n_p, tp_error **err_p);

/**
 * tp_store_append - append @len bytes at @val to the value of @key (a
 * missing key counts as empty), atomically, and wake its waiters
 * (PyTorch's append). Errors: TP_EINVAL also when the result would be
 * longer than TP_STORE_MAX_VALUE.
 */
TP_API tp_status tp_store_append(tp_store *store, const char *key,
                                 const void *val, size_t len,
                                 int64_t timeout_ms, tp_error **err_p);

/**
 * tp_store_check - PyTorch's check: *@all_set_p says whether every one of
 * the @n keys (at most 4096) is set now. Never waits for the keys;
 * @timeout_ms bounds only reaching the store.
 */
TP_API tp_status tp_store_check(tp_store *store, const char *const *keys,
                                size_t n, int64_t timeout_ms, bool *all_set_p,
                                tp_error **err_p);

/**
 * tp_store_multi_set - set each of the @n keys (at most 4096) to its
 * value (@vals[i], @lens[i] bytes, copied), in order, within one deadline.
 * Not atomic for other clients (as PyTorch's default): a failure may leave
 * the first keys set.
 */
TP_API tp_status tp_store_multi_set(tp_store *store, const char *const *keys,
                                    const void *const *vals, const size_t *lens,
                                    size_t n, int64_t timeout_ms,
                                    tp_error **err_p);

/**
 * tp_store_multi_get - wait until each of the @n keys (at most 4096) is set
 * and return copies: @vals[i] (tp_free() each; NUL-terminated beyond the
 * length) and @lens[i] (@lens may be NULL), within one deadline. On error
 * nothing is returned.
 */
TP_API tp_status tp_store_multi_get(tp_store *store, const char *const *keys,
                                    size_t n, int64_t timeout_ms, void **vals,
                                    size_t *lens, tp_error **err_p);

/**
 * tp_store_prefix_open - a view of @base whose keys are "@prefix/key"
 * (PyTorch's PrefixStore): every call is @base's on the prefixed keys;
 * num_keys counts all of @base's keys, as PyTorch does. Views nest.
 * Ownership: borrows @base, which must outlive the view; free the view
 *   with tp_store_close (@base stays open).
 * Errors: TP_EINVAL (NULL arguments, an empty prefix, or a key longer
 *   than TP_STORE_MAX_KEY once prefixed, at the call).
 * Thread safety: as any store; the view's calls and @base's are
 *   serialised together.
 */
TP_API tp_status tp_store_prefix_open(tp_store *base, const char *prefix,
                                      tp_store **store_p, tp_error **err_p);

/**
 * tp_store_server_options - the bounds of a tcp store server. Zero a
 * struct, set size to sizeof(tp_store_server_options), then set the fields
 * to change; a field left 0 takes its environment variable, else its
 * default. In the environment, 0 turns a deadline off.
 */
typedef struct tp_store_server_options {
    size_t size;
    /** Connections served at once; more are refused (logged, and the
     * client fails naming TP_STORE_MAX_CONNS). TP_STORE_MAX_CONNS, 1024. */
    int64_t max_conns;
    /** A connection that sends nothing for this long is closed (a client
     * parked in a get or wait is not idle; a tpipe client reconnects on
     * its next call). TP_STORE_IDLE_TIMEOUT_MS, 300000 (5 min). */
    int64_t idle_timeout_ms;
    /** A request (and the hello) must arrive whole within this of its
     * first byte, else the connection is closed with an error reply.
     * TP_STORE_REQUEST_TIMEOUT_MS, 10000. */
    int64_t request_timeout_ms;
    /** Key and value bytes stored in all; a set over it fails with
     * TP_ENOMEM naming TP_STORE_MAX_BYTES. TP_STORE_MAX_BYTES, 1 GiB. */
    int64_t max_bytes;
    /** The longest value. TP_STORE_MAX_VALUE, 64 MiB. */
    int64_t max_value;
} tp_store_server_options;

/**
 * tp_store_server_start - run a tcp store server on @addr ("tcp://H:P";
 * P may be 0 for any free port; an empty host, "tcp://:P", listens on every
 * IPv4 interface). Serves every client from one event-loop thread of its
 * own until stopped.
 * Errors: TP_EINVAL (address), bind/listen errors naming the address
 *   (EADDRINUSE maps to its errno status with "address in use").
 * Ownership: *@srv_p is the caller's; free with tp_store_server_stop.
 */
TP_API tp_status tp_store_server_start(const char *addr,
                                       tp_store_server **srv_p,
                                       tp_error **err_p);

/**
 * tp_store_server_start_opts - tp_store_server_start with the bounds in
 * @opts (may be NULL: the environment and defaults).
 * Errors: as tp_store_server_start; TP_EINVAL for a malformed option or
 *   environment variable (named in the message).
 */
TP_API tp_status tp_store_server_start_opts(const char *addr,
                                            const tp_store_server_options *opts,
                                            tp_store_server **srv_p,
                                            tp_error **err_p);

/** tp_store_server_addr - the bound address, "tcp://127.0.0.1:41234"
 * (with the real port); borrowed for the server's lifetime. */
TP_API const char *tp_store_server_addr(const tp_store_server *srv);

/**
 * tp_store_server_stop - close every client connection (dropping its
 * parked get or wait), stop the server's loop thread and free @srv. NULL
 * is fine.
 */
TP_API void tp_store_server_stop(tp_store_server *srv);

#ifdef __cplusplus
}
#endif
#endif
