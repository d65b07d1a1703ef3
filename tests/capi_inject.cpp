// Throws the library's own exceptions through the C ABI's boundary, for test_cxx_api: the failures that no config
// can provoke on demand (NVRTC rejecting a source, a Driver API call failing, running out of memory, a bug).
#include <new>
#include <stdexcept>

#include "capi/boundary.hpp"

extern "C" rtattn_status rtattn_test_inject(int kind) {
    namespace core = rtattn::core;
    return rtattn::capi::guard([&] {
        switch (kind) {
            case 0: throw core::CompileError("NVRTC rejected d132 bf16", "line 7: error", "--std=c++17", "source");
            case 1: throw core::CudaError("cuLaunchKernel", 719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified failure");
            case 2: throw std::bad_alloc();
            case 3: throw std::logic_error("an invariant broke");
            case 4: throw 42;
            case 5: throw core::CacheError("compiled, but not stored");
            case 6: throw core::CacheMissError("cache_only mode: no cached kernel");
            default: return;
        }
    });
}
