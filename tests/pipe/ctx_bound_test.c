// SPDX-License-Identifier: Apache-2.0
// ctx_bound_test.c - a context refuses a build with more backends of a
// kind than a pipe's brochure carries (TP_WIRE_MAX_BACKENDS), naming the
// list and the bound, instead of dropping the ones past it.
//
// This program defines the four registry functions itself, so the linker
// takes these and never pulls transport/registry.o or channel/registry.o
// out of the static tp_testing: the registries below are what the context
// sees. Their backends are never viable, so a context over a registry that
// fits fails later, for that reason.

#include "tp_test.h"

#include <stdio.h>
#include <string.h>

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "pipe/wire.h"
#include "transport/transport.h"

#define NFAKE (TP_WIRE_MAX_BACKENDS + 1)

static char names[2][NFAKE][16];
static tp_transport_ops fake_tr[NFAKE];
static tp_channel_ops fake_ch[NFAKE];
static const tp_transport_ops *tr_reg[NFAKE];
static const tp_channel_ops *ch_reg[NFAKE];
static size_t n_tr, n_ch;

static bool
fake_not_viable(const tp_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    snprintf(why, why_len, "a fake of ctx_bound_test");
    return false;
}

const tp_transport_ops *const *
tp__transport_registry(size_t *n_p)
{
    *n_p = n_tr;
    return tr_reg;
}

const tp_transport_ops *
tp__transport_find(const char *name)
{
    for (size_t i = 0; i < n_tr; i++) {
        if (strcmp(tr_reg[i]->name, name) == 0) {
            return tr_reg[i];
        }
    }
    return NULL;
}

const tp_channel_ops *const *
tp__channel_registry(size_t *n_p)
{
    *n_p = n_ch;
    return ch_reg;
}

const tp_channel_ops *
tp__channel_find(const char *name)
{
    for (size_t i = 0; i < n_ch; i++) {
        if (strcmp(ch_reg[i]->name, name) == 0) {
            return ch_reg[i];
        }
    }
    return NULL;
}

static void
fake_setup(size_t ntr, size_t nch)
{
    for (size_t i = 0; i < NFAKE; i++) {
        snprintf(names[0][i], sizeof(names[0][i]), "faketr%zu", i);
        snprintf(names[1][i], sizeof(names[1][i]), "fakech%zu", i);
        fake_tr[i] = (tp_transport_ops){.abi_version = TP_TRANSPORT_ABI_V1,
                                        .name = names[0][i],
                                        .props = TP_TRANSPORT_PROP_NETWORK,
                                        .is_viable = fake_not_viable};
        fake_ch[i] = (tp_channel_ops){.abi_version = TP_CHANNEL_ABI_V1,
                                      .name = names[1][i],
                                      .is_viable = fake_not_viable};
        tr_reg[i] = &fake_tr[i];
        ch_reg[i] = &fake_ch[i];
    }
    n_tr = ntr;
    n_ch = nch;
}

static tp_status
try_create(tp_error **err_p)
{
    tp_context_options o;
    tp_context_options_init(&o);
    o.name = "bounded";
    tp_context *ctx = NULL;
    tp_status st = tp_context_create(&o, &ctx, err_p);
    TP_CHECK(st != TP_OK); // the fakes are never viable
    return st;
}

static void
test_transports_past_bound(void)
{
    fake_setup(NFAKE, 1);
    tp_error *err = NULL;
    TP_CHECK_EQ(try_create(&err), TP_EINVAL);
    char want[160];
    snprintf(want, sizeof(want),
             "context bounded: %u transports are built, more than the %u a "
             "pipe's brochure carries (TP_WIRE_MAX_BACKENDS)",
             (unsigned)NFAKE, TP_WIRE_MAX_BACKENDS);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
    tp_error_unref(err);
}

static void
test_channels_past_bound(void)
{
    fake_setup(1, NFAKE);
    tp_error *err = NULL;
    TP_CHECK_EQ(try_create(&err), TP_EINVAL);
    char want[160];
    snprintf(want, sizeof(want),
             "%u channels are built, more than the %u a pipe's brochure "
             "carries",
             (unsigned)NFAKE, TP_WIRE_MAX_BACKENDS);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), want);
    tp_error_unref(err);
}

// Exactly the bound of each fits: every one is considered (the report
// lists the last), and the context fails only because none is viable.
static void
test_at_bound_all_considered(void)
{
    fake_setup(TP_WIRE_MAX_BACKENDS, TP_WIRE_MAX_BACKENDS);
    tp_error *err = NULL;
    TP_CHECK_EQ(try_create(&err), TP_EINVAL);
    const char *msg = tp_error_message(err);
    TP_CHECK(strstr(msg, "TP_WIRE_MAX_BACKENDS") == NULL);
    TP_CHECK_STR_CONTAINS(msg, "no usable transport");
    char last[64];
    snprintf(last, sizeof(last), "transport faketr%u: not viable here",
             TP_WIRE_MAX_BACKENDS - 1);
    TP_CHECK_STR_CONTAINS(msg, last);
    tp_error_unref(err);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_transports_past_bound),
    TP_TEST_CASE(test_channels_past_bound),
    TP_TEST_CASE(test_at_bound_all_considered),
};

TP_TEST_MAIN(cases)
