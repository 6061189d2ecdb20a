// SPDX-License-Identifier: Apache-2.0
// pipe_write.c - the write engine: a queue of pipe_wop; the one
// whose main-connection bytes are being submitted is p_wcursor, so the
// connection's byte order is the message order; a write completes, in
// order, when its connection bytes are out and its channel ops are done.
// Such a write completes OK even if the pipe fails later (or meanwhile,
// before its completion is seen): the peer has its bytes, and a failure
// that comes after (the peer exited, a channel's own connection broke)
// is not this write's. A write with bytes still to send, or whose channel
// op failed, fails with the pipe's error.
//
// Everything runs on the context's loop thread (x_loop; see pipe_impl.h)
// but the synchronisation and staging of a message's CUDA tensors, which
// run on the context's copy pool (wop_prep) while the writes behind it
// wait.

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "pipe_impl.h"

#define PIPE_COALESCE_MAX 65536u // payload bytes copied after a descriptor

// ---- writes ----------------------------------------------------------------

static void
wop_free(pipe_wop *w)
{
    tp__aio_fini(&w->w_aio);
    tp__free(w->w_hdr);
    tp__free(w->w_iovs);
    tp__free(w->w_ops);
    tp__free(w->w_infos);
    tp__free(w->w_via);
    tp_error_unref(w->w_err);
    tp_error_unref(w->w_prep_err);
    tp__free(w);
}

static void
wop_free_task(void *arg)
{
    wop_free(arg);
}

void
tp__pipe_flush_writes(tp_pipe *p)
{
    pipe_wop *w;
    while ((w = tp__list_first(&p->p_writes)) != NULL) {
        bool failed = p->p_state == PIPE_FAILED;
        bool idle = !w->w_conn_busy && w->w_ops_pending == 0 && !w->w_prepping;
        if (!(w->w_done || (failed && (idle || !w->w_started)))) {
            break;
        }
        if (failed && !idle) {
            break;
        }
        if (p->p_wnext == w) {
            p->p_wnext = tp__list_next(&p->p_writes, w);
        }
        tp__list_remove(&p->p_writes, w);
        if (p->p_wcursor == w) {
            p->p_wcursor = NULL;
        }
        // w_err: a channel op of @w failed (the pipe failed with it).
        // Nothing reads the staging buffers any more (done, or idle).
        tp__pipe_cuda_release_stage(p->p_ctx, w->w_msg, w->w_stage);
        w->w_stage = NULL;
        tp_error *err = NULL;
        if (!w->w_done || w->w_err != NULL) {
            err = tp_error_ref(failed ? p->p_err : w->w_err);
        }
        tp__aio_finish(w->w_user, err, 0);
        // w_aio's callback may be running now: free after it returns.
        tp__task_init(&w->w_free_task, wop_free_task, w);
        tp__loop_defer(p->p_ctx->x_loop, &w->w_free_task);
    }
    tp__pipe_check_drained(p);
}

static void
wop_check(pipe_wop *w)
{
    if (!w->w_done && w->w_conn_done && w->w_ops_pending == 0) {
        w->w_done = true;
    }
}

static void
wop_submit_group(pipe_wop *w)
{
    tp_pipe *p = w->w_pipe;
    unsigned n = w->w_niovs - w->w_next_iov;
    if (n > TP_AIO_MAX_IOV) {
        n = TP_AIO_MAX_IOV;
    }
    tp_aio_set_iov(&w->w_aio, n, &w->w_iovs[w->w_next_iov]);
    w->w_next_iov += n;
    w->w_conn_busy = true;
    p->p_busy++;
    if (w->w_next_iov == w->w_niovs && p->p_wcursor == w) {
        p->p_wcursor = NULL;
    }
    tp__conn_write(p->p_conn, &w->w_aio);
}

static void
wop_aio_cb(void *arg)
{
    pipe_wop *w = arg;
    tp_pipe *p = w->w_pipe;
    w->w_conn_busy = false;
    bool ok = tp_aio_status(&w->w_aio) == TP_OK;
    if (!ok && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_aio_status(&w->w_aio),
                                      tp_aio_error(&w->w_aio), "write"));
    }
    if (p->p_state == PIPE_FAILED) {
        // The pipe failed after the last bytes went out: they did.
        if (ok && w->w_next_iov == w->w_niovs) {
            w->w_conn_done = true;
            wop_check(w);
        }
        tp__pipe_busy_done(p);
        tp__pipe_flush_writes(p);
        return;
    }
    if (w->w_next_iov < w->w_niovs) {
        wop_submit_group(w);
    } else {
        w->w_conn_done = true;
        wop_check(w);
    }
    tp__pipe_busy_done(p);
    tp__pipe_flush_writes(p);
    tp__pipe_write_pump(p);
}

static void
wop_chan_done(tp_chan_op *op, tp_error *err)
{
    pipe_wop *w = op->co_arg;
    tp_pipe *p = w->w_pipe;
    w->w_ops_pending--;
    if (err != NULL && w->w_err == NULL) {
        w->w_err = tp_error_ref(err);
    }
    if (err != NULL && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(err), err, "channel"));
    }
    tp_error_unref(err);
    wop_check(w);
    tp__pipe_busy_done(p);
    tp__pipe_flush_writes(p);
}

// Which CUDA tensors of @w go on the device channel (w_via): each one it
// accepts (cuda_ipc: memory it can share); the others are staged, and
// their descriptor entry says so (TP_CHAN_INFO_STAGED). Allocates w_infos.
static tp_status
wop_route(tp_pipe *p, pipe_wop *w, tp_error **err_p)
{
    const tp_message *m = w->w_msg;
    if (m->ntensors == 0) {
        return TP_OK;
    }
    w->w_infos = tp__zalloc(m->ntensors * sizeof(*w->w_infos));
    if (w->w_infos == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
    }
    for (uint32_t i = 0; p->p_dchan != NULL && i < m->ntensors; i++) {
        const tp_msg_buf *b = &m->tensors[i];
        if (b->device.type != TP_DEVICE_CUDA || b->len == 0) {
            continue;
        }
        if (w->w_via == NULL) {
            w->w_via = tp__zalloc(m->ntensors * sizeof(*w->w_via));
            if (w->w_via == NULL) {
                return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
            }
        }
        tp_chan_op probe = {.co_buf = b->data,
                            .co_len = b->len,
                            .co_index = i,
                            .co_device = b->device};
        char why[256] = "";
        w->w_via[i] =
            p->p_dchops->accepts == NULL ||
            p->p_dchops->accepts(p->p_dchan, &probe, why, sizeof(why));
        if (!w->w_via[i]) {
            TP_LOG_DEBUG("TP-PIPE-STAGED",
                         "pipe to %s: tensor %" PRIu32 " on cuda:%d staged "
                         "through host memory, not by %s: %s",
                         p->p_peer, i, b->device.index, p->p_dch->cb_name, why);
            w->w_infos[i].ci_flags |= TP_CHAN_INFO_STAGED;
        }
    }
    return TP_OK;
}

// The bytes of @m's CUDA tensors: a write with any synchronises the
// devices and stages first, on the pool (wop_prep) above
// TP_PIPE_CUDA_LOOP_MAX.
static uint64_t
msg_cuda_bytes(const tp_message *m)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].device.type == TP_DEVICE_CUDA) {
            n += m->tensors[i].len;
        }
    }
    return n;
}

// Drops @w, not started (its staging, if any, over), with @reason: it
// leaves the queue and its user's aio fails.
static void
wop_drop(tp_pipe *p, pipe_wop *w, tp_status reason)
{
    tp__pipe_cuda_release_stage(p->p_ctx, w->w_msg, w->w_stage);
    w->w_stage = NULL;
    if (p->p_wnext == w) {
        p->p_wnext = tp__list_next(&p->p_writes, w);
    }
    tp__list_remove(&p->p_writes, w);
    tp__aio_finish_status(w->w_user, reason, "pipe to %s: write %s", p->p_peer,
                          reason == TP_ETIMEDOUT ? "timed out" : "canceled");
    tp__task_init(&w->w_free_task, wop_free_task, w);
    tp__loop_defer(p->p_ctx->x_loop, &w->w_free_task);
    tp__pipe_check_drained(p);
}

// Loop thread: @w's synchronisation and staging (wop_prep_job) ended.
static void
wop_prep_done(void *arg)
{
    pipe_wop *w = arg;
    tp_pipe *p = w->w_pipe;
    tp_error *err = w->w_prep_err;
    w->w_prep_err = NULL;
    w->w_prepping = false;
    w->w_prepped = true;
    if (err != NULL && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(err), err, "write"));
    }
    tp_error_unref(err);
    tp__pipe_busy_done(p);
    if (p->p_state == PIPE_FAILED) {
        tp__pipe_flush_writes(p); // frees the staging
        return;
    }
    if (w->w_cancel != TP_OK) {
        // Timed out or canceled while it staged: nothing of it went out,
        // so it goes alone and the pipe stays.
        wop_drop(p, w, w->w_cancel);
    }
    tp__pipe_write_pump(p);
}

// Pool thread: waits for the work on @w's source devices and copies the
// staged tensors to host memory (pipe_cuda.c), off the loop, whose other
// pipes go on meanwhile. Reads only @w's message, routing and staging.
static void
wop_prep_job(void *arg)
{
    pipe_wop *w = arg;
    tp__pipe_cuda_stage_out(&w->w_pipe->p_ctx->x_pinned, w->w_msg, w->w_via,
                            &w->w_stage, &w->w_prep_err);
    tp__task_init(&w->w_prep_task, wop_prep_done, w);
    tp__loop_post(w->w_pipe->p_ctx->x_loop, &w->w_prep_task);
}

static tp_status
wop_prep(tp_pipe *p, pipe_wop *w, tp_error **err_p)
{
    w->w_prepping = true;
    p->p_busy++;
    tp__task_init(&w->w_prep_task, wop_prep_job, w);
    if (tp__pool_submit(p->p_ctx->x_pool, &w->w_prep_task) != TP_OK) {
        w->w_prepping = false;
        p->p_busy--;
        return tp__error_set(err_p, TP_ECLOSED,
                             "the context's copy pool is closed");
    }
    return TP_OK;
}

// Builds @w once it is staged: channel sends (which fill the infos),
// descriptor, the iov list of the main connection.
static tp_status
wop_build(tp_pipe *p, pipe_wop *w, tp_error **err_p)
{
    const tp_message *m = w->w_msg;
    w->w_seq = p->p_wseq++;
    w->w_started = true;
    // CUDA tensors go on the device channel, or else as host copies
    // (pipe_cuda.c): src[i] is what is sent.
#define TENSOR_VIA_DEV(i) (w->w_via != NULL && w->w_via[i])
#define TENSOR_INLINE(i)  (!TENSOR_VIA_DEV(i) && m->tensors[i].len <= inl)
#define TENSOR_SRC(i)                                                          \
    (w->w_stage != NULL && w->w_stage[i].cs_host != NULL                       \
         ? w->w_stage[i].cs_host                                               \
         : m->tensors[i].data)
    // Tensors up to p_inline_max follow the payloads on the connection.
    const uint64_t inl = p->p_inline_max;
    unsigned nchan = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        nchan += !TENSOR_INLINE(i);
    }
    if (nchan > 0) {
        w->w_ops = tp__zalloc(nchan * sizeof(*w->w_ops));
        if (w->w_ops == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
        }
    }
    // Payload prefix copied behind the descriptor (one write for small
    // messages).
    uint32_t ncoal = 0;
    uint64_t coal = 0;
    while (ncoal < m->npayloads &&
           coal + m->payloads[ncoal].len <= PIPE_COALESCE_MAX) {
        coal += m->payloads[ncoal].len;
        ncoal++;
    }
    unsigned k = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (TENSOR_INLINE(i)) {
            continue;
        }
        // A channel's send may fail the pipe (out of memory), which closes
        // both channels: the other may not be given ops after its close.
        if (p->p_state == PIPE_FAILED) {
            break;
        }
        tp_chan_op *op = &w->w_ops[k++];
        op->co_buf = TENSOR_SRC(i);
        op->co_len = m->tensors[i].len;
        op->co_seq = w->w_seq;
        op->co_index = i;
        // A staged CUDA tensor is sent from its host copy.
        op->co_device = op->co_buf == m->tensors[i].data
                            ? m->tensors[i].device
                            : (tp_device){TP_DEVICE_CPU, 0};
        op->co_done = wop_chan_done;
        op->co_arg = w;
        w->w_ops_pending++;
        p->p_busy++;
        if (TENSOR_VIA_DEV(i)) {
            p->p_dchops->send(p->p_dchan, op);
        } else {
            p->p_chops->send(p->p_chan, op);
        }
        op->co_info.ci_flags = w->w_infos[i].ci_flags;
        w->w_infos[i] = op->co_info;
    }
    w->w_nops = k;
    uint64_t dlen = tp__desc_size(m, w->w_infos);
    w->w_hdr_len = TP_FRAME_HDR_LEN + dlen + coal;
    w->w_hdr = tp__alloc(w->w_hdr_len);
    unsigned niovs = 1 + (m->npayloads - ncoal) + m->ntensors;
    w->w_iovs = tp__alloc(niovs * sizeof(*w->w_iovs));
    if (w->w_hdr == NULL || w->w_iovs == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
    }
    tp__frame_hdr h = {TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 0, dlen};
    tp__frame_hdr_encode(w->w_hdr, &h);
    if (tp__desc_encode(m, w->w_infos, w->w_hdr + TP_FRAME_HDR_LEN, dlen) !=
        dlen) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "write: descriptor encoding failed");
    }
    uint8_t *q = w->w_hdr + TP_FRAME_HDR_LEN + dlen;
    for (uint32_t i = 0; i < ncoal; i++) {
        if (m->payloads[i].len > 0) {
            memcpy(q, m->payloads[i].data, m->payloads[i].len);
            q += m->payloads[i].len;
        }
    }
    w->w_iovs[0] = (tp_iov){w->w_hdr, w->w_hdr_len};
    unsigned n = 1;
    for (uint32_t i = ncoal; i < m->npayloads; i++) {
        if (m->payloads[i].len > 0) {
            w->w_iovs[n++] = (tp_iov){m->payloads[i].data, m->payloads[i].len};
        }
    }
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len > 0 && TENSOR_INLINE(i)) {
            w->w_iovs[n++] = (tp_iov){TENSOR_SRC(i), m->tensors[i].len};
        }
    }
#undef TENSOR_SRC
#undef TENSOR_INLINE
#undef TENSOR_VIA_DEV
    w->w_niovs = n;
    return TP_OK;
}

void
tp__pipe_write_pump(tp_pipe *p)
{
    if (p->p_state != PIPE_READY) {
        return;
    }
    while (p->p_wcursor == NULL && p->p_wnext != NULL) {
        pipe_wop *w = p->p_wnext;
        tp_error *err = NULL;
        if (w->w_prepping) {
            return; // wop_prep_done pumps again
        }
        uint64_t cuda_bytes = w->w_prepped ? 0 : msg_cuda_bytes(w->w_msg);
        if (cuda_bytes > (uint64_t)p->p_ctx->x_cfg.pipe_cuda_loop_max) {
            // Staged on the pool; the writes behind it wait (order).
            if (wop_route(p, w, &err) != TP_OK ||
                wop_prep(p, w, &err) != TP_OK) {
                tp__pipe_fail(
                    p, tp__pipe_err(p, tp_error_status(err), err, "write"));
                tp_error_unref(err);
            }
            return;
        }
        p->p_wnext = tp__list_next(&p->p_writes, w);
        tp_status st = w->w_prepped ? TP_OK : wop_route(p, w, &err);
        if (st == TP_OK && cuda_bytes > 0) {
            // Small enough to stage here (TP_PIPE_CUDA_LOOP_MAX).
            st = tp__pipe_cuda_stage_out(&p->p_ctx->x_pinned, w->w_msg,
                                         w->w_via, &w->w_stage, &err);
        }
        if (st == TP_OK) {
            st = wop_build(p, w, &err);
        }
        if (st != TP_OK) {
            tp__pipe_fail(p,
                          tp__pipe_err(p, tp_error_status(err), err, "write"));
            tp_error_unref(err);
            return;
        }
        p->p_wcursor = w;
        wop_submit_group(w);
        if (p->p_state != PIPE_READY) {
            return;
        }
    }
}

static void
pipe_write_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    pipe_wop *w = arg;
    tp_pipe *p = w->w_pipe;
    if (w->w_started || p->p_state == PIPE_FAILED) {
        char what[128];
        snprintf(what, sizeof(what), "write %s after it started; pipe closed",
                 reason == TP_ETIMEDOUT ? "timed out" : "canceled");
        tp__pipe_fail(p, tp__pipe_err(p, reason, NULL, what));
        return;
    }
    if (w->w_prepping) {
        w->w_cancel = reason; // wop_prep_done drops it
        return;
    }
    TP_ASSERT(w->w_user == aio);
    wop_drop(p, w, reason);
}

static tp_status
msg_check(const tp_pipe *p, const tp_message *m, tp_error **err_p)
{
    const tp__pipe_limits *lim = &p->p_ctx->x_limits;
    if (m == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "message is NULL");
    }
    if (m->metadata_len > lim->max_metadata ||
        (m->metadata_len > 0 && m->metadata == NULL)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "metadata of %" PRIu64 " bytes: above the limit "
                             "%" PRIu64 " (TP_PIPE_MAX_METADATA) or NULL",
                             m->metadata_len, lim->max_metadata);
    }
    if (m->npayloads > lim->max_payloads || m->ntensors > lim->max_tensors) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%u payloads / %u tensors: above the limits %u / "
                             "%u (TP_PIPE_MAX_PAYLOADS / TP_PIPE_MAX_TENSORS)",
                             m->npayloads, m->ntensors, lim->max_payloads,
                             lim->max_tensors);
    }
    for (uint32_t k = 0; k < 2; k++) {
        const tp_msg_buf *bufs = k ? m->tensors : m->payloads;
        uint32_t n = k ? m->ntensors : m->npayloads;
        for (uint32_t i = 0; i < n; i++) {
            // Payloads are CPU only; tensors may be on a CUDA device.
            if (bufs[i].len > lim->max_buf_len ||
                (bufs[i].len > 0 && bufs[i].data == NULL) ||
                (k == 0 && bufs[i].device.type != TP_DEVICE_CPU)) {
                return tp__error_set(
                    err_p, TP_EINVAL,
                    "%s %u: %" PRIu64 " bytes, data %p, device %d: needs "
                    "data, %s and at most %" PRIu64
                    " bytes (TP_PIPE_MAX_BUF_BYTES)",
                    k ? "tensor" : "payload", i, bufs[i].len, bufs[i].data,
                    (int)bufs[i].device.type,
                    k ? "a CPU or CUDA device" : "a CPU device",
                    lim->max_buf_len);
            }
            tp_status st =
                k ? tp__pipe_cuda_check(&bufs[i], "tensor", i, err_p) : TP_OK;
            if (st != TP_OK) {
                return st;
            }
        }
    }
    return TP_OK;
}

static void
pipe_write_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    const tp_message *m = aio->a_input[0];
    pipe_wop *w = tp__zalloc(sizeof(*w));
    if (w == NULL) {
        if (tp__aio_begin(aio, p->p_ctx->x_loop, NULL, NULL)) {
            tp__aio_finish_status(
                aio, TP_ENOMEM, "pipe to %s: write: out of memory", p->p_peer);
        }
        return;
    }
    w->w_pipe = p;
    w->w_user = aio;
    w->w_msg = m;
    tp__aio_init(&w->w_aio, wop_aio_cb, w);
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_write_cancel, w)) {
        wop_free(w);
        return;
    }
    tp_error *err = NULL;
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        wop_free(w);
        return;
    }
    if (msg_check(p, m, &err) != TP_OK) {
        tp__error_wrap(&err, tp_error_status(err), "pipe to %s: write",
                       p->p_peer);
        tp__aio_finish(aio, err, 0);
        wop_free(w);
        return;
    }
    tp__list_append(&p->p_writes, w);
    if (p->p_wnext == NULL) {
        p->p_wnext = w;
    }
    tp__pipe_write_pump(p);
}

void
tp_pipe_write(tp_pipe *p, const tp_message *msg, tp_aio *aio)
{
    aio->a_input[0] = (void *)(uintptr_t)msg;
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_write_start, p);
}
