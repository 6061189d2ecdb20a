#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_collective.sh - `tpipe bench collective` beside gloo (torch.distributed)
# and OpenMPI: runs, for the default engine and for --engine pipe,
#   tpipe bench collective --json --reps 3 --world 2 --op all_reduce \
#       --min-bytes 4K --max-bytes 64M --factor 4
#   tpipe bench collective ... --op barrier
#   tpipe bench collective ... --op all_gather --sizes 2M,32M
#   tpipe bench collective ... --op broadcast --sizes 1M,16M
#   bash ../shared/peers/run_all.sh gloo mpi   (torch_gloo_bench.py,
#                                               mpi_bench over vader and tcp)
# in the same session, then writes a markdown report (compare_collective.py)
# with the medians, the ratios to gloo and MPI, and the issue's targets
# (all_reduce 4 KiB <= 4 us, all_reduce 64 MiB busbw >= 3.0 GB/s, barrier
# <= 1 us). The sizes are the peers': all_reduce 4K, 64K, 1M, 16M, 64M
# (and 16K, 256K, 4M between), broadcast 1M and 16M, all_gather's output
# 2M and 32M (gloo's per-rank input 1M and 16M), barrier.
#
#   bash bench/run_collective.sh              # everything (~5 min + apt)
#   REPS=5 bash bench/run_collective.sh
#   SKIP_PEERS=1 bash bench/run_collective.sh # ours only
#   ENGINES=auto bash bench/run_collective.sh # the default engine only
#
# Env: TPIPE (the tpipe binary; default: built into $BUILD_DIR),
#      BUILD_DIR (default <repo>/build-bench), REPS (3), PEERS (sections;
#      default "gloo mpi"), ENGINES (default "auto pipe"), OUT (default
#      $BUILD_DIR/bench-results/collective-<UTC stamp>), TP_ARGS (extra
#      arguments for every tpipe run), SAVE (default 1: also copy the report
#      to bench/results/collective-<stamp>.md; 0: don't).
# Writes $OUT/{ours.jsonl,ours.log,peers/raw.txt,report.md,*.log}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=collective
PEERS=${PEERS:-gloo mpi}
ENGINES=${ENGINES:-auto pipe}
SAVE=${SAVE:-1}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

ARGS="--json --reps $REPS --world 2"
RUNS="--op all_reduce --min-bytes 4K --max-bytes 64M --factor 4|--op barrier|--op all_gather --sizes 2M,32M|--op broadcast --sizes 1M,16M"
: >"$OUT/ours.jsonl"
: >"$OUT/ours.log"
IFS='|' read -r -a RUN_LIST <<<"$RUNS"
for engine in $ENGINES; do
  for run in "${RUN_LIST[@]}"; do
    log "tpipe bench collective $ARGS --engine $engine $run ${TP_ARGS:-}"
    # shellcheck disable=SC2086
    "$TPIPE" bench collective $ARGS --engine "$engine" $run ${TP_ARGS:-} \
      >>"$OUT/ours.jsonl" 2>>"$OUT/ours.log" ||
      { log "tpipe bench collective --engine $engine $run failed (exit $?), see $OUT/ours.log"; rc=1; }
  done
done
[ -s "$OUT/ours.log" ] && sed 's/^/  /' "$OUT/ours.log" >&2

run_peers

{
  echo "## tpipe bench collective vs gloo and OpenMPI ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r))"
  echo
  echo "tpipe: \`$TPIPE bench collective $ARGS\` with \`--engine\` ${ENGINES// /, } ${TP_ARGS:+and \`$TP_ARGS\` }over the runs of bench/run_collective.sh (median of $REPS repetitions, each on fresh ranks; time = mean per call of the slowest rank);"
  echo "peers: \`run_all.sh $PEERS\` (torch_gloo_bench.py: gloo over loopback TCP; mpi_bench: OpenMPI ob1 over vader shared memory and over tcp; REPS=$REPS, median over reps of each run's median per-iteration time), same session."
  echo "Load average before / after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the small sizes)."
  echo
  "$PY" "$HERE/compare_collective.py" "$OUT/ours.jsonl" "$OUT/peers/raw.txt"
} >"$OUT/report.md"
finish_report collective
exit "$rc"
