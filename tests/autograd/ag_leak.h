/* SPDX-License-Identifier: Apache-2.0 */
/* ag_leak.h - leak checks inside forked test cases. The runner ends each
 * case with _exit, so LeakSanitizer's exit-time check never runs there;
 * AG_TEST cases run it explicitly when built with ASan. */
#ifndef TP_AG_LEAK_H
#define TP_AG_LEAK_H

#include "tp_test.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define AG_LSAN 1
#else
#define AG_LSAN 0
#endif

static inline void
ag_leak_check(void)
{
#if AG_LSAN
    TP_CHECKF(__lsan_do_recoverable_leak_check() == 0,
              "memory leaked (LeakSanitizer report above)");
#endif
}

/* AG_LEAK_CHECKED(fn) defines fn_lc, which runs fn then the leak check;
 * AG_TEST(fn) is its entry in the case table. */
#define AG_LEAK_CHECKED(fn)                                                    \
    static void fn##_lc(void)                                                  \
    {                                                                          \
        fn();                                                                  \
        ag_leak_check();                                                       \
    }
#define AG_TEST(fn)                                                            \
    {                                                                          \
#fn, fn##_lc, 0                                                        \
    }

#endif
