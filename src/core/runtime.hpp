// The library's own Runtime and Kernel (rtattn::core), behind the C ABI.
// Runtime: turns AttentionConfig into a launchable Kernel (plan -> render -> NVRTC -> disk cache -> Driver API).
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::core {

// The plain data types are the public ones (include/rtattn/types.hpp): one definition for the library and its callers.
using rtattn::CacheMode;
using rtattn::LogLevel;
using rtattn::RuntimeOptions;
using rtattn::CacheStats;
using rtattn::TensorArg;
using rtattn::ForwardArgs;
using rtattn::BackwardArgs;
using rtattn::MergeArgs;
using rtattn::PlanSummary;
using rtattn::KernelInfo;

class Kernel {
public:
    Kernel() = default;
    // Launches on `stream` (a CUstream / cudaStream_t; nullptr = legacy default stream). Never synchronizes or
    // allocates, so it can be captured into a CUDA graph. Throws ArgumentError on a bad argument.
    void forward(const ForwardArgs& args, void* stream = nullptr) const;
    // Device workspace a call with these sizes needs (decode: partial results per split; else 0), and the key
    // splits it runs; num_splits 0 is the library's choice.
    std::size_t workspace_bytes(int batch, int seqlen_q, int seqlen_k, int num_splits = 0) const;
    int num_splits(int batch, int seqlen_q, int seqlen_k, int num_splits = 0) const;
    // Merges two attention states of this kernel's dtype and d_v (MergeArgs); launches on `stream`.
    void merge(const MergeArgs& args, void* stream = nullptr) const;
    const AttentionConfig& config() const;
    const KernelInfo& info() const;
    explicit operator bool() const noexcept { return impl_ != nullptr; }

    struct Impl;
    explicit Kernel(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
private:
    std::shared_ptr<const Impl> impl_;
};

// The backward kernels of one config (preprocess, main, postprocess: one module).
class BackwardKernel {
public:
    BackwardKernel() = default;
    // Device memory one call needs as workspace (fp32 dQ accumulator, row statistics, turn counters).
    std::size_t workspace_bytes(int batch, int seqlen_q, int seqlen_k) const;
    // Writes dQ, dK, dV on `stream`. Never synchronizes or allocates: graph-capturable. Throws ArgumentError.
    void backward(const BackwardArgs& args, void* stream = nullptr) const;
    const AttentionConfig& config() const;
    const KernelInfo& info() const;
    explicit operator bool() const noexcept { return impl_ != nullptr; }

    struct Impl;
    explicit BackwardKernel(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
private:
    std::shared_ptr<const Impl> impl_;
};

class Runtime {
public:
    explicit Runtime(RuntimeOptions options = {});
    ~Runtime();
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    // Validates, plans, compiles or loads from cache, and loads the module into the current CUDA context
    // (the device's primary context if none is current). Thread-safe.
    Kernel get(const AttentionConfig& config);

    // Makes sure a cubin for `config` (with an explicit arch) is in the disk cache; needs no GPU or driver. Throws
    // CacheError when it was compiled but could not be stored (the message says why; this Runtime still serves it
    // from memory), CacheMissError in cache_only mode when it is not there.
    KernelInfo precompile(const AttentionConfig& config);

    // The same for the backward pass of `config` (its own kernels and cache entry).
    BackwardKernel get_backward(const AttentionConfig& config);
    KernelInfo precompile_backward(const AttentionConfig& config);

    CacheStats stats() const;
    const RuntimeOptions& options() const;

    struct Impl;
    Impl& impl() { return *impl_; }  // library-internal (the CLI and tests reach the resolver through it)
private:
    // Shared only so a Kernel can hold it weakly (its few-query calls reach their decode kernel through it while
    // the Runtime lives); the Runtime is its one owner.
    std::shared_ptr<Impl> impl_;
};

// Library version string, e.g. "0.1.0".
const char* version() noexcept;

}  // namespace rtattn::core

// Internal code names these as rtattn::X. The public C++ API (include/rtattn/runtime.hpp) defines its own Kernel and
// Runtime, header-only over the C ABI; a translation unit includes one or the other, never both.
namespace rtattn {
using core::Kernel;
using core::BackwardKernel;
using core::Runtime;
using core::version;
}  // namespace rtattn
