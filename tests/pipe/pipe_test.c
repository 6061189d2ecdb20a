// SPDX-License-Identifier: Apache-2.0
// pipe_test.c - the pipe through its public API, for one (transport,
// channel) combination chosen by the environment: TP_PIPE_TRANSPORT and
// TP_PIPE_CHANNEL. Without both, for every pair of the registries
// (tp__transport_registry x tp__channel_registry, at run time; only those
// with the one that is set), each in a child with both set; a pair that
// cannot run here (a backend not viable or opt-in, lanes over a transport
// that does not reach other hosts) is reported skipped with its reason.
// Both contexts restrict themselves to that pair; cases check the negotiated
// choice, messages of every shape, ordering, close and failure, and, across
// processes (fork), a peer killed mid-message and a peer sending garbage.
// The cases live in pipe_test_msgs.c, pipe_test_errors.c and
// pipe_test_fork.c, their helpers in pipe_test_util.c (pipe_test.h); this
// file holds the case table and walks the registries.

#include "tp_test.h"

#include <tpipe/pipe.h>

#include "channel/channel.h"
#include "core/config.h"
#include "pipe_test.h"
#include "tp_test_variants.h"
#include "transport/transport.h"

static const tp_test_case cases[] = {
    TP_TEST_CASE(test_options_errors),
    TP_TEST_CASE(test_no_common_channel),
    TP_TEST_CASE(test_negotiates_pair),
    TP_TEST_CASE_T(test_shapes, 60),
    TP_TEST_CASE_T(test_ordering, 60),
    TP_TEST_CASE_T(test_many_parts, 60),
    TP_TEST_CASE_T(test_256mib_in_process, 120),
    TP_TEST_CASE(test_close_pending),
    TP_TEST_CASE(test_read_timeout_keeps_pipe),
    TP_TEST_CASE(test_destroy_with_pending),
    TP_TEST_CASE(test_bad_user_input),
    TP_TEST_CASE_T(test_cross_process_echo, 60),
    TP_TEST_CASE_T(test_peer_killed, 60),
    TP_TEST_CASE_T(test_above_2gib, 280),
};

// Why @t and @c cannot be tested together here, or "" when they can.
static void
pair_skip(const tp_config *cfg, const tp_transport_ops *t,
          const tp_channel_ops *c, char *out, size_t len)
{
    char why[400];
    bool lanes = false;
    if (!t->is_viable(cfg, why, sizeof(why))) {
        snprintf(out, len, "transport %s is not viable here: %s", t->name, why);
    } else if (!(c->devices & TP_CHAN_DEV_CPU_CPU)) {
        snprintf(out, len,
                 "channel %s carries no cpu-cpu tensors (a device channel, "
                 "never the pipe's)",
                 c->name);
    } else if (!c->is_viable(cfg, why, sizeof(why))) {
        snprintf(out, len, "channel %s is not viable here: %s", c->name, why);
    } else if ((void)c->nconns(cfg, &lanes),
               lanes && !(t->props & TP_TRANSPORT_PROP_NETWORK)) {
        snprintf(out, len,
                 "channel %s takes network lanes, never chosen over %s, "
                 "which does not reach other hosts",
                 c->name, t->name);
    } else {
        out[0] = '\0';
    }
}

static int
pipe_over_registry(int argc, char **argv)
{
    tp_config cfg;
    tp_error *err = NULL;
    if (tp__config_load(&cfg, &err) != TP_OK) {
        fprintf(stderr, "pipe_test: configuration: %s\n",
                tp_error_message(err));
        tp_error_unref(err);
        return 1;
    }
    const char *only_t = getenv("TP_PIPE_TRANSPORT");
    const char *only_c = getenv("TP_PIPE_CHANNEL");
    size_t nt, nc, n = 0;
    const tp_transport_ops *const *treg = tp__transport_registry(&nt);
    const tp_channel_ops *const *creg = tp__channel_registry(&nc);
    tp_test_variant *v = calloc(nt * nc, sizeof(*v));
    TP_CHECK(v != NULL);
    for (size_t i = 0; i < nt; i++) {
        if (only_t != NULL && *only_t && strcmp(only_t, treg[i]->name) != 0) {
            continue;
        }
        for (size_t j = 0; j < nc; j++) {
            if (only_c != NULL && *only_c &&
                strcmp(only_c, creg[j]->name) != 0) {
                continue;
            }
            tp_test_variant *x = &v[n++];
            snprintf(x->tv_label, sizeof(x->tv_label), "%s+%s", treg[i]->name,
                     creg[j]->name);
            pair_skip(&cfg, treg[i], creg[j], x->tv_skip, sizeof(x->tv_skip));
            tp_test_variant_env(x, "TP_PIPE_TRANSPORT", treg[i]->name);
            tp_test_variant_env(x, "TP_PIPE_CHANNEL", creg[j]->name);
        }
    }
    int rc =
        n == 0 ? 77 : tp_test_run_variants("pipe_test", argc, argv, v, n, 600);
    if (n == 0) {
        printf("pipe_test: no pair of the registries matches "
               "TP_PIPE_TRANSPORT=%s TP_PIPE_CHANNEL=%s\n",
               only_t ? only_t : "", only_c ? only_c : "");
    }
    free(v);
    return rc;
}

int
main(int argc, char **argv)
{
    const char *t = getenv("TP_PIPE_TRANSPORT");
    const char *c = getenv("TP_PIPE_CHANNEL");
    bool list = argc > 1 && strcmp(argv[1], "--list") == 0;
    tp_test_install_fakes(); // before the registry's is_viable
    if ((t != NULL && *t && c != NULL && *c) || list) {
        return tp_test_main(argc, argv, cases,
                            sizeof(cases) / sizeof(cases[0]));
    }
    return pipe_over_registry(argc, argv);
}
