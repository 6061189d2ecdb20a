// SPDX-License-Identifier: Apache-2.0
// config_rows.h - helpers of the config and tunables tests: a tunable's
// row and value by name, wherever its component stores it.
#ifndef TP_TESTS_CORE_CONFIG_ROWS_H
#define TP_TESTS_CORE_CONFIG_ROWS_H

#include <string.h>

#include "config.h"
#include "tp_test.h"

// The row named @name and its storage in @cfg, whichever table has it.
static inline const tp_tunable *
find_row(const tp_config *cfg, const char *name, const void **base_p)
{
    const tp_tunables *ts;
    for (size_t i = 0; (ts = tp__tunables_at(i)) != NULL; i++) {
        for (size_t j = 0; j < ts->ts_nrows; j++) {
            if (strcmp(ts->ts_rows[j].tu_name, name) == 0) {
                *base_p = ts->ts_store == TP_TUNABLES_OWN
                              ? tp__config_own_const(cfg, ts)
                              : (const void *)cfg;
                return &ts->ts_rows[j];
            }
        }
    }
    tp_test_fail(__FILE__, __LINE__, "no tunable %s", name);
}

// The value of an integer tunable, wherever its component stores it.
static inline int64_t
int_of(const tp_config *cfg, const char *name)
{
    const void *base;
    const tp_tunable *t = find_row(cfg, name, &base);
    TP_CHECK_EQ(t->tu_size, sizeof(int64_t));
    int64_t v;
    memcpy(&v, (const char *)base + t->tu_offset, sizeof(v));
    return v;
}

#endif
