// SPDX-License-Identifier: Apache-2.0
// cuda_ipc_cache.c - the peer's allocations this channel has opened
// (cuda_ipc_impl.h). cudaIpcOpenMemHandle costs tens to hundreds of
// microseconds and a caching allocator (PyTorch's) sends tensors from the
// same few allocations again and again, so a mapping may stay open after
// its copy: up to TP_CUDA_IPC_CACHE idle ones (default 0: none), the least
// recently used closed first; all of them when the pipe goes. A mapping in
// use by copies is shared by them (this pipe opens a handle once per
// device at a time), whatever the bound. Opt-in because CUDA leaves a
// cudaFree of an exported allocation that an importer still has open
// undefined: only a sender that never frees what it sent while the pipe
// lives may have its allocations cached. Any thread (the copies run on the
// context's pool).

#include "channel/cuda_ipc/cuda_ipc_impl.h"

void
tp__cipc_cache_init(cipc_cache *c, unsigned cap)
{
    memset(c, 0, sizeof(*c));
    pthread_mutex_init(&c->cc_mtx, NULL);
    c->cc_cap = cap;
}

// Lock held: closes idle mappings, least recently used first, until at
// most cc_cap are left.
static void
cache_trim(cipc_cache *c)
{
    for (;;) {
        unsigned idle = 0;
        cipc_map *lru = NULL;
        for (unsigned i = 0; i < c->cc_n; i++) {
            cipc_map *m = &c->cc_maps[i];
            if (m->m_used != 0 && m->m_refs == 0) {
                idle++;
                if (lru == NULL || m->m_used < lru->m_used) {
                    lru = m;
                }
            }
        }
        if (idle <= c->cc_cap || lru == NULL) {
            return;
        }
        tp__cuda_ipc_mem_close(lru->m_dev, lru->m_base);
        lru->m_used = 0;
    }
}

tp_status
tp__cipc_cache_get(cipc_cache *c, const uint8_t *handle, int dev, void **base_p,
                   size_t *size_p, tp_error **err_p)
{
    pthread_mutex_lock(&c->cc_mtx);
    cipc_map *free_slot = NULL;
    for (unsigned i = 0; i < c->cc_n; i++) {
        cipc_map *m = &c->cc_maps[i];
        if (m->m_used == 0) {
            free_slot = free_slot ? free_slot : m;
        } else if (m->m_dev == dev &&
                   memcmp(m->m_handle, handle, TP_CUDA_IPC_HANDLE_LEN) == 0) {
            m->m_refs++;
            m->m_used = ++c->cc_tick;
            *base_p = m->m_base;
            *size_p = m->m_size;
            c->cc_hits++;
            pthread_mutex_unlock(&c->cc_mtx);
            return TP_OK;
        }
    }
    // Opened under the lock: two copies never open one handle twice.
    void *base = NULL, *b2 = NULL;
    size_t size = 0;
    tp_status st = tp__cuda_ipc_mem_open(dev, handle, &base, err_p);
    if (st == TP_OK) {
        // The size of what the handle really names, for the range check.
        st = tp__cuda_mem_range(dev, base, &b2, &size, err_p);
        if (st != TP_OK) {
            tp__cuda_ipc_mem_close(dev, base);
        }
    }
    if (st == TP_OK && free_slot == NULL) {
        cipc_map *maps =
            tp__realloc(c->cc_maps, (c->cc_n + 1) * sizeof(*c->cc_maps));
        if (maps == NULL) {
            tp__cuda_ipc_mem_close(dev, base);
            st = tp__error_set(err_p, TP_ENOMEM,
                               "cuda_ipc: out of memory (handle cache)");
        } else {
            c->cc_maps = maps;
            free_slot = &c->cc_maps[c->cc_n++];
        }
    }
    if (st == TP_OK) {
        memcpy(free_slot->m_handle, handle, TP_CUDA_IPC_HANDLE_LEN);
        free_slot->m_dev = dev;
        free_slot->m_base = base;
        free_slot->m_size = size;
        free_slot->m_refs = 1;
        free_slot->m_used = ++c->cc_tick;
        c->cc_opens++;
        *base_p = base;
        *size_p = size;
    }
    pthread_mutex_unlock(&c->cc_mtx);
    return st;
}

void
tp__cipc_cache_put(cipc_cache *c, void *base, int dev)
{
    pthread_mutex_lock(&c->cc_mtx);
    for (unsigned i = 0; i < c->cc_n; i++) {
        cipc_map *m = &c->cc_maps[i];
        if (m->m_used != 0 && m->m_base == base && m->m_dev == dev &&
            m->m_refs > 0) {
            m->m_refs--;
            break;
        }
    }
    cache_trim(c);
    pthread_mutex_unlock(&c->cc_mtx);
}

void
tp__cipc_cache_fini(cipc_cache *c)
{
    for (unsigned i = 0; i < c->cc_n; i++) {
        cipc_map *m = &c->cc_maps[i];
        if (m->m_used != 0) {
            tp__cuda_ipc_mem_close(m->m_dev, m->m_base);
        }
    }
    tp__free(c->cc_maps);
    pthread_mutex_destroy(&c->cc_mtx);
    memset(c, 0, sizeof(*c));
}
