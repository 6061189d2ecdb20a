// SPDX-License-Identifier: Apache-2.0
// pipe.c - the pipe: both halves of the handshake (brochure, answer,
// joins), the choice of transport and channel and its report, the write
// and read engines, and failure (one pipe at a time).
//
// Everything runs on the context's loop thread (x_loop). p_busy counts
// the internal operations in flight (main/extra connection I/O, channel
// ops); a failed pipe is freed from the context only once it is zero, so
// no callback ever finds it gone.

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "pipe_impl.h"

#define PIPE_COALESCE_MAX 65536u // payload bytes copied after a descriptor

const char *tp__listener_lane_addr(const tp_pipe_listener *l, unsigned i);

// ---- handshake state of the connecting side ------------------------------

typedef struct hs_extra {
    struct tp_pipe_hs *he_hs;
    unsigned he_idx;
    tp_aio he_aio;
    tp_conn *he_conn;
    uint8_t he_frame[TP_FRAME_HDR_LEN + TP_JOIN_LEN];
    int he_step; // 0 connect, 1 join written
    tp_task he_task;
} hs_extra;

struct tp_pipe_hs {
    tp_pipe *h_pipe;
    tp_transport *h_tr0; // the transport of the URL
    tp_conn *h_conn0;    // the first connection (brochure, answer)
    tp_aio h_aio;
    int h_step;
    uint8_t *h_buf;
    uint64_t h_len;
    uint8_t h_hdr[TP_FRAME_HDR_LEN];
    tp__answer h_ans;
    tp_conn *h_main; // upgraded main connection
    uint8_t h_join[TP_FRAME_HDR_LEN + TP_JOIN_LEN];
    hs_extra *h_extras;
    unsigned h_nextra_done;
};

enum {
    HS_CONNECT = 0,
    HS_BROCHURE = 1,
    HS_ANS_HDR = 2,
    HS_ANS_BODY = 3,
    HS_MAIN_CONNECT = 4,
    HS_MAIN_JOIN = 5,
    HS_EXTRAS = 6,
};

static void pipe_ready(tp_pipe *p);
static void pipe_hs_timeout(tp_timer *t, void *arg);
static void pipe_raio_cb(void *arg);
static void pipe_write_pump(tp_pipe *p);
static void pipe_read_pump(tp_pipe *p);
static void pipe_check_drained(tp_pipe *p);

// ---- lifetime
// ----------------------------------------------------------------

static void
pipe_free(tp_pipe *p)
{
    tp_error_unref(p->p_err);
    tp__mtx_fini(&p->p_mtx);
    tp__cv_fini(&p->p_cv);
    tp__free(p);
}

void
tp__pipe_release_hold(tp_pipe *p)
{
    if (atomic_fetch_sub_explicit(&p->p_holds, 1, memory_order_acq_rel) == 1) {
        pipe_free(p);
    }
}

tp_pipe *
tp__pipe_new(tp_context *ctx)
{
    tp_pipe *p = tp__zalloc(sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    p->p_ctx = ctx;
    TP_LIST_INIT(&p->p_writes, pipe_wop, w_node);
    TP_LIST_INIT(&p->p_reads, pipe_rop, r_node);
    TP_LIST_INIT(&p->p_rdesc, tp_aio, a_node);
    tp__mtx_init(&p->p_mtx);
    tp__cv_init(&p->p_cv);
    atomic_init(&p->p_holds, 2); // the user's, and "live in the context"
    atomic_init(&p->p_urefs, 1);
    atomic_init(&p->p_ctx_dead, false);
    atomic_init(&p->p_close_posted, false);
    atomic_init(&p->p_pub_state, PIPE_HS);
    p->p_state = PIPE_HS;
    tp__timer_init(&p->p_hs_timer, pipe_hs_timeout, p);
    tp__aio_init(&p->p_raio, pipe_raio_cb, p);
    tp__ctx_obj_add(ctx);
    tp__list_append(&ctx->x_pipes, p);
    return p;
}

static void
pipe_publish_state(tp_pipe *p)
{
    tp__mtx_lock(&p->p_mtx);
    atomic_store_explicit(&p->p_pub_state, p->p_state, memory_order_release);
    tp__cv_broadcast(&p->p_cv);
    tp__mtx_unlock(&p->p_mtx);
}

static void
pipe_busy_done(tp_pipe *p)
{
    TP_ASSERT(p->p_busy > 0);
    p->p_busy--;
    if (p->p_state == PIPE_FAILED) {
        pipe_check_drained(p);
    }
}

// ---- failure ---------------------------------------------------------------

static void pipe_flush_writes(tp_pipe *p);
static void pipe_flush_reads(tp_pipe *p);

void
tp__pipe_fail(tp_pipe *p, tp_error *err)
{
    if (p->p_state == PIPE_FAILED) {
        tp_error_unref(err);
        return;
    }
    bool was_ready = p->p_state == PIPE_READY;
    p->p_state = PIPE_FAILED;
    p->p_err = err;
    TP_LOG_DEBUG("TP-PIPE-FAIL", "pipe to %s failed: %s", p->p_peer,
                 tp_error_message(err));
    tp__timer_stop(p->p_ctx->x_loop, &p->p_hs_timer);
    if (p->p_chan != NULL) {
        p->p_chops->close(p->p_chan, err);
    }
    if (p->p_conn != NULL) {
        tp__conn_close(p->p_conn);
    }
    for (unsigned i = 0; i < p->p_nextra; i++) {
        if (p->p_extra != NULL && p->p_extra[i] != NULL) {
            tp__conn_close(p->p_extra[i]);
        }
    }
    tp_pipe_hs *hs = p->p_hs;
    if (hs != NULL) {
        if (hs->h_conn0 != NULL) {
            tp__conn_close(hs->h_conn0);
        }
        if (hs->h_main != NULL) {
            tp__conn_close(hs->h_main);
        }
        tp_aio_cancel(&hs->h_aio);
        for (unsigned i = 0; hs->h_extras != NULL && i < hs->h_ans.a_nconns;
             i++) {
            if (hs->h_extras[i].he_conn != NULL) {
                tp__conn_close(hs->h_extras[i].he_conn);
            }
            tp_aio_cancel(&hs->h_extras[i].he_aio);
        }
    }
    // Waiting descriptor reads fail now; the active one when its read ends.
    tp_aio *aio;
    while ((aio = tp__list_pop_first(&p->p_rdesc)) != NULL) {
        tp__aio_finish(aio, tp_error_ref(err), 0);
    }
    (void)was_ready;
    pipe_flush_writes(p);
    pipe_flush_reads(p);
    pipe_publish_state(p);
    pipe_check_drained(p);
}

static tp_error *
pipe_err(tp_pipe *p, tp_status st, const tp_error *cause, const char *what)
{
    return tp__error_new(st, 0, cause, "pipe to %s: %s", p->p_peer, what);
}

static void
pipe_free_task(void *arg)
{
    tp_pipe *p = arg;
    tp_context *ctx = p->p_ctx;
    if (p->p_chan != NULL) {
        p->p_chops->destroy(p->p_chan);
        p->p_chan = NULL;
    }
    tp__conn_unref(p->p_conn);
    for (unsigned i = 0; i < p->p_nextra; i++) {
        if (p->p_extra != NULL) {
            tp__conn_unref(p->p_extra[i]);
        }
    }
    tp__free(p->p_extra);
    tp__free(p->p_reg_extra);
    tp_pipe_hs *hs = p->p_hs;
    if (hs != NULL) {
        tp__aio_fini(&hs->h_aio);
        tp__conn_unref(hs->h_conn0);
        tp__conn_unref(hs->h_main);
        for (unsigned i = 0; hs->h_extras != NULL && i < hs->h_ans.a_nconns;
             i++) {
            tp__aio_fini(&hs->h_extras[i].he_aio);
            tp__conn_unref(hs->h_extras[i].he_conn);
        }
        tp__free(hs->h_extras);
        tp__free(hs->h_buf);
        tp__free(hs);
        p->p_hs = NULL;
    }
    tp__aio_fini(&p->p_raio);
    tp__free(p->p_rbody);
    // p_rmsg, a descriptor delivered whose tp_pipe_read never came, is the
    // caller's (tp_pipe_read_descriptor gave it away): not freed here.
    p->p_rmsg = NULL;
    tp__free(p->p_rinfos);
    atomic_store_explicit(&p->p_ctx_dead, true, memory_order_release);
    if (p->p_pl != NULL) {
        tp__listener_pipe_gone(p->p_pl, p);
        p->p_pl = NULL;
        tp__pipe_release_hold(p); // nobody accepted it
    }
    tp__pipe_release_hold(p); // live
    tp__ctx_obj_done(ctx);
}

static void
pipe_check_drained(tp_pipe *p)
{
    if (p->p_state != PIPE_FAILED || p->p_busy > 0 ||
        !tp__list_empty(&p->p_writes) || !tp__list_empty(&p->p_reads) ||
        p->p_rdesc_active != NULL || !tp__list_node_active(&p->p_ctx_node)) {
        return;
    }
    tp__list_remove(&p->p_ctx->x_pipes, p);
    tp__task_init(&p->p_close_task, pipe_free_task, p);
    tp__loop_defer(p->p_ctx->x_loop, &p->p_close_task);
}

// ---- reports
// -----------------------------------------------------------------

static void
pipe_log_report(tp_pipe *p)
{
    TP_LOG_DEBUG("TP-PIPE-CHOICE", "%s", p->p_report);
}

// ---- choosing (accepting side)
// -----------------------------------------------

static const tp__brochure_entry *
brochure_find(const tp__brochure_entry *e, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(e[i].be_name, name) == 0) {
            return &e[i];
        }
    }
    return NULL;
}

// Picks the transport and channel for brochure @b; fills p_report and the
// compact notes sent to the peer. Returns false with @why if none fits.
static bool
pipe_choose(tp_pipe *p, tp_pipe_listener *pl, const tp__brochure *b,
            char *notes, size_t notes_len, char *why, size_t why_len)
{
    tp_context *ctx = p->p_ctx;
    char *rep = p->p_report;
    size_t cap = sizeof(p->p_report);
    notes[0] = '\0';
    for (size_t i = 0; i < ctx->x_ntr; i++) {
        ctx_backend *t = &ctx->x_tr[i];
        const tp__brochure_entry *e =
            brochure_find(b->b_transports, b->b_ntransports, t->cb_name);
        const char *addr = tp_pipe_listener_addr(pl, t->cb_name);
        if (!t->cb_used) {
            tp__report_add(rep, cap, "transport %s: %s\n", t->cb_name,
                           t->cb_why);
        } else if (p->p_tr != NULL) {
            tp__report_add(rep, cap,
                           "transport %s: usable, lower priority than "
                           "%s\n",
                           t->cb_name, p->p_tr->cb_name);
            tp__report_add(notes, notes_len, "%s: lower priority; ",
                           t->cb_name);
        } else if (e == NULL) {
            tp__report_add(rep, cap,
                           "transport %s: the peer does not offer it "
                           "(not registered, allowed or viable there)\n",
                           t->cb_name);
        } else if (strcmp(e->be_domain, t->cb_domain) != 0) {
            tp__report_add(rep, cap,
                           "transport %s: domain descriptors differ "
                           "(ours \"%s\", peer's \"%s\")\n",
                           t->cb_name, t->cb_domain, e->be_domain);
            tp__report_add(notes, notes_len, "%s: domains differ; ",
                           t->cb_name);
        } else if (addr == NULL) {
            tp__report_add(rep, cap,
                           "transport %s: this listener does not listen "
                           "on it\n",
                           t->cb_name);
        } else {
            p->p_tr = t;
            tp__report_add(rep, cap, "transport %s: chosen\n", t->cb_name);
        }
    }
    if (p->p_tr == NULL) {
        snprintf(why, why_len, "no transport both ends can use");
        return false;
    }
    for (size_t i = 0; i < ctx->x_nch; i++) {
        ctx_backend *c = &ctx->x_ch[i];
        const tp__brochure_entry *e =
            brochure_find(b->b_channels, b->b_nchannels, c->cb_name);
        bool lanes = false;
        if (c->cb_used) {
            c->cb_channel_ops->nconns(&ctx->x_cfg, &lanes);
        }
        if (!c->cb_used) {
            tp__report_add(rep, cap, "channel %s: %s\n", c->cb_name, c->cb_why);
        } else if (p->p_ch != NULL) {
            tp__report_add(rep, cap,
                           "channel %s: usable, lower priority than "
                           "%s\n",
                           c->cb_name, p->p_ch->cb_name);
            tp__report_add(notes, notes_len, "%s: lower priority; ",
                           c->cb_name);
        } else if (e == NULL) {
            tp__report_add(rep, cap,
                           "channel %s: the peer does not offer it "
                           "(not registered, allowed or viable there)\n",
                           c->cb_name);
        } else if (strcmp(e->be_domain, c->cb_domain) != 0) {
            tp__report_add(rep, cap,
                           "channel %s: domain descriptors differ "
                           "(ours \"%s\", peer's \"%s\")\n",
                           c->cb_name, c->cb_domain, e->be_domain);
            tp__report_add(notes, notes_len, "%s: domains differ; ",
                           c->cb_name);
        } else if (lanes && p->p_tr->cb_transport->t_ops->same_host) {
            tp__report_add(rep, cap,
                           "channel %s: not over transport %s (same-host "
                           "memory beats tcp lanes)\n",
                           c->cb_name, p->p_tr->cb_name);
            tp__report_add(notes, notes_len, "%s: not over %s; ", c->cb_name,
                           p->p_tr->cb_name);
        } else if (lanes && pl->pl_nlanes == 0) {
            tp__report_add(rep, cap, "channel %s: this listener has no lanes\n",
                           c->cb_name);
        } else {
            p->p_ch = c;
            tp__report_add(rep, cap, "channel %s: chosen\n", c->cb_name);
        }
    }
    if (p->p_ch == NULL) {
        snprintf(why, why_len, "no channel both ends can use");
        return false;
    }
    return true;
}

// ---- the accepting side of the handshake
// -------------------------------------

typedef struct ans_write {
    tp_pipe *aw_pipe;
    tp_aio aw_aio;
    uint8_t *aw_buf;
    tp_conn *aw_conn;
    bool aw_refuse;
    tp_task aw_task;
} ans_write;

static void
ans_free_task(void *arg)
{
    ans_write *aw = arg;
    tp__aio_fini(&aw->aw_aio);
    tp__free(aw->aw_buf);
    tp__free(aw);
}

static void
ans_written_cb(void *arg)
{
    ans_write *aw = arg;
    tp_pipe *p = aw->aw_pipe;
    if (aw->aw_refuse) {
        tp__conn_close(aw->aw_conn);
        tp__conn_unref(aw->aw_conn);
    } else {
        if (tp_aio_status(&aw->aw_aio) != TP_OK && p->p_state != PIPE_FAILED) {
            tp__pipe_fail(p, pipe_err(p, tp_aio_status(&aw->aw_aio),
                                      tp_aio_error(&aw->aw_aio),
                                      "writing the handshake answer"));
        }
        pipe_busy_done(p);
    }
    tp__task_init(&aw->aw_task, ans_free_task, aw);
    tp__loop_defer(aw->aw_conn->c_transport->t_loop, &aw->aw_task);
}

static void
send_answer(tp_context *ctx, tp_pipe *p, tp_conn *conn, const tp__answer *a)
{
    ans_write *aw = tp__zalloc(sizeof(*aw));
    size_t n = tp__answer_size(a);
    uint8_t *buf = aw ? tp__alloc(TP_FRAME_HDR_LEN + n) : NULL;
    if (buf == NULL || tp__answer_encode(a, buf + TP_FRAME_HDR_LEN, n) != n) {
        tp__free(buf);
        tp__free(aw);
        if (p != NULL) {
            tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL,
                                      "encoding the handshake answer"));
        } else {
            tp__conn_close(conn);
            tp__conn_unref(conn);
        }
        return;
    }
    tp__frame_hdr h = {TP_FRAME_ANSWER, TP_PIPE_WIRE_VERSION, 0, n};
    tp__frame_hdr_encode(buf, &h);
    aw->aw_pipe = p;
    aw->aw_buf = buf;
    aw->aw_conn = conn;
    aw->aw_refuse = (p == NULL);
    tp__aio_init(&aw->aw_aio, ans_written_cb, aw);
    tp_iov iov = {buf, TP_FRAME_HDR_LEN + n};
    tp_aio_set_iov(&aw->aw_aio, 1, &iov);
    tp_aio_set_timeout(&aw->aw_aio, ctx->x_cfg.handshake_timeout_ms);
    if (p != NULL) {
        p->p_busy++;
    }
    tp__conn_write(conn, &aw->aw_aio);
}

static void
pipe_hs_timeout(tp_timer *t, void *arg)
{
    (void)t;
    tp_pipe *p = arg;
    char what[160];
    snprintf(
        what, sizeof(what),
        "handshake did not finish within %lld ms (TP_HANDSHAKE_TIMEOUT_MS)",
        (long long)p->p_ctx->x_cfg.handshake_timeout_ms);
    tp__pipe_fail(p, pipe_err(p, TP_ETIMEDOUT, NULL, what));
}

static void
pipe_arm_hs_timer(tp_pipe *p, int64_t ms)
{
    tp__timer_start(p->p_ctx->x_loop, &p->p_hs_timer,
                    tp__deadline_after_ms(ms));
}

void
tp__pipe_accept_brochure(tp_context *ctx, tp_pipe_listener *pl, tp_conn *conn,
                         const uint8_t *body, uint64_t len)
{
    tp__brochure *b = tp__alloc(sizeof(*b));
    tp__answer *a = tp__zalloc(sizeof(*a));
    tp_error *err = NULL;
    if (b == NULL || a == NULL) {
        TP_LOG_WARN("TP-PIPE-ACCEPT",
                    "pipe listener: connection from %s "
                    "dropped: out of memory",
                    tp__conn_peer(conn));
        goto drop;
    }
    if (tp__brochure_decode(body, len, b, &err) != TP_OK) {
        TP_LOG_WARN("TP-PIPE-PROTO",
                    "pipe listener: connection from %s (%s): protocol "
                    "error: %s; closed",
                    tp__conn_peer(conn), conn->c_transport->t_ops->name,
                    tp_error_message(err));
        tp_error_unref(err);
        goto drop;
    }
    snprintf(a->a_ctxname, sizeof(a->a_ctxname), "%s", ctx->x_name);
    tp_pipe *p = tp__pipe_new(ctx);
    if (p == NULL) {
        goto drop;
    }
    p->p_listener_side = true;
    p->p_pl = pl;
    snprintf(p->p_peer, sizeof(p->p_peer), "%s at %s://%s", b->b_ctxname,
             conn->c_transport->t_ops->name, tp__conn_peer(conn));
    snprintf(p->p_url, sizeof(p->p_url), "%s://%s",
             conn->c_transport->t_ops->name, tp__conn_peer(conn));
    char why[160];
    p->p_report[0] = '\0';
    if (!pipe_choose(p, pl, b, a->a_reason, sizeof(a->a_reason), why,
                     sizeof(why))) {
        a->a_accepted = false;
        int w = snprintf(a->a_reason, sizeof(a->a_reason), "%s at %s: ", why,
                         ctx->x_name);
        // As much of our report as fits, its lines joined with "; ": it
        // says why each one failed. Each line stops at its first '(' or
        // '"': what follows may be a domain descriptor, uids or namespace
        // ids, which the peer must not learn (the log below has them).
        bool cut = false;
        for (const char *q = p->p_report;
             *q != '\0' && w > 0 && (size_t)w + 2 < sizeof(a->a_reason); q++) {
            if (*q == '\n') {
                while (a->a_reason[w - 1] == ' ') {
                    w--;
                }
                a->a_reason[w++] = ';';
                a->a_reason[w++] = ' ';
                cut = false;
            } else if (cut || *q == '(' || *q == '"') {
                cut = true;
            } else {
                a->a_reason[w++] = *q;
            }
            a->a_reason[w] = '\0';
        }
        TP_LOG_WARN("TP-PIPE-REFUSE", "pipe from %s refused: %s\n%s", p->p_peer,
                    why, p->p_report);
        send_answer(ctx, NULL, conn, a);
        p->p_pl = NULL;
        tp__pipe_fail(p, pipe_err(p, TP_EUNREACHABLE, NULL, why));
        tp__pipe_release_hold(p); // never given to a user
        tp__free(b);
        tp__free(a);
        return;
    }
    {
        char lines[TP_REPORT_LEN];
        snprintf(lines, sizeof(lines), "%s", p->p_report);
        p->p_report[0] = '\0';
        tp__report_add(p->p_report, sizeof(p->p_report),
                       "pipe from %s: transport %s, channel %s\n", p->p_peer,
                       p->p_tr->cb_name, p->p_ch->cb_name);
        tp__report_add(p->p_report, sizeof(p->p_report), "%s", lines);
    }
    p->p_chops = p->p_ch->cb_channel_ops;
    a->a_accepted = true;
    snprintf(a->a_transport, sizeof(a->a_transport), "%s", p->p_tr->cb_name);
    snprintf(a->a_channel, sizeof(a->a_channel), "%s", p->p_ch->cb_name);
    if (strcmp(p->p_tr->cb_name, conn->c_transport->t_ops->name) == 0) {
        a->a_transport_reg_id = 0;
        p->p_conn = conn;
    } else {
        p->p_reg_main = tp__random_u64();
        a->a_transport_reg_id = p->p_reg_main;
        snprintf(a->a_transport_addr, sizeof(a->a_transport_addr), "%s",
                 tp_pipe_listener_addr(pl, p->p_tr->cb_name));
        p->p_hs = tp__zalloc(sizeof(*p->p_hs));
        if (p->p_hs == NULL) {
            tp__conn_close(conn);
            tp__conn_unref(conn);
            tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL, "handshake"));
            goto out;
        }
        p->p_hs->h_pipe = p;
        tp__aio_init(&p->p_hs->h_aio, NULL, NULL);
        p->p_hs->h_conn0 = conn; // kept until the main join arrives
    }
    bool lanes = false;
    unsigned n = p->p_chops->nconns(&ctx->x_cfg, &lanes);
    if (lanes) {
        n = (unsigned)pl->pl_nlanes;
    }
    p->p_nextra = n;
    p->p_extra = n ? tp__zalloc(n * sizeof(*p->p_extra)) : NULL;
    p->p_reg_extra = n ? tp__zalloc(n * sizeof(*p->p_reg_extra)) : NULL;
    if (n > 0 && (p->p_extra == NULL || p->p_reg_extra == NULL)) {
        tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL, "handshake"));
        goto out;
    }
    a->a_nconns = (uint16_t)n;
    for (unsigned i = 0; i < n; i++) {
        p->p_reg_extra[i] = tp__random_u64();
        a->a_conns[i].ac_reg_id = p->p_reg_extra[i];
        snprintf(a->a_conns[i].ac_addr, sizeof(a->a_conns[i].ac_addr), "%s",
                 lanes ? tp__listener_lane_addr(pl, i)
                       : tp_pipe_listener_addr(pl, p->p_tr->cb_name));
    }
    pipe_arm_hs_timer(p, ctx->x_cfg.handshake_timeout_ms);
    send_answer(ctx, p, conn, a);
    if (p->p_state == PIPE_HS && p->p_reg_main == 0 && n == 0) {
        pipe_ready(p);
    }
out:
    tp__free(b);
    tp__free(a);
    return;
drop:
    tp__free(b);
    tp__free(a);
    tp__conn_close(conn);
    tp__conn_unref(conn);
}

bool
tp__pipe_join(tp_context *ctx, uint64_t reg_id, uint16_t index, tp_conn *conn,
              bool lane, unsigned lane_idx)
{
    for (tp_pipe *p = tp__list_first(&ctx->x_pipes); p != NULL;
         p = tp__list_next(&ctx->x_pipes, p)) {
        if (p->p_state != PIPE_HS || !p->p_listener_side) {
            continue;
        }
        if (p->p_reg_main != 0 && reg_id == p->p_reg_main && !lane &&
            p->p_conn == NULL &&
            strcmp(conn->c_transport->t_ops->name, p->p_tr->cb_name) == 0) {
            p->p_conn = conn;
            // The first connection has served its purpose.
            tp__conn_close(p->p_hs->h_conn0);
        } else {
            bool found = false;
            for (unsigned i = 0; i < p->p_nextra && !found; i++) {
                found = p->p_reg_extra[i] == reg_id && i == index &&
                        p->p_extra[i] == NULL;
            }
            // A lane's join must come in on that lane's listener, any
            // other extra connection on the pipe's transport (its loop is
            // the one the channel runs on).
            bool lanes = false;
            p->p_chops->nconns(&ctx->x_cfg, &lanes);
            if (found && (lanes ? (!lane || lane_idx != index)
                                : (lane || conn->c_transport !=
                                               p->p_tr->cb_transport))) {
                found = false;
            }
            if (!found) {
                continue;
            }
            p->p_extra[index] = conn;
            p->p_extra_got++;
        }
        if ((p->p_reg_main == 0 || p->p_conn != NULL) &&
            p->p_extra_got == p->p_nextra) {
            pipe_ready(p);
        }
        return true;
    }
    return false;
}

// ---- the connecting side of the handshake
// ------------------------------------

static void hs_step(tp_pipe *p);

static void
hs_fail(tp_pipe *p, tp_status st, const tp_error *cause, const char *what)
{
    tp__pipe_fail(p, pipe_err(p, st, cause, what));
}

static void
hs_cb(void *arg)
{
    tp_pipe *p = arg;
    tp_pipe_hs *hs = p->p_hs;
    if (p->p_state != PIPE_HS) {
        // Failed meanwhile: a connection that came in anyway is closed
        // here and released with the pipe.
        if (tp_aio_status(&hs->h_aio) == TP_OK &&
            (hs->h_step == HS_CONNECT || hs->h_step == HS_MAIN_CONNECT)) {
            tp_conn *c = tp_aio_get_output(&hs->h_aio, 0);
            if (hs->h_step == HS_CONNECT) {
                hs->h_conn0 = c;
            } else {
                hs->h_main = c;
            }
            tp__conn_close(c);
        }
        pipe_busy_done(p);
        return;
    }
    pipe_busy_done(p);
    hs_step(p);
}

static void
hs_submit_read(tp_pipe *p, tp_conn *c, void *buf, uint64_t len)
{
    tp_pipe_hs *hs = p->p_hs;
    tp_iov iov = {buf, len};
    tp_aio_set_iov(&hs->h_aio, 1, &iov);
    p->p_busy++;
    tp__conn_read(c, &hs->h_aio);
}

static void
hs_submit_write(tp_pipe *p, tp_conn *c, void *buf, uint64_t len)
{
    tp_pipe_hs *hs = p->p_hs;
    tp_iov iov = {buf, len};
    tp_aio_set_iov(&hs->h_aio, 1, &iov);
    p->p_busy++;
    tp__conn_write(c, &hs->h_aio);
}

static void hs_extra_cb(void *arg);

static void
hs_extra_task(void *arg)
{
    hs_extra *he = arg;
    tp_pipe_hs *hs = he->he_hs;
    tp_pipe *p = hs->h_pipe;
    if (p->p_state != PIPE_HS) {
        // Failed meanwhile: keep a connection that came in anyway so the
        // pipe releases it (pipe_free_task), and close it now.
        if (he->he_step == 0 && tp_aio_status(&he->he_aio) == TP_OK) {
            he->he_conn = tp_aio_get_output(&he->he_aio, 0);
            tp__conn_close(he->he_conn);
        }
        pipe_busy_done(p);
        return;
    }
    pipe_busy_done(p);
    if (tp_aio_status(&he->he_aio) != TP_OK) {
        char what[96];
        snprintf(what, sizeof(what), "%s connection %u of channel %s",
                 he->he_step == 0 ? "opening" : "joining", he->he_idx,
                 p->p_ch->cb_name);
        hs_fail(p, tp_aio_status(&he->he_aio), tp_aio_error(&he->he_aio), what);
        return;
    }
    if (he->he_step == 0) {
        he->he_conn = tp_aio_get_output(&he->he_aio, 0);
        he->he_step = 1;
        tp__frame_hdr h = {TP_FRAME_JOIN, TP_PIPE_WIRE_VERSION, 0, TP_JOIN_LEN};
        tp__frame_hdr_encode(he->he_frame, &h);
        tp__join_encode(hs->h_ans.a_conns[he->he_idx].ac_reg_id,
                        (uint16_t)he->he_idx, he->he_frame + TP_FRAME_HDR_LEN);
        tp_iov iov = {he->he_frame, sizeof(he->he_frame)};
        tp_aio_set_iov(&he->he_aio, 1, &iov);
        p->p_busy++;
        tp__conn_write(he->he_conn, &he->he_aio);
        return;
    }
    p->p_extra[he->he_idx] = he->he_conn;
    he->he_conn = NULL;
    if (++hs->h_nextra_done == p->p_nextra) {
        pipe_ready(p);
    }
}

static void
hs_extra_cb(void *arg)
{
    hs_extra *he = arg;
    tp_context *ctx = he->he_hs->h_pipe->p_ctx;
    tp__task_init(&he->he_task, hs_extra_task, he);
    if (tp__loop_on_thread(ctx->x_loop)) {
        hs_extra_task(he);
    } else {
        tp__loop_post(ctx->x_loop, &he->he_task);
    }
}

static void
hs_start_extras(tp_pipe *p)
{
    tp_pipe_hs *hs = p->p_hs;
    tp_context *ctx = p->p_ctx;
    bool lanes = false;
    unsigned want = p->p_chops->nconns(&ctx->x_cfg, &lanes);
    unsigned n = hs->h_ans.a_nconns;
    if ((!lanes && n != want) || (lanes && (n == 0 || ctx->x_nlanes == 0))) {
        char what[128];
        snprintf(what, sizeof(what),
                 "protocol error: the answer asks for %u connections for "
                 "channel %s",
                 n, p->p_ch->cb_name);
        hs_fail(p, TP_EPROTO, NULL, what);
        return;
    }
    p->p_nextra = n;
    if (n == 0) {
        pipe_ready(p);
        return;
    }
    p->p_extra = tp__zalloc(n * sizeof(*p->p_extra));
    hs->h_extras = tp__zalloc(n * sizeof(*hs->h_extras));
    if (p->p_extra == NULL || hs->h_extras == NULL) {
        hs_fail(p, TP_ENOMEM, NULL, "handshake: out of memory");
        return;
    }
    for (unsigned i = 0; i < n; i++) {
        hs_extra *he = &hs->h_extras[i];
        he->he_hs = hs;
        he->he_idx = i;
        tp__aio_init(&he->he_aio, hs_extra_cb, he);
        tp_aio_set_timeout(&he->he_aio, ctx->x_cfg.connect_timeout_ms);
    }
    for (unsigned i = 0; i < n; i++) {
        hs_extra *he = &hs->h_extras[i];
        tp_transport *t =
            lanes ? ctx->x_lane_tr[i % ctx->x_nlanes] : p->p_tr->cb_transport;
        p->p_busy++;
        tp__transport_connect(t, hs->h_ans.a_conns[i].ac_addr, &he->he_aio);
    }
}

static void
hs_connector_report(tp_pipe *p)
{
    tp_context *ctx = p->p_ctx;
    tp__answer *a = &p->p_hs->h_ans;
    char *rep = p->p_report;
    size_t cap = sizeof(p->p_report);
    snprintf(rep, cap, "pipe to %s: transport %s, channel %s\n", p->p_peer,
             a->a_transport, a->a_channel);
    const struct {
        const char *kind;
        ctx_backend *b;
        size_t n;
        const char *chosen;
    } g[] = {{"transport", ctx->x_tr, ctx->x_ntr, a->a_transport},
             {"channel", ctx->x_ch, ctx->x_nch, a->a_channel}};
    for (size_t k = 0; k < 2; k++) {
        for (size_t i = 0; i < g[k].n; i++) {
            ctx_backend *b = &g[k].b[i];
            if (!b->cb_used) {
                tp__report_add(rep, cap, "%s %s: %s\n", g[k].kind, b->cb_name,
                               b->cb_why);
            } else if (strcmp(b->cb_name, g[k].chosen) == 0) {
                tp__report_add(rep, cap, "%s %s: chosen\n", g[k].kind,
                               b->cb_name);
            } else {
                // The peer's note for it ("tcp: lower priority; ...").
                char key[TP_WIRE_MAX_NAME + 3];
                snprintf(key, sizeof(key), "%s: ", b->cb_name);
                const char *note = strstr(a->a_reason, key);
                if (note != NULL) {
                    note += strlen(key);
                    int n = (int)strcspn(note, ";");
                    tp__report_add(rep, cap,
                                   "%s %s: not chosen by the peer: %.*s\n",
                                   g[k].kind, b->cb_name, n, note);
                } else {
                    tp__report_add(rep, cap,
                                   "%s %s: not chosen by the peer (it does not "
                                   "offer it)\n",
                                   g[k].kind, b->cb_name);
                }
            }
        }
    }
    if (a->a_reason[0] != '\0') {
        size_t n = strlen(a->a_reason);
        while (n > 0 &&
               (a->a_reason[n - 1] == ' ' || a->a_reason[n - 1] == ';')) {
            a->a_reason[--n] = '\0';
        }
        tp__report_add(rep, cap, "peer %s notes: %s\n", a->a_ctxname,
                       a->a_reason);
    }
}

static void
hs_step(tp_pipe *p)
{
    tp_pipe_hs *hs = p->p_hs;
    tp_context *ctx = p->p_ctx;
    tp_aio *aio = &hs->h_aio;
    if (tp_aio_status(aio) != TP_OK) {
        static const char *const what[] = {
            "connecting",         "sending the brochure", "reading the answer",
            "reading the answer", "connecting (upgrade)", "joining (upgrade)",
        };
        hs_fail(p, tp_aio_status(aio), tp_aio_error(aio),
                what[hs->h_step < 6 ? hs->h_step : 0]);
        return;
    }
    tp_error *err = NULL;
    switch (hs->h_step) {
    case HS_CONNECT: {
        hs->h_conn0 = tp_aio_get_output(aio, 0);
        // Connected: from now on the handshake deadline applies (the
        // pipe's timer, which names TP_HANDSHAKE_TIMEOUT_MS).
        tp_aio_set_timeout(aio, 0);
        pipe_arm_hs_timer(p, ctx->x_cfg.handshake_timeout_ms);
        // The brochure: every usable transport (with our listener-less
        // address: none) and channel.
        tp__brochure *b = tp__zalloc(sizeof(*b));
        if (b == NULL) {
            hs_fail(p, TP_ENOMEM, NULL, "handshake: out of memory");
            return;
        }
        snprintf(b->b_ctxname, sizeof(b->b_ctxname), "%s", ctx->x_name);
        for (size_t i = 0; i < ctx->x_ntr; i++) {
            if (ctx->x_tr[i].cb_used) {
                tp__brochure_entry *e = &b->b_transports[b->b_ntransports++];
                snprintf(e->be_name, sizeof(e->be_name), "%s",
                         ctx->x_tr[i].cb_name);
                snprintf(e->be_domain, sizeof(e->be_domain), "%s",
                         ctx->x_tr[i].cb_domain);
            }
        }
        for (size_t i = 0; i < ctx->x_nch; i++) {
            if (ctx->x_ch[i].cb_used) {
                tp__brochure_entry *e = &b->b_channels[b->b_nchannels++];
                snprintf(e->be_name, sizeof(e->be_name), "%s",
                         ctx->x_ch[i].cb_name);
                snprintf(e->be_domain, sizeof(e->be_domain), "%s",
                         ctx->x_ch[i].cb_domain);
            }
        }
        size_t n = tp__brochure_size(b);
        hs->h_buf = tp__alloc(TP_FRAME_HDR_LEN + n);
        if (hs->h_buf == NULL ||
            tp__brochure_encode(b, hs->h_buf + TP_FRAME_HDR_LEN, n) != n) {
            tp__free(b);
            hs_fail(p, TP_EINTERNAL, NULL, "encoding the brochure");
            return;
        }
        tp__free(b);
        tp__frame_hdr h = {TP_FRAME_BROCHURE, TP_PIPE_WIRE_VERSION, 0, n};
        tp__frame_hdr_encode(hs->h_buf, &h);
        hs->h_step = HS_BROCHURE;
        hs_submit_write(p, hs->h_conn0, hs->h_buf, TP_FRAME_HDR_LEN + n);
        return;
    }
    case HS_BROCHURE:
        tp__free(hs->h_buf);
        hs->h_buf = NULL;
        hs->h_step = HS_ANS_HDR;
        hs_submit_read(p, hs->h_conn0, hs->h_hdr, TP_FRAME_HDR_LEN);
        return;
    case HS_ANS_HDR: {
        tp__frame_hdr h = {0};
        if (tp__frame_hdr_decode(hs->h_hdr, &h, &err) != TP_OK ||
            h.fh_type != TP_FRAME_ANSWER ||
            h.fh_body_len > TP_WIRE_MAX_HANDSHAKE) {
            char what[128];
            snprintf(what, sizeof(what),
                     "protocol error: expected an answer frame (type %u, "
                     "<= %u bytes), got type %u, %" PRIu64 " bytes",
                     TP_FRAME_ANSWER, TP_WIRE_MAX_HANDSHAKE, h.fh_type,
                     h.fh_body_len);
            hs_fail(p, TP_EPROTO, err, err ? "protocol error" : what);
            tp_error_unref(err);
            return;
        }
        hs->h_len = h.fh_body_len;
        hs->h_buf = tp__alloc(hs->h_len ? hs->h_len : 1);
        if (hs->h_buf == NULL) {
            hs_fail(p, TP_ENOMEM, NULL, "handshake: out of memory");
            return;
        }
        hs->h_step = HS_ANS_BODY;
        hs_submit_read(p, hs->h_conn0, hs->h_buf, hs->h_len);
        return;
    }
    case HS_ANS_BODY: {
        tp__answer *a = &hs->h_ans;
        if (tp__answer_decode(hs->h_buf, hs->h_len, a, &err) != TP_OK) {
            hs_fail(p, TP_EPROTO, err, "protocol error in the answer");
            tp_error_unref(err);
            return;
        }
        tp__free(hs->h_buf);
        hs->h_buf = NULL;
        char peer[sizeof(p->p_peer)];
        snprintf(peer, sizeof(peer), "%s at %s", a->a_ctxname, p->p_url);
        snprintf(p->p_peer, sizeof(p->p_peer), "%s", peer);
        if (!a->a_accepted) {
            char what[TP_WIRE_MAX_REASON + 32];
            snprintf(what, sizeof(what), "refused by the peer: %s",
                     a->a_reason);
            hs_fail(p, TP_EUNREACHABLE, NULL, what);
            return;
        }
        p->p_tr = tp__ctx_transport(ctx, a->a_transport);
        p->p_ch = NULL;
        for (size_t i = 0; i < ctx->x_nch; i++) {
            if (ctx->x_ch[i].cb_used &&
                strcmp(ctx->x_ch[i].cb_name, a->a_channel) == 0) {
                p->p_ch = &ctx->x_ch[i];
            }
        }
        if (p->p_tr == NULL || p->p_ch == NULL) {
            char what[160];
            snprintf(what, sizeof(what),
                     "protocol error: the peer chose transport \"%s\" and "
                     "channel \"%s\", which we did not offer",
                     a->a_transport, a->a_channel);
            hs_fail(p, TP_EPROTO, NULL, what);
            return;
        }
        p->p_chops = p->p_ch->cb_channel_ops;
        hs_connector_report(p);
        if (a->a_transport_reg_id == 0) {
            if (strcmp(a->a_transport, hs->h_tr0->t_ops->name) != 0) {
                hs_fail(p, TP_EPROTO, NULL,
                        "protocol error: the answer switches transport "
                        "without a registration id");
                return;
            }
            p->p_conn = hs->h_conn0;
            hs->h_conn0 = NULL;
            hs->h_step = HS_EXTRAS;
            hs_start_extras(p);
            return;
        }
        hs->h_step = HS_MAIN_CONNECT;
        tp_aio_set_timeout(aio, ctx->x_cfg.connect_timeout_ms);
        p->p_busy++;
        tp__transport_connect(p->p_tr->cb_transport, a->a_transport_addr, aio);
        return;
    }
    case HS_MAIN_CONNECT: {
        hs->h_main = tp_aio_get_output(aio, 0);
        tp_aio_set_timeout(aio, 0);
        tp__frame_hdr h = {TP_FRAME_JOIN, TP_PIPE_WIRE_VERSION, 0, TP_JOIN_LEN};
        tp__frame_hdr_encode(hs->h_join, &h);
        tp__join_encode(hs->h_ans.a_transport_reg_id, 0,
                        hs->h_join + TP_FRAME_HDR_LEN);
        hs->h_step = HS_MAIN_JOIN;
        hs_submit_write(p, hs->h_main, hs->h_join, sizeof(hs->h_join));
        return;
    }
    case HS_MAIN_JOIN:
        p->p_conn = hs->h_main;
        hs->h_main = NULL;
        tp__conn_close(hs->h_conn0);
        hs->h_step = HS_EXTRAS;
        hs_start_extras(p);
        return;
    default:
        TP_ASSERT(!"bad handshake step");
    }
}

typedef struct connect_args {
    tp_context *ctx;
    const char *url;
    tp_transport *tr;
    tp_pipe *pipe;
} connect_args;

static void
connect_task(void *arg)
{
    connect_args *ca = arg;
    tp_context *ctx = ca->ctx;
    tp_pipe *p = tp__pipe_new(ctx);
    ca->pipe = p;
    if (p == NULL) {
        return;
    }
    snprintf(p->p_url, sizeof(p->p_url), "%s", ca->url);
    snprintf(p->p_peer, sizeof(p->p_peer), "%s", ca->url);
    tp_pipe_hs *hs = tp__zalloc(sizeof(*hs));
    if (hs == NULL) {
        tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL, "connect"));
        return;
    }
    p->p_hs = hs;
    hs->h_pipe = p;
    hs->h_tr0 = ca->tr;
    tp__aio_init(&hs->h_aio, hs_cb, p);
    tp_aio_set_timeout(&hs->h_aio, ctx->x_cfg.connect_timeout_ms);
    pipe_arm_hs_timer(p, ctx->x_cfg.connect_timeout_ms +
                             ctx->x_cfg.handshake_timeout_ms);
    hs->h_step = HS_CONNECT;
    p->p_busy++;
    tp__transport_connect(ca->tr, ca->url, &hs->h_aio);
}

tp_status
tp_context_connect(tp_context *ctx, const char *url, tp_pipe **pipe_p,
                   tp_error **err_p)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    if (sep == NULL || strlen(url) > TP_WIRE_MAX_ADDR) {
        return tp__error_set(err_p, TP_EINVAL,
                             "context %s: connect: bad URL \"%s\" (expected "
                             "TRANSPORT://ADDRESS, e.g. tcp://127.0.0.1:5000)",
                             ctx->x_name, url ? url : "(null)");
    }
    char name[TP_WIRE_MAX_NAME + 1];
    snprintf(name, sizeof(name), "%.*s", (int)(sep - url), url);
    ctx_backend *b = tp__ctx_transport(ctx, name);
    if (b == NULL) {
        char *rep = tp_context_report(ctx);
        tp_status st = tp__error_set(
            err_p, TP_EINVAL,
            "context %s: connect to %s: transport \"%s\" is not in use "
            "here:\n%s",
            ctx->x_name, url, name, rep ? rep : "");
        free(rep);
        return st;
    }
    connect_args ca = {ctx, url, b->cb_transport, NULL};
    tp__loop_call(ctx->x_loop, connect_task, &ca);
    if (ca.pipe == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "context %s: connect to %s: "
                             "out of memory",
                             ctx->x_name, url);
    }
    *pipe_p = ca.pipe;
    return TP_OK;
}

// ---- ready -----------------------------------------------------------------

static void pipe_chan_fail(void *pipe, tp_error *err);
static void pipe_raio_cb(void *arg);

static void
pipe_ready(tp_pipe *p)
{
    tp_context *ctx = p->p_ctx;
    tp__timer_stop(ctx->x_loop, &p->p_hs_timer);
    // Find the peer's descriptor of the channel for the channel (xth uses
    // it); the accepting side saw it in the brochure, the connecting side
    // has the same by construction (equal domains).
    tp_chan_env env = {
        .ce_loop = ctx->x_loop,
        .ce_pool = ctx->x_pool,
        .ce_cfg = &ctx->x_cfg,
        .ce_conns = p->p_extra,
        .ce_nconns = p->p_nextra,
        .ce_peer = p->p_peer,
        .ce_peer_domain = p->p_ch->cb_domain,
        .ce_fail = pipe_chan_fail,
        .ce_pipe = p,
    };
    tp_error *err = NULL;
    if (p->p_chops->create != NULL &&
        p->p_chops->create(&env, &p->p_chan, &err) != TP_OK) {
        tp__pipe_fail(
            p, pipe_err(p, tp_error_status(err), err, "starting the channel"));
        tp_error_unref(err);
        return;
    }
    p->p_inline_max = p->p_chops->inline_data ? UINT64_MAX
                      : p->p_chops->inline_max != NULL
                          ? p->p_chops->inline_max(&ctx->x_cfg)
                          : 0;
    p->p_state = PIPE_READY;
    pipe_log_report(p);
    pipe_publish_state(p);
    if (p->p_pl != NULL) {
        tp__listener_pipe_ready(p->p_pl, p);
    }
    pipe_write_pump(p);
    pipe_read_pump(p);
}

static void
pipe_chan_fail(void *pipe, tp_error *err)
{
    tp__pipe_fail((tp_pipe *)pipe, err);
}

// ---- writes ----------------------------------------------------------------

static void
wop_free(pipe_wop *w)
{
    tp__aio_fini(&w->w_aio);
    tp__free(w->w_hdr);
    tp__free(w->w_iovs);
    tp__free(w->w_ops);
    tp__free(w->w_infos);
    tp_error_unref(w->w_err);
    tp__free(w);
}

static void
wop_free_task(void *arg)
{
    wop_free(arg);
}

static void
pipe_flush_writes(tp_pipe *p)
{
    pipe_wop *w;
    while ((w = tp__list_first(&p->p_writes)) != NULL) {
        bool failed = p->p_state == PIPE_FAILED;
        bool idle = !w->w_conn_busy && w->w_ops_pending == 0;
        if (!(w->w_done || (failed && (idle || !w->w_started)))) {
            break;
        }
        if (failed && !idle) {
            break;
        }
        if (p->p_wnext == w) {
            p->p_wnext = tp__list_next(&p->p_writes, w);
        }
        tp__list_remove(&p->p_writes, w);
        if (p->p_wcursor == w) {
            p->p_wcursor = NULL;
        }
        tp_error *err = failed ? tp_error_ref(p->p_err) : NULL;
        if (!failed && w->w_err != NULL) {
            err = tp_error_ref(w->w_err);
        }
        tp__aio_finish(w->w_user, err, 0);
        // w_aio's callback may be running now: free after it returns.
        tp__task_init(&w->w_free_task, wop_free_task, w);
        tp__loop_defer(p->p_ctx->x_loop, &w->w_free_task);
    }
    pipe_check_drained(p);
}

static void
wop_check(pipe_wop *w)
{
    if (!w->w_done && w->w_conn_done && w->w_ops_pending == 0) {
        w->w_done = true;
    }
}

static void
wop_submit_group(pipe_wop *w)
{
    tp_pipe *p = w->w_pipe;
    unsigned n = w->w_niovs - w->w_next_iov;
    if (n > TP_AIO_MAX_IOV) {
        n = TP_AIO_MAX_IOV;
    }
    tp_aio_set_iov(&w->w_aio, n, &w->w_iovs[w->w_next_iov]);
    w->w_next_iov += n;
    w->w_conn_busy = true;
    p->p_busy++;
    if (w->w_next_iov == w->w_niovs && p->p_wcursor == w) {
        p->p_wcursor = NULL;
    }
    tp__conn_write(p->p_conn, &w->w_aio);
}

static void
wop_aio_cb(void *arg)
{
    pipe_wop *w = arg;
    tp_pipe *p = w->w_pipe;
    w->w_conn_busy = false;
    if (tp_aio_status(&w->w_aio) != TP_OK && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, pipe_err(p, tp_aio_status(&w->w_aio),
                                  tp_aio_error(&w->w_aio), "write"));
    }
    if (p->p_state == PIPE_FAILED) {
        pipe_busy_done(p);
        pipe_flush_writes(p);
        return;
    }
    if (w->w_next_iov < w->w_niovs) {
        wop_submit_group(w);
    } else {
        w->w_conn_done = true;
        wop_check(w);
    }
    pipe_busy_done(p);
    pipe_flush_writes(p);
    pipe_write_pump(p);
}

static void
wop_chan_done(tp_chan_op *op, tp_error *err)
{
    pipe_wop *w = op->co_arg;
    tp_pipe *p = w->w_pipe;
    w->w_ops_pending--;
    if (err != NULL && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, pipe_err(p, tp_error_status(err), err, "channel"));
    }
    tp_error_unref(err);
    wop_check(w);
    pipe_busy_done(p);
    pipe_flush_writes(p);
}

// Starts sending @w: channel sends (which fill the infos), descriptor,
// the iov list of the main connection.
static tp_status
wop_start(tp_pipe *p, pipe_wop *w, tp_error **err_p)
{
    const tp_message *m = w->w_msg;
    w->w_seq = p->p_wseq++;
    w->w_started = true;
    // Tensors up to p_inline_max follow the payloads on the connection.
    const uint64_t inl = p->p_inline_max;
    unsigned nchan = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        nchan += (m->tensors[i].len > inl);
    }
    if (m->ntensors > 0) {
        w->w_infos = tp__zalloc(m->ntensors * sizeof(*w->w_infos));
        if (w->w_infos == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
        }
    }
    if (nchan > 0) {
        w->w_ops = tp__zalloc(nchan * sizeof(*w->w_ops));
        if (w->w_ops == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
        }
    }
    // Payload prefix copied behind the descriptor (one write for small
    // messages).
    uint32_t ncoal = 0;
    uint64_t coal = 0;
    while (ncoal < m->npayloads &&
           coal + m->payloads[ncoal].len <= PIPE_COALESCE_MAX) {
        coal += m->payloads[ncoal].len;
        ncoal++;
    }
    unsigned k = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len <= inl) {
            continue;
        }
        tp_chan_op *op = &w->w_ops[k++];
        op->co_buf = m->tensors[i].data;
        op->co_len = m->tensors[i].len;
        op->co_seq = w->w_seq;
        op->co_index = i;
        op->co_done = wop_chan_done;
        op->co_arg = w;
        w->w_ops_pending++;
        p->p_busy++;
        p->p_chops->send(p->p_chan, op);
        w->w_infos[i] = op->co_info;
    }
    w->w_nops = k;
    uint64_t dlen = tp__desc_size(m, w->w_infos);
    w->w_hdr_len = TP_FRAME_HDR_LEN + dlen + coal;
    w->w_hdr = tp__alloc(w->w_hdr_len);
    unsigned niovs = 1 + (m->npayloads - ncoal) + m->ntensors;
    w->w_iovs = tp__alloc(niovs * sizeof(*w->w_iovs));
    if (w->w_hdr == NULL || w->w_iovs == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "write: out of memory");
    }
    tp__frame_hdr h = {TP_FRAME_MESSAGE, TP_PIPE_WIRE_VERSION, 0, dlen};
    tp__frame_hdr_encode(w->w_hdr, &h);
    if (tp__desc_encode(m, w->w_infos, w->w_hdr + TP_FRAME_HDR_LEN, dlen) !=
        dlen) {
        return tp__error_set(err_p, TP_EINTERNAL,
                             "write: descriptor encoding failed");
    }
    uint8_t *q = w->w_hdr + TP_FRAME_HDR_LEN + dlen;
    for (uint32_t i = 0; i < ncoal; i++) {
        if (m->payloads[i].len > 0) {
            memcpy(q, m->payloads[i].data, m->payloads[i].len);
            q += m->payloads[i].len;
        }
    }
    w->w_iovs[0] = (tp_iov){w->w_hdr, w->w_hdr_len};
    unsigned n = 1;
    for (uint32_t i = ncoal; i < m->npayloads; i++) {
        if (m->payloads[i].len > 0) {
            w->w_iovs[n++] = (tp_iov){m->payloads[i].data, m->payloads[i].len};
        }
    }
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len > 0 && m->tensors[i].len <= inl) {
            w->w_iovs[n++] = (tp_iov){m->tensors[i].data, m->tensors[i].len};
        }
    }
    w->w_niovs = n;
    return TP_OK;
}

static void
pipe_write_pump(tp_pipe *p)
{
    if (p->p_state != PIPE_READY) {
        return;
    }
    while (p->p_wcursor == NULL && p->p_wnext != NULL) {
        pipe_wop *w = p->p_wnext;
        p->p_wnext = tp__list_next(&p->p_writes, w);
        tp_error *err = NULL;
        if (wop_start(p, w, &err) != TP_OK) {
            tp__pipe_fail(p, pipe_err(p, tp_error_status(err), err, "write"));
            tp_error_unref(err);
            return;
        }
        p->p_wcursor = w;
        wop_submit_group(w);
        if (p->p_state != PIPE_READY) {
            return;
        }
    }
}

static void
pipe_write_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    pipe_wop *w = arg;
    tp_pipe *p = w->w_pipe;
    if (w->w_started || p->p_state == PIPE_FAILED) {
        char what[128];
        snprintf(what, sizeof(what), "write %s after it started; pipe closed",
                 reason == TP_ETIMEDOUT ? "timed out" : "canceled");
        tp__pipe_fail(p, pipe_err(p, reason, NULL, what));
        return;
    }
    if (p->p_wnext == w) {
        p->p_wnext = tp__list_next(&p->p_writes, w);
    }
    tp__list_remove(&p->p_writes, w);
    tp__aio_finish_status(aio, reason, "pipe to %s: write %s", p->p_peer,
                          reason == TP_ETIMEDOUT ? "timed out" : "canceled");
    tp__task_init(&w->w_free_task, wop_free_task, w);
    tp__loop_defer(p->p_ctx->x_loop, &w->w_free_task);
    pipe_check_drained(p);
}

static tp_status
msg_check(const tp_pipe *p, const tp_message *m, tp_error **err_p)
{
    const tp__pipe_limits *lim = &p->p_ctx->x_limits;
    if (m == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "message is NULL");
    }
    if (m->metadata_len > lim->max_metadata ||
        (m->metadata_len > 0 && m->metadata == NULL)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "metadata of %" PRIu64 " bytes: above the limit "
                             "%" PRIu64 " (TP_PIPE_MAX_METADATA) or NULL",
                             m->metadata_len, lim->max_metadata);
    }
    if (m->npayloads > lim->max_payloads || m->ntensors > lim->max_tensors) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%u payloads / %u tensors: above the limits %u / "
                             "%u (TP_PIPE_MAX_PAYLOADS / TP_PIPE_MAX_TENSORS)",
                             m->npayloads, m->ntensors, lim->max_payloads,
                             lim->max_tensors);
    }
    for (uint32_t k = 0; k < 2; k++) {
        const tp_msg_buf *bufs = k ? m->tensors : m->payloads;
        uint32_t n = k ? m->ntensors : m->npayloads;
        for (uint32_t i = 0; i < n; i++) {
            if (bufs[i].len > lim->max_buf_len ||
                (bufs[i].len > 0 && bufs[i].data == NULL) ||
                bufs[i].device.type != TP_DEVICE_CPU) {
                return tp__error_set(
                    err_p, TP_EINVAL,
                    "%s %u: %" PRIu64 " bytes, data %p, device %d: needs "
                    "data, a CPU device and at most %" PRIu64
                    " bytes (TP_PIPE_MAX_BUF_BYTES)",
                    k ? "tensor" : "payload", i, bufs[i].len, bufs[i].data,
                    (int)bufs[i].device.type, lim->max_buf_len);
            }
        }
    }
    return TP_OK;
}

static void
pipe_write_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    const tp_message *m = aio->a_input[0];
    pipe_wop *w = tp__zalloc(sizeof(*w));
    if (w == NULL) {
        if (tp__aio_begin(aio, p->p_ctx->x_loop, NULL, NULL)) {
            tp__aio_finish_status(
                aio, TP_ENOMEM, "pipe to %s: write: out of memory", p->p_peer);
        }
        return;
    }
    w->w_pipe = p;
    w->w_user = aio;
    w->w_msg = m;
    tp__aio_init(&w->w_aio, wop_aio_cb, w);
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_write_cancel, w)) {
        wop_free(w);
        return;
    }
    tp_error *err = NULL;
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        wop_free(w);
        return;
    }
    if (msg_check(p, m, &err) != TP_OK) {
        tp__error_wrap(&err, TP_EINVAL, "pipe to %s: write", p->p_peer);
        tp__aio_finish(aio, err, 0);
        wop_free(w);
        return;
    }
    tp__list_append(&p->p_writes, w);
    if (p->p_wnext == NULL) {
        p->p_wnext = w;
    }
    pipe_write_pump(p);
}

void
tp_pipe_write(tp_pipe *p, const tp_message *msg, tp_aio *aio)
{
    aio->a_input[0] = (void *)(uintptr_t)msg;
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_write_start, p);
}

// ---- reads -----------------------------------------------------------------

static void
rop_free(pipe_rop *r)
{
    tp__aio_fini(&r->r_aio);
    tp__free(r->r_iovs);
    tp__free(r->r_ops);
    tp__free(r->r_infos);
    tp_error_unref(r->r_err);
    tp__free(r);
}

static void
rop_free_task(void *arg)
{
    rop_free(arg);
}

static void
pipe_flush_reads(tp_pipe *p)
{
    pipe_rop *r;
    while ((r = tp__list_first(&p->p_reads)) != NULL) {
        bool failed = p->p_state == PIPE_FAILED;
        bool idle = !r->r_conn_busy && r->r_ops_pending == 0;
        if (!r->r_done && !(failed && idle)) {
            break;
        }
        tp__list_remove(&p->p_reads, r);
        if (p->p_rcursor == r) {
            p->p_rcursor = NULL;
        }
        tp_error *err = failed ? tp_error_ref(p->p_err) : NULL;
        tp__aio_finish(r->r_user, err, 0);
        tp__task_init(&r->r_free_task, rop_free_task, r);
        tp__loop_defer(p->p_ctx->x_loop, &r->r_free_task);
    }
    pipe_check_drained(p);
}

static void
rop_check(pipe_rop *r)
{
    if (!r->r_done && r->r_conn_done && r->r_ops_pending == 0) {
        r->r_done = true;
    }
}

static void
rop_submit_group(pipe_rop *r)
{
    tp_pipe *p = r->r_pipe;
    unsigned n = r->r_niovs - r->r_next_iov;
    if (n > TP_AIO_MAX_IOV) {
        n = TP_AIO_MAX_IOV;
    }
    tp_aio_set_iov(&r->r_aio, n, &r->r_iovs[r->r_next_iov]);
    r->r_next_iov += n;
    r->r_conn_busy = true;
    p->p_busy++;
    tp__conn_read(p->p_conn, &r->r_aio);
}

static void
rop_aio_cb(void *arg)
{
    pipe_rop *r = arg;
    tp_pipe *p = r->r_pipe;
    r->r_conn_busy = false;
    if (tp_aio_status(&r->r_aio) != TP_OK && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, pipe_err(p, tp_aio_status(&r->r_aio),
                                  tp_aio_error(&r->r_aio), "read"));
    }
    if (p->p_state == PIPE_FAILED) {
        pipe_busy_done(p);
        pipe_flush_reads(p);
        return;
    }
    if (r->r_next_iov < r->r_niovs) {
        rop_submit_group(r);
    } else {
        r->r_conn_done = true;
        rop_check(r);
        // The inline bytes are in: the next descriptor may be read.
        p->p_rcursor = NULL;
        p->p_rstate = RD_IDLE;
    }
    pipe_busy_done(p);
    pipe_flush_reads(p);
    pipe_read_pump(p);
}

static void
rop_chan_done(tp_chan_op *op, tp_error *err)
{
    pipe_rop *r = op->co_arg;
    tp_pipe *p = r->r_pipe;
    r->r_ops_pending--;
    if (err != NULL && p->p_state != PIPE_FAILED) {
        tp__pipe_fail(p, pipe_err(p, tp_error_status(err), err, "channel"));
    }
    tp_error_unref(err);
    rop_check(r);
    pipe_busy_done(p);
    pipe_flush_reads(p);
}

static void
pipe_raio_submit(tp_pipe *p, void *buf, uint64_t len)
{
    tp_iov iov = {buf, len};
    tp_aio_set_iov(&p->p_raio, 1, &iov);
    p->p_raio_busy = true;
    p->p_busy++;
    tp__conn_read(p->p_conn, &p->p_raio);
}

static void
pipe_read_pump(tp_pipe *p)
{
    if (p->p_state != PIPE_READY || p->p_rstate != RD_IDLE) {
        return;
    }
    tp_aio *aio = tp__list_pop_first(&p->p_rdesc);
    if (aio == NULL) {
        return;
    }
    p->p_rdesc_active = aio;
    p->p_rstate = RD_HDR;
    pipe_raio_submit(p, p->p_rhdr, TP_FRAME_HDR_LEN);
}

static void
pipe_raio_step(tp_pipe *p)
{
    tp_aio *user = p->p_rdesc_active;
    tp_status st = tp_aio_status(&p->p_raio);
    if (p->p_state == PIPE_FAILED) {
        return;
    }
    if (st != TP_OK) {
        if ((st == TP_ECANCELED || st == TP_ETIMEDOUT) &&
            p->p_rstate == RD_HDR && tp_aio_count(&p->p_raio) == 0 &&
            p->p_rdesc_reason != 0) {
            // Canceled before any byte: the stream is intact.
            st = p->p_rdesc_reason;
            p->p_rdesc_reason = 0;
            p->p_rdesc_active = NULL;
            p->p_rstate = RD_IDLE;
            tp__aio_finish_status(
                user, st, "pipe to %s: read descriptor %s", p->p_peer,
                st == TP_ETIMEDOUT ? "timed out" : "canceled");
            pipe_read_pump(p);
            return;
        }
        tp__pipe_fail(p, pipe_err(p, st, tp_aio_error(&p->p_raio), "read"));
        return;
    }
    tp_error *err = NULL;
    p->p_rdesc_reason = 0; // bytes came: a cancel that raced them is moot
    if (p->p_rstate == RD_HDR) {
        tp__frame_hdr h;
        uint64_t max = tp__desc_max_size(&p->p_ctx->x_limits);
        if (tp__frame_hdr_decode(p->p_rhdr, &h, &err) != TP_OK) {
            tp__pipe_fail(p, pipe_err(p, TP_EPROTO, err, "protocol error"));
            tp_error_unref(err);
        } else if (h.fh_type != TP_FRAME_MESSAGE || h.fh_body_len > max) {
            char what[160];
            snprintf(what, sizeof(what),
                     "protocol error: expected a message descriptor of at "
                     "most %" PRIu64 " bytes, got frame type %u of %" PRIu64
                     " bytes",
                     max, h.fh_type, h.fh_body_len);
            tp__pipe_fail(p, pipe_err(p, TP_EPROTO, NULL, what));
        } else {
            tp__free(p->p_rbody);
            p->p_rbody_len = h.fh_body_len;
            p->p_rbody = tp__alloc(h.fh_body_len ? h.fh_body_len : 1);
            if (p->p_rbody == NULL) {
                tp__pipe_fail(
                    p, pipe_err(p, TP_ENOMEM, NULL, "read: out of memory"));
            } else {
                p->p_rstate = RD_BODY;
                pipe_raio_submit(p, p->p_rbody, p->p_rbody_len);
            }
        }
        return;
    }
    TP_ASSERT(p->p_rstate == RD_BODY);
    tp_message *msg = NULL;
    tp__chan_info *infos = NULL;
    if (tp__desc_decode(p->p_rbody, p->p_rbody_len, &p->p_ctx->x_limits, &msg,
                        &infos, &err) != TP_OK) {
        tp_status dst = tp_error_status(err);
        tp__pipe_fail(p, pipe_err(p, dst, err,
                                  dst == TP_ENOMEM ? "read: out of memory"
                                                   : "protocol error"));
        tp_error_unref(err);
        return;
    }
    tp__free(p->p_rbody);
    p->p_rbody = NULL;
    p->p_rmsg = msg;
    p->p_rinfos = infos;
    p->p_rstate = RD_GOT_DESC;
    p->p_rdesc_active = NULL;
    tp__aio_set_output(user, 0, msg);
    tp__aio_finish(user, NULL, 0);
}

static void
pipe_raio_cb(void *arg)
{
    tp_pipe *p = arg;
    p->p_raio_busy = false;
    pipe_raio_step(p);
    // A failure (found here or before) ends the descriptor read being
    // served, with the pipe's first error.
    if (p->p_state == PIPE_FAILED && p->p_rdesc_active != NULL) {
        tp_aio *user = p->p_rdesc_active;
        p->p_rdesc_active = NULL;
        tp__aio_finish(user, tp_error_ref(p->p_err), 0);
    }
    pipe_busy_done(p);
}

static void
pipe_rdesc_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tp_pipe *p = arg;
    if (tp__list_node_active(&aio->a_node)) {
        tp__list_remove(&p->p_rdesc, aio);
        tp__aio_finish_status(
            aio, reason, "pipe to %s: read descriptor %s", p->p_peer,
            reason == TP_ETIMEDOUT ? "timed out" : "canceled");
        pipe_check_drained(p);
        return;
    }
    if (p->p_rdesc_active == aio) {
        if (p->p_rstate == RD_HDR) {
            // Completes through pipe_raio_cb: intact if no byte came.
            p->p_rdesc_reason = reason;
            tp_aio_cancel(&p->p_raio);
        } else {
            char what[96];
            snprintf(what, sizeof(what),
                     "read descriptor %s in the middle of a frame; pipe "
                     "closed",
                     reason == TP_ETIMEDOUT ? "timed out" : "canceled");
            tp__pipe_fail(p, pipe_err(p, reason, NULL, what));
        }
    }
}

static void
pipe_rdesc_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_rdesc_cancel, p)) {
        return;
    }
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        return;
    }
    tp__list_append(&p->p_rdesc, aio);
    pipe_read_pump(p);
}

void
tp_pipe_read_descriptor(tp_pipe *p, tp_aio *aio)
{
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_rdesc_start, p);
}

static void
pipe_read_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    (void)aio;
    pipe_rop *r = arg;
    char what[96];
    snprintf(what, sizeof(what), "read %s while data was arriving; pipe closed",
             reason == TP_ETIMEDOUT ? "timed out" : "canceled");
    tp__pipe_fail(r->r_pipe, pipe_err(r->r_pipe, reason, NULL, what));
}

static void
pipe_read_start(void *obj, tp_aio *aio)
{
    tp_pipe *p = obj;
    tp_message *m = aio->a_input[0];
    pipe_rop *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        if (tp__aio_begin(aio, p->p_ctx->x_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM,
                                  "pipe to %s: read: out of memory", p->p_peer);
        }
        return;
    }
    r->r_pipe = p;
    r->r_user = aio;
    r->r_msg = m;
    tp__aio_init(&r->r_aio, rop_aio_cb, r);
    if (!tp__aio_begin(aio, p->p_ctx->x_loop, pipe_read_cancel, r)) {
        rop_free(r);
        return;
    }
    if (p->p_state == PIPE_FAILED) {
        tp__aio_finish(aio, tp_error_ref(p->p_err), 0);
        rop_free(r);
        return;
    }
    if (p->p_rstate != RD_GOT_DESC || m == NULL || m != p->p_rmsg) {
        tp__aio_finish_status(aio, TP_EINVAL, "pipe to %s: read: %s", p->p_peer,
                              p->p_rstate != RD_GOT_DESC
                                  ? "no descriptor is waiting for its data "
                                    "(call tp_pipe_read_descriptor first)"
                                  : "not the message returned by the last "
                                    "tp_pipe_read_descriptor");
        rop_free(r);
        return;
    }
    p->p_rmsg = NULL;
    r->r_infos = p->p_rinfos;
    p->p_rinfos = NULL;
    r->r_seq = p->p_rseq++;
    const uint64_t inl = p->p_inline_max;
    // Buffers the caller left NULL: ours.
    for (uint32_t k = 0; k < 2; k++) {
        tp_msg_buf *bufs = k ? m->tensors : m->payloads;
        uint32_t n = k ? m->ntensors : m->npayloads;
        for (uint32_t i = 0; i < n; i++) {
            if (bufs[i].data == NULL && bufs[i].len > 0) {
                bufs[i].data = tp__alloc(bufs[i].len);
                if (bufs[i].data == NULL) {
                    tp__list_append(&p->p_reads, r);
                    tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL,
                                              "read: out of memory for the "
                                              "message's buffers"));
                    return;
                }
                bufs[i].pipe_owned = true;
            }
        }
    }
    unsigned niovs = m->npayloads + m->ntensors;
    unsigned nchan = m->ntensors;
    r->r_iovs = niovs ? tp__alloc(niovs * sizeof(*r->r_iovs)) : NULL;
    r->r_ops = nchan ? tp__zalloc(nchan * sizeof(*r->r_ops)) : NULL;
    tp__list_append(&p->p_reads, r);
    if ((niovs && r->r_iovs == NULL) || (nchan && r->r_ops == NULL)) {
        tp__pipe_fail(p, pipe_err(p, TP_ENOMEM, NULL, "read: out of memory"));
        return;
    }
    unsigned n = 0;
    for (uint32_t i = 0; i < m->npayloads; i++) {
        if (m->payloads[i].len > 0) {
            r->r_iovs[n++] = (tp_iov){m->payloads[i].data, m->payloads[i].len};
        }
    }
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len > 0 && m->tensors[i].len <= inl) {
            r->r_iovs[n++] = (tp_iov){m->tensors[i].data, m->tensors[i].len};
        }
    }
    r->r_niovs = n;
    if (n > 0) {
        p->p_rstate = RD_INLINE;
        p->p_rcursor = r;
        rop_submit_group(r);
    } else {
        r->r_conn_done = true;
        p->p_rstate = RD_IDLE;
    }
    unsigned k = 0;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        if (m->tensors[i].len <= inl) {
            continue;
        }
        tp_chan_op *op = &r->r_ops[k++];
        op->co_buf = m->tensors[i].data;
        op->co_len = m->tensors[i].len;
        op->co_seq = r->r_seq;
        op->co_index = i;
        op->co_info = r->r_infos[i];
        op->co_done = rop_chan_done;
        op->co_arg = r;
        r->r_ops_pending++;
        p->p_busy++;
        p->p_chops->recv(p->p_chan, op);
    }
    r->r_nops = k;
    rop_check(r);
    pipe_flush_reads(p);
    pipe_read_pump(p);
}

void
tp_pipe_read(tp_pipe *p, tp_message *msg, tp_aio *aio)
{
    aio->a_input[0] = msg;
    tp__aio_submit(aio, p->p_ctx->x_loop, pipe_read_start, p);
}

// ---- the rest of the public API --------------------------------------------

tp_status
tp_pipe_wait_ready(tp_pipe *p, int64_t timeout_ms, tp_error **err_p)
{
    uint64_t deadline =
        timeout_ms > 0 ? tp__deadline_after_ms(timeout_ms) : UINT64_MAX;
    tp__mtx_lock(&p->p_mtx);
    int st;
    while ((st = atomic_load_explicit(&p->p_pub_state, memory_order_acquire)) ==
           PIPE_HS) {
        if (!tp__cv_wait_until(&p->p_cv, &p->p_mtx, deadline) &&
            atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
                PIPE_HS) {
            tp__mtx_unlock(&p->p_mtx);
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "pipe to %s: not ready after %lld ms",
                                 p->p_peer, (long long)timeout_ms);
        }
    }
    tp__mtx_unlock(&p->p_mtx);
    if (st == PIPE_FAILED) {
        if (err_p != NULL) {
            *err_p = tp_error_ref(p->p_err);
        }
        return tp_error_status(p->p_err);
    }
    return TP_OK;
}

char *
tp_pipe_report(tp_pipe *p)
{
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
            PIPE_HS ||
        p->p_report[0] == '\0') {
        return NULL;
    }
    return strdup(p->p_report);
}

const char *
tp_pipe_transport(const tp_pipe *p)
{
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
        PIPE_HS) {
        return NULL;
    }
    return p->p_tr ? p->p_tr->cb_name : NULL;
}

const char *
tp_pipe_channel(const tp_pipe *p)
{
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
        PIPE_HS) {
        return NULL;
    }
    return p->p_ch ? p->p_ch->cb_name : NULL;
}

const char *
tp_pipe_peer(const tp_pipe *p)
{
    return p->p_peer;
}

static void
pipe_close_task(void *arg)
{
    tp_pipe *p = arg;
    tp__pipe_fail(p, tp__error_new(TP_ECLOSED, 0, NULL,
                                   "pipe to %s: closed locally", p->p_peer));
    tp__pipe_release_hold(p); // the task's
}

void
tp_pipe_close(tp_pipe *p)
{
    if (p == NULL ||
        atomic_load_explicit(&p->p_ctx_dead, memory_order_acquire)) {
        return;
    }
    // One close task per pipe: later calls find it posted.
    if (atomic_exchange_explicit(&p->p_close_posted, true,
                                 memory_order_acq_rel)) {
        return;
    }
    atomic_fetch_add_explicit(&p->p_holds, 1, memory_order_relaxed);
    tp__task_init(&p->p_uclose_task, pipe_close_task, p);
    tp__loop_post(p->p_ctx->x_loop, &p->p_uclose_task);
}

tp_pipe *
tp_pipe_ref(tp_pipe *p)
{
    atomic_fetch_add_explicit(&p->p_urefs, 1, memory_order_relaxed);
    return p;
}

void
tp_pipe_unref(tp_pipe *p)
{
    if (p == NULL) {
        return;
    }
    if (atomic_fetch_sub_explicit(&p->p_urefs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp_pipe_close(p);
    tp__pipe_release_hold(p); // the user's
}
