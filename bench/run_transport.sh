#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_transport.sh - issue 2's "measure and report": runs
#   tpipe bench transport --json --reps 3        (every transport x backend)
#   tpipe bench transport --idle-cpu --json      (CPU while idle)
#   bash ../shared/peers/run_all.sh sock memcpy iperf3
# in the same session, then prints a markdown side-by-side comparison
# (compare_transport.py): tcp 64 B round trip vs the raw socket, shm 64 B
# round trip vs 2 us, shm 64 MiB stream vs 0.8 x memcpy, tcp 64 MiB stream
# vs 0.9 x iperf3 -P1, idle CPU.
#
#   bash bench/run_transport.sh              # everything (~3-5 min + apt)
#   REPS=5 bash bench/run_transport.sh
#   PEERS="sock memcpy iperf3 tp" bash bench/run_transport.sh
#   SKIP_PEERS=1 bash bench/run_transport.sh # ours only (tables w/o peers)
#   TP_ARGS="--transport shm" bash bench/run_transport.sh
#
# Env: TPIPE (the tpipe binary; default: built into $BUILD_DIR),
#      BUILD_DIR (default <repo>/build-bench), REPS (3), PEERS (sections),
#      OUT (default $BUILD_DIR/bench-results/transport-<UTC stamp>),
#      TP_ARGS (extra arguments for tpipe bench transport).
# Writes $OUT/{ours.jsonl,idle.jsonl,peers/raw.txt,report.md,*.log}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=transport
PEERS=${PEERS:-sock memcpy iperf3}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

log "tpipe bench transport --json --reps $REPS ${TP_ARGS:-}"
# shellcheck disable=SC2086
"$TPIPE" bench transport --json --reps "$REPS" ${TP_ARGS:-} \
  >"$OUT/ours.jsonl" 2>"$OUT/ours.log" ||
  { log "tpipe bench transport failed (exit $?), see $OUT/ours.log"; rc=1; }
log "tpipe bench transport --idle-cpu --json"
# shellcheck disable=SC2086
"$TPIPE" bench transport --idle-cpu --json ${TP_ARGS:-} \
  >"$OUT/idle.jsonl" 2>"$OUT/idle.log" ||
  { log "idle measurement failed (exit $?), see $OUT/idle.log"; rc=1; }

run_peers

{
  echo "## tpipe bench transport vs peers ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r))"
  echo
  echo "tpipe: \`$TPIPE bench transport --json --reps $REPS ${TP_ARGS:-}\` (median of $REPS medians);"
  echo "peers: \`run_all.sh $PEERS\` (REPS=$REPS), same session."
  echo
  "$PY" "$HERE/compare_transport.py" "$OUT/ours.jsonl" "$OUT/peers/raw.txt" \
    "$OUT/idle.jsonl"
} >"$OUT/report.md"
cat "$OUT/report.md"
log "report: $OUT/report.md"
exit $rc
