// SPDX-License-Identifier: Apache-2.0
// info_pipe.c - `tpipe info --listen [URL]` and `tpipe info --connect URL`:
// open a pipe and print what the negotiation chose and why each other
// transport and channel was refused (the pipe's report), from either end.
// Run --listen on one host and --connect on another to see what two hosts
// can use; --allow-* narrow the choice as an application would.

#include <stdlib.h>
#include <string.h>
#include <tpipe/info.h>
#include <tpipe/pipe.h>
#include <tpipe/tpipe.h>

#include "tool.h"

static tp_context *
info_pipe_ctx(const char *name, const char *transports, const char *channels)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = name;
    o.transports = transports;
    o.channels = channels;
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    if (tp_context_create(&o, &ctx, &err) != TP_OK) {
        tool_err("info: %s", tp_error_message(err));
        tp_error_unref(err);
        return NULL;
    }
    return ctx;
}

static void
info_pipe_print(tp_pipe *p)
{
    char *rep = tp_pipe_report(p);
    fputs(rep ? rep : "(no report)\n", stdout);
    free(rep);
    fflush(stdout);
}

int
tool_info_connect(const char *url, int64_t timeout_ms, const char *transports,
                  const char *channels)
{
    tp_context *ctx = info_pipe_ctx("tpipe-info", transports, channels);
    if (ctx == NULL) {
        return TOOL_EXIT_USAGE;
    }
    int rc = TOOL_EXIT_OK;
    tp_pipe *p = NULL;
    tp_error *err = NULL;
    if (tp_context_connect(ctx, url, &p, &err) != TP_OK ||
        tp_pipe_wait_ready(p, timeout_ms, &err) != TP_OK) {
        tool_err("info: %s", tp_error_message(err));
        tp_error_unref(err);
        rc = TOOL_EXIT_FAIL;
    } else {
        info_pipe_print(p);
    }
    tp_pipe_unref(p);
    tp_context_destroy(ctx);
    return rc;
}

int
tool_info_listen(const char *url, int64_t timeout_ms, long count,
                 const char *transports, const char *channels)
{
    tp_context *ctx = info_pipe_ctx("tpipe-info", transports, channels);
    if (ctx == NULL) {
        return TOOL_EXIT_USAGE;
    }
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    if (tp_context_listen(ctx, url ? &url : NULL, url ? 1 : 0, &l, &err) !=
        TP_OK) {
        tool_err("info: %s", tp_error_message(err));
        tp_error_unref(err);
        tp_context_destroy(ctx);
        return TOOL_EXIT_FAIL;
    }
    printf("listening:");
    tp_backend_info tr[TP_INFO_MAX];
    size_t ntr = 0;
    if (tp_info_transports(0, tr, TP_INFO_MAX, &ntr, NULL) != TP_OK) {
        ntr = 0;
    }
    for (size_t i = 0; i < ntr && i < TP_INFO_MAX; i++) {
        const char *a = tp_pipe_listener_addr(l, tr[i].name);
        if (a != NULL) {
            printf(" %s", a);
        }
    }
    printf("\n");
    fflush(stdout);
    int rc = TOOL_EXIT_OK;
    tp_aio *aio = NULL;
    tp_aio_create(NULL, NULL, &aio);
    for (long n = 0; aio != NULL && (count <= 0 || n < count); n++) {
        tp_aio_set_timeout(aio, timeout_ms);
        tp_pipe_listener_accept(l, aio);
        tp_aio_wait(aio);
        if (tp_aio_status(aio) != TP_OK) {
            tool_err("info: %s", tp_error_message(tp_aio_error(aio)));
            rc = TOOL_EXIT_FAIL;
            break;
        }
        tp_pipe *p = tp_aio_get_output(aio, 0);
        info_pipe_print(p);
        tp_pipe_unref(p);
    }
    tp_aio_destroy(aio);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
    return rc;
}
