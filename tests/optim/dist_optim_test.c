// SPDX-License-Identifier: Apache-2.0
// dist_optim_test.c - the DistributedOptimizer (optim.h) across forked
// worker processes on loopback: two owners of parameters that never call
// tp_dist_optim_create themselves, and two trainers, each with its own
// DistributedOptimizer and its own distributed autograd contexts, doing
// an RPC forward through both owners, backward, and steps at the same
// time; the parameters afterwards equal a local computation. And the
// errors: options, values that are not one tensor that requires grad, an
// unknown context, each naming the owner.
//
// Workers: alpha (0) and bravo (1) own the parameters w and b (N f64
// each) and big (NBIG f64), leaves requiring grad; "o.fwd" computes
// x * w + b + mean(big) with them. big makes a step long enough (a
// millisecond and more) that the two trainers' steps of one owner would
// overlap if they were not serialised (ThreadSanitizer then reports the
// race: the test carries the tsan label). charlie (2) and delta (3)
// train. Every wait has a deadline.

#include "tp_test.h"

#include <pthread.h>
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include <tpipe/dist_autograd.h>
#include <tpipe/optim.h>
#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#include "tp_test_job.h"

#define WAIT_MS 20000
#define N       4
#define NBIG    (1 << 18)
#define NPARAM  3 // per owner: w, b, big
#define ITERS   3
#define NBAR    (2 * ITERS)

static const char *const k_names[4] = {"alpha", "bravo", "charlie", "delta"};
static int g_rank;

// An owner's parameters, and the RRefs that own them (made at the first
// "o.params" under g_mtx).
static tp_tensor *g_w, *g_b, *g_big;
static pthread_mutex_t g_mtx = PTHREAD_MUTEX_INITIALIZER;
static tp_rref *g_rw, *g_rb, *g_rbig;
// On alpha: how many trainers reached each barrier.
static atomic_int g_bar[NBAR];

// ---- values -----------------------------------------------------------------

static double
w0(int owner, int i)
{
    return 0.5 + 0.25 * i + 0.1 * owner;
}

static double
b0(int owner, int i)
{
    return -0.3 + 0.2 * i - 0.05 * owner;
}

static double
big0(int owner, int i)
{
    return ((i % 7) - 3) * 0.01 + 0.001 * owner;
}

// The trainers' input at iteration @it (the same for both).
static double
x_at(int it, int i)
{
    return 1 + 0.5 * i - 0.3 * it;
}

static tp_tensor *
vec_n(int64_t n, double (*f)(int, int), int k, bool grad)
{
    int64_t shape[1] = {n};
    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_F64, 1, shape, &t, NULL), NULL);
    double *v = tp_tensor_data(t);
    for (int i = 0; i < n; i++) {
        v[i] = f(k, i);
    }
    if (grad) {
        TP_CHECK_OK(tp_tensor_set_requires_grad(t, true, NULL), NULL);
    }
    return t;
}

static double
item(const tp_tensor *t, int i)
{
    double v = 0;
    TP_CHECK_OK(tp_tensor_item(t, i, &v), NULL);
    return v;
}

static tp_args *
args_i64(int64_t v)
{
    tp_args *x = NULL;
    TP_CHECK_OK(tp_args_create(&v, sizeof(v), &x), NULL);
    return x;
}

static int64_t
get_i64(const tp_args *x)
{
    size_t n = 0;
    const void *p = tp_args_bytes(x, &n);
    int64_t v = 0;
    TP_CHECKF(p != NULL && n == sizeof(v), "rank %d: not an int64", g_rank);
    memcpy(&v, p, sizeof(v));
    return v;
}

// An RRef owned here whose value is args holding @t (and @t2 if not NULL).
static tp_rref *
own(tp_agent *a, tp_tensor *t, tp_tensor *t2)
{
    tp_args *v = NULL;
    tp_rref *r = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &v), NULL);
    TP_CHECK_OK(tp_args_add_tensor(v, t), NULL);
    if (t2 != NULL) {
        TP_CHECK_OK(tp_args_add_tensor(v, t2), NULL);
    }
    TP_CHECK_OK(tp_rref_create(a, v, &r, NULL), NULL);
    tp_args_unref(v);
    return r;
}

// ---- functions --------------------------------------------------------------

static tp_tensor *
vec_of(double (*f)(int, int), int k, bool grad)
{
    return vec_n(N, f, k, grad);
}

// "o.params": RRefs to w, b and big.
static tp_status
fn_params(const tp_rpc_call_info *call, const tp_args *in, void *arg,
          tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)arg;
    (void)err_p;
    pthread_mutex_lock(&g_mtx);
    if (g_rw == NULL) {
        g_rw = own(call->agent, g_w, NULL);
        g_rb = own(call->agent, g_b, NULL);
        g_rbig = own(call->agent, g_big, NULL);
    }
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, g_rw), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, g_rb), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, g_rbig), NULL);
    pthread_mutex_unlock(&g_mtx);
    *out_p = out;
    return TP_OK;
}

// "o.bad": an RRef whose value is two tensors (in 0) or one tensor that
// does not require grad (in 1).
static tp_status
fn_bad(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    (void)err_p;
    tp_tensor *t = vec_of(w0, g_rank, false);
    tp_rref *r = get_i64(in) == 0 ? own(call->agent, g_w, g_b)
                                  : own(call->agent, t, NULL);
    tp_tensor_unref(t);
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_rref(out, r), NULL);
    tp_rref_unref(r);
    *out_p = out;
    return TP_OK;
}

// One layer: x * w + b + mean(big).
static tp_tensor *
layer(tp_tensor *x, tp_tensor *w, tp_tensor *b, tp_tensor *big)
{
    tp_tensor *xw = NULL, *xwb = NULL, *m = NULL, *y = NULL;
    TP_CHECK_OK(tp_mul(x, w, &xw, NULL), NULL);
    TP_CHECK_OK(tp_add(xw, b, &xwb, NULL), NULL);
    TP_CHECK_OK(tp_mean(big, &m, NULL), NULL);
    TP_CHECK_OK(tp_add(xwb, m, &y, NULL), NULL);
    tp_tensor_unref(xw);
    tp_tensor_unref(xwb);
    tp_tensor_unref(m);
    return y;
}

// "o.fwd": layer(x (tensor 0)) with this owner's parameters.
static tp_status
fn_fwd(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)err_p;
    tp_tensor *y = layer(tp_args_tensor(in, 0), g_w, g_b, g_big);
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_tensor(out, y), NULL);
    tp_tensor_unref(y);
    *out_p = out;
    return TP_OK;
}

// "b.arrive" (in: barrier) and "b.count" (in: barrier; out: arrivals),
// on alpha.
static tp_status
fn_arrive(const tp_rpc_call_info *call, const tp_args *in, void *arg,
          tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)out_p;
    (void)err_p;
    int64_t k = get_i64(in);
    TP_CHECK(k >= 0 && k < NBAR);
    atomic_fetch_add(&g_bar[k], 1);
    return TP_OK;
}

static tp_status
fn_count(const tp_rpc_call_info *call, const tp_args *in, void *arg,
         tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    (void)err_p;
    int64_t k = get_i64(in);
    TP_CHECK(k >= 0 && k < NBAR);
    *out_p = args_i64(atomic_load(&g_bar[k]));
    return TP_OK;
}

static void
setup(int rank)
{
    g_rank = rank;
    if (rank < 2) {
        g_w = vec_of(w0, rank, true);
        g_b = vec_of(b0, rank, true);
        g_big = vec_n(NBIG, big0, rank, true);
    }
    static const struct {
        const char *name;
        tp_rpc_fn fn;
    } fns[] = {
        {"o.params", fn_params}, {"o.bad", fn_bad},     {"o.fwd", fn_fwd},
        {"b.arrive", fn_arrive}, {"b.count", fn_count},
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        TP_CHECK_OK(tp_rpc_register(fns[i].name, fns[i].fn, NULL, NULL), NULL);
    }
}

static tp_agent *
join(int rank, int world, const char *url)
{
    return tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
}

// Owners drop their RRefs and every worker shuts down gracefully (an
// owner keeps serving until every worker has arrived).
static void
leave(tp_agent *a)
{
    pthread_mutex_lock(&g_mtx);
    tp_rref_unref(g_rw);
    tp_rref_unref(g_rb);
    tp_rref_unref(g_rbig);
    g_rw = g_rb = g_rbig = NULL;
    pthread_mutex_unlock(&g_mtx);
    tp_error *err = NULL;
    tp_status st = tp_rpc_shutdown(a, true, &err);
    TP_CHECKF(st == TP_OK, "rank %d: graceful shutdown: %s", g_rank,
              tp_error_message(err));
    tp_tensor_unref(g_w);
    tp_tensor_unref(g_b);
    tp_tensor_unref(g_big);
}

static void
run(int world, tp_job_fn fn)
{
    tp_job j;
    tp_job_tcp(&j, world, fn, NULL);
    j.setup = setup;
    j.names = k_names;
    tp_job_run(&j);
}

// ---- what the trainers do ---------------------------------------------------

// The RRefs of owner @owner's w, b and big into @ps[0..2].
static void
params_of(tp_agent *a, int owner, tp_rref **ps)
{
    tp_args *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(
        tp_rpc_sync_rank(a, owner, "o.params", NULL, WAIT_MS, &out, &err), err);
    TP_CHECK_EQ(tp_args_nrrefs(out), NPARAM);
    for (int k = 0; k < NPARAM; k++) {
        ps[k] = tp_rref_ref(tp_args_rref(out, k));
    }
    tp_args_unref(out);
}

static tp_tensor *
fwd(tp_agent *a, int owner, tp_tensor *x)
{
    tp_args *in = NULL, *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &in), NULL);
    TP_CHECK_OK(tp_args_add_tensor(in, x), NULL);
    TP_CHECK_OK(tp_rpc_sync_rank(a, owner, "o.fwd", in, WAIT_MS, &out, &err),
                err);
    tp_tensor *y = tp_tensor_ref(tp_args_tensor(out, 0));
    tp_args_unref(in);
    tp_args_unref(out);
    return y;
}

// The loss of the model, sum(y1^2), from its output y1 = layer_bravo(
// layer_alpha(x)).
static tp_tensor *
loss_of(tp_tensor *y1)
{
    tp_tensor *sq = NULL, *l = NULL;
    TP_CHECK_OK(tp_mul(y1, y1, &sq, NULL), NULL);
    TP_CHECK_OK(tp_sum(sq, &l, NULL), NULL);
    tp_tensor_unref(sq);
    return l;
}

// Waits until both trainers reached barrier @k.
static void
barrier(tp_agent *a, int64_t k)
{
    tp_error *err = NULL;
    tp_args *in = args_i64(k);
    TP_CHECK_OK(tp_rpc_sync_rank(a, 0, "b.arrive", in, WAIT_MS, NULL, &err),
                err);
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    for (;;) {
        tp_args *out = NULL;
        TP_CHECK_OK(tp_rpc_sync_rank(a, 0, "b.count", in, WAIT_MS, &out, &err),
                    err);
        int64_t n = get_i64(out);
        tp_args_unref(out);
        if (n >= 2) {
            break;
        }
        TP_CHECKF(tp_job_now_ms() < end, "rank %d: barrier %lld: %lld of 2",
                  g_rank, (long long)k, (long long)n);
        tp_job_sleep_ms(2);
    }
    tp_args_unref(in);
}

static void
adam_options(tp_optim_options *o)
{
    tp_optim_options_init(o, TP_OPTIM_ADAM);
    o->lr = 0.05;
    o->amsgrad = true;
}

// The starts of the parameters, in the order of train's RRefs.
static tp_tensor *
param_start(int k, bool grad)
{
    int owner = k / NPARAM;
    switch (k % NPARAM) {
    case 0:
        return vec_of(w0, owner, grad);
    case 1:
        return vec_of(b0, owner, grad);
    default:
        return vec_n(NBIG, big0, owner, grad);
    }
}

// The same training in this process: each iteration's gradient, from the
// parameters both trainers saw, applied by two optimizers (one per
// trainer, as on the owners) in turn. Adam without weight decay moves a
// parameter by an amount that does not depend on it, and both optimizers
// have seen the same gradients, so the order of the two steps does not
// matter. The parameters at the end in @p (new references).
static void
local_training(tp_tensor *p[2 * NPARAM])
{
    tp_error *err = NULL;
    for (int k = 0; k < 2 * NPARAM; k++) {
        p[k] = param_start(k, true);
    }
    tp_optim_options o;
    adam_options(&o);
    tp_optim *opt[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        TP_CHECK_OK(tp_optim_create(&o, 2 * NPARAM, p, &opt[k], &err), err);
    }
    for (int it = 0; it < ITERS; it++) {
        tp_tensor *x = vec_of(x_at, it, false);
        tp_tensor *y0 = layer(x, p[0], p[1], p[2]);
        tp_tensor *y1 = layer(y0, p[3], p[4], p[5]);
        tp_tensor *l = loss_of(y1);
        tp_optim_zero_grad(opt[0]);
        TP_CHECK_OK(tp_backward(1, &l, NULL, false, &err), err);
        TP_CHECK_OK(tp_optim_step(opt[0], NULL, &err), err);
        TP_CHECK_OK(tp_optim_step(opt[1], NULL, &err), err);
        tp_tensor_unref(l);
        tp_tensor_unref(y1);
        tp_tensor_unref(y0);
        tp_tensor_unref(x);
    }
    tp_optim_destroy(opt[0]);
    tp_optim_destroy(opt[1]);
}

static void
train(tp_agent *a)
{
    tp_error *err = NULL;
    tp_rref *ps[2 * NPARAM];
    params_of(a, 0, ps);
    params_of(a, 1, ps + NPARAM);
    tp_optim_options o;
    adam_options(&o);
    tp_dist_optim *d = NULL;
    TP_CHECK_OK(tp_dist_optim_create(a, &o, 2 * NPARAM, ps, WAIT_MS, &d, &err),
                err);
    for (int it = 0; it < ITERS; it++) {
        int64_t ctx = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &ctx, &err), err);
        tp_tensor *x = vec_of(x_at, it, false);
        tp_tensor *y0 = fwd(a, 0, x);
        tp_tensor *y1 = fwd(a, 1, y0);
        tp_tensor *l = loss_of(y1);
        TP_CHECK_OK(tp_dist_autograd_backward(a, ctx, 1, &l, false, &err), err);
        // Nobody steps before both trainers have their gradients, and
        // nobody runs forward again before both have stepped: the
        // parameters are read and written at different times.
        barrier(a, 2 * it);
        // Both trainers step both owners now: each owner applies the two
        // steps one after the other.
        TP_CHECK_OK(tp_dist_optim_step(d, ctx, WAIT_MS, &err), err);
        TP_CHECK_OK(tp_dist_autograd_context_release(a, ctx, &err), err);
        barrier(a, 2 * it + 1);
        tp_tensor_unref(l);
        tp_tensor_unref(y1);
        tp_tensor_unref(y0);
        tp_tensor_unref(x);
    }
    tp_tensor *want[2 * NPARAM];
    local_training(want);
    for (int k = 0; k < 2 * NPARAM; k++) {
        tp_args *v = NULL;
        TP_CHECK_OK(tp_rref_to_here(ps[k], WAIT_MS, &v, &err), err);
        const tp_tensor *t = tp_args_tensor(v, 0);
        tp_tensor *start = param_start(k, false);
        int64_t n = tp_tensor_numel(t);
        TP_CHECK_EQ(n, tp_tensor_numel(want[k]));
        const double *gv = tp_tensor_data(t);
        const double *wv = tp_tensor_data(want[k]);
        const double *sv = tp_tensor_data(start);
        for (int64_t i = 0; i < n; i++) {
            TP_CHECKF(fabs(gv[i] - wv[i]) <= 1e-12 * (1 + fabs(wv[i])),
                      "rank %d: %s's parameter %d [%lld] = %.17g, local "
                      "training %.17g",
                      g_rank, k_names[k / NPARAM], k % NPARAM, (long long)i,
                      gv[i], wv[i]);
            TP_CHECK(gv[i] != sv[i]); // and it moved
        }
        tp_tensor_unref(start);
        tp_tensor_unref(want[k]);
        tp_args_unref(v);
    }
    tp_dist_optim_destroy(d);
    for (int k = 0; k < 2 * NPARAM; k++) {
        tp_rref_unref(ps[k]);
    }
}

static void
w_two_trainers(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank >= 2) {
        train(a);
    }
    leave(a);
}

static void
test_two_trainers(void)
{
    run(4, w_two_trainers);
}

// ---- errors -----------------------------------------------------------------

static void
expect_create_fails(tp_agent *a, const tp_optim_options *o, size_t n,
                    tp_rref *const *ps, tp_status want, const char *needle,
                    const char *needle2)
{
    tp_error *err = NULL;
    tp_dist_optim *d = NULL;
    tp_status st = tp_dist_optim_create(a, o, n, ps, WAIT_MS, &d, &err);
    TP_CHECKF(st == want, "expected %s for \"%s\", got %s: %s",
              tp_status_name(want), needle, tp_status_name(st),
              tp_error_message(err));
    TP_CHECK(d == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle2);
    tp_error_unref(err);
}

static tp_rref *
bad_param(tp_agent *a, int64_t which)
{
    tp_args *in = args_i64(which), *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_rpc_sync_rank(a, 0, "o.bad", in, WAIT_MS, &out, &err), err);
    tp_rref *r = tp_rref_ref(tp_args_rref(out, 0));
    tp_args_unref(in);
    tp_args_unref(out);
    return r;
}

static void
w_errors(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 1) {
        tp_error *err = NULL;
        tp_rref *ps[NPARAM];
        params_of(a, 0, ps);
        tp_optim_options o;
        // Options are checked before any RPC.
        tp_optim_options_init(&o, TP_OPTIM_SGD);
        expect_create_fails(a, &o, 2, ps, TP_EINVAL, "dist optim",
                            "optim sgd: lr is required");
        o.lr = 0.1;
        expect_create_fails(a, &o, 0, ps, TP_EINVAL, "dist optim sgd",
                            "empty parameter list");
        tp_rref *withnull[2] = {ps[0], NULL};
        expect_create_fails(a, &o, 2, withnull, TP_EINVAL, "dist optim",
                            "parameter 1 is NULL");
        // The owner refuses values that are not one tensor requiring
        // grad; the error names it.
        tp_rref *two = bad_param(a, 0), *nograd = bad_param(a, 1);
        tp_rref *bad1[2] = {ps[0], two};
        expect_create_fails(a, &o, 2, bad1, TP_EINVAL,
                            "creating the sgd optimizer of the 2 parameters "
                            "owned by alpha (rank 0)",
                            "parameter RRef 1: its value holds 2 tensors");
        expect_create_fails(a, &o, 1, &nograd, TP_EINVAL,
                            "owned by alpha (rank 0)",
                            "is not a leaf that requires grad");
        tp_rref_unref(two);
        tp_rref_unref(nograd);

        // A context the owner does not know.
        tp_dist_optim *d = NULL;
        TP_CHECK_OK(tp_dist_optim_create(a, &o, 2, ps, WAIT_MS, &d, &err), err);
        TP_CHECK_EQ(tp_dist_optim_step(d, 12345, WAIT_MS, &err), TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err),
                              "dist optim step of context 12345: owner "
                              "alpha (rank 0)");
        tp_error_unref(err);
        err = NULL;
        // A context of this worker that never reached the owner: it does
        // not know it either (PyTorch: "Could not find autograd context").
        // Not current here while stepping, so the step's call does not
        // carry it there.
        int64_t ctx = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &ctx, &err), err);
        TP_CHECK_OK(tp_dist_autograd_set_current(a, -1, &err), err);
        TP_CHECK_EQ(tp_dist_optim_step(d, ctx, WAIT_MS, &err), TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "owner alpha (rank 0)");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_OK(tp_dist_autograd_context_release(a, ctx, &err), err);
        TP_CHECK(tp_dist_optim_step(NULL, 1, WAIT_MS, &err) == TP_EINVAL);
        tp_error_unref(err);
        // Nothing moved.
        for (int k = 0; k < 2; k++) {
            tp_args *v = NULL;
            TP_CHECK_OK(tp_rref_to_here(ps[k], WAIT_MS, &v, &err), err);
            for (int i = 0; i < N; i++) {
                double start = k ? b0(0, i) : w0(0, i);
                TP_CHECK(item(tp_args_tensor(v, 0), i) == start);
            }
            tp_args_unref(v);
        }
        tp_dist_optim_destroy(d);
        tp_dist_optim_destroy(NULL);
        for (int k = 0; k < NPARAM; k++) {
            tp_rref_unref(ps[k]);
        }
    }
    leave(a);
}

static void
test_errors(void)
{
    run(2, w_errors);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_two_trainers, 120),
    TP_TEST_CASE_T(test_errors, 120),
};

TP_TEST_MAIN(cases)
