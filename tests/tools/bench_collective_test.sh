#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_collective_test.sh TPIPE [PYTHON3] - `tpipe bench collective` end
# to end with 2 ranks: the JSON lines (schema, values, busbw = algbw x the
# nccl-tests factor), the table, --plot's SVG, --engine pipe, and usage
# errors (exit 2). Short runs: --iters 5 --warmup 1 --reps 1.
set -u
TPIPE=$1
PY=${2:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "bench_collective_test: FAIL: $*" >&2; exit 1; }
ARGS="--world 2 --op all_reduce,barrier,all_gather --sizes 4K,64K --iters 5
      --warmup 1 --reps 1"

# check_json FILE ENGINE: the lines of one --json run (ENGINE "any": the
# default engine, whichever it is here).
check_json() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, math, sys
KEYS = ("bench", "op", "size", "count", "dtype", "world", "engine",
        "time_us", "algbw_gbps", "busbw_gbps", "busbw_factor", "iters",
        "warmup", "time_min_us", "time_max_us", "reps")
FACTOR = {"all_reduce": 1.0, "all_gather": 0.5, "barrier": 0.0}  # n = 2
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(v)
want_engine = sys.argv[2]
seen = []
lines = [l for l in open(sys.argv[1]) if l.strip()]
for line in lines:
    o = json.loads(line)
    miss = [k for k in KEYS if k not in o]
    assert not miss, "missing %s: %s" % (miss, line)
    assert o["bench"] == "collective" and o["world"] == 2, line
    assert o["reps"] == 1 and o["iters"] == 5 and o["warmup"] == 1, line
    assert o["engine"] in ("shm", "pipe"), line
    assert want_engine == "any" or o["engine"] == want_engine, line
    op = o["op"]
    assert op in FACTOR, line
    assert num(o["time_us"]) and o["time_us"] > 0, line
    assert o["time_min_us"] <= o["time_us"] <= o["time_max_us"], line
    assert o["busbw_factor"] == FACTOR[op], line
    if op == "barrier":
        assert o["size"] == 0 and o["count"] == 0 and o["dtype"] is None, line
        assert o["algbw_gbps"] == 0 and o["busbw_gbps"] == 0, line
    else:
        assert o["size"] in (4096, 65536) and o["dtype"] == "f32", line
        assert o["count"] == o["size"] // 4, line
        assert num(o["algbw_gbps"]) and o["algbw_gbps"] > 0, line
        # algbw = size / time (1 GB = 1e9 B), busbw = algbw x factor.
        alg = o["size"] / o["time_us"] / 1e3
        assert abs(o["algbw_gbps"] - alg) <= 1e-4 * alg, line
        bus = o["algbw_gbps"] * FACTOR[op]
        assert abs(o["busbw_gbps"] - bus) <= 1e-4 * bus, line
    seen.append((op, o["size"]))
want = [("all_reduce", 4096), ("all_reduce", 65536), ("barrier", 0),
        ("all_gather", 4096), ("all_gather", 65536)]
assert seen == want, "got %s" % seen
PYEOF
}

# JSON, default engine.
# shellcheck disable=SC2086
timeout -k 5 60 "$TPIPE" bench collective $ARGS --json \
  >"$TMP/out.jsonl" 2>"$TMP/err.txt"
rc=$?
[ $rc -eq 0 ] || { cat "$TMP/out.jsonl" "$TMP/err.txt" >&2; fail "exit $rc"; }
check_json "$TMP/out.jsonl" any || { cat "$TMP/out.jsonl" >&2; fail "bad JSON"; }

# JSON, --engine pipe (and the tcp store).
# shellcheck disable=SC2086
timeout -k 5 60 "$TPIPE" bench collective $ARGS --json --engine pipe \
  --store tcp >"$TMP/pipe.jsonl" 2>"$TMP/err.txt"
rc=$?
[ $rc -eq 0 ] || { cat "$TMP/pipe.jsonl" "$TMP/err.txt" >&2; fail "pipe: exit $rc"; }
check_json "$TMP/pipe.jsonl" pipe ||
  { cat "$TMP/pipe.jsonl" >&2; fail "bad JSON with --engine pipe"; }

# The table and --plot: a header, one row per op and size (each printed as
# it completes), and the SVG written here (no gnuplot): bandwidth and time
# per call side by side, the op names literal in the legend.
# shellcheck disable=SC2086
timeout -k 5 60 "$TPIPE" bench collective $ARGS --plot "$TMP/coll.svg" \
  >"$TMP/table.txt" 2>&1 || { cat "$TMP/table.txt" >&2; fail "table run"; }
grep -q '^op  *size  *count  *dtype  *engine  *iters  *time_us  *algbw  *busbw$' \
  "$TMP/table.txt" &&
  [ "$(grep -c '^all_reduce  ' "$TMP/table.txt")" -eq 2 ] &&
  [ "$(grep -c '^all_gather  ' "$TMP/table.txt")" -eq 2 ] &&
  grep -q '^barrier  *0  *0  *-  ' "$TMP/table.txt" &&
  grep -q "^# plot written to $TMP/coll.svg" "$TMP/table.txt" ||
  { cat "$TMP/table.txt" >&2; fail "table lacks the header or a row"; }
"$PY" -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' \
  "$TMP/coll.svg" || fail "SVG is not well-formed XML"
grep -q '>all_reduce</text>' "$TMP/coll.svg" &&
  grep -q '>all_gather</text>' "$TMP/coll.svg" &&
  ! grep -q '>barrier</text>' "$TMP/coll.svg" &&
  grep -q 'time per call' "$TMP/coll.svg" &&
  grep -q 'busbw' "$TMP/coll.svg" &&
  [ "$(grep -c '<polyline' "$TMP/coll.svg")" -eq 4 ] ||
  { cat "$TMP/coll.svg" >&2; fail "SVG lacks a panel, curve or legend"; }

# Usage errors: a message naming the problem, exit 2.
check_usage() {
  local want=$1
  shift
  st=0
  "$TPIPE" bench collective "$@" >"$TMP/u.txt" 2>&1 || st=$?
  [ $st -eq 2 ] || { cat "$TMP/u.txt" >&2; fail "$*: exit $st, want 2"; }
  grep -q "$want" "$TMP/u.txt" ||
    { cat "$TMP/u.txt" >&2; fail "$*: no \"$want\" in the message"; }
}
check_usage 'unknown op "bogus"' --op all_reduce,bogus
check_usage 'bad size "6"' --sizes 4K,6
check_usage 'bad size "abc"' --sizes abc
check_usage 'world must be 1..' --world 0
check_usage 'unknown engine "gpu"' --engine gpu
check_usage 'reps must be' --reps 0
check_usage 'exclude each other' --sizes 4K --min-bytes 4K
check_usage 'too small for all_gather' --op all_gather --world 3 --sizes 8
echo "bench_collective_test: ok"
