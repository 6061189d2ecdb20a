#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_pipe.sh - `tpipe bench pipe` beside TensorPipe: runs
#   tpipe bench pipe --json --reps 3 --lanes 2 --plot pipe.svg
#   bash ../shared/peers/run_all.sh tp     (TensorPipe's tp_bench)
# in the same session, then prints a markdown comparison per matching
# combination and size (compare_pipe.py): uv+basic <-> tcp+basic,
# shm+basic, uv+cma <-> tcp+cma, shm+cma, uv+mpt <-> tcp+mpt, xth (in one
# process; over the transport the handshake chose).
#
#   bash bench/run_pipe.sh                    # everything (~3-6 min + apt)
#   REPS=5 bash bench/run_pipe.sh
#   SKIP_PEERS=1 bash bench/run_pipe.sh       # ours only
#   TP_ARGS="--channel basic,cma" bash bench/run_pipe.sh
#
# Env: TPIPE (the tpipe binary; default: built into $BUILD_DIR),
#      BUILD_DIR (default <repo>/build-bench), REPS (3), PEERS (sections;
#      default "tp"), LANES (mpt lanes, default 2 as tp_bench uses),
#      OUT (default $BUILD_DIR/bench-results/pipe-<UTC stamp>),
#      TP_ARGS (extra arguments for tpipe bench pipe).
# Writes $OUT/{ours.jsonl,ours.log,pipe.svg,peers/raw.txt,report.md,*.log}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=pipe
PEERS=${PEERS:-tp}
LANES=${LANES:-2}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

ARGS="--json --reps $REPS --lanes $LANES --plot $OUT/pipe.svg ${TP_ARGS:-}"
log "tpipe bench pipe $ARGS"
# shellcheck disable=SC2086
"$TPIPE" bench pipe $ARGS >"$OUT/ours.jsonl" 2>"$OUT/ours.log" ||
  { log "tpipe bench pipe failed (exit $?), see $OUT/ours.log"; rc=1; }
[ -s "$OUT/ours.log" ] && sed 's/^/  /' "$OUT/ours.log" >&2

run_peers

{
  echo "## tpipe bench pipe vs TensorPipe ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r))"
  echo
  echo "tpipe: \`$TPIPE bench pipe $ARGS\` (median of $REPS medians);"
  echo "TensorPipe: \`run_all.sh $PEERS\` (tp_bench, REPS=$REPS, median over reps), same session."
  echo "Load average before / after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg) (anything else running skews the round trips)."
  echo
  "$PY" "$HERE/compare_pipe.py" "$OUT/ours.jsonl" "$OUT/peers/raw.txt"
  echo
  echo "Plot (stream GB/s against size, memcpy and loopback TCP ceilings): \`$OUT/pipe.svg\`"
} >"$OUT/report.md"
cat "$OUT/report.md"
log "report: $OUT/report.md"
exit $rc
