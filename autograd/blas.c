// SPDX-License-Identifier: Apache-2.0
// blas.c - BLAS (cblas_sgemm/dgemm) for matmul, loaded at first use.
//
// OpenBLAS chooses its kernels when it is loaded: from OPENBLAS_CORETYPE,
// else from the CPU model it recognises. A CPU newer than the OpenBLAS
// build falls back to generic SSE3 kernels ("Prescott"): on this project's
// machines that is 27 GFLOP/s for a 256^3 sgemm against 110-130 with the
// AVX-512 kernels the CPU supports (docs/training.md). So the library is
// not linked against BLAS: when this library is loaded, and the user has
// not set OPENBLAS_CORETYPE, it names the kernel set the CPU's features
// allow (SKYLAKEX with AVX-512 F/BW/DQ/VL, HASWELL with AVX2 and FMA), and
// the first matmul loads BLAS with dlopen. TP_BLAS_CORETYPE=keep leaves
// OpenBLAS to its own detection; TP_BLAS=off uses the built-in blocked
// kernel. Without a loadable BLAS the built-in kernel is used.

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"
#include "log.h"

#if TP_HAVE_BLAS
#include <cblas.h>
#endif

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static tp__sgemm_fn blas_sgemm;
static tp__dgemm_fn blas_dgemm;
static const char *blas_coretype; // what this library asked for, or NULL

// The OpenBLAS kernel set this CPU supports, or NULL (OpenBLAS decides).
static const char *
pick_coretype(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")) {
        return "SKYLAKEX";
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return "HASWELL";
    }
#endif
    return NULL;
}

// At load time (before the program starts threads, usually): the variable
// must be set before OpenBLAS is loaded, which happens at first use.
__attribute__((constructor)) static void
blas_set_coretype(void)
{
#if TP_HAVE_BLAS
    const char *keep = getenv("TP_BLAS_CORETYPE");
    if (getenv("OPENBLAS_CORETYPE") != NULL ||
        (keep != NULL && strcmp(keep, "keep") == 0)) {
        return;
    }
    const char *c = pick_coretype();
    if (c != NULL && setenv("OPENBLAS_CORETYPE", c, 0) == 0) {
        blas_coretype = c;
    }
#endif
}

static void
blas_load(void)
{
#if TP_HAVE_BLAS
    const char *off = getenv("TP_BLAS");
    if (off != NULL && strcmp(off, "off") == 0) {
        return;
    }
    static const char *const names[] = {
        "libopenblas.so.0",
        "libopenblas.so",
        "libcblas.so.3",
        "libblas.so.3",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h == NULL) {
            continue;
        }
        // dlsym returns an object pointer; ISO C has no conversion to a
        // function pointer, so copy the representation (POSIX allows it).
        void *ps = dlsym(h, "cblas_sgemm");
        void *pd = dlsym(h, "cblas_dgemm");
        tp__sgemm_fn s = NULL;
        tp__dgemm_fn d = NULL;
        memcpy(&s, &ps, sizeof(s));
        memcpy(&d, &pd, sizeof(d));
        if (s != NULL && d != NULL) {
            blas_sgemm = s;
            blas_dgemm = d;
            TP_LOG_DEBUG("TP-BLAS", "matmul uses %s (OPENBLAS_CORETYPE %s%s)",
                         names[i],
                         getenv("OPENBLAS_CORETYPE") != NULL
                             ? getenv("OPENBLAS_CORETYPE")
                             : "unset",
                         blas_coretype != NULL ? ", set by tpipe" : "");
            return; // kept loaded for the process's life
        }
        dlclose(h);
    }
    const char *why = dlerror();
    TP_LOG_DEBUG("TP-BLAS",
                 "no BLAS could be loaded (%s): matmul uses the built-in "
                 "blocked kernel",
                 why != NULL ? why : "no cblas_sgemm/cblas_dgemm");
#endif
}

tp__sgemm_fn
tp__blas_sgemm(void)
{
    pthread_once(&blas_once, blas_load);
    return blas_sgemm;
}

tp__dgemm_fn
tp__blas_dgemm(void)
{
    pthread_once(&blas_once, blas_load);
    return blas_dgemm;
}

const char *
tp__blas_coretype(void)
{
    return blas_coretype;
}
