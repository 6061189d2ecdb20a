// SPDX-License-Identifier: Apache-2.0
// context_listen.c - pipe listeners (tp_context_listen and the accept
// path), and the first frame of each accepted connection (a brochure
// starts a pipe, a join completes one).

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "pipe_impl.h"

// ---- listener ---------------------------------------------------------------

static void pl_accept_cb(void *arg);
static void pending_start(tp_context *ctx, tp_pipe_listener *pl, tp_conn *conn,
                          bool lane, unsigned lane_idx);

static void
pl_arm(pl_tl *tl)
{
    tp_pipe_listener *pl = tl->tl_pl;
    if (pl->pl_closed || tl->tl_busy) {
        return;
    }
    tl->tl_busy = true;
    pl->pl_busy++;
    tp__listener_accept(tl->tl_l, &tl->tl_aio);
}

void
tp__pipe_listener_maybe_free(tp_pipe_listener *pl)
{
    if (!pl->pl_destroy_req || pl->pl_busy > 0 || pl->pl_free_queued) {
        return;
    }
    pl->pl_free_queued = true;
    tp_context *ctx = pl->pl_ctx;
    tp__loop_defer(ctx->x_loop, &pl->pl_destroy_task);
}

static void
pl_free_task(void *arg)
{
    tp_pipe_listener *pl = arg;
    tp_context *ctx = pl->pl_ctx;
    for (size_t i = 0; i < pl->pl_ntls; i++) {
        tp__aio_fini(&pl->pl_tls[i].tl_aio);
    }
    for (size_t i = 0; i < pl->pl_nlanes; i++) {
        tp__aio_fini(&pl->pl_lanes[i].tl_aio);
    }
    tp__free(pl);
    tp__ctx_obj_done(ctx);
}

// Runs on x_loop (posted from the transport's loop).
static void
pl_accepted_task(void *arg)
{
    pl_tl *tl = arg;
    tp_pipe_listener *pl = tl->tl_pl;
    tp_context *ctx = pl->pl_ctx;
    tl->tl_busy = false;
    pl->pl_busy--;
    tp_conn *conn = tp_aio_get_output(&tl->tl_aio, 0);
    tp_status st = tp_aio_status(&tl->tl_aio);
    if (st == TP_OK && conn != NULL) {
        if (pl->pl_closed) {
            tp__conn_unref(conn);
        } else {
            pending_start(ctx, pl, conn, tl->tl_lane, tl->tl_lane_idx);
        }
        pl_arm(tl);
    } else if (!pl->pl_closed) {
        // An accept error that is not a close (EMFILE, ...): say so and
        // keep serving; the transport has already dropped bad hellos.
        TP_LOG_WARN("TP-PIPE-ACCEPT", "pipe listener %s: accept failed: %s",
                    tp__listener_addr(tl->tl_l),
                    tp_error_message(tp_aio_error(&tl->tl_aio)));
        if (st != TP_ECLOSED) {
            pl_arm(tl);
        }
    }
    tp__pipe_listener_maybe_free(pl);
}

static void
pl_accept_cb(void *arg)
{
    pl_tl *tl = arg;
    tp_context *ctx = tl->tl_pl->pl_ctx;
    // A lane listener completes on its lane loop: continue on x_loop.
    tp__task_init(&tl->tl_task, pl_accepted_task, tl);
    if (tp__loop_on_thread(ctx->x_loop)) {
        pl_accepted_task(tl);
    } else {
        tp__loop_post(ctx->x_loop, &tl->tl_task);
    }
}

// "tcp://HOST:PORT" -> "tcp://HOST:0" (any SCHEME://HOST:PORT).
static void
pl_port0(const char *url, char *out, size_t len)
{
    snprintf(out, len, "%s", url);
    char *colon = strrchr(out, ':');
    char *close = strrchr(out, ']');
    if (colon != NULL && (close == NULL || colon > close) && colon > out + 5) {
        snprintf(colon, len - (size_t)(colon - out), ":0");
    }
}

void
tp__pipe_listener_close(tp_pipe_listener *pl)
{
    if (pl->pl_closed) {
        return;
    }
    pl->pl_closed = true;
    for (size_t i = 0; i < pl->pl_ntls; i++) {
        tp__listener_destroy(pl->pl_tls[i].tl_l);
    }
    for (size_t i = 0; i < pl->pl_nlanes; i++) {
        tp__listener_destroy(pl->pl_lanes[i].tl_l);
    }
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&pl->pl_accepts)) != NULL) {
        tp__aio_finish_status(aio, TP_ECLOSED, "pipe listener %s: closed",
                              pl->pl_addrs[0]);
    }
    tp_pipe *p;
    while ((p = tp__list_pop_first(&pl->pl_ready)) != NULL) {
        p->p_pl = NULL;
        tp__pipe_fail(p, tp__error_new(TP_ECLOSED, 0, NULL,
                                       "pipe listener %s closed before the "
                                       "pipe was accepted",
                                       pl->pl_addrs[0]));
        tp__pipe_release_hold(p); // the user hold nobody took
    }
    // Handshakes still running for this listener fail with it.
    tp_context *ctx = pl->pl_ctx;
    for (tp_pipe *q = tp__list_first(&ctx->x_pipes); q != NULL;) {
        tp_pipe *next = tp__list_next(&ctx->x_pipes, q);
        if (q->p_pl == pl) {
            q->p_pl = NULL;
            tp__pipe_fail(q, tp__error_new(TP_ECLOSED, 0, NULL,
                                           "pipe listener %s closed during "
                                           "the handshake",
                                           pl->pl_addrs[0]));
            tp__pipe_release_hold(q);
        }
        q = next;
    }
    for (pending_conn *pc = tp__list_first(&ctx->x_pending); pc != NULL;
         pc = tp__list_next(&ctx->x_pending, pc)) {
        if (pc->pc_pl == pl) {
            tp__conn_close(pc->pc_conn);
        }
    }
}

typedef struct listen_args {
    tp_pipe_listener *pl;
} listen_args;

static void
listen_start_task(void *arg)
{
    tp_pipe_listener *pl = arg;
    tp__list_append(&pl->pl_ctx->x_listeners, pl);
    for (size_t i = 0; i < pl->pl_ntls; i++) {
        pl_arm(&pl->pl_tls[i]);
    }
    for (size_t i = 0; i < pl->pl_nlanes; i++) {
        pl_arm(&pl->pl_lanes[i]);
    }
}

static void
pl_tl_init(pl_tl *tl, tp_pipe_listener *pl, tp_listener *l, bool lane,
           unsigned idx)
{
    tl->tl_pl = pl;
    tl->tl_l = l;
    tl->tl_lane = lane;
    tl->tl_lane_idx = idx;
    tp__aio_init(&tl->tl_aio, pl_accept_cb, tl);
}

tp_status
tp_context_listen(tp_context *ctx, const char *const *urls, size_t nurls,
                  tp_pipe_listener **l_p, tp_error **err_p)
{
    if (ctx == NULL || l_p == NULL || (nurls > 0 && urls == NULL)) {
        return tp__error_set(err_p, TP_EINVAL, "tp_context_listen: %s is NULL",
                             ctx == NULL   ? "ctx"
                             : l_p == NULL ? "l_p"
                                           : "urls");
    }
    for (size_t i = 0; i < nurls; i++) {
        const char *sep = urls[i] ? strstr(urls[i], "://") : NULL;
        bool known = false;
        for (size_t t = 0; sep != NULL && t < ctx->x_ntr; t++) {
            known = known ||
                    (strlen(ctx->x_tr[t].cb_name) == (size_t)(sep - urls[i]) &&
                     strncmp(ctx->x_tr[t].cb_name, urls[i],
                             (size_t)(sep - urls[i])) == 0 &&
                     ctx->x_tr[t].cb_used);
        }
        if (!known) {
            char *rep = tp_context_report(ctx);
            tp_status st = tp__error_set(
                err_p, TP_EINVAL,
                "context %s: listen on \"%s\": not a URL of a transport this "
                "context uses:\n%s",
                ctx->x_name, urls[i] ? urls[i] : "(null)", rep ? rep : "");
            free(rep);
            return st;
        }
    }
    tp_pipe_listener *pl = tp__zalloc(sizeof(*pl));
    if (pl == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "pipe listener: out of memory");
    }
    pl->pl_ctx = ctx;
    TP_LIST_INIT(&pl->pl_ready, tp_pipe, p_accept_node);
    TP_LIST_INIT(&pl->pl_accepts, tp_aio, a_node);
    tp__task_init(&pl->pl_destroy_task, pl_free_task, pl);
    tp_status st = TP_OK;
    const char *lane_url = NULL;
    for (size_t t = 0; t < ctx->x_ntr; t++) {
        ctx_backend *b = &ctx->x_tr[t];
        if (!b->cb_used) {
            continue;
        }
        const char *url = NULL;
        for (size_t i = 0; i < nurls; i++) {
            if (strncmp(urls[i], b->cb_name, strlen(b->cb_name)) == 0 &&
                strncmp(urls[i] + strlen(b->cb_name), "://", 3) == 0) {
                url = urls[i];
            }
        }
        tp_listener *l = NULL;
        if ((st = tp__transport_listen(b->cb_transport, url, &l, err_p)) !=
            TP_OK) {
            tp__error_wrap(err_p, st, "context %s: listen", ctx->x_name);
            goto fail;
        }
        size_t k = pl->pl_ntls++;
        pl_tl_init(&pl->pl_tls[k], pl, l, false, 0);
        snprintf(pl->pl_addrs[k], sizeof(pl->pl_addrs[k]), "%s",
                 tp__listener_addr(l));
        snprintf(pl->pl_names[k], sizeof(pl->pl_names[k]), "%s", b->cb_name);
        if (b->cb_transport->t_ops == ctx->x_lane_ops) {
            lane_url = pl->pl_addrs[k];
        }
    }
    // mpt lanes listen on the host of the lane transport's listener (the
    // context's first network transport, x_lane_ops), any port.
    for (unsigned i = 0; i < ctx->x_nlanes && lane_url != NULL; i++) {
        char url[TP_WIRE_MAX_ADDR + 1];
        pl_port0(lane_url, url, sizeof(url));
        tp_listener *l = NULL;
        if ((st = tp__transport_listen(ctx->x_lane_tr[i], url, &l, err_p)) !=
            TP_OK) {
            tp__error_wrap(err_p, st, "context %s: mpt lane %u: listen",
                           ctx->x_name, i);
            goto fail;
        }
        pl_tl_init(&pl->pl_lanes[pl->pl_nlanes++], pl, l, true, i);
    }
    tp__ctx_obj_add(ctx);
    tp__loop_call(ctx->x_loop, listen_start_task, pl);
    *l_p = pl;
    return TP_OK;

fail:
    for (size_t i = 0; i < pl->pl_ntls; i++) {
        tp__listener_destroy(pl->pl_tls[i].tl_l);
        tp__aio_fini(&pl->pl_tls[i].tl_aio);
    }
    for (size_t i = 0; i < pl->pl_nlanes; i++) {
        tp__listener_destroy(pl->pl_lanes[i].tl_l);
        tp__aio_fini(&pl->pl_lanes[i].tl_aio);
    }
    tp__free(pl);
    return st;
}

const char *
tp_pipe_listener_addr(const tp_pipe_listener *l, const char *transport)
{
    if (l == NULL) {
        return NULL;
    }
    if (l->pl_ntls == 0) {
        return NULL;
    }
    if (transport == NULL) {
        return l->pl_addrs[0];
    }
    for (size_t i = 0; i < l->pl_ntls; i++) {
        if (strcmp(l->pl_names[i], transport) == 0) {
            return l->pl_addrs[i];
        }
    }
    return NULL;
}

size_t
tp_pipe_listener_addrs(const tp_pipe_listener *l, const char **addrs,
                       size_t max)
{
    if (l == NULL) {
        return 0;
    }
    // The first transport with the network property leads; the others
    // follow in the context's order (best first).
    size_t lead = l->pl_ntls;
    for (size_t i = 0; i < l->pl_ntls && lead == l->pl_ntls; i++) {
        const tp_transport_ops *ops = tp__transport_find(l->pl_names[i]);
        if (ops != NULL && (ops->props & TP_TRANSPORT_PROP_NETWORK) != 0) {
            lead = i;
        }
    }
    size_t n = 0;
    if (lead < l->pl_ntls) {
        if (n < max) {
            addrs[n] = l->pl_addrs[lead];
        }
        n++;
    }
    for (size_t i = 0; i < l->pl_ntls; i++) {
        if (i != lead) {
            if (n < max) {
                addrs[n] = l->pl_addrs[i];
            }
            n++;
        }
    }
    return n;
}

// Mpt lane listener addresses, for the answer (in lane order).
const char *
tp__listener_lane_addr(const tp_pipe_listener *l, unsigned i)
{
    return i < l->pl_nlanes ? tp__listener_addr(l->pl_lanes[i].tl_l) : NULL;
}

static void
pl_accept_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tp_pipe_listener *pl = arg;
    if (!tp__list_node_active(&aio->a_node)) {
        return;
    }
    tp__list_remove(&pl->pl_accepts, aio);
    tp__aio_finish_status(aio, reason, "pipe listener %s: accept %s",
                          pl->pl_addrs[0],
                          reason == TP_ETIMEDOUT ? "timed out" : "canceled");
}

static void
pl_accept_start(void *obj, tp_aio *aio)
{
    tp_pipe_listener *pl = obj;
    if (!tp__aio_begin(aio, pl->pl_ctx->x_loop, pl_accept_cancel, pl)) {
        return;
    }
    if (pl->pl_closed) {
        tp__aio_finish_status(aio, TP_ECLOSED, "pipe listener %s: closed",
                              pl->pl_addrs[0]);
        return;
    }
    tp_pipe *p = tp__list_pop_first(&pl->pl_ready);
    if (p != NULL) {
        tp__aio_set_output(aio, 0, p);
        tp__aio_finish(aio, NULL, 0);
        return;
    }
    tp__list_append(&pl->pl_accepts, aio);
}

void
tp_pipe_listener_accept(tp_pipe_listener *l, tp_aio *aio)
{
    tp__aio_submit(aio, l->pl_ctx->x_loop, pl_accept_start, l);
}

void
tp__listener_pipe_ready(tp_pipe_listener *pl, tp_pipe *p)
{
    p->p_pl = NULL;
    tp_aio *aio = tp__list_pop_first(&pl->pl_accepts);
    if (aio != NULL) {
        tp__aio_set_output(aio, 0, p);
        tp__aio_finish(aio, NULL, 0);
        return;
    }
    tp__list_append(&pl->pl_ready, p);
}

void
tp__listener_pipe_gone(tp_pipe_listener *pl, tp_pipe *p)
{
    if (tp__list_node_active(&p->p_accept_node)) {
        tp__list_remove(&pl->pl_ready, p);
    }
}

static void
pl_destroy_task(void *arg)
{
    tp_pipe_listener *pl = arg;
    if (tp__list_node_active(&pl->pl_node)) {
        tp__list_remove(&pl->pl_ctx->x_listeners, pl);
    }
    pl->pl_destroy_req = true;
    tp__pipe_listener_close(pl);
    tp__pipe_listener_maybe_free(pl);
}

void
tp_pipe_listener_destroy(tp_pipe_listener *l)
{
    if (l == NULL) {
        return;
    }
    tp_context *ctx = l->pl_ctx;
    // Closed by the context already: it frees itself once quiet.
    tp__loop_call(ctx->x_loop, pl_destroy_task, l);
}

// ---- the first frame of an accepted connection ---------------------------

static void pending_cb(void *arg);

static void
pending_free_task(void *arg)
{
    pending_conn *pc = arg;
    tp_context *ctx = pc->pc_ctx;
    tp__aio_fini(&pc->pc_aio);
    tp__free(pc->pc_body);
    tp__free(pc);
    tp__ctx_obj_done(ctx);
}

static void
pending_end(pending_conn *pc, tp_conn *keep)
{
    tp_context *ctx = pc->pc_ctx;
    tp__list_remove(&ctx->x_pending, pc);
    if (pc->pc_pl != NULL) {
        pc->pc_pl->pl_busy--;
        tp__pipe_listener_maybe_free(pc->pc_pl);
    }
    if (keep == NULL) {
        tp__conn_close(pc->pc_conn);
        tp__conn_unref(pc->pc_conn);
    }
    tp__task_init(&pc->pc_task, pending_free_task, pc);
    tp__loop_defer(ctx->x_loop, &pc->pc_task);
}

static void
pending_reject(pending_conn *pc, const char *fmt, const char *detail)
{
    TP_LOG_WARN(
        "TP-PIPE-PROTO", "pipe listener: connection from %s (%s): %s%s; closed",
        tp__conn_peer(pc->pc_conn),
        pc->pc_lane ? "mpt lane" : pc->pc_conn->c_transport->t_ops->name, fmt,
        detail ? detail : "");
    pending_end(pc, NULL);
}

static void
pending_read(pending_conn *pc, void *buf, uint64_t len)
{
    tp_iov iov = {buf, len};
    tp_aio_set_iov(&pc->pc_aio, 1, &iov);
    tp_aio_set_timeout(&pc->pc_aio, pc->pc_ctx->x_cfg.handshake_timeout_ms);
    tp__conn_read(pc->pc_conn, &pc->pc_aio);
}

static void
pending_step_task(void *arg)
{
    pending_conn *pc = arg;
    tp_context *ctx = pc->pc_ctx;
    if (tp_aio_status(&pc->pc_aio) != TP_OK) {
        pending_reject(pc, "no first frame: ",
                       tp_error_message(tp_aio_error(&pc->pc_aio)));
        return;
    }
    if (ctx->x_closing || (pc->pc_pl != NULL && pc->pc_pl->pl_closed)) {
        pending_end(pc, NULL);
        return;
    }
    if (pc->pc_step == 0) {
        tp__frame_hdr h;
        tp_error *err = NULL;
        if (tp__frame_hdr_decode(pc->pc_hdr, &h, &err) != TP_OK) {
            pending_reject(pc, "bad frame header: ", tp_error_message(err));
            tp_error_unref(err);
            return;
        }
        bool ok = (h.fh_type == TP_FRAME_BROCHURE && !pc->pc_lane &&
                   h.fh_body_len <= TP_WIRE_MAX_HANDSHAKE) ||
                  (h.fh_type == TP_FRAME_JOIN && h.fh_body_len == TP_JOIN_LEN);
        if (!ok) {
            char d[96];
            snprintf(d, sizeof(d), "type %u, %llu bytes", h.fh_type,
                     (unsigned long long)h.fh_body_len);
            pending_reject(pc, "unexpected first frame: ", d);
            return;
        }
        pc->pc_body_len = h.fh_body_len;
        pc->pc_body = tp__alloc(h.fh_body_len ? h.fh_body_len : 1);
        if (pc->pc_body == NULL) {
            pending_reject(pc, "out of memory", NULL);
            return;
        }
        pc->pc_step = (h.fh_type == TP_FRAME_BROCHURE) ? 1 : 2;
        pending_read(pc, pc->pc_body, pc->pc_body_len);
        return;
    }
    if (pc->pc_step == 1) {
        tp_conn *conn = pc->pc_conn;
        tp__pipe_accept_brochure(ctx, pc->pc_pl, conn, pc->pc_body,
                                 pc->pc_body_len);
        pending_end(pc, conn);
        return;
    }
    uint64_t reg;
    uint16_t idx;
    tp_error *err = NULL;
    if (tp__join_decode(pc->pc_body, pc->pc_body_len, &reg, &idx, &err) !=
        TP_OK) {
        pending_reject(pc, "bad join: ", tp_error_message(err));
        tp_error_unref(err);
        return;
    }
    if (!tp__pipe_join(ctx, reg, idx, pc->pc_conn, pc->pc_lane,
                       pc->pc_lane_idx)) {
        pending_reject(pc, "join names no pipe in its handshake", NULL);
        return;
    }
    pending_end(pc, pc->pc_conn);
}

static void
pending_cb(void *arg)
{
    pending_conn *pc = arg;
    tp__task_init(&pc->pc_task, pending_step_task, pc);
    if (tp__loop_on_thread(pc->pc_ctx->x_loop)) {
        pending_step_task(pc);
    } else {
        // A lane conn completes on its lane loop; pc is freed on x_loop
        // by tp__aio_fini, which waits for this callback to be over.
        tp__loop_post(pc->pc_ctx->x_loop, &pc->pc_task);
    }
}

static void
pending_start(tp_context *ctx, tp_pipe_listener *pl, tp_conn *conn, bool lane,
              unsigned lane_idx)
{
    pending_conn *pc = tp__zalloc(sizeof(*pc));
    if (pc == NULL) {
        TP_LOG_WARN("TP-PIPE-ACCEPT",
                    "pipe listener: connection from %s dropped: out of "
                    "memory",
                    tp__conn_peer(conn));
        tp__conn_unref(conn);
        return;
    }
    pc->pc_ctx = ctx;
    pc->pc_pl = pl;
    pc->pc_conn = conn;
    pc->pc_lane = lane;
    pc->pc_lane_idx = lane_idx;
    tp__aio_init(&pc->pc_aio, pending_cb, pc);
    tp__ctx_obj_add(ctx);
    tp__list_append(&ctx->x_pending, pc);
    pl->pl_busy++;
    pending_read(pc, pc->pc_hdr, TP_FRAME_HDR_LEN);
}
