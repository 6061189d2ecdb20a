/* SPDX-License-Identifier: Apache-2.0 */
/* coll.h (internal) - what the process-group layer (pg.c) hands to the
 * engines that run a collective: the pipe engine (algo.c, over p2p.c) and
 * the shared-memory engine (shm.c).
 *
 * The group layer checks every argument, converts tensors to host buffers
 * and group ranks, turns avg into sum (it divides afterwards) and runs one
 * collective at a time per group, in issue order. An engine runs one
 * tp__coll_args to completion or failure before its deadline. */
#ifndef TP_COLLECTIVES_COLL_H
#define TP_COLLECTIVES_COLL_H

#include <stddef.h>
#include <stdint.h>

#include <tpipe/collectives.h>
#include <tpipe/error.h>
#include <tpipe/tensor.h>

typedef enum tp__coll_kind {
    TP__COLL_BARRIER,
    TP__COLL_BROADCAST,
    TP__COLL_ALL_REDUCE,
    TP__COLL_REDUCE,
    TP__COLL_ALL_GATHER,
    TP__COLL_GATHER,
    TP__COLL_SCATTER,
    TP__COLL_REDUCE_SCATTER,
    TP__COLL_ALL_TO_ALL,
    TP__COLL_KIND_COUNT,
} tp__coll_kind;

// "barrier", "broadcast", ...; "?" outside the enum.
const char *tp__coll_kind_name(tp__coll_kind k);

/**
 * tp__coll_args - one collective of a group of n ranks, as rank r.
 * Counts are elements of @dtype; buffers are host memory.
 *   barrier:        nothing
 *   broadcast:      buf[count], in place: root's is copied to every rank
 *   all_reduce:     buf[count] = op over every rank's buf, in place
 *   reduce:         root's buf[count] = op over every buf; others' bufs
 *                   are not changed
 *   all_gather:     out[n*count] = every rank's in[count], rank order
 *   gather:         root's out[n*count] = every in[count]; out NULL
 *                   elsewhere
 *   scatter:        out[count] = block r of root's in[n*count]; in NULL
 *                   elsewhere
 *   reduce_scatter: out[count] = op over block r of every in[n*count]
 *   all_to_all:     block j of in (scounts[j] elements at sdispls[j]) goes
 *                   to rank j, which receives it as its block r of out
 *                   (its rcounts[r] at rdispls[r]); rcounts[i] here equals
 *                   scounts[r] on rank i (checked by the group layer only
 *                   with TP_DEBUG_COLLECTIVES)
 * @op is never TP_REDUCE_AVG (the group layer sums, then divides), and
 * (op, dtype) has passed tp__reduce_check for the reducing kinds. in and
 * out never overlap except buf (in == out). Buffers with count 0 may be
 * NULL.
 */
typedef struct tp__coll_args {
    tp__coll_kind kind;
    tp_dtype dtype;
    tp_reduce_op op;
    int root;
    void *buf; // broadcast, all_reduce, reduce
    const void *in;
    void *out;
    size_t count;
    const size_t *scounts, *sdispls, *rcounts, *rdispls; // all_to_all
    int device; // CUDA device of the buffers (the NCCL engine only)
} tp__coll_args;

#endif
