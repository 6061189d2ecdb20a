/* SPDX-License-Identifier: Apache-2.0 */
/* pg.c - process groups (collectives.h): init through the store, subgroups,
 * argument checks, work handles, the per-group order of collectives, the
 * choice of engine (shm.c on one host, algo.c over pipes otherwise, NCCL
 * for CUDA tensors), failure propagation and TP_DEBUG_COLLECTIVES.
 *
 * Order: a group runs one collective at a time. A blocking call runs on
 * the caller's thread when nothing is queued before it; asynchronous calls
 * are queued for the group's thread (started on first use), and a
 * blocking call issued behind them waits for its turn there. Every
 * collective gets the next sequence number of its group when it starts, so
 * the same collective has the same number on every member: the pipe
 * engine's messages are tagged with it.
 *
 * Failure: the first error of a collective breaks the group (kept in
 * g_broken; later collectives fail with it at once). A member's death
 * fails the sends and receives that involve it (p2p.c: pipe errors and
 * probes); on the shm engine every waiter watches every member's pid. A
 * rank whose collective failed on the pipe engine tells the other members
 * with an abort message, so ranks waiting on a live rank that gave up do
 * not wait for their deadline. A member that destroyed its group after its
 * last collective breaks nothing.
 *
 * Locks: w_mtx (world's group list) > g_mtx (one group's queue and
 * state) > wk_mtx (one work). The abort callback takes w_mtx then
 * g_mtx. */
#include <tpipe/collectives.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/algo.h"
#include "collectives/coll.h"
#include "collectives/nccl.h"
#include "collectives/p2p.h"
#include "collectives/reduce.h"
#include "collectives/shm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/list.h"
#include "core/log.h"
#include "core/platform.h"
#include "store/store_int.h"

#define PG_KEY_PREFIX      "tp.pg/"
#define PG_DESC_BYTES      32
#define PG_FINISH_GRACE_MS 5000

struct tp_work {
    tp_pg *wk_pg;
    atomic_int wk_refs;
    bool wk_p2p;
    tp__req *wk_req;
    int wk_peer; // p2p: group rank or TP_ANY_SOURCE
    bool wk_send;
    tp__coll_args wk_args;
    tp_reduce_op wk_op; // as asked (avg)
    size_t *wk_splits;  // all_to_all: 4n entries behind wk_args' pointers
    void *wk_in_copy;   // an input that overlapped the output
    tp_tensor *wk_t1;
    tp_tensor *wk_t2;
    bool wk_cuda;
    bool wk_local; // on the stack of a blocking call: no lock, no free
    uint64_t wk_deadline_ns;
    tp_mtx wk_mtx;
    tp_cv wk_cv;
    bool wk_done;
    tp_status wk_st;
    tp_error *wk_err;
    int wk_source;         // group rank
    tp_list_node wk_qnode; // in its group's g_queue while queued
    // point-to-point works are listed in their world (w_works, under
    // w_mtx) from posting until freed, so that destroying a group can
    // finish them and the p2p layer never outlives their requests
    _Atomic(tp_pg *) wk_world;
    tp_list_node wk_lnode; // in w_works
};

struct tp_pg {
    tp_pg *g_world; // itself for the world group
    char g_name[64];
    char g_what[128]; // "process group world (rank 1 of 4)"
    int g_rank;
    int g_size;
    int *g_wranks; // group rank -> world rank
    int *g_granks; // world rank -> group rank or -1 (world-size entries)
    uint64_t g_gid;
    char g_prefix[160]; // store keys of this group
    int64_t g_timeout_ms;
    tp_config g_cfg;
    tp__shm *g_shm;
    const char *g_engine;
    tp__nccl_comm *g_nccl;
    void *g_scratch; // the pipe engine's, kept between collectives
    size_t g_scratch_len;
    int g_nccl_device;
    // queue and state
    tp_mtx g_mtx;
    tp_cv g_cv;
    tp_list g_queue; // async collectives (tp_work), in issue order
    bool g_busy;
    bool g_stop;
    bool g_thread_started;
    pthread_t g_thread;
    uint64_t g_seq;
    tp_error *g_broken;
    atomic_bool g_is_broken; // g_broken != NULL, read without the lock
    atomic_int g_waiters;    // threads in tp_work_wait on a work of it
    tp_pg *g_next;           // in the world's list
    // world only
    tp_store *w_store;
    tp__p2p *w_p2p;
    tp_mtx w_mtx;
    tp_pg *w_groups; // every live group, the world first
    int w_nsub;
    int w_ngroups_made;
    char w_prefix[64];
    struct pg_set {
        uint64_t hash;
        int count;
    } * w_sets;
    int w_nsets;
    tp_list w_works; // point-to-point works (see tp_work)
    // aborts for groups not (yet) listed here: a member may give up
    // while this rank is still inside tp_pg_new_group
    struct pg_abort {
        uint64_t gid;
        int from;
        char reason[256];
    } w_aborts[16];
    int w_naborts;
};

// ---- options
// --------------------------------------------------------------------

void
tp_pg_options_init(tp_pg_options *o)
{
    memset(o, 0, sizeof(*o));
    o->timeout_ms = TP_TIMEOUT_DEFAULT;
    o->init_timeout_ms = TP_TIMEOUT_DEFAULT;
}

static int64_t
ms_left(uint64_t deadline)
{
    if (deadline == UINT64_MAX) {
        return 0;
    }
    uint64_t now = tp__now_ns();
    if (now >= deadline) {
        return 1;
    }
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > INT64_MAX ? INT64_MAX : (int64_t)ms;
}

// ---- small accessors
// ---------------------------------------------------------------

int
tp_pg_rank(const tp_pg *pg)
{
    return pg != NULL ? pg->g_rank : -1;
}

int
tp_pg_size(const tp_pg *pg)
{
    return pg != NULL ? pg->g_size : 0;
}

int
tp_pg_world_rank(const tp_pg *pg, int group_rank)
{
    if (pg == NULL || group_rank < 0 || group_rank >= pg->g_size) {
        return -1;
    }
    return pg->g_wranks[group_rank];
}

const char *
tp_pg_engine(const tp_pg *pg)
{
    return pg != NULL ? pg->g_engine : "";
}

const char *
tp_pg_name(const tp_pg *pg)
{
    return pg != NULL ? pg->g_name : "";
}

// ---- failure
// -----------------------------------------------------------------------

// Breaks @g with @err (the first error wins). Takes g_mtx.
static void
group_break(tp_pg *g, const tp_error *err)
{
    tp__mtx_lock(&g->g_mtx);
    if (g->g_broken == NULL) {
        g->g_broken = tp_error_ref(err);
        atomic_store_explicit(&g->g_is_broken, true, memory_order_release);
    }
    tp__cv_broadcast(&g->g_cv);
    tp__mtx_unlock(&g->g_mtx);
}

static tp_status
group_check(void *arg, tp_error **err_p)
{
    tp_pg *g = arg;
    if (!atomic_load_explicit(&g->g_is_broken, memory_order_acquire)) {
        return TP_OK;
    }
    tp__mtx_lock(&g->g_mtx);
    tp_error *e = tp_error_ref(g->g_broken);
    tp__mtx_unlock(&g->g_mtx);
    if (e == NULL) {
        return TP_OK;
    }
    tp_status st = tp_error_status(e);
    if (err_p != NULL) {
        *err_p = e;
    } else {
        tp_error_unref(e);
    }
    return st;
}

// p2p callback: world rank @from aborted group @gid.
static void
on_abort(void *arg, uint64_t gid, int from, const char *reason)
{
    tp_pg *w = arg;
    bool found = false;
    tp__mtx_lock(&w->w_mtx);
    for (tp_pg *g = w->w_groups; g != NULL; g = g->g_next) {
        if (g->g_gid != gid || g->g_granks[from] < 0) {
            continue;
        }
        found = true;
        tp_error *e = tp_error_create(
            TP_EREMOTE, NULL, "%s: rank %d (world rank %d) gave up: %s",
            g->g_what, g->g_granks[from], from, reason);
        group_break(g, e);
        tp_error_unref(e);
    }
    if (!found) {
        // Kept (the last 16) for a group this rank is still creating.
        struct pg_abort *a = &w->w_aborts[w->w_naborts % 16];
        a->gid = gid;
        a->from = from;
        snprintf(a->reason, sizeof(a->reason), "%s", reason);
        w->w_naborts++;
    }
    tp__mtx_unlock(&w->w_mtx);
}

// ---- store helpers
// -------------------------------------------------------------------

// Publishes @val under <prefix><stem><rank of @me> and reads the value of
// each of the @n ranks (world ranks @wr, or 0..n-1 if NULL) into vals[i]
// (free() each; vals[me] = copy of @val). On timeout, names every rank
// still missing.
static tp_status
store_exchange(tp_pg *w, const char *prefix, const char *stem, int n, int me,
               const int *wr, const char *val, char **vals, uint64_t deadline,
               const char *what, tp_error **err_p)
{
    char key[256];
    snprintf(key, sizeof(key), "%s%s%d", prefix, stem, me);
    tp_status st = tp_store_set(w->w_store, key, val, strlen(val),
                                ms_left(deadline), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s", what);
    }
    for (int i = 0; i < n; i++) {
        if (i == me) {
            vals[i] = strdup(val);
            if (vals[i] == NULL) {
                return tp__error_set(err_p, TP_ENOMEM, "%s", what);
            }
            continue;
        }
        snprintf(key, sizeof(key), "%s%s%d", prefix, stem, i);
        void *v = NULL;
        size_t len = 0;
        tp_error *e = NULL;
        st = tp_store_get(w->w_store, key, ms_left(deadline), &v, &len, &e);
        if (st == TP_ETIMEDOUT) {
            char missing[256];
            size_t off = 0;
            for (int m = i; m < n && off + 16 < sizeof(missing); m++) {
                if (m == me) {
                    continue;
                }
                snprintf(key, sizeof(key), "%s%s%d", prefix, stem, m);
                void *mv = NULL;
                size_t ml;
                tp_error *me_err = NULL;
                if (m > i && tp_store_get(w->w_store, key, 1, &mv, &ml,
                                          &me_err) == TP_OK) {
                    free(mv);
                    continue;
                }
                tp_error_unref(me_err);
                off += (size_t)snprintf(missing + off, sizeof(missing) - off,
                                        "%s%d", off > 0 ? ", " : "",
                                        wr != NULL ? wr[m] : m);
            }
            tp__error_set(err_p, TP_ETIMEDOUT,
                          "%s: world ranks %s did not join through %s before "
                          "the deadline: %s",
                          what, missing, tp_store_addr(w->w_store),
                          tp_error_message(e));
            tp_error_unref(e);
            return TP_ETIMEDOUT;
        }
        if (st != TP_OK) {
            tp__error_set(err_p, st, "%s: %s", what, tp_error_message(e));
            tp_error_unref(e);
            return st;
        }
        vals[i] = v; // NUL-terminated by the store
    }
    return TP_OK;
}

static void
free_vals(char **vals, int n)
{
    if (vals != NULL) {
        for (int i = 0; i < n; i++) {
            free(vals[i]);
        }
        free(vals);
    }
}

// ---- groups
// -------------------------------------------------------------------------

static tp_pg *
group_alloc(int size, int world_size)
{
    tp_pg *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        return NULL;
    }
    g->g_wranks = calloc((size_t)size, sizeof(int));
    g->g_granks = malloc((size_t)world_size * sizeof(int));
    if (g->g_wranks == NULL || g->g_granks == NULL) {
        free(g->g_wranks);
        free(g->g_granks);
        free(g);
        return NULL;
    }
    for (int i = 0; i < world_size; i++) {
        g->g_granks[i] = -1;
    }
    g->g_size = size;
    TP_LIST_INIT(&g->g_queue, tp_work, wk_qnode);
    TP_LIST_INIT(&g->w_works, tp_work, wk_lnode);
    tp__mtx_init(&g->g_mtx);
    tp__cv_init(&g->g_cv);
    g->g_engine = "pipe";
    return g;
}

static void
group_free(tp_pg *g)
{
    tp__shm_close(g->g_shm);
    tp__nccl_comm_destroy(g->g_nccl);
    free(g->g_scratch);
    tp_error_unref(g->g_broken);
    tp__cv_fini(&g->g_cv);
    tp__mtx_fini(&g->g_mtx);
    free(g->g_wranks);
    free(g->g_granks);
    free(g);
}

// Chooses the engine of a new group: every member calls this at the same
// point of its creation.
static tp_status
group_engine(tp_pg *w, tp_pg *g, uint64_t deadline, tp_error **err_p)
{
    g->g_engine = "pipe";
    if (g->g_cfg.coll_engine == TP_COLL_ENGINE_PIPE) {
        return TP_OK;
    }
    char why[512] = "";
    tp__shm_setup s = {
        .store = w->w_store,
        .prefix = g->g_prefix,
        .rank = g->g_rank,
        .size = g->g_size,
        .world_ranks = g->g_wranks,
        .group = g->g_name,
        .slot_bytes = (size_t)g->g_cfg.coll_shm_slot,
        .deadline_ns = deadline,
    };
    tp_status st = tp__shm_open(&s, &g->g_shm, why, sizeof(why), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: shared-memory engine", g->g_what);
    }
    if (g->g_shm != NULL) {
        g->g_engine = "shm";
        return TP_OK;
    }
    if (g->g_cfg.coll_engine == TP_COLL_ENGINE_SHM) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: TP_COLL_ENGINE=shm, but the shared-memory "
                             "engine cannot be used: %s",
                             g->g_what, why);
    }
    TP_LOG_INFO("TP-PG-ENGINE", "%s: collectives on pipes: %s", g->g_what, why);
    return TP_OK;
}

static void
group_set_what(tp_pg *g)
{
    snprintf(g->g_what, sizeof(g->g_what), "process group %s (rank %d of %d)",
             g->g_name, g->g_rank, g->g_size);
}

static tp_status
load_config(tp_pg *g, const tp_pg_options *o, tp_error **err_p)
{
    tp_error *e = NULL;
    if (tp__config_load(&g->g_cfg, &e) != TP_OK) {
        tp__error_set(err_p, TP_EINVAL, "process group: %s",
                      tp_error_message(e));
        tp_error_unref(e);
        return TP_EINVAL;
    }
    if (o->timeout_ms < TP_TIMEOUT_DEFAULT ||
        o->init_timeout_ms < TP_TIMEOUT_DEFAULT) {
        return tp__error_set(err_p, TP_EINVAL,
                             "process group: timeout_ms %" PRId64
                             " / init_timeout_ms %" PRId64
                             ": -1 (default), 0 (none) or > 0",
                             o->timeout_ms, o->init_timeout_ms);
    }
    g->g_timeout_ms = o->timeout_ms == TP_TIMEOUT_DEFAULT
                          ? g->g_cfg.coll_timeout_ms
                          : o->timeout_ms;
    return TP_OK;
}

tp_status
tp_pg_init(const char *init_method, int rank, int world_size,
           const tp_pg_options *o, tp_pg **pg_p, tp_error **err_p)
{
    tp_pg_options defaults;
    if (o == NULL) {
        tp_pg_options_init(&defaults);
        o = &defaults;
    }
    if (pg_p == NULL || init_method == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_init: init_method and pg_p are required");
    }
    *pg_p = NULL;
    tp_store *store = NULL;
    tp_config cfg;
    tp_error *e = NULL;
    if (tp__config_load(&cfg, &e) != TP_OK) {
        tp__error_set(err_p, TP_EINVAL, "tp_pg_init: %s", tp_error_message(e));
        tp_error_unref(e);
        return TP_EINVAL;
    }
    int64_t init_ms = o->init_timeout_ms == TP_TIMEOUT_DEFAULT
                          ? cfg.coll_init_timeout_ms
                          : o->init_timeout_ms;
    if (init_ms < 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_init: init_timeout_ms %" PRId64
                             ": -1 (default), 0 (none) or > 0",
                             init_ms);
    }
    if (strncmp(init_method, "env://", 6) == 0 &&
        (rank < 0 || world_size < 0)) {
        int r, ws, l;
        tp_status st = tp__store_env_ranks(&r, &ws, &l, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "tp_pg_init");
        }
        rank = rank < 0 ? r : rank;
        world_size = world_size < 0 ? ws : world_size;
    }
    if (world_size < 1 || world_size > TP_PG_MAX_WORLD || rank < 0 ||
        rank >= world_size) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_init: rank %d of world size %d (world size "
                             "1..%d, rank 0..size-1)",
                             rank, world_size, TP_PG_MAX_WORLD);
    }
    uint64_t deadline = tp__deadline_after_ms(init_ms);
    tp_status st =
        tp_store_open(init_method, rank, world_size, init_ms, &store, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "tp_pg_init (rank %d)", rank);
    }
    tp_pg *w = group_alloc(world_size, world_size);
    if (w == NULL) {
        tp_store_close(store);
        return tp__error_set(err_p, TP_ENOMEM, "tp_pg_init");
    }
    w->g_world = w;
    w->w_store = store;
    tp__mtx_init(&w->w_mtx);
    w->g_rank = rank;
    for (int i = 0; i < world_size; i++) {
        w->g_wranks[i] = i;
        w->g_granks[i] = i;
    }
    snprintf(w->g_name, sizeof(w->g_name), "%s",
             o->name != NULL ? o->name : "world");
    group_set_what(w);
    char **vals = NULL;
    st = load_config(w, o, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    // A store may outlive a job: each job's keys get their own generation.
    int64_t joins = 0;
    st = tp_store_add(store, PG_KEY_PREFIX "joins", 1, ms_left(deadline),
                      &joins, err_p);
    if (st != TP_OK) {
        tp__error_wrap(err_p, st, "%s: init", w->g_what);
        goto fail;
    }
    snprintf(w->w_prefix, sizeof(w->w_prefix), PG_KEY_PREFIX "%" PRId64 "/",
             (joins - 1) / world_size);
    snprintf(w->g_prefix, sizeof(w->g_prefix), "%sworld/", w->w_prefix);
    tp_context_options co;
    tp_context_options_init(&co);
    char cname[96];
    snprintf(cname, sizeof(cname), "pg-%s-rank%d", w->g_name, rank);
    co.name = cname;
    co.transports = o->transports;
    co.channels = o->channels;
    const char *saddr = tp_store_addr(store);
    bool loopback = w->g_cfg.socket_ifname[0] == '\0' &&
                    w->g_cfg.socket_addr[0] == '\0' && saddr != NULL &&
                    strncmp(saddr, "tcp://127.", 10) == 0;
    st = tp__p2p_create(&co, loopback, rank, world_size, w->g_what, &w->w_p2p,
                        err_p);
    if (st != TP_OK) {
        goto fail;
    }
    // A dead rank fails what waits on it (and later operations with it);
    // the collective that notices breaks its group and tells the others.
    // A rank that left after its last collective breaks nothing.
    tp__p2p_set_callbacks(w->w_p2p, on_abort, NULL, w);
    vals = calloc((size_t)world_size, sizeof(char *));
    if (vals == NULL) {
        st = tp__error_set(err_p, TP_ENOMEM, "%s: init", w->g_what);
        goto fail;
    }
    char what[160];
    snprintf(what, sizeof(what), "%s: init", w->g_what);
    st = store_exchange(w, w->w_prefix, "addr/", world_size, rank, NULL,
                        tp__p2p_urls(w->w_p2p), vals, deadline, what, err_p);
    for (int i = 0; st == TP_OK && i < world_size; i++) {
        st = tp__p2p_set_peer(w->w_p2p, i, vals[i], err_p);
    }
    free_vals(vals, world_size);
    if (st != TP_OK) {
        goto fail;
    }
    w->w_groups = w;
    tp__p2p_start(w->w_p2p);
    st = group_engine(w, w, deadline, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    TP_LOG_INFO("TP-PG-INIT", "%s: engine %s, store %s", w->g_what, w->g_engine,
                saddr);
    *pg_p = w;
    return TP_OK;
fail:
    tp__p2p_destroy(w->w_p2p);
    tp__mtx_fini(&w->w_mtx);
    free(w->w_sets);
    group_free(w);
    tp_store_close(store);
    return st;
}

static int
cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

tp_status
tp_pg_new_group(tp_pg *world, const int *ranks, int n, const tp_pg_options *o,
                tp_pg **pg_p, tp_error **err_p)
{
    tp_pg_options defaults;
    if (o == NULL) {
        tp_pg_options_init(&defaults);
        o = &defaults;
    }
    if (pg_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "tp_pg_new_group: pg_p is NULL");
    }
    *pg_p = NULL;
    if (world == NULL || world->g_world != world) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_new_group: needs the world group");
    }
    tp_pg *w = world;
    if (n < 1 || n > w->g_size || ranks == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: new_group of %d ranks (1..%d)", w->g_what, n,
                             w->g_size);
    }
    int *sorted = malloc((size_t)n * sizeof(int));
    if (sorted == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: new_group", w->g_what);
    }
    memcpy(sorted, ranks, (size_t)n * sizeof(int));
    qsort(sorted, (size_t)n, sizeof(int), cmp_int);
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (sorted[i] < 0 || sorted[i] >= w->g_size ||
            (i > 0 && sorted[i] == sorted[i - 1])) {
            tp__error_set(err_p, TP_EINVAL, "%s: new_group: rank %d is %s",
                          w->g_what, sorted[i],
                          sorted[i] < 0 || sorted[i] >= w->g_size
                              ? "not in the world"
                              : "listed twice");
            free(sorted);
            return TP_EINVAL;
        }
        if (sorted[i] == w->g_rank) {
            me = i;
        }
    }
    if (me < 0) {
        free(sorted);
        return TP_OK; // not a member: no handle, nothing to wait for
    }
    // The id: the member set and how many groups of that set this rank
    // made before (members create them in the same order).
    uint64_t set_hash = tp__hash64(sorted, (size_t)n * sizeof(int));
    tp__mtx_lock(&w->w_mtx);
    int count = 0;
    int si = 0;
    for (; si < w->w_nsets; si++) {
        if (w->w_sets[si].hash == set_hash) {
            break;
        }
    }
    if (si == w->w_nsets) {
        struct pg_set *ns =
            realloc(w->w_sets, (size_t)(w->w_nsets + 1) * sizeof(*ns));
        if (ns == NULL) {
            tp__mtx_unlock(&w->w_mtx);
            free(sorted);
            return tp__error_set(err_p, TP_ENOMEM, "%s: new_group", w->g_what);
        }
        w->w_sets = ns;
        w->w_sets[si].hash = set_hash;
        w->w_sets[si].count = 0;
        w->w_nsets++;
    }
    count = w->w_sets[si].count++;
    int index = ++w->w_ngroups_made;
    tp__mtx_unlock(&w->w_mtx);
    uint64_t idbuf[2] = {set_hash, (uint64_t)count};
    uint64_t gid = tp__hash64(idbuf, sizeof(idbuf)) | 1u;

    tp_pg *g = group_alloc(n, w->g_size);
    if (g == NULL) {
        free(sorted);
        return tp__error_set(err_p, TP_ENOMEM, "%s: new_group", w->g_what);
    }
    memcpy(g->g_wranks, sorted, (size_t)n * sizeof(int));
    free(sorted);
    for (int i = 0; i < n; i++) {
        g->g_granks[g->g_wranks[i]] = i;
    }
    g->g_world = w;
    g->g_rank = me;
    g->g_gid = gid;
    if (o->name != NULL) {
        snprintf(g->g_name, sizeof(g->g_name), "%s", o->name);
    } else {
        snprintf(g->g_name, sizeof(g->g_name), "group%d", index);
    }
    group_set_what(g);
    snprintf(g->g_prefix, sizeof(g->g_prefix), "%sgroup/%016" PRIx64 "/",
             w->w_prefix, gid);
    tp_status st = load_config(g, o, err_p);
    if (st != TP_OK) {
        group_free(g);
        return st;
    }
    int64_t init_ms = o->init_timeout_ms == TP_TIMEOUT_DEFAULT
                          ? g->g_cfg.coll_init_timeout_ms
                          : o->init_timeout_ms;
    uint64_t deadline = tp__deadline_after_ms(init_ms);
    // Every member has called new_group: then it is live on all of them.
    char **vals = calloc((size_t)n, sizeof(char *));
    if (vals == NULL) {
        group_free(g);
        return tp__error_set(err_p, TP_ENOMEM, "%s: new_group", w->g_what);
    }
    char what[192];
    snprintf(what, sizeof(what), "%s: new_group", g->g_what);
    char mine[32];
    snprintf(mine, sizeof(mine), "%d", g->g_wranks[me]);
    st = store_exchange(w, g->g_prefix, "join/", n, me, g->g_wranks, mine, vals,
                        deadline, what, err_p);
    free_vals(vals, n);
    if (st == TP_OK) {
        // Listed before the engine is chosen: aborts and failures reach it.
        tp__mtx_lock(&w->w_mtx);
        g->g_next = w->w_groups->g_next;
        w->w_groups->g_next = g;
        w->w_nsub++;
        int na = w->w_naborts < 16 ? w->w_naborts : 16;
        for (int i = 0; i < na; i++) {
            const struct pg_abort *ab = &w->w_aborts[i];
            if (ab->gid == gid && g->g_granks[ab->from] >= 0) {
                tp_error *e = tp_error_create(
                    TP_EREMOTE, NULL, "%s: rank %d (world rank %d) gave up: %s",
                    g->g_what, g->g_granks[ab->from], ab->from, ab->reason);
                group_break(g, e);
                tp_error_unref(e);
            }
        }
        tp__mtx_unlock(&w->w_mtx);
        st = group_engine(w, g, deadline, err_p);
        if (st != TP_OK) {
            tp_pg_destroy(g);
            return st;
        }
    } else {
        group_free(g);
        return st;
    }
    *pg_p = g;
    return TP_OK;
}

// ---- works
// --------------------------------------------------------------------------

static tp_work *
work_new(tp_pg *g)
{
    tp_work *wk = calloc(1, sizeof(*wk));
    if (wk == NULL) {
        return NULL;
    }
    wk->wk_pg = g;
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
    free(wk->wk_splits);
    free(wk->wk_in_copy);
    if (wk->wk_local) {
        return; // on a caller's stack; no lock, error or request
    }
    tp_error_unref(wk->wk_err);
    tp__cv_fini(&wk->wk_cv);
    tp__mtx_fini(&wk->wk_mtx);
    free(wk);
}

static void
work_unref(tp_work *wk)
{
    if (wk == NULL) {
        return;
    }
    tp_pg *lw = atomic_load(&wk->wk_world);
    if (lw != NULL) {
        // A listed (point-to-point) work drops its last reference under
        // the world's lock, so finish_p2p_works, which takes references
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
work_complete(tp_work *wk, tp_status st, const tp_error *err, int source)
{
    tp__mtx_lock(&wk->wk_mtx);
    if (!wk->wk_done) {
        wk->wk_st = st;
        wk->wk_err = err != NULL ? tp_error_ref(err) : NULL;
        wk->wk_source = source;
        wk->wk_done = true;
        tp__cv_broadcast(&wk->wk_cv);
    }
    tp__mtx_unlock(&wk->wk_mtx);
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
static void
p2p_work_cb(tp__req *r, void *arg)
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
        work_complete(wk, st, we, gsrc);
        tp_error_unref(we);
    } else {
        work_complete(wk, TP_OK, NULL, gsrc);
    }
    tp_error_unref(e);
    work_unref(wk); // the callback's reference
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
    tp__mtx_lock(&w->wk_mtx);
    tp_pg *g = w->wk_pg;
    bool waiting = !w->wk_done;
    if (waiting) {
        // Counted under the work's lock: a destroy completes the group's
        // works (taking this lock) before it waits for its waiters to
        // leave, so @g stays valid until we do.
        atomic_fetch_add(&g->g_waiters, 1);
    }
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
            tp__p2p_probe(g->g_world->w_p2p, g->g_wranks[w->wk_peer]);
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
        work_complete(w, TP_ETIMEDOUT, we, -1);
        tp_error_unref(we);
        tp_pg *lw = g->g_world;
        tp__mtx_lock(&lw->w_mtx);
        tp__req *r = w->wk_req;
        w->wk_req = NULL;
        tp__mtx_unlock(&lw->w_mtx);
        tp__req_cancel_free(r);
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
    if (waiting) {
        atomic_fetch_sub(&g->g_waiters, 1); // last use of @g
    }
    return st;
}

void
tp_work_free(tp_work *w)
{
    work_unref(w);
}

// ---- argument checks
// -------------------------------------------------------------------

static tp_status
check_tensor(tp_pg *g, const char *op, const char *arg, const tp_tensor *t,
             tp_error **err_p)
{
    if (t == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: %s is NULL", g->g_what,
                             op, arg);
    }
    if (!tp_tensor_is_contiguous(t)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: %s is not contiguous (call "
                             "tp_tensor_contiguous first)",
                             g->g_what, op, arg);
    }
    tp_device d = tp_tensor_device(t);
    if (d.type != TP_DEVICE_CPU && d.type != TP_DEVICE_CUDA) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: %s is on device %d",
                             g->g_what, op, arg, (int)d.type);
    }
    return TP_OK;
}

static tp_status
check_root(tp_pg *g, const char *op, int root, tp_error **err_p)
{
    if (root < 0 || root >= g->g_size) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: root %d is not a rank of the group "
                             "(0..%d)",
                             g->g_what, op, root, g->g_size - 1);
    }
    return TP_OK;
}

// @big (the argument named @big_name) must hold group size x the elements
// of @small (named @small_name), in its dtype and on its kind of device.
static tp_status
check_blocks(tp_pg *g, const char *op, const tp_tensor *big,
             const char *big_name, const tp_tensor *small,
             const char *small_name, tp_error **err_p)
{
    if (tp_tensor_dtype(big) != tp_tensor_dtype(small)) {
        return tp__error_set(
            err_p, TP_EINVAL, "%s: %s: %s has dtype %s, %s has dtype %s",
            g->g_what, op, big_name, tp_dtype_name(tp_tensor_dtype(big)),
            small_name, tp_dtype_name(tp_tensor_dtype(small)));
    }
    if (tp_tensor_device(big).type != tp_tensor_device(small).type) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: %s and %s are on different devices",
                             g->g_what, op, big_name, small_name);
    }
    int64_t want = tp_tensor_numel(small) * g->g_size;
    if (tp_tensor_numel(big) != want) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "%s: %s: %s has %" PRId64 " elements, expected %" PRId64
            " (group size %d x the %" PRId64 " elements of %s)",
            g->g_what, op, big_name, tp_tensor_numel(big), want, g->g_size,
            tp_tensor_numel(small), small_name);
    }
    return TP_OK;
}

static tp_status
check_op(tp_pg *g, const char *opname, tp_reduce_op op, tp_dtype dt,
         tp_error **err_p)
{
    tp_status st = tp__reduce_check(op, dt, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: %s", g->g_what, opname);
    }
    return TP_OK;
}

static bool
is_cuda(const tp_tensor *t)
{
    return t != NULL && tp_tensor_device(t).type == TP_DEVICE_CUDA;
}

// ---- running a collective
// -----------------------------------------------------------------

static void
desc_encode(uint8_t *d, const tp__coll_args *a, tp_reduce_op op, uint64_t seq)
{
    memset(d, 0, PG_DESC_BYTES);
    uint32_t v[4] = {(uint32_t)a->kind, (uint32_t)a->dtype, (uint32_t)op,
                     (uint32_t)a->root};
    memcpy(d, v, sizeof(v));
    uint64_t count = a->kind == TP__COLL_ALL_TO_ALL ? 0 : a->count;
    memcpy(d + 16, &count, 8);
    memcpy(d + 24, &seq, 8);
}

static int
desc_str(const uint8_t *d, char *buf, size_t len)
{
    uint32_t v[4];
    uint64_t count, seq;
    memcpy(v, d, sizeof(v));
    memcpy(&count, d + 16, 8);
    memcpy(&seq, d + 24, 8);
    tp__coll_kind k = (tp__coll_kind)v[0];
    const char *dt =
        v[1] < TP_DTYPE_COUNT ? tp_dtype_name((tp_dtype)v[1]) : "?";
    switch (k) {
    case TP__COLL_BARRIER:
        return snprintf(buf, len, "barrier (#%" PRIu64 ")", seq);
    case TP__COLL_ALL_REDUCE:
    case TP__COLL_REDUCE_SCATTER:
        return snprintf(buf, len,
                        "%s(%s, count %" PRIu64 ", op %s) (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count,
                        tp__reduce_op_name((tp_reduce_op)v[2]), seq);
    case TP__COLL_REDUCE:
        return snprintf(
            buf, len,
            "reduce(%s, count %" PRIu64 ", op %s, root %d) (#%" PRIu64 ")", dt,
            count, tp__reduce_op_name((tp_reduce_op)v[2]), (int)v[3], seq);
    case TP__COLL_BROADCAST:
    case TP__COLL_GATHER:
    case TP__COLL_SCATTER:
        return snprintf(buf, len,
                        "%s(%s, count %" PRIu64 ", root %d) (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count, (int)v[3], seq);
    default:
        return snprintf(buf, len, "%s(%s, count %" PRIu64 ") (#%" PRIu64 ")",
                        tp__coll_kind_name(k), dt, count, seq);
    }
}

// Runs one collective on the group's engine (no debug check).
static tp_status
engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq, uint64_t deadline,
           tp_error **err_p)
{
    if (g->g_shm != NULL) {
        return tp__shm_run(g->g_shm, a, deadline, err_p);
    }
    char what[192];
    snprintf(what, sizeof(what), "%s: %s #%" PRIu64, g->g_what,
             tp__coll_kind_name(a->kind), seq);
    tp__algo c = {
        .p2p = g->g_world->w_p2p,
        .gid = g->g_gid,
        .tag = seq,
        .rank = g->g_rank,
        .size = g->g_size,
        .wranks = g->g_wranks,
        .deadline_ns = deadline,
        .check = group_check,
        .check_arg = g,
        .what = what,
        .allreduce_algo = (int)g->g_cfg.coll_allreduce,
        .bcast_algo = (int)g->g_cfg.coll_bcast,
        .small_max = (size_t)g->g_cfg.coll_small_max,
        .chunk = (size_t)g->g_cfg.coll_chunk,
        .scratch = &g->g_scratch,
        .scratch_len = &g->g_scratch_len,
    };
    return tp__algo_run(&c, a, err_p);
}

// TP_DEBUG_COLLECTIVES: every member's description of this collective (and
// for all_to_all its split sizes) is gathered and compared.
static tp_status
debug_check(tp_pg *g, const tp__coll_args *a, tp_reduce_op op,
            uint64_t deadline, tp_error **err_p)
{
    int n = g->g_size;
    uint8_t mine[PG_DESC_BYTES];
    uint64_t seq = g->g_seq++;
    desc_encode(mine, a, op, g->g_seq);
    uint8_t *all = malloc((size_t)n * PG_DESC_BYTES);
    if (all == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: debug check", g->g_what);
    }
    tp__coll_args ga = {
        .kind = TP__COLL_ALL_GATHER,
        .dtype = TP_U8,
        .in = mine,
        .out = all,
        .count = PG_DESC_BYTES,
    };
    tp_status st = engine_run(g, &ga, seq, deadline, err_p);
    if (st != TP_OK) {
        free(all);
        return st;
    }
    int bad = -1;
    for (int i = 0; i < n && bad < 0; i++) {
        if (memcmp(all + (size_t)i * PG_DESC_BYTES, all, PG_DESC_BYTES) != 0) {
            bad = i;
        }
    }
    if (bad >= 0) {
        char msg[1024];
        size_t off = 0;
        for (int i = 0; i < n && off + 128 < sizeof(msg); i++) {
            off += (size_t)snprintf(msg + off, sizeof(msg) - off,
                                    "%srank %d: ", i > 0 ? "; " : "", i);
            off += (size_t)desc_str(all + (size_t)i * PG_DESC_BYTES, msg + off,
                                    sizeof(msg) - off);
        }
        free(all);
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: collective mismatch (TP_DEBUG_COLLECTIVES): "
                             "%s",
                             g->g_what, msg);
    }
    free(all);
    if (a->kind != TP__COLL_ALL_TO_ALL) {
        return TP_OK;
    }
    // rank i's rcounts[j] must be rank j's scounts[i].
    size_t row = (size_t)n * sizeof(uint64_t);
    uint64_t *sc = malloc(row * (size_t)(n + 1));
    if (sc == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: debug check", g->g_what);
    }
    uint64_t *myrow = sc + (size_t)n * (size_t)n;
    for (int i = 0; i < n; i++) {
        myrow[i] = a->scounts[i];
    }
    tp__coll_args ga2 = {
        .kind = TP__COLL_ALL_GATHER,
        .dtype = TP_U8,
        .in = myrow,
        .out = sc,
        .count = row,
    };
    seq = g->g_seq++;
    st = engine_run(g, &ga2, seq, deadline, err_p);
    if (st == TP_OK) {
        for (int j = 0; j < n; j++) {
            uint64_t theirs = sc[(size_t)j * (size_t)n + (size_t)g->g_rank];
            if (theirs != a->rcounts[j]) {
                st = tp__error_set(err_p, TP_EINVAL,
                                   "%s: all_to_all mismatch "
                                   "(TP_DEBUG_COLLECTIVES): this rank expects "
                                   "%zu elements from rank %d, which sends "
                                   "%" PRIu64,
                                   g->g_what, a->rcounts[j], j, theirs);
                break;
            }
        }
    }
    free(sc);
    return st;
}

static tp_status
nccl_run(tp_pg *g, tp_work *wk, uint64_t deadline, tp_error **err_p)
{
    const tp__coll_args *a = &wk->wk_args;
    char why[256];
    if (!tp__nccl_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: %s of CUDA tensors needs NCCL: %s", g->g_what,
                             tp__coll_kind_name(a->kind), why);
    }
    int dev = tp_tensor_device(wk->wk_t1).index;
    int64_t left = ms_left(deadline);
    if (g->g_nccl == NULL) {
        char prefix[200];
        snprintf(prefix, sizeof(prefix), "%snccl/%" PRIu64 "/", g->g_prefix,
                 g->g_seq);
        tp_status st =
            tp__nccl_comm_create(g->g_world->w_store, prefix, g->g_rank,
                                 g->g_size, dev, left, &g->g_nccl, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "%s: NCCL communicator",
                                  g->g_what);
        }
        g->g_nccl_device = dev;
    } else if (dev != g->g_nccl_device) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: CUDA tensor on device %d, the group's NCCL "
                             "communicator is on device %d",
                             g->g_what, dev, g->g_nccl_device);
    }
    tp_reduce_op op = wk->wk_op;
    switch (a->kind) {
    case TP__COLL_ALL_REDUCE:
        return tp__nccl_all_reduce(g->g_nccl, a->buf, a->buf, a->count,
                                   a->dtype, op, left, err_p);
    case TP__COLL_BROADCAST:
        return tp__nccl_broadcast(g->g_nccl, a->buf, a->buf, a->count, a->dtype,
                                  a->root, left, err_p);
    case TP__COLL_REDUCE:
        return tp__nccl_reduce(g->g_nccl, a->buf, a->buf, a->count, a->dtype,
                               op, a->root, left, err_p);
    case TP__COLL_ALL_GATHER:
        return tp__nccl_all_gather(g->g_nccl, a->in, a->out, a->count, a->dtype,
                                   left, err_p);
    case TP__COLL_REDUCE_SCATTER:
        return tp__nccl_reduce_scatter(g->g_nccl, a->in, a->out, a->count,
                                       a->dtype, op, left, err_p);
    default:
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: %s of CUDA tensors is not supported with "
                             "NCCL; copy them to the CPU",
                             g->g_what, tp__coll_kind_name(a->kind));
    }
}

// Runs @wk: debug check, engine, avg. Breaks the group on error.
static tp_status
coll_exec(tp_pg *g, tp_work *wk, tp_error **err_p)
{
    tp_status st = group_check(g, err_p);
    if (st != TP_OK) {
        return st;
    }
    const tp__coll_args *a = &wk->wk_args;
    uint64_t deadline = wk->wk_deadline_ns;
    bool mismatch = false;
    if (wk->wk_cuda) {
        st = nccl_run(g, wk, deadline, err_p);
    } else {
        if (g->g_cfg.debug_collectives) {
            st = debug_check(g, a, wk->wk_op, deadline, err_p);
            mismatch = st == TP_EINVAL;
        }
        if (st == TP_OK) {
            uint64_t seq = g->g_seq++;
            st = engine_run(g, a, seq, deadline, err_p);
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
        group_break(g, e);
        // Pipe engine: tell the others, so that ranks waiting on one that
        // gave up do not wait for their deadline.
        // (Not for a mismatch, which every member detects itself, nor for
        // an abort that came from another member.)
        if (g->g_shm == NULL && !wk->wk_cuda && st != TP_EREMOTE && !mismatch) {
            for (int i = 0; i < g->g_size; i++) {
                int wr = g->g_wranks[i];
                tp_error *pe = i == g->g_rank
                                   ? NULL
                                   : tp__p2p_peer_error(g->g_world->w_p2p, wr);
                if (i != g->g_rank && pe == NULL) {
                    tp__p2p_send_abort(g->g_world->w_p2p, wr, g->g_gid,
                                       tp_error_message(e));
                }
                tp_error_unref(pe);
            }
        }
        tp_error_unref(own);
    }
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
        } else {
            st = coll_exec(g, wk, &e);
        }
        work_complete(wk, st, e, -1);
        tp_error_unref(e);
        work_unref(wk);
        tp__mtx_lock(&g->g_mtx);
        g->g_busy = false;
        tp__cv_broadcast(&g->g_cv);
    }
    tp__mtx_unlock(&g->g_mtx);
    return NULL;
}

// Runs @wk now on this thread (blocking call, nothing queued) or queues
// it. Takes the caller's reference of @wk.
static tp_status
coll_submit(tp_pg *g, tp_work *wk, tp_work **w_p, tp_error **err_p)
{
    tp__mtx_lock(&g->g_mtx);
    if (w_p == NULL && tp__list_empty(&g->g_queue) && !g->g_busy) {
        g->g_busy = true;
        tp__mtx_unlock(&g->g_mtx);
        tp_status st = coll_exec(g, wk, err_p);
        tp__mtx_lock(&g->g_mtx);
        g->g_busy = false;
        tp__cv_broadcast(&g->g_cv);
        tp__mtx_unlock(&g->g_mtx);
        work_unref(wk);
        return st;
    }
    if (g->g_stop) {
        tp__mtx_unlock(&g->g_mtx);
        work_unref(wk);
        return tp__error_set(err_p, TP_ECLOSED, "%s: destroyed", g->g_what);
    }
    if (wk->wk_local) {
        // Queued behind others: the group's thread needs a heap work.
        tp_work *h = work_new(g);
        if (h == NULL) {
            tp__mtx_unlock(&g->g_mtx);
            work_unref(wk);
            return tp__error_set(err_p, TP_ENOMEM, "%s: %s", g->g_what,
                                 tp__coll_kind_name(wk->wk_args.kind));
        }
        h->wk_args = wk->wk_args;
        h->wk_op = wk->wk_op;
        h->wk_splits = wk->wk_splits;
        h->wk_in_copy = wk->wk_in_copy;
        h->wk_t1 = wk->wk_t1;
        h->wk_t2 = wk->wk_t2;
        h->wk_cuda = wk->wk_cuda;
        h->wk_deadline_ns = wk->wk_deadline_ns;
        wk->wk_splits = NULL;
        wk->wk_in_copy = NULL;
        wk->wk_t1 = wk->wk_t2 = NULL;
        wk = h;
    }
    if (!g->g_thread_started) {
        int rc = pthread_create(&g->g_thread, NULL, group_thread, g);
        if (rc != 0) {
            tp__mtx_unlock(&g->g_mtx);
            work_unref(wk);
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
    work_unref(wk);
    return st;
}

// Common start of every collective: a work holding the tensors. A
// blocking call passes @local: its work lives on the caller's stack unless
// it has to be queued (coll_submit then moves it to the heap).
static tp_status
coll_begin(tp_pg *g, tp__coll_kind kind, tp_work *local, tp_work **wk_p,
           tp_error **err_p)
{
    if (g == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: NULL process group",
                             tp__coll_kind_name(kind));
    }
    tp_work *wk = local;
    if (local != NULL) {
        memset(local, 0, sizeof(*local));
        local->wk_pg = g;
        atomic_init(&local->wk_refs, 1);
        local->wk_local = true;
        local->wk_source = -1;
        local->wk_deadline_ns = tp__deadline_after_ms(g->g_timeout_ms);
    } else {
        wk = work_new(g);
        if (wk == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "%s: %s", g->g_what,
                                 tp__coll_kind_name(kind));
        }
    }
    wk->wk_args.kind = kind;
    *wk_p = wk;
    return TP_OK;
}

static void
work_hold(tp_work *wk, tp_tensor *t1, tp_tensor *t2)
{
    wk->wk_t1 = t1 != NULL ? tp_tensor_ref(t1) : NULL;
    wk->wk_t2 = t2 != NULL ? tp_tensor_ref(t2) : NULL;
    wk->wk_cuda = is_cuda(t1) || is_cuda(t2);
}

static size_t
numel(const tp_tensor *t)
{
    return t != NULL ? (size_t)tp_tensor_numel(t) : 0;
}

// An input that overlaps the output is copied first (in-place all_gather
// with the input as the output's block r, and the like).
static tp_status
untangle(tp_work *wk, tp_error **err_p)
{
    tp__coll_args *a = &wk->wk_args;
    if (a->in == NULL || a->out == NULL || wk->wk_cuda) {
        return TP_OK;
    }
    size_t es = tp_dtype_size(a->dtype);
    size_t in_bytes = numel(wk->wk_t2) * es, out_bytes = numel(wk->wk_t1) * es;
    const char *i0 = a->in, *o0 = a->out;
    if (in_bytes == 0 || out_bytes == 0 || i0 + in_bytes <= o0 ||
        o0 + out_bytes <= i0) {
        return TP_OK;
    }
    wk->wk_in_copy = malloc(in_bytes);
    if (wk->wk_in_copy == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: copy of the input",
                             wk->wk_pg->g_what);
    }
    memcpy(wk->wk_in_copy, a->in, in_bytes);
    a->in = wk->wk_in_copy;
    return TP_OK;
}

static tp_status
coll_finish(tp_pg *g, tp_work *wk, tp_work **w_p, tp_status st,
            tp_error **err_p)
{
    if (st == TP_OK) {
        st = untangle(wk, err_p);
    }
    if (st != TP_OK) {
        work_unref(wk);
        return st;
    }
    return coll_submit(g, wk, w_p, err_p);
}

tp_status
tp_pg_barrier(tp_pg *pg, tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_BARRIER, w_p == NULL ? &local : NULL,
                              &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    wk->wk_args.dtype = TP_U8;
    return coll_finish(pg, wk, w_p, TP_OK, err_p);
}

tp_status
tp_pg_broadcast(tp_pg *pg, tp_tensor *t, int root, tp_work **w_p,
                tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_BROADCAST,
                              w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_tensor(pg, "broadcast", "tensor", t, err_p);
    if (st == TP_OK) {
        st = check_root(pg, "broadcast", root, err_p);
    }
    if (st == TP_OK) {
        work_hold(wk, t, NULL);
        wk->wk_args.dtype = tp_tensor_dtype(t);
        wk->wk_args.root = root;
        wk->wk_args.buf = tp_tensor_data(t);
        wk->wk_args.count = numel(t);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

static tp_status
reducing(tp_pg *pg, tp__coll_kind kind, tp_tensor *t, int root, tp_reduce_op op,
         tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    const char *name = tp__coll_kind_name(kind);
    tp_work local;
    tp_status st =
        coll_begin(pg, kind, w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_tensor(pg, name, "tensor", t, err_p);
    if (st == TP_OK && kind == TP__COLL_REDUCE) {
        st = check_root(pg, name, root, err_p);
    }
    if (st == TP_OK) {
        st = check_op(pg, name, op, tp_tensor_dtype(t), err_p);
    }
    if (st == TP_OK) {
        work_hold(wk, t, NULL);
        wk->wk_op = op;
        wk->wk_args.op =
            op == TP_REDUCE_AVG && !wk->wk_cuda ? TP_REDUCE_SUM : op;
        wk->wk_args.dtype = tp_tensor_dtype(t);
        wk->wk_args.root = root;
        wk->wk_args.buf = tp_tensor_data(t);
        wk->wk_args.count = numel(t);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

tp_status
tp_pg_all_reduce(tp_pg *pg, tp_tensor *t, tp_reduce_op op, tp_work **w_p,
                 tp_error **err_p)
{
    return reducing(pg, TP__COLL_ALL_REDUCE, t, 0, op, w_p, err_p);
}

tp_status
tp_pg_reduce(tp_pg *pg, tp_tensor *t, int root, tp_reduce_op op, tp_work **w_p,
             tp_error **err_p)
{
    return reducing(pg, TP__COLL_REDUCE, t, root, op, w_p, err_p);
}

tp_status
tp_pg_all_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in, tp_work **w_p,
                 tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_ALL_GATHER,
                              w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_tensor(pg, "all_gather", "out", out, err_p);
    if (st == TP_OK) {
        st = check_tensor(pg, "all_gather", "in", in, err_p);
    }
    if (st == TP_OK) {
        st = check_blocks(pg, "all_gather", out, "out", in, "in", err_p);
    }
    if (st == TP_OK) {
        work_hold(wk, out, in);
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = numel(in);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

tp_status
tp_pg_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in, int root, tp_work **w_p,
             tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_GATHER, w_p == NULL ? &local : NULL,
                              &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_root(pg, "gather", root, err_p);
    if (st == TP_OK) {
        st = check_tensor(pg, "gather", "in", in, err_p);
    }
    bool is_root = st == TP_OK && pg->g_rank == root;
    if (is_root) {
        st = check_tensor(pg, "gather", "out (on the root)", out, err_p);
        if (st == TP_OK) {
            st = check_blocks(pg, "gather", out, "out", in, "in", err_p);
        }
    }
    if (st == TP_OK) {
        work_hold(wk, is_root ? out : NULL, in);
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.root = root;
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = is_root ? tp_tensor_data(out) : NULL;
        wk->wk_args.count = numel(in);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

tp_status
tp_pg_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in, int root, tp_work **w_p,
              tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_SCATTER, w_p == NULL ? &local : NULL,
                              &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_root(pg, "scatter", root, err_p);
    if (st == TP_OK) {
        st = check_tensor(pg, "scatter", "out", out, err_p);
    }
    bool is_root = st == TP_OK && pg->g_rank == root;
    if (is_root) {
        st = check_tensor(pg, "scatter", "in (on the root)", in, err_p);
        if (st == TP_OK) {
            st = check_blocks(pg, "scatter", in, "in", out, "out", err_p);
        }
    }
    if (st == TP_OK) {
        work_hold(wk, out, is_root ? in : NULL);
        wk->wk_args.dtype = tp_tensor_dtype(out);
        wk->wk_args.root = root;
        wk->wk_args.in = is_root ? tp_tensor_data(in) : NULL;
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = numel(out);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

tp_status
tp_pg_reduce_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in, tp_reduce_op op,
                     tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_REDUCE_SCATTER,
                              w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_tensor(pg, "reduce_scatter", "out", out, err_p);
    if (st == TP_OK) {
        st = check_tensor(pg, "reduce_scatter", "in", in, err_p);
    }
    if (st == TP_OK) {
        st = check_blocks(pg, "reduce_scatter", in, "in", out, "out", err_p);
    }
    if (st == TP_OK) {
        st = check_op(pg, "reduce_scatter", op, tp_tensor_dtype(in), err_p);
    }
    if (st == TP_OK) {
        work_hold(wk, out, in);
        wk->wk_op = op;
        wk->wk_args.op =
            op == TP_REDUCE_AVG && !wk->wk_cuda ? TP_REDUCE_SUM : op;
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = numel(out);
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

// Rows of dimension 0 and the elements per row of @t (ndim >= 1).
static tp_status
a2a_rows(tp_pg *g, const char *arg, const tp_tensor *t, int64_t *rows,
         int64_t *row_el, tp_error **err_p)
{
    if (tp_tensor_ndim(t) < 1) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: all_to_all: %s has no dimension 0", g->g_what,
                             arg);
    }
    *rows = tp_tensor_size(t, 0);
    *row_el = *rows > 0 ? tp_tensor_numel(t) / *rows : 0;
    return TP_OK;
}

static tp_status
a2a_splits(tp_pg *g, const char *arg, const int64_t *splits, int64_t rows,
           int64_t row_el, size_t *counts, size_t *displs, tp_error **err_p)
{
    int n = g->g_size;
    if (splits == NULL) {
        if (rows % n != 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: all_to_all: %s has %" PRId64
                                 " rows, not divisible by the group size %d "
                                 "(pass split sizes)",
                                 g->g_what, arg, rows, n);
        }
    }
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        int64_t s = splits != NULL ? splits[i] : rows / n;
        if (s < 0 || s > rows - sum) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: all_to_all: %s split %d is %" PRId64
                                 " rows (%" PRId64 " rows, %" PRId64
                                 " already used)",
                                 g->g_what, arg, i, s, rows, sum);
        }
        counts[i] = (size_t)(s * row_el);
        displs[i] = (size_t)(sum * row_el);
        sum += s;
    }
    if (sum != rows) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: all_to_all: %s splits add up to %" PRId64
                             " rows, the tensor has %" PRId64,
                             g->g_what, arg, sum, rows);
    }
    return TP_OK;
}

tp_status
tp_pg_all_to_all(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                 const int64_t *out_splits, const int64_t *in_splits,
                 tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = coll_begin(pg, TP__COLL_ALL_TO_ALL,
                              w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = check_tensor(pg, "all_to_all", "out", out, err_p);
    if (st == TP_OK) {
        st = check_tensor(pg, "all_to_all", "in", in, err_p);
    }
    if (st == TP_OK) {
        if ((tp_tensor_dtype(out) != tp_tensor_dtype(in) ||
             is_cuda(out) != is_cuda(in))) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "%s: all_to_all: out and in differ in dtype or "
                               "device",
                               pg->g_what);
        }
    }
    int64_t in_rows = 0, in_row = 0, out_rows = 0, out_row = 0;
    if (st == TP_OK) {
        st = a2a_rows(pg, "in", in, &in_rows, &in_row, err_p);
    }
    if (st == TP_OK) {
        st = a2a_rows(pg, "out", out, &out_rows, &out_row, err_p);
    }
    if (st == TP_OK && in_rows > 0 && out_rows > 0 && in_row != out_row) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "%s: all_to_all: rows of in have %" PRId64
                           " elements, rows of out %" PRId64,
                           pg->g_what, in_row, out_row);
    }
    size_t n = (size_t)pg->g_size;
    if (st == TP_OK) {
        wk->wk_splits = malloc(4 * n * sizeof(size_t));
        if (wk->wk_splits == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "%s: all_to_all", pg->g_what);
        }
    }
    if (st == TP_OK) {
        size_t *sp = wk->wk_splits;
        st =
            a2a_splits(pg, "in", in_splits, in_rows, in_row, sp, sp + n, err_p);
        if (st == TP_OK) {
            st = a2a_splits(pg, "out", out_splits, out_rows, out_row,
                            sp + 2 * n, sp + 3 * n, err_p);
        }
        size_t me = (size_t)pg->g_rank;
        if (st == TP_OK && sp[me] != sp[2 * n + me]) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "%s: all_to_all: this rank sends itself %zu "
                               "elements (in_splits) but expects %zu "
                               "(out_splits)",
                               pg->g_what, sp[me], sp[2 * n + me]);
        }
    }
    if (st == TP_OK) {
        work_hold(wk, out, in);
        size_t *sp = wk->wk_splits;
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = numel(in);
        wk->wk_args.scounts = sp;
        wk->wk_args.sdispls = sp + n;
        wk->wk_args.rcounts = sp + 2 * n;
        wk->wk_args.rdispls = sp + 3 * n;
    }
    return coll_finish(pg, wk, w_p, st, err_p);
}

// ---- point to point
// --------------------------------------------------------------------

static tp_status
p2p_start(tp_pg *pg, bool send, tp_tensor *t, int peer, int tag, tp_work **w_p,
          tp_error **err_p)
{
    const char *op = send ? "send" : "recv";
    if (pg == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: NULL process group", op);
    }
    tp_status st = check_tensor(pg, op, "tensor", t, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (tag < 0) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: tag %d (tags are >= 0)",
                             pg->g_what, op, tag);
    }
    if (peer >= pg->g_size || peer < (send ? 0 : TP_ANY_SOURCE)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: rank %d is not a rank of the group "
                             "(0..%d%s)",
                             pg->g_what, op, peer, pg->g_size - 1,
                             send ? "" : " or TP_ANY_SOURCE");
    }
    tp_work *wk = work_new(pg);
    if (wk == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: %s", pg->g_what, op);
    }
    work_hold(wk, t, NULL);
    wk->wk_p2p = true;
    wk->wk_send = send;
    wk->wk_peer = peer;
    if (wk->wk_cuda) {
        work_unref(wk);
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: %s of a CUDA tensor: copy it to the CPU "
                             "(NCCL point-to-point is not wired in)",
                             pg->g_what, op);
    }
    tp__p2p *p = pg->g_world->w_p2p;
    size_t bytes = tp_tensor_nbytes(t);
    int wpeer = peer >= 0 ? pg->g_wranks[peer] : -1;
    atomic_fetch_add(&wk->wk_refs, 1); // the request's callback
    tp__req *r = NULL;
    st = send ? tp__p2p_isend(p, wpeer, pg->g_gid, TP__CHAN_P2P, (uint64_t)tag,
                              tp_tensor_data(t), bytes, p2p_work_cb, wk, &r,
                              err_p)
              : tp__p2p_irecv(p, wpeer, pg->g_gid, TP__CHAN_P2P, (uint64_t)tag,
                              tp_tensor_data(t), bytes, p2p_work_cb, wk, &r,
                              err_p);
    if (st != TP_OK) {
        atomic_fetch_sub(&wk->wk_refs, 1);
        work_unref(wk);
        return tp__error_wrap(err_p, st, "%s: %s %s rank %d (tag %d)",
                              pg->g_what, op, send ? "to" : "from", peer, tag);
    }
    wk->wk_req = r;
    tp_pg *w = pg->g_world;
    tp__mtx_lock(&w->w_mtx);
    atomic_store(&wk->wk_world, w);
    tp__list_append(&w->w_works, wk);
    tp__mtx_unlock(&w->w_mtx);
    if (w_p != NULL) {
        *w_p = wk;
        return TP_OK;
    }
    st = tp_work_wait(wk, 0, err_p);
    work_unref(wk);
    return st;
}

tp_status
tp_pg_send(tp_pg *pg, tp_tensor *t, int dst, int tag, tp_work **w_p,
           tp_error **err_p)
{
    return p2p_start(pg, true, t, dst, tag, w_p, err_p);
}

tp_status
tp_pg_recv(tp_pg *pg, tp_tensor *t, int src, int tag, tp_work **w_p,
           tp_error **err_p)
{
    return p2p_start(pg, false, t, src, tag, w_p, err_p);
}

// ---- destroy
// ------------------------------------------------------------------------------

// Finishes the point-to-point works of @pg (every group's if @pg is the
// world): pending ones complete with TP_ECLOSED; their requests are
// canceled (a subgroup: the world's pipes go on) or detached (the world:
// the p2p layer is about to go, and frees them).
static void
finish_p2p_works(tp_pg *pg)
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
        work_complete(wk, TP_ECLOSED, e, -1);
        tp_error_unref(e);
        if (world) {
            tp__req_detach(r);
        } else {
            tp__req_cancel_free(r);
        }
        work_unref(wk);
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

void
tp_pg_destroy(tp_pg *pg)
{
    if (pg == NULL) {
        return;
    }
    tp_pg *w = pg->g_world;
    if (pg == w) {
        for (;;) {
            tp__mtx_lock(&w->w_mtx);
            tp_pg *sub = w->w_groups->g_next;
            tp__mtx_unlock(&w->w_mtx);
            if (sub == NULL) {
                break;
            }
            TP_LOG_ERROR("TP-PG-DESTROY",
                         "%s: destroyed before its subgroup %s; destroying "
                         "that first",
                         w->g_what, sub->g_name);
            tp_pg_destroy(sub);
        }
    }
    tp__mtx_lock(&pg->g_mtx);
    pg->g_stop = true;
    tp__cv_broadcast(&pg->g_cv);
    bool started = pg->g_thread_started;
    tp__mtx_unlock(&pg->g_mtx);
    // The pipe engine's waits see the group broken and end; queued works
    // complete with TP_ECLOSED.
    tp_error *e =
        tp_error_create(TP_ECLOSED, NULL, "%s: destroyed", pg->g_what);
    group_break(pg, e);
    tp_error_unref(e);
    tp__p2p_kick(w->w_p2p);
    if (started) {
        pthread_join(pg->g_thread, NULL);
    }
    finish_p2p_works(pg);
    // Threads in tp_work_wait on works of this group leave now (every work
    // is complete); bounded, in case one is stuck in a probe's connect.
    uint64_t until = tp__deadline_after_ms(PG_FINISH_GRACE_MS);
    while (atomic_load(&pg->g_waiters) > 0 && tp__now_ns() < until) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (pg != w) {
        tp__mtx_lock(&w->w_mtx);
        for (tp_pg **gp = &w->w_groups; *gp != NULL; gp = &(*gp)->g_next) {
            if (*gp == pg) {
                *gp = pg->g_next;
                w->w_nsub--;
                break;
            }
        }
        tp__mtx_unlock(&w->w_mtx);
        group_free(pg);
        return;
    }
    tp__p2p_destroy(w->w_p2p);
    tp_store_close(w->w_store);
    free(w->w_sets);
    tp__mtx_fini(&w->w_mtx);
    group_free(w);
}
