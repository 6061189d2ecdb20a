/* SPDX-License-Identifier: Apache-2.0 */
/* pg_work.c - work handles (tp_work_*), running a collective on its engine
 * (pg_engine.c: shm on one host, pipes otherwise, NCCL for CUDA
 * tensors), and the group's queue and thread (the order is described in
 * pg_impl.h).
 *
 * Locks: g_mtx > wk_mtx; w_mtx (the world's) is taken alone here, or
 * before wk_mtx. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "collectives/reduce.h"
#include "core/error.h"
#include "core/log.h"

// ---- works
// --------------------------------------------------------------------------

tp_work *
tp__pg_work_new(tp_pg *g)
{
    tp_work *wk = calloc(1, sizeof(*wk));
    if (wk == NULL) {
        return NULL;
    }
    wk->wk_pg = g;
    tp__pg_ref(g); // dropped by work_release
    atomic_init(&wk->wk_refs, 1);
    tp__mtx_init(&wk->wk_mtx);
    tp__cv_init(&wk->wk_cv);
    wk->wk_source = -1;
    wk->wk_deadline_ns = tp__deadline_after_ms(g->g_timeout_ms);
    return wk;
}

// Frees what a work holds (its last reference is gone).
static void
work_release(tp_work *wk)
{
    tp_tensor_unref(wk->wk_t1);
    tp_tensor_unref(wk->wk_t2);
    tp_tensor_unref(wk->wk_result);
    for (int i = 0; i < wk->wk_nback; i++) {
        tp_tensor_unref(wk->wk_back[i].b_dst);
        tp_tensor_unref(wk->wk_back[i].b_src);
    }
    free(wk->wk_back);
    free(wk->wk_splits);
    free(wk->wk_in_copy);
    if (wk->wk_local) {
        return; // on a caller's stack; no lock, error or request
    }
    tp_error_unref(wk->wk_err);
    tp_future_unref(wk->wk_fut);
    tp__cv_fini(&wk->wk_cv);
    tp__mtx_fini(&wk->wk_mtx);
    tp_pg *g = wk->wk_pg;
    free(wk);
    tp__pg_unref(g);
}

void
tp__pg_work_unref(tp_work *wk)
{
    if (wk == NULL) {
        return;
    }
    tp_pg *lw = atomic_load(&wk->wk_world);
    if (lw != NULL) {
        // A listed (point-to-point) work drops its last reference under
        // the world's lock, so tp__pg_finish_p2p_works, which takes references
        // under it, never sees a dying work; its request is given to the
        // p2p layer before the lock is released (the p2p layer is alive:
        // the world's destroy unlists every work first).
        tp__mtx_lock(&lw->w_mtx);
        if (atomic_fetch_sub(&wk->wk_refs, 1) != 1) {
            tp__mtx_unlock(&lw->w_mtx);
            return;
        }
        if (tp__list_node_active(&wk->wk_lnode)) {
            tp__list_remove(&lw->w_works, wk);
        }
        tp__req *r = wk->wk_req;
        wk->wk_req = NULL;
        tp__req_detach(r); // done: the callback held a reference
        tp__mtx_unlock(&lw->w_mtx);
        work_release(wk);
        return;
    }
    if (atomic_fetch_sub(&wk->wk_refs, 1) != 1) {
        return;
    }
    TP_ASSERT(wk->wk_req == NULL); // unlisted by the world's destroy
    work_release(wk);
}

static void
work_future_free(void *value)
{
    tp_tensor_unref(value);
}

// Resolves @f (the future of the completed @wk) with its output tensor or
// its error. Called with no lock held: @f's callbacks run here.
static void
work_future_resolve(tp_work *wk, tp_future *f)
{
    if (wk->wk_st == TP_OK) {
        tp_tensor *t =
            wk->wk_result != NULL ? tp_tensor_ref(wk->wk_result) : NULL;
        if (tp_future_set_value(f, t, work_future_free) != TP_OK) {
            tp_tensor_unref(t);
        }
        return;
    }
    tp_error *own = NULL;
    const tp_error *e = wk->wk_err;
    if (e == NULL) {
        own =
            tp_error_create(wk->wk_st, NULL, "%s: %s failed", wk->wk_pg->g_what,
                            tp__coll_kind_name(wk->wk_args.kind));
        e = own;
    }
    (void)tp_future_set_error(f, e);
    tp_error_unref(own);
}

void
tp__pg_work_complete(tp_work *wk, tp_status st, const tp_error *err, int source)
{
    tp_future *f = NULL;
    tp__mtx_lock(&wk->wk_mtx);
    if (!wk->wk_done) {
        wk->wk_st = st;
        wk->wk_err = err != NULL ? tp_error_ref(err) : NULL;
        wk->wk_source = source;
        wk->wk_done = true;
        tp__cv_broadcast(&wk->wk_cv);
        f = wk->wk_fut != NULL ? tp_future_ref(wk->wk_fut) : NULL;
    }
    tp__mtx_unlock(&wk->wk_mtx);
    if (f != NULL) {
        // wk_st, wk_err and wk_result no longer change: read without the
        // lock.
        work_future_resolve(wk, f);
        tp_future_unref(f);
    }
}

tp_status
tp_work_get_future(tp_work *w, tp_future **f_p, tp_error **err_p)
{
    if (w == NULL || f_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_work_get_future: NULL work or f_p");
    }
    if (w->wk_p2p) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: tp_work_get_future of a %s: wait for it with "
                             "tp_work_wait",
                             w->wk_pg->g_what, w->wk_send ? "send" : "recv");
    }
    tp__mtx_lock(&w->wk_mtx);
    tp_future *f = w->wk_fut;
    bool made = false;
    if (f == NULL) {
        if (tp_future_create(&f) != TP_OK) {
            tp__mtx_unlock(&w->wk_mtx);
            return tp__error_set(err_p, TP_ENOMEM, "%s: tp_work_get_future",
                                 w->wk_pg->g_what);
        }
        w->wk_fut = f;
        made = true;
    }
    bool resolve = made && w->wk_done; // else completion resolves it
    tp_future_ref(f);
    tp__mtx_unlock(&w->wk_mtx);
    if (resolve) {
        work_future_resolve(w, f);
    }
    *f_p = f;
    return TP_OK;
}

bool
tp_work_is_completed(const tp_work *w)
{
    if (w == NULL) {
        return true;
    }
    tp_work *wk = (tp_work *)w;
    tp__mtx_lock(&wk->wk_mtx);
    bool done = wk->wk_done;
    tp__mtx_unlock(&wk->wk_mtx);
    return done;
}

const tp_error *
tp_work_error(const tp_work *w)
{
    if (w == NULL) {
        return NULL;
    }
    tp_work *wk = (tp_work *)w;
    tp__mtx_lock(&wk->wk_mtx);
    const tp_error *e = wk->wk_done ? wk->wk_err : NULL;
    tp__mtx_unlock(&wk->wk_mtx);
    return e;
}

int
tp_work_source(const tp_work *w)
{
    return w != NULL ? w->wk_source : -1;
}

// p2p request callback of a point-to-point work.
void
tp__pg_p2p_work_cb(tp__req *r, void *arg)
{
    tp_work *wk = arg;
    tp_error *e = NULL;
    tp_status st = tp__req_status(r, &e);
    int src = tp__req_source(r);
    int gsrc = src >= 0 ? wk->wk_pg->g_granks[src] : -1;
    if (st != TP_OK) {
        tp_error *we = tp_error_create(
            st, e, "%s: %s %s rank %d", wk->wk_pg->g_what,
            wk->wk_send ? "send to" : "recv from",
            wk->wk_send ? "" : (wk->wk_peer < 0 ? "any" : ""), wk->wk_peer);
        tp__pg_work_complete(wk, st, we, gsrc);
        tp_error_unref(we);
    } else {
        tp__pg_work_complete(wk, TP_OK, NULL, gsrc);
    }
    tp_error_unref(e);
    tp__pg_work_unref(wk); // the callback's reference
}

tp_status
tp_work_wait(tp_work *w, int64_t timeout_ms, tp_error **err_p)
{
    if (w == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_work_wait: NULL work");
    }
    uint64_t deadline =
        timeout_ms > 0 ? tp__deadline_after_ms(timeout_ms) : w->wk_deadline_ns;
    bool op_deadline = timeout_ms <= 0 || deadline >= w->wk_deadline_ns;
    if (op_deadline && w->wk_deadline_ns != UINT64_MAX && !w->wk_p2p) {
        // A collective's own deadline is enforced by its runner; a little
        // grace lets its error (naming what it waited for) arrive first.
        deadline = w->wk_deadline_ns + (uint64_t)PG_FINISH_GRACE_MS * 1000000u;
    }
    // @g (and its world) stay allocated while the work lives: it holds a
    // reference. Its p2p layer may be closed by a destroy, so probes and
    // cancels go through tp__pg_p2p_enter.
    tp__mtx_lock(&w->wk_mtx);
    tp_pg *g = w->wk_pg;
    tp_pg *lw = g->g_world;
    uint64_t start = tp__now_ns();
    bool op_expired = false;
    while (!w->wk_done) {
        uint64_t now = tp__now_ns();
        if (now >= deadline) {
            op_expired = w->wk_p2p && now >= w->wk_deadline_ns;
            break;
        }
        uint64_t slice = now + 20000000u; // 20 ms: probes of a silent peer
        tp__cv_wait_until(&w->wk_cv, &w->wk_mtx,
                          slice < deadline ? slice : deadline);
        if (!w->wk_done && w->wk_p2p && w->wk_peer >= 0 &&
            tp__now_ns() - start > (uint64_t)TP__P2P_PROBE_MS * 1000000u) {
            // A receive from (or send to) a rank that died before it ever
            // wrote to us: a probe's failed write fails it.
            tp__mtx_unlock(&w->wk_mtx);
            if (tp__pg_p2p_enter(lw)) {
                tp__p2p_probe(lw->w_p2p, g->g_wranks[w->wk_peer]);
                tp__pg_p2p_leave(lw);
            }
            tp__mtx_lock(&w->wk_mtx);
        }
    }
    tp__mtx_unlock(&w->wk_mtx);
    if (op_expired) {
        // The point-to-point operation's own deadline: it fails, and its
        // request is canceled (taken under the world's lock: a destroy may
        // take it at the same time).
        tp_error *we = tp_error_create(
            TP_ETIMEDOUT, NULL,
            "%s: %s rank %d did not complete within %" PRId64 " ms", g->g_what,
            w->wk_send ? "send to" : "recv from", w->wk_peer, g->g_timeout_ms);
        tp__pg_work_complete(w, TP_ETIMEDOUT, we, -1);
        tp_error_unref(we);
        tp__mtx_lock(&lw->w_mtx);
        tp__req *r = NULL;
        if (!lw->w_closed && w->wk_req != NULL) {
            r = w->wk_req;
            w->wk_req = NULL;
            lw->w_p2p_users++; // the cancel uses the p2p layer
        }
        tp__mtx_unlock(&lw->w_mtx);
        if (r != NULL) {
            tp__req_cancel_free(r);
            tp__pg_p2p_leave(lw);
        }
    }
    tp__mtx_lock(&w->wk_mtx);
    bool done = w->wk_done;
    tp_status st = w->wk_st;
    tp_error *e = tp_error_ref(w->wk_err);
    tp__mtx_unlock(&w->wk_mtx);
    if (!done) {
        tp__error_set(err_p, TP_ETIMEDOUT,
                      "%s: work not completed within %" PRId64 " ms", g->g_what,
                      timeout_ms);
        st = TP_ETIMEDOUT;
        tp_error_unref(e);
    } else if (err_p != NULL) {
        *err_p = e;
    } else {
        tp_error_unref(e);
    }
    return st;
}

void
tp_work_free(tp_work *w)
{
    tp__pg_work_unref(w);
}

uint64_t
tp__pg_seq_take(tp_pg *g)
{
    uint64_t seq = g->g_seq++;
    atomic_store_explicit(&g->g_seq_taken, g->g_seq, memory_order_release);
    return seq;
}

// Runs @wk: debug check, engine, avg. Breaks the group on error.
static tp_status
coll_exec_engine(tp_pg *g, tp_work *wk, tp_error **err_p)
{
    tp_status st = tp__pg_check(g, err_p);
    if (st != TP_OK) {
        return st;
    }
    const tp__coll_args *a = &wk->wk_args;
    uint64_t deadline = wk->wk_deadline_ns;
    const tp__coll_engine_ops *eng = tp__pg_engine_for(g, wk->wk_cuda);
    bool mismatch = false;
    if (eng->device) {
        st = eng->run(g, a, g->g_seq, deadline, err_p);
    } else {
        if (g->g_cfg.debug_collectives) {
            st = tp__pg_debug_check(g, a, wk->wk_op, deadline, err_p);
            mismatch = st == TP_EINVAL;
        }
        if (st == TP_OK) {
            uint64_t seq = tp__pg_seq_take(g);
            st = eng->run(g, a, seq, deadline, err_p);
        }
        if (st == TP_OK && wk->wk_op == TP_REDUCE_AVG) {
            if (a->kind == TP__COLL_ALL_REDUCE ||
                (a->kind == TP__COLL_REDUCE && g->g_rank == a->root)) {
                tp__reduce_avg_finish(a->dtype, a->buf, a->count, g->g_size);
            } else if (a->kind == TP__COLL_REDUCE_SCATTER) {
                tp__reduce_avg_finish(a->dtype, a->out, a->count, g->g_size);
            }
        }
    }
    if (st != TP_OK) {
        tp_error *e = err_p != NULL ? *err_p : NULL;
        tp_error *own = NULL;
        if (e == NULL) {
            own = tp_error_create(st, NULL, "%s: %s failed", g->g_what,
                                  tp__coll_kind_name(a->kind));
            e = own;
        }
        tp__pg_break(g, e);
        // Tell the others where the engine can (pipe), so that ranks
        // waiting on one that gave up do not wait for their deadline (not
        // for a mismatch, which every member detects itself, nor for an
        // abort that came from another member).
        if (eng->tell_failed != NULL && st != TP_EREMOTE && !mismatch) {
            eng->tell_failed(g, e);
        }
        tp_error_unref(own);
    }
    return st;
}

// coll_exec_engine with the flight recorder: a timeout's log line lists
// what was still in flight on this rank (this collective included).
static tp_status
coll_exec(tp_pg *g, tp_work *wk, tp_error **err_p)
{
    bool debug = g->g_cfg.debug_collectives &&
                 !tp__pg_engine_for(g, wk->wk_cuda)->device;
    tp__pg_fr_run(g, wk, g->g_seq + (debug ? 1u : 0u));
    tp_status st = coll_exec_engine(g, wk, err_p);
    for (int i = 0; st == TP_OK && i < wk->wk_nback; i++) {
        // The result into the caller's tensors (coalesced, strided).
        if (wk->wk_back[i].b_dst == NULL) {
            continue; // an input's copy
        }
        st = tp__copy_raw(wk->wk_back[i].b_dst, wk->wk_back[i].b_src, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "%s: %s: copy of the result", g->g_what,
                           tp__coll_kind_name(wk->wk_args.kind));
        }
    }
    if (st == TP_ETIMEDOUT) {
        char *fl = tp__pg_fr_dump(g, true);
        // The error names the group and the collective.
        if (err_p != NULL && *err_p != NULL) {
            TP_LOG_ERROR("TP-PG-TIMEOUT", "%s; in flight on this rank:\n%s",
                         tp_error_message(*err_p),
                         fl != NULL ? fl : "(out of memory)\n");
        } else {
            TP_LOG_ERROR("TP-PG-TIMEOUT",
                         "%s: %s timed out; in flight on this rank:\n%s",
                         g->g_what, tp__coll_kind_name(wk->wk_args.kind),
                         fl != NULL ? fl : "(out of memory)\n");
        }
        free(fl);
    }
    tp__pg_fr_end(g, wk, st);
    return st;
}

static void *
group_thread(void *arg)
{
    tp_pg *g = arg;
    char name[16];
    snprintf(name, sizeof(name), "tp-pg-%.9s", g->g_name);
    tp__thread_set_name(name);
    tp__mtx_lock(&g->g_mtx);
    for (;;) {
        while ((!g->g_stop && tp__list_empty(&g->g_queue)) || g->g_busy) {
            tp__cv_wait(&g->g_cv, &g->g_mtx);
        }
        tp_work *wk = tp__list_pop_first(&g->g_queue);
        if (wk == NULL) {
            break; // stopping
        }
        g->g_busy = true;
        bool stop = g->g_stop;
        tp__mtx_unlock(&g->g_mtx);
        tp_error *e = NULL;
        tp_status st;
        if (stop) {
            st = tp__error_set(&e, TP_ECLOSED, "%s: destroyed before %s ran",
                               g->g_what, tp__coll_kind_name(wk->wk_args.kind));
            tp__pg_fr_end(g, wk, st);
        } else {
            st = coll_exec(g, wk, &e);
        }
        tp__pg_work_complete(wk, st, e, -1);
        tp_error_unref(e);
        tp__pg_work_unref(wk);
        tp__mtx_lock(&g->g_mtx);
        g->g_busy = false;
        tp__cv_broadcast(&g->g_cv);
    }
    tp__mtx_unlock(&g->g_mtx);
    return NULL;
}

// Runs @wk now on this thread (blocking call, nothing queued) or queues
// it. Takes the caller's reference of @wk.
tp_status
tp__pg_coll_submit(tp_pg *g, tp_work *wk, tp_work **w_p, tp_error **err_p)
{
    tp__pg_fr_issue(g, wk);
    tp__mtx_lock(&g->g_mtx);
    if (w_p == NULL && tp__list_empty(&g->g_queue) && !g->g_busy) {
        g->g_busy = true;
        tp__mtx_unlock(&g->g_mtx);
        tp_status st = coll_exec(g, wk, err_p);
        tp__mtx_lock(&g->g_mtx);
        g->g_busy = false;
        tp__cv_broadcast(&g->g_cv);
        tp__mtx_unlock(&g->g_mtx);
        tp__pg_work_unref(wk);
        return st;
    }
    if (g->g_stop) {
        tp__mtx_unlock(&g->g_mtx);
        tp__pg_fr_end(g, wk, TP_ECLOSED);
        tp__pg_work_unref(wk);
        return tp__error_set(err_p, TP_ECLOSED, "%s: destroyed", g->g_what);
    }
    if (wk->wk_local) {
        // Queued behind others: the group's thread needs a heap work.
        tp_work *h = tp__pg_work_new(g);
        if (h == NULL) {
            tp__mtx_unlock(&g->g_mtx);
            tp__pg_work_unref(wk);
            return tp__error_set(err_p, TP_ENOMEM, "%s: %s", g->g_what,
                                 tp__coll_kind_name(wk->wk_args.kind));
        }
        h->wk_args = wk->wk_args;
        h->wk_op = wk->wk_op;
        h->wk_splits = wk->wk_splits;
        h->wk_in_copy = wk->wk_in_copy;
        h->wk_t1 = wk->wk_t1;
        h->wk_t2 = wk->wk_t2;
        h->wk_result = wk->wk_result;
        h->wk_no_result = wk->wk_no_result;
        h->wk_back = wk->wk_back;
        h->wk_nback = wk->wk_nback;
        h->wk_cuda = wk->wk_cuda;
        h->wk_deadline_ns = wk->wk_deadline_ns;
        h->wk_fr_id = wk->wk_fr_id;
        wk->wk_splits = NULL;
        wk->wk_in_copy = NULL;
        wk->wk_t1 = wk->wk_t2 = wk->wk_result = NULL;
        wk->wk_back = NULL;
        wk->wk_nback = 0;
        wk = h;
    }
    if (!g->g_thread_started) {
        int rc = pthread_create(&g->g_thread, NULL, group_thread, g);
        if (rc != 0) {
            tp__mtx_unlock(&g->g_mtx);
            tp__pg_work_unref(wk);
            return tp__error_errno(err_p, rc, "%s: start the group's thread",
                                   g->g_what);
        }
        g->g_thread_started = true;
    }
    atomic_fetch_add(&wk->wk_refs, 1); // the queue's
    tp__list_append(&g->g_queue, wk);
    tp__cv_broadcast(&g->g_cv);
    tp__mtx_unlock(&g->g_mtx);
    if (w_p != NULL) {
        *w_p = wk;
        return TP_OK;
    }
    tp_status st = tp_work_wait(wk, 0, err_p);
    tp__pg_work_unref(wk);
    return st;
}

// Finishes the point-to-point works of @pg (every group's if @pg is the
// world): pending ones complete with TP_ECLOSED; their requests are
// canceled (a subgroup: the world's pipes go on) or detached (the world:
// the p2p layer is about to go, and frees them).
void
tp__pg_finish_p2p_works(tp_pg *pg)
{
    tp_pg *w = pg->g_world;
    bool world = pg == w;
    for (;;) {
        tp__mtx_lock(&w->w_mtx);
        tp_work *wk = tp__list_first(&w->w_works);
        while (wk != NULL &&
               (wk->wk_req == NULL || (!world && wk->wk_pg != pg))) {
            wk = tp__list_next(&w->w_works, wk);
        }
        tp__req *r = NULL;
        if (wk != NULL) {
            r = wk->wk_req;
            wk->wk_req = NULL;
            atomic_fetch_add(&wk->wk_refs, 1);
        }
        tp__mtx_unlock(&w->w_mtx);
        if (wk == NULL) {
            break;
        }
        tp_error *e = tp_error_create(
            TP_ECLOSED, NULL, "%s: destroyed before the %s completed",
            pg->g_what, wk->wk_send ? "send" : "recv");
        tp__pg_work_complete(wk, TP_ECLOSED, e, -1);
        tp_error_unref(e);
        if (world) {
            tp__req_detach(r);
        } else {
            tp__req_cancel_free(r);
        }
        tp__pg_work_unref(wk);
    }
    if (world) {
        // Works freed later must not touch the world.
        tp__mtx_lock(&w->w_mtx);
        tp_work *wk;
        while ((wk = tp__list_pop_first(&w->w_works)) != NULL) {
            // Last touch: once it reads NULL, a thread dropping the last
            // reference frees it without this lock.
            atomic_store(&wk->wk_world, NULL);
        }
        tp__mtx_unlock(&w->w_mtx);
    }
}
