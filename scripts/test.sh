#!/usr/bin/env bash
# The test command: install dependencies, build, run every test with ctest. GPU tests skip visibly without a GPU.
# Usage: scripts/test.sh [build-dir] [extra ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
cd "$build"
ctest --output-on-failure "$@"
