// SPDX-License-Identifier: Apache-2.0
// autograd_leaf_hook_test.c - what the engine offers data-parallel
// training and distributed autograd: the per-pass leaf hook
// (tp_backward_options.on_leaf_grad) and copies of gradient maps.

#include "ag_leak.h"
#include "ag_test_util.h"

#include "alloc.h" // tp__alloc_fail_after
#include "tp_config.h"

#define REC_MAX 16

// What on_leaf_grad saw, in order.
struct rec {
    int n;
    tp_tensor *leaf[REC_MAX];
    tp_tensor *grad[REC_MAX];  // a reference to the tensor passed
    tp_tensor *value[REC_MAX]; // a copy of its values at that moment
    bool grad_mode[REC_MAX];
    bool no_copy; // leave value[] NULL (the hook then allocates nothing)
};

static void
rec_hook(tp_tensor *leaf, tp_tensor *grad, void *arg)
{
    struct rec *r = arg;
    TP_CHECK(r->n < REC_MAX);
    r->leaf[r->n] = leaf;
    r->grad[r->n] = tp_tensor_ref(grad);
    r->value[r->n] = NULL;
    if (grad && !r->no_copy) {
        TP_CHECK_OK(tp_tensor_clone(grad, &r->value[r->n], NULL), NULL);
    }
    r->grad_mode[r->n] = tp_grad_mode_get();
    r->n++;
}

static void
rec_clear(struct rec *r)
{
    for (int i = 0; i < r->n; i++) {
        tp_tensor_unref(r->grad[i]);
        tp_tensor_unref(r->value[i]);
    }
    r->n = 0;
}

// The position of @leaf in @r; fails unless it is there exactly once.
static int
rec_pos(const struct rec *r, const tp_tensor *leaf, const char *what)
{
    int pos = -1, count = 0;
    for (int i = 0; i < r->n; i++) {
        if (r->leaf[i] == leaf) {
            pos = i;
            count++;
        }
    }
    TP_CHECKF(count == 1, "%s reported %d times", what, count);
    return pos;
}

// The report at @pos had the gradient @final (the leaf's .grad or map
// entry after the pass): the same tensor, with the same values.
static void
rec_check_final(const struct rec *r, int pos, tp_tensor *final,
                const char *what)
{
    TP_CHECKF(r->grad[pos] == final, "%s: reported %p, final %p", what,
              (void *)r->grad[pos], (void *) final);
    TP_CHECK(final != NULL);
    int64_t n = tp_tensor_numel(final);
    for (int64_t i = 0; i < n; i++) {
        TP_CHECKF(at(r->value[pos], i) == at(final, i), "%s[%lld]: %g vs %g",
                  what, (long long)i, at(r->value[pos], i), at(final, i));
    }
    TP_CHECK(!r->grad_mode[pos]);
}

static tp_tensor *
mat(int64_t rows, int64_t cols)
{
    int64_t s[2] = {rows, cols};
    return rnd(TP_F64, 2, s, -1, 1);
}

static tp_tensor *
vec(int64_t n)
{
    int64_t s[1] = {n};
    return rnd(TP_F64, 1, s, -1, 1);
}

// out = tanh(x @ w1 + b1) @ w2 + b2; loss = mse(out, t).
static tp_tensor *
mlp_loss(tp_tensor *x, tp_tensor *t, tp_tensor *const *p)
{
    tp_tensor *h1, *a1, *z1, *h2, *out, *loss;
    TP_CHECK_OK(tp_matmul(x, p[0], &h1, NULL), NULL);
    TP_CHECK_OK(tp_add(h1, p[1], &a1, NULL), NULL);
    TP_CHECK_OK(tp_tanh(a1, &z1, NULL), NULL);
    TP_CHECK_OK(tp_matmul(z1, p[2], &h2, NULL), NULL);
    TP_CHECK_OK(tp_add(h2, p[3], &out, NULL), NULL);
    TP_CHECK_OK(tp_mse_loss(out, t, &loss, NULL), NULL);
    tp_tensor_unref(h1);
    tp_tensor_unref(a1);
    tp_tensor_unref(z1);
    tp_tensor_unref(h2);
    tp_tensor_unref(out);
    return loss;
}

// Two linear layers: each parameter is reported once, with its final
// gradient, the second layer's before the first layer's; into .grad (also
// on top of an earlier pass's gradients) and into a map.
static void
t_leaf_hook_mlp(void)
{
    tp_tensor *x = mat(6, 3), *t = mat(6, 2);
    tp_tensor *p[4] = {leaf(mat(3, 5)), leaf(vec(5)), leaf(mat(5, 2)),
                       leaf(vec(2))};
    const char *names[4] = {"w1", "b1", "w2", "b2"};
    struct rec r = {0};
    tp_backward_options o;
    tp_backward_options_init(&o);
    TP_CHECK(o.on_leaf_grad == NULL && o.on_leaf_grad_arg == NULL);
    o.on_leaf_grad = rec_hook;
    o.on_leaf_grad_arg = &r;
    tp_error *err = NULL;

    // Pass 1 without the hook (.grad gets g), pass 2 with it (.grad gets
    // 2g), pass 3 into a map.
    tp_tensor *first[4];
    for (int pass = 1; pass <= 3; pass++) {
        tp_grad_map *map = NULL;
        if (pass == 3) {
            TP_CHECK_OK(tp_grad_map_create(&map), NULL);
        }
        o.grads = map;
        tp_tensor *loss = mlp_loss(x, t, p);
        tp_backward_root root = {.tensor = loss};
        if (pass == 1) {
            TP_CHECK_OK(tp_backward(1, &loss, NULL, false, &err), err);
            for (int i = 0; i < 4; i++) {
                TP_CHECK_OK(
                    tp_tensor_clone(tp_tensor_grad(p[i]), &first[i], NULL),
                    NULL);
            }
            TP_CHECK_EQ(r.n, 0);
            tp_tensor_unref(loss);
            continue;
        }
        TP_CHECK_OK(tp_backward_run(&o, 1, &root, &err), err);
        TP_CHECK_EQ(r.n, 4);
        int pos[4];
        for (int i = 0; i < 4; i++) {
            pos[i] = rec_pos(&r, p[i], names[i]);
            tp_tensor *final =
                map ? tp_grad_map_get(map, p[i]) : tp_tensor_grad(p[i]);
            rec_check_final(&r, pos[i], final, names[i]);
            // What was reported is the whole gradient: 2g after two
            // passes into .grad, g in the fresh map.
            int64_t n = tp_tensor_numel(final);
            for (int64_t k = 0; k < n; k++) {
                check_close(at(final, k), (pass == 2 ? 2 : 1) * at(first[i], k),
                            1e-12, 1e-15, names[i], k);
            }
        }
        TP_CHECKF(pos[2] < pos[0] && pos[2] < pos[1] && pos[3] < pos[0] &&
                      pos[3] < pos[1],
                  "order w1 %d b1 %d w2 %d b2 %d", pos[0], pos[1], pos[2],
                  pos[3]);
        if (map) {
            // .grad still holds pass 2's gradients.
            for (int i = 0; i < 4; i++) {
                TP_CHECK(tp_tensor_grad(p[i]) != NULL);
                TP_CHECK(tp_tensor_grad(p[i]) != tp_grad_map_get(map, p[i]));
            }
        }
        rec_clear(&r);
        tp_grad_map_destroy(map);
        tp_tensor_unref(loss);
    }
    for (int i = 0; i < 4; i++) {
        tp_tensor_unref(first[i]);
        tp_tensor_unref(p[i]);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(t);
}

// A leaf used on two paths, and twice in one op, is reported once, after
// all its contributions; other leaves of the same pass are reported too.
static void
t_leaf_hook_shared_leaf(void)
{
    tp_tensor *w = leaf(vec(4)), *v = leaf(vec(4));
    // l = sum(tanh(w) * v) + sum(3 w) + sum(w * w):
    // dl/dw = (1 - tanh(w)^2) v + 3 + 2 w, dl/dv = tanh(w).
    tp_tensor *a, *b, *c, *d, *sa, *sc, *sd, *l1, *l;
    TP_CHECK_OK(tp_tanh(w, &a, NULL), NULL);
    TP_CHECK_OK(tp_mul(a, v, &b, NULL), NULL);
    TP_CHECK_OK(tp_mul_scalar(w, 3, &c, NULL), NULL);
    TP_CHECK_OK(tp_mul(w, w, &d, NULL), NULL);
    TP_CHECK_OK(tp_sum(b, &sa, NULL), NULL);
    TP_CHECK_OK(tp_sum(c, &sc, NULL), NULL);
    TP_CHECK_OK(tp_sum(d, &sd, NULL), NULL);
    TP_CHECK_OK(tp_add(sa, sc, &l1, NULL), NULL);
    TP_CHECK_OK(tp_add(l1, sd, &l, NULL), NULL);

    struct rec r = {0};
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.on_leaf_grad = rec_hook;
    o.on_leaf_grad_arg = &r;
    tp_backward_root root = {.tensor = l};
    tp_error *err = NULL;
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, &err), err);
    TP_CHECK_EQ(r.n, 2);
    int pw = rec_pos(&r, w, "w"), pv = rec_pos(&r, v, "v");
    rec_check_final(&r, pw, tp_tensor_grad(w), "w");
    rec_check_final(&r, pv, tp_tensor_grad(v), "v");
    for (int i = 0; i < 4; i++) {
        double wi = at(w, i), th = tanh(wi);
        // The reported value is the sum of all four contributions.
        check_close(at(r.value[pw], i), (1 - th * th) * at(v, i) + 3 + 2 * wi,
                    1e-12, 1e-15, "w reported", i);
        check_close(at(r.value[pv], i), th, 1e-12, 1e-15, "v reported", i);
    }
    rec_clear(&r);

    // A leaf as a root is reported too.
    tp_tensor *g = vec(4);
    tp_tensor_zero_grad(v);
    root = (tp_backward_root){.tensor = v, .grad = g};
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, &err), err);
    TP_CHECK_EQ(r.n, 1);
    rec_check_final(&r, rec_pos(&r, v, "v root"), tp_tensor_grad(v), "v");
    rec_clear(&r);

    tp_tensor *ts[] = {g, a, b, c, d, sa, sc, sd, l1, l, w, v};
    for (size_t i = 0; i < AG_LEN(ts); i++) {
        tp_tensor_unref(ts[i]);
    }
}

// A node whose backward gives its input no gradient.
static tp_status
no_grad_backward(tp_node *node, tp_tensor *const *gout, tp_tensor **gin,
                 tp_error **err_p)
{
    return TP_OK;
}

static const tp_node_ops no_grad_ops = {.name = "NoGradBackward",
                                        .backward = no_grad_backward};

// A leaf the pass reaches but gives no gradient is still reported, once,
// with what it has: NULL, or an earlier pass's gradient.
static void
t_leaf_hook_no_gradient(void)
{
    tp_tensor *u = leaf(vec(3)), *out = vec(3), *g = vec(3);
    tp_node *node;
    TP_CHECK_OK(tp_node_create(&no_grad_ops, NULL, 1, &u, 1, &node, NULL),
                NULL);
    TP_CHECK_OK(tp_tensor_set_grad_fn(out, node, 0, NULL), NULL);
    tp_node_unref(node);

    struct rec r = {0};
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.retain_graph = true;
    o.on_leaf_grad = rec_hook;
    o.on_leaf_grad_arg = &r;
    tp_backward_root root = {.tensor = out, .grad = g};
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, NULL), NULL);
    TP_CHECK_EQ(r.n, 1);
    TP_CHECK(r.leaf[0] == u && r.grad[0] == NULL);
    TP_CHECK(tp_tensor_grad(u) == NULL);
    rec_clear(&r);

    tp_tensor *g0 = vec(3);
    tp_backward_root lr = {.tensor = u, .grad = g0};
    TP_CHECK_OK(tp_backward_run(NULL, 1, &lr, NULL), NULL);
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, NULL), NULL);
    TP_CHECK_EQ(r.n, 1);
    rec_check_final(&r, 0, tp_tensor_grad(u), "earlier gradient");
    rec_clear(&r);
    tp_tensor_unref(g0);
    tp_tensor_unref(g);
    tp_tensor_unref(out);
    tp_tensor_unref(u);
}

// Out of memory at each allocation of a pass with the hook in turn: every
// failure is TP_ENOMEM (and leaks nothing, under ASan), no leaf is ever
// reported twice, and a pass that succeeds reports every leaf.
static void
t_leaf_hook_out_of_memory(void)
{
    if (!TP_HAVE_TEST_FAULTS) {
        tp_test_skip("built without TP_TEST_FAULTS");
    }
    tp_tensor *x = mat(4, 3), *t = mat(4, 2);
    tp_tensor *p[4] = {leaf(mat(3, 5)), leaf(vec(5)), leaf(mat(5, 2)),
                       leaf(vec(2))};
    struct rec r = {.no_copy = true};
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.retain_graph = true;
    o.on_leaf_grad = rec_hook;
    o.on_leaf_grad_arg = &r;
    tp_tensor *loss = mlp_loss(x, t, p);
    tp_backward_root root = {.tensor = loss};
    tp__alloc_fail_after(0);
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, NULL), NULL);
    long total = tp__alloc_fail_after(0);
    rec_clear(&r);
    int failures = 0;
    for (long nth = 1; nth <= total + 1; nth++) {
        for (int i = 0; i < 4; i++) {
            tp_tensor_zero_grad(p[i]);
        }
        tp_error *err = NULL;
        tp__alloc_fail_after(nth);
        tp_status st = tp_backward_run(&o, 1, &root, &err);
        tp__alloc_fail_after(0);
        if (st == TP_OK) {
            TP_CHECK_EQ(r.n, 4);
        } else {
            TP_CHECKF(st == TP_ENOMEM, "allocation %ld: %s", nth,
                      tp_error_message(err));
            TP_CHECK(r.n < 4);
            failures++;
        }
        for (int i = 0; i < r.n; i++) {
            for (int k = i + 1; k < r.n; k++) {
                TP_CHECK(r.leaf[i] != r.leaf[k]);
            }
        }
        rec_clear(&r);
        tp_error_unref(err);
    }
    TP_CHECK(failures > 0);
    tp_tensor_unref(loss);
    for (int i = 0; i < 4; i++) {
        tp_tensor_unref(p[i]);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(t);
}

// A copy shares the leaves and gradient tensors of the moment; later
// passes into the source replace its entries and leave the copy alone.
static void
t_grad_map_copy(void)
{
    tp_tensor *x = leaf(vec(3)), *w = leaf(vec(3)), *p, *l;
    tp_grad_map *src, *dst, *empty;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_grad_map_create(&src), NULL);

    TP_CHECK_OK(tp_grad_map_copy(src, &empty, &err), err);
    TP_CHECK_EQ(tp_grad_map_size(empty), 0);
    tp_grad_map_destroy(empty);
    TP_CHECK_EQ(tp_grad_map_copy(NULL, &empty, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;
    TP_CHECK_EQ(tp_grad_map_copy(src, NULL, &err), TP_EINVAL);
    tp_error_unref(err);
    err = NULL;

    // l = sum(x * w): dl/dx = w, dl/dw = x.
    TP_CHECK_OK(tp_mul(x, w, &p, NULL), NULL);
    TP_CHECK_OK(tp_sum(p, &l, NULL), NULL);
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.grads = src;
    o.retain_graph = true;
    tp_backward_root root = {.tensor = l};
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, &err), err);

    TP_CHECK_OK(tp_grad_map_copy(src, &dst, &err), err);
    TP_CHECK_EQ(tp_grad_map_size(dst), 2);
    for (size_t i = 0; i < 2; i++) {
        tp_tensor *sk, *sg, *dk, *dg;
        TP_CHECK_OK(tp_grad_map_entry(src, i, &sk, &sg), NULL);
        TP_CHECK_OK(tp_grad_map_entry(dst, i, &dk, &dg), NULL);
        TP_CHECK(sk == dk && sg == dg);
    }
    tp_tensor *gx = tp_grad_map_get(dst, x), *gw = tp_grad_map_get(dst, w);

    // Another pass into src: src doubles, dst keeps its tensors and values.
    TP_CHECK_OK(tp_backward_run(&o, 1, &root, &err), err);
    TP_CHECK(tp_grad_map_get(src, x) != gx && tp_grad_map_get(src, w) != gw);
    TP_CHECK(tp_grad_map_get(dst, x) == gx && tp_grad_map_get(dst, w) == gw);
    for (int i = 0; i < 3; i++) {
        TP_CHECK(at(tp_grad_map_get(src, x), i) == 2 * at(w, i));
        TP_CHECK(at(gx, i) == at(w, i));
        TP_CHECK(at(gw, i) == at(x, i));
    }

    // The copy holds its own references: it outlives the source.
    tp_grad_map_destroy(src);
    TP_CHECK(at(tp_grad_map_get(dst, w), 0) == at(x, 0));
    tp_grad_map_destroy(dst);
    tp_tensor_unref(p);
    tp_tensor_unref(l);
    tp_tensor_unref(x);
    tp_tensor_unref(w);
}

AG_LEAK_CHECKED(t_leaf_hook_mlp)
AG_LEAK_CHECKED(t_leaf_hook_shared_leaf)
AG_LEAK_CHECKED(t_leaf_hook_no_gradient)
AG_LEAK_CHECKED(t_leaf_hook_out_of_memory)
AG_LEAK_CHECKED(t_grad_map_copy)

static const tp_test_case cases[] = {
    AG_TEST(t_leaf_hook_mlp),         AG_TEST(t_leaf_hook_shared_leaf),
    AG_TEST(t_leaf_hook_no_gradient), AG_TEST(t_leaf_hook_out_of_memory),
    AG_TEST(t_grad_map_copy),
};

TP_TEST_MAIN(cases)
