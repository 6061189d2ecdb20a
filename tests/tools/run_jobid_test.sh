#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# run_jobid_test.sh TPIPE RPC_DEMO - `tpipe run` gives every rank of a job
# one TP_JOB_ID (the store's join keeps concurrent jobs apart by it):
# --rdzv-id, an inherited TP_JOB_ID, a fresh random one per single-node
# job, one derived alike on every node of a --nnodes job (from the
# endpoint, -n and --nnodes); the refusal of a bad --rdzv-id; and two jobs
# of rpc_demo at once on one shared file store, each under `tpipe run`.
set -u
TPIPE=$1
DEMO=$2
out=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill -9 $p 2>/dev/null; done; rm -rf "$out"' EXIT
fail() { echo "run_jobid_test: FAIL: $*"; for f in "$out"/*; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done; exit 1; }
unset TP_JOB_ID
ids() { # ids ARGS...: the distinct TP_JOB_IDs of the ranks, one a line
    "$TPIPE" run --no-job-token "$@" -- sh -c 'echo "id=$TP_JOB_ID"' | sed 's/^\[[0-9]*\] id=//' | sort -u
}

# 1. One node, no id: one fresh id per job, the same on every rank.
a=$(ids -n 3) || fail "run -n 3 failed"
b=$(ids -n 3) || fail "run -n 3 failed"
[ "$(printf '%s\n' "$a" | wc -l)" = 1 ] || fail "ranks of one job disagree: $a"
printf '%s\n' "$a" | grep -Eqx 'run-[0-9a-f]{16}' || fail "generated id \"$a\""
[ "$a" != "$b" ] || fail "two jobs got one id: $a"

# 2. --rdzv-id, and an inherited TP_JOB_ID (--rdzv-id wins over it).
[ "$(ids -n 2 --rdzv-id myjob.7)" = myjob.7 ] || fail "--rdzv-id not passed on"
[ "$(TP_JOB_ID=outer ids -n 2)" = outer ] || fail "inherited TP_JOB_ID not passed on"
[ "$(TP_JOB_ID=outer ids -n 2 --rdzv-id inner)" = inner ] || fail "--rdzv-id does not win"

# 3. Several nodes, no id: every node derives the same one, from what
# they are all given (endpoint spelled either way, -n, --nnodes).
n0=$(ids -n 2 --nnodes 2 --node-rank 0 --master-addr 10.1.2.3 --master-port 29511)
n1=$(ids -n 2 --nnodes 2 --node-rank 1 --rdzv-endpoint 10.1.2.3:29511)
[ "$n0" = "run-10.1.2.3:29511-2x2" ] || fail "node 0's derived id \"$n0\""
[ "$n0" = "$n1" ] || fail "the nodes derived different ids: $n0 / $n1"
n2=$(ids -n 2 --nnodes 2 --node-rank 1 --rdzv-endpoint 10.1.2.3:29512)
[ "$n2" != "$n0" ] || fail "another endpoint, same id"
long=$(printf 'h%.0s' $(seq 1 80))
n3=$(ids -n 1 --nnodes 2 --node-rank 1 --master-addr "$long" --master-port 1)
printf '%s\n' "$n3" | grep -Eqx 'run-[0-9a-f]{16}' || fail "long endpoint: id \"$n3\""

# 4. A bad --rdzv-id is refused (exit 2) with the reason.
for bad in "" "a b" "$long"; do
    st=0
    "$TPIPE" run -n 1 --rdzv-id "$bad" -- true >"$out/bad" 2>&1 || st=$?
    [ "$st" = 2 ] || fail "--rdzv-id \"$bad\": exit $st"
    grep -q 'tpipe: run: --rdzv-id needs 1\.\.64 printable characters' "$out/bad" || fail "--rdzv-id \"$bad\": message"
done
rm -f "$out/bad"

# 5. Two jobs at once on one file store, each of two rpc_demo workers
# under its own `tpipe run` with no id given: each job's ranks meet each
# other (their generated ids keep the jobs apart), five times over (given
# one id both, about 2 runs in 5 fail here).
for round in 1 2 3 4 5; do
    store="$out/store$round"
    TP_INIT_METHOD="file://$store" timeout -s KILL 100 "$TPIPE" run -n 2 --grace 2 --timeout 80 -- "$DEMO" >"$out/j1" 2>&1 &
    p1=$!
    pids="$p1"
    st2=0
    TP_INIT_METHOD="file://$store" timeout -s KILL 100 "$TPIPE" run -n 2 --grace 2 --timeout 80 -- "$DEMO" >"$out/j2" 2>&1 || st2=$?
    st1=0
    wait "$p1" || st1=$?
    pids=""
    [ "$st1" = 0 ] || fail "round $round: job 1 exited $st1"
    [ "$st2" = 0 ] || fail "round $round: job 2 exited $st2"
    for j in j1 j2; do
        for r in 0 1; do grep -q "^\[$r\] worker$r: done\$" "$out/$j" || fail "round $round: $j rank $r not done"; done
    done
    rm -f "$out/j1" "$out/j2" "$store"*
done
echo "run_jobid_test: ok"
