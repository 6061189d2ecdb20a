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

static tp_tensor **
grad_map_slot(const tp_grad_map *m, const tp_tensor *leaf)
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
    tp_tensor **slot = grad_map_slot(m, leaf);
    tp_tensor *g = slot ? *slot : NULL;
    tp__mtx_unlock(&mm->m_mtx);
    return g;
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
    tp_tensor **slot = grad_map_slot(m, leaf);
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
