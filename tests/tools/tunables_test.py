#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tunables_test.py - the tables of tunables, seen from outside the library.

usage: tunables_test.py info     SRC TOOL   `tpipe info --config` (text,
                                            --json, =COMPONENT, secrets,
                                            external variables, bad values)
       tunables_test.py declared SRC TOOL   every TP_* variable the sources
                                            read is declared in some table
       tunables_test.py docs     SRC TOOL   docs/configuration.md's table is
                                            the one the tables give
       tunables_test.py write-docs SRC TOOL regenerate that table

The listing comes from `tpipe info --config --json` run with no TP_*
variable in its environment, so defaults are the tables' own.
"""
import json
import os
import re
import subprocess
import sys

BEGIN = "<!-- tunables:begin (generated: tests/tools/tunables_test.py " \
        "write-docs) -->"
END = "<!-- tunables:end -->"
KEYS = ("component", "name", "env", "default", "value", "source",
        "accepted", "doc")
# Folders whose sources may read TP_* variables: the library, the tool,
# examples and benchmarks. tests/ sets and reads its own (TP_TEST_*,
# TP_CONF_TRANSPORT, ...), which are no tunables of the library.
SOURCE_DIRS = ("core", "transport", "channel", "pipe", "store", "agent",
               "collectives", "rref", "autograd", "optim", "tools",
               "examples", "bench", "include")


def fail(msg, out="", err=""):
    sys.stderr.write("tunables_test: FAIL: %s\n" % msg)
    if out:
        sys.stderr.write("--- stdout\n%s\n" % out)
    if err:
        sys.stderr.write("--- stderr\n%s\n" % err)
    sys.exit(1)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TP_")}
    env.update(extra)
    return env


def run(tool, args, **env):
    p = subprocess.run([tool] + args, env=clean_env(**env), timeout=60,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


def listing(tool, args=(), **env):
    rc, out, err = run(tool, ["info", "--config", "--json"] + list(args),
                       **env)
    try:
        o = json.loads(out)
    except ValueError as e:
        fail("info --config --json is not JSON (%s)" % e, out, err)
    return rc, o, err


def check_info(tool):
    rc, o, err = listing(tool)
    if rc != 0 or o.get("error") is not None:
        fail("info --config exits %d, error %r" % (rc, o.get("error")), "",
             err)
    items = o["config"]
    envs = set()
    for it in items:
        for k in KEYS:
            if not isinstance(it.get(k), str):
                fail("item lacks %s: %r" % (k, it))
        if it["env"] != "TP_" + it["name"].upper():
            fail("env is not TP_ + NAME: %r" % it)
        if it["env"] in envs:
            fail("%s listed twice" % it["env"])
        envs.add(it["env"])
        if it["source"] != "default" or not it["doc"] or \
                not it["accepted"] or not it["component"]:
            fail("incomplete item: %r" % it)
    comps = [it["component"] for it in items]
    for c in ("core", "auth", "transport", "tcp", "shm", "mpt", "cma",
              "pipe", "store", "agent", "collectives"):
        if c not in comps:
            fail("no component %s in %r" % (c, sorted(set(comps))))
    # A component's rows are listed together.
    seen = []
    for c in comps:
        if not seen or seen[-1] != c:
            if c in seen:
                fail("rows of %s are not together" % c)
            seen.append(c)
    for v in ("TP_INIT_METHOD", "TP_TRANSPORTS", "TP_CHANNELS", "TP_FAULT",
              "TP_RPC_MAX_MESSAGE_BYTES", "TP_STORE_MAX_CONNS",
              "TP_JOB_TOKEN", "TP_SHM_RING_SIZE", "TP_IO_BACKEND"):
        if v not in envs:
            fail("%s not listed" % v)

    # The text form: a header and one row per tunable.
    rc, out, err = run(tool, ["info", "--config"])
    lines = out.splitlines()
    if rc != 0 or not lines or lines[0].split()[:7] != [
            "COMPONENT", "VARIABLE", "VALUE", "SOURCE", "DEFAULT",
            "ACCEPTS", "DOC"]:
        fail("info --config text: bad header or exit %d" % rc, out, err)
    if len(lines) != len(items) + 1:
        fail("info --config text: %d rows for %d tunables" %
             (len(lines) - 1, len(items)), out, err)
    row = [ln for ln in lines if " TP_SHM_RING_SIZE " in ln]
    if len(row) != 1 or row[0].split()[:5] != [
            "shm", "TP_SHM_RING_SIZE", "512K", "default", "512K"]:
        fail("info --config text: shm_ring_size row %r" % row, out, err)

    # --config=COMPONENT keeps that component's rows only.
    rc, o, err = listing(tool, ["--config=tcp"])
    got = sorted(it["env"] for it in o["config"])
    if rc != 0 or got != ["TP_TCP_RCVBUF", "TP_TCP_SNDBUF",
                          "TP_TCP_USER_TIMEOUT_MS"]:
        fail("--config=tcp gives %r (exit %d)" % (got, rc), "", err)
    rc, out, err = run(tool, ["info", "--config=agent"])
    if rc != 0 or "TP_RPC_TIMEOUT_MS" not in out or "TP_SHM" in out:
        fail("--config=agent", out, err)
    rc, out, err = run(tool, ["info", "--config=nope"])
    if rc != 2 or "no such component" not in err or "tcp" not in err:
        fail("--config=nope: exit %d" % rc, out, err)

    # Variables read elsewhere show their raw value and source; the job
    # secret never shows.
    secret = "0123456789abcdef-do-not-print"
    rc, o, err = listing(tool, TP_INIT_METHOD="tcp://somehost:29500",
                         TP_JOB_TOKEN=secret, TP_TCP_SNDBUF="256K")
    by = {it["env"]: it for it in o["config"]}
    im = by["TP_INIT_METHOD"]
    if rc != 0 or im["value"] != "tcp://somehost:29500" or \
            im["source"] != "env" or im["component"] != "store":
        fail("TP_INIT_METHOD item %r (exit %d)" % (im, rc), "", err)
    if by["TP_TCP_SNDBUF"]["value"] != "256K" or \
            by["TP_TCP_SNDBUF"]["source"] != "env":
        fail("TP_TCP_SNDBUF item %r" % by["TP_TCP_SNDBUF"])
    for args in (["info", "--config"], ["info", "--config", "--json"]):
        rc, out, err = run(tool, args, TP_JOB_TOKEN=secret)
        if secret in out or secret in err or "not shown" not in out:
            fail("the job secret is shown by %r" % args, out, err)

    # A malformed value: listed as such, named on stderr, exit status 2.
    rc, o, err = listing(tool, TP_TCP_SNDBUF="lots")
    v = {it["env"]: it for it in o["config"]}["TP_TCP_SNDBUF"]["value"]
    if rc != 2 or "TP_TCP_SNDBUF=lots" not in err or "invalid" not in v or \
            "TP_TCP_SNDBUF=lots" not in (o.get("error") or ""):
        fail("TP_TCP_SNDBUF=lots: exit %d, value %r" % (rc, v), "", err)


def source_files(src):
    for d in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(src, d)):
            for f in files:
                if f.endswith((".c", ".h")):
                    yield os.path.join(root, f)


def status_names(src):
    with open(os.path.join(src, "include", "tpipe", "error.h")) as f:
        return set(re.findall(r"\b(TP_[A-Z0-9_]+)\s*=", f.read()))


def check_declared(src, tool):
    _, o, _ = listing(tool)
    declared = {it["env"] for it in o["config"]}
    built = {it["component"] for it in o["config"]}
    statuses = status_names(src)
    read = {}
    for path in source_files(src):
        with open(path, errors="replace") as f:
            text = f.read()
        rel = os.path.relpath(path, src)
        parts = rel.split(os.sep)
        if parts[0] in ("transport", "channel") and len(parts) > 2 and \
                parts[1] not in built:
            continue  # a backend this build does not have (ucx without UCX)
        # getenv("TP_X"), and every "TP_X" literal: tables that read the
        # environment through a row (agent/options.c, the store server)
        # name their variables as literals.
        for name in re.findall(r'getenv\(\s*"(TP_[A-Z0-9_]+)"', text) + \
                re.findall(r'"(TP_[A-Z0-9_]+)"', text):
            if name not in statuses:
                read.setdefault(name, rel)
    if "TP_INIT_METHOD" not in read or "TP_RPC_FAULTY" not in read:
        fail("the source scan found too little (%d names)" % len(read))
    missing = sorted(n for n in read if n not in declared)
    if missing:
        fail("read but declared in no table of tunables (add a row, "
             "TP_TUNABLE_EXTERN if the component reads it itself): " +
             ", ".join("%s (%s)" % (n, read[n]) for n in missing))
    print("tunables_test: %d variables read in the sources, all declared "
          "(%d declared)" % (len(read), len(declared)))


def md_cell(s):
    return (s or "-").replace("|", "\\|")


def docs_table(tool):
    _, o, _ = listing(tool)
    out = [BEGIN, "",
           "| variable | component | default | accepts | meaning |",
           "| --- | --- | --- | --- | --- |"]
    for it in o["config"]:
        out.append("| `%s` | %s | %s | %s | %s |" % (
            it["env"], it["component"],
            "`%s`" % it["default"] if it["default"] else "-",
            md_cell(it["accepted"]), md_cell(it["doc"])))
    out += ["", END]
    return "\n".join(out)


def doc_parts(src):
    path = os.path.join(src, "docs", "configuration.md")
    with open(path) as f:
        text = f.read()
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        fail("%s has no generated table between the markers" % path)
    return path, text[:a], text[a:b + len(END)], text[b + len(END):]


def row_component(line):
    cells = line.split(" | ")
    return cells[1] if line.startswith("| `TP_") and len(cells) > 2 else None


def check_docs(src, tool):
    path, _, table, _ = doc_parts(src)
    want = docs_table(tool)
    built = {row_component(ln) for ln in want.splitlines()}
    # Rows of a backend this build lacks (ucx without UCX) may stay.
    kept = "\n".join(ln for ln in table.splitlines()
                     if row_component(ln) in (None,) or
                     row_component(ln) in built)
    if kept != want:
        have = set(kept.splitlines())
        diff = [ln for ln in want.splitlines() if ln not in have]
        extra = [ln for ln in kept.splitlines()
                 if ln not in set(want.splitlines())]
        fail("%s is out of date with the tables; run `tests/tools/"
             "tunables_test.py write-docs SRC build/tools/tpipe`.\n"
             "missing: %s\nextra: %s" % (path, "\n".join(diff),
                                          "\n".join(extra)))
    print("tunables_test: docs/configuration.md matches the tables")


def write_docs(src, tool):
    path, head, _, tail = doc_parts(src)
    with open(path, "w") as f:
        f.write(head + docs_table(tool) + tail)
    print("tunables_test: wrote %s" % path)


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    mode, src, tool = argv[1:]
    {"info": lambda: check_info(tool),
     "declared": lambda: check_declared(src, tool),
     "docs": lambda: check_docs(src, tool),
     "write-docs": lambda: write_docs(src, tool)}[mode]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
