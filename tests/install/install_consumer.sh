#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install_consumer.sh - install the build tree into a scratch prefix and use
# it the way a user would:
#   1. cmake --install into $TP_WORK_DIR/prefix; check the installed files
#      and the SONAME;
#   2. compile every installed header on its own (self-contained, strict C11);
#   3. build consumer/ with find_package(tpipe) against tpipe::tpipe and
#      against tpipe::tpipe_static;
#   4. build consumer.c with `pkg-config --cflags --libs tpipe` (shared) and
#      with `pkg-config --static --libs tpipe` (static archive);
# and run each binary, comparing its output. Any failing step fails the test.
#
# Called by CTest (tests/install/CMakeLists.txt), which sets the TP_*
# variables below.
set -euo pipefail

: "${TP_CMAKE:?}" "${TP_CC:?}" "${TP_PKG_CONFIG:?}" "${TP_BUILD_DIR:?}"
: "${TP_WORK_DIR:?}" "${TP_LIBDIR:?}" "${TP_INCLUDEDIR:?}" "${TP_VERSION:?}"
: "${TP_SOVERSION:?}" "${TP_CONSUMER_DIR:?}"
TP_GENERATOR=${TP_GENERATOR:-}
TP_SANITIZE=${TP_SANITIZE:-}

work=$TP_WORK_DIR
prefix=$work/prefix
libdir=$prefix/$TP_LIBDIR
includedir=$prefix/$TP_INCLUDEDIR
step=""

fail() {
    echo "install_consumer: FAIL at step '$step': $*" >&2
    exit 1
}
on_exit() {
    local rc=$?
    [ $rc -eq 0 ] || echo "install_consumer: step '$step' failed (exit $rc)" >&2
}
trap on_exit EXIT

# A sanitized libtpipe needs the sanitizer runtime in the program too.
san_flags=()
if [ -n "$TP_SANITIZE" ]; then
    san_flags=(-fsanitize="$TP_SANITIZE" -fno-omit-frame-pointer)
fi
cflags=(-std=c11 -Wall -Wextra -Wpedantic -Werror -Wstrict-prototypes
        "${san_flags[@]}")

expected="tpipe $TP_VERSION
TP_ECLOSED
tp_error(NULL): status TP_OK, errno 0, message \"success\", cause NULL, ref NULL
tp_info_transports: tcp listed"

# check_run <binary> <shared|static>: run it, compare output, check linkage.
check_run() {
    local bin=$1 kind=$2 out needed
    out=$("$bin") || fail "$bin exited with $?; output: $out"
    if [ "$out" != "$expected" ]; then
        echo "--- expected" >&2
        echo "$expected" >&2
        echo "--- got" >&2
        echo "$out" >&2
        fail "unexpected output from $bin"
    fi
    needed=$(readelf -d "$bin" | grep NEEDED || true)
    if [ "$kind" = shared ]; then
        grep -q "\[libtpipe\.so\.$TP_SOVERSION\]" <<<"$needed" ||
            fail "$bin does not link libtpipe.so.$TP_SOVERSION: $needed"
    else
        ! grep -q libtpipe <<<"$needed" ||
            fail "$bin should be static but needs: $needed"
    fi
    echo "ok: $bin ($kind)"
}

step="clean"
rm -rf "$work"
mkdir -p "$work"

step="cmake --install"
env -u DESTDIR "$TP_CMAKE" --install "$TP_BUILD_DIR" --prefix "$prefix" \
    >"$work/install.log" 2>&1 || { cat "$work/install.log" >&2; fail "install"; }

step="installed files"
for f in "$includedir/tpipe/tpipe.h" "$includedir/tpipe/version.h" \
         "$libdir/libtpipe.so" "$libdir/libtpipe.so.$TP_SOVERSION" \
         "$libdir/libtpipe.so.$TP_VERSION" "$libdir/libtpipe.a" \
         "$libdir/pkgconfig/tpipe.pc" \
         "$libdir/cmake/tpipe/tpipeConfig.cmake" \
         "$libdir/cmake/tpipe/tpipeConfigVersion.cmake" \
         "$libdir/cmake/tpipe/tpipeTargets.cmake"; do
    [ -e "$f" ] || fail "missing $f"
done
soname=$(readelf -d "$libdir/libtpipe.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libtpipe.so.$TP_SOVERSION" ] || fail "SONAME is '$soname'"
# Private headers stay private (STYLE.md §3).
extra=$(cd "$includedir" && find . -type f ! -path './tpipe/*')
[ -z "$extra" ] || fail "unexpected files under include/: $extra"

step="headers stand alone"
for h in "$includedir"/tpipe/*.h; do
    # The typedef keeps a header that only defines macros from being an
    # empty translation unit (-Wpedantic).
    printf '#include <tpipe/%s>\ntypedef int tp_check;\n' "${h##*/}" |
        "$TP_CC" "${cflags[@]}" -I"$includedir" -fsyntax-only -x c - ||
        fail "<tpipe/${h##*/}> does not compile on its own"
done

gen=()
[ -z "$TP_GENERATOR" ] || gen=(-G "$TP_GENERATOR")
for kind in shared static; do
    target=tpipe::tpipe
    [ "$kind" = static ] && target=tpipe::tpipe_static
    step="find_package consumer, $target"
    bdir=$work/cmake-$kind
    "$TP_CMAKE" -S "$TP_CONSUMER_DIR" -B "$bdir" "${gen[@]}" \
        -DCMAKE_C_COMPILER="$TP_CC" \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
        -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
        -DCMAKE_C_FLAGS="${san_flags[*]}" \
        -DCMAKE_EXE_LINKER_FLAGS="${san_flags[*]}" \
        -DTPIPE_TARGET="$target" >"$work/cmake-$kind.log" 2>&1 ||
        { cat "$work/cmake-$kind.log" >&2; fail "configure"; }
    found=$(sed -n 's/^tpipe_DIR:PATH=//p' "$bdir/CMakeCache.txt")
    [ "$found" = "$libdir/cmake/tpipe" ] ||
        fail "find_package found tpipe in '$found', not in $prefix"
    "$TP_CMAKE" --build "$bdir" >>"$work/cmake-$kind.log" 2>&1 ||
        { cat "$work/cmake-$kind.log" >&2; fail "build"; }
    check_run "$bdir/consumer" "$kind"
done

export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
step="pkg-config tpipe"
pc_version=$("$TP_PKG_CONFIG" --modversion tpipe)
[ "$pc_version" = "$TP_VERSION" ] || fail "pkg-config version '$pc_version'"
pc_cflags=$("$TP_PKG_CONFIG" --cflags tpipe)
pc_libs=$("$TP_PKG_CONFIG" --libs tpipe)
pc_static=$("$TP_PKG_CONFIG" --static --libs tpipe)
grep -q -- "-I$includedir" <<<"$pc_cflags" || fail "cflags: $pc_cflags"
echo "pkg-config: cflags '$pc_cflags' libs '$pc_libs' static '$pc_static'"

step="pkg-config consumer, shared"
# shellcheck disable=SC2086 # pkg-config output is a list of words
"$TP_CC" "${cflags[@]}" "$TP_CONSUMER_DIR/consumer.c" -o "$work/pc-shared" \
    $pc_cflags $pc_libs -Wl,-rpath,"$libdir"
check_run "$work/pc-shared" shared

step="pkg-config consumer, static"
# -l:libtpipe.a picks the archive; the rest of --static --libs must be
# enough to link it (Libs.private, Requires.private).
# shellcheck disable=SC2086
"$TP_CC" "${cflags[@]}" "$TP_CONSUMER_DIR/consumer.c" -o "$work/pc-static" \
    $pc_cflags ${pc_static//-ltpipe/-l:libtpipe.a}
check_run "$work/pc-static" static

# The quickstart (docs/quickstart.md) from the install tree, both ways the
# page shows, run under the installed `tpipe run`.
qs=$prefix/share/tpipe/examples/quickstart
step="quickstart, find_package"
[ -f "$qs/CMakeLists.txt" ] && [ -f "$qs/hello_rpc.c" ] && [ -f "$qs/allreduce.c" ] ||
    fail "quickstart sources not installed in $qs"
"$TP_CMAKE" -S "$qs" -B "$work/qs" "${gen[@]}" -DCMAKE_C_COMPILER="$TP_CC" \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_C_FLAGS="${san_flags[*]}" \
    -DCMAKE_EXE_LINKER_FLAGS="${san_flags[*]}" >"$work/qs.log" 2>&1 &&
    "$TP_CMAKE" --build "$work/qs" >>"$work/qs.log" 2>&1 ||
    { cat "$work/qs.log" >&2; fail "build"; }
step="quickstart, run"
out=$("$prefix/bin/tpipe" run -n 3 --timeout 60 -- "$work/qs/hello_rpc" 2>&1) ||
    fail "hello_rpc: $out"
grep -qx '\[0\] hello from worker2, worker0' <<<"$out" || fail "hello_rpc output: $out"
out=$("$prefix/bin/tpipe" run -n 2 --timeout 60 -- "$work/qs/allreduce" 2>&1) ||
    fail "allreduce: $out"
grep -qx '\[1\] rank 1 of 2: sum 1' <<<"$out" || fail "allreduce output: $out"
step="quickstart, pkg-config"
# shellcheck disable=SC2086
"$TP_CC" "${san_flags[@]}" -std=c11 "$qs/hello_rpc.c" -o "$work/qs-pc-hello" \
    $pc_cflags $pc_libs -Wl,-rpath,"$libdir" || fail "pkg-config build"
out=$("$prefix/bin/tpipe" run -n 2 --timeout 60 -- "$work/qs-pc-hello" 2>&1) ||
    fail "pkg-config hello_rpc: $out"
grep -qx '\[0\] hello from worker1, worker0' <<<"$out" || fail "pkg-config output: $out"
echo "ok: quickstart (find_package, pkg-config)"

step="done"
echo "install_consumer: all steps passed"
