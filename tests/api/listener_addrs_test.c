// SPDX-License-Identifier: Apache-2.0
// listener_addrs_test.c - tp_pipe_listener_addrs lists a listener's
// addresses in connect order (the first network transport, then the
// others best first), which the agent and the process group publish.

#include <string.h>

#include <tpipe/pipe.h>

#include "tp_test.h"

static tp_context *
ctx_with(const char *transports)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = transports;
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    if (tp_context_create(&o, &ctx, &err) != TP_OK) {
        tp_test_skip("transports %s unusable here: %s", transports,
                     tp_error_message(err));
    }
    return ctx;
}

// shm is listed before tcp in the context (best first), but tcp leads the
// connect order: a peer on another host can only use tcp, and one on this
// host moves from tcp to shm.
static void
network_first(void)
{
    tp_context *ctx = ctx_with("shm,tcp");
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    const char *urls[] = {"tcp://127.0.0.1:0"};
    TP_CHECK_OK(tp_context_listen(ctx, urls, 1, &l, &err), err);
    TP_CHECK(strncmp(tp_pipe_listener_addr(l, NULL), "shm://", 6) == 0);

    const char *addrs[4] = {NULL};
    TP_CHECK_EQ(tp_pipe_listener_addrs(l, addrs, 4), 2u);
    TP_CHECK(addrs[0] == tp_pipe_listener_addr(l, "tcp"));
    TP_CHECK(addrs[1] == tp_pipe_listener_addr(l, "shm"));
    TP_CHECK(addrs[2] == NULL);

    // A short array gets the first ones; the count is of all.
    const char *one[1] = {NULL};
    TP_CHECK_EQ(tp_pipe_listener_addrs(l, one, 1), 2u);
    TP_CHECK(one[0] == addrs[0]);
    TP_CHECK_EQ(tp_pipe_listener_addrs(l, NULL, 0), 2u);
    TP_CHECK_EQ(tp_pipe_listener_addrs(NULL, addrs, 4), 0u);

    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}

// With no network transport the others are listed, best first.
static void
same_host_only(void)
{
    tp_context *ctx = ctx_with("shm");
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_listen(ctx, NULL, 0, &l, &err), err);
    const char *addrs[2] = {NULL};
    TP_CHECK_EQ(tp_pipe_listener_addrs(l, addrs, 2), 1u);
    TP_CHECK(strncmp(addrs[0], "shm://", 6) == 0);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(ctx);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(network_first),
    TP_TEST_CASE(same_host_only),
};

TP_TEST_MAIN(cases)
