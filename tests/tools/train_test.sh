#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# train_test.sh TPIPE TP_TRAIN - examples/train/tp_train on synthetic data
# (no data set package needed), loopback only, each job under a deadline:
#   1. --mode ps with one trainer (`tpipe run -n 2`) ends with the same
#      parameters as --mode local (same seed and samples), to 1e-5;
#   2. --mode ps with two trainers finishes and reports its result;
#   3. --mode ddp with two ranks finishes and both replicas end equal;
#   4. bad data (a corrupt IDX file, a bad CSV row, a missing folder) fails
#      with a message naming the file.
set -u
TPIPE=$1
TRAIN=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "train_test: FAIL: $*"; for f in "$out"/*.log; do echo "== $f"; cat "$f"; done; exit 1; }
COMMON="--synthetic 600 --limit 320 --batch 32 --progress 0 --timeout-ms 60000"

# 1. Parameter server with one trainer == local training.
"$TRAIN" --mode local $COMMON --save-params "$out/local.bin" >"$out/local.log" 2>&1 ||
    fail "tp_train --mode local exited $?"
grep -q "^result: mode=local workers=1 batch=32 epochs=1 samples=320 " "$out/local.log" ||
    fail "local: no result line"
st=0
"$TPIPE" run -n 2 --grace 2 --timeout 120 "$TRAIN" --mode ps $COMMON \
    --check-params "$out/local.bin" --tol 1e-5 >"$out/ps1.log" 2>&1 || st=$?
[ "$st" = 0 ] || fail "tpipe run -n 2 tp_train --mode ps exited $st"
grep -q "^\[0\] ps: parameters match .*local.bin: max |diff| " "$out/ps1.log" ||
    fail "ps with one trainer: parameters differ from local training"
lloss=$(sed -n 's/^result: .* final_loss=\([0-9.]*\) .*/\1/p' "$out/local.log")
ploss=$(sed -n 's/^\[0\] result: .* final_loss=\([0-9.]*\) .*/\1/p' "$out/ps1.log")
[ -n "$lloss" ] && [ "$lloss" = "$ploss" ] || fail "loss: local $lloss, ps $ploss"

# 2. Two trainers.
st=0
"$TPIPE" run -n 3 --grace 2 --timeout 120 "$TRAIN" --mode ps $COMMON \
    >"$out/ps2.log" 2>&1 || st=$?
[ "$st" = 0 ] || fail "tpipe run -n 3 tp_train --mode ps exited $st"
grep -q "^\[0\] result: mode=ps workers=2 batch=32 epochs=1 samples=320 .*test_acc=" "$out/ps2.log" ||
    fail "ps with two trainers: no result line"
for r in 1 2; do
    grep -q "^\[$r\] trainer$r: epoch 1/1: loss " "$out/ps2.log" || fail "trainer$r: no epoch line"
done

# 3. Data parallel, two ranks, the gradient hook and without it.
for ov in "" "--no-overlap"; do
    st=0
    "$TPIPE" run -n 2 --grace 2 --timeout 120 "$TRAIN" --mode ddp $COMMON $ov \
        >"$out/ddp.log" 2>&1 || st=$?
    [ "$st" = 0 ] || fail "tpipe run -n 2 tp_train --mode ddp $ov exited $st"
    for r in 0 1; do
        grep -q "^\[$r\] ddp rank $r: replicas equal: max |diff| from rank 0's parameters 0 over 2 ranks" "$out/ddp.log" ||
            fail "ddp $ov: rank $r: replicas not equal"
    done
    grep -q "^\[0\] result: mode=ddp workers=2 batch=32 epochs=1 samples=320 " "$out/ddp.log" ||
        fail "ddp $ov: no result line"
done

# 4. Bad data: clear errors naming the file.
mkdir "$out/idx"
printf 'not an idx file at all' >"$out/idx/train-images-idx3-ubyte"
printf '\000\000\010\001\000\000\000\001\007' >"$out/idx/train-labels-idx1-ubyte"
st=0
"$TRAIN" --mode local --data "$out/idx" >"$out/bad.log" 2>&1 || st=$?
[ "$st" != 0 ] || fail "a corrupt IDX file was accepted"
grep -q "tp_train: local: loading the data: $out/idx/train-images-idx3-ubyte: bad magic" "$out/bad.log" ||
    fail "corrupt IDX: unclear error"
printf '1,2,3\n4,5\n' >"$out/bad.csv"
st=0
"$TRAIN" --mode local --csv "$out/bad.csv" >"$out/bad.log" 2>&1 || st=$?
[ "$st" != 0 ] || fail "a bad CSV file was accepted"
grep -q "$out/bad.csv:2: only 2 columns (the first row has 3)" "$out/bad.log" ||
    fail "bad CSV: unclear error"
st=0
"$TRAIN" --mode local --data "$out/none" >"$out/bad.log" 2>&1 || st=$?
[ "$st" != 0 ] && grep -q "no .*train-images-idx3-ubyte (or .gz) in $out/none" "$out/bad.log" ||
    fail "missing data folder: unclear error"
rm -f "$out/bad.log"
echo "train_test: ok"
