// SPDX-License-Identifier: Apache-2.0
// transport.c - the generic layer over transport backends: runs backend
// ops on the loop thread, and frees conns and listeners there once the
// last reference is gone. All backend state is loop-owned; the one lock,
// t_mtx, guards only the count of live objects that destroy waits on.

#include "transport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "transport/fault.h"

tp_status
tp__transport_create(const char *name, tp_loop *loop, const tp_config *cfg,
                     tp_transport **t_p, tp_error **err_p)
{
    const tp_transport_ops *ops = tp__transport_find(name);
    if (ops == NULL) {
        char known[256] = "";
        size_t n;
        const tp_transport_ops *const *all = tp__transport_registry(&n);
        for (size_t i = 0; i < n; i++) {
            size_t len = strlen(known);
            snprintf(known + len, sizeof(known) - len, "%s%s", i ? ", " : "",
                     all[i]->name);
        }
        return tp__error_set(err_p, TP_EINVAL,
                             "unknown transport \"%s\" (known: %s)", name,
                             known);
    }
    TP_ASSERT(ops->abi_version == TP_TRANSPORT_ABI_V1);
    char why[256] = "";
    if (!ops->is_viable(cfg, why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "transport %s: not viable on this host: %s", name,
                             why);
    }
    tp_transport *t = tp__zalloc(sizeof(*t) + ops->ctx_size);
    if (t == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "transport %s: out of memory",
                             name);
    }
    t->t_ops = ops;
    t->t_loop = loop;
    t->t_cfg = *cfg;
    atomic_init(&t->t_nobjs, 0);
    tp__mtx_init(&t->t_mtx);
    tp__cv_init(&t->t_cv);
    // Fault injection from the environment, parsed strictly: a test that
    // asks for a fault and does not get it would pass for wrong reasons.
    const char *fs = getenv("TP_FAULT");
    if (fs != NULL && fs[0] != '\0') {
        tp_fault f;
        tp_status fst = tp__fault_parse(fs, &f, err_p);
        if (fst != TP_OK) {
            tp__error_wrap(err_p, fst, "transport %s", name);
            tp__cv_fini(&t->t_cv);
            tp__mtx_fini(&t->t_mtx);
            tp__free(t);
            return fst;
        }
        if (f.f_transport[0] == '\0' || strcmp(f.f_transport, name) == 0) {
            TP_LOG_WARN("TP-TRANSPORT-FAULT",
                        "transport %s: fault injection on every conn: %s "
                        "(TP_FAULT)",
                        name, fs);
            tp__transport_fault_set(t, &f);
        }
    }
    tp_status st = ops->ctx_init(t, err_p);
    if (st != TP_OK) {
        tp__free(t->t_fault);
        tp__cv_fini(&t->t_cv);
        tp__mtx_fini(&t->t_mtx);
        tp__free(t);
        return st;
    }
    *t_p = t;
    return TP_OK;
}

static void
transport_fini_task(void *arg)
{
    tp_transport *t = arg;
    t->t_ops->ctx_fini(t);
}

void
tp__transport_hold(tp_transport *t)
{
    tp__mtx_lock(&t->t_mtx);
    atomic_fetch_add_explicit(&t->t_nobjs, 1, memory_order_relaxed);
    tp__mtx_unlock(&t->t_mtx);
}

void
tp__transport_release(tp_transport *t)
{
    // Under t_mtx, so that destroy, which sees zero only under t_mtx, can
    // free @t only after this unlock: nothing here touches @t after it.
    tp__mtx_lock(&t->t_mtx);
    int left = atomic_fetch_sub_explicit(&t->t_nobjs, 1, memory_order_acq_rel);
    TP_ASSERT(left > 0);
    if (left == 1) {
        tp__cv_broadcast(&t->t_cv);
    }
    tp__mtx_unlock(&t->t_mtx);
}

void
tp__transport_destroy(tp_transport *t)
{
    if (t == NULL) {
        return;
    }
    TP_ASSERT(!tp__loop_on_thread(t->t_loop));
    // Conns and listeners are freed by tasks on the loop, after their last
    // reference is dropped, maybe by another thread, maybe later: wait for
    // the last one. A reference that is never dropped is a bug in the
    // caller; the log names it every 5 s rather than freeing what a conn
    // still points to.
    uint64_t start = tp__now_ns();
    tp__mtx_lock(&t->t_mtx);
    while (atomic_load_explicit(&t->t_nobjs, memory_order_acquire) > 0) {
        uint64_t next = tp__now_ns() + 5000000000u;
        while (atomic_load_explicit(&t->t_nobjs, memory_order_acquire) > 0 &&
               tp__cv_wait_until(&t->t_cv, &t->t_mtx, next)) {
        }
        int n = atomic_load_explicit(&t->t_nobjs, memory_order_acquire);
        if (n > 0) {
            TP_LOG_WARN(
                "TP-TRANSPORT-WAIT",
                "transport %s: destroy has waited %llu s for %d "
                "conns/listeners still referenced",
                t->t_ops->name,
                (unsigned long long)((tp__now_ns() - start) / 1000000000u), n);
        }
    }
    tp__mtx_unlock(&t->t_mtx);
    tp__loop_call(t->t_loop, transport_fini_task, t);
    tp__free(t->t_fault);
    tp__cv_fini(&t->t_cv);
    tp__mtx_fini(&t->t_mtx);
    tp__free(t);
}

void
tp__transport_destroy_nested(tp_transport *t)
{
    if (t == NULL) {
        return;
    }
    TP_ASSERT(tp__loop_on_thread(t->t_loop));
    int n = atomic_load_explicit(&t->t_nobjs, memory_order_acquire);
    if (n > 0) {
        // Freeing it would leave its objects pointing at freed memory.
        TP_LOG_WARN("TP-TRANSPORT-WAIT",
                    "transport %s (nested): %d conns/listeners still "
                    "referenced at destroy; it is leaked",
                    t->t_ops->name, n);
        return;
    }
    t->t_ops->ctx_fini(t);
    tp__free(t->t_fault);
    tp__cv_fini(&t->t_cv);
    tp__mtx_fini(&t->t_mtx);
    tp__free(t);
}

const char *
tp__transport_name(const tp_transport *t)
{
    return t->t_ops->name;
}

const char *
tp__transport_domain(const tp_transport *t)
{
    return t->t_domain;
}

// ---- listeners -------------------------------------------------------------

static void
listener_init_base(tp_listener *l, tp_transport *t)
{
    l->l_transport = t;
    atomic_init(&l->l_refs, 1);
}

tp_status
tp__transport_listen(tp_transport *t, const char *addr, tp_listener **l_p,
                     tp_error **err_p)
{
    TP_ASSERT(t->t_ops->listener_size >= sizeof(tp_listener));
    tp_listener *l = tp__zalloc(t->t_ops->listener_size);
    if (l == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "%s: listen on %s: out of memory", t->t_ops->name,
                             addr ? addr : "(default)");
    }
    listener_init_base(l, t);
    tp_status st = t->t_ops->listen(t, l, addr, err_p);
    if (st != TP_OK) {
        tp__free(l);
        return st;
    }
    tp__transport_hold(t);
    *l_p = l;
    return TP_OK;
}

const char *
tp__listener_addr(const tp_listener *l)
{
    return l->l_addr;
}

static void
listener_accept_start(void *obj, tp_aio *aio)
{
    tp_listener *l = obj;
    if (l->l_closed) {
        if (tp__aio_begin(aio, l->l_transport->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ECLOSED,
                                  "%s: accept on %s: listener closed",
                                  l->l_transport->t_ops->name, l->l_addr);
        }
        return;
    }
    l->l_transport->t_ops->accept(l, aio);
}

void
tp__listener_accept(tp_listener *l, tp_aio *aio)
{
    tp__aio_submit(aio, l->l_transport->t_loop, listener_accept_start, l);
}

static void
listener_free_task(void *arg)
{
    tp_listener *l = arg;
    tp_transport *t = l->l_transport;
    if (!l->l_closed) {
        l->l_closed = true;
        t->t_ops->listener_close(l);
    }
    tp__free(l);
    tp__transport_release(t);
}

void
tp__listener_destroy(tp_listener *l)
{
    if (l == NULL) {
        return;
    }
    tp__task_init(&l->l_free_task, listener_free_task, l);
    tp__loop_post(l->l_transport->t_loop, &l->l_free_task);
}

// ---- conns -----------------------------------------------------------------

tp_conn *
tp__conn_alloc(tp_transport *t)
{
    TP_ASSERT(t->t_ops->conn_size >= sizeof(tp_conn));
    tp_conn *c = tp__zalloc(t->t_ops->conn_size);
    if (c == NULL) {
        return NULL;
    }
    c->c_transport = t;
    atomic_init(&c->c_refs, 1);
    atomic_init(&c->c_closed_req, false);
    if (t->t_fault != NULL && tp__conn_fault_attach(c, t->t_fault) != TP_OK) {
        tp__free(c);
        return NULL;
    }
    tp__transport_hold(t);
    return c;
}

static void
transport_connect_start(void *obj, tp_aio *aio)
{
    tp_transport *t = obj;
    char *addr = aio->a_input[0];
    aio->a_input[0] = NULL;
    if (addr == NULL) {
        if (tp__aio_begin(aio, t->t_loop, NULL, NULL)) {
            tp__aio_finish_status(aio, TP_ENOMEM, "%s: connect: out of memory",
                                  t->t_ops->name);
        }
        return;
    }
    t->t_ops->connect(t, addr, aio);
    tp__free(addr);
}

void
tp__transport_connect(tp_transport *t, const char *addr, tp_aio *aio)
{
    // The backend parses the address on the loop thread, maybe after the
    // caller's string is gone: keep a copy until then.
    aio->a_input[0] = tp__strdup(addr ? addr : "");
    tp__aio_submit(aio, t->t_loop, transport_connect_start, t);
}

static void
conn_read_start(void *obj, tp_aio *aio)
{
    tp_conn *c = obj;
    c->c_transport->t_ops->conn_read(c, aio);
}

static void
conn_write_start(void *obj, tp_aio *aio)
{
    tp_conn *c = obj;
    if (c->c_fault != NULL) {
        tp__conn_fault_write(c, aio);
        return;
    }
    c->c_transport->t_ops->conn_write(c, aio);
}

// Loop thread: the backend's close, then what fault injection holds.
void
tp__conn_close_now(tp_conn *c)
{
    c->c_transport->t_ops->conn_close(c);
    if (c->c_fault != NULL) {
        tp__conn_fault_on_close(c);
    }
}

void
tp__conn_read(tp_conn *c, tp_aio *aio)
{
    tp__aio_submit(aio, c->c_transport->t_loop, conn_read_start, c);
}

void
tp__conn_write(tp_conn *c, tp_aio *aio)
{
    tp__aio_submit(aio, c->c_transport->t_loop, conn_write_start, c);
}

static void
conn_close_task(void *arg)
{
    tp_conn *c = arg;
    tp__conn_close_now(c);
    tp__conn_unref(c); // the reference tp__conn_close took
}

void
tp__conn_close(tp_conn *c)
{
    bool expected = false;
    if (!atomic_compare_exchange_strong_explicit(&c->c_closed_req, &expected,
                                                 true, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        return;
    }
    if (tp__loop_on_thread(c->c_transport->t_loop)) {
        tp__conn_close_now(c);
        return;
    }
    // Hold a reference until the close has run.
    tp__conn_ref(c);
    tp__task_init(&c->c_close_task, conn_close_task, c);
    tp__loop_post(c->c_transport->t_loop, &c->c_close_task);
}

tp_conn *
tp__conn_ref(tp_conn *c)
{
    atomic_fetch_add_explicit(&c->c_refs, 1, memory_order_relaxed);
    return c;
}

static void
conn_free_task(void *arg)
{
    tp_conn *c = arg;
    tp_transport *t = c->c_transport;
    tp__conn_close_now(c);
    t->t_ops->conn_fini(c);
    tp__conn_fault_free(c);
    tp__free(c);
    tp__transport_release(t);
}

void
tp__conn_unref(tp_conn *c)
{
    if (c == NULL) {
        return;
    }
    if (atomic_fetch_sub_explicit(&c->c_refs, 1, memory_order_acq_rel) != 1) {
        return;
    }
    tp__task_init(&c->c_free_task, conn_free_task, c);
    tp__loop_post(c->c_transport->t_loop, &c->c_free_task);
}

const char *
tp__conn_peer(const tp_conn *c)
{
    return c->c_peer;
}

const char *
tp__conn_local(const tp_conn *c)
{
    return c->c_local;
}
