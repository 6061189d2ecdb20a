/* SPDX-License-Identifier: Apache-2.0 */
/* nccl_impl.h (internal) - what collectives/nccl_comm.c (loading NCCL,
 * the symbol table, communicators) and collectives/nccl_ops.c (the
 * operations, with deadline and abort) share: the NCCL and CUDA headers,
 * the resolved entry points, the communicator struct and the result and
 * polling helpers. Only those two files include it. */
#ifndef TP_COLLECTIVES_NCCL_IMPL_H
#define TP_COLLECTIVES_NCCL_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "collectives/nccl.h"
#include "core/error.h"
#include "core/platform.h"
#include "tp_config.h"

#if TP_HAVE_NCCL
// NCCL's and CUDA's headers are not -Wundef/-Wstrict-prototypes clean in C.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cuda_runtime_api.h>
#include <nccl.h>
#pragma GCC diagnostic pop

// bf16 and avg came with NCCL 2.10 (version code 21000); non-blocking
// communicators (ncclConfig_t, ncclInProgress, ncclCommFinalize) with 2.14.
#ifdef NCCL_VERSION_CODE
#if NCCL_VERSION_CODE >= 21000
#define NCCL_HAS_BF16_AVG 1
#endif
#if NCCL_VERSION_CODE >= 21400
#define NCCL_HAS_CONFIG 1
#endif
#endif
#ifndef NCCL_HAS_BF16_AVG
#define NCCL_HAS_BF16_AVG 0
#endif
#ifndef NCCL_HAS_CONFIG
#define NCCL_HAS_CONFIG 0
#endif

#define NCCL_V2_10   21000
#define NCCL_POLL_NS 100000L // ~100 us between polls of a pending op

typedef ncclResult_t (*nccl_get_version_fn)(int *);
typedef ncclResult_t (*nccl_get_unique_id_fn)(ncclUniqueId *);
typedef ncclResult_t (*nccl_comm_init_rank_fn)(ncclComm_t *, int, ncclUniqueId,
                                               int);
#if NCCL_HAS_CONFIG
typedef ncclResult_t (*nccl_comm_init_rank_config_fn)(ncclComm_t *, int,
                                                      ncclUniqueId, int,
                                                      ncclConfig_t *);
#endif
typedef ncclResult_t (*nccl_comm_fn)(ncclComm_t);
typedef ncclResult_t (*nccl_get_async_error_fn)(ncclComm_t, ncclResult_t *);
typedef const char *(*nccl_error_string_fn)(ncclResult_t);
typedef ncclResult_t (*nccl_all_reduce_fn)(const void *, void *, size_t,
                                           ncclDataType_t, ncclRedOp_t,
                                           ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_broadcast_fn)(const void *, void *, size_t,
                                          ncclDataType_t, int, ncclComm_t,
                                          cudaStream_t);
typedef ncclResult_t (*nccl_reduce_fn)(const void *, void *, size_t,
                                       ncclDataType_t, ncclRedOp_t, int,
                                       ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_all_gather_fn)(const void *, void *, size_t,
                                           ncclDataType_t, ncclComm_t,
                                           cudaStream_t);

// The entry points resolved from libnccl.so.2 (nccl_comm.c), valid once
// tp__nccl_loadable has returned true.
typedef struct tp__nccl_syms {
    void *lib;
    int version;
    nccl_get_version_fn get_version;
    nccl_get_unique_id_fn get_unique_id;
    nccl_comm_init_rank_fn comm_init_rank;
#if NCCL_HAS_CONFIG
    nccl_comm_init_rank_config_fn comm_init_rank_config; // may be NULL
    nccl_comm_fn comm_finalize;                          // may be NULL
#endif
    nccl_comm_fn comm_destroy;
    nccl_comm_fn comm_abort;
    nccl_get_async_error_fn get_async_error;
    nccl_error_string_fn error_string;
    nccl_all_reduce_fn all_reduce;
    nccl_broadcast_fn broadcast;
    nccl_reduce_fn reduce;
    nccl_all_gather_fn all_gather;
    nccl_all_reduce_fn reduce_scatter; // same signature as all_reduce
    bool ok;
    char why[256];
} tp__nccl_syms;

extern tp__nccl_syms tp__nccl_lib;

struct tp__nccl_comm {
    ncclComm_t nc_comm; // NULL once aborted
    cudaStream_t nc_stream;
    int nc_rank;
    int nc_world;
    int nc_device;
    int64_t nc_timeout_ms;
    bool nc_nonblocking; // made with ncclCommInitRankConfig, blocking = 0
    tp_error *nc_dead;   // why the communicator was aborted, or NULL
};

static inline tp_status
nccl_status(ncclResult_t r)
{
    switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
        return TP_EINVAL;
    case ncclUnhandledCudaError:
        return TP_EDEVICE;
    case ncclSystemError:
        return TP_ECONNRESET;
#ifdef NCCL_VERSION_CODE
#if NCCL_VERSION_CODE >= 21200
    case ncclRemoteError:
        return TP_EREMOTE;
#endif
#endif
    default:
        return TP_EINTERNAL;
    }
}

static inline bool
nccl_in_progress(ncclResult_t r)
{
#if NCCL_HAS_CONFIG
    return r == ncclInProgress;
#else
    (void)r;
    return false;
#endif
}

static inline void
nccl_sleep_poll(void)
{
    struct timespec ts = {0, NCCL_POLL_NS};
    nanosleep(&ts, NULL);
}

// The deadline for an operation given @timeout_ms (TP_TIMEOUT_DEFAULT:
// the communicator's default).
static inline uint64_t
nccl_deadline(const tp__nccl_comm *c, int64_t timeout_ms)
{
    if (timeout_ms == TP_TIMEOUT_DEFAULT) {
        timeout_ms = c->nc_timeout_ms;
    }
    return tp__deadline_after_ms(timeout_ms);
}

// Fails with @st and the formatted message, aborting the communicator.
tp_status tp__nccl_fail_abort(tp__nccl_comm *c, tp_error **err_p, tp_status st,
                              const char *fmt, ...) TP_PRINTF(4, 5);

#else // !TP_HAVE_NCCL

#define NCCL_OFF "built without NCCL (TP_WITH_NCCL)"

struct tp__nccl_comm {
    int nc_unused;
};

static inline tp_status
nccl_off(tp_error **err_p, const char *what)
{
    return tp__error_set(err_p, TP_ENOTSUP, "nccl: %s: " NCCL_OFF, what);
}

#endif

#endif
