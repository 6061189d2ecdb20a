#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# layer_check.sh NM OBJDIR [SRCDIR] - arrows point down only (DESIGN.md,
# "Layers"):
# no object of a layer's folder may use a symbol defined in the folder of a
# higher layer or of a sibling. OBJDIR holds the library's objects by
# folder (CMakeFiles/tp_objects.dir). Objects outside the listed folders
# (the build's generated protocol list, gen/) compose layers and are not
# checked. With SRCDIR (the source tree), the same rule holds for the
# #include "<folder>/..." lines of each folder's .c and .h files: a header
# of a higher layer or a sibling is an arrow pointing up even when no
# symbol follows it. Lists every offending reference and fails if there is
# one, or if a listed folder has no objects (the check would be blind).
set -euo pipefail

nm=${1:?usage: layer_check.sh NM OBJDIR}
dir=${2:?usage: layer_check.sh NM OBJDIR}
src=${3:-}

# folder:rank. A folder may use folders of a lower rank only; equal ranks
# are siblings (agent and collectives; channel and store).
layers=(core:0 transport:1 channel:2 store:2 pipe:3 collectives:4 agent:4
        rref:5 autograd:6 optim:7)

# Known upward references, each with the issue that removes it (none
# today: issue 13 gave the channel contract its own types).
known=()

declare -A rank_of def_in is_known
for k in "${known[@]}"; do
    is_known[$k]=1
done
for l in "${layers[@]}"; do
    rank_of[${l%%:*}]=${l##*:}
done

for l in "${layers[@]}"; do
    f=${l%%:*}
    [ -d "$dir/$f" ] || continue
    while read -r sym; do
        def_in[$sym]=$f
    done < <(find "$dir/$f" -name '*.o' -print0 |
        xargs -0 -r "$nm" --defined-only -g 2>/dev/null |
        awk 'NF == 3 && $2 ~ /[TDBRV]/ {print $3}')
done

bad=()
checked=0
for l in "${layers[@]}"; do
    f=${l%%:*}
    r=${rank_of[$f]}
    [ -d "$dir/$f" ] || continue
    while IFS= read -r obj; do
        checked=$((checked + 1))
        while read -r sym; do
            owner=${def_in[$sym]:-}
            [ -n "$owner" ] && [ "$owner" != "$f" ] || continue
            if [ "${rank_of[$owner]}" -ge "$r" ] &&
                [ -z "${is_known["${obj#"$dir"/} $sym"]:-}" ]; then
                bad+=("${obj#"$dir"/} uses $sym from $owner/")
            fi
        done < <("$nm" -u "$obj" | awk '{print $2}')
    done < <(find "$dir/$f" -name '*.o' | sort)
done

if [ -n "$src" ]; then
    for l in "${layers[@]}"; do
        f=${l%%:*}
        r=${rank_of[$f]}
        [ -d "$src/$f" ] || continue
        while IFS=: read -r file line inc; do
            owner=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\)\/.*/\1/p' <<<"$inc")
            [ -n "$owner" ] && [ "$owner" != "$f" ] || continue
            [ -n "${rank_of[$owner]:-}" ] || continue
            if [ "${rank_of[$owner]}" -ge "$r" ]; then
                bad+=("${file#"$src"/}:$line includes $(sed 's/^[^"]*//' <<<"$inc") from $owner/")
            fi
        done < <(find "$src/$f" \( -name '*.c' -o -name '*.h' \) \
            ! -name '*_test.c' -print0 | sort -z |
            xargs -0 -r grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"')
    done
fi

if [ "$checked" -eq 0 ]; then
    echo "layer_check: no objects under $dir" >&2
    exit 1
fi
if [ ${#bad[@]} -gt 0 ]; then
    echo "layer_check: ${#bad[@]} reference(s) point up or sideways:" >&2
    printf '  %s\n' "${bad[@]}" >&2
    echo "A lower layer offers a hook; the higher one installs it." >&2
    exit 1
fi
echo "layer_check: $checked objects, every reference points down"
