// SPDX-License-Identifier: Apache-2.0
// optim.c - the local optimizer (tp_optim): a fixed list of parameters,
// their state (allocated at a parameter's first step with a gradient),
// and a step over a gradient source: the parameters' .grad or a
// tp_grad_map (a distributed autograd context's gradients).
//
// A step first gathers and checks every gradient and allocates the state
// it needs, and only then updates: a step that fails leaves every
// parameter and its state as they were.

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <tpipe/autograd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "op_impl.h"

struct tp_optim {
    tp_optim_options o_opts; // checked (tp__op_options_load)
    size_t o_n;
    tp_tensor **o_params; // references
    op_state *o_state;    // o_n; s_step 0 until the first step with a grad
};

// "[2, 3] f32", for messages.
static void
describe(const tp_tensor *t, char *buf, size_t len)
{
    size_t off = 0;
    int nd = tp_tensor_ndim(t);
    const int64_t *shape = tp_tensor_shape(t);
    off += (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < nd && off < len; d++) {
        off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64,
                                d ? ", " : "", shape[d]);
    }
    if (off < len) {
        snprintf(buf + off, len - off, "] %s",
                 tp_dtype_name(tp_tensor_dtype(t)));
    }
}

static tp_status
check_param(const char *kind, size_t i, tp_tensor *p, tp_error **err_p)
{
    char d[160];
    if (p == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: parameter %zu is NULL", kind, i);
    }
    describe(p, d, sizeof(d));
    tp_dtype dt = tp_tensor_dtype(p);
    if (dt != TP_F32 && dt != TP_F64) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "optim %s: parameter %zu %s: only f32 and f64 "
                             "parameters are supported",
                             kind, i, d);
    }
    if (tp_tensor_device(p).type != TP_DEVICE_CPU) {
        return tp__error_set(err_p, TP_ENOTSUP,
                             "optim %s: parameter %zu %s is on a CUDA device: "
                             "only CPU parameters are supported",
                             kind, i, d);
    }
    if (!tp_tensor_is_leaf(p) || !tp_tensor_requires_grad(p)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: parameter %zu %s is not a leaf that "
                             "requires grad",
                             kind, i, d);
    }
    if (!tp_tensor_is_contiguous(p)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: parameter %zu %s is not contiguous: "
                             "the step updates its data in place",
                             kind, i, d);
    }
    return TP_OK;
}

tp_status
tp_optim_create(const tp_optim_options *o, size_t n_params,
                tp_tensor *const *params, tp_optim **opt_p, tp_error **err_p)
{
    tp_optim_options opts;
    tp_status st = tp__op_options_load(o, &opts, err_p);
    if (st != TP_OK) {
        return st;
    }
    const char *kind = tp_optim_kind_name(opts.kind);
    if (n_params == 0 || params == NULL) {
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s: got an empty parameter list", kind);
    }
    for (size_t i = 0; i < n_params; i++) {
        st = check_param(kind, i, params[i], err_p);
        if (st != TP_OK) {
            return st;
        }
        for (size_t k = 0; k < i; k++) {
            if (params[k] == params[i]) {
                return tp__error_set(err_p, TP_EINVAL,
                                     "optim %s: parameter %zu is parameter "
                                     "%zu again: each may appear once",
                                     kind, i, k);
            }
        }
    }
    tp_optim *opt = tp__zalloc(sizeof(*opt));
    if (opt != NULL) {
        opt->o_params = tp__zalloc(n_params * sizeof(*opt->o_params));
        opt->o_state = tp__zalloc(n_params * sizeof(*opt->o_state));
    }
    if (opt == NULL || opt->o_params == NULL || opt->o_state == NULL) {
        if (opt != NULL) {
            tp__free(opt->o_params);
            tp__free(opt->o_state);
        }
        tp__free(opt);
        return tp__error_set(err_p, TP_ENOMEM,
                             "optim %s: out of memory for %zu parameters", kind,
                             n_params);
    }
    opt->o_opts = opts;
    opt->o_n = n_params;
    for (size_t i = 0; i < n_params; i++) {
        opt->o_params[i] = tp_tensor_ref(params[i]);
    }
    *opt_p = opt;
    return TP_OK;
}

// The gradient of parameter @i (a new reference to a contiguous tensor of
// its dtype and shape in *@g_p), or NULL in *@g_p if it has none.
static tp_status
step_grad(tp_optim *opt, size_t i, const tp_grad_map *grads, tp_tensor **g_p,
          tp_error **err_p)
{
    tp_tensor *p = opt->o_params[i];
    tp_tensor *g =
        grads != NULL ? tp_grad_map_get(grads, p) : tp_tensor_grad(p);
    *g_p = NULL;
    if (g == NULL) {
        return TP_OK;
    }
    const char *kind = tp_optim_kind_name(opt->o_opts.kind);
    int nd = tp_tensor_ndim(p);
    bool same = tp_tensor_dtype(g) == tp_tensor_dtype(p) &&
                tp_tensor_ndim(g) == nd &&
                tp_tensor_device(g).type == TP_DEVICE_CPU &&
                memcmp(tp_tensor_shape(g), tp_tensor_shape(p),
                       (size_t)nd * sizeof(int64_t)) == 0;
    if (!same) {
        char dp[160], dg[160];
        describe(p, dp, sizeof(dp));
        describe(g, dg, sizeof(dg));
        return tp__error_set(err_p, TP_EINVAL,
                             "optim %s step: parameter %zu %s has a gradient "
                             "%s%s of another shape or dtype (from %s)",
                             kind, i, dp, dg,
                             tp_tensor_device(g).type == TP_DEVICE_CPU
                                 ? ""
                                 : " on a CUDA device",
                             grads != NULL ? "the gradient map" : ".grad");
    }
    tp_status st = tp_tensor_contiguous(g, g_p, err_p);
    if (st != TP_OK) {
        return tp__error_wrap(err_p, st, "optim %s step: parameter %zu", kind,
                              i);
    }
    return TP_OK;
}

// Allocates the buffers of @s for a parameter like @p (first step).
static tp_status
state_alloc(const tp_optim *opt, size_t i, op_state *s, tp_error **err_p)
{
    tp_tensor *p = opt->o_params[i];
    bool used[OP_MAX_BUFS];
    double init[OP_MAX_BUFS];
    tp__op_rule_bufs(&opt->o_opts, used, init);
    int64_t n = tp_tensor_numel(p);
    size_t es = tp_dtype_size(tp_tensor_dtype(p));
    for (int b = 0; b < OP_MAX_BUFS; b++) {
        if (!used[b]) {
            continue;
        }
        // One element even for an empty parameter, so NULL means unused.
        s->s_buf[b] = tp__alloc((n > 0 ? (size_t)n : 1) * es);
        if (s->s_buf[b] == NULL) {
            for (int k = 0; k < b; k++) {
                tp__free(s->s_buf[k]);
                s->s_buf[k] = NULL;
            }
            return tp__error_set(err_p, TP_ENOMEM,
                                 "optim %s step: out of memory for the state "
                                 "of parameter %zu (%" PRId64 " elements)",
                                 tp_optim_kind_name(opt->o_opts.kind), i, n);
        }
        for (int64_t k = 0; k < n; k++) {
            if (tp_tensor_dtype(p) == TP_F32) {
                ((float *)s->s_buf[b])[k] = (float)init[b];
            } else {
                ((double *)s->s_buf[b])[k] = init[b];
            }
        }
    }
    return TP_OK;
}

tp_status
tp_optim_step(tp_optim *opt, const tp_grad_map *grads, tp_error **err_p)
{
    if (opt == NULL) {
        return tp__error_set(err_p, TP_EINVAL, "optim step: no optimizer");
    }
    tp_tensor **g = tp__zalloc(opt->o_n * sizeof(*g));
    if (g == NULL) {
        return tp__error_set(err_p, TP_ENOMEM, "optim %s step: out of memory",
                             tp_optim_kind_name(opt->o_opts.kind));
    }
    // Gradients and new state first: nothing changes unless all are here.
    tp_status st = TP_OK;
    size_t fresh = 0; // parameters whose state this step allocated: [0, i)
    for (size_t i = 0; i < opt->o_n && st == TP_OK; i++) {
        st = step_grad(opt, i, grads, &g[i], err_p);
        // A state whose step count is 0 has no buffers yet: a failed
        // step frees those it allocated.
        if (st == TP_OK && g[i] != NULL && opt->o_state[i].s_step == 0) {
            st = state_alloc(opt, i, &opt->o_state[i], err_p);
            fresh = i + 1;
        }
    }
    if (st != TP_OK) {
        // Undo the allocations of this step: those states are still fresh.
        for (size_t i = 0; i < fresh; i++) {
            op_state *s = &opt->o_state[i];
            if (s->s_step == 0) {
                for (int b = 0; b < OP_MAX_BUFS; b++) {
                    tp__free(s->s_buf[b]);
                    s->s_buf[b] = NULL;
                }
            }
        }
    }
    for (size_t i = 0; i < opt->o_n; i++) {
        if (st == TP_OK && g[i] != NULL) {
            tp_tensor *p = opt->o_params[i];
            tp__op_rule_apply(&opt->o_opts, tp_tensor_dtype(p),
                              tp_tensor_numel(p), tp_tensor_data(p),
                              tp_tensor_data(g[i]), &opt->o_state[i]);
        }
        tp_tensor_unref(g[i]);
    }
    tp__free(g);
    return st;
}

void
tp_optim_zero_grad(tp_optim *opt)
{
    if (opt == NULL) {
        return;
    }
    for (size_t i = 0; i < opt->o_n; i++) {
        tp_tensor_zero_grad(opt->o_params[i]);
    }
}

void
tp_optim_destroy(tp_optim *opt)
{
    if (opt == NULL) {
        return;
    }
    for (size_t i = 0; i < opt->o_n; i++) {
        for (int b = 0; b < OP_MAX_BUFS; b++) {
            tp__free(opt->o_state[i].s_buf[b]);
        }
        tp_tensor_unref(opt->o_params[i]);
    }
    tp__free(opt->o_state);
    tp__free(opt->o_params);
    tp__free(opt);
}
