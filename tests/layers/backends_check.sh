#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# backends_check.sh CMAKE SRCDIR - the generated registries
# (cmake/TpBackends.cmake): tp_backends_collect run in script mode over
# fake backend folders orders them by ORDER, builds only those whose
# CONDITION holds, lists those as features, and refuses a duplicate name or
# order, a missing field, a bad name and more backends than a brochure
# carries, each with a message naming the file or the bound. Then the real
# transport/ and channel/ folders give today's order.
set -euo pipefail

cmake=${1:?usage: backends_check.sh CMAKE SRCDIR}
src=${2:?usage: backends_check.sh CMAKE SRCDIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

cat >"$tmp/run.cmake" <<'EOS'
cmake_minimum_required(VERSION 3.20)
include(${TP_SRC}/cmake/TpBackends.cmake)
set(CMAKE_CURRENT_SOURCE_DIR ${DIR})
set(CMAKE_BINARY_DIR ${OUT})
set(PROJECT_SOURCE_DIR ${TP_SRC})
set(TP_SOURCES "")
tp_backends_collect(${KIND})
list(LENGTH TP_SOURCES nsrc)
get_property(f GLOBAL PROPERTY TP_BACKEND_FEATURES)
message(STATUS "sources=${nsrc} features=${f}")
EOS

# backend DIR NAME ORDER [EXTRA...]: a fake backend folder.
backend() {
    local dir=$1 name=$2 order=$3
    shift 3
    mkdir -p "$dir/$name"
    echo "tp_backend(NAME $name ORDER $order OPS tp__transport_${name}_ops" \
        "SOURCES $name.c $*)" >"$dir/$name/backend.cmake"
}

# expect CASE WANT-RC NEEDLE DIR [KIND] [-Dvar...]: run, check the exit
# status and that the output holds NEEDLE (CMake wraps its messages: lines
# are joined and blanks squeezed first).
expect() {
    local case=$1 want=$2 needle=$3 dir=$4 kind=${5:-transport}
    shift 5 || shift $#
    local out rc=0
    out=$("$cmake" -DTP_SRC="$src" -DDIR="$dir" -DOUT="$tmp/out-$case" \
        -DKIND="$kind" "$@" -P "$tmp/run.cmake" 2>&1) || rc=$?
    if { [ "$want" = 0 ] && [ "$rc" != 0 ]; } ||
        { [ "$want" != 0 ] && [ "$rc" = 0 ]; } ||
        ! tr -s ' \n' '  ' <<<"$out" | grep -qF -- "$needle"; then
        echo "FAIL $case: exit $rc (want $([ "$want" = 0 ] && echo 0 ||
            echo nonzero)), output lacks \"$needle\":" >&2
        sed 's/^/    /' <<<"$out" >&2
        fails=$((fails + 1))
    else
        echo "ok   $case"
    fi
}

d=$tmp/order
backend "$d" alpha 20
backend "$d" beta 5 CONDITION HAVE_BETA
backend "$d" gamma 7
expect order_cond_on 0 "best first: beta, gamma, alpha" "$d" transport \
    -DHAVE_BETA=1
expect features_on 0 "sources=3 features=beta" "$d" transport -DHAVE_BETA=1
expect cond_off 0 "transport beta: not built (HAVE_BETA is false)" "$d"
expect cond_off_list 0 "best first: gamma, alpha" "$d"
if ! grep -q '&tp__transport_gamma_ops, // gamma' \
    "$tmp/out-cond_off_list/gen/tp_transport_list.inc"; then
    echo "FAIL generated table: gamma missing" >&2
    fails=$((fails + 1))
fi

d=$tmp/dup_order
backend "$d" alpha 20
backend "$d" beta 20
expect dup_order 1 "ORDER 20 is taken by another backend" "$d"

d=$tmp/dup_name
backend "$d" alpha 20
mkdir -p "$d/other"
cp "$d/alpha/backend.cmake" "$d/other/backend.cmake"
expect dup_name 1 "transport 'alpha' declared twice" "$d"

d=$tmp/no_ops
mkdir -p "$d/x"
echo 'tp_backend(NAME x ORDER 1 SOURCES x.c)' >"$d/x/backend.cmake"
expect missing_ops 1 "tp_backend: OPS missing" "$d"

d=$tmp/bad_name
mkdir -p "$d/x"
echo 'tp_backend(NAME X-1 ORDER 1 OPS tp__transport_x_ops SOURCES x.c)' \
    >"$d/x/backend.cmake"
expect bad_name 1 "NAME must be [a-z][a-z0-9_]*" "$d"

d=$tmp/too_many
for i in $(seq 1 17); do
    backend "$d" "b$i" "$i"
done
expect too_many 1 "17 transport backends are enabled, more than the 16" "$d"

expect real_transports 0 "transport backends, best first: shm, tcp" \
    "$src/transport" transport
expect real_channels 0 "channel backends, best first: xth, cma, mpt, basic" \
    "$src/channel" channel

if [ "$fails" -gt 0 ]; then
    echo "backends_check: $fails case(s) failed" >&2
    exit 1
fi
echo "backends_check: every case passed"
