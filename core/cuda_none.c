// SPDX-License-Identifier: Apache-2.0
// cuda_none.c - core/cuda.h in a build without CUDA (TP_WITH_CUDA off or
// no toolkit found): every function says so (TP_ENOTSUP); cuda.c is the
// real one.

#include "cuda.h"

#include <stdio.h>

#include "tp_config.h"

#if !TP_HAVE_CUDA

bool
tp__cuda_available(char *why, size_t why_len)
{
    if (why != NULL) {
        snprintf(why, why_len, "built without CUDA (TP_WITH_CUDA)");
    }
    return false;
}

int
tp__cuda_device_count(void)
{
    return 0;
}

tp_status
tp__cuda_alloc(int device, size_t nbytes, void **ptr_p, tp_error **err_p)
{
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: alloc: built without CUDA (TP_WITH_CUDA)");
}

void
tp__cuda_free(int device, void *ptr)
{
}

tp_status
tp__cuda_copy(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
              tp_error **err_p)
{
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: copy: built without CUDA (TP_WITH_CUDA)");
}

tp_status
tp__cuda_set_device(int device, tp_error **err_p)
{
    (void)device;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: built without CUDA (TP_WITH_CUDA)");
}

tp_status
tp__cuda_stream_create(int device, void **stream_p, tp_error **err_p)
{
    (void)device;
    (void)stream_p;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: built without CUDA (TP_WITH_CUDA)");
}

tp_status
tp__cuda_stream_query(void *stream, bool *done_p, tp_error **err_p)
{
    (void)stream;
    (void)done_p;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: built without CUDA (TP_WITH_CUDA)");
}

void
tp__cuda_stream_destroy(void *stream)
{
    (void)stream;
}

tp_status
tp__cuda_device_sync(int device, tp_error **err_p)
{
    (void)device;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: built without CUDA (TP_WITH_CUDA)");
}

tp_status
tp__cuda_host_alloc(size_t nbytes, void **ptr_p, tp_error **err_p)
{
    (void)nbytes;
    (void)ptr_p;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "cuda: built without CUDA (TP_WITH_CUDA)");
}

void
tp__cuda_host_free(void *ptr)
{
    (void)ptr;
}

#define CUDA_NO(what)                                                          \
    tp__error_set(err_p, TP_ENOTSUP,                                           \
                  "cuda: " what ": built without CUDA (TP_WITH_CUDA)")

tp_status
tp__cuda_ipc_mem_export(int device, void *base,
                        uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                        tp_error **err_p)
{
    (void)device;
    (void)base;
    (void)handle;
    return CUDA_NO("ipc export");
}

tp_status
tp__cuda_ipc_mem_open(int device, const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                      void **base_p, tp_error **err_p)
{
    (void)device;
    (void)handle;
    (void)base_p;
    return CUDA_NO("ipc open");
}

tp_status
tp__cuda_mem_range(int device, const void *ptr, void **base_p, size_t *size_p,
                   tp_error **err_p)
{
    (void)device;
    (void)ptr;
    (void)base_p;
    (void)size_p;
    return CUDA_NO("allocation range");
}

bool
tp__cuda_probe(bool check_driver, char *why, size_t why_len)
{
    (void)check_driver;
    snprintf(why, why_len, "built without CUDA (TP_WITH_CUDA)");
    return false;
}

void
tp__cuda_ipc_mem_close(int device, void *base)
{
    (void)device;
    (void)base;
}

tp_status
tp__cuda_event_create_ipc(int device, void **event_p, tp_error **err_p)
{
    (void)device;
    (void)event_p;
    return CUDA_NO("event");
}

tp_status
tp__cuda_event_record(void *event, tp_error **err_p)
{
    (void)event;
    return CUDA_NO("event record");
}

tp_status
tp__cuda_event_export(void *event, uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                      tp_error **err_p)
{
    (void)event;
    (void)handle;
    return CUDA_NO("event export");
}

tp_status
tp__cuda_event_open(int device, const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                    void **event_p, tp_error **err_p)
{
    (void)device;
    (void)handle;
    (void)event_p;
    return CUDA_NO("event open");
}

tp_status
tp__cuda_event_sync(void *event, tp_error **err_p)
{
    (void)event;
    return CUDA_NO("event wait");
}

void
tp__cuda_event_destroy(void *event)
{
    (void)event;
}

bool
tp__cuda_testing_use_runtime(const char *path)
{
    (void)path;
    return false;
}

#else
typedef int tp__cuda_none_empty; // ISO C: no empty translation unit
#endif // !TP_HAVE_CUDA
