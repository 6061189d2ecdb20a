/* SPDX-License-Identifier: Apache-2.0 */
/* shm.h (internal) - the shared-memory engine: collectives of a group
 * whose members all run on one host, on a segment the members map, with
 * cross-memory attach (process_vm_readv) for contributions larger than a
 * slot. See docs/collectives.md (Engines). */
#ifndef TP_COLLECTIVES_SHM_H
#define TP_COLLECTIVES_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tpipe/error.h>
#include <tpipe/store.h>

#include "collectives/coll.h"

typedef struct tp__shm tp__shm;

typedef struct tp__shm_setup {
    tp_store *store;        // borrowed for the call
    const char *prefix;     // store keys of this group: <prefix>shm/...
    int rank;               // group rank
    int size;               // group size
    const int *world_ranks; // [size], for messages
    const char *group;      // group name, for messages
    size_t slot_bytes;      // per-rank slot (TP_COLL_SHM_SLOT)
    uint64_t deadline_ns;   // tp__now_ns() clock
} tp__shm_setup;

// Collective over the group's members. TP_OK with *@shm_p set: every
// member mapped the segment and can reach every other with cross-memory
// attach. TP_OK with *@shm_p NULL: the engine cannot be used (every member
// gets the same answer; @why says which rank could not and why). Other
// statuses: the store failed or the deadline passed (naming the ranks).
// Store keys: "<prefix>shm/name" (set by rank 0) and "<prefix>shm/ok/<rank>"
// (every rank); @prefix must be unique per group and per open. Rank 0
// unlinks the segment's name before returning, so /dev/shm keeps nothing.
// Also makes this process readable by its peers (tp__cma_allow_peers).
tp_status tp__shm_open(const tp__shm_setup *s, tp__shm **shm_p, char *why,
                       size_t why_len, tp_error **err_p);

// Runs one collective (coll.h) as this member. Every member runs the same
// sequence of collectives. Results are bitwise identical on every rank.
// Errors: TP_ETIMEDOUT at @deadline_ns naming the rank waited for and the
// collective; TP_ECONNRESET when a member exited (naming its rank and
// pid, within ~100 ms); errors of process_vm_readv naming the rank. After
// an error the segment's state is undefined: the caller stops using it.
tp_status tp__shm_run(tp__shm *shm, const tp__coll_args *a,
                      uint64_t deadline_ns, tp_error **err_p);

// Whether this process could use the engine (`tpipe info`): cross-memory
// attach works (tp__cma_viable) and /dev/shm takes a small segment
// (created, reserved and unlinked). On false @why says which and why.
// The engine also needs every member to agree; this checks only here.
bool tp__shm_viable(char *why, size_t why_len);

// Makes the waits of a collective running on another thread end (within
// ~10 ms) with TP_ECLOSED; the segment is unusable after. Any thread.
// NULL is fine.
void tp__shm_cancel(tp__shm *shm);
// Unmaps and frees. Not collective. NULL is fine.
void tp__shm_close(tp__shm *shm);

#endif
