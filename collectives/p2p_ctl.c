/* SPDX-License-Identifier: Apache-2.0 */
/* p2p_ctl.c - the p2p layer's control messages (p2p.h): an abort of a
 * group, a probe of a rank (fire and forget), and queries: "which
 * sequence number did this group reach on your side?", answered by the
 * peer's loop thread (through the answer pool: answering may connect,
 * which a loop callback must not do). Locks: p2p_impl.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/p2p_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"

// ---- control messages
// ------------------------------------------------------------

// Writes a control message of @kind to @dst with @tag and, if @len > 0,
// one payload (copied). Does not wait.
static void
ctl_send(tp__p2p *p, int dst, int kind, uint64_t gid, uint64_t tag,
         const void *payload, size_t len)
{
    if (dst == p->p_rank || dst < 0 || dst >= p->p_world) {
        return;
    }
    tp__req *r =
        tp__p2p_req_new(p, true, dst, gid, kind, 0, NULL, 0, NULL, NULL);
    if (r == NULL) {
        return;
    }
    tp__p2p_hdr_put(r->r_hdr, kind, p->p_rank, gid, tag, 0);
    tp_error *e = NULL;
    if (len > 0) {
        char *copy = malloc(len);
        if (copy == NULL) {
            tp__req_free(r);
            return;
        }
        memcpy(copy, payload, len);
        r->r_owned = copy;
        r->r_tbuf.data = copy;
        r->r_tbuf.len = len;
        r->r_msg.payloads = &r->r_tbuf;
        r->r_msg.npayloads = 1;
    }
    if (tp_aio_create(tp__p2p_send_cb, r, &r->r_aio) != TP_OK ||
        tp__p2p_peer_out(p, dst, &r->r_pipe, &e) != TP_OK) {
        if (e != NULL) {
            tp__p2p_peer_write_fail(p, dst, e);
        }
        tp_error_unref(e);
        tp__req_free(r);
        return;
    }
    r->r_msg.metadata = r->r_hdr;
    r->r_msg.metadata_len = P2P_HDR;
    tp_pipe_write(r->r_pipe, &r->r_msg, r->r_aio);
    // Fire and forget: freed once written (a failure marks the peer).
    tp__req_detach(r);
}

void
tp__p2p_send_abort(tp__p2p *p, int dst, uint64_t gid, const char *reason)
{
    size_t n = strlen(reason);
    n = n > TP__P2P_MAX_REASON ? TP__P2P_MAX_REASON : n;
    ctl_send(p, dst, P2P_KIND_ABORT, gid, 0, reason, n);
}

void
tp__p2p_probe(tp__p2p *p, int rank)
{
    if (rank < 0 || rank >= p->p_world || rank == p->p_rank) {
        return;
    }
    uint64_t now = tp__now_ns();
    p2p_peer *pe = &p->p_peers[rank];
    tp__mtx_lock(&p->p_mtx);
    bool due = pe->pe_err == NULL &&
               now - pe->pe_probe_ns > (uint64_t)TP__P2P_PROBE_MS * 1000000u;
    if (due) {
        pe->pe_probe_ns = now;
    }
    tp__mtx_unlock(&p->p_mtx);
    if (due) {
        ctl_send(p, rank, P2P_KIND_PROBE, 0, 0, NULL, 0);
    }
}

// ---- queries
// ---------------------------------------------------------------------

typedef struct p2p_answer_task {
    tp__p2p *at_p;
    int at_dst;
    uint64_t at_gid;
    uint64_t at_qid;
    uint8_t at_payload[TP__P2P_ANSWER_LEN];
} p2p_answer_task;

// Answer pool: writes one answer (connecting to the asker if this rank
// never wrote to it).
static void
answer_run(void *arg)
{
    p2p_answer_task *t = arg;
    tp__p2p *p = t->at_p;
    tp__mtx_lock(&p->p_mtx);
    bool closing = p->p_closing;
    tp__mtx_unlock(&p->p_mtx);
    if (!closing) {
        ctl_send(p, t->at_dst, P2P_KIND_ANSWER, t->at_gid, t->at_qid,
                 t->at_payload, sizeof(t->at_payload));
    }
    free(t);
}

void
tp__p2p_on_query(tp__p2p *p, int src, uint64_t gid, uint64_t qid)
{
    tp__p2p_answer a = {.has_group = false, .next = 0};
    if (p->p_query_cb != NULL) {
        a.has_group = p->p_query_cb(p->p_cb_arg, gid, src, &a.next);
    }
    if (!a.has_group) {
        a.next = 0;
    }
    p2p_answer_task *t = malloc(sizeof(*t));
    if (t == NULL) {
        TP_LOG_ERROR("TP-P2P-QUERY",
                     "%s: no memory to answer a query of rank %d", p->p_name,
                     src);
        return;
    }
    t->at_p = p;
    t->at_dst = src;
    t->at_gid = gid;
    t->at_qid = qid;
    tp__p2p_answer_encode(t->at_payload, &a);
    tp_status st = TP_ECLOSED;
    tp_error *e = NULL;
    tp__mtx_lock(&p->p_mtx);
    if (!p->p_closing && p->p_ans_pool == NULL) {
        if (tp__pool_create(1, "p2p-ans", &p->p_ans_pool, &e) != TP_OK) {
            p->p_ans_pool = NULL;
        }
    }
    if (!p->p_closing && p->p_ans_pool != NULL) {
        st = tp__pool_submit_fn(p->p_ans_pool, answer_run, t);
    }
    tp__mtx_unlock(&p->p_mtx);
    if (st != TP_OK) {
        // The asker reports this rank as not answering.
        TP_LOG_DEBUG("TP-P2P-QUERY", "%s: query of rank %d not answered: %s",
                     p->p_name, src,
                     e != NULL ? tp_error_message(e) : tp_status_name(st));
        free(t);
    }
    tp_error_unref(e);
}

bool
tp__p2p_on_answer(tp__p2p *p, int src, uint64_t gid, uint64_t qid,
                  const void *payload, uint64_t len, char *why, size_t why_len)
{
    tp__p2p_answer a;
    if (!tp__p2p_answer_decode(payload, len, &a, why, why_len)) {
        return false;
    }
    bool ok = true;
    tp__mtx_lock(&p->p_mtx);
    p2p_query *q = p->p_queries;
    while (q != NULL && q->q_id != qid) {
        q = q->q_next;
    }
    if (qid > p->p_qid_last) {
        snprintf(why, why_len, "an answer to query %" PRIu64 ", never sent",
                 qid);
        ok = false;
    } else if (q != NULL && q->q_gid != gid) {
        snprintf(why, why_len,
                 "an answer about group %016" PRIx64 " to query %" PRIu64
                 " about group %016" PRIx64,
                 gid, qid, q->q_gid);
        ok = false;
    } else if (q != NULL) {
        // Late answers (the query is over) are dropped.
        for (int i = 0; i < q->q_n; i++) {
            if (q->q_wranks[i] == src &&
                q->q_out[i].state == TP__P2P_SEQ_NO_ANSWER) {
                q->q_out[i].state =
                    a.has_group ? TP__P2P_SEQ_OK : TP__P2P_SEQ_NO_GROUP;
                q->q_out[i].next = a.next;
                q->q_left--;
                tp__cv_broadcast(&p->p_cv);
            }
        }
    }
    tp__mtx_unlock(&p->p_mtx);
    return ok;
}

// Marks the ranks of @q known to have failed (p_mtx held).
static void
query_mark_failed_locked(tp__p2p *p, p2p_query *q)
{
    for (int i = 0; i < q->q_n; i++) {
        int w = q->q_wranks[i];
        if (q->q_out[i].state == TP__P2P_SEQ_NO_ANSWER &&
            p->p_peers[w].pe_err != NULL) {
            q->q_out[i].state = TP__P2P_SEQ_FAILED;
            q->q_left--;
        }
    }
}

void
tp__p2p_query_seqs(tp__p2p *p, uint64_t gid, const int *wranks, int n,
                   int64_t bound_ms, tp__p2p_seq *out)
{
    uint64_t deadline = tp__deadline_after_ms(bound_ms > 0 ? bound_ms : 1);
    p2p_query q = {.q_gid = gid, .q_wranks = wranks, .q_out = out, .q_n = n};
    tp__mtx_lock(&p->p_mtx);
    q.q_id = ++p->p_qid_last;
    for (int i = 0; i < n; i++) {
        bool valid = wranks[i] >= 0 && wranks[i] < p->p_world;
        out[i].state = !valid || wranks[i] == p->p_rank ? TP__P2P_SEQ_SELF
                                                        : TP__P2P_SEQ_NO_ANSWER;
        out[i].next = 0;
        q.q_left += out[i].state == TP__P2P_SEQ_NO_ANSWER ? 1 : 0;
    }
    query_mark_failed_locked(p, &q);
    q.q_next = p->p_queries;
    p->p_queries = &q;
    tp__mtx_unlock(&p->p_mtx);
    for (int i = 0; i < n; i++) {
        if (out[i].state == TP__P2P_SEQ_NO_ANSWER) {
            ctl_send(p, wranks[i], P2P_KIND_QUERY, gid, q.q_id, NULL, 0);
        }
    }
    tp__mtx_lock(&p->p_mtx);
    for (;;) {
        query_mark_failed_locked(p, &q); // a write of the query failed
        if (q.q_left <= 0 || p->p_closing ||
            !tp__cv_wait_until(&p->p_cv, &p->p_mtx, deadline)) {
            break;
        }
    }
    query_mark_failed_locked(p, &q);
    p2p_query **pp = &p->p_queries;
    while (*pp != &q) {
        pp = &(*pp)->q_next;
    }
    *pp = q.q_next;
    tp__mtx_unlock(&p->p_mtx);
}
