#!/usr/bin/env bash
# `pip install ./python` both ways the package can get librtattn, each into a fresh target directory, then used by an
# interpreter that is told nothing (no RTATTN_LIBRARY, no RTATTN_CLI): it must load the bundled library, run the
# bundled CLI through `python -m rtattn`, and find the bundled default manifest.
#   find:  RTATTN_PREFIX=<an install of this build>  (bundles it)
#   build: nothing set                                (setup.py builds librtattn with CMake, slow, so last: a
#                                                      portable wheel, checked for its tag and its libraries)
# Usage: python_package.sh BUILD_DIR CMAKE_COMMAND PYTHON
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=$2
python=$3
source_dir=$(cd "$(dirname "$0")/.." && pwd)
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "python_package: SKIPPED: $python has no pip (scripts/deps.sh installs python3-pip)" >&2
  exit 77
fi
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --prefix "$tmp/prefix" >/dev/null
# A copy of the package directory, so the build writes nothing into the source tree.
cp -r "$source_dir/python" "$tmp/pkg"
rm -rf "$tmp/pkg/build" "$tmp/pkg"/*.egg-info

check() {  # check TARGET_DIR
  local target=$1
  env -u RTATTN_LIBRARY -u RTATTN_CLI PYTHONPATH="$target" RTATTN_CACHE_DIR="$tmp/cache" "$python" - "$target" <<'PY'
import os, subprocess, sys
import rtattn
target = os.path.realpath(sys.argv[1])
lib = os.path.realpath(rtattn.info()["library"])
assert lib.startswith(target), f"loaded {lib}, not the bundled library under {target}"
info = rtattn.precompile(head_dim=132, arch="sm_80")
assert (info.padded_qk, info.padded_v) == (144, 136), info
r = subprocess.run([sys.executable, "-m", "rtattn", "--version"], capture_output=True, text=True)
assert r.returncode == 0 and rtattn.version() in r.stdout, r
# The bundled CLI finds the bundled default manifest (cache-only: lists what is missing, exit 1, no compiling).
r = subprocess.run([sys.executable, "-m", "rtattn", "precompile", "--cache-only"], capture_output=True, text=True)
assert r.returncode == 1 and "missing: d128" in r.stdout, (r.returncode, r.stdout[-500:], r.stderr[-500:])
print("python_package:", target, "ok")
PY
}

pip_install() {  # pip_install TARGET [ENV...]
  local target=$1
  shift
  env "$@" RTATTN_SOURCE_DIR="$source_dir" "$python" -m pip install --quiet --no-build-isolation --no-deps \
    --no-index --target "$target" "$tmp/pkg" 2>&1 | grep -v "^\s*$" || true
  test -d "$target/rtattn" || { echo "python_package: pip install into $target failed" >&2; exit 1; }
}

pip_install "$tmp/found" RTATTN_PREFIX="$tmp/prefix"
check "$tmp/found"
rm -rf "$tmp/pkg/build" "$tmp/pkg"/*.egg-info
# From source: a wheel that travels (py3-none-manylinux, the C++ runtime linked in, nothing NEEDED past the C runtime),
# installed from its file into an empty directory.
if ! RTATTN_SOURCE_DIR="$source_dir" "$python" -m pip wheel --quiet --no-build-isolation --no-deps --no-index \
  -w "$tmp/wheels" "$tmp/pkg" >"$tmp/wheel.log" 2>&1; then
  tail -30 "$tmp/wheel.log" >&2
  echo "python_package: pip wheel failed" >&2
  exit 1
fi
wheel=$(find "$tmp/wheels" -name 'rtattn-*.whl' | head -1)
case "$(basename "${wheel:-none}")" in
  rtattn-*-py3-none-manylinux_2_*_x86_64.whl | rtattn-*-py3-none-manylinux_2_*_aarch64.whl) ;;
  *) echo "python_package: the wheel is not py3-none-manylinux: ${wheel:-none built}" >&2; exit 1 ;;
esac
"$python" -m pip install --quiet --no-deps --no-index --target "$tmp/built" "$wheel"
for f in "$tmp"/built/rtattn/lib/librtattn.so "$tmp"/built/rtattn/bin/rtattn; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  for lib in $needed; do
    case "$lib" in
      libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | libgcc_s.so.1 | ld-linux-*) ;;
      *) echo "python_package: $(basename "$f") in the wheel needs $lib (needs: $needed)" >&2; exit 1 ;;
    esac
  done
done
echo "python_package: $(basename "$wheel") needs only the C runtime"
check "$tmp/built"
