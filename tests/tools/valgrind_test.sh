#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# valgrind_test.sh TPIPE DEMO [N] [SANITIZE] - examples/rpc_demo (N ranks,
# default 2) under `tpipe run`, every rank under valgrind memcheck with
# --error-exitcode=1 --leak-check=full: exit status 0 (no memory error, no
# definite or possible leak), every rank done, and each rank's loops chose
# epoll saying valgrind is why (io_uring hangs under valgrind).
# Exit 77 (skipped) without valgrind, or when the build uses a sanitizer
# (SANITIZE non-empty: sanitizers and valgrind do not mix).
set -u
TPIPE=$1
DEMO=$2
N=${3:-2}
SANITIZE=${4:-}
if ! command -v valgrind >/dev/null 2>&1; then
    echo "valgrind_test: skipped: valgrind not installed"
    exit 77
fi
if [ -n "$SANITIZE" ]; then
    echo "valgrind_test: skipped: built with -fsanitize=$SANITIZE"
    exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "valgrind_test: FAIL: $*"; for f in "$out"/*; do echo "== $f"; cat "$f"; done; exit 1; }

st=0
TP_LOG_LEVEL=info "$TPIPE" run -n "$N" --grace 10 --timeout 500 -- \
    valgrind -q --error-exitcode=1 --leak-check=full "$DEMO" \
    >"$out/stdout" 2>"$out/stderr" || st=$?
[ "$st" = 0 ] || fail "tpipe run -n $N valgrind rpc_demo exited $st"
[ "$(grep -c ': done$' "$out/stdout")" = "$N" ] || fail "expected $N done lines"
r=0
while [ "$r" -lt "$N" ]; do
    grep -q "^\[$r\] .*TP-LOOP-BACKEND.*running under valgrind.*using epoll" \
        "$out/stdout" "$out/stderr" ||
        fail "rank $r: no TP-LOOP-BACKEND line naming valgrind"
    r=$((r + 1))
done
# valgrind -q prints only errors, each line starting with ==PID==.
grep -q '==[0-9]*==' "$out/stderr" && fail "valgrind reported something"
echo "valgrind_test: ok"
