// SPDX-License-Identifier: Apache-2.0
// fault.c - fault injection in the generic transport layer (fault.h): the
// per-conn fault that transport.c routes writes through, and the TP_FAULT
// parser.

#include "transport/fault.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

// ---- fault injection (fault.h) ---------------------------------------------
//
// A conn with a fault routes its writes through tp__conn_fault_write on the
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

tp_status
tp__conn_fault_attach(tp_conn *c, const tp_fault *f)
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

void
tp__conn_fault_free(tp_conn *c)
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
            tp__conn_close_now(c);
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

void
tp__conn_fault_write(tp_conn *c, tp_aio *aio)
{
    tp_conn_fault *cf = c->c_fault;
    aio->a_prov_u64[0] = cf->cf_spec.f_delay_ms > 0 && !cf->cf_closed
                             ? tp__deadline_after_ms(cf->cf_spec.f_delay_ms)
                             : 0;
    tp__list_append(&cf->cf_heldq, aio);
    conn_fault_pump(cf);
}

void
tp__conn_fault_on_close(tp_conn *c)
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
    call->st = tp__conn_fault_attach(call->c, call->f);
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
