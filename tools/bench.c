// SPDX-License-Identifier: Apache-2.0
// bench.c - `tpipe bench <what>`: dispatches to the benchmarks.

#include <string.h>

#include "tool.h"

static void
bench_usage(FILE *f)
{
    fputs("usage: tpipe bench <benchmark> [options]\n"
          "\n"
          "benchmarks:\n"
          "  transport    round trip and streaming between two processes\n"
          "               (tpipe bench transport --help)\n"
          "  pipe         pipe messages per transport and channel, between "
          "two\n"
          "               processes (tpipe bench pipe --help)\n"
          "  rpc          RPC agent calls between two worker processes\n"
          "               (tpipe bench rpc --help)\n"
          "  collective   process-group collectives between N forked ranks\n"
          "               (tpipe bench collective --help)\n",
          f);
}

int
tool_bench_main(int argc, char **argv)
{
    if (argc < 2) {
        bench_usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    const char *what = argv[1];
    if (strcmp(what, "-h") == 0 || strcmp(what, "--help") == 0) {
        bench_usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (strcmp(what, "transport") == 0) {
        return tool_bench_transport_main(argc - 1, argv + 1);
    }
    if (strcmp(what, "pipe") == 0) {
        return tool_bench_pipe_main(argc - 1, argv + 1);
    }
    if (strcmp(what, "rpc") == 0) {
        return tool_bench_rpc_main(argc - 1, argv + 1);
    }
    if (strcmp(what, "collective") == 0) {
        return tool_bench_collective_main(argc - 1, argv + 1);
    }
    tool_err("unknown benchmark \"%s\" (known: transport, pipe, rpc, "
             "collective)",
             what);
    return TOOL_EXIT_USAGE;
}
