// SPDX-License-Identifier: Apache-2.0
// cma_copy.c - the cma channel's sends and receives (cma_impl.h): a send
// waits for the reader's ack; a receive copies the peer's bytes with
// process_vm_readv, on the loop when small, else split between the loop
// and the context's pool, then acks.

#include "channel/cma/cma_impl.h"

// Why @op cannot go: the channel broke earlier (ca_err).
static tp_error *
cma_down_err(tp_chan *ch, const tp_chan_op *op)
{
    return tp__error_new(tp_error_status(ch->c_acks.ca_err), 0,
                         ch->c_acks.ca_err,
                         "cma: pipe to %s: tensor %u of message %" PRIu64
                         ": the cma channel is down",
                         ch->c_env.ce_peer, op->co_index, op->co_seq);
}

// @op came after close (the pipe failed inside another channel's call):
// it fails at once, like every op close found.
static bool
cma_closed_op(tp_chan *ch, tp_chan_op *op)
{
    if (!ch->c_closed) {
        return false;
    }
    tp__chan_op_fail_later(
        ch->c_env.ce_loop, op,
        tp__error_new(TP_ECLOSED, 0, NULL,
                      "cma: pipe to %s: tensor %u of message %" PRIu64
                      ": the pipe is closing",
                      ch->c_env.ce_peer, op->co_index, op->co_seq));
    return true;
}

void
tp__cma_chan_send(tp_chan *ch, tp_chan_op *op)
{
    op->co_info.ci_len = 12;
    tp__put_u32le(op->co_info.ci_bytes, (uint32_t)getpid());
    tp__put_u64le(op->co_info.ci_bytes + 4, (uint64_t)(uintptr_t)op->co_buf);
    if (cma_closed_op(ch, op)) {
        return;
    }
    if (ch->c_acks.ca_err != NULL) {
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, cma_down_err(ch, op));
        return;
    }
    tp__list_append(&ch->c_acks.ca_sends, op);
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
    if (err == NULL && !ch->c_closed && ch->c_acks.ca_err == NULL) {
        // Done once the ack is written (chan_ack.c).
        if (tp__chan_acks_ack(&ch->c_acks, op)) {
            return;
        }
        err = tp__error_new(TP_ENOMEM, 0, NULL, "cma: ack: out of memory");
    }
    if (err != NULL) {
        tp__cma_chan_fail(ch, tp_error_ref(err));
    }
    op->co_done(op, err);
    tp__cma_chan_maybe_free(ch);
}

static void
cma_copy_run(cma_copy *cc)
{
    tp_chan_op *op = cc->cc_op;
    tp_error *err = NULL;
    tp_status st =
        tp__cma_read(cc->cc_pid, cc->cc_addr + cc->cc_off,
                     (uint8_t *)op->co_buf + cc->cc_off, cc->cc_len, &err);
    // Alive after the read: the pid was the peer's all along (it cannot be
    // reused while the peer lives). Gone: the bytes may come from whoever
    // got the pid next.
    if (st == TP_OK && !tp__cma_peer_alive(&cc->cc_ch->c_peer)) {
        st = tp__error_set(&err, TP_ECONNRESET,
                           "cma: read from pid %d: process gone during the "
                           "read",
                           (int)cc->cc_pid);
    }
    if (st != TP_OK) {
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

void
tp__cma_chan_recv(tp_chan *ch, tp_chan_op *op)
{
    if (cma_closed_op(ch, op)) {
        return;
    }
    if (ch->c_acks.ca_err != NULL) {
        tp__chan_op_fail_later(ch->c_env.ce_loop, op, cma_down_err(ch, op));
        return;
    }
    if (ch->c_hs != CMA_HS_DONE) {
        tp__list_append(&ch->c_recvs, op); // until the kernel names the peer
        return;
    }
    tp__cma_chan_recv_start(ch, op);
}

void
tp__cma_chan_recv_start(tp_chan *ch, tp_chan_op *op)
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
    // The peer may only offer its own memory: the pid must be the one the
    // kernel gave for the side connection.
    if (pid != ch->c_peer.cp_pid) {
        tp__chan_op_fail_later(
            ch->c_env.ce_loop, op,
            tp__error_new(TP_EPROTO, 0, NULL,
                          "cma: pipe to %s: protocol error: tensor %u of "
                          "message %" PRIu64 " names pid %d, but the peer's "
                          "process is pid %d (SO_PEERCRED); refused",
                          ch->c_env.ce_peer, op->co_index, op->co_seq, (int)pid,
                          (int)ch->c_peer.cp_pid));
        return;
    }
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
