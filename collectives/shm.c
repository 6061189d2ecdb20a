/* SPDX-License-Identifier: Apache-2.0 */
/* shm.c - placeholder until the shared-memory engine lands. */
#include "collectives/shm.h"

#include <stdio.h>

tp_status
tp__shm_open(const tp__shm_setup *s, tp__shm **shm_p, char *why,
             size_t why_len, tp_error **err_p)
{
    (void)s;
    (void)err_p;
    *shm_p = NULL;
    snprintf(why, why_len, "shm engine not built");
    return TP_OK;
}

tp_status
tp__shm_run(tp__shm *shm, const tp__coll_args *a, uint64_t deadline_ns,
            tp_error **err_p)
{
    (void)shm;
    (void)a;
    (void)deadline_ns;
    (void)err_p;
    return TP_ENOTSUP;
}

void
tp__shm_close(tp__shm *shm)
{
    (void)shm;
}
