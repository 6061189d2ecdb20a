/* SPDX-License-Identifier: Apache-2.0 */
/* pg_api_ops.c - the public collective and point-to-point calls: each
 * checks its arguments, makes the work that holds the tensors and hands it
 * to the group's queue through pg_api.c. Takes only w_mtx. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "collectives/reduce.h"
#include "core/error.h"

// ---- collectives
// -----------------------------------------------------------------------

tp_status
tp_pg_barrier(tp_pg *pg, tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_BARRIER,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    wk->wk_args.dtype = TP_U8;
    return tp__pg_coll_finish(pg, wk, w_p, TP_OK, err_p);
}

tp_status
tp_pg_broadcast(tp_pg *pg, tp_tensor *t, int root, tp_work **w_p,
                tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_BROADCAST,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__pg_check_tensor(pg, "broadcast", "tensor", t, err_p);
    if (st == TP_OK) {
        st = tp__pg_check_root(pg, "broadcast", root, err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_stage(wk, &t, true, err_p);
    }
    if (st == TP_OK) {
        tp__pg_work_hold(wk, t, NULL);
        wk->wk_args.dtype = tp_tensor_dtype(t);
        wk->wk_args.root = root;
        wk->wk_args.buf = tp_tensor_data(t);
        wk->wk_args.count = tp__pg_numel(t);
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

// A reducing collective on the work @wk (from coll_begin).
static tp_status
reducing_on(tp_pg *pg, tp_work *wk, tp__coll_kind kind, tp_tensor *t, int root,
            tp_reduce_op op, tp_work **w_p, tp_error **err_p)
{
    const char *name = tp__coll_kind_name(kind);
    tp_status st = tp__pg_check_tensor(pg, name, "tensor", t, err_p);
    if (st == TP_OK && kind == TP__COLL_REDUCE) {
        st = tp__pg_check_root(pg, name, root, err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_check_op(pg, name, op, tp_tensor_dtype(t), err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_stage(wk, &t, true, err_p);
    }
    if (st == TP_OK) {
        tp__pg_work_hold(wk, t, NULL);
        wk->wk_op = op;
        wk->wk_args.op =
            op == TP_REDUCE_AVG && !wk->wk_cuda ? TP_REDUCE_SUM : op;
        wk->wk_args.dtype = tp_tensor_dtype(t);
        wk->wk_args.root = root;
        wk->wk_args.buf = tp_tensor_data(t);
        wk->wk_args.count = tp__pg_numel(t);
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

static tp_status
reducing(tp_pg *pg, tp__coll_kind kind, tp_tensor *t, int root, tp_reduce_op op,
         tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st =
        tp__pg_coll_begin(pg, kind, w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    return reducing_on(pg, wk, kind, t, root, op, w_p, err_p);
}

tp_status
tp_pg_all_reduce(tp_pg *pg, tp_tensor *t, tp_reduce_op op, tp_work **w_p,
                 tp_error **err_p)
{
    return reducing(pg, TP__COLL_ALL_REDUCE, t, 0, op, w_p, err_p);
}

tp_status
tp_pg_reduce(tp_pg *pg, tp_tensor *t, int root, tp_reduce_op op, tp_work **w_p,
             tp_error **err_p)
{
    return reducing(pg, TP__COLL_REDUCE, t, root, op, w_p, err_p);
}

// The elements of @t as a view of @flat from element @off, in @t's shape.
static tp_status
flat_view(tp_tensor *flat, int64_t off, const tp_tensor *t, tp_tensor **v_p,
          tp_error **err_p)
{
    tp_tensor *n = NULL;
    tp_status st = tp__view_narrow(flat, 0, off, tp_tensor_numel(t), &n, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__view_reshape(n, tp_tensor_ndim(t), tp_tensor_shape(t), v_p, err_p);
    tp_tensor_unref(n);
    return st;
}

tp_status
tp_pg_all_reduce_coalesced(tp_pg *pg, tp_tensor *const *ts, size_t n,
                           tp_reduce_op op, tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_ALL_REDUCE,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    const char *name = "all_reduce_coalesced";
    if (ts == NULL || n < 1 || n > INT32_MAX) {
        st = tp__error_set(err_p, TP_EINVAL, "%s: %s: %zu tensors (1 or more)",
                           pg->g_what, name, ts == NULL ? 0 : n);
    }
    int64_t total = 0;
    char arg[32];
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        snprintf(arg, sizeof(arg), "tensor %zu", i);
        st = tp__pg_check_tensor(pg, name, arg, ts[i], err_p);
        if (st == TP_OK && tp__pg_is_cuda(ts[i])) {
            st = tp__error_set(err_p, TP_ENOTSUP,
                               "%s: %s: %s is a CUDA tensor (all_reduce each "
                               "one)",
                               pg->g_what, name, arg);
        }
        if (st == TP_OK && tp_tensor_dtype(ts[i]) != tp_tensor_dtype(ts[0])) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "%s: %s: %s has dtype %s, tensor 0 has dtype %s",
                               pg->g_what, name, arg,
                               tp_dtype_name(tp_tensor_dtype(ts[i])),
                               tp_dtype_name(tp_tensor_dtype(ts[0])));
        }
        if (st == TP_OK) {
            total += tp_tensor_numel(ts[i]);
        }
    }
    // One buffer: the tensors one after the other; the result is copied
    // back into them once the all_reduce succeeded.
    tp_tensor *flat = NULL;
    if (st == TP_OK) {
        st = tp_tensor_empty(tp_tensor_dtype(ts[0]), 1, &total, &flat, err_p);
    }
    if (st == TP_OK) {
        wk->wk_back = calloc(n, sizeof(*wk->wk_back));
        if (wk->wk_back == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "%s: %s", pg->g_what, name);
        }
    }
    int64_t off = 0;
    for (size_t i = 0; st == TP_OK && i < n; i++) {
        tp_tensor *v = NULL;
        st = flat_view(flat, off, ts[i], &v, err_p);
        if (st == TP_OK) {
            st = tp__copy_raw(v, ts[i], err_p);
            wk->wk_back[i].b_dst = tp_tensor_ref(ts[i]);
            wk->wk_back[i].b_src = v;
            wk->wk_nback++;
        }
        off += tp_tensor_numel(ts[i]);
    }
    if (st != TP_OK) {
        tp_tensor_unref(flat);
        return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
    }
    wk->wk_no_result = true;
    st = reducing_on(pg, wk, TP__COLL_ALL_REDUCE, flat, 0, op, w_p, err_p);
    tp_tensor_unref(flat); // the work's reference holds it
    return st;
}

tp_status
tp_pg_all_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in, tp_work **w_p,
                 tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_ALL_GATHER,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__pg_check_tensor(pg, "all_gather", "out", out, err_p);
    if (st == TP_OK) {
        st = tp__pg_check_tensor(pg, "all_gather", "in", in, err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_check_blocks(pg, "all_gather", out, "out", in, "in", err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_stage2(wk, &out, &in, err_p);
    }
    if (st == TP_OK) {
        tp__pg_work_hold(wk, out, in);
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = tp__pg_numel(in);
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

// gather and scatter: every rank has a block (gather's in, scatter's out);
// the root also has the concatenation of the blocks (gather's out,
// scatter's in), checked against the block.
static tp_status
pg_rooted(tp_pg *pg, tp__coll_kind kind, const char *name, bool gather,
          tp_tensor *out, tp_tensor *in, int root, tp_work **w_p,
          tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st =
        tp__pg_coll_begin(pg, kind, w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_tensor *block = gather ? in : out;
    tp_tensor *all = gather ? out : in;
    const char *block_name = gather ? "in" : "out";
    const char *all_name = gather ? "out" : "in";
    st = tp__pg_check_root(pg, name, root, err_p);
    if (st == TP_OK) {
        st = tp__pg_check_tensor(pg, name, block_name, block, err_p);
    }
    bool is_root = st == TP_OK && pg->g_rank == root;
    if (is_root) {
        char what[32];
        snprintf(what, sizeof(what), "%s (on the root)", all_name);
        st = tp__pg_check_tensor(pg, name, what, all, err_p);
        if (st == TP_OK) {
            st = tp__pg_check_blocks(pg, name, all, all_name, block, block_name,
                                     err_p);
        }
    }
    if (st == TP_OK) {
        st = is_root  ? tp__pg_stage2(wk, &out, &in, err_p)
             : gather ? tp__pg_stage(wk, &in, false, err_p)
                      : tp__pg_stage(wk, &out, true, err_p);
    }
    if (st == TP_OK) {
        block = gather ? in : out;
        tp__pg_work_hold(wk, gather && !is_root ? NULL : out,
                         !gather && !is_root ? NULL : in);
        wk->wk_args.dtype = tp_tensor_dtype(block);
        wk->wk_args.root = root;
        wk->wk_args.in = gather || is_root ? tp_tensor_data(in) : NULL;
        wk->wk_args.out = !gather || is_root ? tp_tensor_data(out) : NULL;
        wk->wk_args.count = tp__pg_numel(block);
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

tp_status
tp_pg_gather(tp_pg *pg, tp_tensor *out, tp_tensor *in, int root, tp_work **w_p,
             tp_error **err_p)
{
    return pg_rooted(pg, TP__COLL_GATHER, "gather", true, out, in, root, w_p,
                     err_p);
}

tp_status
tp_pg_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in, int root, tp_work **w_p,
              tp_error **err_p)
{
    return pg_rooted(pg, TP__COLL_SCATTER, "scatter", false, out, in, root, w_p,
                     err_p);
}

tp_status
tp_pg_reduce_scatter(tp_pg *pg, tp_tensor *out, tp_tensor *in, tp_reduce_op op,
                     tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_REDUCE_SCATTER,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__pg_check_tensor(pg, "reduce_scatter", "out", out, err_p);
    if (st == TP_OK) {
        st = tp__pg_check_tensor(pg, "reduce_scatter", "in", in, err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_check_blocks(pg, "reduce_scatter", in, "in", out, "out",
                                 err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_check_op(pg, "reduce_scatter", op, tp_tensor_dtype(in),
                             err_p);
    }
    if (st == TP_OK) {
        st = tp__pg_stage2(wk, &out, &in, err_p);
    }
    if (st == TP_OK) {
        tp__pg_work_hold(wk, out, in);
        wk->wk_op = op;
        wk->wk_args.op =
            op == TP_REDUCE_AVG && !wk->wk_cuda ? TP_REDUCE_SUM : op;
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = tp__pg_numel(out);
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

// Rows of dimension 0 and the elements per row of @t (ndim >= 1).
static tp_status
a2a_rows(tp_pg *g, const char *arg, const tp_tensor *t, int64_t *rows,
         int64_t *row_el, tp_error **err_p)
{
    if (tp_tensor_ndim(t) < 1) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: all_to_all: %s has no dimension 0", g->g_what,
                             arg);
    }
    *rows = tp_tensor_size(t, 0);
    *row_el = *rows > 0 ? tp_tensor_numel(t) / *rows : 0;
    return TP_OK;
}

static tp_status
a2a_splits(tp_pg *g, const char *arg, const int64_t *splits, int64_t rows,
           int64_t row_el, size_t *counts, size_t *displs, tp_error **err_p)
{
    int n = g->g_size;
    if (splits == NULL) {
        if (rows % n != 0) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: all_to_all: %s has %" PRId64
                                 " rows, not divisible by the group size %d "
                                 "(pass split sizes)",
                                 g->g_what, arg, rows, n);
        }
    }
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        int64_t s = splits != NULL ? splits[i] : rows / n;
        if (s < 0 || s > rows - sum) {
            return tp__error_set(err_p, TP_EINVAL,
                                 "%s: all_to_all: %s split %d is %" PRId64
                                 " rows (%" PRId64 " rows, %" PRId64
                                 " already used)",
                                 g->g_what, arg, i, s, rows, sum);
        }
        counts[i] = (size_t)(s * row_el);
        displs[i] = (size_t)(sum * row_el);
        sum += s;
    }
    if (sum != rows) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: all_to_all: %s splits add up to %" PRId64
                             " rows, the tensor has %" PRId64,
                             g->g_what, arg, sum, rows);
    }
    return TP_OK;
}

tp_status
tp_pg_all_to_all(tp_pg *pg, tp_tensor *out, tp_tensor *in,
                 const int64_t *out_splits, const int64_t *in_splits,
                 tp_work **w_p, tp_error **err_p)
{
    tp_work *wk = NULL;
    tp_work local;
    tp_status st = tp__pg_coll_begin(pg, TP__COLL_ALL_TO_ALL,
                                     w_p == NULL ? &local : NULL, &wk, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp__pg_check_tensor(pg, "all_to_all", "out", out, err_p);
    if (st == TP_OK) {
        st = tp__pg_check_tensor(pg, "all_to_all", "in", in, err_p);
    }
    if (st == TP_OK) {
        if ((tp_tensor_dtype(out) != tp_tensor_dtype(in) ||
             tp__pg_is_cuda(out) != tp__pg_is_cuda(in))) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "%s: all_to_all: out and in differ in dtype or "
                               "device",
                               pg->g_what);
        }
    }
    int64_t in_rows = 0, in_row = 0, out_rows = 0, out_row = 0;
    if (st == TP_OK) {
        st = a2a_rows(pg, "in", in, &in_rows, &in_row, err_p);
    }
    if (st == TP_OK) {
        st = a2a_rows(pg, "out", out, &out_rows, &out_row, err_p);
    }
    if (st == TP_OK && in_rows > 0 && out_rows > 0 && in_row != out_row) {
        st = tp__error_set(err_p, TP_EINVAL,
                           "%s: all_to_all: rows of in have %" PRId64
                           " elements, rows of out %" PRId64,
                           pg->g_what, in_row, out_row);
    }
    size_t n = (size_t)pg->g_size;
    if (st == TP_OK) {
        wk->wk_splits = malloc(4 * n * sizeof(size_t));
        if (wk->wk_splits == NULL) {
            st = tp__error_set(err_p, TP_ENOMEM, "%s: all_to_all", pg->g_what);
        }
    }
    if (st == TP_OK) {
        size_t *sp = wk->wk_splits;
        st =
            a2a_splits(pg, "in", in_splits, in_rows, in_row, sp, sp + n, err_p);
        if (st == TP_OK) {
            st = a2a_splits(pg, "out", out_splits, out_rows, out_row,
                            sp + 2 * n, sp + 3 * n, err_p);
        }
        size_t me = (size_t)pg->g_rank;
        if (st == TP_OK && sp[me] != sp[2 * n + me]) {
            st = tp__error_set(err_p, TP_EINVAL,
                               "%s: all_to_all: this rank sends itself %zu "
                               "elements (in_splits) but expects %zu "
                               "(out_splits)",
                               pg->g_what, sp[me], sp[2 * n + me]);
        }
    }
    if (st == TP_OK) {
        st = tp__pg_stage2(wk, &out, &in, err_p);
    }
    if (st == TP_OK) {
        tp__pg_work_hold(wk, out, in);
        size_t *sp = wk->wk_splits;
        wk->wk_args.dtype = tp_tensor_dtype(in);
        wk->wk_args.in = tp_tensor_data(in);
        wk->wk_args.out = tp_tensor_data(out);
        wk->wk_args.count = tp__pg_numel(in);
        wk->wk_args.scounts = sp;
        wk->wk_args.sdispls = sp + n;
        wk->wk_args.rcounts = sp + 2 * n;
        wk->wk_args.rdispls = sp + 3 * n;
    }
    return tp__pg_coll_finish(pg, wk, w_p, st, err_p);
}

// ---- point to point
// --------------------------------------------------------------------

static tp_status
p2p_start(tp_pg *pg, bool send, tp_tensor *t, int peer, int tag, tp_work **w_p,
          tp_error **err_p)
{
    const char *op = send ? "send" : "recv";
    if (pg == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: NULL process group", op);
    }
    tp_status st = tp__pg_check_tensor(pg, op, "tensor", t, err_p);
    if (st != TP_OK) {
        return st;
    }
    if (!tp_tensor_is_contiguous(t)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: tensor is not contiguous (call "
                             "tp_tensor_contiguous first)",
                             pg->g_what, op);
    }
    if (tag < 0) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: tag %d (tags are >= 0)",
                             pg->g_what, op, tag);
    }
    if (peer >= pg->g_size || peer < (send ? 0 : TP_ANY_SOURCE)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: rank %d is not a rank of the group "
                             "(0..%d%s)",
                             pg->g_what, op, peer, pg->g_size - 1,
                             send ? "" : " or TP_ANY_SOURCE");
    }
    tp_work *wk = tp__pg_work_new(pg);
    if (wk == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: %s", pg->g_what, op);
    }
    tp__pg_work_hold(wk, t, NULL);
    wk->wk_p2p = true;
    wk->wk_send = send;
    wk->wk_peer = peer;
    if (wk->wk_cuda) {
        tp__pg_work_unref(wk);
        return tp__error_set(err_p, TP_ENOTSUP,
                             "%s: %s of a CUDA tensor: copy it to the CPU "
                             "(NCCL point-to-point is not wired in)",
                             pg->g_what, op);
    }
    tp__p2p *p = pg->g_world->w_p2p;
    size_t bytes = tp_tensor_nbytes(t);
    int wpeer = peer >= 0 ? pg->g_wranks[peer] : -1;
    atomic_fetch_add(&wk->wk_refs, 1); // the request's callback
    tp__req *r = NULL;
    st = send ? tp__p2p_isend(p, wpeer, pg->g_gid, TP__CHAN_P2P, (uint64_t)tag,
                              tp_tensor_data(t), bytes, tp__pg_p2p_work_cb, wk,
                              &r, err_p)
              : tp__p2p_irecv(p, wpeer, pg->g_gid, TP__CHAN_P2P, (uint64_t)tag,
                              tp_tensor_data(t), bytes, tp__pg_p2p_work_cb, wk,
                              &r, err_p);
    if (st != TP_OK) {
        atomic_fetch_sub(&wk->wk_refs, 1);
        tp__pg_work_unref(wk);
        return tp__error_wrap(err_p, st, "%s: %s %s rank %d (tag %d)",
                              pg->g_what, op, send ? "to" : "from", peer, tag);
    }
    wk->wk_req = r;
    tp_pg *w = pg->g_world;
    tp__mtx_lock(&w->w_mtx);
    atomic_store(&wk->wk_world, w);
    tp__list_append(&w->w_works, wk);
    tp__mtx_unlock(&w->w_mtx);
    if (w_p != NULL) {
        *w_p = wk;
        return TP_OK;
    }
    st = tp_work_wait(wk, 0, err_p);
    tp__pg_work_unref(wk);
    return st;
}

tp_status
tp_pg_send(tp_pg *pg, tp_tensor *t, int dst, int tag, tp_work **w_p,
           tp_error **err_p)
{
    return p2p_start(pg, true, t, dst, tag, w_p, err_p);
}

tp_status
tp_pg_recv(tp_pg *pg, tp_tensor *t, int src, int tag, tp_work **w_p,
           tp_error **err_p)
{
    return p2p_start(pg, false, t, src, tag, w_p, err_p);
}
