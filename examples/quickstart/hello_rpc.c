// SPDX-License-Identifier: Apache-2.0
// hello_rpc.c - the smallest RPC program (docs/quickstart.md): every
// worker registers "hello", joins, and worker0 calls each of the others.
//
//   tpipe run -n 3 ./hello_rpc
//
// RANK and WORLD_SIZE come from the launcher (tpipe run, torchrun-style
// variables, mpirun/srun: docs/store.md); tp_rpc_init's default init
// method, env://, reads MASTER_ADDR and MASTER_PORT.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/tpipe.h>

// "hello": returns "hello from <callee>, <caller>" as bytes.
static tp_status
hello(const tp_rpc_call_info *call, const tp_args *in, void *arg,
      tp_args **out_p, tp_error **err_p)
{
    (void)in;
    const char *me = arg;
    char msg[128];
    int n =
        snprintf(msg, sizeof(msg), "hello from %s, %s", me, call->caller->name);
    (void)err_p;
    return tp_args_create(msg, (size_t)n, out_p);
}

static void
check(tp_status st, tp_error *err, const char *what)
{
    if (st != TP_OK) {
        fprintf(stderr, "hello_rpc: %s: %s\n", what, tp_error_message(err));
        exit(1);
    }
}

int
main(void)
{
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    int rank = r != NULL ? atoi(r) : 0, world = w != NULL ? atoi(w) : 1;
    char me[32];
    snprintf(me, sizeof(me), "worker%d", rank);

    tp_error *err = NULL;
    check(tp_rpc_register("hello", hello, me, &err), err, "register");
    tp_agent_options o;
    tp_agent_options_init(&o); // init method env://, timeouts: docs/rpc.md
    tp_agent *a = NULL;
    check(tp_rpc_init(me, rank, world, &o, &a, &err), err, "tp_rpc_init");

    if (rank == 0) {
        for (int i = 1; i < world; i++) {
            char to[32];
            snprintf(to, sizeof(to), "worker%d", i);
            tp_args *out = NULL;
            check(tp_rpc_sync(a, to, "hello", NULL, TP_TIMEOUT_DEFAULT, &out,
                              &err),
                  err, "rpc_sync");
            size_t len = 0;
            const char *s = tp_args_bytes(out, &len);
            printf("%.*s\n", (int)len, s);
            tp_args_unref(out);
        }
    }
    // Graceful: waits until every worker is done with its calls.
    check(tp_rpc_shutdown(a, true, &err), err, "tp_rpc_shutdown");
    return 0;
}
