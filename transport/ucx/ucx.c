// SPDX-License-Identifier: Apache-2.0
// ucx.c - the UCX transport: a UCP context and worker per transport,
// progressed on the transport's loop thread. Its parts: ucx_impl.h.
//
// Progress: the worker's event fd (ucp_worker_get_efd, UCP_FEATURE_WAKEUP)
// is watched by the loop, and a loop poller spins on ucp_worker_progress
// while the loop spins (TP_LOOP_SPIN_US), arming the worker
// (ucp_worker_arm) before the loop sleeps; UCS_ERR_BUSY from the arm means
// events arrived meanwhile and the loop does not sleep.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "transport/ucx/ucx_impl.h"

const char *
tp__ucx_status_str(ucs_status_t st)
{
    return ucs_status_string(st);
}

tp_status
tp__ucx_status_tp(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return TP_OK;
    case UCS_ERR_NO_MEMORY:
        return TP_ENOMEM;
    case UCS_ERR_INVALID_PARAM:
        return TP_EINVAL;
    case UCS_ERR_BUSY:
        return TP_EADDRINUSE;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
        return TP_ECONNREFUSED;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
        return TP_ETIMEDOUT;
    case UCS_ERR_CANCELED:
        return TP_ECANCELED;
    case UCS_ERR_UNSUPPORTED:
        return TP_ENOTSUP;
    default:
        return TP_ECONNRESET;
    }
}

// Acts on what the callbacks recorded: received data, endpoint errors,
// finished sends. A conn may leave the list (fail, close) while we look at
// it, so take the next one first; dispatch only removes the conn it runs
// on.
static void
ucx_dispatch(ucx_ctx *x)
{
    for (ucx_listener *l = tp__list_first(&x->x_lsns); l != NULL;
         l = tp__list_next(&x->x_lsns, l)) {
        tp__ucx_listener_make_eps(l);
    }
    ucx_conn *c = tp__list_first(&x->x_conns);
    while (c != NULL) {
        ucx_conn *next = tp__list_next(&x->x_conns, c);
        tp__ucx_conn_dispatch(c);
        c = next;
    }
}

// Progresses the worker and dispatches; true if anything happened.
// Progress and dispatch repeat while UCP finds work, but stop as soon as
// an operation completed (its callback waits in the loop's deferred
// queue): a round trip's message is read, and answered, right after the
// progress that received it, not after one more that finds nothing (on
// the tcp lane an epoll_wait, ~0.5 us per message), while a stream still
// drains UCP in one go. The loop polls again while this returns true and
// sleeps only after a progress that found nothing and an arm that says
// the worker is idle (ucx_prepare_sleep_cb), so nothing is left behind.
static bool
ucx_progress_once(ucx_ctx *x)
{
    if (x->x_in_progress) {
        return false;
    }
    tp_loop *loop = x->x_t->t_loop;
    unsigned total = 0, n;
    do {
        x->x_in_progress = true;
        n = ucp_worker_progress(x->x_worker);
        x->x_in_progress = false;
        total += n;
        ucx_dispatch(x);
    } while (n != 0 && !tp__loop_has_deferred(loop));
    return total != 0;
}

void
tp__ucx_progress(ucx_ctx *x)
{
    (void)ucx_progress_once(x);
}

static void
ucx_efd_cb(tp_loop_fd *lfd, uint32_t events)
{
    TP_UNUSED(events);
    ucx_ctx *x = lfd->lf_arg;
    tp__ucx_progress(x);
}

static bool
ucx_poll_cb(tp_loop_poller *p)
{
    return ucx_progress_once(p->lp_arg);
}

static bool
ucx_prepare_sleep_cb(tp_loop_poller *p)
{
    ucx_ctx *x = p->lp_arg;
    // UCP's protocol: arm only after a progress that found nothing (the
    // spin may have ended on one that found something: TP_LOOP_SPIN_US=0).
    if (ucx_progress_once(x)) {
        return true;
    }
    ucs_status_t st = ucp_worker_arm(x->x_worker);
    // BUSY: events arrived since the last progress; do not sleep.
    return st == UCS_ERR_BUSY;
}

static void
ucx_after_sleep_cb(tp_loop_poller *p)
{
    TP_UNUSED(p);
}

tp_status
tp__ucx_ctx_start(ucx_ctx *x, tp_error **err_p)
{
    if (x->x_started) {
        return TP_OK;
    }
    tp_loop *loop = x->x_t->t_loop;
    tp_status st = tp__loop_fd_add(loop, &x->x_lfd, x->x_efd, TP_EV_READ,
                                   ucx_efd_cb, x, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "ucx: watching the worker's event fd");
    }
    x->x_poller.lp_poll = ucx_poll_cb;
    x->x_poller.lp_prepare_sleep = ucx_prepare_sleep_cb;
    x->x_poller.lp_after_sleep = ucx_after_sleep_cb;
    x->x_poller.lp_spin_ns = (uint64_t)x->x_t->t_cfg.loop_spin_us * 1000u;
    x->x_poller.lp_arg = x;
    tp__loop_poller_start(loop, &x->x_poller);
    x->x_started = true;
    return TP_OK;
}

static void
ucx_close_cb(void *request, ucs_status_t status, void *user_data)
{
    TP_UNUSED(status);
    ucx_ctx *x = user_data;
    x->x_closing--;
    ucp_request_free(request);
}

void
tp__ucx_ep_close(ucx_ctx *x, ucp_ep_h ep, bool force)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_FLAGS;
    p.cb.send = ucx_close_cb;
    p.user_data = x;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        x->x_closing++;
    }
}

// ---- transport -------------------------------------------------------------

static tp_status
ucx_init_context(ucp_context_h *ctx_p, char *why, size_t why_len)
{
    ucp_config_t *uc = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &uc);
    if (st != UCS_OK) {
        snprintf(why, why_len, "ucp_config_read: %s", ucs_status_string(st));
        return tp__ucx_status_tp(st);
    }
    // No rendezvous rails unless the user asks: the data goes on the
    // stream (no rendezvous) and our active messages are 8-byte eager
    // credits, but for UCP_FEATURE_AM UCX 1.13 adds rma_bw lanes on every
    // device (tcp: lo and eth0), and polling the extra interface on each
    // progress cost ~1 us of a 64 B round trip (docs/transport-ucx.md).
    if (getenv("UCX_MAX_RNDV_RAILS") == NULL) {
        st = ucp_config_modify(uc, "MAX_RNDV_RAILS", "0");
        if (st != UCS_OK) {
            TP_LOG_DEBUG("TP-UCX-CONFIG", "ucx: MAX_RNDV_RAILS=0: %s",
                         ucs_status_string(st));
        }
    }
    ucp_params_t p;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    // Active messages carry the credits of flow control (flow.c).
    p.features = UCP_FEATURE_STREAM | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.name = "tpipe";
    st = ucp_init(&p, uc, ctx_p);
    ucp_config_release(uc);
    if (st != UCS_OK) {
        snprintf(why, why_len, "ucp_init: %s", ucs_status_string(st));
        return TP_ENOTSUP;
    }
    return TP_OK;
}

// Opt-in: every context creates every viable transport, and a UCP context
// costs tens of milliseconds and a UCX progress thread, so ucx is used only
// where TP_UCX=1 says so (docs/transport-ucx.md).
static bool
ucx_enabled(void)
{
    const char *s = getenv("TP_UCX");
    return s != NULL && (strcmp(s, "1") == 0 || strcmp(s, "on") == 0 ||
                         strcmp(s, "yes") == 0 || strcmp(s, "true") == 0);
}

static const tp_tunable ucx_tunable_rows[] = {
    // Declared for the listings; read by ucx_enabled at each viability
    // check.
    TP_TUNABLE_EXTERN("ucx", "TP_UCX", "0", "1|on|yes|true, else off",
                      "1: the ucx transport is viable (opt-in; "
                      "docs/transport-ucx.md)"),
    {
        .tu_name = "ucx_window",
        .tu_env = "TP_UCX_WINDOW",
        // 8M: a 64 MiB stream over tcp/lo runs as fast as with no window
        // (docs/transport-ucx.md); a conn nobody reads holds at most this.
        .tu_def = "8M",
        .tu_doc = "bytes a ucx connection's peer may send ahead of this "
                  "side's reads (its writes past it wait for credits)",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(ucx_tunables, ut_window),
        .tu_min = UCX_WINDOW_MIN,
        .tu_max = UCX_WINDOW_MAX,
    },
    {
        .tu_name = "ucx_recv_post",
        .tu_env = "TP_UCX_RECV_POST",
        // docs/transport-ucx.md: posted reads save a copy, but one that
        // is canceled closes its connection.
        .tu_def = "64K",
        .tu_doc = "reads with no deadline that need at least this many "
                  "bytes more than UCX holds are posted to UCX, which "
                  "receives into the caller's buffer (one copy less; a "
                  "cancel of one closes the connection); 0: never",
        .tu_type = TP_TUNABLE_SIZE,
        TP_TUNABLE_FIELD(ucx_tunables, ut_post_min),
        .tu_min = 0,
        .tu_max = UCX_WINDOW_MAX,
    },
};

const tp_tunables tp__ucx_tunables = {
    .ts_component = "ucx",
    .ts_rows = ucx_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(ucx_tunable_rows),
    .ts_store = TP_TUNABLES_OWN,
    .ts_size = sizeof(ucx_tunables),
};

static bool
ucx_is_viable(const tp_config *cfg, char *why, size_t why_len)
{
    TP_UNUSED(cfg);
    if (!ucx_enabled()) {
        snprintf(why, why_len, "off unless TP_UCX=1 (opt-in)");
        return false;
    }
    ucp_context_h ctx;
    if (ucx_init_context(&ctx, why, why_len) != TP_OK) {
        return false;
    }
    ucp_cleanup(ctx);
    return true;
}

static tp_status
ucx_ctx_init(tp_transport *t, tp_error **err_p)
{
    ucx_ctx *x = ucx_ctx_of(t);
    memset(x, 0, sizeof(*x));
    x->x_t = t;
    x->x_efd = -1;
    TP_LIST_INIT(&x->x_conns, ucx_conn, xc_node);
    TP_LIST_INIT(&x->x_lsns, ucx_listener, xl_node);
    char why[256];
    tp_status rc = ucx_init_context(&x->x_ucp, why, sizeof(why));
    if (rc != TP_OK) {
        return tp__error_set(err_p, rc, "ucx: %s", why);
    }
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Created here, then used only on the loop thread.
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs_status_t st = ucp_worker_create(x->x_ucp, &wp, &x->x_worker);
    if (st != UCS_OK) {
        ucp_cleanup(x->x_ucp);
        return tp__error_set(err_p, TP_ENOTSUP, "ucx: ucp_worker_create: %s",
                             ucs_status_string(st));
    }
    st = ucp_worker_get_efd(x->x_worker, &x->x_efd);
    if (st != UCS_OK) {
        ucp_worker_destroy(x->x_worker);
        ucp_cleanup(x->x_ucp);
        return tp__error_set(err_p, TP_ENOTSUP, "ucx: ucp_worker_get_efd: %s",
                             ucs_status_string(st));
    }
    rc = tp__ucx_flow_init(x, err_p);
    if (rc != TP_OK) {
        ucp_worker_destroy(x->x_worker);
        ucp_cleanup(x->x_ucp);
        return rc;
    }
    const ucx_tunables *ut = tp__config_own_const(&t->t_cfg, &tp__ucx_tunables);
    x->x_window = (uint64_t)ut->ut_window;
    x->x_post_min = (uint64_t)ut->ut_post_min;
    // Two ends with the same UCX major.minor can connect; UCX picks the
    // fabric (UCX_TLS) itself.
    unsigned major, minor, release;
    ucp_get_version(&major, &minor, &release);
    snprintf(t->t_domain, sizeof(t->t_domain), "ucx:%u.%u", major, minor);
    return TP_OK;
}

static void
ucx_ctx_fini(tp_transport *t)
{
    ucx_ctx *x = ucx_ctx_of(t);
    // Endpoint closes still in flight finish with a little progress.
    uint64_t deadline = tp__deadline_after_ms(UCX_CLOSE_WAIT_MS);
    while (x->x_closing > 0 && tp__now_ns() < deadline) {
        ucp_worker_progress(x->x_worker);
    }
    if (x->x_closing > 0) {
        TP_LOG_WARN("TP-UCX-CLOSE",
                    "ucx: %u endpoint closes still pending after %d ms",
                    x->x_closing, UCX_CLOSE_WAIT_MS);
    }
    if (x->x_started) {
        tp__loop_poller_stop(t->t_loop, &x->x_poller);
        tp__loop_fd_remove(t->t_loop, &x->x_lfd);
        x->x_started = false;
    }
    ucp_worker_destroy(x->x_worker);
    ucp_cleanup(x->x_ucp);
}

const tp_transport_ops tp__transport_ucx_ops = {
    .abi_version = TP_TRANSPORT_ABI_V1,
    .name = "ucx",
    .props = TP_TRANSPORT_PROP_NETWORK,
    .tunables = &tp__ucx_tunables,
    .ctx_size = sizeof(ucx_ctx),
    .listener_size = sizeof(ucx_listener),
    .conn_size = sizeof(ucx_conn),
    .is_viable = ucx_is_viable,
    .ctx_init = ucx_ctx_init,
    .ctx_fini = ucx_ctx_fini,
    .listen = tp__ucx_listen,
    .accept = tp__ucx_accept,
    .listener_close = tp__ucx_listener_close,
    .connect = tp__ucx_connect,
    .conn_read = tp__ucx_conn_read,
    .conn_write = tp__ucx_conn_write,
    .conn_close = tp__ucx_conn_close,
    .conn_fini = tp__ucx_conn_fini,
};
