// SPDX-License-Identifier: Apache-2.0
// dist_autograd_test.c - distributed autograd (dist_autograd.h) across 2
// to 3 worker processes on loopback: gradients through an RPC in both
// directions, a nested chain A -> B -> C -> A, several roots and
// accumulation, remote() + to_here, the errors (no roots, unknown
// context, a failing remote part, a worker killed during backward), and
// contexts released on every worker (by the creator, by its death).
//
// Every worker has a leaf weight w (4 f64, all rank + 2) requiring grad;
// "d.hop" multiplies its input by w and passes it on along a list of
// ranks. Every wait has a deadline.

#include "tp_test.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tpipe/dist_autograd.h>
#include <tpipe/rpc.h>
#include <tpipe/rref.h>

#include "tp_test_job.h"

#define WAIT_MS 20000
#define N       4

static const char *const k_names[4] = {"alpha", "bravo", "charlie", "delta"};
static tp_tensor *g_w; // this worker's weight
static int g_rank;

static tp_tensor *
vec(double v0, double step, bool grad)
{
    int64_t shape[1] = {N};
    tp_tensor *t = NULL;
    TP_CHECK_OK(tp_tensor_empty(TP_F64, 1, shape, &t, NULL), NULL);
    for (int i = 0; i < N; i++) {
        TP_CHECK_OK(tp_tensor_set_item(t, i, v0 + step * i), NULL);
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

static void
check_vec(const tp_tensor *t, const double *want, const char *what)
{
    TP_CHECKF(t != NULL, "rank %d: %s: no gradient", g_rank, what);
    for (int i = 0; i < N; i++) {
        double v = item(t, i);
        TP_CHECKF(v > want[i] - 1e-9 && v < want[i] + 1e-9,
                  "rank %d: %s[%d] = %g, want %g", g_rank, what, i, v, want[i]);
    }
}

// ---- functions -------------------------------------------------------------

// in: bytes = int32 ranks still to visit, tensor 0 = x. Out: x * w (then
// passed on along the list).
static tp_status
fn_hop(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    size_t len = 0;
    const int32_t *next = tp_args_bytes(in, &len);
    tp_tensor *y = NULL;
    tp_status st = tp_mul(tp_args_tensor(in, 0), g_w, &y, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_args *out = NULL;
    if (len >= 4) {
        tp_args *fw = NULL;
        TP_CHECK_OK(tp_args_create(next + 1, len - 4, &fw), NULL);
        TP_CHECK_OK(tp_args_add_tensor(fw, y), NULL);
        st = tp_rpc_sync(call->agent, k_names[next[0]], "d.hop", fw, WAIT_MS,
                         &out, err_p);
        tp_args_unref(fw);
    } else {
        TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
        TP_CHECK_OK(tp_args_add_tensor(out, y), NULL);
    }
    tp_tensor_unref(y);
    *out_p = out;
    return st;
}

// The gradient of this worker's w in context (bytes: i64), or none.
static tp_status
fn_grad(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)arg;
    int64_t id = 0;
    memcpy(&id, tp_args_bytes(in, NULL), sizeof(id));
    tp_grad_map *m = NULL;
    tp_status st = tp_dist_autograd_get_gradients(call->agent, id, &m, err_p);
    if (st != TP_OK) {
        return st;
    }
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    tp_tensor *g = tp_grad_map_get(m, g_w);
    if (g != NULL) {
        TP_CHECK_OK(tp_args_add_tensor(out, g), NULL);
    }
    tp_grad_map_destroy(m);
    *out_p = out;
    return TP_OK;
}

// The number of contexts alive here (bytes: i64).
static tp_status
fn_nctx(const tp_rpc_call_info *call, const tp_args *in, void *arg,
        tp_args **out_p, tp_error **err_p)
{
    (void)in;
    (void)arg;
    (void)err_p;
    tp_dist_autograd_stats s;
    TP_CHECK_OK(tp_dist_autograd_get_stats(call->agent, &s), NULL);
    int64_t v = (int64_t)(s.contexts + s.send_fns + s.backwards);
    return tp_args_create(&v, sizeof(v), out_p);
}

// A node whose backward fails, or kills this worker.
static tp_status
bad_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
             tp_error **err_p)
{
    (void)gout;
    (void)gin;
    if (tp_node_arg(node) != NULL) {
        kill(getpid(), SIGKILL);
    }
    *err_p = tp_error_create(TP_EIO, NULL, "the test's node refuses on rank %d",
                             g_rank);
    return TP_EIO;
}
static const tp_node_ops bad_ops = {.name = "BadBackward",
                                    .backward = bad_backward};

// x -> a tensor equal to x whose backward fails (bytes "die": kills).
static tp_status
fn_bad(const tp_rpc_call_info *call, const tp_args *in, void *arg,
       tp_args **out_p, tp_error **err_p)
{
    (void)call;
    (void)arg;
    size_t len = 0;
    const char *b = tp_args_bytes(in, &len);
    tp_tensor *x = tp_args_tensor(in, 0);
    tp_node *n = NULL;
    tp_status st = tp_node_create(&bad_ops, len == 3 ? (void *)1 : NULL, 1, &x,
                                  1, &n, err_p);
    if (st != TP_OK) {
        return st;
    }
    (void)b;
    tp_tensor *y = NULL;
    TP_CHECK_OK(tp_detach(x, &y, NULL), NULL);
    TP_CHECK_OK(tp_tensor_set_grad_fn(y, n, 0, NULL), NULL);
    tp_node_unref(n);
    tp_args *out = NULL;
    TP_CHECK_OK(tp_args_create(NULL, 0, &out), NULL);
    TP_CHECK_OK(tp_args_add_tensor(out, y), NULL);
    tp_tensor_unref(y);
    *out_p = out;
    return TP_OK;
}

static void
setup(int rank)
{
    g_rank = rank;
    g_w = vec(rank + 2, 0, true);
    TP_CHECK_OK(tp_rpc_register("d.hop", fn_hop, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("d.grad", fn_grad, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("d.nctx", fn_nctx, NULL, NULL), NULL);
    TP_CHECK_OK(tp_rpc_register("d.bad", fn_bad, NULL, NULL), NULL);
}

static tp_agent *
join(int rank, int world, const char *url)
{
    return tp_job_rpc_join(k_names[rank], rank, world, url, WAIT_MS, WAIT_MS);
}

static void
leave(tp_agent *a)
{
    tp_job_rpc_leave(a, g_rank);
}

static void
run(int world, tp_job_fn fn, tp_job *jp)
{
    tp_job j;
    if (jp == NULL) {
        tp_job_tcp(&j, world, fn, NULL);
        jp = &j;
    }
    jp->setup = setup;
    jp->names = k_names;
    tp_job_run(jp);
}

// x through "d.hop" along @path (first the worker to call).
static tp_tensor *
hop(tp_agent *a, tp_tensor *x, const int32_t *path, int n)
{
    tp_args *in = NULL, *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_args_create(path + 1, (size_t)(n - 1) * 4, &in), NULL);
    TP_CHECK_OK(tp_args_add_tensor(in, x), NULL);
    TP_CHECK_OK(
        tp_rpc_sync(a, k_names[path[0]], "d.hop", in, WAIT_MS, &out, &err),
        err);
    tp_tensor *y = tp_tensor_ref(tp_args_tensor(out, 0));
    tp_args_unref(in);
    tp_args_unref(out);
    return y;
}

static tp_tensor *
sum(tp_tensor *y)
{
    tp_tensor *s = NULL;
    TP_CHECK_OK(tp_sum(y, &s, NULL), NULL);
    return s;
}

// The gradient of rank @r's w in @id (NULL: none).
static tp_tensor *
grad_of(tp_agent *a, int r, int64_t id)
{
    tp_args *in = NULL, *out = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_args_create(&id, sizeof(id), &in), NULL);
    TP_CHECK_OK(tp_rpc_sync(a, k_names[r], "d.grad", in, WAIT_MS, &out, &err),
                err);
    tp_tensor *g = tp_args_ntensors(out) > 0
                       ? tp_tensor_ref(tp_args_tensor(out, 0))
                       : NULL;
    tp_args_unref(in);
    tp_args_unref(out);
    return g;
}

// Waits until no worker of @world has a context, send function or part.
static void
wait_clean(tp_agent *a, int world, int skip)
{
    int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
    for (int r = 0; r < world; r++) {
        if (r == skip) {
            continue;
        }
        for (;;) {
            tp_args *out = NULL, *in = NULL;
            tp_error *err = NULL;
            int64_t z = 0;
            TP_CHECK_OK(tp_args_create(&z, sizeof(z), &in), NULL);
            TP_CHECK_OK(
                tp_rpc_sync(a, k_names[r], "d.nctx", in, WAIT_MS, &out, &err),
                err);
            int64_t v = 0;
            memcpy(&v, tp_args_bytes(out, NULL), sizeof(v));
            tp_args_unref(in);
            tp_args_unref(out);
            if (v == 0) {
                break;
            }
            TP_CHECKF(tp_job_now_ms() < end,
                      "rank %d still has %lld contexts/functions/parts", r,
                      (long long)v);
            tp_job_sleep_ms(10);
        }
    }
}

// ---- cases ---------------------------------------------------------------

// x (alpha) -> bravo: y = x * w1; loss = sum(y * y) on alpha.
static void
w_basic(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_EQ(tp_dist_autograd_current(a), -1);
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        TP_CHECK_EQ(tp_dist_autograd_current(a), id);
        TP_CHECK_EQ((int)((uint64_t)id >> 48), 0); // the creator's rank
        int64_t id2 = 0;
        TP_CHECK_EQ(tp_dist_autograd_context_create(a, &id2, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "already current");
        tp_error_unref(err);
        err = NULL;
        tp_tensor *x = vec(1, 1, true); // 1 2 3 4
        int32_t path[1] = {1};
        tp_tensor *y = hop(a, x, path, 1);
        TP_CHECK(tp_tensor_requires_grad(y));
        TP_CHECK(
            strcmp(tp_node_name(tp_tensor_grad_fn(y)), "RecvRpcBackward") == 0);
        tp_tensor *yy = NULL;
        TP_CHECK_OK(tp_mul(y, y, &yy, NULL), NULL);
        tp_tensor *loss = sum(yy);
        TP_CHECK_OK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err),
                    err);
        // dloss/dx = 2 y w1 = 2 x w1^2 = 18 x; dloss/dw1 = 2 y x = 6 x^2.
        tp_grad_map *m = NULL;
        TP_CHECK_OK(tp_dist_autograd_get_gradients(a, id, &m, &err), err);
        TP_CHECK_EQ(tp_grad_map_size(m), 1);
        double gx[N], gw[N];
        for (int i = 0; i < N; i++) {
            gx[i] = 18.0 * (i + 1);
            gw[i] = 6.0 * (i + 1) * (i + 1);
        }
        check_vec(tp_grad_map_get(m, x), gx, "dx");
        TP_CHECK(tp_tensor_grad(x) == NULL); // never into .grad
        tp_grad_map_destroy(m);
        tp_tensor *g1 = grad_of(a, 1, id);
        check_vec(g1, gw, "dw on bravo");
        tp_tensor_unref(g1);
        // Released here and on bravo; unknown from then on.
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        TP_CHECK_EQ(tp_dist_autograd_current(a), -1);
        TP_CHECK_EQ(tp_dist_autograd_get_gradients(a, id, &m, &err), TP_ENOENT);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "no context");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_dist_autograd_backward(a, id, 1, &loss, false, &err),
                    TP_ENOENT);
        tp_error_unref(err);
        wait_clean(a, world, -1);
        tp_tensor_unref(loss);
        tp_tensor_unref(yy);
        tp_tensor_unref(y);
        tp_tensor_unref(x);
    }
    leave(a);
}

static void
test_basic(void)
{
    run(2, w_basic, NULL);
}

// alpha -> bravo -> charlie -> alpha; two roots; two passes accumulate.
static void
w_chain(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *x = vec(1, 1, true);
        int32_t path[3] = {1, 2, 0};
        tp_tensor *y = hop(a, x, path, 3); // x * 3 * 4 * 2
        int32_t path2[1] = {2};
        tp_tensor *z = hop(a, x, path2, 1); // x * 4
        tp_tensor *roots[2] = {sum(y), sum(z)};
        TP_CHECK_OK(tp_dist_autograd_backward(a, id, 2, roots, true, &err),
                    err);
        TP_CHECK_OK(tp_dist_autograd_backward(a, id, 2, roots, false, &err),
                    err);
        // Two passes: dx = 2 (24 + 4); dw0 = 2 * 12 x; dw1 = 2 * 8 x;
        // dw2 = 2 * (6 x + x).
        double gx[N], g0[N], g1[N], g2[N];
        for (int i = 0; i < N; i++) {
            double xi = i + 1;
            gx[i] = 56;
            g0[i] = 24 * xi;
            g1[i] = 16 * xi;
            g2[i] = 14 * xi;
        }
        tp_grad_map *m = NULL;
        TP_CHECK_OK(tp_dist_autograd_get_gradients(a, id, &m, &err), err);
        check_vec(tp_grad_map_get(m, x), gx, "dx");
        check_vec(tp_grad_map_get(m, g_w), g0, "dw on alpha");
        tp_grad_map_destroy(m);
        tp_tensor *g = grad_of(a, 1, id);
        check_vec(g, g1, "dw on bravo");
        tp_tensor_unref(g);
        g = grad_of(a, 2, id);
        check_vec(g, g2, "dw on charlie");
        tp_tensor_unref(g);
        // Charlie learnt of the context from bravo: released there too.
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        wait_clean(a, world, -1);
        tp_tensor_unref(roots[0]);
        tp_tensor_unref(roots[1]);
        tp_tensor_unref(y);
        tp_tensor_unref(z);
        tp_tensor_unref(x);
    }
    leave(a);
}

static void
test_chain(void)
{
    run(3, w_chain, NULL);
}

// remote() and to_here inside a context: both record functions.
static void
w_rref(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *x = vec(1, 1, true);
        tp_args *in = NULL;
        TP_CHECK_OK(tp_args_create(NULL, 0, &in), NULL);
        TP_CHECK_OK(tp_args_add_tensor(in, x), NULL);
        tp_rref *r = NULL;
        TP_CHECK_OK(tp_remote(a, "bravo", "d.hop", in, WAIT_MS, &r, &err), err);
        tp_args *v = NULL;
        TP_CHECK_OK(tp_rref_to_here(r, WAIT_MS, &v, &err), err);
        tp_tensor *loss = sum(tp_args_tensor(v, 0));
        TP_CHECK_OK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err),
                    err);
        double gx[N], gw[N];
        for (int i = 0; i < N; i++) {
            gx[i] = 3;
            gw[i] = i + 1;
        }
        tp_grad_map *m = NULL;
        TP_CHECK_OK(tp_dist_autograd_get_gradients(a, id, &m, &err), err);
        check_vec(tp_grad_map_get(m, x), gx, "dx");
        tp_grad_map_destroy(m);
        tp_tensor *g = grad_of(a, 1, id);
        check_vec(g, gw, "dw on bravo");
        tp_tensor_unref(g);
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        tp_tensor_unref(loss);
        tp_args_unref(v);
        tp_rref_unref(r);
        tp_args_unref(in);
        tp_tensor_unref(x);
        wait_clean(a, world, -1);
    }
    leave(a);
}

static void
test_rref(void)
{
    run(2, w_rref, NULL);
}

// Bad roots and contexts; a remote part that fails; the next context works.
static void
w_errors(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *x = vec(1, 1, true);
        TP_CHECK_EQ(tp_dist_autograd_backward(a, id, 0, NULL, false, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "no roots");
        tp_error_unref(err);
        err = NULL;
        tp_tensor *c = vec(1, 0, false);
        tp_tensor *cs = sum(c);
        TP_CHECK_EQ(tp_dist_autograd_backward(a, id, 1, &cs, false, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "does not require grad");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_dist_autograd_backward(a, id, 1, &x, false, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "4 elements");
        tp_error_unref(err);
        err = NULL;
        // Unknown and foreign contexts.
        TP_CHECK_EQ(tp_dist_autograd_set_current(a, 12345, &err), TP_ENOENT);
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_dist_autograd_context_release(a, (int64_t)1 << 48, &err),
                    TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "made by rank 1");
        tp_error_unref(err);
        err = NULL;
        // bravo's part fails: the backward fails naming bravo and why.
        tp_args *in = NULL, *out = NULL;
        TP_CHECK_OK(tp_args_create(NULL, 0, &in), NULL);
        TP_CHECK_OK(tp_args_add_tensor(in, x), NULL);
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "d.bad", in, WAIT_MS, &out, &err),
                    err);
        tp_tensor *loss = sum(tp_args_tensor(out, 0));
        TP_CHECK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err) !=
                 TP_OK);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECK_STR_CONTAINS(tp_error_message(err),
                              "the test's node refuses on rank 1");
        tp_error_unref(err);
        err = NULL;
        tp_tensor_unref(loss);
        tp_args_unref(out);
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        // Another context is unaffected.
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        int32_t path[1] = {1};
        tp_tensor *y = hop(a, x, path, 1);
        loss = sum(y);
        TP_CHECK_OK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err),
                    err);
        tp_grad_map *m = NULL;
        TP_CHECK_OK(tp_dist_autograd_get_gradients(a, id, &m, &err), err);
        double gx[N] = {3, 3, 3, 3};
        check_vec(tp_grad_map_get(m, x), gx, "dx");
        tp_grad_map_destroy(m);
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        // Local tp_backward through a recv function says what to use.
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *y2 = hop(a, x, path, 1);
        tp_tensor *l2 = sum(y2);
        TP_CHECK(tp_backward(1, &l2, NULL, false, &err) != TP_OK);
        TP_CHECK_STR_CONTAINS(tp_error_message(err),
                              "tp_dist_autograd_backward");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        wait_clean(a, world, -1);
        tp_tensor_unref(l2);
        tp_tensor_unref(y2);
        tp_tensor_unref(loss);
        tp_tensor_unref(y);
        tp_args_unref(in);
        tp_tensor_unref(cs);
        tp_tensor_unref(c);
        tp_tensor_unref(x);
    }
    leave(a);
}

static void
test_errors(void)
{
    run(2, w_errors, NULL);
}

// bravo dies during the backward: it fails promptly, naming bravo.
static void
w_killed(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    (void)world;
    tp_agent *a = join(rank, world, url);
    if (rank == 0) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *x = vec(1, 1, true);
        tp_args *in = NULL, *out = NULL;
        TP_CHECK_OK(tp_args_create("die", 3, &in), NULL);
        TP_CHECK_OK(tp_args_add_tensor(in, x), NULL);
        TP_CHECK_OK(tp_rpc_sync(a, "bravo", "d.bad", in, WAIT_MS, &out, &err),
                    err);
        tp_tensor *loss = sum(tp_args_tensor(out, 0));
        int64_t t0 = tp_job_now_ms();
        TP_CHECK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err) !=
                 TP_OK);
        int64_t dt = tp_job_now_ms() - t0;
        printf("rank 0: backward failed after %lld ms: %s\n", (long long)dt,
               tp_error_message(err));
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "bravo");
        TP_CHECKF(dt < tp_test_ms(3000), "the failure took %lld ms",
                  (long long)dt);
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
        tp_tensor_unref(loss);
        tp_args_unref(out);
        tp_args_unref(in);
        tp_tensor_unref(x);
        tp_rpc_shutdown(a, false, NULL);
        return;
    }
    // bravo: its node kills it.
    tp_job_sleep_ms(tp_test_ms(WAIT_MS));
    TP_CHECK(false);
}

// A job of @world in which rank @victim must end by SIGKILL.
static void
run_killed(int world, tp_job_fn fn, int victim)
{
    tp_job j;
    tp_job_tcp(&j, world, fn, NULL);
    j.expect_sig[victim] = SIGKILL;
    run(world, fn, &j);
}

static void
test_killed(void)
{
    run_killed(2, w_killed, 1);
}

// charlie makes a context that reaches bravo, then dies: bravo's copy of
// the context ends.
static void
w_creator_dies(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank == 2) {
        tp_error *err = NULL;
        int64_t id = -1;
        TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
        tp_tensor *x = vec(1, 1, true);
        int32_t path[1] = {1};
        tp_tensor *y = hop(a, x, path, 1);
        (void)y;
        kill(getpid(), SIGKILL);
    }
    if (rank == 1) {
        int64_t end = tp_job_now_ms() + tp_test_ms(WAIT_MS);
        tp_dist_autograd_stats s;
        // First the context arrives, then it goes with its creator.
        do {
            TP_CHECK_OK(tp_dist_autograd_get_stats(a, &s), NULL);
            tp_job_sleep_ms(5);
        } while (s.released == 0 && tp_job_now_ms() < end);
        TP_CHECKF(s.released == 1 && s.contexts == 0 && s.send_fns == 0,
                  "bravo: %llu contexts, %llu released",
                  (unsigned long long)s.contexts,
                  (unsigned long long)s.released);
    }
    tp_rpc_shutdown(a, false, NULL);
}

static void
test_creator_dies(void)
{
    run_killed(3, w_creator_dies, 2);
}

// PyTorch's trainer/PS case: charlie (rank 2) holds w; alpha and bravo, at
// once, each in its own contexts in a loop, send x to charlie, who returns
// x * w; loss = sum((x w)^2). Each context's gradient of w on charlie is
// 2 x^2 w, of x on the trainer 2 x w^2: what a local computation gives.
static void
w_ps(int rank, int world, const char *url, void *arg)
{
    (void)arg;
    tp_agent *a = join(rank, world, url);
    if (rank < 2) {
        for (int it = 0; it < 20; it++) {
            tp_error *err = NULL;
            int64_t id = -1;
            TP_CHECK_OK(tp_dist_autograd_context_create(a, &id, &err), err);
            double x0 = 1 + rank + 0.5 * it;
            tp_tensor *x = vec(x0, 0.25, true);
            int32_t path[1] = {2};
            tp_tensor *y = hop(a, x, path, 1);
            tp_tensor *yy = NULL;
            TP_CHECK_OK(tp_mul(y, y, &yy, NULL), NULL);
            tp_tensor *loss = sum(yy);
            TP_CHECK_OK(tp_dist_autograd_backward(a, id, 1, &loss, false, &err),
                        err);
            double gx[N], gw[N];
            for (int i = 0; i < N; i++) {
                double xi = x0 + 0.25 * i;
                gx[i] = 2 * xi * 16; // w = 4 on charlie
                gw[i] = 2 * xi * xi * 4;
            }
            tp_grad_map *m = NULL;
            TP_CHECK_OK(tp_dist_autograd_get_gradients(a, id, &m, &err), err);
            check_vec(tp_grad_map_get(m, x), gx, "dx");
            tp_grad_map_destroy(m);
            tp_tensor *g = grad_of(a, 2, id);
            check_vec(g, gw, "dw on charlie");
            tp_tensor_unref(g);
            TP_CHECK_OK(tp_dist_autograd_context_release(a, id, &err), err);
            tp_tensor_unref(loss);
            tp_tensor_unref(yy);
            tp_tensor_unref(y);
            tp_tensor_unref(x);
        }
        if (rank == 0) {
            wait_clean(a, world, -1);
        }
    }
    leave(a);
}

static void
test_ps(void)
{
    run(3, w_ps, NULL);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE_T(test_basic, 60),  TP_TEST_CASE_T(test_chain, 60),
    TP_TEST_CASE_T(test_rref, 60),   TP_TEST_CASE_T(test_errors, 60),
    TP_TEST_CASE_T(test_killed, 60), TP_TEST_CASE_T(test_creator_dies, 60),
    TP_TEST_CASE_T(test_ps, 60),
};

TP_TEST_MAIN(cases)
