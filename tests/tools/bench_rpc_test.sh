#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_rpc_test.sh TPIPE [PYTHON3] - `tpipe bench rpc` end to end: the
# JSON lines (schema, values, one per transport, test and size, the RRef
# tests remote and rref_fork and dist_autograd included) over shm (when
# viable here) and tcp with 2 repetitions, the table, and usage errors (exit 2).
set -u
TPIPE=$1
PY=${2:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "bench_rpc_test: FAIL: $*" >&2; exit 1; }

timeout -k 5 150 "$TPIPE" bench rpc --sizes 64,1M --budget 0.1 --reps 2 \
  --json >"$TMP/out.jsonl" 2>"$TMP/err.txt"
rc=$?
[ $rc -eq 0 ] || { cat "$TMP/out.jsonl" "$TMP/err.txt" >&2; fail "exit $rc"; }

"$PY" - "$TMP/out.jsonl" "$TMP/err.txt" <<'PYEOF' || { cat "$TMP/err.txt" >&2; fail "bad JSON"; }
import json, math, sys
KEYS = ("bench", "transport", "channel", "test", "size", "p50_us", "p10_us",
        "p90_us", "min_us", "max_us", "gbps", "calls_per_s", "init_max_us",
        "calls", "reps")
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(v) and v > 0
seen = set()
lines = [l for l in open(sys.argv[1]) if l.strip()]
for line in lines:
    o = json.loads(line)
    miss = [k for k in KEYS if k not in o]
    assert not miss, "missing %s: %s" % (miss, line)
    assert o["bench"] == "rpc" and o["transport"] in ("shm", "tcp"), line
    assert o["reps"] == 2, line
    assert isinstance(o["channel"], str) and o["channel"], line
    t = o["test"]
    if t in ("remote", "rref_fork", "dist_autograd"):
        assert o["size"] == 0 and o["gbps"] is None, line
        assert all(num(o[k]) for k in ("p50_us", "p10_us", "p90_us",
                                       "min_us", "max_us")), line
        assert o["min_us"] <= o["p50_us"] <= o["max_us"], line
        assert o["calls_per_s"] is None and o["calls"] >= 200, line
    elif t in ("noop", "echo"):
        assert all(num(o[k]) for k in ("p50_us", "p10_us", "p90_us",
                                       "min_us", "max_us")), line
        assert o["min_us"] <= o["p10_us"] <= o["p50_us"] <= o["p90_us"] \
            <= o["max_us"], line
        assert o["calls_per_s"] is None and o["init_max_us"] is None, line
        assert o["calls"] >= (200 if t == "noop" else 10), line
        if t == "noop":
            assert o["size"] == 0 and o["gbps"] is None, line
        else:
            assert o["size"] in (64, 1 << 20) and num(o["gbps"]), line
            assert abs(o["gbps"] - 2 * o["size"] / o["p50_us"] / 1e3) \
                <= 0.01 * o["gbps"], line
    elif t == "async":
        assert o["size"] == 0 and num(o["calls_per_s"]), line
        assert o["p50_us"] is None and o["gbps"] is None, line
        assert o["calls"] >= 2 * 640, line
    else:
        assert t == "init" and o["size"] == 0, line
        assert num(o["p50_us"]) and num(o["init_max_us"]), line
        assert o["init_max_us"] >= o["p50_us"], line
        assert o["calls_per_s"] is None and o["gbps"] is None, line
    seen.add((o["transport"], t, o["size"]))
trs = sorted({tr for tr, _, _ in seen})
assert "tcp" in trs, "no tcp lines"
if "shm" not in trs:
    assert "skipping shm" in open(sys.argv[2]).read(), "shm neither " \
        "measured nor skipped with a reason"
want = {(tr, t, s) for tr in trs for t, s in (("noop", 0), ("echo", 64),
        ("echo", 1 << 20), ("async", 0), ("init", 0), ("remote", 0),
        ("rref_fork", 0), ("dist_autograd", 0))}
assert seen == want and len(lines) == len(want), "got %s" % sorted(seen)
PYEOF

# The table: a header and one row per test.
timeout -k 5 60 "$TPIPE" bench rpc --transport tcp --test noop,init \
  --budget 0.05 --reps 1 >"$TMP/table.txt" 2>&1 ||
  { cat "$TMP/table.txt" >&2; fail "table run"; }
grep -q '^transport  *channel  *test  *size  *p50_us' "$TMP/table.txt" &&
  grep -q '^tcp  .*noop' "$TMP/table.txt" &&
  grep -q '^tcp  .*init' "$TMP/table.txt" ||
  { cat "$TMP/table.txt" >&2; fail "table lacks the header or a row"; }

# Usage errors.
for args in "--test bogus" "--transport nope" "--sizes 6" "--reps 0" \
            "--channel nope" "--inflight 0"; do
  st=0
  # shellcheck disable=SC2086
  "$TPIPE" bench rpc $args >"$TMP/u.txt" 2>&1 || st=$?
  [ $st -eq 2 ] || { cat "$TMP/u.txt" >&2; fail "$args: exit $st, want 2"; }
done
echo "bench_rpc_test: ok"
