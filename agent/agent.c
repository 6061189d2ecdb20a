// SPDX-License-Identifier: Apache-2.0
// agent.c - the RPC agent (rpc.h): rendezvous through the store, one pipe
// per direction between two workers, calls and replies, timeouts, the
// handler pool, shutdown, counters.
//
// Connections. A worker connects lazily to a peer on its first call (the
// "outgoing" pipe: requests out, replies in) and accepts the peer's own
// outgoing pipe (an "incoming" pipe: requests in, replies out), as
// PyTorch's TensorPipe agent does. A failed outgoing pipe is dropped; the
// next call to that worker connects again.
//
// Threads. Loop threads (the context's) read messages, resolve call
// futures and hand requests to the pool; they never run handlers or the
// callbacks of RPC futures (futures are bound to the pool, see
// tp__future_set_pool). The timer thread fails calls whose deadline
// passed. Handlers run on the pool and send their reply themselves.
//
// Locks: a_mtx protects the agent's tables (peers' connections, pending
// calls, timer lists, write slots, counters). It is never held across a
// call into the pipe layer, the store, a future or user code.
//
// Lifetime. The agent is refcounted: the user holds one reference until
// tp_rpc_shutdown, every request in a handler holds one. Shutdown stops
// everything (pipes, timer, pool, context); the memory goes with the last
// reference (a late async handler may hold it; its reply is dropped).

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tpipe/pipe.h>
#include <tpipe/rpc.h>
#include <tpipe/store.h>

#include "agent_int.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/platform.h"
#include "core/pool.h"
#include "store/store_int.h"
#include "wire.h"

#define AG_MAX_URLS      4
#define AG_MAX_URL       256
#define AG_KEY_PREFIX    "tp.rpc/"
#define AG_LAT_BUCKETS   (64 * 4)
#define AG_META_INLINE   192
#define AG_TEARDOWN_MS   5000 /* waiting for handlers at shutdown */
#define AG_SYNC_GRACE_MS 5000 /* tp_rpc_sync beyond the call's deadline */

typedef struct ag_conn ag_conn;
typedef struct ag_call ag_call;

// ---- per-peer state ----------------------------------------------------

typedef struct ag_stats {
    uint64_t s_calls_sent;
    uint64_t s_calls_received;
    uint64_t s_bytes_sent;
    uint64_t s_bytes_received;
    uint64_t s_errors;
    uint64_t s_timeouts;
    uint64_t s_pending;
    uint64_t s_lat_n;
    uint64_t s_lat_min_ns;
    uint64_t s_lat_max_ns;
    double s_lat_sum_ns;
    uint32_t s_lat_hist[AG_LAT_BUCKETS]; // log2 buckets, 4 sub-buckets
} ag_stats;

typedef struct ag_peer {
    tp_worker_info p_info;
    char p_urls[AG_MAX_URLS][AG_MAX_URL];
    int p_nurls;
    ag_conn *p_out;    // outgoing connection, NULL until a call needs it
    ag_call *p_calls;  // pending calls to this peer (c_pnext list)
    bool p_sd_missing; // did not arrive in the last shutdown round
    ag_stats p_stats;
} ag_peer;

// ---- connections and write slots ---------------------------------------

// One pipe write in flight: the message, its metadata buffer and what
// keeps its buffers alive.
typedef struct ag_wslot {
    struct ag_wslot *w_next; // free list of the connection
    ag_conn *w_conn;
    tp_aio *w_aio;
    tp_message w_msg;
    tp_msg_buf w_payload;
    tp_msg_buf *w_tbufs;
    uint32_t w_tcap;
    uint8_t *w_meta;
    size_t w_meta_cap;
    tp_args *w_args; // referenced until the write completes
    ag_kind w_kind;  // what the message is
    uint64_t w_call_id;
    uint8_t w_meta_inline[AG_META_INLINE];
} ag_wslot;

struct ag_conn {
    ag_conn *c_next; // the agent's list of every connection
    // Operations in flight on it (reads, writes) and requests whose reply
    // goes on it; a failed connection is freed when this is 0.
    _Atomic long c_ops;
    tp_agent *c_agent;
    tp_pipe *c_pipe;
    bool c_outgoing;
    bool c_failed;
    ag_peer *c_peer; // outgoing: the callee; incoming: set by requests
    char c_url[AG_MAX_URL];
    tp_aio *c_daio;     // reads descriptors
    tp_aio *c_raio;     // reads the rest of a message
    tp_message *c_rmsg; // the message being read
    tp_args *c_rargs;   // its args, tensors allocated at the descriptor
    ag_tensor_meta *c_metas;
    uint32_t c_metas_cap;
    ag_wslot *c_slots;     // free write slots
    ag_wslot **c_allslots; // every slot, for freeing
    size_t c_nslots, c_slots_cap;
};

// ---- calls -------------------------------------------------------------

typedef struct ag_tclass ag_tclass;

struct ag_call {
    ag_call *c_hnext;           // pending table chain
    ag_call *c_tprev, *c_tnext; // the timeout class list
    ag_call *c_pprev, *c_pnext; // the peer's pending list
    ag_tclass *c_tclass;        // NULL: no deadline
    uint64_t c_id;
    tp_future *c_fut;
    ag_peer *c_peer;
    ag_conn *c_conn; // NULL for calls to self
    int64_t c_timeout_ms;
    uint64_t c_start_ns;
    uint64_t c_deadline_ns;
    char c_fn_name[TP_RPC_MAX_FN_NAME + 1];
};

// The calls with one timeout value, in deadline order (the deadline of a
// call is its start + the class's timeout, and starts are taken under
// a_mtx, so appending keeps the order).
struct ag_tclass {
    ag_tclass *t_next;
    int64_t t_ms;
    ag_call *t_head, *t_tail;
};

// A request being handled.
typedef struct ag_req {
    tp_task r_task;
    tp_agent *r_agent; // referenced
    ag_conn *r_conn;   // NULL: a call to self (r_call_id is local)
    ag_peer *r_caller;
    const ag_fn *r_fn; // NULL: not registered here
    uint64_t r_call_id;
    uint64_t r_fn_id;
    tp_args *r_args;
    tp_rpc_call_info r_info;
    char r_fn_name[TP_RPC_MAX_FN_NAME + 1];
} ag_req;

typedef enum ag_state {
    AG_RUNNING = 0,
    AG_SHUTTING_DOWN, // graceful shutdown in progress: calls still work
    AG_CLOSED,        // calls fail with TP_ECLOSED
} ag_state;

struct tp_agent {
    _Atomic long a_refs;
    tp_mtx a_mtx;
    ag_state a_state;
    tp_agent_options a_opts;
    char a_init_method[1024];
    char a_transports[128];
    char a_channels[128];
    int a_rank;
    int a_world;
    ag_peer *a_peers; // by rank
    ag_peer *a_self;
    tp_store *a_store;
    char a_prefix[48]; // "tp.rpc/<generation>/": this job's store keys
    tp_context *a_ctx;
    tp_pipe_listener *a_listener;
    tp_aio *a_accept_aio;
    char a_listen_url[AG_MAX_URL];
    tp_pool *a_pool;
    bool a_pool_leaked;
    ag_conn *a_conns;
    _Atomic long a_writers; // threads inside a pipe call (shutdown waits)
    // pending calls
    _Atomic uint64_t a_next_id;
    ag_call **a_table;
    size_t a_table_size; // power of two
    size_t a_npending;
    uint64_t a_activity; // calls made + requests received, for shutdown
    tp_cv a_idle_cv;     // broadcast when a_npending drops to 0
    // timer
    ag_tclass *a_tclasses;
    pthread_t a_timer;
    bool a_timer_started;
    bool a_timer_stop;
    tp_cv a_timer_cv;
    uint64_t a_timer_until; // what the timer thread sleeps until
    uint64_t a_spin_ns;     // tp_rpc_wait's spin before sleeping
};

static void agent_unref(tp_agent *a);
static void conn_fail(ag_conn *c, const tp_error *err);
static void conn_read_next(ag_conn *c);

// ---- small helpers -----------------------------------------------------

static const char *
agent_name(const tp_agent *a)
{
    return a->a_self->p_info.name;
}

static bool
worker_name_valid(const char *name, size_t len)
{
    return ag_name_valid(name, len, TP_RPC_MAX_NAME, "_-:");
}

static int64_t
agent_timeout(const tp_agent *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->a_opts.rpc_timeout_ms : timeout_ms;
}

// ---- options -----------------------------------------------------------

void
tp_agent_options_init(tp_agent_options *o)
{
    tp_config cfg;
    // A malformed variable leaves its default here; tp_rpc_init reports it.
    tp_error *err = NULL;
    if (tp__config_load(&cfg, &err) != TP_OK) {
        tp_error_unref(err);
    }
    memset(o, 0, sizeof(*o));
    o->num_worker_threads = (int)cfg.num_worker_threads;
    o->rpc_timeout_ms = cfg.rpc_timeout_ms;
    o->init_timeout_ms = cfg.rpc_init_timeout_ms;
    o->shutdown_timeout_ms = cfg.rpc_shutdown_timeout_ms;
    const char *im = getenv("TP_INIT_METHOD");
    o->init_method = im != NULL && im[0] != '\0' ? im : "env://";
    o->transports = getenv("TP_TRANSPORTS");
    o->channels = getenv("TP_CHANNELS");
}

static tp_status
options_check(tp_agent *a, const tp_agent_options *o, tp_error **err_p)
{
    tp_config cfg;
    tp_status st = tp__config_load(&cfg, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init");
    }
    if (o == NULL) {
        tp_agent_options_init(&a->a_opts);
    } else {
        a->a_opts = *o;
    }
    tp_agent_options *ao = &a->a_opts;
    if (ao->num_worker_threads < 1 ||
        ao->num_worker_threads > TP_POOL_MAX_THREADS) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init: num_worker_threads %d, expected "
                             "1..%d",
                             ao->num_worker_threads, TP_POOL_MAX_THREADS);
    }
    if (ao->rpc_timeout_ms < 0 || ao->init_timeout_ms <= 0 ||
        ao->shutdown_timeout_ms <= 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init: rpc_timeout_ms %lld (>= 0), "
                             "init_timeout_ms %lld and shutdown_timeout_ms "
                             "%lld (> 0)",
                             (long long)ao->rpc_timeout_ms,
                             (long long)ao->init_timeout_ms,
                             (long long)ao->shutdown_timeout_ms);
    }
    const char *im = ao->init_method != NULL ? ao->init_method : "env://";
    int n1 = snprintf(a->a_init_method, sizeof(a->a_init_method), "%s", im);
    int n2 = snprintf(a->a_transports, sizeof(a->a_transports), "%s",
                      ao->transports != NULL ? ao->transports : "");
    int n3 = snprintf(a->a_channels, sizeof(a->a_channels), "%s",
                      ao->channels != NULL ? ao->channels : "");
    if (n1 < 0 || (size_t)n1 >= sizeof(a->a_init_method) || n2 < 0 ||
        (size_t)n2 >= sizeof(a->a_transports) || n3 < 0 ||
        (size_t)n3 >= sizeof(a->a_channels)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init: init_method, transports or channels "
                             "too long");
    }
    ao->init_method = a->a_init_method;
    ao->transports = a->a_transports;
    ao->channels = a->a_channels;
    a->a_spin_ns = (uint64_t)cfg.loop_spin_us * 1000u;
    return TP_OK;
}

// ---- the pending table ---------------------------------------------------

static ag_call **
table_slot_locked(tp_agent *a, uint64_t id)
{
    // Ids are sequential: the low bits spread them.
    return &a->a_table[id & (a->a_table_size - 1)];
}

static bool
table_grow_locked(tp_agent *a)
{
    size_t nsize = a->a_table_size * 2;
    ag_call **nt = tp__zalloc(nsize * sizeof(*nt));
    if (nt == NULL) {
        return false; // chains just get longer
    }
    for (size_t i = 0; i < a->a_table_size; i++) {
        ag_call *c = a->a_table[i];
        while (c != NULL) {
            ag_call *next = c->c_hnext;
            ag_call **slot = &nt[c->c_id & (nsize - 1)];
            c->c_hnext = *slot;
            *slot = c;
            c = next;
        }
    }
    tp__free(a->a_table);
    a->a_table = nt;
    a->a_table_size = nsize;
    return true;
}

static void
timer_insert_locked(tp_agent *a, ag_call *c)
{
    if (c->c_timeout_ms == 0) {
        c->c_tclass = NULL;
        return;
    }
    ag_tclass *tc = a->a_tclasses;
    while (tc != NULL && tc->t_ms != c->c_timeout_ms) {
        tc = tc->t_next;
    }
    if (tc == NULL) {
        tc = tp__zalloc(sizeof(*tc));
        if (tc == NULL) {
            // Out of memory for a class: the timer thread will never see
            // this call, so it only ends by its reply or a failure.
            TP_LOG_WARN("TP-RPC-TIMER",
                        "rpc %s: no memory for a timeout class: call %" PRIu64
                        " has no deadline",
                        agent_name(a), c->c_id);
            c->c_tclass = NULL;
            return;
        }
        tc->t_ms = c->c_timeout_ms;
        tc->t_next = a->a_tclasses;
        a->a_tclasses = tc;
    }
    c->c_tclass = tc;
    c->c_tnext = NULL;
    c->c_tprev = tc->t_tail;
    if (tc->t_tail != NULL) {
        tc->t_tail->c_tnext = c;
    } else {
        tc->t_head = c;
    }
    tc->t_tail = c;
    if (c->c_deadline_ns < a->a_timer_until) {
        tp__cv_signal(&a->a_timer_cv);
    }
}

static void
timer_remove_locked(ag_call *c)
{
    ag_tclass *tc = c->c_tclass;
    if (tc == NULL) {
        return;
    }
    if (c->c_tprev != NULL) {
        c->c_tprev->c_tnext = c->c_tnext;
    } else {
        tc->t_head = c->c_tnext;
    }
    if (c->c_tnext != NULL) {
        c->c_tnext->c_tprev = c->c_tprev;
    } else {
        tc->t_tail = c->c_tprev;
    }
    c->c_tclass = NULL;
}

static void
pending_insert_locked(tp_agent *a, ag_call *c)
{
    if (a->a_npending >= a->a_table_size) {
        table_grow_locked(a);
    }
    ag_call **slot = table_slot_locked(a, c->c_id);
    c->c_hnext = *slot;
    *slot = c;
    ag_peer *p = c->c_peer;
    c->c_pprev = NULL;
    c->c_pnext = p->p_calls;
    if (p->p_calls != NULL) {
        p->p_calls->c_pprev = c;
    }
    p->p_calls = c;
    p->p_stats.s_pending++;
    p->p_stats.s_calls_sent++;
    a->a_npending++;
    a->a_activity++;
    timer_insert_locked(a, c);
}

static void
lat_record_locked(ag_stats *s, uint64_t ns)
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
static void
pending_unlink_locked(tp_agent *a, ag_call *c, tp_status st)
{
    ag_call **pp = table_slot_locked(a, c->c_id);
    while (*pp != c) {
        pp = &(*pp)->c_hnext;
    }
    *pp = c->c_hnext;
    ag_peer *p = c->c_peer;
    if (c->c_pprev != NULL) {
        c->c_pprev->c_pnext = c->c_pnext;
    } else {
        p->p_calls = c->c_pnext;
    }
    if (c->c_pnext != NULL) {
        c->c_pnext->c_pprev = c->c_pprev;
    }
    timer_remove_locked(c);
    p->p_stats.s_pending--;
    if (st == TP_OK) {
        lat_record_locked(&p->p_stats, tp__now_ns() - c->c_start_ns);
    } else {
        p->p_stats.s_errors++;
        if (st == TP_ETIMEDOUT) {
            p->p_stats.s_timeouts++;
        }
    }
    if (--a->a_npending == 0) {
        tp__cv_broadcast(&a->a_idle_cv);
    }
}

// Takes call @id out of the table, or NULL if it already ended (or, when
// @conn is not NULL, if it was not sent on @conn: a peer cannot answer
// another peer's calls).
static ag_call *
pending_take_locked(tp_agent *a, uint64_t id, const ag_conn *conn, tp_status st)
{
    ag_call *c = *table_slot_locked(a, id);
    while (c != NULL && c->c_id != id) {
        c = c->c_hnext;
    }
    if (c != NULL && conn != NULL && c->c_conn != conn) {
        return NULL;
    }
    if (c != NULL) {
        pending_unlink_locked(a, c, st);
    }
    return c;
}

// Resolves and frees a call taken out of the table. Takes @result and
// @err. No lock held.
static void
call_finish(ag_call *c, tp_args *result, tp_error *err)
{
    if (err != NULL) {
        tp_future_set_error(c->c_fut, err);
        tp_error_unref(err);
        tp_args_unref(result);
    } else {
        tp_future_set_value(c->c_fut, result, (tp_future_free_fn)tp_args_unref);
    }
    tp_future_unref(c->c_fut);
    tp__free(c);
}

// ---- the timer thread ----------------------------------------------------

static void *
timer_main(void *arg)
{
    tp_agent *a = arg;
    char tname[16];
    snprintf(tname, sizeof(tname), "tp-rpc-timer");
    tp__thread_set_name(tname);

    tp__mtx_lock(&a->a_mtx);
    while (!a->a_timer_stop) {
        uint64_t now = tp__now_ns();
        uint64_t next = UINT64_MAX;
        ag_call *expired = NULL;
        for (ag_tclass *tc = a->a_tclasses; tc != NULL; tc = tc->t_next) {
            while (tc->t_head != NULL && tc->t_head->c_deadline_ns <= now) {
                ag_call *c = tc->t_head;
                pending_unlink_locked(a, c, TP_ETIMEDOUT);
                c->c_hnext = expired;
                expired = c;
            }
            if (tc->t_head != NULL) {
                next = TP_MIN(next, tc->t_head->c_deadline_ns);
            }
        }
        // Classes whose calls all ended go (callers passing a different
        // timeout each time must not make the list grow); while there are
        // many, the thread also wakes each second to sweep them.
        size_t nclasses = 0;
        for (ag_tclass **tp = &a->a_tclasses; *tp != NULL;) {
            ag_tclass *tc = *tp;
            if (tc->t_head == NULL) {
                *tp = tc->t_next;
                tp__free(tc);
            } else {
                nclasses++;
                tp = &tc->t_next;
            }
        }
        if (nclasses > 16) {
            next = TP_MIN(next, now + 1000000000u);
        }
        if (expired != NULL) {
            tp__mtx_unlock(&a->a_mtx);
            while (expired != NULL) {
                ag_call *c = expired;
                expired = c->c_hnext;
                tp_error *err = tp__error_new(
                    TP_ETIMEDOUT, 0, NULL,
                    "rpc \"%s\" from %s to %s (rank %d): RPC ran for more "
                    "than set timeout (%lld ms) and will now be marked with "
                    "an error",
                    c->c_fn_name, agent_name(a), c->c_peer->p_info.name,
                    c->c_peer->p_info.rank, (long long)c->c_timeout_ms);
                call_finish(c, NULL, err);
            }
            tp__mtx_lock(&a->a_mtx);
            continue;
        }
        a->a_timer_until = next;
        tp__cv_wait_until(&a->a_timer_cv, &a->a_mtx, next);
        a->a_timer_until = 0;
    }
    tp__mtx_unlock(&a->a_mtx);
    return NULL;
}

// ---- write slots -------------------------------------------------------

static void slot_write_cb(void *arg);

static ag_wslot *
slot_get_locked(ag_conn *c)
{
    ag_wslot *w = c->c_slots;
    if (w != NULL) {
        c->c_slots = w->w_next;
        return w;
    }
    if (c->c_nslots == c->c_slots_cap) {
        size_t cap = c->c_slots_cap == 0 ? 8 : c->c_slots_cap * 2;
        ag_wslot **ns = tp__realloc(c->c_allslots, cap * sizeof(*ns));
        if (ns == NULL) {
            return NULL;
        }
        c->c_allslots = ns;
        c->c_slots_cap = cap;
    }
    w = tp__zalloc(sizeof(*w));
    if (w == NULL) {
        return NULL;
    }
    if (tp_aio_create(slot_write_cb, w, &w->w_aio) != TP_OK) {
        tp__free(w);
        return NULL;
    }
    w->w_conn = c;
    w->w_meta = w->w_meta_inline;
    w->w_meta_cap = sizeof(w->w_meta_inline);
    c->c_allslots[c->c_nslots++] = w;
    return w;
}

static void
slot_free(ag_wslot *w)
{
    tp_aio_destroy(w->w_aio);
    if (w->w_meta != w->w_meta_inline) {
        tp__free(w->w_meta);
    }
    tp__free(w->w_tbufs);
    tp_args_unref(w->w_args);
    tp__free(w);
}

// Fills @w's message: metadata from @h and @args, payload 0 = the bytes of
// @args (or @errmsg for an error reply), tensors of @args. Takes @args.
static tp_status
slot_fill(ag_wslot *w, const ag_hdr *h, tp_args *args, const char *errmsg)
{
    size_t msize = ag_wire_size(h->h_fn_name_len, h->h_ext_len, args);
    if (msize > w->w_meta_cap) {
        uint8_t *m = tp__alloc(msize);
        if (m == NULL) {
            tp_args_unref(args);
            return TP_ENOMEM;
        }
        if (w->w_meta != w->w_meta_inline) {
            tp__free(w->w_meta);
        }
        w->w_meta = m;
        w->w_meta_cap = msize;
    }
    uint32_t nt = args != NULL ? (uint32_t)args->a_ntensors : 0;
    if (nt > w->w_tcap) {
        tp_msg_buf *tb = tp__realloc(w->w_tbufs, nt * sizeof(*tb));
        if (tb == NULL) {
            tp_args_unref(args);
            return TP_ENOMEM;
        }
        w->w_tbufs = tb;
        w->w_tcap = nt;
    }
    ag_wire_encode(w->w_meta, h, args);
    memset(&w->w_msg, 0, sizeof(w->w_msg));
    w->w_msg.metadata = w->w_meta;
    w->w_msg.metadata_len = msize;
    memset(&w->w_payload, 0, sizeof(w->w_payload));
    if (errmsg != NULL) {
        w->w_payload.data = (void *)errmsg;
        w->w_payload.len = strlen(errmsg);
    } else if (args != NULL && args->a_len > 0) {
        w->w_payload.data = (void *)args->a_bytes;
        w->w_payload.len = args->a_len;
    }
    if (w->w_payload.len > 0) {
        w->w_msg.payloads = &w->w_payload;
        w->w_msg.npayloads = 1;
    }
    for (uint32_t i = 0; i < nt; i++) {
        tp_tensor *t = args->a_tensors[i];
        memset(&w->w_tbufs[i], 0, sizeof(tp_msg_buf));
        w->w_tbufs[i].data = tp_tensor_data(t);
        w->w_tbufs[i].len = tp_tensor_nbytes(t);
        w->w_tbufs[i].device = tp_tensor_device(t);
    }
    w->w_msg.tensors = nt > 0 ? w->w_tbufs : NULL;
    w->w_msg.ntensors = nt;
    w->w_args = args;
    w->w_kind = h->h_kind;
    w->w_call_id = h->h_call_id;
    return TP_OK;
}

static void write_failed_locally(ag_conn *c, ag_kind kind, uint64_t call_id,
                                 const tp_error *err);

// Loop thread: a write completed. Its slot goes back to the connection.
// A connection-scope failure fails the connection (and every call pending
// on it); an operation-scope one (the message broke a pipe limit, memory)
// fails only that message's call.
static void
slot_write_step(ag_wslot *w)
{
    ag_conn *c = w->w_conn;
    tp_agent *a = c->c_agent;
    tp_args *args = w->w_args;
    w->w_args = NULL;
    ag_kind kind = w->w_kind;
    uint64_t call_id = w->w_call_id;
    tp_error *err = tp_error_ref(tp_aio_error(w->w_aio));

    tp__mtx_lock(&a->a_mtx);
    w->w_next = c->c_slots;
    c->c_slots = w;
    tp__mtx_unlock(&a->a_mtx);
    tp_args_unref(args);
    if (err != NULL) {
        if (TP_STATUS_IS_CONN(tp_error_status(err))) {
            conn_fail(c, err);
        } else {
            write_failed_locally(c, kind, call_id, err);
        }
        tp_error_unref(err);
    }
}

static void
conn_op_done(ag_conn *c)
{
    atomic_fetch_sub_explicit(&c->c_ops, 1, memory_order_release);
}

static void
slot_write_cb(void *arg)
{
    ag_wslot *w = arg;
    ag_conn *c = w->w_conn;
    slot_write_step(w);
    conn_op_done(c);
}

// Any thread: writes the message of @w, taken from its connection's free
// list by a caller that counted itself in a_writers.
static void
slot_submit(ag_wslot *w)
{
    atomic_fetch_add_explicit(&w->w_conn->c_ops, 1, memory_order_relaxed);
    tp_pipe_write(w->w_conn->c_pipe, &w->w_msg, w->w_aio);
}

// ---- connections ---------------------------------------------------------

static void conn_desc_cb(void *arg);
static void conn_read_cb(void *arg);

static ag_conn *
conn_create(tp_agent *a, tp_pipe *pipe, bool outgoing)
{
    ag_conn *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    atomic_init(&c->c_ops, 0);
    c->c_agent = a;
    c->c_pipe = pipe;
    c->c_outgoing = outgoing;
    if (tp_aio_create(conn_desc_cb, c, &c->c_daio) != TP_OK ||
        tp_aio_create(conn_read_cb, c, &c->c_raio) != TP_OK) {
        tp_aio_destroy(c->c_daio);
        tp__free(c);
        return NULL;
    }
    return c;
}

static void
conn_free(ag_conn *c)
{
    for (size_t i = 0; i < c->c_nslots; i++) {
        slot_free(c->c_allslots[i]);
    }
    tp__free(c->c_allslots);
    tp_aio_destroy(c->c_daio);
    tp_aio_destroy(c->c_raio);
    tp_message_destroy(c->c_rmsg);
    tp_args_unref(c->c_rargs);
    tp__free(c->c_metas);
    tp_pipe_unref(c->c_pipe);
    tp__free(c);
}

// The peer's name for messages: "worker1 (rank 1) at tcp://..." or the
// pipe's view of it for an incoming pipe that has not said who it is.
static void
conn_describe(const ag_conn *c, char *buf, size_t len)
{
    if (c->c_peer != NULL) {
        snprintf(buf, len, "%s (rank %d)%s%s", c->c_peer->p_info.name,
                 c->c_peer->p_info.rank, c->c_url[0] ? " at " : "", c->c_url);
    } else {
        snprintf(buf, len, "%s", tp_pipe_peer(c->c_pipe));
    }
}

// Any thread: the connection is dead. Every call pending on it fails with
// @err (naming the peer); an outgoing connection is forgotten so the next
// call connects again. Idempotent.
static void
conn_fail(ag_conn *c, const tp_error *err)
{
    tp_agent *a = c->c_agent;
    ag_call *failed = NULL;

    tp__mtx_lock(&a->a_mtx);
    if (c->c_failed) {
        tp__mtx_unlock(&a->a_mtx);
        return;
    }
    c->c_failed = true;
    ag_state state = a->a_state;
    ag_peer *p = c->c_peer;
    if (p != NULL && c->c_outgoing) {
        if (p->p_out == c) {
            p->p_out = NULL;
        }
        ag_call *call = p->p_calls;
        while (call != NULL) {
            ag_call *next = call->c_pnext;
            if (call->c_conn == c) {
                pending_unlink_locked(a, call, tp_error_status(err));
                call->c_hnext = failed;
                failed = call;
            }
            call = next;
        }
    }
    tp__mtx_unlock(&a->a_mtx);

    char who[AG_MAX_URL + 160];
    conn_describe(c, who, sizeof(who));
    if (failed != NULL || (state == AG_RUNNING && c->c_outgoing)) {
        TP_LOG_WARN("TP-RPC-PIPE", "rpc %s: pipe to %s failed: %s",
                    agent_name(a), who, tp_error_message(err));
    } else {
        // A peer closing its pipe to us (it shut down) is normal.
        TP_LOG_DEBUG("TP-RPC-PIPE", "rpc %s: pipe %s %s ended: %s",
                     agent_name(a), c->c_outgoing ? "to" : "from", who,
                     tp_error_message(err));
    }
    tp_status st = tp_error_status(err);
    if (!TP_STATUS_IS_CONN(st)) {
        st = TP_ECONNRESET;
    }
    while (failed != NULL) {
        ag_call *call = failed;
        failed = call->c_hnext;
        tp_error *e = tp__error_new(st, 0, err, "rpc \"%s\" from %s to %s",
                                    call->c_fn_name, agent_name(a), who);
        call_finish(call, NULL, e);
    }
    tp_pipe_close(c->c_pipe);
}

static void
conn_protocol_error(ag_conn *c, tp_error *err)
{
    char who[AG_MAX_URL + 160];
    conn_describe(c, who, sizeof(who));
    tp_error *e =
        tp__error_new(TP_EPROTO, 0, err, "rpc %s: protocol error from %s",
                      agent_name(c->c_agent), who);
    TP_LOG_WARN("TP-RPC-PROTO", "%s; closing that pipe", tp_error_message(e));
    conn_fail(c, e);
    tp_error_unref(e);
}

// Loop thread (or the connecting thread, once): read the next descriptor.
static void
conn_read_next(ag_conn *c)
{
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    tp_pipe_read_descriptor(c->c_pipe, c->c_daio);
}

// Loop thread: a descriptor arrived. Check it, allocate the tensors the
// message carries and read the rest.
static void
conn_desc_step(ag_conn *c)
{
    const tp_error *aerr = tp_aio_error(c->c_daio);
    if (aerr != NULL) {
        conn_fail(c, aerr);
        return;
    }
    tp_message *msg = tp_aio_get_output(c->c_daio, 0);
    c->c_rmsg = msg;
    if (msg->ntensors > c->c_metas_cap) {
        uint32_t cap = TP_MIN(msg->ntensors, (uint32_t)TP_RPC_MAX_TENSORS);
        ag_tensor_meta *m = tp__realloc(c->c_metas, cap * sizeof(*m));
        if (m == NULL && cap > 0) {
            conn_fail(c, tp__error_nomem());
            return;
        }
        c->c_metas = m;
        c->c_metas_cap = cap;
    }
    uint64_t lens_inline[16];
    uint64_t *lens = lens_inline;
    if (msg->ntensors > 16 && msg->ntensors <= TP_RPC_MAX_TENSORS) {
        lens = tp__alloc(msg->ntensors * sizeof(uint64_t));
        if (lens == NULL) {
            conn_fail(c, tp__error_nomem());
            return;
        }
    }
    ag_hdr h;
    tp_error *err = NULL;
    tp_status st;
    if (msg->ntensors > TP_RPC_MAX_TENSORS) {
        st = tp__error_set(&err, TP_EPROTO,
                           "rpc message with %u tensors (at most %d)",
                           msg->ntensors, TP_RPC_MAX_TENSORS);
    } else {
        for (uint32_t i = 0; i < msg->ntensors; i++) {
            lens[i] = msg->tensors[i].len;
        }
        st = ag_wire_decode(msg->metadata, msg->metadata_len, msg->npayloads,
                            msg->ntensors, lens, &h, c->c_metas, &err);
    }
    if (lens != lens_inline) {
        tp__free(lens);
    }
    if (st == TP_OK) {
        bool want_req = !c->c_outgoing;
        if ((h.h_kind == AG_KIND_REQUEST) != want_req) {
            st = tp__error_set(
                &err, TP_EPROTO, "rpc %s on a pipe that carries %s",
                h.h_kind == AG_KIND_REQUEST ? "request" : "reply",
                want_req ? "requests" : "replies");
        } else if (h.h_kind == AG_KIND_ERROR && msg->npayloads == 1 &&
                   msg->payloads[0].len > AG_WIRE_MAX_ERRMSG) {
            st = tp__error_set(
                &err, TP_EPROTO, "rpc error reply of %llu bytes (at most %u)",
                (unsigned long long)msg->payloads[0].len, AG_WIRE_MAX_ERRMSG);
        } else if (h.h_src_rank >= (uint32_t)c->c_agent->a_world) {
            st = tp__error_set(&err, TP_EPROTO,
                               "rpc message from rank %u of a world of %d",
                               h.h_src_rank, c->c_agent->a_world);
        }
    }
    if (st != TP_OK) {
        conn_protocol_error(c, err);
        tp_error_unref(err);
        return;
    }
    tp_args *args;
    if (ag_args_create_empty(msg->ntensors, &args) != TP_OK) {
        conn_fail(c, tp__error_nomem());
        return;
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        const ag_tensor_meta *m = &c->c_metas[i];
        tp_tensor *t;
        st = tp_tensor_empty(m->tm_dtype, m->tm_ndim, m->tm_shape, &t, &err);
        if (st != TP_OK) {
            tp_args_unref(args);
            tp_error *e =
                tp__error_new(st, 0, err, "rpc %s: tensor %u of a message",
                              agent_name(c->c_agent), i);
            tp_error_unref(err);
            conn_fail(c, e);
            tp_error_unref(e);
            return;
        }
        ag_args_push_tensor(args, t);
        msg->tensors[i].data = m->tm_nbytes > 0 ? tp_tensor_data(t) : NULL;
    }
    c->c_rargs = args;
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    tp_pipe_read(c->c_pipe, msg, c->c_raio);
}

static void
conn_desc_cb(void *arg)
{
    ag_conn *c = arg;
    conn_desc_step(c);
    conn_op_done(c);
}

static void req_run(void *arg);

// Loop thread: a request arrived; hand it to the pool.
static void
conn_dispatch_request(ag_conn *c, const ag_hdr *h, tp_args *args)
{
    tp_agent *a = c->c_agent;
    ag_peer *caller = &a->a_peers[h->h_src_rank];

    tp__mtx_lock(&a->a_mtx);
    if (c->c_peer == NULL) {
        c->c_peer = caller;
    }
    bool mismatch = c->c_peer != caller;
    bool closed = a->a_state == AG_CLOSED;
    if (!mismatch) {
        caller->p_stats.s_calls_received++;
        caller->p_stats.s_bytes_received += ag_args_nbytes(args);
        a->a_activity++;
    }
    tp__mtx_unlock(&a->a_mtx);
    if (mismatch) {
        tp_error *err = tp__error_new(TP_EPROTO, 0, NULL,
                                      "rpc request says it is from rank %u "
                                      "on a pipe from rank %d",
                                      h->h_src_rank, c->c_peer->p_info.rank);
        tp_args_unref(args);
        conn_protocol_error(c, err);
        tp_error_unref(err);
        return;
    }
    if (closed) {
        tp_args_unref(args);
        return;
    }
    ag_req *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        tp_args_unref(args);
        conn_fail(c, tp__error_nomem());
        return;
    }
    atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    r->r_agent = a;
    r->r_conn = c;
    r->r_caller = caller;
    r->r_call_id = h->h_call_id;
    r->r_fn_id = h->h_fn_id;
    r->r_args = args;
    memcpy(r->r_fn_name, h->h_fn_name, h->h_fn_name_len);
    r->r_fn_name[h->h_fn_name_len] = '\0';
    tp__task_init(&r->r_task, req_run, r);
    if (tp__pool_submit(a->a_pool, &r->r_task) != TP_OK) {
        // Shutting down: the caller's call fails with our pipe's close.
        tp_args_unref(args);
        tp__free(r);
        conn_op_done(c);
        agent_unref(a);
    }
}

// Loop thread: a reply arrived; resolve its call (dropped if the call
// already ended: timed out, or failed).
static void
conn_dispatch_reply(ag_conn *c, const ag_hdr *h, tp_args *args)
{
    tp_agent *a = c->c_agent;
    tp_error *err = NULL;
    tp_status st = TP_OK;

    if (h->h_kind == AG_KIND_ERROR) {
        st = (tp_status)h->h_status;
    }
    tp__mtx_lock(&a->a_mtx);
    ag_call *call = pending_take_locked(a, h->h_call_id, c, st);
    if (call != NULL) {
        call->c_peer->p_stats.s_bytes_received += ag_args_nbytes(args);
    }
    tp__mtx_unlock(&a->a_mtx);
    if (call == NULL) {
        TP_LOG_DEBUG("TP-RPC-LATE",
                     "rpc %s: dropped a reply to call %" PRIu64
                     " that already ended (timed out or failed)",
                     agent_name(a), h->h_call_id);
        tp_args_unref(args);
        return;
    }
    if (h->h_kind == AG_KIND_ERROR) {
        size_t len = 0;
        const char *text = tp_args_bytes(args, &len);
        err = tp__error_new(st, 0, NULL, "rpc \"%s\" on %s (rank %d): %.*s",
                            call->c_fn_name, call->c_peer->p_info.name,
                            call->c_peer->p_info.rank, (int)len,
                            text != NULL ? text : "");
        tp_args_unref(args);
        args = NULL;
    }
    call_finish(call, args, err);
}

// Loop thread: the rest of a message arrived.
static void
conn_read_step(ag_conn *c)
{
    tp_message *msg = c->c_rmsg;
    tp_args *args = c->c_rargs;
    c->c_rmsg = NULL;
    c->c_rargs = NULL;
    const tp_error *aerr = tp_aio_error(c->c_raio);
    if (aerr != NULL) {
        tp_args_unref(args);
        tp_message_destroy(msg);
        conn_fail(c, aerr);
        return;
    }
    // Decoded again (cheap) so the header's pointers refer to the
    // metadata that the args now keep.
    ag_hdr h;
    uint64_t lens_inline[16];
    uint64_t *lens = lens_inline;
    if (msg->ntensors > 16) {
        lens = tp__alloc(msg->ntensors * sizeof(uint64_t));
        if (lens == NULL) {
            tp_args_unref(args);
            tp_message_destroy(msg);
            conn_fail(c, tp__error_nomem());
            return;
        }
    }
    for (uint32_t i = 0; i < msg->ntensors; i++) {
        lens[i] = msg->tensors[i].len;
    }
    tp_status st =
        ag_wire_decode(msg->metadata, msg->metadata_len, msg->npayloads,
                       msg->ntensors, lens, &h, c->c_metas, NULL);
    if (lens != lens_inline) {
        tp__free(lens);
    }
    TP_ASSERT(st == TP_OK); // checked at the descriptor
    args->a_msg = msg;
    if (msg->npayloads == 1) {
        args->a_bytes = msg->payloads[0].data;
        args->a_len = msg->payloads[0].len;
    }
    if (h.h_kind == AG_KIND_REQUEST) {
        conn_dispatch_request(c, &h, args);
    } else {
        conn_dispatch_reply(c, &h, args);
    }
    bool failed;
    tp__mtx_lock(&c->c_agent->a_mtx);
    failed = c->c_failed;
    tp__mtx_unlock(&c->c_agent->a_mtx);
    if (!failed) {
        conn_read_next(c);
    }
}

static void
conn_read_cb(void *arg)
{
    ag_conn *c = arg;
    conn_read_step(c);
    conn_op_done(c);
}

// Loop thread: a peer connected to us.
static void
agent_accept_cb(void *arg)
{
    tp_agent *a = arg;
    if (tp_aio_error(a->a_accept_aio) != NULL) {
        TP_LOG_DEBUG("TP-RPC-ACCEPT", "rpc %s: accept ended: %s", agent_name(a),
                     tp_error_message(tp_aio_error(a->a_accept_aio)));
        return; // listener closed (shutdown) or failed
    }
    tp_pipe *pipe = tp_aio_get_output(a->a_accept_aio, 0);
    ag_conn *c = conn_create(a, pipe, false);
    tp__mtx_lock(&a->a_mtx);
    bool closed = a->a_state == AG_CLOSED;
    if (c != NULL && !closed) {
        c->c_next = a->a_conns;
        a->a_conns = c;
    }
    tp__mtx_unlock(&a->a_mtx);
    if (c == NULL || closed) {
        if (c != NULL) {
            c->c_pipe = NULL;
            conn_free(c);
        }
        tp_pipe_close(pipe);
        tp_pipe_unref(pipe);
    } else {
        conn_read_next(c);
    }
    if (!closed) {
        tp_pipe_listener_accept(a->a_listener, a->a_accept_aio);
    }
}

// The URL to dial for @p: the first of a transport this context has (tcp
// before shm: a tcp connection between two processes of one host moves to
// shm in the handshake when both allow it). NULL if none.
static const char *
peer_pick_url(const tp_agent *a, const ag_peer *p)
{
    for (int i = 0; i < p->p_nurls; i++) {
        const char *u = p->p_urls[i];
        const char *colon = strchr(u, ':');
        char scheme[16];
        size_t n = colon != NULL ? (size_t)(colon - u) : 0;
        if (n == 0 || n >= sizeof(scheme)) {
            continue;
        }
        memcpy(scheme, u, n);
        scheme[n] = '\0';
        if (tp_pipe_listener_addr(a->a_listener, scheme) != NULL) {
            return u;
        }
    }
    return NULL;
}

// A new outgoing connection to @p (no lock held: tp_context_connect waits
// for the loop thread, whose callbacks take a_mtx). The pipe connects in
// the background; writes queue until it is ready.
static ag_conn *
conn_connect(tp_agent *a, ag_peer *p, tp_error **err_p)
{
    const char *url = peer_pick_url(a, p);
    if (url == NULL) {
        tp__error_set(err_p, TP_EUNREACHABLE,
                      "no transport in common with %s (rank %d): it "
                      "listens on %s%s",
                      p->p_info.name, p->p_info.rank,
                      p->p_nurls > 0 ? p->p_urls[0] : "nothing",
                      p->p_nurls > 1 ? " and more" : "");
        return NULL;
    }
    tp_pipe *pipe;
    if (tp_context_connect(a->a_ctx, url, &pipe, err_p) != TP_OK) {
        return NULL;
    }
    ag_conn *c = conn_create(a, pipe, true);
    if (c == NULL) {
        tp_pipe_close(pipe);
        tp_pipe_unref(pipe);
        tp__error_set(err_p, TP_ENOMEM, "out of memory");
        return NULL;
    }
    c->c_peer = p;
    snprintf(c->c_url, sizeof(c->c_url), "%s", url);
    return c;
}

// Called with a_mtx held; returns with it held (it may drop it to
// connect). The outgoing connection to @p, or NULL with *@err_p. A new
// connection starts reading replies before it is returned.
static ag_conn *
conn_get_locked(tp_agent *a, ag_peer *p, tp_error **err_p)
{
    if (p->p_out != NULL) {
        return p->p_out;
    }
    // Connecting is rare: a good time to free failed connections that
    // nothing uses any more (a peer that restarts or keeps failing must
    // not make the agent grow).
    ag_conn *dead = NULL;
    for (ag_conn **cp = &a->a_conns; *cp != NULL;) {
        ag_conn *x = *cp;
        if (x->c_failed &&
            atomic_load_explicit(&x->c_ops, memory_order_acquire) == 0) {
            *cp = x->c_next;
            x->c_next = dead;
            dead = x;
        } else {
            cp = &x->c_next;
        }
    }
    tp__mtx_unlock(&a->a_mtx);
    while (dead != NULL) {
        ag_conn *x = dead;
        dead = x->c_next;
        conn_free(x);
    }
    ag_conn *c = conn_connect(a, p, err_p);
    tp__mtx_lock(&a->a_mtx);
    if (c == NULL) {
        return NULL;
    }
    if (p->p_out != NULL || a->a_state == AG_CLOSED) {
        // Another thread connected meanwhile (or we shut down): ours goes.
        ag_conn *mine = c;
        tp__mtx_unlock(&a->a_mtx);
        tp_pipe_close(mine->c_pipe);
        conn_free(mine);
        tp__mtx_lock(&a->a_mtx);
        if (a->a_state == AG_CLOSED) {
            tp__error_set(err_p, TP_ECLOSED, "the agent is shut down");
            return NULL;
        }
        if (p->p_out == NULL) {
            // The other thread's connection failed meanwhile.
            tp__error_set(err_p, TP_ECONNRESET,
                          "the connection to %s (rank %d) failed while this "
                          "call was connecting",
                          p->p_info.name, p->p_info.rank);
            return NULL;
        }
        return p->p_out;
    }
    c->c_next = a->a_conns;
    a->a_conns = c;
    p->p_out = c;
    // Reading replies starts now (queued until the pipe is ready); the
    // submission posts to the loop and never runs a callback inline.
    conn_read_next(c);
    return c;
}

// ---- handlers ------------------------------------------------------------

// Sends the reply of @r (any thread): the result @result (taken) or
// @err (borrowed), then frees @r.
static void
req_reply(ag_req *r, tp_args *result, const tp_error *err)
{
    tp_agent *a = r->r_agent;

    if (r->r_conn == NULL) {
        // A call to self: complete it here.
        tp_status st = err != NULL ? tp_error_status(err) : TP_OK;
        tp__mtx_lock(&a->a_mtx);
        ag_call *call = pending_take_locked(a, r->r_call_id, NULL, st);
        tp__mtx_unlock(&a->a_mtx);
        if (call != NULL) {
            tp_error *e = NULL;
            if (err != NULL) {
                // As for a remote caller: the call's own connection is
                // fine, a handler's connection- or context-scope status
                // arrives as TP_EIO.
                st = (st < 0 && st > -20) ? st : TP_EIO;
                e = tp__error_new(st, 0, NULL, "rpc \"%s\" on %s (rank %d): %s",
                                  call->c_fn_name, agent_name(a), a->a_rank,
                                  tp_error_message(err));
            }
            call_finish(call, result, e);
        } else {
            tp_args_unref(result);
        }
        goto out;
    }

    ag_conn *c = r->r_conn;
    char *errmsg = NULL;
    tp_args *holder = NULL; // keeps errmsg alive until the write is done
    ag_hdr h;
    memset(&h, 0, sizeof(h));
    h.h_call_id = r->r_call_id;
    h.h_src_rank = (uint32_t)a->a_rank;
    if (err != NULL) {
        h.h_kind = AG_KIND_ERROR;
        tp_status st = tp_error_status(err);
        // The caller's connection is fine: a handler's connection- or
        // context-scope status arrives as TP_EIO.
        h.h_status = (st < 0 && st > -20) ? st : TP_EIO;
        errmsg = tp__asprintf("%.*s", (int)(AG_WIRE_MAX_ERRMSG - 1),
                              tp_error_message(err));
        tp_args_unref(result);
        result = NULL;
        if (errmsg == NULL || ag_args_create_empty(0, &holder) != TP_OK) {
            tp__free(errmsg);
            goto out;
        }
        holder->a_owned = errmsg;
        result = holder; // no bytes, no tensors: only owns errmsg
    } else {
        h.h_kind = AG_KIND_RESPONSE;
    }
    tp__mtx_lock(&a->a_mtx);
    ag_wslot *w = NULL;
    if (a->a_state != AG_CLOSED && !c->c_failed) {
        w = slot_get_locked(c);
        if (w != NULL) {
            atomic_fetch_add_explicit(&a->a_writers, 1, memory_order_acquire);
            if (c->c_peer != NULL) {
                c->c_peer->p_stats.s_bytes_sent += ag_args_nbytes(result);
            }
        }
    }
    tp__mtx_unlock(&a->a_mtx);
    if (w == NULL) {
        tp_args_unref(result); // shutting down, or the pipe failed
        goto out;
    }
    if (slot_fill(w, &h, result, errmsg) != TP_OK) {
        // The caller will time out; tell why here.
        TP_LOG_ERROR("TP-RPC-REPLY",
                     "rpc %s: no memory for the reply to call %" PRIu64,
                     agent_name(a), r->r_call_id);
        tp__mtx_lock(&a->a_mtx);
        w->w_next = c->c_slots;
        c->c_slots = w;
        tp__mtx_unlock(&a->a_mtx);
    } else {
        slot_submit(w);
    }
    atomic_fetch_sub_explicit(&a->a_writers, 1, memory_order_release);
out:
    tp_args_unref(r->r_args);
    tp_agent *ag = r->r_agent;
    if (r->r_conn != NULL) {
        conn_op_done(r->r_conn);
    }
    tp__free(r);
    agent_unref(ag);
}

// Loop thread: a message could not be sent for a reason of its own (a
// pipe limit, memory). A request fails its call; a result is replaced by
// an error reply, so the caller learns why instead of waiting for its
// deadline; a failed error reply is only logged.
static void
write_failed_locally(ag_conn *c, ag_kind kind, uint64_t call_id,
                     const tp_error *err)
{
    tp_agent *a = c->c_agent;
    char who[AG_MAX_URL + 160];
    conn_describe(c, who, sizeof(who));
    if (kind == AG_KIND_REQUEST) {
        tp_status st = tp_error_status(err);
        tp__mtx_lock(&a->a_mtx);
        ag_call *call = pending_take_locked(a, call_id, c, st);
        tp__mtx_unlock(&a->a_mtx);
        if (call != NULL) {
            call_finish(call, NULL,
                        tp__error_new(st, 0, err,
                                      "rpc \"%s\" from %s to %s: sending "
                                      "the request",
                                      call->c_fn_name, agent_name(a), who));
        }
        return;
    }
    if (kind == AG_KIND_ERROR) {
        TP_LOG_WARN("TP-RPC-REPLY",
                    "rpc %s: could not send the error reply to call %" PRIu64
                    " of %s: %s",
                    agent_name(a), call_id, who, tp_error_message(err));
        return;
    }
    ag_req *r = tp__zalloc(sizeof(*r));
    if (r == NULL) {
        TP_LOG_ERROR("TP-RPC-REPLY",
                     "rpc %s: could not send the reply to call %" PRIu64
                     " of %s: %s (and no memory to say so)",
                     agent_name(a), call_id, who, tp_error_message(err));
        return;
    }
    atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->c_ops, 1, memory_order_relaxed);
    r->r_agent = a;
    r->r_conn = c;
    r->r_call_id = call_id;
    tp_error *e = tp__error_new(tp_error_status(err), 0, err,
                                "%s could not send the result", agent_name(a));
    req_reply(r, NULL, e);
    tp_error_unref(e);
}

// Future callback of an async handler (on the thread that resolved it).
static void
req_async_done(tp_future *f, void *arg)
{
    ag_req *r = arg;
    const tp_error *err = tp_future_error(f);
    tp_args *result = NULL;
    if (err == NULL && tp_future_value(f) != NULL) {
        result = tp_args_ref(tp_future_value(f));
    }
    req_reply(r, result, err);
    tp_future_unref(f);
}

// Pool thread: run the handler of @r.
static void
req_run(void *arg)
{
    ag_req *r = arg;
    tp_agent *a = r->r_agent;
    const ag_fn *fn = ag_registry_find(r->r_fn_id);
    tp_error *err = NULL;

    if (fn == NULL || strcmp(fn->fn_name, r->r_fn_name) != 0) {
        err = tp__error_new(TP_ENOENT, 0, NULL,
                            "function \"%s\" is not registered on %s "
                            "(rank %d)",
                            r->r_fn_name, agent_name(a), a->a_rank);
        req_reply(r, NULL, err);
        tp_error_unref(err);
        return;
    }
    r->r_info.agent = a;
    r->r_info.fn_name = fn->fn_name;
    r->r_info.caller = &r->r_caller->p_info;
    r->r_info.call_id = r->r_call_id;
    if (fn->fn_async != NULL) {
        tp_future *f = fn->fn_async(&r->r_info, r->r_args, fn->fn_arg);
        if (f == NULL) {
            err = tp__error_new(TP_ENOMEM, 0, NULL,
                                "async function \"%s\" returned no future",
                                fn->fn_name);
            req_reply(r, NULL, err);
            tp_error_unref(err);
            return;
        }
        if (tp_future_then(f, req_async_done, r) != TP_OK) {
            tp_future_unref(f);
            err = tp__error_new(TP_ENOMEM, 0, NULL, "function \"%s\"",
                                fn->fn_name);
            req_reply(r, NULL, err);
            tp_error_unref(err);
        }
        return;
    }
    tp_args *out = NULL;
    tp_status st = fn->fn_sync(&r->r_info, r->r_args, fn->fn_arg, &out, &err);
    if (st != TP_OK) {
        tp_args_unref(out);
        if (err == NULL) {
            err = tp__error_new(st, 0, NULL, "function \"%s\" failed: %s",
                                fn->fn_name, tp_status_describe(st));
        } else if (tp_error_status(err) != st) {
            tp_error *e =
                tp__error_new(st, 0, err, "function \"%s\"", fn->fn_name);
            tp_error_unref(err);
            err = e;
        }
        req_reply(r, NULL, err);
        tp_error_unref(err);
        return;
    }
    tp_error_unref(err); // a success with an error object: ignored
    req_reply(r, out, NULL);
}

// ---- calls ---------------------------------------------------------------

static tp_future *
future_failed(tp_error *err)
{
    tp_future *f;
    if (tp_future_create(&f) != TP_OK) {
        tp_error_unref(err);
        return NULL;
    }
    tp_future_set_error(f, err);
    tp_error_unref(err);
    return f;
}

static tp_future *
agent_call(tp_agent *a, ag_peer *p, const char *fn_name, const tp_args *in,
           int64_t timeout_ms)
{
    size_t fnlen = fn_name != NULL ? strlen(fn_name) : 0;
    if (fn_name == NULL || !ag_fn_name_valid(fn_name, fnlen)) {
        return future_failed(tp__error_new(
            TP_EINVAL, 0, NULL,
            "rpc from %s to %s: malformed function name \"%s\"", agent_name(a),
            p->p_info.name, fn_name != NULL ? fn_name : "(null)"));
    }
    ag_call *c = tp__zalloc(sizeof(*c));
    if (c == NULL) {
        return future_failed(tp__error_nomem());
    }
    if (tp_future_create(&c->c_fut) != TP_OK) {
        tp__free(c);
        return future_failed(tp__error_nomem());
    }
    memcpy(c->c_fn_name, fn_name, fnlen + 1);
    c->c_peer = p;
    c->c_timeout_ms = agent_timeout(a, timeout_ms);
    // The call may end (and be freed) as soon as it is in the table: its
    // id is kept here for what follows.
    const uint64_t id =
        atomic_fetch_add_explicit(&a->a_next_id, 1, memory_order_relaxed);
    c->c_id = id;
    tp_future *result = tp_future_ref(c->c_fut);
    bool self = p == a->a_self;

    // A call to self runs on the pool with a copy of the arguments, as a
    // remote worker would see them.
    ag_req *r = NULL;
    tp_args *copy = NULL;
    tp_error *err = NULL;
    if (self) {
        r = tp__zalloc(sizeof(*r));
        if (r == NULL || ag_args_clone(in, &copy, &err) != TP_OK) {
            tp__free(r);
            call_finish(c, NULL, err != NULL ? err : tp__error_nomem());
            return result;
        }
    }

    tp__mtx_lock(&a->a_mtx);
    if (a->a_state == AG_CLOSED) {
        tp__mtx_unlock(&a->a_mtx);
        tp__free(r);
        tp_args_unref(copy);
        call_finish(c, NULL,
                    tp__error_new(TP_ECLOSED, 0, NULL,
                                  "rpc \"%s\" from %s to %s: the agent is "
                                  "shut down",
                                  fn_name, agent_name(a), p->p_info.name));
        return result;
    }
    // Bound to the pool under the lock: a_pool is stable while the agent
    // is not closed.
    tp__future_set_pool(c->c_fut, a->a_pool);
    tp_pool *pool = a->a_pool;
    // Counted before the connection may be made (unlocked) or the pool
    // used: shutdown keeps the context and the pool until every such
    // thread is out.
    atomic_fetch_add_explicit(&a->a_writers, 1, memory_order_acquire);
    ag_wslot *w = NULL;
    if (!self) {
        ag_conn *conn = conn_get_locked(a, p, &err);
        if (conn != NULL) {
            w = slot_get_locked(conn);
            if (w == NULL) {
                tp__error_set(&err, TP_ENOMEM, "out of memory");
            }
        }
        if (w == NULL) {
            tp__mtx_unlock(&a->a_mtx);
            atomic_fetch_sub_explicit(&a->a_writers, 1, memory_order_release);
            tp_status st = tp_error_status(err);
            tp_error *e = tp__error_new(st, 0, err,
                                        "rpc \"%s\" from %s to %s "
                                        "(rank %d)",
                                        fn_name, agent_name(a), p->p_info.name,
                                        p->p_info.rank);
            tp_error_unref(err);
            call_finish(c, NULL, e);
            return result;
        }
        c->c_conn = conn;
        p->p_stats.s_bytes_sent += ag_args_nbytes(in);
    }
    c->c_start_ns = tp__now_ns();
    // tp__deadline_after_ms saturates (a huge timeout means none).
    c->c_deadline_ns = tp__deadline_after_ms(c->c_timeout_ms);
    pending_insert_locked(a, c);
    if (self) {
        a->a_self->p_stats.s_calls_received++;
        a->a_activity++;
    }
    tp__mtx_unlock(&a->a_mtx);
    // From here on the call may end at any time (reply, timeout, failure):
    // @c must not be touched.

    if (self) {
        atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
        r->r_agent = a;
        r->r_caller = a->a_self;
        r->r_call_id = id;
        r->r_fn_id = tp__hash64(fn_name, fnlen);
        r->r_args = copy;
        memcpy(r->r_fn_name, fn_name, fnlen + 1);
        tp__task_init(&r->r_task, req_run, r);
        if (tp__pool_submit(pool, &r->r_task) != TP_OK) {
            tp_error *e =
                tp__error_new(TP_ECLOSED, 0, NULL, "the agent is shut down");
            req_reply(r, NULL, e);
            tp_error_unref(e);
        }
        atomic_fetch_sub_explicit(&a->a_writers, 1, memory_order_release);
        return result;
    }

    ag_hdr h;
    memset(&h, 0, sizeof(h));
    h.h_kind = AG_KIND_REQUEST;
    h.h_call_id = id;
    h.h_fn_id = tp__hash64(fn_name, fnlen);
    h.h_fn_name = fn_name;
    h.h_fn_name_len = (uint16_t)fnlen;
    h.h_src_rank = (uint32_t)a->a_rank;
    tp_args *ref = in != NULL ? tp_args_ref((tp_args *)in) : NULL;
    if (slot_fill(w, &h, ref, NULL) != TP_OK) {
        ag_conn *conn = w->w_conn;
        tp__mtx_lock(&a->a_mtx);
        w->w_next = conn->c_slots;
        conn->c_slots = w;
        ag_call *mine = pending_take_locked(a, h.h_call_id, NULL, TP_ENOMEM);
        tp__mtx_unlock(&a->a_mtx);
        if (mine != NULL) {
            call_finish(mine, NULL, tp__error_nomem());
        }
    } else {
        slot_submit(w);
    }
    atomic_fetch_sub_explicit(&a->a_writers, 1, memory_order_release);
    return result;
}

static ag_peer *
peer_by_name(tp_agent *a, const char *name)
{
    if (name == NULL) {
        return NULL;
    }
    for (int i = 0; i < a->a_world; i++) {
        if (strcmp(a->a_peers[i].p_info.name, name) == 0) {
            return &a->a_peers[i];
        }
    }
    return NULL;
}

tp_future *
tp_rpc_async(tp_agent *a, const char *to, const char *fn_name,
             const tp_args *in, int64_t timeout_ms)
{
    ag_peer *p = peer_by_name(a, to);
    if (p == NULL) {
        return future_failed(tp__error_new(
            TP_ENOENT, 0, NULL, "rpc \"%s\" from %s: no worker named \"%s\"",
            fn_name != NULL ? fn_name : "(null)", agent_name(a),
            to != NULL ? to : "(null)"));
    }
    return agent_call(a, p, fn_name, in, timeout_ms);
}

tp_future *
tp_rpc_async_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                  int64_t timeout_ms)
{
    if (to < 0 || to >= a->a_world) {
        return future_failed(tp__error_new(
            TP_ENOENT, 0, NULL,
            "rpc \"%s\" from %s: no worker of rank %d (world size %d)",
            fn_name != NULL ? fn_name : "(null)", agent_name(a), to,
            a->a_world));
    }
    return agent_call(a, &a->a_peers[to], fn_name, in, timeout_ms);
}

static bool
future_done(void *arg)
{
    return tp_future_is_done(arg);
}

tp_status
tp_rpc_wait(tp_future *f, int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    if (out_p != NULL) {
        *out_p = NULL;
    }
    if (f == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rpc: no future");
    }
    // Spin briefly: a reply within microseconds should not pay for a
    // sleep and a wake-up. TP_LOOP_SPIN_US bounds it, as for the loops.
    if (!tp_future_is_done(f)) {
        static _Atomic int64_t spin_ns = -1;
        int64_t sns = atomic_load_explicit(&spin_ns, memory_order_relaxed);
        if (sns < 0) {
            tp_config cfg;
            tp__config_defaults(&cfg);
            tp_error *e = NULL;
            if (tp__config_load(&cfg, &e) != TP_OK) {
                tp_error_unref(e);
            }
            sns = cfg.loop_spin_us * 1000;
            atomic_store_explicit(&spin_ns, sns, memory_order_relaxed);
        }
        tp__spin_until(future_done, f, (uint64_t)sns);
    }
    tp_status st = tp_future_wait(f, timeout_ms, err_p);
    if (st == TP_OK && out_p != NULL) {
        tp_args *v = tp_future_value(f);
        *out_p = v != NULL ? tp_args_ref(v) : NULL;
    }
    return st;
}

static tp_status
rpc_sync_wait(tp_agent *a, tp_future *f, int64_t timeout_ms, tp_args **out_p,
              tp_error **err_p)
{
    // The call ends by itself at its deadline (the timer thread); the
    // wait's own deadline is only a backstop.
    int64_t t = agent_timeout(a, timeout_ms);
    int64_t wait_ms =
        t > 0 && t < INT64_MAX - AG_SYNC_GRACE_MS ? t + AG_SYNC_GRACE_MS : 0;
    tp_status st = tp_rpc_wait(f, wait_ms, out_p, err_p);
    if (st == TP_ETIMEDOUT && !tp_future_is_done(f)) {
        // Only if the timer thread failed to end the call: say so.
        tp__error_wrap(err_p, st,
                       "rpc from %s: the call did not end %d ms after its "
                       "%lld ms deadline",
                       agent_name(a), AG_SYNC_GRACE_MS, (long long)t);
    }
    tp_future_unref(f);
    return st;
}

tp_status
tp_rpc_sync(tp_agent *a, const char *to, const char *fn_name, const tp_args *in,
            int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}

tp_status
tp_rpc_sync_rank(tp_agent *a, int to, const char *fn_name, const tp_args *in,
                 int64_t timeout_ms, tp_args **out_p, tp_error **err_p)
{
    return rpc_sync_wait(a, tp_rpc_async_rank(a, to, fn_name, in, timeout_ms),
                         timeout_ms, out_p, err_p);
}

// ---- worker info -----------------------------------------------------------

tp_status
tp_rpc_get_worker_info(const tp_agent *a, const char *name,
                       tp_worker_info *wi_p)
{
    const ag_peer *p =
        name == NULL ? a->a_self : peer_by_name((tp_agent *)a, name);
    if (p == NULL) {
        return TP_ENOENT;
    }
    *wi_p = p->p_info;
    return TP_OK;
}

tp_status
tp_rpc_get_worker_info_by_rank(const tp_agent *a, int rank,
                               tp_worker_info *wi_p)
{
    if (rank < 0 || rank >= a->a_world) {
        return TP_ENOENT;
    }
    *wi_p = a->a_peers[rank].p_info;
    return TP_OK;
}

int
tp_rpc_world_size(const tp_agent *a)
{
    return a->a_world;
}

int
tp_rpc_get_worker_infos(const tp_agent *a, tp_worker_info *infos, int n)
{
    for (int i = 0; i < a->a_world && i < n; i++) {
        infos[i] = a->a_peers[i].p_info;
    }
    return a->a_world;
}

const char *
tp__agent_listen_url(const tp_agent *a)
{
    return a->a_listen_url;
}

size_t
tp__agent_nconns(const tp_agent *a)
{
    tp_agent *ma = (tp_agent *)a;
    size_t n = 0;
    tp__mtx_lock(&ma->a_mtx);
    for (const ag_conn *c = a->a_conns; c != NULL; c = c->c_next) {
        n++;
    }
    tp__mtx_unlock(&ma->a_mtx);
    return n;
}

// ---- rendezvous ------------------------------------------------------------

// Milliseconds until @deadline, at least 1 (a store timeout of 0 would
// mean no limit).
static int64_t
ms_left(uint64_t deadline)
{
    uint64_t now = tp__now_ns();
    return now >= deadline ? 1 : (int64_t)((deadline - now) / 1000000u) + 1;
}

// "<prefix>worker/<rank>" = "<name>\n<world>\n<url>\n<url>..."
static void
worker_key(const tp_agent *a, char *buf, size_t len, int rank)
{
    snprintf(buf, len, "%sworker/%d", a->a_prefix, rank);
}

static tp_status
rendezvous_parse(tp_agent *a, int rank, const char *val, size_t len,
                 tp_error **err_p)
{
    ag_peer *p = &a->a_peers[rank];
    const char *end = val + len;
    const char *line = val;
    int field = 0;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t n = nl != NULL ? (size_t)(nl - line) : (size_t)(end - line);
        if (field == 0) {
            if (!worker_name_valid(line, n)) {
                goto bad;
            }
            memcpy(p->p_info.name, line, n);
            p->p_info.name[n] = '\0';
        } else if (field == 1) {
            char num[16];
            if (n == 0 || n >= sizeof(num)) {
                goto bad;
            }
            memcpy(num, line, n);
            num[n] = '\0';
            char *e;
            long w = strtol(num, &e, 10);
            if (*e != '\0' || w != a->a_world) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "rpc init of %s (rank %d): rank %d "
                                     "says the world size is %s, here it "
                                     "is %d",
                                     agent_name(a), a->a_rank, rank, num,
                                     a->a_world);
            }
        } else if (p->p_nurls < AG_MAX_URLS && n > 0 && n < AG_MAX_URL) {
            memcpy(p->p_urls[p->p_nurls], line, n);
            p->p_urls[p->p_nurls][n] = '\0';
            p->p_nurls++;
        } else if (n > 0) {
            goto bad;
        }
        field++;
        line = nl != NULL ? nl + 1 : end;
    }
    if (field < 2) {
        goto bad;
    }
    p->p_info.rank = rank;
    return TP_OK;
bad:
    return tp__error_set(err_p, TP_EPROTO,
                         "rpc init of %s (rank %d): malformed worker record "
                         "of rank %d in the store",
                         agent_name(a), a->a_rank, rank);
}

// After a wait for <prefix><stem><rank> timed out at rank @from: lists
// @from and every later rank (this one excepted) whose key is still not
// set (1 ms per check) in @out, as numbers, or with @shutdown as "name
// (rank N)" marking them p_sd_missing for the store's last wait.
static void
store_missing_ranks(tp_agent *a, const char *stem, int from, bool shutdown,
                    char *out, size_t len)
{
    size_t off = 0;
    out[0] = '\0';
    for (int m = from; m < a->a_world; m++) {
        if (m == a->a_rank && !shutdown) {
            continue;
        }
        char key[128];
        snprintf(key, sizeof(key), "%s%s%d", a->a_prefix, stem, m);
        void *v = NULL;
        size_t vlen;
        tp_error *e = NULL;
        if (m > from &&
            tp_store_get(a->a_store, key, 1, &v, &vlen, &e) == TP_OK) {
            free(v);
            continue;
        }
        tp_error_unref(e);
        if (shutdown) {
            a->a_peers[m].p_sd_missing = true;
        }
        if (off + TP_RPC_MAX_NAME + 32 < len) {
            off += (size_t)(shutdown ? snprintf(out + off, len - off,
                                                "%s%s (rank %d)",
                                                off > 0 ? ", " : "",
                                                a->a_peers[m].p_info.name, m)
                                     : snprintf(out + off, len - off, "%s%d",
                                                off > 0 ? ", " : "", m));
        }
    }
}

static tp_status
rendezvous(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    char key[128];
    char val[AG_MAX_URL * AG_MAX_URLS + TP_RPC_MAX_NAME + 64];
    ag_peer *me = a->a_self;
    // A store may outlive a job (a file, a standalone server): each job's
    // keys get their own generation, counted by the joins so far (every
    // job of world_size workers adds world_size).
    int64_t joins = 0;
    tp_status st = tp_store_add(a->a_store, AG_KEY_PREFIX "joins", 1,
                                ms_left(deadline), &joins, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)",
                              agent_name(a), a->a_rank);
    }
    snprintf(a->a_prefix, sizeof(a->a_prefix), AG_KEY_PREFIX "%lld/",
             (long long)((joins - 1) / a->a_world));
    int n = snprintf(val, sizeof(val), "%s\n%d\n", me->p_info.name, a->a_world);
    for (int i = 0; i < me->p_nurls; i++) {
        n += snprintf(val + n, sizeof(val) - (size_t)n, "%s\n", me->p_urls[i]);
    }
    worker_key(a, key, sizeof(key), a->a_rank);
    st =
        tp_store_set(a->a_store, key, val, (size_t)n, ms_left(deadline), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)",
                              agent_name(a), a->a_rank);
    }
    for (int r = 0; r < a->a_world; r++) {
        if (r == a->a_rank) {
            continue;
        }
        worker_key(a, key, sizeof(key), r);
        int64_t left = ms_left(deadline);
        void *v = NULL;
        size_t vlen = 0;
        tp_error *err = NULL;
        st = tp_store_get(a->a_store, key, left, &v, &vlen, &err);
        if (st != TP_OK) {
            if (st == TP_ETIMEDOUT) {
                // Name every rank still missing.
                char missing[512];
                store_missing_ranks(a, "worker/", r, false, missing,
                                    sizeof(missing));
                tp__error_set(err_p, TP_ETIMEDOUT,
                              "rpc init of %s (rank %d): waited %lld ms for "
                              "ranks %s of %d to join through %s: %s",
                              agent_name(a), a->a_rank,
                              (long long)a->a_opts.init_timeout_ms, missing,
                              a->a_world, tp_store_addr(a->a_store),
                              tp_error_message(err));
                tp_error_unref(err);
                return TP_ETIMEDOUT;
            }
            if (err_p != NULL) {
                *err_p = err;
            } else {
                tp_error_unref(err);
            }
            return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)",
                                  agent_name(a), a->a_rank);
        }
        st = rendezvous_parse(a, r, v, vlen, err_p);
        free(v);
        if (st != TP_OK) {
            return st;
        }
    }
    // Duplicate names fail init on every worker (each sees every record).
    int dup_i = -1, dup_j = -1;
    for (int i = 0; i < a->a_world && dup_i < 0; i++) {
        for (int j = i + 1; j < a->a_world; j++) {
            if (strcmp(a->a_peers[i].p_info.name, a->a_peers[j].p_info.name) ==
                0) {
                dup_i = i;
                dup_j = j;
                break;
            }
        }
    }
    if (dup_i < 0) {
        return TP_OK;
    }
    // Rank 0 hosts the store: it keeps it up until every rank has read
    // the records, so that each fails with this message, not a reset.
    snprintf(key, sizeof(key), "%sread/%d", a->a_prefix, a->a_rank);
    tp_error *e = NULL;
    if (tp_store_set(a->a_store, key, "1", 1, ms_left(deadline), &e) == TP_OK &&
        a->a_rank == 0) {
        for (int r = 1; r < a->a_world; r++) {
            snprintf(key, sizeof(key), "%sread/%d", a->a_prefix, r);
            const char *keys[1] = {key};
            if (tp_store_wait(a->a_store, keys, 1, ms_left(deadline), &e) !=
                TP_OK) {
                break;
            }
        }
    }
    tp_error_unref(e);
    return tp__error_set(err_p, TP_EINVAL,
                         "rpc init of rank %d: worker name \"%s\" is used by "
                         "rank %d and rank %d",
                         a->a_rank, a->a_peers[dup_i].p_info.name, dup_i,
                         dup_j);
}

// True if the comma-separated allow list @list ("" = all) has @name.
static bool
list_has(const char *list, const char *name)
{
    size_t n = strlen(name);
    if (list[0] == '\0') {
        return true;
    }
    for (const char *p = list; *p != '\0';) {
        while (*p == ' ' || *p == ',') {
            p++;
        }
        const char *e = p;
        while (*e != '\0' && *e != ',' && *e != ' ') {
            e++;
        }
        if ((size_t)(e - p) == n && strncmp(p, name, n) == 0) {
            return true;
        }
        p = e;
    }
    return false;
}

// The listener's addresses: tcp on loopback when the job rendezvous on
// loopback and no interface was chosen (a local job stays on lo).
static tp_status
agent_listen(tp_agent *a, tp_error **err_p)
{
    const char *urls[1];
    size_t nurls = 0;
    tp_config cfg;
    tp__config_defaults(&cfg);
    tp_error *e = NULL;
    if (tp__config_load(&cfg, &e) != TP_OK) {
        tp_error_unref(e);
    }
    const char *saddr = tp_store_addr(a->a_store);
    if (cfg.socket_ifname[0] == '\0' && cfg.socket_addr[0] == '\0' &&
        saddr != NULL && list_has(a->a_transports, "tcp")) {
        if (strncmp(saddr, "tcp://127.", 10) == 0) {
            urls[nurls++] = "tcp://127.0.0.1:0";
        } else if (strncmp(saddr, "tcp://[::1]", 11) == 0) {
            urls[nurls++] = "tcp://[::1]:0";
        }
    }
    tp_status st =
        tp_context_listen(a->a_ctx, urls, nurls, &a->a_listener, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init of %s (rank %d): listen",
                              agent_name(a), a->a_rank);
    }
    // Published in connect order: tcp first (moves to shm on one host
    // when both allow it), then the others.
    static const char *const order[] = {"tcp", "shm", "ibv", "ucx"};
    ag_peer *me = a->a_self;
    for (size_t i = 0; i < TP_ARRAY_LEN(order); i++) {
        const char *u = tp_pipe_listener_addr(a->a_listener, order[i]);
        if (u != NULL && strlen(u) < AG_MAX_URL && me->p_nurls < AG_MAX_URLS) {
            snprintf(me->p_urls[me->p_nurls++], AG_MAX_URL, "%s", u);
        }
    }
    if (me->p_nurls == 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init of %s (rank %d): the listener has no "
                             "address",
                             agent_name(a), a->a_rank);
    }
    snprintf(a->a_listen_url, sizeof(a->a_listen_url), "%s", me->p_urls[0]);
    return TP_OK;
}

// ---- teardown ----------------------------------------------------------

static void
agent_free(tp_agent *a)
{
    ag_conn *c = a->a_conns;
    while (c != NULL) {
        ag_conn *next = c->c_next;
        conn_free(c);
        c = next;
    }
    ag_tclass *tc = a->a_tclasses;
    while (tc != NULL) {
        ag_tclass *next = tc->t_next;
        tp__free(tc);
        tc = next;
    }
    tp_aio_destroy(a->a_accept_aio);
    tp__free(a->a_table);
    tp__free(a->a_peers);
    tp__cv_fini(&a->a_timer_cv);
    tp__cv_fini(&a->a_idle_cv);
    tp__mtx_fini(&a->a_mtx);
    tp__free(a);
}

static void
agent_unref(tp_agent *a)
{
    if (atomic_fetch_sub_explicit(&a->a_refs, 1, memory_order_acq_rel) == 1) {
        agent_free(a);
    }
}

// Waits (bounded) until no thread is inside a pipe call for the agent.
// False if one still is after AG_TEARDOWN_MS (its loop is stuck): the
// context is then left alive rather than freed under it.
static bool
agent_wait_writers(tp_agent *a)
{
    uint64_t deadline = tp__deadline_after_ms(AG_TEARDOWN_MS);
    while (atomic_load_explicit(&a->a_writers, memory_order_acquire) > 0) {
        if (tp__now_ns() >= deadline) {
            TP_LOG_ERROR("TP-RPC-SHUTDOWN",
                         "rpc %s: a thread is still inside a pipe call %d ms "
                         "after shutdown; leaving the pipes",
                         agent_name(a), AG_TEARDOWN_MS);
            return false;
        }
        struct timespec ts = {0, 1000000}; // 1 ms
        nanosleep(&ts, NULL);
    }
    return true;
}

// Stops everything: pending calls fail with @why (borrowed, may be NULL
// for a generic message), pipes close, timer, pool and context end. Then
// drops the user's reference.
static void
agent_teardown(tp_agent *a, const char *why)
{
    ag_call *all = NULL;

    tp__mtx_lock(&a->a_mtx);
    a->a_state = AG_CLOSED;
    for (size_t i = 0; a->a_table != NULL && i < a->a_table_size; i++) {
        while (a->a_table[i] != NULL) {
            ag_call *c = a->a_table[i];
            pending_unlink_locked(a, c, TP_ECLOSED);
            c->c_hnext = all;
            all = c;
        }
    }
    a->a_timer_stop = true;
    tp__cv_signal(&a->a_timer_cv);
    tp__mtx_unlock(&a->a_mtx);
    while (all != NULL) {
        ag_call *c = all;
        all = c->c_hnext;
        call_finish(c, NULL,
                    tp__error_new(TP_ECLOSED, 0, NULL,
                                  "rpc \"%s\" from %s to %s (rank %d): %s",
                                  c->c_fn_name, agent_name(a),
                                  c->c_peer->p_info.name,
                                  c->c_peer->p_info.rank,
                                  why != NULL ? why
                                              : "the agent shut down before "
                                                "the reply"));
    }
    // Threads that passed the state check are inside a pipe call; the
    // pipes must outlive it.
    bool writers_out = agent_wait_writers(a);
    if (a->a_timer_started) {
        pthread_join(a->a_timer, NULL);
        a->a_timer_started = false;
    }
    if (a->a_listener != NULL) {
        tp_pipe_listener_destroy(a->a_listener);
        a->a_listener = NULL;
    }
    tp__mtx_lock(&a->a_mtx);
    for (ag_conn *c = a->a_conns; c != NULL; c = c->c_next) {
        tp_pipe_close(c->c_pipe);
    }
    tp__mtx_unlock(&a->a_mtx);
    if (a->a_pool != NULL) {
        tp__pool_close(a->a_pool);
        if (tp__pool_wait_idle(a->a_pool,
                               tp__deadline_after_ms(AG_TEARDOWN_MS))) {
            tp__pool_destroy(a->a_pool);
        } else {
            // A handler that never returns cannot be stopped; its thread
            // and the agent's memory stay.
            TP_LOG_ERROR("TP-RPC-SHUTDOWN",
                         "rpc %s: handlers still running %d ms after "
                         "shutdown; leaving their threads",
                         agent_name(a), AG_TEARDOWN_MS);
            a->a_pool_leaked = true;
        }
        a->a_pool = NULL;
    }
    // Handlers that finished after the pool stopped may still write:
    // wait for them before the pipes go.
    writers_out = writers_out && agent_wait_writers(a);
    if (a->a_ctx != NULL && !a->a_pool_leaked && writers_out) {
        tp_context_destroy(a->a_ctx);
        a->a_ctx = NULL;
    }
}

// ---- init ------------------------------------------------------------------

tp_status
tp_rpc_init(const char *name, int rank, int world_size,
            const tp_agent_options *o, tp_agent **agent_p, tp_error **err_p)
{
    size_t nlen = name != NULL ? strlen(name) : 0;
    if (agent_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "rpc init: no agent_p");
    }
    *agent_p = NULL;
    if (name == NULL || !worker_name_valid(name, nlen)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init: worker name \"%s\": 1..%d letters, "
                             "digits, '_', '-' and ':'",
                             name != NULL ? name : "(null)", TP_RPC_MAX_NAME);
    }
    tp_agent *a = tp__zalloc(sizeof(*a));
    if (a == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "rpc init: out of memory");
    }
    atomic_init(&a->a_refs, 1);
    atomic_init(&a->a_writers, 0);
    atomic_init(&a->a_next_id, 1);
    tp__mtx_init(&a->a_mtx);
    tp__cv_init(&a->a_idle_cv);
    tp__cv_init(&a->a_timer_cv);
    tp_status st = options_check(a, o, err_p);
    if (st != TP_OK) {
        goto fail_early;
    }
    if (strncmp(a->a_init_method, "env://", 6) == 0 &&
        (rank < 0 || world_size < 0)) {
        int r, w, l;
        st = tp__store_env_ranks(&r, &w, &l, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "rpc init of %s", name);
            goto fail_early;
        }
        rank = rank < 0 ? r : rank;
        world_size = world_size < 0 ? w : world_size;
    }
    if (world_size < 1 || world_size > 65536 || rank < 0 ||
        rank >= world_size) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "rpc init of %s: rank %d of world size %d", name,
                           rank, world_size);
        goto fail_early;
    }
    a->a_rank = rank;
    a->a_world = world_size;
    a->a_peers = tp__zalloc((size_t)world_size * sizeof(ag_peer));
    a->a_table_size = 64;
    a->a_table = tp__zalloc(a->a_table_size * sizeof(ag_call *));
    if (a->a_peers == NULL || a->a_table == NULL ||
        tp_aio_create(agent_accept_cb, a, &a->a_accept_aio) != TP_OK) {
        st = tp__error_set(err_p, TP_ENOMEM, "rpc init of %s: out of memory",
                           name);
        goto fail_early;
    }
    a->a_self = &a->a_peers[rank];
    memcpy(a->a_self->p_info.name, name, nlen + 1);
    a->a_self->p_info.rank = rank;

    uint64_t deadline = tp__deadline_after_ms(a->a_opts.init_timeout_ms);
    st = tp_store_open(a->a_init_method, rank, world_size,
                       a->a_opts.init_timeout_ms, &a->a_store, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "rpc init of %s (rank %d)", name, rank);
        goto fail_early;
    }
    tp_context_options co;
    tp_context_options_init(&co);
    co.name = name;
    co.transports = a->a_transports[0] ? a->a_transports : NULL;
    co.channels = a->a_channels[0] ? a->a_channels : NULL;
    st = tp_context_create(&co, &a->a_ctx, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "rpc init of %s (rank %d)", name, rank);
        goto fail;
    }
    st =
        tp__pool_create(a->a_opts.num_worker_threads, "rpc", &a->a_pool, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "rpc init of %s (rank %d)", name, rank);
        goto fail;
    }
    tp__pool_set_spin_us(a->a_pool, (int64_t)(a->a_spin_ns / 1000u));
    st = agent_listen(a, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    int rc = pthread_create(&a->a_timer, NULL, timer_main, a);
    if (rc != 0) {
        st = tp__error_errno(err_p, rc, "rpc init of %s: timer thread", name);
        goto fail;
    }
    a->a_timer_started = true;
    st = rendezvous(a, deadline, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    // Accepting starts once every worker's record is known: a worker that
    // finished its rendezvous first may already call us; its pipe waits in
    // the listener's ready queue until then (the handshake is done by the
    // context), so requests never see a half-filled peer table.
    tp_pipe_listener_accept(a->a_listener, a->a_accept_aio);
    TP_LOG_INFO("TP-RPC-INIT",
                "rpc %s: rank %d of %d, listening on %s, store %s", name, rank,
                world_size, a->a_listen_url, tp_store_addr(a->a_store));
    *agent_p = a;
    return TP_OK;

fail:
    agent_teardown(a, "init failed");
    tp_store_close(a->a_store);
    a->a_store = NULL;
    agent_unref(a);
    return st;
fail_early:
    tp_store_close(a->a_store);
    tp_aio_destroy(a->a_accept_aio);
    a->a_accept_aio = NULL;
    agent_unref(a);
    return st;
}

// ---- shutdown ------------------------------------------------------------

// One round of the shutdown agreement: publish (pending, activity), read
// everyone's. Returns the sums.
static tp_status
shutdown_round(tp_agent *a, int round, uint64_t deadline, uint64_t *pending_p,
               uint64_t *activity_p, tp_error **err_p)
{
    char key[128];
    char val[64];
    tp__mtx_lock(&a->a_mtx);
    uint64_t pend = a->a_npending, act = a->a_activity;
    tp__mtx_unlock(&a->a_mtx);
    int n = snprintf(val, sizeof(val), "%" PRIu64 " %" PRIu64, pend, act);
    snprintf(key, sizeof(key), "%sshutdown/%d/%d", a->a_prefix, round,
             a->a_rank);
    tp_status st =
        tp_store_set(a->a_store, key, val, (size_t)n, ms_left(deadline), err_p);
    if (st != TP_OK) {
        return st;
    }
    uint64_t sp = 0, sa = 0;
    for (int r = 0; r < a->a_world; r++) {
        snprintf(key, sizeof(key), "%sshutdown/%d/%d", a->a_prefix, round, r);
        void *v = NULL;
        size_t len = 0;
        tp_error *err = NULL;
        st = tp_store_get(a->a_store, key, ms_left(deadline), &v, &len, &err);
        if (st != TP_OK) {
            if (st == TP_ETIMEDOUT) {
                // Name every worker still missing in this round.
                char stem[32];
                char missing[512];
                snprintf(stem, sizeof(stem), "shutdown/%d/", round);
                store_missing_ranks(a, stem, r, true, missing, sizeof(missing));
                tp__error_set(err_p, TP_ETIMEDOUT,
                              "waited %lld ms for %s to %s shutdown",
                              (long long)a->a_opts.shutdown_timeout_ms, missing,
                              round == 0 ? "call" : "finish a round of");
                tp_error_unref(err);
            } else if (err_p != NULL) {
                *err_p = err;
            } else {
                tp_error_unref(err);
            }
            return st;
        }
        unsigned long long p = 0, ac = 0;
        if (sscanf(v, "%llu %llu", &p, &ac) != 2) {
            free(v);
            return tp__error_set(err_p, TP_EPROTO,
                                 "malformed shutdown record of rank %d", r);
        }
        free(v);
        sp += p;
        sa += ac;
    }
    *pending_p = sp;
    *activity_p = sa;
    return TP_OK;
}

// Graceful: every worker waits for its own calls to end, then all agree
// (through the store) that no call is outstanding anywhere and nothing
// happened since the previous round (PyTorch's join + sync of call counts).
static tp_status
shutdown_graceful(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    uint64_t prev_activity = UINT64_MAX;
    for (int round = 0;; round++) {
        tp__mtx_lock(&a->a_mtx);
        while (a->a_npending > 0) {
            if (!tp__cv_wait_until(&a->a_idle_cv, &a->a_mtx, deadline) &&
                a->a_npending > 0) {
                size_t n = a->a_npending;
                tp__mtx_unlock(&a->a_mtx);
                return tp__error_set(err_p, TP_ETIMEDOUT,
                                     "waited %lld ms for %zu calls of this "
                                     "worker to end",
                                     (long long)a->a_opts.shutdown_timeout_ms,
                                     n);
            }
        }
        tp__mtx_unlock(&a->a_mtx);
        uint64_t pending = 0, activity = 0;
        tp_status st =
            shutdown_round(a, round, deadline, &pending, &activity, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (pending == 0 && activity == prev_activity) {
            return TP_OK;
        }
        prev_activity = activity;
        if (tp__now_ns() >= deadline) {
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "waited %lld ms for the calls of every "
                                 "worker to end",
                                 (long long)a->a_opts.shutdown_timeout_ms);
        }
    }
}

tp_status
tp_rpc_shutdown(tp_agent *a, bool graceful, tp_error **err_p)
{
    if (a == NULL) {
        return TP_OK;
    }
    tp_status st = TP_OK;
    uint64_t deadline = tp__deadline_after_ms(a->a_opts.shutdown_timeout_ms);
    if (graceful) {
        tp__mtx_lock(&a->a_mtx);
        a->a_state = AG_SHUTTING_DOWN;
        tp__mtx_unlock(&a->a_mtx);
        st = shutdown_graceful(a, deadline, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "rpc shutdown of %s (rank %d)",
                           agent_name(a), a->a_rank);
        }
    }
    agent_teardown(a, graceful ? "the agent shut down before the reply"
                               : "the agent was shut down (not graceful) "
                                 "before the reply");
    // The store server lives in rank 0's process: rank 0 closes it after
    // every rank that took part in the shutdown said it is done with it
    // (graceful only; bounded). When the agreement failed, the others may
    // still be waiting for their own deadline: rank 0 gives them one more
    // shutdown timeout, so they fail with their own timeout naming the
    // missing worker rather than with a closed store.
    if (graceful) {
        char key[128];
        uint64_t exit_deadline =
            st == TP_OK ? deadline
                        : tp__deadline_after_ms(a->a_opts.shutdown_timeout_ms);
        snprintf(key, sizeof(key), "%sexit/%d", a->a_prefix, a->a_rank);
        tp_error *e = NULL;
        if (tp_store_set(a->a_store, key, "1", 1, ms_left(exit_deadline), &e) ==
                TP_OK &&
            a->a_rank == 0) {
            for (int r = 1; r < a->a_world; r++) {
                if (a->a_peers[r].p_sd_missing) {
                    continue;
                }
                snprintf(key, sizeof(key), "%sexit/%d", a->a_prefix, r);
                const char *keys[1] = {key};
                if (tp_store_wait(a->a_store, keys, 1, ms_left(exit_deadline),
                                  &e) != TP_OK) {
                    break;
                }
            }
        }
        if (e != NULL) {
            TP_LOG_DEBUG("TP-RPC-SHUTDOWN", "rpc %s: %s", agent_name(a),
                         tp_error_message(e));
            tp_error_unref(e);
        }
    }
    tp_store_close(a->a_store);
    a->a_store = NULL;
    agent_unref(a);
    return st;
}

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
    size_t cap = 1024 + (size_t)a->a_world * 400;
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
    DI_ADD("agent %s: rank %d of %d, listening on %s\n", agent_name(a),
           a->a_rank, a->a_world, a->a_listen_url);
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
#undef DI_ADD
    if (off >= cap) {
        buf[cap - 1] = '\0';
    }
    return buf;
}
