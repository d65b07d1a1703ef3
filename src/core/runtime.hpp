// The library's own Runtime and Kernel (rtattn::core), behind the C ABI.
// Runtime: turns AttentionConfig into a launchable Kernel (plan -> render -> NVRTC -> disk cache -> Driver API).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/config.hpp"

namespace rtattn::core {

enum class CacheMode {
    jit,         // compile on a miss
    cache_only,  // a miss throws CacheMissError naming the config (servers that must never JIT)
};

enum class LogLevel { quiet, warn, info, debug };

struct RuntimeOptions {
    std::string cache_dir;                // empty: $RTATTN_CACHE_DIR, else $XDG_CACHE_HOME/rtattn, else ~/.cache/rtattn
    CacheMode mode = CacheMode::jit;
    // 0: one per hardware thread, at most 8. Never more than the hardware threads (each NVRTC run can take 100s of
    // MB); Runtime::options() shows the number in effect.
    int max_concurrent_compiles = 0;
    std::uint64_t max_cache_bytes = 2ull << 30;  // disk cap; least recently used entries are evicted past it
    LogLevel log_level = LogLevel::warn;
    std::function<void(LogLevel, const std::string&)> log_sink;  // default: stderr with an "rtattn:" prefix
    // A cached cubin runs in this process, so by default an entry is loaded only if it and every directory from the
    // cache root down are owned by you or root and writable by nobody else. true (or RTATTN_SHARED_CACHE=1) trusts
    // a team cache that is group-writable on purpose: then anyone who can write it can run code in this process.
    // A directory writable by every user is never trusted.
    bool shared_cache = false;
    // How long to wait for another process that is building the same kernel (0..86400); past it the kernel is
    // built into memory and not stored, so an entry never has two writers.
    double lock_timeout_seconds = 60;
    // Replaces the plan table's tile choice, "block_m,block_n,warps,m_tiles,stages,q_in_regs[,schedule[,swizzle
    // [,pv_step[,wide_v]]]]": a tuning knob (tools/bench/tile_sweep.sh). Empty: RTATTN_TILE, read once here, else
    // the table. The choice is part of the rendered source, so it gets its own cache entries.
    std::string tile_override;
};

struct CacheStats {
    std::uint64_t memory_hits = 0;
    std::uint64_t disk_hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t compiles = 0;
    double compile_seconds = 0;          // NVRTC time, not counting waits for a compile slot
    std::uint64_t bad_entries = 0;       // corrupt entries found, removed and rebuilt
    std::uint64_t evictions = 0;
    std::uint64_t bytes_written = 0;
    std::uint64_t disk_bytes = 0;        // size of the disk cache as last scanned
    bool disk_enabled = true;            // false when the cache dir cannot be used or is not trusted (memory only)
    std::string dir;
};

// Strides are in elements; the last (head_dim) dimension is contiguous. Layout: [batch, seq, head, dim].
struct TensorArg {
    const void* ptr = nullptr;
    std::int64_t batch_stride = 0;
    std::int64_t seq_stride = 0;
    std::int64_t head_stride = 0;
};

struct ForwardArgs {
    TensorArg q, k, v;               // q: [batch, seqlen_q, heads_q, d_qk], k: [.., seqlen_k, heads_kv, d_qk], v: d_v
    TensorArg o;                     // [batch, seqlen_q, heads_q, d_v], written (o.ptr is cast to non-const)
    float* lse = nullptr;            // optional [batch, heads_q, seqlen_q] float32, natural-log sum-exp of scaled scores
    int batch = 0;
    int seqlen_q = 0;
    int seqlen_k = 0;

    // Fills strides for a contiguous [batch, seq, head, dim] tensor.
    static TensorArg contiguous(const void* ptr, int seqlen, int heads, int dim);
};

// What the planner chose, for `rtattn info` and logging.
struct PlanSummary {
    int padded_qk = 0, padded_v = 0;   // head dims after padding to the MMA shape
    int block_m = 0, block_n = 0, warps = 0, stages = 0;
    int smem_bytes = 0;
    int vec_qk = 0, vec_v = 0;         // elements per vector access: pointers and strides must be multiples
    double useful_flop_fraction = 0;  // useful / issued MMA FLOPs (padding waste)
    std::string kernel;               // e.g. "mma.sync", "wgmma, swizzled tiles, producer warpgroup, ping-pong"
    std::string reason;               // the plan table row's reason
};

struct KernelInfo {
    std::string key;       // SHA-256 cache key (hex)
    std::string arch;
    PlanSummary plan;
    int registers = -1;    // from ptxas when this process compiled it, else -1
    int spill_bytes = -1;
    bool from_cache = false;
};

class Kernel {
public:
    Kernel() = default;
    // Launches on `stream` (a CUstream / cudaStream_t; nullptr = legacy default stream). Never synchronizes or
    // allocates, so it can be captured into a CUDA graph. Throws ArgumentError on a bad argument.
    void forward(const ForwardArgs& args, void* stream = nullptr) const;
    const AttentionConfig& config() const;
    const KernelInfo& info() const;
    explicit operator bool() const noexcept { return impl_ != nullptr; }

    struct Impl;
    explicit Kernel(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
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

    CacheStats stats() const;
    const RuntimeOptions& options() const;

    struct Impl;
    Impl& impl() { return *impl_; }  // library-internal (the CLI and tests reach the resolver through it)
private:
    std::unique_ptr<Impl> impl_;
};

// Library version string, e.g. "0.1.0".
const char* version() noexcept;

}  // namespace rtattn::core

// Internal code names these as rtattn::X. The public C++ API (include/rtattn/*.hpp) defines its own, header-only
// over the C ABI; a translation unit includes one set or the other, never both.
namespace rtattn {
using core::CacheMode;
using core::LogLevel;
using core::RuntimeOptions;
using core::CacheStats;
using core::TensorArg;
using core::ForwardArgs;
using core::PlanSummary;
using core::KernelInfo;
using core::Kernel;
using core::Runtime;
using core::version;
}  // namespace rtattn
