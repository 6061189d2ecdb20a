#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The launcher race of issue 15: rank 3 of 6 fails at once, so the others
# get SIGTERM while the last-forked ones may still be between fork() and
# exec(). Each of ITERS runs (default 20) must end well before the 30 s
# grace (every rank gone within 2 s, no SIGKILL needed), exit 1, and say
# which rank failed and how many others it stopped.
set -eu
TPIPE=$1
ITERS=${2:-20}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; for f in "$out"/*; do echo "== $f"; cat "$f"; done; exit 1; }
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

it=0
worst=0
while [ "$it" -lt "$ITERS" ]; do
    it=$((it + 1))
    start=$(now_ms)
    st=0
    # timeout(1) bounds a hang (the bug keeps a rank alive for the grace).
    timeout -s KILL 40 "$TPIPE" run -n 6 --grace 30 -- \
        sh -c '[ "$RANK" = 3 ] && exit 1; exec sleep 60' >"$out/o" 2>"$out/e" || st=$?
    ms=$(( $(now_ms) - start ))
    [ "$ms" -gt "$worst" ] && worst=$ms
    [ "$st" = 1 ] || fail "run $it: exit $st, want 1 (after ${ms} ms)"
    [ "$ms" -lt 2000 ] || fail "run $it: ranks still alive after ${ms} ms (grace 30 s)"
    grep -q '^tpipe: run: rank 3 exited with code 1; stopping the 5 other running rank(s)' "$out/e" \
        || fail "run $it: no failure summary"
    grep -q '^tpipe: run: 5 rank(s) stopped: 5 by SIGTERM$' "$out/e" \
        || fail "run $it: no stop summary"
    grep -q 'sending SIGKILL' "$out/e" && fail "run $it: a rank needed SIGKILL"
done
echo "ok: $ITERS runs, slowest ${worst} ms"
