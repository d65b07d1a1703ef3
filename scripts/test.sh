#!/usr/bin/env bash
# The test command: install dependencies, build, run the tests with ctest. GPU tests skip visibly without a GPU.
# Usage: scripts/test.sh [--full] [build-dir] [extra ctest args...]
#   default  every kind of test (C++, C, Python, CLI, install) and a sample of the compile sweep: about 5 minutes on
#            2 cores once built (setup.sh builds the same directory)
#   --full   the whole compile sweep too (every head dim 1..256 on every arch, in eight ranges: about 40 minutes more
#            on 2 cores); CI runs this one
set -euo pipefail
cd "$(dirname "$0")/.."
full=0
if [ "${1:-}" = --full ]; then
  full=1
  shift
fi
build=${1:-build}
shift || true
scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
# ctest prints each test as it ends. The quick set runs side by side, one test per core; the full one in turn, since
# each sweep range already compiles on every core (side by side on 2 cores: 3918 s, against 2839 s in turn).
# The full set leaves out the sweep's sample: its head dims are among the ranges' (about 3 minutes of CI on 2 cores).
if [ "$full" = 1 ]; then
  ctest --output-on-failure -E '^test_compile_sweep_sample$' "$@"
else
  ctest --output-on-failure -j"$(nproc)" -LE full "$@"
  echo "test.sh: the quick set passed; scripts/test.sh --full adds the whole compile sweep (label full)"
fi
