/* SPDX-License-Identifier: Apache-2.0 */
/* pg_init.c - tp_pg_init: the world group's rendezvous through the store
 * (store/join.h), its p2p layer and engine; and the store exchange that
 * new_group uses too. The layer's files and its lock order are listed in
 * pg_impl.h. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "store/join.h"

// ---- store helpers
// -------------------------------------------------------------------

// Publishes @val under <prefix><stem><rank of @me> and reads the value of
// each of the @n ranks (world ranks @wr, or 0..n-1 if NULL) into vals[i]
// (free() each; vals[me] = copy of @val). On timeout, names every rank
// still missing. With @join (init), waits in slices that notice a conflict
// posted to the generation (store/join.h).
tp_status
tp__pg_store_exchange(tp_pg *w, tp__store_member *join, const char *prefix,
                      const char *stem, int n, int me, const int *wr,
                      const char *val, char **vals, uint64_t deadline,
                      const char *what, tp_error **err_p)
{
    char key[256];
    snprintf(key, sizeof(key), "%s%s%d", prefix, stem, me);
    tp_status st = tp_store_set(w->w_store, key, val, strlen(val),
                                tp__ms_left(deadline), err_p);
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
        if (join != NULL) {
            st = tp__store_join_get(join, key, deadline, &v, &len, &e);
        } else {
            st = tp_store_get(w->w_store, key, tp__ms_left(deadline), &v, &len,
                              &e);
        }
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

void
tp__pg_free_vals(char **vals, int n)
{
    if (vals != NULL) {
        for (int i = 0; i < n; i++) {
            free(vals[i]);
        }
        free(vals);
    }
}

tp_status
tp_pg_init(const char *init_method, int rank, int world_size,
           const tp_pg_options *o, tp_pg **pg_p, tp_error **err_p)
{
    tp_pg_options defaults;
    tp_status ost = tp__pg_options_load(o, &defaults, err_p);
    if (ost != TP_OK) {
        return ost;
    }
    o = &defaults;
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
    // The URL first, then -1 from the environment (every init method).
    tp_status rst =
        tp__store_resolve_ranks(init_method, &rank, &world_size, err_p);
    if (rst != TP_OK) {
        return tp__error_wrap(err_p, rst, "tp_pg_init");
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
    tp_pg *w = tp__pg_group_alloc(world_size, world_size);
    if (w == NULL) {
        tp_store_close(store);
        return tp__error_set(err_p, TP_ENOMEM, "tp_pg_init");
    }
    w->g_world = w;
    w->w_store = store;
    w->w_gen = -1;
    w->g_rank = rank;
    for (int i = 0; i < world_size; i++) {
        w->g_wranks[i] = i;
        w->g_granks[i] = i;
    }
    snprintf(w->g_name, sizeof(w->g_name), "%s",
             o->name != NULL ? o->name : "world");
    tp__pg_group_set_what(w);
    char **vals = NULL;
    tp__store_member join;
    bool joined = false;
    st = tp__pg_load_config(w, o, err_p);
    if (st != TP_OK) {
        goto fail;
    }
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
    tp__p2p_set_callbacks(w->w_p2p, tp__pg_on_abort, NULL, tp__pg_on_query, w);
    vals = calloc((size_t)world_size, sizeof(char *));
    if (vals == NULL) {
        st = tp__error_set(err_p, TP_ENOMEM, "%s: init", w->g_what);
        goto fail;
    }
    char what[160];
    snprintf(what, sizeof(what), "%s: init", w->g_what);
    // A store may outlive a job, or serve RPC too: rank 0 opens a
    // generation of keys with its world size and every rank claims its
    // slot (store/join.h), so a world-size disagreement or a rank used
    // twice fails every member at once, and a later job, of any size,
    // never reads an earlier one's addresses.
    for (;;) {
        st = tp__store_join(store, PG_KEY_PREFIX, rank, world_size, init_ms,
                            deadline, &join, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st, "%s", what);
            goto fail;
        }
        joined = true;
        snprintf(w->w_prefix, sizeof(w->w_prefix),
                 PG_KEY_PREFIX "w%d/%" PRId64 "/", world_size, join.j_gen);
        w->w_gen = join.j_gen;
        w->w_gen_hosted = join.j_hosted;
        snprintf(w->g_prefix, sizeof(w->g_prefix), "%sworld/", w->w_prefix);
        tp_error *xe = NULL;
        st = tp__pg_store_exchange(w, &join, w->w_prefix, "addr/", world_size,
                                   rank, NULL, tp__p2p_urls(w->w_p2p), vals,
                                   deadline, what, &xe);
        if (st != TP_EAGAIN) {
            if (err_p != NULL) {
                *err_p = xe;
            } else {
                tp_error_unref(xe);
            }
            break;
        }
        // This rank had joined a generation left by a job killed in its
        // init; the next job's rank 0 opened a newer one.
        TP_LOG_INFO("TP-PG-INIT", "%s: %s", w->g_what, tp_error_message(xe));
        tp_error_unref(xe);
        joined = false;
        for (int i = 0; i < world_size; i++) {
            free(vals[i]);
            vals[i] = NULL;
        }
    }
    for (int i = 0; st == TP_OK && i < world_size; i++) {
        st = tp__p2p_set_peer(w->w_p2p, i, vals[i], err_p);
    }
    tp__pg_free_vals(vals, world_size);
    vals = NULL;
    if (st != TP_OK) {
        goto fail;
    }
    w->w_groups = w;
    tp__p2p_start(w->w_p2p);
    st = tp__pg_engine_choose(w, deadline, err_p);
    if (st != TP_OK) {
        goto fail;
    }
    if (rank == 0) {
        tp__store_join_done(&join);
    }
    TP_LOG_INFO("TP-PG-INIT", "%s: engine %s, store %s", w->g_what,
                w->g_eng->name, saddr);
    *pg_p = w;
    return TP_OK;
fail:
    if (joined) {
        // The other members stop waiting for this one (the first post
        // wins: a conflict found here is already there).
        tp__store_join_fail(&join, false,
                            err_p != NULL && *err_p != NULL
                                ? tp_error_message(*err_p)
                                : "a member's init failed");
        if (rank == 0) {
            tp__store_join_linger(&join, 2000);
        }
    }
    tp__pg_free_vals(vals, world_size);
    tp__p2p_destroy(w->w_p2p);
    tp__pg_group_free(w);
    tp_store_close(store);
    return st;
}
