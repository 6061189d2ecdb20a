#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_ucx.sh - issue 13's UCX comparison: tpipe's ucx transport beside
# ucx_perftest (Debian's ucx-utils) on the same UCX_TLS, alternating, in
# one session:
#   TP_UCX=1 UCX_TLS=<tls> tpipe bench transport --transport ucx
#       --backend epoll --sizes 64 --test pingpong    (round trip, p50)
#   TP_UCX=1 UCX_TLS=<tls> tpipe bench transport ... --sizes 64M --test stream
#   ucx_perftest -t stream_lat -s 64 [-e]   (its one-way latency, doubled)
#   ucx_perftest -t stream_bw -s 64M [-e]
# ucx_perftest runs with -e (endpoints with peer-failure handling, as
# tpipe's: the same lanes) and without it (UCX's fastest lanes, which
# tpipe cannot use without losing peer-failure detection); the ratio is
# taken against the -e run. Prints a markdown table of medians.
#
#   bash bench/run_ucx.sh                 # REPS=3, tls "tcp" and shm
#   REPS=5 TLS_LIST="tcp" bash bench/run_ucx.sh
#
# Env: TPIPE, BUILD_DIR, REPS, OUT, SAVE (as the other run_*.sh; SAVE=1
# copies the report to bench/results/ucx-<stamp>.md), TLS_LIST (default
# "tcp posix,sysv,cma,tcp"), PT_ITERS (ucx_perftest latency iterations,
# default 50000), PORT0 (ucx_perftest ports are PORT0..PORT0+19999,
# default 15000).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
BENCH=ucx
PEERS=
SAVE=${SAVE:-0}
TLS_LIST=${TLS_LIST:-tcp posix,sysv,cma,tcp}
PT_ITERS=${PT_ITERS:-50000}
PORT0=${PORT0:-15000}
# shellcheck source=bench/common.sh
. "$HERE/common.sh"

if ! command -v ucx_perftest >/dev/null 2>&1; then
  log "ucx_perftest not found: apt-get install ucx-utils"
  exit 1
fi
export TP_UCX=1 TP_AUTH_WARN=0

# perftest TLS TEST SIZE ITERS [FLAGS]: one value (RTT us or GB/s) or NA.
perftest() {
  local tls=$1 test=$2 size=$3 iters=$4 flags=${5:-} out sp port
  # A fresh port each time (this runs in a command substitution's subshell,
  # so a counter would not advance).
  port=$((PORT0 + RANDOM % 20000))
  # shellcheck disable=SC2086
  UCX_TLS=$tls timeout 90 ucx_perftest -p "$port" -t "$test" -s "$size" \
    -n "$iters" $flags >>"$OUT/perftest-server.log" 2>&1 &
  sp=$!
  sleep 0.5
  # shellcheck disable=SC2086
  out=$(UCX_TLS=$tls timeout 90 ucx_perftest 127.0.0.1 -p "$port" -t "$test" \
    -s "$size" -n "$iters" $flags 2>>"$OUT/perftest.log" |
    awk '/^Final:/ {print $3, $7}')
  kill "$sp" 2>/dev/null
  wait "$sp" 2>/dev/null
  # Final: iters, latency typical/average/overall (us, one way for the
  # ping-pong tests), bandwidth average/overall (MB/s = 2^20 B/s), ...
  case $test in
  *lat) echo "$out" | awk 'NF {print $1 * 2; f = 1} END {if (!f) print "NA"}' ;;
  *) echo "$out" | awk 'NF {printf "%.3f\n", $2 * 1048576 / 1e9; f = 1}
                        END {if (!f) print "NA"}' ;;
  esac
}

# ours TLS pingpong|stream SIZE: p50 RTT us or GB/s, or NA.
ours() {
  UCX_TLS=$1 timeout 120 "$TPIPE" bench transport --transport ucx \
    --backend epoll --sizes "$3" --test "$2" --budget 1 2>>"$OUT/ours.log" |
    awk -v t="$2" '$1 == "ucx" {print (t == "pingpong") ? $5 : $8; f = 1}
                   END {if (!f) print "NA"}'
}

: >"$OUT/raw.txt"
for rep in $(seq "$REPS"); do
  for tls in $TLS_LIST; do
    log "rep $rep UCX_TLS=$tls"
    echo "$tls lat tpipe $(ours "$tls" pingpong 64)" >>"$OUT/raw.txt"
    echo "$tls lat perftest-e $(perftest "$tls" stream_lat 64 "$PT_ITERS" -e)" >>"$OUT/raw.txt"
    echo "$tls lat perftest $(perftest "$tls" stream_lat 64 "$PT_ITERS")" >>"$OUT/raw.txt"
    echo "$tls bw tpipe $(ours "$tls" stream 64M)" >>"$OUT/raw.txt"
    echo "$tls bw perftest-e $(perftest "$tls" stream_bw 67108864 100 -e)" >>"$OUT/raw.txt"
    echo "$tls bw perftest $(perftest "$tls" stream_bw 67108864 100)" >>"$OUT/raw.txt"
  done
done

{
  echo "## tpipe ucx transport vs ucx_perftest ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $LOAD0 at start)"
  echo
  echo "Medians of $REPS alternating runs; NA = a run that failed (see $OUT/*.log)."
  echo "RTT = round trip of 64 B (ucx_perftest's one-way stream_lat doubled);"
  echo "bandwidth = 64 MiB stream, GB/s (1e9 B/s). ratio = tpipe / perftest -e"
  echo "(RTT) or perftest -e / tpipe (bandwidth): 1.0 = equal, above = tpipe slower."
  echo
  echo "| UCX_TLS | metric | tpipe | ucx_perftest -e | ratio | ucx_perftest (no -e) |"
  echo "|---|---|---|---|---|---|"
  awk '
    { v[$1 " " $2 " " $3] = v[$1 " " $2 " " $3] " " $4; tls[$1] = 1 }
    function med(s,   a, n, i, j, t, m) {
      n = 0
      m = split(s, a, " ")
      for (i = 1; i <= m; i++) if (a[i] != "NA") b[++n] = a[i] + 0
      if (n == 0) return "NA"
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
        if (b[j] < b[i]) { t = b[i]; b[i] = b[j]; b[j] = t }
      return (n % 2) ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
    }
    END {
      for (t in tls) for (k = 0; k < 2; k++) {
        m = k ? "bw" : "lat"
        a = med(v[t " " m " tpipe"]); e = med(v[t " " m " perftest-e"])
        p = med(v[t " " m " perftest"])
        r = "NA"
        if (a != "NA" && e != "NA" && a > 0 && e > 0)
          r = sprintf("%.2fx", k ? e / a : a / e)
        printf "| %s | %s | %s | %s | %s | %s |\n", t,
          k ? "64 MiB GB/s" : "64 B RTT us", a, e, r, p
      }
    }' "$OUT/raw.txt"
  echo
  echo "Lanes: run tpipe with TP_LOG_LEVEL=info to see TP-UCX-LANES (docs/transport-ucx.md)."
} >"$OUT/report.md"
finish_report ucx
exit $rc
