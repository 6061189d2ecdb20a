// SPDX-License-Identifier: Apache-2.0
// tunables.c - the collectives' tunables: engine and algorithm choice,
// sizes, deadlines, the debug checks and the flight recorder.

#include "core/config.h"
#include "core/platform.h"

static const char *const coll_engines[] = {"auto", "shm", "pipe", NULL};
static const char *const coll_allreduce_algos[] = {"auto", "rd", "ring", NULL};
static const char *const coll_bcast_algos[] = {"auto", "tree", "chain", NULL};

static const tp_tunable coll_tunable_rows[] = {
    {
        .tu_name = "coll_engine",
        .tu_env = "TP_COLL_ENGINE",
        .tu_def = "auto",
        .tu_doc = "where collectives run: auto uses the shared-memory "
                  "engine when every member is on this host, else pipes "
                  "(auto|shm|pipe)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_CONFIG_FIELD(coll_engine),
        .tu_min = 0,
        .tu_max = 2,
        .tu_choices = coll_engines,
    },
    {
        .tu_name = "coll_allreduce",
        .tu_env = "TP_COLL_ALLREDUCE",
        .tu_def = "auto",
        .tu_doc = "all_reduce algorithm of the pipe engine: recursive "
                  "doubling up to coll_small_max, ring above (auto|rd|ring)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_CONFIG_FIELD(coll_allreduce),
        .tu_min = 0,
        .tu_max = 2,
        .tu_choices = coll_allreduce_algos,
    },
    {
        .tu_name = "coll_bcast",
        .tu_env = "TP_COLL_BCAST",
        .tu_def = "auto",
        .tu_doc = "broadcast algorithm of the pipe engine: binomial tree up "
                  "to coll_small_max, pipelined chain above "
                  "(auto|tree|chain)",
        .tu_type = TP_TUNABLE_ENUM,
        TP_TUNABLE_CONFIG_FIELD(coll_bcast),
        .tu_min = 0,
        .tu_max = 2,
        .tu_choices = coll_bcast_algos,
    },
    {
        .tu_name = "coll_small_max",
        .tu_env = "TP_COLL_SMALL_MAX",
        .tu_def = "64K",
        .tu_doc = "largest message of the latency algorithms (recursive "
                  "doubling, tree) of the pipe engine",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(coll_small_max),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_GIB,
    },
    {
        .tu_name = "coll_chunk",
        .tu_env = "TP_COLL_CHUNK",
        .tu_def = "1M",
        .tu_doc = "piece size of the pipelined ring and chain of the pipe "
                  "engine",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(coll_chunk),
        .tu_min = 4096,
        .tu_max = TP_TUNABLE_GIB,
    },
    {
        .tu_name = "coll_shm_slot",
        .tu_env = "TP_COLL_SHM_SLOT",
        .tu_def = "64K",
        .tu_doc = "per-rank slot of the shared-memory engine; larger "
                  "contributions are read with cross-memory attach",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(coll_shm_slot),
        .tu_min = 4096,
        .tu_max = 64 * TP_TUNABLE_MIB,
    },
    {
        .tu_name = "coll_timeout_ms",
        .tu_env = "TP_COLL_TIMEOUT_MS",
        .tu_def = "300000",
        .tu_doc = "default deadline of a collective or point-to-point "
                  "operation, in ms (0: none)",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(coll_timeout_ms),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "coll_init_timeout_ms",
        .tu_env = "TP_COLL_INIT_TIMEOUT_MS",
        .tu_def = "60000",
        .tu_doc = "deadline of tp_pg_init and tp_pg_new_group, in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(coll_init_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "debug_collectives",
        .tu_env = "TP_DEBUG_COLLECTIVES",
        .tu_def = "0",
        .tu_doc = "1: members compare op, dtype, count and root before "
                  "each collective and report a mismatch",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(debug_collectives),
        .tu_min = 0,
        .tu_max = 1,
    },
    // Read by tp__pg_fr_init (pg_fr.c) when a group is created.
    TP_TUNABLE_EXTERN("pg_flight_recorder", "TP_PG_FLIGHT_RECORDER", "64",
                      "0..65536 entries",
                      "collectives each process group remembers for "
                      "tp_pg_dump (0: none)"),
};

const tp_tunables tp__collectives_tunables = {
    .ts_component = "collectives",
    .ts_rows = coll_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(coll_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};
