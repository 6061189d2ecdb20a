#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `tpipe run`: rank environment, "[rank] " prefixes on stdout and stderr
# (a last line without newline too), a failing rank's status stops the
# others within the grace, 128+signal, exec failure 127, bad -n 2.
set -eu
TPIPE=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; for f in "$out"/*; do echo "== $f"; cat "$f"; done; exit 1; }

# 1. Environment and prefixes.
"$TPIPE" run -n 3 -- sh -c 'echo "env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"; echo "err of $RANK" >&2; printf "tail $RANK"' \
    >"$out/o" 2>"$out/e" || fail "run -n 3 exited $?"
for r in 0 1 2; do
    grep -q "^\[$r\] env $r 3 $r 3 127\.0\.0\.1 [0-9][0-9]*\$" "$out/o" || fail "rank $r env line"
    grep -qx "\[$r\] tail $r" "$out/o" || fail "rank $r partial last line"
    grep -qx "\[$r\] err of $r" "$out/e" || fail "rank $r stderr line"
done
[ "$(grep -c ' env ' "$out/o")" = 3 ] || fail "expected 3 env lines"
[ "$(awk '/ env /{print $NF}' "$out/o" | sort -u | wc -l)" = 1 ] || fail "MASTER_PORT differs"
grep -q ' env ' "$out/e" && fail "stdout line on stderr"
# A fixed port and address are passed through.
"$TPIPE" run -n 1 --master-addr localhost --master-port 29500 sh -c 'echo "$MASTER_ADDR:$MASTER_PORT"' >"$out/o2" 2>&1 \
    || fail "fixed port"
grep -qx '\[0\] localhost:29500' "$out/o2" || fail "fixed port output"

# 1b. The job secret: one fresh 64-hex-digit TP_JOB_TOKEN shared by the
# ranks of a job, different for the next job; a user's own is kept;
# --no-job-token gives none. (Without libcrypto no secret is made.)
if "$TPIPE" --version | grep -q crypto; then
env -u TP_JOB_TOKEN -u TP_JOB_TOKEN_FILE "$TPIPE" run -n 2 -- sh -c 'echo "tok $TP_JOB_TOKEN"' >"$out/t1" 2>&1 || fail "token run 1"
env -u TP_JOB_TOKEN -u TP_JOB_TOKEN_FILE "$TPIPE" run -n 1 -- sh -c 'echo "tok $TP_JOB_TOKEN"' >"$out/t2" 2>&1 || fail "token run 2"
[ "$(grep -c '^\[[01]\] tok [0-9a-f]\{64\}$' "$out/t1")" = 2 ] || fail "token: not 64 hex digits in each rank"
[ "$(awk '{print $3}' "$out/t1" | sort -u | wc -l)" = 1 ] || fail "token: ranks differ"
[ "$(awk '{print $3}' "$out/t1" | sort -u)" != "$(awk '{print $3}' "$out/t2")" ] || fail "token: reused by the next job"
TP_JOB_TOKEN=users-own-secret-0123 "$TPIPE" run -n 1 -- sh -c 'echo "tok $TP_JOB_TOKEN"' >"$out/t3" 2>&1 || fail "token run 3"
grep -qx '\[0\] tok users-own-secret-0123' "$out/t3" || fail "token: the user's own was replaced"
TP_JOB_TOKEN=users-own-secret-0123 "$TPIPE" run -n 1 --no-job-token -- sh -c 'echo "tok [${TP_JOB_TOKEN-unset}]"' >"$out/t4" 2>&1 || fail "token run 4"
grep -qx '\[0\] tok \[unset\]' "$out/t4" || fail "token: --no-job-token"
fi

# 2. Rank 1 exits 3: the others (sleeping 30 s) are stopped within the grace.
start=$(date +%s)
st=0
"$TPIPE" run -n 3 --grace 1 sh -c '[ "$RANK" = 1 ] && exit 3; exec sleep 30' >"$out/f" 2>&1 || st=$?
elapsed=$(( $(date +%s) - start ))
[ "$st" = 3 ] || fail "failing rank: exit $st, want 3"
[ "$elapsed" -lt 10 ] || fail "failing rank: took ${elapsed}s"
# Even a rank ignoring SIGTERM is killed after the grace.
start=$(date +%s)
st=0
"$TPIPE" run -n 2 --grace 1 sh -c 'trap "" TERM; [ "$RANK" = 0 ] && exit 5; while :; do sleep 1; done' >"$out/f2" 2>&1 || st=$?
elapsed=$(( $(date +%s) - start ))
[ "$st" = 5 ] || fail "TERM-ignoring rank: exit $st, want 5"
[ "$elapsed" -lt 10 ] || fail "TERM-ignoring rank: took ${elapsed}s"

# 3. A rank killed by SIGKILL: 128 + 9.
st=0
"$TPIPE" run -n 2 --grace 1 sh -c '[ "$RANK" = 0 ] && kill -9 $$; exec sleep 30' >"$out/k" 2>&1 || st=$?
[ "$st" = 137 ] || fail "SIGKILLed rank: exit $st, want 137"
# Never silent: which rank, the signal's name, how many others are stopped.
grep -q '^tpipe: run: rank 0 was killed by signal 9 (SIGKILL: Killed); stopping the 1 other running rank(s)' "$out/k" \
    || fail "SIGKILLed rank: no failure summary"
grep -q '^tpipe: run: 1 rank(s) stopped: 1 by SIGTERM$' "$out/k" || fail "SIGKILLed rank: no stop summary"
# A rank that dies of a signal of its own while the others are stopped is
# named too.
st=0
# Rank 0 fails once rank 1's trap is set (it waits 10 s at most).
rdy="$out/ready"
RDY=$rdy "$TPIPE" run -n 2 --grace 5 sh -c 'if [ "$RANK" = 0 ]; then i=0; while [ ! -f "$RDY" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 2; fi; trap "kill -SEGV \$\$" TERM; : >"$RDY"; while :; do sleep 0.1; done' >"$out/k2" 2>&1 || st=$?
rm -f "$rdy"
[ "$st" = 2 ] || fail "SEGV while stopping: exit $st, want 2"
grep -q '^tpipe: run: rank 1 was killed by signal 11 (SIGSEGV' "$out/k2" || fail "SEGV while stopping: not reported"

# 4. A missing program: 127 and the message, through the prefixed stderr.
st=0
"$TPIPE" run -n 2 /nonexistent/tpipe-no-such-prog >"$out/m" 2>&1 || st=$?
[ "$st" = 127 ] || fail "missing program: exit $st, want 127"
# (The first rank to fail stops the other, which may not get to say it.)
grep -q '^\[[01]\] tpipe: run: cannot execute "/nonexistent/tpipe-no-such-prog": No such file or directory$' "$out/m" \
    || fail "missing program message"

# 5. Usage errors: 2.
for n in 0 1025 x -1; do
    st=0
    "$TPIPE" run -n "$n" true >"$out/u" 2>&1 || st=$?
    [ "$st" = 2 ] || fail "-n $n: exit $st, want 2"
done
st=0
"$TPIPE" run -n 2 >"$out/u" 2>&1 || st=$?
[ "$st" = 2 ] || fail "no program: exit $st, want 2"

# 6. --timeout: exit 124.
st=0
"$TPIPE" run -n 2 --grace 1 --timeout 0.5 sleep 30 >"$out/t" 2>&1 || st=$?
[ "$st" = 124 ] || fail "--timeout: exit $st, want 124"

# 7. SIGTERM to the launcher is forwarded: the ranks die of it (143).
"$TPIPE" run -n 2 --grace 1 sleep 30 >"$out/s" 2>&1 &
lpid=$!
sleep 0.3
kill -TERM "$lpid"
st=0
wait "$lpid" || st=$?
[ "$st" = 143 ] || fail "forwarded SIGTERM: exit $st, want 143"
echo "tpipe run ok"
