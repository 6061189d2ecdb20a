// SPDX-License-Identifier: Apache-2.0
// mpt.c - the mpt channel: tensor bytes over N lanes, each a tcp
// connection served by its own loop thread. A tensor up to mpt_inline_max
// goes on the pipe's own connection (a lane's thread hops only add
// latency to it); one below mpt_split_min
// travels whole on one lane (round robin); a larger one is cut into N
// contiguous pieces, one per lane. Both ends make the same calls in the
// same order, so each derives the placement from its own counter and
// nothing about placement goes on the wire; the split size is part of
// the domain descriptor, so two ends with different settings never pair.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "channel/channel.h"
#include "core/alloc.h"

typedef struct mpt_piece {
    tp_chan *mp_ch;
    tp_chan_op *mp_op;
    tp_aio mp_aio;
    tp_task mp_task;
} mpt_piece;

struct tp_chan {
    tp_chan_env m_env;
    unsigned m_nlanes;
    uint64_t m_split_min;
    uint64_t m_send_rr;
    uint64_t m_recv_rr;
    bool m_closed;
};

static unsigned
mpt_nconns(const tp_config *cfg, bool *lanes_p)
{
    *lanes_p = true;
    return (unsigned)cfg->mpt_lanes;
}

static bool
mpt_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    (void)why;
    (void)why_len;
    return true;
}

static tp_status
mpt_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    (void)err_p;
    snprintf(buf, len, "mpt:split=%lld:inline=%lld",
             (long long)cfg->mpt_split_min, (long long)cfg->mpt_inline_max);
    return TP_OK;
}

static uint64_t
mpt_inline_max(const tp_config *cfg)
{
    return (uint64_t)cfg->mpt_inline_max;
}

static tp_status
mpt_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    if (env->ce_nconns == 0) {
        return tp__error_set(err_p, TP_EINTERNAL, "mpt: no lanes");
    }
    tp_chan *ch = tp__zalloc(sizeof(*ch));
    if (ch == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "mpt: out of memory");
    }
    ch->m_env = *env;
    ch->m_nlanes = env->ce_nconns;
    ch->m_split_min = (uint64_t)env->ce_cfg->mpt_split_min;
    *ch_p = ch;
    return TP_OK;
}

// x_loop: a piece is done.
static void
mpt_piece_task(void *arg)
{
    mpt_piece *mp = arg;
    tp_chan_op *op = mp->mp_op;
    tp_status st = tp_aio_status(&mp->mp_aio);
    if (st != TP_OK && op->co_err == NULL) {
        op->co_err =
            tp__error_new(st, 0, tp_aio_error(&mp->mp_aio),
                          "mpt: pipe to %s: lane", mp->mp_ch->m_env.ce_peer);
    }
    // Waits for the lane loop to be done with the aio (it posted us from
    // the callback).
    tp__aio_fini(&mp->mp_aio);
    tp__free(mp);
    if (--op->co_parts == 0) {
        tp_error *err = op->co_err;
        op->co_err = NULL;
        op->co_done(op, err);
    }
}

static void
mpt_piece_cb(void *arg)
{
    mpt_piece *mp = arg;
    tp__task_init(&mp->mp_task, mpt_piece_task, mp);
    tp__loop_post(mp->mp_ch->m_env.ce_loop, &mp->mp_task);
}

static void
mpt_start(tp_chan *ch, tp_chan_op *op, bool write)
{
    uint64_t *rr = write ? &ch->m_send_rr : &ch->m_recv_rr;
    unsigned n = ch->m_nlanes;
    unsigned first, count;
    uint64_t piece;
    if (op->co_len < ch->m_split_min || n == 1) {
        first = (unsigned)(*rr % n);
        (*rr)++;
        count = 1;
        piece = op->co_len;
    } else {
        first = 0;
        piece = (op->co_len + n - 1) / n;
        piece = (piece + 63) & ~(uint64_t)63; // cache-line aligned cuts
        count = (unsigned)((op->co_len + piece - 1) / piece);
    }
    op->co_parts = (int)count;
    op->co_err = NULL;
    if (write) {
        op->co_info.ci_len = 0;
    }
    for (unsigned i = 0; i < count; i++) {
        uint64_t off = (uint64_t)i * piece;
        uint64_t len = op->co_len - off < piece ? op->co_len - off : piece;
        mpt_piece *mp = tp__zalloc(sizeof(*mp));
        if (mp == NULL) {
            // The lane streams are now out of step: the pipe must go.
            ch->m_env.ce_fail(
                ch->m_env.ce_pipe,
                tp__error_new(TP_ENOMEM, 0, NULL, "mpt: out of memory"));
            op->co_parts -= (int)(count - i);
            if (op->co_parts == 0) {
                tp__chan_op_fail_later(
                    ch->m_env.ce_loop, op,
                    tp__error_new(TP_ENOMEM, 0, NULL, "mpt: out of memory"));
            }
            return;
        }
        mp->mp_ch = ch;
        mp->mp_op = op;
        tp__aio_init(&mp->mp_aio, mpt_piece_cb, mp);
        tp_iov iov = {(uint8_t *)op->co_buf + off, len};
        tp_aio_set_iov(&mp->mp_aio, 1, &iov);
        tp_conn *lane = ch->m_env.ce_conns[(first + i) % n];
        if (write) {
            tp__conn_write(lane, &mp->mp_aio);
        } else {
            tp__conn_read(lane, &mp->mp_aio);
        }
    }
}

static void
mpt_send(tp_chan *ch, tp_chan_op *op)
{
    mpt_start(ch, op, true);
}

static void
mpt_recv(tp_chan *ch, tp_chan_op *op)
{
    mpt_start(ch, op, false);
}

static void
mpt_close(tp_chan *ch, const tp_error *err)
{
    (void)err;
    // The pipe closes the lanes: every piece completes with an error.
    ch->m_closed = true;
}

static void
mpt_destroy(tp_chan *ch)
{
    tp__free(ch);
}

// mpt's tunables: fields of tp_config (context options set mpt_lanes).
static const tp_tunable mpt_tunable_rows[] = {
    {
        .tu_name = "mpt_lanes",
        .tu_env = "TP_MPT_LANES",
        .tu_def = "2",
        .tu_doc = "lanes (tcp connections, each with its own loop thread) "
                  "of the mpt channel",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(mpt_lanes),
        .tu_min = 1,
        .tu_max = 64,
        .tu_unit = "lanes",
    },
    {
        .tu_name = "mpt_split_min",
        .tu_env = "TP_MPT_SPLIT_MIN",
        .tu_def = "256K",
        .tu_doc = "tensors smaller than this travel whole on one mpt lane "
                  "(round robin); larger ones are striped over all lanes",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(mpt_split_min),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
    {
        .tu_name = "mpt_inline_max",
        .tu_env = "TP_MPT_INLINE_MAX",
        // 64K: below it a lane's two thread hops cost more than the bytes
        // (tcp+mpt 4K stream: 0.08 GB/s through a lane, ~1 through the
        // pipe's connection on this VM).
        .tu_def = "64K",
        .tu_doc = "mpt tensors up to this size travel on the pipe's own "
                  "connection instead of a lane",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(mpt_inline_max),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
};

static const tp_tunables tp__mpt_tunables = {
    .ts_component = "mpt",
    .ts_rows = mpt_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(mpt_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};

const tp_channel_ops tp__channel_mpt_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "mpt",
    .devices = TP_CHAN_DEV_CPU_CPU,
    .tunables = &tp__mpt_tunables,
    .nconns = mpt_nconns,
    .is_viable = mpt_is_viable,
    .domain = mpt_domain,
    .inline_max = mpt_inline_max,
    .create = mpt_create,
    .send = mpt_send,
    .recv = mpt_recv,
    .close = mpt_close,
    .destroy = mpt_destroy,
};
