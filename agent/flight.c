// SPDX-License-Identifier: Apache-2.0
// flight.c - the flight recorder: a ring of the last messages this agent
// sent (calls, replies, notifications) with their peer, size, state and
// times, for the question users ask of a hung job: what was in flight, to
// whom, and since when (NCCL's and PyTorch's flight recorders).
//
// The ring lives under a_mtx and every update is made where the agent
// holds a_mtx anyway (a call made, a write slot taken, a write or a call
// ended): the hot path pays one record write, no extra lock. A record is
// found again by its seq; one that the ring overwrote meanwhile is simply
// not updated.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ag_impl.h"
#include "core/alloc.h"
#include "core/log.h"

// The most records the debug info prints (the accessor has no limit).
#define FR_DEBUG_MAX 1000
// The most peers named by timeout lines in one sweep of the timer.
#define FR_LOG_PEERS 8

tp_status
tp__ag_fr_init(tp_agent *a, tp_error **err_p)
{
    int n = a->a_opts.flight_recorder;
    if (n <= 0) {
        return TP_OK;
    }
    a->a_fr.f_recs = tp__zalloc((size_t)n * sizeof(ag_fr_rec));
    if (a->a_fr.f_recs == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "rpc init: no memory for a flight recorder of "
                             "%d messages (flight_recorder)",
                             n);
    }
    a->a_fr.f_cap = (uint32_t)n;
    return TP_OK;
}

void
tp__ag_fr_fini(tp_agent *a)
{
    tp__free(a->a_fr.f_recs);
    a->a_fr.f_recs = NULL;
}

static ag_fr_rec *
fr_rec_locked(tp_agent *a, uint64_t seq)
{
    if (seq == 0 || a->a_fr.f_recs == NULL) {
        return NULL;
    }
    ag_fr_rec *r = &a->a_fr.f_recs[seq % a->a_fr.f_cap];
    return r->r_seq == seq ? r : NULL;
}

uint64_t
tp__ag_fr_begin_locked(tp_agent *a, ag_kind kind, int peer, uint64_t call_id,
                       const char *name, uint64_t bytes, bool call,
                       uint64_t now_ns)
{
    ag_fr *f = &a->a_fr;
    if (f->f_recs == NULL) {
        return 0;
    }
    uint64_t seq = ++f->f_next;
    if (now_ns == 0) {
        now_ns = tp__now_ns();
    }
    ag_fr_rec *r = &f->f_recs[seq % f->f_cap];
    r->r_seq = seq;
    r->r_call_id = call_id;
    r->r_bytes = bytes;
    r->r_start_ns = now_ns;
    r->r_end_ns = 0;
    r->r_peer = peer;
    r->r_kind = (uint8_t)kind;
    r->r_state = TP_RPC_OP_SENT;
    r->r_call = call;
    size_t n = name != NULL ? strnlen(name, sizeof(r->r_name) - 1) : 0;
    memcpy(r->r_name, name != NULL ? name : "", n);
    r->r_name[n] = '\0';
    return seq;
}

void
tp__ag_fr_written_locked(tp_agent *a, uint64_t seq, bool ok)
{
    ag_fr_rec *r = fr_rec_locked(a, seq);
    // A reply may have ended the call before its write's completion ran.
    if (r == NULL || r->r_state != TP_RPC_OP_SENT) {
        return;
    }
    if (ok && r->r_call) {
        r->r_state = TP_RPC_OP_WAITING;
        return;
    }
    r->r_state = ok ? TP_RPC_OP_DONE : TP_RPC_OP_FAILED;
    r->r_end_ns = tp__now_ns();
}

void
tp__ag_fr_end_locked(tp_agent *a, uint64_t seq, tp_status st)
{
    ag_fr_rec *r = fr_rec_locked(a, seq);
    if (r == NULL || r->r_end_ns != 0) {
        return;
    }
    r->r_state = st == TP_OK          ? TP_RPC_OP_DONE
                 : st == TP_ETIMEDOUT ? TP_RPC_OP_TIMED_OUT
                                      : TP_RPC_OP_FAILED;
    r->r_end_ns = tp__now_ns();
}

const char *
tp_rpc_op_state_name(tp_rpc_op_state s)
{
    switch (s) {
    case TP_RPC_OP_SENT:
        return "sent";
    case TP_RPC_OP_WAITING:
        return "waiting reply";
    case TP_RPC_OP_DONE:
        return "done";
    case TP_RPC_OP_FAILED:
        return "failed";
    case TP_RPC_OP_TIMED_OUT:
        return "timed out";
    }
    return "?";
}

static bool
fr_in_flight(const ag_fr_rec *r)
{
    return r->r_state == TP_RPC_OP_SENT || r->r_state == TP_RPC_OP_WAITING;
}

// The oldest seq the ring still holds.
static uint64_t
fr_first_locked(const tp_agent *a)
{
    const ag_fr *f = &a->a_fr;
    return f->f_next > f->f_cap ? f->f_next - f->f_cap + 1 : 1;
}

static void
fr_export(const tp_agent *a, const ag_fr_rec *r, uint64_t mono_ns,
          int64_t real_us, tp_rpc_op_record *o)
{
    memset(o, 0, sizeof(*o));
    o->seq = r->r_seq;
    const ag_kind_desc *kd = tp__ag_kind_get(r->r_kind);
    if (kd != NULL) {
        snprintf(o->kind, sizeof(o->kind), "%s", kd->k_name);
    } else {
        snprintf(o->kind, sizeof(o->kind), "kind %u", (unsigned)r->r_kind);
    }
    memcpy(o->name, r->r_name, sizeof(o->name));
    o->call_id = r->r_call_id;
    if (r->r_peer >= 0 && r->r_peer < a->a_world) {
        o->peer = a->a_peers[r->r_peer].p_info;
    } else {
        snprintf(o->peer.name, sizeof(o->peer.name), "?");
        o->peer.rank = -1;
    }
    o->bytes = r->r_bytes;
    o->state = (tp_rpc_op_state)r->r_state;
    uint64_t end = r->r_end_ns != 0 ? r->r_end_ns : mono_ns;
    o->duration_us = end > r->r_start_ns ? (end - r->r_start_ns) / 1000 : 0;
    uint64_t ago_ns = mono_ns > r->r_start_ns ? mono_ns - r->r_start_ns : 0;
    o->start_us = real_us - (int64_t)(ago_ns / 1000);
}

tp_status
tp_rpc_get_recent_ops(const tp_agent *a, tp_rpc_op_record *out, size_t cap,
                      size_t *n_p)
{
    if (a == NULL || n_p == NULL || (out == NULL && cap > 0)) {
        return TP_EINVAL;
    }
    tp_agent *ma = (tp_agent *)a;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t real_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    size_t n = 0;
    tp__mtx_lock(&ma->a_mtx);
    uint64_t mono = tp__now_ns();
    if (a->a_fr.f_recs != NULL && cap > 0) {
        uint64_t first = fr_first_locked(a);
        if (a->a_fr.f_next - first + 1 > cap) {
            first = a->a_fr.f_next - cap + 1;
        }
        for (uint64_t s = first; s <= a->a_fr.f_next; s++) {
            const ag_fr_rec *r = &a->a_fr.f_recs[s % a->a_fr.f_cap];
            if (r->r_seq == s) {
                fr_export(a, r, mono, real_us, &out[n++]);
            }
        }
    }
    tp__mtx_unlock(&ma->a_mtx);
    *n_p = n;
    return TP_OK;
}

// ---- text ----------------------------------------------------------------

// "REQUEST "tp.echo" id 5 to bravo (rank 1), 100 bytes, waiting reply for
// 12.3 ms"
static int
fr_describe(const tp_rpc_op_record *o, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "%s%s%s%s id %" PRIu64 " to %s (rank %d), %" PRIu64
                    " bytes, %s %s %.3f ms",
                    o->kind, o->name[0] ? " \"" : "", o->name,
                    o->name[0] ? "\"" : "", o->call_id, o->peer.name,
                    o->peer.rank, o->bytes, tp_rpc_op_state_name(o->state),
                    o->state == TP_RPC_OP_SENT || o->state == TP_RPC_OP_WAITING
                        ? "for"
                        : "after",
                    (double)o->duration_us / 1000.0);
}

// Appends to @buf (@len, *@off used) the messages still in flight to
// @rank, "none" if there are none.
static void
fr_inflight_text_locked(tp_agent *a, int rank, char *buf, size_t len,
                        size_t *off)
{
    uint64_t mono = tp__now_ns();
    size_t shown = 0, more = 0;
    for (uint64_t s = fr_first_locked(a); s <= a->a_fr.f_next; s++) {
        const ag_fr_rec *r = &a->a_fr.f_recs[s % a->a_fr.f_cap];
        if (r->r_seq != s || r->r_peer != rank || !fr_in_flight(r)) {
            continue;
        }
        tp_rpc_op_record o;
        fr_export(a, r, mono, 0, &o);
        char one[400];
        int n = fr_describe(&o, one, sizeof(one));
        // Keep room for " and N more".
        if (more > 0 || n < 0 || *off + (size_t)n + 40 >= len) {
            more++;
            continue;
        }
        int m =
            snprintf(buf + *off, len - *off, "%s%s", shown ? "; " : "", one);
        *off += (size_t)TP_MAX(m, 0);
        shown++;
    }
    int m = 0;
    if (shown == 0 && more == 0) {
        m = snprintf(buf + *off, len - *off, "none");
    } else if (more > 0) {
        m = snprintf(buf + *off, len - *off, " and %zu more", more);
    }
    *off += (size_t)TP_MAX(m, 0);
    *off = TP_MIN(*off, len - 1);
}

static void
fr_log_peer(tp_agent *a, const ag_peer *p, const ag_call *expired)
{
    const ag_call *first = NULL;
    size_t ncalls = 0;
    for (const ag_call *c = expired; c != NULL; c = c->c_hnext) {
        if (c->c_peer == p) {
            first = first != NULL ? first : c;
            ncalls++;
        }
    }
    char list[4096];
    size_t off = 0;
    list[0] = '\0';
    tp__mtx_lock(&a->a_mtx);
    if (a->a_fr.f_recs != NULL) {
        fr_inflight_text_locked(a, p->p_info.rank, list, sizeof(list), &off);
    } else {
        snprintf(list, sizeof(list), "unknown (flight_recorder is 0)");
    }
    tp__mtx_unlock(&a->a_mtx);
    char also[48] = "";
    if (ncalls > 1) {
        snprintf(also, sizeof(also), " (and %zu more calls to it)", ncalls - 1);
    }
    TP_LOG_WARN("TP-RPC-TIMEOUT",
                "rpc %s: call \"%s\" id %" PRIu64
                " to %s (rank %d) timed out after %lld ms%s; in flight to "
                "%s: %s",
                ag_name(a), first->c_fn_name, first->c_id, p->p_info.name,
                p->p_info.rank, (long long)first->c_timeout_ms, also,
                p->p_info.name, list);
}

void
tp__ag_fr_log_timeouts(tp_agent *a, const ag_call *expired)
{
    if (!tp__log_enabled(TP_LOG_LEVEL_WARN)) {
        return;
    }
    const ag_peer *seen[FR_LOG_PEERS];
    size_t nseen = 0;
    for (const ag_call *c = expired; c != NULL; c = c->c_hnext) {
        bool dup = false;
        for (size_t i = 0; i < nseen && !dup; i++) {
            dup = seen[i] == c->c_peer;
        }
        if (dup) {
            continue;
        }
        if (nseen == FR_LOG_PEERS) {
            TP_LOG_WARN("TP-RPC-TIMEOUT",
                        "rpc %s: calls to more workers timed out too: "
                        "tp_rpc_get_debug_info lists them",
                        ag_name(a));
            return;
        }
        seen[nseen++] = c->c_peer;
        fr_log_peer(a, c->c_peer, expired);
    }
}

size_t
tp__ag_fr_debug_size(const tp_agent *a)
{
    return 200 + (size_t)TP_MIN(a->a_fr.f_cap, (uint32_t)FR_DEBUG_MAX) * 560;
}

size_t
tp__ag_fr_debug(tp_agent *a, char *buf, size_t len)
{
    size_t off = 0;
#define FR_ADD(...)                                                            \
    do {                                                                       \
        if (off < len) {                                                       \
            int n_ = snprintf(buf + off, len - off, __VA_ARGS__);              \
            off += n_ > 0 ? (size_t)n_ : 0;                                    \
        }                                                                      \
    } while (0)
    if (a->a_fr.f_recs == NULL) {
        FR_ADD("flight recorder: off (flight_recorder 0)\n");
        return TP_MIN(off, len);
    }
    size_t cap = TP_MIN(a->a_fr.f_cap, (uint32_t)FR_DEBUG_MAX);
    tp_rpc_op_record *ops = tp__alloc(cap * sizeof(*ops));
    size_t n = 0;
    if (ops == NULL || tp_rpc_get_recent_ops(a, ops, cap, &n) != TP_OK) {
        tp__free(ops);
        FR_ADD("flight recorder: out of memory\n");
        return TP_MIN(off, len);
    }
    size_t inflight = 0;
    for (size_t i = 0; i < n; i++) {
        inflight +=
            ops[i].state == TP_RPC_OP_SENT || ops[i].state == TP_RPC_OP_WAITING;
    }
    FR_ADD("flight recorder: last %zu messages sent (of %" PRIu32
           " kept), %zu in flight, oldest first:\n",
           n, a->a_fr.f_cap, inflight);
    for (size_t i = 0; i < n; i++) {
        char one[400];
        fr_describe(&ops[i], one, sizeof(one));
        FR_ADD("  #%" PRIu64 " %s\n", ops[i].seq, one);
    }
#undef FR_ADD
    tp__free(ops);
    return TP_MIN(off, len);
}
