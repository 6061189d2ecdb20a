#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# symbol_check.sh NM LIB - every symbol LIB exports is public API: its name
# starts with tp_ and not with tp__ (STYLE.md §2). Ignored: the version node
# (TPIPE_0, an absolute symbol) and the linker's own _init, _fini,
# __bss_start, _edata, _end. Lists the offenders and fails if there are any,
# or if nothing is exported at all (which means the check itself is broken
# or the version script hides everything), or if a symbol of REQUIRED (the
# public API of headers whose exports are easy to lose: introspection) is
# missing.
set -euo pipefail

nm=${1:?usage: symbol_check.sh NM LIB}
lib=${2:?usage: symbol_check.sh NM LIB}
required=(tp_info_transports tp_info_channels tp_info_io_backends
    tp_version_string tp_config_visit)

# Lines are "VALUE TYPE NAME[@@VERSION]"; newer binutils append the version.
syms=$(LC_ALL=C "$nm" -D --defined-only "$lib") || {
    echo "symbol_check: $nm -D --defined-only $lib failed" >&2
    exit 1
}

bad=()
count=0
declare -A seen
while read -r _ type name; do
    [ -n "${name:-}" ] || continue
    name=${name%%@*}
    case "$type" in
    A) continue ;; # version nodes such as TPIPE_0
    esac
    case "$name" in
    _init | _fini | __bss_start | _edata | _end) continue ;;
    tp__*) bad+=("$name ($type): internal tp__ name exported") ;;
    tp_*)
        count=$((count + 1))
        seen[$name]=1
        ;;
    *) bad+=("$name ($type): not in the tp_ namespace") ;;
    esac
done <<<"$syms"

for name in "${required[@]}"; do
    [ -n "${seen[$name]:-}" ] || bad+=("$name: public API, not exported")
done

if [ ${#bad[@]} -gt 0 ]; then
    echo "symbol_check: $lib exports ${#bad[@]} symbol(s) it must not:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "Public API: name it tp_<object>_<verb> and mark it TP_API." >&2
    echo "Internal: make it static or name it tp__*; cmake/libtpipe.map" >&2
    echo "and -fvisibility=hidden keep those out of the dynamic table." >&2
    exit 1
fi
if [ "$count" -eq 0 ]; then
    echo "symbol_check: $lib exports no tp_ symbols at all" >&2
    exit 1
fi
echo "symbol_check: $count exported symbols, all tp_ public names"
