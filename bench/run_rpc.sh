#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_rpc.sh - `tpipe bench rpc` beside PyTorch's RPC (TensorPipe agent):
# runs
#   tpipe bench rpc --json --reps 3 --transport shm
#   tpipe bench rpc --json --reps 3 --transport tcp --channel basic
#   bash ../shared/peers/run_all.sh rpc        (torch_rpc_bench.py: PyTorch
#                                               defaults, then uv+basic)
# in the same session, then prints a markdown comparison with the RPC
# issue's targets (compare_rpc.py): noop shm <-> PyTorch default, noop tcp
# <-> uv+basic, tensor echo 64 MiB, rpc_async calls/s (64 in flight), init,
# remote + to_here, and one distributed autograd iteration (our
# dist_autograd <-> PyTorch's dist_autograd_fwd_bwd).
#
#   bash bench/run_rpc.sh                     # everything (~2-4 min + apt)
#   REPS=5 bash bench/run_rpc.sh
#   SKIP_PEERS=1 bash bench/run_rpc.sh        # ours only
#   TP_ARGS="--test noop,async" bash bench/run_rpc.sh
#   SKIP_LAYERS=1 bash bench/run_rpc.sh       # no pipe/transport rows
#
# Env: TPIPE (the tpipe binary; default: built into $BUILD_DIR),
#      BUILD_DIR (default <repo>/build-bench), REPS (3), PEERS (sections;
#      default "rpc"), OUT (default $BUILD_DIR/bench-results/rpc-<UTC
#      stamp>), TP_ARGS (extra arguments for both tpipe bench rpc runs),
#      SAVE (default 1: also copy the report to bench/results/rpc-<stamp>.md;
#      0: don't).
# Writes $OUT/{ours.jsonl,ours.log,peers/raw.txt,report.md,*.log}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=rpc
PEERS=${PEERS:-rpc}
SAVE=${SAVE:-1}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

# The same configurations as the peer: PyTorch's default (shm, every
# channel: cma between two local processes) and uv+basic.
ARGS="--json --reps $REPS"
RUNS="--transport=shm|--transport=tcp --channel=basic"
: >"$OUT/ours.jsonl"
: >"$OUT/ours.log"
IFS='|' read -r -a RUN_LIST <<<"$RUNS"
for run in "${RUN_LIST[@]}"; do
  log "tpipe bench rpc $ARGS $run ${TP_ARGS:-}"
  # shellcheck disable=SC2086
  "$TPIPE" bench rpc $ARGS $run ${TP_ARGS:-} >>"$OUT/ours.jsonl" \
    2>>"$OUT/ours.log" ||
    { log "tpipe bench rpc $run failed (exit $?), see $OUT/ours.log"; rc=1; }
done
[ -s "$OUT/ours.log" ] && sed 's/^/  /' "$OUT/ours.log" >&2

# The layers under the agent, same session, for the in-run ratios: the
# pipe's and the transport's 64 B round trips over shm.
if [ -z "${SKIP_LAYERS:-}" ]; then
  log "tpipe bench pipe --transport shm --channel basic --sizes 64 --test pingpong"
  "$TPIPE" bench pipe --transport shm --channel basic --sizes 64 \
    --test pingpong --json --reps "$REPS" >"$OUT/pipe.jsonl" \
    2>>"$OUT/ours.log" || log "tpipe bench pipe failed, see $OUT/ours.log"
  log "tpipe bench transport --transport shm --sizes 64 --test pingpong"
  "$TPIPE" bench transport --transport shm --sizes 64 --test pingpong \
    --json --reps "$REPS" >"$OUT/transport.jsonl" 2>>"$OUT/ours.log" ||
    log "tpipe bench transport failed, see $OUT/ours.log"
fi

run_peers

{
  echo "## tpipe bench rpc vs PyTorch RPC ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r))"
  echo
  echo "tpipe: \`$TPIPE bench rpc $ARGS\` with \`--transport shm\` and with \`--transport tcp --channel basic\` ${TP_ARGS:+and \`$TP_ARGS\` }(median of $REPS repetitions, each a fresh pair of processes);"
  echo "PyTorch: \`run_all.sh $PEERS\` (torch_rpc_bench.py, TensorPipe agent, REPS=$REPS, median over reps), same session."
  echo "Load average before / after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the round trips)."
  echo
  "$PY" "$HERE/compare_rpc.py" "$OUT/ours.jsonl" "$OUT/peers/raw.txt" \
    pipe="$OUT/pipe.jsonl" transport="$OUT/transport.jsonl"
} >"$OUT/report.md"
finish_report rpc
exit $rc
