// SPDX-License-Identifier: Apache-2.0
// optim_test.c - the local optimizers (optim.h): 20 steps of every rule
// and several option combinations against PyTorch 1.13 (optim_ref.h, made
// by gen_optim_ref.py), in f64 and f32, from .grad and from a gradient
// map; defaults; option and parameter checks; parameters without a
// gradient; zero_grad; a failed step changes nothing.

#include <math.h>
#include <stddef.h>

#include <tpipe/autograd.h>
#include <tpipe/optim.h>

#include "alloc.h" // tp__alloc_fail_after
#include "optim_ref.h"
#include "tensor_impl.h"
#include "tp_test.h"

// Tolerances against PyTorch. The kernels make the operations and
// roundings of PyTorch's for-loop implementations (optim/rules.c), and on
// x86-64 with glibc every value of both runs is identical to PyTorch's
// to the bit; the checks allow 1e-6 relative in f64 (other libms, CPUs
// without FMA in PyTorch's build), and 1e-5 relative plus 1e-6 absolute
// in f32, where one rounding more or less per operation grows to about
// 8e-6 over 20 steps (measured with plain multiply-adds).
#define TOL64_REL 1e-6
#define TOL64_ABS 1e-12
#define TOL32_REL 1e-5
#define TOL32_ABS 1e-6

// ---- helpers ----------------------------------------------------------------

static double *
field(tp_optim_options *o, const char *name)
{
    static const struct {
        const char *name;
        size_t off;
    } fs[] = {
        {"lr", offsetof(tp_optim_options, lr)},
        {"weight_decay", offsetof(tp_optim_options, weight_decay)},
        {"momentum", offsetof(tp_optim_options, momentum)},
        {"dampening", offsetof(tp_optim_options, dampening)},
        {"beta1", offsetof(tp_optim_options, beta1)},
        {"beta2", offsetof(tp_optim_options, beta2)},
        {"eps", offsetof(tp_optim_options, eps)},
        {"lr_decay", offsetof(tp_optim_options, lr_decay)},
        {"initial_accumulator_value",
         offsetof(tp_optim_options, initial_accumulator_value)},
        {"alpha", offsetof(tp_optim_options, alpha)},
    };
    for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++) {
        if (strcmp(fs[i].name, name) == 0) {
            return (double *)((char *)o + fs[i].off);
        }
    }
    return NULL;
}

static bool *
flag(tp_optim_options *o, const char *name)
{
    if (strcmp(name, "nesterov") == 0) {
        return &o->nesterov;
    }
    if (strcmp(name, "amsgrad") == 0) {
        return &o->amsgrad;
    }
    if (strcmp(name, "centered") == 0) {
        return &o->centered;
    }
    if (strcmp(name, "maximize") == 0) {
        return &o->maximize;
    }
    return NULL;
}

static void
case_options(const ref_case *c, tp_optim_options *o)
{
    tp_optim_options_init(o, c->kind);
    o->lr = c->lr;
    o->weight_decay = c->weight_decay;
    o->momentum = c->momentum;
    o->dampening = c->dampening;
    o->nesterov = c->nesterov;
    o->beta1 = c->beta1;
    o->beta2 = c->beta2;
    o->eps = c->eps;
    o->amsgrad = c->amsgrad;
    o->lr_decay = c->lr_decay;
    o->initial_accumulator_value = c->initial_accumulator_value;
    o->alpha = c->alpha;
    o->centered = c->centered;
    o->maximize = c->maximize;
}

// A leaf requiring grad of @dt holding @v (@n values) in shape @shape.
static tp_tensor *
param(tp_dtype dt, int ndim, const int64_t *shape, const double *v, int64_t n)
{
    tp_tensor *t = NULL;
    tp_error *err = NULL;
    TP_CHECK_OK(tp_tensor_empty(dt, ndim, shape, &t, &err), err);
    TP_CHECK_EQ(tp_tensor_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        TP_CHECK_OK(tp_tensor_set_item(t, i, v[i]), NULL);
    }
    TP_CHECK_OK(tp_tensor_set_requires_grad(t, true, &err), err);
    return t;
}

static double
at(const tp_tensor *t, int64_t i)
{
    double v = 0;
    TP_CHECK_OK(tp_tensor_item(t, i, &v), NULL);
    return v;
}

// Gives @p the gradient G + 0.5 * p (@G: its numel values, converted to
// p's dtype first, as the generator does) through a backward pass of
// sum(p * w), w = G + 0.5 * p: into .grad, or into @map when not NULL.
static void
give_grad(tp_tensor *p, const double *G, tp_grad_map *map)
{
    tp_error *err = NULL;
    int64_t n = tp_tensor_numel(p);
    tp_tensor *w = NULL, *m = NULL, *s = NULL;
    TP_CHECK_OK(tp_tensor_empty(tp_tensor_dtype(p), tp_tensor_ndim(p),
                                tp_tensor_shape(p), &w, &err),
                err);
    if (tp_tensor_dtype(p) == TP_F32) {
        const float *pv = tp_tensor_data(p);
        float *wv = tp_tensor_data(w);
        for (int64_t i = 0; i < n; i++) {
            wv[i] = (float)G[i] + 0.5f * pv[i];
        }
    } else {
        const double *pv = tp_tensor_data(p);
        double *wv = tp_tensor_data(w);
        for (int64_t i = 0; i < n; i++) {
            wv[i] = G[i] + 0.5 * pv[i];
        }
    }
    tp_tensor *g0 = map != NULL ? tp_grad_map_get(map, p) : tp_tensor_grad(p);
    TP_CHECK_OK(tp_mul(p, w, &m, &err), err);
    TP_CHECK_OK(tp_sum(m, &s, &err), err);
    tp_backward_options o;
    tp_backward_options_init(&o);
    o.grads = map;
    tp_backward_root r = {.tensor = s};
    TP_CHECK_OK(tp_backward_run(&o, 1, &r, &err), err);
    // The gradient is exactly w (d sum(p * w) / dp = 1 * w), unless it
    // was added to an earlier one.
    tp_tensor *g = map != NULL ? tp_grad_map_get(map, p) : tp_tensor_grad(p);
    TP_CHECK(g != NULL);
    for (int64_t i = 0; i < n && g0 == NULL; i++) {
        TP_CHECK(at(g, i) == at(w, i));
    }
    tp_tensor_unref(s);
    tp_tensor_unref(m);
    tp_tensor_unref(w);
}

// What a run saw: the largest relative difference of elements with
// |want| >= 0.01 (a relative figure of elements near 0 says little: the
// absolute tolerance covers those), and how many values were identical.
typedef struct diff_stats {
    double worst;
    long same, total;
} diff_stats;

// Checks |got - want| <= rel * |want| + abs_tol.
static void
check_close(const char *what, const char *name, int t, int64_t i, double got,
            double want, double rel, double abs_tol, diff_stats *ds)
{
    double d = fabs(got - want);
    if (fabs(want) >= 0.01 && d / fabs(want) > ds->worst) {
        ds->worst = d / fabs(want);
    }
    ds->same += got == want;
    ds->total++;
    TP_CHECKF(d <= rel * fabs(want) + abs_tol,
              "%s %s: step %d element %" PRId64 ": %.17g, PyTorch %.17g "
              "(off by %.3g)",
              name, what, t, i, got, want, d);
}

// C's value @i at the start, and its gradient's G at step @t (exact
// dyadic fractions: the same formulas as gen_optim_ref.py's).
static void
c_start(double *v)
{
    for (int i = 0; i < REF_NC; i++) {
        v[i] = REF_C0(i);
    }
}

static void
c_grad(int t, double *g)
{
    for (int i = 0; i < REF_NC; i++) {
        g[i] = REF_GC(t, i);
    }
}

static void
check_all(const char *what, const char *name, int t, const tp_tensor *p,
          const double *want, int64_t n, bool f32, diff_stats *ds)
{
    for (int64_t i = 0; i < n; i++) {
        check_close(what, name, t, i, at(p, i), want[i],
                    f32 ? TOL32_REL : TOL64_REL, f32 ? TOL32_ABS : TOL64_ABS,
                    ds);
    }
}

// Runs case @c for REF_STEPS steps in @dt, gradients from .grad or (with
// @use_map) from a fresh map per step; checks the steps the reference
// has (f64: A and B after each step; the rest after the last) and adds
// what it saw to @ds.
static void
run_case(const ref_case *c, tp_dtype dt, bool use_map, diff_stats *ds)
{
    tp_error *err = NULL;
    int64_t sb[1] = {REF_NB}, sc[1] = {REF_NC};
    double c0[REF_NC], gc[REF_NC];
    c_start(c0);
    tp_tensor *a = param(dt, 2, ref_shape_a, ref_a0, REF_NA);
    tp_tensor *b = param(dt, 1, sb, ref_b0, REF_NB);
    tp_tensor *cp = param(dt, 1, sc, c0, REF_NC);
    tp_tensor *ps[3] = {a, b, cp};
    tp_optim_options o;
    case_options(c, &o);
    tp_optim *opt = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 3, ps, &opt, &err), err);
    bool f32 = dt == TP_F32;
    for (int t = 1; t <= REF_STEPS; t++) {
        tp_grad_map *map = NULL;
        if (use_map) {
            TP_CHECK_OK(tp_grad_map_create(&map), NULL);
        } else {
            tp_optim_zero_grad(opt);
        }
        give_grad(a, ref_ga[t - 1], map);
        if (!REF_B_SKIP(t)) {
            give_grad(b, ref_gb[t - 1], map);
        }
        c_grad(t, gc);
        give_grad(cp, gc, map);
        TP_CHECK_OK(tp_optim_step(opt, map, &err), err);
        tp_grad_map_destroy(map);
        if (!f32) {
            check_all("A", c->name, t, a, c->a64[t - 1], REF_NA, f32, ds);
            check_all("B", c->name, t, b, c->b64[t - 1], REF_NB, f32, ds);
        }
    }
    if (f32) {
        check_all("A", c->name, REF_STEPS, a, c->a32, REF_NA, f32, ds);
        check_all("B", c->name, REF_STEPS, b, c->b32, REF_NB, f32, ds);
    }
    check_all("C", c->name, REF_STEPS, cp, f32 ? c->c32 : c->c64, REF_NC, f32,
              ds);
    tp_optim_destroy(opt);
    // The optimizer dropped its references: ours are the last.
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(cp);
}

// ---- against PyTorch --------------------------------------------------------

static void
run_all(tp_dtype dt, bool use_map)
{
    diff_stats ds = {0};
    size_t n = sizeof(ref_cases) / sizeof(ref_cases[0]);
    for (size_t k = 0; k < n; k++) {
        run_case(&ref_cases[k], dt, use_map, &ds);
    }
    printf("  %zu cases, %s, %s: %ld of %ld values identical to PyTorch's, "
           "largest relative difference %.3g\n",
           n, tp_dtype_name(dt), use_map ? "gradient map" : ".grad", ds.same,
           ds.total, ds.worst);
}

static void
t_pytorch_f64_grad(void)
{
    run_all(TP_F64, false);
}

static void
t_pytorch_f64_map(void)
{
    run_all(TP_F64, true);
}

static void
t_pytorch_f32_grad(void)
{
    run_all(TP_F32, false);
}

static void
t_pytorch_f32_map(void)
{
    run_all(TP_F32, true);
}

// .grad and a map holding the same gradients give bit-identical steps.
static void
t_grad_and_map_agree(void)
{
    tp_error *err = NULL;
    const ref_case *c = &ref_cases[0];
    for (size_t k = 0; k < sizeof(ref_cases) / sizeof(ref_cases[0]); k++) {
        if (strcmp(ref_cases[k].name, "adam_amsgrad") == 0) {
            c = &ref_cases[k];
        }
    }
    int64_t sb[1] = {REF_NB};
    tp_tensor *p1 = param(TP_F64, 1, sb, ref_b0, REF_NB);
    tp_tensor *p2 = param(TP_F64, 1, sb, ref_b0, REF_NB);
    tp_optim_options o;
    case_options(c, &o);
    tp_optim *o1 = NULL, *o2 = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 1, &p1, &o1, &err), err);
    TP_CHECK_OK(tp_optim_create(&o, 1, &p2, &o2, &err), err);
    for (int t = 1; t <= 5; t++) {
        tp_grad_map *map = NULL;
        TP_CHECK_OK(tp_grad_map_create(&map), NULL);
        tp_optim_zero_grad(o1);
        give_grad(p1, ref_gb[t - 1], NULL);
        give_grad(p2, ref_gb[t - 1], map);
        // p2's .grad is empty: the map is the only source.
        TP_CHECK(tp_tensor_grad(p2) == NULL);
        TP_CHECK_OK(tp_optim_step(o1, NULL, &err), err);
        TP_CHECK_OK(tp_optim_step(o2, map, &err), err);
        tp_grad_map_destroy(map);
        for (int64_t i = 0; i < REF_NB; i++) {
            TP_CHECK(at(p1, i) == at(p2, i));
            // The reference's B has no gradient at step 3.
            if (t < 3) {
                TP_CHECK(fabs(at(p1, i) - c->b64[t - 1][i]) <
                         TOL64_REL * fabs(c->b64[t - 1][i]));
            }
        }
    }
    // A map that does not hold p1 leaves it alone, even with a .grad.
    double before = at(p1, 0);
    tp_grad_map *empty = NULL;
    TP_CHECK_OK(tp_grad_map_create(&empty), NULL);
    TP_CHECK(tp_tensor_grad(p1) != NULL);
    TP_CHECK_OK(tp_optim_step(o1, empty, &err), err);
    TP_CHECK(at(p1, 0) == before);
    tp_grad_map_destroy(empty);
    tp_optim_destroy(o1);
    tp_optim_destroy(o2);
    tp_tensor_unref(p1);
    tp_tensor_unref(p2);
}

// ---- defaults and names -----------------------------------------------------

static void
t_defaults(void)
{
    for (size_t i = 0; i < sizeof(ref_defaults) / sizeof(ref_defaults[0]);
         i++) {
        const ref_default *d = &ref_defaults[i];
        tp_optim_options o;
        tp_optim_options_init(&o, d->kind);
        TP_CHECK_EQ(o.size, sizeof(o));
        TP_CHECK_EQ(o.kind, d->kind);
        double *f = field(&o, d->field);
        bool *b = flag(&o, d->field);
        TP_CHECKF(f != NULL || b != NULL, "unknown field %s", d->field);
        double v = f != NULL ? *f : (*b ? 1 : 0);
        TP_CHECKF((isnan(v) && isnan(d->value)) || v == d->value,
                  "%s default %s: %.17g, PyTorch %.17g",
                  tp_optim_kind_name(d->kind), d->field, v, d->value);
    }
    static const char *const names[] = {"sgd", "adagrad", "adam", "adamw",
                                        "rmsprop"};
    for (int k = 0; k < 5; k++) {
        TP_CHECK(strcmp(tp_optim_kind_name((tp_optim_kind)k), names[k]) == 0);
    }
    TP_CHECK(strcmp(tp_optim_kind_name((tp_optim_kind)99), "?") == 0);
}

// ---- option checks ----------------------------------------------------------

static void
expect_bad(const tp_optim_options *o, tp_status want, const char *needle)
{
    tp_error *err = NULL;
    tp_optim *opt = NULL;
    int64_t s[1] = {2};
    double v[2] = {1, 2};
    tp_tensor *p = param(TP_F64, 1, s, v, 2);
    tp_status st = tp_optim_create(o, 1, &p, &opt, &err);
    TP_CHECKF(st == want, "expected %s for \"%s\", got %s",
              tp_status_name(want), needle, tp_status_name(st));
    TP_CHECK(opt == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    tp_error_unref(err);
    tp_tensor_unref(p);
}

static void
t_option_checks(void)
{
    static const struct {
        tp_optim_kind kind;
        const char *field;
        double value;
        const char *want;
    } bad[] = {
        {TP_OPTIM_SGD, "lr", -0.1, "optim sgd: invalid lr -0.1"},
        {TP_OPTIM_SGD, "momentum", -1, "invalid momentum -1"},
        {TP_OPTIM_SGD, "weight_decay", -0.5, "invalid weight_decay -0.5"},
        {TP_OPTIM_ADAGRAD, "lr", -1, "optim adagrad: invalid lr -1"},
        {TP_OPTIM_ADAGRAD, "lr_decay", -0.25, "invalid lr_decay -0.25"},
        {TP_OPTIM_ADAGRAD, "weight_decay", -2, "invalid weight_decay -2"},
        {TP_OPTIM_ADAGRAD, "initial_accumulator_value", -3,
         "invalid initial_accumulator_value -3"},
        {TP_OPTIM_ADAGRAD, "eps", -1e-3, "invalid eps -0.001"},
        {TP_OPTIM_ADAM, "lr", NAN, "optim adam: invalid lr nan"},
        {TP_OPTIM_ADAM, "eps", -1, "invalid eps -1"},
        {TP_OPTIM_ADAM, "beta1", 1, "invalid beta1 1: it must be in [0, 1)"},
        {TP_OPTIM_ADAM, "beta1", -0.1, "invalid beta1 -0.1"},
        {TP_OPTIM_ADAM, "beta2", 1.5, "invalid beta2 1.5"},
        {TP_OPTIM_ADAM, "weight_decay", -1, "invalid weight_decay -1"},
        {TP_OPTIM_ADAMW, "weight_decay", -0.01,
         "optim adamw: invalid "
         "weight_decay -0.01"},
        {TP_OPTIM_ADAMW, "beta2", NAN, "invalid beta2 nan"},
        {TP_OPTIM_RMSPROP, "lr", -1, "optim rmsprop: invalid lr -1"},
        {TP_OPTIM_RMSPROP, "alpha", -0.5, "invalid alpha -0.5"},
        {TP_OPTIM_RMSPROP, "eps", -1, "invalid eps -1"},
        {TP_OPTIM_RMSPROP, "momentum", -0.9, "invalid momentum -0.9"},
        {TP_OPTIM_RMSPROP, "weight_decay", -1, "invalid weight_decay -1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tp_optim_options o;
        tp_optim_options_init(&o, bad[i].kind);
        if (bad[i].kind == TP_OPTIM_SGD && strcmp(bad[i].field, "lr") != 0) {
            o.lr = 0.1;
        }
        *field(&o, bad[i].field) = bad[i].value;
        expect_bad(&o, TP_EINVAL, bad[i].want);
    }
    tp_optim_options o;
    // SGD: lr is required; nesterov needs momentum and no dampening.
    tp_optim_options_init(&o, TP_OPTIM_SGD);
    expect_bad(&o, TP_EINVAL, "optim sgd: lr is required");
    o.lr = 0.1;
    o.nesterov = true;
    expect_bad(&o, TP_EINVAL,
               "nesterov needs momentum > 0 and dampening 0 "
               "(momentum 0, dampening 0)");
    o.momentum = 0.9;
    o.dampening = 0.1;
    expect_bad(&o, TP_EINVAL, "(momentum 0.9, dampening 0.1)");
    // Unknown kind, missing or short options.
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    o.kind = (tp_optim_kind)7;
    expect_bad(&o, TP_EINVAL, "optim: unknown kind 7");
    expect_bad(NULL, TP_EINVAL, "options missing or too short (size 0");
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    o.size = 4;
    expect_bad(&o, TP_EINVAL, "too short (size 4");

    // Options a kind does not use are not checked (PyTorch has no such
    // argument); zero values at the edges are accepted.
    tp_error *err = NULL;
    tp_optim *opt = NULL;
    int64_t s[1] = {1};
    double v[1] = {1};
    tp_tensor *p = param(TP_F64, 1, s, v, 1);
    tp_optim_options_init(&o, TP_OPTIM_SGD);
    o.lr = 0;
    o.beta1 = 5;
    o.alpha = -1;
    o.dampening = -3; // PyTorch does not check dampening either
    TP_CHECK_OK(tp_optim_create(&o, 1, &p, &opt, &err), err);
    tp_optim_destroy(opt);
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    o.beta1 = 0;
    o.beta2 = 0;
    o.momentum = -1;
    TP_CHECK_OK(tp_optim_create(&o, 1, &p, &opt, &err), err);
    tp_optim_destroy(opt);
    // A shorter (older) options struct: the missing fields take the
    // defaults of its kind.
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    o.size = offsetof(tp_optim_options, lr);
    o.lr = -5; // beyond the size: not read
    TP_CHECK_OK(tp_optim_create(&o, 1, &p, &opt, &err), err);
    tp_optim_destroy(opt);
    tp_tensor_unref(p);
}

// ---- parameter checks -------------------------------------------------------

static void
expect_bad_params(size_t n, tp_tensor *const *ps, tp_status want,
                  const char *needle)
{
    tp_error *err = NULL;
    tp_optim *opt = NULL;
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    tp_status st = tp_optim_create(&o, n, ps, &opt, &err);
    TP_CHECKF(st == want, "expected %s for \"%s\", got %s",
              tp_status_name(want), needle, tp_status_name(st));
    TP_CHECK(opt == NULL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), needle);
    tp_error_unref(err);
}

static void
t_param_checks(void)
{
    tp_error *err = NULL;
    int64_t s[2] = {2, 3};
    double v[6] = {1, 2, 3, 4, 5, 6};
    tp_tensor *p = param(TP_F64, 2, s, v, 6);
    expect_bad_params(0, &p, TP_EINVAL,
                      "optim adam: got an empty parameter "
                      "list");
    tp_tensor *dup[3] = {p, NULL, p};
    expect_bad_params(2, dup, TP_EINVAL, "parameter 1 is NULL");
    dup[1] = p;
    expect_bad_params(2, dup, TP_EINVAL, "parameter 1 is parameter 0 again");

    // Not a leaf: an op's output.
    tp_tensor *y = NULL;
    TP_CHECK_OK(tp_mul_scalar(p, 2, &y, &err), err);
    expect_bad_params(1, &y, TP_EINVAL,
                      "parameter 0 [2, 3] f64 is not a leaf that requires "
                      "grad");
    tp_tensor_unref(y);
    // A leaf that does not require grad.
    tp_tensor *z = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 2, s, &z, &err), err);
    tp_tensor *pz[2] = {p, z};
    expect_bad_params(2, pz, TP_EINVAL,
                      "parameter 1 [2, 3] f32 is not a leaf that requires "
                      "grad");
    tp_tensor_unref(z);
    // Integer dtype.
    tp_tensor *i = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_I64, 2, s, &i, &err), err);
    expect_bad_params(1, &i, TP_ENOTSUP,
                      "parameter 0 [2, 3] i64: only f32 and f64");
    tp_tensor_unref(i);
    // A strided leaf view (as_strided makes leaves).
    tp_tensor *tr = NULL;
    int64_t ts[2] = {3, 2}, st[2] = {1, 3};
    TP_CHECK_OK(tp_tensor_as_strided(p, 2, ts, st, 0, &tr, &err), err);
    TP_CHECK_OK(tp_tensor_set_requires_grad(tr, true, &err), err);
    expect_bad_params(1, &tr, TP_EINVAL, "is not contiguous");
    tp_tensor_unref(tr);
    // Mixed dtypes are fine.
    tp_tensor *q = param(TP_F32, 1, s, v, 2);
    tp_tensor *pq[2] = {p, q};
    tp_optim *opt = NULL;
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_SGD);
    o.lr = 0.5;
    TP_CHECK_OK(tp_optim_create(&o, 2, pq, &opt, &err), err);
    give_grad(p, v, NULL);
    give_grad(q, v, NULL);
    TP_CHECK_OK(tp_optim_step(opt, NULL, &err), err);
    // p - 0.5 * (v + 0.5 p) = 0.75 p - 0.5 v = 0.25 v here.
    TP_CHECK(at(p, 5) == 0.25 * 6);
    TP_CHECK(at(q, 1) == 0.25 * 2);
    tp_optim_destroy(opt);
    tp_tensor_unref(q);
    tp_tensor_unref(p);
    // NULL is fine for destroy and zero_grad; a NULL optimizer is not.
    tp_optim_destroy(NULL);
    tp_optim_zero_grad(NULL);
    TP_CHECK(tp_optim_step(NULL, NULL, &err) == TP_EINVAL);
    tp_error_unref(err);
}

// ---- skipping, zero_grad, failures ------------------------------------------

// A parameter without a gradient keeps its value and its state: when it
// gets one later, its first step is a first step (Adam's bias correction
// of step 1), as in PyTorch.
static void
t_skip_without_grad(void)
{
    tp_error *err = NULL;
    int64_t s[1] = {REF_NB};
    tp_tensor *a = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *b = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *ps[2] = {a, b};
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_ADAM);
    o.lr = 0.01;
    tp_optim *opt = NULL, *fresh = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 2, ps, &opt, &err), err);
    for (int t = 1; t <= 4; t++) {
        tp_optim_zero_grad(opt);
        give_grad(a, ref_gb[t - 1], NULL);
        TP_CHECK_OK(tp_optim_step(opt, NULL, &err), err);
        for (int64_t i = 0; i < REF_NB; i++) {
            TP_CHECK(at(b, i) == ref_b0[i]); // untouched, bit for bit
        }
        TP_CHECK(at(a, 0) != ref_b0[0]);
    }
    // b's first gradient: the same update as a fresh optimizer's first.
    tp_tensor *c = param(TP_F64, 1, s, ref_b0, REF_NB);
    TP_CHECK_OK(tp_optim_create(&o, 1, &c, &fresh, &err), err);
    tp_optim_zero_grad(opt);
    give_grad(b, ref_gb[0], NULL);
    give_grad(c, ref_gb[0], NULL);
    TP_CHECK_OK(tp_optim_step(opt, NULL, &err), err);
    TP_CHECK_OK(tp_optim_step(fresh, NULL, &err), err);
    for (int64_t i = 0; i < REF_NB; i++) {
        TP_CHECK(at(b, i) == at(c, i));
    }
    tp_optim_destroy(fresh);
    tp_optim_destroy(opt);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(c);
}

static void
t_zero_grad(void)
{
    tp_error *err = NULL;
    int64_t s[1] = {REF_NB};
    tp_tensor *a = param(TP_F32, 1, s, ref_b0, REF_NB);
    tp_tensor *b = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *ps[2] = {a, b};
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_RMSPROP);
    tp_optim *opt = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 2, ps, &opt, &err), err);
    give_grad(a, ref_gb[0], NULL);
    give_grad(b, ref_gb[0], NULL);
    TP_CHECK(tp_tensor_grad(a) != NULL && tp_tensor_grad(b) != NULL);
    tp_optim_zero_grad(opt);
    TP_CHECK(tp_tensor_grad(a) == NULL && tp_tensor_grad(b) == NULL);
    // Nothing to apply: the parameters stay.
    TP_CHECK_OK(tp_optim_step(opt, NULL, &err), err);
    for (int64_t i = 0; i < REF_NB; i++) {
        TP_CHECK(at(a, i) == (double)(float)ref_b0[i]);
        TP_CHECK(at(b, i) == ref_b0[i]);
    }
    // Without zero_grad, gradients accumulate as in PyTorch: the step
    // uses the sum of two passes.
    give_grad(b, ref_gb[0], NULL);
    double g0 = at(tp_tensor_grad(b), 0);
    give_grad(b, ref_gb[0], NULL);
    TP_CHECK(at(tp_tensor_grad(b), 0) == 2 * g0);
    tp_optim_destroy(opt);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// A gradient of another shape or dtype fails the step, naming the
// parameter, and no parameter changes (the checks come first).
static void
t_bad_gradient(void)
{
    tp_error *err = NULL;
    int64_t s[1] = {REF_NB}, s3[1] = {3};
    tp_tensor *a = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *b = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *ps[2] = {a, b};
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_SGD);
    o.lr = 0.1;
    o.momentum = 0.9;
    tp_optim *opt = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 2, ps, &opt, &err), err);
    give_grad(a, ref_gb[0], NULL);
    // The engine never makes such a gradient: put one in place directly.
    tp_tensor *bad = NULL;
    TP_CHECK_OK(tp_tensor_zeros(TP_F64, 1, s3, &bad, &err), err);
    b->t_grad = bad;
    TP_CHECK(tp_optim_step(opt, NULL, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err),
                          "optim sgd step: parameter 1 [4] f64 has a "
                          "gradient [3] f64 of another shape or dtype (from "
                          ".grad)");
    tp_error_unref(err);
    err = NULL;
    TP_CHECK(at(a, 0) == ref_b0[0]);
    tp_tensor_unref(bad);
    TP_CHECK_OK(tp_tensor_zeros(TP_F32, 1, s, &bad, &err), err);
    b->t_grad = bad;
    TP_CHECK(tp_optim_step(opt, NULL, &err) == TP_EINVAL);
    TP_CHECK_STR_CONTAINS(tp_error_message(err), "gradient [4] f32");
    tp_error_unref(err);
    err = NULL;
    tp_tensor_zero_grad(b); // drops bad's reference
    // Now a steps, as a first step: buf = grad.
    TP_CHECK_OK(tp_optim_step(opt, NULL, &err), err);
    double want = ref_b0[0] - 0.1 * (ref_gb[0][0] + 0.5 * ref_b0[0]);
    TP_CHECK(fabs(at(a, 0) - want) < 1e-15);
    TP_CHECK(at(b, 0) == ref_b0[0]);
    tp_optim_destroy(opt);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// Out of memory at every allocation of a first step (the state): each
// failure is TP_ENOMEM and changes nothing; the step that finally works
// is the step a fresh optimizer makes.
static void
t_step_out_of_memory(void)
{
    tp_error *err = NULL;
    int64_t s[1] = {REF_NB};
    tp_optim_options o;
    tp_optim_options_init(&o, TP_OPTIM_ADAMW);
    o.amsgrad = true;
    tp_tensor *ref = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_optim *ro = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 1, &ref, &ro, &err), err);
    give_grad(ref, ref_gb[0], NULL);
    TP_CHECK_OK(tp_optim_step(ro, NULL, &err), err);

    tp_tensor *a = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *b = param(TP_F64, 1, s, ref_b0, REF_NB);
    tp_tensor *ps[2] = {a, b};
    tp_optim *opt = NULL;
    TP_CHECK_OK(tp_optim_create(&o, 2, ps, &opt, &err), err);
    give_grad(a, ref_gb[0], NULL);
    give_grad(b, ref_gb[0], NULL);
    int failures = 0;
    for (long nth = 1;; nth++) {
        tp__alloc_fail_after(nth);
        tp_status st = tp_optim_step(opt, NULL, &err);
        tp__alloc_fail_after(0);
        if (st == TP_OK) {
            break;
        }
        failures++;
        TP_CHECKF(st == TP_ENOMEM, "allocation %ld: %s", nth,
                  tp_error_message(err));
        tp_error_unref(err);
        err = NULL;
        for (int64_t i = 0; i < REF_NB; i++) {
            TP_CHECK(at(a, i) == ref_b0[i] && at(b, i) == ref_b0[i]);
        }
        TP_CHECK(nth < 100);
    }
    TP_CHECK(failures >= 6); // 2 parameters x 3 buffers, at least
    for (int64_t i = 0; i < REF_NB; i++) {
        TP_CHECK(at(a, i) == at(ref, i) && at(b, i) == at(ref, i));
    }
    tp_optim_destroy(opt);
    tp_optim_destroy(ro);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    tp_tensor_unref(ref);
}

static const tp_test_case cases[] = {
    TP_TEST_CASE(t_pytorch_f64_grad),   TP_TEST_CASE(t_pytorch_f64_map),
    TP_TEST_CASE(t_pytorch_f32_grad),   TP_TEST_CASE(t_pytorch_f32_map),
    TP_TEST_CASE(t_grad_and_map_agree), TP_TEST_CASE(t_defaults),
    TP_TEST_CASE(t_option_checks),      TP_TEST_CASE(t_param_checks),
    TP_TEST_CASE(t_skip_without_grad),  TP_TEST_CASE(t_zero_grad),
    TP_TEST_CASE(t_bad_gradient),       TP_TEST_CASE(t_step_out_of_memory),
};

TP_TEST_MAIN(cases)
