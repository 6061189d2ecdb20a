/* SPDX-License-Identifier: Apache-2.0 */
/* p2p_ctl.c - the p2p layer's control messages (p2p.h): an abort of a
 * group, a probe of a rank. Fire and forget. Locks: p2p_impl.h. */
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

static void
ctl_send(tp__p2p *p, int dst, int kind, uint64_t gid, const char *reason)
{
    if (dst == p->p_rank || dst < 0 || dst >= p->p_world) {
        return;
    }
    tp__req *r =
        tp__p2p_req_new(p, true, dst, gid, kind, 0, NULL, 0, NULL, NULL);
    if (r == NULL) {
        return;
    }
    tp__p2p_hdr_put(r->r_hdr, kind, p->p_rank, gid, 0, 0);
    tp_error *e = NULL;
    if (kind == P2P_KIND_ABORT) {
        size_t n = strlen(reason);
        n = n > TP__P2P_MAX_REASON ? TP__P2P_MAX_REASON : n;
        char *copy = malloc(n + 1);
        if (copy == NULL) {
            tp__req_free(r);
            return;
        }
        memcpy(copy, reason, n);
        copy[n] = '\0';
        r->r_owned = copy;
        r->r_tbuf.data = copy;
        r->r_tbuf.len = n;
        r->r_msg.payloads = &r->r_tbuf;
        r->r_msg.npayloads = 1;
    }
    if (tp_aio_create(tp__p2p_send_cb, r, &r->r_aio) != TP_OK ||
        tp__p2p_peer_out(p, dst, &r->r_pipe, &e) != TP_OK) {
        if (e != NULL) {
            tp__p2p_peer_fail(p, dst, e);
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
    ctl_send(p, dst, P2P_KIND_ABORT, gid, reason);
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
        ctl_send(p, rank, P2P_KIND_PROBE, 0, NULL);
    }
}
