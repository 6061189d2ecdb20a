#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs tp_bench_autograd and the PyTorch peer with the same thread count,
# alternating, ROUNDS times each. Usage:
#   bench/autograd/compare.sh BUILD_DIR [THREADS] [ROUNDS]
set -eu
build=${1:?build dir}
threads=${2:-1}
rounds=${3:-3}
here=$(dirname "$0")
export OPENBLAS_NUM_THREADS="$threads" OMP_NUM_THREADS="$threads"
i=0
while [ "$i" -lt "$rounds" ]; do
    echo "--- round $i: tpipe"
    "$build/bench/autograd/tp_bench_autograd"
    echo "--- round $i: torch"
    /usr/bin/python3 "$here/peer_torch.py" "$threads"
    i=$((i + 1))
done
