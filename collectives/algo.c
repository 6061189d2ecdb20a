/* SPDX-License-Identifier: Apache-2.0 */
/* algo.c - the pipe engine's algorithms (algo.h). n = group size, r =
 * this rank, S = bytes per rank.
 *
 *   barrier         dissemination: ceil(log2 n) rounds; in round k each
 *                   rank sends an empty message to r + 2^k and waits for
 *                   one from r - 2^k.
 *   broadcast       S <= small_max (or TP_COLL_BCAST=tree): binomial tree
 *                   from the root, log2 n steps. Larger (chain): a
 *                   pipelined chain root -> root+1 -> ...; every piece of
 *                   coll_chunk bytes is forwarded as soon as it arrived.
 *   all_reduce      S <= small_max (or rd): recursive doubling, log2 n
 *                   exchanges of the whole buffer; with n not a power of
 *                   two the first 2*(n - 2^k) ranks pair up first and the
 *                   odd ones stand in for the even ones. Larger (ring):
 *                   reduce-scatter then all-gather around a ring, 2(n-1)
 *                   steps of S/n; each step moves in coll_chunk pieces and
 *                   reduces a piece as soon as it arrived.
 *   reduce          binomial tree towards the root (non-roots accumulate
 *                   in a scratch copy: their buffer does not change).
 *   all_gather      ring, n-1 steps of S.
 *   gather, scatter direct: the root posts n-1 receives (sends) at once.
 *   reduce_scatter  direct: block j goes to rank j; each rank reduces the
 *                   n blocks it received in rank order.
 *   all_to_all      direct: every receive, then every send, posted at once.
 *
 * Every pairwise combination puts the lower rank's operand first, and
 * every final value is computed once and copied, so every rank ends with
 * bitwise identical results. */
#include "collectives/algo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/reduce.h"
#include "core/error.h"
#include "core/platform.h"

// A set of requests of one collective: waited for together; canceled on
// error.
typedef struct reqs {
    tp__req **r;
    int n;
    int cap;
} reqs;

static tp_status
reqs_grow(reqs *q, const tp__algo *c, tp_error **err_p)
{
    if (q->n < q->cap) {
        return TP_OK;
    }
    int cap = q->cap == 0 ? 16 : q->cap * 2;
    tp__req **r = realloc(q->r, (size_t)cap * sizeof(*r));
    if (r == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: no memory", c->what);
    }
    q->r = r;
    q->cap = cap;
    return TP_OK;
}

static tp_status
xsend(const tp__algo *c, reqs *q, int to, const void *buf, size_t len,
      tp_error **err_p)
{
    tp_status st = reqs_grow(q, c, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp__req *r = NULL;
    st = tp__p2p_isend(c->p2p, c->wranks[to], c->gid, TP__CHAN_COLL, c->tag,
                       buf, len, NULL, NULL, &r, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: send to rank %d", c->what, to);
    }
    q->r[q->n++] = r;
    return TP_OK;
}

static tp_status
xrecv(const tp__algo *c, reqs *q, int from, void *buf, size_t len,
      tp_error **err_p)
{
    tp_status st = reqs_grow(q, c, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp__req *r = NULL;
    st = tp__p2p_irecv(c->p2p, c->wranks[from], c->gid, TP__CHAN_COLL, c->tag,
                       buf, len, NULL, NULL, &r, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: receive from rank %d", c->what,
                              from);
    }
    q->r[q->n++] = r;
    return TP_OK;
}

// Waits for requests [from, from + n) of @q.
static tp_status
wait_range(const tp__algo *c, reqs *q, int from, int n, tp_error **err_p)
{
    return tp__p2p_waitall(c->p2p, q->r + from, n, c->start_ns, c->deadline_ns,
                           c->check, c->check_arg, c->what, err_p);
}

static tp_status
wait_all(const tp__algo *c, reqs *q, tp_error **err_p)
{
    tp_status st = wait_range(c, q, 0, q->n, err_p);
    if (st == TP_OK) {
        for (int i = 0; i < q->n; i++) {
            tp__req_free(q->r[i]);
        }
        q->n = 0;
    }
    return st;
}

// Cancels whatever is still in flight (after an error) and frees @q.
// Before the deadline a send in flight gets the usual grace to complete
// on its own (see tp__req_cancel_free); once it passed, it is canceled at
// once: a peer that cannot take it (stopped, swapped out) must not make
// the collective fail at twice its timeout.
static void
reqs_fini(const tp__algo *c, reqs *q)
{
    int64_t grace_ms = tp__now_ns() >= c->deadline_ns ? 1 : -1;
    for (int i = 0; i < q->n; i++) {
        tp__req_cancel_free_within(q->r[i], grace_ms);
    }
    free(q->r);
    q->r = NULL;
    q->n = q->cap = 0;
}

// The group's scratch buffer, at least @bytes (kept between collectives:
// a fresh 32 MiB buffer per collective costs its page faults every time).
// NULL if out of memory.
static void *
scratch(const tp__algo *c, size_t bytes)
{
    if (*c->scratch_len < bytes) {
        void *p = realloc(*c->scratch, bytes);
        if (p == NULL) {
            return NULL;
        }
        *c->scratch = p;
        *c->scratch_len = bytes;
    }
    return *c->scratch;
}

static size_t
esize(const tp__coll_args *a)
{
    return tp_dtype_size(a->dtype);
}

// Elements [lo, hi) of block @i when @count elements are cut in @n.
static void
block(size_t count, int n, int i, size_t *lo, size_t *len)
{
    size_t b = (size_t)i * count / (size_t)n;
    size_t e = (size_t)(i + 1) * count / (size_t)n;
    *lo = b;
    *len = e - b;
}

static int
mod(int a, int n)
{
    return ((a % n) + n) % n;
}

// ---- barrier
// -------------------------------------------------------------------

static tp_status
run_barrier(const tp__algo *c, reqs *q, tp_error **err_p)
{
    int n = c->size, r = c->rank;
    for (int k = 1; k < n; k <<= 1) {
        tp_status st = xrecv(c, q, mod(r - k, n), NULL, 0, err_p);
        if (st == TP_OK) {
            st = xsend(c, q, mod(r + k, n), NULL, 0, err_p);
        }
        if (st == TP_OK) {
            st = wait_all(c, q, err_p);
        }
        if (st != TP_OK) {
            return st;
        }
    }
    return TP_OK;
}

// ---- broadcast
// -----------------------------------------------------------------

static bool
bcast_is_chain(const tp__algo *c, size_t bytes)
{
    if (c->bcast_algo == TP_COLL_ALGO_SMALL) {
        return false;
    }
    if (c->bcast_algo == TP_COLL_ALGO_LARGE) {
        return true;
    }
    return bytes > c->small_max && c->size > 2;
}

static tp_status
run_bcast(const tp__algo *c, const tp__coll_args *a, reqs *q, tp_error **err_p)
{
    int n = c->size;
    int vr = mod(c->rank - a->root, n);
    size_t bytes = a->count * esize(a);
    char *buf = a->buf;
    tp_status st = TP_OK;
    if (!bcast_is_chain(c, bytes)) {
        int mask = 1;
        while (mask < n) {
            if (vr & mask) {
                st =
                    xrecv(c, q, mod(vr - mask + a->root, n), buf, bytes, err_p);
                if (st == TP_OK) {
                    st = wait_all(c, q, err_p);
                }
                if (st != TP_OK) {
                    return st;
                }
                break;
            }
            mask <<= 1;
        }
        for (mask >>= 1; mask > 0; mask >>= 1) {
            if (vr + mask < n) {
                st =
                    xsend(c, q, mod(vr + mask + a->root, n), buf, bytes, err_p);
                if (st != TP_OK) {
                    return st;
                }
            }
        }
        return wait_all(c, q, err_p);
    }
    // Pipelined chain in relative rank order.
    size_t piece = c->chunk;
    size_t npieces = bytes == 0 ? 1 : (bytes + piece - 1) / piece;
    int prev = mod(vr - 1 + a->root, n), next = mod(vr + 1 + a->root, n);
    if (vr > 0) {
        for (size_t i = 0; i < npieces && st == TP_OK; i++) {
            size_t off = i * piece;
            size_t len = bytes - off < piece ? bytes - off : piece;
            st = xrecv(c, q, prev, buf + off, len, err_p);
        }
    }
    int nrecv = q->n;
    for (size_t i = 0; i < npieces && st == TP_OK; i++) {
        size_t off = i * piece;
        size_t len = bytes - off < piece ? bytes - off : piece;
        if (vr > 0) {
            st = wait_range(c, q, (int)i, 1, err_p);
        }
        if (st == TP_OK && vr < n - 1) {
            st = xsend(c, q, next, buf + off, len, err_p);
        }
    }
    (void)nrecv;
    return st == TP_OK ? wait_all(c, q, err_p) : st;
}

// ---- all_reduce
// ----------------------------------------------------------------

// buf = lower op higher, where @tmp came from rank @peer.
static void
combine(const tp__coll_args *a, int me, int peer, void *buf, const void *tmp,
        size_t count)
{
    if (peer < me) {
        tp__reduce3(a->op, a->dtype, buf, tmp, buf, count);
    } else {
        tp__reduce(a->op, a->dtype, buf, tmp, count);
    }
}

static tp_status
run_allreduce_rd(const tp__algo *c, const tp__coll_args *a, void *buf,
                 size_t count, reqs *q, tp_error **err_p)
{
    int n = c->size, r = c->rank;
    size_t bytes = count * esize(a);
    void *tmp = bytes > 0 ? scratch(c, bytes) : NULL;
    if (bytes > 0 && tmp == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: %zu bytes of scratch",
                             c->what, bytes);
    }
    int pof2 = 1;
    while (pof2 * 2 <= n) {
        pof2 *= 2;
    }
    int rem = n - pof2;
    int newrank;
    tp_status st = TP_OK;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            st = xsend(c, q, r + 1, buf, bytes, err_p);
            if (st == TP_OK) {
                st = wait_all(c, q, err_p);
            }
            newrank = -1;
        } else {
            st = xrecv(c, q, r - 1, tmp, bytes, err_p);
            if (st == TP_OK) {
                st = wait_all(c, q, err_p);
            }
            if (st == TP_OK) {
                combine(a, r, r - 1, buf, tmp, count);
            }
            newrank = r / 2;
        }
    } else {
        newrank = r - rem;
    }
    for (int mask = 1; st == TP_OK && newrank >= 0 && mask < pof2; mask <<= 1) {
        int nd = newrank ^ mask;
        int dst = nd < rem ? nd * 2 + 1 : nd + rem;
        st = xrecv(c, q, dst, tmp, bytes, err_p);
        if (st == TP_OK) {
            st = xsend(c, q, dst, buf, bytes, err_p);
        }
        if (st == TP_OK) {
            st = wait_all(c, q, err_p);
        }
        if (st == TP_OK) {
            combine(a, r, dst, buf, tmp, count);
        }
    }
    if (st == TP_OK && r < 2 * rem) {
        st = r % 2 != 0 ? xsend(c, q, r - 1, buf, bytes, err_p)
                        : xrecv(c, q, r + 1, buf, bytes, err_p);
        if (st == TP_OK) {
            st = wait_all(c, q, err_p);
        }
    }
    if (st != TP_OK) {
        reqs_fini(c, q); // before the scratch goes
    }
    return st;
}

// Ring reduce-scatter over @n blocks of @buf: afterwards this rank holds
// block (r + 1 + shift) mod n fully reduced. Pieces of a step are reduced
// as they arrive.
static tp_status
ring_reduce_scatter(const tp__algo *c, const tp__coll_args *a, char *buf,
                    size_t count, int shift, reqs *q, tp_error **err_p)
{
    int n = c->size, r = c->rank;
    size_t es = esize(a);
    int next = mod(r + 1, n), prev = mod(r - 1, n);
    size_t maxb = (count + (size_t)n - 1) / (size_t)n + 1;
    char *tmp = scratch(c, maxb * es);
    if (tmp == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: %zu bytes of scratch",
                             c->what, maxb * es);
    }
    size_t piece_el = c->chunk / es > 0 ? c->chunk / es : 1;
    tp_status st = TP_OK;
    for (int s = 0; s < n - 1 && st == TP_OK; s++) {
        size_t slo, slen, rlo, rlen;
        block(count, n, mod(r - s + shift, n), &slo, &slen);
        block(count, n, mod(r - s - 1 + shift, n), &rlo, &rlen);
        int base = q->n;
        for (size_t off = 0; off < rlen && st == TP_OK; off += piece_el) {
            size_t len = rlen - off < piece_el ? rlen - off : piece_el;
            st = xrecv(c, q, prev, tmp + off * es, len * es, err_p);
        }
        if (rlen == 0 && st == TP_OK) {
            st = xrecv(c, q, prev, NULL, 0, err_p);
        }
        int nrecv = q->n - base;
        for (size_t off = 0; off < slen && st == TP_OK; off += piece_el) {
            size_t len = slen - off < piece_el ? slen - off : piece_el;
            st = xsend(c, q, next, buf + (slo + off) * es, len * es, err_p);
        }
        if (slen == 0 && st == TP_OK) {
            st = xsend(c, q, next, NULL, 0, err_p);
        }
        for (int i = 0; i < nrecv && st == TP_OK; i++) {
            st = wait_range(c, q, base + i, 1, err_p);
            if (st == TP_OK && rlen > 0) {
                size_t off = (size_t)i * piece_el;
                size_t len = rlen - off < piece_el ? rlen - off : piece_el;
                // The incoming partial comes from lower ranks around the
                // ring; the order is fixed per block, so every rank that
                // later copies the block gets the same bits.
                tp__reduce(a->op, a->dtype, buf + (rlo + off) * es,
                           tmp + off * es, len);
            }
        }
        if (st == TP_OK) {
            st = wait_all(c, q, err_p);
        }
    }
    if (st != TP_OK) {
        reqs_fini(c, q);
    }
    return st;
}

// Ring all-gather of the @n blocks of @buf: this rank starts with block
// (r + 1 + shift) mod n.
static tp_status
ring_all_gather(const tp__algo *c, char *buf, size_t count, size_t es,
                int shift, reqs *q, tp_error **err_p)
{
    int n = c->size, r = c->rank;
    int next = mod(r + 1, n), prev = mod(r - 1, n);
    tp_status st = TP_OK;
    for (int s = 0; s < n - 1 && st == TP_OK; s++) {
        size_t slo, slen, rlo, rlen;
        block(count, n, mod(r - s + 1 + shift, n), &slo, &slen);
        block(count, n, mod(r - s + shift, n), &rlo, &rlen);
        st = xrecv(c, q, prev, buf + rlo * es, rlen * es, err_p);
        if (st == TP_OK) {
            st = xsend(c, q, next, buf + slo * es, slen * es, err_p);
        }
        if (st == TP_OK) {
            st = wait_all(c, q, err_p);
        }
    }
    return st;
}

static bool
allreduce_is_ring(const tp__algo *c, size_t bytes, size_t count)
{
    if (c->allreduce_algo == TP_COLL_ALGO_SMALL) {
        return false;
    }
    if (c->allreduce_algo == TP_COLL_ALGO_LARGE) {
        return true;
    }
    return bytes > c->small_max && count >= (size_t)c->size;
}

static tp_status
run_allreduce(const tp__algo *c, const tp__coll_args *a, reqs *q,
              tp_error **err_p)
{
    size_t bytes = a->count * esize(a);
    if (!allreduce_is_ring(c, bytes, a->count)) {
        return run_allreduce_rd(c, a, a->buf, a->count, q, err_p);
    }
    tp_status st = ring_reduce_scatter(c, a, a->buf, a->count, 0, q, err_p);
    if (st == TP_OK) {
        st = ring_all_gather(c, a->buf, a->count, esize(a), 0, q, err_p);
    }
    return st;
}

// ---- reduce
// ----------------------------------------------------------------------

static tp_status
run_reduce(const tp__algo *c, const tp__coll_args *a, reqs *q, tp_error **err_p)
{
    int n = c->size;
    int vr = mod(c->rank - a->root, n);
    size_t bytes = a->count * esize(a);
    bool root = vr == 0;
    char *acc = a->buf;
    char *tmp = NULL;
    if (bytes > 0) {
        tmp = scratch(c, root ? bytes : 2 * bytes);
        if (tmp == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "%s: %zu bytes of scratch",
                                 c->what, 2 * bytes);
        }
        if (!root) {
            acc = tmp + bytes;
            memcpy(acc, a->buf, bytes);
        }
    }
    tp_status st = TP_OK;
    for (int mask = 1; mask < n && st == TP_OK; mask <<= 1) {
        if ((vr & mask) == 0) {
            int child = vr | mask;
            if (child < n) {
                int from = mod(child + a->root, n);
                st = xrecv(c, q, from, tmp, bytes, err_p);
                if (st == TP_OK) {
                    st = wait_all(c, q, err_p);
                }
                if (st == TP_OK && bytes > 0) {
                    combine(a, c->rank, from, acc, tmp, a->count);
                }
            }
        } else {
            st = xsend(c, q, mod((vr & ~mask) + a->root, n), acc, bytes, err_p);
            if (st == TP_OK) {
                st = wait_all(c, q, err_p);
            }
            break;
        }
    }
    if (st != TP_OK) {
        reqs_fini(c, q);
    }
    return st;
}

// ---- gathers, scatters
// -----------------------------------------------------------

static tp_status
run_all_gather(const tp__algo *c, const tp__coll_args *a, reqs *q,
               tp_error **err_p)
{
    size_t es = esize(a);
    size_t bytes = a->count * es;
    char *out = a->out;
    if (bytes > 0) {
        memcpy(out + (size_t)c->rank * bytes, a->in, bytes);
    }
    // Blocks of the whole output, one per rank: this rank starts with its
    // own, block r = (r + 1 + shift) with shift -1.
    return ring_all_gather(c, out, a->count * (size_t)c->size, es, -1, q,
                           err_p);
}

static tp_status
run_gather(const tp__algo *c, const tp__coll_args *a, reqs *q, tp_error **err_p)
{
    size_t bytes = a->count * esize(a);
    tp_status st = TP_OK;
    if (c->rank != a->root) {
        st = xsend(c, q, a->root, a->in, bytes, err_p);
        return st == TP_OK ? wait_all(c, q, err_p) : st;
    }
    char *out = a->out;
    for (int i = 0; i < c->size && st == TP_OK; i++) {
        if (i != c->rank) {
            st = xrecv(c, q, i, out + (size_t)i * bytes, bytes, err_p);
        } else if (bytes > 0) {
            memcpy(out + (size_t)i * bytes, a->in, bytes);
        }
    }
    return st == TP_OK ? wait_all(c, q, err_p) : st;
}

static tp_status
run_scatter(const tp__algo *c, const tp__coll_args *a, reqs *q,
            tp_error **err_p)
{
    size_t bytes = a->count * esize(a);
    tp_status st = TP_OK;
    if (c->rank != a->root) {
        st = xrecv(c, q, a->root, a->out, bytes, err_p);
        return st == TP_OK ? wait_all(c, q, err_p) : st;
    }
    const char *in = a->in;
    for (int i = 0; i < c->size && st == TP_OK; i++) {
        if (i != c->rank) {
            st = xsend(c, q, i, in + (size_t)i * bytes, bytes, err_p);
        } else if (bytes > 0) {
            memcpy(a->out, in + (size_t)i * bytes, bytes);
        }
    }
    return st == TP_OK ? wait_all(c, q, err_p) : st;
}

static tp_status
run_reduce_scatter(const tp__algo *c, const tp__coll_args *a, reqs *q,
                   tp_error **err_p)
{
    int n = c->size, r = c->rank;
    size_t bytes = a->count * esize(a);
    const char *in = a->in;
    char *tmp = NULL;
    if (bytes > 0 && n > 1) {
        tmp = scratch(c, (size_t)n * bytes);
        if (tmp == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "%s: %zu bytes of scratch",
                                 c->what, (size_t)n * bytes);
        }
    }
    tp_status st = TP_OK;
    for (int i = 0; i < n && st == TP_OK; i++) {
        if (i != r) {
            st = xrecv(c, q, i, tmp != NULL ? tmp + (size_t)i * bytes : NULL,
                       bytes, err_p);
        }
    }
    for (int i = 0; i < n && st == TP_OK; i++) {
        if (i != r) {
            st = xsend(c, q, i, in + (size_t)i * bytes, bytes, err_p);
        }
    }
    if (st == TP_OK) {
        st = wait_all(c, q, err_p);
    }
    if (st == TP_OK && bytes > 0) {
        // out = block r of rank 0 op rank 1 op ..., in rank order.
        const void *b0 = r == 0 ? in + (size_t)r * bytes : tmp;
        if (n == 1) {
            memcpy(a->out, b0, bytes);
        } else {
            const void *b1 = r == 1 ? in + (size_t)r * bytes : tmp + bytes;
            tp__reduce3(a->op, a->dtype, a->out, b0, b1, a->count);
            for (int i = 2; i < n; i++) {
                const void *bi =
                    i == r ? in + (size_t)r * bytes : tmp + (size_t)i * bytes;
                tp__reduce(a->op, a->dtype, a->out, bi, a->count);
            }
        }
    }
    if (st != TP_OK) {
        reqs_fini(c, q);
    }
    return st;
}

static tp_status
run_all_to_all(const tp__algo *c, const tp__coll_args *a, reqs *q,
               tp_error **err_p)
{
    int n = c->size, r = c->rank;
    size_t es = esize(a);
    const char *in = a->in;
    char *out = a->out;
    tp_status st = TP_OK;
    for (int i = 0; i < n && st == TP_OK; i++) {
        if (i != r) {
            st = xrecv(c, q, i, out + a->rdispls[i] * es, a->rcounts[i] * es,
                       err_p);
        }
    }
    for (int i = 0; i < n && st == TP_OK; i++) {
        if (i != r) {
            st = xsend(c, q, i, in + a->sdispls[i] * es, a->scounts[i] * es,
                       err_p);
        }
    }
    if (st == TP_OK && a->scounts[r] > 0) {
        memcpy(out + a->rdispls[r] * es, in + a->sdispls[r] * es,
               a->scounts[r] * es);
    }
    return st == TP_OK ? wait_all(c, q, err_p) : st;
}

// ---- entry
// -------------------------------------------------------------------------

tp_status
tp__algo_run(const tp__algo *c, const tp__coll_args *a, tp_error **err_p)
{
    reqs q = {0};
    tp_status st;
    switch (a->kind) {
    case TP__COLL_BARRIER:
        st = run_barrier(c, &q, err_p);
        break;
    case TP__COLL_BROADCAST:
        st = run_bcast(c, a, &q, err_p);
        break;
    case TP__COLL_ALL_REDUCE:
        st = run_allreduce(c, a, &q, err_p);
        break;
    case TP__COLL_REDUCE:
        st = run_reduce(c, a, &q, err_p);
        break;
    case TP__COLL_ALL_GATHER:
        st = run_all_gather(c, a, &q, err_p);
        break;
    case TP__COLL_GATHER:
        st = run_gather(c, a, &q, err_p);
        break;
    case TP__COLL_SCATTER:
        st = run_scatter(c, a, &q, err_p);
        break;
    case TP__COLL_REDUCE_SCATTER:
        st = run_reduce_scatter(c, a, &q, err_p);
        break;
    case TP__COLL_ALL_TO_ALL:
        st = run_all_to_all(c, a, &q, err_p);
        break;
    default:
        st = tp__error_set(err_p, TP_EINVAL, "%s: unknown collective %d",
                           c->what, (int)a->kind);
        break;
    }
    reqs_fini(c, &q);
    return st;
}
