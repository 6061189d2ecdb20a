// SPDX-License-Identifier: Apache-2.0
// context.c - the context (registered transports and channels, the loop,
// the copy pool, mpt lanes), pipe listeners, and the first frame of each
// accepted connection (a brochure starts a pipe, a join completes one).

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "pipe_impl.h"

#define CTX_DESTROY_WAIT_NS (30ull * 1000000000ull)

// ---- names, allow and deny lists --------------------------------------------

// Next name of a comma-separated list (blanks around names ignored):
// false at the end, else *tok_p / *len_p and *p_p moved past it.
static bool
ctx_list_next(const char **p_p, const char **tok_p, size_t *len_p)
{
    const char *p = *p_p;
    while (*p == ',' || isspace((unsigned char)*p)) {
        p++;
    }
    if (*p == '\0') {
        *p_p = p;
        return false;
    }
    const char *e = p;
    while (*e != '\0' && *e != ',') {
        e++;
    }
    const char *t = e;
    while (t > p && isspace((unsigned char)t[-1])) {
        t--;
    }
    *tok_p = p;
    *len_p = (size_t)(t - p);
    *p_p = e;
    return true;
}

static bool
ctx_tok_is(const char *tok, size_t len, const char *name)
{
    return strlen(name) == len && strncmp(tok, name, len) == 0;
}

// True if @name is in the comma-separated @list.
static bool
ctx_list_has(const char *list, const char *name)
{
    const char *p = list, *tok;
    size_t len;
    while (p != NULL && ctx_list_next(&p, &tok, &len)) {
        if (ctx_tok_is(tok, len, name)) {
            return true;
        }
    }
    return false;
}

// Every name of @list must be in @known (n entries): else TP_EINVAL naming
// it and listing the known ones.
static tp_status
ctx_check_list(const char *what, const char *list, const char *const *known,
               size_t n, tp_error **err_p)
{
    const char *p = list, *tok;
    size_t len;
    while (p != NULL && ctx_list_next(&p, &tok, &len)) {
        bool found = false;
        for (size_t i = 0; i < n && !found; i++) {
            found = ctx_tok_is(tok, len, known[i]);
        }
        if (!found) {
            char names[256] = "";
            for (size_t i = 0; i < n; i++) {
                tp__report_add(names, sizeof(names), "%s%s", i ? ", " : "",
                               known[i]);
            }
            return tp__error_set(err_p, TP_EINVAL,
                                 "context options: unknown %s \"%.*s\" in "
                                 "\"%s\" (known: %s)",
                                 what, (int)len, tok, list, names);
        }
    }
    return TP_OK;
}

static bool
ctx_allowed(const char *allow, const char *deny, const char *name,
            const char *kind, char *why, size_t why_len)
{
    if (allow != NULL && *allow != '\0' && !ctx_list_has(allow, name)) {
        snprintf(why, why_len, "not allowed by the options (%ss=\"%s\")", kind,
                 allow);
        return false;
    }
    if (deny != NULL && ctx_list_has(deny, name)) {
        snprintf(why, why_len, "denied by the options (deny_%ss=\"%s\")", kind,
                 deny);
        return false;
    }
    return true;
}

void
tp__report_add(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= cap) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

// ---- objects the context waits for -----------------------------------------

void
tp__ctx_obj_add(tp_context *ctx)
{
    tp__mtx_lock(&ctx->x_mtx);
    ctx->x_nobjs++;
    tp__mtx_unlock(&ctx->x_mtx);
}

void
tp__ctx_obj_done(tp_context *ctx)
{
    tp__mtx_lock(&ctx->x_mtx);
    ctx->x_nobjs--;
    if (ctx->x_nobjs == 0) {
        tp__cv_broadcast(&ctx->x_cv);
    }
    tp__mtx_unlock(&ctx->x_mtx);
}

ctx_backend *
tp__ctx_transport(tp_context *ctx, const char *name)
{
    for (size_t i = 0; i < ctx->x_ntr; i++) {
        if (ctx->x_tr[i].cb_used && strcmp(ctx->x_tr[i].cb_name, name) == 0) {
            return &ctx->x_tr[i];
        }
    }
    return NULL;
}

// ---- create / destroy ------------------------------------------------------

void
tp_context_options_init(tp_context_options *o)
{
    if (o == NULL) {
        return;
    }
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
}

// The oldest layout with a size field ends after mpt_lanes. Fields added
// later go after it; a caller built before them passes a smaller size
// and they keep the defaults of tp_context_options_init.
#define CTX_OPTS_MIN_SIZE                                                      \
    (offsetof(tp_context_options, mpt_lanes) + sizeof(int))

static void
ctx_setup_transports(tp_context *ctx, const tp_context_options *o)
{
    size_t n;
    const tp_transport_ops *const *reg = tp__transport_registry(&n);
    for (size_t i = 0; i < n && ctx->x_ntr < TP_CTX_MAX_BACKENDS; i++) {
        ctx_backend *b = &ctx->x_tr[ctx->x_ntr++];
        snprintf(b->cb_name, sizeof(b->cb_name), "%s", reg[i]->name);
        char why[200];
        if (!ctx_allowed(o->transports, o->deny_transports, reg[i]->name,
                         "transport", b->cb_why, sizeof(b->cb_why))) {
            continue;
        }
        if (!reg[i]->is_viable(&ctx->x_cfg, why, sizeof(why))) {
            snprintf(b->cb_why, sizeof(b->cb_why), "not viable here: %s", why);
            continue;
        }
        tp_error *err = NULL;
        if (tp__transport_create(reg[i]->name, ctx->x_loop, &ctx->x_cfg,
                                 &b->cb_transport, &err) != TP_OK) {
            snprintf(b->cb_why, sizeof(b->cb_why), "failed to start: %s",
                     tp_error_message(err));
            tp_error_unref(err);
            continue;
        }
        snprintf(b->cb_domain, sizeof(b->cb_domain), "%s",
                 tp__transport_domain(b->cb_transport));
        b->cb_used = true;
    }
}

static tp_status
ctx_setup_lanes(tp_context *ctx, unsigned nlanes, char *why, size_t why_len)
{
    // Lane loops spin like the others: the spin yields its core whenever
    // another thread can run (core/loop.c), so it costs the copies little
    // (tcp+mpt 1M round trip: 133 us spinning, 376 us sleeping at once).
    for (unsigned i = 0; i < nlanes; i++) {
        char name[16];
        snprintf(name, sizeof(name), "lane%u", i);
        tp_error *err = NULL;
        if (tp__loop_create(&ctx->x_cfg, name, &ctx->x_lane_loops[i], &err) !=
                TP_OK ||
            tp__transport_create("tcp", ctx->x_lane_loops[i], &ctx->x_cfg,
                                 &ctx->x_lane_tr[i], &err) != TP_OK) {
            snprintf(why, why_len, "lane %u failed to start: %s", i,
                     tp_error_message(err));
            tp_error_unref(err);
            ctx->x_nlanes = i + 1;
            return TP_EINTERNAL;
        }
        ctx->x_nlanes = i + 1;
    }
    return TP_OK;
}

static void
ctx_setup_channels(tp_context *ctx, const tp_context_options *o)
{
    size_t n;
    const tp_channel_ops *const *reg = tp__channel_registry(&n);
    for (size_t i = 0; i < n && ctx->x_nch < TP_CTX_MAX_BACKENDS; i++) {
        ctx_backend *b = &ctx->x_ch[ctx->x_nch++];
        const tp_channel_ops *ops = reg[i];
        snprintf(b->cb_name, sizeof(b->cb_name), "%s", ops->name);
        b->cb_channel_ops = ops;
        char why[200];
        if (!ctx_allowed(o->channels, o->deny_channels, ops->name, "channel",
                         b->cb_why, sizeof(b->cb_why))) {
            continue;
        }
        if (!ops->is_viable(&ctx->x_cfg, why, sizeof(why))) {
            snprintf(b->cb_why, sizeof(b->cb_why), "not viable here: %s", why);
            continue;
        }
        tp_error *err = NULL;
        if (ops->domain(&ctx->x_cfg, b->cb_domain, sizeof(b->cb_domain),
                        &err) != TP_OK) {
            snprintf(b->cb_why, sizeof(b->cb_why), "no domain: %s",
                     tp_error_message(err));
            tp_error_unref(err);
            continue;
        }
        bool lanes = false;
        unsigned nconns = ops->nconns(&ctx->x_cfg, &lanes);
        if (lanes) {
            if (tp__ctx_transport(ctx, "tcp") == NULL) {
                snprintf(b->cb_why, sizeof(b->cb_why),
                         "its lanes need the tcp transport, which this "
                         "context does not use");
                continue;
            }
            if (nconns > TP_CTX_MAX_LANES ||
                ctx_setup_lanes(ctx, nconns, why, sizeof(why)) != TP_OK) {
                snprintf(b->cb_why, sizeof(b->cb_why), "%s", why);
                continue;
            }
        }
        b->cb_used = true;
    }
}

// True if some used transport has a used channel that can run over it:
// otherwise every pipe's handshake would fail ("no channel both ends can
// use"), so the context is refused at creation. A lane channel (mpt)
// needs the tcp transport for its lanes (ctx_setup_channels) and is not
// chosen over a same-host transport (pipe_hs_accept.c).
static bool
ctx_any_pair(tp_context *ctx)
{
    for (size_t c = 0; c < ctx->x_nch; c++) {
        const ctx_backend *ch = &ctx->x_ch[c];
        if (!ch->cb_used) {
            continue;
        }
        bool lanes = false;
        (void)ch->cb_channel_ops->nconns(&ctx->x_cfg, &lanes);
        for (size_t t = 0; t < ctx->x_ntr; t++) {
            const ctx_backend *tr = &ctx->x_tr[t];
            if (tr->cb_used &&
                (!lanes || !tr->cb_transport->t_ops->same_host)) {
                return true;
            }
        }
    }
    return false;
}

static void ctx_destroy_parts(tp_context *ctx);

tp_status
tp_context_create(const tp_context_options *o_in, tp_context **ctx_p,
                  tp_error **err_p)
{
    if (ctx_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_context_create: ctx_p is NULL");
    }
    tp_context_options opts;
    tp_context_options_init(&opts);
    if (o_in != NULL) {
        if (o_in->size < CTX_OPTS_MIN_SIZE || o_in->size > sizeof(opts)) {
            return tp__error_set(
                err_p, TP_EINVAL,
                "context options: size %zu unknown to this library "
                "(%zu..%zu): the caller was built against another tpipe "
                "version, or did not call tp_context_options_init",
                o_in->size, (size_t)CTX_OPTS_MIN_SIZE, sizeof(opts));
        }
        memcpy(&opts, o_in, o_in->size);
        opts.size = sizeof(opts);
    }
    const tp_context_options *o = &opts;
    // Check the lists first: a typo is the caller's error, said at once.
    size_t ntr, nch;
    const tp_transport_ops *const *treg = tp__transport_registry(&ntr);
    const tp_channel_ops *const *creg = tp__channel_registry(&nch);
    const char *tnames[TP_CTX_MAX_BACKENDS], *cnames[TP_CTX_MAX_BACKENDS];
    for (size_t i = 0; i < ntr && i < TP_CTX_MAX_BACKENDS; i++) {
        tnames[i] = treg[i]->name;
    }
    for (size_t i = 0; i < nch && i < TP_CTX_MAX_BACKENDS; i++) {
        cnames[i] = creg[i]->name;
    }
    tp_status st;
    if ((st = ctx_check_list("transport", o->transports, tnames, ntr, err_p)) !=
            TP_OK ||
        (st = ctx_check_list("transport", o->deny_transports, tnames, ntr,
                             err_p)) != TP_OK ||
        (st = ctx_check_list("channel", o->channels, cnames, nch, err_p)) !=
            TP_OK ||
        (st = ctx_check_list("channel", o->deny_channels, cnames, nch,
                             err_p)) != TP_OK) {
        return st;
    }
    if (o->name != NULL &&
        (strlen(o->name) == 0 || strlen(o->name) > TP_WIRE_MAX_CTXNAME)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "context options: name \"%s\" must have 1..%u "
                             "bytes",
                             o->name, TP_WIRE_MAX_CTXNAME);
    }

    tp_context *ctx = tp__zalloc(sizeof(*ctx));
    if (ctx == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "context: out of memory");
    }
    tp__mtx_init(&ctx->x_mtx);
    tp__cv_init(&ctx->x_cv);
    TP_LIST_INIT(&ctx->x_pipes, tp_pipe, p_ctx_node);
    TP_LIST_INIT(&ctx->x_listeners, tp_pipe_listener, pl_node);
    TP_LIST_INIT(&ctx->x_pending, pending_conn, pc_node);
    if (o->name != NULL) {
        snprintf(ctx->x_name, sizeof(ctx->x_name), "%s", o->name);
    } else {
        snprintf(ctx->x_name, sizeof(ctx->x_name), "tpipe-%d", (int)getpid());
    }
    if ((st = tp__config_load(&ctx->x_cfg, err_p)) != TP_OK) {
        goto fail;
    }
    if (o->mpt_lanes < 0 || o->mpt_lanes > TP_CTX_MAX_LANES) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "context options: mpt_lanes %d out of 0..%d",
                           o->mpt_lanes, TP_CTX_MAX_LANES);
        goto fail;
    }
    if (o->mpt_lanes > 0) {
        ctx->x_cfg.mpt_lanes = o->mpt_lanes;
    }
    ctx->x_limits.max_metadata = (uint64_t)ctx->x_cfg.pipe_max_metadata;
    ctx->x_limits.max_payloads = (uint32_t)ctx->x_cfg.pipe_max_payloads;
    ctx->x_limits.max_tensors = (uint32_t)ctx->x_cfg.pipe_max_tensors;
    ctx->x_limits.max_buf_len = (uint64_t)ctx->x_cfg.pipe_max_buf_bytes;
    if ((st = tp__loop_create(&ctx->x_cfg, "ctx", &ctx->x_loop, err_p)) !=
        TP_OK) {
        goto fail;
    }
    if ((st = tp__pool_create(2, "copy", &ctx->x_pool, err_p)) != TP_OK) {
        goto fail;
    }
    ctx_setup_transports(ctx, o);
    bool any = false;
    for (size_t i = 0; i < ctx->x_ntr; i++) {
        any = any || ctx->x_tr[i].cb_used;
    }
    if (!any) {
        char *rep = tp_context_report(ctx);
        st = tp__error_set(err_p, TP_EINVAL,
                           "context %s: no usable transport:\n%s", ctx->x_name,
                           rep ? rep : "");
        free(rep);
        goto fail;
    }
    ctx_setup_channels(ctx, o);
    if (!ctx_any_pair(ctx)) {
        char *why = tp_context_report(ctx);
        st = tp__error_set(err_p, TP_EINVAL,
                           "context %s: the allow lists leave no transport "
                           "and channel that work together, so no pipe could "
                           "connect (a lane channel such as mpt needs the "
                           "tcp transport):\n%s",
                           ctx->x_name, why ? why : "");
        free(why);
        goto fail;
    }
    char *rep = tp_context_report(ctx);
    TP_LOG_DEBUG("TP-CONTEXT", "context %s created:\n%s", ctx->x_name,
                 rep ? rep : "");
    free(rep);
    *ctx_p = ctx;
    return TP_OK;

fail:
    ctx_destroy_parts(ctx);
    return st;
}

static void
ctx_destroy_parts(tp_context *ctx)
{
    for (unsigned i = 0; i < ctx->x_nlanes; i++) {
        tp__transport_destroy(ctx->x_lane_tr[i]);
        tp__loop_destroy(ctx->x_lane_loops[i]);
    }
    for (size_t i = 0; i < ctx->x_ntr; i++) {
        tp__transport_destroy(ctx->x_tr[i].cb_transport);
    }
    tp__pool_destroy(ctx->x_pool);
    if (ctx->x_loop != NULL) {
        tp__loop_destroy(ctx->x_loop);
    }
    tp__cv_fini(&ctx->x_cv);
    tp__mtx_fini(&ctx->x_mtx);
    tp__free(ctx);
}

static void listener_close(tp_pipe_listener *pl);
static void pl_maybe_free(tp_pipe_listener *pl);

static void
ctx_close_all_task(void *arg)
{
    tp_context *ctx = arg;
    ctx->x_closing = true;
    tp_pipe_listener *pl;
    while ((pl = tp__list_first(&ctx->x_listeners)) != NULL) {
        tp__list_remove(&ctx->x_listeners, pl);
        pl->pl_destroy_req = true;
        listener_close(pl);
        pl_maybe_free(pl); // nothing in flight: nothing else would free it
    }
    // Pending first frames: closing the conn fails their read.
    for (pending_conn *pc = tp__list_first(&ctx->x_pending); pc != NULL;
         pc = tp__list_next(&ctx->x_pending, pc)) {
        tp__conn_close(pc->pc_conn);
    }
    for (tp_pipe *p = tp__list_first(&ctx->x_pipes); p != NULL;) {
        tp_pipe *next = tp__list_next(&ctx->x_pipes, p);
        tp__pipe_fail(p, tp__error_new(TP_ECLOSED, 0, NULL,
                                       "pipe to %s: context %s closed",
                                       p->p_peer, ctx->x_name));
        p = next;
    }
}

void
tp_context_destroy(tp_context *ctx)
{
    if (ctx == NULL) {
        return;
    }
    TP_ASSERT(!tp__loop_on_thread(ctx->x_loop));
    tp__loop_call(ctx->x_loop, ctx_close_all_task, ctx);
    uint64_t deadline = tp__now_ns() + CTX_DESTROY_WAIT_NS;
    tp__mtx_lock(&ctx->x_mtx);
    bool leaked = false;
    while (ctx->x_nobjs > 0) {
        if (!tp__cv_wait_until(&ctx->x_cv, &ctx->x_mtx, deadline) &&
            ctx->x_nobjs > 0) {
            leaked = true;
            break;
        }
    }
    int left = ctx->x_nobjs;
    tp__mtx_unlock(&ctx->x_mtx);
    if (leaked) {
        // Never hang: say what is stuck and leak the context.
        TP_LOG_ERROR("TP-CONTEXT-LEAK",
                     "context %s: %d pipes/listeners still busy after 30 s; "
                     "leaking the context",
                     ctx->x_name, left);
        return;
    }
    ctx_destroy_parts(ctx);
}

const char *
tp_context_name(const tp_context *ctx)
{
    if (ctx == NULL) {
        return NULL;
    }
    return ctx->x_name;
}

char *
tp_context_report(const tp_context *ctx)
{
    if (ctx == NULL) {
        return NULL;
    }
    size_t cap = 4096;
    char *out = malloc(cap);
    if (out == NULL) {
        return NULL;
    }
    out[0] = '\0';
    const struct {
        const char *kind;
        const ctx_backend *b;
        size_t n;
    } groups[] = {{"transport", ctx->x_tr, ctx->x_ntr},
                  {"channel", ctx->x_ch, ctx->x_nch}};
    for (size_t g = 0; g < 2; g++) {
        for (size_t i = 0; i < groups[g].n; i++) {
            const ctx_backend *b = &groups[g].b[i];
            if (b->cb_used) {
                tp__report_add(out, cap,
                               "%s %s: usable, priority %zu, domain \"%s\"\n",
                               groups[g].kind, b->cb_name, i + 1, b->cb_domain);
            } else {
                tp__report_add(out, cap, "%s %s: %s\n", groups[g].kind,
                               b->cb_name, b->cb_why);
            }
        }
    }
    if (ctx->x_nlanes > 0) {
        tp__report_add(out, cap, "mpt lanes: %u\n", ctx->x_nlanes);
    }
    return out;
}

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

static void
pl_maybe_free(tp_pipe_listener *pl)
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
    pl_maybe_free(pl);
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

// "tcp://HOST:PORT" -> "tcp://HOST:0".
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

static void
listener_close(tp_pipe_listener *pl)
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
    const char *tcp_url = NULL;
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
        if (strcmp(b->cb_name, "tcp") == 0) {
            tcp_url = pl->pl_addrs[k];
        }
    }
    // mpt lanes listen on the host of the tcp listener, any port.
    for (unsigned i = 0; i < ctx->x_nlanes && tcp_url != NULL; i++) {
        char url[TP_WIRE_MAX_ADDR + 1];
        pl_port0(tcp_url, url, sizeof(url));
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
    listener_close(pl);
    pl_maybe_free(pl);
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
        pl_maybe_free(pc->pc_pl);
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
