// SPDX-License-Identifier: Apache-2.0
// pmix.c - env:// under a PMIx launcher (OpenMPI's mpirun, Slurm's
// srun --mpi=pmix) without MASTER_ADDR: rank 0 publishes its store address
// with PMIx_Put and every process reads it after a fence. The only file
// that calls libpmix (TP_WITH_PMIX); without it the calls fail with
// TP_ENOTSUP.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"
#include "tp_config.h"

#if TP_HAVE_PMIX
#include <pmix.h>
#endif

bool
tp__pmix_present(void)
{
#if TP_HAVE_PMIX
    const char *r = getenv("PMIX_RANK"), *ns = getenv("PMIX_NAMESPACE");
    return r != NULL && *r != '\0' && ns != NULL && *ns != '\0';
#else
    return false;
#endif
}

#if TP_HAVE_PMIX

#define PMIX_STORE_KEY "tpipe.store.addr"

static tp_status
pmix_fail(tp_error **err_p, const char *call, pmix_status_t rc)
{
    return tp__error_set(err_p,
                         rc == PMIX_ERR_TIMEOUT ? TP_ETIMEDOUT : TP_EINTERNAL,
                         "env://: %s: %s", call, PMIx_Error_string(rc));
}

tp_status
tp__pmix_exchange(const char *mine, int store_rank, int64_t timeout_ms,
                  char *buf, size_t len, tp_error **err_p)
{
    pmix_proc_t me;
    pmix_status_t rc = PMIx_Init(&me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        return pmix_fail(err_p, "PMIx_Init", rc);
    }
    tp_status st = TP_OK;
    if ((me.rank == 0) != (mine != NULL)) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "env://: PMIx rank %u is not store rank %d: rank "
                           "0 of the store must be PMIx rank 0",
                           (unsigned)me.rank, store_rank);
        goto out_fini;
    }
    if (mine != NULL) {
        pmix_value_t v;
        PMIX_VALUE_CONSTRUCT(&v);
        v.type = PMIX_STRING;
        v.data.string = (char *)mine; // copied by PMIx_Put
        rc = PMIx_Put(PMIX_GLOBAL, PMIX_STORE_KEY, &v);
        if (rc == PMIX_SUCCESS) {
            rc = PMIx_Commit();
        }
        if (rc != PMIX_SUCCESS) {
            st = pmix_fail(err_p, "PMIx_Put of the store address", rc);
            goto out_fini;
        }
    }
    // Fence over the whole namespace, collecting the data put: afterwards
    // rank 0's address is local to every process.
    pmix_proc_t all;
    PMIX_PROC_CONSTRUCT(&all);
    memcpy(all.nspace, me.nspace, sizeof(all.nspace));
    all.rank = PMIX_RANK_WILDCARD;
    pmix_info_t info[2];
    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    bool collect = true;
    int secs = timeout_ms > 0 ? (int)((timeout_ms + 999) / 1000) : 0;
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &secs, PMIX_INT);
    rc = PMIx_Fence(&all, 1, info, secs > 0 ? 2 : 1);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc != PMIX_SUCCESS) {
        st = pmix_fail(err_p, "PMIx_Fence", rc);
        goto out_fini;
    }
    pmix_proc_t r0 = all;
    r0.rank = 0;
    pmix_value_t *val = NULL;
    rc = PMIx_Get(&r0, PMIX_STORE_KEY, NULL, 0, &val);
    if (rc != PMIX_SUCCESS) {
        st = pmix_fail(err_p, "PMIx_Get of rank 0's store address", rc);
        goto out_fini;
    }
    if (val->type != PMIX_STRING || val->data.string == NULL ||
        strlen(val->data.string) >= len) {
        st = tp__error_set(err_p, TP_EPROTO,
                           "env://: PMIx: rank 0's store address is not a "
                           "string of less than %zu bytes",
                           len);
    } else {
        strcpy(buf, val->data.string);
    }
    PMIX_VALUE_RELEASE(val);
out_fini:
    PMIx_Finalize(NULL, 0);
    return st;
}

#else

tp_status
tp__pmix_exchange(const char *mine, int store_rank, int64_t timeout_ms,
                  char *buf, size_t len, tp_error **err_p)
{
    (void)mine;
    (void)store_rank;
    (void)timeout_ms;
    (void)buf;
    (void)len;
    return tp__error_set(err_p, TP_ENOTSUP,
                         "env://: built without PMIx (TP_WITH_PMIX)");
}

#endif
