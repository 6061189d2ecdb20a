// SPDX-License-Identifier: Apache-2.0
// pipe_cuda.c - CUDA tensors on a pipe: the cuda_basic path (and, when the
// pipe has a device channel such as cuda_ipc, the checks, allocations and
// synchronisation that path shares with it). A tensor on
// a CUDA device is staged through page-locked host memory: the writer
// copies it device-to-host when its write starts and sends the host copy
// on the pipe's CPU channel (inline or channel, as any tensor); the
// descriptor carries the sender's device. The reader receives a tensor
// whose destination is a CUDA device into a host staging buffer and
// copies it host-to-device once the message's bytes are in. Either side
// may be the CPU, so every device pair (CPU/CUDA both ways, CUDA/CUDA)
// works with any CPU channel. Every CUDA call goes through core/cuda.c.
//
// Before staging, the writer synchronises each source device
// (cudaDeviceSynchronize), so a tensor still being written by work on any
// stream is complete before it is read; the reader's host-to-device copy
// has returned before the read completes, so its user never sees a
// tensor still being written either. The copies are synchronous
// (cudaMemcpy): tp__pipe_cuda_stage_out and tp__pipe_cuda_copy_in run on
// the context's copy pool (pipe_write.c, pipe_read.c), touching only the
// message and its staging; the rest runs on the loop thread.

#include <inttypes.h>
#include <string.h>

#include "core/alloc.h"
#include "core/cuda.h"
#include "core/log.h"
#include "pipe_impl.h"

tp_status
tp__pipe_cuda_check(const tp_msg_buf *b, const char *what, uint32_t i,
                    tp_error **err_p)
{
    if (b->device.type == TP_DEVICE_CPU) {
        if (b->device.index != 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s %" PRIu32 ": cpu device index %d (only 0)",
                                 what, i, b->device.index);
        }
        return TP_OK;
    }
    if (b->device.type != TP_DEVICE_CUDA) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s %" PRIu32 ": device type %d is not cpu or "
                             "cuda",
                             what, i, (int)b->device.type);
    }
    char why[256];
    if (!tp__cuda_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s %" PRIu32 " on cuda:%d: CUDA is not usable "
                             "here: %s",
                             what, i, b->device.index, why);
    }
    int n = tp__cuda_device_count();
    if (b->device.index < 0 || b->device.index >= n ||
        b->device.index > UINT8_MAX) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s %" PRIu32 " on cuda:%d: no such device (%d "
                             "here)",
                             what, i, b->device.index, n);
    }
    return TP_OK;
}

void
tp__pipe_cuda_free_stage(tp__cuda_stage *stage, uint32_t n)
{
    if (stage == NULL) {
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (stage[i].cs_pinned) {
            tp__cuda_host_free(stage[i].cs_host);
        } else {
            tp__free(stage[i].cs_host);
        }
    }
    tp__free(stage);
}

// ---- the context's page-locked buffers (tp__pinned_cache) ---------------

void
tp__pinned_cache_init(tp__pinned_cache *c, uint64_t cap)
{
    memset(c, 0, sizeof(*c));
    tp__mtx_init(&c->pc_mtx);
    c->pc_cap = cap;
}

// Frees every kept buffer (cudaFreeHost, outside the lock). NULL is fine.
static void
pinned_drain(tp__pinned_cache *c)
{
    if (c == NULL) {
        return;
    }
    void *lists[TP_PINNED_CLASSES];
    tp__mtx_lock(&c->pc_mtx);
    memcpy(lists, c->pc_free, sizeof(lists));
    memset(c->pc_free, 0, sizeof(c->pc_free));
    c->pc_bytes = 0;
    tp__mtx_unlock(&c->pc_mtx);
    for (unsigned k = 0; k < TP_PINNED_CLASSES; k++) {
        void *b = lists[k];
        while (b != NULL) {
            void *next;
            memcpy(&next, b, sizeof(next));
            tp__cuda_host_free(b);
            b = next;
        }
    }
}

void
tp__pinned_cache_fini(tp__pinned_cache *c)
{
    pinned_drain(c);
    tp__mtx_fini(&c->pc_mtx);
}

_Static_assert(sizeof(size_t) >= 8, "classes up to 1 TiB");

// The class of a buffer for @n bytes: its size (a power of two, at least
// 4 KiB) into *@size_p; -1 when @c keeps nothing or a buffer that size
// could never be kept (larger than the cache): then it is allocated at its
// exact size, not rounded up.
static int
pinned_class(const tp__pinned_cache *c, size_t n, size_t *size_p)
{
    if (c == NULL || c->pc_cap == 0) {
        return -1;
    }
    for (int k = 0; k < TP_PINNED_CLASSES; k++) {
        size_t size = (size_t)1 << (TP_PINNED_MIN_SHIFT + k);
        if (size > c->pc_cap) {
            return -1;
        }
        if (n <= size) {
            *size_p = size;
            return k;
        }
    }
    return -1;
}

// A kept buffer of class @k, or NULL.
static void *
pinned_get(tp__pinned_cache *c, int k)
{
    tp__mtx_lock(&c->pc_mtx);
    void *b = c->pc_free[k];
    if (b != NULL) {
        memcpy(&c->pc_free[k], b, sizeof(void *));
        c->pc_bytes -= (size_t)1 << (TP_PINNED_MIN_SHIFT + k);
    }
    tp__mtx_unlock(&c->pc_mtx);
    return b;
}

// Keeps @b (@size bytes, page-locked) if it is of a class and there is
// room; false: the caller frees it.
static bool
pinned_put(tp__pinned_cache *c, void *b, size_t size)
{
    size_t want = 0;
    int k = pinned_class(c, size, &want);
    if (k < 0 || want != size) {
        return false;
    }
    tp__mtx_lock(&c->pc_mtx);
    bool keep = c->pc_bytes + size <= c->pc_cap;
    if (keep) {
        memcpy(b, &c->pc_free[k], sizeof(void *));
        c->pc_free[k] = b;
        c->pc_bytes += size;
    }
    tp__mtx_unlock(&c->pc_mtx);
    return keep;
}

// ---- staging buffers ------------------------------------------------------

typedef struct stage_free {
    tp__cuda_stage *sf_stage;
    uint32_t sf_n;
} stage_free;

// Pool thread.
static void
stage_free_job(void *arg)
{
    stage_free *sf = arg;
    tp__pipe_cuda_free_stage(sf->sf_stage, sf->sf_n);
    tp__free(sf);
}

void
tp__pipe_cuda_release_stage(tp_context *ctx, const tp_message *m,
                            tp__cuda_stage *stage)
{
    uint32_t n = m->ntensors;
    uint64_t pinned = 0;
    for (uint32_t i = 0; stage != NULL && i < n; i++) {
        if (!stage[i].cs_pinned || stage[i].cs_host == NULL) {
            continue;
        }
        if (pinned_put(&ctx->x_pinned, stage[i].cs_host, stage[i].cs_size)) {
            stage[i].cs_host = NULL; // kept for the next message
        } else {
            pinned += m->tensors[i].len;
        }
    }
    stage_free *sf = pinned > (uint64_t)ctx->x_cfg.pipe_cuda_loop_max
                         ? tp__alloc(sizeof(*sf))
                         : NULL;
    if (sf != NULL) {
        *sf = (stage_free){stage, n};
        if (tp__pool_submit_fn(ctx->x_pool, stage_free_job, sf) == TP_OK) {
            return;
        }
        tp__free(sf);
    }
    tp__pipe_cuda_free_stage(stage, n);
}

// A host buffer of @n bytes for tensor @i into @s: page-locked (the copy
// is a DMA), else (cudaMallocHost failed: the pinned limit, no memory
// left for it) pageable memory, which the runtime copies through its own
// bounce buffer, slower but it works. TP_ENOMEM when neither is there.
static tp_status
stage_host(tp__pinned_cache *cache, size_t n, tp__cuda_stage *s,
           const char *side, uint32_t i, tp_error **err_p)
{
    size_t size = n;
    int k = pinned_class(cache, n, &size);
    s->cs_host = k >= 0 ? pinned_get(cache, k) : NULL;
    s->cs_size = size;
    if (s->cs_host != NULL) {
        s->cs_pinned = true;
        return TP_OK;
    }
    tp_error *e = NULL;
    if (tp__cuda_host_alloc(size, &s->cs_host, &e) == TP_OK) {
        s->cs_pinned = true;
        return TP_OK;
    }
    // Refused (the page-locked limit): the kept buffers of other sizes
    // go, and the exact size is tried once more.
    tp_error_unref(e);
    e = NULL;
    pinned_drain(cache);
    s->cs_size = n;
    if (tp__cuda_host_alloc(n, &s->cs_host, &e) == TP_OK) {
        s->cs_pinned = true;
        return TP_OK;
    }
    TP_LOG_DEBUG("TP-CUDA-PAGEABLE",
                 "%s: tensor %" PRIu32 ": %zu bytes of page-locked memory "
                 "refused (%s): staging through pageable memory",
                 side, i, n, tp_error_message(e));
    tp_error_unref(e);
    s->cs_pinned = false;
    s->cs_host = tp__alloc(n ? n : 1);
    if (s->cs_host == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "%s: tensor %" PRIu32 ": out of memory for %zu "
                             "bytes of cuda staging",
                             side, i, n);
    }
    return TP_OK;
}

tp_status
tp__pipe_cuda_stage_out(tp__pinned_cache *cache, const tp_message *m,
                        const bool *via, tp__cuda_stage **stage_p,
                        tp_error **err_p)
{
    *stage_p = NULL;
    tp__cuda_stage *stage = NULL;
    uint64_t synced = 0; // devices below 64 already synchronised
    for (uint32_t i = 0; i < m->ntensors; i++) {
        const tp_msg_buf *b = &m->tensors[i];
        if (b->device.type != TP_DEVICE_CUDA || b->len == 0) {
            continue;
        }
        // Work queued on any stream of the device (a kernel still writing
        // the tensor, on a non-blocking stream too) finishes first.
        int dev = b->device.index;
        if (dev >= 64 || (synced & (UINT64_C(1) << dev)) == 0) {
            tp_status sst = tp__cuda_device_sync(dev, err_p);
            if (sst != TP_OK) {
                tp__pipe_cuda_free_stage(stage, m->ntensors);
                return tp__error_wrap(
                    err_p, sst, "write: tensor %" PRIu32 " on cuda:%d", i, dev);
            }
            synced |= dev < 64 ? UINT64_C(1) << dev : 0;
        }
        if (via != NULL && via[i]) {
            continue; // the device channel reads the device memory itself
        }
        if (stage == NULL) {
            stage = tp__zalloc(m->ntensors * sizeof(*stage));
            if (stage == NULL) {
                return tp__error_set(err_p, TP_ENOMEM,
                                     "write: out of memory (cuda staging)");
            }
        }
        tp_status st =
            stage_host(cache, (size_t)b->len, &stage[i], "write", i, err_p);
        if (st == TP_OK) {
            st = tp__cuda_copy(stage[i].cs_host, -1, b->data, b->device.index,
                               (size_t)b->len, err_p);
        }
        if (st != TP_OK) {
            tp__pipe_cuda_free_stage(stage, m->ntensors);
            tp__error_wrap(err_p, st,
                           "write: tensor %" PRIu32 " on cuda:%d: staging "
                           "to host memory",
                           i, b->device.index);
            return st;
        }
    }
    *stage_p = stage;
    return TP_OK;
}

tp_status
tp__pipe_cuda_stage_in(tp__pinned_cache *cache, tp_message *m, const bool *via,
                       tp__cuda_stage **stage_p, tp_error **stage_err_p,
                       tp_error **err_p)
{
    *stage_p = NULL;
    *stage_err_p = NULL;
    tp__cuda_stage *stage = NULL;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        tp_msg_buf *b = &m->tensors[i];
        if (b->device.type == TP_DEVICE_CPU || b->len == 0) {
            continue;
        }
        if (stage == NULL) {
            stage = tp__zalloc(m->ntensors * sizeof(*stage));
            if (stage == NULL) {
                return tp__error_set(err_p, TP_ENOMEM,
                                     "read: out of memory (cuda staging)");
            }
        }
        // The bytes arrive whatever happens: a destination that cannot be
        // used fails this read (once they are in), not the pipe.
        tp_error *e = NULL;
        tp_status st = tp__pipe_cuda_check(b, "tensor", i, &e);
        if (st == TP_OK && b->data == NULL) {
            st = tp__cuda_alloc(b->device.index, (size_t)b->len, &b->data, &e);
            b->pipe_owned = st == TP_OK;
        }
        if (st == TP_OK && via != NULL && via[i]) {
            continue; // the device channel writes the device memory itself
        }
        if (st == TP_OK) {
            if (stage_host(cache, (size_t)b->len, &stage[i], "read", i,
                           err_p) != TP_OK) {
                tp__pipe_cuda_free_stage(stage, m->ntensors);
                return TP_ENOMEM;
            }
            stage[i].cs_copy = true;
        }
        if (st != TP_OK) {
            if (*stage_err_p == NULL) {
                tp__error_wrap(&e, st, "read: tensor %" PRIu32, i);
                *stage_err_p = e;
            } else {
                tp_error_unref(e);
            }
            // Somewhere for the bytes that are coming.
            stage[i].cs_host = tp__alloc((size_t)b->len);
            if (stage[i].cs_host == NULL) {
                tp__pipe_cuda_free_stage(stage, m->ntensors);
                return tp__error_set(err_p, TP_ENOMEM,
                                     "read: out of memory (cuda staging)");
            }
        }
    }
    *stage_p = stage;
    return TP_OK;
}

tp_status
tp__pipe_cuda_copy_in(tp_message *m, const tp__cuda_stage *stage,
                      tp_error **err_p)
{
    for (uint32_t i = 0; stage != NULL && i < m->ntensors; i++) {
        tp_msg_buf *b = &m->tensors[i];
        if (!stage[i].cs_copy) {
            continue;
        }
        tp_status st = tp__cuda_copy(b->data, b->device.index, stage[i].cs_host,
                                     -1, (size_t)b->len, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "read: tensor %" PRIu32 " to cuda:%d: copying "
                           "from host memory",
                           i, b->device.index);
            return st;
        }
    }
    return TP_OK;
}
