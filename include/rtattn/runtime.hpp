// Runtime: turns an AttentionConfig into a launchable Kernel (plan -> render -> NVRTC -> disk cache -> Driver API).
// Header-only over the C ABI (rtattn.h): nothing here crosses the shared library as a C++ type, so any C++17
// compiler and either libstdc++ string ABI can use it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "rtattn/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn {

namespace detail {

inline KernelInfo from_c(const rtattn_kernel_info& i) {
    KernelInfo out;
    out.key = str(i.key);
    out.arch = str(i.arch);
    PlanSummary& p = out.plan;
    p.padded_qk = i.padded_qk, p.padded_v = i.padded_v;
    p.block_m = i.block_m, p.block_n = i.block_n, p.warps = i.warps, p.stages = i.stages;
    p.smem_bytes = i.smem_bytes;
    p.vec_qk = i.vec_qk, p.vec_v = i.vec_v;
    p.useful_flop_fraction = i.useful_flop_fraction;
    p.kernel = str(i.kernel);
    p.reason = str(i.reason);
    out.registers = i.registers, out.spill_bytes = i.spill_bytes;
    out.from_cache = i.from_cache != 0;
    return out;
}

inline rtattn_tensor to_c(const TensorArg& t) { return rtattn_tensor{t.ptr, t.batch_stride, t.seq_stride, t.head_stride}; }

}  // namespace detail

class Kernel {
public:
    Kernel() = default;
    // Launches on `stream` (a CUstream / cudaStream_t; nullptr = legacy default stream). Never synchronizes or
    // allocates, so it can be captured into a CUDA graph. Throws ArgumentError on a bad argument.
    void forward(const ForwardArgs& args, void* stream = nullptr) const {
        rtattn_forward_args a;
        rtattn_forward_args_init(&a);
        a.q = detail::to_c(args.q), a.k = detail::to_c(args.k), a.v = detail::to_c(args.v), a.o = detail::to_c(args.o);
        a.lse = args.lse;
        a.batch = args.batch, a.seqlen_q = args.seqlen_q, a.seqlen_k = args.seqlen_k;
        a.seqlens_k = args.seqlens_k, a.block_table = args.block_table, a.block_table_stride = args.block_table_stride;
        a.pages_per_seq = args.pages_per_seq, a.page_size = args.page_size, a.num_splits = args.num_splits;
        a.workspace = args.workspace, a.workspace_bytes = args.workspace_bytes;
        a.cu_seqlens_q = args.cu_seqlens_q, a.cu_seqlens_k = args.cu_seqlens_k;
        a.total_q = args.total_q, a.total_k = args.total_k;
        a.num_pages = args.num_pages;
        a.has_window = 1, a.window_size_left = args.window_size_left, a.window_size_right = args.window_size_right;
        a.sinks = args.sinks;
        a.softcap = args.softcap;
        a.alibi_slopes = args.alibi_slopes, a.alibi_slopes_batch_stride = args.alibi_slopes_batch_stride;
        // An older librtattn reads its own, shorter struct (rtattn_forward_args_init set its size): it would drop the
        // append without a word, so it is refused here.
        if (args.seqlen_new != 0 && a.struct_size < offsetof(rtattn_forward_args, seqlen_new) + sizeof(a.seqlen_new))
            throw ArgumentError("seqlen_new", "this librtattn predates the KV append (k_new / v_new); upgrade it");
        a.k_new = detail::to_c(args.k_new), a.v_new = detail::to_c(args.v_new), a.seqlen_new = args.seqlen_new;
        detail::check(rtattn_kernel_forward(handle(), &a, stream));
    }
    // Merges two attention states of this kernel's dtype and d_v (see MergeArgs) on `stream`: cascade attention's
    // prefix and suffix, ring attention's steps, split-KV partials. Never synchronizes or allocates.
    void merge(const MergeArgs& args, void* stream = nullptr) const {
        rtattn_merge_args a;
        rtattn_merge_args_init(&a);
        a.o_a = detail::to_c(args.o_a), a.o_b = detail::to_c(args.o_b), a.o = detail::to_c(args.o);
        a.lse_a = args.lse_a, a.lse_b = args.lse_b, a.lse = args.lse;
        a.batch = args.batch, a.seqlen = args.seqlen;
        detail::check(rtattn_kernel_merge(handle(), &a, stream));
    }
    // Device workspace one call with these sizes needs: the decode kernels' partial results per split (0 for the
    // prefill kernels, except a few-query call they hand to the decode kernels: rtattn_kernel_workspace_bytes).
    // num_splits 0: the library's choice, as forward() makes it.
    std::size_t workspace_bytes(int batch, int seqlen_q, int seqlen_k, int num_splits = 0) const {
        std::size_t n = 0;
        detail::check(rtattn_kernel_workspace_bytes(handle(), batch, seqlen_q, seqlen_k, num_splits, &n));
        return n;
    }
    // Key splits per sequence a decode call with these sizes runs (1 for the prefill kernels).
    int num_splits(int batch, int seqlen_q, int seqlen_k, int num_splits = 0) const {
        std::int32_t n = 0;
        detail::check(rtattn_kernel_num_splits(handle(), batch, seqlen_q, seqlen_k, num_splits, &n));
        return n;
    }
    const AttentionConfig& config() const { return state().config; }  // arch resolved
    const KernelInfo& info() const { return state().info; }
    explicit operator bool() const noexcept { return state_ != nullptr; }
    rtattn_kernel* handle() const noexcept { return state_ ? state_->handle : nullptr; }  // for C calls

private:
    friend class Runtime;
    struct State {
        rtattn_kernel* handle = nullptr;
        AttentionConfig config;
        KernelInfo info;
        State() = default;
        State(const State&) = delete;
        State& operator=(const State&) = delete;
        ~State() { rtattn_kernel_release(handle); }
    };
    const State& state() const {
        if (!state_) throw ArgumentError("kernel", "is empty (default-constructed); get one from Runtime::get");
        return *state_;
    }
    std::shared_ptr<const State> state_;
};

// The backward kernels of one config: dQ, dK and dV from Q, K, V, O, dO and the forward's LSE.
class BackwardKernel {
public:
    BackwardKernel() = default;
    // Device memory one call needs as workspace (fp32 dQ accumulator, row statistics, turn counters).
    std::size_t workspace_bytes(int batch, int seqlen_q, int seqlen_k) const {
        std::size_t n = 0;
        detail::check(rtattn_backward_kernel_workspace_bytes(handle_checked(), batch, seqlen_q, seqlen_k, &n));
        return n;
    }
    // Writes dQ, dK, dV on `stream`. Never synchronizes or allocates: graph-capturable. Throws ArgumentError.
    void backward(const BackwardArgs& args, void* stream = nullptr) const {
        rtattn_backward_args a;
        rtattn_backward_args_init(&a);
        a.q = detail::to_c(args.q), a.k = detail::to_c(args.k), a.v = detail::to_c(args.v);
        a.o = detail::to_c(args.o), a.dout = detail::to_c(args.dout);
        a.lse = args.lse, a.dlse = args.dlse;
        a.dq = detail::to_c(args.dq), a.dk = detail::to_c(args.dk), a.dv = detail::to_c(args.dv);
        a.batch = args.batch, a.seqlen_q = args.seqlen_q, a.seqlen_k = args.seqlen_k;
        a.workspace = args.workspace, a.workspace_bytes = args.workspace_bytes;
        a.deterministic = args.deterministic ? 1 : 0;
        a.cu_seqlens_q = args.cu_seqlens_q, a.cu_seqlens_k = args.cu_seqlens_k;
        a.total_q = args.total_q, a.total_k = args.total_k;
        a.has_window = 1, a.window_size_left = args.window_size_left, a.window_size_right = args.window_size_right;
        a.sinks = args.sinks, a.dsinks = args.dsinks;
        a.softcap = args.softcap;
        a.alibi_slopes = args.alibi_slopes, a.alibi_slopes_batch_stride = args.alibi_slopes_batch_stride;
        detail::check(rtattn_kernel_backward(handle_checked(), &a, stream));
    }
    const AttentionConfig& config() const { return state().config; }  // arch resolved
    const KernelInfo& info() const { return state().info; }
    explicit operator bool() const noexcept { return state_ != nullptr; }
    rtattn_backward_kernel* handle() const noexcept { return state_ ? state_->handle : nullptr; }  // for C calls

private:
    friend class Runtime;
    struct State {
        rtattn_backward_kernel* handle = nullptr;
        AttentionConfig config;
        KernelInfo info;
        State() = default;
        State(const State&) = delete;
        State& operator=(const State&) = delete;
        ~State() { rtattn_backward_kernel_release(handle); }
    };
    const State& state() const {
        if (!state_)
            throw ArgumentError("kernel", "is empty (default-constructed); get one from Runtime::get_backward");
        return *state_;
    }
    rtattn_backward_kernel* handle_checked() const { return state().handle; }
    std::shared_ptr<const State> state_;
};

class Runtime {
public:
    explicit Runtime(RuntimeOptions options = {}) : options_(std::move(options)) {
        rtattn_runtime_options o;
        rtattn_runtime_options_init(&o);
        o.cache_dir = options_.cache_dir.c_str();
        o.cache_mode = options_.mode == CacheMode::cache_only ? RTATTN_CACHE_ONLY : RTATTN_CACHE_JIT;
        o.max_concurrent_compiles = options_.max_concurrent_compiles;
        o.max_cache_bytes = options_.max_cache_bytes;
        o.log_level = static_cast<std::int32_t>(options_.log_level);
        if (options_.log_sink) {
            sink_ = std::make_unique<Sink>(options_.log_sink);
            o.log_callback = &Runtime::log_trampoline;
            o.log_user_data = sink_.get();
        }
        o.shared_cache = options_.shared_cache;
        o.lock_timeout_seconds = options_.lock_timeout_seconds;
        o.tile_override = options_.tile_override.empty() ? nullptr : options_.tile_override.c_str();
        detail::check(rtattn_runtime_create(&o, &runtime_));
        // What is in effect: the environment applied, the compile bound resolved.
        rtattn_runtime_options e;
        rtattn_runtime_options_init(&e);
        if (const rtattn_status s = rtattn_runtime_options_get(runtime_, &e); s != RTATTN_OK) {
            rtattn_runtime_destroy(runtime_);  // the destructor does not run for a constructor that throws
            detail::throw_last_error(s);
        }
        options_.mode = e.cache_mode == RTATTN_CACHE_ONLY ? CacheMode::cache_only : CacheMode::jit;
        options_.max_concurrent_compiles = e.max_concurrent_compiles;
        options_.max_cache_bytes = e.max_cache_bytes;
        options_.log_level = static_cast<LogLevel>(e.log_level);
        options_.shared_cache = e.shared_cache != 0;
        options_.lock_timeout_seconds = e.lock_timeout_seconds;
        options_.tile_override = detail::str(e.tile_override);
    }
    ~Runtime() { rtattn_runtime_destroy(runtime_); }
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    // Validates, plans, compiles or loads from cache, and loads the module into the current CUDA context
    // (the device's primary context if none is current). Thread-safe.
    Kernel get(const AttentionConfig& config) {
        const rtattn_config c = detail::to_c(config);
        auto state = std::make_shared<Kernel::State>();
        detail::check(rtattn_runtime_get(runtime_, &c, &state->handle));
        rtattn_config kc;
        rtattn_config_init(&kc);
        detail::check(rtattn_kernel_get_config(state->handle, &kc));
        state->config = detail::from_c(kc);
        rtattn_kernel_info info;
        rtattn_kernel_info_init(&info);
        detail::check(rtattn_kernel_get_info(state->handle, &info));
        state->info = detail::from_c(info);
        Kernel k;
        k.state_ = std::move(state);
        return k;
    }

    // Makes sure a cubin for `config` (with an explicit arch) is in the disk cache; needs no GPU or driver. Throws
    // CacheError when it was compiled but could not be stored (the message says why; this Runtime still serves it
    // from memory), CacheMissError in cache_only mode when it is not there.
    KernelInfo precompile(const AttentionConfig& config) {
        const rtattn_config c = detail::to_c(config);
        rtattn_kernel_info info;
        rtattn_kernel_info_init(&info);
        detail::check(rtattn_runtime_precompile(runtime_, &c, &info));
        return detail::from_c(info);
    }

    // The backward kernels of `config` (their own cache entry), as get() and precompile() do for the forward.
    BackwardKernel get_backward(const AttentionConfig& config) {
        const rtattn_config c = detail::to_c(config);
        auto state = std::make_shared<BackwardKernel::State>();
        detail::check(rtattn_runtime_get_backward(runtime_, &c, &state->handle));
        rtattn_config kc;
        rtattn_config_init(&kc);
        detail::check(rtattn_backward_kernel_get_config(state->handle, &kc));
        state->config = detail::from_c(kc);
        rtattn_kernel_info info;
        rtattn_kernel_info_init(&info);
        detail::check(rtattn_backward_kernel_get_info(state->handle, &info));
        state->info = detail::from_c(info);
        BackwardKernel k;
        k.state_ = std::move(state);
        return k;
    }
    KernelInfo precompile_backward(const AttentionConfig& config) {
        const rtattn_config c = detail::to_c(config);
        rtattn_kernel_info info;
        rtattn_kernel_info_init(&info);
        detail::check(rtattn_runtime_precompile_backward(runtime_, &c, &info));
        return detail::from_c(info);
    }

    CacheStats stats() const {
        rtattn_cache_stats s;
        rtattn_cache_stats_init(&s);
        detail::check(rtattn_runtime_stats(runtime_, &s));
        CacheStats out;
        out.memory_hits = s.memory_hits, out.disk_hits = s.disk_hits, out.misses = s.misses;
        out.compiles = s.compiles, out.compile_seconds = s.compile_seconds, out.bad_entries = s.bad_entries;
        out.evictions = s.evictions, out.bytes_written = s.bytes_written, out.disk_bytes = s.disk_bytes;
        out.disk_enabled = s.disk_enabled != 0;
        out.dir = detail::str(s.dir);
        return out;
    }

    // The options in effect (the environment applied, max_concurrent_compiles resolved).
    const RuntimeOptions& options() const { return options_; }
    rtattn_runtime* handle() const noexcept { return runtime_; }  // for C calls

private:
    using Sink = std::function<void(LogLevel, const std::string&)>;
    static void log_trampoline(void* user, std::int32_t level, const char* message) {
        try {
            (*static_cast<Sink*>(user))(static_cast<LogLevel>(level), detail::str(message));
        } catch (...) {
            // A logger's failure must not unwind through the library's C frames.
        }
    }

    RuntimeOptions options_;
    std::unique_ptr<Sink> sink_;  // the library calls it until rtattn_runtime_destroy, in ~Runtime's body
    rtattn_runtime* runtime_ = nullptr;
};

// Library version string, e.g. "0.1.0".
inline const char* version() noexcept { return rtattn_version(); }

}  // namespace rtattn
