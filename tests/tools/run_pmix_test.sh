#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_pmix_test.sh RPC_DEMO - env:// under a PMIx launcher with no
# MASTER_ADDR/MASTER_PORT: OpenMPI's mpirun starts 3 copies of
# examples/rpc_demo; rank 0's store address travels through PMIx
# (store/pmix.c). Skipped (77) without mpirun. Registered only when the
# library is built with PMIx (TP_HAVE_PMIX).
set -u
DEMO=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "run_pmix_test: FAIL: $*"; cat "$out/o"; exit 1; }
# mpirun refuses root unless told; oversubscribe: the host may have fewer
# cores than ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
st=0
cd "$out" && timeout -s KILL 120 env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE \
    -u SLURM_JOB_NODELIST -u SLURM_STEP_NODELIST -u SLURM_NODELIST -u SLURM_JOB_ID \
    mpirun --oversubscribe -n 3 sh -c \
    'RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE exec "$0"' "$DEMO" >"$out/o" 2>&1 || st=$?
if [ "$st" != 0 ] && grep -q 'mpirun was unable\|ORTE\|PRTE' "$out/o" && ! grep -q 'rpc_demo' "$out/o"; then
    echo "skip: mpirun cannot start processes here"; cat "$out/o"; exit 77
fi
[ "$st" = 0 ] || fail "mpirun -n 3 rpc_demo exited $st"
[ "$(grep -c ': done$' "$out/o")" = 3 ] || fail "expected 3 done lines"
grep -q 'worker2: worker0 echoed "hello"' "$out/o" || fail "worker2 -> worker0"
echo "run_pmix_test: ok"
