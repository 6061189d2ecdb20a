#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `tpipe store`: a standalone rendezvous server prints its bound address,
# a second one on the same port fails naming the address (EADDRINUSE),
# and SIGTERM stops the first with status 0.
set -eu
TPIPE=$1
out=$(mktemp -d)
trap 'kill $spid 2>/dev/null || true; rm -rf "$out"' EXIT
"$TPIPE" store --port 0 --host 127.0.0.1 >"$out/srv" 2>&1 &
spid=$!
addr=""
for _ in $(seq 1 200); do
    addr=$(grep -o 'tcp://127.0.0.1:[0-9]*' "$out/srv" 2>/dev/null | head -n1 || true)
    [ -n "$addr" ] && break
    sleep 0.05
done
[ -n "$addr" ] || { echo "no address printed:"; cat "$out/srv"; exit 1; }
port=${addr##*:}
if "$TPIPE" store --port "$port" --host 127.0.0.1 >"$out/second" 2>&1; then
    echo "a second server on $addr started"; exit 1
fi
grep -q "127.0.0.1:$port" "$out/second" || { cat "$out/second"; exit 1; }
grep -q 'EADDRINUSE' "$out/second" || { cat "$out/second"; exit 1; }
kill -TERM $spid
rc=0
wait $spid || rc=$?
[ "$rc" -eq 0 ] || { echo "server exited $rc"; cat "$out/srv"; exit 1; }
echo "tpipe store ok ($addr)"
