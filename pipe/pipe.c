// SPDX-License-Identifier: Apache-2.0
// pipe.c - the pipe object: lifetime and holds, failure and
// draining, the handshake timer, ready (starting the channel), and the public
// calls that are not reads or writes (wait_ready, report, close, ref).
//
// The rest of the pipe: pipe_hs_accept.c and pipe_hs_connect.c (the two
// halves of the handshake), pipe_write.c and pipe_read.c (the engines).
// p_busy counts the internal operations in flight (main/extra connection
// I/O, channel ops, CUDA staging and copies on the copy pool); a failed pipe is
// freed from the context only once it is zero, so no callback ever finds it
// gone.
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

static void pipe_hs_timeout(tp_timer *t, void *arg);

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
    tp__aio_init(&p->p_raio, tp__pipe_raio_cb, p);
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

void
tp__pipe_busy_done(tp_pipe *p)
{
    TP_ASSERT(p->p_busy > 0);
    p->p_busy--;
    if (p->p_state == PIPE_FAILED) {
        tp__pipe_check_drained(p);
    }
}

// ---- failure ---------------------------------------------------------------

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
    if (p->p_dchan != NULL) {
        p->p_dchops->close(p->p_dchan, err);
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
        for (unsigned i = 0; hs->h_extras != NULL && i < p->p_nextra; i++) {
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
    tp__pipe_flush_writes(p);
    tp__pipe_flush_reads(p);
    pipe_publish_state(p);
    tp__pipe_check_drained(p);
}

tp_error *
tp__pipe_err(tp_pipe *p, tp_status st, const tp_error *cause, const char *what)
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
    if (p->p_dchan != NULL) {
        p->p_dchops->destroy(p->p_dchan);
        p->p_dchan = NULL;
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
        for (unsigned i = 0; hs->h_extras != NULL && i < p->p_nextra; i++) {
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
    tp__free(p->p_rvia);
    atomic_store_explicit(&p->p_ctx_dead, true, memory_order_release);
    if (p->p_pl != NULL) {
        tp__listener_pipe_gone(p->p_pl, p);
        p->p_pl = NULL;
        tp__pipe_release_hold(p); // nobody accepted it
    }
    tp__pipe_release_hold(p); // live
    tp__ctx_obj_done(ctx);
}

void
tp__pipe_check_drained(tp_pipe *p)
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
    tp__pipe_fail(p, tp__pipe_err(p, TP_ETIMEDOUT, NULL, what));
}

void
tp__pipe_arm_hs_timer(tp_pipe *p, int64_t ms)
{
    tp__timer_start(p->p_ctx->x_loop, &p->p_hs_timer,
                    tp__deadline_after_ms(ms));
}

// ---- ready -----------------------------------------------------------------

static void pipe_chan_fail(void *pipe, tp_error *err);

void
tp__pipe_ready(tp_pipe *p)
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
        .ce_nconns = p->p_nextra_ch,
        .ce_peer = p->p_peer,
        .ce_peer_domain = p->p_ch->cb_domain,
        .ce_fail = pipe_chan_fail,
        .ce_pipe = p,
    };
    tp_error *err = NULL;
    if (p->p_chops->create != NULL &&
        p->p_chops->create(&env, &p->p_chan, &err) != TP_OK) {
        tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(err), err,
                                      "starting the channel"));
        tp_error_unref(err);
        return;
    }
    if (p->p_dch != NULL) {
        env.ce_conns = p->p_extra + p->p_nextra_ch;
        env.ce_nconns = p->p_nextra - p->p_nextra_ch;
        env.ce_peer_domain = p->p_dch->cb_domain;
        if (p->p_dchops->create(&env, &p->p_dchan, &err) != TP_OK) {
            tp__pipe_fail(p, tp__pipe_err(p, tp_error_status(err), err,
                                          "starting the device channel"));
            tp_error_unref(err);
            return;
        }
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
    tp__pipe_write_pump(p);
    tp__pipe_read_pump(p);
}

static void
pipe_chan_fail(void *pipe, tp_error *err)
{
    tp__pipe_fail((tp_pipe *)pipe, err);
}

// ---- the rest of the public API --------------------------------------------

tp_status
tp_pipe_wait_ready(tp_pipe *p, int64_t timeout_ms, tp_error **err_p)
{
    if (p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_pipe_wait_ready: p is NULL");
    }
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
    if (p == NULL) {
        return NULL;
    }
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
    if (p == NULL) {
        return NULL;
    }
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
        PIPE_HS) {
        return NULL;
    }
    return p->p_tr ? p->p_tr->cb_name : NULL;
}

const char *
tp_pipe_channel(const tp_pipe *p)
{
    if (p == NULL) {
        return NULL;
    }
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
        PIPE_HS) {
        return NULL;
    }
    return p->p_ch ? p->p_ch->cb_name : NULL;
}

const char *
tp_pipe_device_channel(const tp_pipe *p)
{
    if (p == NULL) {
        return NULL;
    }
    if (atomic_load_explicit(&p->p_pub_state, memory_order_acquire) ==
        PIPE_HS) {
        return NULL;
    }
    return p->p_dch ? p->p_dch->cb_name : NULL;
}

const char *
tp_pipe_peer(const tp_pipe *p)
{
    if (p == NULL) {
        return NULL;
    }
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
    if (p == NULL) {
        return NULL;
    }
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
