/* SPDX-License-Identifier: Apache-2.0 */
/* pg_engine.c - the engines behind one ops table (tp__coll_engine_ops,
 * pg_impl.h) and the two choices made with it: a group's engine when the
 * group is made (tp__pg_engine_choose: shm when every member can use it,
 * else pipe, TP_COLL_ENGINE=auto|shm|pipe), and the engine of one
 * collective (tp__pg_engine_for: NCCL for CUDA tensors, else the
 * group's).
 *   shm   collectives/shm*.c: a segment the members map (one host)
 *   pipe  collectives/algo.c over the point-to-point layer (p2p*.c)
 *   nccl  collectives/nccl_*.c: CUDA tensors; its communicator is made on
 *         the group's first CUDA collective
 * Each engine keeps its state in its own fields of the group (g_shm;
 * g_scratch; g_nccl, g_nccl_device).
 *
 * Locks: none of its own; an engine's run is called with no lock held, by
 * the one thread running the group's collective. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "collectives/algo.h"
#include "collectives/pg_impl.h"
#include <tpipe/info.h>
#include "core/error.h"
#include "core/log.h"

// ---- shm
// ----------------------------------------------------------------------------

static tp_status
shm_engine_open(tp_pg *g, uint64_t deadline, char *why, size_t why_len,
                tp_error **err_p)
{
    tp__shm_setup s = {
        .store = g->g_world->w_store,
        .prefix = g->g_prefix,
        .rank = g->g_rank,
        .size = g->g_size,
        .world_ranks = g->g_wranks,
        .group = g->g_name,
        .slot_bytes = (size_t)g->g_cfg.coll_shm_slot,
        .deadline_ns = deadline,
    };
    tp_status st = tp__shm_open(&s, &g->g_shm, why, why_len, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (g->g_shm == NULL && why[0] == '\0') {
        snprintf(why, why_len, "the shared-memory engine is not usable");
    }
    return TP_OK;
}

static tp_status
shm_engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq,
               uint64_t deadline, tp_error **err_p)
{
    (void)seq;
    return tp__shm_run(g->g_shm, a, deadline, err_p);
}

static void
shm_engine_abort(tp_pg *g)
{
    tp__shm_cancel(g->g_shm);
}

static void
shm_engine_close(tp_pg *g)
{
    tp__shm_close(g->g_shm);
    g->g_shm = NULL;
}

static const tp__coll_engine_ops shm_engine = {
    .name = "shm",
    .open = shm_engine_open,
    .run = shm_engine_run,
    .abort = shm_engine_abort,
    .close = shm_engine_close,
};

// ---- pipe
// ---------------------------------------------------------------------------

static tp_status
pipe_engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq,
                uint64_t deadline, tp_error **err_p)
{
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
        // the deadline was set when the collective was issued
        .start_ns = deadline != UINT64_MAX && g->g_timeout_ms > 0
                        ? deadline - (uint64_t)g->g_timeout_ms * 1000000u
                        : 0,
        .deadline_ns = deadline,
        .check = tp__pg_check,
        .check_arg = g,
        .what = what,
        .allreduce_algo = (int)g->g_cfg.coll_allreduce,
        .bcast_algo = (int)g->g_cfg.coll_bcast,
        .small_max = (size_t)g->g_cfg.coll_small_max,
        .chunk = (size_t)g->g_cfg.coll_chunk,
        .scratch = &g->g_scratch,
        .scratch_len = &g->g_scratch_len,
    };
    tp_status st = tp__algo_run(&c, a, err_p);
    if (st == TP_ETIMEDOUT) {
        // The rank this one waited for may be waiting too: name the
        // members that never called it.
        tp__pg_blame_timeout(g, tp__coll_kind_name(a->kind), seq, c.start_ns,
                             what, err_p);
    } else if (st != TP_OK) {
        // A member that gave up tells the others why (its abort, which
        // breaks the group) before it closes: a wait woken by that close
        // reports the reason, not the close (rank 2 died, rank 0 gave up
        // on it and left: rank 1 names rank 2).
        tp_error *be = NULL;
        if (tp__pg_check(g, &be) != TP_OK && be != NULL && err_p != NULL &&
            tp_error_status(be) == TP_EREMOTE) {
            tp_error_unref(*err_p);
            *err_p = be;
            st = TP_EREMOTE;
        } else {
            tp_error_unref(be);
        }
    }
    return st;
}

// The pipe engine's waits re-run their check (tp__pg_check) and see the
// group broken.
static void
pipe_engine_abort(tp_pg *g)
{
    tp__p2p_kick(g->g_world->w_p2p);
}

// Tells the other members that this rank gave up with @e, so that ranks
// waiting on one that gave up do not wait for their deadline (a member
// whose pipe already failed is skipped).
static void
pipe_engine_tell_failed(tp_pg *g, const tp_error *e)
{
    for (int i = 0; i < g->g_size; i++) {
        if (i == g->g_rank) {
            continue;
        }
        int wr = g->g_wranks[i];
        tp_error *pe = tp__p2p_peer_error(g->g_world->w_p2p, wr);
        if (pe == NULL) {
            tp__p2p_send_abort(g->g_world->w_p2p, wr, g->g_gid,
                               tp_error_message(e));
        }
        tp_error_unref(pe);
    }
}

static const tp__coll_engine_ops pipe_engine = {
    .name = "pipe",
    .run = pipe_engine_run,
    .abort = pipe_engine_abort,
    .tell_failed = pipe_engine_tell_failed,
};

// ---- nccl
// ---------------------------------------------------------------------------

// Makes the group's communicator on its first CUDA collective (every
// member reaches it at the same point: collectives run in issue order).
static tp_status
nccl_engine_comm(tp_pg *g, const tp__coll_args *a, uint64_t deadline,
                 tp_error **err_p)
{
    char why[256];
    if (!tp__nccl_available(why, sizeof(why))) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: %s of CUDA tensors needs NCCL: %s", g->g_what,
                             tp__coll_kind_name(a->kind), why);
    }
    int dev = a->device;
    if (g->g_nccl == NULL) {
        char prefix[200];
        snprintf(prefix, sizeof(prefix), "%snccl/%" PRIu64 "/", g->g_prefix,
                 g->g_seq);
        tp_status st = tp__nccl_comm_create(
            g->g_world->w_store, prefix, g->g_rank, g->g_size, dev,
            tp__ms_left(deadline), &g->g_nccl, err_p);
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
    return TP_OK;
}

static tp_status
nccl_engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq,
                uint64_t deadline, tp_error **err_p)
{
    (void)seq;
    tp_status st = nccl_engine_comm(g, a, deadline, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t left = tp__ms_left(deadline);
    tp_reduce_op op = a->op; // avg included: NCCL averages itself
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

static void
nccl_engine_close(tp_pg *g)
{
    tp__nccl_comm_destroy(g->g_nccl);
    g->g_nccl = NULL;
}

static const tp__coll_engine_ops nccl_engine = {
    .name = "nccl",
    .device = true,
    .run = nccl_engine_run,
    .close = nccl_engine_close,
};

// ---- choices
// ------------------------------------------------------------------------

const tp__coll_engine_ops *const tp__pg_default_engine = &pipe_engine;

// Host engines in order of preference.
static const tp__coll_engine_ops *const host_engines[] = {
    &shm_engine,
    &pipe_engine,
};

tp_status
tp__pg_engine_choose(tp_pg *g, uint64_t deadline, tp_error **err_p)
{
    g->g_eng = &pipe_engine;
    tp_coll_engine engine = (tp_coll_engine)g->g_cfg.coll_engine;
    char why[512] = "";
    for (size_t i = 0; i < sizeof(host_engines) / sizeof(host_engines[0]);
         i++) {
        const tp__coll_engine_ops *e = host_engines[i];
        bool forced = (engine == TP_COLL_ENGINE_SHM && e == &shm_engine) ||
                      (engine == TP_COLL_ENGINE_PIPE && e == &pipe_engine);
        if (engine != TP_COLL_ENGINE_AUTO && !forced) {
            continue;
        }
        char ewhy[512] = "";
        tp_status st = e->open != NULL
                           ? e->open(g, deadline, ewhy, sizeof(ewhy), err_p)
                           : TP_OK;
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "%s: %s engine", g->g_what,
                                  e == &shm_engine ? "shared-memory" : e->name);
        }
        if (ewhy[0] == '\0') {
            g->g_eng = e;
            if (why[0] != '\0') {
                TP_LOG_INFO("TP-PG-ENGINE", "%s: collectives on %ss: %s",
                            g->g_what, e->name, why);
            }
            return TP_OK;
        }
        if (forced) {
            return tp__error_set(err_p, TP_ENOTSUP,
                                 "%s: TP_COLL_ENGINE=%s, but the %s engine "
                                 "cannot be used: %s",
                                 g->g_what, e->name,
                                 e == &shm_engine ? "shared-memory" : e->name,
                                 ewhy);
        }
        if (why[0] == '\0') {
            snprintf(why, sizeof(why), "%s", ewhy);
        }
    }
    return tp__error_set(err_p, TP_EINTERNAL, "%s: no collective engine",
                         g->g_what);
}

const tp__coll_engine_ops *
tp__pg_engine_for(const tp_pg *g, bool cuda)
{
    return cuda ? &nccl_engine : g->g_eng;
}

void
tp__pg_engine_abort(tp_pg *g)
{
    if (g->g_eng->abort != NULL) {
        g->g_eng->abort(g);
    }
    // NCCL: nothing; a destroy waits for its collective (bounded by its
    // deadline).
}

void
tp__pg_engine_close(tp_pg *g)
{
    const tp__coll_engine_ops *all[] = {&shm_engine, &pipe_engine,
                                        &nccl_engine};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        if (all[i]->close != NULL) {
            all[i]->close(g);
        }
    }
}

tp_status
tp__pg_engine_run(tp_pg *g, const tp__coll_args *a, uint64_t seq,
                  uint64_t deadline, tp_error **err_p)
{
    return g->g_eng->run(g, a, seq, deadline, err_p);
}

// ---- introspection ----------------------------------------------------------

tp_status
tp_info_collective_engines(unsigned flags, tp_backend_info *out, size_t cap,
                           size_t *n_p, tp_error **err_p)
{
    (void)flags;
    if (n_p == NULL || (out == NULL && cap > 0)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tp_info_collective_engines: %s is NULL",
                             n_p == NULL ? "n_p" : "out");
    }
    static const char *const names[] = {"shm", "pipe", "nccl"};
    size_t n = sizeof(names) / sizeof(names[0]);
    *n_p = n;
    for (size_t i = 0; i < n && i < cap; i++) {
        tp_backend_info *e = &out[i];
        memset(e, 0, sizeof(*e));
        e->name = names[i];
        e->priority = (unsigned)i;
        if (i == 0) {
            e->viable = tp__shm_viable(e->reason, sizeof(e->reason));
            e->same_host = true;
        } else if (i == 1) {
            e->viable = true;
        } else {
            e->viable = tp__nccl_available(e->reason, sizeof(e->reason));
        }
        if (e->viable) {
            e->reason[0] = '\0';
        }
    }
    return TP_OK;
}
