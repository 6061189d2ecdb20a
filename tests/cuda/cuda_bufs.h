/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_bufs.h - what the CUDA pipe tests share: patterned buffers on a
 * device or the host (core/cuda.h), their check, and the pipe reads with
 * a deadline. Header-only, static inline. */
#ifndef TP_TESTS_CUDA_BUFS_H
#define TP_TESTS_CUDA_BUFS_H

#include <string.h>
#include <tpipe/pipe.h>

#include "core/alloc.h"
#include "core/cuda.h"
#include "tp_test.h"
#include "tp_test_op.h"
#include "tp_test_pipe.h"

#ifndef CUDA_BUFS_WAIT_MS
#define CUDA_BUFS_WAIT_MS 20000
#endif

// Pattern @seed over @n bytes.
static inline void
cuda_fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (uint8_t)(i * 31u + seed * 7u + (i >> 11));
    }
}

// @n bytes of pattern @seed at offset @off of a new allocation on @dev
// (the rest 0xee); *@base_p: the allocation, for cuda_buf_free.
static inline void *
cuda_buf_make(tp_device dev, size_t off, size_t n, unsigned seed, void **base_p)
{
    uint8_t *h = tp__alloc(off + n + 1);
    TP_CHECK(h != NULL);
    memset(h, 0xee, off + n + 1);
    cuda_fill(h + off, n, seed);
    if (dev.type == TP_DEVICE_CPU) {
        *base_p = h;
        return h + off;
    }
    void *d = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp__cuda_alloc(dev.index, off + n + 1, &d, &err), err);
    TP_CHECK_OK(tp__cuda_copy(d, dev.index, h, -1, off + n + 1, &err), err);
    tp__free(h);
    *base_p = d;
    return (uint8_t *)d + off;
}

static inline void
cuda_buf_free(tp_device dev, void *base)
{
    if (dev.type == TP_DEVICE_CPU) {
        tp__free(base);
    } else {
        tp__cuda_free(dev.index, base);
    }
}

// @p (@n bytes on @dev) holds pattern @seed.
static inline bool
cuda_buf_ok(tp_device dev, const void *p, size_t n, unsigned seed)
{
    uint8_t *want = tp__alloc(n + 1);
    uint8_t *got = tp__alloc(n + 1);
    TP_CHECK(want != NULL && got != NULL);
    cuda_fill(want, n, seed);
    tp_error *err = NULL;
    if (dev.type == TP_DEVICE_CPU) {
        memcpy(got, p, n);
    } else {
        TP_CHECK_OK(tp__cuda_copy(got, -1, p, dev.index, n, &err), err);
    }
    bool ok = memcmp(want, got, n) == 0;
    tp__free(want);
    tp__free(got);
    return ok;
}

// The next descriptor of @p (the read must succeed in time).
static inline tp_message *
cuda_read_desc(tp_pipe *p)
{
    return tp_test_read_desc(p, CUDA_BUFS_WAIT_MS);
}

// tp_pipe_read; returns its status, *@err_p the error (caller unrefs).
static inline tp_status
cuda_read_data(tp_pipe *p, tp_message *m, tp_error **err_p)
{
    op r;
    op_init(&r, CUDA_BUFS_WAIT_MS);
    tp_pipe_read(p, m, r.aio);
    op_wait(&r, CUDA_BUFS_WAIT_MS);
    tp_status st = tp_aio_status(r.aio);
    *err_p = tp_error_ref(tp_aio_error(r.aio));
    op_fini(&r);
    return st;
}

#endif
