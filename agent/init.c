// SPDX-License-Identifier: Apache-2.0
// init.c - the agent's life: options, tp_rpc_init, worker infos, the
// listener, teardown and tp_rpc_shutdown (ag_impl.h has the map of the
// agent's files).
//
// Lifetime. The agent is refcounted: the user holds one reference until
// tp_rpc_shutdown, every request in a handler holds one. Shutdown stops
// everything (pipes, timer, pool, context); the memory goes with the last
// reference (a late async handler may hold it; its reply is dropped).

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "ag_impl.h"
#include "core/alloc.h"
#include "core/config.h"
#include "core/log.h"
#include "store/store_int.h"

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
    o->size = sizeof(*o);
    o->num_worker_threads = (int)cfg.num_worker_threads;
    o->rpc_timeout_ms = cfg.rpc_timeout_ms;
    o->init_timeout_ms = cfg.rpc_init_timeout_ms;
    o->shutdown_timeout_ms = cfg.rpc_shutdown_timeout_ms;
    const char *im = getenv("TP_INIT_METHOD");
    o->init_method = im != NULL && im[0] != '\0' ? im : "env://";
    o->transports = getenv("TP_TRANSPORTS");
    o->channels = getenv("TP_CHANNELS");
    tp__ag_options_defaults(o);
}

// The oldest layout with a size field ends after flight_recorder. Fields
// added later go after it; a caller built before them passes a smaller
// size and they keep the defaults of tp_agent_options_init.
#define AG_OPTS_MIN_SIZE                                                       \
    (offsetof(tp_agent_options, flight_recorder) + sizeof(int))

static tp_status
options_check(tp_agent *a, const tp_agent_options *o, tp_error **err_p)
{
    tp_config cfg;
    tp_status st = tp__config_load(&cfg, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init");
    }
    tp_agent_options_init(&a->a_opts);
    if (o != NULL) {
        if (o->size < AG_OPTS_MIN_SIZE || o->size > sizeof(a->a_opts)) {
            return tp__error_set(
                err_p, TP_EINVAL,
                "rpc init: options size %zu unknown to this library "
                "(%zu..%zu): the caller was built against another tpipe "
                "version, or did not call tp_agent_options_init",
                o->size, (size_t)AG_OPTS_MIN_SIZE, sizeof(a->a_opts));
        }
        memcpy(&a->a_opts, o, o->size);
        a->a_opts.size = sizeof(a->a_opts);
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
    st = tp__ag_options_check(ao, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__ag_faulty_parse(ao->faulty, &a->a_faulty, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init (TP_RPC_FAULTY)");
    }
    ao->faulty = a->a_faulty.f_nrules > 0 ? a->a_faulty.f_spec : NULL;
    st = tp__ag_devmaps_parse(ao->device_maps, ao->devices, &a->a_devmaps,
                              err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init");
    }
    // The strings are the caller's: the parsed maps are what is used.
    ao->device_maps = NULL;
    ao->devices = NULL;
    if (ao->faulty != NULL) {
        TP_LOG_WARN("TP-RPC-FAULTY",
                    "rpc: faulty mode \"%s\": sends fail or wait on purpose",
                    ao->faulty);
    }
    ao->init_method = a->a_init_method;
    ao->transports = a->a_transports;
    ao->channels = a->a_channels;
    a->a_spin_ns = (uint64_t)cfg.loop_spin_us * 1000u;
    return TP_OK;
}

// ---- worker info -----------------------------------------------------------

tp_status
tp_rpc_get_worker_info(const tp_agent *a, const char *name,
                       tp_worker_info *wi_p)
{
    if (a == NULL || wi_p == NULL) {
        return TP_EINVAL;
    }
    const ag_peer *p =
        name == NULL ? a->a_self : tp__ag_peer_by_name((tp_agent *)a, name);
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
    if (a == NULL || wi_p == NULL) {
        return TP_EINVAL;
    }
    if (rank < 0 || rank >= a->a_world) {
        return TP_ENOENT;
    }
    *wi_p = a->a_peers[rank].p_info;
    return TP_OK;
}

int
tp_rpc_world_size(const tp_agent *a)
{
    return a != NULL ? a->a_world : TP_EINVAL;
}

int
tp_rpc_get_worker_infos(const tp_agent *a, tp_worker_info *infos, int n)
{
    if (a == NULL || (infos == NULL && n > 0)) {
        return TP_EINVAL;
    }
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
                              ag_name(a), a->a_rank);
    }
    // Published in connect order: the first network transport (tcp: moves
    // to shm on one host when both allow it), then the others.
    const char *addrs[AG_MAX_URLS];
    size_t naddrs =
        TP_MIN(tp_pipe_listener_addrs(a->a_listener, addrs, AG_MAX_URLS),
               (size_t)AG_MAX_URLS);
    ag_peer *me = a->a_self;
    for (size_t i = 0; i < naddrs; i++) {
        if (strlen(addrs[i]) < AG_MAX_URL && me->p_nurls < AG_MAX_URLS) {
            snprintf(me->p_urls[me->p_nurls++], AG_MAX_URL, "%s", addrs[i]);
        }
    }
    if (me->p_nurls == 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "rpc init of %s (rank %d): the listener has no "
                             "address",
                             ag_name(a), a->a_rank);
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
        tp__ag_conn_free(c);
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
    tp__ag_devmaps_free(a->a_devmaps);
    tp__ag_fr_fini(a);
    tp__cv_fini(&a->a_timer_cv);
    tp__cv_fini(&a->a_idle_cv);
    tp__cv_fini(&a->a_quiet_cv);
    tp__mtx_fini(&a->a_mtx);
    tp__free(a);
}

void
tp__ag_agent_unref(tp_agent *a)
{
    if (atomic_fetch_sub_explicit(&a->a_refs, 1, memory_order_acq_rel) == 1) {
        agent_free(a);
    }
}

// The reads and writes in flight on @c (its operations but the requests
// held by handlers).
static long
conn_io(const ag_conn *c)
{
    ag_conn *mc = (ag_conn *)c;
    return atomic_load_explicit(&mc->c_ops, memory_order_acquire) -
           atomic_load_explicit(&mc->c_reqs, memory_order_acquire);
}

// Waits until no thread is inside a pipe call for the agent and, with
// @conns, until every connection's operations ended (the pipes were
// closed: reads and writes complete with TP_ECLOSED), at most until
// @deadline. False if something is still busy then: its loop is stuck, so
// the context and the agent's memory are left alive rather than freed
// under it, and the log names each pipe that did not close.
static bool
agent_wait_quiet(tp_agent *a, uint64_t deadline, bool conns)
{
    tp__mtx_lock(&a->a_mtx);
    for (;;) {
        long w = atomic_load_explicit(&a->a_writers, memory_order_acquire);
        const ag_conn *busy = NULL;
        for (const ag_conn *c = a->a_conns; conns && c != NULL && !busy;
             c = c->c_next) {
            if (conn_io(c) > 0) {
                busy = c;
            }
        }
        if (w == 0 && busy == NULL) {
            tp__mtx_unlock(&a->a_mtx);
            return true;
        }
        if (tp__cv_wait_until(&a->a_quiet_cv, &a->a_mtx, deadline) ||
            tp__now_ns() < deadline) {
            continue;
        }
        // The deadline passed: say who is still busy (looked at again,
        // the last wake-up may have been the last operation).
        w = atomic_load_explicit(&a->a_writers, memory_order_acquire);
        size_t nbusy = 0;
        for (const ag_conn *c = a->a_conns; conns && c != NULL; c = c->c_next) {
            long ops = conn_io(c);
            if (ops == 0) {
                continue;
            }
            char who[AG_MAX_URL + 160];
            tp__ag_conn_describe(c, who, sizeof(who));
            TP_LOG_ERROR("TP-RPC-SHUTDOWN",
                         "rpc %s: the pipe %s %s did not close by the "
                         "shutdown deadline (%ld operations pending); "
                         "leaving it",
                         ag_name(a), c->c_outgoing ? "to" : "from", who, ops);
            nbusy++;
        }
        if (w > 0) {
            TP_LOG_ERROR("TP-RPC-SHUTDOWN",
                         "rpc %s: %ld threads still inside a pipe call at the "
                         "shutdown deadline; leaving the pipes",
                         ag_name(a), w);
        }
        tp__mtx_unlock(&a->a_mtx);
        return w == 0 && nbusy == 0;
    }
}

// Stops everything: pending calls fail with @why (borrowed, may be NULL
// for a generic message), pipes close, timer, pool and context end, each
// wait bounded by @deadline (at least AG_TEARDOWN_MIN_MS from now). The
// caller then drops its reference.
static void
agent_teardown(tp_agent *a, const char *why, uint64_t deadline)
{
    ag_call *all = NULL;

    deadline = TP_MAX(deadline, tp__deadline_after_ms(AG_TEARDOWN_MIN_MS));
    tp__mtx_lock(&a->a_mtx);
    a->a_state = AG_CLOSED;
    for (size_t i = 0; a->a_table != NULL && i < a->a_table_size; i++) {
        while (a->a_table[i] != NULL) {
            ag_call *c = a->a_table[i];
            tp__ag_pending_unlink_locked(a, c, TP_ECLOSED);
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
        tp__ag_call_finish(
            c, NULL,
            tp__error_new(TP_ECLOSED, 0, NULL,
                          "rpc \"%s\" from %s to %s (rank %d): %s",
                          c->c_fn_name, ag_name(a), c->c_peer->p_info.name,
                          c->c_peer->p_info.rank,
                          why != NULL ? why
                                      : "the agent shut down before "
                                        "the reply"));
    }
    // Threads that passed the state check are inside a pipe call; the
    // pipes must outlive it.
    bool quiet = agent_wait_quiet(a, deadline, false);
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
                         ag_name(a), AG_TEARDOWN_MS);
            a->a_pool_leaked = true;
        }
        a->a_pool = NULL;
    }
    if (a->a_pool_leaked) {
        return; // the context stays for their threads
    }
    // Handlers that finished after the pool stopped may still write, and
    // the pipes closed above end their reads and writes: wait for all of
    // it (counts and a condition, no polling) before the context goes.
    quiet = quiet && agent_wait_quiet(a, deadline, true);
    if (!quiet) {
        // A callback of a pipe that did not close may still run and touch
        // its connection and the agent: neither may be freed, ever.
        atomic_fetch_add_explicit(&a->a_refs, 1, memory_order_relaxed);
        return;
    }
    if (a->a_ctx != NULL) {
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
    if (name == NULL || !ag_worker_name_valid(name, nlen)) {
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
    tp__cv_init(&a->a_quiet_cv);
    tp_status st = options_check(a, o, err_p);
    if (st == TP_OK) {
        st = tp__ag_fr_init(a, err_p);
    }
    if (st != TP_OK) {
        goto fail_early;
    }
    // The URL first, then -1 from the environment (every init method).
    st = tp__store_resolve_ranks(a->a_init_method, &rank, &world_size, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "rpc init of %s", name);
        goto fail_early;
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
    a->a_gen = -1;
    a->a_peers = tp__zalloc((size_t)world_size * sizeof(ag_peer));
    a->a_table_size = 64;
    a->a_table = tp__zalloc(a->a_table_size * sizeof(ag_call *));
    if (a->a_peers == NULL || a->a_table == NULL ||
        tp_aio_create(tp__ag_accept_cb, a, &a->a_accept_aio) != TP_OK) {
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
    int rc = pthread_create(&a->a_timer, NULL, tp__ag_timer_main, a);
    if (rc != 0) {
        st = tp__error_errno(err_p, rc, "rpc init of %s: timer thread", name);
        goto fail;
    }
    a->a_timer_started = true;
    st = tp__ag_rendezvous(a, deadline, err_p);
    if (st == TP_OK) {
        st = tp__ag_devmaps_check_peers(a, deadline, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "rpc init of %s (rank %d)", name, rank);
        }
    }
    if (st != TP_OK) {
        goto fail;
    }
    // The protocols above the agent (RRefs, ...) are in place before the
    // first message can arrive.
    st = tp__ag_protos_attach(a, err_p);
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
    agent_teardown(a, "init failed", deadline);
    tp__ag_protos_detach(a);
    tp_store_close(a->a_store);
    a->a_store = NULL;
    tp__ag_agent_unref(a);
    return st;
fail_early:
    tp_store_close(a->a_store);
    tp_aio_destroy(a->a_accept_aio);
    a->a_accept_aio = NULL;
    tp__ag_agent_unref(a);
    return st;
}

// Graceful: every worker waits for its own calls to end, then all agree
// (through the store) that no call is outstanding anywhere and nothing
// happened since the previous round (PyTorch's join + sync of call counts).
static tp_status
shutdown_graceful(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    uint64_t prev_activity = UINT64_MAX;
    bool begun = false;
    for (int round = 0;; round++) {
        tp__mtx_lock(&a->a_mtx);
        while (a->a_npending > 0) {
            if (!tp__cv_wait_until(&a->a_idle_cv, &a->a_mtx, deadline) &&
                a->a_npending > 0) {
                size_t n = a->a_npending;
                tp__mtx_unlock(&a->a_mtx);
                return tp__error_set(err_p, TP_ETIMEDOUT,
                                     "timed out after %lld ms waiting for %zu "
                                     "calls of this worker to end",
                                     (long long)a->a_opts.shutdown_timeout_ms,
                                     n);
            }
        }
        tp__mtx_unlock(&a->a_mtx);
        uint64_t pending = 0, activity = 0;
        tp_status st = tp__ag_shutdown_round(a, round, deadline, &pending,
                                             &activity, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (pending == 0 && activity == prev_activity) {
            if (begun) {
                return TP_OK;
            }
            // Every worker is here and idle (all see the same round, so
            // all get here together). Now the protocols let go of what
            // the program still holds (PyTorch deletes the user RRefs at
            // this point); the rounds go on until that settled too.
            begun = true;
            tp__ag_proto_shutdown_begin(a);
            prev_activity = UINT64_MAX;
            continue;
        }
        prev_activity = activity;
        if (pending > 0) {
            // Messages are still in flight somewhere (calls, protocol
            // work): give them a moment rather than spin on the store.
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (tp__now_ns() >= deadline) {
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "timed out after %lld ms waiting for the "
                                 "calls of every worker to end",
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
                           ag_name(a), a->a_rank);
        }
    }
    tp__ag_proto_shutdown_end(a, graceful && st == TP_OK);
    agent_teardown(a,
                   graceful ? "the agent shut down before the reply"
                            : "the agent was shut down (not graceful) "
                              "before the reply",
                   deadline);
    // No hook runs any more: the pool and the pipes are gone.
    tp__ag_protos_detach(a);
    // The store server lives in rank 0's process: rank 0 closes it after
    // every rank that took part in the shutdown said it is done with it
    // (graceful only; bounded). When the agreement failed, the others may
    // still be waiting for their own deadline: rank 0 gives them one more
    // shutdown timeout, so they fail with their own timeout naming the
    // missing worker rather than with a closed store.
    if (graceful) {
        tp__ag_rendezvous_exit(
            a, st == TP_OK
                   ? deadline
                   : tp__deadline_after_ms(a->a_opts.shutdown_timeout_ms));
    }
    tp_store_close(a->a_store);
    a->a_store = NULL;
    tp__ag_agent_unref(a);
    return st;
}
