// SPDX-License-Identifier: Apache-2.0
// tunables.c - the ibv transport's tunables table (verbs.h has the struct;
// docs/transport-ibv.md says how each is used) and the parser of
// TP_IBV_DEVICE's "name:port" form, shared by the real verbs and the fake.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/platform.h"
#include "transport/ibv/verbs.h"

static const tp_tunable ibv_tunable_rows[] = {
    {
        .tu_name = "ibv_device",
        .tu_env = "TP_IBV_DEVICE",
        .tu_def = "",
        .tu_doc = "the RDMA device to use, as ibv_devices names it "
                  "(\"mlx5_0\", or \"mlx5_0:1\" with a port); empty: the "
                  "first device with an active port",
        .tu_type = TP_TUNABLE_STR,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_device),
    },
    {
        .tu_name = "ibv_port",
        .tu_env = "TP_IBV_PORT",
        .tu_def = "0",
        .tu_doc = "the device's port (0: the first active one; a port in "
                  "TP_IBV_DEVICE wins); it must be ACTIVE",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_port),
        .tu_min = 0,
        .tu_max = 255,
        .tu_unit = "port number",
    },
    {
        .tu_name = "ibv_gid_index",
        .tu_env = "TP_IBV_GID_INDEX",
        .tu_def = "-1",
        .tu_doc = "the GID index on RoCE ports (-1: a RoCE v2 IPv4-mapped "
                  "GID if the port has one, else index 0); unused on "
                  "InfiniBand",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_gid_index),
        .tu_min = -1,
        .tu_max = 255,
        .tu_unit = "index",
    },
    {
        .tu_name = "ibv_mtu",
        .tu_env = "TP_IBV_MTU",
        .tu_def = "4096",
        .tu_doc = "cap on the path MTU: a connection uses the smallest of "
                  "this, its port's active MTU and the peer's",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_mtu),
        .tu_min = 256,
        .tu_max = 4096,
        .tu_flags = TP_TUNABLE_POW2,
    },
    {
        .tu_name = "ibv_ring_size",
        .tu_env = "TP_IBV_RING_SIZE",
        .tu_def = "2M",
        .tu_doc = "each side's inbox ring per connection (registered "
                  "memory: twice this per connection); both ends must use "
                  "the same",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_ring_size),
        .tu_min = 64 * TP_TUNABLE_KIB,
        .tu_max = TP_TUNABLE_GIB,
        .tu_flags = TP_TUNABLE_POW2,
    },
    {
        .tu_name = "ibv_pool_max",
        .tu_env = "TP_IBV_POOL_MAX",
        .tu_def = "8",
        .tu_doc = "registered ring pairs of closed connections kept for new "
                  "ones (0: register each time)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_pool_max),
        .tu_min = 0,
        .tu_max = TP_IBV_POOL_CAP,
        .tu_unit = "ring pairs",
    },
    {
        .tu_name = "ibv_timeout",
        .tu_env = "TP_IBV_TIMEOUT",
        .tu_def = "14",
        .tu_doc = "the QP's local ACK timeout exponent: 4.096 us * 2^n "
                  "(14: about 67 ms)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_timeout),
        .tu_min = 1,
        .tu_max = 31,
        .tu_unit = "exponent",
    },
    {
        .tu_name = "ibv_retry_cnt",
        .tu_env = "TP_IBV_RETRY_CNT",
        .tu_def = "7",
        .tu_doc = "transport retries before a write fails (and the "
                  "connection with it)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_retry_cnt),
        .tu_min = 0,
        .tu_max = 7,
        .tu_unit = "retries",
    },
    {
        .tu_name = "ibv_sl",
        .tu_env = "TP_IBV_SL",
        .tu_def = "0",
        .tu_doc = "the InfiniBand service level of connections",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_sl),
        .tu_min = 0,
        .tu_max = 15,
        .tu_unit = "level",
    },
    {
        .tu_name = "ibv_tc",
        .tu_env = "TP_IBV_TC",
        .tu_def = "0",
        .tu_doc = "the traffic class of RoCE connections (the GRH's)",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_FIELD(tp_ibv_tunables, it_tc),
        .tu_min = 0,
        .tu_max = 255,
        .tu_unit = "class",
    },
};

const tp_tunables tp__ibv_tunables = {
    .ts_component = "ibv",
    .ts_rows = ibv_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(ibv_tunable_rows),
    .ts_store = TP_TUNABLES_OWN,
    .ts_size = sizeof(tp_ibv_tunables),
};

tp_status
tp__ibv_want_device(const tp_config *cfg, char *name, size_t name_len,
                    unsigned *port_p, tp_error **err_p)
{
    const tp_ibv_tunables *it = tp__ibv_tunables_of(cfg);
    snprintf(name, name_len, "%s", it->it_device);
    *port_p = (unsigned)it->it_port;
    char *colon = strchr(name, ':');
    if (colon == NULL) {
        return TP_OK;
    }
    *colon = '\0';
    char *end = NULL;
    long port = strtol(colon + 1, &end, 10);
    if (name[0] == '\0' || colon[1] < '0' || colon[1] > '9' || *end != '\0' ||
        port < 1 || port > 255) {
        return tp__error_set(err_p, TP_EINVAL,
                             "TP_IBV_DEVICE=%s: expected a device name, "
                             "optionally with \":port\" (1..255), as in "
                             "mlx5_0 or mlx5_0:1",
                             it->it_device);
    }
    *port_p = (unsigned)port;
    return TP_OK;
}
