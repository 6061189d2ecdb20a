/* SPDX-License-Identifier: Apache-2.0 */
/* join.h (internal) - the join step of a rendezvous on a store that may
 * outlive a job (a file, a standalone server) or be shared by several
 * users (RPC and a process group): rank 0 opens a generation and records
 * its world size, each other rank claims its slot in the newest open
 * generation with compare_set. A conflict (another world size, a slot
 * already taken, a second rank 0) is posted to the generation, so every
 * member waiting in it fails at once with the same message instead of at
 * its deadline. docs/store.md, "Joining a generation", has the keys. */
#ifndef TP_STORE_JOIN_H
#define TP_STORE_JOIN_H

#include <stdbool.h>
#include <stdint.h>
#include <tpipe/store.h>

#include "core/error.h"

typedef struct tp__store_member {
    tp_store *j_store; // borrowed
    char j_ns[32];     // key namespace, e.g. "tp.pg/"
    int j_rank;
    int j_world;
    int64_t j_gen; // the generation joined
    char j_token[96];
    char j_job[72]; // this job's id (TP_JOB_ID, Slurm, PMIx, torchrun); ""
    bool j_hosted;  // rank 0's process hosts the store (its record says)
} tp__store_member;

/**
 * tp__store_join - join a generation of namespace @ns on @store as @rank of
 * @world, by @deadline (monotonic ns). Rank 0 opens a new generation,
 * recording its world size, the job's id and whether it hosts the store,
 * and removes the keys of older generations that are over; another rank
 * claims its slot in the newest open generation of its own job (the same
 * id: TP_JOB_ID, else the launcher's), waiting for rank 0 to open one when
 * there is none. A generation is open while it is not failed, not marked
 * done and not past its opener's init deadline (+2 s), so an abandoned
 * job's generation is not joined. @init_ms is the init timeout (0: none),
 * recorded by rank 0 for that expiry.
 * Errors: TP_EINVAL (another world size, the slot taken, a conflict posted
 *   to the generation; at once: the slot held in a complete generation of
 *   a store its rank 0 hosts, or the store hosted by another job's rank
 *   0), TP_ETIMEDOUT (no generation opened), the store's. A conflict found
 *   here is posted to the generation first.
 */
tp_status tp__store_join(tp_store *store, const char *ns, int rank, int world,
                         int64_t init_ms, uint64_t deadline,
                         tp__store_member *j, tp_error **err_p);

/**
 * tp__store_join_check - fails if a conflict was posted to @j's generation,
 * or a newer generation of the same job was opened while this one is not
 * done (rank 0: a second rank 0, posted to both; another rank: the
 * generation is abandoned). Never waits long (a few store calls).
 */
tp_status tp__store_join_check(tp__store_member *j, tp_error **err_p);

/**
 * tp__store_join_get - tp_store_get of @key by @deadline, in slices of 50
 * ms with tp__store_join_check between them.
 */
tp_status tp__store_join_get(tp__store_member *j, const char *key,
                             uint64_t deadline, void **val_p, size_t *len_p,
                             tp_error **err_p);

/** tp__store_join_fail - posts @msg to @j's generation as a conflict
 * (@conflict: every member fails with it) or as its abandonment (later
 * jobs skip it). The first post wins. Also records that this rank has
 * seen the failure (for tp__store_join_linger). */
void tp__store_join_fail(tp__store_member *j, bool conflict, const char *msg);

/** tp__store_join_linger - rank 0, after a failure it posted or found:
 * waits (at most @ms) until every other rank holding a slot has posted
 * its own failure, so that a store this process hosts stays up until they
 * have read the message. */
void tp__store_join_linger(tp__store_member *j, int64_t ms);

/** tp__store_join_done - marks @j's generation complete: a later rank
 * that finds it waits for a newer one. */
void tp__store_join_done(tp__store_member *j);

/**
 * tp__store_job_end - the end of a job: removes generation @gen of
 * namespace @ns (world size @world) from @store: its join keys (the
 * record first) and what its users published under "<ns>w<world>/<gen>/".
 * Call it when no member uses them any more (the RPC agent's rank 0 after
 * every worker said it left in a graceful shutdown). Best effort: each
 * removal is bounded by @timeout_ms, errors are ignored (a later rank 0
 * removes what is left of an over generation of its job).
 */
void tp__store_job_end(tp_store *store, const char *ns, int world, int64_t gen,
                       int64_t timeout_ms);

/**
 * tp__store_job_leave - a member of generation @gen leaves for good (a
 * process group destroyed): counts it in "<ns>w<world>/<gen>/left"; the
 * last of the @world members to leave removes the generation
 * (tp__store_job_end). Needs no other member: nobody waits. Errors: the
 * store's (e.g. a store its rank 0 hosted is gone with it), within
 * @timeout_ms; nothing is removed then.
 */
tp_status tp__store_job_leave(tp_store *store, const char *ns, int world,
                              int64_t gen, int64_t timeout_ms,
                              tp_error **err_p);

#endif
