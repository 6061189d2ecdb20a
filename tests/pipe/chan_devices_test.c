// SPDX-License-Identifier: Apache-2.0
// chan_devices_test.c - the device pairs of the channel contract
// (tp_channel_ops.devices): a channel that declares none is refused by the
// context with the reason, and one that carries no cpu-cpu tensors (a
// device channel) is offered but never chosen as the pipe's channel, even
// when it ranks first and both ends match: the pipe takes the next one
// (basic), and the report says why.
//
// Like ctx_bound_test, this program defines the channel registry functions
// itself, so the linker never pulls channel/registry.o: the context sees
// two fakes and the real basic channel (inline data: it needs nothing of
// registry.c).

#include "tp_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "tp_test_op.h"

#define WAIT_MS 20000

extern const tp_channel_ops tp__channel_basic_ops;

static bool
fake_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    (void)why;
    (void)why_len;
    return true;
}

static tp_status
fake_domain(const tp_config *cfg, char *buf, size_t len, tp_error **err_p)
{
    (void)cfg;
    (void)err_p;
    snprintf(buf, len, "fakedev:same");
    return TP_OK;
}

static unsigned
fake_nconns(const tp_config *cfg, bool *lanes_p)
{
    (void)cfg;
    *lanes_p = false;
    return 0;
}

// Never created: the pipe must not choose them.
static const tp_channel_ops fake_cuda = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "fakecuda",
    .devices = TP_CHAN_DEV_CUDA_CUDA,
    .nconns = fake_nconns,
    .is_viable = fake_viable,
    .domain = fake_domain,
};

static const tp_channel_ops fake_none = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "fakenone",
    .devices = 0,
    .nconns = fake_nconns,
    .is_viable = fake_viable,
    .domain = fake_domain,
};

static const tp_channel_ops *const ch_reg[] = {&fake_cuda, &fake_none,
                                               &tp__channel_basic_ops};

const tp_channel_ops *const *
tp__channel_registry(size_t *n_p)
{
    *n_p = sizeof(ch_reg) / sizeof(ch_reg[0]);
    return ch_reg;
}

const tp_channel_ops *
tp__channel_find(const char *name)
{
    for (size_t i = 0; i < sizeof(ch_reg) / sizeof(ch_reg[0]); i++) {
        if (strcmp(ch_reg[i]->name, name) == 0) {
            return ch_reg[i];
        }
    }
    return NULL;
}

static tp_context *
make_ctx(const char *name)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = name;
    o.transports = "tcp";
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &ctx, &err), err);
    return ctx;
}

static void
test_context_reports_devices(void)
{
    tp_context *ctx = make_ctx("alice");
    char *rep = tp_context_report(ctx);
    TP_CHECK(rep != NULL);
    TP_CHECK_STR_CONTAINS(rep, "channel fakenone: declares no device pair "
                               "it carries (devices 0x0)");
    TP_CHECK_STR_CONTAINS(rep, "channel fakecuda: usable");
    TP_CHECK_STR_CONTAINS(rep, "channel basic: usable");
    free(rep);
    tp_context_destroy(ctx);
}

static void
test_device_channel_not_the_pipes(void)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = make_ctx("bob");
    tp_pipe_listener *l = NULL;
    tp_error *err = NULL;
    const char *url = "tcp://127.0.0.1:0";
    TP_CHECK_OK(tp_context_listen(a, &url, 1, &l, &err), err);
    tp_pipe *pb = NULL;
    TP_CHECK_OK(
        tp_context_connect(b, tp_pipe_listener_addr(l, NULL), &pb, &err), err);
    op acc;
    op_init(&acc, WAIT_MS);
    tp_pipe_listener_accept(l, acc.aio);
    TP_CHECK(op_wait_for(&acc, WAIT_MS));
    TP_CHECK_OK(tp_aio_status(acc.aio), tp_aio_error(acc.aio));
    tp_pipe *pa = tp_aio_get_output(acc.aio, 0);
    op_fini(&acc);
    TP_CHECK_OK(tp_pipe_wait_ready(pb, WAIT_MS, &err), err);
    TP_CHECK(strcmp(tp_pipe_channel(pa), "basic") == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pb), "basic") == 0);
    char *ra = tp_pipe_report(pa);
    TP_CHECK(ra != NULL);
    TP_CHECK_STR_CONTAINS(ra, "channel fakecuda: carries no cpu-cpu tensors");
    TP_CHECK_STR_CONTAINS(ra, "channel basic: chosen");
    free(ra);
    tp_pipe_unref(pa);
    tp_pipe_unref(pb);
    tp_pipe_listener_destroy(l);
    tp_context_destroy(b);
    tp_context_destroy(a);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_context_reports_devices),
    TP_TEST_CASE(test_device_channel_not_the_pipes),
};

TP_TEST_MAIN(cases)
