// SPDX-License-Identifier: Apache-2.0
// tunables.c - the tunables of the generic transport layer (every
// backend's address choice and connect deadline, fault injection); each
// backend's own are in its folder, reached through its ops' `tunables`.

#include "core/config.h"
#include "core/platform.h"

static const tp_tunable transport_tunable_rows[] = {
    {
        .tu_name = "socket_ifname",
        .tu_env = "TP_SOCKET_IFNAME",
        .tu_def = "",
        .tu_doc = "network interface for pipes, store and collectives "
                  "(empty: choose one)",
        .tu_type = TP_TUNABLE_STR,
        TP_TUNABLE_CONFIG_FIELD(socket_ifname),
    },
    {
        .tu_name = "socket_addr",
        .tu_env = "TP_SOCKET_ADDR",
        .tu_def = "",
        .tu_doc = "address to listen on and advertise (empty: from the "
                  "interface)",
        .tu_type = TP_TUNABLE_STR,
        TP_TUNABLE_CONFIG_FIELD(socket_addr),
    },
    {
        .tu_name = "connect_timeout_ms",
        .tu_env = "TP_CONNECT_TIMEOUT_MS",
        .tu_def = "10000",
        .tu_doc = "deadline of one connection attempt, in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(connect_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    // Read by tp__transport_create (transport.c), parsed by fault.c.
    TP_TUNABLE_EXTERN("fault", "TP_FAULT", "",
                      "comma-separated close_after=N, drop_after=N, "
                      "stall_after=N, delay_ms=D, transport=NAME "
                      "(docs/faults.md)",
                      "fault injection on every connection of the named "
                      "transport (tests; empty: none)"),
};

const tp_tunables tp__transport_tunables = {
    .ts_component = "transport",
    .ts_rows = transport_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(transport_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};
