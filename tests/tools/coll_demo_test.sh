#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# coll_demo_test.sh TPIPE COLL_DEMO [N] - examples/coll_demo under
# `tpipe run -n N` (default 3): exit status 0, every rank reports the
# engine, the averaged gradient, identical parameters and the timings;
# ranks 0 and 1 their subgroup; nothing on stderr.
set -u
TPIPE=$1
DEMO=$2
N=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "coll_demo_test: FAIL: $*"; for f in "$out"/*; do echo "== $f"; cat "$f"; done; exit 1; }

st=0
TP_SOCKET_IFNAME=lo "$TPIPE" run -n "$N" --grace 2 --timeout 90 "$DEMO" >"$out/stdout" 2>"$out/stderr" || st=$?
[ "$st" = 0 ] || fail "tpipe run -n $N coll_demo exited $st"

mean=$(awk "BEGIN { printf \"%.2f\", ($N + 1) / 2 }")
r=0
while [ "$r" -lt "$N" ]; do
    for pat in \
        "^\[$r\] rank $r of $N: collectives run on the [a-z]* engine\$" \
        "^\[$r\] rank $r: step done: gradient averaged to $mean over $N ranks" \
        "^\[$r\] rank $r: parameters identical on all $N ranks" \
        "^\[$r\] rank $r: all_reduce 4 KiB [0-9.]* us, barrier [0-9.]* us"; do
        grep -q "$pat" "$out/stdout" || fail "rank $r: no line matching: $pat"
    done
    r=$((r + 1))
done
for r in 0 1; do
    grep -q "^\[$r\] rank $r: subgroup {0, 1}" "$out/stdout" || fail "rank $r: no subgroup line"
done
[ "$(grep -c 'subgroup' "$out/stdout")" = 2 ] || fail "only ranks 0 and 1 are in the subgroup"
grep -q . "$out/stderr" && fail "unexpected stderr output"
echo "coll_demo_test: ok"
