#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# netns_bench_launched_test.sh TPIPE - `tpipe bench rpc`, `bench
# collective` and `bench transport` as launched jobs across two "hosts": a
# pair of network namespaces joined by a veth pair (10.202.2.1 and
# 10.202.2.2, which exist only inside them; netns_lib.sh).
#   1. each bench as a job of two nodes, one rank per namespace: `tpipe run
#      -n 1 --nnodes 2 --node-rank R --master-addr 10.202.2.1` in each;
#      rank 0 (ns0) prints a row with a number per test, op and size;
#      both nodes exit 0.
#   2. bench collective with plain env vars (RANK, WORLD_SIZE,
#      MASTER_ADDR, MASTER_PORT) and 2 ranks per node (world 4).
#   3. rank 1 alone, its rank 0 never started: it fails within its
#      deadline, naming rank 1 and the store's address, "timed out".
# Exit 77 with the reason when namespaces cannot be made (not root, no ip).
set -u

tpipe=${1:?usage: netns_bench_launched_test.sh TPIPE}
. "$(dirname "$0")/netns_lib.sh"
netns_init "netns_bench_launched_test" "*.txt"
[ -x "$tpipe" ] || fail "no tpipe program $tpipe"

netns_pair "benchl" l 10.202.2
say "namespaces $ns0 (10.202.2.1) and $ns1 (10.202.2.2)"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT TP_INIT_METHOD
export TP_JOB_TOKEN=netns-bench-launched-test-$id

# two_nodes NAME ARGS...: `tpipe bench ARGS` as a 2-node job, one rank per
# node; prints node 0's output.
two_nodes() {
    local name=$1
    shift
    netns_two_nodes "$name" 1 "$tpipe" bench "$@"
    cat "$dir/${name}0.txt"
}

# rows FILE TEST...: FILE has, for each TEST ("noop", "echo 1M", ...), a
# row whose first numeric column is a positive number.
rows() {
    local f=$1 t
    shift
    for t in "$@"; do
        # shellcheck disable=SC2086
        set -- $t
        awk -v test="$1" -v size="${2:-}" '
            { sub(/^\[[0-9]+\] /, "") }
            ($3 == test || $1 == test) && (size == "" || $4 == size || $2 == size) {
                for (i = 4; i <= NF; i++)
                    if ($i ~ /^[0-9.]+$/ && $i + 0 > 0) { ok = 1; exit }
            }
            END { exit !ok }' "$f" || fail "$(basename "$f"): no row with a number for '$t'"
    done
}

args=(--budget 0.1 --stall-timeout 10)

# 1. rpc, collective, transport: one rank per namespace.
two_nodes rpc rpc --test noop,echo,async,init --sizes 64,1M "${args[@]}"
rows "$dir/rpc0.txt" noop "echo 64" "echo 1M" async init
grep -q '^\[0\] tcp ' "$dir/rpc0.txt" || fail "rpc: the rows do not say tcp"
say "bench rpc launched across the namespaces: ok"

two_nodes coll collective --op all_reduce,all_gather,barrier \
    --sizes 4K,1M --budget 0.05 --reps 1 --timeout 60
rows "$dir/coll0.txt" "all_reduce 4096" "all_reduce 1048576" \
    "all_gather 4096" "all_gather 1048576" barrier
grep -q 'world 2, engine pipe' "$dir/coll0.txt" ||
    fail "collective: not a world of 2 on the pipe engine"
say "bench collective launched across the namespaces: ok"

two_nodes tr transport --sizes 64,64K "${args[@]}"
rows "$dir/tr0.txt" "pingpong 64" "stream 64K"
say "bench transport launched across the namespaces: ok"

# 2. Plain env vars, 2 ranks per namespace (ranks 0,1 in ns0, 2,3 in ns1).
port=$((29600 + RANDOM % 1000))
p=()
for r in 0 1 2 3; do
    ns=$ns0
    [ $r -ge 2 ] && ns=$ns1
    RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) MASTER_ADDR=10.202.2.1 \
        MASTER_PORT=$port timeout -k 5 150 ip netns exec "$ns" "$tpipe" \
        bench collective --op all_reduce --sizes 64K --budget 0.05 --reps 1 \
        --timeout 60 >"$dir/env$r.txt" 2>&1 &
    p+=($!)
    pids+=($!)
done
for r in 0 1 2 3; do
    wait "${p[$r]}" || fail "env vars: rank $r exited $?"
done
cat "$dir/env0.txt"
rows "$dir/env0.txt" "all_reduce 65536"
grep -q 'world 4' "$dir/env0.txt" || fail "env vars: not a world of 4"
for r in 1 2 3; do
    [ ! -s "$dir/env$r.txt" ] || fail "env vars: rank $r printed something"
done
say "bench collective, 4 ranks from env vars: ok"

# 3. Rank 1 alone in ns1: rank 0 (10.202.2.1) never comes.
for cmd in "rpc --stall-timeout 2" "collective --timeout 2"; do
    t0=$SECONDS
    st=0
    # shellcheck disable=SC2086
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=10.202.2.1 MASTER_PORT=$port \
        timeout -k 5 60 ip netns exec "$ns1" "$tpipe" bench $cmd \
        >"$dir/lone.txt" 2>&1 || st=$?
    [ $st = 1 ] || fail "$cmd without rank 0: exit $st, want 1"
    [ $((SECONDS - t0)) -le 15 ] ||
        fail "$cmd without rank 0: took $((SECONDS - t0)) s"
    grep -q 'rank 1' "$dir/lone.txt" &&
        grep -q "10.202.2.1:$port" "$dir/lone.txt" &&
        grep -q 'timed out' "$dir/lone.txt" ||
        fail "$cmd without rank 0: the error lacks rank 1, the store or 'timed out'"
    cat "$dir/lone.txt"
done
say "a rank without its rank 0 fails in time: ok"
