#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# netns_rpc_test.sh SCENARIO WORKER - two RPC workers on two "hosts": a
# pair of network namespaces joined by a veth pair (10.201.1.1 and
# 10.201.1.2, which exist only inside them), with a fault between them:
#   loss       iptables drops 5% of ns1's packets, in and out (no netem
#              here), from before init: every call succeeds.
#   linkdown   ns1's link goes down for 10 s with calls in flight, then up:
#              each call succeeds or fails naming ns1, none hangs, new
#              calls work.
#   blackhole  iptables drops everything of ns1's with calls in flight:
#              they and new calls fail within the RPC timeout (5 s), or
#              sooner at TP_TCP_USER_TIMEOUT_MS (3 s), naming ns1.
# WORKER is netns_rpc_worker (its comment has the protocol). Names are
# unique per run, everything is removed on exit (trap). Exit 77 with the
# reason when namespaces cannot be made (not root, no ip, no iptables).
set -u

scenario=${1:?usage: netns_rpc_test.sh loss|linkdown|blackhole WORKER}
worker=${2:?usage: netns_rpc_test.sh SCENARIO WORKER}
. "$(dirname "$0")/netns_lib.sh"
netns_init "netns_rpc_test $scenario" "rank*.log"
if [ "$scenario" != linkdown ]; then
    command -v iptables >/dev/null ||
        skip "no iptables (apt-get install iptables)"
fi
[ -x "$worker" ] || fail "no worker program $worker"

netns_pair "$scenario" v 10.201.1
ip -n "$ns0" route get 10.201.1.2 >/dev/null 2>&1 ||
    fail "no route to 10.201.1.2 in $ns0"

ipt1() { ip netns exec "$ns1" iptables "$@" 2>>"$dir/err"; }
if [ "$scenario" = loss ]; then
    if ! ipt1 -A INPUT -m statistic --mode random --probability 0.05 -j DROP ||
        ! ipt1 -A OUTPUT -m statistic --mode random --probability 0.05 -j DROP; then
        skip "iptables does not work in a namespace: $(cat "$dir/err")"
    fi
fi

# The workers: tcp store at rank 0's address, pipes on eth0, over tcp
# with the channels two hosts would use (cma and shm would bypass the
# link: the namespaces share a kernel and a pid namespace). The black hole
# is found by TCP_USER_TIMEOUT (3 s) before the RPC timeout (5 s); the link
# down for 10 s stays within the default user timeout (30 s).
uto=()
[ "$scenario" = blackhole ] && uto=(TP_TCP_USER_TIMEOUT_MS=3000)
run_worker() { # run_worker RANK NS
    ip netns exec "$2" env TP_SOCKET_IFNAME=eth0 TP_TRANSPORTS=tcp \
        TP_CHANNELS=mpt,basic "${uto[@]}" \
        timeout -s KILL 90 "$worker" "$1" tcp://10.201.1.1:29500 \
        "$scenario" "$dir" >"$dir/rank$1.log" 2>&1
}
run_worker 0 "$ns0" &
pids+=($!)
run_worker 1 "$ns1" &
pids+=($!)

# wait_for FILE SECONDS: until FILE exists (or a worker ended).
wait_for() {
    local n=$(($2 * 10))
    while [ ! -e "$1" ]; do
        n=$((n - 1))
        [ $n -gt 0 ] || fail "$(basename "$1") did not appear in $2 s"
        for p in "${pids[@]}"; do
            kill -0 "$p" 2>/dev/null ||
                fail "a worker ended before $(basename "$1") appeared"
        done
        sleep 0.1
    done
}

case $scenario in
loss) ;;
linkdown)
    wait_for "$dir/ready" 60
    for i in 0 1 2 3; do wait_for "$dir/entered.$i" 30; done
    ip -n "$ns1" link set eth0 down || fail "link down"
    say "link down with 4 calls in flight"
    touch "$dir/go"
    sleep 10
    ip -n "$ns1" link set eth0 up || fail "link up"
    say "link up"
    touch "$dir/up"
    ;;
blackhole)
    wait_for "$dir/ready" 60
    for i in 0 1 2 3; do wait_for "$dir/entered.$i" 30; done
    ipt1 -A INPUT -j DROP && ipt1 -A OUTPUT -j DROP ||
        skip "iptables does not work in a namespace: $(cat "$dir/err")"
    say "black hole with 4 calls in flight"
    touch "$dir/go"
    ;;
*) fail "unknown scenario" ;;
esac

rc=0
for p in "${pids[@]}"; do
    wait "$p" || rc=$?
done
pids=()
[ $rc = 0 ] || fail "a worker failed (status $rc)"
cat "$dir/rank0.log"
say "ok"
