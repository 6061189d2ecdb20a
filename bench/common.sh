# SPDX-License-Identifier: Apache-2.0
# common.sh - sourced by bench/run_*.sh: the settings every run shares,
# the log helper, python, the tpipe binary (built incrementally into
# $BUILD_DIR unless $TPIPE is set), the output folder and run_peers.
# Expects REPO, BENCH (transport, pipe, rpc) and PEERS; sets PEERS_DIR,
# BUILD_DIR, REPS, STAMP, OUT (created), PY, TPIPE, rc=0 and LOAD0.
PEERS_DIR=${PEERS_DIR:-$REPO/../shared/peers}
BUILD_DIR=${BUILD_DIR:-$REPO/build-bench}
REPS=${REPS:-3}
STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT=${OUT:-$BUILD_DIR/bench-results/$BENCH-$STAMP}
PY=${PY:-/usr/bin/python3}
command -v "$PY" >/dev/null 2>&1 || PY=python3
log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

if [ -z "${TPIPE:-}" ]; then
  # Configure once, then an incremental build: never a stale binary.
  TPIPE=$BUILD_DIR/tools/tpipe
  log "building tpipe in $BUILD_DIR"
  mkdir -p "$BUILD_DIR"
  if ! { { [ -f "$BUILD_DIR/CMakeCache.txt" ] ||
           cmake -S "$REPO" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
             -DBUILD_TESTING=OFF; } &&
         cmake --build "$BUILD_DIR" --target tpipe_tool -j"$(nproc)"; } \
       >"$BUILD_DIR/bench-build.log" 2>&1; then
    log "build failed: see $BUILD_DIR/bench-build.log"
    exit 1
  fi
fi

mkdir -p "$OUT"
log "results in $OUT"
rc=0
# Other jobs on the 2 cores distort cross-process latencies badly: note it.
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# run_peers: `run_all.sh $PEERS` in this session into $OUT/peers (skipped
# with SKIP_PEERS=1); sets rc=1 when it fails.
run_peers() {
  mkdir -p "$OUT/peers"
  if [ -z "${SKIP_PEERS:-}" ]; then
    log "peers: bash $PEERS_DIR/run_all.sh $PEERS"
    # shellcheck disable=SC2086
    OUT=$OUT/peers REPS=$REPS bash "$PEERS_DIR/run_all.sh" $PEERS \
      >"$OUT/peers.log" 2>&1 ||
      { log "run_all.sh failed, see $OUT/peers.log"; rc=1; }
    [ -s "$OUT/peers/failures.txt" ] &&
      { log "peer failures:"; cat "$OUT/peers/failures.txt" >&2; }
  fi
  touch "$OUT/peers/raw.txt"
}

# finish_report NAME: prints $OUT/report.md and, with SAVE=1, copies it to
# bench/results/NAME-<UTC date-time>.md.
finish_report() {
  cat "$OUT/report.md"
  log "report: $OUT/report.md"
  if [ "$SAVE" = 1 ]; then
    SAVED=$HERE/results/$1-$(date -u +%Y%m%d-%H%M).md
    mkdir -p "$HERE/results" && cp "$OUT/report.md" "$SAVED" &&
      log "saved: $SAVED"
  fi
}
