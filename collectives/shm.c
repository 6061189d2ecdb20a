/* SPDX-License-Identifier: Apache-2.0 */
/* shm.c - the shared-memory collectives engine (shm.h).
 *
 * Segment. Rank 0 creates a POSIX shm segment ("/tp-coll-<pid>-<hex>",
 * O_EXCL, 0600, ftruncate + posix_fallocate so a full /dev/shm is an error
 * now rather than a SIGBUS later) and publishes its name in the store
 * ("<prefix>shm/name"). Every rank maps it and publishes its status
 * ("<prefix>shm/ok/<rank>": its pid, cma domain and viability, or why it
 * failed), then reads every rank's status: the engine is used only if
 * every rank mapped the segment and every cma domain is equal and viable,
 * else every rank gets the same answer naming the first rank that could
 * not. Rank 0 unlinks the name once it has read every status, so nothing
 * is left in /dev/shm even if processes die later. Layout:
 *   header (64 B) | control line per rank (64 B) | all_to_all table per
 *   rank and parity ([size][2][size] entries) | 2 data slots per rank
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
 * Algorithms (n ranks; every reduction is in rank order 0..n-1:
 * acc = x0 op x1, then acc op= x2, ... with tp__reduce3 / tp__reduce, so
 * results are bitwise identical on every rank and in both modes):
 *   barrier:        post P, wait all.
 *   broadcast:      slot: root copies buf in, posts; others wait root,
 *                   copy out. cma: root publishes buf; others read it and
 *                   post P + 1; root waits all P + 1.
 *   all_reduce:     slot: all copy in, post, wait all, every rank reduces
 *                   every slot into buf. cma: all publish buf, post, wait
 *                   all; reduce-scatter: rank r reduces chunk r of every
 *                   buf (count split into n nearly equal element ranges)
 *                   into its own buf; post P + 1, wait all; all-gather:
 *                   read chunk q from rank q's buf; post P + 2, wait all.
 *   reduce:         slot: all copy in, post; root waits all and reduces.
 *                   cma: all publish; root reduces every buf into its own
 *                   and posts P + 1; others wait for it (their buffers are
 *                   never written).
 *   all_gather:     slot: all copy in, post, wait all, copy every slot.
 *                   cma: all publish, read every buf, post P + 1, wait all.
 *   gather:         as all_gather, with only the root reading.
 *   scatter:        the root's whole in (n * count) is its contribution;
 *                   every rank reads its block.
 *   reduce_scatter: the whole in (n * count) is each rank's contribution;
 *                   rank r reduces block r of every rank into out.
 *   all_to_all:     each rank packs every block it sends into its slot if
 *                   they all fit (else publishes in) and writes, per
 *                   destination, the block's offset and count to its
 *                   table; every rank reads its block from every rank and
 *                   posts P + 1; a rank that published in waits all P + 1.
 *   size 1:         local copies, no phases.
 *
 * Waiting: spin up to 20 us (only when the group fits the online CPUs;
 * the budget doubles after each wait that ends within it or within 200 us,
 * and halves after each longer one, down to 1 us), sched_yield a few rounds,
 * then FUTEX_WAIT (shared) on the awaited counter in slices of at most
 * SHM_SLICE_NS, counted in that rank's waiters so posters know to FUTEX_WAKE.
 * Between slices: the deadline, and every member: one whose collective failed
 * (it sets c_abort, naming the rank it blames, and wakes its waiters) or one
 * that exited (its pidfd; kill(pid, 0) where pidfd_open is missing) before
 * reaching the awaited phase fails the wait, so a failure anywhere reaches
 * every member within a slice.
 *
 * Threads: an engine is used by one thread at a time (the group layer runs
 * one collective at a time); no locks. */
#include "collectives/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "channel/cma_probe.h"
#include "collectives/reduce.h"
#include "core/alloc.h"
#include "core/error.h"
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
    uint32_t m_phase;   // last phase this rank posted
    uint32_t m_min;     // every rank has posted at least this
    bool m_spin;        // spin before sleeping (group fits the CPUs)
    uint32_t m_spin_ns; // current spin budget (SHM_SPIN_MIN..SHM_SPIN_NS)
    shm_view *m_view;   // [size]
    uint8_t *m_tmp;     // 3 x SHM_SUB scratch for cma reductions
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

static bool
shm_reached(uint32_t v, uint32_t p)
{
    return (int32_t)(v - p) >= 0;
}

static void
shm_copy(void *dst, const void *src, size_t n)
{
    // Buffers of count 0 may be NULL, and memcpy must not see NULL.
    if (n > 0) {
        memcpy(dst, src, n);
    }
}

static uint8_t *
shm_at(const void *p, size_t off)
{
    // No offset on NULL (count-0 buffers): that is undefined even for 0.
    return p == NULL ? NULL : (uint8_t *)(uintptr_t)p + off;
}

static uint8_t *
shm_slot(const tp__shm *m, int q, uint32_t p)
{
    return m->m_slots + ((size_t)q * 2 + (p & 1)) * m->m_slot;
}

static shm_ent *
shm_tab(const tp__shm *m, int q, uint32_t p)
{
    return m->m_tab + ((size_t)q * 2 + (p & 1)) * (size_t)m->m_size;
}

static bool
shm_layout_of(int n, size_t slot, shm_layout *l)
{
    size_t un = (size_t)n;
    size_t tab = un * 2 * un * sizeof(shm_ent);
    tab = (tab + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
    l->l_ctl = sizeof(shm_hdr);
    l->l_tab = l->l_ctl + un * sizeof(shm_ctl);
    l->l_slots = l->l_tab + tab;
    if (slot > (SIZE_MAX - l->l_slots) / (2 * un)) {
        return false;
    }
    l->l_total = l->l_slots + 2 * un * slot;
    return true;
}

// Remaining milliseconds for a store call; 0 (no limit) for no deadline.
static int64_t
shm_store_ms(uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        return 0;
    }
    uint64_t now = tp__now_ns();
    if (now >= deadline_ns) {
        return 1;
    }
    return (int64_t)((deadline_ns - now + 999999) / 1000000);
}

// ---- errors ----------------------------------------------------------------

static tp_status shm_fail(const shm_op *o, tp_status st, const char *fmt, ...)
    TP_PRINTF(3, 4);

// "shm <op> (group "<g>", rank <r>): <message>"
static tp_status
shm_fail(const shm_op *o, tp_status st, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return tp__error_set(o->o_err_p, st, "shm %s (group \"%s\", rank %d): %s",
                         o->o_name, o->o_m->m_group, o->o_m->m_rank, msg);
}

// "rank <q> (world rank <w>, pid <p>)"
static void
shm_who(const tp__shm *m, int q, char *buf, size_t len)
{
    snprintf(buf, len, "rank %d (world rank %d, pid %d)", q, m->m_world[q],
             (int)m->m_pid[q]);
}

// ---- posting and waiting ---------------------------------------------------

static long
shm_futex(_Atomic uint32_t *addr, int op, uint32_t val,
          const struct timespec *ts)
{
    // Shared (not FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED
    // segment of several processes.
    return syscall(SYS_futex, (void *)addr, op, val, ts, NULL, 0);
}

static void
shm_post(tp__shm *m, uint32_t p)
{
    shm_ctl *c = &m->m_ctl[m->m_rank];
    m->m_phase = p;
    // seq_cst store, then seq_cst load of the waiters: against the waiter's
    // increment then reload, one of the two sees the other (no lost wake).
    atomic_store_explicit(&c->c_arrive, p, memory_order_seq_cst);
    if (atomic_load_explicit(&c->c_waiters, memory_order_seq_cst) != 0) {
        shm_futex(&c->c_arrive, FUTEX_WAKE, INT_MAX, NULL);
    }
}

// Whether rank @q exited (a zombie counts: a killed child of a test stays
// one until reaped, which its pidfd sees but kill(pid, 0) does not).
static bool
shm_dead(const tp__shm *m, int q)
{
    if (m->m_pidfd[q] >= 0) {
        struct pollfd pfd = {.fd = m->m_pidfd[q], .events = POLLIN};
        return poll(&pfd, 1, 0) > 0;
    }
    return kill(m->m_pid[q], 0) != 0 && errno == ESRCH;
}

// Every SHM_SLICE_NS of waiting for phase @p: a member that gave up
// (its failure names the rank to blame) or exited before reaching @p
// fails this wait too, so one failure reaches every member within a
// slice, not only the ranks waiting on the failed one.
static tp_status
shm_check_members(const shm_op *o, uint32_t p, uint64_t start, uint64_t now)
{
    tp__shm *m = o->o_m;
    for (int x = 0; x < m->m_size; x++) {
        if (x == m->m_rank) {
            continue;
        }
        shm_ctl *cx = &m->m_ctl[x];
        uint32_t ab = atomic_load_explicit(&cx->c_abort, memory_order_acquire);
        if (ab != 0) {
            bool timed_out = (ab & SHM_ABORT_TIMEOUT) != 0;
            int b = (int)(ab & ~SHM_ABORT_TIMEOUT) - 1;
            char who[96], blamed[96];
            shm_who(m, x, who, sizeof(who));
            *o->o_blame = b >= 0 && b < m->m_size ? b : x;
            *o->o_timed_out = timed_out;
            shm_who(m, *o->o_blame, blamed, sizeof(blamed));
            return shm_fail(o, timed_out ? TP_ETIMEDOUT : TP_ECONNRESET,
                            "%s gave up%s%s (waited %" PRIu64 " ms)", who,
                            b == x      ? ""
                            : timed_out ? " waiting for "
                                        : " after a failure of ",
                            b == x ? "" : blamed, (now - start) / 1000000);
        }
        if (shm_dead(m, x) &&
            !shm_reached(
                atomic_load_explicit(&cx->c_arrive, memory_order_acquire), p)) {
            char who[96];
            shm_who(m, x, who, sizeof(who));
            *o->o_blame = x;
            return shm_fail(o, TP_ECONNRESET,
                            "%s exited before reaching phase %" PRIu32
                            " (waited %" PRIu64 " ms)",
                            who, p, (now - start) / 1000000);
        }
    }
    return TP_OK;
}

// After a wait that outlasted the spin: a short one (the peer arrived
// soon, and yielding or sleeping only added its wake-up) doubles the spin
// budget; a long one (the peer was busy, or not running: other processes
// hold the CPUs, and spinning then only delays it) halves it. Waits that
// end within the spin double it too (shm_wait). So a run of long
// collectives does not leave small ones sleeping on every phase.
static void
shm_spin_adapt(tp__shm *m, uint64_t start)
{
    if (!m->m_spin) {
        return;
    }
    if (tp__now_ns() - start < SHM_SPIN_SHORT_NS) {
        m->m_spin_ns = TP_MIN(SHM_SPIN_NS, m->m_spin_ns * 2);
    } else {
        m->m_spin_ns = TP_MAX(SHM_SPIN_MIN, m->m_spin_ns / 2);
    }
}

// Waits until rank @q posted phase @p.
static tp_status
shm_wait(const shm_op *o, int q, uint32_t p)
{
    tp__shm *m = o->o_m;
    shm_ctl *c = &m->m_ctl[q];
    _Atomic uint32_t *w = &c->c_arrive;
    if (shm_reached(atomic_load_explicit(w, memory_order_acquire), p)) {
        return TP_OK;
    }
    uint64_t start = tp__now_ns();
    if (m->m_spin) {
        for (unsigned i = 1;; i++) {
            tp__cpu_relax();
            if (shm_reached(atomic_load_explicit(w, memory_order_acquire), p)) {
                m->m_spin_ns = TP_MIN(SHM_SPIN_NS, m->m_spin_ns * 2);
                return TP_OK;
            }
            if ((i & 15) == 0 && tp__now_ns() - start >= m->m_spin_ns) {
                break; // the budget is adjusted once the wait is over
            }
        }
    }
    for (int i = 0; i < SHM_YIELDS; i++) {
        sched_yield();
        if (shm_reached(atomic_load_explicit(w, memory_order_acquire), p)) {
            shm_spin_adapt(m, start);
            return TP_OK;
        }
    }
    uint64_t next_check = 0;
    for (;;) {
        uint64_t now = tp__now_ns();
        if (now >= next_check ||
            atomic_load_explicit(&c->c_abort, memory_order_acquire) != 0) {
            // A rank that posted, then exited normally, is no failure.
            if (shm_reached(atomic_load_explicit(w, memory_order_acquire), p)) {
                return TP_OK;
            }
            tp_status st = shm_check_members(o, p, start, now);
            if (st != TP_OK) {
                return st;
            }
            next_check = now + SHM_SLICE_NS;
        }
        if (now >= o->o_deadline) {
            char who[96];
            shm_who(m, q, who, sizeof(who));
            *o->o_blame = q;
            return shm_fail(o, TP_ETIMEDOUT,
                            "timed out after %" PRIu64
                            " ms waiting for %s to reach phase %" PRIu32,
                            (now - start) / 1000000, who, p);
        }
        uint64_t slice = next_check - now;
        if (o->o_deadline - now < slice) {
            slice = o->o_deadline - now;
        }
        struct timespec ts = {.tv_sec = (time_t)(slice / 1000000000u),
                              .tv_nsec = (long)(slice % 1000000000u)};
        atomic_fetch_add_explicit(&c->c_waiters, 1, memory_order_seq_cst);
        uint32_t v = atomic_load_explicit(w, memory_order_seq_cst);
        if (!shm_reached(v, p) && shm_futex(w, FUTEX_WAIT, v, &ts) != 0 &&
            errno != EAGAIN && errno != ETIMEDOUT && errno != EINTR) {
            sched_yield(); // no futex here (seccomp?): poll instead
        }
        atomic_fetch_sub_explicit(&c->c_waiters, 1, memory_order_seq_cst);
        if (shm_reached(atomic_load_explicit(w, memory_order_acquire), p)) {
            shm_spin_adapt(m, start);
            return TP_OK;
        }
    }
}

// Waits until every other rank posted phase @p.
static tp_status
shm_wait_all(const shm_op *o, uint32_t p)
{
    tp__shm *m = o->o_m;
    for (int q = 0; q < m->m_size; q++) {
        if (q != m->m_rank) {
            tp_status st = shm_wait(o, q, p);
            if (st != TP_OK) {
                return st;
            }
        }
    }
    if ((int32_t)(p - m->m_min) > 0) {
        m->m_min = p;
    }
    return TP_OK;
}

// Before this rank writes its slot, table or publication of phase @p:
// every rank must have posted p - 1, so every read of phase p - 2 (same
// parity) is finished.
static tp_status
shm_acquire(const shm_op *o, uint32_t p)
{
    if (shm_reached(o->o_m->m_min, p - 1)) {
        return TP_OK;
    }
    return shm_wait_all(o, p - 1);
}

// Publishes @len bytes at @src as this rank's contribution to phase @p:
// copied into the slot if @slot, else its address for cma.
static tp_status
shm_give(const shm_op *o, uint32_t p, const void *src, size_t len, bool slot)
{
    tp__shm *m = o->o_m;
    tp_status st = shm_acquire(o, p);
    if (st != TP_OK) {
        return st;
    }
    shm_pub *pub = &m->m_ctl[m->m_rank].c_pub[p & 1];
    pub->p_len = len;
    if (slot) {
        shm_copy(shm_slot(m, m->m_rank, p), src, len);
        pub->p_mode = SHM_SLOT;
        pub->p_addr = 0;
    } else {
        pub->p_mode = SHM_CMA;
        pub->p_addr = (uint64_t)(uintptr_t)src;
    }
    return TP_OK;
}

// Takes rank @q's publication of phase @p (after waiting for it). Readers
// use the copy, so later phases may reuse the publication line.
static void
shm_look(tp__shm *m, int q, uint32_t p)
{
    m->m_view[q].v_pub = m->m_ctl[q].c_pub[p & 1];
    m->m_view[q].v_slot = shm_slot(m, q, p);
}

static void
shm_look_all(tp__shm *m, uint32_t p)
{
    for (int q = 0; q < m->m_size; q++) {
        shm_look(m, q, p);
    }
}

// Phase @p where every rank contributes: give @len bytes at @src (slot or
// published), post, wait for all, and take every rank's view.
// Phase @p of the one rank every other reads from (a broadcast's or a
// scatter's root): it gives @len bytes at @src and posts; a published
// buffer is held until every rank posted p + 1 (has read it).
static tp_status
shm_give_source(const shm_op *o, uint32_t p, const void *src, size_t len,
                bool slot)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    shm_post(o->o_m, p);
    if (slot) {
        return TP_OK;
    }
    shm_post(o->o_m, p + 1);
    return shm_wait_all(o, p + 1);
}

// Phase @p of a rooted collective where only @reader ranks read the
// others' contributions: every rank gives @len bytes at @src and posts.
// A rank that does not read is done (*@done_p) once its contribution may
// be reused: at once for a slot; for a published buffer, once the root
// posted p + 1 (it has read it).
static tp_status
shm_give_rooted(const shm_op *o, uint32_t p, const void *src, size_t len,
                bool slot, bool reader, bool *done_p)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    shm_post(o->o_m, p);
    *done_p = !reader;
    if (reader || slot) {
        return TP_OK;
    }
    shm_post(o->o_m, p + 1);
    return shm_wait(o, o->o_a->root, p + 1);
}

static tp_status
shm_give_all(const shm_op *o, uint32_t p, const void *src, size_t len,
             bool slot)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    shm_post(o->o_m, p);
    st = shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    shm_look_all(o->o_m, p);
    return TP_OK;
}

// Checks that rank @q's view holds bytes [off, off + len).
static tp_status
shm_check_range(const shm_op *o, int q, uint64_t off, uint64_t len)
{
    const shm_view *v = &o->o_m->m_view[q];
    bool bad_mode = v->v_pub.p_mode != SHM_SLOT && v->v_pub.p_mode != SHM_CMA;
    if (!bad_mode && off <= v->v_pub.p_len && len <= v->v_pub.p_len - off &&
        (v->v_pub.p_mode != SHM_SLOT || v->v_pub.p_len <= o->o_m->m_slot)) {
        return TP_OK;
    }
    char who[96];
    shm_who(o->o_m, q, who, sizeof(who));
    return shm_fail(o, TP_EPROTO,
                    "%s published %" PRIu64 " bytes (mode %" PRIu32
                    "), this rank needs bytes %" PRIu64 "..%" PRIu64
                    ": the ranks disagree on the arguments",
                    who, v->v_pub.p_len, v->v_pub.p_mode, off, off + len);
}

static tp_status
shm_cma(const shm_op *o, int q, uint64_t off, void *dst, uint64_t len)
{
    tp__shm *m = o->o_m;
    tp_status st = tp__cma_read(m->m_pid[q], m->m_view[q].v_pub.p_addr + off,
                                dst, len, o->o_err_p);
    if (st != TP_OK) {
        char who[96];
        shm_who(m, q, who, sizeof(who));
        *o->o_blame = q;
        return tp__error_wrap(o->o_err_p, st,
                              "shm %s (group \"%s\", rank %d): reading %s",
                              o->o_name, m->m_group, m->m_rank, who);
    }
    return TP_OK;
}

// Copies bytes [off, off + len) of rank @q's contribution to @dst.
static tp_status
shm_fetch(const shm_op *o, int q, uint64_t off, void *dst, uint64_t len)
{
    if (len == 0) {
        return TP_OK;
    }
    tp_status st = shm_check_range(o, q, off, len);
    if (st != TP_OK) {
        return st;
    }
    const shm_view *v = &o->o_m->m_view[q];
    if (v->v_pub.p_mode == SHM_SLOT) {
        memcpy(dst, v->v_slot + off, len);
        return TP_OK;
    }
    return shm_cma(o, q, off, dst, len);
}

// Points *@src_p at bytes [off, off + len) of rank @q's contribution: in
// @mine for this rank when @mine is given, in its slot, or read into @tmp.
static tp_status
shm_src(const shm_op *o, int q, const void *mine, uint64_t off, uint64_t len,
        uint8_t *tmp, const void **src_p)
{
    if (q == o->o_m->m_rank && mine != NULL) {
        *src_p = shm_at(mine, off);
        return TP_OK;
    }
    tp_status st = shm_check_range(o, q, off, len);
    if (st != TP_OK) {
        return st;
    }
    const shm_view *v = &o->o_m->m_view[q];
    if (v->v_pub.p_mode == SHM_SLOT) {
        *src_p = v->v_slot + off;
        return TP_OK;
    }
    *src_p = tmp;
    return shm_cma(o, q, off, tmp, len);
}

// dst[0, len) = x_0 op x_1 op ... op x_{n-1} (in rank order), x_q being
// bytes [off, off + len) of rank q's contribution (this rank's in @mine if
// given). @dst_mine: @dst is this rank's own input (mine + off), which
// must not be overwritten before it is read. n >= 2.
static tp_status
shm_reduce_range(const shm_op *o, const void *mine, size_t off, size_t len,
                 void *dst, bool dst_mine)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    uint8_t *t0 = m->m_tmp, *t1 = t0 + SHM_SUB, *tacc = t1 + SHM_SUB;
    for (size_t s = 0; s < len; s += SHM_SUB) {
        size_t k = TP_MIN((size_t)SHM_SUB, len - s);
        // dst may be x_0 or x_1 for tp__reduce3, but not a later operand.
        uint8_t *acc = dst_mine && m->m_rank >= 2 ? tacc : shm_at(dst, s);
        const void *x0 = NULL, *x1 = NULL, *xq = NULL;
        tp_status st = shm_src(o, 0, mine, off + s, k, t0, &x0);
        if (st == TP_OK) {
            st = shm_src(o, 1, mine, off + s, k, t1, &x1);
        }
        if (st != TP_OK) {
            return st;
        }
        tp__reduce3(a->op, a->dtype, acc, x0, x1, k / o->o_es);
        for (int q = 2; q < m->m_size; q++) {
            st = shm_src(o, q, mine, off + s, k, t0, &xq);
            if (st != TP_OK) {
                return st;
            }
            tp__reduce(a->op, a->dtype, acc, xq, k / o->o_es);
        }
        if (acc == tacc) {
            memcpy(shm_at(dst, s), acc, k);
        }
    }
    return TP_OK;
}

// ---- the collectives -------------------------------------------------------

static tp_status
shm_barrier(const shm_op *o)
{
    uint32_t p = o->o_m->m_phase + 1;
    shm_post(o->o_m, p);
    return shm_wait_all(o, p);
}

static tp_status
shm_broadcast(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st;
    if (m->m_rank == a->root) {
        return shm_give_source(o, p, a->buf, bytes, slot);
    }
    shm_post(m, p);
    st = shm_wait(o, a->root, p);
    if (st != TP_OK) {
        return st;
    }
    shm_look(m, a->root, p);
    st = shm_fetch(o, a->root, 0, a->buf, bytes);
    if (st == TP_OK && !slot) {
        shm_post(m, p + 1);
    }
    return st;
}

// Splits @count elements into n nearly equal ranges; range @q.
static void
shm_chunk(size_t count, int n, int q, size_t *start_p, size_t *len_p)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    size_t uq = (size_t)q;
    *start_p = uq * base + TP_MIN(uq, rem);
    *len_p = base + (uq < rem ? 1 : 0);
}

static tp_status
shm_all_reduce(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t es = o->o_es, bytes = a->count * es;
    bool slot = bytes <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = shm_give_all(o, p, a->buf, bytes, slot);
    if (st != TP_OK) {
        return st;
    }
    if (slot) {
        // Every input is in a slot, this rank's too: buf is free to write.
        return shm_reduce_range(o, NULL, 0, bytes, a->buf, false);
    }
    // Reduce-scatter: chunk r of every buf, into this rank's buf.
    size_t start, len;
    shm_chunk(a->count, m->m_size, m->m_rank, &start, &len);
    st = shm_reduce_range(o, a->buf, start * es, len * es,
                          shm_at(a->buf, start * es), true);
    if (st != TP_OK) {
        return st;
    }
    shm_post(m, p + 1);
    st = shm_wait_all(o, p + 1);
    if (st != TP_OK) {
        return st;
    }
    // All-gather: chunk q from rank q's buf (final since it posted p + 1).
    for (int q = 0; q < m->m_size; q++) {
        if (q == m->m_rank) {
            continue;
        }
        shm_chunk(a->count, m->m_size, q, &start, &len);
        st = shm_fetch(o, q, start * es, shm_at(a->buf, start * es), len * es);
        if (st != TP_OK) {
            return st;
        }
    }
    shm_post(m, p + 2);
    return shm_wait_all(o, p + 2); // until every rank read this buf
}

static tp_status
shm_reduce(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot, root = m->m_rank == a->root;
    uint32_t p = m->m_phase + 1;
    bool done = false;
    tp_status st = shm_give_rooted(o, p, a->buf, bytes, slot, root, &done);
    if (st != TP_OK || done) {
        return st;
    }
    st = shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    shm_look_all(m, p);
    if (slot) {
        return shm_reduce_range(o, NULL, 0, bytes, a->buf, false);
    }
    st = shm_reduce_range(o, a->buf, 0, bytes, a->buf, true);
    if (st == TP_OK) {
        shm_post(m, p + 1);
    }
    return st;
}

// all_gather (every rank reads) and gather (the root reads).
static tp_status
shm_gather(const shm_op *o, bool all)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    bool slot = bytes <= m->m_slot;
    bool reader = all || m->m_rank == a->root;
    uint32_t p = m->m_phase + 1;
    bool done = false;
    tp_status st = shm_give_rooted(o, p, a->in, bytes, slot, reader, &done);
    if (st != TP_OK || done) {
        return st;
    }
    st = shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    for (int q = 0; q < m->m_size; q++) {
        uint8_t *dst = shm_at(a->out, (size_t)q * bytes);
        if (q == m->m_rank) {
            shm_copy(dst, a->in, bytes);
            continue;
        }
        shm_look(m, q, p);
        st = shm_fetch(o, q, 0, dst, bytes);
        if (st != TP_OK) {
            return st;
        }
    }
    if (slot) {
        return TP_OK;
    }
    shm_post(m, p + 1);
    return all ? shm_wait_all(o, p + 1) : TP_OK;
}

static tp_status
shm_scatter(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es, total = bytes * (size_t)m->m_size;
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st;
    if (m->m_rank == a->root) {
        shm_copy(a->out, shm_at(a->in, (size_t)m->m_rank * bytes), bytes);
        return shm_give_source(o, p, a->in, total, slot);
    }
    shm_post(m, p);
    st = shm_wait(o, a->root, p);
    if (st != TP_OK) {
        return st;
    }
    shm_look(m, a->root, p);
    st = shm_fetch(o, a->root, (uint64_t)m->m_rank * bytes, a->out, bytes);
    if (st == TP_OK && !slot) {
        shm_post(m, p + 1);
    }
    return st;
}

static tp_status
shm_reduce_scatter(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es, total = bytes * (size_t)m->m_size;
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = shm_give_all(o, p, a->in, total, slot);
    if (st != TP_OK) {
        return st;
    }
    size_t off = (size_t)m->m_rank * bytes;
    st = shm_reduce_range(o, slot ? NULL : a->in, off, bytes, a->out, false);
    if (st != TP_OK || slot) {
        return st;
    }
    shm_post(m, p + 1);
    return shm_wait_all(o, p + 1);
}

static tp_status
shm_all_to_all(const shm_op *o)
{
    tp__shm *m = o->o_m;
    const tp__coll_args *a = o->o_a;
    size_t es = o->o_es;
    int n = m->m_size, me = m->m_rank;
    // The bytes to pack (slot) and the extent of in (cma).
    size_t total = 0, extent = 0;
    for (int j = 0; j < n; j++) {
        if (a->scounts[j] > 0) {
            total += a->scounts[j] * es;
            extent = TP_MAX(extent, (a->sdispls[j] + a->scounts[j]) * es);
        }
    }
    bool slot = total <= m->m_slot;
    uint32_t p = m->m_phase + 1;
    tp_status st = shm_acquire(o, p);
    if (st != TP_OK) {
        return st;
    }
    shm_ent *tab = shm_tab(m, me, p);
    uint8_t *mine = shm_slot(m, me, p);
    size_t packed = 0;
    for (int j = 0; j < n; j++) {
        size_t len = a->scounts[j] * es;
        tab[j].e_count = a->scounts[j];
        if (slot) {
            tab[j].e_off = packed;
            if (j != me) {
                shm_copy(mine + packed, shm_at(a->in, a->sdispls[j] * es), len);
                packed += len;
            }
        } else {
            tab[j].e_off = len > 0 ? a->sdispls[j] * es : 0;
        }
    }
    shm_pub *pub = &m->m_ctl[me].c_pub[p & 1];
    pub->p_mode = slot ? SHM_SLOT : SHM_CMA;
    pub->p_len = slot ? packed : extent;
    pub->p_addr = slot ? 0 : (uint64_t)(uintptr_t)a->in;
    shm_post(m, p);
    st = shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    for (int q = 0; q < n; q++) {
        uint8_t *dst = shm_at(a->out, a->rdispls[q] * es);
        size_t len = a->rcounts[q] * es;
        if (q == me) {
            shm_copy(dst, shm_at(a->in, a->sdispls[me] * es), len);
            continue;
        }
        shm_look(m, q, p);
        shm_ent e = shm_tab(m, q, p)[me];
        if (e.e_count != a->rcounts[q]) {
            char who[96];
            shm_who(m, q, who, sizeof(who));
            return shm_fail(o, TP_EINVAL,
                            "%s sends %" PRIu64 " elements to this rank, "
                            "which expects %zu (rcounts[%d])",
                            who, e.e_count, a->rcounts[q], q);
        }
        st = shm_fetch(o, q, e.e_off, dst, len);
        if (st != TP_OK) {
            return st;
        }
    }
    shm_post(m, p + 1);
    return slot ? TP_OK : shm_wait_all(o, p + 1);
}

// A group of one: every collective is a local copy or nothing.
static tp_status
shm_run_alone(const shm_op *o)
{
    const tp__coll_args *a = o->o_a;
    size_t bytes = a->count * o->o_es;
    switch (a->kind) {
    case TP__COLL_ALL_GATHER:
    case TP__COLL_GATHER:
    case TP__COLL_SCATTER:
    case TP__COLL_REDUCE_SCATTER:
        if (bytes > 0) {
            memmove(a->out, a->in, bytes);
        }
        return TP_OK;
    case TP__COLL_ALL_TO_ALL:
        if (a->scounts[0] != a->rcounts[0]) {
            return shm_fail(o, TP_EINVAL,
                            "sends %zu elements to itself but expects %zu",
                            a->scounts[0], a->rcounts[0]);
        }
        if (a->rcounts[0] > 0) {
            memmove(shm_at(a->out, a->rdispls[0] * o->o_es),
                    shm_at(a->in, a->sdispls[0] * o->o_es),
                    a->rcounts[0] * o->o_es);
        }
        return TP_OK;
    default:
        return TP_OK; // barrier, broadcast, all_reduce, reduce
    }
}

tp_status
tp__shm_run(tp__shm *shm, const tp__coll_args *a, uint64_t deadline_ns,
            tp_error **err_p)
{
    TP_ASSERT(shm != NULL && a != NULL);
    int blame_rank = -1;
    bool timed_out = false;
    shm_op o = {
        .o_blame = &blame_rank,
        .o_timed_out = &timed_out,
        .o_m = shm,
        .o_a = a,
        .o_name = tp__coll_kind_name(a->kind),
        .o_es = tp_dtype_size(a->dtype),
        .o_deadline = deadline_ns,
        .o_err_p = err_p,
    };
    int n = shm->m_size;
    if ((unsigned)a->kind >= TP__COLL_KIND_COUNT) {
        return shm_fail(&o, TP_EINVAL, "unknown collective %d", (int)a->kind);
    }
    if (o.o_es == 0) {
        return shm_fail(&o, TP_EINVAL, "bad dtype %d", (int)a->dtype);
    }
    if (a->count > SIZE_MAX / o.o_es / (size_t)n) {
        return shm_fail(&o, TP_EINVAL, "count %zu is too large", a->count);
    }
    bool rooted = a->kind == TP__COLL_BROADCAST || a->kind == TP__COLL_REDUCE ||
                  a->kind == TP__COLL_GATHER || a->kind == TP__COLL_SCATTER;
    if (rooted && (a->root < 0 || a->root >= n)) {
        return shm_fail(&o, TP_EINVAL, "root %d outside the group of %d",
                        a->root, n);
    }
    if (a->kind == TP__COLL_ALL_TO_ALL &&
        (a->scounts == NULL || a->sdispls == NULL || a->rcounts == NULL ||
         a->rdispls == NULL)) {
        return shm_fail(&o, TP_EINVAL, "counts or displacements missing");
    }
    if (n == 1) {
        return shm_run_alone(&o);
    }
    tp_status st;
    switch (a->kind) {
    case TP__COLL_BARRIER:
        st = shm_barrier(&o);
        break;
    case TP__COLL_BROADCAST:
        st = shm_broadcast(&o);
        break;
    case TP__COLL_ALL_REDUCE:
        st = shm_all_reduce(&o);
        break;
    case TP__COLL_REDUCE:
        st = shm_reduce(&o);
        break;
    case TP__COLL_ALL_GATHER:
        st = shm_gather(&o, true);
        break;
    case TP__COLL_GATHER:
        st = shm_gather(&o, false);
        break;
    case TP__COLL_SCATTER:
        st = shm_scatter(&o);
        break;
    case TP__COLL_REDUCE_SCATTER:
        st = shm_reduce_scatter(&o);
        break;
    case TP__COLL_ALL_TO_ALL:
        st = shm_all_to_all(&o);
        break;
    default:
        st = shm_fail(&o, TP_EINVAL, "unknown collective %d", (int)a->kind);
        break;
    }
    if (st != TP_OK) {
        // Tell the others: ranks waiting on this one wake now, the rest
        // see it within a slice (shm_check_members).
        shm_ctl *c = &shm->m_ctl[shm->m_rank];
        int blame = blame_rank >= 0 ? blame_rank : shm->m_rank;
        uint32_t word = (uint32_t)blame + 1;
        if (st == TP_ETIMEDOUT || timed_out) {
            word |= SHM_ABORT_TIMEOUT;
        }
        atomic_store_explicit(&c->c_abort, word, memory_order_seq_cst);
        shm_futex(&c->c_arrive, FUTEX_WAKE, INT_MAX, NULL);
    }
    return st;
}

// ---- open and close --------------------------------------------------------

void
tp__shm_close(tp__shm *shm)
{
    if (shm == NULL) {
        return;
    }
    if (shm->m_base != NULL) {
        munmap(shm->m_base, shm->m_len);
    }
    if (shm->m_pidfd != NULL) {
        for (int q = 0; q < shm->m_size; q++) {
            if (shm->m_pidfd[q] >= 0) {
                close(shm->m_pidfd[q]);
            }
        }
    }
    tp__free(shm->m_group);
    tp__free(shm->m_world);
    tp__free(shm->m_pid);
    tp__free(shm->m_pidfd);
    tp__free(shm->m_view);
    tp__free(shm->m_tmp);
    tp__free(shm);
}

static tp_status
shm_engine_create(const tp__shm_setup *s, tp__shm **m_p, tp_error **err_p)
{
    size_t n = (size_t)s->size;
    tp__shm *m = tp__zalloc(sizeof(*m));
    if (m == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "shm open: out of memory");
    }
    m->m_rank = s->rank;
    m->m_size = s->size;
    m->m_slot = (s->slot_bytes + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
    m->m_group = tp__strdup(s->group != NULL ? s->group : "?");
    m->m_world = tp__alloc(n * sizeof(int));
    m->m_pid = tp__zalloc(n * sizeof(pid_t));
    m->m_pidfd = tp__alloc(n * sizeof(int));
    m->m_view = tp__zalloc(n * sizeof(shm_view));
    if (n > 1) {
        m->m_tmp = tp__alloc(3 * (size_t)SHM_SUB);
    }
    if (m->m_group == NULL || m->m_world == NULL || m->m_pid == NULL ||
        m->m_pidfd == NULL || m->m_view == NULL ||
        (n > 1 && m->m_tmp == NULL)) {
        tp__shm_close(m);
        return tp__error_set(err_p, TP_ENOMEM,
                             "shm open (group \"%s\", rank %d): out of memory",
                             s->group != NULL ? s->group : "?", s->rank);
    }
    for (size_t q = 0; q < n; q++) {
        m->m_world[q] = s->world_ranks != NULL ? s->world_ranks[q] : (int)q;
        m->m_pidfd[q] = -1;
    }
    m->m_pid[s->rank] = getpid();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    m->m_spin = cpus > 0 && (long)s->size <= cpus;
    m->m_spin_ns = SHM_SPIN_NS;
    *m_p = m;
    return TP_OK;
}

static void
shm_errno_text(int e, char *buf, size_t len)
{
    snprintf(buf, len, "%s (%s)", strerror(e), tp__errno_name(e));
}

static void
shm_set_layout(tp__shm *m, const shm_layout *l)
{
    m->m_ctl = (shm_ctl *)(void *)(m->m_base + l->l_ctl);
    m->m_tab = (shm_ent *)(void *)(m->m_base + l->l_tab);
    m->m_slots = m->m_base + l->l_slots;
}

// Rank 0: creates and maps the segment; on failure @fail says why.
static void
shm_segment_create(tp__shm *m, const shm_layout *l, char *name, size_t name_len,
                   char *fail, size_t fail_len)
{
    int fd = -1;
    char et[160];
    for (int i = 0; i < 16 && fd < 0; i++) {
        snprintf(name, name_len, "/tp-coll-%d-%016" PRIx64, (int)getpid(),
                 tp__random_u64());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "shm_open /dev/shm%s: %s", name, et);
        name[0] = '\0';
        return;
    }
    if (ftruncate(fd, (off_t)l->l_total) != 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "ftruncate /dev/shm%s to %zu bytes: %s", name,
                 l->l_total, et);
        goto fail_unlink;
    }
    // Allocate every page now: on a full /dev/shm (Docker's default is 64
    // MB) a later first touch would be a SIGBUS instead of this error.
    int e = posix_fallocate(fd, 0, (off_t)l->l_total);
    if (e != 0) {
        shm_errno_text(e, et, sizeof(et));
        snprintf(fail, fail_len,
                 "posix_fallocate of %zu bytes for /dev/shm%s: %s%s",
                 l->l_total, name, et,
                 e == ENOSPC ? ": /dev/shm is full or too small (Docker: "
                               "--shm-size; or a smaller TP_COLL_SHM_SLOT)"
                             : "");
        goto fail_unlink;
    }
    void *p = mmap(NULL, l->l_total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "mmap of %zu bytes of /dev/shm%s: %s",
                 l->l_total, name, et);
        goto fail_unlink;
    }
    close(fd);
    m->m_base = p;
    m->m_len = l->l_total;
    shm_hdr *h = p;
    h->h_magic = SHM_MAGIC;
    h->h_size = (uint64_t)m->m_size;
    h->h_slot_bytes = m->m_slot;
    h->h_total = l->l_total;
    shm_set_layout(m, l);
    return;

fail_unlink:
    close(fd);
    shm_unlink(name);
    name[0] = '\0';
}

// Ranks > 0: maps the segment rank 0 created.
static void
shm_segment_map(tp__shm *m, const shm_layout *l, const char *name, char *fail,
                size_t fail_len)
{
    char et[160];
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "shm_open /dev/shm%s: %s", name, et);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "fstat /dev/shm%s: %s", name, et);
        close(fd);
        return;
    }
    if ((uint64_t)st.st_size != (uint64_t)l->l_total) {
        snprintf(fail, fail_len,
                 "/dev/shm%s has %jd bytes, expected %zu (do the ranks "
                 "agree on the group size and slot?)",
                 name, (intmax_t)st.st_size, l->l_total);
        close(fd);
        return;
    }
    void *p = mmap(NULL, l->l_total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        shm_errno_text(errno, et, sizeof(et));
        snprintf(fail, fail_len, "mmap of %zu bytes of /dev/shm%s: %s",
                 l->l_total, name, et);
        close(fd);
        return;
    }
    close(fd);
    const shm_hdr *h = p;
    if (h->h_magic != SHM_MAGIC || h->h_size != (uint64_t)m->m_size ||
        h->h_slot_bytes != m->m_slot || h->h_total != l->l_total) {
        snprintf(fail, fail_len,
                 "/dev/shm%s: header does not match (size %" PRIu64
                 ", slot %" PRIu64 "; this rank: size %d, slot %zu)",
                 name, h->h_size, h->h_slot_bytes, m->m_size, m->m_slot);
        munmap(p, l->l_total);
        return;
    }
    m->m_base = p;
    m->m_len = l->l_total;
    shm_set_layout(m, l);
}

// A rank's status record: "ok\n<pid>\n<viable 0|1>\n<domain>\n<why>" or
// "err\n<why>".
typedef struct shm_rec {
    bool r_ok;
    bool r_viable;
    pid_t r_pid;
    char r_domain[TP_CMA_DOMAIN_MAX];
    char r_why[512];
} shm_rec;

static void
shm_rec_parse(const char *v, shm_rec *r)
{
    memset(r, 0, sizeof(*r));
    if (strncmp(v, "err\n", 4) == 0) {
        snprintf(r->r_why, sizeof(r->r_why), "%s", v + 4);
        return;
    }
    int pid = 0, viable = 0, used = 0;
    if (strncmp(v, "ok\n", 3) != 0 ||
        sscanf(v + 3, "%d\n%d\n%n", &pid, &viable, &used) != 2 || used == 0) {
        snprintf(r->r_why, sizeof(r->r_why), "malformed status \"%.64s\"", v);
        return;
    }
    const char *d = v + 3 + used;
    const char *nl = strchr(d, '\n');
    size_t dl = nl != NULL ? (size_t)(nl - d) : strlen(d);
    if (dl >= sizeof(r->r_domain)) {
        snprintf(r->r_why, sizeof(r->r_why), "cma domain too long");
        return;
    }
    memcpy(r->r_domain, d, dl);
    r->r_domain[dl] = '\0';
    snprintf(r->r_why, sizeof(r->r_why), "%s", nl != NULL ? nl + 1 : "");
    r->r_ok = true;
    r->r_viable = viable != 0;
    r->r_pid = (pid_t)pid;
}

// Publishes this rank's status: mapped (with the cma facts) or @fail.
static tp_status
shm_publish_status(const tp__shm_setup *s, tp__shm *m, const char *fail,
                   tp_error **err_p)
{
    char rec[1024], key[TP_STORE_MAX_KEY + 1];
    if (fail[0] != '\0') {
        snprintf(rec, sizeof(rec), "err\n%s", fail);
    } else {
        char domain[TP_CMA_DOMAIN_MAX] = "", cwhy[512] = "";
        tp_error *e = NULL;
        bool viable = false;
        if (tp__cma_domain(domain, sizeof(domain), &e) != TP_OK) {
            snprintf(cwhy, sizeof(cwhy), "cma domain: %s", tp_error_message(e));
            tp_error_unref(e);
            snprintf(domain, sizeof(domain), "?");
        } else {
            viable = tp__cma_viable(cwhy, sizeof(cwhy));
        }
        snprintf(rec, sizeof(rec), "ok\n%d\n%d\n%s\n%s", (int)getpid(),
                 viable ? 1 : 0, domain, cwhy);
        m->m_ctl[m->m_rank].c_pid = (int32_t)getpid();
    }
    snprintf(key, sizeof(key), "%sshm/ok/%d", s->prefix, s->rank);
    tp_status st = tp_store_set(s->store, key, rec, strlen(rec),
                                shm_store_ms(s->deadline_ns), err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st,
                              "shm open (group \"%s\", rank %d): publishing "
                              "this rank's status",
                              m->m_group, m->m_rank);
    }
    return TP_OK;
}

// Reads every rank's status; *@usable_p false: @why names the first rank
// that cannot use the engine, and why.
static tp_status
shm_read_status(const tp__shm_setup *s, tp__shm *m, char *why, size_t why_len,
                bool *usable_p, tp_error **err_p)
{
    shm_rec *rec = tp__alloc(sizeof(shm_rec) * 2);
    if (rec == NULL) {
        return tp__error_set(err_p, TP_ENOMEM,
                             "shm open (group \"%s\", rank %d): out of memory",
                             m->m_group, m->m_rank);
    }
    shm_rec *r0 = &rec[0], *rq = &rec[1];
    bool found = false;
    char buf[TP_CMA_DOMAIN_MAX * 2 + 600];
    buf[0] = '\0';
    for (int q = 0; q < s->size; q++) {
        char key[TP_STORE_MAX_KEY + 1];
        snprintf(key, sizeof(key), "%sshm/ok/%d", s->prefix, q);
        void *val = NULL;
        size_t len = 0;
        tp_status st = tp_store_get(s->store, key, shm_store_ms(s->deadline_ns),
                                    &val, &len, err_p);
        if (st != TP_OK) {
            tp__free(rec);
            return tp__error_wrap(err_p, st,
                                  "shm open (group \"%s\", rank %d): waiting "
                                  "for the status of rank %d (world rank %d)",
                                  m->m_group, m->m_rank, q, m->m_world[q]);
        }
        shm_rec *r = q == 0 ? r0 : rq;
        shm_rec_parse(val, r);
        free(val);
        m->m_pid[q] = r->r_pid;
        if (found) {
            continue; // read every status anyway: rank 0 unlinks after
        }
        if (!r->r_ok) {
            snprintf(buf, sizeof(buf), "rank %d: %s", q, r->r_why);
            found = true;
        } else if (!r->r_viable) {
            snprintf(buf, sizeof(buf),
                     "rank %d: cross-memory attach not "
                     "usable: %s",
                     q, r->r_why);
            found = true;
        } else if (q > 0 && strcmp(r->r_domain, r0->r_domain) != 0) {
            snprintf(buf, sizeof(buf),
                     "rank %d: cma domain %s differs from rank 0's %s", q,
                     r->r_domain, r0->r_domain);
            found = true;
        }
    }
    if (why_len > 0) {
        snprintf(why, why_len, "%s", buf);
    }
    tp__free(rec);
    *usable_p = !found;
    return TP_OK;
}

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static tp_status
shm_open_pidfds(tp__shm *m, tp_error **err_p)
{
    for (int q = 0; q < m->m_size; q++) {
        if (q == m->m_rank) {
            continue;
        }
        long fd = syscall(SYS_pidfd_open, m->m_pid[q], 0);
        if (fd >= 0) {
            m->m_pidfd[q] = (int)fd; // pidfds are always close-on-exec
        } else if (errno == ESRCH) {
            return tp__error_set(err_p, TP_ECONNRESET,
                                 "shm open (group \"%s\", rank %d): rank %d "
                                 "(world rank %d, pid %d) exited",
                                 m->m_group, m->m_rank, q, m->m_world[q],
                                 (int)m->m_pid[q]);
        }
        // Otherwise (ENOSYS: kernel < 5.3; seccomp): kill(pid, 0).
    }
    return TP_OK;
}

tp_status
tp__shm_open(const tp__shm_setup *s, tp__shm **shm_p, char *why, size_t why_len,
             tp_error **err_p)
{
    if (s == NULL || shm_p == NULL || s->size < 1 || s->size > SHM_MAX_SIZE ||
        s->rank < 0 || s->rank >= s->size || s->slot_bytes == 0 ||
        s->slot_bytes > SIZE_MAX / 4 ||
        (s->size > 1 && (s->store == NULL || s->prefix == NULL))) {
        return tp__error_set(err_p, TP_EINVAL,
                             "shm open: bad setup (rank %d, size %d, slot "
                             "%zu bytes)",
                             s != NULL ? s->rank : -1, s != NULL ? s->size : -1,
                             s != NULL ? s->slot_bytes : 0);
    }
    if (why_len > 0) {
        why[0] = '\0';
    }
    tp__cma_allow_peers();
    tp__shm *m = NULL;
    tp_status st = shm_engine_create(s, &m, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (s->size == 1) {
        *shm_p = m;
        return TP_OK;
    }
    shm_layout l;
    if (!shm_layout_of(s->size, m->m_slot, &l)) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "shm open (group \"%s\", rank %d): %d slots of "
                           "%zu bytes do not fit the address space",
                           m->m_group, s->rank, 2 * s->size, s->slot_bytes);
        tp__shm_close(m);
        return st;
    }
    char key[TP_STORE_MAX_KEY + 1];
    snprintf(key, sizeof(key), "%sshm/name", s->prefix);
    char name[64] = "", fail[768] = "";
    if (s->rank == 0) {
        shm_segment_create(m, &l, name, sizeof(name), fail, sizeof(fail));
        // "!<why>" tells the others there is no segment.
        char val[sizeof(fail) + 1];
        snprintf(val, sizeof(val), "%s%s", fail[0] != '\0' ? "!" : "",
                 fail[0] != '\0' ? fail : name);
        st = tp_store_set(s->store, key, val, strlen(val),
                          shm_store_ms(s->deadline_ns), err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "shm open (group \"%s\", rank 0): publishing the "
                           "segment name",
                           m->m_group);
            goto out_unlink;
        }
    } else {
        void *val = NULL;
        size_t len = 0;
        st = tp_store_get(s->store, key, shm_store_ms(s->deadline_ns), &val,
                          &len, err_p);
        if (st != TP_OK) {
            tp__error_wrap(err_p, st,
                           "shm open (group \"%s\", rank %d): waiting for "
                           "rank 0's segment name",
                           m->m_group, m->m_rank);
            goto out_close;
        }
        const char *v = val;
        if (v[0] == '!' || len == 0 || len >= sizeof(name)) {
            snprintf(fail, sizeof(fail), "no segment (rank 0 failed)");
        } else {
            snprintf(name, sizeof(name), "%s", v);
            shm_segment_map(m, &l, name, fail, sizeof(fail));
        }
        free(val);
    }
    st = shm_publish_status(s, m, fail, err_p);
    if (st == TP_OK) {
        char buf[1200];
        bool usable = false;
        st = shm_read_status(s, m, buf, sizeof(buf), &usable, err_p);
        if (st == TP_OK && !usable) {
            // Unusable: every rank read the same statuses, so the same why.
            if (why_len > 0) {
                snprintf(why, why_len, "%s", buf);
            }
            if (s->rank == 0 && name[0] != '\0') {
                shm_unlink(name);
            }
            tp__shm_close(m);
            *shm_p = NULL;
            return TP_OK;
        }
    }
    // Every rank reported (or we give up): the name is no longer needed.
out_unlink:
    if (s->rank == 0 && name[0] != '\0') {
        shm_unlink(name);
    }
    if (st == TP_OK) {
        st = shm_open_pidfds(m, err_p);
    }
    if (st == TP_OK) {
        *shm_p = m;
        return TP_OK;
    }
out_close:
    tp__shm_close(m);
    return st;
}

bool
tp__shm_viable(char *why, size_t why_len)
{
    char cma[256];
    if (!tp__cma_viable(cma, sizeof(cma))) {
        snprintf(why, why_len, "cross-memory attach: %s", cma);
        return false;
    }
    char name[64];
    snprintf(name, sizeof(name), "/tp-coll-probe-%d-%016" PRIx64, (int)getpid(),
             tp__random_u64());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "shm_open of /dev/shm%s: %s", name,
                 strerror(errno));
        return false;
    }
    shm_unlink(name);
    int e = posix_fallocate(fd, 0, 1 << 20);
    close(fd);
    if (e != 0) {
        snprintf(why, why_len, "posix_fallocate of 1 MiB in /dev/shm: %s",
                 strerror(e));
        return false;
    }
    return true;
}
