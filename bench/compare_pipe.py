#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compare_pipe.py - side-by-side markdown of `tpipe bench pipe` and
TensorPipe's tp_bench (../shared/peers/run_all.sh tp), same session.

usage: compare_pipe.py OURS.jsonl PEERS_RAW.txt

OURS.jsonl: lines of `tpipe bench pipe --json --reps R` (each already the
median over R repetitions). PEERS_RAW.txt: run_all.sh's raw.txt, lines
"rep=N TP transport=uv channel=basic mode=proc test=pingpong size=64
median_us=.." and "... test=stream ... GBps=..". Matching: our tcp is
TensorPipe's uv, shm is shm; same channel; same mode (proc = two
processes, thread = one process, as xth needs). Prints, per test, one row
per matching combination and size: our median, TensorPipe's median over
its reps, and ours/TP. Exit status 0 even when we are slower (a report,
not a test).
"""
import statistics
import sys

from benchlib import fmt, read_json_lines, read_peer_lines

TR_MAP = {"tcp": "uv", "shm": "shm"}


def load_ours(path):
    return read_json_lines(path, bench="pipe")


def load_tp(path):
    """[(kv dict)] of the TP lines."""
    return [kv for tag, kv in read_peer_lines(path) if tag == "TP"]


def tp_median(recs, transport, channel, mode, test, size, field):
    vals = []
    for kv in recs:
        if (kv.get("transport"), kv.get("channel"), kv.get("mode"),
                kv.get("test"), kv.get("size")) != (transport, channel, mode,
                                                    test, str(size)):
            continue
        try:
            vals.append(float(kv[field]))
        except (KeyError, ValueError):
            pass
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def size_str(n):
    for shift, suf in ((30, "G"), (20, "M"), (10, "K")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, suf)
    return str(n)


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    ours = load_ours(argv[1])
    tp = load_tp(argv[2])
    if not ours:
        print("(no tpipe bench pipe results)")
    tests = (("pingpong", "p50_us", "median_us",
              "Round trip, us (p50; lower is better)", True),
             ("stream", "gbps", "GBps",
              "Streaming one way, GB/s (higher is better)", False))
    summary = []
    for test, ofield, tfield, title, lower in tests:
        rows = [r for r in ours if r.get("test") == test]
        if not rows:
            continue
        print("### %s\n" % title)
        print("| tpipe | TensorPipe | size | tpipe | TensorPipe (reps) "
              "| tpipe/TP | better |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            tr = TR_MAP.get(r.get("transport"), r.get("transport"))
            ch, mode = r.get("channel"), r.get("mode", "proc")
            ours_v = r.get(ofield)
            tp_v, n = tp_median(tp, tr, ch, mode, test, r.get("size"),
                                tfield)
            ratio = ours_v / tp_v if ours_v is not None and tp_v else None
            if ratio is None:
                better = "n/a"
            else:
                win = ratio < 1 if lower else ratio > 1
                better = "tpipe" if win else "**TP**"
                summary.append((test, win))
            name = "%s+%s%s" % (r.get("transport"), ch,
                                " (1 proc)" if mode == "thread" else "")
            tpname = "%s+%s%s" % (tr, ch, " (1 proc)" if mode == "thread"
                                  else "")
            print("| %s | %s | %s | %s | %s | %s | %s |" % (
                name, tpname, size_str(r.get("size", 0)), fmt(ours_v),
                "%s (%d)" % (fmt(tp_v), n) if tp_v is not None else "-",
                "%.2f" % ratio if ratio is not None else "-", better))
        print()
    if summary:
        for test in ("pingpong", "stream"):
            s = [w for t, w in summary if t == test]
            if s:
                print("%s: tpipe better in %d of %d matched rows." % (
                    test, sum(s), len(s)))
    elif ours:
        print("(no matching TensorPipe rows: run `bash ../shared/peers/"
              "run_all.sh tp` in the same session)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
