/* SPDX-License-Identifier: Apache-2.0 */
/* pg_fr.c - the flight recorder of a process group: its last N
 * collectives (TP_PG_FLIGHT_RECORDER, default 64, 0 = off) with kind,
 * sequence number, root, bytes, state and times, for
 * tp_pg_get_debug_info and for the log line of a timeout (what was still
 * in flight). NCCL's and PyTorch's flight recorders answer the same
 * question: what was this rank doing when the job hung.
 *
 * Locks: g_fr_mtx only, a leaf (taken under g_mtx or none). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "core/error.h"
#include "core/log.h"

void
tp__pg_fr_init(tp_pg *g)
{
    tp__mtx_init(&g->g_fr_mtx);
    long n = PG_FR_DEFAULT;
    const char *s = getenv("TP_PG_FLIGHT_RECORDER");
    if (s != NULL && *s != '\0') {
        char *end = NULL;
        long v = strtol(s, &end, 10);
        if (*end != '\0' || v < 0 || v > PG_FR_MAX) {
            TP_LOG_WARN("TP-PG-FR",
                        "TP_PG_FLIGHT_RECORDER=%s: not 0..%d; using %d", s,
                        PG_FR_MAX, PG_FR_DEFAULT);
        } else {
            n = v;
        }
    }
    g->g_fr = n > 0 ? calloc((size_t)n, sizeof(*g->g_fr)) : NULL;
    g->g_fr_cap = g->g_fr != NULL ? (int)n : 0;
}

void
tp__pg_fr_fini(tp_pg *g)
{
    free(g->g_fr);
    tp__mtx_fini(&g->g_fr_mtx);
}

// The entry of @id while the ring still holds it. With g_fr_mtx.
static pg_fr_ent *
fr_find_locked(tp_pg *g, uint64_t id)
{
    if (id == 0 || g->g_fr_cap == 0) {
        return NULL;
    }
    pg_fr_ent *e = &g->g_fr[(id - 1) % (uint64_t)g->g_fr_cap];
    return e->fr_id == id ? e : NULL;
}

void
tp__pg_fr_issue(tp_pg *g, tp_work *wk)
{
    if (g->g_fr_cap == 0) {
        return;
    }
    const tp__coll_args *a = &wk->wk_args;
    bool rooted = a->kind == TP__COLL_BROADCAST || a->kind == TP__COLL_REDUCE ||
                  a->kind == TP__COLL_GATHER || a->kind == TP__COLL_SCATTER;
    size_t n = a->count;
    if (a->kind == TP__COLL_REDUCE_SCATTER) {
        n *= (size_t)g->g_size; // count is out's; the input is size x it
    } else if (a->kind == TP__COLL_SCATTER) {
        n = g->g_rank == a->root ? n * (size_t)g->g_size : 0;
    }
    tp__mtx_lock(&g->g_fr_mtx);
    uint64_t id = ++g->g_fr_last;
    pg_fr_ent *e = &g->g_fr[(id - 1) % (uint64_t)g->g_fr_cap];
    *e = (pg_fr_ent){
        .fr_id = id,
        .fr_kind = a->kind,
        .fr_seq = UINT64_MAX,
        .fr_root = rooted ? a->root : -1,
        .fr_bytes = n * tp_dtype_size(a->dtype),
        .fr_state = PG_FR_QUEUED,
        .fr_issued_ns = tp__now_ns(),
    };
    tp__mtx_unlock(&g->g_fr_mtx);
    wk->wk_fr_id = id;
}

void
tp__pg_fr_run(tp_pg *g, const tp_work *wk, uint64_t seq)
{
    tp__mtx_lock(&g->g_fr_mtx);
    pg_fr_ent *e = fr_find_locked(g, wk->wk_fr_id);
    if (e != NULL) {
        e->fr_seq = seq;
        e->fr_state = PG_FR_RUNNING;
        e->fr_run_ns = tp__now_ns();
    }
    tp__mtx_unlock(&g->g_fr_mtx);
}

void
tp__pg_fr_end(tp_pg *g, const tp_work *wk, tp_status st)
{
    tp__mtx_lock(&g->g_fr_mtx);
    pg_fr_ent *e = fr_find_locked(g, wk->wk_fr_id);
    if (e != NULL) {
        e->fr_state = st == TP_OK ? PG_FR_DONE : PG_FR_FAILED;
        e->fr_end_ns = tp__now_ns();
        if (e->fr_run_ns == 0) {
            e->fr_run_ns = e->fr_end_ns; // failed before it ran
        }
    }
    tp__mtx_unlock(&g->g_fr_mtx);
}

static const char *
fr_state_name(pg_fr_state s)
{
    switch (s) {
    case PG_FR_QUEUED:
        return "queued";
    case PG_FR_RUNNING:
        return "running";
    case PG_FR_DONE:
        return "done";
    default:
        return "failed";
    }
}

char *
tp__pg_fr_dump(tp_pg *g, bool in_flight_only)
{
    tp__mtx_lock(&g->g_fr_mtx);
    uint64_t last = g->g_fr_last;
    uint64_t cap = (uint64_t)g->g_fr_cap;
    uint64_t first = last > cap ? last - cap + 1 : 1;
    size_t len = 256 + (size_t)(last - first + 1) * 192;
    char *buf = malloc(len);
    if (buf == NULL) {
        tp__mtx_unlock(&g->g_fr_mtx);
        return NULL;
    }
    uint64_t now = tp__now_ns();
    size_t off = 0;
    if (!in_flight_only) {
        off += (size_t)snprintf(buf, len,
                                "%s: flight recorder, the last %" PRIu64
                                " of %" PRIu64 " collectives (capacity %d)\n",
                                g->g_what, last - first + 1, last, g->g_fr_cap);
    }
    buf[off] = '\0';
    for (uint64_t id = first; id <= last && cap > 0; id++) {
        const pg_fr_ent *e = &g->g_fr[(id - 1) % cap];
        bool in_flight =
            e->fr_state == PG_FR_QUEUED || e->fr_state == PG_FR_RUNNING;
        if (in_flight_only && !in_flight) {
            continue;
        }
        char seq[24] = "-", root[16] = "-";
        if (e->fr_seq != UINT64_MAX) {
            snprintf(seq, sizeof(seq), "%" PRIu64, e->fr_seq);
        }
        if (e->fr_root >= 0) {
            snprintf(root, sizeof(root), "%d", e->fr_root);
        }
        uint64_t began = e->fr_run_ns != 0 ? e->fr_run_ns : e->fr_issued_ns;
        uint64_t end = e->fr_end_ns != 0 ? e->fr_end_ns : now;
        off += (size_t)snprintf(
            buf + off, len - off,
            "op %" PRIu64 " %s seq %s root %s bytes %zu state %s issued "
            "%.3f s ago duration %.3f ms\n",
            e->fr_id, tp__coll_kind_name(e->fr_kind), seq, root, e->fr_bytes,
            fr_state_name(e->fr_state), (double)(now - e->fr_issued_ns) / 1e9,
            (double)(end - began) / 1e6);
    }
    tp__mtx_unlock(&g->g_fr_mtx);
    return buf;
}

tp_status
tp_pg_get_debug_info(tp_pg *pg, char **out_p, tp_error **err_p)
{
    if (pg == NULL || out_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_get_debug_info: pg and out_p are required");
    }
    char *s = tp__pg_fr_dump(pg, false);
    if (s == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: debug info", pg->g_what);
    }
    *out_p = s;
    return TP_OK;
}
