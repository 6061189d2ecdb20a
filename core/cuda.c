// SPDX-License-Identifier: Apache-2.0
// cuda.c - the CUDA runtime, loaded with dlopen (see cuda.h).
//
// Only the handful of runtime entry points tensors need are resolved; the
// signatures are those of cuda_runtime_api.h, which is included when the
// build found CUDA so the compiler checks them.

#include "cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tp_config.h"

#if TP_HAVE_CUDA
#include <cuda_runtime_api.h>

typedef cudaError_t (*cuda_get_count_fn)(int *);
typedef cudaError_t (*cuda_set_device_fn)(int);
typedef cudaError_t (*cuda_malloc_fn)(void **, size_t);
typedef cudaError_t (*cuda_free_fn)(void *);
typedef cudaError_t (*cuda_memcpy_fn)(void *, const void *, size_t,
                                      enum cudaMemcpyKind);
typedef const char *(*cuda_error_string_fn)(cudaError_t);
typedef cudaError_t (*cuda_stream_create_fn)(cudaStream_t *, unsigned int);
typedef cudaError_t (*cuda_stream_fn)(cudaStream_t);
typedef cudaError_t (*cuda_malloc_host_fn)(void **, size_t);
typedef cudaError_t (*cuda_sync_fn)(void);
typedef cudaError_t (*cuda_free_host_fn)(void *);
typedef cudaError_t (*cuda_ipc_get_mem_fn)(cudaIpcMemHandle_t *, void *);
typedef cudaError_t (*cuda_ipc_open_mem_fn)(void **, cudaIpcMemHandle_t,
                                            unsigned int);
typedef cudaError_t (*cuda_ipc_close_mem_fn)(void *);
typedef cudaError_t (*cuda_event_create_fn)(cudaEvent_t *, unsigned int);
typedef cudaError_t (*cuda_event_record_fn)(cudaEvent_t, cudaStream_t);
typedef cudaError_t (*cuda_event_fn)(cudaEvent_t);
typedef cudaError_t (*cuda_ipc_get_event_fn)(cudaIpcEventHandle_t *,
                                             cudaEvent_t);
typedef cudaError_t (*cuda_ipc_open_event_fn)(cudaEvent_t *,
                                              cudaIpcEventHandle_t);
// The driver's calls return CUresult (cuda.h, not included: the driver
// API is loaded by name too), an enum without negative values, which GCC
// and Clang make compatible with unsigned int.
// cuMemGetAddressRange_v2 (CUdeviceptr: unsigned long long): the runtime
// API cannot give the allocation an interior pointer is in.
typedef unsigned int (*cuda_mem_range_fn)(unsigned long long *, size_t *,
                                          unsigned long long);
typedef unsigned int (*cuda_drv_version_fn)(int *); // cuDriverGetVersion
typedef cudaError_t (*cuda_rt_version_fn)(int *);   // cudaRuntimeGetVersion

static struct {
    void *lib;
    cuda_get_count_fn get_count;
    cuda_set_device_fn set_device;
    cuda_malloc_fn malloc;
    cuda_free_fn free;
    cuda_memcpy_fn memcpy;
    cuda_error_string_fn error_string;
    cuda_stream_create_fn stream_create;
    cuda_stream_fn stream_query;
    cuda_stream_fn stream_sync;
    cuda_stream_fn stream_destroy;
    cuda_malloc_host_fn malloc_host;
    cuda_free_host_fn free_host;
    cuda_sync_fn device_sync;
    // Optional (NULL: absent, why in ipc_why).
    cuda_ipc_get_mem_fn ipc_get_mem;
    cuda_ipc_open_mem_fn ipc_open_mem;
    cuda_ipc_close_mem_fn ipc_close_mem;
    cuda_event_create_fn event_create;
    cuda_event_record_fn event_record;
    cuda_event_fn event_sync;
    cuda_event_fn event_destroy;
    cuda_ipc_get_event_fn ipc_get_event;
    cuda_ipc_open_event_fn ipc_open_event;
    void *drv; // libcuda (the fake runtime itself in tests)
    cuda_mem_range_fn mem_range;
    char ipc_why[128];
    int ndev;
    char why[256];
} cuda;

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
// tp__cuda_testing_use_runtime: the only library tried when set.
static const char *cuda_testing_path;
static _Atomic bool cuda_loaded;

static void *
cuda_sym(const char *name)
{
    void *p = dlsym(cuda.lib, name);
    if (p == NULL && cuda.why[0] == '\0') {
        snprintf(cuda.why, sizeof(cuda.why), "libcudart has no %s", name);
    }
    return p;
}

// The version @h (the driver library if @driver, else the runtime) says
// into *@ver (cuDriverGetVersion, cudaRuntimeGetVersion: neither
// initialises CUDA); left as it was when the library lacks the call or it
// fails.
static void
cuda_probe_version(void *h, bool driver, int *ver)
{
    void *sym =
        dlsym(h, driver ? "cuDriverGetVersion" : "cudaRuntimeGetVersion");
    if (sym == NULL) {
        return;
    }
    int v = 0;
    bool ok;
    if (driver) {
        cuda_drv_version_fn fn;
        memcpy(&fn, &sym, sizeof(sym));
        ok = fn(&v) == 0; // CUDA_SUCCESS
    } else {
        cuda_rt_version_fn fn;
        memcpy(&fn, &sym, sizeof(sym));
        ok = fn(&v) == cudaSuccess;
    }
    if (ok) {
        *ver = v;
    }
}

// Whether a runtime of version @rt can start on a driver of version @drv
// (1000 * major + 10 * minor; -1: unknown, taken as fine). Since CUDA 11
// a runtime runs on any driver of its major version (minor version
// compatibility); an older major fails every call with
// cudaErrorInsufficientDriver, and a driver that reports 0 has no GPU
// support loaded.
static bool
cuda_probe_versions(int drv, int rt, char *why, size_t why_len)
{
    if (drv == 0) {
        snprintf(why, why_len,
                 "the CUDA driver library reports no driver "
                 "(cuDriverGetVersion: 0)");
        return false;
    }
    if (drv > 0 && rt > 0 && drv / 1000 < rt / 1000) {
        snprintf(why, why_len,
                 "the CUDA driver supports CUDA %d.%d, older than the "
                 "runtime's %d.%d: the runtime cannot start here (a newer "
                 "driver would)",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return false;
    }
    return true;
}

static void
cuda_load(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so"};
    atomic_store_explicit(&cuda_loaded, true, memory_order_release);
    size_t nnames = sizeof(names) / sizeof(names[0]);
    for (size_t i = 0; i < nnames; i++) {
        const char *name = names[i];
        if (cuda_testing_path != NULL) {
            name = cuda_testing_path;
            nnames = 1;
        }
        cuda.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (cuda.lib != NULL) {
            break;
        }
    }
    if (cuda.lib == NULL) {
        snprintf(cuda.why, sizeof(cuda.why),
                 "the CUDA runtime (libcudart.so) could not be loaded: %s",
                 dlerror());
        return;
    }
    // dlsym returns an object pointer; ISO C has no conversion to a
    // function pointer, so copy the representation (POSIX guarantees it).
#define CUDA_SYM(field, name)                                                  \
    do {                                                                       \
        void *p_ = cuda_sym(name);                                             \
        memcpy(&cuda.field, &p_, sizeof(p_));                                  \
    } while (0)
    CUDA_SYM(get_count, "cudaGetDeviceCount");
    CUDA_SYM(set_device, "cudaSetDevice");
    CUDA_SYM(malloc, "cudaMalloc");
    CUDA_SYM(free, "cudaFree");
    CUDA_SYM(memcpy, "cudaMemcpy");
    CUDA_SYM(error_string, "cudaGetErrorString");
    CUDA_SYM(stream_create, "cudaStreamCreateWithFlags");
    CUDA_SYM(stream_query, "cudaStreamQuery");
    CUDA_SYM(stream_sync, "cudaStreamSynchronize");
    CUDA_SYM(stream_destroy, "cudaStreamDestroy");
    CUDA_SYM(malloc_host, "cudaMallocHost");
    CUDA_SYM(free_host, "cudaFreeHost");
    CUDA_SYM(device_sync, "cudaDeviceSynchronize");
    // Optional: without them only the cuda_ipc path is refused.
#define CUDA_OPT(field, name)                                                  \
    do {                                                                       \
        void *p_ = dlsym(cuda.lib, name);                                      \
        memcpy(&cuda.field, &p_, sizeof(p_));                                  \
        if (p_ == NULL && cuda.ipc_why[0] == '\0') {                           \
            snprintf(cuda.ipc_why, sizeof(cuda.ipc_why),                       \
                     "libcudart has no %s", name);                             \
        }                                                                      \
    } while (0)
    CUDA_OPT(ipc_get_mem, "cudaIpcGetMemHandle");
    CUDA_OPT(ipc_open_mem, "cudaIpcOpenMemHandle");
    CUDA_OPT(ipc_close_mem, "cudaIpcCloseMemHandle");
    CUDA_OPT(event_create, "cudaEventCreateWithFlags");
    CUDA_OPT(event_record, "cudaEventRecord");
    CUDA_OPT(event_sync, "cudaEventSynchronize");
    CUDA_OPT(event_destroy, "cudaEventDestroy");
    CUDA_OPT(ipc_get_event, "cudaIpcGetEventHandle");
    CUDA_OPT(ipc_open_event, "cudaIpcOpenEventHandle");
    // The driver, for an allocation's range (cuda_ipc sends a tensor's
    // offset in its allocation); the fake runtime exports it too.
    cuda.drv = cuda_testing_path != NULL
                   ? cuda.lib
                   : dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda.drv != NULL) {
        void *p_ = dlsym(cuda.drv, "cuMemGetAddressRange_v2");
        memcpy(&cuda.mem_range, &p_, sizeof(p_));
    }
    if (cuda.mem_range == NULL && cuda.ipc_why[0] == '\0') {
        snprintf(cuda.ipc_why, sizeof(cuda.ipc_why),
                 "the CUDA driver (libcuda.so.1) or its "
                 "cuMemGetAddressRange_v2 is missing");
    }
#undef CUDA_OPT
#undef CUDA_SYM
    if (cuda.why[0] != '\0') {
        return;
    }
    // A driver too old for this runtime: said plainly (and as
    // tp__cuda_probe says it before the runtime is loaded), rather than
    // the runtime's error from its first call.
    int drv_ver = -1, rt_ver = -1;
    if (cuda.drv != NULL) {
        cuda_probe_version(cuda.drv, true, &drv_ver);
    }
    cuda_probe_version(cuda.lib, false, &rt_ver);
    if (!cuda_probe_versions(drv_ver, rt_ver, cuda.why, sizeof(cuda.why))) {
        return;
    }
    int n = 0;
    cudaError_t e = cuda.get_count(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(cuda.why, sizeof(cuda.why),
                 "no CUDA device: cudaGetDeviceCount: %s",
                 e != cudaSuccess ? cuda.error_string(e) : "0 devices");
        return;
    }
    cuda.ndev = n;
}

bool
tp__cuda_available(char *why, size_t why_len)
{
    pthread_once(&cuda_once, cuda_load);
    if (cuda.ndev <= 0 && why != NULL) {
        snprintf(why, why_len, "%s", cuda.why);
    }
    return cuda.ndev > 0;
}

int
tp__cuda_device_count(void)
{
    pthread_once(&cuda_once, cuda_load);
    return cuda.ndev;
}

static tp_status
cuda_check(int device, tp_error **err_p, const char *what)
{
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP, "cuda: %s: %s", what, why);
    }
    if (device < 0 || device >= cuda.ndev) {
        return tp__error_set(err_p, TP_EINVAL,
                             "cuda: %s: device %d does not exist (%d "
                             "devices)",
                             what, device, cuda.ndev);
    }
    cudaError_t e = cuda.set_device(device);
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_EDEVICE,
                             "cuda: %s: cudaSetDevice(%d): %s", what, device,
                             cuda.error_string(e));
    }
    return TP_OK;
}

tp_status
tp__cuda_alloc(int device, size_t nbytes, void **ptr_p, tp_error **err_p)
{
    tp_status st = cuda_check(device, err_p, "alloc");
    if (st != TP_OK) {
        return st;
    }
    void *p = NULL;
    cudaError_t e = cuda.malloc(&p, nbytes == 0 ? 1 : nbytes);
    if (e != cudaSuccess) {
        return tp__error_set(
            err_p, e == cudaErrorMemoryAllocation ? TP_ENOMEM : TP_EDEVICE,
            "cuda: cudaMalloc of %zu bytes on device %d: %s", nbytes, device,
            cuda.error_string(e));
    }
    *ptr_p = p;
    return TP_OK;
}

void
tp__cuda_free(int device, void *ptr)
{
    if (ptr == NULL || cuda_check(device, NULL, "free") != TP_OK) {
        return;
    }
    cuda.free(ptr);
}

tp_status
tp__cuda_copy(void *dst, int dst_dev, const void *src, int src_dev, size_t n,
              tp_error **err_p)
{
    int dev = dst_dev >= 0 ? dst_dev : src_dev;
    if (dev < 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "cuda: copy: neither side is on a device");
    }
    tp_status st = cuda_check(dev, err_p, "copy");
    if (st != TP_OK || n == 0) {
        return st;
    }
    enum cudaMemcpyKind kind = dst_dev >= 0 && src_dev >= 0
                                   ? cudaMemcpyDeviceToDevice
                               : dst_dev >= 0 ? cudaMemcpyHostToDevice
                                              : cudaMemcpyDeviceToHost;
    cudaError_t e = cuda.memcpy(dst, src, n, kind);
    // cudaMemcpy returns before a device-to-device copy is done, and
    // before a copy from pageable host memory reached the device: wait for
    // the legacy default stream it ran on, so "returned" means "done" (a
    // sender may reuse its buffer, a reader's user may read the tensor).
    if (e == cudaSuccess && dst_dev >= 0) {
        e = cuda.stream_sync(NULL);
    }
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_EDEVICE,
                             "cuda: cudaMemcpy of %zu bytes: %s", n,
                             cuda.error_string(e));
    }
    return TP_OK;
}

tp_status
tp__cuda_set_device(int device, tp_error **err_p)
{
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP, "cuda: %s", why);
    }
    cudaError_t e = cuda.set_device(device);
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_EDEVICE, "cuda: cudaSetDevice(%d): %s",
                             device, cuda.error_string(e));
    }
    return TP_OK;
}

tp_status
tp__cuda_stream_create(int device, void **stream_p, tp_error **err_p)
{
    tp_status st = tp__cuda_set_device(device, err_p);
    if (st != TP_OK) {
        return st;
    }
    cudaStream_t s = NULL;
    // A blocking stream: it waits for the legacy default stream, where
    // tp__cuda_copy's cudaMemcpy runs, so a tensor filled by a copy is
    // complete before work on this stream reads it.
    cudaError_t e = cuda.stream_create(&s, cudaStreamDefault);
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_EDEVICE,
                             "cuda: cudaStreamCreateWithFlags (device %d): %s",
                             device, cuda.error_string(e));
    }
    *stream_p = s;
    return TP_OK;
}

tp_status
tp__cuda_stream_query(void *stream, bool *done_p, tp_error **err_p)
{
    cudaError_t e = cuda.stream_query((cudaStream_t)stream);
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        *done_p = e == cudaSuccess;
        return TP_OK;
    }
    return tp__error_set(err_p, TP_EDEVICE, "cuda: cudaStreamQuery: %s",
                         cuda.error_string(e));
}

void
tp__cuda_stream_destroy(void *stream)
{
    if (stream != NULL && cuda.stream_destroy != NULL) {
        cuda.stream_destroy((cudaStream_t)stream);
    }
}

tp_status
tp__cuda_device_sync(int device, tp_error **err_p)
{
    tp_status st = cuda_check(device, err_p, "synchronize");
    if (st != TP_OK) {
        return st;
    }
    cudaError_t e = cuda.device_sync();
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_EDEVICE,
                             "cuda: cudaDeviceSynchronize (device %d): %s",
                             device, cuda.error_string(e));
    }
    return TP_OK;
}

tp_status
tp__cuda_host_alloc(size_t nbytes, void **ptr_p, tp_error **err_p)
{
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP, "cuda: pinned host memory: %s",
                             why);
    }
    void *p = NULL;
    cudaError_t e = cuda.malloc_host(&p, nbytes == 0 ? 1 : nbytes);
    if (e != cudaSuccess) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "cuda: cudaMallocHost of %zu bytes: %s", nbytes,
                             cuda.error_string(e));
    }
    *ptr_p = p;
    return TP_OK;
}

void
tp__cuda_host_free(void *ptr)
{
    if (ptr != NULL && cuda.free_host != NULL) {
        cuda.free_host(ptr);
    }
}

// TP_OK when the runtime loaded with its IPC functions and @device
// exists (made current; -1: no device to check).
static tp_status
cuda_ipc_check(int device, tp_error **err_p, const char *what)
{
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP, "cuda: %s: %s", what, why);
    }
    if (cuda.ipc_why[0] != '\0') {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "cuda: %s: interprocess sharing is not "
                             "available: %s",
                             what, cuda.ipc_why);
    }
    return device < 0 ? TP_OK : cuda_check(device, err_p, what);
}

#define CUDA_IPC_FAIL(err_p, e, ...)                                           \
    tp__error_set(err_p, TP_EDEVICE, __VA_ARGS__, cuda.error_string(e))

tp_status
tp__cuda_ipc_mem_export(int device, void *base,
                        uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                        tp_error **err_p)
{
    _Static_assert(sizeof(cudaIpcMemHandle_t) == TP_CUDA_IPC_HANDLE_LEN,
                   "cudaIpcMemHandle_t is 64 bytes");
    tp_status st = cuda_ipc_check(device, err_p, "ipc export");
    if (st != TP_OK) {
        return st;
    }
    cudaIpcMemHandle_t h;
    cudaError_t e = cuda.ipc_get_mem(&h, base);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(err_p, e,
                             "cuda: cudaIpcGetMemHandle(%p) on device %d: %s",
                             base, device);
    }
    memcpy(handle, &h, sizeof(h));
    return TP_OK;
}

tp_status
tp__cuda_ipc_mem_open(int device, const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                      void **base_p, tp_error **err_p)
{
    tp_status st = cuda_ipc_check(device, err_p, "ipc open");
    if (st != TP_OK) {
        return st;
    }
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    void *p = NULL;
    cudaError_t e = cuda.ipc_open_mem(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(
            err_p, e, "cuda: cudaIpcOpenMemHandle on device %d: %s", device);
    }
    *base_p = p;
    return TP_OK;
}

tp_status
tp__cuda_mem_range(int device, const void *ptr, void **base_p, size_t *size_p,
                   tp_error **err_p)
{
    tp_status st = cuda_ipc_check(device, err_p, "allocation range");
    if (st != TP_OK) {
        return st;
    }
    unsigned long long base = 0;
    size_t size = 0;
    unsigned int e =
        cuda.mem_range(&base, &size, (unsigned long long)(uintptr_t)ptr);
    if (e == 201) {
        // CUDA_ERROR_INVALID_CONTEXT: a runtime older than 12 does not make
        // the device's primary context current in cudaSetDevice; any
        // runtime call does. Once, then again.
        cuda.free(NULL);
        e = cuda.mem_range(&base, &size, (unsigned long long)(uintptr_t)ptr);
    }
    if (e != 0) {
        return tp__error_set(err_p, TP_EDEVICE,
                             "cuda: cuMemGetAddressRange(%p) on device %d: "
                             "driver error %u%s",
                             ptr, device, e,
                             e == 1     ? " (CUDA_ERROR_INVALID_VALUE: not "
                                          "device memory?)"
                             : e == 201 ? " (CUDA_ERROR_INVALID_CONTEXT)"
                                        : "");
    }
    *base_p = (void *)(uintptr_t)base;
    *size_p = size;
    return TP_OK;
}

bool
tp__cuda_probe(bool check_driver, char *why, size_t why_len)
{
    if (atomic_load_explicit(&cuda_loaded, memory_order_acquire) ||
        cuda_testing_path != NULL) {
        if (!tp__cuda_available(why, why_len)) {
            return false;
        }
        if (cuda.ipc_why[0] != '\0') {
            snprintf(why, why_len, "%s", cuda.ipc_why);
            return false;
        }
        return true;
    }
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis != NULL && (vis[0] == '\0' || strcmp(vis, "-1") == 0 ||
                        strcmp(vis, "none") == 0)) {
        snprintf(why, why_len, "CUDA_VISIBLE_DEVICES=\"%s\" hides every device",
                 vis);
        return false;
    }
    if (check_driver && access("/dev/nvidiactl", F_OK) != 0) {
        snprintf(why, why_len, "no NVIDIA driver here (/dev/nvidiactl: %s)",
                 strerror(errno));
        return false;
    }
    // Both libraries load (loading runs no CUDA code): the runtime, and
    // the driver's, which gives an allocation's range.
    void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (drv == NULL) {
        snprintf(why, why_len,
                 "the CUDA driver library (libcuda.so.1) could not be "
                 "loaded: %s",
                 dlerror());
        return false;
    }
    int drv_ver = -1;
    cuda_probe_version(drv, true, &drv_ver);
    dlclose(drv);
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12",
                                        "libcudart.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_LOCAL);
        if (h != NULL) {
            int rt_ver = -1;
            cuda_probe_version(h, false, &rt_ver);
            dlclose(h);
            return cuda_probe_versions(drv_ver, rt_ver, why, why_len);
        }
    }
    snprintf(why, why_len,
             "the CUDA runtime (libcudart.so) could not be loaded: %s",
             dlerror());
    return false;
}

void
tp__cuda_ipc_mem_close(int device, void *base)
{
    if (base == NULL || cuda_ipc_check(device, NULL, "ipc close") != TP_OK) {
        return;
    }
    cuda.ipc_close_mem(base);
}

tp_status
tp__cuda_event_create_ipc(int device, void **event_p, tp_error **err_p)
{
    tp_status st = cuda_ipc_check(device, err_p, "event");
    if (st != TP_OK) {
        return st;
    }
    cudaEvent_t ev = NULL;
    cudaError_t e =
        cuda.event_create(&ev, cudaEventDisableTiming | cudaEventInterprocess);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(err_p, e,
                             "cuda: cudaEventCreateWithFlags on device %d: %s",
                             device);
    }
    *event_p = (void *)ev;
    return TP_OK;
}

tp_status
tp__cuda_event_record(void *event, tp_error **err_p)
{
    tp_status st = cuda_ipc_check(-1, err_p, "event record");
    if (st != TP_OK) {
        return st;
    }
    cudaError_t e = cuda.event_record((cudaEvent_t)event, (cudaStream_t)0);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(err_p, e, "cuda: cudaEventRecord: %s");
    }
    return TP_OK;
}

tp_status
tp__cuda_event_export(void *event, uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                      tp_error **err_p)
{
    _Static_assert(sizeof(cudaIpcEventHandle_t) == TP_CUDA_IPC_HANDLE_LEN,
                   "cudaIpcEventHandle_t is 64 bytes");
    tp_status st = cuda_ipc_check(-1, err_p, "event export");
    if (st != TP_OK) {
        return st;
    }
    cudaIpcEventHandle_t h;
    cudaError_t e = cuda.ipc_get_event(&h, (cudaEvent_t)event);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(err_p, e, "cuda: cudaIpcGetEventHandle: %s");
    }
    memcpy(handle, &h, sizeof(h));
    return TP_OK;
}

tp_status
tp__cuda_event_open(int device, const uint8_t handle[TP_CUDA_IPC_HANDLE_LEN],
                    void **event_p, tp_error **err_p)
{
    tp_status st = cuda_ipc_check(device, err_p, "event open");
    if (st != TP_OK) {
        return st;
    }
    cudaIpcEventHandle_t h;
    memcpy(&h, handle, sizeof(h));
    cudaEvent_t ev = NULL;
    cudaError_t e = cuda.ipc_open_event(&ev, h);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(
            err_p, e, "cuda: cudaIpcOpenEventHandle on device %d: %s", device);
    }
    *event_p = (void *)ev;
    return TP_OK;
}

tp_status
tp__cuda_event_sync(void *event, tp_error **err_p)
{
    tp_status st = cuda_ipc_check(-1, err_p, "event wait");
    if (st != TP_OK) {
        return st;
    }
    cudaError_t e = cuda.event_sync((cudaEvent_t)event);
    if (e != cudaSuccess) {
        return CUDA_IPC_FAIL(err_p, e, "cuda: cudaEventSynchronize: %s");
    }
    return TP_OK;
}

void
tp__cuda_event_destroy(void *event)
{
    if (event != NULL && cuda.event_destroy != NULL) {
        cuda.event_destroy((cudaEvent_t)event);
    }
}

bool
tp__cuda_testing_use_runtime(const char *path)
{
    if (atomic_load_explicit(&cuda_loaded, memory_order_acquire)) {
        return false;
    }
    cuda_testing_path = path;
    return true;
}

#endif // TP_HAVE_CUDA
