/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.h (internal) - the one wrapper around the CUDA runtime.
 *
 * Every call into CUDA goes through here (STYLE §12). The runtime is
 * loaded with dlopen at first use, so libtpipe never depends on libcudart
 * at link time: a build with CUDA runs on machines without it, and CUDA
 * storage is simply "not available" there, with the reason. */
#ifndef TP_CORE_CUDA_H
#define TP_CORE_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "error.h"

// True if CUDA storage can be created here: built with CUDA, the runtime
// loads, and at least one device is present. Otherwise @why (may be NULL)
// says why ("no CUDA device: cudaGetDeviceCount: no CUDA-capable device is
// detected"). Thread safety: any thread.
bool tp__cuda_available(char *why, size_t why_len);
// Number of devices (0 if unavailable).
int tp__cuda_device_count(void);
// Device memory of @nbytes on @device. Errors: TP_ENOTSUP (unavailable,
// with the reason), TP_EINVAL (bad device index), TP_ENOMEM.
tp_status tp__cuda_alloc(int device, size_t nbytes, void **ptr_p,
                         tp_error **err_p);
// Frees what tp__cuda_alloc returned. NULL is fine.
void tp__cuda_free(int device, void *ptr);
// Copies @n bytes; each side is host memory (device < 0) or memory of
// CUDA device @*_dev. Synchronous. Errors: TP_ENOTSUP, TP_EDEVICE.
tp_status tp__cuda_copy(void *dst, int dst_dev, const void *src, int src_dev,
                        size_t n, tp_error **err_p);

// Streams, for libraries that enqueue work (NCCL). A stream is the
// runtime's cudaStream_t as a void *.
// Makes @device current on the calling thread. Errors: TP_ENOTSUP,
// TP_EDEVICE (with the runtime's message).
tp_status tp__cuda_set_device(int device, tp_error **err_p);
// A new stream on @device (made current), ordered after the legacy default
// stream (where tp__cuda_copy runs). Errors as above.
tp_status tp__cuda_stream_create(int device, void **stream_p, tp_error **err_p);
// *@done_p: the stream's work has finished. Errors: TP_EDEVICE.
tp_status tp__cuda_stream_query(void *stream, bool *done_p, tp_error **err_p);
// NULL is fine.
void tp__cuda_stream_destroy(void *stream);

// Waits until every stream of @device has finished its work
// (cudaDeviceSynchronize): a tensor written by a kernel on any stream,
// blocking or not, is complete after it. Errors: TP_ENOTSUP, TP_EINVAL,
// TP_EDEVICE (with the runtime's message).
tp_status tp__cuda_device_sync(int device, tp_error **err_p);

// Page-locked host memory of @nbytes (cudaMallocHost), for staging copies
// between a device and the network. Errors: TP_ENOTSUP (unavailable, with
// the reason), TP_ENOMEM.
tp_status tp__cuda_host_alloc(size_t nbytes, void **ptr_p, tp_error **err_p);
// Frees what tp__cuda_host_alloc returned. NULL is fine.
void tp__cuda_host_free(void *ptr);

// Tests only: load the runtime from @path (a fake libcudart, see
// tests/cuda/fake_cudart.c) instead of the system's. Must run before
// anything else here (the runtime is loaded once); returns false if it
// was already loaded. Nothing in the library calls it.
bool tp__cuda_testing_use_runtime(const char *path);

#endif
