/* SPDX-License-Identifier: Apache-2.0 */
/* p2p.c - tagged point-to-point messages over pipes (p2p.h).
 *
 * Wire: each message's metadata is a 40-byte little-endian header
 *   u32 magic "TPCL" | u8 version 1 | u8 kind | u16 0 | i32 src | u32 0 |
 *   u64 group id | u64 tag | u64 nbytes
 * kind: 0 p2p data, 1 collective data, 2 abort (one payload: the reason,
 * at most TP__P2P_MAX_REASON bytes), 3 probe (nothing). Data (nbytes > 0)
 * is the message's one tensor, so it moves on the pipe's channel (cma,
 * mpt, ...) straight from the sender's buffer into the posted recv's.
 * Everything is checked before use; a malformed message closes that pipe
 * with TP_EPROTO naming the peer, and fails what depended on that rank.
 *
 * Locks: p_mtx guards the peer table's errors, the posted and unexpected
 * lists and the incoming pipes; it is taken by loop callbacks, so no pipe
 * call that waits for the loop (tp_context_connect) is made under it.
 * p_conn_mtx serialises connecting (never taken by a loop callback). */
#include "collectives/p2p.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/list.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/wire.h"

#define P2P_MAGIC          0x4c435054u // "TPCL"
#define P2P_VERSION        1
#define P2P_HDR            TP__P2P_HDR
#define P2P_KIND_DATA      0 // + chan: 0 p2p, 1 coll
#define P2P_KIND_ABORT     2
#define P2P_KIND_PROBE     3
#define P2P_MAX_URLS       512
#define P2P_CANCEL_WAIT_MS 5000

typedef struct p2p_in p2p_in;
typedef struct p2p_ux p2p_ux;

struct tp__req {
    tp__p2p *r_p;
    bool r_send;
    int r_peer; // dst; src or -1
    uint64_t r_gid;
    int r_chan;
    uint64_t r_tag;
    void *r_buf;
    size_t r_len;
    _Atomic(tp__req_cb) r_cb; // cleared by tp__req_cancel_free's leak path
    void *r_cb_arg;
    uint64_t r_posted_ns;
    _Atomic bool r_done;
    bool r_detached; // under p_mtx: freed by the p2p layer
    tp_status r_st;
    tp_error *r_err;
    int r_source;
    // send
    uint8_t r_hdr[P2P_HDR];
    tp_msg_buf r_tbuf;
    tp_message r_msg;
    tp_aio *r_aio;
    tp_pipe *r_pipe; // reference while the write is in flight
    char *r_owned;   // freed with the request (an abort's reason)
    // recv (under p_mtx)
    p2p_in *r_in;        // being received by this pipe
    p2p_ux *r_ux;        // claimed an arriving unexpected message
    tp_list_node r_node; // in p_posted while posted
    tp__req *r_next;     // in a singly linked chain (p_dead, failed)
};

// A message that arrived before its recv.
struct p2p_ux {
    tp_list_node u_node; // in p_ux while queued
    int u_src;
    uint64_t u_gid;
    int u_chan;
    uint64_t u_tag;
    size_t u_len;
    void *u_data;      // self sends: malloc'd copy
    tp_message *u_msg; // from a pipe: pipe-owned buffer
    bool u_ready;
    bool u_drop; // received only to be dropped (size mismatch)
    tp__req *u_claim;
};

// A pipe a peer connected to us: we only read on it.
struct p2p_in {
    tp__p2p *i_p;
    p2p_in *i_next;
    tp_pipe *i_pipe;
    tp_aio *i_daio;
    tp_aio *i_raio;
    int i_src;         // -1 until its first message
    tp_message *i_msg; // the message being read
    int i_kind;
    tp__req *i_req; // matched recv
    p2p_ux *i_ux;   // or unexpected entry
    bool i_dead;
    bool i_local_close; // closed by a cancellation here (under p_mtx)
};

typedef struct p2p_peer {
    char *pe_urls;   // newline-separated
    tp_pipe *pe_out; // we write on it (under p_conn_mtx to create)
    tp_error *pe_err;
    uint64_t pe_probe_ns;
} p2p_peer;

struct tp__p2p {
    int p_rank;
    int p_world;
    char p_name[96];
    tp_context *p_ctx;
    tp_pipe_listener *p_listener;
    tp_aio *p_accept_aio;
    char p_urls[1024];
    p2p_peer *p_peers;
    tp_mtx p_mtx;
    tp_cv p_cv;
    tp_mtx p_conn_mtx;
    tp_list p_posted; // recvs waiting (tp__req), in post order
    tp_list p_ux;     // unexpected messages (p2p_ux), in arrival order
    p2p_in *p_ins;
    bool p_closing;
    uint64_t p_gen; // bumped on every completion, under p_mtx
    tp__p2p_abort_cb p_abort_cb;
    tp__p2p_fail_cb p_fail_cb;
    void *p_cb_arg;
    tp__req *p_dead; // detached and complete: freed on a user thread
};

static void in_read_next(p2p_in *in);
static bool match(const tp__req *r, int src, uint64_t gid, int chan,
                  uint64_t tag);
static void ux_free(p2p_ux *u);
static void peer_fail(tp__p2p *p, int rank, const tp_error *err);

// The error of a recv whose tensor does not have the message's size.
static tp_error *
size_mismatch(const tp__p2p *p, int src, uint64_t tag, uint64_t msg_len,
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

static void
req_complete(tp__req *r, tp_status st, const tp_error *err, int source)
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
static void
reap_dead(tp__p2p *p)
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

static tp__req *
req_new(tp__p2p *p, bool send, int peer, uint64_t gid, int chan, uint64_t tag,
        void *buf, size_t len, tp__req_cb cb, void *cb_arg)
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

static void
posted_remove(tp__p2p *p, tp__req *r)
{
    tp__list_remove(&p->p_posted, r);
}

// The first posted recv that takes a message with this key (p_mtx held).
static tp__req *
posted_find(tp__p2p *p, int src, uint64_t gid, int chan, uint64_t tag)
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
static void
ux_unqueue(tp__p2p *p, p2p_ux *u)
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
                posted_remove(p, r);
                complete_here = true;
            } else if (r->r_ux != NULL) {
                // The arriving message goes to the next recv that matches
                // it (non-overtaking), or stays unexpected.
                p2p_ux *u = r->r_ux;
                u->u_claim = NULL;
                r->r_ux = NULL;
                complete_here = true;
                heir = posted_find(p, u->u_src, u->u_gid, u->u_chan, u->u_tag);
                if (heir != NULL) {
                    posted_remove(p, heir);
                    u->u_claim = heir;
                    heir->r_ux = u;
                }
            }
        }
        tp__mtx_unlock(&p->p_mtx);
        if (complete_here) {
            tp_error *e = tp_error_create(TP_ECANCELED, NULL,
                                          "%s: recv canceled", p->p_name);
            req_complete(r, TP_ECANCELED, e, -1);
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
                peer_fail(p, src, e);
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

// ---- peers
// -------------------------------------------------------------------

// Records the first failure of @rank, fails its recvs, tells the owner.
// No lock held.
static void
peer_fail(tp__p2p *p, int rank, const tp_error *err)
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
                posted_remove(p, r);
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
        req_complete(r, tp_error_status(e), e, -1);
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
static tp_status
peer_out(tp__p2p *p, int rank, tp_pipe **pipe_p, tp_error **err_p)
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

static void
hdr_encode(uint8_t *h, int kind, int src, uint64_t gid, uint64_t tag,
           uint64_t nbytes)
{
    memset(h, 0, P2P_HDR);
    tp__put_u32le(h, P2P_MAGIC);
    h[4] = P2P_VERSION;
    h[5] = (uint8_t)kind;
    tp__put_u32le(h + 8, (uint32_t)src);
    tp__put_u64le(h + 16, gid);
    tp__put_u64le(h + 24, tag);
    tp__put_u64le(h + 32, nbytes);
}

// Loop thread: a write finished.
static void
send_cb(void *arg)
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
            peer_fail(p, r->r_peer, err);
        }
    }
    tp_pipe_unref(r->r_pipe);
    r->r_pipe = NULL;
    req_complete(r, st, err, p->p_rank);
    tp_error_unref(err);
}

// Posts the write of @r (its header and buffer set) to rank r_peer.
static tp_status
send_post(tp__p2p *p, tp__req *r, tp_error **err_p)
{
    tp_status st = tp_aio_create(send_cb, r, &r->r_aio);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "%s: send to rank %d: no memory",
                             p->p_name, r->r_peer);
    }
    st = peer_out(p, r->r_peer, &r->r_pipe, err_p);
    if (st != TP_OK) {
        tp_error *e = err_p != NULL ? *err_p : NULL;
        if (e != NULL) {
            peer_fail(p, r->r_peer, e);
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
        tp__req *r = posted_find(p, p->p_rank, s->r_gid, s->r_chan, s->r_tag);
        if (r != NULL) {
            posted_remove(p, r);
            tp__mtx_unlock(&p->p_mtx);
            ux_free(u);
            if (r->r_len != s->r_len) {
                tp_error *e =
                    size_mismatch(p, p->p_rank, r->r_tag, s->r_len, r->r_len);
                req_complete(r, TP_EINVAL, e, p->p_rank);
                req_complete(s, TP_OK, NULL, p->p_rank); // as to a peer
                tp_error_unref(e);
                return TP_OK;
            }
            if (s->r_len > 0) {
                memcpy(r->r_buf, s->r_buf, s->r_len);
            }
            req_complete(r, TP_OK, NULL, p->p_rank);
            req_complete(s, TP_OK, NULL, p->p_rank);
            return TP_OK;
        }
        if (u != NULL) {
            tp__list_append(&p->p_ux, u);
            tp__mtx_unlock(&p->p_mtx);
            req_complete(s, TP_OK, NULL, p->p_rank);
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
    reap_dead(p);
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
    tp__req *r =
        req_new(p, true, dst, gid, chan, tag, (void *)buf, len, cb, cb_arg);
    if (r == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: send to rank %d", p->p_name,
                             dst);
    }
    hdr_encode(r->r_hdr, chan, p->p_rank, gid, tag, len);
    tp_status st =
        dst == p->p_rank ? send_self(p, r, err_p) : send_post(p, r, err_p);
    if (st != TP_OK) {
        tp__req_free(r);
        return st;
    }
    *r_p = r;
    return TP_OK;
}

// ---- receiving
// -----------------------------------------------------------------

static bool
match(const tp__req *r, int src, uint64_t gid, int chan, uint64_t tag)
{
    return r->r_gid == gid && r->r_chan == chan && r->r_tag == tag &&
           (r->r_peer == src || r->r_peer < 0);
}

static void
ux_free(p2p_ux *u)
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
static void
ux_deliver(tp__p2p *p, tp__req *r, p2p_ux *u)
{
    if (u->u_len != r->r_len) {
        tp_error *e = size_mismatch(p, u->u_src, r->r_tag, u->u_len, r->r_len);
        req_complete(r, TP_EINVAL, e, u->u_src);
        tp_error_unref(e);
    } else {
        if (u->u_len > 0) {
            memcpy(r->r_buf, ux_data(u), u->u_len);
        }
        req_complete(r, TP_OK, NULL, u->u_src);
    }
    ux_free(u);
}

tp_status
tp__p2p_irecv(tp__p2p *p, int src, uint64_t gid, int chan, uint64_t tag,
              void *buf, size_t len, tp__req_cb cb, void *cb_arg, tp__req **r_p,
              tp_error **err_p)
{
    *r_p = NULL;
    reap_dead(p);
    if (src < -1 || src >= p->p_world) {
        return tp__error_set(err_p, TP_EINVAL, "%s: recv from rank %d of %d",
                             p->p_name, src, p->p_world);
    }
    tp__req *r = req_new(p, false, src, gid, chan, tag, buf, len, cb, cb_arg);
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
            ux_deliver(p, r, u);
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

// Loop thread: fails @in (pipe error or protocol error) and what it was
// receiving; the rank behind it, if known, is failed too.
static void
in_fail(p2p_in *in, tp_status st, const tp_error *cause, const char *why)
{
    tp__p2p *p = in->i_p;
    tp_error *err = NULL;
    if (in->i_src >= 0) {
        err =
            tp_error_create(st, cause, "%s: world rank %d (%s): %s", p->p_name,
                            in->i_src, tp_pipe_peer(in->i_pipe), why);
    } else {
        err = tp_error_create(st, cause, "%s: %s: %s", p->p_name,
                              tp_pipe_peer(in->i_pipe), why);
    }
    if (st == TP_EPROTO) {
        TP_LOG_ERROR("TP-P2P-PROTO", "%s", tp_error_message(err));
    }
    tp__mtx_lock(&p->p_mtx);
    in->i_dead = true;
    bool local_close = in->i_local_close;
    tp__req *r = in->i_req;
    in->i_req = NULL;
    if (r != NULL) {
        r->r_in = NULL;
    }
    p2p_ux *u = in->i_ux;
    in->i_ux = NULL;
    tp__req *claim = NULL;
    if (u != NULL) {
        ux_unqueue(p, u);
        claim = u->u_claim;
        if (claim != NULL) {
            claim->r_ux = NULL;
        }
    }
    tp_message *msg = in->i_msg;
    in->i_msg = NULL;
    bool closing = p->p_closing;
    tp__mtx_unlock(&p->p_mtx);
    if (msg != NULL && (u == NULL || u->u_msg != msg)) {
        tp_message_destroy(msg);
    }
    ux_free(u);
    if (r != NULL) {
        req_complete(r, st, err, in->i_src);
    }
    if (claim != NULL) {
        req_complete(claim, st, err, in->i_src);
    }
    tp_pipe_close(in->i_pipe);
    // A protocol error closes this pipe only: other pipes of that rank
    // are not disturbed. EOF or a reset means the rank is gone.
    if (in->i_src >= 0 && !closing && st != TP_EPROTO && !local_close) {
        peer_fail(p, in->i_src, err);
    }
    tp_error_unref(err);
}

// Loop thread: the payloads and tensor of the current message arrived.
static void
in_read_cb(void *arg)
{
    p2p_in *in = arg;
    tp__p2p *p = in->i_p;
    tp_status st = tp_aio_status(in->i_raio);
    if (st != TP_OK) {
        in_fail(in, st, tp_aio_error(in->i_raio), "receive failed");
        return;
    }
    tp_message *msg = in->i_msg;
    in->i_msg = NULL;
    if (in->i_kind == P2P_KIND_ABORT) {
        char reason[TP__P2P_MAX_REASON + 1];
        size_t n = (size_t)msg->payloads[0].len;
        if (n > 0) {
            memcpy(reason, msg->payloads[0].data, n);
        }
        reason[n] = '\0';
        uint64_t gid = tp__get_u64le((const uint8_t *)msg->metadata + 16);
        tp_message_destroy(msg);
        if (p->p_abort_cb != NULL) {
            p->p_abort_cb(p->p_cb_arg, gid, in->i_src, reason);
        }
        tp__p2p_kick(p);
        in_read_next(in);
        return;
    }
    if (in->i_kind == P2P_KIND_PROBE) {
        tp_message_destroy(msg);
        in_read_next(in);
        return;
    }
    tp__mtx_lock(&p->p_mtx);
    tp__req *r = in->i_req;
    in->i_req = NULL;
    p2p_ux *u = in->i_ux;
    in->i_ux = NULL;
    tp__req *claim = NULL;
    // Read under the lock: once @u is ready and unclaimed a recv may take
    // and free it.
    bool drop = u != NULL && u->u_drop;
    if (r != NULL) {
        r->r_in = NULL;
    } else if (u != NULL && !drop) {
        u->u_ready = true;
        claim = u->u_claim;
        if (claim != NULL) {
            claim->r_ux = NULL;
            ux_unqueue(p, u);
        }
    }
    tp__mtx_unlock(&p->p_mtx);
    if (r != NULL) {
        tp_message_destroy(msg); // the tensor is r's buffer, not pipe-owned
        req_complete(r, TP_OK, NULL, in->i_src);
    } else if (claim != NULL) {
        ux_deliver(p, claim, u);
    } else if (drop) {
        ux_free(u);
    }
    in_read_next(in);
}

bool
tp__p2p_hdr_check(const void *meta, uint64_t meta_len, uint32_t npayloads,
                  uint64_t payload_len, uint32_t ntensors, uint64_t tensor_len,
                  int world, int self, int pipe_src, tp__p2p_hdr *hd, char *why,
                  size_t why_len)
{
    const uint8_t *h = meta;
    if (meta_len != P2P_HDR || h == NULL) {
        snprintf(why, why_len, "header of %" PRIu64 " bytes, expected %d",
                 meta_len, P2P_HDR);
        return false;
    }
    uint32_t magic = tp__get_u32le(h);
    int kind = h[5];
    int32_t src = (int32_t)tp__get_u32le(h + 8);
    uint64_t nbytes = tp__get_u64le(h + 32);
    if (magic != P2P_MAGIC || h[4] != P2P_VERSION) {
        snprintf(why, why_len, "bad magic 0x%08x or version %u", magic, h[4]);
        return false;
    }
    if (kind > P2P_KIND_PROBE || tp__get_u16le(h + 6) != 0 ||
        tp__get_u32le(h + 12) != 0) {
        snprintf(why, why_len, "bad kind %d or reserved bits", kind);
        return false;
    }
    if (src < 0 || src >= world || src == self ||
        (pipe_src >= 0 && src != pipe_src)) {
        snprintf(why, why_len, "source rank %d on a pipe of rank %d", (int)src,
                 pipe_src);
        return false;
    }
    uint32_t want_payloads = kind == P2P_KIND_ABORT ? 1 : 0;
    uint32_t want_tensors = nbytes > 0 ? 1 : 0;
    if (npayloads != want_payloads || ntensors != want_tensors ||
        (want_tensors == 1 && tensor_len != nbytes) ||
        (kind >= P2P_KIND_ABORT && nbytes != 0) ||
        (want_payloads == 1 && payload_len > TP__P2P_MAX_REASON) ||
        nbytes > SIZE_MAX / 2) {
        snprintf(why, why_len,
                 "%u payloads and %u tensors for a kind-%d message of %" PRIu64
                 " bytes",
                 npayloads, ntensors, kind, nbytes);
        return false;
    }
    hd->kind = kind;
    hd->src = src;
    hd->gid = tp__get_u64le(h + 16);
    hd->tag = tp__get_u64le(h + 24);
    hd->nbytes = nbytes;
    return true;
}

void
tp__p2p_hdr_encode(uint8_t *out, const tp__p2p_hdr *hd)
{
    hdr_encode(out, hd->kind, hd->src, hd->gid, hd->tag, hd->nbytes);
}

// Loop thread: the header of the next message arrived; check it, then
// receive into the matching recv or as unexpected.
static void
in_desc_cb(void *arg)
{
    p2p_in *in = arg;
    tp__p2p *p = in->i_p;
    tp_status st = tp_aio_status(in->i_daio);
    if (st != TP_OK) {
        in_fail(in, st, tp_aio_error(in->i_daio),
                st == TP_ECONNRESET ? "connection closed by the peer"
                                    : "receive failed");
        return;
    }
    tp_message *msg = tp_aio_get_output(in->i_daio, 0);
    in->i_msg = msg;
    char why[160];
    tp__p2p_hdr hd;
    if (!tp__p2p_hdr_check(
            msg->metadata, msg->metadata_len, msg->npayloads,
            msg->npayloads > 0 ? msg->payloads[0].len : 0, msg->ntensors,
            msg->ntensors > 0 ? msg->tensors[0].len : 0, p->p_world, p->p_rank,
            in->i_src, &hd, why, sizeof(why))) {
        goto bad;
    }
    int kind = hd.kind;
    int32_t src = hd.src;
    uint64_t gid = hd.gid;
    uint64_t tag = hd.tag;
    uint64_t nbytes = hd.nbytes;
    in->i_src = src;
    in->i_kind = kind;
    if (kind >= P2P_KIND_ABORT) {
        tp_pipe_read(in->i_pipe, msg, in->i_raio);
        return;
    }
    tp__mtx_lock(&p->p_mtx);
    tp__req *r = posted_find(p, src, gid, kind, tag);
    // Earlier unexpected messages with this key must match first: a recv
    // posted now would take them, so one is only matched here if there is
    // none (a posted recv implies none, as it would have taken it).
    tp__req *mismatch = NULL;
    if (r != NULL) {
        posted_remove(p, r);
        if (r->r_len != nbytes) {
            mismatch = r;
            r = NULL;
        } else {
            in->i_req = r;
            r->r_in = in;
            if (msg->ntensors > 0) {
                msg->tensors[0].data = r->r_buf;
            }
        }
    }
    if (r == NULL) {
        p2p_ux *u = calloc(1, sizeof(*u));
        if (u == NULL) {
            tp__mtx_unlock(&p->p_mtx);
            snprintf(why, sizeof(why),
                     "no memory for a message of %" PRIu64 " bytes", nbytes);
            in_fail(in, TP_ENOMEM, NULL, why);
            return;
        }
        u->u_src = src;
        u->u_gid = gid;
        u->u_chan = kind;
        u->u_tag = tag;
        u->u_len = (size_t)nbytes;
        u->u_msg = msg;
        u->u_drop = mismatch != NULL;
        if (mismatch == NULL) {
            tp__list_append(&p->p_ux, u);
        }
        in->i_ux = u;
    }
    tp__mtx_unlock(&p->p_mtx);
    if (mismatch != NULL) {
        // Received and dropped (i_ux not queued): the recv fails.
        tp_error *e = size_mismatch(p, src, tag, nbytes, mismatch->r_len);
        req_complete(mismatch, TP_EINVAL, e, src);
        tp_error_unref(e);
    }
    tp_pipe_read(in->i_pipe, msg, in->i_raio);
    return;
bad:
    in_fail(in, TP_EPROTO, NULL, why);
}

static void
in_read_next(p2p_in *in)
{
    tp_pipe_read_descriptor(in->i_pipe, in->i_daio);
}

// ---- context, accept
// -------------------------------------------------------------

static void
accept_cb(void *arg)
{
    tp__p2p *p = arg;
    if (tp_aio_status(p->p_accept_aio) != TP_OK) {
        return; // closing
    }
    tp_pipe *pipe = tp_aio_get_output(p->p_accept_aio, 0);
    p2p_in *in = calloc(1, sizeof(*in));
    if (in == NULL || tp_aio_create(in_desc_cb, in, &in->i_daio) != TP_OK ||
        tp_aio_create(in_read_cb, in, &in->i_raio) != TP_OK) {
        TP_LOG_ERROR("TP-P2P-ACCEPT", "%s: no memory for a pipe from %s",
                     p->p_name, tp_pipe_peer(pipe));
        if (in != NULL) {
            tp_aio_destroy(in->i_daio);
            free(in);
        }
        tp_pipe_close(pipe);
        tp_pipe_unref(pipe);
    } else {
        in->i_p = p;
        in->i_pipe = pipe;
        in->i_src = -1;
        tp__mtx_lock(&p->p_mtx);
        bool closing = p->p_closing;
        in->i_next = p->p_ins;
        p->p_ins = in;
        tp__mtx_unlock(&p->p_mtx);
        if (closing) {
            tp_pipe_close(pipe);
        }
        in_read_next(in);
    }
    tp_pipe_listener_accept(p->p_listener, p->p_accept_aio);
}

tp_status
tp__p2p_create(const tp_context_options *co, bool loopback, int rank, int world,
               const char *name, tp__p2p **p_p, tp_error **err_p)
{
    *p_p = NULL;
    tp__p2p *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: no memory", name);
    }
    p->p_peers = calloc((size_t)world, sizeof(*p->p_peers));
    if (p->p_peers == NULL) {
        free(p);
        return tp__error_set(err_p, TP_ENOMEM, "%s: no memory", name);
    }
    p->p_rank = rank;
    p->p_world = world;
    snprintf(p->p_name, sizeof(p->p_name), "%s", name);
    TP_LIST_INIT(&p->p_posted, tp__req, r_node);
    TP_LIST_INIT(&p->p_ux, p2p_ux, u_node);
    tp__mtx_init(&p->p_mtx);
    tp__mtx_init(&p->p_conn_mtx);
    tp__cv_init(&p->p_cv);
    tp_status st = tp_context_create(co, &p->p_ctx, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    st = tp_aio_create(accept_cb, p, &p->p_accept_aio);
    if (st != TP_OK) {
        tp__error_set(err_p, st, "%s: no memory", name);
        goto fail;
    }
    const char *urls[1] = {loopback ? "tcp://127.0.0.1:0" : NULL};
    st = tp_context_listen(p->p_ctx, urls, loopback ? 1 : 0, &p->p_listener,
                           err_p);
    if (st != TP_OK) {
        goto fail;
    }
    static const char *const order[] = {"tcp", "shm", "ibv", "ucx"};
    size_t off = 0;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        const char *u = tp_pipe_listener_addr(p->p_listener, order[i]);
        if (u != NULL && off + strlen(u) + 2 < sizeof(p->p_urls)) {
            off += (size_t)snprintf(p->p_urls + off, sizeof(p->p_urls) - off,
                                    "%s%s", off > 0 ? "\n" : "", u);
        }
    }
    if (off == 0) {
        st = tp__error_set(err_p, TP_EINVAL, "%s: the listener has no address",
                           name);
        goto fail;
    }
    *p_p = p;
    return TP_OK;
fail:
    tp__error_wrap(err_p, st, "%s", name);
    tp__p2p_destroy(p);
    return st;
}

const char *
tp__p2p_urls(const tp__p2p *p)
{
    return p->p_urls;
}

tp_status
tp__p2p_set_peer(tp__p2p *p, int r, const char *urls, tp_error **err_p)
{
    if (r < 0 || r >= p->p_world || strlen(urls) > P2P_MAX_URLS * 4) {
        return tp__error_set(err_p, TP_EINVAL, "%s: addresses of rank %d",
                             p->p_name, r);
    }
    char *c = strdup(urls);
    if (c == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: no memory", p->p_name);
    }
    free(p->p_peers[r].pe_urls);
    p->p_peers[r].pe_urls = c;
    return TP_OK;
}

void
tp__p2p_set_callbacks(tp__p2p *p, tp__p2p_abort_cb abort_cb,
                      tp__p2p_fail_cb fail_cb, void *arg)
{
    p->p_abort_cb = abort_cb;
    p->p_fail_cb = fail_cb;
    p->p_cb_arg = arg;
}

void
tp__p2p_start(tp__p2p *p)
{
    tp_pipe_listener_accept(p->p_listener, p->p_accept_aio);
}

void
tp__p2p_destroy(tp__p2p *p)
{
    if (p == NULL) {
        return;
    }
    tp__mtx_lock(&p->p_mtx);
    p->p_closing = true;
    tp__mtx_unlock(&p->p_mtx);
    // Destroying the context fails every pending write and read (their
    // callbacks run and complete the requests) and waits for them.
    tp_pipe_listener_destroy(p->p_listener);
    tp_context_destroy(p->p_ctx);
    tp_aio_destroy(p->p_accept_aio);
    // Recvs still posted fail now.
    tp_error *closed = tp_error_create(
        TP_ECLOSED, NULL, "%s: the process group was destroyed", p->p_name);
    for (;;) {
        tp__mtx_lock(&p->p_mtx);
        tp__req *r = tp__list_pop_first(&p->p_posted);
        tp__mtx_unlock(&p->p_mtx);
        if (r == NULL) {
            break;
        }
        req_complete(r, TP_ECLOSED, closed, -1);
    }
    tp_error_unref(closed);
    reap_dead(p);
    p2p_ux *u;
    while ((u = tp__list_pop_first(&p->p_ux)) != NULL) {
        if (u->u_claim != NULL) {
            tp__req *r = u->u_claim;
            r->r_ux = NULL;
            tp_error *e = tp_error_create(TP_ECLOSED, NULL,
                                          "%s: the process group was destroyed",
                                          p->p_name);
            req_complete(r, TP_ECLOSED, e, -1);
            tp_error_unref(e);
        }
        ux_free(u);
    }
    while (p->p_ins != NULL) {
        p2p_in *in = p->p_ins;
        p->p_ins = in->i_next;
        tp_aio_destroy(in->i_daio);
        tp_aio_destroy(in->i_raio);
        tp_message_destroy(in->i_msg);
        tp_pipe_unref(in->i_pipe);
        free(in);
    }
    for (int r = 0; r < p->p_world; r++) {
        tp_pipe_unref(p->p_peers[r].pe_out);
        tp_error_unref(p->p_peers[r].pe_err);
        free(p->p_peers[r].pe_urls);
    }
    free(p->p_peers);
    tp__cv_fini(&p->p_cv);
    tp__mtx_fini(&p->p_conn_mtx);
    tp__mtx_fini(&p->p_mtx);
    free(p);
}

// ---- control messages
// ------------------------------------------------------------

static void
ctl_send(tp__p2p *p, int dst, int kind, uint64_t gid, const char *reason)
{
    if (dst == p->p_rank || dst < 0 || dst >= p->p_world) {
        return;
    }
    tp__req *r = req_new(p, true, dst, gid, kind, 0, NULL, 0, NULL, NULL);
    if (r == NULL) {
        return;
    }
    hdr_encode(r->r_hdr, kind, p->p_rank, gid, 0, 0);
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
    if (tp_aio_create(send_cb, r, &r->r_aio) != TP_OK ||
        peer_out(p, dst, &r->r_pipe, &e) != TP_OK) {
        if (e != NULL) {
            peer_fail(p, dst, e);
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

// ---- waiting
// ---------------------------------------------------------------------

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

void
tp__p2p_path(tp__p2p *p, int dst, char *buf, size_t len)
{
    tp__mtx_lock(&p->p_conn_mtx);
    tp_pipe *out = p->p_peers[dst].pe_out;
    const char *t = out != NULL ? tp_pipe_transport(out) : NULL;
    const char *c = out != NULL ? tp_pipe_channel(out) : NULL;
    snprintf(buf, len, "%s+%s", t != NULL ? t : "-", c != NULL ? c : "-");
    tp__mtx_unlock(&p->p_conn_mtx);
}
