#!/usr/bin/env bash
# Times variants against each other on the GPU machine, the way the PERFORMANCE.md sections compare them: each
# variant is a templates directory (read through RTATTN_TEMPLATE_DIR) and optionally plan settings from the
# environment (RTATTN_TILE, RTATTN_ROWS, ...), with a cache of its own; its kernels are precompiled on every core first
# (variants side by side), then `rtattn bench` runs in alternating processes, ROUNDS rounds, so the clock's drift falls
# on every variant alike. One line per process: with --vs-padded (the default arguments) each dim's ratio to the pad16
# ideal, "131n:0.956 131c:0.928" (n non-causal, c causal); else the table's rows.
#
# Usage, from the repository root (builds build-dev's CLI unless NO_BUILD=1):
#   VARIANTS="cur=templates new=.devbuild/tplX" DIMS=37,131 tools/bench/variants.sh [rtattn bench arguments]
#   VARIANTS="table=templates k96=templates:RTATTN_TILE=128,96,8,1,2,0,2" DIMS=146,160 \
#     tools/bench/variants.sh --heads 16 --seqlens 16384 --reps 10 --dtype bf16 --alibi on
# A variant is name=dir[:VAR=value]...: the settings apply to its precompile and its bench alike. A tile override
# applies to the pad16 kernels --vs-padded times beside each dim too, so compare such variants by their rows' TFLOPS
# (bench arguments without --vs-padded), not by the ratios.
# Environment: ROUNDS (2), DTYPE (bf16), HEADS (16; the precompile's head count, which picks TMA rows), OUT (files),
# BUILD_DIR (build-dev), PRECOMPILE (extra `rtattn precompile` flags, e.g. "--alibi"; --causal both is given).
# Bench arguments default to --vs-padded --heads 16 --seqlens 16384 --reps 10 --dtype bf16; --head-dim is DIMS.
# Files under OUT: variants.txt (the lines printed), variants-logs.tgz (each process's output), variants-build.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
: "${VARIANTS:?name=templates_dir[:VAR=value]... pairs, space-separated}" "${DIMS:?comma-separated head dims}"
out=${OUT:-device-out} build=${BUILD_DIR:-build-dev}
rounds=${ROUNDS:-2} dtype=${DTYPE:-bf16} heads=${HEADS:-16}
mkdir -p "$out"
if [ -z "${NO_BUILD:-}" ]; then
  if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$out/variants-build.log" 2>&1 &&
    cmake --build "$build" -j"$(nproc)" --target rtattn_cli >>"$out/variants-build.log" 2>&1; }; then
    grep -E "error" "$out/variants-build.log" | head
    exit 1
  fi
fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--vs-padded --heads "$heads" --seqlens 16384 --reps 10 --dtype "$dtype")
# The pad16 partner of each dim too (what --vs-padded times beside it).
pre=$(python3 -c "d = [int(x) for x in '$DIMS'.split(',')]
print(','.join(map(str, sorted(set(d + [(x + 15) // 16 * 16 for x in d])))))")
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

declare -A dirs settings
names=()
for pair in $VARIANTS; do
  name=${pair%%=*} rest=${pair#*=}
  dir=$(realpath -e "${rest%%:*}") || { echo "variants: $name: no directory ${rest%%:*}"; exit 2; }
  dirs[$name]=$dir settings[$name]=$([ "$rest" != "${rest#*:}" ] && echo "${rest#*:}" | tr ':' ' ')
  names+=("$name")
done
# run NAME COMMAND...: COMMAND with the variant's templates directory, cache and settings in its environment.
run() {
  local name=$1
  shift
  # shellcheck disable=SC2086  # the settings are VAR=value words
  env ${settings[$name]} RTATTN_TEMPLATE_DIR="${dirs[$name]}" RTATTN_CACHE_DIR="$PWD/$build/variants-cache/$name" "$@"
}

jobs=$(( $(nproc) / ${#names[@]} > 0 ? $(nproc) / ${#names[@]} : 1 ))
for name in "${names[@]}"; do
  # shellcheck disable=SC2086  # PRECOMPILE holds flags
  run "$name" "$build"/tools/rtattn precompile --head-dim "$pre" --dtype "$dtype" --arch sm_90a --causal both \
    --heads-q "$heads" -j "$jobs" ${PRECOMPILE:-} >"$logs/pre-$name.log" 2>&1 &
done
wait
for round in $(seq 1 "$rounds"); do
  for name in "${names[@]}"; do
    f="$logs/$name-$round.txt"
    run "$name" "$build"/tools/rtattn bench "${args[@]}" --head-dim "$DIMS" >"$f" 2>&1
    if grep -q '^# d' "$f"; then
      echo "$name$round $(grep '^# d' "$f" | sed -E 's/# d([0-9]+) causal=(true|false).* = ([0-9.]+)x.*/\1\2:\3/' |
        sed 's/false/n/; s/true/c/' | tr '\n' ' ')"
    else
      grep -E '^ *[0-9]' "$f" | sed -E "s/^/$name$round /; s/  (wgmma|mma).*//" || tail -3 "$f"
    fi
  done
done | tee "$out/variants.txt"
tar czf "$out/variants-logs.tgz" -C "$logs" .
