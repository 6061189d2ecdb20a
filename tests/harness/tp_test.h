/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test.h - the test harness. Each module builds one executable whose
 * cases are functions; the runner forks each case with a deadline (scaled
 * by TP_TEST_TIMEOUT_MULTIPLIER) so a crash or hang names the case.
 * Exit status: 0 all passed (or some skipped), 1 a case failed, 77 every
 * case skipped. Usage: ./x_test [case-substring ...] [--list] */
#ifndef TP_TEST_H
#define TP_TEST_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tpipe/error.h>

typedef struct tp_test_case {
    const char *name;
    void (*fn)(void);
    int timeout_s; // 0 = default (30 s)
} tp_test_case;

#define TP_TEST_CASE(fn)                                                       \
    {                                                                          \
#fn, fn, 0                                                             \
    }
#define TP_TEST_CASE_T(fn, secs)                                               \
    {                                                                          \
#fn, fn, secs                                                          \
    }

int tp_test_main(int argc, char **argv, const tp_test_case *cases, size_t n);
// Installs the fakes the environment asks for (TP_IBV_FAKE=1: the ibv
// transport on the in-memory verbs fake). tp_test_main calls it; a test
// that looks at the registries before (is_viable) calls it first.
void tp_test_install_fakes(void);
#define TP_TEST_MAIN(cases)                                                    \
    int main(int argc, char **argv)                                            \
    {                                                                          \
        return tp_test_main(argc, argv, cases,                                 \
                            sizeof(cases) / sizeof(cases[0]));                 \
    }

void tp_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
void tp_test_skip(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
// Scaled timeout in ms for waits inside a case.
int64_t tp_test_ms(int64_t ms);
// A loopback tcp port reserved for the rest of the calling process (and
// its forked children): a socket bound to 127.0.0.1:0 with SO_REUSEADDR,
// never listening, stays open, so neither bind(0) nor an outgoing
// connection of another test can take the port, while a server that sets
// SO_REUSEADDR (the tcp store: "tcp://127.0.0.1:P", MASTER_PORT) binds it.
// Safe under `ctest -j`. Fails the case on error.
int tp_test_free_port(void);

#define TP_CHECK(c)                                                            \
    do {                                                                       \
        if (!(c)) {                                                            \
            tp_test_fail(__FILE__, __LINE__, "check failed: %s", #c);          \
        }                                                                      \
    } while (0)
#define TP_CHECKF(c, ...)                                                      \
    do {                                                                       \
        if (!(c)) {                                                            \
            tp_test_fail(__FILE__, __LINE__, __VA_ARGS__);                     \
        }                                                                      \
    } while (0)
#define TP_CHECK_EQ(a, b)                                                      \
    do {                                                                       \
        long long tp_a_ = (long long)(a), tp_b_ = (long long)(b);              \
        if (tp_a_ != tp_b_) {                                                  \
            tp_test_fail(__FILE__, __LINE__,                                   \
                         "%s == %lld, expected %s == %lld", #a, tp_a_, #b,     \
                         tp_b_);                                               \
        }                                                                      \
    } while (0)
// Checks a tp_status is TP_OK; prints the error message if one is given.
#define TP_CHECK_OK(st, err)                                                   \
    do {                                                                       \
        tp_status tp_s_ = (st);                                                \
        if (tp_s_ != TP_OK) {                                                  \
            tp_test_fail(__FILE__, __LINE__, "%s failed: %s: %s", #st,         \
                         tp_status_name(tp_s_), tp_error_message(err));        \
        }                                                                      \
    } while (0)
#define TP_CHECK_STR_CONTAINS(hay, needle)                                     \
    do {                                                                       \
        const char *tp_h_ = (hay);                                             \
        if (tp_h_ == NULL || strstr(tp_h_, (needle)) == NULL) {                \
            tp_test_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"", \
                         tp_h_ ? tp_h_ : "(null)", (needle));                  \
        }                                                                      \
    } while (0)

#endif
