// SPDX-License-Identifier: Apache-2.0
// tunables.c - the store's tunables: the client's deadline and value
// limit (in tp_config), the init method (parsed by url.c), and the tcp
// store server's bounds (read and checked by tcp_server_opts.c, whose
// table holds their values; the two must agree, config_test checks the
// listing).

#include "core/config.h"
#include "core/platform.h"

static const tp_tunable store_tunable_rows[] = {
    {
        .tu_name = "store_timeout_ms",
        .tu_env = "TP_STORE_TIMEOUT_MS",
        // 5 min: PyTorch's default store timeout for rendezvous.
        .tu_def = "300000",
        .tu_doc = "default deadline of store operations and of connecting "
                  "to the store, in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(store_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "store_max_value",
        .tu_env = "TP_STORE_MAX_VALUE",
        .tu_def = "64M",
        .tu_doc = "largest value the store accepts, in bytes",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(store_max_value),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_GIB,
    },
    // Read by tp_agent_options_init and the tools; parsed by url.c.
    TP_TUNABLE_EXTERN("init_method", "TP_INIT_METHOD", "env://",
                      "env:// | tcp://HOST:PORT | file:///PATH",
                      "where the workers of a job meet (env://: "
                      "MASTER_ADDR and MASTER_PORT, or the launcher's)"),
    // Read by join.c when a rank joins its job's rendezvous.
    TP_TUNABLE_EXTERN(
        "job_id", "TP_JOB_ID", "",
        "text, up to 64 characters of [A-Za-z0-9._:+-] (others become _)",
        "this job's id, the same on every rank, so jobs "
        "sharing a store stay apart (empty: the launcher's "
        "job id, if any)"),
    TP_TUNABLE_EXTERN("store_max_conns", "TP_STORE_MAX_CONNS", "1024",
                      "1..1048576", "most clients a tcp store server serves"),
    TP_TUNABLE_EXTERN("store_idle_timeout_ms", "TP_STORE_IDLE_TIMEOUT_MS",
                      "300000", "1..86400000 ms, or 0 for none",
                      "a tcp store server drops a client idle this long"),
    TP_TUNABLE_EXTERN("store_request_timeout_ms", "TP_STORE_REQUEST_TIMEOUT_MS",
                      "10000", "1..86400000 ms, or 0 for none",
                      "a tcp store server drops a client that takes longer "
                      "to send one request"),
    TP_TUNABLE_EXTERN("store_max_bytes", "TP_STORE_MAX_BYTES", "1G",
                      "1..1024G bytes (K, M, G suffixes)",
                      "most bytes of keys and values a tcp store server "
                      "holds"),
};

const tp_tunables tp__store_tunables = {
    .ts_component = "store",
    .ts_rows = store_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(store_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};
