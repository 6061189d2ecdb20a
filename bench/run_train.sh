#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_train.sh - distributed training on Fashion-MNIST, tp_train beside
# PyTorch 1.13 (../shared/peers/torch_train_bench.py), in one session:
#   /usr/bin/python3 torch_train_bench.py --mode ps  --trainers 2 --limit 0
#   tpipe run -n 3 tp_train --mode ps
#   /usr/bin/python3 torch_train_bench.py --mode ddp --ranks 2 --limit 0
#   tpipe run -n 2 tp_train --mode ddp
# each REPS times, alternating (so that both see the same conditions),
# with the same model (MLP 784-512-10, ReLU, cross entropy), data (the
# whole training set, x / 255, not shuffled, split in 2 shards; the whole
# test set), batch 64, SGD lr 0.05 and one epoch. Then a markdown report
# of the medians (samples/s, test accuracy), the ratios and the targets
# (ps >= 5x, ddp >= 1.5x, at equal or better accuracy).
#
#   bash bench/run_train.sh                  # ~4-6 min with REPS=5
#   REPS=3 bash bench/run_train.sh
#   MODES=ddp bash bench/run_train.sh
#   SKIP_PEERS=1 bash bench/run_train.sh     # tp_train only
#   ENV_BOTH="OPENBLAS_CORETYPE=SKYLAKEX" bash bench/run_train.sh
#
# Env: TPIPE (the tpipe binary) and TP_TRAIN (tp_train; default: both built
#      into $BUILD_DIR, default <repo>/build-bench), REPS (5), MODES ("ps
#      ddp"), TP_ARGS (extra tp_train arguments), ENV_BOTH (variables set
#      for both frameworks' processes, e.g. an OpenBLAS setting), SEEDS=1
#      (tp_train's --seed is the repetition's number instead of 0, to show
#      how the test accuracy depends on the initial draw), OUT, SAVE (1:
#      also copy the report to bench/results/train-<stamp>.md).
# Writes $OUT/{raw.txt,report.md,*.log}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=train
SAVE=${SAVE:-1}
REPS=${REPS:-5}
MODES=${MODES:-ps ddp}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

if [ -z "${TP_TRAIN:-}" ]; then
  TP_TRAIN=$BUILD_DIR/examples/train/tp_train
  log "building tp_train in $BUILD_DIR"
  cmake --build "$BUILD_DIR" --target tp_train -j"$(nproc)" \
    >>"$BUILD_DIR/bench-build.log" 2>&1 ||
    { log "build failed: see $BUILD_DIR/bench-build.log"; exit 1; }
fi
PEER=$PEERS_DIR/torch_train_bench.py
TORCH_PY=/usr/bin/python3 # the system python has torch (pyenv's has not)
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  log "no /usr/share/datasets/fashion-mnist: apt-get install dataset-fashion-mnist"
  exit 1
fi
if [ -z "${SKIP_PEERS:-}" ] && ! "$TORCH_PY" -c "import torch" 2>/dev/null; then
  log "no torch for $TORCH_PY: apt-get install python3-torch (or SKIP_PEERS=1)"
  exit 1
fi

# What OpenBLAS picked for this CPU in each: torch uses OpenBLAS's own
# detection (in a VM it may fall back to the generic "Prescott" kernels);
# libtpipe names the kernels from the CPU's features when it is loaded
# (docs/autograd.md, "Which BLAS kernels"), unless OPENBLAS_CORETYPE is set.
BLAS_CORE_TORCH=$(env ${ENV_BOTH:-} OPENBLAS_VERBOSE=2 /usr/bin/python3 -c \
  'import torch; torch.ones(4, 4) @ torch.ones(4, 4)' 2>&1 |
  sed -n 's/^Core: //p' | head -1)
BLAS_CORE_TP=$(env ${ENV_BOTH:-} OPENBLAS_VERBOSE=2 "$TP_TRAIN" --mode local \
  --synthetic 256 --progress 0 2>&1 | sed -n 's/^Core: //p' | head -1)
BLAS_CORE="PyTorch ${BLAS_CORE_TORCH:-unknown}, tpipe ${BLAS_CORE_TP:-unknown}"
: >"$OUT/raw.txt"
port=29600
for rep in $(seq 1 "$REPS"); do
  seed=0
  [ "${SEEDS:-0}" = 1 ] && seed=$((rep - 1))
  for mode in $MODES; do
    if [ "$mode" = ps ]; then n=3; peer_args="--mode ps --trainers 2"; else
      n=2; peer_args="--mode ddp --ranks 2"; fi
    if [ -z "${SKIP_PEERS:-}" ]; then
      port=$((port + 7))
      log "rep $rep: pytorch $mode"
      # shellcheck disable=SC2086
      line=$(env ${ENV_BOTH:-} "$TORCH_PY" "$PEER" $peer_args --epochs 1 \
        --batch 64 --lr 0.05 --limit 0 --port "$port" \
        2>>"$OUT/pytorch-$mode.log" | tee -a "$OUT/pytorch-$mode.log" |
        grep '^TRAIN ')
      if [ -n "$line" ]; then
        echo "pytorch $mode $rep $line" >>"$OUT/raw.txt"
      else
        log "pytorch $mode failed, see $OUT/pytorch-$mode.log"; rc=1
      fi
    fi
    log "rep $rep: tp_train $mode (seed $seed)"
    # shellcheck disable=SC2086
    line=$(env ${ENV_BOTH:-} "$TPIPE" run -n "$n" --timeout 600 -- \
      "$TP_TRAIN" --mode "$mode" --epochs 1 --batch 64 --lr 0.05 \
      --seed "$seed" --progress 0 ${TP_ARGS:-} 2>&1 |
      tee -a "$OUT/tpipe-$mode.log" | sed -n 's/^\[0\] \(result: .*\)/\1/p')
    if [ -n "$line" ]; then
      echo "tpipe $mode $rep $line" >>"$OUT/raw.txt"
    else
      log "tp_train $mode failed, see $OUT/tpipe-$mode.log"; rc=1
    fi
  done
done

{
  echo "## tp_train vs PyTorch 1.13: distributed training on Fashion-MNIST ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, $(uname -r))"
  echo
  echo "MLP 784-512-10, batch 64, SGD lr 0.05, one epoch over the 60000 training images split between 2 trainers (ps: plus a server) or 2 ranks (ddp); test accuracy on the 10000 test images."
  echo "PyTorch: \`/usr/bin/python3 ../shared/peers/torch_train_bench.py --mode ps|ddp --limit 0\` (its defaults: 1 torch thread per process, ps with the server lock from forward to step). tpipe: \`tpipe run -n 3|2 tp_train --mode ps|ddp\` ${TP_ARGS:+with \`$TP_ARGS\` }(its defaults; docs/training.md)."
  echo "Runs alternate, $REPS of each; medians (min-max). OpenBLAS kernels: ${BLAS_CORE}${ENV_BOTH:+; both run with \`$ENV_BOTH\`}. Load average before / after: $LOAD0 / $(cut -d' ' -f1-3 /proc/loadavg)."
  echo
  "$PY" - "$OUT/raw.txt" <<'PYEOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    fw, mode, rep, rest = line.split(" ", 3)
    kv = dict(re.findall(r"(\w+)=([^\s]+)", rest))
    sps = float(kv["samples_per_s"])
    acc = float(kv.get("test_accuracy", kv.get("test_acc", "nan")))
    rows.setdefault((fw, mode), []).append((sps, acc))
def med(v):
    return statistics.median(v)
def cell(v, fmt):
    return f"{fmt.format(med(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"
targets = {"ps": 5.0, "ddp": 1.5}
print("| mode | PyTorch samples/s | tpipe samples/s | ratio | target | PyTorch test acc | tpipe test acc |")
print("|---|---|---|---|---|---|---|")
for mode in ("ps", "ddp"):
    t, p = rows.get(("tpipe", mode)), rows.get(("pytorch", mode))
    if not t:
        continue
    ts, ta = [r[0] for r in t], [r[1] for r in t]
    if p:
        ps_, pa = [r[0] for r in p], [r[1] for r in p]
        ratio = med(ts) / med(ps_)
        ok = "met" if ratio >= targets[mode] and med(ta) >= med(pa) - 0.005 else "not met"
        print(f"| {mode} | {cell(ps_, '{:.0f}')} | {cell(ts, '{:.0f}')} | "
              f"{ratio:.2f}x | >= {targets[mode]}x: {ok} | {cell(pa, '{:.4f}')} | {cell(ta, '{:.4f}')} |")
    else:
        print(f"| {mode} | - | {cell(ts, '{:.0f}')} | - | - | - | {cell(ta, '{:.4f}')} |")
print()
print("Accuracy counts as equal within 0.005 (the spread of one epoch's result over initial draws and trainer interleavings). For reference, the data set's README table lists an MLP 256-128-100 at 0.8833 (trained to convergence).")
PYEOF
  echo
  echo "Raw lines: \`$OUT/raw.txt\`."
} >"$OUT/report.md"
finish_report train
exit $rc
