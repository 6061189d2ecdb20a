// SPDX-License-Identifier: Apache-2.0
// faulty.c - the faulty mode of tests (PyTorch's FaultyTensorPipeAgent):
// the first N sends of chosen message kinds fail as a broken connection
// would, and sends of chosen kinds wait a set time. Built in every
// configuration, off unless options->faulty (TP_RPC_FAULTY) says so.
//
// A chosen send does not reach the pipe: its slot goes to a_delayed and
// the timer thread (calls.c) writes it when it is due, or completes it
// with the injected TP_ECONNRESET through the same path as a write the
// pipe failed (slot.c): the connection fails, every call pending on it
// fails with the connection's status, and the next call connects again.

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "ag_impl.h"
#include "core/log.h"

// Adds the kinds named by @name (@n bytes) to @r. False if unknown.
static bool
kind_add(ag_fault_rule *r, const char *name, size_t n)
{
    static const struct {
        const char *alias;
        unsigned k1, k2;
    } aliases[] = {
        {"call", AG_KIND_REQUEST, 0},
        {"request", AG_KIND_REQUEST, 0},
        {"reply", AG_KIND_RESPONSE, AG_KIND_ERROR},
        {"response", AG_KIND_RESPONSE, 0},
        {"error", AG_KIND_ERROR, 0},
    };
    for (size_t i = 0; i < TP_ARRAY_LEN(aliases); i++) {
        if (strlen(aliases[i].alias) == n &&
            strncasecmp(name, aliases[i].alias, n) == 0) {
            r->r_kinds[aliases[i].k1] = true;
            r->r_kinds[aliases[i].k2] = aliases[i].k2 != 0;
            return true;
        }
    }
    if (n > 0 && n <= 3 && strspn(name, "0123456789") >= n) {
        unsigned k = 0;
        for (size_t i = 0; i < n; i++) {
            k = k * 10 + (unsigned)(name[i] - '0');
        }
        if (tp__ag_kind_get(k) != NULL) {
            r->r_kinds[k] = true;
            return true;
        }
        return false;
    }
    // A name of the kinds table: the protocols' kinds of this build
    // ("RREF_FETCH", "DIST_AUTOGRAD_BACKWARD", ...).
    for (unsigned k = 1; k < AG_NKINDS; k++) {
        const ag_kind_desc *kd = tp__ag_kind_get(k);
        if (kd != NULL && strlen(kd->k_name) == n &&
            strncasecmp(name, kd->k_name, n) == 0) {
            r->r_kinds[k] = true;
            return true;
        }
    }
    return false;
}

// The names a rule may use, for messages.
static void
kind_names(char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "call, reply, response, error");
    for (unsigned k = 1; k < AG_NKINDS && off < len; k++) {
        const ag_kind_desc *kd = tp__ag_kind_get(k);
        if (kd != NULL) {
            off += (size_t)snprintf(buf + off, len - off, ", %s", kd->k_name);
        }
    }
}

static tp_status
rule_error(const char *spec, const char *item, size_t n, const char *why,
           tp_error **err_p)
{
    return tp__error_set(err_p, TP_EINVAL, "faulty \"%s\": \"%.*s\": %s", spec,
                         (int)n, item, why);
}

// One "fail=KINDS:N" or "delay=KINDS:MS" of @n bytes at @item.
static tp_status
rule_parse(const char *spec, const char *item, size_t n, ag_fault_rule *r,
           tp_error **err_p)
{
    memset(r, 0, sizeof(*r));
    const char *eq = memchr(item, '=', n);
    const char *colon = memchr(item, ':', n);
    if (eq == NULL || colon == NULL || colon < eq) {
        return rule_error(spec, item, n,
                          "expected fail=KINDS:N or delay=KINDS:MS", err_p);
    }
    size_t vlen = (size_t)(eq - item);
    if (vlen == 4 && strncmp(item, "fail", 4) == 0) {
        r->r_fail = true;
    } else if (!(vlen == 5 && strncmp(item, "delay", 5) == 0)) {
        return rule_error(spec, item, n, "expected fail= or delay=", err_p);
    }
    const char *num = colon + 1;
    size_t nlen = (size_t)(item + n - num);
    if (nlen == 0 || nlen > 9 || strspn(num, "0123456789") < nlen) {
        return rule_error(spec, item, n,
                          r->r_fail ? "N: a count of 0..999999999"
                                    : "MS: milliseconds, 0..999999999",
                          err_p);
    }
    for (size_t i = 0; i < nlen; i++) {
        r->r_n = r->r_n * 10 + (uint64_t)(num[i] - '0');
    }
    r->r_total = r->r_n;
    for (const char *k = eq + 1; k < colon;) {
        const char *e = memchr(k, '+', (size_t)(colon - k));
        e = e != NULL ? e : colon;
        if (!kind_add(r, k, (size_t)(e - k))) {
            char names[1024], why[1200];
            kind_names(names, sizeof(names));
            snprintf(why, sizeof(why),
                     "unknown message kind \"%.*s\" (%s, or a number)",
                     (int)(e - k), k, names);
            return rule_error(spec, item, n, why, err_p);
        }
        k = e + 1;
    }
    snprintf(r->r_text, sizeof(r->r_text), "%.*s", (int)n, item);
    return TP_OK;
}

tp_status
tp__ag_faulty_parse(const char *spec, ag_faulty *f, tp_error **err_p)
{
    memset(f, 0, sizeof(*f));
    if (spec == NULL || spec[0] == '\0') {
        return TP_OK;
    }
    if (strlen(spec) >= sizeof(f->f_spec)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "faulty: a spec of %zu bytes (at most %zu)",
                             strlen(spec), sizeof(f->f_spec) - 1);
    }
    for (const char *p = spec;;) {
        const char *e = strchr(p, ',');
        size_t n = e != NULL ? (size_t)(e - p) : strlen(p);
        if (f->f_nrules == AG_FAULTY_MAX_RULES) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "faulty \"%s\": more than %d rules", spec,
                                 AG_FAULTY_MAX_RULES);
        }
        tp_status st = rule_parse(spec, p, n, &f->f_rules[f->f_nrules], err_p);
        if (st != TP_OK) {
            memset(f, 0, sizeof(*f));
            return st;
        }
        f->f_nrules++;
        if (e == NULL) {
            break;
        }
        p = e + 1;
    }
    snprintf(f->f_spec, sizeof(f->f_spec), "%s", spec);
    return TP_OK;
}

bool
tp__ag_faulty_intercept(tp_agent *a, ag_wslot *w)
{
    ag_faulty *f = &a->a_faulty;
    if (f->f_nrules == 0) {
        return false;
    }
    ag_conn *c = w->w_conn;
    tp__mtx_lock(&a->a_mtx);
    ag_fault_rule *hit = NULL;
    uint64_t nth = 0;
    for (int i = 0; i < f->f_nrules && hit == NULL; i++) {
        ag_fault_rule *r = &f->f_rules[i];
        if (!r->r_kinds[w->w_kind] || (r->r_fail && r->r_n == 0)) {
            continue;
        }
        hit = r;
        if (r->r_fail) {
            nth = r->r_total - --r->r_n;
        }
    }
    if (hit == NULL) {
        tp__mtx_unlock(&a->a_mtx);
        return false;
    }
    w->w_due_ns = hit->r_fail ? 0 : tp__deadline_after_ms((int64_t)hit->r_n);
    w->w_inject = NULL;
    if (hit->r_fail) {
        char who[AG_MAX_URL + 160];
        tp__ag_conn_describe(c, who, sizeof(who));
        w->w_inject = tp__error_new(
            TP_ECONNRESET, 0, NULL,
            "rpc %s: the send of a %s message to %s failed on purpose "
            "(faulty agent, \"%s\": failure %" PRIu64 " of %" PRIu64 ")",
            ag_name(a), tp__ag_kind_get(w->w_kind)->k_name, who, hit->r_text,
            nth, hit->r_total);
        if (w->w_inject == NULL) {
            w->w_inject = tp__error_nomem();
        }
    }
    // The queued write counts as an operation of its connection; the
    // timer thread writes or fails it (never this thread: the caller's
    // completion does not run inside its call).
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    w->w_dnext = a->a_delayed;
    a->a_delayed = w;
    tp__cv_signal(&a->a_timer_cv);
    tp__mtx_unlock(&a->a_mtx);
    return true;
}
