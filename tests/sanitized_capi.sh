#!/usr/bin/env bash
# The C ABI under AddressSanitizer and UndefinedBehaviorSanitizer: builds the library and test_capi with both (a build
# dir of their own, kept between runs) and runs test_capi, whose struct_size, handed-out string and scale cases are
# the bad inputs that corrupted memory (heap use after free, reads past a caller's struct) or overflowed silently.
# Any sanitizer report fails the test.
# Usage: sanitized_capi.sh SOURCE_DIR BUILD_DIR CMAKE_COMMAND
set -euo pipefail
source_dir=$1
build=$2
cmake=${3:-cmake}
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
"$cmake" -S "$source_dir" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" >/dev/null
"$cmake" --build "$build" -j"$(nproc)" --target test_capi >/dev/null
cache=$build/test-cache-capi
# protect_shadow_gap=0: the CUDA driver maps memory where ASAN's shadow gap would be (a GPU machine).
# intercept_tls_get_addr=0: NVRTC, dlopen'd, has thread-local storage, so glibc hands out its block from malloc at
# run time. The GCC 12 runtime's __tls_get_addr hook takes any such block that starts 16 bytes into a page for a
# pre-2.25 glibc block with a header, and reads its range from the two words before it; LeakSanitizer's tracer then
# scans that garbage range at exit and dies ("Tracer caught signal 11", after every check passed). Where the block
# lands depends on the heap's history, so one machine (CI) hit it on every run and this one never. Without the hook
# the leak check does not scan NVRTC's thread-local block (32 bytes, no pointers of ours).
export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=0:halt_on_error=1:intercept_tls_get_addr=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export CUDA_CACHE_DISABLE=1
rm -rf "$cache"
exec "$build/tests/test_capi" "$cache"
