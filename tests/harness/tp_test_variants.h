/* SPDX-License-Identifier: Apache-2.0 */
/* tp_test_variants.h - one suite, run once per backend (or pair of
 * backends) of the registries. A suite's main builds the variants from
 * tp__transport_registry / tp__channel_registry at run time, marks those
 * that cannot run here as skipped with the reason (not viable, opt-in, a
 * pair that does not apply), and tp_test_run_variants runs the others, each
 * as a child of this same program with its environment set (the suite
 * then reads it, e.g. TP_CONF_TRANSPORT). So a backend added to the build
 * is tested without editing a list. */
#ifndef TP_TEST_VARIANTS_H
#define TP_TEST_VARIANTS_H

#include <stddef.h>

#define TP_TEST_VARIANT_ENVS 4

typedef struct tp_test_variant {
    char tv_label[64]; // "shm", "tcp+mpt": how the summary names it
    // "NAME=value" strings set in the child, NULL-terminated (copied).
    char tv_env[TP_TEST_VARIANT_ENVS][128];
    unsigned tv_nenv;
    char tv_skip[512]; // not empty: not run, reported skipped with this
} tp_test_variant;

// Adds "NAME=value" to @v's environment. Fails the program on overflow.
void tp_test_variant_env(tp_test_variant *v, const char *name,
                         const char *value);

// Runs each variant that is not skipped as "/proc/self/exe argv[1..]" with
// its environment added, one at a time, each within @deadline_s seconds
// (scaled by TP_TEST_TIMEOUT_MULTIPLIER; killed past it, a failure).
// Prints one line per variant ("variant tcp+mpt: passed | FAILED (exit 1)
// | skipped: <why>") and a summary. Returns the exit status of the whole:
// 1 if a variant failed, 77 if none ran or every one skipped, else 0.
int tp_test_run_variants(const char *suite, int argc, char **argv,
                         const tp_test_variant *v, size_t n, int deadline_s);

#endif
