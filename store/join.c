// SPDX-License-Identifier: Apache-2.0
// join.c - joining a generation of a rendezvous on a store (join.h);
// join_gen.c has a generation's record, the job's id and the removal of
// old generations (join_int.h).
//
// Keys, under the namespace @ns ("tp.pg/"):
//   open              generations opened so far (rank 0 adds 1)
//   clean             the oldest generation whose keys may remain (rank 0s
//                     advance it with compare_set as they remove them)
//   g/<G>/info        "<world size> <expiry> <hosted> <job>" (rank 0;
//                     expiry: realtime ms of its init deadline, 0 for none;
//                     hosted: 1 when rank 0's process hosts the store; job:
//                     the job's id, "-" for none)
//   g/<G>/slot/<r>    the process holding rank r ("host pid N #k"),
//                     claimed with compare_set
//   g/<G>/failed      "c <realtime ms> <message>" (a conflict) or "a ..."
//                     (abandoned: a member gave up), first post wins
//   g/<G>/done        set once rank 0 finished its init
// Why generations at all: a file or a standalone server outlives a job,
// and the next job must not read the last one's addresses.
// Why job ids: two jobs on one store at once must not join each other's
// generations. A rank joins only generations of its own job (the same id,
// or both none), so concurrent jobs with ids are kept apart; a rank that
// finds its store hosted by another job's rank 0 fails at once.
// Why "hosted": a store that rank 0's process hosts answers only while that
// process lives, so a complete generation there is a running job and a
// second claimant of one of its ranks fails at once. Elsewhere (a file, a
// standalone server) a complete generation may be a killed job's, whose
// ranks' processes only this host can see (a second claimant seen alive
// here fails after JOIN_TAKEN_WAIT_MS; one on another host waits for a
// newer generation).

#include "store/join.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/platform.h"
#include "store/join_int.h"
#include "store/store_int.h"

// A conflict posted this recently to the newest generation is this job's,
// even when this rank arrived after it.
#define JOIN_CONFLICT_RECENT_MS 5000
#define JOIN_SLICE_MS           50
// How long a rank that found its slot taken waits for a newer generation
// before it reports a rank used twice.
#define JOIN_TAKEN_WAIT_MS 1000
// Generations a rank looks back over for its own job's newest.
#define JOIN_SCAN_MAX 32

// At most @cap ms of a wait bounded by @deadline. tp__ms_left gives 0 for
// no deadline, which a store call reads as "no limit": a slice must not.
static int64_t
join_slice(uint64_t deadline, int64_t cap)
{
    int64_t left = tp__ms_left(deadline);
    return left == 0 ? cap : TP_MIN(left, cap);
}

// Generations opened so far.
static tp_status
join_opened(tp__store_member *j, int64_t *n_p, tp_error **err_p)
{
    char key[64];
    snprintf(key, sizeof(key), "%sopen", j->j_ns);
    return tp_store_add(j->j_store, key, 0, TP_TIMEOUT_DEFAULT, n_p, err_p);
}

void
tp__store_join_fail(tp__store_member *j, bool conflict, const char *msg)
{
    char key[96];
    char val[768];
    tp__join_key(j, j->j_gen, "failed", key, sizeof(key));
    int n = snprintf(val, sizeof(val), "%c %" PRId64 " %s",
                     conflict ? 'c' : 'a', tp__join_realtime_ms(), msg);
    if (n < 0 || (size_t)n >= sizeof(val)) {
        n = (int)strlen(val);
    }
    void *v = NULL;
    size_t len = 0;
    tp_error *e = NULL;
    if (tp_store_compare_set(j->j_store, key, "", 0, val, (size_t)n,
                             TP_TIMEOUT_DEFAULT, &v, &len, &e) == TP_OK) {
        free(v);
    }
    tp_error_unref(e);
    e = NULL;
    // Read by rank 0's linger (a store it hosts stays up until then).
    char leaf[32];
    snprintf(leaf, sizeof(leaf), "seen/%d", j->j_rank);
    tp__join_key(j, j->j_gen, leaf, key, sizeof(key));
    (void)tp_store_set(j->j_store, key, "1", 1, TP_TIMEOUT_DEFAULT, &e);
    tp_error_unref(e);
}

void
tp__store_join_linger(tp__store_member *j, int64_t ms)
{
    uint64_t deadline = tp__deadline_after_ms(ms);
    for (int r = 1; r < j->j_world; r++) {
        char key[96];
        char leaf[32];
        char *slot = NULL;
        snprintf(leaf, sizeof(leaf), "slot/%d", r);
        tp__join_key(j, j->j_gen, leaf, key, sizeof(key));
        if (tp__join_peek(j, key, &slot, NULL) != TP_OK || slot == NULL) {
            continue; // nobody holds it: nobody to wait for
        }
        free(slot);
        snprintf(leaf, sizeof(leaf), "seen/%d", r);
        tp__join_key(j, j->j_gen, leaf, key, sizeof(key));
        const char *keys[1] = {key};
        tp_error *e = NULL;
        tp_status st =
            tp_store_wait(j->j_store, keys, 1, tp__ms_left(deadline), &e);
        tp_error_unref(e);
        if (st != TP_OK) {
            return;
        }
    }
}

void
tp__store_join_done(tp__store_member *j)
{
    char key[96];
    tp__join_key(j, j->j_gen, "done", key, sizeof(key));
    tp_error *e = NULL;
    (void)tp_store_set(j->j_store, key, "1", 1, TP_TIMEOUT_DEFAULT, &e);
    tp_error_unref(e);
}

// Fails with the message of a failed-generation record @rec.
static tp_status
join_failed_error(tp__store_member *j, const char *rec, tp_error **err_p)
{
    const char *msg = rec;
    const char *sp = strchr(rec, ' ');
    if (sp != NULL) {
        sp = strchr(sp + 1, ' ');
        if (sp != NULL) {
            msg = sp + 1;
        }
    }
    // A member that gave up on a timeout makes the others' init a
    // timeout too (what they were waiting for will not come).
    tp_status st = rec[0] == 'a' && strstr(msg, "timed out") != NULL
                       ? TP_ETIMEDOUT
                       : TP_EINVAL;
    return tp__error_set(err_p, st, "the rendezvous through %s failed: %s%s",
                         tp_store_addr(j->j_store),
                         rec[0] == 'a' ? "another member gave up: " : "", msg);
}

// Posts @msg as a conflict of generation @gen and fails with it.
static tp_status
join_conflict(tp__store_member *j, int64_t gen, const char *msg,
              tp_error **err_p)
{
    int64_t mine = j->j_gen;
    j->j_gen = gen;
    tp__store_join_fail(j, true, msg);
    j->j_gen = mine;
    return tp__error_set(err_p, TP_EINVAL,
                         "the rendezvous through %s failed: %s",
                         tp_store_addr(j->j_store), msg);
}

static tp_status
join_open(tp__store_member *j, int64_t init_ms, uint64_t deadline,
          tp_error **err_p)
{
    char key[96];
    int64_t n = 0;
    snprintf(key, sizeof(key), "%sopen", j->j_ns);
    tp_status st =
        tp_store_add(j->j_store, key, 1, tp__ms_left(deadline), &n, err_p);
    if (st != TP_OK) {
        return st;
    }
    j->j_gen = n - 1;
    // The slot first: a rank that finds the info finds rank 0 in place.
    tp__join_key(j, j->j_gen, "slot/0", key, sizeof(key));
    void *v = NULL;
    size_t len = 0;
    st = tp_store_compare_set(j->j_store, key, "", 0, j->j_token,
                              strlen(j->j_token), tp__ms_left(deadline), &v,
                              &len, err_p);
    if (st != TP_OK) {
        return st;
    }
    free(v);
    char info[160];
    int64_t expiry = init_ms > 0 ? tp__join_realtime_ms() + init_ms : 0;
    j->j_hosted = tp__store_is_host(j->j_store);
    int in =
        snprintf(info, sizeof(info), "%d %" PRId64 " %d %s", j->j_world, expiry,
                 j->j_hosted ? 1 : 0, j->j_job[0] != '\0' ? j->j_job : "-");
    tp__join_key(j, j->j_gen, "info", key, sizeof(key));
    st = tp_store_set(j->j_store, key, info, (size_t)in, tp__ms_left(deadline),
                      err_p);
    if (st == TP_OK) {
        tp__join_clean(j, j->j_gen);
    }
    return st;
}

// Whether a slot holder's token ("<host> pid <pid> #<n>") names a live
// process of this host.
static bool
join_holder_alive_here(const char *token)
{
    char host[256], me[256];
    int pid = 0;
    if (sscanf(token, "%255s pid %d", host, &pid) != 2 || pid <= 0 ||
        gethostname(me, sizeof(me)) != 0) {
        return false;
    }
    me[sizeof(me) - 1] = '\0';
    if (strncmp(host, me, 64) != 0) {
        return false;
    }
    return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

// Whether a slot holder's token names this very process (an earlier
// membership of it, over since it joins again).
static bool
join_holder_is_me(const char *token)
{
    char host[256], me[256];
    int pid = 0;
    if (sscanf(token, "%255s pid %d", host, &pid) != 2 ||
        gethostname(me, sizeof(me)) != 0) {
        return false;
    }
    me[sizeof(me) - 1] = '\0';
    return strncmp(host, me, 64) == 0 && pid == (int)getpid();
}

// Generation @gen's state, for a rank other than 0: whether to join it
// (*@joined_p), to look at older generations for this job's (*@skip_p:
// another job's, or gone), and if not, why (@why, for the timeout
// message) or, when its slot is taken, by whom (@holder). @wait_ms: how
// long its record may take to appear (rank 0 adds, then sets it). Fails
// on a conflict that is this job's, on a second claimant of a rank of a
// running job on a store its rank 0 hosts, and on a store hosted by
// another job's rank 0.
static tp_status
join_try(tp__store_member *j, int64_t gen, int64_t wait_ms, bool opened_since,
         bool *joined_p, bool *skip_p, char *holder, size_t holder_len,
         char *why, size_t why_len, uint64_t deadline, tp_error **err_p)
{
    char key[96];
    char *info = NULL, *failed = NULL, *done = NULL;
    *joined_p = false;
    *skip_p = false;
    // Its state before its record: a rank 0 removing the generation
    // (join_remove) takes the record first, so a state read as unset here
    // is either real or followed by a missing record.
    tp__join_key(j, gen, "failed", key, sizeof(key));
    tp_status st = tp__join_peek(j, key, &failed, err_p);
    if (st == TP_OK) {
        tp__join_key(j, gen, "done", key, sizeof(key));
        st = tp__join_peek(j, key, &done, err_p);
    }
    if (st != TP_OK) {
        goto out;
    }
    tp__join_key(j, gen, "info", key, sizeof(key));
    void *v = NULL;
    size_t len = 0;
    tp_error *e = NULL;
    st = tp_store_get(j->j_store, key, join_slice(deadline, wait_ms), &v, &len,
                      &e);
    if (st == TP_ETIMEDOUT) {
        tp_error_unref(e);
        snprintf(why, why_len, "generation %" PRId64 " has no world size", gen);
        *skip_p = wait_ms <= 1; // an older one: removed
        st = TP_OK;
        goto out;
    }
    if (st != TP_OK) {
        if (err_p != NULL) {
            *err_p = e;
        } else {
            tp_error_unref(e);
        }
        goto out;
    }
    info = v;
    tp__join_info ji;
    if (!tp__join_info_parse(info, &ji)) {
        st = tp__error_set(err_p, TP_EPROTO,
                           "rendezvous through %s: malformed record \"%.64s\" "
                           "of generation %" PRId64,
                           tp_store_addr(j->j_store), info, gen);
        goto out;
    }
    int w0 = ji.ji_world;
    int64_t now = tp__join_realtime_ms();
    bool expired = done == NULL && ji.ji_expiry != 0 &&
                   now > ji.ji_expiry + JOIN_EXPIRY_SLACK_MS;
    char mine[96], theirs[96];
    tp__join_job_label(j->j_job, mine, sizeof(mine));
    tp__join_job_label(ji.ji_job, theirs, sizeof(theirs));
    if (strcmp(ji.ji_job, j->j_job) != 0) {
        snprintf(why, why_len, "generation %" PRId64 " is %s's", gen, theirs);
        *skip_p = true;
        // The store lives in that job's rank 0 (it answers: alive): this
        // job's rank 0 cannot host it, so no generation of ours comes.
        if (ji.ji_hosted && failed == NULL && !expired) {
            st = tp__error_set(
                err_p, TP_EINVAL,
                "the rendezvous through %s failed: the store is hosted by "
                "rank 0 of another job (%s, generation %" PRId64
                ", world %d, %s), but rank %d is of %s: two jobs given one "
                "store address (MASTER_ADDR:MASTER_PORT)? Give each job its "
                "own",
                tp_store_addr(j->j_store), theirs, gen, w0,
                done != NULL ? "running" : "in its init", j->j_rank, mine);
        }
        goto out;
    }
    if (done != NULL) {
        snprintf(why, why_len, "generation %" PRId64 " is complete", gen);
        // A running job holds every slot. If ours is held by another
        // process and the job is known to run (its rank 0 hosts this
        // store), this is a second claimant: fail at once. A holder of
        // this host that is still alive is one too, unless a newer
        // generation opens soon (the caller waits JOIN_TAKEN_WAIT_MS: the
        // same processes may start their next job). Otherwise the job may
        // have ended: a newer generation is waited for.
        char slot[32];
        snprintf(slot, sizeof(slot), "slot/%d", j->j_rank);
        tp__join_key(j, gen, slot, key, sizeof(key));
        char *hold = NULL;
        if (tp__join_peek(j, key, &hold, NULL) == TP_OK && hold != NULL &&
            !join_holder_is_me(hold)) {
            if (ji.ji_hosted) {
                st = tp__error_set(
                    err_p, TP_EINVAL,
                    "the rendezvous through %s failed: rank %d is claimed by "
                    "two processes at once: %.96s holds it in %s (generation "
                    "%" PRId64 ", world %d, its init complete, its rank 0 "
                    "hosting the store), and a second process, %s, claims it",
                    tp_store_addr(j->j_store), j->j_rank, hold, mine, gen, w0,
                    j->j_token);
            } else if (join_holder_alive_here(hold)) {
                snprintf(holder, holder_len, "%s", hold);
            }
        }
        free(hold);
        goto out;
    }
    if (expired) {
        snprintf(why, why_len, "generation %" PRId64 " is past its deadline",
                 gen);
        goto out;
    }
    if (failed != NULL) {
        long long when = 0;
        bool recent = sscanf(failed + 1, " %lld", &when) == 1 &&
                      now - when < JOIN_CONFLICT_RECENT_MS;
        if (failed[0] == 'c' && (opened_since || recent)) {
            st = join_failed_error(j, failed, err_p);
        } else {
            snprintf(why, why_len, "generation %" PRId64 " failed: %.200s", gen,
                     failed);
        }
        goto out;
    }
    char msg[512];
    if (w0 != j->j_world) {
        snprintf(msg, sizeof(msg),
                 "rank %d says the world size is %d, rank 0 says %d", j->j_rank,
                 j->j_world, w0);
        st = join_conflict(j, gen, msg, err_p);
        goto out;
    }
    char slot[32];
    snprintf(slot, sizeof(slot), "slot/%d", j->j_rank);
    tp__join_key(j, gen, slot, key, sizeof(key));
    v = NULL;
    st = tp_store_compare_set(j->j_store, key, "", 0, j->j_token,
                              strlen(j->j_token), tp__ms_left(deadline), &v,
                              &len, err_p);
    if (st != TP_OK) {
        goto out;
    }
    if (len != strlen(j->j_token) || memcmp(v, j->j_token, len) != 0) {
        // The caller decides: a duplicate, or a stale slot of a job killed
        // in its init (then a newer generation opens soon).
        snprintf(holder, holder_len, "%s", (const char *)v);
        free(v);
        goto out;
    }
    free(v);
    j->j_gen = gen;
    j->j_hosted = ji.ji_hosted;
    *joined_p = true;
out:
    free(info);
    free(failed);
    free(done);
    return st;
}

tp_status
tp__store_join(tp_store *store, const char *ns, int rank, int world,
               int64_t init_ms, uint64_t deadline, tp__store_member *j,
               tp_error **err_p)
{
    static atomic_uint seq;
    memset(j, 0, sizeof(*j));
    j->j_store = store;
    snprintf(j->j_ns, sizeof(j->j_ns), "%s", ns);
    j->j_rank = rank;
    j->j_world = world;
    char host[64] = "?";
    if (gethostname(host, sizeof(host)) != 0) {
        snprintf(host, sizeof(host), "?");
    }
    host[sizeof(host) - 1] = '\0';
    snprintf(j->j_token, sizeof(j->j_token), "%.64s pid %d #%u", host,
             (int)getpid(),
             atomic_fetch_add_explicit(&seq, 1, memory_order_relaxed));
    tp__join_job_id(j->j_job, sizeof(j->j_job));
    if (rank == 0) {
        return join_open(j, init_ms, deadline, err_p);
    }
    int64_t first = -1;
    char why[320] = "no generation was opened";
    // A slot found taken: a conflict unless a newer generation opens
    // within JOIN_TAKEN_WAIT_MS (the taken one was a killed job's).
    int64_t taken_gen = -1;
    uint64_t taken_dl = 0;
    char holder[128] = "";
    for (;;) {
        int64_t n = 0;
        tp_status st = join_opened(j, &n, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (first < 0) {
            first = n;
        }
        // This job's newest generation: the newest one, or, past other
        // jobs' (and removed ones), an older one.
        for (int64_t g = n - 1; g >= 0 && g > n - 1 - JOIN_SCAN_MAX; g--) {
            if (g == taken_gen) {
                break;
            }
            bool joined = false, skip = false;
            holder[0] = '\0';
            st = join_try(j, g, g == n - 1 ? 2000 : 1, n > first, &joined,
                          &skip, holder, sizeof(holder), why, sizeof(why),
                          deadline, err_p);
            if (st != TP_OK || joined) {
                return st;
            }
            if (holder[0] != '\0') {
                taken_gen = g;
                taken_dl = tp__deadline_after_ms(JOIN_TAKEN_WAIT_MS);
            }
            if (!skip) {
                break;
            }
        }
        uint64_t now = tp__now_ns();
        if (taken_gen >= 0 && (now >= taken_dl || now >= deadline)) {
            char msg[512];
            snprintf(msg, sizeof(msg),
                     "rank %d is claimed by two processes at once: %.96s and "
                     "%.96s",
                     j->j_rank, holder, j->j_token);
            return join_conflict(j, taken_gen, msg, err_p);
        }
        if (now >= deadline) {
            char mine[96];
            tp__join_job_label(j->j_job, mine, sizeof(mine));
            return tp__error_set(err_p, TP_ETIMEDOUT,
                                 "rendezvous through %s: timed out waiting "
                                 "for rank 0 of %s to open a generation (the "
                                 "newest found: %s)",
                                 tp_store_addr(store), mine, why);
        }
        // Wait for rank 0 to open generation n.
        char key[96];
        tp__join_key(j, n, "info", key, sizeof(key));
        void *v = NULL;
        size_t len = 0;
        tp_error *e = NULL;
        int64_t slice = join_slice(deadline, 500);
        if (taken_gen >= 0) {
            slice = TP_MIN(slice, join_slice(taken_dl, 500));
        }
        st = tp_store_get(store, key, slice, &v, &len, &e);
        if (st != TP_OK && st != TP_ETIMEDOUT) {
            if (err_p != NULL) {
                *err_p = e;
            } else {
                tp_error_unref(e);
            }
            return st;
        }
        tp_error_unref(e);
        free(v);
    }
}

tp_status
tp__store_join_check(tp__store_member *j, tp_error **err_p)
{
    int64_t n = 0;
    tp_status st = join_opened(j, &n, err_p);
    if (st != TP_OK) {
        return st;
    }
    char key[96];
    char msg[512];
    // The newest generation of this job opened after ours (another job's
    // do not count; one whose record is not set yet is seen next time).
    int64_t newer = -1;
    for (int64_t g = n - 1;
         g > j->j_gen && g > n - 1 - JOIN_SCAN_MAX && newer < 0; g--) {
        char *info = NULL;
        tp__join_info ji;
        tp__join_key(j, g, "info", key, sizeof(key));
        st = tp__join_peek(j, key, &info, err_p);
        if (st != TP_OK) {
            return st;
        }
        if (info != NULL && tp__join_info_parse(info, &ji) &&
            strcmp(ji.ji_job, j->j_job) == 0) {
            newer = g;
        }
        free(info);
    }
    if (newer >= 0) {
        n = newer + 1;
        if (j->j_rank == 0) {
            // Only rank 0 opens generations: a newer one while this one
            // is being joined is another process as rank 0.
            snprintf(msg, sizeof(msg),
                     "rank 0 is claimed by two processes at once: %.96s "
                     "(generation %" PRId64 ") and another (generation "
                     "%" PRId64 ")",
                     j->j_token, j->j_gen, n - 1);
            int64_t mine = j->j_gen;
            j->j_gen = n - 1;
            tp__store_join_fail(j, true, msg);
            j->j_gen = mine;
            return join_conflict(j, mine, msg, err_p);
        }
        // Rank 0 of this generation is gone (a job killed in its init) and
        // the next job's opened another: leave for it.
        snprintf(msg, sizeof(msg),
                 "rank %d left for the newer generation %" PRId64, j->j_rank,
                 n - 1);
        tp__store_join_fail(j, false, msg);
        return tp__error_set(err_p, TP_EAGAIN,
                             "rendezvous through %s: generation %" PRId64
                             " superseded by %" PRId64,
                             tp_store_addr(j->j_store), j->j_gen, n - 1);
    }
    char *failed = NULL;
    tp__join_key(j, j->j_gen, "failed", key, sizeof(key));
    st = tp__join_peek(j, key, &failed, err_p);
    if (st != TP_OK || failed == NULL) {
        return st;
    }
    st = join_failed_error(j, failed, err_p);
    free(failed);
    return st;
}

tp_status
tp__store_join_get(tp__store_member *j, const char *key, uint64_t deadline,
                   void **val_p, size_t *len_p, tp_error **err_p)
{
    for (;;) {
        int64_t left = tp__ms_left(deadline);
        bool last = deadline != UINT64_MAX && left <= JOIN_SLICE_MS;
        tp_error *e = NULL;
        tp_status st = tp_store_get(
            j->j_store, key, last ? left : JOIN_SLICE_MS, val_p, len_p, &e);
        if (st != TP_ETIMEDOUT || last) {
            if (err_p != NULL) {
                *err_p = e;
            } else {
                tp_error_unref(e);
            }
            return st;
        }
        tp_error_unref(e);
        st = tp__store_join_check(j, err_p);
        if (st != TP_OK) {
            return st;
        }
    }
}
