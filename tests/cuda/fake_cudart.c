// SPDX-License-Identifier: Apache-2.0
// fake_cudart.c - a stand-in for libcudart, for tests on machines without
// a GPU (tests only; core/cuda.c loads it through
// tp__cuda_testing_use_runtime).
//
// It exports the runtime functions core/cuda.c resolves, with the
// signatures of cuda_runtime_api.h (included, so the compiler checks
// them). "Device memory" is host memory mapped PROT_NONE and tagged with
// its device: only this library's cudaMemcpy opens it (under a lock), so
// code that reads or writes a device pointer directly crashes, and a copy
// whose kind does not match its pointers fails with
// cudaErrorInvalidValue, as the real runtime would. Streams are already
// complete (every copy is synchronous). FAKE_CUDA_DEVICES sets the device
// count (default 2; 0 makes cudaGetDeviceCount fail like a machine with
// no GPU).
//
// IPC across processes: device memory is a POSIX shared memory object
// ("/tpfakecuda.<pid>.<n>", removed by cudaFree), and a memory handle
// carries its name, size and device, so cudaIpcOpenMemHandle in another
// process maps the same bytes (PROT_NONE too: only cudaMemcpy opens
// them). A process cannot open its own handle (like the real runtime).
// Events are already complete; an event handle names an interprocess
// event, and a handle not made by cudaIpcGetEventHandle is refused.
//
// fake_cuda_counters (not a CUDA function) lets tests see what happened:
// live device and pinned allocations, and copies per kind.

#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FAKE_MAX_ALLOCS 4096

typedef struct fake_alloc {
    uintptr_t fa_base;
    size_t fa_len;    // mapped bytes
    int fa_dev;       // -1: pinned host memory
    bool fa_opened;   // mapped by cudaIpcOpenMemHandle (not ours)
    char fa_name[48]; // device memory: its shared memory object
} fake_alloc;

#define FAKE_IPC_MAGIC "TPFKIPC1"
#define FAKE_EV_MAGIC  "TPFKEVT1"

// A memory handle: magic, u64 size, i32 device, the object's name.
typedef struct fake_mem_handle {
    char mh_magic[8];
    uint64_t mh_len;
    int32_t mh_dev;
    char mh_name[44];
} fake_mem_handle;
_Static_assert(sizeof(fake_mem_handle) <= sizeof(cudaIpcMemHandle_t),
               "fits a cudaIpcMemHandle_t");

struct CUevent_st {
    char ev_magic[8];
    bool ev_ipc;
};

static pthread_mutex_t fake_mtx = PTHREAD_MUTEX_INITIALIZER;
static fake_alloc fake_allocs[FAKE_MAX_ALLOCS];
static _Thread_local int fake_cur_dev;
// live dev, live pinned, h2d, d2h, d2d, streams, device syncs
static long fake_counts[7];
static long fake_host_allocs; // cudaMallocHost calls (not refused)
// cudaIpcOpenMemHandle calls that mapped something, mappings still open
static long fake_ipc_opens, fake_ipc_live, fake_ipc_exports;
// cudaStreamSynchronize calls
static long fake_stream_syncs;

static int
fake_ndev(void)
{
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (s == NULL || *s == '\0') {
        return 2;
    }
    int n = atoi(s);
    return n < 0 ? 0 : n > 16 ? 16 : n;
}

// The device allocation holding [p, p + n), or NULL (lock held).
static fake_alloc *
fake_find(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
        fake_alloc *f = &fake_allocs[i];
        if (f->fa_len > 0 && f->fa_dev >= 0 && a >= f->fa_base &&
            a - f->fa_base < f->fa_len && n <= f->fa_len - (a - f->fa_base)) {
            return f;
        }
    }
    return NULL;
}

static bool
fake_is_dev(const void *p)
{
    return fake_find(p, 0) != NULL;
}

static cudaError_t
fake_add(void **ptr, size_t size, int dev)
{
    if (ptr == NULL) {
        return cudaErrorInvalidValue;
    }
    size_t len = size == 0 ? 1 : size;
    static _Atomic unsigned long seq;
    char name[48] = "";
    void *p = MAP_FAILED;
    if (dev >= 0) {
        snprintf(name, sizeof(name), "/tpfakecuda.%d.%lu", (int)getpid(),
                 seq++);
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno == EEXIST) {
            // Our pid in the name: left by a killed process whose pid
            // this one reuses (a test's SIGKILLed child), never a live one.
            shm_unlink(name);
            fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        }
        if (fd < 0) {
            return cudaErrorMemoryAllocation;
        }
        if (ftruncate(fd, (off_t)len) == 0) {
            p = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
        }
        close(fd);
        if (p == MAP_FAILED) {
            shm_unlink(name);
        }
    } else {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
    }
    if (p == MAP_FAILED) {
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&fake_mtx);
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
        if (fake_allocs[i].fa_len == 0) {
            fake_allocs[i] = (fake_alloc){(uintptr_t)p, len, dev, false, ""};
            memcpy(fake_allocs[i].fa_name, name, sizeof(name));
            fake_counts[dev >= 0 ? 0 : 1]++;
            pthread_mutex_unlock(&fake_mtx);
            *ptr = p;
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&fake_mtx);
    munmap(p, len);
    if (name[0] != '\0') {
        shm_unlink(name);
    }
    return cudaErrorMemoryAllocation;
}

// Frees a device or pinned allocation, or (@opened) unmaps an opened one.
static cudaError_t
fake_remove_as(void *p, bool dev, bool opened)
{
    if (p == NULL) {
        return cudaSuccess;
    }
    pthread_mutex_lock(&fake_mtx);
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
        fake_alloc *f = &fake_allocs[i];
        if (f->fa_len > 0 && f->fa_base == (uintptr_t)p &&
            (f->fa_dev >= 0) == dev && f->fa_opened == opened) {
            munmap(p, f->fa_len);
            f->fa_len = 0;
            if (!opened && f->fa_name[0] != '\0') {
                shm_unlink(f->fa_name);
            }
            fake_counts[dev ? 0 : 1] -= !opened;
            fake_ipc_live -= opened;
            pthread_mutex_unlock(&fake_mtx);
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&fake_mtx);
    return cudaErrorInvalidValue;
}

static cudaError_t
fake_remove(void *p, bool dev)
{
    return fake_remove_as(p, dev, false);
}

// cuDriverGetVersion (the driver's; FAKE_CUDA_DRIVER_VERSION, default
// this runtime's version) and cudaRuntimeGetVersion (the headers'):
// core/cuda.c compares them without initialising CUDA.
unsigned int cuDriverGetVersion(int *version);

unsigned int
cuDriverGetVersion(int *version)
{
    const char *v = getenv("FAKE_CUDA_DRIVER_VERSION");
    *version = v != NULL ? atoi(v) : CUDART_VERSION;
    return 0;
}

cudaError_t
cudaRuntimeGetVersion(int *runtimeVersion)
{
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t
cudaGetDeviceCount(int *count)
{
    int n = fake_ndev();
    *count = n;
    return n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t
cudaSetDevice(int device)
{
    if (device < 0 || device >= fake_ndev()) {
        return cudaErrorInvalidDevice;
    }
    fake_cur_dev = device;
    return cudaSuccess;
}

cudaError_t
cudaMalloc(void **devPtr, size_t size)
{
    return fake_add(devPtr, size, fake_cur_dev);
}

cudaError_t
cudaFree(void *devPtr)
{
    return fake_remove(devPtr, true);
}

cudaError_t
cudaMallocHost(void **ptr, size_t size)
{
    // FAKE_CUDA_NO_PINNED=1: page-locked memory is refused (its limit).
    const char *np = getenv("FAKE_CUDA_NO_PINNED");
    if (np != NULL && strcmp(np, "1") == 0) {
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&fake_mtx);
    fake_host_allocs++;
    pthread_mutex_unlock(&fake_mtx);
    return fake_add(ptr, size, -1);
}

// Tests: successful or not, cudaMallocHost calls so far.
void fake_cuda_host_allocs(long out[1]);

void
fake_cuda_host_allocs(long out[1])
{
    pthread_mutex_lock(&fake_mtx);
    out[0] = fake_host_allocs;
    pthread_mutex_unlock(&fake_mtx);
}

cudaError_t
cudaFreeHost(void *ptr)
{
    return fake_remove(ptr, false);
}

static void
fake_open(void *p, size_t n, int prot)
{
    fake_alloc *f = fake_find(p, n);
    if (f != NULL) {
        mprotect((void *)f->fa_base, f->fa_len, prot);
    }
}

// A gate tests close to hold copies where they start (a copy that takes
// its time, or hangs): fake_cuda_copy_gate(io) closes it (io[0] 1), opens
// it (0) or only looks (-1); io[1] is then the copies waiting at it. A
// copy waits at most 30 s, then goes on.
static pthread_mutex_t fake_gate_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_gate_cv = PTHREAD_COND_INITIALIZER;
static bool fake_gate_closed;
static long fake_gate_waiting;

void fake_cuda_copy_gate(long io[2]);

void
fake_cuda_copy_gate(long io[2])
{
    pthread_mutex_lock(&fake_gate_mtx);
    if (io[0] >= 0) {
        fake_gate_closed = io[0] != 0;
        pthread_cond_broadcast(&fake_gate_cv);
    }
    io[1] = fake_gate_waiting;
    pthread_mutex_unlock(&fake_gate_mtx);
}

static void
fake_gate_pass(void)
{
    pthread_mutex_lock(&fake_gate_mtx);
    if (fake_gate_closed) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 30;
        fake_gate_waiting++;
        while (fake_gate_closed &&
               pthread_cond_timedwait(&fake_gate_cv, &fake_gate_mtx, &dl) ==
                   0) {
        }
        fake_gate_waiting--;
    }
    pthread_mutex_unlock(&fake_gate_mtx);
}

// Copies by the thread that made them: [0] a pipe context's copy pool
// ("tp-copy-N"), [1] its loop thread ("tp-ctx"), [2] another.
static long fake_copy_threads[3];

void fake_cuda_copy_threads(long out[3]);

void
fake_cuda_copy_threads(long out[3])
{
    pthread_mutex_lock(&fake_mtx);
    memcpy(out, fake_copy_threads, sizeof(fake_copy_threads));
    pthread_mutex_unlock(&fake_mtx);
}

static int
fake_thread_kind(void)
{
    char name[16] = "";
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return strncmp(name, "tp-copy-", 8) == 0 ? 0
           : strcmp(name, "tp-ctx") == 0     ? 1
                                             : 2;
}

cudaError_t
cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if (count == 0) {
        return cudaSuccess;
    }
    fake_gate_pass();
    int thread_kind = fake_thread_kind();
    pthread_mutex_lock(&fake_mtx);
    bool ddev = fake_find(dst, count) != NULL;
    bool sdev = fake_find(src, count) != NULL;
    // A pointer inside a device allocation whose range runs past its end.
    bool bad = (!ddev && fake_is_dev(dst)) || (!sdev && fake_is_dev(src));
    switch (kind) {
    case cudaMemcpyHostToDevice:
        bad = bad || !ddev || sdev;
        break;
    case cudaMemcpyDeviceToHost:
        bad = bad || ddev || !sdev;
        break;
    case cudaMemcpyDeviceToDevice:
        bad = bad || !ddev || !sdev;
        break;
    case cudaMemcpyDefault:
        break;
    default:
        bad = bad || ddev || sdev;
        break;
    }
    if (bad) {
        pthread_mutex_unlock(&fake_mtx);
        return cudaErrorInvalidValue;
    }
    fake_open(dst, count, PROT_READ | PROT_WRITE);
    fake_open((void *)(uintptr_t)src, count, PROT_READ | PROT_WRITE);
    memmove(dst, src, count);
    fake_open(dst, count, PROT_NONE);
    fake_open((void *)(uintptr_t)src, count, PROT_NONE);
    fake_counts[ddev && sdev ? 4 : ddev ? 2 : sdev ? 3 : 2]++;
    fake_copy_threads[thread_kind]++;
    pthread_mutex_unlock(&fake_mtx);
    return cudaSuccess;
}

const char *
cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error (fake runtime)";
    case cudaErrorInvalidValue:
        return "invalid argument (fake runtime)";
    case cudaErrorMemoryAllocation:
        return "out of memory (fake runtime)";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal (fake runtime)";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected (fake runtime, "
               "FAKE_CUDA_DEVICES=0)";
    default:
        return "unknown error (fake runtime)";
    }
}

cudaError_t
cudaDeviceSynchronize(void)
{
    pthread_mutex_lock(&fake_mtx);
    fake_counts[6]++;
    pthread_mutex_unlock(&fake_mtx);
    return cudaSuccess; // every copy is synchronous: nothing is queued
}

cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    (void)flags;
    static char streams[64];
    pthread_mutex_lock(&fake_mtx);
    fake_counts[5]++;
    *pStream = (cudaStream_t)(void *)&streams[fake_cur_dev % 64];
    pthread_mutex_unlock(&fake_mtx);
    return cudaSuccess;
}

cudaError_t
cudaStreamSynchronize(cudaStream_t stream)
{
    (void)stream;
    pthread_mutex_lock(&fake_mtx);
    fake_stream_syncs++;
    pthread_mutex_unlock(&fake_mtx);
    return cudaSuccess; // every copy is synchronous: nothing is queued
}

cudaError_t
cudaStreamQuery(cudaStream_t stream)
{
    (void)stream;
    return cudaSuccess; // every copy is synchronous: nothing is queued
}

cudaError_t
cudaStreamDestroy(cudaStream_t stream)
{
    (void)stream;
    pthread_mutex_lock(&fake_mtx);
    fake_counts[5]--;
    pthread_mutex_unlock(&fake_mtx);
    return cudaSuccess;
}

// Tests: live device allocations, live pinned allocations, host-to-device,
// device-to-host and device-to-device copies, live streams, calls of
// cudaDeviceSynchronize.
void fake_cuda_counters(long out[7]);

void
fake_cuda_counters(long out[7])
{
    pthread_mutex_lock(&fake_mtx);
    memcpy(out, fake_counts, sizeof(fake_counts));
    pthread_mutex_unlock(&fake_mtx);
}

// Tests: [0] successful cudaIpcOpenMemHandle calls, [1] mappings open now,
// [2] cudaStreamSynchronize calls, [3] successful cudaIpcGetMemHandle calls.
void fake_cuda_ipc_counters(long out[4]);

void
fake_cuda_ipc_counters(long out[4])
{
    pthread_mutex_lock(&fake_mtx);
    out[0] = fake_ipc_opens;
    out[1] = fake_ipc_live;
    out[2] = fake_stream_syncs;
    out[3] = fake_ipc_exports;
    pthread_mutex_unlock(&fake_mtx);
}

cudaError_t
cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    fake_mem_handle h;
    memset(&h, 0, sizeof(h));
    // FAKE_CUDA_NO_IPC_EXPORT=1: memory legacy IPC cannot share (VMM).
    const char *ne = getenv("FAKE_CUDA_NO_IPC_EXPORT");
    if (ne != NULL && strcmp(ne, "1") == 0) {
        return cudaErrorInvalidValue;
    }
    pthread_mutex_lock(&fake_mtx);
    fake_alloc *f = fake_find(devPtr, 0);
    if (f == NULL || f->fa_opened || f->fa_base != (uintptr_t)devPtr) {
        pthread_mutex_unlock(&fake_mtx);
        return cudaErrorInvalidValue; // the fake wants an allocation's base
    }
    memcpy(h.mh_magic, FAKE_IPC_MAGIC, 8);
    h.mh_len = f->fa_len;
    h.mh_dev = f->fa_dev;
    snprintf(h.mh_name, sizeof(h.mh_name), "%s", f->fa_name);
    fake_ipc_exports++;
    pthread_mutex_unlock(&fake_mtx);
    memset(handle, 0, sizeof(*handle));
    memcpy(handle, &h, sizeof(h));
    return cudaSuccess;
}

cudaError_t
cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
                     unsigned int flags)
{
    (void)flags;
    fake_mem_handle h;
    memcpy(&h, &handle, sizeof(h));
    char own[32];
    snprintf(own, sizeof(own), "/tpfakecuda.%d.", (int)getpid());
    if (memcmp(h.mh_magic, FAKE_IPC_MAGIC, 8) != 0 ||
        memchr(h.mh_name, '\0', sizeof(h.mh_name)) == NULL ||
        strncmp(h.mh_name, "/tpfakecuda.", 12) != 0 ||
        strncmp(h.mh_name, own, strlen(own)) == 0 || h.mh_len == 0) {
        return cudaErrorInvalidValue;
    }
    int fd = shm_open(h.mh_name, O_RDWR, 0);
    if (fd < 0) {
        return cudaErrorInvalidValue;
    }
    struct stat sb;
    void *p = MAP_FAILED;
    if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size == h.mh_len) {
        p = mmap(NULL, (size_t)h.mh_len, PROT_NONE, MAP_SHARED, fd, 0);
    }
    close(fd);
    if (p == MAP_FAILED) {
        return cudaErrorInvalidValue;
    }
    pthread_mutex_lock(&fake_mtx);
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
        if (fake_allocs[i].fa_len == 0) {
            fake_allocs[i] = (fake_alloc){(uintptr_t)p, (size_t)h.mh_len,
                                          fake_cur_dev, true, ""};
            fake_ipc_opens++;
            fake_ipc_live++;
            pthread_mutex_unlock(&fake_mtx);
            *devPtr = p;
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&fake_mtx);
    munmap(p, (size_t)h.mh_len);
    return cudaErrorMemoryAllocation;
}

cudaError_t
cudaIpcCloseMemHandle(void *devPtr)
{
    return fake_remove_as(devPtr, true, true);
}

cudaError_t
cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (ev == NULL) {
        return cudaErrorMemoryAllocation;
    }
    memcpy(ev->ev_magic, FAKE_EV_MAGIC, 8);
    ev->ev_ipc = (flags & cudaEventInterprocess) != 0;
    *event = ev;
    return cudaSuccess;
}

cudaError_t
cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    (void)stream;
    return event != NULL ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t
cudaEventSynchronize(cudaEvent_t event)
{
    // every copy is synchronous: recorded work has finished
    return event != NULL ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t
cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

cudaError_t
cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    if (event == NULL || !event->ev_ipc) {
        return cudaErrorInvalidValue; // needs cudaEventInterprocess
    }
    memset(handle, 0, sizeof(*handle));
    memcpy(handle, FAKE_EV_MAGIC, 8);
    return cudaSuccess;
}

cudaError_t
cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    if (memcmp(&handle, FAKE_EV_MAGIC, 8) != 0) {
        return cudaErrorInvalidValue;
    }
    return cudaEventCreateWithFlags(event, cudaEventInterprocess);
}

// The driver's cuMemGetAddressRange_v2 (core/cuda.c finds it in the fake
// when tests load it): the device allocation holding @dptr, ours or
// opened from a handle. 1 (CUDA_ERROR_INVALID_VALUE) when there is none.
unsigned int cuMemGetAddressRange_v2(unsigned long long *pbase, size_t *psize,
                                     unsigned long long dptr);

unsigned int
cuMemGetAddressRange_v2(unsigned long long *pbase, size_t *psize,
                        unsigned long long dptr)
{
    pthread_mutex_lock(&fake_mtx);
    fake_alloc *f = fake_find((const void *)(uintptr_t)dptr, 0);
    if (f == NULL) {
        pthread_mutex_unlock(&fake_mtx);
        return 1;
    }
    if (pbase != NULL) {
        *pbase = f->fa_base;
    }
    if (psize != NULL) {
        *psize = f->fa_len;
    }
    pthread_mutex_unlock(&fake_mtx);
    return 0;
}
