#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_tool.py - run the tpipe command and check its exit status and output.

usage: check_tool.py [--exit N] [--stderr-has S]... [--stdout-has S]...
                     [--stderr-re RE]... [--stdout-re RE]... [--json-object] [--bench-json TRANSPORT] [--min-lines N]
                     [--timeout S] -- COMMAND...

--stderr-re RE      stderr matches the Python regular expression RE (search)
--json-object       stdout is exactly one JSON object
--bench-json TR     every stdout line is a JSON object of the bench transport
                    schema, for transport TR (required keys, types, sanity)
"""
import json
import re
import math
import subprocess
import sys

BENCH_KEYS = ("bench", "transport", "backend", "test", "size",
              "p50_us", "p90_us", "p99_us", "gbps")


def fail(msg, out="", err=""):
    sys.stderr.write("check_tool: FAIL: %s\n" % msg)
    if out:
        sys.stderr.write("--- stdout\n%s\n" % out)
    if err:
        sys.stderr.write("--- stderr\n%s\n" % err)
    sys.exit(1)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and \
        math.isfinite(v)


def check_bench_line(line, transport):
    try:
        o = json.loads(line)
    except ValueError as e:
        return "not JSON (%s): %r" % (e, line)
    if not isinstance(o, dict):
        return "not an object: %r" % line
    if o.get("test") == "idle":
        for k in ("bench", "transport", "backend", "seconds",
                  "client_cpu_pct", "server_cpu_pct"):
            if k not in o:
                return "idle line misses key %s: %r" % (k, line)
        return None
    for k in BENCH_KEYS:
        if k not in o:
            return "missing key %s: %r" % (k, line)
    if o["bench"] != "transport":
        return "bench is not \"transport\": %r" % line
    if transport and o["transport"] != transport:
        return "transport is not %s: %r" % (transport, line)
    if o["backend"] not in ("epoll", "uring"):
        return "unknown backend: %r" % line
    if not isinstance(o["size"], int) or o["size"] <= 0:
        return "bad size: %r" % line
    if o["test"] == "pingpong":
        for k in ("p50_us", "p90_us", "p99_us"):
            if not is_num(o[k]) or o[k] <= 0:
                return "pingpong %s is not a positive number: %r" % (k, line)
        if not (o["p50_us"] <= o["p90_us"] <= o["p99_us"]):
            return "percentiles out of order: %r" % line
        if o["gbps"] is not None:
            return "pingpong gbps should be null: %r" % line
    elif o["test"] == "stream":
        if not is_num(o["gbps"]) or o["gbps"] <= 0:
            return "stream gbps is not a positive number: %r" % line
        for k in ("p50_us", "p90_us", "p99_us"):
            if o[k] is not None:
                return "stream %s should be null: %r" % (k, line)
    else:
        return "unknown test: %r" % line
    return None


def main(argv):
    if "--" not in argv:
        fail("no command (use -- COMMAND...)")
    sep = argv.index("--")
    opts, cmd = argv[1:sep], argv[sep + 1:]
    want_exit, timeout, min_lines = 0, 300, 1
    stderr_has, stdout_has = [], []
    stderr_re, stdout_re = [], []  # Python regular expressions (re.search)
    json_object, bench_tr = False, None
    i = 0
    while i < len(opts):
        o = opts[i]
        if o == "--exit":
            want_exit = int(opts[i + 1]); i += 1
        elif o == "--stderr-has":
            stderr_has.append(opts[i + 1]); i += 1
        elif o == "--stdout-has":
            stdout_has.append(opts[i + 1]); i += 1
        elif o == "--stdout-re":
            stdout_re.append(opts[i + 1]); i += 1
        elif o == "--stderr-re":
            stderr_re.append(opts[i + 1]); i += 1
        elif o == "--json-object":
            json_object = True
        elif o == "--bench-json":
            bench_tr = opts[i + 1]; i += 1
        elif o == "--min-lines":
            min_lines = int(opts[i + 1]); i += 1
        elif o == "--timeout":
            timeout = float(opts[i + 1]); i += 1
        else:
            fail("unknown option %s" % o)
        i += 1
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:
        fail("timed out after %s s: %s" % (timeout, " ".join(cmd)),
             (e.stdout or b"").decode(errors="replace"),
             (e.stderr or b"").decode(errors="replace"))
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    if p.returncode != want_exit:
        fail("exit status %d, expected %d: %s" % (p.returncode, want_exit,
                                                   " ".join(cmd)), out, err)
    for s in stderr_has:
        if s not in err:
            fail("stderr does not contain %r" % s, out, err)
    for s in stdout_has:
        if s not in out:
            fail("stdout does not contain %r" % s, out, err)
    for r in stderr_re:
        if re.search(r, err) is None:
            fail("stderr does not match %r" % r, out, err)
    for r in stdout_re:
        if re.search(r, out) is None:
            fail("stdout does not match %r" % r, out, err)
    if json_object:
        try:
            o = json.loads(out)
        except ValueError as e:
            fail("stdout is not one JSON object: %s" % e, out, err)
        if not isinstance(o, dict):
            fail("stdout is JSON but not an object", out, err)
    if bench_tr is not None:
        lines = [l for l in out.splitlines() if l.strip()]
        if len(lines) < min_lines:
            fail("%d lines, expected at least %d" % (len(lines), min_lines),
                 out, err)
        for l in lines:
            why = check_bench_line(l, bench_tr if bench_tr != "any" else None)
            if why:
                fail(why, out, err)
    sys.stdout.write(out)
    sys.stderr.write(err)
    print("check_tool: ok")


if __name__ == "__main__":
    main(sys.argv)
