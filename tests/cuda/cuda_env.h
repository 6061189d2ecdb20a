/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_env.h - which CUDA runtime a CUDA test uses. By default the fake
 * one (tests/cuda/fake_cudart.c, built next to the tests): the pipe and
 * RPC logic then runs for real on a machine without a GPU. With
 * TP_TEST_CUDA=real the system's libcudart is used and the cases skip
 * (77) with the reason where there is no device. Call cuda_env_setup()
 * first in every case (each case runs in its own forked process, before
 * anything loaded the runtime). */
#ifndef TP_TESTS_CUDA_ENV_H
#define TP_TESTS_CUDA_ENV_H

#include <dlfcn.h>
#include <stdbool.h>
#include <unistd.h>

#include <tpipe/tensor.h>

#include "core/cuda.h"
#include "tp_test.h"

// The devices the cases name: the host, and CUDA device @i.
static const tp_device cpu = {TP_DEVICE_CPU, 0};

static inline tp_device
gpu(int i)
{
    return (tp_device){TP_DEVICE_CUDA, i};
}

static inline bool
cuda_env_fake(void)
{
    const char *v = getenv("TP_TEST_CUDA");
    return v == NULL || strcmp(v, "real") != 0;
}

// Loads the runtime (fake or real); skips the case if no device.
static inline void
cuda_env_setup(void)
{
    if (cuda_env_fake()) {
        TP_CHECK(tp__cuda_testing_use_runtime(TP_FAKE_CUDART));
    }
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        tp_test_skip("no CUDA device (%s runtime): %s",
                     cuda_env_fake() ? "fake" : "real", why);
    }
}

// Calls the fake runtime's @name(out) (fake_cuda_counters,
// fake_cuda_ipc_counters); false with the real runtime.
static inline bool
cuda_env_fake_call(const char *name, long *out)
{
    if (!cuda_env_fake()) {
        return false;
    }
    void *h = dlopen(TP_FAKE_CUDART, RTLD_NOW | RTLD_NOLOAD);
    TP_CHECK(h != NULL);
    void *sym = dlsym(h, name);
    TP_CHECK(sym != NULL);
    void (*fn)(long *);
    memcpy(&fn, &sym, sizeof(sym));
    fn(out);
    dlclose(h);
    return true;
}

// The copies held at the fake runtime's copy gate now; closes (@set 1)
// or opens (0) the gate first, or only looks (-1). The case fails with
// the real runtime (skip such cases first: cuda_env_fake).
static inline long
cuda_env_copy_gate(long set)
{
    long io[2] = {set, 0};
    TP_CHECK(cuda_env_fake_call("fake_cuda_copy_gate", io));
    return io[1];
}

// The fake's copies so far by thread: [0] on a context's copy pool, [1]
// on its loop thread, [2] elsewhere (the test's own). False with the real
// runtime.
static inline bool
cuda_env_copy_threads(long out[3])
{
    return cuda_env_fake_call("fake_cuda_copy_threads", out);
}

// The fake's cudaMallocHost calls so far; -1 with the real runtime.
static inline long
cuda_env_host_allocs(void)
{
    long n = -1;
    return cuda_env_fake_call("fake_cuda_host_allocs", &n) ? n : -1;
}

// The fake's live page-locked allocations once they fell to @want, or as
// they are after @ms (the pipe frees staging on its context's pool, just
// after the read or write completed).
static inline long
cuda_env_pinned_settle(long want, int64_t ms)
{
    long c[7];
    for (int64_t t = 0;; t++) {
        TP_CHECK(cuda_env_fake_call("fake_cuda_counters", c));
        if (c[1] <= want || t >= ms) {
            return c[1];
        }
        usleep(1000);
    }
}

// The fake runtime's counters: [0] live device allocations, [1] live
// pinned ones, [2] h2d, [3] d2h, [4] d2d copies, [5] live streams, [6]
// device syncs. False with the real runtime.
static inline bool
cuda_env_counters(long out[7])
{
    return cuda_env_fake_call("fake_cuda_counters", out);
}

// The fake runtime's IPC counters: [0] handles opened so far, [1] mappings
// open now, [2] cudaStreamSynchronize calls, [3] handles exported so far.
// False with the real runtime.
static inline bool
cuda_env_ipc_counters(long out[4])
{
    return cuda_env_fake_call("fake_cuda_ipc_counters", out);
}

#endif
