#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_multinode_test.sh TPIPE RPC_DEMO - `tpipe run` across nodes, emulated
# on one host: two launchers (--nnodes 2 --node-rank 0|1, one shared
# TP_JOB_TOKEN) form one world of 4 in which examples/rpc_demo's worker3
# calls worker0; RANK/WORLD_SIZE/LOCAL_RANK/NODE_RANK; --log-dir (a file
# per rank); --output-ranks; the refusals (no shared job secret, no master
# address, bad node rank); Ctrl-C is announced and forwarded.
set -u
TPIPE=$1
DEMO=$2
out=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null; done; rm -rf "$out"' EXIT
fail() { echo "run_multinode_test: FAIL: $*"; for f in "$out"/*; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done; exit 1; }
# A free port: the one tpipe run itself picks.
free_port() { "$TPIPE" run -n 1 --no-job-token sh -c 'echo $MASTER_PORT' | sed 's/^\[0\] //'; }
TOKEN=0123456789abcdef0123456789abcdef-multinode

# 1. The environment of each rank (no rendezvous needed).
TP_JOB_TOKEN=$TOKEN "$TPIPE" run --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29999 -n 2 -- \
    sh -c 'echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $MASTER_ADDR:$MASTER_PORT"' \
    >"$out/env" 2>&1 || fail "env run exited $?"
grep -qx '\[2\] env 2 4 0 2 1 127\.0\.0\.1:29999' "$out/env" || fail "rank 2 environment"
grep -qx '\[3\] env 3 4 1 2 1 127\.0\.0\.1:29999' "$out/env" || fail "rank 3 environment"

# 2. A world of 4 from two launchers: every worker calls its right
# neighbour, across the "nodes" too (worker1 -> worker2, worker3 -> worker0).
P=$(free_port)
[ -n "$P" ] || fail "no free port"
TP_JOB_TOKEN=$TOKEN timeout -s KILL 120 "$TPIPE" run --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$P" \
    -n 2 --grace 2 --timeout 90 -- "$DEMO" >"$out/node1" 2>&1 &
n1=$!
pids="$n1"
st0=0
TP_JOB_TOKEN=$TOKEN timeout -s KILL 120 "$TPIPE" run --nnodes 2 --node-rank 0 --rdzv-endpoint "127.0.0.1:$P" \
    -n 2 --grace 2 --timeout 90 -- "$DEMO" >"$out/node0" 2>&1 || st0=$?
st1=0
wait "$n1" || st1=$?
pids=""
[ "$st0" = 0 ] || fail "node 0 exited $st0"
[ "$st1" = 0 ] || fail "node 1 exited $st1"
for r in 0 1; do grep -q "^\[$r\] worker$r: done\$" "$out/node0" || fail "node 0: rank $r not done"; done
for r in 2 3; do grep -q "^\[$r\] worker$r: done\$" "$out/node1" || fail "node 1: rank $r not done"; done
grep -q '^\[1\] worker1: worker2 echoed "hello"' "$out/node0" || fail "worker1 -> worker2 across the nodes"
grep -q '^\[3\] worker3: worker0 echoed "hello"' "$out/node1" || fail "worker3 -> worker0 across the nodes"
rm -f "$out/node0" "$out/node1"

# 3. --log-dir: one file per rank, unprefixed stdout and stderr; with
# --output-ranks only rank 1 reaches the terminal.
"$TPIPE" run -n 3 --log-dir "$out/logs" --output-ranks 1 -- \
    sh -c 'echo "out of $RANK"; echo "err of $RANK" >&2; printf "tail $RANK"' >"$out/lo" 2>"$out/le" \
    || fail "--log-dir run exited $?"
for r in 0 1 2; do
    f="$out/logs/rank-$r.log"
    [ -f "$f" ] || fail "no $f"
    grep -qx "out of $r" "$f" || fail "$f: stdout line"
    grep -qx "err of $r" "$f" || fail "$f: stderr line"
    grep -qx "tail $r" "$f" || fail "$f: partial last line"
    [ "$(wc -l <"$f")" = 3 ] || fail "$f: not 3 lines"
done
[ "$(cat "$out/lo")" = "$(printf '[1] out of 1\n[1] tail 1')" ] || fail "--output-ranks 1: stdout"
[ "$(cat "$out/le")" = "[1] err of 1" ] || fail "--output-ranks 1: stderr"
# Global ranks: node 1 of 2 shows only rank 3; "none" shows nothing.
"$TPIPE" run --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29999 --no-job-token -n 2 \
    --output-ranks 0,3 -- sh -c 'echo "r $RANK"' >"$out/f2" 2>&1 || fail "filter on node 1"
[ "$(cat "$out/f2")" = "[3] r 3" ] || fail "--output-ranks 0,3 on node 1"
"$TPIPE" run -n 2 --output-ranks none -- sh -c 'echo "r $RANK"' >"$out/f3" 2>&1 || fail "--output-ranks none"
[ -s "$out/f3" ] && fail "--output-ranks none printed"
# A failing filtered-out rank is still reported by the launcher.
st=0
"$TPIPE" run -n 2 --output-ranks 0 -- sh -c '[ "$RANK" = 1 ] && exit 4; exit 0' >"$out/f4" 2>&1 || st=$?
[ "$st" = 4 ] || fail "filtered rank failure: exit $st"
grep -q '^tpipe: run: rank 1 exited with code 4' "$out/f4" || fail "filtered rank failure not reported"
rm -rf "$out/logs" "$out"/f* "$out"/l*

# 4. Refusals: exit 2 with a message.
expect2() { # expect2 PATTERN ARGS...
    pat=$1; shift
    st=0
    env -u TP_JOB_TOKEN -u TP_JOB_TOKEN_FILE "$TPIPE" run "$@" >"$out/u" 2>&1 || st=$?
    [ "$st" = 2 ] || fail "tpipe run $*: exit $st, want 2"
    grep -q -e "$pat" "$out/u" || fail "tpipe run $*: no \"$pat\""
}
if "$TPIPE" --version | grep -q crypto; then
    expect2 'set TP_JOB_TOKEN (or TP_JOB_TOKEN_FILE) to the same value on every node' \
        --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29999 -n 1 true
fi
expect2 'needs --node-rank' --nnodes 2 --node-rank 0 -n 1 --no-job-token true
expect2 'needs --node-rank' --nnodes 2 --master-addr h --master-port 1 -n 1 --no-job-token true
expect2 '--node-rank must be between 0 and 1' --nnodes 2 --node-rank 2 --master-addr h --master-port 1 -n 1 true
expect2 'rdzv-endpoint needs HOST:PORT' --rdzv-endpoint nohostport -n 1 true
expect2 'not both' --rdzv-endpoint h:1 --master-port 2 -n 1 true
expect2 'output-ranks' -n 2 --output-ranks 2 true
expect2 'output-ranks' -n 2 --output-ranks 1-0 true
# --no-job-token lets a multi-node launcher start without a secret.
env -u TP_JOB_TOKEN -u TP_JOB_TOKEN_FILE "$TPIPE" run --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
    --master-port 29999 -n 1 --no-job-token -- sh -c 'echo "tok [${TP_JOB_TOKEN-unset}]"' >"$out/t" 2>&1 \
    || fail "--no-job-token with --nnodes"
grep -qx '\[0\] tok \[unset\]' "$out/t" || fail "--no-job-token output"

# 5. Ctrl-C (SIGINT to the launcher): announced, forwarded, 130; a second
# one kills at once.
"$TPIPE" run -n 2 --grace 20 -- sh -c 'echo up; exec sleep 30' >"$out/c" 2>"$out/ce" &
lp=$!
pids="$lp"
i=0
while [ "$(grep -c up "$out/c")" != 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -INT "$lp"
st=0
i=0
while kill -0 "$lp" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$lp" || st=$?
pids=""
[ "$st" = 130 ] || fail "Ctrl-C: exit $st, want 130"
grep -q '^tpipe: run: got SIGINT: passing it to the 2 running rank(s)' "$out/ce" || fail "Ctrl-C not announced"
grep -q '^tpipe: run: 2 rank(s) stopped: 2 by SIGINT$' "$out/ce" || fail "Ctrl-C: no stop summary"
# Ranks that ignore it: the second Ctrl-C kills them now.
"$TPIPE" run -n 2 --grace 60 -- sh -c 'trap "" INT; echo up; while :; do sleep 1; done' >"$out/c2" 2>"$out/ce2" &
lp=$!
pids="$lp"
i=0
while [ "$(grep -c up "$out/c2")" != 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -INT "$lp"
sleep 0.3
kill -INT "$lp"
st=0
i=0
while kill -0 "$lp" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
wait "$lp" || st=$?
pids=""
[ "$st" = 137 ] || fail "second Ctrl-C: exit $st, want 137"
grep -q '^tpipe: run: got SIGINT again: killing the 2 running rank(s)' "$out/ce2" || fail "second Ctrl-C not announced"
grep -q '^tpipe: run: 2 rank(s) stopped: 2 by SIGKILL$' "$out/ce2" || fail "second Ctrl-C: no stop summary"
echo "run_multinode_test: ok"
