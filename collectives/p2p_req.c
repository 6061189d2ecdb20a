/* SPDX-License-Identifier: Apache-2.0 */
/* p2p_req.c - the p2p layer's requests (p2p.h): completion, detach,
 * cancel, and posting recvs (matched against the unexpected queue). Locks:
 * p2p_impl.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/p2p_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"

// The error of a recv whose tensor does not have the message's size.
static bool match(const tp__req *r, int src, uint64_t gid, int chan,
                  uint64_t tag);

tp_error *
tp__p2p_size_mismatch(const tp__p2p *p, int src, uint64_t tag, uint64_t msg_len,
                      size_t buf_len)
{
    return tp_error_create(TP_EINVAL, NULL,
                           "%s: recv from rank %d (tag %" PRIu64
                           "): the message has %" PRIu64
                           " bytes, the tensor %zu",
                           p->p_name, src, tag, msg_len, buf_len);
}

// ---- requests
// ----------------------------------------------------------------

void
tp__p2p_req_complete(tp__req *r, tp_status st, const tp_error *err, int source)
{
    tp__p2p *p = r->r_p;
    r->r_st = st;
    r->r_err = err != NULL ? tp_error_ref(err) : NULL;
    r->r_source = source;
    tp__req_cb cb = atomic_load_explicit(&r->r_cb, memory_order_acquire);
    void *arg = r->r_cb_arg;
    if (cb != NULL) {
        cb(r, arg);
    }
    tp__mtx_lock(&p->p_mtx);
    if (r->r_detached) {
        // Its aio may be the one whose callback this is: freed later, on a
        // user thread (tp__p2p_isend/irecv, destroy).
        r->r_next = p->p_dead;
        p->p_dead = r;
    }
    // Last touch of @r: its owner may free it once it sees r_done.
    atomic_store_explicit(&r->r_done, true, memory_order_release);
    p->p_gen++;
    tp__cv_broadcast(&p->p_cv);
    tp__mtx_unlock(&p->p_mtx);
    // @r may be freed from here on.
}

void
tp__req_detach(tp__req *r)
{
    if (r == NULL) {
        return;
    }
    tp__p2p *p = r->r_p;
    tp__mtx_lock(&p->p_mtx);
    bool done = tp__req_done(r);
    if (!done) {
        r->r_detached = true;
    }
    tp__mtx_unlock(&p->p_mtx);
    if (done) {
        tp__req_free(r);
    }
}

// Frees the detached requests that completed. A user thread.
void
tp__p2p_reap_dead(tp__p2p *p)
{
    tp__mtx_lock(&p->p_mtx);
    tp__req *r = p->p_dead;
    p->p_dead = NULL;
    tp__mtx_unlock(&p->p_mtx);
    while (r != NULL) {
        tp__req *next = r->r_next;
        tp__req_free(r);
        r = next;
    }
}

tp__req *
tp__p2p_req_new(tp__p2p *p, bool send, int peer, uint64_t gid, int chan,
                uint64_t tag, void *buf, size_t len, tp__req_cb cb,
                void *cb_arg)
{
    tp__req *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    r->r_p = p;
    r->r_send = send;
    r->r_peer = peer;
    r->r_gid = gid;
    r->r_chan = chan;
    r->r_tag = tag;
    r->r_buf = buf;
    r->r_len = len;
    atomic_init(&r->r_cb, cb);
    r->r_cb_arg = cb_arg;
    r->r_source = -1;
    r->r_posted_ns = tp__now_ns();
    return r;
}

bool
tp__req_done(const tp__req *r)
{
    return atomic_load_explicit(&r->r_done, memory_order_acquire);
}

tp_status
tp__req_status(const tp__req *r, tp_error **err_p)
{
    if (err_p != NULL) {
        *err_p = r->r_err != NULL ? tp_error_ref(r->r_err) : NULL;
    }
    return r->r_st;
}

int
tp__req_source(const tp__req *r)
{
    return r->r_source;
}

void
tp__req_free(tp__req *r)
{
    if (r == NULL) {
        return;
    }
    tp_aio_destroy(r->r_aio);
    tp_error_unref(r->r_err);
    free(r->r_owned);
    free(r);
}

void
tp__p2p_posted_remove(tp__p2p *p, tp__req *r)
{
    tp__list_remove(&p->p_posted, r);
}

// The first posted recv that takes a message with this key (p_mtx held).
tp__req *
tp__p2p_posted_find(tp__p2p *p, int src, uint64_t gid, int chan, uint64_t tag)
{
    for (tp__req *r = tp__list_first(&p->p_posted); r != NULL;
         r = tp__list_next(&p->p_posted, r)) {
        if (match(r, src, gid, chan, tag)) {
            return r;
        }
    }
    return NULL;
}

// Takes @u out of the unexpected queue if it is in it (p_mtx held).
void
tp__p2p_ux_unqueue(tp__p2p *p, p2p_ux *u)
{
    if (tp__list_node_active(&u->u_node)) {
        tp__list_remove(&p->p_ux, u);
    }
}

// Waits up to @ms for @r to complete. True if it did.
static bool
req_wait_done(tp__p2p *p, tp__req *r, int64_t ms)
{
    uint64_t deadline = tp__deadline_after_ms(ms);
    tp__mtx_lock(&p->p_mtx);
    while (!tp__req_done(r) &&
           tp__cv_wait_until(&p->p_cv, &p->p_mtx, deadline)) {
    }
    bool done = tp__req_done(r);
    tp__mtx_unlock(&p->p_mtx);
    return done;
}

void
tp__req_cancel_free(tp__req *r)
{
    tp__req_cancel_free_within(r, -1);
}

void
tp__req_cancel_free_within(tp__req *r, int64_t grace_ms)
{
    if (r == NULL) {
        return;
    }
    tp__p2p *p = r->r_p;
    if (!tp__req_done(r)) {
        bool complete_here = false;
        tp__req *heir = NULL;
        tp__mtx_lock(&p->p_mtx);
        if (!r->r_send) {
            if (tp__list_node_active(&r->r_node)) {
                tp__p2p_posted_remove(p, r);
                complete_here = true;
            } else if (r->r_ux != NULL) {
                // The arriving message goes to the next recv that matches
                // it (non-overtaking), or stays unexpected.
                p2p_ux *u = r->r_ux;
                u->u_claim = NULL;
                r->r_ux = NULL;
                complete_here = true;
                heir = tp__p2p_posted_find(p, u->u_src, u->u_gid, u->u_chan,
                                           u->u_tag);
                if (heir != NULL) {
                    tp__p2p_posted_remove(p, heir);
                    u->u_claim = heir;
                    heir->r_ux = u;
                }
            }
        }
        tp__mtx_unlock(&p->p_mtx);
        if (complete_here) {
            tp_error *e = tp_error_create(TP_ECANCELED, NULL,
                                          "%s: recv canceled", p->p_name);
            tp__p2p_req_complete(r, TP_ECANCELED, e, -1);
            tp_error_unref(e);
        }
        // A send in flight, or a recv whose message is being received,
        // completes on its own (the peer reads everything it is sent; a
        // dead peer fails the pipe). Closing the pipe instead would make
        // the peer take this rank for dead: only as a last resort.
        if (!req_wait_done(p, r,
                           grace_ms < 0 ? P2P_CANCEL_WAIT_MS : (int)grace_ms)) {
            tp_pipe *close_pipe = NULL;
            tp__mtx_lock(&p->p_mtx);
            if (!r->r_send && r->r_in != NULL && r->r_in->i_pipe != NULL) {
                r->r_in->i_local_close = true;
                close_pipe = tp_pipe_ref(r->r_in->i_pipe);
            }
            tp__mtx_unlock(&p->p_mtx);
            if (close_pipe != NULL) {
                // The peer will see its pipe to us break and take us for
                // dead: take it for failed too, so that what waits on it
                // fails now rather than at its deadline.
                tp_error *e = tp_error_create(
                    TP_ECLOSED, NULL,
                    "%s: world rank %d: a canceled receive from it stalled "
                    "for %d ms; its pipe was closed",
                    p->p_name, r->r_peer, P2P_CANCEL_WAIT_MS);
                int src = r->r_peer;
                tp_pipe_close(close_pipe);
                tp_pipe_unref(close_pipe);
                tp__p2p_peer_fail(p, src, e);
                tp_error_unref(e);
            } else if (r->r_send && r->r_aio != NULL) {
                tp_aio_cancel(r->r_aio);
            }
            if (!req_wait_done(p, r, P2P_CANCEL_WAIT_MS)) {
                // A buffer may still be written: leak the request rather
                // than free memory a pipe holds, and let its completion
                // call nobody (its owner is going away).
                atomic_store_explicit(&r->r_cb, NULL, memory_order_release);
                TP_LOG_ERROR("TP-P2P-LEAK",
                             "%s: a %s to rank %d did not complete within "
                             "%d ms of being canceled; leaking it",
                             p->p_name, r->r_send ? "send" : "recv", r->r_peer,
                             2 * P2P_CANCEL_WAIT_MS);
                return;
            }
        }
    }
    tp__req_free(r);
}

// ---- receiving
// -----------------------------------------------------------------

static bool
match(const tp__req *r, int src, uint64_t gid, int chan, uint64_t tag)
{
    return r->r_gid == gid && r->r_chan == chan && r->r_tag == tag &&
           (r->r_peer == src || r->r_peer < 0);
}

void
tp__p2p_ux_free(p2p_ux *u)
{
    if (u != NULL) {
        free(u->u_data);
        tp_message_destroy(u->u_msg);
        free(u);
    }
}

static const void *
ux_data(const p2p_ux *u)
{
    if (u->u_data != NULL) {
        return u->u_data;
    }
    return u->u_msg != NULL && u->u_msg->ntensors > 0
               ? u->u_msg->tensors[0].data
               : NULL;
}

// Completes @r from the ready unexpected message @u (removed from the
// queue by the caller). No lock held.
void
tp__p2p_ux_deliver(tp__p2p *p, tp__req *r, p2p_ux *u)
{
    if (u->u_len != r->r_len) {
        tp_error *e =
            tp__p2p_size_mismatch(p, u->u_src, r->r_tag, u->u_len, r->r_len);
        tp__p2p_req_complete(r, TP_EINVAL, e, u->u_src);
        tp_error_unref(e);
    } else {
        if (u->u_len > 0) {
            memcpy(r->r_buf, ux_data(u), u->u_len);
        }
        tp__p2p_req_complete(r, TP_OK, NULL, u->u_src);
    }
    tp__p2p_ux_free(u);
}

tp_status
tp__p2p_irecv(tp__p2p *p, int src, uint64_t gid, int chan, uint64_t tag,
              void *buf, size_t len, tp__req_cb cb, void *cb_arg, tp__req **r_p,
              tp_error **err_p)
{
    *r_p = NULL;
    tp__p2p_reap_dead(p);
    if (src < -1 || src >= p->p_world) {
        return tp__error_set(err_p, TP_EINVAL, "%s: recv from rank %d of %d",
                             p->p_name, src, p->p_world);
    }
    tp__req *r =
        tp__p2p_req_new(p, false, src, gid, chan, tag, buf, len, cb, cb_arg);
    if (r == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: recv from rank %d",
                             p->p_name, src);
    }
    tp__mtx_lock(&p->p_mtx);
    // A message already here, in arrival order.
    p2p_ux *u = tp__list_first(&p->p_ux);
    while (u != NULL && (u->u_claim != NULL ||
                         !match(r, u->u_src, u->u_gid, u->u_chan, u->u_tag))) {
        u = tp__list_next(&p->p_ux, u);
    }
    if (u != NULL) {
        if (u->u_ready) {
            tp__list_remove(&p->p_ux, u);
            tp__mtx_unlock(&p->p_mtx);
            *r_p = r;
            tp__p2p_ux_deliver(p, r, u);
            return TP_OK;
        }
        u->u_claim = r; // completes when it has arrived
        r->r_ux = u;
        tp__mtx_unlock(&p->p_mtx);
        *r_p = r;
        return TP_OK;
    }
    tp_error *dead = src >= 0 ? tp_error_ref(p->p_peers[src].pe_err) : NULL;
    if (dead == NULL) {
        tp__list_append(&p->p_posted, r);
    }
    tp__mtx_unlock(&p->p_mtx);
    if (dead != NULL) {
        tp_status st = tp_error_status(dead);
        if (err_p != NULL) {
            *err_p = dead;
        } else {
            tp_error_unref(dead);
        }
        tp__req_free(r);
        return st;
    }
    *r_p = r;
    return TP_OK;
}
