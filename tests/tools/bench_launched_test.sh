#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_launched_test.sh TPIPE [PYTHON3] - `tpipe bench transport|rpc|
# collective` and `bench pipe --test msgrate` (2 and 4 ranks: 1 and 2
# pairs) as ranks of a launched job on this host (`tpipe run -n N`,
# env:// over loopback): rank 0 prints a row with numbers per size or
# test, the other ranks nothing, every rank exits 0; a rank whose rank 0
# never comes fails within its deadline naming the store; bad launcher
# variables and options a launched run cannot take exit 2.
# tests/netns/netns_bench_launched_test.sh runs the same across two
# network namespaces.
set -u
TPIPE=$1
PY=${2:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "bench_launched_test: FAIL: $*" >&2; exit 1; }
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT TP_INIT_METHOD

# run NAME N ARGS...: `tpipe run -n N tpipe bench ARGS --json`, rank 0's
# lines (the launcher's "[0] " taken off) in $TMP/NAME.jsonl.
run() {
  local name=$1 n=$2
  shift 2
  timeout -k 5 120 "$TPIPE" run -n "$n" -- "$TPIPE" bench "$@" --json \
    >"$TMP/$name.out" 2>&1 ||
    { cat "$TMP/$name.out" >&2; fail "$name: exit $?"; }
  grep -v '^\[0\] {' "$TMP/$name.out" | grep -q '^\[[1-9][0-9]*\] {' &&
    { cat "$TMP/$name.out" >&2; fail "$name: a rank other than 0 printed a row"; }
  grep '^\[0\] {' "$TMP/$name.out" | sed 's/^\[0\] //' >"$TMP/$name.jsonl"
}

# check NAME KEY WANT...: every row has a positive number under KEY and
# the rows' (test or op, size) are exactly WANT ("noop:0", ...).
check() {
  "$PY" - "$TMP/$1.jsonl" "$2" "${@:3}" <<'PYEOF' ||
import json, math, sys
path, key, want = sys.argv[1], sys.argv[2], set(sys.argv[3:])
seen = []
for line in open(path):
    o = json.loads(line)
    name = o.get("test", o.get("op"))
    k = key if name not in ("async", "barrier") else \
        ("calls_per_s" if name == "async" else "time_us")
    v = o[k]
    assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, line
    seen.append("%s:%d" % (name, o["size"]))
assert sorted(seen) == sorted(want), "rows %s, want %s" % (seen, sorted(want))
PYEOF
    { cat "$TMP/$1.out" >&2; fail "$1: rows"; }
}

args=(--budget 0.05 --stall-timeout 10)
run transport 2 transport --sizes 64,64K "${args[@]}"
"$PY" - "$TMP/transport.jsonl" <<'PYEOF' || { cat "$TMP/transport.out" >&2; fail "transport rows"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
got = sorted((o["test"], o["size"]) for o in rows)
assert got == sorted([("pingpong", 64), ("pingpong", 65536), ("stream", 64),
                      ("stream", 65536)]), got
for o in rows:
    v = o["p50_us"] if o["test"] == "pingpong" else o["gbps"]
    assert v is not None and v > 0 and o["transport"] == "tcp", o
PYEOF
echo "bench_launched_test: bench transport launched: ok"

run rpc 2 rpc --test noop,echo,async,init --sizes 64,1M --reps 2 "${args[@]}"
check rpc p50_us noop:0 echo:64 echo:1048576 async:0 init:0
"$PY" - "$TMP/rpc.jsonl" <<'PYEOF' || { cat "$TMP/rpc.out" >&2; fail "rpc init"; }
import json, sys
for o in map(json.loads, open(sys.argv[1])):
    assert o["transport"] == "tcp" and o["reps"] == 2, o
    if o["test"] == "init":
        assert o["init_max_us"] >= o["p50_us"] > 0, o
PYEOF
run rpc3 3 rpc --test noop,rref_fork --reps 1 "${args[@]}"
check rpc3 p50_us noop:0 rref_fork:0
echo "bench_launched_test: bench rpc launched (2 and 3 ranks): ok"

run coll 3 collective --op all_reduce,all_gather,barrier --sizes 4K,64K \
  --reps 2 --budget 0.02 --timeout 60
check coll time_us all_reduce:4096 all_reduce:65536 all_gather:4092 \
  all_gather:65532 barrier:0
"$PY" - "$TMP/coll.jsonl" <<'PYEOF' || { cat "$TMP/coll.out" >&2; fail "coll world"; }
import json, sys
for o in map(json.loads, open(sys.argv[1])):
    assert o["world"] == 3 and o["reps"] == 2, o
PYEOF
echo "bench_launched_test: bench collective launched (3 ranks): ok"

# bench pipe --test msgrate (OSU's osu_mbw_mr) as a launched job: ranks
# 0..P-1 stream to P..2P-1 at once, rank 0 prints the sums of the pairs.
run msgrate2 2 pipe --test msgrate --sizes 64,4K "${args[@]}"
check msgrate2 msgs_per_s msgrate:64 msgrate:4096
run msgrate4 4 pipe --test msgrate --sizes 64,1K "${args[@]}"
check msgrate4 msgs_per_s msgrate:64 msgrate:1024
"$PY" - "$TMP/msgrate2.jsonl" "$TMP/msgrate4.jsonl" <<'PYEOF' || { cat "$TMP"/msgrate*.out >&2; fail "msgrate pairs"; }
import json, sys
for path, pairs in ((sys.argv[1], 1), (sys.argv[2], 2)):
    for o in map(json.loads, open(path)):
        assert o["pairs"] == pairs and o["mode"] == "remote", o
        assert o["transport"] == "tcp" and o["iters"] > 0 and o["gbps"] > 0, o
PYEOF
echo "bench_launched_test: bench pipe --test msgrate launched (2 and 4 ranks): ok"

# A rank whose rank 0 never comes: a clear error within its deadline. A
# fresh free port for each; if another test's server takes it meanwhile,
# the rank fails at once saying the port holds no tpipe store, which is as
# right (CTest runs tests in parallel).
for cmd in "rpc --stall-timeout 2" "collective --timeout 2" \
           "transport --stall-timeout 1"; do
  port=$("$TPIPE" run -n 1 --no-job-token sh -c 'echo $MASTER_PORT' |
    sed 's/^\[0\] //')
  t0=$SECONDS
  st=0
  # shellcheck disable=SC2086
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 5 60 "$TPIPE" bench $cmd >"$TMP/lone.txt" 2>&1 || st=$?
  [ $st -eq 1 ] || { cat "$TMP/lone.txt" >&2; fail "$cmd alone: exit $st, want 1"; }
  [ $((SECONDS - t0)) -le 15 ] || fail "$cmd alone: took $((SECONDS - t0)) s"
  grep -q "rank 1" "$TMP/lone.txt" && grep -q "127.0.0.1:$port" "$TMP/lone.txt" &&
    grep -Eq "timed out|not a tpipe store" "$TMP/lone.txt" ||
    { cat "$TMP/lone.txt" >&2; fail "$cmd alone: the error lacks the rank, the store or 'timed out'"; }
done
echo "bench_launched_test: a rank without its rank 0 fails in time: ok"

# Launched msgrate with its rank 3 missing: rank 1 (no server URL) and
# rank 0 (rank 1 never ready) fail within their deadlines, saying so.
pids=()
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 5 60 "$TPIPE" bench pipe --test msgrate --sizes 64 \
    --budget 0.05 --stall-timeout 1 >"$TMP/mr$r.txt" 2>&1 &
  pids+=($!)
done
t0=$SECONDS
for r in 0 1 2; do
  st=0
  wait "${pids[$r]}" || st=$?
  [ $st -eq 1 ] || { cat "$TMP"/mr?.txt >&2; fail "msgrate without rank 3: rank $r exit $st, want 1"; }
done
[ $((SECONDS - t0)) -le 15 ] || fail "msgrate without rank 3: took $((SECONDS - t0)) s"
# Rank 1's wait ends at its own deadline, or (when rank 0, which hosts the
# store, gave up first and exited) when the store goes away: both name
# what it waited for.
grep -Eq "rank 1: waiting for rank 3's URL: .*(timed out|connection closed by the peer)" "$TMP/mr1.txt" &&
  grep -q "rank 0: waiting for the other 1 measuring rank(s) to be ready: .*timed out" "$TMP/mr0.txt" ||
  { cat "$TMP"/mr?.txt >&2; fail "msgrate without rank 3: the errors"; }
echo "bench_launched_test: msgrate with a rank missing fails in time: ok"

# Usage errors: exit 2 with the reason.
expect2() {
  local want=$1
  shift
  st=0
  env "$@" >"$TMP/u.txt" 2>&1 || st=$?
  [ $st -eq 2 ] && grep -q -- "$want" "$TMP/u.txt" ||
    { cat "$TMP/u.txt" >&2; fail "$*: exit $st or no \"$want\""; }
}
expect2 'RANK in 0..WORLD_SIZE-1' RANK=2 WORLD_SIZE=2 "$TPIPE" bench rpc
expect2 'RANK in 0..WORLD_SIZE-1' RANK=x WORLD_SIZE=2 "$TPIPE" bench collective
expect2 'WORLD_SIZE in 2..2' RANK=0 WORLD_SIZE=3 "$TPIPE" bench transport
expect2 'not with --world or --store' RANK=0 WORLD_SIZE=2 "$TPIPE" bench \
  collective --world 2
expect2 'one transport' RANK=0 WORLD_SIZE=2 "$TPIPE" bench rpc --transport all
expect2 'needs a third rank' RANK=0 WORLD_SIZE=2 "$TPIPE" bench rpc --test rref_fork
expect2 'a launched run needs' "$TPIPE" bench collective --launched
expect2 'a launched msgrate run needs an even WORLD_SIZE' RANK=0 WORLD_SIZE=3 \
  "$TPIPE" bench pipe --test msgrate
expect2 'not --listen or --connect' "$TPIPE" bench pipe --test msgrate --listen
echo "bench_launched_test: ok"
