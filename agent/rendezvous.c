// SPDX-License-Identifier: Apache-2.0
// rendezvous.c - the agent's use of the store: worker records at init
// (generation per job, duplicate names), the rounds of the graceful
// shutdown agreement, and the exit handshake that keeps rank 0's store up
// until every worker is done with it.

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_impl.h"
#include "core/log.h"
#include "store/join.h"

// ---- rendezvous ------------------------------------------------------------

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
            if (!ag_worker_name_valid(line, n)) {
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
                                     ag_name(a), a->a_rank, rank, num,
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
                         ag_name(a), a->a_rank, rank);
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

// Publishes this worker's record in generation @j and reads every other
// one. TP_EAGAIN (with *err_p) when the generation was abandoned for a
// newer one (a job killed in its init): join again.
static tp_status
rendezvous_exchange(tp_agent *a, tp__store_member *j, uint64_t deadline,
                    tp_error **err_p)
{
    char key[128];
    char val[AG_MAX_URL * AG_MAX_URLS + TP_RPC_MAX_NAME + 64];
    ag_peer *me = a->a_self;
    snprintf(a->a_prefix, sizeof(a->a_prefix), AG_KEY_PREFIX "w%d/%lld/",
             a->a_world, (long long)j->j_gen);
    a->a_gen = j->j_gen;
    int n = snprintf(val, sizeof(val), "%s\n%d\n", me->p_info.name, a->a_world);
    for (int i = 0; i < me->p_nurls; i++) {
        n += snprintf(val + n, sizeof(val) - (size_t)n, "%s\n", me->p_urls[i]);
    }
    worker_key(a, key, sizeof(key), a->a_rank);
    tp_status st = tp_store_set(a->a_store, key, val, (size_t)n,
                                tp__ms_left(deadline), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)", ag_name(a),
                              a->a_rank);
    }
    for (int r = 0; r < a->a_world; r++) {
        if (r == a->a_rank) {
            continue;
        }
        worker_key(a, key, sizeof(key), r);
        void *v = NULL;
        size_t vlen = 0;
        tp_error *err = NULL;
        // In slices: a conflict posted to the generation (another world
        // size, a rank used twice, a member that gave up) fails at once.
        st = tp__store_join_get(j, key, deadline, &v, &vlen, &err);
        if (st != TP_OK) {
            if (st == TP_ETIMEDOUT) {
                // Name every rank still missing.
                char missing[512];
                store_missing_ranks(a, "worker/", r, false, missing,
                                    sizeof(missing));
                tp__error_set(err_p, TP_ETIMEDOUT,
                              "rpc init of %s (rank %d): timed out after "
                              "%lld ms waiting for ranks %s of %d to join "
                              "through %s: %s",
                              ag_name(a), a->a_rank,
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
            if (st == TP_EAGAIN) {
                return st;
            }
            return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)",
                                  ag_name(a), a->a_rank);
        }
        st = rendezvous_parse(a, r, v, vlen, err_p);
        free(v);
        if (st != TP_OK) {
            return st;
        }
    }
    return TP_OK;
}

tp_status
tp__ag_rendezvous(tp_agent *a, uint64_t deadline, tp_error **err_p)
{
    char key[128];
    // A store may outlive a job (a file, a standalone server) or serve a
    // process group too: rank 0 opens a generation of keys with its world
    // size and every rank claims its slot (store/join.h), so a world-size
    // disagreement or a rank used twice fails every worker at once, and a
    // later job, of any size, never reads an earlier one's records.
    tp__store_member jm;
    tp_status st;
    for (;;) {
        st = tp__store_join(a->a_store, AG_KEY_PREFIX, a->a_rank, a->a_world,
                            a->a_opts.init_timeout_ms, deadline, &jm, err_p);
        if (st != TP_OK) {
            return tp__error_wrap(err_p, st, "rpc init of %s (rank %d)",
                                  ag_name(a), a->a_rank);
        }
        tp_error *xe = NULL;
        st = rendezvous_exchange(a, &jm, deadline, &xe);
        if (st != TP_EAGAIN) {
            if (err_p != NULL) {
                *err_p = xe;
            } else {
                tp_error_unref(xe);
            }
            break;
        }
        TP_LOG_INFO("TP-RPC-INIT", "rpc init of %s (rank %d): %s", ag_name(a),
                    a->a_rank, tp_error_message(xe));
        tp_error_unref(xe);
    }
    if (st != TP_OK) {
        // The others stop waiting for this worker (the first post wins: a
        // conflict found here is already there); rank 0 keeps the store
        // it may host up until they have read it.
        tp__store_join_fail(&jm, false,
                            err_p != NULL && *err_p != NULL
                                ? tp_error_message(*err_p)
                                : "a worker's init failed");
        if (a->a_rank == 0) {
            tp__store_join_linger(&jm, 2000);
        }
        return st;
    }
    if (a->a_rank == 0) {
        tp__store_join_done(&jm);
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
    if (tp_store_set(a->a_store, key, "1", 1, tp__ms_left(deadline), &e) ==
            TP_OK &&
        a->a_rank == 0) {
        for (int r = 1; r < a->a_world; r++) {
            snprintf(key, sizeof(key), "%sread/%d", a->a_prefix, r);
            const char *keys[1] = {key};
            if (tp_store_wait(a->a_store, keys, 1, tp__ms_left(deadline), &e) !=
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

// ---- shutdown ------------------------------------------------------------

// A worker taken for dead (a pipe to it failed) whose record is not
// there may live: its pipe failed for a passing reason (a refused
// message, an injected fault) and it will call again. A connection to it
// tells: one that gets ready (its listener accepts and answers the
// handshake) means it lives, and the wait goes on (that connection's
// failure marks it dead again); a dead worker refuses it at once. At most
// one probe per AG_SD_PROBE_MS per worker, so one that keeps failing is
// taken for dead. Appends the probe's failure to @why.
static bool
shutdown_probe(tp_agent *a, ag_peer *p, uint64_t deadline, char *why,
               size_t why_len)
{
    uint64_t now = tp__now_ns();
    tp__mtx_lock(&a->a_mtx);
    if (p->p_sd_probe_ns != 0 &&
        now - p->p_sd_probe_ns < (uint64_t)AG_SD_PROBE_MS * 1000000u) {
        tp__mtx_unlock(&a->a_mtx);
        return false;
    }
    p->p_sd_probe_ns = now;
    // A connection to it that is still up (the one that failed came from
    // it) says as much as a new one: a dead worker's would fail within
    // milliseconds, marking it dead again.
    bool had = p->p_out != NULL;
    tp_error *err = NULL;
    ag_conn *c = tp__ag_conn_get_locked(a, p, &err);
    tp_pipe *pipe = c != NULL ? tp_pipe_ref(c->c_pipe) : NULL;
    tp__mtx_unlock(&a->a_mtx);
    tp_status st = TP_EINTERNAL;
    if (pipe != NULL) {
        int64_t ms = TP_MIN(tp__ms_left(deadline), AG_SD_PROBE_MS);
        st = tp_pipe_wait_ready(pipe, ms > 0 ? ms : AG_SD_PROBE_MS, &err);
    }
    bool alive = false;
    if (st == TP_OK) {
        // Ready, and not failed since (conn_fail forgets p_out).
        tp__mtx_lock(&a->a_mtx);
        alive =
            p->p_out != NULL && p->p_out->c_pipe == pipe && !p->p_out->c_failed;
        if (alive) {
            p->p_dead = false;
        }
        tp__mtx_unlock(&a->a_mtx);
    }
    tp_pipe_unref(pipe);
    if (alive) {
        TP_LOG_INFO("TP-RPC-SHUTDOWN-PROBE",
                    "rpc shutdown of %s (rank %d): %s (rank %d) %s after a "
                    "pipe with it failed (%s): waiting for it",
                    ag_name(a), a->a_rank, p->p_info.name, p->p_info.rank,
                    had ? "still has a connection up"
                        : "answers a new connection",
                    why);
    } else {
        size_t n = strlen(why);
        snprintf(why + n, why_len - n, "; a new connection to it %s%s",
                 err != NULL ? "failed: " : "failed",
                 err != NULL ? tp_error_message(err) : "");
    }
    tp_error_unref(err);
    return alive;
}

// Reads rank @r's record @key of a shutdown round, by @deadline. A worker
// whose pipe failed (it died, or shut down abruptly) will never write it:
// once its record is not there and a new connection to it fails
// (shutdown_probe), this fails at once with TP_ECONNRESET naming it,
// instead of waiting out the shutdown timeout.
static tp_status
shutdown_get(tp_agent *a, int r, const char *key, uint64_t deadline, void **v_p,
             size_t *len_p, tp_error **err_p)
{
    for (;;) {
        tp__mtx_lock(&a->a_mtx);
        ag_peer *p = &a->a_peers[r];
        bool dead = p->p_dead;
        char why[sizeof(p->p_dead_why) + 256]; // and the probe's
        memcpy(why, p->p_dead_why, sizeof(p->p_dead_why));
        tp__mtx_unlock(&a->a_mtx);
        // Known dead: only what it wrote before is there (no wait). Else
        // wait in slices, to notice a death meanwhile.
        int64_t ms = dead ? 1 : TP_MIN(tp__ms_left(deadline), 50);
        tp_error *err = NULL;
        tp_status st = tp_store_get(a->a_store, key, ms, v_p, len_p, &err);
        if (st == TP_ETIMEDOUT && dead) {
            tp_error_unref(err);
            if (shutdown_probe(a, p, deadline, why, sizeof(why))) {
                continue;
            }
            // Rank 0 does not wait for its exit record either.
            tp__mtx_lock(&a->a_mtx);
            a->a_peers[r].p_sd_missing = true;
            tp__mtx_unlock(&a->a_mtx);
            return tp__error_set(err_p, TP_ECONNRESET,
                                 "%s (rank %d) cannot take part in the "
                                 "shutdown: its pipe failed (%s)",
                                 a->a_peers[r].p_info.name, r, why);
        }
        if (st != TP_ETIMEDOUT || tp__now_ns() >= deadline) {
            if (err_p != NULL) {
                *err_p = err;
            } else {
                tp_error_unref(err);
            }
            return st;
        }
        tp_error_unref(err);
    }
}

// One round of the shutdown agreement: publish (pending, activity), read
// everyone's. Returns the sums.
tp_status
tp__ag_shutdown_round(tp_agent *a, int round, uint64_t deadline,
                      uint64_t *pending_p, uint64_t *activity_p,
                      tp_error **err_p)
{
    char key[128];
    char val[96];
    tp__mtx_lock(&a->a_mtx);
    uint64_t pend = a->a_npending, act = a->a_activity;
    uint64_t sent = a->a_notes_sent, recv = a->a_notes_recv;
    tp__mtx_unlock(&a->a_mtx);
    pend += tp__ag_proto_pending(a);
    // Notifications (one-way messages) in flight: sent by someone and not
    // yet received by anyone, counted from the sums of both.
    int n = snprintf(val, sizeof(val),
                     "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, pend, act,
                     sent, recv);
    snprintf(key, sizeof(key), "%sshutdown/%d/%d", a->a_prefix, round,
             a->a_rank);
    tp_status st = tp_store_set(a->a_store, key, val, (size_t)n,
                                tp__ms_left(deadline), err_p);
    if (st != TP_OK) {
        return st;
    }
    uint64_t sp = 0, sa = 0, ss = 0, sr = 0;
    for (int r = 0; r < a->a_world; r++) {
        snprintf(key, sizeof(key), "%sshutdown/%d/%d", a->a_prefix, round, r);
        void *v = NULL;
        size_t len = 0;
        tp_error *err = NULL;
        st = shutdown_get(a, r, key, deadline, &v, &len, &err);
        if (st != TP_OK) {
            if (st == TP_ETIMEDOUT) {
                // Name every worker still missing in this round.
                char stem[32];
                char missing[512];
                snprintf(stem, sizeof(stem), "shutdown/%d/", round);
                store_missing_ranks(a, stem, r, true, missing, sizeof(missing));
                tp__error_set(err_p, TP_ETIMEDOUT,
                              "timed out after %lld ms waiting for %s to %s "
                              "shutdown",
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
        unsigned long long p = 0, ac = 0, ns = 0, nr = 0;
        if (sscanf(v, "%llu %llu %llu %llu", &p, &ac, &ns, &nr) != 4) {
            free(v);
            return tp__error_set(err_p, TP_EPROTO,
                                 "malformed shutdown record of rank %d", r);
        }
        free(v);
        sp += p;
        sa += ac;
        ss += ns;
        sr += nr;
    }
    *pending_p = sp + (ss > sr ? ss - sr : 0);
    *activity_p = sa;
    return TP_OK;
}

// Graceful shutdown, last step: rank 0 hosts the store server, so it
// waits (until @deadline) for every other rank that took part in the
// shutdown to say it is done with the store before the store closes.
void
tp__ag_rendezvous_exit(tp_agent *a, uint64_t deadline)
{
    char key[128];
    snprintf(key, sizeof(key), "%sexit/%d", a->a_prefix, a->a_rank);
    tp_error *e = NULL;
    if (tp_store_set(a->a_store, key, "1", 1, tp__ms_left(deadline), &e) ==
            TP_OK &&
        a->a_rank == 0) {
        // Every worker left: the job is over, its keys go (a store that
        // outlives it, a file or a standalone server, keeps none of them).
        bool all_left = true;
        for (int r = 1; r < a->a_world; r++) {
            if (a->a_peers[r].p_sd_missing) {
                all_left = false;
                continue;
            }
            snprintf(key, sizeof(key), "%sexit/%d", a->a_prefix, r);
            const char *keys[1] = {key};
            if (tp_store_wait(a->a_store, keys, 1, tp__ms_left(deadline), &e) !=
                TP_OK) {
                all_left = false;
                break;
            }
        }
        if (all_left) {
            tp__store_job_end(a->a_store, AG_KEY_PREFIX, a->a_world, a->a_gen,
                              tp__ms_left(deadline));
        }
    }
    if (e != NULL) {
        TP_LOG_DEBUG("TP-RPC-SHUTDOWN", "rpc %s: %s", ag_name(a),
                     tp_error_message(e));
        tp_error_unref(e);
    }
}
