// SPDX-License-Identifier: Apache-2.0
// nccl.c - NCCL, loaded with dlopen (see nccl.h).
//
// nccl.h is included when the build found NCCL so the compiler checks the
// types and enum values; the entry points are resolved with dlsym at first
// use. The CUDA runtime entry points the communicator needs (device
// selection and its stream) are resolved here too: core/cuda.h exposes
// only what tensors need.

#include "collectives/nccl.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/cuda.h"
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

_Static_assert(NCCL_UNIQUE_ID_BYTES == TP_NCCL_ID_BYTES, "ncclUniqueId size");
_Static_assert(sizeof(ncclUniqueId) == TP_NCCL_ID_BYTES, "ncclUniqueId size");

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
typedef ncclResult_t (*nccl_send_fn)(const void *, size_t, ncclDataType_t, int,
                                     ncclComm_t, cudaStream_t);
typedef ncclResult_t (*nccl_recv_fn)(void *, size_t, ncclDataType_t, int,
                                     ncclComm_t, cudaStream_t);

static struct {
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
    nccl_send_fn send;
    nccl_recv_fn recv;
    bool ok;
    char why[256];
} nccl;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

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

static void *
nccl_sym(void *lib, const char *libname, const char *name, bool required)
{
    void *p = dlsym(lib, name);
    if (p == NULL && required && nccl.why[0] == '\0') {
        snprintf(nccl.why, sizeof(nccl.why), "%s has no %s", libname, name);
    }
    return p;
}

static void
nccl_version_str(int code, char *buf, size_t len)
{
    if (code < NCCL_V2_10) {
        snprintf(buf, len, "%d.%d.%d", code / 1000, code % 1000 / 100,
                 code % 100);
    } else {
        snprintf(buf, len, "%d.%d.%d", code / 10000, code % 10000 / 100,
                 code % 100);
    }
}

// The CUDA runtime calls (device, streams) go through core/cuda.c.
static void
nccl_load(void)
{
    nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (nccl.lib == NULL) {
        snprintf(nccl.why, sizeof(nccl.why), "%s", dlerror());
        return;
    }
    // dlsym returns an object pointer; ISO C has no conversion to a
    // function pointer, so copy the representation (POSIX guarantees it).
#define NCCL_SYM(h, field, name, req)                                          \
    do {                                                                       \
        void *p_ = nccl_sym(h, "libnccl.so.2", name, req);                     \
        memcpy(&nccl.field, &p_, sizeof(p_));                                  \
    } while (0)
    NCCL_SYM(nccl.lib, get_version, "ncclGetVersion", true);
    NCCL_SYM(nccl.lib, get_unique_id, "ncclGetUniqueId", true);
    NCCL_SYM(nccl.lib, comm_init_rank, "ncclCommInitRank", true);
#if NCCL_HAS_CONFIG
    NCCL_SYM(nccl.lib, comm_init_rank_config, "ncclCommInitRankConfig", false);
    NCCL_SYM(nccl.lib, comm_finalize, "ncclCommFinalize", false);
#endif
    NCCL_SYM(nccl.lib, comm_destroy, "ncclCommDestroy", true);
    NCCL_SYM(nccl.lib, comm_abort, "ncclCommAbort", true);
    NCCL_SYM(nccl.lib, get_async_error, "ncclCommGetAsyncError", true);
    NCCL_SYM(nccl.lib, error_string, "ncclGetErrorString", true);
    NCCL_SYM(nccl.lib, all_reduce, "ncclAllReduce", true);
    NCCL_SYM(nccl.lib, broadcast, "ncclBroadcast", true);
    NCCL_SYM(nccl.lib, reduce, "ncclReduce", true);
    NCCL_SYM(nccl.lib, all_gather, "ncclAllGather", true);
    NCCL_SYM(nccl.lib, reduce_scatter, "ncclReduceScatter", true);
    NCCL_SYM(nccl.lib, send, "ncclSend", true);
    NCCL_SYM(nccl.lib, recv, "ncclRecv", true);
#undef NCCL_SYM
    if (nccl.why[0] != '\0') {
        return;
    }
    ncclResult_t r = nccl.get_version(&nccl.version);
    if (r != ncclSuccess) {
        snprintf(nccl.why, sizeof(nccl.why), "libnccl.so.2: ncclGetVersion: %s",
                 nccl.error_string(r));
        return;
    }
    nccl.ok = true;
}

bool
tp__nccl_loadable(char *why, size_t why_len)
{
    pthread_once(&nccl_once, nccl_load);
    if (!nccl.ok && why != NULL) {
        snprintf(why, why_len, "%s", nccl.why);
    }
    return nccl.ok;
}

bool
tp__nccl_available(char *why, size_t why_len)
{
    if (!tp__nccl_loadable(why, why_len)) {
        return false;
    }
    // tp__cuda_available says "no CUDA device: ..." when none is present.
    return tp__cuda_available(why, why_len);
}

int
tp__nccl_version(void)
{
    return tp__nccl_loadable(NULL, 0) ? nccl.version : 0;
}

tp_status
tp__nccl_dtype(tp_dtype dt, int *nccl_dt_p, tp_error **err_p)
{
    int v;
    switch (dt) {
    case TP_F32:
        v = ncclFloat32;
        break;
    case TP_F64:
        v = ncclFloat64;
        break;
    case TP_F16:
        v = ncclFloat16;
        break;
    case TP_BF16:
#if NCCL_HAS_BF16_AVG
        v = ncclBfloat16;
        break;
#else
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: dtype bf16 needs NCCL >= 2.10 (built "
                             "against an older nccl.h)");
#endif
    case TP_I8:
        v = ncclInt8;
        break;
    case TP_U8:
        v = ncclUint8;
        break;
    case TP_I32:
        v = ncclInt32;
        break;
    case TP_I64:
        v = ncclInt64;
        break;
    case TP_BOOL:
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: dtype bool is not supported by NCCL");
    default:
        return tp__error_set(err_p, TP_EINVAL, "nccl: invalid dtype %d",
                             (int)dt);
    }
    *nccl_dt_p = v;
    return TP_OK;
}

tp_status
tp__nccl_op(tp_reduce_op op, int *nccl_op_p, tp_error **err_p)
{
    int v;
    switch (op) {
    case TP_REDUCE_SUM:
        v = ncclSum;
        break;
    case TP_REDUCE_PRODUCT:
        v = ncclProd;
        break;
    case TP_REDUCE_MIN:
        v = ncclMin;
        break;
    case TP_REDUCE_MAX:
        v = ncclMax;
        break;
    case TP_REDUCE_AVG:
#if NCCL_HAS_BF16_AVG
        v = ncclAvg;
        break;
#else
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: op avg needs NCCL >= 2.10 (built against "
                             "an older nccl.h)");
#endif
    case TP_REDUCE_BAND:
    case TP_REDUCE_BOR:
    case TP_REDUCE_BXOR:
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: op %s is not supported by NCCL (it has "
                             "sum, product, min, max and avg)",
                             tp__reduce_op_name(op));
    default:
        return tp__error_set(err_p, TP_EINVAL, "nccl: invalid op %d", (int)op);
    }
    *nccl_op_p = v;
    return TP_OK;
}

static tp_status
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

static bool
nccl_in_progress(ncclResult_t r)
{
#if NCCL_HAS_CONFIG
    return r == ncclInProgress;
#else
    (void)r;
    return false;
#endif
}

static void
nccl_sleep_poll(void)
{
    struct timespec ts = {0, NCCL_POLL_NS};
    nanosleep(&ts, NULL);
}

// The store timeout for what is left until @deadline_ns (0: no limit).
static int64_t
nccl_remaining_ms(uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        return 0;
    }
    uint64_t now = tp__now_ns();
    if (now >= deadline_ns) {
        return 1;
    }
    return (int64_t)((deadline_ns - now + 999999u) / 1000000u);
}

tp_status
tp__nccl_id_exchange(tp_store *store, const char *key_prefix, int rank,
                     int world, int64_t timeout_ms,
                     unsigned char id[TP_NCCL_ID_BYTES], tp_error **err_p)
{
    char why[256];
    if (store == NULL || key_prefix == NULL || world < 1 || rank < 0 ||
        rank >= world) {
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: unique id exchange: bad arguments (rank "
                             "%d of %d)",
                             rank, world);
    }
    if (!tp__nccl_loadable(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: unique id exchange (rank %d): %s", rank,
                             why);
    }
    char *key = tp__asprintf("%snccl_id", key_prefix);
    if (key == NULL) {
        if (err_p != NULL) {
            *err_p = tp__error_nomem();
        }
        return TP_ENOMEM;
    }
    tp_status st = TP_OK;
    if (rank == 0) {
        ncclUniqueId uid;
        ncclResult_t r = nccl.get_unique_id(&uid);
        if (r != ncclSuccess) {
            st = tp__error_set(err_p, nccl_status(r),
                               "nccl: ncclGetUniqueId (rank 0 of %d): %s",
                               world, nccl.error_string(r));
            goto free_key;
        }
        st = tp_store_set(store, key, &uid, sizeof(uid), timeout_ms, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "nccl: publishing the unique id (rank 0 of %d)",
                           world);
            goto free_key;
        }
        memcpy(id, &uid, TP_NCCL_ID_BYTES);
    } else {
        void *val = NULL;
        size_t len = 0;
        st = tp_store_get(store, key, timeout_ms, &val, &len, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "nccl: waiting for rank 0's unique id (rank %d of "
                           "%d)",
                           rank, world);
            goto free_key;
        }
        if (len != TP_NCCL_ID_BYTES) {
            st = tp__error_set(err_p, TP_EPROTO,
                               "nccl: unique id (rank %d of %d): store key "
                               "\"%s\" holds %zu bytes, expected %d",
                               rank, world, key, len, TP_NCCL_ID_BYTES);
            free(val);
            goto free_key;
        }
        memcpy(id, val, TP_NCCL_ID_BYTES);
        free(val);
    }
free_key:
    tp__free(key);
    return st;
}

// Marks @c dead (keeping @cause as the reason) and aborts the NCCL
// communicator, which frees it.
static void
nccl_comm_kill(tp__nccl_comm *c, const tp_error *cause)
{
    if (c->nc_dead == NULL && cause != NULL) {
        c->nc_dead = tp_error_ref((tp_error *)cause);
    }
    if (c->nc_comm != NULL) {
        nccl.comm_abort(c->nc_comm);
        c->nc_comm = NULL;
    }
}

// Fails with @st and the formatted message, aborting the communicator.
static tp_status nccl_fail_abort(tp__nccl_comm *c, tp_error **err_p,
                                 tp_status st, const char *fmt, ...)
    TP_PRINTF(4, 5);

static tp_status
nccl_fail_abort(tp__nccl_comm *c, tp_error **err_p, tp_status st,
                const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    tp_error *err = tp__error_new(st, 0, NULL, "%s; communicator aborted", msg);
    nccl_comm_kill(c, err);
    if (err_p != NULL) {
        *err_p = err;
    } else {
        tp_error_unref(err);
    }
    return st;
}

// Waits until the async state of @c is no longer ncclInProgress (after a
// non-blocking init or finalize). Aborts on error or at the deadline.
static tp_status
nccl_wait_ready(tp__nccl_comm *c, const char *what, uint64_t start_ns,
                uint64_t deadline_ns, tp_error **err_p)
{
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t r = nccl.get_async_error(c->nc_comm, &ar);
        if (r != ncclSuccess) {
            ar = r;
        }
        if (ar == ncclSuccess) {
            return TP_OK;
        }
        if (!nccl_in_progress(ar)) {
            return nccl_fail_abort(c, err_p, nccl_status(ar),
                                   "nccl: %s (rank %d of %d, device %d): %s",
                                   what, c->nc_rank, c->nc_world, c->nc_device,
                                   nccl.error_string(ar));
        }
        if (tp__now_ns() >= deadline_ns) {
            return nccl_fail_abort(
                c, err_p, TP_ETIMEDOUT,
                "nccl: %s (rank %d of %d, device %d): not complete after "
                "%" PRIu64 " ms (are all %d ranks there?)",
                what, c->nc_rank, c->nc_world, c->nc_device,
                (tp__now_ns() - start_ns) / 1000000u, c->nc_world);
        }
        nccl_sleep_poll();
    }
}

static uint64_t
nccl_deadline(const tp__nccl_comm *c, int64_t timeout_ms)
{
    if (timeout_ms == TP_TIMEOUT_DEFAULT) {
        timeout_ms = c->nc_timeout_ms;
    }
    return tp__deadline_after_ms(timeout_ms);
}

tp_status
tp__nccl_comm_create(tp_store *store, const char *key_prefix, int rank,
                     int world, int device, int64_t timeout_ms,
                     tp__nccl_comm **comm_p, tp_error **err_p)
{
    char why[256];
    if (store == NULL || key_prefix == NULL || world < 1 || rank < 0 ||
        rank >= world || device < 0 || timeout_ms < TP_TIMEOUT_DEFAULT) {
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: comm create: bad arguments (rank %d of "
                             "%d, device %d, timeout %" PRId64 " ms)",
                             rank, world, device, timeout_ms);
    }
    if (!tp__nccl_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: comm create (rank %d of %d, device %d): "
                             "%s",
                             rank, world, device, why);
    }
    if (device >= tp__cuda_device_count()) {
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: comm create (rank %d of %d): device %d "
                             "does not exist (%d devices)",
                             rank, world, device, tp__cuda_device_count());
    }
    if (timeout_ms == TP_TIMEOUT_DEFAULT) {
        timeout_ms = TP_NCCL_TIMEOUT_MS;
    }
    uint64_t start_ns = tp__now_ns();
    uint64_t deadline_ns = tp__deadline_after_ms(timeout_ms);

    unsigned char id[TP_NCCL_ID_BYTES];
    tp_status st =
        tp__nccl_id_exchange(store, key_prefix, rank, world,
                             nccl_remaining_ms(deadline_ns), id, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "nccl: comm create (device %d)", device);
        return st;
    }

    tp__nccl_comm *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        if (err_p != NULL) {
            *err_p = tp__error_nomem();
        }
        return TP_ENOMEM;
    }
    c->nc_rank = rank;
    c->nc_world = world;
    c->nc_device = device;
    c->nc_timeout_ms = timeout_ms;

    void *stream = NULL;
    st = tp__cuda_stream_create(device, &stream, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st,
                       "nccl: comm create (rank %d of %d, device %d)", rank,
                       world, device);
        goto free_comm;
    }
    c->nc_stream = (cudaStream_t)stream;

    ncclUniqueId uid;
    memcpy(&uid, id, sizeof(uid));
    ncclResult_t r;
    bool nonblocking = false;
#if NCCL_HAS_CONFIG
    if (nccl.comm_init_rank_config != NULL) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        nonblocking = true;
        c->nc_nonblocking = true;
        r = nccl.comm_init_rank_config(&c->nc_comm, world, uid, rank, &cfg);
    } else
#endif
    {
        r = nccl.comm_init_rank(&c->nc_comm, world, uid, rank);
    }
    if (r != ncclSuccess && !(nonblocking && nccl_in_progress(r))) {
        st = tp__error_set(err_p, nccl_status(r),
                           "nccl: ncclCommInitRank (rank %d of %d, device "
                           "%d): %s",
                           rank, world, device, nccl.error_string(r));
        if (c->nc_comm != NULL) {
            nccl.comm_abort(c->nc_comm);
            c->nc_comm = NULL;
        }
        goto destroy_stream;
    }
    if (nonblocking) {
        st = nccl_wait_ready(c, "ncclCommInitRank", start_ns, deadline_ns,
                             err_p);
        if (st != TP_OK) {
            goto destroy_stream; // aborted by nccl_wait_ready
        }
    }
    *comm_p = c;
    return TP_OK;

destroy_stream:
    tp__cuda_stream_destroy(c->nc_stream);
free_comm:
    tp_error_unref(c->nc_dead);
    tp__free(c);
    return st;
}

void
tp__nccl_comm_destroy(tp__nccl_comm *c)
{
    if (c == NULL) {
        return;
    }
    (void)tp__cuda_set_device(c->nc_device, NULL);
    if (c->nc_comm != NULL) {
        bool clean = true;
#if NCCL_HAS_CONFIG
        if (nccl.comm_finalize != NULL) {
            ncclResult_t r = nccl.comm_finalize(c->nc_comm);
            if (r == ncclSuccess || nccl_in_progress(r)) {
                uint64_t now = tp__now_ns();
                clean = nccl_wait_ready(c, "ncclCommFinalize", now,
                                        nccl_deadline(c, TP_TIMEOUT_DEFAULT),
                                        NULL) == TP_OK;
            } else {
                clean = false;
            }
        }
#endif
        if (clean) {
            nccl.comm_destroy(c->nc_comm);
            c->nc_comm = NULL;
        } else {
            nccl_comm_kill(c, NULL);
        }
    }
    tp__cuda_stream_destroy(c->nc_stream);
    tp_error_unref(c->nc_dead);
    tp__free(c);
}

int
tp__nccl_comm_rank(const tp__nccl_comm *c)
{
    return c->nc_rank;
}

int
tp__nccl_comm_world(const tp__nccl_comm *c)
{
    return c->nc_world;
}

int
tp__nccl_comm_device(const tp__nccl_comm *c)
{
    return c->nc_device;
}

// Checks what every operation needs before enqueueing: a live
// communicator, its device current, a mapped dtype (and op, if @op_p) and
// a root/peer in range (@peer; INT_MIN for none).
static tp_status
nccl_begin(tp__nccl_comm *c, const char *what, tp_dtype dt, int *dt_p,
           const tp_reduce_op *op, int *op_p, int peer, tp_error **err_p)
{
    if (c->nc_comm == NULL) {
        tp_error *err = tp__error_new(TP_ECLOSED, 0, c->nc_dead,
                                      "nccl: %s (rank %d of %d): the "
                                      "communicator was aborted",
                                      what, c->nc_rank, c->nc_world);
        if (err_p != NULL) {
            *err_p = err;
        } else {
            tp_error_unref(err);
        }
        return TP_ECLOSED;
    }
    tp_status st = tp__nccl_dtype(dt, dt_p, err_p);
    if (st == TP_OK && op != NULL) {
        st = tp__nccl_op(*op, op_p, err_p);
        if (st == TP_OK) {
            st = tp__reduce_check(*op, dt, err_p);
        }
    }
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "nccl: %s (rank %d)", what,
                              c->nc_rank);
    }
    if (nccl.version < NCCL_V2_10 &&
        (dt == TP_BF16 || (op != NULL && *op == TP_REDUCE_AVG))) {
        char v[32];
        nccl_version_str(nccl.version, v, sizeof(v));
        return tp__error_set(err_p, TP_ENOTSUP,
                             "nccl: %s (rank %d): %s needs NCCL >= 2.10, the "
                             "loaded libnccl.so.2 is %s",
                             what, c->nc_rank, dt == TP_BF16 ? "bf16" : "avg",
                             v);
    }
    if (peer != INT_MIN && (peer < 0 || peer >= c->nc_world)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: %s (rank %d of %d): peer/root %d out of "
                             "range",
                             what, c->nc_rank, c->nc_world, peer);
    }
    st = tp__cuda_set_device(c->nc_device, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "nccl: %s (rank %d)", what,
                              c->nc_rank);
    }
    return TP_OK;
}

// After enqueueing (@r is what the NCCL call returned): polls the stream
// and the communicator's async error until done or the deadline.
static tp_status
nccl_finish(tp__nccl_comm *c, const char *what, ncclResult_t r,
            int64_t timeout_ms, tp_error **err_p)
{
    uint64_t start_ns = tp__now_ns();
    if (r != ncclSuccess && !nccl_in_progress(r)) {
        if (!c->nc_nonblocking &&
            (r == ncclInvalidArgument || r == ncclInvalidUsage)) {
            // Rejected before anything was enqueued: a blocking
            // communicator is still usable (a non-blocking one keeps the
            // error as its async state, so it is aborted below).
            return tp__error_set(err_p, nccl_status(r),
                                 "nccl: %s (rank %d of %d, device %d): %s",
                                 what, c->nc_rank, c->nc_world, c->nc_device,
                                 nccl.error_string(r));
        }
        return nccl_fail_abort(
            c, err_p, nccl_status(r), "nccl: %s (rank %d of %d, device %d): %s",
            what, c->nc_rank, c->nc_world, c->nc_device, nccl.error_string(r));
    }
    uint64_t deadline_ns = nccl_deadline(c, timeout_ms);
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t qr = nccl.get_async_error(c->nc_comm, &ar);
        if (qr != ncclSuccess) {
            ar = qr;
        }
        if (ar != ncclSuccess && !nccl_in_progress(ar)) {
            return nccl_fail_abort(c, err_p, nccl_status(ar),
                                   "nccl: %s (rank %d of %d, device %d): "
                                   "asynchronous error: %s",
                                   what, c->nc_rank, c->nc_world, c->nc_device,
                                   nccl.error_string(ar));
        }
        if (ar == ncclSuccess) {
            bool done = false;
            tp_error *qe = NULL;
            if (tp__cuda_stream_query(c->nc_stream, &done, &qe) != TP_OK) {
                tp_status fst = nccl_fail_abort(
                    c, err_p, TP_EDEVICE,
                    "nccl: %s (rank %d of %d, device %d): %s", what, c->nc_rank,
                    c->nc_world, c->nc_device, tp_error_message(qe));
                tp_error_unref(qe);
                return fst;
            }
            if (done) {
                return TP_OK;
            }
        }
        uint64_t now = tp__now_ns();
        if (now >= deadline_ns) {
            return nccl_fail_abort(c, err_p, TP_ETIMEDOUT,
                                   "nccl: %s (rank %d of %d, device %d): not "
                                   "complete after %" PRIu64 " ms",
                                   what, c->nc_rank, c->nc_world, c->nc_device,
                                   (now - start_ns) / 1000000u);
        }
        nccl_sleep_poll();
    }
}

tp_status
tp__nccl_all_reduce(tp__nccl_comm *c, const void *send, void *recv,
                    size_t count, tp_dtype dt, tp_reduce_op op,
                    int64_t timeout_ms, tp_error **err_p)
{
    int ndt = 0, nop = 0;
    tp_status st =
        nccl_begin(c, "all_reduce", dt, &ndt, &op, &nop, INT_MIN, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r =
        nccl.all_reduce(send, recv, count, (ncclDataType_t)ndt,
                        (ncclRedOp_t)nop, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "all_reduce", r, timeout_ms, err_p);
}

tp_status
tp__nccl_broadcast(tp__nccl_comm *c, const void *send, void *recv, size_t count,
                   tp_dtype dt, int root, int64_t timeout_ms, tp_error **err_p)
{
    int ndt = 0;
    tp_status st =
        nccl_begin(c, "broadcast", dt, &ndt, NULL, NULL, root, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r = nccl.broadcast(send, recv, count, (ncclDataType_t)ndt,
                                    root, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "broadcast", r, timeout_ms, err_p);
}

tp_status
tp__nccl_reduce(tp__nccl_comm *c, const void *send, void *recv, size_t count,
                tp_dtype dt, tp_reduce_op op, int root, int64_t timeout_ms,
                tp_error **err_p)
{
    int ndt = 0, nop = 0;
    tp_status st = nccl_begin(c, "reduce", dt, &ndt, &op, &nop, root, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r =
        nccl.reduce(send, recv, count, (ncclDataType_t)ndt, (ncclRedOp_t)nop,
                    root, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "reduce", r, timeout_ms, err_p);
}

tp_status
tp__nccl_all_gather(tp__nccl_comm *c, const void *send, void *recv,
                    size_t send_count, tp_dtype dt, int64_t timeout_ms,
                    tp_error **err_p)
{
    int ndt = 0;
    tp_status st =
        nccl_begin(c, "all_gather", dt, &ndt, NULL, NULL, INT_MIN, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r = nccl.all_gather(
        send, recv, send_count, (ncclDataType_t)ndt, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "all_gather", r, timeout_ms, err_p);
}

tp_status
tp__nccl_reduce_scatter(tp__nccl_comm *c, const void *send, void *recv,
                        size_t recv_count, tp_dtype dt, tp_reduce_op op,
                        int64_t timeout_ms, tp_error **err_p)
{
    int ndt = 0, nop = 0;
    tp_status st =
        nccl_begin(c, "reduce_scatter", dt, &ndt, &op, &nop, INT_MIN, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r =
        nccl.reduce_scatter(send, recv, recv_count, (ncclDataType_t)ndt,
                            (ncclRedOp_t)nop, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "reduce_scatter", r, timeout_ms, err_p);
}

tp_status
tp__nccl_send(tp__nccl_comm *c, const void *buf, size_t count, tp_dtype dt,
              int peer, int64_t timeout_ms, tp_error **err_p)
{
    int ndt = 0;
    if (c->nc_comm != NULL && peer == c->nc_rank) {
        // Each call is its own NCCL group: a send to itself would wait for
        // a matching call that cannot be posted, until the deadline.
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: send (rank %d of %d): peer is this rank",
                             c->nc_rank, c->nc_world);
    }
    tp_status st = nccl_begin(c, "send", dt, &ndt, NULL, NULL, peer, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r = nccl.send(buf, count, (ncclDataType_t)ndt, peer,
                               c->nc_comm, c->nc_stream);
    return nccl_finish(c, "send", r, timeout_ms, err_p);
}

tp_status
tp__nccl_recv(tp__nccl_comm *c, void *buf, size_t count, tp_dtype dt, int peer,
              int64_t timeout_ms, tp_error **err_p)
{
    int ndt = 0;
    if (c->nc_comm != NULL && peer == c->nc_rank) {
        // Each call is its own NCCL group: a recv to itself would wait for
        // a matching call that cannot be posted, until the deadline.
        return tp__error_set(err_p, TP_EINVAL,
                             "nccl: recv (rank %d of %d): peer is this rank",
                             c->nc_rank, c->nc_world);
    }
    tp_status st = nccl_begin(c, "recv", dt, &ndt, NULL, NULL, peer, err_p);
    if (st != TP_OK) {
        return st;
    }
    ncclResult_t r = nccl.recv(buf, count, (ncclDataType_t)ndt, peer,
                               c->nc_comm, c->nc_stream);
    return nccl_finish(c, "recv", r, timeout_ms, err_p);
}

#else // !TP_HAVE_NCCL

#define NCCL_OFF "built without NCCL (TP_WITH_NCCL)"

struct tp__nccl_comm {
    int nc_unused;
};

static tp_status
nccl_off(tp_error **err_p, const char *what)
{
    return tp__error_set(err_p, TP_ENOTSUP, "nccl: %s: " NCCL_OFF, what);
}

bool
tp__nccl_available(char *why, size_t why_len)
{
    if (why != NULL) {
        snprintf(why, why_len, NCCL_OFF);
    }
    return false;
}

bool
tp__nccl_loadable(char *why, size_t why_len)
{
    return tp__nccl_available(why, why_len);
}

int
tp__nccl_version(void)
{
    return 0;
}

tp_status
tp__nccl_dtype(tp_dtype dt, int *nccl_dt_p, tp_error **err_p)
{
    return nccl_off(err_p, "dtype");
}

tp_status
tp__nccl_op(tp_reduce_op op, int *nccl_op_p, tp_error **err_p)
{
    return nccl_off(err_p, "op");
}

tp_status
tp__nccl_id_exchange(tp_store *store, const char *key_prefix, int rank,
                     int world, int64_t timeout_ms,
                     unsigned char id[TP_NCCL_ID_BYTES], tp_error **err_p)
{
    return nccl_off(err_p, "unique id exchange");
}

tp_status
tp__nccl_comm_create(tp_store *store, const char *key_prefix, int rank,
                     int world, int device, int64_t timeout_ms,
                     tp__nccl_comm **comm_p, tp_error **err_p)
{
    return nccl_off(err_p, "comm create");
}

void
tp__nccl_comm_destroy(tp__nccl_comm *comm)
{
}

int
tp__nccl_comm_rank(const tp__nccl_comm *comm)
{
    return -1;
}

int
tp__nccl_comm_world(const tp__nccl_comm *comm)
{
    return 0;
}

int
tp__nccl_comm_device(const tp__nccl_comm *comm)
{
    return -1;
}

tp_status
tp__nccl_all_reduce(tp__nccl_comm *comm, const void *send, void *recv,
                    size_t count, tp_dtype dt, tp_reduce_op op,
                    int64_t timeout_ms, tp_error **err_p)
{
    return nccl_off(err_p, "all_reduce");
}

tp_status
tp__nccl_broadcast(tp__nccl_comm *comm, const void *send, void *recv,
                   size_t count, tp_dtype dt, int root, int64_t timeout_ms,
                   tp_error **err_p)
{
    return nccl_off(err_p, "broadcast");
}

tp_status
tp__nccl_reduce(tp__nccl_comm *comm, const void *send, void *recv, size_t count,
                tp_dtype dt, tp_reduce_op op, int root, int64_t timeout_ms,
                tp_error **err_p)
{
    return nccl_off(err_p, "reduce");
}

tp_status
tp__nccl_all_gather(tp__nccl_comm *comm, const void *send, void *recv,
                    size_t send_count, tp_dtype dt, int64_t timeout_ms,
                    tp_error **err_p)
{
    return nccl_off(err_p, "all_gather");
}

tp_status
tp__nccl_reduce_scatter(tp__nccl_comm *comm, const void *send, void *recv,
                        size_t recv_count, tp_dtype dt, tp_reduce_op op,
                        int64_t timeout_ms, tp_error **err_p)
{
    return nccl_off(err_p, "reduce_scatter");
}

tp_status
tp__nccl_send(tp__nccl_comm *comm, const void *buf, size_t count, tp_dtype dt,
              int peer, int64_t timeout_ms, tp_error **err_p)
{
    return nccl_off(err_p, "send");
}

tp_status
tp__nccl_recv(tp__nccl_comm *comm, void *buf, size_t count, tp_dtype dt,
              int peer, int64_t timeout_ms, tp_error **err_p)
{
    return nccl_off(err_p, "recv");
}

#endif
