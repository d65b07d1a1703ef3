#!/usr/bin/env bash
# A/B of two builds on a GPU machine: builds the rtattn CLI of another source tree (e.g. the commit before a
# refactor), then alternates `rtattn bench --interleave` runs of the old and the new build, so clock drift falls on
# both alike; tools/bench/ab_compare.py prints new/old per shape. The new build must already be in build-dev.
# Usage: scripts/device_ab.sh OLD_SOURCE_DIR [rounds]; HDIMS, SEQS, REPS shape the grid; results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
old_src=$1
rounds=${2:-3}
out=${OUT:-device-out}
mkdir -p "$out"
cmake -S "$old_src" -B "$old_src/build" -DCMAKE_BUILD_TYPE=Release -DRTATTN_BUILD_TESTS=OFF >/dev/null 2>&1 &&
  cmake --build "$old_src/build" -j16 --target rtattn_cli >"$out/old-build.log" 2>&1 ||
  { tail -20 "$out/old-build.log"; exit 1; }
old=$old_src/build/tools/rtattn
new=build-dev/tools/rtattn
grid=(--interleave --seqlens "${SEQS:-16384}" --reps "${REPS:-20}")
dims=${HDIMS:-64,100,128,132,256}
# The old CLI may predate --head-dim/--json-out: ask its help which spelling it takes.
flags_for() {
  if "$1" bench --help 2>&1 | grep -q -- "--json-out"; then echo "--head-dim $dims --json-out"; else echo "--head-dims $dims --json"; fi
}
for r in $(seq "$rounds"); do
  for b in old new; do
    bin=${!b}
    # shellcheck disable=SC2046
    RTATTN_CACHE_DIR=$PWD/build-dev/ab-cache-$b "$bin" bench "${grid[@]}" $(flags_for "$bin") "$out/ab-$b-$r.json" \
      >"$out/ab-$b-$r.txt" 2>&1 || { echo "$b round $r failed"; tail -5 "$out/ab-$b-$r.txt"; }
  done
done
python3 tools/bench/ab_compare.py "$out"/ab-old-*.json -- "$out"/ab-new-*.json | tee "$out/ab.md"
