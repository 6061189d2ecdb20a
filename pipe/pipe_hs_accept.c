// SPDX-License-Identifier: Apache-2.0
// pipe_hs_accept.c - the accepting half of the handshake: a brochure
// arrives (context.c reads the first frame), the choice of transport and
// channel and its report, the answer, and the joins of the connections the
// answer asked for.
//
// Everything runs on the context's loop thread (x_loop); see pipe_impl.h.

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/wire.h"
#include "pipe_impl.h"

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

// Channel @c (offered by the peer as @e, NULL: not offered), which carries
// no host buffers: the device channel if none is chosen yet and both ends
// can use it; a line of p_report (and a note for the peer) either way.
static void
pipe_choose_device(tp_pipe *p, ctx_backend *c, const tp__brochure_entry *e,
                   char *notes, size_t notes_len)
{
    char *rep = p->p_report;
    size_t cap = sizeof(p->p_report);
    bool lanes = false;
    c->cb_channel_ops->nconns(&p->p_ctx->x_cfg, &lanes);
    if (p->p_dch != NULL) {
        tp__report_add(rep, cap,
                       "channel %s: usable, lower priority than %s (device "
                       "channel)\n",
                       c->cb_name, p->p_dch->cb_name);
        tp__report_add(notes, notes_len, "%s: lower priority; ", c->cb_name);
    } else if (e == NULL) {
        tp__report_add(rep, cap,
                       "channel %s: the peer does not offer it (not "
                       "registered, allowed or viable there); cuda tensors "
                       "are staged through host memory\n",
                       c->cb_name);
    } else if (strcmp(e->be_domain, c->cb_domain) != 0) {
        tp__report_add(rep, cap,
                       "channel %s: domain descriptors differ (ours \"%s\", "
                       "peer's \"%s\"); cuda tensors are staged through host "
                       "memory\n",
                       c->cb_name, c->cb_domain, e->be_domain);
        tp__report_add(notes, notes_len, "%s: domains differ; ", c->cb_name);
    } else if (lanes) {
        tp__report_add(rep, cap,
                       "channel %s: a device channel cannot use lanes\n",
                       c->cb_name);
    } else {
        p->p_dch = c;
        tp__report_add(rep, cap, "channel %s: chosen for cuda tensors\n",
                       c->cb_name);
    }
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
        } else if (tp__chan_is_device(c->cb_channel_ops)) {
            // A device channel: CUDA tensors go on it when both ends have
            // it, else they are staged through host memory (pipe_cuda.c).
            pipe_choose_device(p, c, e, notes, notes_len);
        } else if (!(c->cb_channel_ops->devices & TP_CHAN_DEV_CPU_CPU)) {
            tp__report_add(rep, cap,
                           "channel %s: carries no cpu-cpu tensors and is "
                           "no device channel (devices 0x%x)\n",
                           c->cb_name, c->cb_channel_ops->devices);
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
        } else if (lanes && !(p->p_tr->cb_transport->t_ops->props &
                              TP_TRANSPORT_PROP_NETWORK)) {
            tp__report_add(rep, cap,
                           "channel %s: not over transport %s (it does not "
                           "reach other hosts: same-host memory beats "
                           "network lanes)\n",
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

// The answer holds TP_WIRE_MAX_CONNS connections for both channels: a
// device channel that does not fit beside the channel's lanes is dropped
// (cuda tensors are then staged).
static void
pipe_device_room(tp_pipe *p, tp_pipe_listener *pl)
{
    if (p->p_dch == NULL) {
        return;
    }
    const tp_config *cfg = &p->p_ctx->x_cfg;
    bool lanes = false;
    unsigned n = p->p_ch->cb_channel_ops->nconns(cfg, &lanes);
    if (lanes) {
        n = (unsigned)pl->pl_nlanes;
    }
    unsigned dn = p->p_dch->cb_channel_ops->nconns(cfg, &lanes);
    if (n + dn > TP_WIRE_MAX_CONNS) {
        tp__report_add(p->p_report, sizeof(p->p_report),
                       "channel %s: not used: its %u connections and %s's %u "
                       "exceed the answer's %u; cuda tensors are staged\n",
                       p->p_dch->cb_name, dn, p->p_ch->cb_name, n,
                       TP_WIRE_MAX_CONNS);
        p->p_dch = NULL;
    }
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
            tp__pipe_fail(p, tp__pipe_err(p, tp_aio_status(&aw->aw_aio),
                                          tp_aio_error(&aw->aw_aio),
                                          "writing the handshake answer"));
        }
        tp__pipe_busy_done(p);
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
            tp__pipe_fail(p, tp__pipe_err(p, TP_ENOMEM, NULL,
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
        tp__pipe_fail(p, tp__pipe_err(p, TP_EUNREACHABLE, NULL, why));
        tp__pipe_release_hold(p); // never given to a user
        tp__free(b);
        tp__free(a);
        return;
    }
    pipe_device_room(p, pl);
    {
        char lines[TP_REPORT_LEN];
        snprintf(lines, sizeof(lines), "%s", p->p_report);
        p->p_report[0] = '\0';
        tp__report_add(p->p_report, sizeof(p->p_report),
                       "pipe from %s: transport %s, channel %s%s%s\n",
                       p->p_peer, p->p_tr->cb_name, p->p_ch->cb_name,
                       p->p_dch != NULL ? ", cuda tensors by " : "",
                       p->p_dch != NULL ? p->p_dch->cb_name : "");
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
            tp__pipe_fail(p, tp__pipe_err(p, TP_ENOMEM, NULL, "handshake"));
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
    unsigned dn = 0;
    if (p->p_dch != NULL) {
        bool dlanes = false;
        dn = p->p_dch->cb_channel_ops->nconns(&ctx->x_cfg, &dlanes);
        p->p_dchops = p->p_dch->cb_channel_ops;
        snprintf(a->a_dchannel, sizeof(a->a_dchannel), "%s", p->p_dch->cb_name);
    }
    p->p_nextra_ch = n;
    p->p_nextra = n + dn;
    n += dn;
    p->p_extra = n ? tp__zalloc(n * sizeof(*p->p_extra)) : NULL;
    p->p_reg_extra = n ? tp__zalloc(n * sizeof(*p->p_reg_extra)) : NULL;
    if (n > 0 && (p->p_extra == NULL || p->p_reg_extra == NULL)) {
        tp__pipe_fail(p, tp__pipe_err(p, TP_ENOMEM, NULL, "handshake"));
        goto out;
    }
    a->a_nconns = (uint16_t)p->p_nextra_ch;
    a->a_dnconns = (uint16_t)dn;
    for (unsigned i = 0; i < n; i++) {
        p->p_reg_extra[i] = tp__random_u64();
        a->a_conns[i].ac_reg_id = p->p_reg_extra[i];
        bool lane_conn = lanes && i < p->p_nextra_ch;
        snprintf(a->a_conns[i].ac_addr, sizeof(a->a_conns[i].ac_addr), "%s",
                 lane_conn ? tp__listener_lane_addr(pl, i)
                           : tp_pipe_listener_addr(pl, p->p_tr->cb_name));
    }
    tp__pipe_arm_hs_timer(p, ctx->x_cfg.handshake_timeout_ms);
    send_answer(ctx, p, conn, a);
    if (p->p_state == PIPE_HS && p->p_reg_main == 0 && n == 0) {
        tp__pipe_ready(p);
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
            lanes = lanes && index < p->p_nextra_ch; // device conns: no lanes
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
            tp__pipe_ready(p);
        }
        return true;
    }
    return false;
}
