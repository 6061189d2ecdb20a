// SPDX-License-Identifier: Apache-2.0
// tensor_rand.c - random generators (xoshiro256**, seeded by
// splitmix64) and the tensors they fill (rand, randn).

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "error.h"
#include "platform.h"
#include "tensor_impl.h"

// ---- random ----------------------------------------------------------------

// xoshiro256** seeded through splitmix64: small, fast and reproducible
// across machines.
struct tp_generator {
    uint64_t g_s[4];
    bool g_have_spare; // Box-Muller makes normals in pairs
    double g_spare;
};

static uint64_t
splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t
rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t
gen_next(tp_generator *g)
{
    uint64_t *s = g->g_s;
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

// Uniform in [0, 1).
static double
gen_uniform(tp_generator *g)
{
    return (double)(gen_next(g) >> 11) * 0x1.0p-53;
}

static double
gen_normal(tp_generator *g)
{
    if (g->g_have_spare) {
        g->g_have_spare = false;
        return g->g_spare;
    }
    double u1 = gen_uniform(g), u2 = gen_uniform(g);
    double r = sqrt(-2.0 * log(1.0 - u1)); // 1 - u1 is in (0, 1]
    double th = 2.0 * 3.14159265358979323846 * u2;
    g->g_spare = r * sin(th);
    g->g_have_spare = true;
    return r * cos(th);
}

tp_status
tp_generator_create(uint64_t seed, tp_generator **g_p)
{
    if (g_p == NULL) {
        return TP_EINVAL;
    }
    tp_generator *g = tp__zalloc(sizeof(*g));
    if (!g) {
        return TP_ENOMEM;
    }
    for (int i = 0; i < 4; i++) {
        g->g_s[i] = splitmix64(&seed);
    }
    *g_p = g;
    return TP_OK;
}

void
tp_generator_destroy(tp_generator *g)
{
    tp__free(g);
}

static tp_status
rand_fill(tp_dtype dt, int ndim, const int64_t *shape, double a, double b,
          bool normal, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    if (t_p == NULL) {
        return tp__tensor_null_arg(err_p, "tensor rand", "t_p");
    }
    if (!g || !tp_dtype_is_floating(dt)) {
        return tp__error_set(err_p, TP_EINVAL,
                             "tensor rand: needs a generator and a floating "
                             "dtype (got %s)",
                             tp_dtype_name(dt));
    }
    tp_tensor *t;
    tp_status st = tp_tensor_empty(dt, ndim, shape, &t, err_p);
    if (st != TP_OK) {
        return st;
    }
    int64_t n = tp_tensor_numel(t);
    char *p = tp__tensor_ptr(t);
    size_t es = tp_dtype_size(dt);
    for (int64_t i = 0; i < n; i++) {
        double v =
            normal ? a + b * gen_normal(g) : a + (b - a) * gen_uniform(g);
        tp__store_f64(p + (size_t)i * es, dt, v);
    }
    *t_p = t;
    return TP_OK;
}

tp_status
tp_tensor_rand(tp_dtype dt, int ndim, const int64_t *shape, double lo,
               double hi, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    return rand_fill(dt, ndim, shape, lo, hi, false, g, t_p, err_p);
}

tp_status
tp_tensor_randn(tp_dtype dt, int ndim, const int64_t *shape, double mean,
                double std, tp_generator *g, tp_tensor **t_p, tp_error **err_p)
{
    return rand_fill(dt, ndim, shape, mean, std, true, g, t_p, err_p);
}
