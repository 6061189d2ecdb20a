// SPDX-License-Identifier: Apache-2.0
// coll_demo.c - process groups and collectives in one page: a data-parallel
// training step.
//
//   tpipe run -n 4 build/examples/coll_demo
//
// `tpipe run` starts N copies with RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT set; tp_pg_init("env://", -1, -1, ...) reads them. Every rank
// starts from rank 0's parameters (broadcast), computes a "gradient" of its
// own, averages the gradients (all_reduce avg, asynchronously, while it
// does other work), checks that every rank ended with the same parameters
// (all_gather), and times a few small all_reduces and barriers. Ranks 0 and
// 1 form a subgroup (new_group) that only they take part in. Each rank
// prints one line per step. Any failure: the message on stderr, exit 1.

// clock_gettime with -std=c11.
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <tpipe/tpipe.h>

#define N_PARAMS (1 << 20)
#define N_TIMED  2000

static int g_rank = -1;

static void
die(const char *what, tp_status st, tp_error *err)
{
    fprintf(stderr, "coll_demo: rank %d: %s: %s (%s)\n", g_rank, what,
            err != NULL ? tp_error_message(err) : "failed", tp_status_name(st));
    tp_error_unref(err);
    exit(1);
}

// Every call takes &err (declared in main); on failure its message names
// the group, the rank and the cause.
#define CHECK(call, what)                                                      \
    do {                                                                       \
        tp_status st_ = (call);                                                \
        if (st_ != TP_OK) {                                                    \
            die(what, st_, err);                                               \
        }                                                                      \
    } while (0)

static double
now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int
main(void)
{
    tp_error *err = NULL;
    tp_pg *pg = NULL;
    CHECK(tp_pg_init("env://", -1, -1, NULL, &pg, &err), "tp_pg_init");
    g_rank = tp_pg_rank(pg);
    int world = tp_pg_size(pg);
    printf("rank %d of %d: collectives run on the %s engine\n", g_rank, world,
           tp_pg_engine(pg));

    // 1. Everyone starts from rank 0's parameters.
    int64_t n = N_PARAMS;
    tp_tensor *params = NULL, *grad = NULL;
    CHECK(tp_tensor_zeros(TP_F32, 1, &n, &params, &err), "tensor");
    CHECK(tp_tensor_empty(TP_F32, 1, &n, &grad, &err), "tensor");
    float *p = tp_tensor_data(params);
    float *g = tp_tensor_data(grad);
    for (int64_t i = 0; i < n; i++) {
        p[i] = g_rank == 0 ? (float)(i % 100) * 0.01f : -1.0f;
    }
    CHECK(tp_pg_broadcast(pg, params, 0, NULL, &err), "broadcast");

    // 2. A gradient of our own, averaged over the ranks while we do other
    //    work (the async form returns a work handle).
    for (int64_t i = 0; i < n; i++) {
        g[i] = (float)(g_rank + 1);
    }
    tp_work *w = NULL;
    CHECK(tp_pg_all_reduce(pg, grad, TP_REDUCE_AVG, &w, &err), "all_reduce");
    double busy = 0;
    for (int i = 1; i < 1000; i++) {
        busy += sqrt((double)i); // "other work"
    }
    CHECK(tp_work_wait(w, 0, &err), "all_reduce (wait)");
    tp_work_free(w);
    float want = (float)(world + 1) / 2.0f; // mean of 1..world
    if (fabsf(g[12345] - want) > 1e-5f) {
        fprintf(stderr, "coll_demo: rank %d: averaged gradient %g, want %g\n",
                g_rank, (double)g[12345], (double)want);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        p[i] -= 0.1f * g[i];
    }
    printf("rank %d: step done: gradient averaged to %.2f over %d ranks "
           "(%s)\n",
           g_rank, (double)g[0], world, busy > 0 ? "overlapped" : "");

    // 3. Every rank holds the same parameters: gather a checksum of each.
    int64_t one = 1, all = world;
    tp_tensor *mine = NULL, *sums = NULL;
    CHECK(tp_tensor_zeros(TP_F64, 1, &one, &mine, &err), "tensor");
    CHECK(tp_tensor_zeros(TP_F64, 1, &all, &sums, &err), "tensor");
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        s += p[i];
    }
    *(double *)tp_tensor_data(mine) = s;
    CHECK(tp_pg_all_gather(pg, sums, mine, NULL, &err), "all_gather");
    const double *sv = tp_tensor_data(sums);
    for (int r = 0; r < world; r++) {
        if (sv[r] != sv[0]) {
            fprintf(stderr,
                    "coll_demo: rank %d: rank %d's parameters "
                    "differ\n",
                    g_rank, r);
            return 1;
        }
    }
    printf("rank %d: parameters identical on all %d ranks (checksum %.3f)\n",
           g_rank, world, sv[0]);

    // 4. A subgroup of ranks 0 and 1: only they call new_group.
    if (world >= 2 && g_rank < 2) {
        const int pair[2] = {0, 1};
        tp_pg *sub = NULL;
        CHECK(tp_pg_new_group(pg, pair, 2, NULL, &sub, &err), "new_group");
        CHECK(tp_pg_all_reduce(sub, mine, TP_REDUCE_SUM, NULL, &err),
              "all_reduce (subgroup)");
        printf("rank %d: subgroup {0, 1}: sum of two checksums %.3f\n", g_rank,
               *(double *)tp_tensor_data(mine));
        tp_pg_destroy(sub);
    }

    // 5. Latency of small collectives (blocking, on the caller's thread).
    int64_t k = 1024;
    tp_tensor *small = NULL;
    CHECK(tp_tensor_ones(TP_F32, 1, &k, &small, &err), "tensor");
    CHECK(tp_pg_barrier(pg, NULL, &err), "barrier");
    double t0 = now_us();
    for (int i = 0; i < N_TIMED; i++) {
        CHECK(tp_pg_all_reduce(pg, small, TP_REDUCE_MAX, NULL, &err),
              "all_reduce 4 KiB");
    }
    double t1 = now_us();
    for (int i = 0; i < N_TIMED; i++) {
        CHECK(tp_pg_barrier(pg, NULL, &err), "barrier");
    }
    double t2 = now_us();
    printf("rank %d: all_reduce 4 KiB %.2f us, barrier %.2f us (mean of %d; "
           "see tpipe bench collective for the real benchmark)\n",
           g_rank, (t1 - t0) / N_TIMED, (t2 - t1) / N_TIMED, N_TIMED);

    tp_tensor_unref(small);
    tp_tensor_unref(mine);
    tp_tensor_unref(sums);
    tp_tensor_unref(params);
    tp_tensor_unref(grad);
    tp_pg_destroy(pg);
    return 0;
}
