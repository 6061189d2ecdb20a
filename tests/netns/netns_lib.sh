# SPDX-License-Identifier: Apache-2.0
# netns_lib.sh - sourced by the netns tests: two network namespaces joined
# by a veth pair, addresses that exist only inside them, and their cleanup.
#
#   netns_init TAG GLOB
#
# starts the clock and skips (exit 77, with the reason) unless this runs
# as root with ip; then skip MSG exits 77, fail MSG prints "TAG: FAIL: MSG"
# and every $dir/GLOB file (each line prefixed by the file's name) and
# exits 1, say MSG prints "TAG: MSG (N s)".
#
#   netns_pair NAME LETTER SUBNET
#
# creates namespaces $ns0 and $ns1 (tp-NAME-0-$id, tp-NAME-1-$id), eth0
# in each with SUBNET.1/24 and SUBNET.2/24, a scratch directory $dir and an
# array $pids of processes the cleanup kills; an EXIT trap removes all of
# it. LETTER makes the veth names unique per test (at most 15 characters).
#
#   netns_two_nodes NAME NPROC TPIPE ARGS...
#
# runs `TPIPE ARGS` as a job of two nodes under `TPIPE run -n NPROC
# --nnodes 2` (node R in namespace R, rank 0's node at SUBNET.1, a random
# port), node R's output in $dir/NAME<R>.txt; fails naming a node that
# exits non-zero.

skip() {
    echo "skipped: $*"
    exit 77
}
fail() {
    echo "$netns_tag: FAIL: $*" >&2
    # shellcheck disable=SC2086 # $netns_logs is a glob
    for f in ${dir:+"$dir"/$netns_logs}; do
        [ -f "$f" ] && sed "s|^|$(basename "$f"): |" "$f" >&2
    done
    exit 1
}
say() { echo "$netns_tag: $* ($((SECONDS - T0)) s)"; }

netns_init() {
    netns_tag=$1
    netns_logs=$2
    T0=$SECONDS
    dir=""
    [ "$(id -u)" = 0 ] || skip "network namespaces need root"
    command -v ip >/dev/null || skip "no ip command (iproute2)"
}

netns_cleanup() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    wait 2>/dev/null
    ip netns del "$ns0" 2>/dev/null
    ip netns del "$ns1" 2>/dev/null
    ip link del "$va" 2>/dev/null
    rm -rf "$dir"
}

netns_pair() {
    local name=$1 letter=$2 subnet=$3
    netns_subnet=$subnet
    id=$$-$RANDOM
    ns0=tp-$name-0-$id
    ns1=tp-$name-1-$id
    va=tp$letter$$a
    vb=tp$letter$$b
    dir=$(mktemp -d /tmp/tp-netns.XXXXXX)
    pids=()
    trap netns_cleanup EXIT
    trap "exit 1" INT TERM HUP
    ip netns add "$ns0" 2>"$dir/err" ||
        skip "cannot create a network namespace: $(cat "$dir/err")"
    ip netns add "$ns1" 2>"$dir/err" ||
        skip "cannot create a network namespace: $(cat "$dir/err")"
    ip link add "$va" type veth peer name "$vb" 2>"$dir/err" ||
        skip "cannot create a veth pair: $(cat "$dir/err")"
    ip link set "$va" netns "$ns0" && ip link set "$vb" netns "$ns1" &&
        ip -n "$ns0" link set "$va" name eth0 &&
        ip -n "$ns1" link set "$vb" name eth0 &&
        ip -n "$ns0" addr add "$subnet.1/24" dev eth0 &&
        ip -n "$ns1" addr add "$subnet.2/24" dev eth0 &&
        ip -n "$ns0" link set lo up && ip -n "$ns1" link set lo up &&
        ip -n "$ns0" link set eth0 up && ip -n "$ns1" link set eth0 up ||
        fail "setting up the veth pair"
}

netns_two_nodes() {
    local name=$1 nproc=$2 tp=$3 r ns
    shift 3
    local port=$((29600 + RANDOM % 1000))
    local p=()
    for r in 0 1; do
        ns=$ns0
        [ $r = 1 ] && ns=$ns1
        timeout -k 5 150 ip netns exec "$ns" "$tp" run -n "$nproc" \
            --nnodes 2 --node-rank $r --master-addr "$netns_subnet.1" \
            --master-port $port -- "$tp" "$@" >"$dir/$name$r.txt" 2>&1 &
        p+=($!)
        pids+=($!)
    done
    wait "${p[0]}" || fail "$name: node 0 exited $?"
    wait "${p[1]}" || fail "$name: node 1 exited $?"
}
