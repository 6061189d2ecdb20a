// SPDX-License-Identifier: Apache-2.0
// registry.c - the channels compiled in, best first, and the contract's
// helpers. The table is generated from channel/*/backend.cmake
// (cmake/TpBackends.cmake) into the build's gen/tp_channel_list.inc. xth
// only matches a peer in the same process and cma one on the same host, so
// the order is TensorPipe's: same process, then same host, then lanes,
// then basic.

#include <string.h>

#include "channel.h"

#include "tp_channel_list.inc"

const tp_channel_ops *const *
tp__channel_registry(size_t *n_p)
{
    *n_p = sizeof(channel_registry) / sizeof(channel_registry[0]);
    return channel_registry;
}

const tp_channel_ops *
tp__channel_find(const char *name)
{
    for (size_t i = 0;
         i < sizeof(channel_registry) / sizeof(channel_registry[0]); i++) {
        if (strcmp(channel_registry[i]->name, name) == 0) {
            return channel_registry[i];
        }
    }
    return NULL;
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
