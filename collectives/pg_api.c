/* SPDX-License-Identifier: Apache-2.0 */
/* pg_api.c - what the public collective and point-to-point calls
 * (pg_api_ops.c) share: argument checks (returned before any
 * communication, in the blocking and the asynchronous form alike), the
 * work that holds the tensors, strided tensors staged through contiguous
 * copies, and the hand-off to the group's queue (pg_work.c). Takes only
 * w_mtx. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/pg_impl.h"
#include "collectives/reduce.h"
#include "core/error.h"

// ---- argument checks
// -------------------------------------------------------------------

// The oldest layout with a size field ends after name. Fields added later
// go after it; a caller built before them passes a smaller size and they
// keep the defaults of tp_pg_options_init.
#define PG_OPTS_MIN_SIZE (offsetof(tp_pg_options, name) + sizeof(const char *))

tp_status
tp__pg_options_load(const tp_pg_options *o, tp_pg_options *out,
                    tp_error **err_p)
{
    tp_pg_options_init(out);
    if (o == NULL) {
        return TP_OK;
    }
    if (o->size < PG_OPTS_MIN_SIZE || o->size > sizeof(*out)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "process group options: size %zu unknown to "
                             "this library (%zu..%zu): the caller was built "
                             "against another tpipe version, or did not call "
                             "tp_pg_options_init",
                             o->size, (size_t)PG_OPTS_MIN_SIZE, sizeof(*out));
    }
    memcpy(out, o, o->size);
    out->size = sizeof(*out);
    return TP_OK;
}

tp_status
tp__pg_check_tensor(tp_pg *g, const char *op, const char *arg,
                    const tp_tensor *t, tp_error **err_p)
{
    if (t == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: %s is NULL", g->g_what,
                             op, arg);
    }
    tp_device d = tp_tensor_device(t);
    // A strided CPU tensor is staged in a contiguous copy (tp__pg_stage()).
    if (!tp_tensor_is_contiguous(t) && d.type != TP_DEVICE_CPU) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: %s is not contiguous (call "
                             "tp_tensor_contiguous first)",
                             g->g_what, op, arg);
    }
    if (d.type != TP_DEVICE_CPU && d.type != TP_DEVICE_CUDA) {
        return tp__error_set(err_p, TP_EINVAL, "%s: %s: %s is on device %d",
                             g->g_what, op, arg, (int)d.type);
    }
    return TP_OK;
}

tp_status
tp__pg_check_root(tp_pg *g, const char *op, int root, tp_error **err_p)
{
    if (root < 0 || root >= g->g_size) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: root %d is not a rank of the group "
                             "(0..%d)",
                             g->g_what, op, root, g->g_size - 1);
    }
    return TP_OK;
}

// @big (the argument named @big_name) must hold group size x the elements
// of @small (named @small_name), in its dtype and on its kind of device.
tp_status
tp__pg_check_blocks(tp_pg *g, const char *op, const tp_tensor *big,
                    const char *big_name, const tp_tensor *small,
                    const char *small_name, tp_error **err_p)
{
    if (tp_tensor_dtype(big) != tp_tensor_dtype(small)) {
        return tp__error_set(
            err_p, TP_EINVAL, "%s: %s: %s has dtype %s, %s has dtype %s",
            g->g_what, op, big_name, tp_dtype_name(tp_tensor_dtype(big)),
            small_name, tp_dtype_name(tp_tensor_dtype(small)));
    }
    if (tp_tensor_device(big).type != tp_tensor_device(small).type) {
        return tp__error_set(err_p, TP_EINVAL,
                             "%s: %s: %s and %s are on different devices",
                             g->g_what, op, big_name, small_name);
    }
    int64_t want = tp_tensor_numel(small) * g->g_size;
    if (tp_tensor_numel(big) != want) {
        return tp__error_set(
            err_p, TP_EINVAL,
            "%s: %s: %s has %" PRId64 " elements, expected %" PRId64
            " (group size %d x the %" PRId64 " elements of %s)",
            g->g_what, op, big_name, tp_tensor_numel(big), want, g->g_size,
            tp_tensor_numel(small), small_name);
    }
    return TP_OK;
}

tp_status
tp__pg_check_op(tp_pg *g, const char *opname, tp_reduce_op op, tp_dtype dt,
                tp_error **err_p)
{
    tp_status st = tp__reduce_check(op, dt, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: %s", g->g_what, opname);
    }
    return TP_OK;
}

bool
tp__pg_is_cuda(const tp_tensor *t)
{
    return t != NULL && tp_tensor_device(t).type == TP_DEVICE_CUDA;
}

// Common start of every collective: a work holding the tensors. A
// blocking call passes @local: its work lives on the caller's stack unless
// it has to be queued (tp__pg_coll_submit then moves it to the heap).
tp_status
tp__pg_coll_begin(tp_pg *g, tp__coll_kind kind, tp_work *local, tp_work **wk_p,
                  tp_error **err_p)
{
    if (g == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "%s: NULL process group",
                             tp__coll_kind_name(kind));
    }
    tp_work *wk = local;
    if (local != NULL) {
        memset(local, 0, sizeof(*local));
        local->wk_pg = g;
        atomic_init(&local->wk_refs, 1);
        local->wk_local = true;
        local->wk_source = -1;
        local->wk_deadline_ns = tp__deadline_after_ms(g->g_timeout_ms);
    } else {
        wk = tp__pg_work_new(g);
        if (wk == NULL) {
            return tp__error_set(err_p, TP_ENOMEM, "%s: %s", g->g_what,
                                 tp__coll_kind_name(kind));
        }
    }
    wk->wk_args.kind = kind;
    *wk_p = wk;
    return TP_OK;
}

void
tp__pg_work_hold(tp_work *wk, tp_tensor *t1, tp_tensor *t2)
{
    wk->wk_t1 = t1 != NULL ? tp_tensor_ref(t1) : NULL;
    wk->wk_t2 = t2 != NULL ? tp_tensor_ref(t2) : NULL;
    if (wk->wk_result == NULL && !wk->wk_no_result && t1 != NULL) {
        wk->wk_result = tp_tensor_ref(t1);
    }
    wk->wk_cuda = tp__pg_is_cuda(t1) || tp__pg_is_cuda(t2);
    if (wk->wk_cuda) {
        wk->wk_args.device = tp_tensor_device(t1 != NULL ? t1 : t2).index;
    }
}

size_t
tp__pg_numel(const tp_tensor *t)
{
    return t != NULL ? (size_t)tp_tensor_numel(t) : 0;
}

// Strided tensors: *@t_p, if it is not contiguous, is replaced by a
// contiguous copy held by the work; for an output (@out) the result is
// copied back into the caller's tensor once the collective succeeded (the
// first output staged is the value of the work's future).
tp_status
tp__pg_stage(tp_work *wk, tp_tensor **t_p, bool out, tp_error **err_p)
{
    tp_tensor *t = *t_p;
    if (t == NULL || tp_tensor_is_contiguous(t)) {
        return TP_OK;
    }
    struct pg_back *nb =
        realloc(wk->wk_back, (size_t)(wk->wk_nback + 1) * sizeof(*nb));
    if (nb == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: contiguous copy",
                             wk->wk_pg->g_what);
    }
    wk->wk_back = nb;
    tp_tensor *c = NULL;
    tp_status st = tp__contiguous_raw(t, &c, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "%s: contiguous copy",
                              wk->wk_pg->g_what);
    }
    // An input's copy is only held (b_dst NULL: nothing is copied back).
    nb[wk->wk_nback].b_dst = out ? tp_tensor_ref(t) : NULL;
    nb[wk->wk_nback].b_src = c;
    wk->wk_nback++;
    if (out && wk->wk_result == NULL && !wk->wk_no_result) {
        wk->wk_result = tp_tensor_ref(t);
    }
    *t_p = c;
    return TP_OK;
}

// Stages @out (an output) and @in (an input) of @wk.
tp_status
tp__pg_stage2(tp_work *wk, tp_tensor **out_p, tp_tensor **in_p,
              tp_error **err_p)
{
    tp_status st = tp__pg_stage(wk, out_p, true, err_p);
    return st == TP_OK ? tp__pg_stage(wk, in_p, false, err_p) : st;
}

// An input that overlaps the output is copied first (in-place all_gather
// with the input as the output's block r, and the like).
static tp_status
untangle(tp_work *wk, tp_error **err_p)
{
    tp__coll_args *a = &wk->wk_args;
    if (a->in == NULL || a->out == NULL || wk->wk_cuda) {
        return TP_OK;
    }
    size_t es = tp_dtype_size(a->dtype);
    size_t in_bytes = tp__pg_numel(wk->wk_t2) * es,
           out_bytes = tp__pg_numel(wk->wk_t1) * es;
    const char *i0 = a->in, *o0 = a->out;
    if (in_bytes == 0 || out_bytes == 0 || i0 + in_bytes <= o0 ||
        o0 + out_bytes <= i0) {
        return TP_OK;
    }
    wk->wk_in_copy = malloc(in_bytes);
    if (wk->wk_in_copy == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "%s: copy of the input",
                             wk->wk_pg->g_what);
    }
    memcpy(wk->wk_in_copy, a->in, in_bytes);
    a->in = wk->wk_in_copy;
    return TP_OK;
}

tp_status
tp__pg_coll_finish(tp_pg *g, tp_work *wk, tp_work **w_p, tp_status st,
                   tp_error **err_p)
{
    if (st == TP_OK) {
        st = untangle(wk, err_p);
    }
    if (st != TP_OK) {
        tp__pg_work_unref(wk);
        return st;
    }
    return tp__pg_coll_submit(g, wk, w_p, err_p);
}
