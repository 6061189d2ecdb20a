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
#include <stdint.h>

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

// Same-host sharing between processes (cudaIpc*), for a cuda_ipc channel.
// A handle is the runtime's 64 opaque bytes; it names a whole cudaMalloc
// allocation (open maps its base) or an interprocess event. Functions the
// loaded runtime lacks fail with TP_ENOTSUP and the reason. Errors also:
// TP_EINVAL (bad device), TP_EDEVICE (with the runtime's message).
#define TP_CUDA_IPC_HANDLE_LEN 64u
// The handle of the allocation starting at @base on @device.
tp_status tp__cuda_ipc_mem_export(int device, void *base,
                                  uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                                  tp_error **err_p);
// Maps the peer's allocation named by @handle on @device (made current):
// *@base_p is its base here, valid until tp__cuda_ipc_mem_close.
tp_status tp__cuda_ipc_mem_open(int device,
                                const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                                void **base_p, tp_error **err_p);
// The allocation holding device pointer @ptr on @device: its base and
// size (the driver's cuMemGetAddressRange; a memory handle names the whole
// allocation, so a tensor inside one travels as handle + offset).
tp_status tp__cuda_mem_range(int device, const void *ptr, void **base_p,
                             size_t *size_p, tp_error **err_p);
// Whether interprocess sharing could work here, without initialising the
// runtime when it is not loaded yet (a process that forks after that
// cannot use CUDA in the child, and the first call is slow): not built
// with CUDA, CUDA_VISIBLE_DEVICES hiding every device, no NVIDIA driver
// (/dev/nvidiactl; only if @check_driver) or no libcudart are reasons, in
// @why. Once the runtime is loaded (or in tests, with a fake), its device
// count and IPC entry points decide. Any thread.
bool tp__cuda_probe(bool check_driver, char *why, size_t why_len);
// Unmaps what tp__cuda_ipc_mem_open returned. NULL is fine.
void tp__cuda_ipc_mem_close(int device, void *base);
// A new interprocess event on @device (timing disabled).
tp_status tp__cuda_event_create_ipc(int device, void **event_p,
                                    tp_error **err_p);
// Records @event on the legacy default stream of its device (after the
// work queued there, where tp__cuda_copy runs).
tp_status tp__cuda_event_record(void *event, tp_error **err_p);
tp_status tp__cuda_event_export(void *event,
                                uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                                tp_error **err_p);
// The peer's event named by @handle, opened on @device.
tp_status tp__cuda_event_open(int device,
                              const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                              void **event_p, tp_error **err_p);
// Waits until the work before @event's last record has finished.
tp_status tp__cuda_event_sync(void *event, tp_error **err_p);
// NULL is fine.
void tp__cuda_event_destroy(void *event);

// Tests only: load the runtime from @path (a fake libcudart, see
// tests/cuda/fake_cudart.c) instead of the system's. Must run before
// anything else here (the runtime is loaded once); returns false if it
// was already loaded. Nothing in the library calls it.
bool tp__cuda_testing_use_runtime(const char *path);

#endif
