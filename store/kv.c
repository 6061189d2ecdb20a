// SPDX-License-Identifier: Apache-2.0
// kv.c - the in-memory key-value engine of the mem backend and the tcp
// server: an array searched linearly (rendezvous stores hold few keys), one
// mutex and one condition variable broadcast on every change, and an
// optional watch function called after every change (the tcp server's
// event loop parks its waiting requests instead of blocking on the
// condition variable).

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "store_int.h"

void
tp__kv_init(tp__kv *kv)
{
    memset(kv, 0, sizeof(*kv));
    tp__mtx_init(&kv->kv_mtx);
    tp__cv_init(&kv->kv_cv);
}

void
tp__kv_fini(tp__kv *kv)
{
    for (size_t i = 0; i < kv->kv_n; i++) {
        tp__free(kv->kv_ents[i].e_key);
        tp__free(kv->kv_ents[i].e_val);
    }
    tp__free(kv->kv_ents);
    tp__cv_fini(&kv->kv_cv);
    tp__mtx_fini(&kv->kv_mtx);
}

void
tp__kv_close(tp__kv *kv)
{
    tp__mtx_lock(&kv->kv_mtx);
    kv->kv_closed = true;
    tp__cv_broadcast(&kv->kv_cv);
    tp__mtx_unlock(&kv->kv_mtx);
}

void
tp__kv_set_max_bytes(tp__kv *kv, uint64_t max)
{
    kv->kv_max_bytes = max;
}

void
tp__kv_set_watch(tp__kv *kv, tp__kv_watch_fn fn, void *arg)
{
    kv->kv_watch = fn;
    kv->kv_watch_arg = arg;
}

static void
kv_notify(tp__kv *kv, const char *key)
{
    if (kv->kv_watch != NULL) {
        kv->kv_watch(kv->kv_watch_arg, key);
    }
}

// A malloc'ed copy of @len bytes + NUL; NULL on OOM.
static uint8_t *
kv_dup(const void *v, size_t len)
{
    uint8_t *p = tp__alloc(len + 1);
    if (p == NULL) {
        return NULL;
    }
    if (len > 0) {
        memcpy(p, v, len);
    }
    p[len] = 0;
    return p;
}

// Parses a decimal int64 of @len bytes; false if it is not one.
static bool
kv_parse_i64(const uint8_t *v, size_t len, int64_t *out_p)
{
    char buf[32];
    if (len == 0 || len >= sizeof(buf)) {
        return false;
    }
    memcpy(buf, v, len);
    buf[len] = 0;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(buf, &end, 10);
    if (errno != 0 || end != buf + len) {
        return false;
    }
    *out_p = (int64_t)x;
    return true;
}

static tp__kv_entry *
kv_find_locked(tp__kv *kv, const char *key)
{
    for (size_t i = 0; i < kv->kv_n; i++) {
        if (strcmp(kv->kv_ents[i].e_key, key) == 0) {
            return &kv->kv_ents[i];
        }
    }
    return NULL;
}

// Sets @key to a copy of @val; the caller broadcasts.
static tp_status
kv_put_locked(tp__kv *kv, const char *key, const void *val, size_t len,
              tp_error **err_p)
{
    tp__kv_entry *e = kv_find_locked(kv, key);
    size_t klen = strlen(key);
    uint64_t after = kv->kv_bytes + len - (e != NULL ? e->e_len : 0) +
                     (e != NULL ? 0 : klen);
    if (kv->kv_max_bytes != 0 && after > kv->kv_max_bytes) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "store full: storing %zu bytes at \"%.64s\" "
                             "would hold %llu bytes, over the cap of %llu "
                             "(TP_STORE_MAX_BYTES)",
                             len, key, (unsigned long long)after,
                             (unsigned long long)kv->kv_max_bytes);
    }
    uint8_t *v = kv_dup(val, len);
    if (v == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    if (e != NULL) {
        tp__free(e->e_val);
        e->e_val = v;
        e->e_len = len;
        kv->kv_bytes = after;
        return TP_OK;
    }
    if (kv->kv_n == kv->kv_cap) {
        size_t cap = kv->kv_cap ? kv->kv_cap * 2 : 16;
        tp__kv_entry *ents = tp__realloc(kv->kv_ents, cap * sizeof(*ents));
        if (ents == NULL) {
            tp__free(v);
            return tp__error_set(err_p, TP_ENOMEM, "out of memory");
        }
        kv->kv_ents = ents;
        kv->kv_cap = cap;
    }
    char *k = tp__strdup(key);
    if (k == NULL) {
        tp__free(v);
        return tp__error_set(err_p, TP_ENOMEM, "out of memory");
    }
    kv->kv_ents[kv->kv_n++] = (tp__kv_entry){k, v, len};
    kv->kv_bytes = after;
    return TP_OK;
}

static tp_status
kv_closed_error(tp_error **err_p)
{
    return tp__error_set(err_p, TP_ECLOSED, "store closed");
}

tp_status
tp__kv_set(tp__kv *kv, const char *key, const void *val, size_t len,
           tp_error **err_p)
{
    tp__mtx_lock(&kv->kv_mtx);
    tp_status st = kv->kv_closed ? kv_closed_error(err_p)
                                 : kv_put_locked(kv, key, val, len, err_p);
    if (st == TP_OK) {
        tp__cv_broadcast(&kv->kv_cv);
    }
    tp__mtx_unlock(&kv->kv_mtx);
    if (st == TP_OK) {
        kv_notify(kv, key);
    }
    return st;
}

tp_status
tp__kv_get(tp__kv *kv, const char *key, uint64_t deadline_ns, uint8_t **val_p,
           size_t *len_p, tp_error **err_p)
{
    tp_status st = TP_OK;
    tp__mtx_lock(&kv->kv_mtx);
    tp__kv_entry *e;
    while ((e = kv_find_locked(kv, key)) == NULL) {
        if (kv->kv_closed) {
            st = kv_closed_error(err_p);
            goto out;
        }
        if (tp__now_ns() >= deadline_ns ||
            !tp__cv_wait_until(&kv->kv_cv, &kv->kv_mtx, deadline_ns)) {
            if (kv_find_locked(kv, key) != NULL) {
                continue;
            }
            st = tp__error_set(err_p, TP_ETIMEDOUT, "key not set");
            goto out;
        }
    }
    uint8_t *v = kv_dup(e->e_val, e->e_len);
    if (v == NULL) {
        st = tp__error_set(err_p, TP_ENOMEM, "out of memory");
        goto out;
    }
    *val_p = v;
    *len_p = e->e_len;
out:
    tp__mtx_unlock(&kv->kv_mtx);
    return st;
}

tp_status
tp__kv_add(tp__kv *kv, const char *key, int64_t delta, int64_t *value_p,
           tp_error **err_p)
{
    tp_status st = TP_OK;
    tp__mtx_lock(&kv->kv_mtx);
    if (kv->kv_closed) {
        st = kv_closed_error(err_p);
        goto out;
    }
    int64_t cur = 0;
    tp__kv_entry *e = kv_find_locked(kv, key);
    if (e != NULL && !kv_parse_i64(e->e_val, e->e_len, &cur)) {
        st = tp__error_set(err_p, TP_EINVAL, "value is not a decimal integer");
        goto out;
    }
    // Wraps like two's complement, as PyTorch's int64 arithmetic does.
    int64_t nv = (int64_t)((uint64_t)cur + (uint64_t)delta);
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%" PRId64, nv);
    st = kv_put_locked(kv, key, buf, (size_t)n, err_p);
    if (st == TP_OK) {
        *value_p = nv;
        tp__cv_broadcast(&kv->kv_cv);
    }
out:
    tp__mtx_unlock(&kv->kv_mtx);
    if (st == TP_OK) {
        kv_notify(kv, key);
    }
    return st;
}

// The keys of @keys not set, as "not set: \"a\", \"b\"" (the first few).
static tp_status
kv_wait_timeout_locked(tp__kv *kv, const char *const *keys, size_t n,
                       tp_error **err_p)
{
    char buf[512];
    size_t off = (size_t)snprintf(buf, sizeof(buf), "not set:");
    size_t shown = 0;
    for (size_t i = 0; i < n && off < sizeof(buf); i++) {
        if (kv_find_locked(kv, keys[i]) != NULL) {
            continue;
        }
        if (shown++ == 8) {
            off += (size_t)snprintf(buf + off, sizeof(buf) - off, " ...");
            break;
        }
        off += (size_t)snprintf(buf + off, sizeof(buf) - off, "%s \"%.64s\"",
                                shown > 1 ? "," : "", keys[i]);
    }
    return tp__error_set(err_p, TP_ETIMEDOUT, "%s", buf);
}

tp_status
tp__kv_wait(tp__kv *kv, const char *const *keys, size_t n, uint64_t deadline_ns,
            tp_error **err_p)
{
    tp_status st = TP_OK;
    tp__mtx_lock(&kv->kv_mtx);
    for (;;) {
        size_t i = 0;
        while (i < n && kv_find_locked(kv, keys[i]) != NULL) {
            i++;
        }
        if (i == n) {
            break;
        }
        if (kv->kv_closed) {
            st = kv_closed_error(err_p);
            break;
        }
        if (tp__now_ns() >= deadline_ns) {
            st = kv_wait_timeout_locked(kv, keys, n, err_p);
            break;
        }
        tp__cv_wait_until(&kv->kv_cv, &kv->kv_mtx, deadline_ns);
    }
    tp__mtx_unlock(&kv->kv_mtx);
    return st;
}

tp_status
tp__kv_compare_set(tp__kv *kv, const char *key, const void *exp, size_t elen,
                   const void *des, size_t dlen, uint8_t **val_p, size_t *len_p,
                   tp_error **err_p)
{
    tp_status st = TP_OK;
    bool stored = false;
    tp__mtx_lock(&kv->kv_mtx);
    if (kv->kv_closed) {
        st = kv_closed_error(err_p);
        goto out;
    }
    tp__kv_entry *e = kv_find_locked(kv, key);
    const void *res;
    size_t rlen;
    if ((e == NULL && elen == 0) ||
        (e != NULL && e->e_len == elen &&
         (elen == 0 || memcmp(e->e_val, exp, elen) == 0))) {
        st = kv_put_locked(kv, key, des, dlen, err_p);
        if (st != TP_OK) {
            goto out;
        }
        tp__cv_broadcast(&kv->kv_cv);
        stored = true;
        res = des;
        rlen = dlen;
    } else if (e == NULL) {
        res = exp; // PyTorch returns the expected value here
        rlen = elen;
    } else {
        res = e->e_val;
        rlen = e->e_len;
    }
    uint8_t *v = kv_dup(res, rlen);
    if (v == NULL) {
        st = tp__error_set(err_p, TP_ENOMEM, "out of memory");
        goto out;
    }
    *val_p = v;
    *len_p = rlen;
out:
    tp__mtx_unlock(&kv->kv_mtx);
    if (stored) {
        kv_notify(kv, key);
    }
    return st;
}

tp_status
tp__kv_delete(tp__kv *kv, const char *key, bool *deleted_p)
{
    tp__mtx_lock(&kv->kv_mtx);
    tp__kv_entry *e = kv_find_locked(kv, key);
    if (e != NULL) {
        kv->kv_bytes -= strlen(e->e_key) + e->e_len;
        tp__free(e->e_key);
        tp__free(e->e_val);
        *e = kv->kv_ents[--kv->kv_n];
    }
    tp__mtx_unlock(&kv->kv_mtx);
    *deleted_p = e != NULL;
    return TP_OK;
}

void
tp__kv_delete_prefix(tp__kv *kv, const char *prefix, int64_t *n_p)
{
    size_t plen = strlen(prefix);
    int64_t n = 0;
    tp__mtx_lock(&kv->kv_mtx);
    for (size_t i = kv->kv_n; i-- > 0;) {
        tp__kv_entry *e = &kv->kv_ents[i];
        if (strncmp(e->e_key, prefix, plen) == 0) {
            kv->kv_bytes -= strlen(e->e_key) + e->e_len;
            tp__free(e->e_key);
            tp__free(e->e_val);
            *e = kv->kv_ents[--kv->kv_n];
            n++;
        }
    }
    tp__mtx_unlock(&kv->kv_mtx);
    *n_p = n;
}

tp_status
tp__kv_prefix_keys(tp__kv *kv, const char *prefix, char ***keys_p, size_t *n_p)
{
    size_t plen = strlen(prefix), n = 0;
    tp_status st = TP_OK;
    tp__mtx_lock(&kv->kv_mtx);
    char **keys = tp__alloc((kv->kv_n + 1) * sizeof(*keys));
    for (size_t i = 0; keys != NULL && i < kv->kv_n; i++) {
        const char *k = kv->kv_ents[i].e_key;
        if (strncmp(k, prefix, plen) != 0) {
            continue;
        }
        keys[n] = (char *)kv_dup(k, strlen(k));
        if (keys[n] == NULL) {
            st = TP_ENOMEM;
            break;
        }
        n++;
    }
    tp__mtx_unlock(&kv->kv_mtx);
    if (keys == NULL || st != TP_OK) {
        for (size_t i = 0; keys != NULL && i < n; i++) {
            tp__free(keys[i]);
        }
        tp__free(keys);
        return TP_ENOMEM;
    }
    *keys_p = keys;
    *n_p = n;
    return TP_OK;
}

int64_t
tp__kv_num_keys(tp__kv *kv)
{
    tp__mtx_lock(&kv->kv_mtx);
    int64_t n = (int64_t)kv->kv_n;
    tp__mtx_unlock(&kv->kv_mtx);
    return n;
}

tp_status
tp__kv_append(tp__kv *kv, const char *key, const void *val, size_t len,
              int64_t max_value, tp_error **err_p)
{
    tp__mtx_lock(&kv->kv_mtx);
    tp_status st = TP_OK;
    uint8_t *nv = NULL;
    if (kv->kv_closed) {
        st = kv_closed_error(err_p);
        goto out;
    }
    tp__kv_entry *e = kv_find_locked(kv, key);
    size_t old = e != NULL ? e->e_len : 0;
    if (max_value > 0 && (uint64_t)old + len > (uint64_t)max_value) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "appending %zu bytes to a value of %zu would pass "
                           "TP_STORE_MAX_VALUE (%lld)",
                           len, old, (long long)max_value);
        goto out;
    }
    nv = tp__alloc(old + len + 1);
    if (nv == NULL) {
        st = tp__error_set(err_p, TP_ENOMEM, "out of memory");
        goto out;
    }
    if (old > 0) {
        memcpy(nv, e->e_val, old);
    }
    if (len > 0) {
        memcpy(nv + old, val, len);
    }
    st = kv_put_locked(kv, key, nv, old + len, err_p);
    if (st == TP_OK) {
        tp__cv_broadcast(&kv->kv_cv);
    }
out:
    tp__mtx_unlock(&kv->kv_mtx);
    tp__free(nv);
    if (st == TP_OK) {
        kv_notify(kv, key);
    }
    return st;
}

bool
tp__kv_check(tp__kv *kv, const char *const *keys, size_t n)
{
    tp__mtx_lock(&kv->kv_mtx);
    bool all = true;
    for (size_t i = 0; i < n && all; i++) {
        all = kv_find_locked(kv, keys[i]) != NULL;
    }
    tp__mtx_unlock(&kv->kv_mtx);
    return all;
}
