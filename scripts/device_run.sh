#!/usr/bin/env bash
# One device command: build, run every test (GPU ones included), time our kernel and the peers side by side.
# Usage on the GPU machine: scripts/device_run.sh [tests|bench|all]; logs and JSON go to $OUT (or ./device-out).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-device-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-dev -j16 -- -k >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -30; exit 1; }
rm -f "$out/cmake.log" "$out/build.log"  # kept only on failure: the device tool brings back few files
export RTATTN_CACHE_DIR=$PWD/build-dev/cache
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  (cd build-dev && ctest --output-on-failure -j2 >"$out/ctest.log" 2>&1) || rc=1
  tail -25 "$out/ctest.log"
  grep -iE "cases|worst|skipped" build-dev/Testing/Temporary/LastTest.log | head -30
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  build-dev/tools/rtattn bench --seqlens ${SEQS:-4096,16384} --json-out "$out/ours.json" 2>&1 | tee "$out/ours.txt"
  build-dev/tools/rtattn bench --latency --head-dim 128,132 --json-out "$out/latency.json" 2>&1 | tee -a "$out/ours.txt"
  if [ -f .devbuild/peers.py ]; then
    PYTHONUNBUFFERED=1 FLEX=0 SEQS=${SEQS:-4096,16384} OUT="$out" python3 .devbuild/peers.py 2>&1 | tee "$out/peers.txt"
    python3 tools/bench/compare.py "$out/ours.json" "$out/peers.json" | tee "$out/compare.md"
  fi
fi
exit $rc
