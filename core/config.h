/* SPDX-License-Identifier: Apache-2.0 */
/* config.h (internal) - the tunables of every component, parsed into
 * tp_config.
 *
 * Each component declares its tunables once, in its own table
 * (core/tunables.h): name, default, doc, environment variable TP_<NAME>,
 * bounds, and where the value goes: a field below, or the component's own
 * struct inside cfg_own (tp__config_own). Values are read when an object
 * that takes a config is created (tp__config_load); fields a caller sets
 * afterwards win over the environment. */
#ifndef TP_CORE_CONFIG_H
#define TP_CORE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <tpipe/config.h>

#include "tunables.h"

typedef enum tp_io_backend {
    TP_IO_BACKEND_AUTO = 0,
    TP_IO_BACKEND_EPOLL = 1,
    TP_IO_BACKEND_URING = 2,
} tp_io_backend;

// Bytes of tp_config holding the components' own structs (TP_TUNABLES_OWN
// tables), each at a max_align_t boundary; config_test checks they fit.
#define TP_CONFIG_OWN_BYTES 512

// The fields of the tables that store in tp_config (TP_TUNABLES_IN_CONFIG):
// read by several layers, or set from context options. A component's
// other tunables live in its own struct, in cfg_own.
typedef struct tp_config {
    int64_t log_level;              // TP_LOG_LEVEL (0..5)
    int64_t io_backend;             // TP_IO_BACKEND (tp_io_backend)
    char socket_ifname[64];         // TP_SOCKET_IFNAME ("" = choose)
    char socket_addr[128];          // TP_SOCKET_ADDR ("" = from interface)
    int64_t connect_timeout_ms;     // TP_CONNECT_TIMEOUT_MS
    int64_t handshake_timeout_ms;   // TP_HANDSHAKE_TIMEOUT_MS
    int64_t shm_ring_size;          // TP_SHM_RING_SIZE bytes, power of two
    int64_t shm_spin_us;            // TP_SHM_SPIN_US before sleeping
    int64_t loop_spin_us;           // TP_LOOP_SPIN_US (all fds) before sleeping
    int64_t pool_threads;           // TP_POOL_THREADS
    int64_t mpt_lanes;              // TP_MPT_LANES
    int64_t mpt_split_min;          // TP_MPT_SPLIT_MIN bytes
    int64_t mpt_inline_max;         // TP_MPT_INLINE_MAX bytes
    int64_t pipe_max_metadata;      // TP_PIPE_MAX_METADATA bytes
    int64_t pipe_max_payloads;      // TP_PIPE_MAX_PAYLOADS
    int64_t pipe_max_tensors;       // TP_PIPE_MAX_TENSORS
    int64_t pipe_max_buf_bytes;     // TP_PIPE_MAX_BUF_BYTES
    int64_t pipe_cuda_loop_max;     // TP_PIPE_CUDA_LOOP_MAX bytes
    int64_t pipe_cuda_pinned_cache; // TP_PIPE_CUDA_PINNED_CACHE bytes
    int64_t store_timeout_ms;       // TP_STORE_TIMEOUT_MS
    int64_t store_max_value;        // TP_STORE_MAX_VALUE bytes
    int64_t num_worker_threads;     // TP_NUM_WORKER_THREADS (agent handlers)
    int64_t rpc_timeout_ms;         // TP_RPC_TIMEOUT_MS, 0 = none
    int64_t rpc_init_timeout_ms;    // TP_RPC_INIT_TIMEOUT_MS
    int64_t rpc_shutdown_timeout_ms; // TP_RPC_SHUTDOWN_TIMEOUT_MS
    int64_t coll_engine;             // TP_COLL_ENGINE (tp_coll_engine)
    int64_t coll_allreduce;          // TP_COLL_ALLREDUCE (tp_coll_algo)
    int64_t coll_bcast;              // TP_COLL_BCAST (tp_coll_algo)
    int64_t coll_small_max;          // TP_COLL_SMALL_MAX bytes
    int64_t coll_chunk;              // TP_COLL_CHUNK bytes
    int64_t coll_shm_slot;           // TP_COLL_SHM_SLOT bytes
    int64_t coll_timeout_ms;         // TP_COLL_TIMEOUT_MS, 0 = none
    int64_t coll_init_timeout_ms;    // TP_COLL_INIT_TIMEOUT_MS
    int64_t debug_collectives;       // TP_DEBUG_COLLECTIVES (0|1)
    // The TP_TUNABLES_OWN tables' structs (tcp's, cma's, ...), laid out in
    // the order of tp__tunables_at. Copying a tp_config copies them.
    _Alignas(max_align_t) unsigned char cfg_own[TP_CONFIG_OWN_BYTES];
} tp_config;

typedef enum tp_coll_engine {
    TP_COLL_ENGINE_AUTO = 0,
    TP_COLL_ENGINE_SHM = 1,
    TP_COLL_ENGINE_PIPE = 2,
} tp_coll_engine;

// Algorithms of the pipe engine (TP_COLL_ALLREDUCE, TP_COLL_BCAST): auto
// chooses by size; rd/tree for small, ring/chain for large.
typedef enum tp_coll_algo {
    TP_COLL_ALGO_AUTO = 0,
    TP_COLL_ALGO_SMALL = 1, // all_reduce: rd; broadcast: tree
    TP_COLL_ALGO_LARGE = 2, // all_reduce: ring; broadcast: chain
} tp_coll_algo;

// Fills @cfg with defaults, then applies TP_* environment variables.
// A malformed value is TP_EINVAL with a message naming the variable, the
// value and what is accepted; @cfg then holds the defaults for that field.
tp_status tp__config_load(tp_config *cfg, tp_error **err_p);
// Defaults only, no environment.
void tp__config_defaults(tp_config *cfg);
// Sets one tunable by name ("shm_ring_size") or env name ("TP_SHM_RING_SIZE")
// from text, with the same checks as the environment. A row that its
// component reads itself (TP_TUNABLE_EXTERNAL) is TP_EINVAL here.
tp_status tp__config_set(tp_config *cfg, const char *name, const char *value,
                         tp_error **err_p);
// The struct of the TP_TUNABLES_OWN table @ts inside @cfg: a component
// reads its tunables with `const tcp_tunables *tt = tp__config_own_const(
// cfg, &tp__tcp_tunables)`. @ts must be one of tp__tunables_at's.
void *tp__config_own(tp_config *cfg, const tp_tunables *ts);
const void *tp__config_own_const(const tp_config *cfg, const tp_tunables *ts);
const char *tp__io_backend_name(int64_t b);

#endif
