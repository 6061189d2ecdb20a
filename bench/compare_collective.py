#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compare_collective.py - markdown of `tpipe bench collective` beside gloo
(torch.distributed) and OpenMPI (../shared/peers/run_all.sh gloo mpi), same
session, with the collectives issue's targets.

usage: compare_collective.py OURS.jsonl PEERS_RAW.txt

OURS.jsonl: lines of `tpipe bench collective --json --reps R --world 2`
(each already the median over R repetitions): {"bench":"collective",
"op":"all_reduce","size":4096,"engine":"shm","time_us":..,"busbw_gbps":..}.
Runs of several engines may be mixed; rows are told apart by "engine".
PEERS_RAW.txt: run_all.sh's raw.txt, lines
  "rep=N GLOO world=2 test=all_reduce_4096 n=.. median_us=.. bytes=4096
   algbw_GBps=.. busbw_GBps=.."   (torch_gloo_bench.py; all_gather_<B> is
                                   per-rank input B, bytes = output 2B)
  "rep=N MPI btl=vader test=allreduce size=4096 iters=.. median_us=..
   busbw_GBps=.."                 (mpi_bench.c; also btl=tcp, test=barrier)
A peer's value is the median over its repetitions.

Sizes follow nccl-tests: all_reduce and broadcast the buffer, all_gather the
output (world x input), as the peers print them. Times differ in method:
ours is the mean per call of the slowest rank over a timed block of calls
(nccl-tests); gloo's and MPI's the median over iterations of the per-
iteration max over ranks (a mean is >= a median: the comparison does not
favour us). Exit status 0 even when a target is missed (a report, not a
test).
"""
import statistics
import sys

from benchlib import fmt, read_json_lines, read_peer_lines

MiB = 1 << 20
# (op, size) compared with the peers: what torch_gloo_bench.py and
# mpi_bench.c measure.
ROWS = [("all_reduce", s) for s in (4096, 65536, MiB, 16 * MiB, 64 * MiB)]
ROWS += [("broadcast", MiB), ("broadcast", 16 * MiB),
         ("all_gather", 2 * MiB), ("all_gather", 32 * MiB), ("barrier", 0)]

# (op, size, field, bound, lower is better, text)
TARGETS = (
    ("all_reduce", 4096, "time_us", 4.0, True, "all_reduce 4 KiB <= 4 us"),
    ("all_reduce", 64 * MiB, "busbw_gbps", 3.0, False,
     "all_reduce 64 MiB busbw >= 3.0 GB/s"),
    ("barrier", 0, "time_us", 1.0, True, "barrier <= 1 us"),
)


def size_name(n):
    if n == 0:
        return "-"
    for unit, div in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def ours_row(rows, engine, op, size):
    for r in rows:
        if (r.get("engine"), r.get("op"), r.get("size")) == (engine, op,
                                                             size):
            return r
    return None


def peer_gloo(recs, op, size):
    """(median_us, busbw, reps) of gloo's measurement of (op, size)."""
    if op == "barrier":
        test = "barrier"
    elif op == "all_gather":
        test = "all_gather_%d" % (size // 2)  # per-rank input, world 2
    else:
        test = "%s_%d" % (op, size)
    return peer_median([kv for kv in recs if kv.get("test") == test])


def peer_mpi(recs, btl, op, size):
    test = {"all_reduce": "allreduce", "barrier": "barrier"}.get(op)
    if test is None:
        return None, None, 0
    return peer_median([kv for kv in recs if kv.get("btl") == btl and
                        kv.get("test") == test and
                        int(kv.get("size", -1)) == size])


def peer_median(kvs):
    t, b = [], []
    for kv in kvs:
        try:
            t.append(float(kv["median_us"]))
        except (KeyError, ValueError):
            continue
        try:
            b.append(float(kv["busbw_GBps"]))
        except (KeyError, ValueError):
            pass
    if not t:
        return None, None, 0
    return statistics.median(t), statistics.median(b) if b else None, len(t)


def ratio(a, b):
    return "%.3g" % (a / b) if a is not None and b else "-"


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    ours = read_json_lines(argv[1], bench="collective")
    raw = read_peer_lines(argv[2])
    gloo = [kv for tag, kv in raw if tag == "GLOO"]
    mpi = [kv for tag, kv in raw if tag == "MPI"]
    engines = []
    for r in ours:
        if r.get("engine") not in engines:
            engines.append(r.get("engine"))
    # The default engine is the one `--engine auto` picks: shm when it
    # works here, else pipe.
    engines.sort(key=lambda e: (e != "shm", e))
    default = engines[0] if engines else None
    if not ours:
        print("(no tpipe bench collective results)\n")

    head = ["op", "size"]
    for e in engines:
        head += ["tpipe %s us" % e, "tpipe %s busbw" % e]
    head += ["gloo us (reps)", "gloo busbw", "MPI vader us (reps)",
             "MPI vader busbw", "MPI tcp us", "MPI tcp busbw",
             "tpipe %s / gloo (time)" % default,
             "tpipe %s / MPI vader (time)" % default]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for op, size in ROWS:
        cells = [op, size_name(size)]
        t_def = None
        for e in engines:
            r = ours_row(ours, e, op, size)
            t = r.get("time_us") if r else None
            b = r.get("busbw_gbps") if r and size else None
            if e == default:
                t_def = t
            cells += [fmt(t), fmt(b) if size else "-"]
        gt, gb, gn = peer_gloo(gloo, op, size)
        vt, vb, vn = peer_mpi(mpi, "vader", op, size)
        tt, tb, _ = peer_mpi(mpi, "tcp", op, size)
        cells += ["%s (%d)" % (fmt(gt), gn) if gt is not None else "-",
                  fmt(gb) if size else "-",
                  "%s (%d)" % (fmt(vt), vn) if vt is not None else "-",
                  fmt(vb) if size else "-", fmt(tt), fmt(tb) if size else "-",
                  ratio(t_def, gt), ratio(t_def, vt)]
        print("| " + " | ".join(cells) + " |")
    print()
    print("Times in µs, busbw in GB/s (1e9 B/s; nccl-tests' bus bandwidth: "
          "all_reduce 2(n-1)/n x size/time, all_gather (n-1)/n, broadcast "
          "1). Ratios below 1: tpipe is faster. gloo measures all_reduce, "
          "broadcast, all_gather and barrier; mpi_bench MPI_Allreduce and "
          "MPI_Barrier only.")
    print()

    # The targets, on the default engine.
    met = []
    print("| target | tpipe %s | met |" % default)
    print("|---|---|---|")
    for op, size, field, bound, lower, text in TARGETS:
        r = ours_row(ours, default, op, size)
        v = r.get(field) if r else None
        if v is None:
            ok = "not measured"
            met.append(None)
        else:
            hit = v <= bound if lower else v >= bound
            ok = "met" if hit else "**not met**"
            met.append(hit)
        unit = "us" if field == "time_us" else "GB/s"
        print("| %s | %s %s | %s |" % (text, fmt(v), unit, ok))
    print()
    print("Targets met: %d of %d." % (sum(1 for h in met if h), len(met)))
    if ours and not gloo and not mpi:
        print()
        print("(no gloo or MPI rows: run `bash ../shared/peers/run_all.sh "
              "gloo mpi` in the same session)")

    # Everything we measured, for the record.
    print()
    print("All tpipe rows (median over repetitions):")
    print()
    print("| engine | op | size | time_us | algbw | busbw | iters | "
          "time min..max over reps |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ours:
        print("| %s | %s | %s | %s | %s | %s | %s | %s..%s |" % (
            r.get("engine"), r.get("op"), size_name(r.get("size", 0)),
            fmt(r.get("time_us")), fmt(r.get("algbw_gbps")),
            fmt(r.get("busbw_gbps")), r.get("iters"),
            fmt(r.get("time_min_us")), fmt(r.get("time_max_us"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
