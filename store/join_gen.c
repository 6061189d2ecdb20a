// SPDX-License-Identifier: Apache-2.0
// join_gen.c - a rendezvous generation's record (g/<G>/info), the job's
// id, the generation's keys, the removal of old generations by the rank 0
// that opens a new one (join_int.h; the keys are listed in join.c), and of
// a job's own generation when it ends (join.h).

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/platform.h"
#include "store/join_int.h"
#include "store/store_int.h"

bool
tp__join_info_parse(const char *s, tp__join_info *ji)
{
    char job[JOIN_JOB_MAX + 1] = "-";
    int hosted = 0;
    memset(ji, 0, sizeof(*ji));
    int n = sscanf(s, "%d %lld %d %64s", &ji->ji_world, &ji->ji_expiry, &hosted,
                   job);
    if (n < 2) {
        return false;
    }
    ji->ji_hosted = n >= 3 && hosted == 1;
    snprintf(ji->ji_job, sizeof(ji->ji_job), "%s",
             n >= 4 && strcmp(job, "-") != 0 ? job : "");
    return true;
}

// This job's id, the same on every rank: TP_JOB_ID, else the launcher's
// (Slurm's job id, the PMIx namespace of mpirun or srun --mpi=pmix, Open
// MPI 4's job id, torchrun's run id), else "" (none). Only [A-Za-z0-9._:+-]
// are kept (others become '_'), at most JOIN_JOB_MAX characters.
void
tp__join_job_id(char *buf, size_t len)
{
    static const struct {
        const char *var, *tag;
    } srcs[] = {
        {"TP_JOB_ID", ""},
        {"SLURM_JOB_ID", "slurm-"},
        {"PMIX_NAMESPACE", "pmix-"},
        {"OMPI_MCA_orte_ess_jobid", "ompi-"},
        {"TORCHELASTIC_RUN_ID", "torch-"},
    };
    char tmp[160] = "";
    for (size_t i = 0; i < TP_ARRAY_LEN(srcs); i++) {
        const char *v = getenv(srcs[i].var);
        // torchrun's default run id is "none".
        if (v != NULL && *v != '\0' && !(i == 4 && strcmp(v, "none") == 0)) {
            snprintf(tmp, sizeof(tmp), "%s%s", srcs[i].tag, v);
            break;
        }
    }
    size_t k = 0;
    for (size_t i = 0; tmp[i] != '\0' && k + 1 < len && k < JOIN_JOB_MAX; i++) {
        unsigned char c = (unsigned char)tmp[i];
        buf[k++] = isalnum(c) || strchr("._:+-", c) != NULL ? (char)c : '_';
    }
    buf[k] = '\0';
}

// "job \"ID\"" or "a job with no id" (for messages).
void
tp__join_job_label(const char *job, char *buf, size_t len)
{
    if (job[0] != '\0') {
        snprintf(buf, len, "job \"%s\"", job);
    } else {
        snprintf(buf, len, "a job with no id (TP_JOB_ID)");
    }
}

int64_t
tp__join_realtime_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
tp__join_key(const tp__store_member *j, int64_t gen, const char *leaf,
             char *buf, size_t len)
{
    snprintf(buf, len, "%sg/%" PRId64 "/%s", j->j_ns, gen, leaf);
}

// The value of @key now (*@v_p NULL when it is not set). Store errors
// other than "not set" are returned.
tp_status
tp__join_peek(tp__store_member *j, const char *key, char **v_p,
              tp_error **err_p)
{
    void *v = NULL;
    size_t len = 0;
    tp_error *e = NULL;
    *v_p = NULL;
    tp_status st = tp_store_get(j->j_store, key, 1, &v, &len, &e);
    if (st == TP_ETIMEDOUT) {
        tp_error_unref(e);
        return TP_OK;
    }
    if (st != TP_OK) {
        if (err_p != NULL) {
            *err_p = e;
        } else {
            tp_error_unref(e);
        }
        return st;
    }
    *v_p = v;
    return TP_OK;
}

// Removes generation @gen's join keys, its record first: a generation
// without one is gone to every reader (one still being removed must not
// look open: its record without its "done"). With @users, also what its
// users published under "<ns>w<world>/<gen>/" (tp_pg_init's and
// tp_rpc_init's addresses, and their later keys): only for a generation
// that never completed, since a complete one may still be in use (a
// process may hold two groups of one job at once).
static void
join_remove_within(tp__store_member *j, int64_t gen, int world, bool users,
                   int64_t timeout_ms)
{
    char key[96];
    tp_error *e = NULL;
    tp__join_key(j, gen, "info", key, sizeof(key));
    (void)tp_store_delete_key(j->j_store, key, timeout_ms, NULL, &e);
    tp_error_unref(e);
    e = NULL;
    tp__join_key(j, gen, "", key, sizeof(key));
    (void)tp__store_delete_prefix(j->j_store, key, timeout_ms, NULL, &e);
    tp_error_unref(e);
    e = NULL;
    if (users) {
        snprintf(key, sizeof(key), "%sw%d/%" PRId64 "/", j->j_ns, world, gen);
        (void)tp__store_delete_prefix(j->j_store, key, timeout_ms, NULL, &e);
        tp_error_unref(e);
    }
}

static void
join_remove(tp__store_member *j, int64_t gen, int world, bool users)
{
    join_remove_within(j, gen, world, users, TP_TIMEOUT_DEFAULT);
}

// Rank 0, having opened generation @mine: removes the join keys of older
// generations that are over: failed, or past their deadline without
// completing, or complete and of this job (superseded by this one: a
// relaunch), and the users' keys of those that never completed. A
// complete generation of another job may be running: it stays. Bounded
// (JOIN_CLEAN_MAX generations from the "clean" mark, which advances over the
// leading ones gone) and best effort: a store error leaves the rest for the
// next rank 0.
void
tp__join_clean(tp__store_member *j, int64_t mine)
{
    char key[96], mark_key[64], *mark = NULL;
    snprintf(mark_key, sizeof(mark_key), "%sclean", j->j_ns);
    if (tp__join_peek(j, mark_key, &mark, NULL) != TP_OK) {
        return;
    }
    long long low = mark != NULL ? strtoll(mark, NULL, 10) : 0;
    if (low < 0 || low > mine) {
        low = 0;
    }
    int64_t now = tp__join_realtime_ms();
    int64_t next = low;
    bool leading = true;
    for (int64_t g = low; g < mine && g < low + JOIN_CLEAN_MAX; g++) {
        char *info = NULL, *done = NULL, *failed = NULL;
        tp__join_key(j, g, "info", key, sizeof(key));
        if (tp__join_peek(j, key, &info, NULL) != TP_OK) {
            break;
        }
        tp__join_info ji;
        bool gone = false;
        if (info == NULL || !tp__join_info_parse(info, &ji)) {
            // Removed already, or (just older than ours) its rank 0 is
            // about to set it.
            gone = g + 1 < mine;
        } else {
            tp__join_key(j, g, "done", key, sizeof(key));
            (void)tp__join_peek(j, key, &done, NULL);
            tp__join_key(j, g, "failed", key, sizeof(key));
            (void)tp__join_peek(j, key, &failed, NULL);
            bool expired = done == NULL && ji.ji_expiry != 0 &&
                           now > ji.ji_expiry + JOIN_EXPIRY_SLACK_MS;
            bool superseded = done != NULL && strcmp(ji.ji_job, j->j_job) == 0;
            if (failed != NULL || expired || superseded) {
                join_remove(j, g, ji.ji_world,
                            done == NULL && (failed != NULL || expired));
                gone = true;
            }
        }
        free(info);
        free(done);
        free(failed);
        leading = leading && gone;
        if (leading) {
            next = g + 1;
        }
    }
    if (next != low) {
        char nv[32];
        int n = snprintf(nv, sizeof(nv), "%lld", (long long)next);
        void *v = NULL;
        size_t len = 0;
        tp_error *e = NULL;
        // Another rank 0 may have moved it: then it did this work too.
        if (tp_store_compare_set(j->j_store, mark_key, mark ? mark : "",
                                 mark ? strlen(mark) : 0, nv, (size_t)n,
                                 TP_TIMEOUT_DEFAULT, &v, &len, &e) == TP_OK) {
            free(v);
        }
        tp_error_unref(e);
    }
    free(mark);
}

// The end of a job: removes generation @gen of namespace @ns (world size
// @world), its join keys and what its users published. Best effort, each
// removal bounded by @timeout_ms.
void
tp__store_job_end(tp_store *store, const char *ns, int world, int64_t gen,
                  int64_t timeout_ms)
{
    if (store == NULL || gen < 0) {
        return;
    }
    tp__store_member j = {.j_store = store, .j_world = world, .j_gen = gen};
    snprintf(j.j_ns, sizeof(j.j_ns), "%s", ns);
    join_remove_within(&j, gen, world, true, timeout_ms);
}

tp_status
tp__store_job_leave(tp_store *store, const char *ns, int world, int64_t gen,
                    int64_t timeout_ms, tp_error **err_p)
{
    if (store == NULL || gen < 0 || world < 1) {
        return TP_OK;
    }
    char key[96];
    snprintf(key, sizeof(key), "%sw%d/%" PRId64 "/left", ns, world, gen);
    int64_t left = 0;
    tp_status st = tp_store_add(store, key, 1, timeout_ms, &left, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (left == world) {
        tp__store_job_end(store, ns, world, gen, timeout_ms);
    }
    return TP_OK;
}
