/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h (internal) - the RRef protocol's bytes (docs/rref.md): the
 * headers of its message kinds (section 0 of an agent message) and the
 * section describing the RRefs an args carries. Little-endian; every
 * field read from the network is checked here before use.
 *
 * An id is (creator rank, number): u32 w, u32 0, u64 n (16 bytes).
 *   REMOTE        id, fork, u32 flags, u32 0, target id   (56 bytes)
 *   FETCH         id                                       (16)
 *   FORK          id, fork                                 (32)
 *   CHILD_ACCEPT  fork                                     (16)
 *   DELETE        id, fork                                 (32)
 *   CALL          id, u32 flags, u32 0                     (24)
 * RRefs section: u32 count, u32 0, then per RRef: id, fork, u32 owner,
 * u32 flags (40 bytes each).
 */
#ifndef TP_RREF_WIRE_H
#define TP_RREF_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Message kinds (16..31 belong to the RRef protocol). */
enum {
    RR_KIND_REMOTE = 16,       /* create an owner RRef by running fn/ctor */
    RR_KIND_FETCH = 17,        /* to_here: the value */
    RR_KIND_FORK = 18,         /* a user tells the owner of its new fork */
    RR_KIND_CHILD_ACCEPT = 19, /* the child's fork is known: parent lets go */
    RR_KIND_DELETE = 20,       /* a user RRef is gone */
    RR_KIND_CALL = 21,         /* run fn / method on the owner's value */
};

/* REMOTE flags */
#define RR_REMOTE_OBJECT 0x1u /* the name is a remote type: construct it */
#define RR_REMOTE_PROXY  0x2u /* the target's value is the function's RRef 0 */
/* CALL flags */
#define RR_CALL_METHOD 0x1u /* the name is a method of the object */
#define RR_CALL_COPY                                                           \
    0x100u /* local only, never on the wire: a copy of                         \
              the value (to_here on the owner) */
/* RRef descriptor flags */
#define RR_DESC_OBJECT 0x1u /* the value is a remote object */

#define RR_ID_BYTES   16
#define RR_DESC_BYTES 40
#define RR_SEC_HDR    8

typedef struct rr_id {
    uint32_t w; /* the creator's rank */
    uint64_t n; /* its counter (never 0) */
} rr_id;

typedef struct rr_msg {
    rr_id m_id;
    rr_id m_fork;
    rr_id m_target;
    uint32_t m_flags;
} rr_msg;

typedef struct rr_desc {
    rr_id d_id;
    rr_id d_fork;
    uint32_t d_owner;
    uint32_t d_flags;
} rr_desc;

static inline bool
rr_id_eq(rr_id a, rr_id b)
{
    return a.w == b.w && a.n == b.n;
}

/* The header size of @kind (0 for a kind that is not the protocol's). */
size_t tp__rr_hdr_size(unsigned kind);
/* Encodes the header of @kind from @m into @buf (tp__rr_hdr_size bytes). */
void tp__rr_hdr_encode(unsigned kind, const rr_msg *m, uint8_t *buf);
/*
 * Decodes and checks the header of a message of @kind from rank @from in
 * a world of @world: sizes, zero reserved bytes, known flags, ranks below
 * @world, ids not 0, forks made by the worker that says it made them.
 * TP_EPROTO with a message naming what is wrong.
 */
tp_status tp__rr_hdr_decode(unsigned kind, const uint8_t *buf, size_t len,
                            uint32_t from, uint32_t world, rr_msg *m,
                            tp_error **err_p);

/* The size of a section describing @n RRefs. */
size_t tp__rr_sec_size(size_t n);
void tp__rr_sec_encode(const rr_desc *d, size_t n, uint8_t *buf);
/*
 * Checks a section from rank @from (world @world) and returns the number
 * of descriptors in *@n_p (at most @max); tp__rr_sec_desc reads them.
 * Each fork must be made by @from; owners and creators below @world.
 */
tp_status tp__rr_sec_check(const uint8_t *buf, size_t len, uint32_t from,
                           uint32_t world, size_t max, size_t *n_p,
                           tp_error **err_p);
void tp__rr_sec_desc(const uint8_t *buf, size_t i, rr_desc *d);

#endif
