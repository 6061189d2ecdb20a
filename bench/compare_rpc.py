#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compare_rpc.py - markdown of `tpipe bench rpc` beside PyTorch's RPC
(TensorPipe agent; ../shared/peers/run_all.sh rpc), same session, with the
RPC issue's targets.

usage: compare_rpc.py OURS.jsonl PEERS_RAW.txt [pipe=PIPE.jsonl]
                     [transport=TRANSPORT.jsonl]

OURS.jsonl: lines of `tpipe bench rpc --json --reps R` (each already the
median over R repetitions): {"bench":"rpc","transport":"shm","test":"noop",
"size":0,"p50_us":..,"calls_per_s":..,...}. PEERS_RAW.txt: run_all.sh's
raw.txt, lines "rep=N RPC backend=tensorpipe transports=default
channels=default test=noop n=.. median_us=.." (torch_rpc_bench.py), also
test=echo_67108864 (median_us, bidir_GBps), test=async64_noop
(calls_per_s), test=init_rpc (seconds), test=remote_to_here and
test=dist_autograd_fwd_bwd (median_us; our remote and dist_autograd).

With the layer files (`tpipe bench pipe|transport --json` of the same
session), it also prints the in-run ratios the RRef issue names: remote +
to_here over the no-op round trip, the no-op over the pipe's 64 B round
trip (shm+basic), the pipe's over the transport's (shm).

Matching: our shm is PyTorch's default (transports shm > uv, channels cma >
mpt_uv > basic: shm+cma between two local processes), our tcp is PyTorch's
uv/basic (transports=uv channels=basic). PyTorch's value is the median
over its reps. Targets apply to the default (shm) rows, and to the noop
round trip over tcp. Exit status 0 even when a target is missed (a report,
not a test).
"""
import statistics
import sys

from benchlib import fmt, read_json_lines, read_peer_lines

# Our transport -> PyTorch's (transports, channels) of torch_rpc_bench.py.
PEER_CFG = {"shm": ("default", "default"), "tcp": ("uv", "basic")}
PEER_NAME = {"shm": "default (shm+cma)", "tcp": "uv+basic"}

ECHO_SIZE = 64 << 20

# (title, our test, our size, our field, our scale, peer test, peer field,
#  peer scale, unit, lower is better, {transport: (target, text)})
ROWS = (
    ("no-op rpc_sync round trip", "noop", 0, "p50_us", 1, "noop",
     "median_us", 1, "us", True,
     {"shm": (5, "<= 5 us"), "tcp": (25, "<= 25 us")}),
    ("tensor echo 64 MiB (rpc_sync, p50)", "echo", ECHO_SIZE, "p50_us", 1e-3,
     "echo_%d" % ECHO_SIZE, "median_us", 1e-3, "ms", True,
     {"shm": (25, "<= 25 ms")}),
    ("rpc_async no-op, 64 in flight", "async", 0, "calls_per_s", 1,
     "async64_noop", "calls_per_s", 1, "calls/s", False,
     {"shm": (200000, ">= 200000 calls/s")}),
    ("init, 2 workers (worker0)", "init", 0, "p50_us", 1e-3, "init_rpc",
     "seconds", 1e3, "ms", True, {"shm": (20, "<= 20 ms")}),
    ("remote() + to_here() of a no-op", "remote", 0, "p50_us", 1,
     "remote_to_here", "median_us", 1, "us", True, {}),
    ("user RRef to a third worker and back (rref_fork)", "rref_fork", 0,
     "p50_us", 1, "-", "median_us", 1, "us", True, {}),
    ("distributed autograd fwd + bwd, 1024 floats", "dist_autograd", 0,
     "p50_us", 1,
     "dist_autograd_fwd_bwd", "median_us", 1, "us", True,
     {"shm": (50, "<= 50 us")}),
)

# In-run ratios the RRef issue names: (title, numerator (transport, test),
# denominator (bench, transport, test), target).
RATIOS = (
    ("remote + to_here / no-op round trip", ("shm", "remote"),
     ("rpc", "shm", "noop"), 2.0),
    ("no-op round trip / pipe 64 B round trip (shm+basic)", ("shm", "noop"),
     ("pipe", "shm", "pingpong"), 2.0),
    ("pipe 64 B round trip / transport 64 B round trip (shm)",
     ("pipe:shm", "pingpong"), ("transport", "shm", "pingpong"), 1.5),
)


def ours_value(rows, transport, test, size, field, scale):
    for r in rows:
        if (r.get("transport"), r.get("test"), r.get("size", 0)) == (
                transport, test, size):
            v = r.get(field)
            return None if v is None else v * scale, r.get("channel")
    return None, None


def peer_value(recs, transport, test, field, scale):
    trs, chs = PEER_CFG[transport]
    vals = []
    for kv in recs:
        if (kv.get("transports"), kv.get("channels"), kv.get("test")) != (
                trs, chs, test):
            continue
        try:
            vals.append(float(kv[field]) * scale)
        except (KeyError, ValueError):
            pass
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def layer_p50(path, bench, transport, test):
    """p50 of a 64-byte round trip from `tpipe bench pipe|transport --json`
    (each line already the median of its reps)."""
    vals = [r["p50_us"] for r in read_json_lines(path, bench=bench)
            if (r.get("transport"), r.get("test"), r.get("size")) == (
                transport, test, 64) and r.get("p50_us")]
    # transport: one line per I/O backend; the faster one is the bar.
    return min(vals) if vals else None


def ratios(ours, layer_files):
    """The in-run ratios, when the layer files (pipe.jsonl, transport.jsonl
    of the same session) were given."""
    files = dict(f.split("=", 1) for f in layer_files if "=" in f)
    lines = []
    for title, (ntr, ntest), (dbench, dtr, dtest), target in RATIOS:
        if ntr.startswith("pipe:"):
            nv = layer_p50(files.get("pipe", ""), "pipe", ntr[5:], ntest) \
                if "pipe" in files else None
        else:
            nv, _ = ours_value(ours, ntr, ntest, 0, "p50_us", 1)
        if dbench == "rpc":
            dv, _ = ours_value(ours, dtr, dtest, 0, "p50_us", 1)
        else:
            dv = layer_p50(files.get(dbench, ""), dbench, dtr, dtest) \
                if dbench in files else None
        if nv is None or dv is None:
            continue
        r = nv / dv
        lines.append("| %s | %s / %s us | %.2f | <= %.1f | %s |" % (
            title, fmt(nv), fmt(dv), r, target,
            "met" if r <= target else "**not met**"))
    if lines:
        print()
        print("| ratio, same run | values | ratio | target | met |")
        print("|---|---|---|---|---|")
        print("\n".join(lines))


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    ours = read_json_lines(argv[1], bench="rpc")
    peers = [kv for tag, kv in read_peer_lines(argv[2]) if tag == "RPC"]
    if not ours:
        print("(no tpipe bench rpc results)\n")
    print("| measure | tpipe | PyTorch | value | tpipe | PyTorch (reps) "
          "| tpipe/PyTorch | better | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    met = []
    matched = 0
    for (title, test, size, field, scale, ptest, pfield, pscale, unit,
         lower, targets) in ROWS:
        for tr in ("shm", "tcp"):
            v, ch = ours_value(ours, tr, test, size, field, scale)
            pv, n = peer_value(peers, tr, ptest, pfield, pscale)
            if v is None and pv is None and tr not in targets:
                continue
            ratio = v / pv if v is not None and pv else None
            if ratio is None:
                better = "n/a"
            else:
                matched += 1
                better = "tpipe" if (ratio < 1 if lower else ratio > 1) \
                    else "**PyTorch**"
            target, ttext = targets.get(tr, (None, "-"))
            if target is None:
                ok = "-"
            elif v is None:
                ok = "not measured"
                met.append((title, tr, None))
            else:
                hit = v <= target if lower else v >= target
                ok = "met" if hit else "**not met**"
                met.append((title, tr, hit))
            print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                title, "%s+%s" % (tr, ch) if ch else tr, PEER_NAME[tr], unit,
                fmt(v), "%s (%d)" % (fmt(pv), n) if pv is not None else "-",
                "%.3g" % ratio if ratio is not None else "-", better, ttext,
                ok))
    print()
    if met:
        print("Targets met: %d of %d (%s)." % (
            sum(1 for _, _, h in met if h), len(met),
            ", ".join("%s %s: %s" % (
                t, tr, "not measured" if h is None else
                "met" if h else "NOT met") for t, tr, h in met)))
    if not matched and ours:
        print("(no matching PyTorch rows: run `bash ../shared/peers/"
              "run_all.sh rpc` in the same session)")
    ratios(ours, argv[3:] if len(argv) > 3 else [])
    # Our other rows (other echo sizes), for the record.
    rest = [r for r in ours if r.get("test") == "echo"
            and r.get("size") != ECHO_SIZE]
    if rest:
        print()
        print("Other tpipe echo sizes: " + "; ".join(
            "%s+%s %d B: p50 %s us, %s GB/s" % (
                r.get("transport"), r.get("channel"), r.get("size", 0),
                fmt(r.get("p50_us")), fmt(r.get("gbps"))) for r in rest))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
