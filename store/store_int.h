/* SPDX-License-Identifier: Apache-2.0 */
/* store_int.h (internal) - the backend contract of the store, the
 * in-memory key-value engine shared by the mem backend and the tcp server,
 * and the tcp wire format (docs/store.md). */
#ifndef TP_STORE_INT_H
#define TP_STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/store.h>

#include "core/error.h"
#include "core/platform.h"
#include "transport/sockaddr.h"

// ---- the engine: keys and values in memory, with waiters ----

typedef struct tp__kv_entry {
    char *e_key;
    uint8_t *e_val; // e_len bytes + a NUL
    size_t e_len;
} tp__kv_entry;

// Called after every change that sets @key (set, add, compare_set that
// stored), on the thread that made it, with no lock held.
typedef void (*tp__kv_watch_fn)(void *arg, const char *key);

typedef struct tp__kv {
    tp_mtx kv_mtx;
    tp_cv kv_cv; // broadcast on every set and on close
    tp__kv_entry *kv_ents;
    size_t kv_n;
    size_t kv_cap;
    bool kv_closed;
    uint64_t kv_bytes;     // key and value bytes stored
    uint64_t kv_max_bytes; // cap on kv_bytes; 0: none
    tp__kv_watch_fn kv_watch;
    void *kv_watch_arg;
} tp__kv;

void tp__kv_init(tp__kv *kv);
void tp__kv_fini(tp__kv *kv);
// Wakes every waiter; they fail with TP_ECLOSED.
void tp__kv_close(tp__kv *kv);
// Before any other use: cap the key and value bytes stored at @max (0:
// none); a change over it fails with TP_ENOMEM naming TP_STORE_MAX_BYTES.
void tp__kv_set_max_bytes(tp__kv *kv, uint64_t max);
// Before any other use: call @fn after each change (the tcp server wakes
// its parked requests with it).
void tp__kv_set_watch(tp__kv *kv, tp__kv_watch_fn fn, void *arg);

// Every call returns bare messages ("key not set"); the caller adds the
// store address, operation and rank. @deadline_ns: tp__now_ns() value or
// UINT64_MAX. Returned values are malloc'ed, with a NUL after them.
tp_status tp__kv_set(tp__kv *kv, const char *key, const void *val, size_t len,
                     tp_error **err_p);
tp_status tp__kv_get(tp__kv *kv, const char *key, uint64_t deadline_ns,
                     uint8_t **val_p, size_t *len_p, tp_error **err_p);
tp_status tp__kv_add(tp__kv *kv, const char *key, int64_t delta,
                     int64_t *value_p, tp_error **err_p);
tp_status tp__kv_wait(tp__kv *kv, const char *const *keys, size_t n,
                      uint64_t deadline_ns, tp_error **err_p);
tp_status tp__kv_compare_set(tp__kv *kv, const char *key, const void *exp,
                             size_t elen, const void *des, size_t dlen,
                             uint8_t **val_p, size_t *len_p, tp_error **err_p);
tp_status tp__kv_delete(tp__kv *kv, const char *key, bool *deleted_p);
// Removes every key that starts with @prefix; *@n_p: how many.
void tp__kv_delete_prefix(tp__kv *kv, const char *prefix, int64_t *n_p);
// Copies of the keys that start with @prefix (tp__free each and the
// array); TP_ENOMEM.
tp_status tp__kv_prefix_keys(tp__kv *kv, const char *prefix, char ***keys_p,
                             size_t *n_p);
// Appends @len bytes to @key's value (a missing key counts as empty); a
// result longer than @max_value (0: no cap) is TP_EINVAL.
tp_status tp__kv_append(tp__kv *kv, const char *key, const void *val,
                        size_t len, int64_t max_value, tp_error **err_p);
// Whether every one of the @n keys is set now (never waits).
bool tp__kv_check(tp__kv *kv, const char *const *keys, size_t n);
int64_t tp__kv_num_keys(tp__kv *kv);

// ---- backends ----

typedef struct tp__store_ops {
    // Every member blocks until done or @deadline_ns; @timeout_ms is the
    // same deadline as a relative time (0: none), for the wire. Errors are
    // bare ("key not set"); store.c adds the context.
    tp_status (*so_set)(void *impl, const char *key, const void *val,
                        size_t len, int64_t timeout_ms, uint64_t deadline_ns,
                        tp_error **err_p);
    tp_status (*so_get)(void *impl, const char *key, int64_t timeout_ms,
                        uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
                        tp_error **err_p);
    tp_status (*so_add)(void *impl, const char *key, int64_t delta,
                        int64_t timeout_ms, uint64_t deadline_ns,
                        int64_t *value_p, tp_error **err_p);
    tp_status (*so_wait)(void *impl, const char *const *keys, size_t n,
                         int64_t timeout_ms, uint64_t deadline_ns,
                         tp_error **err_p);
    tp_status (*so_compare_set)(void *impl, const char *key, const void *exp,
                                size_t elen, const void *des, size_t dlen,
                                int64_t timeout_ms, uint64_t deadline_ns,
                                uint8_t **val_p, size_t *len_p,
                                tp_error **err_p);
    tp_status (*so_delete)(void *impl, const char *key, int64_t timeout_ms,
                           uint64_t deadline_ns, bool *deleted_p,
                           tp_error **err_p);
    tp_status (*so_num_keys)(void *impl, int64_t timeout_ms,
                             uint64_t deadline_ns, int64_t *n_p,
                             tp_error **err_p);
    // Appends to the value of @key (missing: empty), atomically.
    tp_status (*so_append)(void *impl, const char *key, const void *val,
                           size_t len, int64_t timeout_ms, uint64_t deadline_ns,
                           tp_error **err_p);
    // *@all_p: whether every one of the @n keys is set now (no waiting
    // for them; @deadline_ns bounds the round trip or the lock).
    tp_status (*so_check)(void *impl, const char *const *keys, size_t n,
                          int64_t timeout_ms, uint64_t deadline_ns, bool *all_p,
                          tp_error **err_p);
    // Removes every key that starts with @prefix; *@n_p: how many.
    tp_status (*so_delete_prefix)(void *impl, const char *prefix,
                                  int64_t timeout_ms, uint64_t deadline_ns,
                                  int64_t *n_p, tp_error **err_p);
    // Frees @impl (and stops what it runs). Never NULL.
    void (*so_close)(void *impl);
} tp__store_ops;

// The public handle (store.c; prefix.c makes views of one).
struct tp_store {
    const tp__store_ops *s_ops;
    void *s_impl;
    tp_mtx s_mtx; // serialises calls (the tcp connection is one stream)
    int s_rank;
    int s_world;
    int64_t s_timeout_ms; // the default; 0 = no limit
    int64_t s_max_value;
    char s_addr[TP_SOCKADDR_STRLEN + 4096];
};

// shared.c: the server of @addr that this process hosts, started by the
// first acquire, stopped by the last release (tp_store_server_start's
// errors). Release of a server not acquired here stops it.
tp_status tp__store_server_acquire(const char *addr, tp_store_server **srv_p,
                                   tp_error **err_p);
void tp__store_server_release(tp_store_server *srv);

// Whether the store lives as long as this process: a tcp store whose
// server this process hosts (rank 0 of env:// or tcp://), or a mem store.
// A job's rendezvous records it (store/join.c): such a store answering
// means its host is alive.
bool tp__store_is_host(const tp_store *s);
// Removes every key of @s that starts with @prefix (a rendezvous's keys
// of a generation that is over); *@n_p (may be NULL): how many. Errors as
// tp_store_delete_key's.
tp_status tp__store_delete_prefix(tp_store *s, const char *prefix,
                                  int64_t timeout_ms, int64_t *n_p,
                                  tp_error **err_p);
bool tp__store_tcp_hosts(const void *impl);

// prefix.c: the ops of a view of another store (tp_store_prefix_open).
extern const tp__store_ops tp__store_prefix_ops;

// mem://NAME
tp_status tp__store_mem_open(const char *name, void **impl_p, tp_error **err_p);
extern const tp__store_ops tp__store_mem_ops;

// file:///PATH
tp_status tp__store_file_open(const char *path, int64_t max_value,
                              void **impl_p, tp_error **err_p);
extern const tp__store_ops tp__store_file_ops;

// tcp client: connects to @addr ("tcp://H:P"), retrying until
// @deadline_ns. @srv (may be NULL) is a server this client owns and stops
// on close.
tp_status tp__store_tcp_open(const char *addr, int64_t max_value,
                             uint64_t deadline_ns, tp_store_server *srv,
                             void **impl_p, tp_error **err_p);
extern const tp__store_ops tp__store_tcp_ops;

// Rank, world size and local rank (-1 if unknown) from RANK/WORLD_SIZE/
// LOCAL_RANK, else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, else
// OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK. TP_EINVAL if none or malformed.
tp_status tp__store_env_ranks(int *rank_p, int *world_p, int *local_p,
                              tp_error **err_p);

// url.c. TP_EINVAL naming what is wrong if @url is not a well-formed init
// method (scheme, tcp address and options, absolute file path).
tp_status tp__store_url_check(const char *url, tp_error **err_p);
// tp__store_url_check, then -1 in *@rank_p or *@world_p taken from the
// environment (tp__store_env_ranks) for every init method, then TP_EINVAL
// unless world >= 1 and 0 <= rank < world. Sets both only on success.
tp_status tp__store_resolve_ranks(const char *url, int *rank_p, int *world_p,
                                  tp_error **err_p);

// ---- tcp wire format (little-endian; docs/store.md) ----

// The hello, sent by both sides first: 8-byte magic, u32 version, u32
// flags. A peer whose first bytes differ is not a tpipe store (client) or
// not a tpipe store client (server).
#define TP_STORE_HELLO_MAGIC   "TPSTORE\x01" // 8 bytes
#define TP_STORE_HELLO_LEN     16u
#define TP_STORE_HELLO_VERSION 1u
// Flags. Bit 0 is TP_AUTH_HELLO_FLAG (core/auth.h): this side has a job
// secret and runs the exchange after the hellos.
#define TP_STORE_HELLO_FULL 0x2u // server: at its connection cap; closes

#define TP_STORE_MAGIC    0x31545354u // "TST1" in memory order
#define TP_STORE_HDR_LEN  16          // magic u32, op u8, pad[3], timeout u64
#define TP_STORE_RHDR_LEN 8           // magic u32, status u8, pad[3]
#define TP_STORE_MAX_WAIT 4096        // keys in one wait request
#define TP_STORE_MAX_MSG  1024        // bytes of an error text in a reply

enum {
    TP_STORE_OP_SET = 1,
    TP_STORE_OP_GET = 2,
    TP_STORE_OP_ADD = 3,
    TP_STORE_OP_WAIT = 4,
    TP_STORE_OP_CAS = 5,
    TP_STORE_OP_DELETE = 6,
    TP_STORE_OP_NUM_KEYS = 7,
    TP_STORE_OP_APPEND = 8, // key, value; OK reply: nothing
    TP_STORE_OP_CHECK = 9,  // u32 n (1..4096), n keys; OK reply: u8 all set
    TP_STORE_OP_DELETE_PREFIX = 10, // prefix (as a key); OK reply: u64 removed
};

// Reply statuses.
enum {
    TP_STORE_R_OK = 0,
    TP_STORE_R_TIMEOUT = 1, // + text
    TP_STORE_R_ERROR = 2,   // + i32 tp_status + text
    // Sent instead of a reply when the server closes a connection that
    // was idle (TP_STORE_IDLE_TIMEOUT_MS) before reading any byte of a
    // request: whatever the client sent after it was not run, so the
    // client reconnects and sends it again.
    TP_STORE_R_IDLE = 3,
};

#endif
