// SPDX-License-Identifier: Apache-2.0
// rpc_gather.c - tp_rpc_all_gather and tp_rpc_barrier: PyTorch's
// _all_gather over the workers, through the job's store. The k-th call of
// each worker is round k (a counter per worker in the store), so every
// worker must make the same calls in the same order, as with PyTorch.
// Round k: each worker sets "<prefix>gather/<k>/<rank>" and reads every
// worker's key. Once a worker finishes round k, every worker has set its
// key of round k and so finished reading round k - 1: it deletes its own
// key of round k - 1, so the store holds at most two rounds.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"

tp_status
tp_rpc_all_gather(tp_agent *a, const void *in, size_t len, int64_t timeout_ms,
                  void **vals, size_t *lens, tp_error **err_p)
{
    if (a == NULL || vals == NULL || (in == NULL && len > 0)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_rpc_all_gather: agent and vals are "
                             "required (and in, when len > 0)");
    }
    if (timeout_ms < TP_TIMEOUT_DEFAULT) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_rpc_all_gather: timeout_ms %lld: -1 "
                             "(default), 0 (none) or > 0",
                             (long long)timeout_ms);
    }
    int64_t ms = timeout_ms == TP_TIMEOUT_DEFAULT ? a->a_opts.rpc_timeout_ms
                                                  : timeout_ms;
    uint64_t deadline = tp__deadline_after_ms(ms);
    char key[128];
    snprintf(key, sizeof(key), "%sgather/n/%d", a->a_prefix, a->a_rank);
    int64_t round = 0;
    tp_status st =
        tp_store_add(a->a_store, key, 1, tp__ms_left(deadline), &round, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    snprintf(key, sizeof(key), "%sgather/%lld/%d", a->a_prefix,
             (long long)round, a->a_rank);
    st = tp_store_set(a->a_store, key, in, len, tp__ms_left(deadline), err_p);
    if (st != TP_OK) {
        goto fail;
    }
    int n = a->a_world;
    char(*kb)[128] = calloc((size_t)n, sizeof(*kb));
    const char **keys = calloc((size_t)n, sizeof(*keys));
    if (kb == NULL || keys == NULL) {
        free(kb);
        free(keys);
        st = tp__error_set(err_p, TP_ENOMEM, "out of memory");
        goto fail;
    }
    for (int r = 0; r < n; r++) {
        snprintf(kb[r], sizeof(kb[r]), "%sgather/%lld/%d", a->a_prefix,
                 (long long)round, r);
        keys[r] = kb[r];
    }
    st = tp_store_multi_get(a->a_store, keys, (size_t)n, tp__ms_left(deadline),
                            vals, lens, err_p);
    free(keys);
    free(kb);
    if (st != TP_OK) {
        goto fail;
    }
    if (round > 1) {
        tp_error *e = NULL;
        snprintf(key, sizeof(key), "%sgather/%lld/%d", a->a_prefix,
                 (long long)(round - 1), a->a_rank);
        if (tp_store_delete_key(a->a_store, key, tp__ms_left(deadline), NULL,
                                &e) != TP_OK) {
            tp_error_unref(e); // only garbage left behind
        }
    }
    return TP_OK;
fail:
    return tp__error_wrap(err_p, st, "rpc all_gather of %s (rank %d)",
                          ag_name(a), a->a_rank);
}

tp_status
tp_rpc_barrier(tp_agent *a, int64_t timeout_ms, tp_error **err_p)
{
    if (a == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_rpc_barrier: no agent");
    }
    void **vals = calloc((size_t)a->a_world, sizeof(*vals));
    if (vals == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rpc barrier: out of memory");
    }
    tp_status st = tp_rpc_all_gather(a, NULL, 0, timeout_ms, vals, NULL, err_p);
    for (int r = 0; r < a->a_world; r++) {
        free(vals[r]);
    }
    free(vals);
    return st;
}
