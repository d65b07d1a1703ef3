#!/usr/bin/env bash
# Installs the build into a temporary prefix and uses it the ways a new user would:
# - CMake, find_package(rtattn): the README's C++ example built as C++17 with the old libstdc++ string ABI
#   (-D_GLIBCXX_USE_CXX11_ABI=0, as PyTorch's wheels through 2.6), the README's C example as C99, and the static
#   library through the `static` component; the shared target alone must not look for fmt, OpenSSL or CUDA;
# - pkg-config: the C example, the C++17 old-ABI example, and a static link (pkg-config --static);
# - the shared library exports exactly the functions rtattn.h declares;
# - the installed tree moved elsewhere: the CLI still finds its default manifest, pkg-config its prefix;
# - librtattn as a subproject (add_subdirectory) adds no tests to the parent.
# The examples run their no-GPU part everywhere and their GPU part where there is one (exit 77: no GPU).
# Usage: install_consumer.sh BUILD_DIR CMAKE_COMMAND README_EXAMPLE_CPP README_EXAMPLE_C CUDA_INCLUDE_DIR CUDA_LIB_DIR
# (the CUDA dirs are for the C++ example's own cudart calls in the pkg-config build)
set -euo pipefail
build=$(cd "$1" && pwd)
cmake=${2:-cmake}
example_cpp=$3
example_c=$4
cuda_inc=$5
cuda_lib=$6
source_dir=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
for f in include/rtattn/rtattn.h include/rtattn/rtattn.hpp bin/rtattn share/rtattn/manifests/default.json; do
  test -e "$prefix/$f" || { echo "install_consumer: $f not installed" >&2; exit 1; }
done
libdir=$(dirname "$(find "$prefix" -name 'librtattn.so' | head -1)")
export RTATTN_CACHE_DIR="$tmp/cache"

# Runs an example; exit 77 (no GPU for its GPU part) counts as success.
run() {
  local rc=0
  "$@" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then echo "install_consumer: $* exited $rc" >&2; exit 1; fi
}

# --- exports: exactly what rtattn.h declares ---
declared=$(grep -E '^RTATTN_API ' "$prefix/include/rtattn/rtattn.h" | grep -oE 'rtattn_[a-z0-9_]+\(' | tr -d '(' | sort)
exported=$(nm -D --defined-only "$libdir/librtattn.so" | awk '{print $3}' | sort)
if [ "$declared" != "$exported" ]; then
  echo "install_consumer: librtattn.so exports differ from rtattn.h's declarations:" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi

# --- CMake consumers ---
mkdir "$tmp/consumer"
cp "$example_cpp" "$tmp/consumer/example.cpp"
cp "$example_c" "$tmp/consumer/example.c"
cat >"$tmp/consumer/static_main.cpp" <<'CPP'
#include <rtattn/rtattn.hpp>
#include <cstdio>
int main() {
    rtattn::AttentionConfig c;
    c.head_dim_qk = 132;
    c.arch = "sm_80";
    rtattn::Runtime rt;
    const auto info = rt.precompile(c);  // a real NVRTC compile through the static library
    std::printf("static: %s %s padded %d/%d\n", rtattn::version(), info.key.c_str(), info.plan.padded_qk,
                info.plan.padded_v);
    return info.key.size() == 64 && info.plan.padded_qk == 144 ? 0 : 1;
}
CPP
cat >"$tmp/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(rtattn 0.1 REQUIRED)
# The shared target needs nothing found at the consumer: no fmt, OpenSSL or CUDA looked for, no static target yet.
foreach(dep fmt OpenSSL CUDAToolkit)
  if(DEFINED ${dep}_FOUND OR DEFINED ${dep}_DIR)
    message(FATAL_ERROR "find_package(rtattn) looked for ${dep}")
  endif()
endforeach()
if(TARGET rtattn::rtattn_static)
  message(FATAL_ERROR "rtattn::rtattn_static is defined without COMPONENTS static")
endif()
find_package(CUDAToolkit REQUIRED)  # the example's own allocations (CUDA::cudart)
add_executable(use_old_abi example.cpp)
set_target_properties(use_old_abi PROPERTIES CXX_STANDARD 17 CXX_EXTENSIONS OFF)
target_compile_definitions(use_old_abi PRIVATE _GLIBCXX_USE_CXX11_ABI=0)
target_link_libraries(use_old_abi PRIVATE rtattn::rtattn CUDA::cudart)
add_executable(use_c example.c)
set_target_properties(use_c PROPERTIES C_STANDARD 99 C_EXTENSIONS OFF)
target_link_libraries(use_c PRIVATE rtattn::rtattn)
find_package(rtattn 0.1 REQUIRED COMPONENTS static)
add_executable(use_static static_main.cpp)
set_target_properties(use_static PROPERTIES CXX_STANDARD 17)
target_link_libraries(use_static PRIVATE rtattn::rtattn_static)
CMAKE
"$cmake" -S "$tmp/consumer" -B "$tmp/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
"$cmake" --build "$tmp/consumer/build" -j2 >/dev/null
run "$tmp/consumer/build/use_old_abi"
run "$tmp/consumer/build/use_c"
run "$tmp/consumer/build/use_static"

# --- pkg-config consumers ---
pc() { PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config "$@" rtattn; }
# shellcheck disable=SC2046
cc -std=c99 -pedantic -Werror "$example_c" $(pc --cflags --libs) -o "$tmp/pc_c"
# shellcheck disable=SC2046
c++ -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=0 "$example_cpp" -I"$cuda_inc" $(pc --cflags --libs) -L"$cuda_lib" -lcudart \
  -Wl,-rpath,"$cuda_lib" -o "$tmp/pc_cpp"
# shellcheck disable=SC2046
c++ -std=c++17 "$tmp/consumer/static_main.cpp" $(pc --cflags) \
  $(pc --static --libs | sed "s#-lrtattn\\b#$libdir/librtattn.a#") -o "$tmp/pc_static"
if ldd "$tmp/pc_static" | grep -q librtattn; then echo "install_consumer: pc_static links librtattn.so" >&2; exit 1; fi
LD_LIBRARY_PATH="$libdir" run "$tmp/pc_c"
LD_LIBRARY_PATH="$libdir" run "$tmp/pc_cpp"
run "$tmp/pc_static"

# --- the installed tree, moved ---
mv "$prefix" "$tmp/moved"
out=$("$tmp/moved/bin/rtattn" precompile --cache-only --cache-dir "$tmp/empty-cache" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 1 ] || ! grep -q "missing: d128" <<<"$out"; then
  echo "install_consumer: the moved CLI did not find its default manifest (exit $rc): $out" | head -5 >&2
  exit 1
fi
PKG_CONFIG_PATH="$tmp/moved/${libdir#"$prefix"/}/pkgconfig" pkg-config --cflags rtattn | grep -q -- "-I$tmp/moved/" ||
  PKG_CONFIG_PATH="$tmp/moved/${libdir#"$prefix"/}/pkgconfig" pkg-config --cflags rtattn | grep -q "moved"

# --- as a subproject: the parent's ctest gets none of ours ---
mkdir "$tmp/parent"
cat >"$tmp/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent CXX)
enable_testing()
add_subdirectory("$source_dir" rtattn)
if(TARGET rtattn_cli OR TARGET test_config)
  message(FATAL_ERROR "librtattn as a subproject built its tools or tests")
endif()
CMAKE
"$cmake" -S "$tmp/parent" -B "$tmp/parent/build" >/dev/null
(cd "$tmp/parent/build" && ctest -N | grep -q "Total Tests: 0") ||
  { echo "install_consumer: the subproject added tests to the parent" >&2; exit 1; }
echo "install_consumer: ok"
