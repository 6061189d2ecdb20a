// SPDX-License-Identifier: Apache-2.0
// tpipe.c - the tpipe command: dispatches to one file per subcommand.

#include <string.h>
#include <tpipe/tpipe.h>

#include "tool.h"

static void
tpipe_usage(FILE *f)
{
    fputs("usage: tpipe <command> [options]\n"
          "\n"
          "commands:\n"
          "  info [--config] [--json]     version, loop backends, transports "
          "and their\n"
          "                               viability; --config: every "
          "tunable\n"
          "  bench transport [options]    two-process round-trip latency and "
          "streaming\n"
          "                               bandwidth per transport and loop "
          "backend\n"
          "                               (tpipe bench transport --help)\n"
          "  bench pipe|rpc|collective    pipes between two processes, RPC "
          "calls,\n"
          "                               process-group collectives "
          "(--help each)\n"
          "  store --port P [--host H]    a standalone tcp rendezvous store "
          "server\n"
          "                               (until SIGINT/SIGTERM; prints its "
          "address)\n"
          "  run -n N [--] PROGRAM ARGS   start N local ranks (RANK, "
          "WORLD_SIZE, MASTER_*)\n"
          "                               with rank-prefixed output "
          "(tpipe run --help)\n"
          "\n"
          "options:\n"
          "  -h, --help                   this text\n"
          "  -V, --version                print the version\n"
          "\n"
          "Logging is silent by default; set TP_LOG_LEVEL=info (or debug) "
          "to see it.\n"
          "Exit status: 0 success, 1 failure, 2 usage error or malformed "
          "TP_* variable.\n",
          f);
}

int
main(int argc, char **argv)
{
    if (argc < 2) {
        tpipe_usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 ||
        strcmp(cmd, "help") == 0) {
        tpipe_usage(stdout);
        return TOOL_EXIT_OK;
    }
    if (strcmp(cmd, "-V") == 0 || strcmp(cmd, "--version") == 0 ||
        strcmp(cmd, "version") == 0) {
        const char *feat = tp_build_features();
        printf("tpipe %s%s%s%s\n", tp_version_string(), feat[0] ? " (" : "",
               feat, feat[0] ? ")" : "");
        return TOOL_EXIT_OK;
    }
    if (strcmp(cmd, "info") == 0) {
        return tool_info_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "bench") == 0) {
        return tool_bench_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "store") == 0) {
        return tool_store_main(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "run") == 0) {
        return tool_run_main(argc - 1, argv + 1);
    }
    tool_err("unknown command \"%s\" (try tpipe --help)", cmd);
    return TOOL_EXIT_USAGE;
}
