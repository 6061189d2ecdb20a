/* SPDX-License-Identifier: Apache-2.0 */
/* shm_impl.h (internal to collectives/shm*.c) - what the files of the
 * shared-memory collectives engine (shm.h) share: the segment's layout,
 * the engine, one collective in progress, and the phase primitives.
 *   shm.c        segment, open and close, membership (status records,
 *                pidfds), viability
 *   shm_phase.c  posting and waiting on phases, liveness of the members,
 *                publishing and reading contributions (slot or cma)
 *   shm_algo.c   the collective algorithms and tp__shm_run
 *
 * Phases. Every rank runs the same sequence of numbered phases (the
 * number of phases of a collective depends only on arguments every rank
 * shares). At phase P a rank may write its slot and publication (index
 * P % 2), then posts arrive = P (a release store, seq_cst against the
 * waiters count so no futex wakeup is lost), then may wait for other
 * ranks' arrive >= P (acquire) and read what they published at P. Every
 * read of phase-P data happens before the reader posts P + 1, so a rank
 * may rewrite its slot of parity P % 2 at phase P + 2 once every rank
 * posted P + 1 (m_min caches the lowest phase known to be posted by all,
 * which makes the check free in the common case). Counters are uint32
 * and wrap: compare with (int32_t)(a - b) >= 0.
 *
 * Contributions. A contribution that fits the slot is copied into it;
 * a larger one is not copied: its owner publishes the buffer's address and
 * length and readers fetch it with process_vm_readv (tp__cma_read), in
 * sub-chunks of SHM_SUB bytes into scratch when they reduce it (reduced
 * while hot in cache). A trailing phase then keeps the owner from
 * returning while peers still read its buffer. Each rank publishes its own
 * mode, so readers follow the mode of every rank separately.
 *
 * Threads: an engine is used by one thread at a time (the group layer runs
 * one collective at a time); no locks. */
#ifndef TP_COLLECTIVES_SHM_IMPL_H
#define TP_COLLECTIVES_SHM_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "collectives/shm.h"
#include "core/platform.h"

#define SHM_MAGIC         UINT64_C(0x31306c6c6f637074) // "tpcoll01"
#define SHM_LINE          64
#define SHM_SUB           (256u * 1024u) // bytes per cma sub-chunk
#define SHM_SPIN_NS       20000u         // longest spin before yielding
#define SHM_SPIN_MIN      1000u     // shortest (the spin adapts in between)
#define SHM_YIELDS        16        // sched_yield rounds before sleeping
#define SHM_SPIN_SHORT_NS 200000u   // a wait this short says: spin more
#define SHM_SLICE_NS      10000000u // futex wait slice; liveness period
#define SHM_MAX_SIZE      65536     // ranks
// c_abort: the failure that set it was a timeout (the blamed rank may be
// alive), not a death or an error.
#define SHM_ABORT_TIMEOUT 0x80000000u

enum { SHM_NONE = 0, SHM_SLOT = 1, SHM_CMA = 2 };

// What a rank published at one phase: where its contribution is.
typedef struct shm_pub {
    uint32_t p_mode; // SHM_SLOT: in its slot; SHM_CMA: at p_addr
    uint32_t p_pad;
    uint64_t p_len;  // bytes readable
    uint64_t p_addr; // SHM_CMA: address in the owner's memory
} shm_pub;

// One per rank, on its own cache line.
typedef struct shm_ctl {
    _Atomic uint32_t c_arrive;  // last phase posted; the futex word
    _Atomic uint32_t c_waiters; // ranks sleeping on c_arrive
    int32_t c_pid;
    _Atomic uint32_t c_abort; // 0, or 1 + the rank this rank's failure
                              // names (itself for its own errors), |
                              // SHM_ABORT_TIMEOUT for a timeout
    shm_pub c_pub[2];         // by phase parity
} shm_ctl;

typedef struct shm_hdr {
    uint64_t h_magic;
    uint64_t h_size;
    uint64_t h_slot_bytes;
    uint64_t h_total;
    uint8_t h_pad[32];
} shm_hdr;

// all_to_all: where the block for one destination is (bytes from the
// start of the slot or of the published buffer) and its element count.
typedef struct shm_ent {
    uint64_t e_off;
    uint64_t e_count;
} shm_ent;

_Static_assert(sizeof(shm_pub) == 24, "shm_pub crosses processes");
_Static_assert(sizeof(shm_ctl) == SHM_LINE, "shm_ctl is one cache line");
_Static_assert(sizeof(shm_hdr) == SHM_LINE, "shm_hdr is one cache line");
_Static_assert(sizeof(shm_ent) == 16, "shm_ent crosses processes");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "futex words are 32 bits");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "futex words must be lock-free");

typedef struct shm_layout {
    size_t l_ctl, l_tab, l_slots, l_total;
} shm_layout;

// A peer's publication as read at one phase, with its slot.
typedef struct shm_view {
    shm_pub v_pub;
    const uint8_t *v_slot;
} shm_view;

struct tp__shm {
    int m_rank, m_size;
    char *m_group;
    int *m_world;    // [size] world ranks
    pid_t *m_pid;    // [size]
    int *m_pidfd;    // [size]; -1: use kill(pid, 0)
    uint8_t *m_base; // mapping; NULL for size 1
    size_t m_len;
    shm_ctl *m_ctl;   // [size]
    shm_ent *m_tab;   // [size][2][size]
    uint8_t *m_slots; // [size][2][m_slot]
    size_t m_slot;
    uint32_t m_phase;      // last phase this rank posted
    uint32_t m_min;        // every rank has posted at least this
    bool m_spin;           // spin before sleeping (group fits the CPUs)
    uint32_t m_spin_ns;    // current spin budget (SHM_SPIN_MIN..SHM_SPIN_NS)
    shm_view *m_view;      // [size]
    uint8_t *m_tmp;        // 3 x SHM_SUB scratch for cma reductions
    atomic_bool m_closing; // tp__shm_cancel: waits end with TP_ECLOSED
};

// One collective in progress.
typedef struct shm_op {
    int *o_blame;      // the rank a failure names (-1: none)
    bool *o_timed_out; // the failure was (or propagates) a timeout
    tp__shm *o_m;
    const tp__coll_args *o_a;
    const char *o_name;
    size_t o_es;
    uint64_t o_deadline;
    tp_error **o_err_p;
} shm_op;

// ---- small helpers ---------------------------------------------------------

static inline bool
shm_reached(uint32_t v, uint32_t p)
{
    return (int32_t)(v - p) >= 0;
}

static inline void
shm_copy(void *dst, const void *src, size_t n)
{
    // Buffers of count 0 may be NULL, and memcpy must not see NULL.
    if (n > 0) {
        memcpy(dst, src, n);
    }
}

static inline uint8_t *
shm_at(const void *p, size_t off)
{
    // No offset on NULL (count-0 buffers): that is undefined even for 0.
    return p == NULL ? NULL : (uint8_t *)(uintptr_t)p + off;
}

static inline uint8_t *
shm_slot(const tp__shm *m, int q, uint32_t p)
{
    return m->m_slots + ((size_t)q * 2 + (p & 1)) * m->m_slot;
}

static inline shm_ent *
shm_tab(const tp__shm *m, int q, uint32_t p)
{
    return m->m_tab + ((size_t)q * 2 + (p & 1)) * (size_t)m->m_size;
}

// ---- phases and contributions (shm_phase.c) --------------------------------

// "shm <op> (group "<g>", rank <r>): <message>"
tp_status tp__shm_fail(const shm_op *o, tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);

// "rank <q> (world rank <w>, pid <p>)"
void tp__shm_who(const tp__shm *m, int q, char *buf, size_t len);

// Posts phase @p as this rank's (waking its waiters).
void tp__shm_post(tp__shm *m, uint32_t p);

// After a failed collective: tells the others, naming @blame, so ranks
// waiting on this one wake now and the rest see it within a slice.
void tp__shm_abort(tp__shm *m, int blame, bool timed_out);

// Waits until rank @q posted phase @p.
tp_status tp__shm_wait(const shm_op *o, int q, uint32_t p);

// Waits until every other rank posted phase @p.
tp_status tp__shm_wait_all(const shm_op *o, uint32_t p);

// Before this rank writes its slot, table or publication of phase @p.
tp_status tp__shm_acquire(const shm_op *o, uint32_t p);

// Takes rank @q's (every rank's) publication of phase @p.
void tp__shm_look(tp__shm *m, int q, uint32_t p);
void tp__shm_look_all(tp__shm *m, uint32_t p);

// Phase @p of the one rank every other reads from.
tp_status tp__shm_give_source(const shm_op *o, uint32_t p, const void *src,
                              size_t len, bool slot);

// Phase @p of a rooted collective where only @reader ranks read.
tp_status tp__shm_give_rooted(const shm_op *o, uint32_t p, const void *src,
                              size_t len, bool slot, bool reader, bool *done_p);

// Phase @p where every rank contributes and reads.
tp_status tp__shm_give_all(const shm_op *o, uint32_t p, const void *src,
                           size_t len, bool slot);

// Copies bytes [off, off + len) of rank @q's contribution to @dst.
tp_status tp__shm_fetch(const shm_op *o, int q, uint64_t off, void *dst,
                        uint64_t len);

// dst[0, len) = the reduction in rank order of bytes [off, off + len) of
// every rank's contribution. n >= 2.
tp_status tp__shm_reduce_range(const shm_op *o, const void *mine, size_t off,
                               size_t len, void *dst, bool dst_mine);

#endif
