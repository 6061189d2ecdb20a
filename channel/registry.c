// SPDX-License-Identifier: Apache-2.0
// registry.c - the channels compiled in, best first. xth only matches a
// peer in the same process and cma one on the same host, so the order is
// TensorPipe's: same process, then same host, then lanes, then basic.

#include <string.h>

#include "channel.h"

static const tp_channel_ops *const channel_registry[] = {
    &tp__channel_xth_ops,
    &tp__channel_cma_ops,
    &tp__channel_mpt_ops,
    &tp__channel_basic_ops,
};

const tp_channel_ops *const *
tp__channel_registry(size_t *n_p)
{
    *n_p = sizeof(channel_registry) / sizeof(channel_registry[0]);
    return channel_registry;
}

static void
chan_op_fail_task(void *arg)
{
    tp_chan_op *op = arg;
    tp_error *err = op->co_err;
    op->co_err = NULL;
    op->co_done(op, err);
}

void
tp__chan_op_fail_later(tp_loop *loop, tp_chan_op *op, tp_error *err)
{
    op->co_err = err;
    tp__task_init(&op->co_task, chan_op_fail_task, op);
    tp__loop_defer(loop, &op->co_task);
}
