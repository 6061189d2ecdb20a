// SPDX-License-Identifier: Apache-2.0
// autograd_engine_test.c - the backward engine: diamonds, reuse,
// retain_graph, no_grad, detach, several roots, gradient maps, custom and
// boundary nodes, errors inside backward, bad roots, threads sharing
// leaves. The per-pass leaf hook and grad map copies are in
// autograd_leaf_hook_test.c, training steps in autograd_train_test.c.

#include "ag_leak.h"
#include "ag_test_util.h"

#include <pthread.h>

static tp_tensor *
vec(int64_t n, double lo, double hi)
{
    int64_t s[1] = {n};
    return rnd(TP_F64, 1, s, lo, hi);
}

static tp_tensor *
sum_of(tp_tensor *t)
{
    tp_tensor *s;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_sum(t, &s, &err), err);
    return s;
}

static void
t_diamond(void)
{
    // x -> a = 2x, b = exp(x) -> c = a * b -> sum: dx = 2e^x + 2x e^x.
    tp_tensor *x = leaf(vec(6, -1, 1)), *a, *b, *c, *l;
    TP_CHECK_OK(tp_mul_scalar(x, 2, &a, NULL), NULL);
    TP_CHECK_OK(tp_exp(x, &b, NULL), NULL);
    TP_CHECK_OK(tp_mul(a, b, &c, NULL), NULL);
    l = sum_of(c);
    TP_CHECK(!tp_tensor_is_leaf(l));
    TP_CHECK(strcmp(tp_node_name(tp_tensor_grad_fn(l)), "SumBackward") == 0);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
    for (int i = 0; i < 6; i++) {
        double v = at(x, i);
        check_close(at(tp_tensor_grad(x), i), 2 * exp(v) + 2 * v * exp(v),
                    1e-12, 1e-12, "diamond", i);
    }
    // Non-leaves get no .grad.
    TP_CHECK(tp_tensor_grad(a) == NULL);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(c);
    tp_tensor_unref(l);
    tp_tensor_unref(x);
}

static void
t_reuse_and_accumulation(void)
{
    // l = sum(x) + sum(x * x): dx = 1 + 2x; running twice accumulates.
    tp_tensor *x = leaf(vec(4, -1, 1)), *sq, *s1, *s2, *l;
    for (int pass = 1; pass <= 2; pass++) {
        TP_CHECK_OK(tp_mul(x, x, &sq, NULL), NULL);
        s1 = sum_of(x);
        s2 = sum_of(sq);
        TP_CHECK_OK(tp_add(s1, s2, &l, NULL), NULL);
        TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
        for (int i = 0; i < 4; i++) {
            check_close(at(tp_tensor_grad(x), i), pass * (1 + 2 * at(x, i)),
                        1e-12, 1e-12, "reuse", i);
        }
        tp_tensor_unref(sq);
        tp_tensor_unref(s1);
        tp_tensor_unref(s2);
        tp_tensor_unref(l);
    }
    tp_tensor_zero_grad(x);
    TP_CHECK(tp_tensor_grad(x) == NULL);
    tp_tensor_unref(x);
}

static void
t_retain_graph(void)
{
    tp_tensor *x = leaf(vec(3, 0.5, 1)), *y, *l;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_log(x, &y, NULL), NULL);
    l = sum_of(y);
    TP_CHECK_OK(tp_backward(1, &l, NULL, true, &err), err);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, &err), err);
    for (int i = 0; i < 3; i++) {
        check_close(at(tp_tensor_grad(x), i), 2 / at(x, i), 1e-12, 0, "retain",
                    i);
    }
    // The graph is freed now: a third pass fails and names the op.
    TP_CHECK_EQ(tp_backward(1, &l, NULL, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward of");
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "second time");
    tp_error_unref(err);
    tp_tensor_unref(y);
    tp_tensor_unref(l);
    tp_tensor_unref(x);
}

static void
t_no_grad_and_detach(void)
{
    tp_tensor *x = leaf(vec(3, -1, 1)), *y, *d, *z, *l;
    bool prev = tp_grad_mode_set(false);
    TP_CHECK(prev);
    TP_CHECK(!tp_grad_mode_get());
    TP_CHECK_OK(tp_mul(x, x, &y, NULL), NULL);
    TP_CHECK(!tp_tensor_requires_grad(y));
    TP_CHECK(tp_tensor_grad_fn(y) == NULL);
    tp_grad_mode_set(prev);
    TP_CHECK(tp_grad_mode_get());
    tp_tensor_unref(y);

    // detach cuts the graph: d = detach(3x) acts as a constant.
    TP_CHECK_OK(tp_mul_scalar(x, 3, &y, NULL), NULL);
    TP_CHECK_OK(tp_detach(y, &d, NULL), NULL);
    TP_CHECK(!tp_tensor_requires_grad(d) && tp_tensor_is_leaf(d));
    TP_CHECK(tp_tensor_shares_storage(d, y));
    TP_CHECK_OK(tp_mul(d, x, &z, NULL), NULL);
    l = sum_of(z);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
    for (int i = 0; i < 3; i++) {
        check_close(at(tp_tensor_grad(x), i), 3 * at(x, i), 1e-12, 0, "detach",
                    i);
    }
    tp_tensor_unref(y);
    tp_tensor_unref(d);
    tp_tensor_unref(z);
    tp_tensor_unref(l);
    tp_tensor_unref(x);

    // Grad mode is per thread: the default is on.
    TP_CHECK(tp_grad_mode_get());
}

static void
t_multiple_roots_and_map(void)
{
    tp_tensor *x = leaf(vec(4, -1, 1)), *w = leaf(vec(4, -1, 1));
    tp_tensor *p, *l1, *l2, *e;
    TP_CHECK_OK(tp_mul(x, w, &p, NULL), NULL);
    l1 = sum_of(p); // d/dx = w
    TP_CHECK_OK(tp_exp(x, &e, NULL), NULL);
    l2 = sum_of(e); // d/dx = e^x
    tp_tensor *roots[2] = {l1, l2};
    tp_error *err = NULL;
    TP_CHECK_OK(tp_backward(2, roots, NULL, true, &err), err);
    for (int i = 0; i < 4; i++) {
        check_close(at(tp_tensor_grad(x), i), at(w, i) + exp(at(x, i)), 1e-12,
                    0, "roots x", i);
        check_close(at(tp_tensor_grad(w), i), at(x, i), 1e-12, 0, "roots w", i);
    }
    tp_tensor_zero_grad(x);
    tp_tensor_zero_grad(w);

    // The same graph into a map: .grad stays untouched.
    tp_grad_map *map;
    TP_CHECK_OK(tp_grad_map_create(&map), NULL);
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.grads = map;
    tp_tensor *g2 = NULL;
    TP_CHECK_OK(tp_tensor_full(TP_F64, 0, NULL, 2.0, &g2, NULL), NULL);
    tp_backward_root r[2] = {{.tensor = l1}, {.tensor = l2, .grad = g2}};
    TP_CHECK_OK(tp_backward_run(&o, 2, r, &err), err);
    TP_CHECK(tp_tensor_grad(x) == NULL && tp_tensor_grad(w) == NULL);
    TP_CHECK_EQ(tp_grad_map_size(map), 2);
    tp_tensor *gx = tp_grad_map_get(map, x), *gw = tp_grad_map_get(map, w);
    TP_CHECK(gx && gw);
    for (int i = 0; i < 4; i++) {
        check_close(at(gx, i), at(w, i) + 2 * exp(at(x, i)), 1e-12, 0, "map x",
                    i);
        check_close(at(gw, i), at(x, i), 1e-12, 0, "map w", i);
    }
    tp_tensor *k, *g;
    TP_CHECK_OK(tp_grad_map_entry(map, 0, &k, &g), NULL);
    TP_CHECK(k == x || k == w);
    TP_CHECK_EQ(tp_grad_map_entry(map, 2, &k, &g), TP_EINVAL);
    tp_grad_map_destroy(map);

    // A leaf as root: its gradient is the one given.
    tp_tensor *g4 = vec(4, -1, 1);
    TP_CHECK_OK(tp_backward(1, &x, &g4, false, &err), err);
    for (int i = 0; i < 4; i++) {
        TP_CHECK(at(tp_tensor_grad(x), i) == at(g4, i));
    }
    TP_CHECK(!tp_tensor_shares_storage(tp_tensor_grad(x), g4));
    tp_tensor_unref(g4);

    // A root that does not require grad, and a non-scalar root with no
    // gradient, are errors.
    tp_tensor *c = vec(2, 0, 1);
    TP_CHECK_EQ(tp_backward(1, &c, NULL, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "does not require grad");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_backward(1, &p, NULL, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "one-element");
    tp_error_unref(err);
    err = NULL;
    // A root gradient of the wrong shape.
    TP_CHECK_EQ(tp_backward(1, &p, &c, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "expected f64 [4]");
    tp_error_unref(err);
    tp_tensor_unref(c);
    tp_tensor_unref(g2);
    tp_tensor_unref(p);
    tp_tensor_unref(e);
    tp_tensor_unref(l1);
    tp_tensor_unref(l2);
    tp_tensor_unref(x);
    tp_tensor_unref(w);
}

// ---- custom and boundary nodes ---------------------------------------------

struct probe {
    int calls;
    double seen; // first element of the gradient it received
    int destroyed;
    bool wrong_shape;
};

static tp_status
probe_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
               tp_error **err_p)
{
    struct probe *p = tp_node_arg(node);
    p->calls++;
    if (gout[0]) {
        TP_CHECK_OK(tp_tensor_item(gout[0], 0, &p->seen), NULL);
    }
    // Identity to each input ("send" shape), or a wrong shape on request.
    for (int i = 0; i < tp_node_num_inputs(node); i++) {
        if (p->wrong_shape) {
            int64_t s[1] = {1};
            TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s, &gin[i], NULL), NULL);
        } else {
            TP_CHECK_OK(tp_tensor_clone(gout[0], &gin[i], NULL), NULL);
        }
    }
    return TP_OK;
}

static void
probe_destroy(tp_node *node)
{
    struct probe *p = tp_node_arg(node);
    p->destroyed++;
}

static const tp_node_ops probe_ops = {
    .name = "ProbeBackward",
    .backward = probe_backward,
    .destroy = probe_destroy,
};

static void
t_boundary_recv(void)
{
    // A "recv" node: no inputs; the tensor that came over the wire is its
    // output. Its backward receives the gradient and would ship it away.
    struct probe p = {0};
    tp_node *recv;
    tp_tensor *r = vec(3, -1, 1), *w = leaf(vec(3, -1, 1)), *m, *l;
    TP_CHECK_OK(tp_node_create(&probe_ops, &p, 0, NULL, 1, &recv, NULL), NULL);
    TP_CHECK_OK(tp_tensor_set_grad_fn(r, recv, 0, NULL), NULL);
    tp_node_unref(recv); // r holds it
    TP_CHECK(tp_tensor_requires_grad(r) && !tp_tensor_is_leaf(r));
    TP_CHECK_OK(tp_mul(r, w, &m, NULL), NULL);
    l = sum_of(m);
    TP_CHECK_OK(tp_backward(1, &l, NULL, false, NULL), NULL);
    TP_CHECK_EQ(p.calls, 1);
    TP_CHECK(p.seen == at(w, 0)); // d l / d r = w
    tp_tensor_unref(m);
    tp_tensor_unref(l);
    tp_tensor_unref(w);
    TP_CHECK_EQ(p.destroyed, 0);
    tp_tensor_unref(r);
    TP_CHECK_EQ(p.destroyed, 1);
}

static void
t_boundary_send(void)
{
    // A "send" node: its input is the tensor that was sent; the engine is
    // started at the node with the gradient that came back, into a map.
    struct probe p = {0};
    tp_node *send;
    tp_tensor *x = leaf(vec(3, -1, 1)), *y, *g;
    TP_CHECK_OK(tp_exp(x, &y, NULL), NULL);
    TP_CHECK_OK(tp_node_create(&probe_ops, &p, 1, &y, 1, &send, NULL), NULL);
    int nr = -1;
    TP_CHECK(tp_node_next(send, 0, &nr) == tp_tensor_grad_fn(y));
    TP_CHECK_EQ(nr, 0);
    tp_tensor_unref(y); // the node keeps the graph below it alive
    int64_t s[1] = {3};
    TP_CHECK_OK(tp_tensor_full(TP_F64, 1, s, 0.5, &g, NULL), NULL);
    tp_grad_map *map;
    TP_CHECK_OK(tp_grad_map_create(&map), NULL);
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.grads = map;
    o.retain_graph = true;
    tp_backward_root root = {.node = send, .output_nr = 0, .grad = g};
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, NULL), NULL);
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, NULL), NULL);
    TP_CHECK_EQ(p.calls, 2);
    tp_tensor *gx = tp_grad_map_get(map, x);
    TP_CHECK(gx != NULL);
    for (int i = 0; i < 3; i++) {
        check_close(at(gx, i), 2 * 0.5 * exp(at(x, i)), 1e-12, 0, "send", i);
    }
    TP_CHECK(tp_tensor_grad(x) == NULL);
    // A node whose backward returns a gradient of the wrong shape.
    p.wrong_shape = true;
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_backward_run(&o, 1, &root, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "backward of ProbeBackward: gradient of input 0");
    tp_error_unref(err);
    tp_grad_map_destroy(map);
    tp_node_unref(send);
    TP_CHECK_EQ(p.destroyed, 1);
    tp_tensor_unref(g);
    tp_tensor_unref(x);
}

static tp_status
failing_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
                 tp_error **err_p)
{
    // Fails without a message: the engine still names the op.
    return TP_EIO;
}

static tp_status
failing_backward_msg(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
                     tp_error **err_p)
{
    // A backward function reports its error like any tpipe call.
    tp_tensor *t = NULL;
    tp_status st = tp_tensor_empty(TP_F32, 1, (const int64_t[]){-1}, &t, err_p);
    return st;
}

// Order of the backward calls in t_error_in_backward: each failing
// function and the probe record when they ran.
static int bw_clock, bad_ran_at;

static tp_status
failing_backward_seq(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
                     tp_error **err_p)
{
    bad_ran_at = ++bw_clock;
    return tp_node_arg(node) ? failing_backward_msg(node, gout, gin, err_p)
                             : failing_backward(node, gout, gin, err_p);
}

static const tp_node_ops fail_seq_ops = {.name = "FailingOp",
                                         .backward = failing_backward_seq};

static tp_status
clock_probe_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
                     tp_error **err_p)
{
    *(int *)tp_node_arg(node) = ++bw_clock;
    return tp_tensor_clone(gout[0], &gin[0], err_p);
}

static const tp_node_ops clock_probe_ops = {.name = "ClockProbe",
                                            .backward = clock_probe_backward};

static void
t_error_in_backward(void)
{
    // l = sum(probe(x)) + sum(2 * bad(exp(x))), the branches in both
    // orders. The probe branch does not depend on the failing node, so
    // only a pass that stops at the error keeps it from running after it.
    int probe_skipped = 0;
    for (int k = 0; k < 2; k++) {
        for (int order = 0; order < 2; order++) {
            tp_tensor *x = leaf(vec(3, -1, 1)), *y, *z, *l, *q;
            tp_node *bad, *probe;
            int probe_ran_at = 0;
            bw_clock = 0;
            bad_ran_at = 0;
            TP_CHECK_OK(tp_exp(x, &y, NULL), NULL);
            TP_CHECK_OK(tp_node_create(&fail_seq_ops, k ? &bw_clock : NULL, 1,
                                       &y, 1, &bad, NULL),
                        NULL);
            TP_CHECK_OK(
                tp_tensor_empty(TP_F64, 1, (const int64_t[]){3}, &z, NULL),
                NULL);
            TP_CHECK_OK(tp_tensor_set_grad_fn(z, bad, 0, NULL), NULL);
            tp_node_unref(bad);
            TP_CHECK_OK(tp_node_create(&clock_probe_ops, &probe_ran_at, 1, &x,
                                       1, &probe, NULL),
                        NULL);
            TP_CHECK_OK(
                tp_tensor_empty(TP_F64, 1, (const int64_t[]){3}, &q, NULL),
                NULL);
            TP_CHECK_OK(tp_tensor_set_grad_fn(q, probe, 0, NULL), NULL);
            tp_node_unref(probe);
            TP_CHECK_OK(tp_mul_scalar(z, 2, &l, NULL), NULL);
            tp_tensor *sl = sum_of(l), *sq = sum_of(q), *s;
            TP_CHECK_OK(order ? tp_add(sq, sl, &s, NULL)
                              : tp_add(sl, sq, &s, NULL),
                        NULL);
            tp_error *err = NULL;
            tp_status st = tp_backward(1, &s, NULL, false, &err);
            TP_CHECK_EQ(st, k ? TP_EINVAL : TP_EIO);
            TP_CHECK_STR_CONTAINS(tp_error_message(err),
                                  k ? "backward of FailingOp: tensor "
                                      "empty: negative size"
                                    : "backward of FailingOp");
            tp_error_unref(err);
            TP_CHECK(bad_ran_at > 0);
            // Nothing runs after the failing node: the probe ran before
            // it or not at all.
            TP_CHECKF(probe_ran_at < bad_ran_at,
                      "probe ran at %d, after the failure at %d", probe_ran_at,
                      bad_ran_at);
            probe_skipped += probe_ran_at == 0;
            // The leaf got at most the probe's gradient, never exp's.
            tp_tensor *gx = tp_tensor_grad(x);
            TP_CHECK(probe_ran_at ? gx != NULL : gx == NULL);
            if (gx) {
                for (int i = 0; i < 3; i++) {
                    TP_CHECK(at(gx, i) == 1.0);
                }
            }
            tp_tensor_unref(s);
            tp_tensor_unref(sl);
            tp_tensor_unref(sq);
            tp_tensor_unref(q);
            tp_tensor_unref(l);
            tp_tensor_unref(z);
            tp_tensor_unref(y);
            tp_tensor_unref(x);
        }
    }
    // In one of the orders the failure came first and the probe was
    // skipped: the pass really stopped.
    TP_CHECK(probe_skipped >= 2);
}

// Saved state is released once, before destroy, whether the node ran
// without retain_graph first or was never run.
struct rel_probe {
    bool destroyed;
    int released;
    int released_after_destroy;
};

static tp_status
rel_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
             tp_error **err_p)
{
    return tp_tensor_clone(gout[0], &gin[0], err_p);
}

static void
rel_release(tp_node *node)
{
    struct rel_probe *p = tp_node_arg(node);
    p->released++;
    p->released_after_destroy += p->destroyed;
}

static void
rel_destroy(tp_node *node)
{
    struct rel_probe *p = tp_node_arg(node);
    p->destroyed = true;
}

static const tp_node_ops rel_ops = {.name = "ReleaseProbe",
                                    .backward = rel_backward,
                                    .release = rel_release,
                                    .destroy = rel_destroy};

static void
t_release_once(void)
{
    for (int run = 0; run < 3; run++) {
        // run 0: never run; 1: run without retain_graph; 2: with it.
        struct rel_probe p = {0};
        tp_tensor *x = leaf(vec(3, -1, 1)), *z, *s;
        tp_node *node;
        TP_CHECK_OK(tp_node_create(&rel_ops, &p, 1, &x, 1, &node, NULL), NULL);
        TP_CHECK_OK(tp_tensor_empty(TP_F64, 1, (const int64_t[]){3}, &z, NULL),
                    NULL);
        TP_CHECK_OK(tp_tensor_set_grad_fn(z, node, 0, NULL), NULL);
        tp_node_unref(node);
        s = sum_of(z);
        if (run > 0) {
            TP_CHECK_OK(tp_backward(1, &s, NULL, run == 2, NULL), NULL);
            TP_CHECK_EQ(p.released, run == 1 ? 1 : 0);
        }
        tp_tensor_unref(s);
        tp_tensor_unref(z); // the last reference to the node
        TP_CHECK(p.destroyed);
        TP_CHECK_EQ(p.released, 1);
        TP_CHECK_EQ(p.released_after_destroy, 0);
        tp_tensor_unref(x);
    }
}

// A root gradient must have the root's dtype as well as its shape.
static void
t_root_grad_dtype(void)
{
    tp_tensor *x = leaf(vec(3, -1, 1)), *y, *g;
    TP_CHECK_OK(tp_exp(x, &y, NULL), NULL);
    TP_CHECK_OK(tp_tensor_ones(TP_F32, 1, (const int64_t[]){3}, &g, NULL),
                NULL);
    tp_error *err = NULL;
    TP_CHECK_EQ(tp_backward(1, &y, &g, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "is f32 [3], expected f64");
    tp_error_unref(err);
    TP_CHECK(tp_tensor_grad(x) == NULL);
    tp_tensor_unref(g);
    tp_tensor_unref(y);
    tp_tensor_unref(x);
}

// The roots themselves: an empty list, and a root that does not require
// grad, named by its index; nothing is accumulated.
static void
t_root_checks(void)
{
    tp_tensor *x = leaf(vec(3, -1, 1)), *l, *c = vec(1, 0, 1);
    TP_CHECK_OK(tp_exp(x, &l, NULL), NULL);
    tp_tensor *s = sum_of(l);
    tp_error *err = NULL;
    tp_backward_options o;
    tp_backward_options_init(&o);
    tp_backward_root r[2] = {{.tensor = s}, {.tensor = c}};
    for (int n = -1; n <= 0; n++) {
        TP_CHECK_EQ(tp_backward_run(&o, n, r, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward: no roots");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_backward_run(NULL, n, NULL, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward: no roots");
        tp_error_unref(err);
        err = NULL;
        TP_CHECK_EQ(tp_backward(n, NULL, NULL, false, &err), TP_EINVAL);
        TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward: no roots");
        tp_error_unref(err);
        err = NULL;
    }
    TP_CHECK_EQ(tp_backward(1, NULL, NULL, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "backward: bad roots");
    tp_error_unref(err);
    err = NULL;

    // Root 1 does not require grad: the message names it, and root 0,
    // which was fine, delivers nothing.
    TP_CHECK_EQ(tp_backward_run(&o, 2, r, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "backward: root 1 does not require grad");
    tp_error_unref(err);
    err = NULL;
    tp_tensor *roots[2] = {c, s};
    TP_CHECK_EQ(tp_backward(2, roots, NULL, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "backward: root 0 does not require grad");
    tp_error_unref(err);
    TP_CHECK(tp_tensor_grad(x) == NULL);

    // The graph is still whole.
    TP_CHECK_OK(tp_backward(1, &s, NULL, false, NULL), NULL);
    for (int i = 0; i < 3; i++) {
        check_close(at(tp_tensor_grad(x), i), exp(at(x, i)), 1e-12, 0,
                    "after root errors", i);
    }
    tp_tensor_unref(c);
    tp_tensor_unref(s);
    tp_tensor_unref(l);
    tp_tensor_unref(x);
}

static void
t_long_chain(void)
{
    // 20000 nodes: backward and freeing must not recurse per node.
    tp_tensor *x = leaf(vec(1, 0.5, 1)), *y = tp_tensor_ref(x), *n, *s;
    for (int i = 0; i < 20000; i++) {
        TP_CHECK_OK(tp_add_scalar(y, 1e-4, &n, NULL), NULL);
        tp_tensor_unref(y);
        y = n;
    }
    s = sum_of(y);
    TP_CHECK_OK(tp_backward(1, &s, NULL, false, NULL), NULL);
    TP_CHECK(at(tp_tensor_grad(x), 0) == 1.0);
    tp_tensor_unref(s);
    tp_tensor_unref(y);
    tp_tensor_unref(x);
}

static void
t_leaf_rules(void)
{
    tp_tensor *x = leaf(vec(2, 0, 1)), *y, *i;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_exp(x, &y, NULL), NULL);
    TP_CHECK_EQ(tp_tensor_set_requires_grad(y, false, &err), TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "leaf");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_I64, 1, (const int64_t[]){2}, &i, NULL),
                NULL);
    TP_CHECK_EQ(tp_tensor_set_requires_grad(i, true, &err), TP_ENOTSUP);
    tp_error_unref(err);
    tp_tensor_unref(i);
    tp_tensor_unref(y);
    tp_tensor_unref(x);
}

// ---- threads sharing leaves ------------------------------------------------

struct worker {
    tp_tensor *w;     // shared leaf
    tp_grad_map *map; // shared map, or NULL for .grad
    double xsum[4];   // what this worker contributed to dL/dw
    int iters;
    unsigned seed;
};

static void *
worker_main(void *arg)
{
    struct worker *wk = arg;
    int64_t s[1] = {4};
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.grads = wk->map;
    for (int it = 0; it < wk->iters; it++) {
        tp_tensor *x, *y, *l;
        TP_CHECK_OK(tp_tensor_empty(TP_F64, 1, s, &x, NULL), NULL);
        for (int i = 0; i < 4; i++) {
            double v =
                (double)((wk->seed + (unsigned)it * 7u + (unsigned)i) % 13u);
            tp_tensor_set_item(x, i, v);
            wk->xsum[i] += v;
        }
        TP_CHECK_OK(tp_mul(x, wk->w, &y, NULL), NULL);
        TP_CHECK_OK(tp_sum(y, &l, NULL), NULL);
        tp_backward_root r = {.tensor = l};
        TP_CHECK_OK(tp_backward_run(&o, 1, &r, NULL), NULL);
        tp_tensor_unref(x);
        tp_tensor_unref(y);
        tp_tensor_unref(l);
    }
    return NULL;
}

static void
t_threads_share_leaves(void)
{
    // The second round has compute threads: the op threads then contend
    // for the workers and fall back to serial kernels.
    for (int use_map = 0; use_map < 3; use_map++) {
        if (use_map == 2) {
            TP_CHECK_OK(tp_compute_threads_set(2, NULL), NULL);
        }
        tp_tensor *w = leaf(vec(4, -1, 1));
        tp_grad_map *map = NULL;
        if (use_map == 1) {
            TP_CHECK_OK(tp_grad_map_create(&map), NULL);
        }
        struct worker wk[3];
        pthread_t th[3];
        for (int i = 0; i < 3; i++) {
            memset(&wk[i], 0, sizeof(wk[i]));
            wk[i].w = w;
            wk[i].map = map;
            wk[i].iters = 2000;
            wk[i].seed = (unsigned)i * 5u;
            TP_CHECK(pthread_create(&th[i], NULL, worker_main, &wk[i]) == 0);
        }
        for (int i = 0; i < 3; i++) {
            pthread_join(th[i], NULL);
        }
        tp_tensor *g = map ? tp_grad_map_get(map, w) : tp_tensor_grad(w);
        TP_CHECK(g != NULL);
        for (int i = 0; i < 4; i++) {
            double want = wk[0].xsum[i] + wk[1].xsum[i] + wk[2].xsum[i];
            check_close(at(g, i), want, 0, 0, "shared leaf", i);
        }
        tp_grad_map_destroy(map);
        tp_tensor_unref(w);
    }
    TP_CHECK_OK(tp_compute_threads_set(1, NULL), NULL);
}

AG_LEAK_CHECKED(t_diamond)
AG_LEAK_CHECKED(t_reuse_and_accumulation)
AG_LEAK_CHECKED(t_retain_graph)
AG_LEAK_CHECKED(t_no_grad_and_detach)
AG_LEAK_CHECKED(t_multiple_roots_and_map)
AG_LEAK_CHECKED(t_boundary_recv)
AG_LEAK_CHECKED(t_boundary_send)
AG_LEAK_CHECKED(t_error_in_backward)
AG_LEAK_CHECKED(t_release_once)
AG_LEAK_CHECKED(t_root_grad_dtype)
AG_LEAK_CHECKED(t_root_checks)
AG_LEAK_CHECKED(t_long_chain)
AG_LEAK_CHECKED(t_leaf_rules)
AG_LEAK_CHECKED(t_threads_share_leaves)

static const tp_test_case cases[] = {
    AG_TEST(t_diamond),
    AG_TEST(t_reuse_and_accumulation),
    AG_TEST(t_retain_graph),
    AG_TEST(t_no_grad_and_detach),
    AG_TEST(t_multiple_roots_and_map),
    AG_TEST(t_boundary_recv),
    AG_TEST(t_boundary_send),
    AG_TEST(t_error_in_backward),
    AG_TEST(t_release_once),
    AG_TEST(t_root_grad_dtype),
    AG_TEST(t_root_checks),
    AG_TEST(t_long_chain),
    AG_TEST(t_leaf_rules),
    AG_TEST(t_threads_share_leaves),
};

TP_TEST_MAIN(cases)
