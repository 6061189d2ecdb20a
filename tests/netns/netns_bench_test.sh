#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# netns_bench_test.sh TPIPE - `tpipe bench pipe` across two "hosts": a pair
# of network namespaces joined by a veth pair (10.202.1.1 and 10.202.1.2,
# which exist only inside them; the namespace setup is
# netns_rpc_test.sh's).
#   1. ns0: `bench pipe --listen --bind 10.202.1.1` prints its URL;
#      ns1: `bench pipe --connect URL` measures against it.
#      And again with --test bibw (both ways at once), and bench transport
#      --listen (on its default address) / --connect.
#   2. a launched job, `tpipe run --nnodes 2` (one rank per namespace,
#      MASTER_ADDR 10.202.1.1): rank 1 (ns1) serves on its default
#      address and publishes the URL in the env:// store, rank 0 measures.
#   3. --test msgrate as a launched job of 2 ranks per namespace: ranks 0
#      and 1 (ns0) stream to 2 and 3 (ns1) at once; rank 0 prints the sums.
# Exit 77 with the reason when namespaces cannot be made (not root, no ip).
set -u

tpipe=${1:?usage: netns_bench_test.sh TPIPE}
. "$(dirname "$0")/netns_lib.sh"
netns_init "netns_bench_test" "*.txt"
[ -x "$tpipe" ] || fail "no tpipe program $tpipe"

netns_pair "bench" b 10.202.1
say "namespaces $ns0 (10.202.1.1) and $ns1 (10.202.1.2)"

export TP_JOB_TOKEN=netns-bench-test-$id
args=(--sizes 64,64K,1M --budget 0.2 --stall-timeout 10)

# 1. --listen in ns0, --connect from ns1.
timeout -k 5 60 ip netns exec "$ns0" "$tpipe" bench pipe --listen \
    --bind 10.202.1.1 "${args[@]}" >"$dir/url.txt" 2>"$dir/listen.txt" &
spid=$!
pids+=("$spid")
for _ in $(seq 100); do
    [ -s "$dir/url.txt" ] && break
    sleep 0.1
done
url=$(head -n1 "$dir/url.txt")
case "$url" in
tcp://10.202.1.1:*) ;;
*) fail "--listen printed '$url'" ;;
esac
timeout -k 5 60 ip netns exec "$ns1" "$tpipe" bench pipe --connect "$url" \
    "${args[@]}" >"$dir/connect.txt" 2>"$dir/connect_err.txt" ||
    fail "--connect $url failed"
wait "$spid" || fail "the --listen server exited $?"
cat "$dir/connect.txt"
n=$(grep -c ' remote ' "$dir/connect.txt")
[ "$n" = 6 ] || fail "--connect printed $n rows, want 6"
say "--listen/--connect across the namespaces: ok"

# 1b. The same with --test bibw: the server streams back at once.
timeout -k 5 60 ip netns exec "$ns0" "$tpipe" bench pipe --listen \
    --bind 10.202.1.1 --test bibw "${args[@]}" >"$dir/url2.txt" \
    2>"$dir/listen2.txt" &
spid=$!
pids+=("$spid")
for _ in $(seq 100); do
    [ -s "$dir/url2.txt" ] && break
    sleep 0.1
done
url=$(head -n1 "$dir/url2.txt")
timeout -k 5 60 ip netns exec "$ns1" "$tpipe" bench pipe --connect "$url" \
    --test bibw "${args[@]}" >"$dir/bibw.txt" 2>"$dir/bibw_err.txt" ||
    fail "--connect $url --test bibw failed"
wait "$spid" || fail "the bibw --listen server exited $?"
cat "$dir/bibw.txt"
n=$(grep -c ' remote  bibw ' "$dir/bibw.txt")
[ "$n" = 3 ] || fail "bibw printed $n rows, want 3"
say "bibw across the namespaces: ok"

# 1c. bench transport --listen in ns0 (the transport's own address: the
# veth's), --connect from ns1.
timeout -k 5 60 ip netns exec "$ns0" "$tpipe" bench transport --listen \
    --transport tcp "${args[@]}" >"$dir/turl.txt" 2>"$dir/tlisten.txt" &
spid=$!
pids+=("$spid")
for _ in $(seq 100); do
    [ -s "$dir/turl.txt" ] && break
    sleep 0.1
done
url=$(head -n1 "$dir/turl.txt")
case "$url" in
tcp://10.202.1.1:*) ;;
*) fail "bench transport --listen printed '$url'" ;;
esac
timeout -k 5 60 ip netns exec "$ns1" "$tpipe" bench transport --connect \
    "$url" "${args[@]}" >"$dir/transport.txt" 2>"$dir/transport_err.txt" ||
    fail "bench transport --connect $url failed"
wait "$spid" || fail "the bench transport --listen server exited $?"
cat "$dir/transport.txt"
n=$(grep -c '^tcp ' "$dir/transport.txt")
[ "$n" = 6 ] || fail "bench transport printed $n rows, want 6"
say "bench transport --listen/--connect across the namespaces: ok"

# 2. A launched job of two nodes, one rank in each namespace.
netns_two_nodes node 1 "$tpipe" bench pipe "${args[@]}"
cat "$dir/node0.txt"
n=$(grep -c ' remote ' "$dir/node0.txt")
[ "$n" = 6 ] || fail "the launched job printed $n rows, want 6"
say "launched job across the namespaces: ok"

# 3. --test msgrate launched: two ranks per namespace (world 4), ranks 0
# and 1 (ns0) streaming to 2 and 3 (ns1) at once, across the veth.
netns_two_nodes mr 2 "$tpipe" bench pipe --test msgrate --sizes 64,4K \
    --budget 0.2 --stall-timeout 10 --json
cat "$dir/mr0.txt"
n=$(grep -c '^\[0\] {.*"test":"msgrate".*"pairs":2,' "$dir/mr0.txt")
[ "$n" = 2 ] || fail "msgrate launched printed $n rows of 2 pairs, want 2"
grep -q '^\[[1-3]\] {' "$dir/mr0.txt" "$dir/mr1.txt" &&
    fail "msgrate launched: a rank other than 0 printed a row"
say "bench pipe --test msgrate launched (2 pairs) across the namespaces: ok"
