#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench_pipe_cuda_test.sh TPIPE FAKE_CUDART [PYTHON3] - `tpipe bench pipe
# --device` against the fake CUDA runtime (tests/cuda/fake_cudart.c:
# "device memory" is host memory only its cudaMemcpy touches). The tool
# loads libcudart by name (core/cuda.c), so a directory of this test holds
# the fake under those names, first on LD_LIBRARY_PATH. Checked: every
# device pair (cuda:N, CUDA->CPU, CPU->CUDA, CUDA->CUDA) measures, forked,
# in one process (xth), repeated, bibw, across two tpipe processes
# (--listen/--connect, a launched job); the bytes arrive (the pingpong's
# stamps, the server's check of the last stream message); the cudaMemcpy
# baseline rows; a server given another --device is found; exit 77 with
# the reason and no device (FAKE_CUDA_DEVICES=0); bad specs exit 2;
# `tpipe info` names a driver too old for the runtime.
set -u
TPIPE=$1
FAKE=$2
PY=${3:-python3}
TMP=$(mktemp -d)
spid=""
trap '[ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null; rm -rf "$TMP"' EXIT
fail() {
  echo "bench_pipe_cuda_test: FAIL: $*" >&2
  for f in "$TMP"/*.txt; do [ -f "$f" ] && sed "s|^|$(basename "$f"): |" "$f" >&2; done
  exit 1
}
[ -f "$FAKE" ] || fail "no fake runtime at $FAKE"
mkdir "$TMP/lib"
# The fake also stands for the driver (libcuda.so.1: cuda_ipc asks it for
# an allocation's range).
for n in libcudart.so.13 libcudart.so.12 libcudart.so libcuda.so.1; do
  ln -s "$FAKE" "$TMP/lib/$n"
done
export LD_LIBRARY_PATH="$TMP/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FAKE_CUDA_DEVICES=2
export TP_JOB_TOKEN=bench-pipe-cuda-test
common=(--sizes 64,64K --budget 0.05 --stall-timeout 10 --json)

# check NAME SRC DST TESTS REPS MODE COPIES: the JSON lines of $TMP/NAME.jsonl
# have a row per size for each of TESTS (comma list) with these devices,
# MODE ("proc", "thread", "remote" or "proc,thread") and REPS, and a
# baseline row per size for each of COPIES ("copy_d2d@cuda:0>cuda:0,...").
check() {
  "$PY" - "$@" <<'PYEOF' || fail "$1: bad rows"
import json, math, sys
name, src, dst, tests, reps, modes, copies = sys.argv[1:8]
tmp = __import__("os").environ["TMP"]
# The device channel the rows must name: "staged" unless DCH says.
dch = __import__("os").environ.get("DCH", "staged")
# A launched job's lines carry tpipe run's "[0] ".
rows = [json.loads(l[l.index("{"):])
        for l in open("%s/%s.jsonl" % (tmp, name)) if l.strip()]
sizes = [64, 65536]
pipe = [r for r in rows if r["mode"] != "copy"]
copy = [r for r in rows if r["mode"] == "copy"]
for r in pipe:
    assert r["device_src"] == src and r["device_dst"] == dst, r
    assert r["reps"] == int(reps) and r["iters"] >= 10, r
    assert r["mode"] in modes.split(","), r
    assert r["device_channel"] == dch, r
    if r["test"] == "pingpong":
        assert r["p50_us"] > 0 and r["gbps"] is None, r
    else:
        assert r["gbps"] > 0 and r["p50_us"] is None, r
want = sorted((m, t, s) for m in modes.split(",") for t in tests.split(",")
              for s in sizes)
got = sorted((r["mode"], r["test"], r["size"]) for r in pipe)
assert got == want, "pipe rows %s, want %s" % (got, want)
want = sorted((c.split("@")[0], c.split("@")[1], s)
              for c in copies.split(",") if c for s in sizes)
got = sorted((r["test"], r["device_src"] + ">" + r["device_dst"], r["size"])
             for r in copy)
assert got == want, "copy rows %s, want %s" % (got, want)
for r in copy:
    assert r["transport"] is None and r["channel"] is None, r
    assert math.isfinite(r["gbps"]) and r["gbps"] > 0, r
    assert r["reps"] >= 5 and r["iters"] >= 2 * r["reps"], r
PYEOF
}
export TMP

run() { # run NAME ARGS...: the tool, exit 0, JSON lines into NAME.jsonl
  local name=$1
  shift
  timeout -k 5 60 "$TPIPE" bench pipe "$@" >"$TMP/$name.jsonl" \
    2>"$TMP/$name.txt" || fail "$name: exit $? ($*)"
}

# Both ends on cuda:0, forked server, tcp+basic.
run d0 --device cuda:0 --transport tcp --channel basic "${common[@]}"
check d0 cuda:0 cuda:0 pingpong,stream 1 proc "copy_d2d@cuda:0>cuda:0"
# CUDA -> CPU, forked and in one process (xth).
run d2h --device cuda:0,cpu --transport tcp --channel basic,xth "${common[@]}"
check d2h cuda:0 cpu pingpong,stream 1 proc,thread \
  "copy_d2d@cuda:0>cuda:0,copy_d2h@cuda:0>cpu"
# CPU -> CUDA, two repetitions (each a forked measuring process).
run h2d --device 'cpu->cuda:1' --transport shm --channel basic --reps 2 \
  "${common[@]}"
check h2d cpu cuda:1 pingpong,stream 2 proc \
  "copy_d2d@cuda:1>cuda:1,copy_h2d@cpu>cuda:1"
# CUDA -> CUDA across devices, both ways at once.
run bibw --device 'cuda:0->cuda:1' --transport tcp --channel basic \
  --test bibw "${common[@]}"
check bibw cuda:0 cuda:1 bibw 1 proc "copy_d2d@cuda:0>cuda:1"

# cuda_ipc, the device channel: off here by default (no NVIDIA driver,
# /dev/nvidiactl), on with TP_CUDA_IPC=on (the fake needs no driver); the
# bytes are checked by the bench's stamps. --device-channel none stages.
TP_CUDA_IPC=on run ipc --device cuda:0,cpu --transport tcp --channel basic \
  "${common[@]}"
DCH=cuda_ipc check ipc cuda:0 cpu pingpong,stream 1 proc \
  "copy_d2d@cuda:0>cuda:0,copy_d2h@cuda:0>cpu"
TP_CUDA_IPC=on run ipc_xth --device 'cuda:1->cuda:0' --transport tcp \
  --channel xth "${common[@]}"
DCH=cuda_ipc check ipc_xth cuda:1 cuda:0 pingpong,stream 1 thread \
  "copy_d2d@cuda:1>cuda:0"
TP_CUDA_IPC=on run ipc_none --device cuda:0 --device-channel none \
  --transport tcp --channel basic "${common[@]}"
check ipc_none cuda:0 cuda:0 pingpong,stream 1 proc "copy_d2d@cuda:0>cuda:0"

# The table has the device column and the baseline rows.
timeout -k 5 60 "$TPIPE" bench pipe --device cuda:1 --transport tcp \
  --channel basic --sizes 64 --test pingpong --budget 0.05 \
  >"$TMP/table.txt" 2>&1 || fail "table run"
head -n1 "$TMP/table.txt" | grep -q ' device ' || fail "no device column"
grep -q 'proc  *cuda:1->cuda:1  *pingpong' "$TMP/table.txt" ||
  fail "no pingpong row on cuda:1"
grep -q 'copy  *cuda:1->cuda:1  *copy_d2d' "$TMP/table.txt" ||
  fail "no baseline row"

# Two tpipe processes: --listen / --connect, both given the pair.
timeout -k 5 60 "$TPIPE" bench pipe --listen --bind 127.0.0.1 \
  --device cuda:1,cuda:0 "${common[@]}" >"$TMP/url.txt" 2>"$TMP/srv.txt" &
spid=$!
for _ in $(seq 100); do [ -s "$TMP/url.txt" ] && break; sleep 0.1; done
url=$(head -n1 "$TMP/url.txt")
run remote --connect "$url" --device cuda:1,cuda:0 "${common[@]}"
wait "$spid" || fail "the --listen server exited $?"
spid=""
# The baseline here: this side's device only (cuda:0 is the server's).
check remote cuda:1 cuda:0 pingpong,stream 1 remote "copy_d2d@cuda:1>cuda:1"
# A launched job: rank 1 receives on cuda:1; rank 0's tensors are on the
# CPU, so it has no baseline to measure, and says so.
timeout -k 5 90 "$TPIPE" run -n 2 --output-ranks 0 -- "$TPIPE" bench pipe \
  --device cpu,cuda:1 "${common[@]}" >"$TMP/launched.jsonl" \
  2>"$TMP/launched.txt" || fail "launched run"
check launched cpu cuda:1 pingpong,stream 1 remote ""
grep -q "no cudaMemcpy baseline here" "$TMP/launched.txt" ||
  fail "launched: no word about the baseline"
# A server told another device: the descriptor says so, the run fails.
timeout -k 5 60 "$TPIPE" bench pipe --listen --bind 127.0.0.1 \
  --device cuda:1,cuda:0 "${common[@]}" >"$TMP/url2.txt" \
  2>"$TMP/srv2.txt" &
spid=$!
for _ in $(seq 100); do [ -s "$TMP/url2.txt" ] && break; sleep 0.1; done
url=$(head -n1 "$TMP/url2.txt")
timeout -k 5 60 "$TPIPE" bench pipe --connect "$url" --device cuda:0 \
  "${common[@]}" >"$TMP/mismatch.jsonl" 2>"$TMP/mismatch.txt" &&
  fail "a client on another device than the server's --device measured"
wait "$spid" && fail "the server of a mismatched client exited 0"
spid=""
grep -q "the client's tensor is on cuda:0, --device says cuda:1" \
  "$TMP/srv2.txt" || fail "the server did not name the mismatch"

# No device: skipped (77), one line with the runtime's reason.
FAKE_CUDA_DEVICES=0 timeout -k 5 30 "$TPIPE" bench pipe --device cuda:0 \
  >"$TMP/nodev.jsonl" 2>"$TMP/nodev.txt"
rc=$?
[ $rc -eq 77 ] || fail "no device: exit $rc, want 77"
[ "$(wc -l <"$TMP/nodev.txt")" -eq 1 ] && [ ! -s "$TMP/nodev.jsonl" ] ||
  fail "no device: want exactly one line"
grep -q 'skipped, CUDA is not usable here: .*no CUDA' "$TMP/nodev.txt" ||
  fail "no device: the reason is missing"
# Usage errors: exit 2, naming the option and why.
usage() { # usage WANT ARGS...
  local want=$1
  shift
  timeout -k 5 30 "$TPIPE" bench pipe "$@" >"$TMP/usage.jsonl" \
    2>"$TMP/usage.txt"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit $rc, want 2"
  grep -q -- "$want" "$TMP/usage.txt" || fail "$*: no '$want'"
}
usage '--device gpu:0: not a device spec' --device gpu:0
usage '--device cuda:0->: not a device spec' --device 'cuda:0->'
usage '--device cuda:0,cuda:1,cpu: not a device spec' --device cuda:0,cuda:1,cpu
usage '--device cpu,cuda:2: no CUDA device 2 here (2 devices' --device cpu,cuda:2
usage '--test msgrate measures CPU messages only' --device cuda:0 --test msgrate
usage '--device-channel nope: not a device channel built here (valid: cuda_ipc, none)' \
  --device cuda:0 --device-channel nope
usage '--device-channel cuda_ipc: only with a CUDA --device' \
  --device-channel cuda_ipc
# cuda_ipc's viability compares the driver's and the runtime's versions
# without initialising CUDA: a driver of an older major version, or one
# reporting none, is named in `tpipe info` (core/cuda.c).
ipc_info() { # ipc_info WANT [DRIVER_VERSION]
  env TP_CUDA_IPC=on ${2:+FAKE_CUDA_DRIVER_VERSION=$2} timeout -k 5 30 \
    "$TPIPE" info >"$TMP/info.txt" 2>&1 || fail "tpipe info: exit $?"
  grep -q -- "$1" "$TMP/info.txt" || fail "driver ${2:-same}: no '$1'"
}
ipc_info 'cuda_ipc  yes'
ipc_info 'cuda_ipc  no: the CUDA driver supports CUDA 1.0, older than the runtime' 1000
ipc_info 'cuda_ipc  no: the CUDA driver library reports no driver' 0
echo "bench_pipe_cuda_test: ok"
