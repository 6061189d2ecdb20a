#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""compare_transport.py - side-by-side markdown of `tpipe bench transport`
and the peer baselines (../shared/peers/run_all.sh sock memcpy iperf3),
measured in the same session.

usage: compare_transport.py OURS.jsonl PEERS_RAW.txt [IDLE.jsonl]

OURS.jsonl: lines of `tpipe bench transport --json --reps R` (each already
the median over R repetitions). PEERS_RAW.txt: run_all.sh's raw.txt, lines
"rep=N TAG key=value ...". IDLE.jsonl: `tpipe bench transport --idle-cpu
--json`. Prints markdown tables on stdout; exit status 0 even when a
target is missed (this is a report, not a test).
"""
import statistics
import sys

from benchlib import read_json_lines, read_peer_lines


def load_ours(path):
    return read_json_lines(path)


def load_peers(path):
    """[(tag, {key: value})] of the peers' lines."""
    return read_peer_lines(path)


def peer_median(recs, tag, field, **match):
    vals = []
    for t, kv in recs:
        if t != tag or any(kv.get(k) != str(v) for k, v in match.items()):
            continue
        try:
            vals.append(float(kv[field]))
        except (KeyError, ValueError):
            pass
    return (statistics.median(vals), len(vals)) if vals else (None, 0)


def ours_get(rows, transport, backend, test, size, field):
    for r in rows:
        if (r.get("transport") == transport and r.get("backend") == backend
                and r.get("test") == test and r.get("size") == size):
            return r.get(field)
    return None


def fmt(v, unit=""):
    if v is None:
        return "-"
    if abs(v) >= 100:
        s = "%.0f" % v
    elif abs(v) >= 10:
        s = "%.1f" % v
    else:
        s = "%.2f" % v
    return s + unit


def main(argv):
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    ours = load_ours(argv[1])
    peers = load_peers(argv[2])
    idle = load_ours(argv[3]) if len(argv) > 3 else []
    backends = sorted({r["backend"] for r in ours if "backend" in r},
                      key=lambda b: (b != "epoll", b))
    MiB64 = 64 << 20

    sock_tcp, n_sock = peer_median(peers, "SOCK", "median_us", kind="tcp",
                                   size=64)
    sock_unix, _ = peer_median(peers, "SOCK", "median_us", kind="unix",
                               size=64)
    memcpy, n_mem = peer_median(peers, "MEMCPY", "median_GBps", MiB=256)
    iperf, n_iperf = peer_median(peers, "IPERF3", "GBps", streams=1)

    print("### Targets (issue 2): ours beside the peers, same session\n")
    print("| target | ours | backend | reference | bound | ratio | met |")
    print("|---|---|---|---|---|---|---|")

    def row(name, ours_v, be, ref_desc, bound, lower_is_better, unit):
        if ours_v is None or bound is None:
            ratio, met = "-", "n/a"
        else:
            ratio = "%.2f" % (ours_v / bound) if bound else "-"
            ok = ours_v <= bound if lower_is_better else ours_v >= bound
            met = "yes" if ok else "**no**"
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, fmt(ours_v, unit), be, ref_desc, fmt(bound, unit), ratio,
            met))

    for be in backends:
        v = ours_get(ours, "tcp", be, "pingpong", 64, "p50_us")
        row("tcp 64 B round trip <= raw socket + 10 %", v, be,
            "raw blocking tcp socket %s us (%d reps)" % (fmt(sock_tcp),
                                                         n_sock),
            sock_tcp * 1.1 if sock_tcp else None, True, " us")
    for be in backends:
        v = ours_get(ours, "shm", be, "pingpong", 64, "p50_us")
        row("shm 64 B round trip <= 2 us", v, be,
            "fixed (raw unix socket: %s us)" % fmt(sock_unix), 2.0, True,
            " us")
    for be in backends:
        v = ours_get(ours, "shm", be, "stream", MiB64, "gbps")
        row("shm 64 MiB stream >= 0.8 x memcpy", v, be,
            "memcpy 256 MiB %s GB/s (%d reps)" % (fmt(memcpy), n_mem),
            memcpy * 0.8 if memcpy else None, False, " GB/s")
    for be in backends:
        v = ours_get(ours, "tcp", be, "stream", MiB64, "gbps")
        row("tcp 64 MiB stream >= 0.9 x iperf3 -P1", v, be,
            "iperf3 -P1 %s GB/s (%d reps)" % (fmt(iperf), n_iperf),
            iperf * 0.9 if iperf else None, False, " GB/s")
    for r in idle:
        if r.get("test") != "idle":
            continue
        cpu = max(r.get("client_cpu_pct") or 0, r.get("server_cpu_pct") or 0)
        row("%s idle CPU ~0 %% (max of both processes)" % r["transport"], cpu,
            r["backend"], "%.1f s idle, a read pending on each side"
            % (r.get("seconds") or 0), 1.0, True, " %")

    print("\n### Round trip, us (p50 / p99), ours vs raw blocking sockets\n")
    sizes = sorted({r["size"] for r in ours if r.get("test") == "pingpong"})
    hdr = "| system | " + " | ".join(
        "%s" % human(s) for s in sizes) + " |"
    print(hdr)
    print("|---" * (len(sizes) + 1) + "|")
    for tr in ("shm", "tcp"):
        for be in backends:
            cells = []
            for s in sizes:
                p50 = ours_get(ours, tr, be, "pingpong", s, "p50_us")
                p99 = ours_get(ours, tr, be, "pingpong", s, "p99_us")
                cells.append("-" if p50 is None else "%s / %s" % (fmt(p50),
                                                                  fmt(p99)))
            if any(c != "-" for c in cells):
                print("| tpipe %s/%s | %s |" % (tr, be, " | ".join(cells)))
    for kind in ("tcp", "unix"):
        cells = []
        for s in sizes:
            v, _ = peer_median(peers, "SOCK", "median_us", kind=kind, size=s)
            cells.append(fmt(v))
        print("| raw %s socket (median) | %s |" % (kind, " | ".join(cells)))

    print("\n### Streaming, GB/s (1 GB = 1e9 B)\n")
    sizes = sorted({r["size"] for r in ours if r.get("test") == "stream"})
    print("| system | " + " | ".join(human(s) for s in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for tr in ("shm", "tcp"):
        for be in backends:
            cells = [fmt(ours_get(ours, tr, be, "stream", s, "gbps"))
                     for s in sizes]
            if any(c != "-" for c in cells):
                print("| tpipe %s/%s | %s |" % (tr, be, " | ".join(cells)))
    print("\nmemcpy 256 MiB: %s GB/s; iperf3 -P1: %s GB/s; -P2: %s GB/s" % (
        fmt(memcpy), fmt(iperf),
        fmt(peer_median(peers, "IPERF3", "GBps", streams=2)[0])))
    return 0


def human(n):
    for shift, suf in ((30, " GiB"), (20, " MiB"), (10, " KiB")):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, suf)
    return "%d B" % n


if __name__ == "__main__":
    sys.exit(main(sys.argv))
