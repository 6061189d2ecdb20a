// SPDX-License-Identifier: Apache-2.0
// tunables.c - autograd's tunables: the BLAS library matmul uses, both
// read by blas.c (at load time and at first use).

#include "core/config.h"
#include "core/platform.h"

static const tp_tunable autograd_tunable_rows[] = {
    TP_TUNABLE_EXTERN("blas", "TP_BLAS", "on", "on|off",
                      "off: matmul uses the built-in kernels, not OpenBLAS "
                      "(docs/autograd.md)"),
    TP_TUNABLE_EXTERN("blas_coretype", "TP_BLAS_CORETYPE", "", "keep, or empty",
                      "keep: leave OPENBLAS_CORETYPE to OpenBLAS's own "
                      "detection (empty: tpipe picks one when unset)"),
};

const tp_tunables tp__autograd_tunables = {
    .ts_component = "autograd",
    .ts_rows = autograd_tunable_rows,
    .ts_nrows = TP_ARRAY_LEN(autograd_tunable_rows),
    .ts_store = TP_TUNABLES_IN_CONFIG,
};
