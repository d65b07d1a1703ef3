#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs two consumers against it: a CMake project using
# find_package(rtattn) (shared and static targets) and a plain compiler line using pkg-config.
# Usage: install_consumer.sh BUILD_DIR CMAKE_COMMAND
set -euo pipefail
build=$1
cmake=${2:-cmake}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$cmake" --install "$build" --prefix "$tmp/prefix" >/dev/null
test -f "$tmp/prefix/include/rtattn/rtattn.hpp"
test -f "$tmp/prefix/share/rtattn/manifests/default.json"

mkdir "$tmp/consumer"
cat >"$tmp/consumer/main.cpp" <<'CPP'
#include <rtattn/rtattn.hpp>
#include <cstdio>
int main() {
    rtattn::AttentionConfig c;
    c.head_dim_qk = 132;
    c.arch = "sm_80";
    rtattn::Runtime rt;
    const auto info = rt.precompile(c);  // a real NVRTC compile through the installed library
    std::printf("%s %s padded %d/%d\n", rtattn::version(), info.key.c_str(), info.plan.padded_qk, info.plan.padded_v);
    return info.key.size() == 64 && info.plan.padded_qk == 144 ? 0 : 1;
}
CPP
cat >"$tmp/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
find_package(rtattn 0.1 REQUIRED)
add_executable(use_shared main.cpp)
target_link_libraries(use_shared PRIVATE rtattn::rtattn)
add_executable(use_static main.cpp)
target_link_libraries(use_static PRIVATE rtattn::rtattn_static)
CMAKE
"$cmake" -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
"$cmake" --build "$tmp/consumer/build" -j2 >/dev/null
export RTATTN_CACHE_DIR="$tmp/cache"
"$tmp/consumer/build/use_shared"
"$tmp/consumer/build/use_static"

if command -v pkg-config >/dev/null; then
  libdir=$(dirname "$(find "$tmp/prefix" -name rtattn.pc | head -1)")
  flags=$(PKG_CONFIG_PATH=$libdir pkg-config --cflags --libs rtattn)
  # shellcheck disable=SC2086
  c++ "$tmp/consumer/main.cpp" $flags -o "$tmp/use_pc"
  LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/use_pc"
else
  echo "install_consumer: pkg-config not installed; skipped the pkg-config consumer"
fi
echo "install_consumer: ok"
