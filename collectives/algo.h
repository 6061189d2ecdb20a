/* SPDX-License-Identifier: Apache-2.0 */
/* algo.h (internal) - the pipe engine: collectives as point-to-point
 * algorithms over p2p.h. Algorithms by kind, size and group size are
 * described in algo.c and docs/collectives.md. */
#ifndef TP_COLLECTIVES_ALGO_H
#define TP_COLLECTIVES_ALGO_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "collectives/p2p.h"
#include "core/config.h"

typedef struct tp__algo {
    tp__p2p *p2p;
    uint64_t gid;         // the group's id
    uint64_t tag;         // this collective's sequence number in the group
    int rank;             // group rank
    int size;             // group size
    const int *wranks;    // group rank -> world rank
    uint64_t start_ns;    // when the collective was issued (for messages)
    uint64_t deadline_ns; // of the whole collective
    // Called while waiting: non-OK aborts the collective (group broken).
    tp_status (*check)(void *arg, tp_error **err_p);
    void *check_arg;
    // "process group world (rank 0 of 4): all_reduce #5": the prefix of
    // every error of the collective (the p2p layer's name is not added)
    const char *what;
    int allreduce_algo; // tp_coll_algo
    int bcast_algo;     // tp_coll_algo
    size_t small_max;   // bytes: latency algorithms up to here
    size_t chunk;       // bytes: pipelining piece
    void **scratch;     // the group's scratch buffer (grown by realloc)
    size_t *scratch_len;
} tp__algo;

// Runs @a as this rank. On error every message of this collective still
// in flight has been canceled (the group is then broken: the caller does
// not run further collectives on it).
tp_status tp__algo_run(const tp__algo *c, const tp__coll_args *a,
                       tp_error **err_p);

#endif
