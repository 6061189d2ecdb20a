// SPDX-License-Identifier: Apache-2.0
// transport.c - the generic layer over transport backends: runs backend
// ops on the loop thread, and frees conns and listeners there once the
// last reference is gone. All backend state is loop-owned; the one lock,
// t_mtx, guards only the count of live objects that destroy waits on.

#include "transport.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "transport/fault.h"

static void conn_fault_free(tp_conn *c);
static tp_status conn_fault_attach(tp_conn *c, const tp_fault *f);
static void conn_fault_on_close(tp_conn *c);
static void conn_fault_write(tp_conn *c, tp_aio *aio);

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
    if (t->t_fault != NULL && conn_fault_attach(c, t->t_fault) != TP_OK) {
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
        conn_fault_write(c, aio);
        return;
    }
    c->c_transport->t_ops->conn_write(c, aio);
}

// Loop thread: the backend's close, then what fault injection holds.
static void
conn_close_now(tp_conn *c)
{
    c->c_transport->t_ops->conn_close(c);
    if (c->c_fault != NULL) {
        conn_fault_on_close(c);
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
    conn_close_now(c);
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
        conn_close_now(c);
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
    conn_close_now(c);
    t->t_ops->conn_fini(c);
    conn_fault_free(c);
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

// ---- fault injection (fault.h) ---------------------------------------------
//
// A conn with a fault routes its writes through conn_fault_write on the
// loop thread. Writes wait, not yet begun, in cf_heldq while they are
// delayed or while the write that crosses the byte limit is in flight
// (writes complete in order). The crossing write is begun here: its first
// bytes, up to the limit, go out through the internal aio cf_prefix (which
// holds a conn reference while in flight); then the fault applies to it
// and to every later write. Stalled writes wait, begun, in cf_stallq until
// their timeout, a cancel or the conn's close.

typedef struct tp_conn_fault {
    tp_fault cf_spec;
    tp_conn *cf_conn;
    uint64_t cf_written; // bytes counted so far
    tp_list cf_heldq;    // tp_aio, not begun; a_prov_u64[0] = due time
    tp_list cf_stallq;   // tp_aio, begun, never to complete by themselves
    tp_timer cf_timer;   // the head of cf_heldq is due
    tp_aio cf_prefix;    // the crossing write's bytes up to the limit
    tp_aio *cf_crossing; // the user aio cf_prefix writes for
    uint64_t cf_crossing_len;
    bool cf_closed; // the conn was closed
} tp_conn_fault;

static void conn_fault_pump(tp_conn_fault *cf);

static void
conn_fault_timer_cb(tp_timer *tm, void *arg)
{
    TP_UNUSED(tm);
    conn_fault_pump(arg);
}

static void conn_fault_prefix_done(void *arg);

static tp_status
conn_fault_attach(tp_conn *c, const tp_fault *f)
{
    tp_conn_fault *cf = c->c_fault;
    if (cf == NULL) {
        cf = tp__zalloc(sizeof(*cf));
        if (cf == NULL) {
            return TP_ENOMEM;
        }
        cf->cf_conn = c;
        TP_LIST_INIT(&cf->cf_heldq, tp_aio, a_node);
        TP_LIST_INIT(&cf->cf_stallq, tp_aio, a_node);
        tp__timer_init(&cf->cf_timer, conn_fault_timer_cb, cf);
        tp__aio_init(&cf->cf_prefix, conn_fault_prefix_done, cf);
        c->c_fault = cf;
    }
    if (f != NULL) {
        cf->cf_spec = *f;
    } else {
        memset(&cf->cf_spec, 0, sizeof(cf->cf_spec));
    }
    return TP_OK;
}

static void
conn_fault_free(tp_conn *c)
{
    tp_conn_fault *cf = c->c_fault;
    if (cf == NULL) {
        return;
    }
    // The close emptied both queues, and a crossing write holds a conn
    // reference, so none is in flight when the conn is freed.
    TP_ASSERT(tp__list_empty(&cf->cf_heldq));
    TP_ASSERT(tp__list_empty(&cf->cf_stallq));
    TP_ASSERT(cf->cf_crossing == NULL);
    tp__timer_stop(c->c_transport->t_loop, &cf->cf_timer);
    tp__aio_fini(&cf->cf_prefix);
    tp__free(cf);
    c->c_fault = NULL;
}

static void
conn_fault_stall_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    tp_conn_fault *cf = arg;
    tp_conn *c = cf->cf_conn;
    tp__list_remove(&cf->cf_stallq, aio);
    tp__aio_finish_status(aio, reason,
                          "%s: write to peer %s %s (stalled by fault injection "
                          "after %llu bytes)",
                          c->c_transport->t_ops->name, c->c_peer,
                          reason == TP_ETIMEDOUT ? "timed out"
                          : reason == TP_ECLOSED ? "closed"
                                                 : "canceled",
                          (unsigned long long)cf->cf_spec.f_after);
}

// The fault applies to @aio, a write at or past the limit; @begun: the
// crossing write, already begun, @sent of its bytes went out.
static void
conn_fault_apply(tp_conn_fault *cf, tp_aio *aio, bool begun, uint64_t sent)
{
    tp_conn *c = cf->cf_conn;
    tp_loop *loop = c->c_transport->t_loop;
    switch (cf->cf_spec.f_mode) {
    case TP_FAULT_CLOSE:
        if (!begun && !tp__aio_begin(aio, loop, NULL, NULL)) {
            return;
        }
        tp__aio_finish_status(aio, TP_ECONNRESET,
                              "%s: write to peer %s: connection closed by "
                              "fault injection after %llu bytes (TP_FAULT "
                              "close_after)",
                              c->c_transport->t_ops->name, c->c_peer,
                              (unsigned long long)cf->cf_spec.f_after);
        aio->a_count = sent;
        if (!cf->cf_closed) {
            conn_close_now(c);
        }
        return;
    case TP_FAULT_DROP:
        if (!begun && !tp__aio_begin(aio, loop, NULL, NULL)) {
            return;
        }
        tp__aio_finish(aio, NULL, tp__aio_iov_total(aio));
        return;
    default: // TP_FAULT_STALL
        if (!begun) {
            if (!tp__aio_begin(aio, loop, conn_fault_stall_cancel, cf)) {
                return;
            }
        } else {
            // A cancel that came while its first bytes went out was only
            // a request: honour it now.
            aio->a_cancel_fn = conn_fault_stall_cancel;
            aio->a_cancel_arg = cf;
            if (atomic_load_explicit(&aio->a_cancel_req,
                                     memory_order_acquire)) {
                tp__aio_finish_status(aio, TP_ECANCELED,
                                      "%s: write to peer %s canceled",
                                      c->c_transport->t_ops->name, c->c_peer);
                return;
            }
        }
        if (cf->cf_closed) {
            conn_fault_stall_cancel(aio, cf, TP_ECLOSED);
            return;
        }
        tp__list_append(&cf->cf_stallq, aio);
        return;
    }
}

static void
conn_fault_prefix_start(void *obj, tp_aio *aio)
{
    tp_conn *c = obj;
    c->c_transport->t_ops->conn_write(c, aio);
}

// The crossing write's cancel: pass it on to its prefix in flight (the
// write then completes when the prefix does).
static void
conn_fault_crossing_cancel(tp_aio *aio, void *arg, tp_status reason)
{
    TP_UNUSED(aio);
    TP_UNUSED(reason);
    tp_conn_fault *cf = arg;
    tp_aio_cancel(&cf->cf_prefix);
}

static void
conn_fault_prefix_done(void *arg)
{
    tp_conn_fault *cf = arg;
    tp_conn *c = cf->cf_conn;
    tp_aio *aio = cf->cf_crossing;
    cf->cf_crossing = NULL;
    const tp_error *err = tp_aio_error(&cf->cf_prefix);
    if (err != NULL) {
        tp__aio_finish(aio, tp_error_ref((tp_error *)err),
                       tp_aio_count(&cf->cf_prefix));
    } else {
        conn_fault_apply(cf, aio, true, tp_aio_count(&cf->cf_prefix));
    }
    conn_fault_pump(cf);
    tp__conn_unref(c); // the reference the prefix held
}

// Starts @aio (not begun) now: passed on whole, or faulted.
static void
conn_fault_write_now(tp_conn_fault *cf, tp_aio *aio)
{
    tp_conn *c = cf->cf_conn;
    const tp_transport_ops *ops = c->c_transport->t_ops;
    uint64_t len = tp__aio_iov_total(aio);
    uint64_t after = cf->cf_spec.f_after;
    aio->a_prov_u64[0] = aio->a_prov_u64[1] = 0;
    if (cf->cf_closed || cf->cf_spec.f_mode == TP_FAULT_NONE ||
        cf->cf_written + len <= after) {
        cf->cf_written += len;
        ops->conn_write(c, aio);
        return;
    }
    if (cf->cf_written >= after) {
        conn_fault_apply(cf, aio, false, 0);
        return;
    }
    // It crosses the limit: its bytes up to the limit go out first.
    tp_loop *loop = c->c_transport->t_loop;
    if (!tp__aio_begin(aio, loop, conn_fault_crossing_cancel, cf)) {
        return;
    }
    uint64_t want = after - cf->cf_written;
    cf->cf_written = after;
    tp_iov iov[TP_AIO_MAX_IOV];
    unsigned n = 0;
    for (unsigned i = 0; i < aio->a_niov && want > 0; i++) {
        uint64_t take = TP_MIN(want, (uint64_t)aio->a_iov[i].iov_len);
        iov[n].iov_base = aio->a_iov[i].iov_base;
        iov[n].iov_len = (size_t)take;
        n++;
        want -= take;
    }
    tp_aio_set_iov(&cf->cf_prefix, n, iov);
    tp_aio_set_timeout(&cf->cf_prefix, aio->a_timeout_ms);
    cf->cf_crossing = aio;
    tp__conn_ref(c);
    tp__aio_submit(&cf->cf_prefix, loop, conn_fault_prefix_start, c);
}

// Starts the held writes that are due, in order, unless a crossing write
// is in flight; arms the timer for the next one.
static void
conn_fault_pump(tp_conn_fault *cf)
{
    tp_loop *loop = cf->cf_conn->c_transport->t_loop;
    while (cf->cf_crossing == NULL && !tp__list_empty(&cf->cf_heldq)) {
        tp_aio *aio = tp__list_first(&cf->cf_heldq);
        if (!cf->cf_closed && aio->a_prov_u64[0] > tp__now_ns()) {
            tp__timer_start(loop, &cf->cf_timer, aio->a_prov_u64[0]);
            return;
        }
        tp__list_remove(&cf->cf_heldq, aio);
        conn_fault_write_now(cf, aio);
    }
}

static void
conn_fault_write(tp_conn *c, tp_aio *aio)
{
    tp_conn_fault *cf = c->c_fault;
    aio->a_prov_u64[0] = cf->cf_spec.f_delay_ms > 0 && !cf->cf_closed
                             ? tp__deadline_after_ms(cf->cf_spec.f_delay_ms)
                             : 0;
    tp__list_append(&cf->cf_heldq, aio);
    conn_fault_pump(cf);
}

static void
conn_fault_on_close(tp_conn *c)
{
    tp_conn_fault *cf = c->c_fault;
    if (cf->cf_closed) {
        return;
    }
    cf->cf_closed = true;
    tp__timer_stop(c->c_transport->t_loop, &cf->cf_timer);
    tp_aio *aio;
    while ((aio = tp__list_first(&cf->cf_stallq)) != NULL) {
        conn_fault_stall_cancel(aio, cf, TP_ECLOSED);
    }
    // Held writes go to the closed backend, which fails them.
    conn_fault_pump(cf);
}

typedef struct conn_fault_set_call {
    tp_conn *c;
    const tp_fault *f;
    tp_status st;
} conn_fault_set_call;

static void
conn_fault_set_fn(void *arg)
{
    conn_fault_set_call *call = arg;
    call->st = conn_fault_attach(call->c, call->f);
    if (call->st == TP_OK) {
        conn_fault_pump(call->c->c_fault);
    }
}

tp_status
tp__conn_fault_set(tp_conn *c, const tp_fault *f)
{
    conn_fault_set_call call = {.c = c, .f = f, .st = TP_OK};
    tp__loop_call(c->c_transport->t_loop, conn_fault_set_fn, &call);
    return call.st;
}

void
tp__transport_fault_set(tp_transport *t, const tp_fault *f)
{
    tp__free(t->t_fault);
    t->t_fault = NULL;
    if (f == NULL || (f->f_mode == TP_FAULT_NONE && f->f_delay_ms <= 0)) {
        return;
    }
    t->t_fault = tp__alloc(sizeof(*t->t_fault));
    if (t->t_fault != NULL) {
        *t->t_fault = *f;
    }
}

// ---- TP_FAULT parsing ------------------------------------------------------

static bool
fault_parse_u64(const char *v, uint64_t max, bool suffix, uint64_t *out)
{
    if (!isdigit((unsigned char)v[0])) {
        return false;
    }
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0) {
        return false;
    }
    uint64_t mul = 1;
    if (suffix && *end != '\0' && end[1] == '\0') {
        switch (*end) {
        case 'K':
        case 'k':
            mul = UINT64_C(1) << 10;
            break;
        case 'M':
        case 'm':
            mul = UINT64_C(1) << 20;
            break;
        case 'G':
        case 'g':
            mul = UINT64_C(1) << 30;
            break;
        default:
            return false;
        }
        end++;
    }
    if (*end != '\0' || x > max / mul) {
        return false;
    }
    *out = (uint64_t)x * mul;
    return true;
}

tp_status
tp__fault_parse(const char *spec, tp_fault *f_p, tp_error **err_p)
{
    static const char known[] =
        "transport, close_after, drop_after, stall_after, delay_ms";
    tp_fault f;
    memset(&f, 0, sizeof(f));
    char buf[512];
    if (spec == NULL || spec[0] == '\0') {
        return tp__error_set(err_p, TP_EINVAL, "TP_FAULT: empty");
    }
    if (strlen(spec) >= sizeof(buf)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "TP_FAULT: longer than %zu characters",
                             sizeof(buf) - 1);
    }
    snprintf(buf, sizeof(buf), "%s", spec);
    unsigned seen = 0;
    char *item = buf;
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma != NULL) {
            *comma = '\0';
        }
        char *eq = strchr(item, '=');
        if (eq == NULL || eq == item || eq[1] == '\0') {
            return tp__error_set(err_p, TP_EINVAL,
                                 "TP_FAULT: \"%s\" is not key=value (in "
                                 "\"%s\"; keys: %s)",
                                 item, spec, known);
        }
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        unsigned bit;
        if (strcmp(key, "transport") == 0) {
            bit = 1;
            size_t n = strlen(val);
            if (n >= sizeof(f.f_transport)) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "TP_FAULT: transport \"%s\" too long",
                                     val);
            }
            for (size_t i = 0; i < n; i++) {
                if (!islower((unsigned char)val[i]) &&
                    !isdigit((unsigned char)val[i]) && val[i] != '_') {
                    return tp__error_set(err_p, TP_EINVAL,
                                         "TP_FAULT: transport \"%s\" is not "
                                         "a transport name",
                                         val);
                }
            }
            memcpy(f.f_transport, val, n + 1);
        } else if (strcmp(key, "close_after") == 0 ||
                   strcmp(key, "drop_after") == 0 ||
                   strcmp(key, "stall_after") == 0) {
            bit = key[0] == 'c' ? 2 : key[0] == 'd' ? 4 : 8;
            if (f.f_mode != TP_FAULT_NONE && !(seen & bit)) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "TP_FAULT: only one of close_after, "
                                     "drop_after and stall_after (in \"%s\")",
                                     spec);
            }
            if (!fault_parse_u64(val, UINT64_MAX, true, &f.f_after)) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "TP_FAULT: %s: \"%s\" is not a byte "
                                     "count (digits, optional K, M or G)",
                                     key, val);
            }
            f.f_mode = bit == 2   ? TP_FAULT_CLOSE
                       : bit == 4 ? TP_FAULT_DROP
                                  : TP_FAULT_STALL;
        } else if (strcmp(key, "delay_ms") == 0) {
            bit = 16;
            uint64_t ms;
            if (!fault_parse_u64(val, 3600000u, false, &ms)) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "TP_FAULT: delay_ms: \"%s\" is not a "
                                     "number of milliseconds (0..3600000)",
                                     val);
            }
            f.f_delay_ms = (int64_t)ms;
        } else {
            return tp__error_set(err_p, TP_EINVAL,
                                 "TP_FAULT: unknown key \"%s\" (in \"%s\"; "
                                 "keys: %s)",
                                 key, spec, known);
        }
        if (seen & bit) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "TP_FAULT: %s given twice (in \"%s\")", key,
                                 spec);
        }
        seen |= bit;
        if (comma == NULL) {
            break;
        }
        item = comma + 1;
    }
    if (f.f_mode == TP_FAULT_NONE && f.f_delay_ms == 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "TP_FAULT: no fault in \"%s\" (give close_after, "
                             "drop_after, stall_after or delay_ms)",
                             spec);
    }
    *f_p = f;
    return TP_OK;
}
