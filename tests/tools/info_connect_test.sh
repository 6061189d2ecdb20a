#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `tpipe info --listen` + `tpipe info --connect` over loopback: both ends
# print the pipe's report; a refused connect fails with the address.
set -eu
TPIPE=$1
out=$(mktemp -d)
trap 'kill $lpid 2>/dev/null || true; rm -rf "$out"' EXIT
"$TPIPE" info --listen tcp://127.0.0.1:0 --count 1 --timeout 20000 \
    >"$out/listen" 2>&1 &
lpid=$!
url=""
for _ in $(seq 1 200); do
    url=$(grep -o 'tcp://[0-9.:]*' "$out/listen" 2>/dev/null | head -n1 || true)
    [ -n "$url" ] && break
    sleep 0.05
done
[ -n "$url" ] || { echo "listener printed no address:"; cat "$out/listen"; exit 1; }
"$TPIPE" info --connect "$url" --timeout 20000 --channels basic,mpt \
    >"$out/connect" 2>&1 || { cat "$out/connect"; exit 1; }
wait $lpid || { echo "listener failed:"; cat "$out/listen"; exit 1; }
grep -q '^pipe to tpipe-info at tcp://127.0.0.1' "$out/connect"
grep -q 'channel cma: not allowed by the options' "$out/connect"
grep -q 'channel basic: chosen' "$out/connect"
grep -q '^pipe from tpipe-info' "$out/listen"
grep -q 'channel basic: chosen' "$out/listen"
# Nobody listens on port 1: exit 1, the error names the address.
if "$TPIPE" info --connect tcp://127.0.0.1:1 --timeout 5000 >"$out/refused" 2>&1; then
    echo "connect to port 1 succeeded"; exit 1
fi
grep -q '127.0.0.1:1' "$out/refused" || { cat "$out/refused"; exit 1; }
echo "info --listen/--connect ok"
