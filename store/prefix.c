// SPDX-License-Identifier: Apache-2.0
// prefix.c - a view of another store whose keys all start with
// "<prefix>/" (PyTorch's PrefixStore): every operation is the base
// store's, on prefixed keys, under the base store's lock.
//
// Lock order: the view's s_mtx (store.c) before the base's s_mtx.

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "store_int.h"

typedef struct prefix_store {
    tp_store *p_base; // borrowed: outlives the view
    char *p_prefix;   // with the '/'
    size_t p_len;
} prefix_store;

// The prefixed copies of @n keys, in one allocation; NULL on error.
static char **
prefix_keys(const prefix_store *p, const char *const *keys, size_t n,
            tp_error **err_p)
{
    size_t total = n * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        if (p->p_len + kl > TP_STORE_MAX_KEY) {
            tp__error_set(err_p, TP_EINVAL,
                          "the key with its prefix is longer than %d bytes",
                          TP_STORE_MAX_KEY);
            return NULL;
        }
        total += p->p_len + kl + 1;
    }
    char **out = tp__alloc(total > 0 ? total : 1);
    if (out == NULL) {
        tp__error_set(err_p, TP_ENOMEM, "out of memory");
        return NULL;
    }
    char *w = (char *)(out + n);
    for (size_t i = 0; i < n; i++) {
        out[i] = w;
        memcpy(w, p->p_prefix, p->p_len);
        size_t kl = strlen(keys[i]);
        memcpy(w + p->p_len, keys[i], kl + 1);
        w += p->p_len + kl + 1;
    }
    return out;
}

// Runs @expr on the base store with the prefixed keys @pk (one key: pk[0]).
#define PREFIX_CALL(impl, keys, n, expr)                                       \
    prefix_store *p = (impl);                                                  \
    char **pk = prefix_keys(p, (keys), (n), err_p);                            \
    if (pk == NULL) {                                                          \
        return TP_EINVAL;                                                      \
    }                                                                          \
    tp_store *b = p->p_base;                                                   \
    tp__mtx_lock(&b->s_mtx);                                                   \
    tp_status st = (expr);                                                     \
    tp__mtx_unlock(&b->s_mtx);                                                 \
    tp__free(pk);                                                              \
    return st

static tp_status
prefix_set(void *impl, const char *key, const void *val, size_t len,
           int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_set(b->s_impl, pk[0], val, len, timeout_ms,
                                 deadline_ns, err_p));
}

static tp_status
prefix_get(void *impl, const char *key, int64_t timeout_ms,
           uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
           tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_get(b->s_impl, pk[0], timeout_ms, deadline_ns,
                                 val_p, len_p, err_p));
}

static tp_status
prefix_add(void *impl, const char *key, int64_t delta, int64_t timeout_ms,
           uint64_t deadline_ns, int64_t *value_p, tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_add(b->s_impl, pk[0], delta, timeout_ms,
                                 deadline_ns, value_p, err_p));
}

static tp_status
prefix_wait(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
            uint64_t deadline_ns, tp_error **err_p)
{
    PREFIX_CALL(impl, keys, n,
                b->s_ops->so_wait(b->s_impl, (const char *const *)pk, n,
                                  timeout_ms, deadline_ns, err_p));
}

static tp_status
prefix_compare_set(void *impl, const char *key, const void *exp, size_t elen,
                   const void *des, size_t dlen, int64_t timeout_ms,
                   uint64_t deadline_ns, uint8_t **val_p, size_t *len_p,
                   tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_compare_set(b->s_impl, pk[0], exp, elen, des, dlen,
                                         timeout_ms, deadline_ns, val_p, len_p,
                                         err_p));
}

static tp_status
prefix_delete(void *impl, const char *key, int64_t timeout_ms,
              uint64_t deadline_ns, bool *deleted_p, tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_delete(b->s_impl, pk[0], timeout_ms, deadline_ns,
                                    deleted_p, err_p));
}

static tp_status
prefix_delete_prefix(void *impl, const char *prefix, int64_t timeout_ms,
                     uint64_t deadline_ns, int64_t *n_p, tp_error **err_p)
{
    PREFIX_CALL(impl, &prefix, 1,
                b->s_ops->so_delete_prefix(b->s_impl, pk[0], timeout_ms,
                                           deadline_ns, n_p, err_p));
}

// The base store's count, as PyTorch's PrefixStore.num_keys.
static tp_status
prefix_num_keys(void *impl, int64_t timeout_ms, uint64_t deadline_ns,
                int64_t *n_p, tp_error **err_p)
{
    PREFIX_CALL(
        impl, NULL, 0,
        b->s_ops->so_num_keys(b->s_impl, timeout_ms, deadline_ns, n_p, err_p));
}

static tp_status
prefix_append(void *impl, const char *key, const void *val, size_t len,
              int64_t timeout_ms, uint64_t deadline_ns, tp_error **err_p)
{
    PREFIX_CALL(impl, &key, 1,
                b->s_ops->so_append(b->s_impl, pk[0], val, len, timeout_ms,
                                    deadline_ns, err_p));
}

static tp_status
prefix_check(void *impl, const char *const *keys, size_t n, int64_t timeout_ms,
             uint64_t deadline_ns, bool *all_p, tp_error **err_p)
{
    PREFIX_CALL(impl, keys, n,
                b->s_ops->so_check(b->s_impl, (const char *const *)pk, n,
                                   timeout_ms, deadline_ns, all_p, err_p));
}

static void
prefix_close(void *impl)
{
    prefix_store *p = impl;
    tp__free(p->p_prefix);
    tp__free(p);
}

const tp__store_ops tp__store_prefix_ops = {
    .so_set = prefix_set,
    .so_get = prefix_get,
    .so_add = prefix_add,
    .so_wait = prefix_wait,
    .so_compare_set = prefix_compare_set,
    .so_delete = prefix_delete,
    .so_delete_prefix = prefix_delete_prefix,
    .so_num_keys = prefix_num_keys,
    .so_append = prefix_append,
    .so_check = prefix_check,
    .so_close = prefix_close,
};

tp_status
tp_store_prefix_open(tp_store *base, const char *prefix, tp_store **store_p,
                     tp_error **err_p)
{
    if (base == NULL || prefix == NULL || store_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_store_prefix_open: base, prefix and store_p "
                             "are required");
    }
    size_t plen = strlen(prefix);
    if (plen == 0 || plen >= TP_STORE_MAX_KEY) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_store_prefix_open: the prefix must be 1..%d "
                             "bytes",
                             TP_STORE_MAX_KEY - 1);
    }
    tp_store *s = tp__zalloc(sizeof(*s));
    prefix_store *p = tp__zalloc(sizeof(*p));
    char *pfx = tp__alloc(plen + 2);
    if (s == NULL || p == NULL || pfx == NULL) {
        tp__free(s);
        tp__free(p);
        tp__free(pfx);
        return tp__error_set(err_p, TP_ENOMEM, "store: out of memory");
    }
    memcpy(pfx, prefix, plen);
    pfx[plen] = '/';
    pfx[plen + 1] = '\0';
    p->p_base = base;
    p->p_prefix = pfx;
    p->p_len = plen + 1;
    tp__mtx_init(&s->s_mtx);
    s->s_ops = &tp__store_prefix_ops;
    s->s_impl = p;
    s->s_rank = base->s_rank;
    s->s_world = base->s_world;
    s->s_timeout_ms = base->s_timeout_ms;
    s->s_max_value = base->s_max_value;
    snprintf(s->s_addr, sizeof(s->s_addr), "%.4000s (prefix \"%.64s\")",
             base->s_addr, prefix);
    *store_p = s;
    return TP_OK;
}
