#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The quickstart programs (docs/quickstart.md) under `tpipe run`: the
# output the page shows. Usage: quickstart_test.sh TPIPE HELLO_RPC ALLREDUCE
set -eu
TPIPE=$1 HELLO=$2 ALLRED=$3
out=$("$TPIPE" run -n 3 --timeout 60 -- "$HELLO" 2>&1) || { echo "$out"; echo "FAIL: hello_rpc"; exit 1; }
for i in 1 2; do
    echo "$out" | grep -qx "\[0\] hello from worker$i, worker0" ||
        { echo "$out"; echo "FAIL: no answer from worker$i"; exit 1; }
done
out=$("$TPIPE" run -n 4 --timeout 60 -- "$ALLRED" 2>&1) || { echo "$out"; echo "FAIL: allreduce"; exit 1; }
for r in 0 1 2 3; do
    echo "$out" | grep -qx "\[$r\] rank $r of 4: sum 6" ||
        { echo "$out"; echo "FAIL: rank $r line"; exit 1; }
done
echo "quickstart: ok"
