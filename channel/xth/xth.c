// SPDX-License-Identifier: Apache-2.0
// xth.c - the xth channel: both ends in one process. The sender registers
// each tensor in a process-wide table under a random token and sends only
// the token; the receiver takes the entry out of the table and copies the
// bytes once (large copies on the context's pool), then tells the sender.
// Nothing read from the wire is used as an address: an unknown token is a
// protocol error.

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "channel/channel.h"
#include "core/alloc.h"
#include "core/wire.h"

// Copies up to this size run on the loop: below it, a pool thread's
// wake-up costs more than the copy. Larger ones are copied in two halves
// in parallel: one on the copy pool, the other on the loop while it is at
// most XTH_LOOP_HALF (else on the pool too).
#define XTH_INLINE_COPY (256u * 1024u)
#define XTH_LOOP_HALF   (4u * 1024u * 1024u)

typedef struct xth_entry {
    struct xth_entry *e_next;
    uint64_t e_token;
    tp_chan_op *e_op;  // the sender's op
    tp_loop *e_loop;   // the sender's loop
    tp_chan *e_ch;     // the sender's channel
    tp_chan_op *e_rop; // the receiver's op, once claimed
    tp_loop *e_rloop;
    tp_task e_task;
    tp_task e_rtask[2];   // the two halves of a large copy
    _Atomic int e_halves; // halves still copying
    tp_error *e_err;
} xth_entry;

struct tp_chan {
    tp_chan_env x_env;
    uint64_t x_nsent; // entries of ours still in the table
};

static pthread_mutex_t xth_mtx = PTHREAD_MUTEX_INITIALIZER;
static xth_entry *xth_table;
static uint64_t xth_secret;

static unsigned
xth_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 0;
}

static bool
xth_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    (void)why;
    (void)why_len;
    return true;
}

static tp_status
xth_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    (void)cfg;
    (void)err_p;
    pthread_mutex_lock(&xth_mtx);
    if (xth_secret == 0) {
        xth_secret = tp__random_u64();
    }
    uint64_t s = xth_secret;
    pthread_mutex_unlock(&xth_mtx);
    // Same pid and same random number: the same process (a forked child
    // inherits the number but not the pid).
    snprintf(buf, len, "xth:pid=%d:%016" PRIx64, (int)getpid(), s);
    return TP_OK;
}

static tp_status
xth_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    tp_chan *ch = tp__zalloc(sizeof(*ch));
    if (ch == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "xth: out of memory");
    }
    ch->x_env = *env;
    *ch_p = ch;
    return TP_OK;
}

// Sender's loop: the receiver is done with the buffer (or it failed).
static void
xth_send_done_task(void *arg)
{
    xth_entry *e = arg;
    tp_chan_op *op = e->e_op;
    tp_error *err = e->e_err;
    tp__free(e);
    op->co_done(op, err);
}

static void
xth_send(tp_chan *ch, tp_chan_op *op)
{
    xth_entry *e = tp__zalloc(sizeof(*e));
    if (e == NULL) {
        op->co_info.ci_len = 0;
        tp__chan_op_fail_later(
            ch->x_env.ce_loop, op,
            tp__error_new(TP_ENOMEM, 0, NULL, "xth: out of memory"));
        return;
    }
    e->e_op = op;
    e->e_loop = ch->x_env.ce_loop;
    e->e_ch = ch;
    e->e_token = tp__random_u64();
    pthread_mutex_lock(&xth_mtx);
    e->e_next = xth_table;
    xth_table = e;
    pthread_mutex_unlock(&xth_mtx);
    op->co_info.ci_len = 8;
    tp__put_u64le(op->co_info.ci_bytes, e->e_token);
}

// Receiver's loop.
static void
xth_recv_done_task(void *arg)
{
    tp_chan_op *rop = arg;
    tp_error *err = rop->co_err;
    rop->co_err = NULL;
    rop->co_done(rop, err);
}

static void
xth_copy(xth_entry *e)
{
    tp_chan_op *rop = e->e_rop;
    memcpy(rop->co_buf, e->e_op->co_buf, rop->co_len);
}

// Pool thread: one half of a large copy; the last half done completes.
static void
xth_copy_half(xth_entry *e, unsigned half)
{
    tp_chan_op *rop = e->e_rop;
    uint64_t h = (rop->co_len / 2 + 4095) & ~(uint64_t)4095;
    uint64_t off = half ? h : 0;
    uint64_t len = half ? rop->co_len - h : h;
    memcpy((uint8_t *)rop->co_buf + off, (const uint8_t *)e->e_op->co_buf + off,
           len);
    if (atomic_fetch_sub_explicit(&e->e_halves, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp_loop *rloop = e->e_rloop;
    tp__task_init(&rop->co_task, xth_recv_done_task, rop);
    tp__task_init(&e->e_task, xth_send_done_task, e);
    tp__loop_post(e->e_loop, &e->e_task); // e may be freed after this
    tp__loop_post(rloop, &rop->co_task);
}

static void
xth_copy_task0(void *arg)
{
    xth_copy_half(arg, 0);
}

static void
xth_copy_task1(void *arg)
{
    xth_copy_half(arg, 1);
}

static void
xth_recv(tp_chan *ch, tp_chan_op *op)
{
    xth_entry *e = NULL;
    uint64_t token = 0;
    if (op->co_info.ci_len == 8) {
        token = tp__get_u64le(op->co_info.ci_bytes);
        pthread_mutex_lock(&xth_mtx);
        for (xth_entry **pp = &xth_table; *pp != NULL; pp = &(*pp)->e_next) {
            if ((*pp)->e_token == token) {
                e = *pp;
                *pp = e->e_next;
                break;
            }
        }
        pthread_mutex_unlock(&xth_mtx);
    }
    tp__task_init(&op->co_task, xth_recv_done_task, op);
    if (e == NULL || e->e_op->co_len != op->co_len) {
        // No entry: the sender's pipe closed and took its tensors back (or
        // the token is bad); the pipe's own error usually says more.
        op->co_err = tp__error_new(
            e == NULL ? TP_ECONNRESET : TP_EPROTO, 0, NULL,
            "xth: pipe to %s: tensor %u of message %" PRIu64 " %s",
            ch->x_env.ce_peer, op->co_index, op->co_seq,
            e == NULL ? "is no longer offered by the sender (its pipe "
                        "closed, or the token is bad)"
                      : "has another length than its descriptor said "
                        "(protocol error)");
        if (e != NULL) {
            e->e_err = tp__error_new(
                TP_EPROTO, 0, NULL,
                "xth: pipe to %s: the receiver expected %" PRIu64 " bytes",
                e->e_ch->x_env.ce_peer, op->co_len);
            tp__task_init(&e->e_task, xth_send_done_task, e);
            tp__loop_post(e->e_loop, &e->e_task);
        }
        tp__loop_defer(ch->x_env.ce_loop, &op->co_task);
        return;
    }
    e->e_rop = op;
    e->e_rloop = ch->x_env.ce_loop;
    if (op->co_len > XTH_INLINE_COPY) {
        // Two halves in parallel on the copy pool; the last one completes.
        atomic_init(&e->e_halves, 2);
        tp__task_init(&e->e_rtask[0], xth_copy_task0, e);
        tp__task_init(&e->e_rtask[1], xth_copy_task1, e);
        if (tp__pool_submit(ch->x_env.ce_pool, &e->e_rtask[1]) == TP_OK) {
            if (op->co_len / 2 > XTH_LOOP_HALF &&
                tp__pool_submit(ch->x_env.ce_pool, &e->e_rtask[0]) == TP_OK) {
                return; // completes from the pool
            }
            xth_copy_half(e, 0); // the last half done completes
            return;
        }
    }
    xth_copy(e);
    tp__task_init(&e->e_task, xth_send_done_task, e);
    tp__loop_post(e->e_loop, &e->e_task);
    tp__loop_defer(ch->x_env.ce_loop, &op->co_task);
}

static void
xth_close(tp_chan *ch, const tp_error *err)
{
    // Our tensors nobody claimed yet: take them back and fail them.
    pthread_mutex_lock(&xth_mtx);
    xth_entry *mine = NULL;
    for (xth_entry **pp = &xth_table; *pp != NULL;) {
        xth_entry *e = *pp;
        if (e->e_ch == ch) {
            *pp = e->e_next;
            e->e_next = mine;
            mine = e;
        } else {
            pp = &e->e_next;
        }
    }
    pthread_mutex_unlock(&xth_mtx);
    while (mine != NULL) {
        xth_entry *e = mine;
        mine = e->e_next;
        e->e_err = tp_error_ref(err);
        tp__task_init(&e->e_task, xth_send_done_task, e);
        tp__loop_defer(ch->x_env.ce_loop, &e->e_task);
    }
}

static void
xth_destroy(tp_chan *ch)
{
    tp__free(ch);
}

const tp_channel_ops tp__channel_xth_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "xth",
    .devices = TP_CHAN_DEV_CPU_CPU,
    .nconns = xth_nconns,
    .is_viable = xth_is_viable,
    .domain = xth_domain,
    .create = xth_create,
    .send = xth_send,
    .recv = xth_recv,
    .close = xth_close,
    .destroy = xth_destroy,
};
