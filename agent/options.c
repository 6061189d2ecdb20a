// SPDX-License-Identifier: Apache-2.0
// options.c - the agent's tunables. tp__agent_tunables declares them all
// for the listings (core/tunables.h): the thread count and deadlines,
// loaded into tp_config, and the agent's own options (caps on what a peer
// can make it allocate, the faulty mode of tests, the flight recorder),
// whose table ag_opts below reads from the environment in
// tp_agent_options_init and checks again in tp_rpc_init, which fails
// naming a malformed variable. A row of ag_opts and its declaration must
// agree (default, bounds).

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"
#include "core/config.h"

#define KIB (1024ull)
#define GIB (1024ull * 1024 * 1024)

typedef enum opt_type { OPT_SIZE, OPT_INT, OPT_STR } opt_type;

typedef struct ag_opt {
    const char *o_field; // for messages
    const char *o_env;
    opt_type o_type;
    size_t o_off; // in tp_agent_options
    uint64_t o_def;
    uint64_t o_min, o_max;
} ag_opt;

#define OPT_OFF(f) offsetof(tp_agent_options, f)

static const ag_opt ag_opts[] = {
    // 8 GiB: a whole fp16 shard of a 4-billion-parameter model in one
    // message, more than any single tensor of usual training jobs, while
    // one peer cannot make this worker reserve more in one go.
    {"max_message_bytes", "TP_RPC_MAX_MESSAGE_BYTES", OPT_SIZE,
     OPT_OFF(max_message_bytes), 8 * GIB, 4 * KIB, UINT64_MAX},
    // 16 GiB: two messages of the largest size at once per peer (a
    // request in its handler and the next one arriving).
    {"max_peer_inflight_bytes", "TP_RPC_MAX_PEER_INFLIGHT_BYTES", OPT_SIZE,
     OPT_OFF(max_peer_inflight_bytes), 16 * GIB, 4 * KIB, UINT64_MAX},
    {"faulty", "TP_RPC_FAULTY", OPT_STR, OPT_OFF(faulty), 0, 0, 0},
    // 64 messages: a few calls and their replies to each peer of a small
    // job; 1M records would be 112 MiB.
    {"flight_recorder", "TP_RPC_FLIGHT_RECORDER", OPT_INT,
     OPT_OFF(flight_recorder), 64, 0, 1u << 20},
    // PyTorch's device maps and devices (devmap.c checks them).
    {"device_maps", "TP_RPC_DEVICE_MAPS", OPT_STR, OPT_OFF(device_maps), 0, 0,
     0},
    {"devices", "TP_RPC_DEVICES", OPT_STR, OPT_OFF(devices), 0, 0, 0},
};

static const tp_tunable agent_tunable_rows[] = {
    {
        .tu_name = "num_worker_threads",
        .tu_env = "TP_NUM_WORKER_THREADS",
        // PyTorch's TensorPipeRpcBackendOptions default.
        .tu_def = "16",
        .tu_doc = "threads of an RPC agent that run handlers and the "
                  "callbacks of RPC futures",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(num_worker_threads),
        .tu_min = 1,
        .tu_max = TP_POOL_MAX_THREADS,
        .tu_unit = "threads",
    },
    {
        .tu_name = "rpc_timeout_ms",
        .tu_env = "TP_RPC_TIMEOUT_MS",
        // PyTorch's default rpc_timeout: 60 s.
        .tu_def = "60000",
        .tu_doc = "default deadline of an RPC, in ms (0: none)",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(rpc_timeout_ms),
        .tu_min = 0,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "rpc_init_timeout_ms",
        .tu_env = "TP_RPC_INIT_TIMEOUT_MS",
        .tu_def = "60000",
        .tu_doc = "deadline of tp_rpc_init (every worker joins), in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(rpc_init_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "rpc_shutdown_timeout_ms",
        .tu_env = "TP_RPC_SHUTDOWN_TIMEOUT_MS",
        .tu_def = "60000",
        .tu_doc = "deadline of a graceful tp_rpc_shutdown, in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(rpc_shutdown_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    // The rows of ag_opts above (read by opt_read_env).
    TP_TUNABLE_EXTERN("rpc_max_message_bytes", "TP_RPC_MAX_MESSAGE_BYTES", "8G",
                      "4K..16E bytes (K, M, G, T suffixes)",
                      "largest message an RPC agent accepts from a peer"),
    TP_TUNABLE_EXTERN("rpc_max_peer_inflight_bytes",
                      "TP_RPC_MAX_PEER_INFLIGHT_BYTES", "16G",
                      "4K..16E bytes (K, M, G, T suffixes), at least "
                      "TP_RPC_MAX_MESSAGE_BYTES",
                      "bytes an RPC agent holds from one peer, received and "
                      "not yet handed over"),
    TP_TUNABLE_EXTERN("rpc_faulty", "TP_RPC_FAULTY", "",
                      "fail=KINDS:N and delay=KINDS:MS rules, joined by , "
                      "(docs/rpc.md)",
                      "tests only: an RPC agent fails or delays its sends "
                      "(empty: off)"),
    TP_TUNABLE_EXTERN("rpc_flight_recorder", "TP_RPC_FLIGHT_RECORDER", "64",
                      "0..1048576 messages",
                      "messages an RPC agent's flight recorder keeps (0: "
                      "off)"),
    TP_TUNABLE_EXTERN("rpc_device_maps", "TP_RPC_DEVICE_MAPS", "",
                      "WORKER=L:R[,L:R...][;WORKER=...] CUDA device indexes",
                      "PyTorch's set_device_map: a CUDA tensor on cuda:L "
                      "sent to WORKER arrives on its cuda:R (docs/rpc.md)"),
    TP_TUNABLE_EXTERN("rpc_devices", "TP_RPC_DEVICES", "",
                      "CUDA device indexes joined by , (empty: those of "
                      "the device maps)",
                      "PyTorch's devices: the CUDA devices an RPC agent "
                      "uses"),
};

const tp_tunables tp__agent_tunables = {
    .ts_component = "agent",
    .ts_rows = agent_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(agent_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};

// "123", "64K", "8G", "1T" (binary units, an optional "B" or "iB" after
// the letter): strict, no sign, no space, no overflow.
static bool
parse_size(const char *s, uint64_t *v_p)
{
    if (s[0] < '0' || s[0] > '9') {
        return false;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0) {
        return false;
    }
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case 't':
    case 'T':
        shift = 40;
        break;
    default:
        break;
    }
    if (shift > 0) {
        end++;
        if (end[0] == 'i' && end[1] == 'B') {
            end += 2;
        } else if (end[0] == 'B') {
            end++;
        }
    } else if (end[0] == 'B') {
        end++;
    }
    if (*end != '\0' || (shift > 0 && v > (UINT64_MAX >> shift))) {
        return false;
    }
    *v_p = (uint64_t)v << shift;
    return true;
}

// Reads @d's variable into @o (untouched if unset). TP_EINVAL naming it if
// malformed or out of range.
static tp_status
opt_read_env(const ag_opt *d, tp_agent_options *o, tp_error **err_p)
{
    const char *s = getenv(d->o_env);
    if (s == NULL || s[0] == '\0') {
        return TP_OK;
    }
    void *field = (char *)o + d->o_off;
    if (d->o_type == OPT_STR) {
        *(const char **)field = s;
        return TP_OK;
    }
    uint64_t v;
    if (!parse_size(s, &v) ||
        (d->o_type == OPT_INT && s[strspn(s, "0123456789")] != '\0') ||
        v < d->o_min || v > d->o_max) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "%s=\"%s\": expected %s from %" PRIu64 " to %" PRIu64, d->o_env, s,
            d->o_type == OPT_SIZE ? "a size in bytes (K, M, G, T suffixes)"
                                  : "a number",
            d->o_min, d->o_max);
    }
    if (d->o_type == OPT_SIZE) {
        *(uint64_t *)field = v;
    } else {
        *(int *)field = (int)v;
    }
    return TP_OK;
}

void
tp__ag_options_defaults(tp_agent_options *o)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(ag_opts); i++) {
        const ag_opt *d = &ag_opts[i];
        void *field = (char *)o + d->o_off;
        if (d->o_type == OPT_SIZE) {
            *(uint64_t *)field = d->o_def;
        } else if (d->o_type == OPT_INT) {
            *(int *)field = (int)d->o_def;
        }
        tp_error *err = NULL;
        if (opt_read_env(d, o, &err) != TP_OK) {
            tp_error_unref(err); // tp_rpc_init reports it
        }
    }
}

tp_status
tp__ag_options_check(tp_agent_options *ao, tp_error **err_p)
{
    // A malformed variable fails init even when the program set the
    // field itself (as for core's tunables).
    tp_agent_options scratch;
    memset(&scratch, 0, sizeof(scratch));
    for (size_t i = 0; i < TP_ARRAY_LEN(ag_opts); i++) {
        tp_status st = opt_read_env(&ag_opts[i], &scratch, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "rpc init");
        }
    }
    for (size_t i = 0; i < TP_ARRAY_LEN(ag_opts); i++) {
        const ag_opt *d = &ag_opts[i];
        const void *field = (const char *)ao + d->o_off;
        uint64_t v;
        if (d->o_type == OPT_SIZE) {
            v = *(const uint64_t *)field;
        } else if (d->o_type == OPT_INT) {
            int x = *(const int *)field;
            v = x < 0 ? UINT64_MAX : (uint64_t)x;
        } else {
            continue;
        }
        if (v < d->o_min || v > d->o_max) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "rpc init: %s %" PRIu64 ", expected %" PRIu64
                                 "..%" PRIu64 " (%s)",
                                 d->o_field, v, d->o_min, d->o_max, d->o_env);
        }
    }
    if (ao->max_peer_inflight_bytes < ao->max_message_bytes) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init: max_peer_inflight_bytes %" PRIu64
                             " is below max_message_bytes %" PRIu64,
                             ao->max_peer_inflight_bytes,
                             ao->max_message_bytes);
    }
    return TP_OK;
}
