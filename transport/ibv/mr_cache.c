// SPDX-License-Identifier: Apache-2.0
// mr_cache.c - memory registrations cached by range (see verbs.h): a range
// inside one already registered with the same access reuses it. Registering
// is a system call that pins pages (milliseconds for large buffers), so a
// buffer used again is registered once.

#include "core/alloc.h"
#include "core/log.h"
#include "transport/ibv/verbs.h"

typedef struct tp_ibv_mr_ent {
    struct tp_ibv_mr_ent *e_next;
    tp_ibv_mr *e_mr;
    bool e_remote;
    unsigned e_refs;
} tp_ibv_mr_ent;

void
tp__ibv_mr_cache_init(tp_ibv_mr_cache *mc, const tp_ibv_verbs *v,
                      tp_ibv_dev *dev)
{
    mc->mc_v = v;
    mc->mc_dev = dev;
    mc->mc_ents = NULL;
    mc->mc_hits = 0;
    mc->mc_misses = 0;
}

void
tp__ibv_mr_cache_fini(tp_ibv_mr_cache *mc)
{
    tp_ibv_mr_ent *e = mc->mc_ents;
    while (e != NULL) {
        tp_ibv_mr_ent *next = e->e_next;
        TP_LOG_WARN("TP-IBV-MR",
                    "ibv: registration of %zu bytes still referenced %u "
                    "times at close; deregistered",
                    e->e_mr->mr_len, e->e_refs);
        mc->mc_v->dereg_mr(e->e_mr);
        tp__free(e);
        e = next;
    }
    mc->mc_ents = NULL;
}

tp_status
tp__ibv_mr_get(tp_ibv_mr_cache *mc, void *addr, size_t len, bool remote_write,
               const tp_ibv_mr **mr_p, tp_error **err_p)
{
    uintptr_t a = (uintptr_t)addr;
    for (tp_ibv_mr_ent *e = mc->mc_ents; e != NULL; e = e->e_next) {
        uintptr_t b = (uintptr_t)e->e_mr->mr_addr;
        if (e->e_remote == remote_write && a >= b &&
            a + len <= b + e->e_mr->mr_len) {
            e->e_refs++;
            mc->mc_hits++;
            *mr_p = e->e_mr;
            return TP_OK;
        }
    }
    tp_ibv_mr_ent *e = tp__zalloc(sizeof(*e));
    if (e == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "ibv: registering %zu bytes: out of memory", len);
    }
    tp_status st =
        mc->mc_v->reg_mr(mc->mc_dev, addr, len, remote_write, &e->e_mr, err_p);
    if (st != TP_OK) {
        tp__free(e);
        return st;
    }
    e->e_remote = remote_write;
    e->e_refs = 1;
    e->e_next = mc->mc_ents;
    mc->mc_ents = e;
    mc->mc_misses++;
    *mr_p = e->e_mr;
    return TP_OK;
}

void
tp__ibv_mr_put(tp_ibv_mr_cache *mc, const tp_ibv_mr *mr)
{
    for (tp_ibv_mr_ent **pp = &mc->mc_ents; *pp != NULL; pp = &(*pp)->e_next) {
        tp_ibv_mr_ent *e = *pp;
        if (e->e_mr != mr) {
            continue;
        }
        TP_ASSERT(e->e_refs > 0);
        if (--e->e_refs == 0) {
            *pp = e->e_next;
            mc->mc_v->dereg_mr(e->e_mr);
            tp__free(e);
        }
        return;
    }
    TP_ASSERT(!"tp__ibv_mr_put of a registration not in the cache");
}
