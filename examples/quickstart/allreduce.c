// SPDX-License-Identifier: Apache-2.0
// allreduce.c - the smallest process-group program (docs/quickstart.md):
// every rank all_reduces a tensor holding its rank; all get the sum.
//
//   tpipe run -n 4 ./allreduce

#include <stdio.h>
#include <stdlib.h>

#include <tpipe/tpipe.h>

static void
check(tp_status st, tp_error *err, const char *what)
{
    if (st != TP_OK) {
        fprintf(stderr, "allreduce: %s: %s\n", what, tp_error_message(err));
        exit(1);
    }
}

int
main(void)
{
    tp_error *err = NULL;
    tp_pg *pg = NULL;
    // env://, with rank and world size (-1, -1) from RANK and WORLD_SIZE.
    check(tp_pg_init("env://", -1, -1, NULL, &pg, &err), err, "tp_pg_init");
    int rank = tp_pg_rank(pg), world = tp_pg_size(pg);

    int64_t shape[1] = {4};
    tp_tensor *t = NULL;
    check(tp_tensor_empty(TP_F32, 1, shape, &t, &err), err, "tensor");
    float *x = tp_tensor_data(t);
    for (int i = 0; i < 4; i++) {
        x[i] = (float)rank;
    }
    check(tp_pg_all_reduce(pg, t, TP_REDUCE_SUM, NULL, &err), err,
          "all_reduce");
    float want = (float)(world * (world - 1) / 2);
    if (x[0] != want || x[3] != want) {
        fprintf(stderr, "allreduce: rank %d got %g, want %g\n", rank, x[0],
                want);
        return 1;
    }
    printf("rank %d of %d: sum %g\n", rank, world, x[0]);
    tp_tensor_unref(t);
    tp_pg_destroy(pg);
    return 0;
}
