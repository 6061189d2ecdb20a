// SPDX-License-Identifier: Apache-2.0
// tunables.c - the pipe's tunables: the handshake deadline and the limits
// on what a peer's message may make a pipe allocate; the allow lists of
// transports and channels, read with the context options.

#include "core/config.h"
#include "core/platform.h"

static const tp_tunable pipe_tunable_rows[] = {
    {
        .tu_name = "handshake_timeout_ms",
        .tu_env = "TP_HANDSHAKE_TIMEOUT_MS",
        .tu_def = "5000",
        .tu_doc = "deadline of the pipe handshake once connected, in ms",
        .tu_type = TP_TUNABLE_MS,
        TP_TUNABLE_CONFIG_FIELD(handshake_timeout_ms),
        .tu_min = 1,
        .tu_max = TP_TUNABLE_DAY_MS,
    },
    {
        .tu_name = "pipe_max_metadata",
        .tu_env = "TP_PIPE_MAX_METADATA",
        .tu_def = "64M",
        .tu_doc = "largest metadata of a message a pipe accepts, in bytes",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(pipe_max_metadata),
        .tu_min = 0,
        .tu_max = 4 * TP_TUNABLE_GIB,
    },
    {
        .tu_name = "pipe_max_payloads",
        .tu_env = "TP_PIPE_MAX_PAYLOADS",
        .tu_def = "1024",
        .tu_doc = "most payloads in one message a pipe accepts",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(pipe_max_payloads),
        .tu_min = 0,
        .tu_max = 1 << 20,
        .tu_unit = "payloads",
    },
    {
        .tu_name = "pipe_max_tensors",
        .tu_env = "TP_PIPE_MAX_TENSORS",
        .tu_def = "1024",
        .tu_doc = "most tensors in one message a pipe accepts",
        .tu_type = TP_TUNABLE_INT,
        TP_TUNABLE_CONFIG_FIELD(pipe_max_tensors),
        .tu_min = 0,
        .tu_max = 1 << 20,
        .tu_unit = "tensors",
    },
    {
        .tu_name = "pipe_max_buf_bytes",
        .tu_env = "TP_PIPE_MAX_BUF_BYTES",
        .tu_def = "64G",
        .tu_doc = "largest payload or tensor a pipe accepts, in bytes",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(pipe_max_buf_bytes),
        .tu_min = 0,
        .tu_max = 1024 * TP_TUNABLE_GIB,
    },
    {
        .tu_name = "pipe_cuda_loop_max",
        .tu_env = "TP_PIPE_CUDA_LOOP_MAX",
        .tu_def = "0",
        .tu_doc = "a message whose CUDA tensors total at most this many "
                  "bytes (the writer counts every CUDA tensor, whose "
                  "devices it synchronises; the reader those it copies "
                  "from staging) does that CUDA work on the context's "
                  "loop thread instead of its copy pool: lower latency "
                  "for small tensors, but every pipe of the context waits "
                  "for the device meanwhile (0: always on the pool)",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(pipe_cuda_loop_max),
        .tu_min = 0,
        .tu_max = 1024 * TP_TUNABLE_GIB,
    },
    {
        .tu_name = "pipe_cuda_pinned_cache",
        .tu_env = "TP_PIPE_CUDA_PINNED_CACHE",
        .tu_def = "256M",
        .tu_doc = "bytes of page-locked staging buffers of CUDA tensors "
                  "each context keeps for its next messages (sizes rounded "
                  "up to powers of two; larger ones are not kept), so "
                  "steady traffic makes no cudaMallocHost or cudaFreeHost "
                  "call; 0: each buffer is allocated and freed per "
                  "message, at its exact size",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_CONFIG_FIELD(pipe_cuda_pinned_cache),
        .tu_min = 0,
        .tu_max = 1024 * TP_TUNABLE_GIB,
    },
    // Read by tp_agent_options_init (agent/init.c) into the context
    // options; names are checked against the registries.
    TP_TUNABLE_EXTERN("transports", "TP_TRANSPORTS", "",
                      "comma-separated transport names (tpipe info lists "
                      "them)",
                      "transports a context may use, best first (empty: "
                      "every viable one)"),
    TP_TUNABLE_EXTERN("channels", "TP_CHANNELS", "",
                      "comma-separated channel names (tpipe info lists "
                      "them)",
                      "channels a context may use, best first (empty: "
                      "every viable one)"),
};

const tp_tunables tp__pipe_tunables = {
    .ts_component = "pipe",
    .ts_rows = pipe_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(pipe_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};
