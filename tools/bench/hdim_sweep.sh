#!/usr/bin/env bash
# The head-dim sweep of docs/PERFORMANCE.md, one device command: build, the forward GPU suites (the shifted-row table
# also under compute-sanitizer memcheck), every head dim 32..256 step 4 off the 16 grid against pad16(d) (interleaved,
# H = 16, S = 16k, bf16), then the peers at the multiples of 8 when PEERS names a peers.py (the shared bench script;
# HEADS=16 where it reads H from the environment). ROWS=split|shift times one row-loading choice (RTATTN_ROWS).
# Usage on the GPU machine, from the repository root: tools/bench/hdim_sweep.sh [dims lo:hi:step]; files go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-device-out}
mkdir -p "$out"
range=${1:-32:256:4}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1 &&
  cmake --build build-dev -j"$(nproc)" --target rtattn_cli test_gpu test_gpu_varlen >"$out/build.log" 2>&1 ||
  { grep -E "error" "$out/build.log" | head; exit 1; }
export RTATTN_CACHE_DIR=$PWD/build-dev/cache
[ -n "${ROWS:-}" ] && export RTATTN_ROWS=$ROWS
if [ -z "${NO_TESTS:-}" ]; then
  build-dev/tests/test_gpu >"$out/test-gpu.txt" 2>&1; grep -E "^\[gpu\]|passed|failed" "$out/test-gpu.txt" | tail -12
  build-dev/tests/test_gpu_varlen 2>&1 | tail -3
  compute-sanitizer --tool memcheck --print-limit 20 build-dev/tests/test_gpu "head dims off the 16 grid*" 2>&1 | tail -3
fi
build-dev/tools/rtattn bench --vs-padded --head-dim-range "$range" --heads 16 --seqlens 16384 --reps "${REPS:-10}" \
  --json-out "$out/sweep.json" >"$out/sweep.txt" 2>&1
grep "^#" "$out/sweep.txt"
if [ -n "${PEERS:-}" ]; then
  dims=$(python3 -c "lo,hi,st=map(int,'$range'.split(':')); print(','.join(str(d) for d in range(lo,hi+1,st) if d%8==0 and d%16))")
  PYTHONUNBUFFERED=1 HEADS=16 WHAT=fwd HDIMS="$dims" SEQS=16384 OUT="$out" python3 "$PEERS" >"$out/peers.txt" 2>&1
  tail -4 "$out/peers.txt"
fi
