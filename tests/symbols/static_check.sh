#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# static_check.sh NM ARCHIVE [PENDING...] - every global symbol the static
# library ARCHIVE defines is in the tp_ namespace: public tp_ or internal
# tp__ (STYLE.md §2). The version script and -fvisibility=hidden keep
# internals out of libtpipe.so, but libtpipe.a has neither: there each
# non-static function is a global symbol that an application linking it
# may collide with. Lists the offenders with their object file and fails if
# there are any, or if the archive defines no tp_ symbol at all (which
# means the check itself is broken).
#
# Each PENDING is a name prefix whose leaks are known and waiting to be
# renamed (tests/symbols/CMakeLists.txt says which folder): they are listed
# but do not fail the check; a prefix that no longer leaks fails it, so
# that the list only ever shrinks.
set -euo pipefail

nm=${1:?usage: static_check.sh NM ARCHIVE [PENDING...]}
lib=${2:?usage: static_check.sh NM ARCHIVE [PENDING...]}
shift 2
pending=("$@")

# With -A each line is "ARCHIVE:MEMBER:VALUE TYPE NAME".
syms=$(LC_ALL=C "$nm" -A -g --defined-only "$lib") || {
    echo "static_check: $nm -A -g --defined-only $lib failed" >&2
    exit 1
}

bad=()
known=()
count=0
declare -A hit
while read -r loc type name; do
    [ -n "${name:-}" ] || continue
    case "$name" in
    tp_*)
        count=$((count + 1))
        continue
        ;;
    # Emitted by the toolchain (and the sanitizers' instrumentation), not
    # by our sources.
    __x86.get_pc_thunk.* | DW.ref.__gcc_personality_v0) continue ;;
    __odr_asan.* | __asan_* | __ubsan_* | __tsan_* | __sanitizer_*) continue ;;
    esac
    obj=${loc%:*}
    obj=${obj##*:}
    for p in "${pending[@]}"; do
        if [[ $name == "$p"* ]]; then
            known+=("$name ($type, $obj)")
            hit[$p]=1
            continue 2
        fi
    done
    bad+=("$name ($type, $obj): not in the tp_ namespace")
done <<<"$syms"

for p in "${pending[@]}"; do
    [ -n "${hit[$p]:-}" ] ||
        bad+=("$p*: listed as pending but no longer leaks; drop it from tests/symbols/CMakeLists.txt")
done

if [ ${#known[@]} -gt 0 ]; then
    echo "static_check: ${#known[@]} known leak(s), still to rename:"
    printf '  %s\n' "${known[@]}"
fi
if [ ${#bad[@]} -gt 0 ]; then
    echo "static_check: $lib defines ${#bad[@]} global symbol(s) it must not:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "Make it static if one file uses it, else name it tp__<module>_*." >&2
    exit 1
fi
if [ "$count" -eq 0 ]; then
    echo "static_check: $lib defines no tp_ symbols at all" >&2
    exit 1
fi
echo "static_check: $count global symbols, all in the tp_ namespace"
