// SPDX-License-Identifier: Apache-2.0
// allow_list_test.c - allow lists that can never connect (TP_TRANSPORTS=shm
// with TP_CHANNELS=mpt: mpt's lanes need tcp) are refused when the context
// or the agent is created, with the reason, not at the first call.

#include <stdio.h>
#include <string.h>

#include <tpipe/pipe.h>
#include <tpipe/rpc.h>

#include "tp_test.h"

// Skips unless the shm transport works here (else the error would be
// "no usable transport" and prove nothing about the channel check).
static void
need_shm(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "shm";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    if (tp_context_create(&o, &ctx, &err) != TP_OK) {
        tp_test_skip("shm transport unusable here: %s", tp_error_message(err));
    }
    tp_context_destroy(ctx);
}

static void
context_shm_mpt_refused(void)
{
    need_shm();
    tp_context_options o;
    tp_context_options_init(&o);
    o.transports = "shm";
    o.channels = "mpt";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    tp_status st = tp_context_create(&o, &ctx, &err);
    TP_CHECKF(st == TP_EINVAL, "got %s", tp_status_name(st));
    TP_CHECK(ctx == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "no transport and channel");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "mpt");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "tcp");
    tp_error_unref(err);

    // mpt with tcp allowed as well is fine.
    o.transports = "shm,tcp";
    err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &ctx, &err), err);
    tp_context_destroy(ctx);
}

static void
rpc_init_shm_mpt_refused(void)
{
    need_shm();
    tp_agent_options o;
    tp_agent_options_init(&o);
    char im[64];
    snprintf(im, sizeof(im), "tcp://127.0.0.1:%d", tp_test_free_port());
    o.init_method = im;
    o.transports = "shm";
    o.channels = "mpt";
    o.init_timeout_ms = tp_test_ms(10000);
    tp_agent *a = NULL;
    tp_error *err = NULL;
    tp_status st = tp_rpc_init("w0", 0, 1, &o, &a, &err);
    TP_CHECKF(st == TP_EINVAL, "got %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK(a == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "mpt");
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(context_shm_mpt_refused),
    TP_TEST_CASE(rpc_init_shm_mpt_refused),
};

TP_TEST_MAIN(cases)
