// SPDX-License-Identifier: Apache-2.0
// stats.c - per-peer counters: call and byte counts, errors and timeouts,
// a log2 latency histogram (4 sub-buckets per power of two) for p50/p99,
// and the debug info text (with the flight recorder's lines, flight.c).

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"

void
tp__ag_lat_record_locked(ag_stats *s, uint64_t ns)
{
    if (s->s_lat_n == 0 || ns < s->s_lat_min_ns) {
        s->s_lat_min_ns = ns;
    }
    if (ns > s->s_lat_max_ns) {
        s->s_lat_max_ns = ns;
    }
    s->s_lat_n++;
    s->s_lat_sum_ns += (double)ns;
    unsigned b = 0;
    if (ns >= 4) {
        unsigned lg = 63u - (unsigned)__builtin_clzll(ns);
        unsigned sub = (unsigned)(ns >> (lg - 2)) & 3u;
        b = lg * 4u + sub;
    }
    s->s_lat_hist[TP_MIN(b, AG_LAT_BUCKETS - 1u)]++;
}

// The lower edge of bucket @b in ns.
static double
lat_bucket_ns(unsigned b)
{
    unsigned lg = b / 4, sub = b % 4;
    if (lg < 2) {
        return (double)b;
    }
    return (double)(1ull << lg) * (1.0 + sub / 4.0);
}

static double
lat_quantile_us(const ag_stats *s, double q)
{
    if (s->s_lat_n == 0) {
        return 0;
    }
    uint64_t want = (uint64_t)(q * (double)(s->s_lat_n - 1)) + 1;
    uint64_t seen = 0;
    for (unsigned b = 0; b < AG_LAT_BUCKETS; b++) {
        seen += s->s_lat_hist[b];
        if (seen >= want) {
            // The bucket's middle, clamped to what was observed.
            double lo = lat_bucket_ns(b), hi = lat_bucket_ns(b + 1);
            double v = (lo + hi) / 2;
            v = TP_MAX(v, (double)s->s_lat_min_ns);
            v = TP_MIN(v, (double)s->s_lat_max_ns);
            return v / 1000.0;
        }
    }
    return (double)s->s_lat_max_ns / 1000.0;
}

// Unlinks @c from every list and updates the counters. @st: how it ended.

// ---- counters ------------------------------------------------------------

static void
stats_fill_locked(const tp_agent *a, const ag_peer *p, tp_rpc_peer_stats *s)
{
    const ag_stats *ps = &p->p_stats;
    memset(s, 0, sizeof(*s));
    s->peer = p->p_info;
    s->calls_sent = ps->s_calls_sent;
    s->calls_received = ps->s_calls_received;
    s->bytes_sent = ps->s_bytes_sent;
    s->bytes_received = ps->s_bytes_received;
    s->errors = ps->s_errors;
    s->timeouts = ps->s_timeouts;
    s->pending = ps->s_pending;
    if (ps->s_lat_n > 0) {
        s->latency_min_us = (double)ps->s_lat_min_ns / 1000.0;
        s->latency_max_us = (double)ps->s_lat_max_ns / 1000.0;
        s->latency_mean_us = ps->s_lat_sum_ns / (double)ps->s_lat_n / 1000.0;
        s->latency_p50_us = lat_quantile_us(ps, 0.5);
        s->latency_p99_us = lat_quantile_us(ps, 0.99);
    }
    const ag_conn *c = p->p_out;
    if (c == NULL) {
        for (c = a->a_conns; c != NULL; c = c->c_next) {
            if (c->c_peer == p && !c->c_failed) {
                break;
            }
        }
    }
    if (c != NULL && a->a_state != AG_CLOSED) {
        const char *t = tp_pipe_transport(c->c_pipe);
        const char *ch = tp_pipe_channel(c->c_pipe);
        snprintf(s->transport, sizeof(s->transport), "%s", t ? t : "");
        snprintf(s->channel, sizeof(s->channel), "%s", ch ? ch : "");
    }
}

tp_status
tp_rpc_get_peer_stats(const tp_agent *a, int rank, tp_rpc_peer_stats *st_p)
{
    if (rank < 0 || rank >= a->a_world || st_p == NULL) {
        return TP_ENOENT;
    }
    tp_agent *ma = (tp_agent *)a;
    tp__mtx_lock(&ma->a_mtx);
    stats_fill_locked(a, &a->a_peers[rank], st_p);
    tp__mtx_unlock(&ma->a_mtx);
    return TP_OK;
}

char *
tp_rpc_get_debug_info(const tp_agent *a)
{
    tp_agent *ma = (tp_agent *)a;
    size_t cap = 1024 + (size_t)a->a_world * 400 + tp__ag_fr_debug_size(a);
    char *buf = malloc(cap);
    if (buf == NULL) {
        return NULL;
    }
    size_t off = 0;
#define DI_ADD(...)                                                            \
    do {                                                                       \
        if (off < cap) {                                                       \
            int n_ = snprintf(buf + off, cap - off, __VA_ARGS__);              \
            if (n_ > 0) {                                                      \
                off += (size_t)n_;                                             \
            }                                                                  \
        }                                                                      \
    } while (0)
    tp__mtx_lock(&ma->a_mtx);
    DI_ADD("agent %s: rank %d of %d, listening on %s\n", ag_name(a), a->a_rank,
           a->a_world, a->a_listen_url);
    DI_ADD("options: num_worker_threads=%d rpc_timeout_ms=%lld "
           "init_method=%s transports=%s channels=%s\n",
           a->a_opts.num_worker_threads, (long long)a->a_opts.rpc_timeout_ms,
           a->a_init_method, a->a_transports[0] ? a->a_transports : "(all)",
           a->a_channels[0] ? a->a_channels : "(all)");
    DI_ADD("pending calls: %zu\n", a->a_npending);
    for (int r = 0; r < a->a_world; r++) {
        tp_rpc_peer_stats s;
        stats_fill_locked(a, &a->a_peers[r], &s);
        if (r == a->a_rank && s.calls_sent == 0) {
            continue; // this worker, no calls to self
        }
        DI_ADD("peer %s (rank %d): sent %" PRIu64 " calls, received %" PRIu64
               ", bytes out %" PRIu64 " in %" PRIu64 ", errors %" PRIu64
               " (timeouts %" PRIu64 "), pending %" PRIu64
               ", latency us min %.1f p50 %.1f p99 %.1f max %.1f, pipe "
               "%s/%s\n",
               s.peer.name, s.peer.rank, s.calls_sent, s.calls_received,
               s.bytes_sent, s.bytes_received, s.errors, s.timeouts, s.pending,
               s.latency_min_us, s.latency_p50_us, s.latency_p99_us,
               s.latency_max_us, s.transport[0] ? s.transport : "-",
               s.channel[0] ? s.channel : "-");
    }
    tp__mtx_unlock(&ma->a_mtx);
    // The protocols' lines (RRef counters) and the flight recorder's,
    // outside the lock.
    if (off < cap) {
        size_t n = tp__ag_proto_debug(ma, buf + off, cap - off);
        off = n < cap - off ? off + n : cap;
    }
    if (off < cap) {
        size_t n = tp__ag_fr_debug(ma, buf + off, cap - off);
        off = n < cap - off ? off + n : cap;
    }
#undef DI_ADD
    if (off >= cap) {
        buf[cap - 1] = '\0';
    }
    return buf;
}
