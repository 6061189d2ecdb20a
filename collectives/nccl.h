/* SPDX-License-Identifier: Apache-2.0 */
/* nccl.h (internal) - NCCL for CUDA tensors, called by the process group.
 *
 * libnccl.so.2 is loaded with dlopen at first use, like the CUDA runtime
 * (core/cuda.h): libtpipe has no link-time dependency on NCCL or CUDA, so a
 * build with NCCL runs where NCCL is absent and says why. The header
 * nccl.h is only used at build time (TP_HAVE_NCCL), for the types, the
 * enum values and the version checks. A build without NCCL compiles stubs
 * that fail with TP_ENOTSUP "built without NCCL (TP_WITH_NCCL)".
 *
 * Mapping (tp__nccl_dtype, tp__nccl_op):
 *   dtypes: f32 f64 f16 bf16 i8 u8 i32 i64 (bf16 needs NCCL >= 2.10 both in
 *           the header built against and in the library loaded); bool has
 *           no NCCL type: TP_ENOTSUP.
 *   ops:    sum product min max avg (avg: NCCL >= 2.10); band, bor and bxor
 *           have no NCCL op: TP_ENOTSUP naming the op.
 * The operations also apply tp__reduce_check (collectives/reduce.h), so
 * NCCL accepts a subset of what the CPU path accepts (avg on floats only;
 * no bool, no bitwise ops). send/recv: the peer must post the opposite
 * call; a rank cannot send to or receive from itself (TP_EINVAL).
 *
 * Timeouts (every int64_t timeout_ms): TP_TIMEOUT_DEFAULT (-1) is the
 * communicator's default (the timeout_ms given to tp__nccl_comm_create,
 * itself defaulting to TP_NCCL_TIMEOUT_MS); 0 is no limit; > 0 that many
 * milliseconds. An operation is enqueued on the communicator's own stream
 * and then polled (cudaStreamQuery and ncclCommGetAsyncError, every ~100
 * us). At the deadline, or on an asynchronous NCCL error, the communicator
 * is aborted (ncclCommAbort): the call fails with TP_ETIMEDOUT (or the
 * mapped NCCL error) naming the op, the rank and the time waited, and every
 * later call on the communicator fails with TP_ECLOSED. Destroy it and make
 * a new one (all ranks must).
 *
 * NCCL errors map to: ncclInvalidArgument/ncclInvalidUsage -> TP_EINVAL,
 * ncclUnhandledCudaError -> TP_EDEVICE, ncclSystemError -> TP_ECONNRESET,
 * ncclRemoteError -> TP_EREMOTE, anything else -> TP_EINTERNAL. Messages
 * name the op, the rank, the device and ncclGetErrorString's text.
 *
 * Buffers are device pointers on the communicator's device, borrowed until
 * the call returns (every call is blocking). Counts are in elements.
 *
 * Thread safety: tp__nccl_available, tp__nccl_dtype and tp__nccl_op from
 * any thread. A communicator is used by one thread at a time (NCCL requires
 * the calls on one communicator to be issued in the same order on every
 * rank, which only a single issuing thread guarantees). */
#ifndef TP_COLLECTIVES_NCCL_H
#define TP_COLLECTIVES_NCCL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/store.h>
#include <tpipe/tensor.h>

#include "collectives/reduce.h"

/* TP_NCCL_TIMEOUT_MS - a communicator's default timeout (5 min, as the
 * store's). */
#define TP_NCCL_TIMEOUT_MS 300000

typedef struct tp__nccl_comm tp__nccl_comm;

// True if NCCL can be used here: built with NCCL, libnccl.so.2 (and the
// CUDA runtime) load, and at least one CUDA device is present. Otherwise
// @why (may be NULL) says why: "built without NCCL (TP_WITH_NCCL)",
// "libnccl.so.2: cannot open ...", "no CUDA device: ...".
bool tp__nccl_available(char *why, size_t why_len);

// True if libnccl.so.2 and the CUDA runtime load, whether or not a device
// is present (ncclGetUniqueId works without one). @why as above.
bool tp__nccl_loadable(char *why, size_t why_len);

// The version of the loaded library (NCCL_VERSION_CODE form, 22809 for
// 2.28.9), or 0 if it is not loadable.
int tp__nccl_version(void);

// The ncclDataType_t of @dt in *@nccl_dt_p. Errors (TP_ENOTSUP, naming the
// dtype): bool, bf16 with NCCL < 2.10, a build without NCCL; TP_EINVAL for
// values outside the enum. Needs no device and no library.
tp_status tp__nccl_dtype(tp_dtype dt, int *nccl_dt_p, tp_error **err_p);

// The ncclRedOp_t of @op in *@nccl_op_p. Errors (TP_ENOTSUP, naming the
// op): band, bor, bxor, avg with NCCL < 2.10, a build without NCCL;
// TP_EINVAL for values outside the enum. Needs no device and no library.
tp_status tp__nccl_op(tp_reduce_op op, int *nccl_op_p, tp_error **err_p);

/* TP_NCCL_ID_BYTES - the size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES). */
#define TP_NCCL_ID_BYTES 128

// The bootstrap step of tp__nccl_comm_create, on its own so it can be
// tested without a device: rank 0 makes a unique id (ncclGetUniqueId) and
// sets "<key_prefix>nccl_id" to it; the other ranks get it from @store,
// waiting up to @timeout_ms (TP_TIMEOUT_DEFAULT: the store's default, 0 no
// limit). On success @id holds the id on every rank. The prefix must be
// unique per communicator: a stale id under a reused key would be read.
// Errors: TP_ENOTSUP (NCCL not loadable), TP_EINVAL, TP_EPROTO (the key
// holds a value of the wrong size), the store's errors.
tp_status tp__nccl_id_exchange(tp_store *store, const char *key_prefix,
                               int rank, int world, int64_t timeout_ms,
                               unsigned char id[TP_NCCL_ID_BYTES],
                               tp_error **err_p);

// Makes the NCCL communicator of @rank among @world ranks on CUDA device
// @device. Rank 0 calls ncclGetUniqueId and sets "<key_prefix>nccl_id" in
// @store (the 128-byte id); the other ranks get it, waiting until the
// deadline. Then every rank selects @device and joins with
// ncclCommInitRank (non-blocking initialisation when the library has
// ncclCommInitRankConfig, so the deadline holds there too; otherwise it
// blocks until every rank joined). @timeout_ms bounds the whole call and
// becomes the communicator's default (TP_TIMEOUT_DEFAULT:
// TP_NCCL_TIMEOUT_MS). @store and @key_prefix are borrowed for the call.
// Errors: TP_ENOTSUP (unavailable, with the reason), TP_EINVAL (bad rank,
// world, device or prefix), TP_ETIMEDOUT, the store's errors, the mapped
// NCCL errors; messages name the rank and the device.
tp_status tp__nccl_comm_create(tp_store *store, const char *key_prefix,
                               int rank, int world, int device,
                               int64_t timeout_ms, tp__nccl_comm **comm_p,
                               tp_error **err_p);

// Frees @comm: finalises it (waiting up to its default timeout for
// pending work, then aborting) and destroys its stream. NULL is fine.
void tp__nccl_comm_destroy(tp__nccl_comm *comm);

// recv[i] = OP over ranks of send[i], @count elements. In place if @send
// == @recv.
tp_status tp__nccl_all_reduce(tp__nccl_comm *comm, const void *send, void *recv,
                              size_t count, tp_dtype dt, tp_reduce_op op,
                              int64_t timeout_ms, tp_error **err_p);
// @count elements of @root's @send into every rank's @recv (@send is only
// read on @root).
tp_status tp__nccl_broadcast(tp__nccl_comm *comm, const void *send, void *recv,
                             size_t count, tp_dtype dt, int root,
                             int64_t timeout_ms, tp_error **err_p);
// As all_reduce, with the result only in @root's @recv.
tp_status tp__nccl_reduce(tp__nccl_comm *comm, const void *send, void *recv,
                          size_t count, tp_dtype dt, tp_reduce_op op, int root,
                          int64_t timeout_ms, tp_error **err_p);
// @recv (world * @send_count elements) gets every rank's @send in rank
// order.
tp_status tp__nccl_all_gather(tp__nccl_comm *comm, const void *send, void *recv,
                              size_t send_count, tp_dtype dt,
                              int64_t timeout_ms, tp_error **err_p);
// @send has world * @recv_count elements; rank r's @recv gets block r of
// their reduction.
tp_status tp__nccl_reduce_scatter(tp__nccl_comm *comm, const void *send,
                                  void *recv, size_t recv_count, tp_dtype dt,
                                  tp_reduce_op op, int64_t timeout_ms,
                                  tp_error **err_p);

#endif
