/* SPDX-License-Identifier: Apache-2.0 */
/* pg_debug.c - TP_DEBUG_COLLECTIVES: before each collective the members
 * all_gather a description of it (op, dtype, count, root, sequence number;
 * for all_to_all also the split sizes) and compare, so that a mismatch is
 * reported naming the ranks and what each called instead of hanging.
 * And, always, the pipe engine's blame of a timeout: which members never
 * called the collective that timed out. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "collectives/reduce.h"
#include "core/error.h"

// ---- running a collective
// -----------------------------------------------------------------

static void
desc_encode(uint8_t *d, const tp__coll_args *a, tp_reduce_op op, uint64_t seq)
{
    memset(d, 0, PG_DESC_BYTES);
    uint32_t v[4] = {(uint32_t)a->kind, (uint32_t)a->dtype, (uint32_t)op,
                     (uint32_t)a->root};
    memcpy(d, v, sizeof(v));
    uint64_t count = a->kind == TP__COLL_ALL_TO_ALL ? 0 : a->count;
    memcpy(d + 16, &count, 8);
    memcpy(d + 24, &seq, 8);
}

static int
desc_str(const uint8_t *d, char *buf, size_t len)
{
    uint32_t v[4];
    uint64_t count, seq;
    memcpy(v, d, sizeof(v));
    memcpy(&count, d + 16, 8);
    memcpy(&seq, d + 24, 8);
    tp__coll_kind k = (tp__coll_kind)v[0];
    const char *dt =
        v[1] < TP_DTYPE_COUNT ? tp_dtype_name((tp_dtype)v[1]) : "?";
    switch (k) {
    case TP__COLL_BARRIER:
        return snprintf(buf, len, "barrier (#%" PRIu64 ")", seq);
    case TP__COLL_ALL_REDUCE:
    case TP__COLL_REDUCE_SCATTER:
        return snprintf(buf, len,
                        "%s(%s, count %" PRIu64 ", op %s) (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count,
                        tp__reduce_op_name((tp_reduce_op)v[2]), seq);
    case TP__COLL_REDUCE:
        return snprintf(
            buf, len,
            "reduce(%s, count %" PRIu64 ", op %s, root %d) (#%" PRIu64 ")", dt,
            count, tp__reduce_op_name((tp_reduce_op)v[2]), (int)v[3], seq);
    case TP__COLL_BROADCAST:
    case TP__COLL_GATHER:
    case TP__COLL_SCATTER:
        return snprintf(buf, len,
                        "%s(%s, count %" PRIu64 ", root %d) (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count, (int)v[3], seq);
    default:
        return snprintf(buf, len, "%s(%s, count %" PRIu64 ") (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count, seq);
    }
}
// TP_DEBUG_COLLECTIVES: every member's description of this collective (and
// for all_to_all its split sizes) is gathered and compared.
tp_status
tp__pg_debug_check(tp_pg *g, const tp__coll_args *a, tp_reduce_op op,
                   uint64_t deadline, tp_error **err_p)
{
    int n = g->g_size;
    uint8_t mine[PG_DESC_BYTES];
    uint64_t seq = tp__pg_seq_take(g);
    desc_encode(mine, a, op, g->g_seq);
    uint8_t *all = malloc((size_t)n * PG_DESC_BYTES);
    if (all == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: debug check", g->g_what);
    }
    tp__coll_args ga = {
        .kind = TP__COLL_ALL_GATHER,
        .dtype = TP_U8,
        .in = mine,
        .out = all,
        .count = PG_DESC_BYTES,
    };
    tp_status st = tp__pg_engine_run(g, &ga, seq, deadline, err_p);
    if (st != TP_OK) {
        free(all);
        return st;
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        if (memcmp(all + (size_t)i * PG_DESC_BYTES, all, PG_DESC_BYTES) != 0) {
            bad = i;
        }
    }
    if (bad >= 0) {
        char msg[1024];
        size_t off = 0;
        for (int i = 0; i < n && off + 128 < sizeof(msg); i++) {
            off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                                    "%srank %d: ", i > 0 ? "; " : "", i);
            off += (size_t)desc_str(all + (size_t)i * PG_DESC_BYTES, msg + off,
                                    sizeof(msg) - off);
        }
        free(all);
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: collective mismatch (TP_DEBUG_COLLECTIVES): "
                             "%s",
                             g->g_what, msg);
    }
    free(all);
    if (a->kind != TP__COLL_ALL_TO_ALL) {
        return TP_OK;
    }
    // rank i's rcounts[j] must be rank j's scounts[i].
    size_t row = (size_t)n * sizeof(uint64_t);
    uint64_t *sc = malloc(row * (size_t)(n + 1));
    if (sc == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: debug check", g->g_what);
    }
    uint64_t *myrow = sc + (size_t)n * (size_t)n;
    for (int i = 0; i < n; i++) {
        myrow[i] = a->scounts[i];
    }
    tp__coll_args ga2 = {
        .kind = TP__COLL_ALL_GATHER,
        .dtype = TP_U8,
        .in = myrow,
        .out = sc,
        .count = row,
    };
    seq = tp__pg_seq_take(g);
    st = tp__pg_engine_run(g, &ga2, seq, deadline, err_p);
    if (st == TP_OK) {
        for (int j = 0; j < n; j++) {
            uint64_t theirs = sc[(size_t)j * (size_t)n + (size_t)g->g_rank];
            if (theirs != a->rcounts[j]) {
                st = tp__error_set(err_p, TP_EINVAL,
                                   "%s: all_to_all mismatch "
                                   "(TP_DEBUG_COLLECTIVES): this rank expects "
                                   "%zu elements from rank %d, which sends "
                                   "%" PRIu64,
                                   g->g_what, a->rcounts[j], j, theirs);
                break;
            }
        }
    }
    free(sc);
    return st;
}

// ---- who never called a collective that timed out
// -------------------------------------------------

#define PG_BLAME_MAX 8 // members named in one error

void
tp__pg_blame_timeout(tp_pg *g, const char *kind, uint64_t seq,
                     uint64_t start_ns, const char *what, tp_error **err_p)
{
    if (err_p == NULL || *err_p == NULL || g->g_size < 2) {
        return;
    }
    uint64_t now = tp__now_ns();
    int64_t bound = g->g_timeout_ms / 4;
    bound = bound < 1 ? 1 : bound > TP__P2P_QUERY_MS ? TP__P2P_QUERY_MS : bound;
    tp__p2p_seq *ans = calloc((size_t)g->g_size, sizeof(*ans));
    if (ans == NULL || !tp__pg_p2p_enter(g->g_world)) {
        free(ans);
        return;
    }
    tp__p2p_query_seqs(g->g_world->w_p2p, g->g_gid, g->g_wranks, g->g_size,
                       bound, ans);
    tp__pg_p2p_leave(g->g_world);
    char list[1024] = "";
    size_t off = 0;
    int named = 0;
    for (int i = 0; i < g->g_size; i++) {
        char one[192];
        const tp__p2p_seq *s = &ans[i];
        if (s->state == TP__P2P_SEQ_OK && s->next <= seq) {
            char last[48] = "it called none";
            if (s->next > 0) {
                snprintf(last, sizeof(last), "its last was #%" PRIu64,
                         s->next - 1);
            }
            snprintf(one, sizeof(one), "never called %s #%" PRIu64 " (%s)",
                     kind, seq, last);
        } else if (s->state == TP__P2P_SEQ_NO_ANSWER) {
            snprintf(one, sizeof(one),
                     "did not answer within %" PRId64 " ms (stopped or dead?)",
                     bound);
        } else if (s->state == TP__P2P_SEQ_NO_GROUP) {
            snprintf(one, sizeof(one),
                     "has no such group (not made yet, or destroyed)");
        } else if (s->state == TP__P2P_SEQ_FAILED) {
            snprintf(one, sizeof(one), "failed earlier");
        } else {
            continue; // this rank, or one that called it
        }
        if (++named <= PG_BLAME_MAX && off < sizeof(list)) {
            off += (size_t)snprintf(
                list + off, sizeof(list) - off, "%srank %d (world rank %d) %s",
                named > 1 ? "; " : "", i, g->g_wranks[i], one);
        }
    }
    free(ans);
    if (named == 0) {
        return; // every member called it: the first error stands
    }
    if (named > PG_BLAME_MAX && off < sizeof(list)) {
        snprintf(list + off, sizeof(list) - off, "; and %d more",
                 named - PG_BLAME_MAX);
    }
    uint64_t op_start = start_ns != 0 && start_ns <= now ? start_ns : now;
    tp_error *e = tp_error_create(
        TP_ETIMEDOUT, NULL,
        "%s timed out after %" PRIu64 " ms (timeout %" PRId64 " ms): %s", what,
        (now - op_start) / 1000000u, g->g_timeout_ms, list);
    if (tp_error_status(e) == TP_ETIMEDOUT) {
        tp_error_unref(*err_p);
        *err_p = e;
    } else {
        tp_error_unref(e); // out of memory: the first error stands
    }
}
