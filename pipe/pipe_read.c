// SPDX-License-Identifier: Apache-2.0
// pipe_read.c - the read engine: a state machine on the main
// connection (frame header, descriptor body, waiting for tp_pipe_read,
// inline bytes), then the next descriptor; channel receives for the
// tensors that do not travel inline.
//
// Everything runs on the context's loop thread (x_loop; see pipe_impl.h)
// but the host-to-device copies of staged CUDA tensors, which run on the
// context's copy pool once the bytes are in (rop_check).

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "pipe_impl.h"

// ---- reads -----------------------------------------------------------------

static void
rop_free(pipe_rop *r)
{
    tp__aio_fini(&r->r_aio);
    tp__free(r->r_iovs);
    tp__free(r->r_ops);
    tp__free(r->r_infos);
    tp__free(r->r_via);
    tp_error_unref(r->r_err);
    tp_error_unref(r->r_stage_err);
    tp__free(r);
}

static void
rop_free_task(void *arg)
{
    rop_free(arg);
}

void
tp__pipe_flush_reads(tp_pipe *p)
{
    pipe_rop *r;
    while ((r = tp__list_first(&p->p_reads)) != NULL) {
        bool failed = p->p_state == PIPE_FAILED;
        bool idle = !r->r_conn_busy && r->r_ops_pending == 0 && !r->r_copying;
        if (!r->r_done && !(failed && idle)) {
            break;
        }
        tp__list_remove(&p->p_reads, r);
        if (p->p_rcursor == r) {
            p->p_rcursor = NULL;
        }
        tp_error *err = NULL;
        if (failed) {
            err = tp_error_ref(p->p_err);
        } else if (r->r_stage_err != NULL || r->r_err != NULL) {
            // The bytes are in but a CUDA destination could not take them:
            // this read fails, the pipe goes on.
            err = tp_error_ref(r->r_stage_err != NULL ? r->r_stage_err
                                                      : r->r_err);
            tp__error_wrap(&err, tp_error_status(err), "pipe to %s", p->p_peer);
        }
        tp__pipe_cuda_release_stage(p->p_ctx, r->r_msg, r->r_stage);
        r->r_stage = NULL;
        tp__aio_finish(r->r_user, err, 0);
        tp__task_init(&r->r_free_task, rop_free_task, r);
        tp__loop_defer(p->p_ctx->x_loop, &r->r_free_task);
    }
    tp__pipe_check_drained(p);
}

// Loop thread: @r's host-to-device copies (rop_copy_job) ended.
static void
rop_copied(void *arg)
{
    pipe_rop *r = arg;
    tp_pipe *p = r->r_pipe;
    r->r_copying = false;
    r->r_done = true;
    tp__pipe_busy_done(p);
    tp__pipe_flush_reads(p);
}

// Pool thread: copies @r's staged tensors to their devices, off the loop,
// whose other pipes go on meanwhile. Touches only @r's message, staging
// and r_err.
static void
rop_copy_job(void *arg)
{
    pipe_rop *r = arg;
    tp__pipe_cuda_copy_in(r->r_msg, r->r_stage, &r->r_err);
    tp__task_init(&r->r_copy_task, rop_copied, r);
    tp__loop_post(r->r_pipe->p_ctx->x_loop, &r->r_copy_task);
}

// The bytes @r copies from host staging to its devices.
static uint64_t
rop_copy_bytes(const pipe_rop *r)
{
    if (r->r_stage == NULL || r->r_stage_err != NULL) {
        return 0;
    }
    uint64_t n = 0;
    for (uint32_t i = 0; i < r->r_msg->ntensors; i++) {
        if (r->r_stage[i].cs_copy) {
            n += r->r_msg->tensors[i].len;
        }
    }
    return n;
}

// @r is done once its bytes are in and, for staged CUDA destinations, the
// copies to the devices returned (on the pool: rop_copied; here up to
// TP_PIPE_CUDA_LOOP_MAX bytes).
static void
rop_check(pipe_rop *r)
{
    if (r->r_done || r->r_copying || !r->r_conn_done || r->r_ops_pending > 0) {
        return;
    }
    tp_pipe *p = r->r_pipe;
    uint64_t copy = p->p_state != PIPE_FAILED ? rop_copy_bytes(r) : 0;
    if (copy > 0 && copy <= (uint64_t)p->p_ctx->x_cfg.pipe_cuda_loop_max) {
        tp__pipe_cuda_copy_in(r->r_msg, r->r_stage, &r->r_err);
    } else if (copy > 0) {
        r->r_copying = true;
        p->p_busy++;
        tp__task_init(&r->r_copy_task, rop_copy_job, r);
        if (tp__pool_submit(p->p_ctx->x_pool, &r->r_copy_task) == TP_OK) {
            return;
        }
        r->r_copying = false;
        p->p_busy--;
        r->r_err = tp__error_new(TP_ECLOSED, 0, NULL,
                                 "read: the context's copy pool is closed");
    }
    r->r_done = true;
}

static void
rop_submit_group(pipe_rop *r)
{
    tp_pipe *p = r->r_pipe;
    unsigned n = r->r_niovs - r->r_next_iov;
    if (n > TP_AIO_MAX_IOV) {
        n = TP_AIO_MAX_IOV;
    }
    tp_aio_set_iov(&r->r_aio, n, &r->r_iovs[r->r_next_iov]);
    r->r_next_iov += n;
    r->r_conn_busy = true;
    p->p_busy++;
    tp__conn_read(p->p_conn, &r->r_aio);
}

static void
rop_aio_cb(void *arg)
{
    pipe_rop *r = arg;
    tp_pipe *p = r->r_pipe;
    r->r_conn_busy = false;
    if (tp_aio_status(&r->r_aio) != TP_OK && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_aio_status(&r->r_aio),
                                      tp_aio_error(&r->r_aio), "read"));
    }
    if (p->p_state == PIPE_FAILED) {
        tp__pipe_busy_done(p);
        tp__pipe_flush_reads(p);
        return;
    }
    if (r->r_next_iov < r->r_niovs) {
        rop_submit_group(r);
    } else {
        r->r_conn_done = true;
        rop_check(r);
        // The inline bytes are in: the next descriptor may be read.
        p->p_rcursor = NULL;
        p->p_rstate = RD_IDLE;
    }
    tp__pipe_busy_done(p);
    tp__pipe_flush_reads(p);
    tp__pipe_read_pump(p);
}

static void
rop_chan_done(tp_chan_op *op, tp_error *err)
{
    pipe_rop *r = op->co_arg;
    tp_pipe *p = r->r_pipe;
    r->r_ops_pending--;
    if (err != NULL && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(err), err, "channel"));
    }
    tp_error_unref(err);
    rop_check(r);
    tp__pipe_busy_done(p);
    tp__pipe_flush_reads(p);
}

static void
pipe_raio_submit(tp_pipe *p, void *buf, uint64_t len)
{
    tp_iov iov = {buf, len};
    tp_aio_set_iov(&p->p_raio, 1, &iov);
    p->p_raio_busy = true;
    p->p_busy++;
    tp__conn_read(p->p_conn, &p->p_raio);
}

void
tp__pipe_read_pump(tp_pipe *p)
{
    if (p->p_state != PIPE_READY || p->p_rstate != RD_IDLE) {
        return;
    }
    tp_aio *aio = tp__list_pop_first(&p->p_rdesc);
    if (aio == NULL) {
        return;
    }
    p->p_rdesc_active = aio;
    p->p_rstate = RD_HDR;
    pipe_raio_submit(p, p->p_rhdr, TP_FRAME_HDR_LEN);
}

static void
pipe_raio_step(tp_pipe *p)
{
    tp_aio *user = p->p_rdesc_active;
    tp_status st = tp_aio_status(&p->p_raio);
    if (p->p_state == PIPE_FAILED) {
        return;
    }
    if (st != TP_OK) {
        if ((st == TP_ECANCELED || st == TP_ETIMEDOUT) &&
            p->p_rstate == RD_HDR && tp_aio_count(&p->p_raio) == 0 &&
            p->p_rdesc_reason != 0) {
            // Canceled before any byte: the stream is intact.
            st = p->p_rdesc_reason;
            p->p_rdesc_reason = 0;
            p->p_rdesc_active = NULL;
            p->p_rstate = RD_IDLE;
            tp__aio_finish_status(
                user, st, "pipe to %s: read descriptor %s", p->p_peer,
                st == TP_ETIMEDOUT ? "timed out" : "canceled");
            tp__pipe_read_pump(p);
            return;
        }
        tp__pipe_fail(p, tp__pipe_err(p, st, tp_aio_error(&p->p_raio), "read"));
        return;
    }
    tp_error *err = NULL;
    p->p_rdesc_reason = 0; // bytes came: a cancel that raced them is moot
    if (p->p_rstate == RD_HDR) {
        tp__frame_hdr h;
        uint64_t max = tp__desc_max_size(&p->p_ctx->x_limits);
        if (tp__frame_hdr_decode(p->p_rhdr, &h, &err) != TP_OK) {
            tp__pipe_fail(p, tp__pipe_err(p, TP_EPROTO, err, "protocol error"));
            tp_error_unref(err);
        } else if (h.fh_type != TP_FRAME_MESSAGE || h.fh_body_len > max) {
            char what[160];
            snprintf(what, sizeof(what),
                     "protocol error: expected a message descriptor of at "
                     "most %" PRIu64 " bytes, got frame type %u of %" PRIu64
                     " bytes",
                     max, h.fh_type, h.fh_body_len);
            tp__pipe_fail(p, tp__pipe_err(p, TP_EPROTO, NULL, what));
        } else {
            tp__free(p->p_rbody);
            p->p_rbody_len = h.fh_body_len;
            p->p_rbody = tp__alloc(h.fh_body_len ? h.fh_body_len : 1);
            if (p->p_rbody == NULL) {
                tp__pipe_fail(
                    p, tp__pipe_err(p, TP_ENOMEM, NULL, "read: out of memory"));
            } else {
                p->p_rstate = RD_BODY;
                pipe_raio_submit(p, p->p_rbody, p->p_rbody_len);
            }
        }
        return;
    }
    TP_ASSERT(p->p_rstate == RD_BODY);
    tp_message *msg = NULL;
    tp__chan_info *infos = NULL;
    if (tp__desc_decode(p->p_rbody, p->p_rbody_len, &p->p_ctx->x_limits, &msg,
                        &infos, &err) != TP_OK) {
        tp_status dst = tp_error_status(err);
        tp__pipe_fail(p, tp__pipe_err(p, dst, err,
                                      dst == TP_ENOMEM ? "read: out of memory"
                                                       : "protocol error"));
        tp_error_unref(err);
        return;
    }
    tp__free(p->p_rbody);
    p->p_rbody = NULL;
    // Which tensors the device channel carries: those on a CUDA device at
    // the sender (the reader may change the device before it reads).
    for (uint32_t i = 0; p->p_dchan != NULL && i < msg->ntensors; i++) {
        if (msg->tensors[i].device.type != TP_DEVICE_CUDA ||
            msg->tensors[i].len == 0 ||
            (infos[i].ci_flags & TP_CHAN_INFO_STAGED)) {
            continue;
        }
        if (p->p_rvia == NULL) {
            p->p_rvia = tp__zalloc(msg->ntensors * sizeof(*p->p_rvia));
            if (p->p_rvia == NULL) {
                tp_message_destroy(msg);
                tp__free(infos);
                tp__pipe_fail(
                    p, tp__pipe_err(p, TP_ENOMEM, NULL, "read: out of memory"));
                return;
            }
        }
        p->p_rvia[i] = true;
    }
    p->p_rmsg = msg;
    p->p_rinfos = infos;
    p->p_rstate = RD_GOT_DESC;
    p->p_rdesc_active = NULL;
    tp__aio_set_output(user, 0, msg);
    tp__aio_finish(user, NULL, 0);
}

void
tp__pipe_raio_cb(void *arg)
{
    tp_pipe *p = arg;
    p->p_raio_busy = false;
    pipe_raio_step(p);
    // A failure (found here or before) ends the descriptor read being
    // served, with the pipe's first error.
    if (p->p_state == PIPE_FAILED && p->p_rdesc_active != NULL) {
        tp_aio *user = p->p_rdesc_active;
        p->p_rdesc_active = NULL;
        tp__aio_finish(user, tp_error_ref(p->p_err), 0);
    }
    tp__pipe_busy_done(p);
}

static void
pipe_rdesc_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tp_pipe *p = arg;
    if (tp__list_node_active(&aio->a_node)) {
        tp__list_remove(&p->p_rdesc, aio);
        tp__aio_finish_status(
            aio, reason, "pipe to %s: read descriptor %s", p->p_peer,
            reason == TP_ETIMEDOUT ? "timed out" : "canceled");
        tp__pipe_check_drained(p);
        return;
    }
    if (p->p_rdesc_active == aio) {
        if (p->p_rstate == RD_HDR) {
            // Completes through tp__pipe_raio_cb: intact if no byte came.
            p->p_rdesc_reason = reason;
            tp_aio_cancel(&p->p_raio);
        } else {
            char what[96];
            snprintf(what, sizeof(what),
                     "read descriptor %s in the middle of a frame; pipe "
                     "closed",
                     reason == TP_ETIMEDOUT ? "timed out" : "canceled");
            tp__pipe_fail(p, tp__pipe_err(p, reason, NULL, what));
        }
    }
}

static void
pipe_rdesc_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_rdesc_cancel, p)) {
        return;
    }
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        return;
    }
    tp__list_append(&p->p_rdesc, aio);
    tp__pipe_read_pump(p);
}

void
tp_pipe_read_descriptor(tp_pipe *p, tp_aio *aio)
{
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_rdesc_start, p);
}

static void
pipe_read_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    (void)aio;
    pipe_rop *r = arg;
    char what[96];
    snprintf(what, sizeof(what), "read %s while data was arriving; pipe closed",
             reason == TP_ETIMEDOUT ? "timed out" : "canceled");
    tp__pipe_fail(r->r_pipe, tp__pipe_err(r->r_pipe, reason, NULL, what));
}

static void
pipe_read_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    tp_message *m = aio->a_input[0];
    pipe_rop *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        if (tp__aio_begin(aio, p->p_ctx->x_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "pipe to %s: read: out of memory", p->p_peer);
        }
        return;
    }
    r->r_pipe = p;
    r->r_user = aio;
    r->r_msg = m;
    tp__aio_init(&r->r_aio, rop_aio_cb, r);
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_read_cancel, r)) {
        rop_free(r);
        return;
    }
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        rop_free(r);
        return;
    }
    if (p->p_rstate != RD_GOT_DESC || m == NULL || m != p->p_rmsg) {
        tp__aio_finish_status(aio, TP_EINVAL, "pipe to %s: read: %s", p->p_peer,
                              p->p_rstate != RD_GOT_DESC
                                  ? "no descriptor is waiting for its data "
                                    "(call tp_pipe_read_descriptor first)"
                                  : "not the message returned by the last "
                                    "tp_pipe_read_descriptor");
        rop_free(r);
        return;
    }
    p->p_rmsg = NULL;
    r->r_infos = p->p_rinfos;
    p->p_rinfos = NULL;
    r->r_via = p->p_rvia;
    p->p_rvia = NULL;
    r->r_seq = p->p_rseq++;
    const uint64_t inl = p->p_inline_max;
    // Buffers the caller left NULL: ours (device ones: pipe_cuda.c).
    for (uint32_t k = 0; k < 2; k++) {
        tp_msg_buf *bufs = k ? m->tensors : m->payloads;
        uint32_t n = k ? m->ntensors : m->npayloads;
        for (uint32_t i = 0; i < n; i++) {
            if (k == 0) {
                bufs[i].device = (tp_device){TP_DEVICE_CPU, 0};
            }
            if (bufs[i].data == NULL && bufs[i].len > 0 &&
                bufs[i].device.type == TP_DEVICE_CPU) {
                bufs[i].data = tp__alloc(bufs[i].len);
                if (bufs[i].data == NULL) {
                    tp__list_append(&p->p_reads, r);
                    tp__pipe_fail(p, tp__pipe_err(p, TP_ENOMEM, NULL,
                                                  "read: out of memory for the "
                                                  "message's buffers"));
                    return;
                }
                bufs[i].pipe_owned = true;
            }
        }
    }
    // CUDA destinations receive into host staging buffers (pipe_cuda.c).
    tp_error *serr = NULL;
    if (tp__pipe_cuda_stage_in(&p->p_ctx->x_pinned, m, r->r_via, &r->r_stage,
                               &r->r_stage_err, &serr) != TP_OK) {
        tp__list_append(&p->p_reads, r);
        tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(serr), serr, "read"));
        tp_error_unref(serr);
        return;
    }
#define TENSOR_DST(i)                                                          \
    (r->r_stage != NULL && r->r_stage[i].cs_host != NULL                       \
         ? r->r_stage[i].cs_host                                               \
         : m->tensors[i].data)
    unsigned niovs = m->npayloads + m->ntensors;
    unsigned nchan = m->ntensors;
    r->r_iovs = niovs ? tp__alloc(niovs * sizeof(*r->r_iovs)) : NULL;
    r->r_ops = nchan ? tp__zalloc(nchan * sizeof(*r->r_ops)) : NULL;
    tp__list_append(&p->p_reads, r);
    if ((niovs && r->r_iovs == NULL) || (nchan && r->r_ops == NULL)) {
        tp__pipe_fail(p,
                      tp__pipe_err(p, TP_ENOMEM, NULL, "read: out of memory"));
        return;
    }
    unsigned n = 0;
    for (uint32_t i = 0; i < m->npayloads; i++) {
        if (m->payloads[i].len > 0) {
            r->r_iovs[n++] = (tp_iov){m->payloads[i].data, m->payloads[i].len};
        }
    }
#define TENSOR_VIA_DEV(i) (r->r_via != NULL && r->r_via[i])
#define TENSOR_INLINE(i)  (!TENSOR_VIA_DEV(i) && m->tensors[i].len <= inl)
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len > 0 && TENSOR_INLINE(i)) {
            r->r_iovs[n++] = (tp_iov){TENSOR_DST(i), m->tensors[i].len};
        }
    }
    r->r_niovs = n;
    if (n > 0) {
        p->p_rstate = RD_INLINE;
        p->p_rcursor = r;
        rop_submit_group(r);
    } else {
        r->r_conn_done = true;
        p->p_rstate = RD_IDLE;
    }
    unsigned k = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (TENSOR_INLINE(i)) {
            continue;
        }
        // A channel's recv may fail the pipe (bad info from the peer),
        // which closes both channels: no op for either after that.
        if (p->p_state == PIPE_FAILED) {
            break;
        }
        tp_chan_op *op = &r->r_ops[k++];
        op->co_buf = TENSOR_DST(i);
        op->co_len = m->tensors[i].len;
        op->co_seq = r->r_seq;
        op->co_index = i;
        // A tensor bound for a CUDA device is received into host staging.
        op->co_device = op->co_buf == m->tensors[i].data
                            ? m->tensors[i].device
                            : (tp_device){TP_DEVICE_CPU, 0};
        op->co_info = r->r_infos[i];
        op->co_done = rop_chan_done;
        op->co_arg = r;
        r->r_ops_pending++;
        p->p_busy++;
        if (TENSOR_VIA_DEV(i)) {
            p->p_dchops->recv(p->p_dchan, op);
        } else {
            p->p_chops->recv(p->p_chan, op);
        }
    }
#undef TENSOR_INLINE
#undef TENSOR_VIA_DEV
#undef TENSOR_DST
    r->r_nops = k;
    rop_check(r);
    tp__pipe_flush_reads(p);
    tp__pipe_read_pump(p);
}

void
tp_pipe_read(tp_pipe *p, tp_message *msg, tp_aio *aio)
{
    aio->a_input[0] = msg;
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_read_start, p);
}
