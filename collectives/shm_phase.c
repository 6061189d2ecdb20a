/* SPDX-License-Identifier: Apache-2.0 */
/* shm_phase.c - the shm engine's phases (shm_impl.h): posting and waiting,
 * the members' liveness, and publishing and reading contributions.
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
 * every member within a slice. */

#include "collectives/shm_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/host.h"
#include "collectives/reduce.h"
#include "core/error.h"

// ---- errors ----------------------------------------------------------------

// "shm <op> (group "<g>", rank <r>): <message>"
tp_status
tp__shm_fail(const shm_op *o, tp_status st, const char *fmt, ...)
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
void
tp__shm_who(const tp__shm *m, int q, char *buf, size_t len)
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

void
tp__shm_post(tp__shm *m, uint32_t p)
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

// After a failed collective: ranks waiting on this one wake now, the rest
// see it within a slice (shm_check_members).
void
tp__shm_abort(tp__shm *m, int blame, bool timed_out)
{
    shm_ctl *c = &m->m_ctl[m->m_rank];
    uint32_t word = (uint32_t)blame + 1;
    if (timed_out) {
        word |= SHM_ABORT_TIMEOUT;
    }
    atomic_store_explicit(&c->c_abort, word, memory_order_seq_cst);
    shm_futex(&c->c_arrive, FUTEX_WAKE, INT_MAX, NULL);
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
            tp__shm_who(m, x, who, sizeof(who));
            *o->o_blame = b >= 0 && b < m->m_size ? b : x;
            *o->o_timed_out = timed_out;
            tp__shm_who(m, *o->o_blame, blamed, sizeof(blamed));
            return tp__shm_fail(o, timed_out ? TP_ETIMEDOUT : TP_ECONNRESET,
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
            tp__shm_who(m, x, who, sizeof(who));
            *o->o_blame = x;
            return tp__shm_fail(o, TP_ECONNRESET,
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
// end within the spin double it too (tp__shm_wait). So a run of long
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
tp_status
tp__shm_wait(const shm_op *o, int q, uint32_t p)
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
            if (atomic_load_explicit(&m->m_closing, memory_order_acquire)) {
                return tp__shm_fail(o, TP_ECLOSED,
                                    "the group was destroyed on this rank");
            }
            tp_status st = shm_check_members(o, p, start, now);
            if (st != TP_OK) {
                return st;
            }
            next_check = now + SHM_SLICE_NS;
        }
        if (now >= o->o_deadline) {
            char who[96];
            tp__shm_who(m, q, who, sizeof(who));
            *o->o_blame = q;
            return tp__shm_fail(o, TP_ETIMEDOUT,
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
tp_status
tp__shm_wait_all(const shm_op *o, uint32_t p)
{
    tp__shm *m = o->o_m;
    for (int q = 0; q < m->m_size; q++) {
        if (q != m->m_rank) {
            tp_status st = tp__shm_wait(o, q, p);
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
tp_status
tp__shm_acquire(const shm_op *o, uint32_t p)
{
    if (shm_reached(o->o_m->m_min, p - 1)) {
        return TP_OK;
    }
    return tp__shm_wait_all(o, p - 1);
}

// Publishes @len bytes at @src as this rank's contribution to phase @p:
// copied into the slot if @slot, else its address for cma.
static tp_status
shm_give(const shm_op *o, uint32_t p, const void *src, size_t len, bool slot)
{
    tp__shm *m = o->o_m;
    tp_status st = tp__shm_acquire(o, p);
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
void
tp__shm_look(tp__shm *m, int q, uint32_t p)
{
    m->m_view[q].v_pub = m->m_ctl[q].c_pub[p & 1];
    m->m_view[q].v_slot = shm_slot(m, q, p);
}

void
tp__shm_look_all(tp__shm *m, uint32_t p)
{
    for (int q = 0; q < m->m_size; q++) {
        tp__shm_look(m, q, p);
    }
}

// Phase @p where every rank contributes: give @len bytes at @src (slot or
// published), post, wait for all, and take every rank's view.
// Phase @p of the one rank every other reads from (a broadcast's or a
// scatter's root): it gives @len bytes at @src and posts; a published
// buffer is held until every rank posted p + 1 (has read it).
tp_status
tp__shm_give_source(const shm_op *o, uint32_t p, const void *src, size_t len,
                    bool slot)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_post(o->o_m, p);
    if (slot) {
        return TP_OK;
    }
    tp__shm_post(o->o_m, p + 1);
    return tp__shm_wait_all(o, p + 1);
}

// Phase @p of a rooted collective where only @reader ranks read the
// others' contributions: every rank gives @len bytes at @src and posts.
// A rank that does not read is done (*@done_p) once its contribution may
// be reused: at once for a slot; for a published buffer, once the root
// posted p + 1 (it has read it).
tp_status
tp__shm_give_rooted(const shm_op *o, uint32_t p, const void *src, size_t len,
                    bool slot, bool reader, bool *done_p)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_post(o->o_m, p);
    *done_p = !reader;
    if (reader || slot) {
        return TP_OK;
    }
    tp__shm_post(o->o_m, p + 1);
    return tp__shm_wait(o, o->o_a->root, p + 1);
}

tp_status
tp__shm_give_all(const shm_op *o, uint32_t p, const void *src, size_t len,
                 bool slot)
{
    tp_status st = shm_give(o, p, src, len, slot);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_post(o->o_m, p);
    st = tp__shm_wait_all(o, p);
    if (st != TP_OK) {
        return st;
    }
    tp__shm_look_all(o->o_m, p);
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
    tp__shm_who(o->o_m, q, who, sizeof(who));
    return tp__shm_fail(o, TP_EPROTO,
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
        tp__shm_who(m, q, who, sizeof(who));
        *o->o_blame = q;
        return tp__error_wrap(o->o_err_p, st,
                              "shm %s (group \"%s\", rank %d): reading %s",
                              o->o_name, m->m_group, m->m_rank, who);
    }
    return TP_OK;
}

// Copies bytes [off, off + len) of rank @q's contribution to @dst.
tp_status
tp__shm_fetch(const shm_op *o, int q, uint64_t off, void *dst, uint64_t len)
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
tp_status
tp__shm_reduce_range(const shm_op *o, const void *mine, size_t off, size_t len,
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
