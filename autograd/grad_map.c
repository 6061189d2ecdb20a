// SPDX-License-Identifier: Apache-2.0
// grad_map.c - gradients keyed by leaf tensor, which backward passes fill
// instead of .grad (distributed autograd keeps one per context).

#include <string.h>

#include "ag_impl.h"
#include "alloc.h"
#include "error.h"
#include "platform.h"

struct tp_grad_map {
    tp_mtx m_mtx; // guards everything below; concurrent passes may share
    size_t m_n, m_cap;
    tp_tensor **m_keys;
    tp_tensor **m_grads;
};

tp_status
tp_grad_map_create(tp_grad_map **map_p)
{
    tp_grad_map *m = tp__zalloc(sizeof(*m));
    if (!m) {
        return TP_ENOMEM;
    }
    tp__mtx_init(&m->m_mtx);
    *map_p = m;
    return TP_OK;
}

void
tp_grad_map_destroy(tp_grad_map *m)
{
    if (!m) {
        return;
    }
    for (size_t i = 0; i < m->m_n; i++) {
        tp_tensor_unref(m->m_keys[i]);
        tp_tensor_unref(m->m_grads[i]);
    }
    tp__free(m->m_keys);
    tp__free(m->m_grads);
    tp__mtx_fini(&m->m_mtx);
    tp__free(m);
}

tp_tensor **
tp__grad_map_find_locked(const tp_grad_map *m, const tp_tensor *leaf)
{
    // Linear: maps hold the parameters of one worker's part of a model,
    // which is tens of tensors. A hash table can come when that changes.
    for (size_t i = 0; i < m->m_n; i++) {
        if (m->m_keys[i] == leaf) {
            return &m->m_grads[i];
        }
    }
    return NULL;
}

tp_tensor *
tp_grad_map_get(const tp_grad_map *m, const tp_tensor *leaf)
{
    tp_grad_map *mm = (tp_grad_map *)m; // the lock is not the contents
    tp__mtx_lock(&mm->m_mtx);
    tp_tensor **slot = tp__grad_map_find_locked(m, leaf);
    tp_tensor *g = slot ? *slot : NULL;
    tp__mtx_unlock(&mm->m_mtx);
    return g;
}

tp_status
tp_grad_map_copy(const tp_grad_map *src, tp_grad_map **dst_p, tp_error **err_p)
{
    if (!src || !dst_p) {
        return tp__error_set(err_p, TP_EINVAL, "grad map copy: bad arguments");
    }
    tp_grad_map *d;
    if (tp_grad_map_create(&d) != TP_OK) {
        return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
    }
    tp_grad_map *s = (tp_grad_map *)src; // the lock is not the contents
    tp__mtx_lock(&s->m_mtx);
    size_t n = s->m_n;
    if (n > 0) {
        d->m_keys = tp__alloc(sizeof(*d->m_keys) * n);
        d->m_grads = tp__alloc(sizeof(*d->m_grads) * n);
        if (!d->m_keys || !d->m_grads) {
            tp__mtx_unlock(&s->m_mtx);
            tp_grad_map_destroy(d);
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
    }
    // References, not copies: accumulation never writes into a gradient
    // tensor that is in a map, it replaces the map's entry (see
    // engine.c's accumulate), so @src's later passes leave these alone.
    for (size_t i = 0; i < n; i++) {
        d->m_keys[i] = tp_tensor_ref(s->m_keys[i]);
        d->m_grads[i] = tp_tensor_ref(s->m_grads[i]);
    }
    d->m_n = d->m_cap = n;
    tp__mtx_unlock(&s->m_mtx);
    *dst_p = d;
    return TP_OK;
}

size_t
tp_grad_map_size(const tp_grad_map *m)
{
    tp_grad_map *mm = (tp_grad_map *)m;
    tp__mtx_lock(&mm->m_mtx);
    size_t n = m->m_n;
    tp__mtx_unlock(&mm->m_mtx);
    return n;
}

tp_status
tp_grad_map_entry(const tp_grad_map *m, size_t i, tp_tensor **leaf_p,
                  tp_tensor **grad_p)
{
    tp_grad_map *mm = (tp_grad_map *)m;
    tp_status st = TP_EINVAL;
    tp__mtx_lock(&mm->m_mtx);
    if (i < m->m_n) {
        *leaf_p = m->m_keys[i];
        *grad_p = m->m_grads[i];
        st = TP_OK;
    }
    tp__mtx_unlock(&mm->m_mtx);
    return st;
}

void
tp__grad_map_lock(tp_grad_map *m)
{
    tp__mtx_lock(&m->m_mtx);
}

void
tp__grad_map_unlock(tp_grad_map *m)
{
    tp__mtx_unlock(&m->m_mtx);
}

tp_status
tp__grad_map_slot_locked(tp_grad_map *m, tp_tensor *leaf, tp_tensor ***slot_p,
                         tp_error **err_p)
{
    tp_tensor **slot = tp__grad_map_find_locked(m, leaf);
    if (slot) {
        *slot_p = slot;
        return TP_OK;
    }
    if (m->m_n == m->m_cap) {
        size_t cap = m->m_cap ? m->m_cap * 2 : 8;
        tp_tensor **k = tp__realloc(m->m_keys, sizeof(*k) * cap);
        if (!k) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
        m->m_keys = k;
        tp_tensor **g = tp__realloc(m->m_grads, sizeof(*g) * cap);
        if (!g) {
            return tp__error_set(err_p, TP_ENOMEM, "autograd: out of memory");
        }
        m->m_grads = g;
        m->m_cap = cap;
    }
    m->m_keys[m->m_n] = tp_tensor_ref(leaf);
    m->m_grads[m->m_n] = NULL;
    *slot_p = &m->m_grads[m->m_n];
    m->m_n++;
    return TP_OK;
}
