// SPDX-License-Identifier: Apache-2.0
// store.c - `tpipe store --port P [--host H]`: a standalone tcp store
// server. Prints the bound address on one line, then serves until SIGINT
// or SIGTERM.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tpipe/tpipe.h>

#include "tool.h"

static void
store_usage(FILE *f)
{
    fputs("usage: tpipe store --port P [--host H]\n"
          "  Runs a tcp rendezvous store server until SIGINT/SIGTERM and "
          "prints its\n"
          "  address (tcp://HOST:PORT) on stdout. --port 0 picks a free "
          "port.\n"
          "  --host H   address to listen on (default: every IPv4 "
          "interface)\n"
          "  Clients: tp_store_open(\"tcp://HOST:PORT?server=0\", ...).\n",
          f);
}

int
tool_store_main(int argc, char **argv)
{
    const char *port = NULL;
    const char *host = "";
    bool bad = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            store_usage(stdout);
            return TOOL_EXIT_OK;
        }
        if (tool_opt_value(argc, argv, &i, "--port", &port, &bad) ||
            tool_opt_value(argc, argv, &i, "--host", &host, &bad)) {
            continue;
        }
        if (!bad) {
            tool_err("store: unknown option \"%s\"", argv[i]);
        }
        store_usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    uint64_t p = 0;
    if (port == NULL || !tool_parse_u64(port, &p) || p > 65535) {
        tool_err("store: --port 0..65535 is required");
        store_usage(stderr);
        return TOOL_EXIT_USAGE;
    }
    char addr[320];
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(addr, sizeof(addr), "tcp://%s%s%s:%u", v6 ? "[" : "", host,
             v6 ? "]" : "", (unsigned)p);

    // Block the signals before the server threads exist, so they inherit
    // the mask and sigwait below receives them.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    tp_store_server *srv = NULL;
    tp_error *err = NULL;
    if (tp_store_server_start(addr, &srv, &err) != TP_OK) {
        tool_err("%s", tp_error_message(err));
        tp_error_unref(err);
        return TOOL_EXIT_FAIL;
    }
    printf("%s\n", tp_store_server_addr(srv));
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    tp_store_server_stop(srv);
    return TOOL_EXIT_OK;
}
