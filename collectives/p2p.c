/* SPDX-License-Identifier: Apache-2.0 */
/* p2p.c - tagged point-to-point messages over pipes (p2p.h).
 *
 * Wire: each message's metadata is a 40-byte little-endian header
 *   u32 magic "TPCL" | u8 version 1 | u8 kind | u16 0 | i32 src | u32 0 |
 *   u64 group id | u64 tag | u64 nbytes
 * kind: 0 p2p data, 1 collective data, 2 abort (one payload: the reason,
 * at most TP__P2P_MAX_REASON bytes), 3 probe (nothing), 4 query (tag: its
 * id, not 0; nothing else: "which sequence number did group <id> reach
 * here?"), 5 answer (tag: the query's id; one payload of
 * TP__P2P_ANSWER_LEN bytes: u64 next | u32 flags, bit 0: has the group |
 * u32 0). Data (nbytes > 0)
 * is the message's one tensor, so it moves on the pipe's channel (cma,
 * mpt, ...) straight from the sender's buffer into the posted recv's.
 * Everything is checked before use; a malformed message closes that pipe
 * with TP_EPROTO naming the peer, and fails what depended on that rank.
 *
 * This file: the wire format and its check, the incoming pipes (reading
 * and matching messages), the context, accept, create and destroy. The
 * other files and the locks: p2p_impl.h. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/p2p_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/wire.h"

static void in_read_next(p2p_in *in);

// ---- incoming pipes
// ------------------------------------------------------------

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
        tp__p2p_ux_unqueue(p, u);
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
    tp__p2p_ux_free(u);
    if (r != NULL) {
        tp__p2p_req_complete(r, st, err, in->i_src);
    }
    if (claim != NULL) {
        tp__p2p_req_complete(claim, st, err, in->i_src);
    }
    tp_pipe_close(in->i_pipe);
    // A protocol error closes this pipe only: other pipes of that rank
    // are not disturbed. EOF or a reset means the rank is gone.
    if (in->i_src >= 0 && !closing && st != TP_EPROTO && !local_close) {
        tp__p2p_peer_fail(p, in->i_src, err);
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
    if (in->i_kind == P2P_KIND_QUERY || in->i_kind == P2P_KIND_ANSWER) {
        const uint8_t *h = msg->metadata;
        uint64_t gid = tp__get_u64le(h + 16);
        uint64_t qid = tp__get_u64le(h + 24);
        char why[160];
        bool ok = true;
        if (in->i_kind == P2P_KIND_QUERY) {
            tp__p2p_on_query(p, in->i_src, gid, qid);
        } else {
            ok =
                tp__p2p_on_answer(p, in->i_src, gid, qid, msg->payloads[0].data,
                                  msg->payloads[0].len, why, sizeof(why));
        }
        tp_message_destroy(msg);
        if (!ok) {
            in_fail(in, TP_EPROTO, NULL, why);
            return;
        }
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
            tp__p2p_ux_unqueue(p, u);
        }
    }
    tp__mtx_unlock(&p->p_mtx);
    if (r != NULL) {
        tp_message_destroy(msg); // the tensor is r's buffer, not pipe-owned
        tp__p2p_req_complete(r, TP_OK, NULL, in->i_src);
    } else if (claim != NULL) {
        tp__p2p_ux_deliver(p, claim, u);
    } else if (drop) {
        tp__p2p_ux_free(u);
    }
    in_read_next(in);
}

void
tp__p2p_hdr_put(uint8_t *h, int kind, int src, uint64_t gid, uint64_t tag,
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
    if (kind > P2P_KIND_ANSWER || tp__get_u16le(h + 6) != 0 ||
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
    bool query = kind == P2P_KIND_QUERY || kind == P2P_KIND_ANSWER;
    uint32_t want_payloads =
        kind == P2P_KIND_ABORT || kind == P2P_KIND_ANSWER ? 1 : 0;
    uint32_t want_tensors = nbytes > 0 ? 1 : 0;
    if (npayloads != want_payloads || ntensors != want_tensors ||
        (want_tensors == 1 && tensor_len != nbytes) ||
        (kind >= P2P_KIND_ABORT && nbytes != 0) ||
        (kind == P2P_KIND_ABORT && payload_len > TP__P2P_MAX_REASON) ||
        (kind == P2P_KIND_ANSWER && payload_len != TP__P2P_ANSWER_LEN) ||
        nbytes > SIZE_MAX / 2) {
        snprintf(why, why_len,
                 "%u payloads and %u tensors for a kind-%d message of %" PRIu64
                 " bytes",
                 npayloads, ntensors, kind, nbytes);
        return false;
    }
    if (query && tp__get_u64le(h + 24) == 0) {
        snprintf(why, why_len, "a kind-%d message with query id 0", kind);
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
    tp__p2p_hdr_put(out, hd->kind, hd->src, hd->gid, hd->tag, hd->nbytes);
}

bool
tp__p2p_answer_decode(const void *buf, uint64_t len, tp__p2p_answer *a,
                      char *why, size_t why_len)
{
    const uint8_t *b = buf;
    if (len != TP__P2P_ANSWER_LEN || b == NULL) {
        snprintf(why, why_len, "answer of %" PRIu64 " bytes, expected %d", len,
                 TP__P2P_ANSWER_LEN);
        return false;
    }
    uint64_t next = tp__get_u64le(b);
    uint32_t flags = tp__get_u32le(b + 8);
    if (flags > 1 || tp__get_u32le(b + 12) != 0 || (flags == 0 && next != 0)) {
        snprintf(why, why_len,
                 "answer with flags 0x%x, reserved 0x%x and next %" PRIu64,
                 flags, tp__get_u32le(b + 12), next);
        return false;
    }
    a->has_group = flags == 1;
    a->next = next;
    return true;
}

void
tp__p2p_answer_encode(uint8_t *out, const tp__p2p_answer *a)
{
    tp__put_u64le(out, a->has_group ? a->next : 0);
    tp__put_u32le(out + 8, a->has_group ? 1u : 0u);
    tp__put_u32le(out + 12, 0);
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
    tp__req *r = tp__p2p_posted_find(p, src, gid, kind, tag);
    // Earlier unexpected messages with this key must match first: a recv
    // posted now would take them, so one is only matched here if there is
    // none (a posted recv implies none, as it would have taken it).
    tp__req *mismatch = NULL;
    if (r != NULL) {
        tp__p2p_posted_remove(p, r);
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
        tp_error *e =
            tp__p2p_size_mismatch(p, src, tag, nbytes, mismatch->r_len);
        tp__p2p_req_complete(mismatch, TP_EINVAL, e, src);
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
    // In connect order: the first network transport, then the others.
    const char *addrs[P2P_MAX_ADDRS];
    size_t naddrs = tp_pipe_listener_addrs(p->p_listener, addrs, P2P_MAX_ADDRS);
    size_t off = 0;
    for (size_t i = 0; i < naddrs && i < P2P_MAX_ADDRS; i++) {
        const char *u = addrs[i];
        if (off + strlen(u) + 2 < sizeof(p->p_urls)) {
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
                      tp__p2p_fail_cb fail_cb, tp__p2p_query_cb query_cb,
                      void *arg)
{
    p->p_abort_cb = abort_cb;
    p->p_fail_cb = fail_cb;
    p->p_query_cb = query_cb;
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
    tp_pool *ans = p->p_ans_pool; // no answer is queued from now on
    p->p_ans_pool = NULL;
    tp__mtx_unlock(&p->p_mtx);
    // Answers being sent finish (they may connect) before the context
    // goes; those queued see p_closing and send nothing.
    tp__pool_destroy(ans);
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
        tp__p2p_req_complete(r, TP_ECLOSED, closed, -1);
    }
    tp_error_unref(closed);
    tp__p2p_reap_dead(p);
    p2p_ux *u;
    while ((u = tp__list_pop_first(&p->p_ux)) != NULL) {
        if (u->u_claim != NULL) {
            tp__req *r = u->u_claim;
            r->r_ux = NULL;
            tp_error *e = tp_error_create(TP_ECLOSED, NULL,
                                          "%s: the process group was destroyed",
                                          p->p_name);
            tp__p2p_req_complete(r, TP_ECLOSED, e, -1);
            tp_error_unref(e);
        }
        tp__p2p_ux_free(u);
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
