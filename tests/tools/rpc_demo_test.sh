#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# rpc_demo_test.sh TPIPE RPC_DEMO [N] - examples/rpc_demo under
# `tpipe run -n N` (default 3): exit status 0, and every rank reports each
# result for its right neighbour, its debug info and a clean shutdown,
# with no error on stderr.
set -u
TPIPE=$1
DEMO=$2
N=${3:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "rpc_demo_test: FAIL: $*"; for f in "$out"/*; do echo "== $f"; cat "$f"; done; exit 1; }

st=0
"$TPIPE" run -n "$N" --grace 2 --timeout 90 "$DEMO" >"$out/stdout" 2>"$out/stderr" || st=$?
[ "$st" = 0 ] || fail "tpipe run -n $N rpc_demo exited $st"

r=0
while [ "$r" -lt "$N" ]; do
    p=$(( (r + 1) % N ))
    for pat in \
        "^\[$r\] worker$r: worker$p echoed \"hello\" and 1024 floats in [0-9]* us over [a-z]*/[a-z]*\$" \
        "^\[$r\] worker$r: worker$p scaled 1024 floats by 2\.0 in [0-9]* us over [a-z]*/[a-z]*\$" \
        "^\[$r\] worker$r: worker$p scaled 1024 floats by 3\.0 (call 1 of 4 in flight" \
        "^\[$r\] worker$r: worker$p scaled 1024 floats by 6\.0 (call 4 of 4 in flight" \
        "^\[$r\] worker$r: worker$p has no demo\.missing, as expected: .*demo\.missing" \
        "^\[$r\] worker$r: worker$p owns an RRef to 1024 floats scaled by 5\.0 (remote + to_here in [0-9]* us); their sum, computed there: 2618880\$" \
        "^\[$r\] rrefs: owners [0-9]*, users [0-9]*, forks of owned values [0-9]*" \
        "^\[$r\] worker$r: done\$"; do
        grep -q "$pat" "$out/stdout" || fail "rank $r: no line matching: $pat"
    done
    # The debug info names the neighbour.
    grep -q "^\[$r\] .*worker$p" "$out/stdout" || fail "rank $r: no debug info about worker$p"
    r=$((r + 1))
done
[ "$(grep -c ': done$' "$out/stdout")" = "$N" ] || fail "expected $N done lines"
grep -q . "$out/stderr" && fail "unexpected stderr output"
echo "rpc_demo_test: ok"
