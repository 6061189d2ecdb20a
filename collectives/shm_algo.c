/* SPDX-License-Identifier: Apache-2.0 */
/* shm_algo.c - the shm engine's collectives (shm_impl.h) and tp__shm_run.
 *
 * Algorithms (n ranks; every reduction is in rank order 0..n-1:
 * acc = x0 op x1, then acc op= x2, ... with tp__reduce3 / tp__reduce, so
 * results are bitwise identical on every rank and in both modes):
 *   barrier:        post P, wait all.
 *   broadcast:      slot: root copies buf in, posts; others wait root,
 *                   copy out. cma: root publishes buf; others read it and
 *                   post P + 1; root waits all P + 1.
 *   all_reduce:     slot: all copy in, post, wait all, every rank reduces
 *                   every slot into buf. cma: all publish buf, post, wait
 *                   all; reduce-scatter: rank r reduces chunk r of every
 *                   buf (count split into n nearly equal element ranges)
 *                   into its own buf; post P + 1, wait all; all-gather:
 *                   read chunk q from rank q's buf; post P + 2, wait all.
 *   reduce:         slot: all copy in, post; root waits all and reduces.
 *                   cma: all publish; root reduces every buf into its own
 *                   and posts P + 1; others wait for it (their buffers are
 *                   never written).
 *   all_gather:     slot: all copy in, post, wait all, copy every slot.
 *                   cma: all publish, read every buf, post P + 1, wait all.
 *   gather:         as all_gather, with only the root reading.
 *   scatter:        the root's whole in (n * count) is its contribution;
 *                   every rank reads its block.
 *   reduce_scatter: the whole in (n * count) is each rank's contribution;
 *                   rank r reduces block r of every rank into out.
 *   all_to_all:     each rank packs every block it sends into its slot if
 *                   they all fit (else publishes in) and writes, per
 *                   destination, the block's offset and count to its
 *                   table; every rank reads its block from every rank and
 *                   posts P + 1; a rank that published in waits all P + 1.
 *   size 1:         local copies, no phases. */

#include "collectives/shm_impl.h"

#include <inttypes.h>

#include "core/error.h"

static tp_status
shm_barrier(const shm_op *o)
{
    uint32_t p = o->o_m->m_phase + 1;
    tp__shm_post(o->o_m, p);
    return tp__shm_wait_all(o, p);
}

static tp_status
shm_broadcast(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st;
    if (m->m_rank == a->root) {
        return tp__shm_give_source(o, p, a->buf, bytes, slot);
    }
    tp__shm_post(m, p);
    st = tp__shm_wait(o, a->root, p);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_look(m, a->root, p);
    st = tp__shm_fetch(o, a->root, 0, a->buf, bytes);
    if (st == TP_OK && !slot) {
        tp__shm_post(m, p + 1);
    }
    return st;
}

// Splits @count elements into n nearly equal ranges; range @q.
static void
shm_chunk(size_t count, int n, int q, size_t *start_p, size_t *len_p)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    size_t uq = (size_t)q;
    *start_p = uq * base + TP_MIN(uq, rem);
    *len_p = base + (uq < rem ? 1 : 0);
}

static tp_status
shm_all_reduce(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t es = o->o_es, bytes = a->count * es;
    bool slot = bytes <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = tp__shm_give_all(o, p, a->buf, bytes, slot);
    if (st != TP_OK) {
        return st;
    }
    if (slot) {
        // Every input is in a slot, this rank's too: buf is free to write.
        return tp__shm_reduce_range(o, NULL, 0, bytes, a->buf, false);
    }
    // Reduce-scatter: chunk r of every buf, into this rank's buf.
    size_t start, len;
    shm_chunk(a->count, m->m_size, m->m_rank, &start, &len);
    st = tp__shm_reduce_range(o, a->buf, start * es, len * es,
                              shm_at(a->buf, start * es), true);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_post(m, p + 1);
    st = tp__shm_wait_all(o, p + 1);
    if (st != TP_OK) {
        return st;
    }
    // All-gather: chunk q from rank q's buf (final since it posted p + 1).
    for (int q = 0; q < m->m_size; q++) {
        if (q == m->m_rank) {
            continue;
        }
        shm_chunk(a->count, m->m_size, q, &start, &len);
        st = tp__shm_fetch(o, q, start * es, shm_at(a->buf, start * es),
                           len * es);
        if (st != TP_OK) {
            return st;
        }
    }
    tp__shm_post(m, p + 2);
    return tp__shm_wait_all(o, p + 2); // until every rank read this buf
}

static tp_status
shm_reduce(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot, root = m->m_rank == a->root;
    uint32_t p = m->m_phase + 1;
    bool done = false;
    tp_status st = tp__shm_give_rooted(o, p, a->buf, bytes, slot, root, &done);
    if (st != TP_OK || done) {
        return st;
    }
    st = tp__shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_look_all(m, p);
    if (slot) {
        return tp__shm_reduce_range(o, NULL, 0, bytes, a->buf, false);
    }
    st = tp__shm_reduce_range(o, a->buf, 0, bytes, a->buf, true);
    if (st == TP_OK) {
        tp__shm_post(m, p + 1);
    }
    return st;
}

// all_gather (every rank reads) and gather (the root reads).
static tp_status
shm_gather(const shm_op *o, bool all)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot;
    bool reader = all || m->m_rank == a->root;
    uint32_t p = m->m_phase + 1;
    bool done = false;
    tp_status st = tp__shm_give_rooted(o, p, a->in, bytes, slot, reader, &done);
    if (st != TP_OK || done) {
        return st;
    }
    st = tp__shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    for (int q = 0; q < m->m_size; q++) {
        uint8_t *dst = shm_at(a->out, (size_t)q * bytes);
        if (q == m->m_rank) {
            shm_copy(dst, a->in, bytes);
            continue;
        }
        tp__shm_look(m, q, p);
        st = tp__shm_fetch(o, q, 0, dst, bytes);
        if (st != TP_OK) {
            return st;
        }
    }
    if (slot) {
        return TP_OK;
    }
    tp__shm_post(m, p + 1);
    return all ? tp__shm_wait_all(o, p + 1) : TP_OK;
}

static tp_status
shm_scatter(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es, total = bytes * (size_t)m->m_size;
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st;
    if (m->m_rank == a->root) {
        shm_copy(a->out, shm_at(a->in, (size_t)m->m_rank * bytes), bytes);
        return tp__shm_give_source(o, p, a->in, total, slot);
    }
    tp__shm_post(m, p);
    st = tp__shm_wait(o, a->root, p);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_look(m, a->root, p);
    st = tp__shm_fetch(o, a->root, (uint64_t)m->m_rank * bytes, a->out, bytes);
    if (st == TP_OK && !slot) {
        tp__shm_post(m, p + 1);
    }
    return st;
}

static tp_status
shm_reduce_scatter(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es, total = bytes * (size_t)m->m_size;
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = tp__shm_give_all(o, p, a->in, total, slot);
    if (st != TP_OK) {
        return st;
    }
    size_t off = (size_t)m->m_rank * bytes;
    st =
        tp__shm_reduce_range(o, slot ? NULL : a->in, off, bytes, a->out, false);
    if (st != TP_OK || slot) {
        return st;
    }
    tp__shm_post(m, p + 1);
    return tp__shm_wait_all(o, p + 1);
}

static tp_status
shm_all_to_all(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t es = o->o_es;
    int n = m->m_size, me = m->m_rank;
    // The bytes to pack (slot) and the extent of in (cma).
    size_t total = 0, extent = 0;
    for (int j = 0; j < n; j++) {
        if (a->scounts[j] > 0) {
            total += a->scounts[j] * es;
            extent = TP_MAX(extent, (a->sdispls[j] + a->scounts[j]) * es);
        }
    }
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = tp__shm_acquire(o, p);
    if (st != TP_OK) {
        return st;
    }
    shm_ent *tab = shm_tab(m, me, p);
    uint8_t *mine = shm_slot(m, me, p);
    size_t packed = 0;
    for (int j = 0; j < n; j++) {
        size_t len = a->scounts[j] * es;
        tab[j].e_count = a->scounts[j];
        if (slot) {
            tab[j].e_off = packed;
            if (j != me) {
                shm_copy(mine + packed, shm_at(a->in, a->sdispls[j] * es), len);
                packed += len;
            }
        } else {
            tab[j].e_off = len > 0 ? a->sdispls[j] * es : 0;
        }
    }
    shm_pub *pub = &m->m_ctl[me].c_pub[p & 1];
    pub->p_mode = slot ? SHM_SLOT : SHM_CMA;
    pub->p_len = slot ? packed : extent;
    pub->p_addr = slot ? 0 : (uint64_t)(uintptr_t)a->in;
    tp__shm_post(m, p);
    st = tp__shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    for (int q = 0; q < n; q++) {
        uint8_t *dst = shm_at(a->out, a->rdispls[q] * es);
        size_t len = a->rcounts[q] * es;
        if (q == me) {
            shm_copy(dst, shm_at(a->in, a->sdispls[me] * es), len);
            continue;
        }
        tp__shm_look(m, q, p);
        shm_ent e = shm_tab(m, q, p)[me];
        if (e.e_count != a->rcounts[q]) {
            char who[96];
            tp__shm_who(m, q, who, sizeof(who));
            return tp__shm_fail(o, TP_EINVAL,
                                "%s sends %" PRIu64 " elements to this rank, "
                                "which expects %zu (rcounts[%d])",
                                who, e.e_count, a->rcounts[q], q);
        }
        st = tp__shm_fetch(o, q, e.e_off, dst, len);
        if (st != TP_OK) {
            return st;
        }
    }
    tp__shm_post(m, p + 1);
    return slot ? TP_OK : tp__shm_wait_all(o, p + 1);
}

// A group of one: every collective is a local copy or nothing.
static tp_status
shm_run_alone(const shm_op *o)
{
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    switch (a->kind) {
    case TP__COLL_ALL_GATHER:
    case TP__COLL_GATHER:
    case TP__COLL_SCATTER:
    case TP__COLL_REDUCE_SCATTER:
        if (bytes > 0) {
            memmove(a->out, a->in, bytes);
        }
        return TP_OK;
    case TP__COLL_ALL_TO_ALL:
        if (a->scounts[0] != a->rcounts[0]) {
            return tp__shm_fail(o, TP_EINVAL,
                                "sends %zu elements to itself but expects %zu",
                                a->scounts[0], a->rcounts[0]);
        }
        if (a->rcounts[0] > 0) {
            memmove(shm_at(a->out, a->rdispls[0] * o->o_es),
                    shm_at(a->in, a->sdispls[0] * o->o_es),
                    a->rcounts[0] * o->o_es);
        }
        return TP_OK;
    default:
        return TP_OK; // barrier, broadcast, all_reduce, reduce
    }
}

tp_status
tp__shm_run(tp__shm *shm, const tp__coll_args *a, uint64_t deadline_ns,
            tp_error **err_p)
{
    TP_ASSERT(shm != NULL && a != NULL);
    int blame_rank = -1;
    bool timed_out = false;
    shm_op o = {
        .o_blame = &blame_rank,
        .o_timed_out = &timed_out,
        .o_m = shm,
        .o_a = a,
        .o_name = tp__coll_kind_name(a->kind),
        .o_es = tp_dtype_size(a->dtype),
        .o_deadline = deadline_ns,
        .o_err_p = err_p,
    };
    int n = shm->m_size;
    if ((unsigned)a->kind >= TP__COLL_KIND_COUNT) {
        return tp__shm_fail(&o, TP_EINVAL, "unknown collective %d",
                            (int)a->kind);
    }
    if (o.o_es == 0) {
        return tp__shm_fail(&o, TP_EINVAL, "bad dtype %d", (int)a->dtype);
    }
    if (a->count > SIZE_MAX / o.o_es / (size_t)n) {
        return tp__shm_fail(&o, TP_EINVAL, "count %zu is too large", a->count);
    }
    bool rooted = a->kind == TP__COLL_BROADCAST || a->kind == TP__COLL_REDUCE ||
                  a->kind == TP__COLL_GATHER || a->kind == TP__COLL_SCATTER;
    if (rooted && (a->root < 0 || a->root >= n)) {
        return tp__shm_fail(&o, TP_EINVAL, "root %d outside the group of %d",
                            a->root, n);
    }
    if (a->kind == TP__COLL_ALL_TO_ALL &&
        (a->scounts == NULL || a->sdispls == NULL || a->rcounts == NULL ||
         a->rdispls == NULL)) {
        return tp__shm_fail(&o, TP_EINVAL, "counts or displacements missing");
    }
    if (n == 1) {
        return shm_run_alone(&o);
    }
    tp_status st;
    switch (a->kind) {
    case TP__COLL_BARRIER:
        st = shm_barrier(&o);
        break;
    case TP__COLL_BROADCAST:
        st = shm_broadcast(&o);
        break;
    case TP__COLL_ALL_REDUCE:
        st = shm_all_reduce(&o);
        break;
    case TP__COLL_REDUCE:
        st = shm_reduce(&o);
        break;
    case TP__COLL_ALL_GATHER:
        st = shm_gather(&o, true);
        break;
    case TP__COLL_GATHER:
        st = shm_gather(&o, false);
        break;
    case TP__COLL_SCATTER:
        st = shm_scatter(&o);
        break;
    case TP__COLL_REDUCE_SCATTER:
        st = shm_reduce_scatter(&o);
        break;
    case TP__COLL_ALL_TO_ALL:
        st = shm_all_to_all(&o);
        break;
    default:
        st = tp__shm_fail(&o, TP_EINVAL, "unknown collective %d", (int)a->kind);
        break;
    }
    if (st != TP_OK) {
        // Tell the others: ranks waiting on this one wake now, the rest
        // see it within a slice (shm_check_members).
        int blame = blame_rank >= 0 ? blame_rank : shm->m_rank;
        tp__shm_abort(shm, blame, st == TP_ETIMEDOUT || timed_out);
    }
    return st;
}
