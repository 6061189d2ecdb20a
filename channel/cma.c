// SPDX-License-Identifier: Apache-2.0
// cma.c - the cma channel: two processes on one host. The sender puts its
// pid and the tensor's address in the descriptor; the receiver copies the
// bytes once with process_vm_readv (cma_probe.c) on the context's pool,
// then acknowledges on the channel's own connection (frame ACK, body: the
// message number, aux: the tensor index) so the sender can release the
// buffer. A bad address from the peer only makes the read fail (EFAULT).

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "channel.h"
#include "cma_probe.h"
#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"

#define CMA_ACK_FRAME (TP_FRAME_HDR_LEN + TP_ACK_LEN)
// Copies up to this size run on the loop: a pool thread's wake-up (~40 us
// on this VM) costs more than the copy (64 B round trip: 60 us through the
// pool, 5 us inline). Larger ones are split in CMA_SPLIT parts copied in
// parallel: the first on the loop while it is at most CMA_LOOP_PART (so a
// large tensor does not stall the context's other pipes for long), the
// others on the copy pool.
#define CMA_INLINE_COPY (256u * 1024u)
#define CMA_LOOP_PART   (4u * 1024u * 1024u)
#define CMA_SPLIT       2u

typedef struct cma_copy {
    tp_chan *cc_ch;
    tp_chan_op *cc_op;
    pid_t cc_pid;
    uint64_t cc_addr;
    uint64_t cc_off, cc_len; // the part of the tensor this copy moves
    tp_task cc_task;
    tp_error *cc_err;
} cma_copy;

struct tp_chan {
    tp_chan_env c_env;
    tp_conn *c_conn;
    tp_list c_sends; // ops waiting for their ack (co_node)
    // ack reader
    tp_aio c_raio;
    uint8_t c_rbuf[CMA_ACK_FRAME];
    bool c_rbusy;
    // ack writer: acks queued while one write is in flight
    tp_aio c_waio;
    uint8_t *c_wq; // queued frames
    size_t c_wq_len, c_wq_cap;
    uint8_t *c_wbuf; // frames being written
    size_t c_wbuf_cap;
    bool c_wbusy;
    bool c_closed;
    bool c_destroy_req;
    int c_copies; // copies on the pool
    tp_task c_free_task;
};

static unsigned
cma_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 1;
}

static bool
cma_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    return tp__cma_viable(why, why_len);
}

// The inline size is part of the domain: both ends must agree on which
// tensors travel on the pipe's connection.
static tp_status
cma_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    tp_status st = tp__cma_domain(buf, len, err_p);
    if (st != TP_OK) {
        return st;
    }
    size_t n = strlen(buf);
    int m = snprintf(buf + n, len - n, ":inline=%lld",
                     (long long)cfg->cma_inline_max);
    if (m < 0 || (size_t)m >= len - n) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cma: domain descriptor longer than %zu bytes",
                             len);
    }
    return TP_OK;
}

// Tensors up to TP_CMA_INLINE_MAX follow the payloads on the pipe's
// connection: for small ones a process_vm_readv and its ack cost more
// than the bytes.
static uint64_t
cma_inline_max(const tp_config *cfg)
{
    return (uint64_t)cfg->cma_inline_max;
}

static void cma_read_acks(tp_chan *ch);

static void
cma_maybe_free(tp_chan *ch)
{
    if (ch->c_destroy_req && !ch->c_rbusy && !ch->c_wbusy &&
        ch->c_copies == 0) {
        tp__loop_defer(ch->c_env.ce_loop, &ch->c_free_task);
    }
}

static void
cma_free_task(void *arg)
{
    tp_chan *ch = arg;
    tp__aio_fini(&ch->c_raio);
    tp__aio_fini(&ch->c_waio);
    tp__free(ch->c_wq);
    tp__free(ch->c_wbuf);
    tp__free(ch);
}

static void
cma_fail(tp_chan *ch, tp_error *err)
{
    if (!ch->c_closed) {
        ch->c_env.ce_fail(ch->c_env.ce_pipe, err);
    } else {
        tp_error_unref(err);
    }
}

static void
cma_raio_cb(void *arg)
{
    tp_chan *ch = arg;
    ch->c_rbusy = false;
    if (ch->c_closed) {
        cma_maybe_free(ch);
        return;
    }
    if (tp_aio_status(&ch->c_raio) != TP_OK) {
        cma_fail(ch, tp__error_new(tp_aio_status(&ch->c_raio), 0,
                                   tp_aio_error(&ch->c_raio),
                                   "cma: pipe to %s: ack connection",
                                   ch->c_env.ce_peer));
        return;
    }
    tp__frame_hdr h;
    tp_error *err = NULL;
    if (tp__frame_hdr_decode(ch->c_rbuf, &h, &err) != TP_OK ||
        h.fh_type != TP_FRAME_ACK || h.fh_body_len != TP_ACK_LEN) {
        cma_fail(ch, tp__error_new(TP_EPROTO, 0, err,
                                   "cma: pipe to %s: protocol error: "
                                   "expected an ack frame",
                                   ch->c_env.ce_peer));
        tp_error_unref(err);
        return;
    }
    uint64_t seq = tp__get_u64le(ch->c_rbuf + TP_FRAME_HDR_LEN);
    uint32_t idx = h.fh_aux;
    tp_chan_op *found = NULL;
    for (tp_chan_op *op = tp__list_first(&ch->c_sends); op != NULL;
         op = tp__list_next(&ch->c_sends, op)) {
        if (op->co_seq == seq && op->co_index == idx) {
            found = op;
            break;
        }
    }
    if (found == NULL) {
        cma_fail(ch, tp__error_new(TP_EPROTO, 0, NULL,
                                   "cma: pipe to %s: protocol error: ack of "
                                   "message %" PRIu64 " tensor %u, which is "
                                   "not waiting for one",
                                   ch->c_env.ce_peer, seq, idx));
        return;
    }
    tp__list_remove(&ch->c_sends, found);
    found->co_done(found, NULL);
    cma_read_acks(ch);
}

static void
cma_read_acks(tp_chan *ch)
{
    if (ch->c_closed || ch->c_rbusy) {
        return;
    }
    tp_iov iov = {ch->c_rbuf, sizeof(ch->c_rbuf)};
    tp_aio_set_iov(&ch->c_raio, 1, &iov);
    ch->c_rbusy = true;
    tp__conn_read(ch->c_conn, &ch->c_raio);
}

static void cma_flush_acks(tp_chan *ch);

static void
cma_waio_cb(void *arg)
{
    tp_chan *ch = arg;
    ch->c_wbusy = false;
    if (ch->c_closed) {
        cma_maybe_free(ch);
        return;
    }
    if (tp_aio_status(&ch->c_waio) != TP_OK) {
        cma_fail(ch, tp__error_new(tp_aio_status(&ch->c_waio), 0,
                                   tp_aio_error(&ch->c_waio),
                                   "cma: pipe to %s: sending acks",
                                   ch->c_env.ce_peer));
        return;
    }
    cma_flush_acks(ch);
}

static void
cma_flush_acks(tp_chan *ch)
{
    if (ch->c_wbusy || ch->c_wq_len == 0 || ch->c_closed) {
        return;
    }
    // Swap the queue and the write buffer.
    uint8_t *b = ch->c_wbuf;
    size_t cap = ch->c_wbuf_cap;
    ch->c_wbuf = ch->c_wq;
    ch->c_wbuf_cap = ch->c_wq_cap;
    tp_iov iov = {ch->c_wbuf, ch->c_wq_len};
    ch->c_wq = b;
    ch->c_wq_cap = cap;
    ch->c_wq_len = 0;
    tp_aio_set_iov(&ch->c_waio, 1, &iov);
    ch->c_wbusy = true;
    tp__conn_write(ch->c_conn, &ch->c_waio);
}

static bool
cma_queue_ack(tp_chan *ch, uint64_t seq, uint32_t idx)
{
    if (ch->c_wq_len + CMA_ACK_FRAME > ch->c_wq_cap) {
        size_t cap = ch->c_wq_cap ? ch->c_wq_cap * 2 : CMA_ACK_FRAME * 16;
        uint8_t *q = tp__alloc(cap);
        if (q == NULL) {
            return false;
        }
        if (ch->c_wq_len) {
            memcpy(q, ch->c_wq, ch->c_wq_len);
        }
        tp__free(ch->c_wq);
        ch->c_wq = q;
        ch->c_wq_cap = cap;
    }
    uint8_t *f = ch->c_wq + ch->c_wq_len;
    tp__frame_hdr h = {TP_FRAME_ACK, TP_PIPE_WIRE_VERSION, idx, TP_ACK_LEN};
    tp__frame_hdr_encode(f, &h);
    tp__put_u64le(f + TP_FRAME_HDR_LEN, seq);
    ch->c_wq_len += CMA_ACK_FRAME;
    return true;
}

static tp_status
cma_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    if (env->ce_nconns != 1) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "cma: needs 1 connection, got %u", env->ce_nconns);
    }
    tp_chan *ch = tp__zalloc(sizeof(*ch));
    if (ch == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "cma: out of memory");
    }
    ch->c_env = *env;
    ch->c_conn = env->ce_conns[0];
    TP_LIST_INIT(&ch->c_sends, tp_chan_op, co_node);
    tp__aio_init(&ch->c_raio, cma_raio_cb, ch);
    tp__aio_init(&ch->c_waio, cma_waio_cb, ch);
    tp__task_init(&ch->c_free_task, cma_free_task, ch);
    // Peers must be allowed to read us (Yama scope 1).
    tp__cma_allow_peers();
    cma_read_acks(ch);
    *ch_p = ch;
    return TP_OK;
}

static void
cma_send(tp_chan *ch, tp_chan_op *op)
{
    op->co_info.ci_len = 12;
    tp__put_u32le(op->co_info.ci_bytes, (uint32_t)getpid());
    tp__put_u64le(op->co_info.ci_bytes + 4, (uint64_t)(uintptr_t)op->co_buf);
    tp__list_append(&ch->c_sends, op);
}

static void
cma_copied_task(void *arg)
{
    cma_copy *cc = arg;
    tp_chan *ch = cc->cc_ch;
    tp_chan_op *op = cc->cc_op;
    ch->c_copies--;
    if (cc->cc_err != NULL && op->co_err == NULL) {
        op->co_err = cc->cc_err;
    } else {
        tp_error_unref(cc->cc_err);
    }
    tp__free(cc);
    if (--op->co_parts > 0) {
        return;
    }
    tp_error *err = op->co_err;
    op->co_err = NULL;
    if (err == NULL && !ch->c_closed &&
        !cma_queue_ack(ch, op->co_seq, op->co_index)) {
        err = tp__error_new(TP_ENOMEM, 0, NULL, "cma: ack: out of memory");
    }
    if (err != NULL) {
        cma_fail(ch, tp_error_ref(err));
    } else {
        cma_flush_acks(ch);
    }
    op->co_done(op, err);
    cma_maybe_free(ch);
}

static void
cma_copy_run(cma_copy *cc)
{
    tp_chan_op *op = cc->cc_op;
    tp_error *err = NULL;
    if (tp__cma_read(cc->cc_pid, cc->cc_addr + cc->cc_off,
                     (uint8_t *)op->co_buf + cc->cc_off, cc->cc_len,
                     &err) != TP_OK) {
        cc->cc_err =
            tp__error_new(tp_error_status(err), 0, err,
                          "cma: pipe to %s: tensor %u of message "
                          "%" PRIu64,
                          cc->cc_ch->c_env.ce_peer, op->co_index, op->co_seq);
        tp_error_unref(err);
    }
    tp__task_init(&cc->cc_task, cma_copied_task, cc);
}

// Pool thread.
static void
cma_copy_task(void *arg)
{
    cma_copy *cc = arg;
    cma_copy_run(cc);
    tp__loop_post(cc->cc_ch->c_env.ce_loop, &cc->cc_task);
}

static void
cma_recv(tp_chan *ch, tp_chan_op *op)
{
    if (op->co_info.ci_len != 12) {
        tp__chan_op_fail_later(
            ch->c_env.ce_loop, op,
            tp__error_new(TP_EPROTO, 0, NULL,
                          "cma: pipe to %s: protocol error: tensor "
                          "%u carries %u info bytes, expected 12",
                          ch->c_env.ce_peer, op->co_index, op->co_info.ci_len));
        return;
    }
    pid_t pid = (pid_t)tp__get_u32le(op->co_info.ci_bytes);
    uint64_t addr = tp__get_u64le(op->co_info.ci_bytes + 4);
    // Small: one copy on the loop. Large: CMA_SPLIT parts in parallel on
    // the copy pool (the sender's cores are idle meanwhile).
    unsigned nparts = op->co_len <= CMA_INLINE_COPY ? 1 : CMA_SPLIT;
    uint64_t part = (op->co_len + nparts - 1) / nparts;
    part = (part + 4095) & ~(uint64_t)4095;
    op->co_parts = (int)nparts;
    op->co_err = NULL;
    cma_copy *inline_cc = NULL;
    for (unsigned i = 0; i < nparts; i++) {
        uint64_t off = (uint64_t)i * part;
        cma_copy *cc = tp__zalloc(sizeof(*cc));
        if (cc == NULL) {
            // Count the missing parts as failed ones.
            if (op->co_err == NULL) {
                op->co_err =
                    tp__error_new(TP_ENOMEM, 0, NULL, "cma: out of memory");
            }
            if (--op->co_parts == 0) {
                tp_error *err = op->co_err;
                op->co_err = NULL;
                tp__chan_op_fail_later(ch->c_env.ce_loop, op, err);
            }
            continue;
        }
        cc->cc_ch = ch;
        cc->cc_op = op;
        cc->cc_pid = pid;
        cc->cc_addr = addr;
        cc->cc_off = off < op->co_len ? off : op->co_len;
        cc->cc_len = off < op->co_len
                         ? (op->co_len - off < part ? op->co_len - off : part)
                         : 0;
        ch->c_copies++;
        if (i == 0 && cc->cc_len <= CMA_LOOP_PART) {
            inline_cc = cc; // copied below, once the others are running
            continue;
        }
        tp__task_init(&cc->cc_task, cma_copy_task, cc);
        if (tp__pool_submit(ch->c_env.ce_pool, &cc->cc_task) != TP_OK) {
            cc->cc_err = tp__error_new(TP_ECLOSED, 0, NULL,
                                       "cma: pipe to %s: copy pool closed",
                                       ch->c_env.ce_peer);
            tp__task_init(&cc->cc_task, cma_copied_task, cc);
            tp__loop_defer(ch->c_env.ce_loop, &cc->cc_task);
        }
    }
    if (inline_cc != NULL) {
        cma_copy_run(inline_cc);
        tp__loop_defer(ch->c_env.ce_loop, &inline_cc->cc_task);
    }
}

static void
cma_close(tp_chan *ch, const tp_error *err)
{
    ch->c_closed = true;
    tp_chan_op *op;
    while ((op = tp__list_pop_first(&ch->c_sends)) != NULL) {
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, tp_error_ref(err));
    }
    tp_aio_cancel(&ch->c_raio);
    tp_aio_cancel(&ch->c_waio);
}

static void
cma_destroy(tp_chan *ch)
{
    ch->c_destroy_req = true;
    cma_maybe_free(ch);
}

const tp_channel_ops tp__channel_cma_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "cma",
    .nconns = cma_nconns,
    .is_viable = cma_is_viable,
    .domain = cma_domain,
    .inline_max = cma_inline_max,
    .create = cma_create,
    .send = cma_send,
    .recv = cma_recv,
    .close = cma_close,
    .destroy = cma_destroy,
};
