/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz.h - shared by the libFuzzer targets and their replay driver
 * (replay.c). Each target defines LLVMFuzzerTestOneInput; a target finds a
 * bug by crashing (FUZZ_CHECK aborts), so libFuzzer or the replay test
 * reports the input. */
#ifndef TP_FUZZ_H
#define TP_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(c)                                                          \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__,        \
                    __LINE__, #c);                                             \
            abort();                                                           \
        }                                                                      \
    } while (0)

#endif
