#!/usr/bin/env bash
# Times template variants against each other on the GPU machine, the way the PERFORMANCE.md sections compare them:
# each variant is a templates directory (read through RTATTN_TEMPLATE_DIR) with a cache of its own, its kernels
# precompiled on every core first (variants side by side), then `rtattn bench` in alternating processes, ROUNDS
# rounds, so the clock's drift falls on every variant alike. One line per process: with --vs-padded (the default
# arguments) each dim's ratio to the pad16 ideal, "131n:0.956 131c:0.928" (n non-causal, c causal); else the table.
#
# Usage, from the repository root (builds build-dev's CLI unless NO_BUILD=1):
#   VARIANTS="cur=templates new=.devbuild/tplX" DIMS=37,131 tools/bench/variants.sh [rtattn bench arguments]
# Environment: ROUNDS (2), DTYPE (bf16), HEADS (16; the precompile's head count, which picks TMA rows), OUT (files),
# BUILD_DIR (build-dev).
# Bench arguments default to --vs-padded --heads 16 --seqlens 16384 --reps 10 --dtype bf16; --head-dim is DIMS.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${VARIANTS:?name=templates_dir pairs, space-separated}" "${DIMS:?comma-separated head dims}"
out=${OUT:-device-out} build=${BUILD_DIR:-build-dev}
rounds=${ROUNDS:-2} dtype=${DTYPE:-bf16} heads=${HEADS:-16}
mkdir -p "$out"
if [ -z "${NO_BUILD:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1 &&
    cmake --build "$build" -j"$(nproc)" --target rtattn_cli >"$out/variants-build.log" 2>&1 ||
    { grep -E "error" "$out/variants-build.log" | head; exit 1; }
fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--vs-padded --heads "$heads" --seqlens 16384 --reps 10 --dtype "$dtype")
# The pad16 partner of each dim too (what --vs-padded times beside it).
pre=$(python3 -c "d=[int(x) for x in '$DIMS'.split(',')]; print(','.join(map(str, sorted(set(d + [(x + 15) // 16 * 16 for x in d])))))")
n=$(echo "$VARIANTS" | wc -w)
jobs=$(( $(nproc) / n > 0 ? $(nproc) / n : 1 ))
for pair in $VARIANTS; do
  name=${pair%%=*} dir=$(realpath -e "${pair#*=}") || { echo "variants: ${pair%%=*}: no directory ${pair#*=}"; exit 2; }
  RTATTN_TEMPLATE_DIR=$dir RTATTN_CACHE_DIR=$PWD/$build/variants-cache/$name "$build"/tools/rtattn precompile \
    --head-dim "$pre" --dtype "$dtype" --arch sm_90a --causal both --heads-q "$heads" -j "$jobs" \
    >"$out/variants-pre-$name.log" 2>&1 &
done
wait
for round in $(seq 1 "$rounds"); do
  for pair in $VARIANTS; do
    name=${pair%%=*} dir=$(realpath "${pair#*=}")
    f="$out/variants-$name-$round.txt"
    RTATTN_TEMPLATE_DIR=$dir RTATTN_CACHE_DIR=$PWD/$build/variants-cache/$name "$build"/tools/rtattn bench \
      "${args[@]}" --head-dim "$DIMS" >"$f" 2>&1
    if grep -q '^# d' "$f"; then
      echo "$name$round $(grep '^# d' "$f" | sed -E 's/# d([0-9]+) causal=(true|false).* = ([0-9.]+)x.*/\1\2:\3/' |
        sed 's/false/n/; s/true/c/' | tr '\n' ' ')"
    else
      echo "$name$round"; grep -E '^ *[0-9]' "$f" || tail -3 "$f"
    fi
  done
done
