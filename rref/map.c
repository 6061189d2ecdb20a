// SPDX-License-Identifier: Apache-2.0
// map.c - an intrusive chained hash map on RRef ids (rr_impl.h). Ids are
// (rank, counter): the counter's low bits spread them, mixed with the
// rank so that ids of many workers do not pile up in one chain.

#include "rr_impl.h"

#include "core/alloc.h"

#define RR_MAP_INITIAL 64

static size_t
map_slot(const rr_map *m, rr_id key)
{
    uint64_t h = key.n ^ ((uint64_t)key.w * 0x9e3779b97f4a7c15ull);
    h ^= h >> 29;
    return (size_t)h & (m->m_size - 1);
}

tp_status
tp__rr_map_init(rr_map *m)
{
    m->m_b = tp__zalloc(RR_MAP_INITIAL * sizeof(*m->m_b));
    m->m_size = RR_MAP_INITIAL;
    m->m_count = 0;
    return m->m_b != NULL ? TP_OK : TP_ENOMEM;
}

void
tp__rr_map_fini(rr_map *m)
{
    tp__free(m->m_b);
    m->m_b = NULL;
    m->m_size = 0;
    m->m_count = 0;
}

rr_node *
tp__rr_map_get(const rr_map *m, rr_id key)
{
    if (m->m_b == NULL) {
        return NULL;
    }
    for (rr_node *n = m->m_b[map_slot(m, key)]; n != NULL; n = n->n_next) {
        if (rr_id_eq(n->n_key, key)) {
            return n;
        }
    }
    return NULL;
}

static void
map_grow(rr_map *m)
{
    size_t nsize = m->m_size * 2;
    rr_node **nb = tp__zalloc(nsize * sizeof(*nb));
    if (nb == NULL) {
        return; // longer chains
    }
    rr_node **old = m->m_b;
    size_t osize = m->m_size;
    m->m_b = nb;
    m->m_size = nsize;
    for (size_t i = 0; i < osize; i++) {
        rr_node *n = old[i];
        while (n != NULL) {
            rr_node *next = n->n_next;
            size_t s = map_slot(m, n->n_key);
            n->n_next = nb[s];
            nb[s] = n;
            n = next;
        }
    }
    tp__free(old);
}

void
tp__rr_map_put(rr_map *m, rr_node *n)
{
    if (m->m_count >= m->m_size) {
        map_grow(m);
    }
    size_t s = map_slot(m, n->n_key);
    n->n_next = m->m_b[s];
    m->m_b[s] = n;
    m->m_count++;
}

rr_node *
tp__rr_map_del(rr_map *m, rr_id key)
{
    if (m->m_b == NULL) {
        return NULL;
    }
    for (rr_node **pp = &m->m_b[map_slot(m, key)]; *pp != NULL;
         pp = &(*pp)->n_next) {
        rr_node *n = *pp;
        if (rr_id_eq(n->n_key, key)) {
            *pp = n->n_next;
            n->n_next = NULL;
            m->m_count--;
            return n;
        }
    }
    return NULL;
}

static rr_node *
map_scan(const rr_map *m, size_t from)
{
    for (size_t i = from; i < m->m_size; i++) {
        if (m->m_b[i] != NULL) {
            return m->m_b[i];
        }
    }
    return NULL;
}

rr_node *
tp__rr_map_first(const rr_map *m)
{
    return m->m_b != NULL ? map_scan(m, 0) : NULL;
}

rr_node *
tp__rr_map_next(const rr_map *m, const rr_node *n)
{
    if (n->n_next != NULL) {
        return n->n_next;
    }
    return map_scan(m, map_slot(m, n->n_key) + 1);
}
