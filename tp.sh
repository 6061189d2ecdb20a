#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tp.sh - build and check tpipe with one command.
#
#   ./tp.sh demo [ARGS...]  install missing packages, build, then train an MLP
#                           on Fashion-MNIST with a parameter server and data
#                           parallel (build/examples/train/tp_train ARGS...)
#   ./tp.sh test            what CI runs (.ci/run): build with -Werror, unit
#                           tests, ASan+UBSan tests, TSan tests, format check
#   ./tp.sh format          clang-format -i every tracked .c/.h file
#
# Environment:
#   TP_SKIP_SANITIZE=1  test: skip the ASan/UBSan and TSan trees
#   TP_SKIP_DEPS=1      do not check or install Debian packages
#   TP_FUZZ_SECONDS=N   test: seconds of each libFuzzer run (default 10)
#
# Build trees: build/ (RelWithDebInfo), build-asan/ (Debug, address,undefined),
# build-tsan/ (RelWithDebInfo, thread), build-fuzz/ (clang, libFuzzer
# targets of the wire decoders, docs/fuzzing.md). Each is configured only when it does
# not exist yet or its cache disagrees with the options below. See
# docs/building.md.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"

# Packages: needed to build at all, and wanted for the optional backends and
# tooling (the build leaves a backend out when its package is missing).
NEED_PKGS=(build-essential cmake pkg-config libxxhash-dev liburing-dev)
WANT_PKGS=(libibverbs-dev librdmacm-dev libucx-dev libopenblas-dev clang clang-format
           zlib1g-dev libssl-dev libpmix-dev iptables valgrind)
# The demo also needs the data set and zlib to read it (tp_train).
DEMO_PKGS=(dataset-fashion-mnist zlib1g-dev)

JOBS=$(nproc 2>/dev/null || echo 2)
PLAIN_OPTS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_WERROR=ON)
ASAN_OPTS=(-DCMAKE_BUILD_TYPE=Debug -DTP_WERROR=ON
           "-DTP_SANITIZE=address,undefined")
# TSan finds races at -O2 as well as at -O0, and runs much faster.
TSAN_OPTS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_WERROR=ON
           -DTP_SANITIZE=thread)
FUZZ_OPTS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_WERROR=ON -DTP_FUZZ=ON
           "-DCMAKE_C_COMPILER=$(command -v clang || echo clang)"
           "-DTP_FUZZ_SECONDS=${TP_FUZZ_SECONDS:-10}")

say() { printf 'tp.sh: %s\n' "$*"; }
die() {
    printf 'tp.sh: error: %s\n' "$*" >&2
    exit 1
}

usage() {
    sed -n '3,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# ---- stages ----------------------------------------------------------------
# run_stage NAME CMD...: runs CMD, prints and records "NAME  ok|FAIL  Ns".
# Stage bodies chain their commands with && (errexit does not apply inside
# a command whose status is tested).
SUMMARY=()
FAILED=0
T_START=$SECONDS

record() { # record NAME STATUS SECONDS
    local line
    line=$(printf '%-26s %-5s %5ss' "$1" "$2" "$3")
    SUMMARY+=("$line")
    say "$line"
}

run_stage() {
    local name=$1 t0=$SECONDS
    shift
    say "== $name"
    if "$@"; then
        record "$name" ok $((SECONDS - t0))
        return 0
    fi
    record "$name" FAIL $((SECONDS - t0))
    FAILED=1
    return 1
}

skip_stage() { # skip_stage NAME WHY
    record "$1" skip 0
    say "   ($2)"
}

print_summary() {
    echo
    say "summary (total $((SECONDS - T_START))s):"
    printf '  %s\n' "${SUMMARY[@]}"
}

# ---- Debian packages -------------------------------------------------------
pkg_installed() {
    dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | grep -q '^ii'
}

# ensure_packages [EXTRA_NEEDED...]: install what is missing (as root), or
# print the command to do so.
ensure_packages() {
    local need=("${NEED_PKGS[@]}" "$@") want=() miss_need=() miss_want=() p
    for p in "${WANT_PKGS[@]}"; do
        [[ " ${need[*]} " == *" $p "* ]] || want+=("$p")
    done
    if [ "${TP_SKIP_DEPS:-0}" = 1 ]; then
        say "TP_SKIP_DEPS=1: not checking packages"
        return 0
    fi
    if ! command -v dpkg-query >/dev/null 2>&1; then
        say "no dpkg-query (not Debian?): not checking packages; this needs"
        say "  ${need[*]} (and ideally ${want[*]})"
        return 0
    fi
    for p in "${need[@]}"; do
        pkg_installed "$p" || miss_need+=("$p")
    done
    for p in "${want[@]}"; do
        pkg_installed "$p" || miss_want+=("$p")
    done
    if [ ${#miss_need[@]} -eq 0 ] && [ ${#miss_want[@]} -eq 0 ]; then
        say "packages: all present"
        return 0
    fi
    if [ "$(id -u)" -eq 0 ]; then
        say "installing: ${miss_need[*]} ${miss_want[*]}"
        apt-get update || die "apt-get update failed"
        if DEBIAN_FRONTEND=noninteractive apt-get install -y \
            "${miss_need[@]}" "${miss_want[@]}"; then
            return 0
        fi
        # An optional package may be missing from this archive or
        # architecture (libucx-dev): retry with the required ones only.
        [ ${#miss_need[@]} -gt 0 ] || {
            say "warning: could not install optional ${miss_want[*]}"
            return 0
        }
        DEBIAN_FRONTEND=noninteractive apt-get install -y "${miss_need[@]}" ||
            die "could not install ${miss_need[*]}"
        say "warning: could not install optional ${miss_want[*]}"
        return 0
    fi
    echo "tp.sh: missing Debian packages; install them with:" >&2
    echo "  sudo apt-get install -y ${miss_need[*]} ${miss_want[*]}" >&2
    if [ ${#miss_need[@]} -gt 0 ]; then
        exit 1
    fi
    # Only optional packages are missing: the build still works, without
    # the backends (or tools) they provide.
    say "warning: continuing without optional ${miss_want[*]}"
}

# ---- configure and build ---------------------------------------------------
# cache_matches DIR -DKEY=VALUE...: DIR's cache has every KEY set to VALUE.
cache_matches() {
    local dir=$1 kv key val
    shift
    for kv in "$@"; do
        kv=${kv#-D}
        key=${kv%%=*}
        val=${kv#*=}
        grep -qx "$key:[A-Z]*=$val" "$dir/CMakeCache.txt" || return 1
    done
}

configure() { # configure DIR OPTIONS...
    local dir=$1
    shift
    if [ -f "$dir/CMakeCache.txt" ] && cache_matches "$dir" "$@"; then
        return 0
    fi
    cmake -S . -B "$dir" "$@"
}

build_tree() { # build_tree DIR OPTIONS...
    local dir=$1
    shift
    configure "$dir" "$@" && cmake --build "$dir" -j"$JOBS"
}

# ---- test stages -----------------------------------------------------------
ctest_plain() {
    ctest --test-dir build --output-on-failure -j2 -LE 'slow|valgrind'
}

# A multi-process example under valgrind memcheck (plain build: valgrind
# and the sanitizers do not mix; the loops fall back to epoll under it).
ctest_valgrind() {
    ctest --test-dir build --output-on-failure -j1 -L valgrind
}

# Tests labelled slow (the > 4 GiB transfers, 4 GiB of memory each): one
# at a time, plain build only.
ctest_slow() {
    ctest --test-dir build --output-on-failure -j1 -L slow
}

ctest_asan() {
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        TP_TEST_TIMEOUT_MULTIPLIER=${TP_TEST_TIMEOUT_MULTIPLIER:-2} \
        ctest --test-dir build-asan --output-on-failure -j2 -LE slow
}

# atexit_sleep_ms=0: TSan otherwise sleeps 1 s in every exiting process
# (for late reports), which the multi-process tests pay per child
# (cma_exit_test: 174 s against 12 s); races are still reported where
# they happen (halt_on_error).
ctest_tsan() {
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:atexit_sleep_ms=0 \
        TP_TEST_TIMEOUT_MULTIPLIER=${TP_TEST_TIMEOUT_MULTIPLIER:-3} \
        ctest --test-dir build-tsan --output-on-failure -j2 -L tsan
}

# Number of tests labelled tsan, known after configuring (before building).
ctest_fuzz() {
    ctest --test-dir build-fuzz --output-on-failure -j1 -L fuzz
}

build_fuzz() {
    # Always regenerated: a target added since the tree was configured is
    # otherwise unknown to the generated Makefile ("No rule to make target").
    cmake -S . -B build-fuzz "${FUZZ_OPTS[@]}" >/dev/null &&
        cmake --build build-fuzz -j"$JOBS" --target fuzz_desc fuzz_brochure fuzz_rpc \
            fuzz_handshake fuzz_p2p fuzz_rref fuzz_dist_autograd
}

tsan_test_count() {
    ctest --test-dir build-tsan -N -L tsan 2>/dev/null |
        sed -n 's/^Total Tests: *//p'
}

tracked_c_files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -- '*.c' '*.h' | while read -r f; do
            [ -f "$f" ] && printf '%s\n' "$f"
        done
    else
        find . -path './build*' -prune -o -name '*.[ch]' -print | sort
    fi
}

format_check() {
    local f bad=()
    command -v clang-format >/dev/null 2>&1 ||
        { echo "clang-format is not installed" >&2; return 1; }
    while read -r f; do
        clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
    done < <(tracked_c_files)
    if [ ${#bad[@]} -gt 0 ]; then
        echo "misformatted (fix with ./tp.sh format):" >&2
        printf '  %s\n' "${bad[@]}" >&2
        return 1
    fi
}

# ---- commands --------------------------------------------------------------
cmd_demo() {
    ensure_packages "${DEMO_PKGS[@]}"
    run_stage "build (build/)" build_tree build "${PLAIN_OPTS[@]}" ||
        die "build failed"
    local tool=build/tools/tpipe
    [ -x "$tool" ] || die "$tool was not built (is tools/tpipe.c there?)"
    local train=build/examples/train/tp_train
    [ -x "$train" ] || die "$train was not built (is examples/train there?)"
    # The demo: one epoch of an MLP 784-512-10 on Fashion-MNIST (60000
    # images, batch 64, SGD lr 0.05), first with a parameter server (rank
    # 0 holds the model as a remote object; ranks 1 and 2 train on half
    # the data each: RPC, distributed autograd, DistributedOptimizer),
    # then data parallel on 2 ranks (gradient buckets all_reduced during
    # backward). Each prints a line per epoch, the test accuracy beside
    # the data set's benchmark table, and a "result:" line (samples/s).
    # Arguments go to both runs (e.g. ./tp.sh demo --epochs 3).
    # docs/training.md; bench/run_train.sh compares with PyTorch.
    say "== $tool run -n 3 $train --mode ps $*"
    "$tool" run -n 3 --timeout 300 -- "$train" --mode ps "$@" ||
        die "the parameter-server training failed"
    say "== $tool run -n 2 $train --mode ddp $*"
    "$tool" run -n 2 --timeout 300 -- "$train" --mode ddp "$@" ||
        die "the data-parallel training failed"
    # The smaller examples: every RPC worker calls its neighbour (echo,
    # registered functions, calls in flight, RRefs); a process group's
    # broadcast, async all_reduce, all_gather and subgroup.
    local demo=build/examples/rpc_demo cdemo=build/examples/coll_demo
    say "== $tool run -n 3 $demo"
    "$tool" run -n 3 --timeout 120 -- "$demo" || die "the RPC demo failed"
    say "== $tool run -n 4 $cdemo"
    "$tool" run -n 4 --timeout 120 -- "$cdemo" ||
        die "the collectives demo failed"
    say "done; benchmarks: $tool bench rpc|collective|pipe, bash bench/run_train.sh"
}

cmd_test() {
    ensure_packages clang-format clang

    if run_stage "build (build/)" build_tree build "${PLAIN_OPTS[@]}"; then
        run_stage "ctest build/ -LE slow" ctest_plain || true
        run_stage "ctest build/ -L slow" ctest_slow || true
    else
        skip_stage "ctest build/ -LE slow" "build failed"
    fi

    if [ "${TP_SKIP_SANITIZE:-0}" = 1 ]; then
        skip_stage "asan+ubsan" "TP_SKIP_SANITIZE=1"
        skip_stage "tsan" "TP_SKIP_SANITIZE=1"
        skip_stage "valgrind" "TP_SKIP_SANITIZE=1"
    else
        if [ -x build/examples/rpc_demo ] && command -v valgrind >/dev/null 2>&1; then
            run_stage "valgrind memcheck (build/)" ctest_valgrind || true
        else
            skip_stage "valgrind memcheck (build/)" "valgrind or build/ missing"
        fi
        if run_stage "build (build-asan/)" \
            build_tree build-asan "${ASAN_OPTS[@]}"; then
            run_stage "ctest build-asan/ -LE slow" ctest_asan || true
        else
            skip_stage "ctest build-asan/ -LE slow" "build failed"
        fi

        # Configure first: with no test labelled tsan there is nothing to
        # build the TSan tree for.
        local n=0
        if run_stage "configure (build-tsan/)" \
            configure build-tsan "${TSAN_OPTS[@]}"; then
            n=$(tsan_test_count)
            if [ "${n:-0}" -eq 0 ]; then
                skip_stage "tsan" "no tests labelled tsan"
            elif run_stage "build (build-tsan/)" \
                cmake --build build-tsan -j"$JOBS"; then
                run_stage "ctest build-tsan/ -L tsan" ctest_tsan || true
            else
                skip_stage "ctest build-tsan/ -L tsan" "build failed"
            fi
        fi
    fi

    # A bounded libFuzzer run of each wire decoder (clang only).
    if ! command -v clang >/dev/null 2>&1; then
        skip_stage "fuzz" "clang not installed"
    elif run_stage "build (build-fuzz/)" build_fuzz; then
        run_stage "fuzz build-fuzz/ -L fuzz" ctest_fuzz || true
    else
        skip_stage "fuzz build-fuzz/ -L fuzz" "build failed"
    fi

    run_stage "clang-format" format_check || true

    print_summary
    if [ "$FAILED" -ne 0 ]; then
        say "FAILED"
        exit 1
    fi
    say "all passed"
}

cmd_format() {
    command -v clang-format >/dev/null 2>&1 ||
        ensure_packages clang-format clang
    local n=0 f
    while read -r f; do
        clang-format -i "$f"
        n=$((n + 1))
    done < <(tracked_c_files)
    say "formatted $n files"
}

case "${1:-}" in
demo)
    shift
    cmd_demo "$@"
    ;;
test)
    shift
    [ $# -eq 0 ] || die "test takes no arguments"
    cmd_test
    ;;
format)
    shift
    cmd_format
    ;;
-h | --help | help)
    usage
    ;;
*)
    usage >&2
    exit 2
    ;;
esac
