// SPDX-License-Identifier: Apache-2.0
// basic.c - the basic channel: tensor bytes travel on the pipe's own
// connection, right after the descriptor and the payloads, read straight
// into the destination buffer. Works wherever the transport does.

#include <stdio.h>

#include "channel/channel.h"

static unsigned
basic_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 0;
}

static bool
basic_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    (void)why;
    (void)why_len;
    return true;
}

static tp_status
basic_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    (void)cfg;
    (void)err_p;
    snprintf(buf, len, "any");
    return TP_OK;
}

const tp_channel_ops tp__channel_basic_ops = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "basic",
    .devices = TP_CHAN_DEV_CPU_CPU,
    .inline_data = true,
    .nconns = basic_nconns,
    .is_viable = basic_is_viable,
    .domain = basic_domain,
};
