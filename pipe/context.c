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
    for (size_t i = 0; i < n && ctx->x_ntr < TP_WIRE_MAX_BACKENDS; i++) {
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
            tp__transport_create(ctx->x_lane_ops->name, ctx->x_lane_loops[i],
                                 &ctx->x_cfg, &ctx->x_lane_tr[i],
                                 &err) != TP_OK) {
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

// The lane transport: the first transport this context uses (registry
// order: built, allowed, viable, started) that reaches other hosts. NULL
// when there is none; @why then says so, naming the built ones that have
// the property.
static const tp_transport_ops *
ctx_lane_transport(tp_context *ctx, char *why, size_t why_len)
{
    for (size_t t = 0; t < ctx->x_ntr; t++) {
        const ctx_backend *b = &ctx->x_tr[t];
        if (b->cb_used &&
            (b->cb_transport->t_ops->props & TP_TRANSPORT_PROP_NETWORK)) {
            return b->cb_transport->t_ops;
        }
    }
    char built[128] = "";
    size_t n, off = 0;
    const tp_transport_ops *const *reg = tp__transport_registry(&n);
    for (size_t i = 0; i < n; i++) {
        if ((reg[i]->props & TP_TRANSPORT_PROP_NETWORK) &&
            off < sizeof(built)) {
            int k = snprintf(built + off, sizeof(built) - off, "%s%s",
                             off ? ", " : "", reg[i]->name);
            off += k > 0 ? (size_t)k : 0;
        }
    }
    snprintf(why, why_len,
             "its lanes need a transport that reaches other hosts (network "
             "property; built: %s), and this context uses none (not "
             "allowed, or not viable: see its transports)",
             built[0] ? built : "none");
    return NULL;
}

static void
ctx_setup_channels(tp_context *ctx, const tp_context_options *o)
{
    size_t n;
    const tp_channel_ops *const *reg = tp__channel_registry(&n);
    for (size_t i = 0; i < n && ctx->x_nch < TP_WIRE_MAX_BACKENDS; i++) {
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
        if ((ops->devices & (TP_CHAN_DEV_CPU_CPU | TP_CHAN_DEV_CUDA_CUDA |
                             TP_CHAN_DEV_CPU_CUDA)) == 0) {
            snprintf(b->cb_why, sizeof(b->cb_why),
                     "declares no device pair it carries (devices 0x%x)",
                     (unsigned)ops->devices);
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
            ctx->x_lane_ops =
                ctx_lane_transport(ctx, b->cb_why, sizeof(b->cb_why));
            if (ctx->x_lane_ops == NULL) {
                continue;
            }
            if (nconns > TP_CTX_MAX_LANES ||
                ctx_setup_lanes(ctx, nconns, why, sizeof(why)) != TP_OK) {
                snprintf(b->cb_why, sizeof(b->cb_why), "%s", why);
                continue;
            }
            // Both ends must lane over the same transport: it joins the
            // domain descriptor, so ends that differ never pair.
            size_t dl = strlen(b->cb_domain);
            snprintf(b->cb_domain + dl, sizeof(b->cb_domain) - dl, ":lanes=%s",
                     ctx->x_lane_ops->name);
        }
        b->cb_used = true;
    }
}

// True if some used transport has a used channel that can run over it:
// otherwise every pipe's handshake would fail ("no channel both ends can
// use"), so the context is refused at creation. A lane channel (mpt)
// needs a network transport for its lanes (ctx_setup_channels) and is
// chosen only over a network transport (pipe_hs_accept.c).
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
            if (tr->cb_used && (!lanes || (tr->cb_transport->t_ops->props &
                                           TP_TRANSPORT_PROP_NETWORK))) {
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
    size_t ntr, nch;
    const tp_transport_ops *const *treg = tp__transport_registry(&ntr);
    const tp_channel_ops *const *creg = tp__channel_registry(&nch);
    // A context offers every backend it uses in one brochure, which
    // carries at most TP_WIRE_MAX_BACKENDS of each kind: refuse a build
    // with more rather than drop some (configure refuses it too).
    if (ntr > TP_WIRE_MAX_BACKENDS || nch > TP_WIRE_MAX_BACKENDS) {
        bool tr = ntr > TP_WIRE_MAX_BACKENDS;
        return tp__error_set(err_p, TP_EINVAL,
                             "context %s: %zu %s are built, more than the "
                             "%u a pipe's brochure carries "
                             "(TP_WIRE_MAX_BACKENDS): the context cannot "
                             "offer them all; build fewer",
                             o->name != NULL ? o->name : "(unnamed)",
                             tr ? ntr : nch, tr ? "transports" : "channels",
                             TP_WIRE_MAX_BACKENDS);
    }
    // Check the lists first: a typo is the caller's error, said at once.
    const char *tnames[TP_WIRE_MAX_BACKENDS], *cnames[TP_WIRE_MAX_BACKENDS];
    for (size_t i = 0; i < ntr; i++) {
        tnames[i] = treg[i]->name;
    }
    for (size_t i = 0; i < nch; i++) {
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
    tp__pinned_cache_init(&ctx->x_pinned, 0); // its cap once configured
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
    ctx->x_pinned.pc_cap = (uint64_t)ctx->x_cfg.pipe_cuda_pinned_cache;
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
                           "connect (a lane channel such as mpt needs a "
                           "transport that reaches other hosts):\n%s",
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
    tp__pinned_cache_fini(&ctx->x_pinned);
    if (ctx->x_loop != NULL) {
        tp__loop_destroy(ctx->x_loop);
    }
    tp__cv_fini(&ctx->x_cv);
    tp__mtx_fini(&ctx->x_mtx);
    tp__free(ctx);
}

static void
ctx_close_all_task(void *arg)
{
    tp_context *ctx = arg;
    ctx->x_closing = true;
    tp_pipe_listener *pl;
    while ((pl = tp__list_first(&ctx->x_listeners)) != NULL) {
        tp__list_remove(&ctx->x_listeners, pl);
        pl->pl_destroy_req = true;
        tp__pipe_listener_close(pl);
        tp__pipe_listener_maybe_free(
            pl); // nothing in flight: nothing else would free it
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
        tp__report_add(out, cap, "mpt lanes: %u over %s\n", ctx->x_nlanes,
                       ctx->x_lane_ops->name);
    }
    return out;
}
