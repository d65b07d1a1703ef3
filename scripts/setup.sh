#!/usr/bin/env bash
# The main job: install dependencies, build, precompile the default manifest into the cache, and run the GPU demo
# when a GPU is present. Usage: scripts/setup.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
scripts/deps.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)"
"$build"/tools/rtattn precompile
"$build"/tools/rtattn info
if [ -x "$build"/tests/readme_example ]; then
  set +e
  "$build"/tests/readme_example
  rc=$?
  set -e
  case $rc in
    0) ;;
    77) echo "setup: no GPU here, so the demo was skipped (the cache is precompiled)" ;;
    *) echo "setup: the GPU demo failed (exit $rc)" >&2; exit $rc ;;
  esac
fi
echo "setup: the rtattn CLI is $build/tools/rtattn (cmake --install $build puts it in <prefix>/bin)"
