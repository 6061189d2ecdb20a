// SPDX-License-Identifier: Apache-2.0
// chan_devices_test.c - the device pairs of the channel contract
// (tp_channel_ops.devices): a channel that declares none is refused by the
// context with the reason, and one that carries no cpu-cpu tensors (a
// device channel) is never chosen as the pipe's channel, even when it
// ranks first and both ends match: the pipe takes the next one (basic)
// and the device channel beside it, for cuda tensors, and both reports
// say so; an end that does not offer it leaves the pipe without one.
//
// Like ctx_bound_test, this program defines the channel registry functions
// itself, so the linker never pulls channel/registry.o: the context sees
// two fakes and the real basic channel (inline data: it needs nothing of
// registry.c).

#include "tp_test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "tp_test_pipe.h"

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

// The device channel: created beside basic, never given an op (no cuda
// tensor is written here).
static _Atomic int fake_cuda_live;
static int fake_cuda_token;

static tp_status
fake_cuda_create(const tp_chan_env *env, tp_chan **ch_p, tp_error **err_p)
{
    (void)err_p;
    TP_CHECK_EQ(env->ce_nconns, 0);
    fake_cuda_live++;
    *ch_p = (tp_chan *)&fake_cuda_token;
    return TP_OK;
}

static void
fake_cuda_op(tp_chan *ch, tp_chan_op *o)
{
    (void)ch;
    (void)o;
    TP_CHECK(!"the fake device channel got an op");
}

static void
fake_cuda_close(tp_chan *ch, const tp_error *err)
{
    (void)ch;
    (void)err;
}

static void
fake_cuda_destroy(tp_chan *ch)
{
    TP_CHECK(ch == (tp_chan *)&fake_cuda_token);
    fake_cuda_live--;
}

static const tp_channel_ops fake_cuda = {
    .abi_version = TP_CHANNEL_ABI_V1,
    .name = "fakecuda",
    .devices = TP_CHAN_DEV_CUDA_CUDA,
    .nconns = fake_nconns,
    .is_viable = fake_viable,
    .domain = fake_domain,
    .create = fake_cuda_create,
    .send = fake_cuda_op,
    .recv = fake_cuda_op,
    .close = fake_cuda_close,
    .destroy = fake_cuda_destroy,
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
    return tp_test_ctx(name, "tcp", NULL);
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

// Connects a pipe from @b to @a, both ends ready.
static void
connect_pair(tp_context *a, tp_context *b, tp_test_pair *pr)
{
    tp_test_pair_open(pr, a, b, "tcp://127.0.0.1:0", WAIT_MS);
    tp_error *err = NULL;
    TP_CHECK_OK(tp_pipe_wait_ready(pr->pa, WAIT_MS, &err), err);
}

static void
test_device_channel_beside_the_pipes(void)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = make_ctx("bob");
    tp_test_pair pr;
    connect_pair(a, b, &pr);
    tp_pipe *pa = pr.pa, *pb = pr.pb;
    TP_CHECK(strcmp(tp_pipe_channel(pa), "basic") == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pb), "basic") == 0);
    TP_CHECK_EQ(fake_cuda_live, 2);
    char *ra = tp_pipe_report(pa);
    char *rb = tp_pipe_report(pb);
    TP_CHECK(ra != NULL && rb != NULL);
    TP_CHECK_STR_CONTAINS(ra, "channel basic, cuda tensors by fakecuda");
    TP_CHECK_STR_CONTAINS(ra, "channel fakecuda: chosen for cuda tensors");
    TP_CHECK_STR_CONTAINS(ra, "channel basic: chosen");
    TP_CHECK_STR_CONTAINS(rb, "channel basic, cuda tensors by fakecuda");
    TP_CHECK_STR_CONTAINS(rb, "channel fakecuda: chosen for cuda tensors");
    free(ra);
    free(rb);
    tp_test_pair_close(&pr);
    TP_CHECK_EQ(fake_cuda_live, 0);
}

// One end without the device channel: none is used (cuda tensors would
// be staged), and the report says why.
static void
test_device_channel_one_end_only(void)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = tp_test_ctx("bob", "tcp", "basic");
    tp_test_pair pr;
    connect_pair(a, b, &pr);
    TP_CHECK_EQ(fake_cuda_live, 0);
    char *ra = tp_pipe_report(pr.pa);
    TP_CHECK(ra != NULL);
    TP_CHECK_STR_CONTAINS(ra, "channel fakecuda: the peer does not offer it");
    TP_CHECK_STR_CONTAINS(ra, "cuda tensors are staged through host memory");
    TP_CHECK(strstr(ra, "cuda tensors by") == NULL);
    free(ra);
    tp_test_pair_close(&pr);
}

static void
test_device_channel_not_the_pipes(void)
{
    tp_context *a = make_ctx("alice");
    tp_context *b = make_ctx("bob");
    tp_test_pair pr;
    tp_test_pair_open(&pr, a, b, "tcp://127.0.0.1:0", WAIT_MS);
    tp_pipe *pa = pr.pa, *pb = pr.pb;
    TP_CHECK(strcmp(tp_pipe_channel(pa), "basic") == 0);
    TP_CHECK(strcmp(tp_pipe_channel(pb), "basic") == 0);
    char *ra = tp_pipe_report(pa);
    TP_CHECK(ra != NULL);
    TP_CHECK_STR_CONTAINS(ra, "channel basic: chosen");
    free(ra);
    tp_test_pair_close(&pr);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_context_reports_devices),
    TP_TEST_CASE(test_device_channel_not_the_pipes),
    TP_TEST_CASE(test_device_channel_beside_the_pipes),
    TP_TEST_CASE(test_device_channel_one_end_only),
};

TP_TEST_MAIN(cases)
