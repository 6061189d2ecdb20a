// SPDX-License-Identifier: Apache-2.0
// nccl_comm.c - NCCL, loaded with dlopen (see nccl.h): the symbol table,
// the dtype/op mapping, the unique id exchange through the store and
// communicator creation and destruction. The operations are in
// nccl_ops.c.
//
// nccl.h is included when the build found NCCL so the compiler checks the
// types and enum values; the entry points are resolved with dlsym at first
// use. The CUDA runtime entry points the communicator needs (device
// selection and its stream) are resolved here too: core/cuda.h exposes
// only what tensors need.

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/nccl_impl.h"
#include "core/alloc.h"
#include "core/cuda.h"
#include "core/error.h"
#include "core/platform.h"

#if TP_HAVE_NCCL
_Static_assert(NCCL_UNIQUE_ID_BYTES == TP_NCCL_ID_BYTES, "ncclUniqueId size");
_Static_assert(sizeof(ncclUniqueId) == TP_NCCL_ID_BYTES, "ncclUniqueId size");

tp__nccl_syms tp__nccl_lib;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void *
nccl_sym(void *lib, const char *libname, const char *name, bool required)
{
    void *p = dlsym(lib, name);
    if (p == NULL && required && tp__nccl_lib.why[0] == '\0') {
        snprintf(tp__nccl_lib.why, sizeof(tp__nccl_lib.why), "%s has no %s",
                 libname, name);
    }
    return p;
}

// The CUDA runtime calls (device, streams) go through core/cuda.c.
static void
nccl_load(void)
{
    tp__nccl_lib.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (tp__nccl_lib.lib == NULL) {
        snprintf(tp__nccl_lib.why, sizeof(tp__nccl_lib.why), "%s", dlerror());
        return;
    }
    // dlsym returns an object pointer; ISO C has no conversion to a
    // function pointer, so copy the representation (POSIX guarantees it).
#define NCCL_SYM(h, field, name, req)                                          \
    do {                                                                       \
        void *p_ = nccl_sym(h, "libnccl.so.2", name, req);                     \
        memcpy(&tp__nccl_lib.field, &p_, sizeof(p_));                          \
    } while (0)
    NCCL_SYM(tp__nccl_lib.lib, get_version, "ncclGetVersion", true);
    NCCL_SYM(tp__nccl_lib.lib, get_unique_id, "ncclGetUniqueId", true);
    NCCL_SYM(tp__nccl_lib.lib, comm_init_rank, "ncclCommInitRank", true);
#if NCCL_HAS_CONFIG
    NCCL_SYM(tp__nccl_lib.lib, comm_init_rank_config, "ncclCommInitRankConfig",
             false);
    NCCL_SYM(tp__nccl_lib.lib, comm_finalize, "ncclCommFinalize", false);
#endif
    NCCL_SYM(tp__nccl_lib.lib, comm_destroy, "ncclCommDestroy", true);
    NCCL_SYM(tp__nccl_lib.lib, comm_abort, "ncclCommAbort", true);
    NCCL_SYM(tp__nccl_lib.lib, get_async_error, "ncclCommGetAsyncError", true);
    NCCL_SYM(tp__nccl_lib.lib, error_string, "ncclGetErrorString", true);
    NCCL_SYM(tp__nccl_lib.lib, all_reduce, "ncclAllReduce", true);
    NCCL_SYM(tp__nccl_lib.lib, broadcast, "ncclBroadcast", true);
    NCCL_SYM(tp__nccl_lib.lib, reduce, "ncclReduce", true);
    NCCL_SYM(tp__nccl_lib.lib, all_gather, "ncclAllGather", true);
    NCCL_SYM(tp__nccl_lib.lib, reduce_scatter, "ncclReduceScatter", true);
#undef NCCL_SYM
    if (tp__nccl_lib.why[0] != '\0') {
        return;
    }
    ncclResult_t r = tp__nccl_lib.get_version(&tp__nccl_lib.version);
    if (r != ncclSuccess) {
        snprintf(tp__nccl_lib.why, sizeof(tp__nccl_lib.why),
                 "libnccl.so.2: ncclGetVersion: %s",
                 tp__nccl_lib.error_string(r));
        return;
    }
    tp__nccl_lib.ok = true;
}

bool
tp__nccl_loadable(char *why, size_t why_len)
{
    pthread_once(&nccl_once, nccl_load);
    if (!tp__nccl_lib.ok && why != NULL) {
        snprintf(why, why_len, "%s", tp__nccl_lib.why);
    }
    return tp__nccl_lib.ok;
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
    return tp__nccl_loadable(NULL, 0) ? tp__nccl_lib.version : 0;
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
                             "against an older tp__nccl_lib.h)");
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
                             "an older tp__nccl_lib.h)");
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
        ncclResult_t r = tp__nccl_lib.get_unique_id(&uid);
        if (r != ncclSuccess) {
            st = tp__error_set(err_p, nccl_status(r),
                               "nccl: ncclGetUniqueId (rank 0 of %d): %s",
                               world, tp__nccl_lib.error_string(r));
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
        tp__nccl_lib.comm_abort(c->nc_comm);
        c->nc_comm = NULL;
    }
}

// Fails with @st and the formatted message, aborting the communicator.
tp_status
tp__nccl_fail_abort(tp__nccl_comm *c, tp_error **err_p, tp_status st,
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
        ncclResult_t r = tp__nccl_lib.get_async_error(c->nc_comm, &ar);
        if (r != ncclSuccess) {
            ar = r;
        }
        if (ar == ncclSuccess) {
            return TP_OK;
        }
        if (!nccl_in_progress(ar)) {
            return tp__nccl_fail_abort(
                c, err_p, nccl_status(ar),
                "nccl: %s (rank %d of %d, device %d): %s", what, c->nc_rank,
                c->nc_world, c->nc_device, tp__nccl_lib.error_string(ar));
        }
        if (tp__now_ns() >= deadline_ns) {
            return tp__nccl_fail_abort(
                c, err_p, TP_ETIMEDOUT,
                "nccl: %s (rank %d of %d, device %d): not complete after "
                "%" PRIu64 " ms (are all %d ranks there?)",
                what, c->nc_rank, c->nc_world, c->nc_device,
                (tp__now_ns() - start_ns) / 1000000u, c->nc_world);
        }
        nccl_sleep_poll();
    }
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
    if (tp__nccl_lib.comm_init_rank_config != NULL) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        nonblocking = true;
        c->nc_nonblocking = true;
        r = tp__nccl_lib.comm_init_rank_config(&c->nc_comm, world, uid, rank,
                                               &cfg);
    } else
#endif
    {
        r = tp__nccl_lib.comm_init_rank(&c->nc_comm, world, uid, rank);
    }
    if (r != ncclSuccess && !(nonblocking && nccl_in_progress(r))) {
        st = tp__error_set(err_p, nccl_status(r),
                           "nccl: ncclCommInitRank (rank %d of %d, device "
                           "%d): %s",
                           rank, world, device, tp__nccl_lib.error_string(r));
        if (c->nc_comm != NULL) {
            tp__nccl_lib.comm_abort(c->nc_comm);
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
        if (tp__nccl_lib.comm_finalize != NULL) {
            ncclResult_t r = tp__nccl_lib.comm_finalize(c->nc_comm);
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
            tp__nccl_lib.comm_destroy(c->nc_comm);
            c->nc_comm = NULL;
        } else {
            nccl_comm_kill(c, NULL);
        }
    }
    tp__cuda_stream_destroy(c->nc_stream);
    tp_error_unref(c->nc_dead);
    tp__free(c);
}

#else // !TP_HAVE_NCCL

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

#endif
