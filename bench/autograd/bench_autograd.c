// SPDX-License-Identifier: Apache-2.0
// bench_autograd.c - compute-core numbers: matmul 1024^3 f32 GFLOP/s with
// BLAS and with the blocked fallback, elementwise add bandwidth against
// memcpy, and the time of one MLP training step. Compare with
// peer_torch.py (same sizes; run both with the same OPENBLAS_NUM_THREADS).
//
// Usage: tp_bench_autograd [--mlp-only | --quick]

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tpipe/autograd.h>
#include <tpipe/tensor.h>

#include "autograd/ag_impl.h" // tp__gemm_force_fallback

static double
now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
must(tp_status st, tp_error *err, const char *what)
{
    if (st != TP_OK) {
        fprintf(stderr, "%s: %s\n", what, tp_error_message(err));
        exit(1);
    }
}

static tp_tensor *
rand_t(tp_generator *g, int nd, const int64_t *shape, double lo, double hi)
{
    tp_tensor *t;
    tp_error *err = NULL;
    must(tp_tensor_rand(TP_F32, nd, shape, lo, hi, g, &t, &err), err, "rand");
    return t;
}

// Best of @reps runs of C = A B, n x n f32.
static double
bench_matmul(tp_generator *g, int64_t n, int reps)
{
    int64_t s[2] = {n, n};
    tp_tensor *a = rand_t(g, 2, s, -1, 1), *b = rand_t(g, 2, s, -1, 1), *c;
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        must(tp_matmul(a, b, &c, NULL), NULL, "matmul");
        double t = now_s() - t0;
        tp_tensor_unref(c);
        if (r > 0 && t < best) { // the first run warms up threads and pages
            best = t;
        }
    }
    tp_tensor_unref(a);
    tp_tensor_unref(b);
    return 2.0 * (double)n * (double)n * (double)n / best / 1e9;
}

// Called through a volatile pointer so the compiler cannot drop a copy
// into a buffer that is freed right after.
static void *(*volatile copy_fn)(void *, const void *, size_t) = memcpy;

static void
bench_elementwise(tp_generator *g, int64_t n, int reps)
{
    tp_tensor *a = rand_t(g, 1, &n, -1, 1), *b = rand_t(g, 1, &n, -1, 1), *c;
    size_t bytes = (size_t)n * 4;
    double best_add = 1e30, best_cpy = 1e30, best_cpy_new = 1e30;
    char *dst = malloc(bytes);
    memset(dst, 1, bytes);
    // Each measurement runs back to back, so one does not evict the
    // other's data from the caches.
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        must(tp_add(a, b, &c, NULL), NULL, "add");
        double t = now_s() - t0;
        tp_tensor_unref(c);
        if (r > 0 && t < best_add) {
            best_add = t;
        }
    }
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        copy_fn(dst, tp_tensor_data(a), bytes);
        double t = now_s() - t0;
        if (r > 0 && t < best_cpy) {
            best_cpy = t;
        }
    }
    for (int r = 0; r < reps + 1; r++) {
        // memcpy into a fresh buffer pays for page faults as a new
        // result does without the block cache.
        char *fresh = malloc(bytes);
        double t0 = now_s();
        copy_fn(fresh, tp_tensor_data(a), bytes);
        double t = now_s() - t0;
        free(fresh);
        if (r > 0 && t < best_cpy_new) {
            best_cpy_new = t;
        }
    }
    // Bytes moved: add reads two and writes one; memcpy reads and writes.
    double add_gbs = 3.0 * (double)bytes / best_add / 1e9;
    double cpy_gbs = 2.0 * (double)bytes / best_cpy / 1e9;
    double cpy_new_gbs = 2.0 * (double)bytes / best_cpy_new / 1e9;
    printf("add f32 %lld elems: %.2f GB/s (%.2f ms)\n", (long long)n, add_gbs,
           best_add * 1e3);
    printf("memcpy %zu bytes: %.2f GB/s into a warm buffer, %.2f GB/s into "
           "a fresh one\n",
           bytes, cpy_gbs, cpy_new_gbs);
    printf("add / memcpy: %.2f (warm), %.2f (fresh)\n", add_gbs / cpy_gbs,
           add_gbs / cpy_new_gbs);
    free(dst);
    tp_tensor_unref(a);
    tp_tensor_unref(b);
}

// One step of a 784-512-10 MLP on a batch of 256: forward, cross-entropy,
// backward, SGD update. Returns seconds per step (mean of @steps).
static double
bench_mlp(tp_generator *g, int steps)
{
    const int64_t batch = 256, in = 784, hid = 512, out = 10;
    tp_error *err = NULL;
    int64_t xs[2] = {batch, in}, w1s[2] = {in, hid}, b1s[1] = {hid},
            w2s[2] = {hid, out}, b2s[1] = {out};
    tp_tensor *x = rand_t(g, 2, xs, 0, 1), *y;
    must(tp_tensor_empty(TP_I64, 1, &batch, &y, &err), err, "y");
    for (int64_t i = 0; i < batch; i++) {
        tp_tensor_set_item(y, i, (double)(i % out));
    }
    tp_tensor *p[4] = {
        rand_t(g, 2, w1s, -0.05, 0.05), rand_t(g, 1, b1s, -0.05, 0.05),
        rand_t(g, 2, w2s, -0.05, 0.05), rand_t(g, 1, b2s, -0.05, 0.05)};
    for (int i = 0; i < 4; i++) {
        must(tp_tensor_set_requires_grad(p[i], true, &err), err, "leaf");
    }
    double t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) { // two warm-up steps
            t0 = now_s();
        }
        tp_tensor *h0, *h1, *h, *o0, *o, *loss;
        must(tp_matmul(x, p[0], &h0, &err), err, "mm1");
        must(tp_add(h0, p[1], &h1, &err), err, "add1");
        must(tp_relu(h1, &h, &err), err, "relu");
        must(tp_matmul(h, p[2], &o0, &err), err, "mm2");
        must(tp_add(o0, p[3], &o, &err), err, "add2");
        must(tp_cross_entropy(o, y, &loss, &err), err, "loss");
        must(tp_backward(1, &loss, NULL, false, &err), err, "backward");
        bool prev = tp_grad_mode_set(false);
        for (int i = 0; i < 4; i++) {
            must(tp_tensor_axpy(p[i], -0.1, tp_tensor_grad(p[i]), &err), err,
                 "sgd");
            tp_tensor_zero_grad(p[i]);
        }
        tp_grad_mode_set(prev);
        tp_tensor *ts[6] = {h0, h1, h, o0, o, loss};
        for (int i = 0; i < 6; i++) {
            tp_tensor_unref(ts[i]);
        }
    }
    double per = (now_s() - t0) / steps;
    for (int i = 0; i < 4; i++) {
        tp_tensor_unref(p[i]);
    }
    tp_tensor_unref(x);
    tp_tensor_unref(y);
    return per;
}

int
main(int argc, char **argv)
{
    bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    bool mlp_only = argc > 1 && strcmp(argv[1], "--mlp-only") == 0;
    tp_generator *g;
    if (tp_generator_create(1, &g) != TP_OK) {
        return 1;
    }
    // One thread count for everything: OpenBLAS reads it from the
    // environment, our kernels get the same.
    const char *thr = getenv("OPENBLAS_NUM_THREADS");
    int nthreads = thr ? atoi(thr) : 1;
    tp_error *err = NULL;
    if (tp_compute_threads_set(nthreads > 0 ? nthreads : 1, &err) != TP_OK) {
        fprintf(stderr, "threads: %s\n", tp_error_message(err));
        return 1;
    }
    printf("tpipe autograd bench (BLAS %s, OPENBLAS_NUM_THREADS=%s, compute "
           "threads %d)\n",
           tp__gemm_have_blas() ? "built in" : "absent", thr ? thr : "unset",
           tp_compute_threads_get());
    if (!mlp_only) {
        int64_t n = quick ? 256 : 1024;
        if (tp__gemm_have_blas()) {
            printf("matmul %lldx%lld f32, BLAS: %.1f GFLOP/s\n", (long long)n,
                   (long long)n, bench_matmul(g, n, 5));
        }
        tp__gemm_force_fallback(true);
        printf("matmul %lldx%lld f32, blocked fallback: %.1f GFLOP/s\n",
               (long long)n, (long long)n, bench_matmul(g, n, 3));
        if (tp__gemm_have_blas()) {
            tp__gemm_force_fallback(false);
        }
        // 16 MB operands (glibc reuses freed blocks this size) and 64 MB
        // ones (each result is a fresh mmap, so page faults count).
        bench_elementwise(g, quick ? 1 << 20 : 1 << 22, 30);
        if (!quick) {
            bench_elementwise(g, 1 << 24, 10);
        }
    }
    double step = bench_mlp(g, quick ? 3 : 20);
    printf("mlp 784-512-10 batch 256 step (fwd+bwd+sgd): %.2f ms\n",
           step * 1e3);
    if (tp__gemm_have_blas()) {
        tp__gemm_force_fallback(true);
        step = bench_mlp(g, quick ? 3 : 10);
        printf("mlp step with the blocked fallback: %.2f ms\n", step * 1e3);
    }
    tp_generator_destroy(g);
    return 0;
}
