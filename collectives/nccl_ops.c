// SPDX-License-Identifier: Apache-2.0
// nccl_ops.c - the NCCL operations (see nccl.h): each is checked, enqueued
// on the communicator's stream and polled until done, aborting the
// communicator at the deadline or on an asynchronous error. Loading NCCL
// and the communicator are in nccl_comm.c.

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>

#include "collectives/nccl_impl.h"
#include "core/cuda.h"
#include "core/error.h"
#include "core/platform.h"

#if TP_HAVE_NCCL
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
    if (tp__nccl_lib.version < NCCL_V2_10 &&
        (dt == TP_BF16 || (op != NULL && *op == TP_REDUCE_AVG))) {
        char v[32];
        nccl_version_str(tp__nccl_lib.version, v, sizeof(v));
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
                                 tp__nccl_lib.error_string(r));
        }
        return tp__nccl_fail_abort(c, err_p, nccl_status(r),
                                   "nccl: %s (rank %d of %d, device %d): %s",
                                   what, c->nc_rank, c->nc_world, c->nc_device,
                                   tp__nccl_lib.error_string(r));
    }
    uint64_t deadline_ns = nccl_deadline(c, timeout_ms);
    for (;;) {
        ncclResult_t ar = ncclSuccess;
        ncclResult_t qr = tp__nccl_lib.get_async_error(c->nc_comm, &ar);
        if (qr != ncclSuccess) {
            ar = qr;
        }
        if (ar != ncclSuccess && !nccl_in_progress(ar)) {
            return tp__nccl_fail_abort(c, err_p, nccl_status(ar),
                                       "nccl: %s (rank %d of %d, device %d): "
                                       "asynchronous error: %s",
                                       what, c->nc_rank, c->nc_world,
                                       c->nc_device,
                                       tp__nccl_lib.error_string(ar));
        }
        if (ar == ncclSuccess) {
            bool done = false;
            tp_error *qe = NULL;
            if (tp__cuda_stream_query(c->nc_stream, &done, &qe) != TP_OK) {
                tp_status fst = tp__nccl_fail_abort(
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
            return tp__nccl_fail_abort(
                c, err_p, TP_ETIMEDOUT,
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
        tp__nccl_lib.all_reduce(send, recv, count, (ncclDataType_t)ndt,
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
    ncclResult_t r = tp__nccl_lib.broadcast(
        send, recv, count, (ncclDataType_t)ndt, root, c->nc_comm, c->nc_stream);
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
        tp__nccl_lib.reduce(send, recv, count, (ncclDataType_t)ndt,
                            (ncclRedOp_t)nop, root, c->nc_comm, c->nc_stream);
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
    ncclResult_t r = tp__nccl_lib.all_gather(
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
        tp__nccl_lib.reduce_scatter(send, recv, recv_count, (ncclDataType_t)ndt,
                                    (ncclRedOp_t)nop, c->nc_comm, c->nc_stream);
    return nccl_finish(c, "reduce_scatter", r, timeout_ms, err_p);
}

#else // !TP_HAVE_NCCL

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

#endif
