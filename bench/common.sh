# SPDX-License-Identifier: Apache-2.0
# common.sh - sourced by bench/run_*.sh: the log helper, python, and the
# tpipe binary (built incrementally into $BUILD_DIR unless $TPIPE is set).
# Expects REPO and BUILD_DIR; sets PY and TPIPE.
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
