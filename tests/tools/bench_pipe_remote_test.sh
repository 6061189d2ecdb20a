#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_pipe_remote_test.sh TPIPE - `tpipe bench pipe` between two tpipe
# processes, on this host: --listen (prints its URL, serves one client,
# exits 0) with --connect URL, and a launched job (`tpipe run -n 2`: rank 1
# serves, publishing its URL in the env:// store; rank 0 measures). The
# two-host version is tests/netns/netns_bench_test.sh. Then bench
# transport --listen/--connect.
set -u
TPIPE=$1
TMP=$(mktemp -d)
spid=""
trap '[ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null; rm -rf "$TMP"' EXIT
fail() {
  echo "bench_pipe_remote_test: FAIL: $*" >&2
  for f in "$TMP"/*.txt; do [ -f "$f" ] && sed "s|^|$(basename "$f"): |" "$f" >&2; done
  exit 1
}
export TP_JOB_TOKEN=bench-pipe-remote-test
args=(--sizes 64,64K --budget 0.05 --json --stall-timeout 10)

timeout -k 5 60 "$TPIPE" bench pipe --listen --bind 127.0.0.1 "${args[@]}" \
  >"$TMP/url.txt" 2>"$TMP/srv.txt" &
spid=$!
for _ in $(seq 100); do [ -s "$TMP/url.txt" ] && break; sleep 0.1; done
url=$(head -n1 "$TMP/url.txt")
case "$url" in tcp://127.0.0.1:*) ;; *) fail "--listen printed '$url'" ;; esac
timeout -k 5 60 "$TPIPE" bench pipe --connect "$url" "${args[@]}" \
  >"$TMP/cli.txt" 2>"$TMP/clierr.txt" || fail "--connect failed"
wait "$spid" || fail "the --listen server exited $?"
spid=""
n=$(grep -c '"mode":"remote"' "$TMP/cli.txt")
[ "$n" = 4 ] || fail "--connect printed $n remote rows, want 4"

timeout -k 5 90 "$TPIPE" run -n 2 --output-ranks 0 -- "$TPIPE" bench pipe \
  "${args[@]}" >"$TMP/run.txt" 2>&1 || fail "launched run failed"
n=$(grep -c '"mode":"remote"' "$TMP/run.txt")
[ "$n" = 4 ] || fail "the launched run printed $n remote rows, want 4"

# bench transport --listen/--connect: the raw transport, the same way.
timeout -k 5 60 "$TPIPE" bench transport --listen --addr tcp://127.0.0.1:0 \
  "${args[@]}" >"$TMP/turl.txt" 2>"$TMP/tsrv.txt" &
spid=$!
for _ in $(seq 100); do [ -s "$TMP/turl.txt" ] && break; sleep 0.1; done
url=$(head -n1 "$TMP/turl.txt")
case "$url" in tcp://127.0.0.1:*) ;; *) fail "transport --listen printed '$url'" ;; esac
timeout -k 5 60 "$TPIPE" bench transport --connect "$url" "${args[@]}" \
  >"$TMP/tcli.txt" 2>"$TMP/tclierr.txt" || fail "transport --connect failed"
wait "$spid" || fail "the transport --listen server exited $?"
spid=""
n=$(grep -c '"bench":"transport"' "$TMP/tcli.txt")
[ "$n" = 4 ] || fail "transport --connect printed $n rows, want 4"
"$TPIPE" bench transport --connect tcp://127.0.0.1:1 --reps 2 >/dev/null 2>&1
[ $? = 2 ] || fail "bench transport --connect --reps 2: want exit 2"

# Usage errors: one combination, no --reps/--plot, ranks of 2.
"$TPIPE" bench pipe --connect tcp://127.0.0.1:1 --transport tcp,shm \
  >/dev/null 2>&1
[ $? = 2 ] || fail "two transports across hosts: want exit 2"
"$TPIPE" bench pipe --listen --reps 2 >/dev/null 2>&1
[ $? = 2 ] || fail "--listen --reps 2: want exit 2"
RANK=0 WORLD_SIZE=3 "$TPIPE" bench pipe >/dev/null 2>&1
[ $? = 2 ] || fail "WORLD_SIZE=3: want exit 2"
echo "bench_pipe_remote_test: ok"
