#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_gpu.sh - issue 13's GPU checks in one prepared run, for a session
# that is lent a device machine (docs/cuda.md, "Tests: fake runtime and
# real GPU"). Build here, carry the build folder, run this there:
#
#   bash bench/run_gpu.sh [BUILD_DIR]      # default build/
#
# 1. what the machine has: nvidia-smi -L, the CUDA runtime found;
# 2. the real-runtime twins of the CUDA tests (TP_TEST_CUDA=real), run as
#    programs (ctest files hold this host's paths): cuda_pipe_test,
#    cuda_rpc_test, cuda_ipc_test, cuda_ipc_chan_test, and nccl_test and
#    cuda_tensor_test (world size 1: one GPU);
# 3. tpipe bench pipe --device over shm+cma, cuda_ipc against staging
#    (--device-channel none), for cuda:0->cuda:0, cuda:0->cpu and
#    cpu->cuda:0, with the cudaMemcpy baseline rows, JSON lines;
# 4. staged small round trips with the CUDA work on the copy pool
#    (default) and on the loop (TP_PIPE_CUDA_LOOP_MAX=64K);
# and writes summary.md. Everything goes to $OUT (the device tool's
# folder that comes back) or ./gpu-out. Exits 77, saying why, where there
# is no GPU; 1 if a test failed; 0 otherwise.
#
# Env: OUT, SIZES (default 4K,1M,64M), REPS (default 3), BUDGET (default
# 0.5), CUDA_LIB (the folder with libcudart; default /usr/local/cuda/lib64
# when it exists), TIMEOUT_S (per program, default 240).
set -u
BUILD=${1:-build}
OUT=${OUT:-gpu-out}
SIZES=${SIZES:-4K,1M,64M}
REPS=${REPS:-3}
BUDGET=${BUDGET:-0.5}
TIMEOUT_S=${TIMEOUT_S:-240}
mkdir -p "$OUT"
SUM="$OUT/summary.md"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/run.log" >&2; }

[ -x "$BUILD/tools/tpipe" ] || {
  echo "run_gpu.sh: no $BUILD/tools/tpipe: build first (and carry $BUILD)" >&2
  exit 2
}
CUDA_LIB=${CUDA_LIB:-}
if [ -z "$CUDA_LIB" ] && [ -d /usr/local/cuda/lib64 ]; then
  CUDA_LIB=/usr/local/cuda/lib64
fi
[ -n "$CUDA_LIB" ] && export LD_LIBRARY_PATH="$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

{
  echo "# GPU checks ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -n))"
  echo
  echo '```'
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
  echo "CUDA_LIB=${CUDA_LIB:-none}"
  "$BUILD/tools/tpipe" info 2>&1 | grep -E 'features|cuda_ipc|nccl' || true
  echo '```'
  echo
} >"$SUM"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run_gpu.sh: skipped: no GPU here (nvidia-smi -L fails)" | tee -a "$SUM" >&2
  exit 77
fi

# ---- 2. the real-runtime tests ------------------------------------------------
failed=0
printf '| test | status | seconds |\n|---|---|---|\n' >>"$SUM"
for t in cuda/cuda_pipe_test cuda/cuda_rpc_test cuda/cuda_ipc_test \
  cuda/cuda_ipc_chan_test collectives/nccl_test core/cuda_tensor_test; do
  bin="$BUILD/tests/$t"
  name=$(basename "$t")
  if [ ! -x "$bin" ]; then
    bin=$(find "$BUILD/tests" -name "$name" -type f -perm -u+x | head -n1)
  fi
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    echo "| $name | not built | - |" >>"$SUM"
    continue
  fi
  log "test $name"
  t0=$(date +%s)
  TP_TEST_CUDA=real timeout -k 5 "$TIMEOUT_S" "$bin" >"$OUT/$name.txt" 2>&1
  rc=$?
  dt=$(($(date +%s) - t0))
  case $rc in
  0) st=passed ;;
  77) st="skipped ($(grep -m1 -i skip "$OUT/$name.txt" | cut -c1-80))" ;;
  *)
    st="FAILED (exit $rc)"
    failed=1
    ;;
  esac
  echo "| $name | $st | $dt |" >>"$SUM"
done

# ---- 3. bench pipe: cuda_ipc against staging ----------------------------------
{
  echo
  echo "bench pipe, shm+cma, sizes $SIZES, --reps $REPS, --budget $BUDGET:"
  echo
  echo "| device | test | size | cuda_ipc | staged | copy baseline |"
  echo "|---|---|---|---|---|---|"
} >>"$SUM"
for dev in cuda:0 'cuda:0->cpu' 'cpu->cuda:0'; do
  tag=$(echo "$dev" | tr ':>-' '_  ' | tr -d ' ')
  for dc in auto none; do
    extra=()
    [ "$dc" = none ] && extra=(--device-channel none)
    log "bench pipe --device $dev ($dc)"
    timeout -k 5 "$TIMEOUT_S" "$BUILD/tools/tpipe" bench pipe --device "$dev" \
      --transport shm --channel cma --sizes "$SIZES" --reps "$REPS" \
      --budget "$BUDGET" --json "${extra[@]}" >"$OUT/bench_${tag}_$dc.jsonl" \
      2>"$OUT/bench_${tag}_$dc.txt" || {
      echo "bench pipe --device $dev ($dc): exit $? (see bench_${tag}_$dc.txt)" >>"$SUM"
      failed=1
    }
  done
  python3 - "$OUT/bench_${tag}_auto.jsonl" "$OUT/bench_${tag}_none.jsonl" \
    "$dev" >>"$SUM" <<'PYEOF' || true
import json, sys
def rows(path):
    out = {}
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                out[(r["mode"], r["test"], r["size"])] = r
    except OSError:
        pass
    return out
a, n, dev = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
def val(r):
    if r is None:
        return "-"
    if r["test"] == "pingpong":
        return "%.1f us" % r["p50_us"]
    return "%.2f GB/s" % r["gbps"]
copies = {(k[2]): r for k, r in a.items() if k[0] == "copy"}
for (mode, test, size), r in sorted(a.items(), key=lambda kv: (kv[0][1], kv[0][2])):
    if mode == "copy":
        continue
    base = copies.get(size)
    print("| %s | %s | %d | %s (%s) | %s | %s |" % (
        dev, test, size, val(r), r.get("device_channel"),
        val(n.get((mode, test, size))),
        "%s %.2f GB/s" % (base["test"], base["gbps"]) if base else "-"))
PYEOF
done
# ---- 4. staging on the copy pool against the loop thread --------------------
# The CUDA work of a staged message runs on the context's copy pool by
# default (a busy device never holds the loop); TP_PIPE_CUDA_LOOP_MAX
# keeps small messages on the loop (docs/cuda.md). Small round trips,
# staged, both ways.
{
  echo
  echo "staged pingpong on cuda:0, p50 (--device-channel none, --reps $REPS):"
  echo
  echo "| size | copy pool (default) | TP_PIPE_CUDA_LOOP_MAX=64K |"
  echo "|---|---|---|"
} >>"$SUM"
for mode in pool loop; do
  envs=()
  [ "$mode" = loop ] && envs=(TP_PIPE_CUDA_LOOP_MAX=64K)
  log "bench pipe --device cuda:0 staged ($mode)"
  env "${envs[@]}" timeout -k 5 "$TIMEOUT_S" "$BUILD/tools/tpipe" bench pipe \
    --device cuda:0 --device-channel none --transport shm --channel cma \
    --sizes 64,4K,64K --test pingpong --reps "$REPS" --budget "$BUDGET" \
    --json >"$OUT/bench_loop_$mode.jsonl" 2>"$OUT/bench_loop_$mode.txt" || {
    echo "bench pipe staged ($mode): exit $? (see bench_loop_$mode.txt)" >>"$SUM"
    failed=1
  }
done
python3 - "$OUT/bench_loop_pool.jsonl" "$OUT/bench_loop_loop.jsonl" \
  >>"$SUM" <<'PYEOF' || true
import json, sys
def p50(path):
    out = {}
    try:
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                if r["mode"] != "copy" and r["test"] == "pingpong":
                    out[r["size"]] = r["p50_us"]
    except OSError:
        pass
    return out
a, b = p50(sys.argv[1]), p50(sys.argv[2])
for size in sorted(set(a) | set(b)):
    f = lambda d: "%.1f us" % d[size] if size in d else "-"
    print("| %d | %s | %s |" % (size, f(a), f(b)))
PYEOF

log "done: $SUM"
cat "$SUM"
exit $failed
