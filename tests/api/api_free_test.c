// SPDX-License-Identifier: Apache-2.0
// api_free_test.c - tp_free releases what the library hands out: report
// strings, store values; NULL is a no-op. Run under ASan/valgrind this
// also proves the allocator matches.

#include <string.h>

#include <tpipe/pipe.h>
#include <tpipe/store.h>
#include <tpipe/tpipe.h>

#include "tp_test.h"

static void
free_context_report(void)
{
    tp_context_options o;
    tp_context_options_init(&o);
    tp_context *ctx = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_context_create(&o, &ctx, &err), err);
    char *report = tp_context_report(ctx);
    TP_CHECK(report != NULL && strlen(report) > 0);
    tp_free(report);
    tp_context_destroy(ctx);
}

static void
free_store_values(void)
{
    tp_store *s = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_store_open("mem://api_free_test", 0, 1, 5000, &s, &err),
                err);
    TP_CHECK_OK(tp_store_set(s, "k", "value", 5, 5000, &err), err);
    void *val = NULL;
    size_t len = 0;
    TP_CHECK_OK(tp_store_get(s, "k", 5000, &val, &len, &err), err);
    TP_CHECK_EQ(len, 5);
    TP_CHECK(memcmp(val, "value", 5) == 0);
    tp_free(val);
    tp_store_close(s);
}

static void
free_null_is_noop(void)
{
    tp_free(NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(free_context_report),
    TP_TEST_CASE(free_store_values),
    TP_TEST_CASE(free_null_is_noop),
};

TP_TEST_MAIN(cases)
