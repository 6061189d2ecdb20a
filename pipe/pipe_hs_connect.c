// SPDX-License-Identifier: Apache-2.0
// pipe_hs_connect.c - the connecting half of the handshake:
// tp_context_connect, the brochure, reading the answer and its report, the
// upgrade to another transport, and the channel's extra connections.
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

enum {
    HS_CONNECT = 0,
    HS_BROCHURE = 1,
    HS_ANS_HDR = 2,
    HS_ANS_BODY = 3,
    HS_MAIN_CONNECT = 4,
    HS_MAIN_JOIN = 5,
    HS_EXTRAS = 6,
};

// ---- the connecting side of the handshake
// ------------------------------------

static void hs_step(tp_pipe *p);

static void
hs_fail(tp_pipe *p, tp_status st, const tp_error *cause, const char *what)
{
    tp__pipe_fail(p, tp__pipe_err(p, st, cause, what));
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
        tp__pipe_busy_done(p);
        return;
    }
    tp__pipe_busy_done(p);
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
        tp__pipe_busy_done(p);
        return;
    }
    tp__pipe_busy_done(p);
    if (tp_aio_status(&he->he_aio) != TP_OK) {
        char what[96];
        bool dev = he->he_idx >= p->p_nextra_ch;
        snprintf(what, sizeof(what), "%s connection %u of channel %s",
                 he->he_step == 0 ? "opening" : "joining",
                 dev ? he->he_idx - p->p_nextra_ch : he->he_idx,
                 dev ? p->p_dch->cb_name : p->p_ch->cb_name);
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
        tp__pipe_ready(p);
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
    unsigned nch = hs->h_ans.a_nconns;
    unsigned n = nch + hs->h_ans.a_dnconns;
    if ((!lanes && nch != want) ||
        (lanes && (nch == 0 || ctx->x_nlanes == 0))) {
        char what[128];
        snprintf(what, sizeof(what),
                 "protocol error: the answer asks for %u connections for "
                 "channel %s",
                 nch, p->p_ch->cb_name);
        hs_fail(p, TP_EPROTO, NULL, what);
        return;
    }
    p->p_nextra = n;
    p->p_nextra_ch = nch;
    if (n == 0) {
        tp__pipe_ready(p);
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
        tp_transport *t = lanes && i < nch ? ctx->x_lane_tr[i % ctx->x_nlanes]
                                           : p->p_tr->cb_transport;
        p->p_busy++;
        tp__transport_connect(t, hs->h_ans.a_conns[i].ac_addr, &he->he_aio);
    }
}

// The answer's device channel (a_dchannel, "" = none) must be one we
// offered that carries CUDA tensors, with the connections it asks for.
static bool
hs_device_channel(tp_pipe *p, const tp__answer *a)
{
    tp_context *ctx = p->p_ctx;
    if (a->a_dchannel[0] == '\0') {
        return true;
    }
    for (size_t i = 0; i < ctx->x_nch; i++) {
        ctx_backend *c = &ctx->x_ch[i];
        if (c->cb_used && strcmp(c->cb_name, a->a_dchannel) == 0 &&
            tp__chan_is_device(c->cb_channel_ops)) {
            p->p_dch = c;
        }
    }
    bool lanes = false;
    unsigned want = p->p_dch != NULL
                        ? p->p_dch->cb_channel_ops->nconns(&ctx->x_cfg, &lanes)
                        : 0;
    if (p->p_dch == NULL || lanes || a->a_dnconns != want) {
        char what[192];
        snprintf(what, sizeof(what),
                 "protocol error: the peer chose device channel \"%s\" with "
                 "%u connections (%s)",
                 a->a_dchannel, a->a_dnconns,
                 p->p_dch == NULL ? "not a device channel we offered"
                                  : "it needs a different number");
        p->p_dch = NULL;
        hs_fail(p, TP_EPROTO, NULL, what);
        return false;
    }
    p->p_dchops = p->p_dch->cb_channel_ops;
    return true;
}

static void
hs_connector_report(tp_pipe *p)
{
    tp_context *ctx = p->p_ctx;
    tp__answer *a = &p->p_hs->h_ans;
    char *rep = p->p_report;
    size_t cap = sizeof(p->p_report);
    snprintf(rep, cap, "pipe to %s: transport %s, channel %s%s%s\n", p->p_peer,
             a->a_transport, a->a_channel,
             a->a_dchannel[0] != '\0' ? ", cuda tensors by " : "",
             a->a_dchannel);
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
            } else if (k == 1 && strcmp(b->cb_name, a->a_dchannel) == 0) {
                tp__report_add(rep, cap,
                               "channel %s: chosen for cuda tensors\n",
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
        tp__pipe_arm_hs_timer(p, ctx->x_cfg.handshake_timeout_ms);
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
        if (!(p->p_ch->cb_channel_ops->devices & TP_CHAN_DEV_CPU_CPU)) {
            char what[160];
            snprintf(what, sizeof(what),
                     "protocol error: the peer chose channel \"%s\" for "
                     "the pipe, which carries no cpu-cpu tensors",
                     a->a_channel);
            hs_fail(p, TP_EPROTO, NULL, what);
            return;
        }
        p->p_chops = p->p_ch->cb_channel_ops;
        if (!hs_device_channel(p, a)) {
            return;
        }
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
        tp__pipe_fail(p, tp__pipe_err(p, TP_ENOMEM, NULL, "connect"));
        return;
    }
    p->p_hs = hs;
    hs->h_pipe = p;
    hs->h_tr0 = ca->tr;
    tp__aio_init(&hs->h_aio, hs_cb, p);
    tp_aio_set_timeout(&hs->h_aio, ctx->x_cfg.connect_timeout_ms);
    tp__pipe_arm_hs_timer(p, ctx->x_cfg.connect_timeout_ms +
                                 ctx->x_cfg.handshake_timeout_ms);
    hs->h_step = HS_CONNECT;
    p->p_busy++;
    tp__transport_connect(ca->tr, ca->url, &hs->h_aio);
}

tp_status
tp_context_connect(tp_context *ctx, const char *url, tp_pipe **pipe_p,
                   tp_error **err_p)
{
    if (ctx == NULL || url == NULL || pipe_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_context_connect: %s is NULL",
                             ctx == NULL   ? "ctx"
                             : url == NULL ? "url"
                                           : "pipe_p");
    }
    const char *sep = strstr(url, "://");
    if (sep == NULL || strlen(url) > TP_WIRE_MAX_ADDR) {
        return tp__error_set(err_p, TP_EINVAL,
                             "context %s: connect: bad URL \"%s\" (expected "
                             "TRANSPORT://ADDRESS, e.g. tcp://127.0.0.1:5000)",
                             ctx->x_name, url);
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
