// SPDX-License-Identifier: Apache-2.0
// api_options_test.c - options structs start with a size (issue 15): the
// init functions set it; a size the library does not know (0: a struct
// never initialised; larger: built against a newer tpipe) is refused with
// TP_EINVAL at once, saying the caller was built against another version.

#include <string.h>

#include <tpipe/collectives.h>
#include <tpipe/pipe.h>
#include <tpipe/rpc.h>

#include "tp_test.h"

// @err_p, not the error: the call in @st's argument sets it, and the
// order in which arguments are evaluated is unspecified.
static void
check_refused(tp_status st, tp_error **err_p)
{
    tp_error *err = *err_p;
    TP_CHECKF(st == TP_EINVAL, "got %s: %s", tp_status_name(st),
              tp_error_message(err));
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "another tpipe version");
    tp_error_unref(err);
    *err_p = NULL;
}

static void
context_options_size(void)
{
    tp_context_options o;
    memset(&o, 0xff, sizeof(o));
    tp_context_options_init(&o);
    TP_CHECK_EQ(o.size, sizeof(o));
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &ctx, &err), err);
    tp_context_destroy(ctx);

    const size_t bad[] = {0, sizeof(size_t), sizeof(o) + 8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o.size = bad[i];
        ctx = NULL;
        err = NULL;
        check_refused(tp_context_create(&o, &ctx, &err), &err);
        TP_CHECK(ctx == NULL);
    }
}

static void
agent_options_size(void)
{
    tp_agent_options o;
    memset(&o, 0xff, sizeof(o));
    tp_agent_options_init(&o);
    TP_CHECK_EQ(o.size, sizeof(o));
    o.init_method = "tcp://127.0.0.1:1";
    const size_t bad[] = {0, sizeof(size_t), sizeof(o) + 8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o.size = bad[i];
        tp_agent *a = NULL;
        tp_error *err = NULL;
        check_refused(tp_rpc_init("w0", 0, 1, &o, &a, &err), &err);
        TP_CHECK(a == NULL);
    }
}

static void
pg_options_size(void)
{
    tp_pg_options o;
    memset(&o, 0xff, sizeof(o));
    tp_pg_options_init(&o);
    TP_CHECK_EQ(o.size, sizeof(o));
    const size_t bad[] = {0, sizeof(size_t), sizeof(o) + 8};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        o.size = bad[i];
        tp_pg *pg = NULL;
        tp_error *err = NULL;
        check_refused(tp_pg_init("tcp://127.0.0.1:1", 0, 1, &o, &pg, &err),
                      &err);
        TP_CHECK(pg == NULL);
        err = NULL;
        check_refused(tp_pg_new_subgroups(NULL, 1, &o, &pg, &err), &err);
        err = NULL;
        check_refused(tp_pg_new_group(NULL, NULL, 0, &o, &pg, &err), &err);
    }
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(context_options_size),
    TP_TEST_CASE(agent_options_size),
    TP_TEST_CASE(pg_options_size),
};

TP_TEST_MAIN(cases)
