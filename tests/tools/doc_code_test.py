#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every C code block in README.md and docs/*.md compiles (issue 15).

A ```c block is compiled against the public headers (strict C11, warnings
as errors) as a translation unit of its own, after the public header and
the usual libc headers; a block that is a list of statements is also tried
inside a function body (its undeclared names are then the reader's). A
block that cannot stand alone says so: the line just before its fence is
`<!-- fragment -->`. A block with main() must compile as a whole program.

usage: doc_code_test.py SOURCE_DIR INCLUDE_DIR GEN_INCLUDE_DIR CC
"""
import os
import re
import subprocess
import sys
import tempfile

PRELUDE = """#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tpipe/tpipe.h>
"""


def blocks(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```c":
            frag = i > 0 and lines[i - 1].strip() == "<!-- fragment -->"
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield start + 1, "\n".join(lines[start:j]), frag
            i = j
        i += 1


def compiles(cc, incs, src, tmp):
    f = os.path.join(tmp, "block.c")
    with open(f, "w") as fh:
        fh.write(src)
    cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused",
           "-Wno-unused-parameter", "-fsyntax-only"] + incs + [f]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def main():
    src_dir, inc, gen, cc = sys.argv[1:5]
    incs = ["-I" + inc, "-I" + gen]
    files = [os.path.join(src_dir, "README.md")] + sorted(
        os.path.join(src_dir, "docs", f)
        for f in os.listdir(os.path.join(src_dir, "docs"))
        if f.endswith(".md"))
    bad = 0
    n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            for line, code, frag in blocks(path):
                n += 1
                rel = os.path.relpath(path, src_dir)
                if frag:
                    continue
                ok, err = compiles(cc, incs, PRELUDE + code + "\n", tmp)
                if not ok and not re.search(r"\bmain\s*\(", code):
                    ok2, _ = compiles(cc, incs, PRELUDE +
                                      "void doc_block(void);\n"
                                      "void doc_block(void)\n{\n" + code +
                                      "\n}\n", tmp)
                    ok = ok2
                if not ok:
                    bad += 1
                    print(f"FAIL {rel}:{line}: does not compile (mark it "
                          f"<!-- fragment --> if it is one):\n{err}")
    print(f"{n} C blocks, {bad} failing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
