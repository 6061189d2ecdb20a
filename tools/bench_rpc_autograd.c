// SPDX-License-Identifier: Apache-2.0
// bench_rpc_autograd.c - the distributed autograd test of `tpipe bench rpc`
// (dist_autograd.h), PyTorch's dist_autograd_fwd_bwd of
// ../shared/peers/torch_rpc_bench.py:
//   dist_autograd  x and w, 1024 float32 leaves requiring grad on worker0;
//                  one timed iteration is context_create, y =
//                  rpc_sync(worker1, "bench.mul", x, w) (y = x * w with
//                  tp_mul there), loss = tp_sum(y), backward from loss,
//                  get_gradients (x and w must both have one) and
//                  context_release.
// "bench.mul" is registered in this process before the workers are forked,
// so every worker has it before its tp_rpc_init. The gradients' values
// (dloss/dx = w, dloss/dw = x) are checked once, untimed. After the
// measurement worker0 waits (bounded) until none of its contexts, send or
// recv functions are left, so that the next test does not pay for this
// one's background work.

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tpipe/autograd.h>
#include <tpipe/dist_autograd.h>

#include "bench_rpc.h"
#include "core/error.h"
#include "core/platform.h"
#include "tool.h"

#define BR_AG_NUMEL 1024

// worker1's function: y = x * w, recorded (x and w arrive as the outputs of
// recv functions, so y requires grad and its reply records a send
// function).
static tp_status
br_bench_mul(const tp_rpc_call_info *call, const tp_args *in, void *arg,
             tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    if (in == NULL || tp_args_ntensors(in) != 2) {
        return tp__error_set(err_p, TP_EINVAL,
                             "bench.mul: want 2 tensors (x, w), got %zu",
                             in != NULL ? tp_args_ntensors(in) : (size_t)0);
    }
    tp_tensor *y = NULL;
    tp_args *out = NULL;
    tp_status st =
        tp_mul(tp_args_tensor(in, 0), tp_args_tensor(in, 1), &y, err_p);
    if (st != TP_OK) {
        return st;
    }
    if ((st = tp_args_create(NULL, 0, &out)) != TP_OK ||
        (st = tp_args_add_tensor(out, y)) != TP_OK) {
        tp_args_unref(out);
        tp_tensor_unref(y);
        return tp__error_set(err_p, st, "bench.mul: building the result");
    }
    tp_tensor_unref(y);
    *out_p = out;
    return TP_OK;
}

bool
br_autograd_register(char *err, size_t len)
{
    tp_error *e = NULL;
    tp_status st = tp_rpc_register("bench.mul", br_bench_mul, NULL, &e);
    if (st != TP_OK) {
        br_error(err, len, st, e, "tp_rpc_register(\"bench.mul\")");
        return false;
    }
    return true;
}

// The leaves of the test, on worker0.
typedef struct br_ag {
    tp_tensor *ba_x, *ba_w;
    tp_args *ba_in; // (x, w)
} br_ag;

// Checks that @g holds a gradient of @leaf equal to @want (elementwise).
static tp_status
br_ag_check_grad(const tp_grad_map *g, const tp_tensor *leaf,
                 const tp_tensor *want, const char *name, tp_error **err_p)
{
    tp_tensor *gr = tp_grad_map_get(g, leaf);
    if (gr == NULL) {
        return tp__error_set(err_p, TP_EPROTO, "no gradient of %s", name);
    }
    if (want == NULL) {
        return TP_OK;
    }
    if (tp_tensor_numel(gr) != BR_AG_NUMEL) {
        return tp__error_set(err_p, TP_EPROTO,
                             "the gradient of %s has %lld elements, want %d",
                             name, (long long)tp_tensor_numel(gr), BR_AG_NUMEL);
    }
    for (int64_t i = 0; i < BR_AG_NUMEL; i++) {
        double v = 0, w = 0;
        if (tp_tensor_item(gr, i, &v) != TP_OK ||
            tp_tensor_item(want, i, &w) != TP_OK) {
            return tp__error_set(err_p, TP_EINTERNAL,
                                 "reading the gradient of %s", name);
        }
        if (fabs(v - w) > 1e-6 * (1 + fabs(w))) {
            return tp__error_set(err_p, TP_EPROTO,
                                 "the gradient of %s is %g at %lld, want %g",
                                 name, v, (long long)i, w);
        }
    }
    return TP_OK;
}

// One iteration; with @check, also the gradients' values.
static tp_status
br_ag_iter(tp_agent *a, const br_ag *b, bool check, tp_error **err_p)
{
    int64_t ctx = -1;
    tp_args *out = NULL;
    tp_tensor *loss = NULL;
    tp_grad_map *g = NULL;
    tp_status st = tp_dist_autograd_context_create(a, &ctx, err_p);
    if (st != TP_OK) {
        return st;
    }
    st = tp_rpc_sync_rank(a, 1, "bench.mul", b->ba_in, TP_TIMEOUT_DEFAULT, &out,
                          err_p);
    if (st != TP_OK) {
        goto release;
    }
    if (tp_args_ntensors(out) != 1) {
        st = tp__error_set(err_p, TP_EPROTO,
                           "bench.mul returned %zu tensors, want 1",
                           tp_args_ntensors(out));
        goto release;
    }
    if ((st = tp_sum(tp_args_tensor(out, 0), &loss, err_p)) != TP_OK ||
        (st = tp_dist_autograd_backward(a, ctx, 1, &loss, false, err_p)) !=
            TP_OK ||
        (st = tp_dist_autograd_get_gradients(a, ctx, &g, err_p)) != TP_OK) {
        goto release;
    }
    // d(sum(x * w))/dx = w and /dw = x.
    if ((st = br_ag_check_grad(g, b->ba_x, check ? b->ba_w : NULL, "x",
                               err_p)) != TP_OK ||
        (st = br_ag_check_grad(g, b->ba_w, check ? b->ba_x : NULL, "w",
                               err_p)) != TP_OK) {
        goto release;
    }
release:
    tp_grad_map_destroy(g);
    tp_tensor_unref(loss);
    tp_args_unref(out);
    if (st == TP_OK) {
        return tp_dist_autograd_context_release(a, ctx, err_p);
    }
    // The context ends whatever failed: the next iteration could not make
    // one while it is current.
    tp_dist_autograd_context_release(a, ctx, NULL);
    return st;
}

static tp_status
br_ag_once(tp_agent *a, void *arg, void **keep_p, tp_error **err_p)
{
    *keep_p = NULL;
    return br_ag_iter(a, arg, false, err_p);
}

// Waits until worker0 holds no distributed autograd state.
static bool
br_ag_settle(br_run *r, tp_agent *a)
{
    uint64_t dl = tp__now_ns() + (uint64_t)(r->rr_opts->bo_stall_s * 1e9);
    for (;;) {
        tp_dist_autograd_stats s;
        if (tp_dist_autograd_get_stats(a, &s) != TP_OK) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "dist_autograd: no dist autograd counters");
            return false;
        }
        if (s.contexts == 0 && s.send_fns == 0 && s.recv_fns == 0 &&
            s.backwards == 0) {
            return true;
        }
        if (tp__now_ns() > dl) {
            snprintf(r->rr_err, sizeof(r->rr_err),
                     "dist_autograd: state left after %g s (contexts %llu, "
                     "send functions %llu, recv functions %llu, backward "
                     "parts %llu)",
                     r->rr_opts->bo_stall_s, (unsigned long long)s.contexts,
                     (unsigned long long)s.send_fns,
                     (unsigned long long)s.recv_fns,
                     (unsigned long long)s.backwards);
            return false;
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

// x and w: uniform in [0, 1) (torch.rand), leaves requiring grad.
static tp_status
br_ag_init(br_ag *b, unsigned rep, tp_error **err_p)
{
    int64_t shape[1] = {BR_AG_NUMEL};
    tp_generator *gen = NULL;
    tp_status st = tp_generator_create(0x7470697065ull + rep, &gen);
    if (st != TP_OK) {
        return tp__error_set(err_p, st, "a random generator");
    }
    if ((st = tp_tensor_rand(TP_F32, 1, shape, 0, 1, gen, &b->ba_x, err_p)) !=
            TP_OK ||
        (st = tp_tensor_rand(TP_F32, 1, shape, 0, 1, gen, &b->ba_w, err_p)) !=
            TP_OK ||
        (st = tp_tensor_set_requires_grad(b->ba_x, true, err_p)) != TP_OK ||
        (st = tp_tensor_set_requires_grad(b->ba_w, true, err_p)) != TP_OK) {
        goto out;
    }
    if ((st = tp_args_create(NULL, 0, &b->ba_in)) != TP_OK ||
        (st = tp_args_add_tensor(b->ba_in, b->ba_x)) != TP_OK ||
        (st = tp_args_add_tensor(b->ba_in, b->ba_w)) != TP_OK) {
        st = tp__error_set(err_p, st, "building the args");
    }
out:
    tp_generator_destroy(gen);
    return st;
}

bool
br_measure_autograd(br_run *r, tp_agent *a, unsigned rep)
{
    br_ag b = {0};
    tp_error *err = NULL;
    br_watch(r->rr_opts, r->rr_tr->bt_name, "dist_autograd");
    tp_status st = br_ag_init(&b, rep, &err);
    if (st != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "dist_autograd: x and w");
    } else if ((st = br_ag_iter(a, &b, true, &err)) != TP_OK) {
        br_error(r->rr_err, sizeof(r->rr_err), st, err,
                 "dist_autograd: the first iteration (gradients checked)");
    }
    bool ok = st == TP_OK;
    if (ok) {
        br_op op = {
            .bo_test = "dist_autograd",
            .bo_what = "context, rpc_sync(worker1, \"bench.mul\", x, w), "
                       "sum, backward, get_gradients, release",
            .bo_run = br_ag_once,
            .bo_arg = &b,
        };
        ok = br_measure_lat(r, a, rep, BR_C_AUTOGRAD, &op);
    }
    tp_args_unref(b.ba_in);
    tp_tensor_unref(b.ba_x);
    tp_tensor_unref(b.ba_w);
    return ok && br_ag_settle(r, a);
}
