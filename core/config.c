// SPDX-License-Identifier: Apache-2.0
// config.c - the one table of tunables (STYLE.md §10).
//
// Each tunable is one row of config_table: its name, environment variable,
// default (as text, parsed by the same parser as the environment, so the
// default cannot disagree with the checks), doc line, type, bounds and the
// field of tp_config it fills. Nothing else in the library knows about
// TP_* variables; the environment is read again at every load, never cached,
// so tests and long-running processes see setenv() changes.

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "log.h"
#include "pool.h"

typedef enum config_type {
    CONFIG_INT,  // decimal integer
    CONFIG_SIZE, // bytes, with an optional K, M or G suffix (powers of 1024)
    CONFIG_MS,   // milliseconds, with an optional "ms" or "s" suffix
    CONFIG_STR,  // text that fits the char array of the field
    CONFIG_ENUM, // one of ce_choices (index = value)
} config_type;

// Flags of a table row.
#define CONFIG_POW2    0x1u // the value must be a power of two
#define CONFIG_NUMERIC 0x2u // an enum that also accepts its index as a number

typedef struct config_entry {
    const char *ce_name;
    const char *ce_env;
    const char *ce_def;
    const char *ce_doc;
    config_type ce_type;
    size_t ce_offset;
    size_t ce_size; // of the field: int64_t, or the char array
    int64_t ce_min;
    int64_t ce_max;
    unsigned ce_flags;
    const char *ce_unit;           // shown in error messages of CONFIG_INT
    const char *const *ce_choices; // CONFIG_ENUM, NULL-terminated
} config_entry;

#define CONFIG_FIELD(f)                                                        \
    .ce_offset = offsetof(tp_config, f),                                       \
    .ce_size = sizeof(((tp_config *)NULL)->f)

#define CONFIG_KIB    ((int64_t)1 << 10)
#define CONFIG_MIB    ((int64_t)1 << 20)
#define CONFIG_GIB    ((int64_t)1 << 30)
#define CONFIG_DAY_MS ((int64_t)24 * 3600 * 1000)

static const char *const config_log_levels[] = {
    "off", "error", "warn", "info", "debug", "trace", NULL,
};
static const char *const config_io_backends[] = {"auto", "epoll", "uring",
                                                 NULL};
static const char *const config_coll_engines[] = {"auto", "shm", "pipe", NULL};
static const char *const config_allreduce_algos[] = {"auto", "rd", "ring",
                                                     NULL};
static const char *const config_bcast_algos[] = {"auto", "tree", "chain", NULL};

// The enum values of tp_log_level and tp_io_backend are the indexes above.
_Static_assert(TP_LOG_LEVEL_TRACE == 5, "config_log_levels out of date");
_Static_assert(TP_IO_BACKEND_URING == 2, "config_io_backends out of date");

static const config_entry config_table[] = {
    {
        .ce_name = "log_level",
        .ce_env = "TP_LOG_LEVEL",
        .ce_def = "off",
        .ce_doc = "log messages up to this level "
                  "(off|error|warn|info|debug|trace or 0..5)",
        .ce_type = CONFIG_ENUM,
        CONFIG_FIELD(log_level),
        .ce_min = 0,
        .ce_max = 5,
        .ce_flags = CONFIG_NUMERIC,
        .ce_choices = config_log_levels,
    },
    {
        .ce_name = "io_backend",
        .ce_env = "TP_IO_BACKEND",
        .ce_def = "auto",
        .ce_doc = "loop backend: auto tries io_uring, then falls back to "
                  "epoll (auto|epoll|uring)",
        .ce_type = CONFIG_ENUM,
        CONFIG_FIELD(io_backend),
        .ce_min = 0,
        .ce_max = 2,
        .ce_choices = config_io_backends,
    },
    {
        .ce_name = "socket_ifname",
        .ce_env = "TP_SOCKET_IFNAME",
        .ce_def = "",
        .ce_doc = "network interface for pipes, store and collectives "
                  "(empty: choose one)",
        .ce_type = CONFIG_STR,
        CONFIG_FIELD(socket_ifname),
    },
    {
        .ce_name = "socket_addr",
        .ce_env = "TP_SOCKET_ADDR",
        .ce_def = "",
        .ce_doc = "address to listen on and advertise (empty: from the "
                  "interface)",
        .ce_type = CONFIG_STR,
        CONFIG_FIELD(socket_addr),
    },
    {
        .ce_name = "tcp_sndbuf",
        .ce_env = "TP_TCP_SNDBUF",
        // 1M (both buffers): on loopback, smaller buffers keep the bytes in
        // cache between the two kernel copies (64 MiB stream: 256K 3.0,
        // 1M 2.8-2.95, 2M 2.55-2.6, 4M 2.45, autotuning 2.47 GB/s; 64 MiB
        // round trip 41-43 ms with 1M, 49-51 with 2M; 1 MiB round trips
        // the same within noise). Raise it for links whose
        // bandwidth-delay product is larger.
        .ce_def = "1M",
        .ce_doc = "SO_SNDBUF of tcp connections in bytes (0: kernel default)",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(tcp_sndbuf),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "tcp_rcvbuf",
        .ce_env = "TP_TCP_RCVBUF",
        .ce_def = "1M",
        .ce_doc = "SO_RCVBUF of tcp connections in bytes (0: kernel default)",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(tcp_rcvbuf),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "tcp_user_timeout_ms",
        .ce_env = "TP_TCP_USER_TIMEOUT_MS",
        .ce_def = "30000",
        .ce_doc = "a tcp connection whose peer stops acknowledging (host "
                  "gone, cable cut) fails after this long: TCP_USER_TIMEOUT "
                  "and keepalive probes (0: kernel defaults, ~15 min)",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(tcp_user_timeout_ms),
        .ce_min = 0,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "connect_timeout_ms",
        .ce_env = "TP_CONNECT_TIMEOUT_MS",
        .ce_def = "10000",
        .ce_doc = "deadline of one connection attempt, in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(connect_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "handshake_timeout_ms",
        .ce_env = "TP_HANDSHAKE_TIMEOUT_MS",
        .ce_def = "5000",
        .ce_doc = "deadline of the pipe handshake once connected, in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(handshake_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "shm_ring_size",
        .ce_env = "TP_SHM_RING_SIZE",
        // 512K: small enough to stay in cache while both sides copy, which
        // beats larger rings at every size (bench transport, shm stream:
        // 7.5-7.9 GB/s at 64 MiB against 6.5-6.9 with 4M).
        .ce_def = "512K",
        .ce_doc = "bytes of each shared-memory ring (a power of two)",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(shm_ring_size),
        .ce_min = 64 * CONFIG_KIB,
        .ce_max = CONFIG_GIB,
        .ce_flags = CONFIG_POW2,
    },
    {
        .ce_name = "shm_spin_us",
        .ce_env = "TP_SHM_SPIN_US",
        .ce_def = "50",
        .ce_doc = "microseconds a shm reader spins on its ring before "
                  "sleeping",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(shm_spin_us),
        .ce_min = 0,
        .ce_max = 1000000,
        .ce_unit = "microseconds",
    },
    {
        .ce_name = "loop_spin_us",
        .ce_env = "TP_LOOP_SPIN_US",
        .ce_def = "50",
        .ce_doc = "microseconds a loop keeps polling its fds after the last "
                  "event before sleeping (0: sleep at once)",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(loop_spin_us),
        .ce_min = 0,
        .ce_max = 1000000,
        .ce_unit = "microseconds",
    },
    {
        .ce_name = "pool_threads",
        .ce_env = "TP_POOL_THREADS",
        .ce_def = "4",
        .ce_doc = "threads of the worker pool",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(pool_threads),
        .ce_min = 1,
        .ce_max = TP_POOL_MAX_THREADS,
        .ce_unit = "threads",
    },
    {
        .ce_name = "mpt_lanes",
        .ce_env = "TP_MPT_LANES",
        .ce_def = "2",
        .ce_doc = "lanes (tcp connections, each with its own loop thread) "
                  "of the mpt channel",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(mpt_lanes),
        .ce_min = 1,
        .ce_max = 64,
        .ce_unit = "lanes",
    },
    {
        .ce_name = "mpt_split_min",
        .ce_env = "TP_MPT_SPLIT_MIN",
        .ce_def = "256K",
        .ce_doc = "tensors smaller than this travel whole on one mpt lane "
                  "(round robin); larger ones are striped over all lanes",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(mpt_split_min),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "mpt_inline_max",
        .ce_env = "TP_MPT_INLINE_MAX",
        // 64K: below it a lane's two thread hops cost more than the bytes
        // (tcp+mpt 4K stream: 0.08 GB/s through a lane, ~1 through the
        // pipe's connection on this VM).
        .ce_def = "64K",
        .ce_doc = "mpt tensors up to this size travel on the pipe's own "
                  "connection instead of a lane",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(mpt_inline_max),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "cma_inline_max",
        .ce_env = "TP_CMA_INLINE_MAX",
        // 16K: below it a process_vm_readv plus its ack on the ack
        // connection costs more than copying through the connection.
        .ce_def = "16K",
        .ce_doc = "cma tensors up to this size travel on the pipe's own "
                  "connection instead of being read by the peer",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(cma_inline_max),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "pipe_max_metadata",
        .ce_env = "TP_PIPE_MAX_METADATA",
        .ce_def = "64M",
        .ce_doc = "largest metadata of a message a pipe accepts, in bytes",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(pipe_max_metadata),
        .ce_min = 0,
        .ce_max = 4 * CONFIG_GIB,
    },
    {
        .ce_name = "pipe_max_payloads",
        .ce_env = "TP_PIPE_MAX_PAYLOADS",
        .ce_def = "1024",
        .ce_doc = "most payloads in one message a pipe accepts",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(pipe_max_payloads),
        .ce_min = 0,
        .ce_max = 1 << 20,
        .ce_unit = "payloads",
    },
    {
        .ce_name = "pipe_max_tensors",
        .ce_env = "TP_PIPE_MAX_TENSORS",
        .ce_def = "1024",
        .ce_doc = "most tensors in one message a pipe accepts",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(pipe_max_tensors),
        .ce_min = 0,
        .ce_max = 1 << 20,
        .ce_unit = "tensors",
    },
    {
        .ce_name = "pipe_max_buf_bytes",
        .ce_env = "TP_PIPE_MAX_BUF_BYTES",
        .ce_def = "64G",
        .ce_doc = "largest payload or tensor a pipe accepts, in bytes",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(pipe_max_buf_bytes),
        .ce_min = 0,
        .ce_max = 1024 * CONFIG_GIB,
    },
    {
        .ce_name = "store_timeout_ms",
        .ce_env = "TP_STORE_TIMEOUT_MS",
        // 5 min: PyTorch's default store timeout for rendezvous.
        .ce_def = "300000",
        .ce_doc = "default deadline of store operations and of connecting "
                  "to the store, in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(store_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "store_max_value",
        .ce_env = "TP_STORE_MAX_VALUE",
        .ce_def = "64M",
        .ce_doc = "largest value the store accepts, in bytes",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(store_max_value),
        .ce_min = 1,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "num_worker_threads",
        .ce_env = "TP_NUM_WORKER_THREADS",
        // PyTorch's TensorPipeRpcBackendOptions default.
        .ce_def = "16",
        .ce_doc = "threads of an RPC agent that run handlers and the "
                  "callbacks of RPC futures",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(num_worker_threads),
        .ce_min = 1,
        .ce_max = TP_POOL_MAX_THREADS,
        .ce_unit = "threads",
    },
    {
        .ce_name = "rpc_timeout_ms",
        .ce_env = "TP_RPC_TIMEOUT_MS",
        // PyTorch's default rpc_timeout: 60 s.
        .ce_def = "60000",
        .ce_doc = "default deadline of an RPC, in ms (0: none)",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(rpc_timeout_ms),
        .ce_min = 0,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "rpc_init_timeout_ms",
        .ce_env = "TP_RPC_INIT_TIMEOUT_MS",
        .ce_def = "60000",
        .ce_doc = "deadline of tp_rpc_init (every worker joins), in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(rpc_init_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "rpc_shutdown_timeout_ms",
        .ce_env = "TP_RPC_SHUTDOWN_TIMEOUT_MS",
        .ce_def = "60000",
        .ce_doc = "deadline of a graceful tp_rpc_shutdown, in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(rpc_shutdown_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "coll_engine",
        .ce_env = "TP_COLL_ENGINE",
        .ce_def = "auto",
        .ce_doc = "where collectives run: auto uses the shared-memory "
                  "engine when every member is on this host, else pipes "
                  "(auto|shm|pipe)",
        .ce_type = CONFIG_ENUM,
        CONFIG_FIELD(coll_engine),
        .ce_min = 0,
        .ce_max = 2,
        .ce_choices = config_coll_engines,
    },
    {
        .ce_name = "coll_allreduce",
        .ce_env = "TP_COLL_ALLREDUCE",
        .ce_def = "auto",
        .ce_doc = "all_reduce algorithm of the pipe engine: recursive "
                  "doubling up to coll_small_max, ring above (auto|rd|ring)",
        .ce_type = CONFIG_ENUM,
        CONFIG_FIELD(coll_allreduce),
        .ce_min = 0,
        .ce_max = 2,
        .ce_choices = config_allreduce_algos,
    },
    {
        .ce_name = "coll_bcast",
        .ce_env = "TP_COLL_BCAST",
        .ce_def = "auto",
        .ce_doc = "broadcast algorithm of the pipe engine: binomial tree up "
                  "to coll_small_max, pipelined chain above "
                  "(auto|tree|chain)",
        .ce_type = CONFIG_ENUM,
        CONFIG_FIELD(coll_bcast),
        .ce_min = 0,
        .ce_max = 2,
        .ce_choices = config_bcast_algos,
    },
    {
        .ce_name = "coll_small_max",
        .ce_env = "TP_COLL_SMALL_MAX",
        .ce_def = "64K",
        .ce_doc = "largest message of the latency algorithms (recursive "
                  "doubling, tree) of the pipe engine",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(coll_small_max),
        .ce_min = 0,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "coll_chunk",
        .ce_env = "TP_COLL_CHUNK",
        .ce_def = "1M",
        .ce_doc = "piece size of the pipelined ring and chain of the pipe "
                  "engine",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(coll_chunk),
        .ce_min = 4096,
        .ce_max = CONFIG_GIB,
    },
    {
        .ce_name = "coll_shm_slot",
        .ce_env = "TP_COLL_SHM_SLOT",
        .ce_def = "64K",
        .ce_doc = "per-rank slot of the shared-memory engine; larger "
                  "contributions are read with cross-memory attach",
        .ce_type = CONFIG_SIZE,
        CONFIG_FIELD(coll_shm_slot),
        .ce_min = 4096,
        .ce_max = 64 * CONFIG_MIB,
    },
    {
        .ce_name = "coll_timeout_ms",
        .ce_env = "TP_COLL_TIMEOUT_MS",
        .ce_def = "300000",
        .ce_doc = "default deadline of a collective or point-to-point "
                  "operation, in ms (0: none)",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(coll_timeout_ms),
        .ce_min = 0,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "coll_init_timeout_ms",
        .ce_env = "TP_COLL_INIT_TIMEOUT_MS",
        .ce_def = "60000",
        .ce_doc = "deadline of tp_pg_init and tp_pg_new_group, in ms",
        .ce_type = CONFIG_MS,
        CONFIG_FIELD(coll_init_timeout_ms),
        .ce_min = 1,
        .ce_max = CONFIG_DAY_MS,
    },
    {
        .ce_name = "debug_collectives",
        .ce_env = "TP_DEBUG_COLLECTIVES",
        .ce_def = "0",
        .ce_doc = "1: members compare op, dtype, count and root before "
                  "each collective and report a mismatch",
        .ce_type = CONFIG_INT,
        CONFIG_FIELD(debug_collectives),
        .ce_min = 0,
        .ce_max = 1,
    },
};

// Renders @v with the largest K, M or G suffix that divides it exactly.
static void
config_format_size(int64_t v, char *buf, size_t len)
{
    static const char suffixes[] = {'G', 'M', 'K'};
    static const int64_t units[] = {CONFIG_GIB, CONFIG_MIB, CONFIG_KIB};

    for (size_t i = 0; i < TP_ARRAY_LEN(units); i++) {
        if (v != 0 && v % units[i] == 0) {
            snprintf(buf, len, "%lld%c", (long long)(v / units[i]),
                     suffixes[i]);
            return;
        }
    }
    snprintf(buf, len, "%lld", (long long)v);
}

// Parses a decimal integer at the start of @s into *v_p and points *rest_p
// after it. Rejects leading blanks (strtoll would skip them) and overflow.
static bool
config_parse_int_prefix(const char *s, int64_t *v_p, const char **rest_p)
{
    const char *digits = (s[0] == '-' || s[0] == '+') ? s + 1 : s;
    if (!isdigit((unsigned char)digits[0])) {
        return false;
    }
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) {
        return false;
    }
    *v_p = v;
    *rest_p = end;
    return true;
}

// Returns true and the scaled value if @s is a size ("4194304", "4M").
static bool
config_parse_size(const char *s, int64_t *v_p)
{
    int64_t v;
    const char *rest;
    if (!config_parse_int_prefix(s, &v, &rest) || v < 0) {
        return false;
    }
    int64_t unit = 1;
    switch (rest[0]) {
    case '\0':
        break;
    case 'k':
    case 'K':
        unit = CONFIG_KIB;
        break;
    case 'm':
    case 'M':
        unit = CONFIG_MIB;
        break;
    case 'g':
    case 'G':
        unit = CONFIG_GIB;
        break;
    default:
        return false;
    }
    if (unit != 1 && rest[1] != '\0') {
        return false;
    }
    if (v > INT64_MAX / unit) {
        return false;
    }
    *v_p = v * unit;
    return true;
}

// Returns true and the value in ms if @s is "250", "250ms" or "10s".
static bool
config_parse_ms(const char *s, int64_t *v_p)
{
    int64_t v;
    const char *rest;
    if (!config_parse_int_prefix(s, &v, &rest) || v < 0) {
        return false;
    }
    if (rest[0] == '\0' || strcmp(rest, "ms") == 0) {
        *v_p = v;
        return true;
    }
    if (strcmp(rest, "s") == 0 && v <= INT64_MAX / 1000) {
        *v_p = v * 1000;
        return true;
    }
    return false;
}

static bool
config_parse_enum(const config_entry *e, const char *s, int64_t *v_p)
{
    for (int64_t i = 0; e->ce_choices[i] != NULL; i++) {
        if (strcasecmp(s, e->ce_choices[i]) == 0) {
            *v_p = i;
            return true;
        }
    }
    int64_t v;
    const char *rest;
    if ((e->ce_flags & CONFIG_NUMERIC) != 0 &&
        config_parse_int_prefix(s, &v, &rest) && rest[0] == '\0' &&
        v >= e->ce_min && v <= e->ce_max) {
        *v_p = v;
        return true;
    }
    return false;
}

static bool
config_is_pow2(int64_t v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

// Fills @buf with what @e accepts, completing "<ENV>=<value>: ..." in the
// error message of a malformed value.
static void
config_describe_accepted(const config_entry *e, char *buf, size_t len)
{
    char lo[32];
    char hi[32];

    switch (e->ce_type) {
    case CONFIG_INT:
        snprintf(buf, len, "not an integer between %lld and %lld (%s)",
                 (long long)e->ce_min, (long long)e->ce_max, e->ce_unit);
        break;
    case CONFIG_SIZE:
        config_format_size(e->ce_min, lo, sizeof(lo));
        config_format_size(e->ce_max, hi, sizeof(hi));
        if ((e->ce_flags & CONFIG_POW2) != 0) {
            snprintf(buf, len, "not a power of two between %s and %s", lo, hi);
        } else {
            snprintf(buf, len,
                     "not a size between %s and %s (bytes, or with a K, M or "
                     "G suffix)",
                     lo, hi);
        }
        break;
    case CONFIG_MS:
        snprintf(buf, len,
                 "not a duration between %lld and %lld ms (milliseconds, or "
                 "with an s suffix)",
                 (long long)e->ce_min, (long long)e->ce_max);
        break;
    case CONFIG_STR:
        snprintf(buf, len, "longer than %zu bytes", e->ce_size - 1);
        break;
    case CONFIG_ENUM: {
        size_t off = (size_t)snprintf(buf, len, "not one of ");
        for (size_t i = 0; e->ce_choices[i] != NULL && off < len; i++) {
            off += (size_t)snprintf(buf + off, len - off, "%s%s",
                                    i > 0 ? "|" : "", e->ce_choices[i]);
        }
        if ((e->ce_flags & CONFIG_NUMERIC) != 0 && off < len) {
            snprintf(buf + off, len - off, " or %lld..%lld",
                     (long long)e->ce_min, (long long)e->ce_max);
        }
        break;
    }
    }
}

static int64_t *
config_int_field(const config_entry *e, tp_config *cfg)
{
    TP_ASSERT(e->ce_size == sizeof(int64_t));
    return (int64_t *)(void *)((char *)cfg + e->ce_offset);
}

static const int64_t *
config_int_field_const(const config_entry *e, const tp_config *cfg)
{
    return (const int64_t *)(const void *)((const char *)cfg + e->ce_offset);
}

// Parses @value for @e into @cfg. On failure @cfg is unchanged and the
// error names @label (the variable or name the caller used) and @value.
static tp_status
config_apply(const config_entry *e, tp_config *cfg, const char *label,
             const char *value, tp_error **err_p)
{
    int64_t v = 0;
    bool ok = false;

    switch (e->ce_type) {
    case CONFIG_INT: {
        const char *rest;
        ok = config_parse_int_prefix(value, &v, &rest) && rest[0] == '\0';
        break;
    }
    case CONFIG_SIZE:
        ok = config_parse_size(value, &v);
        if (ok && (e->ce_flags & CONFIG_POW2) != 0) {
            ok = config_is_pow2(v);
        }
        break;
    case CONFIG_MS:
        ok = config_parse_ms(value, &v);
        break;
    case CONFIG_ENUM:
        ok = config_parse_enum(e, value, &v);
        break;
    case CONFIG_STR:
        if (strlen(value) >= e->ce_size) {
            break;
        }
        char *dst = (char *)cfg + e->ce_offset;
        memset(dst, 0, e->ce_size);
        memcpy(dst, value, strlen(value));
        return TP_OK;
    }
    if (ok && (v < e->ce_min || v > e->ce_max)) {
        ok = false;
    }
    if (!ok) {
        char accepted[160];
        config_describe_accepted(e, accepted, sizeof(accepted));
        return tp__error_set(err_p, TP_EINVAL, "%s=%s: %s", label, value,
                             accepted);
    }
    *config_int_field(e, cfg) = v;
    return TP_OK;
}

// Renders the value of @e in @cfg as text, in the form the parser accepts.
static void
config_format_value(const config_entry *e, const tp_config *cfg, char *buf,
                    size_t len)
{
    if (e->ce_type == CONFIG_STR) {
        snprintf(buf, len, "%s", (const char *)cfg + e->ce_offset);
        return;
    }
    int64_t v = *config_int_field_const(e, cfg);
    switch (e->ce_type) {
    case CONFIG_SIZE:
        config_format_size(v, buf, len);
        break;
    case CONFIG_ENUM:
        TP_ASSERT(v >= e->ce_min && v <= e->ce_max);
        snprintf(buf, len, "%s", e->ce_choices[v]);
        break;
    default:
        snprintf(buf, len, "%lld", (long long)v);
        break;
    }
}

void
tp__config_defaults(tp_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < TP_ARRAY_LEN(config_table); i++) {
        const config_entry *e = &config_table[i];
        // A default the parser rejects is a bug in the table above.
        tp_status st = config_apply(e, cfg, e->ce_env, e->ce_def, NULL);
        TP_ASSERT(st == TP_OK);
    }
}

// Applies every TP_* variable that is set. Calls @visit (if not NULL) for
// each row with the raw environment value (NULL if unset) and whether it
// was accepted. Returns the first error; later ones are logged.
static tp_status
config_load_env(tp_config *cfg,
                void (*visit)(const config_entry *e, const tp_config *cfg,
                              const char *env_value, bool ok, void *arg),
                void *arg, tp_error **err_p)
{
    tp_status ret = TP_OK;

    tp__config_defaults(cfg);
    for (size_t i = 0; i < TP_ARRAY_LEN(config_table); i++) {
        const config_entry *e = &config_table[i];
        const char *env_value = getenv(e->ce_env);
        bool ok = true;
        if (env_value != NULL) {
            tp_error *err = NULL;
            if (config_apply(e, cfg, e->ce_env, env_value, &err) != TP_OK) {
                ok = false;
                if (ret == TP_OK) {
                    ret = TP_EINVAL;
                    if (err_p != NULL) {
                        *err_p = tp_error_ref(err);
                    }
                } else {
                    // Only the first error is returned; the caller would
                    // otherwise never hear of the others.
                    TP_LOG_WARN("TP-CONFIG-ENV", "%s", tp_error_message(err));
                }
                tp_error_unref(err);
            }
        }
        if (visit != NULL) {
            visit(e, cfg, env_value, ok, arg);
        }
    }
    return ret;
}

tp_status
tp__config_load(tp_config *cfg, tp_error **err_p)
{
    return config_load_env(cfg, NULL, NULL, err_p);
}

tp_status
tp__config_set(tp_config *cfg, const char *name, const char *value,
               tp_error **err_p)
{
    for (size_t i = 0; i < TP_ARRAY_LEN(config_table); i++) {
        const config_entry *e = &config_table[i];
        if (strcmp(name, e->ce_name) == 0 || strcmp(name, e->ce_env) == 0) {
            return config_apply(e, cfg, name, value, err_p);
        }
    }
    return tp__error_set(err_p, TP_EINVAL, "unknown config tunable %s", name);
}

const char *
tp__io_backend_name(int64_t b)
{
    if (b < 0 || b > TP_IO_BACKEND_URING) {
        return "unknown";
    }
    return config_io_backends[b];
}

typedef struct config_visit_ctx {
    tp_config_visit_fn vc_fn;
    void *vc_arg;
} config_visit_ctx;

static void
config_visit_row(const config_entry *e, const tp_config *cfg,
                 const char *env_value, bool ok, void *arg)
{
    config_visit_ctx *vc = arg;
    // Large enough for the longest string field plus the note below.
    char value[sizeof(cfg->socket_addr) + 64];

    if (ok) {
        config_format_value(e, cfg, value, sizeof(value));
    } else {
        char def[sizeof(cfg->socket_addr)];
        config_format_value(e, cfg, def, sizeof(def));
        snprintf(value, sizeof(value), "%s (invalid, using %s)", env_value,
                 def);
    }
    tp_config_item item = {
        .name = e->ce_name,
        .env = e->ce_env,
        .def = e->ce_def,
        .doc = e->ce_doc,
        .value = value,
        .source = env_value != NULL ? "env" : "default",
    };
    vc->vc_fn(&item, vc->vc_arg);
}

tp_status
tp_config_visit(tp_config_visit_fn fn, void *arg, tp_error **err_p)
{
    config_visit_ctx vc = {.vc_fn = fn, .vc_arg = arg};
    tp_config cfg;

    return config_load_env(&cfg, config_visit_row, &vc, err_p);
}
