# SPDX-License-Identifier: Apache-2.0
"""Readers shared by bench/compare_*.py."""
import json


def read_json_lines(path, bench=None):
    """The JSON objects of @path, one per line (others skipped); only those
    with "bench" == @bench when given. A missing file reads as empty."""
    rows = []
    try:
        f = open(path)
    except OSError:
        return rows
    with f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if bench is None or o.get("bench") == bench:
                rows.append(o)
    return rows


def read_peer_lines(path):
    """[(tag, {key: value})] of the "rep=N TAG key=value ..." lines that
    ../shared/peers/run_all.sh prints. A missing file reads as empty."""
    recs = []
    try:
        f = open(path)
    except OSError:
        return recs
    with f:
        for line in f:
            parts = line.split()
            if len(parts) < 2 or not parts[0].startswith("rep="):
                continue
            kv = dict(p.split("=", 1) for p in parts[2:] if "=" in p)
            recs.append((parts[1], kv))
    return recs


def fmt(v):
    """A number for a report cell: '-' for None, thousands spaced, about 3
    significant digits."""
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return "{:,.0f}".format(v).replace(",", " ")
    if abs(v) >= 100:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    if abs(v) >= 0.1 or v == 0:
        return "%.2f" % v
    return "%.2g" % v
