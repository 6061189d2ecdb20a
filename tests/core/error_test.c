// SPDX-License-Identifier: Apache-2.0
// error_test.c - error objects: messages, causes, errno mapping, refcounts,
// the OOM error, and the allocation-failure hook.

#include <errno.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tp_test.h"

static void
errno_message_names_what_and_why(void)
{
    tp_error *err = NULL;
    tp_status st =
        tp__error_errno(&err, ECONNREFUSED, "tcp: connect to %s", "1.2.3.4:9");
    TP_CHECK_EQ(st, TP_ECONNREFUSED);
    TP_CHECK_EQ(tp_error_status(err), TP_ECONNREFUSED);
    TP_CHECK_EQ(tp_error_errno(err), ECONNREFUSED);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "tcp: connect to 1.2.3.4:9");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "ECONNREFUSED");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "refused");
    TP_CHECK(TP_STATUS_IS_CONN(st));
    tp_error_unref(err);
}

static void
wrap_keeps_cause(void)
{
    tp_error *err = NULL;
    tp__error_set(&err, TP_ECONNRESET, "tcp: read from peer %s: EOF", "x:1");
    tp_status st = tp__error_wrap(&err, TP_EINTERNAL, "rpc %s", "echo");
    TP_CHECK_EQ(st, TP_ECONNRESET);
    TP_CHECK(strcmp(tp_error_message(err), "rpc echo: tcp: read from peer "
                                           "x:1: EOF") == 0);
    const tp_error *cause = tp_error_cause(err);
    TP_CHECK(cause != NULL);
    TP_CHECK_EQ(tp_error_status(cause), TP_ECONNRESET);
    // Keep the cause alive past its wrapper.
    tp_error *kept = tp_error_ref(cause);
    tp_error_unref(err);
    TP_CHECK_STR_CONTAINS(tp_error_message(kept), "EOF");
    tp_error_unref(kept);
    // NULL is fine everywhere.
    tp_error_unref(NULL);
    TP_CHECK(strcmp(tp_error_message(NULL), "success") == 0);
    TP_CHECK_EQ(tp_error_status(NULL), TP_OK);
    TP_CHECK_EQ(tp__error_wrap(NULL, TP_EIO, "x"), TP_EIO);
    TP_CHECK_EQ(tp__error_set(NULL, TP_EINVAL, "no out param"), TP_EINVAL);
}

static void
status_names_and_scopes(void)
{
    TP_CHECK(strcmp(tp_status_name(TP_ECLOSED), "TP_ECLOSED") == 0);
    TP_CHECK(strcmp(tp_status_name((tp_status)-99), "TP_E?") == 0);
    TP_CHECK(strlen(tp_status_describe(TP_EPROTO)) > 0);
    TP_CHECK(!TP_STATUS_IS_CONN(TP_ETIMEDOUT));
    TP_CHECK(TP_STATUS_IS_CONN(TP_EPROTO));
    TP_CHECK(!TP_STATUS_IS_CONN(TP_EINTERNAL));
    TP_CHECK_EQ(tp__status_from_errno(EPIPE), TP_ECONNRESET);
    TP_CHECK_EQ(tp__status_from_errno(EADDRINUSE), TP_EADDRINUSE);
    TP_CHECK_EQ(tp__status_from_errno(EHOSTUNREACH), TP_EUNREACHABLE);
    TP_CHECK_EQ(tp__status_from_errno(12345), TP_EIO);
}

static void
oom_gives_static_error(void)
{
#if TP_HAVE_TEST_FAULTS
    // Fail every allocation in turn: creation never returns NULL and never
    // crashes; it falls back to the static out-of-memory error.
    for (long n = 1; n <= 3; n++) {
        tp__alloc_fail_after(n);
        tp_error *err = tp__error_new(TP_EIO, 0, NULL, "disk %d", 1);
        tp__alloc_fail_after(0);
        TP_CHECK(err != NULL);
        if (tp_error_status(err) == TP_ENOMEM) {
            TP_CHECK(err == tp__error_nomem());
        } else {
            TP_CHECK_STR_CONTAINS(tp_error_message(err), "disk 1");
        }
        tp_error_unref(err); // no-op on the static error
    }
    TP_CHECK_STR_CONTAINS(tp_error_message(tp__error_nomem()), "memory");
#else
    tp_test_skip("built without TP_TEST_FAULTS");
#endif
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(errno_message_names_what_and_why),
    TP_TEST_CASE(wrap_keeps_cause),
    TP_TEST_CASE(status_names_and_scopes),
    TP_TEST_CASE(oom_gives_static_error),
};

TP_TEST_MAIN(cases)
