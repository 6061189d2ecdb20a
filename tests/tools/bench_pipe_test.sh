#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_pipe_test.sh TPIPE [PYTHON3] - `tpipe bench pipe` end to end over
# tcp+basic: the JSON lines (schema, values, one per size and test) and
# --plot writing a well-formed SVG.
set -u
TPIPE=$1
PY=${2:-python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "bench_pipe_test: FAIL: $*" >&2; exit 1; }

timeout -k 5 120 "$TPIPE" bench pipe --transport tcp --channel basic \
  --sizes 64,1M --reps 1 --json >"$TMP/out.jsonl" 2>"$TMP/err.txt"
rc=$?
[ $rc -eq 0 ] || { cat "$TMP/out.jsonl" "$TMP/err.txt" >&2; fail "exit $rc"; }

"$PY" - "$TMP/out.jsonl" <<'PYEOF' || { cat "$TMP/err.txt" >&2; fail "bad JSON"; }
import json, math, sys
KEYS = ("bench", "transport", "channel", "mode", "test", "size", "payloads",
        "payload_size", "p50_us", "p90_us", "p99_us", "gbps", "iters", "reps")
def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(v) and v > 0
seen = set()
lines = [l for l in open(sys.argv[1]) if l.strip()]
for line in lines:
    o = json.loads(line)
    miss = [k for k in KEYS if k not in o]
    assert not miss, "missing %s: %s" % (miss, line)
    assert o["bench"] == "pipe" and o["transport"] == "tcp" and \
        o["channel"] == "basic" and o["mode"] == "proc", line
    assert o["reps"] == 1 and o["iters"] >= 10 and o["payloads"] == 0, line
    if o["test"] == "pingpong":
        assert all(num(o[k]) for k in ("p50_us", "p90_us", "p99_us")), line
        assert o["p50_us"] <= o["p90_us"] <= o["p99_us"], line
        assert o["gbps"] is None, line
    else:
        assert o["test"] == "stream" and num(o["gbps"]), line
        assert o["p50_us"] is None and o["p99_us"] is None, line
    seen.add((o["test"], o["size"]))
want = {(t, s) for t in ("pingpong", "stream") for s in (64, 1 << 20)}
assert seen == want and len(lines) == 4, "got %s" % sorted(seen)
PYEOF

timeout -k 5 120 "$TPIPE" bench pipe --transport tcp --channel basic \
  --sizes 64,64K,1M --test stream --budget 0.05 --plot "$TMP/p.svg" \
  >"$TMP/plot.txt" 2>&1 || { cat "$TMP/plot.txt" >&2; fail "--plot run"; }
[ -s "$TMP/p.svg" ] || fail "no SVG written"
if command -v xmllint >/dev/null 2>&1; then
  xmllint --noout "$TMP/p.svg" || fail "SVG is not well-formed XML"
else
  "$PY" -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' \
    "$TMP/p.svg" || fail "SVG is not well-formed XML"
fi
grep -q '<svg' "$TMP/p.svg" && grep -q '</svg>' "$TMP/p.svg" &&
  grep -q '<polyline' "$TMP/p.svg" && grep -q 'memcpy' "$TMP/p.svg" &&
  grep -q 'loopback TCP' "$TMP/p.svg" ||
  fail "SVG lacks the curve or the ceilings"
# --test bibw: both ways at once, one row per size.
timeout -k 5 120 "$TPIPE" bench pipe --transport tcp --channel basic \
  --test bibw --sizes 64,1M --payloads 2 --budget 0.05 --json \
  >"$TMP/bibw.jsonl" 2>"$TMP/bibw.txt" || { cat "$TMP/bibw.txt" >&2; fail "bibw"; }
"$PY" - "$TMP/bibw.jsonl" <<'PYEOF' || { cat "$TMP/bibw.txt" >&2; fail "bibw JSON"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["size"] for r in rows] == [64, 1 << 20], rows
for r in rows:
    assert r["test"] == "bibw" and r["gbps"] > 0 and r["iters"] >= 10, r
    assert r["p50_us"] is None and r["msgs_per_s"] is None, r
PYEOF

# --test msgrate: 2 pairs at once, one row per size, messages/s.
timeout -k 5 120 "$TPIPE" bench pipe --transport tcp --channel basic \
  --test msgrate --pairs 2 --sizes 16,256 --budget 0.05 --json \
  >"$TMP/mr.jsonl" 2>"$TMP/mr.txt" || { cat "$TMP/mr.txt" >&2; fail "msgrate"; }
"$PY" - "$TMP/mr.jsonl" <<'PYEOF' || { cat "$TMP/mr.txt" >&2; fail "msgrate JSON"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert [r["size"] for r in rows] == [16, 256], rows
for r in rows:
    assert r["test"] == "msgrate" and r["pairs"] == 2, r
    assert r["msgs_per_s"] > 0 and r["gbps"] > 0 and r["iters"] >= 20, r
    assert abs(r["msgs_per_s"] * r["size"] / 1e9 - r["gbps"]) <= \
        0.01 * r["gbps"] + 1e-3, r
PYEOF
echo "bench_pipe_test: ok"
