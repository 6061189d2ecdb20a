/* SPDX-License-Identifier: Apache-2.0 */
/* p2p_send.c - the p2p layer's peers (failure, connecting on the first
 * send), sends (to a peer or to itself) and waiting for requests (p2p.h).
 * Locks: p2p_impl.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/p2p_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"

// ---- peers
// -------------------------------------------------------------------

// Records the first failure of @rank, fails its recvs, tells the owner.
// No lock held.
void
tp__p2p_peer_fail(tp__p2p *p, int rank, const tp_error *err)
{
    if (rank < 0 || rank >= p->p_world || rank == p->p_rank) {
        return;
    }
    tp__req *failed = NULL;
    tp__mtx_lock(&p->p_mtx);
    p2p_peer *pe = &p->p_peers[rank];
    bool first = pe->pe_err == NULL;
    if (first) {
        pe->pe_err = tp_error_ref(err);
        for (tp__req *r = tp__list_first(&p->p_posted), *next; r != NULL;
             r = next) {
            next = tp__list_next(&p->p_posted, r);
            if (r->r_peer == rank) {
                tp__p2p_posted_remove(p, r);
                r->r_next = failed;
                failed = r;
            }
        }
    }
    const tp_error *e = pe->pe_err;
    tp_error_ref(e);
    tp__mtx_unlock(&p->p_mtx);
    while (failed != NULL) {
        tp__req *r = failed;
        failed = r->r_next;
        r->r_next = NULL;
        tp__p2p_req_complete(r, tp_error_status(e), e, -1);
    }
    if (first) {
        TP_LOG_DEBUG("TP-P2P-PEER", "%s: rank %d failed: %s", p->p_name, rank,
                     tp_error_message(e));
        if (p->p_fail_cb != NULL) {
            p->p_fail_cb(p->p_cb_arg, rank, e);
        }
        tp__mtx_lock(&p->p_mtx);
        p->p_gen++;
        tp__cv_broadcast(&p->p_cv);
        tp__mtx_unlock(&p->p_mtx);
    }
    tp_error_unref((tp_error *)e);
}

// A write to @rank failed. While a pipe from @rank is still open, what it
// sent before it went away may still be arriving there (its EOF comes
// after all of it): the rank is failed when that pipe ends, not now, so
// that a receive whose message is in flight still completes (a stale
// send, say a probe, may fail first: the peer finished and exited). With
// no such pipe, it is failed at once. No lock held.
void
tp__p2p_peer_write_fail(tp__p2p *p, int rank, const tp_error *err)
{
    if (rank < 0 || rank >= p->p_world || rank == p->p_rank) {
        return;
    }
    bool live_in = false;
    tp__mtx_lock(&p->p_mtx);
    for (p2p_in *in = p->p_ins; in != NULL; in = in->i_next) {
        if (in->i_src == rank && !in->i_dead) {
            live_in = true;
            break;
        }
    }
    tp__mtx_unlock(&p->p_mtx);
    if (live_in) {
        TP_LOG_DEBUG("TP-P2P-PEER",
                     "%s: a write to rank %d failed (%s); its pipe to us is "
                     "still open: failed when that pipe ends",
                     p->p_name, rank, tp_error_message(err));
        return;
    }
    tp__p2p_peer_fail(p, rank, err);
}

tp_error *
tp__p2p_peer_error(tp__p2p *p, int rank)
{
    if (rank < 0 || rank >= p->p_world) {
        return NULL;
    }
    tp__mtx_lock(&p->p_mtx);
    tp_error *e = tp_error_ref(p->p_peers[rank].pe_err);
    tp__mtx_unlock(&p->p_mtx);
    return e;
}

// The first URL of @rank whose transport this context listens on (tcp
// first: it moves to shm in the handshake on one host).
static bool
peer_url(tp__p2p *p, int rank, char *out, size_t len)
{
    const char *s = p->p_peers[rank].pe_urls;
    while (s != NULL && *s != '\0') {
        const char *e = strchr(s, '\n');
        size_t n = e != NULL ? (size_t)(e - s) : strlen(s);
        const char *colon = memchr(s, ':', n);
        char scheme[16];
        size_t sn = colon != NULL ? (size_t)(colon - s) : 0;
        if (sn > 0 && sn < sizeof(scheme) && n < len) {
            memcpy(scheme, s, sn);
            scheme[sn] = '\0';
            if (tp_pipe_listener_addr(p->p_listener, scheme) != NULL) {
                memcpy(out, s, n);
                out[n] = '\0';
                return true;
            }
        }
        s = e != NULL ? e + 1 : NULL;
    }
    return false;
}

// The pipe we write to @rank on (a new reference), connecting the first
// time. No p_mtx held.
tp_status
tp__p2p_peer_out(tp__p2p *p, int rank, tp_pipe **pipe_p, tp_error **err_p)
{
    tp__mtx_lock(&p->p_conn_mtx);
    p2p_peer *pe = &p->p_peers[rank];
    if (pe->pe_out == NULL) {
        char url[512];
        if (!peer_url(p, rank, url, sizeof(url))) {
            tp__mtx_unlock(&p->p_conn_mtx);
            return tp__error_set(err_p, TP_EUNREACHABLE,
                                 "%s: no transport in common with rank %d "
                                 "(it listens on %s)",
                                 p->p_name, rank,
                                 pe->pe_urls != NULL ? pe->pe_urls : "nothing");
        }
        tp_error *e = NULL;
        tp_status st = tp_context_connect(p->p_ctx, url, &pe->pe_out, &e);
        if (st != TP_OK) {
            tp__mtx_unlock(&p->p_conn_mtx);
            tp__error_set(err_p, st, "%s: connect to rank %d at %s: %s",
                          p->p_name, rank, url, tp_error_message(e));
            tp_error_unref(e);
            return st;
        }
    }
    *pipe_p = tp_pipe_ref(pe->pe_out);
    tp__mtx_unlock(&p->p_conn_mtx);
    return TP_OK;
}

// ---- sending
// -------------------------------------------------------------------

// Loop thread: a write finished.
void
tp__p2p_send_cb(void *arg)
{
    tp__req *r = arg;
    tp__p2p *p = r->r_p;
    tp_status st = tp_aio_status(r->r_aio);
    tp_error *err = NULL;
    if (st != TP_OK) {
        err = tp_error_create(
            st, tp_aio_error(r->r_aio),
            "%s: send of %zu bytes to rank %d (tag %" PRIu64 ") on %s",
            p->p_name, r->r_len, r->r_peer, r->r_tag, tp_pipe_peer(r->r_pipe));
        if (st != TP_ECANCELED && st != TP_ECLOSED) {
            tp__p2p_peer_write_fail(p, r->r_peer, err);
        }
    }
    tp_pipe_unref(r->r_pipe);
    r->r_pipe = NULL;
    tp__p2p_req_complete(r, st, err, p->p_rank);
    tp_error_unref(err);
}

// Posts the write of @r (its header and buffer set) to rank r_peer.
static tp_status
send_post(tp__p2p *p, tp__req *r, tp_error **err_p)
{
    tp_status st = tp_aio_create(tp__p2p_send_cb, r, &r->r_aio);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "%s: send to rank %d: no memory",
                             p->p_name, r->r_peer);
    }
    st = tp__p2p_peer_out(p, r->r_peer, &r->r_pipe, err_p);
    if (st != TP_OK) {
        tp_error *e = err_p != NULL ? *err_p : NULL;
        if (e != NULL) {
            tp__p2p_peer_write_fail(p, r->r_peer, e);
        }
        return st;
    }
    r->r_msg.metadata = r->r_hdr;
    r->r_msg.metadata_len = P2P_HDR;
    if (r->r_len > 0) {
        r->r_tbuf.data = r->r_buf;
        r->r_tbuf.len = r->r_len;
        r->r_tbuf.device.type = TP_DEVICE_CPU;
        r->r_msg.tensors = &r->r_tbuf;
        r->r_msg.ntensors = 1;
    }
    tp_pipe_write(r->r_pipe, &r->r_msg, r->r_aio);
    return TP_OK;
}

// A send to ourselves: delivered at once, to a posted recv or as an
// unexpected copy.
static tp_status
send_self(tp__p2p *p, tp__req *s, tp_error **err_p)
{
    // The copy is made before the lock is taken (loop callbacks take it);
    // it is dropped if a recv turns out to be posted.
    p2p_ux *u = NULL;
    for (int round = 0;; round++) {
        tp__mtx_lock(&p->p_mtx);
        tp__req *r =
            tp__p2p_posted_find(p, p->p_rank, s->r_gid, s->r_chan, s->r_tag);
        if (r != NULL) {
            tp__p2p_posted_remove(p, r);
            tp__mtx_unlock(&p->p_mtx);
            tp__p2p_ux_free(u);
            if (r->r_len != s->r_len) {
                tp_error *e = tp__p2p_size_mismatch(p, p->p_rank, r->r_tag,
                                                    s->r_len, r->r_len);
                tp__p2p_req_complete(r, TP_EINVAL, e, p->p_rank);
                tp__p2p_req_complete(s, TP_OK, NULL, p->p_rank); // as to a peer
                tp_error_unref(e);
                return TP_OK;
            }
            if (s->r_len > 0) {
                memcpy(r->r_buf, s->r_buf, s->r_len);
            }
            tp__p2p_req_complete(r, TP_OK, NULL, p->p_rank);
            tp__p2p_req_complete(s, TP_OK, NULL, p->p_rank);
            return TP_OK;
        }
        if (u != NULL) {
            tp__list_append(&p->p_ux, u);
            tp__mtx_unlock(&p->p_mtx);
            tp__p2p_req_complete(s, TP_OK, NULL, p->p_rank);
            return TP_OK;
        }
        tp__mtx_unlock(&p->p_mtx);
        TP_ASSERT(round == 0);
        u = calloc(1, sizeof(*u));
        void *copy = s->r_len > 0 ? malloc(s->r_len) : NULL;
        if (u == NULL || (s->r_len > 0 && copy == NULL)) {
            free(u);
            free(copy);
            return tp__error_set(err_p, TP_ENOMEM,
                                 "%s: send of %zu bytes to itself: no memory",
                                 p->p_name, s->r_len);
        }
        if (s->r_len > 0) {
            memcpy(copy, s->r_buf, s->r_len);
        }
        u->u_src = p->p_rank;
        u->u_gid = s->r_gid;
        u->u_chan = s->r_chan;
        u->u_tag = s->r_tag;
        u->u_len = s->r_len;
        u->u_data = copy;
        u->u_ready = true;
    }
}

tp_status
tp__p2p_isend(tp__p2p *p, int dst, uint64_t gid, int chan, uint64_t tag,
              const void *buf, size_t len, tp__req_cb cb, void *cb_arg,
              tp__req **r_p, tp_error **err_p)
{
    *r_p = NULL;
    tp__p2p_reap_dead(p);
    if (dst < 0 || dst >= p->p_world) {
        return tp__error_set(err_p, TP_EINVAL, "%s: send to rank %d of %d",
                             p->p_name, dst, p->p_world);
    }
    tp_error *pe = tp__p2p_peer_error(p, dst);
    if (pe != NULL) {
        tp_status st = tp_error_status(pe);
        if (err_p != NULL) {
            *err_p = pe;
        } else {
            tp_error_unref(pe);
        }
        return st;
    }
    tp__req *r = tp__p2p_req_new(p, true, dst, gid, chan, tag, (void *)buf, len,
                                 cb, cb_arg);
    if (r == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: send to rank %d", p->p_name,
                             dst);
    }
    tp__p2p_hdr_put(r->r_hdr, chan, p->p_rank, gid, tag, len);
    tp_status st =
        dst == p->p_rank ? send_self(p, r, err_p) : send_post(p, r, err_p);
    if (st != TP_OK) {
        tp__req_free(r);
        return st;
    }
    *r_p = r;
    return TP_OK;
}

// ---- waiting
// ---------------------------------------------------------------------
void
tp__p2p_kick(tp__p2p *p)
{
    tp__mtx_lock(&p->p_mtx);
    p->p_gen++;
    tp__cv_broadcast(&p->p_cv);
    tp__mtx_unlock(&p->p_mtx);
}

static bool
all_done(tp__req *const *rs, int n, int *first_pending)
{
    for (int i = 0; i < n; i++) {
        if (rs[i] != NULL && !tp__req_done(rs[i])) {
            *first_pending = i;
            return false;
        }
    }
    return true;
}

typedef struct spin_arg {
    tp__req *const *rs;
    int n;
} spin_arg;

static bool
spin_done(void *arg)
{
    spin_arg *s = arg;
    int i;
    return all_done(s->rs, s->n, &i);
}

tp_status
tp__p2p_waitall(tp__p2p *p, tp__req *const *rs, int n, uint64_t start_ns,
                uint64_t deadline_ns,
                tp_status (*check)(void *arg, tp_error **err_p), void *arg,
                const char *what, tp_error **err_p)
{
    uint64_t start = tp__now_ns();
    uint64_t op_start = start_ns != 0 && start_ns <= start ? start_ns : start;
    spin_arg sa = {rs, n};
    tp__spin_until(spin_done, &sa, 20000);
    for (;;) {
        // Errors first, in request order.
        int pending = -1;
        bool done = all_done(rs, n, &pending);
        for (int i = 0; i < n; i++) {
            if (rs[i] != NULL && tp__req_done(rs[i]) && rs[i]->r_st != TP_OK) {
                return tp__req_status(rs[i], err_p);
            }
        }
        if (done) {
            return TP_OK;
        }
        if (check != NULL) {
            tp_error *ce = NULL;
            tp_status st = check(arg, &ce);
            if (st != TP_OK && !all_done(rs, n, &pending)) {
                if (err_p != NULL) {
                    *err_p = ce;
                } else {
                    tp_error_unref(ce);
                }
                return st;
            }
            tp_error_unref(ce);
            if (st != TP_OK) {
                continue; // everything completed meanwhile
            }
        }
        uint64_t now = tp__now_ns();
        if (now >= deadline_ns) {
            // The time since the operation started, not since this wait
            // did: a process stopped past its deadline waited for
            // nothing here, but its collective took that long.
            const tp__req *r = rs[pending];
            return tp__error_set(
                err_p, TP_ETIMEDOUT,
                "%s timed out after %" PRIu64 " ms (timeout %" PRIu64
                " ms) waiting for a %s world rank %d",
                what, (now - op_start) / 1000000u,
                (deadline_ns - op_start) / 1000000u,
                r->r_send ? "send to" : "message from", r->r_peer);
        }
        // Probe the sources of recvs that have waited long.
        if (now - start > (uint64_t)TP__P2P_PROBE_MS * 1000000u) {
            for (int i = 0; i < n; i++) {
                const tp__req *r = rs[i];
                if (r != NULL && !tp__req_done(r) && !r->r_send) {
                    tp__p2p_probe(p, r->r_peer);
                }
            }
        }
        tp__mtx_lock(&p->p_mtx);
        uint64_t gen = p->p_gen;
        uint64_t slice = tp__now_ns() + 20000000u; // 20 ms
        if (slice > deadline_ns) {
            slice = deadline_ns;
        }
        while (gen == p->p_gen && !all_done(rs, n, &pending) &&
               tp__cv_wait_until(&p->p_cv, &p->p_mtx, slice)) {
        }
        tp__mtx_unlock(&p->p_mtx);
    }
}
