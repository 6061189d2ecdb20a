/* SPDX-License-Identifier: Apache-2.0 */
/* pg.c - process groups (collectives.h): options and accessors, group
 * objects, subgroups, failure propagation and destroy (init through the
 * store is pg_init.c). The layer's files and its lock order are listed in
 * pg_impl.h.
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
 * Locks: w_mtx > g_mtx > wk_mtx (pg_impl.h). The abort callback takes
 * w_mtx then g_mtx. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/log.h"
#include "store/join.h"

// ---- options
// --------------------------------------------------------------------

void
tp_pg_options_init(tp_pg_options *o)
{
    if (o == NULL) {
        return;
    }
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    o->timeout_ms = TP_TIMEOUT_DEFAULT;
    o->init_timeout_ms = TP_TIMEOUT_DEFAULT;
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
    return pg != NULL ? pg->g_eng->name : "";
}

const char *
tp_pg_name(const tp_pg *pg)
{
    return pg != NULL ? pg->g_name : "";
}

// ---- failure
// -----------------------------------------------------------------------

// Breaks @g with @err (the first error wins). Takes g_mtx.
void
tp__pg_break(tp_pg *g, const tp_error *err)
{
    tp__mtx_lock(&g->g_mtx);
    if (g->g_broken == NULL) {
        g->g_broken = tp_error_ref(err);
        atomic_store_explicit(&g->g_is_broken, true, memory_order_release);
    }
    tp__cv_broadcast(&g->g_cv);
    tp__mtx_unlock(&g->g_mtx);
}

tp_status
tp__pg_check(void *arg, tp_error **err_p)
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
void
tp__pg_on_abort(void *arg, uint64_t gid, int from, const char *reason)
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
        tp__pg_break(g, e);
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

// p2p callback: world rank @from asks which sequence number group @gid
// reached here (a member whose collective timed out).
bool
tp__pg_on_query(void *arg, uint64_t gid, int from, uint64_t *next_p)
{
    tp_pg *w = arg;
    bool found = false;
    tp__mtx_lock(&w->w_mtx);
    for (tp_pg *g = w->w_groups; g != NULL && !found; g = g->g_next) {
        if (g->g_gid == gid && g->g_granks[from] >= 0) {
            found = true;
            *next_p =
                atomic_load_explicit(&g->g_seq_taken, memory_order_acquire);
        }
    }
    tp__mtx_unlock(&w->w_mtx);
    return found;
}

// ---- groups
// -------------------------------------------------------------------------

tp_pg *
tp__pg_group_alloc(int size, int world_size)
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
    tp__mtx_init(&g->w_mtx);
    tp__cv_init(&g->w_cv);
    atomic_init(&g->g_refs, 1);
    tp__pg_fr_init(g);
    g->g_eng = tp__pg_default_engine;
    return g;
}

// Frees @g (its last reference is gone, or it was never handed out).
// A subgroup drops its reference of the world (taken by new_group).
void
tp__pg_group_free(tp_pg *g)
{
    tp_pg *w = g->g_world;
    tp__pg_engine_close(g);
    free(g->g_scratch);
    tp_error_unref(g->g_broken);
    tp__pg_fr_fini(g);
    free(g->w_sets);
    tp__cv_fini(&g->w_cv);
    tp__mtx_fini(&g->w_mtx);
    tp__cv_fini(&g->g_cv);
    tp__mtx_fini(&g->g_mtx);
    free(g->g_wranks);
    free(g->g_granks);
    free(g);
    if (w != NULL && w != g) {
        tp__pg_unref(w);
    }
}

void
tp__pg_ref(tp_pg *g)
{
    atomic_fetch_add_explicit(&g->g_refs, 1, memory_order_relaxed);
}

void
tp__pg_unref(tp_pg *g)
{
    if (atomic_fetch_sub_explicit(&g->g_refs, 1, memory_order_acq_rel) == 1) {
        tp__pg_group_free(g);
    }
}

bool
tp__pg_p2p_enter(tp_pg *w)
{
    tp__mtx_lock(&w->w_mtx);
    bool open = !w->w_closed;
    if (open) {
        w->w_p2p_users++;
    }
    tp__mtx_unlock(&w->w_mtx);
    return open;
}

void
tp__pg_p2p_leave(tp_pg *w)
{
    tp__mtx_lock(&w->w_mtx);
    if (--w->w_p2p_users == 0) {
        tp__cv_broadcast(&w->w_cv);
    }
    tp__mtx_unlock(&w->w_mtx);
}

void
tp__pg_group_set_what(tp_pg *g)
{
    snprintf(g->g_what, sizeof(g->g_what), "process group %s (rank %d of %d)",
             g->g_name, g->g_rank, g->g_size);
}

tp_status
tp__pg_load_config(tp_pg *g, const tp_pg_options *o, tp_error **err_p)
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
    tp_status ost = tp__pg_options_load(o, &defaults, err_p);
    if (ost != TP_OK) {
        return ost;
    }
    o = &defaults;
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

    tp_pg *g = tp__pg_group_alloc(n, w->g_size);
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
    tp__pg_ref(w); // dropped by tp__pg_group_free
    g->g_rank = me;
    g->g_gid = gid;
    if (o->name != NULL) {
        snprintf(g->g_name, sizeof(g->g_name), "%s", o->name);
    } else {
        snprintf(g->g_name, sizeof(g->g_name), "group%d", index);
    }
    tp__pg_group_set_what(g);
    snprintf(g->g_prefix, sizeof(g->g_prefix), "%sgroup/%016" PRIx64 "/",
             w->w_prefix, gid);
    tp_status st = tp__pg_load_config(g, o, err_p);
    if (st != TP_OK) {
        tp__pg_group_free(g);
        return st;
    }
    int64_t init_ms = o->init_timeout_ms == TP_TIMEOUT_DEFAULT
                          ? g->g_cfg.coll_init_timeout_ms
                          : o->init_timeout_ms;
    uint64_t deadline = tp__deadline_after_ms(init_ms);
    // Every member has called new_group: then it is live on all of them.
    char **vals = calloc((size_t)n, sizeof(char *));
    if (vals == NULL) {
        tp__pg_group_free(g);
        return tp__error_set(err_p, TP_ENOMEM, "%s: new_group", w->g_what);
    }
    char what[192];
    snprintf(what, sizeof(what), "%s: new_group", g->g_what);
    char mine[32];
    snprintf(mine, sizeof(mine), "%d", g->g_wranks[me]);
    st = tp__pg_store_exchange(w, NULL, g->g_prefix, "join/", n, me,
                               g->g_wranks, mine, vals, deadline, what, err_p);
    tp__pg_free_vals(vals, n);
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
                tp__pg_break(g, e);
                tp_error_unref(e);
            }
        }
        tp__mtx_unlock(&w->w_mtx);
        st = tp__pg_engine_choose(g, deadline, err_p);
        if (st != TP_OK) {
            tp_pg_destroy(g);
            return st;
        }
    } else {
        tp__pg_group_free(g);
        return st;
    }
    *pg_p = g;
    return TP_OK;
}

tp_status
tp_pg_new_subgroups(tp_pg *world, int group_size, const tp_pg_options *o,
                    tp_pg **pg_p, tp_error **err_p)
{
    tp_pg_options oo;
    tp_status ost = tp__pg_options_load(o, &oo, err_p);
    if (ost != TP_OK) {
        return ost;
    }
    if (pg_p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_new_subgroups: pg_p is NULL");
    }
    *pg_p = NULL;
    if (world == NULL || world->g_world != world) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_pg_new_subgroups: needs the world group");
    }
    int n = world->g_size;
    if (group_size < 1 || group_size > n || n % group_size != 0) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: new_subgroups of %d ranks: the world size "
                             "%d is not a multiple of it",
                             world->g_what, group_size, n);
    }
    int k = world->g_rank / group_size;
    int *ranks = malloc((size_t)group_size * sizeof(int));
    if (ranks == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: new_subgroups",
                             world->g_what);
    }
    for (int i = 0; i < group_size; i++) {
        ranks[i] = k * group_size + i;
    }
    char name[64];
    snprintf(name, sizeof(name), "%.40s%d",
             oo.name != NULL ? oo.name : "subgroup", k);
    oo.name = name;
    tp_status st = tp_pg_new_group(world, ranks, group_size, &oo, pg_p, err_p);
    free(ranks);
    return st;
}

// ---- destroy
// ------------------------------------------------------------------------------

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
    // The group's engine aborts (the pipe engine's waits see the group
    // broken and end, the shm engine's are canceled); queued works complete
    // with TP_ECLOSED.
    tp_error *e =
        tp_error_create(TP_ECLOSED, NULL, "%s: destroyed", pg->g_what);
    tp__pg_break(pg, e);
    tp_error_unref(e);
    tp__pg_engine_abort(pg);
    if (started) {
        pthread_join(pg->g_thread, NULL);
    }
    // Every work of the group is complete now: threads in tp_work_wait
    // wake and return. They (and handles freed later) hold references, so
    // the memory stays until the last of them lets go.
    tp__pg_finish_p2p_works(pg);
    tp__mtx_lock(&w->w_mtx);
    if (pg != w) {
        for (tp_pg **gp = &w->w_groups; *gp != NULL; gp = &(*gp)->g_next) {
            if (*gp == pg) {
                *gp = pg->g_next;
                w->w_nsub--;
                break;
            }
        }
    } else {
        // The p2p layer goes once no waiter is inside a probe or a cancel
        // (neither blocks for long: a probe does not wait, a cancel is
        // bounded); later ones see w_closed and skip it.
        w->w_closed = true;
        while (w->w_p2p_users > 0) {
            tp__cv_wait(&w->w_cv, &w->w_mtx);
        }
    }
    tp__mtx_unlock(&w->w_mtx);
    if (pg == w) {
        tp__p2p_destroy(w->w_p2p);
        w->w_p2p = NULL;
        // The group's keys go with its last member, on a store that
        // outlives the job (a file, a standalone server); one that rank
        // 0's process hosts goes with it anyway, and may be gone already.
        if (w->w_gen >= 0 && !w->w_gen_hosted) {
            tp_error *le = NULL;
            if (tp__store_job_leave(w->w_store, PG_KEY_PREFIX, w->g_size,
                                    w->w_gen, PG_LEAVE_TIMEOUT_MS,
                                    &le) != TP_OK) {
                TP_LOG_DEBUG("TP-PG-DESTROY", "%s: leaving the store: %s",
                             w->g_what, tp_error_message(le));
            }
            tp_error_unref(le);
        }
        tp_store_close(w->w_store);
        w->w_store = NULL;
    }
    tp__pg_engine_close(pg);
    tp__pg_unref(pg); // the owner's
}
