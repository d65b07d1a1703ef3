// The plain data of rtattn's C++ API: options, statistics, call arguments, what a kernel is. No function here
// calls into the library, so the library itself uses these same definitions (src/core) and the header-only layer
// (runtime.hpp) passes them through the C ABI field by field.
#pragma once
#if !defined(__cplusplus) || __cplusplus < 201703L
#error "rtattn's C++ API needs C++17 or newer; C callers include <rtattn/rtattn.h>"
#endif
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace rtattn {

enum class CacheMode {
    jit,         // compile on a miss
    cache_only,  // a miss throws CacheMissError naming the config (servers that must never JIT)
};

enum class LogLevel { quiet, warn, info, debug };

struct RuntimeOptions {
    std::string cache_dir;                // empty: $RTATTN_CACHE_DIR, else $XDG_CACHE_HOME/rtattn, else ~/.cache/rtattn
    CacheMode mode = CacheMode::jit;      // RTATTN_CACHE_ONLY=1 in the environment forces cache_only
    // 0: one per hardware thread, at most 8. Never more than the hardware threads (each NVRTC run can take 100s of
    // MB); Runtime::options() shows the number in effect.
    int max_concurrent_compiles = 0;
    std::uint64_t max_cache_bytes = 2ull << 30;  // disk cap; least recently used entries are evicted past it
    LogLevel log_level = LogLevel::warn;  // RTATTN_LOG_LEVEL=quiet|warn|info|debug in the environment replaces it
    // Default: stderr with an "rtattn:" prefix. Called from whichever thread logs; exceptions it throws are dropped.
    std::function<void(LogLevel, const std::string&)> log_sink;
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

    // Calls against a KV cache: decode and paged configs (config.decode or config.paged_kv), and dense prefill
    // configs given seqlens_k (not varlen). seqlen_q is the query tokens per sequence (decode: 1..16; a paged
    // prefill: any, or the longest with varlen queries) and seqlen_k the most keys any sequence has cached (host-known:
    // it fixes decode's number of splits, so a CUDA graph captured with it stays valid while the lengths on the device
    // change; dense: the cache's rows per sequence, at most its capacity). The queries are the last seqlen_q of the
    // sequence's keys (causal aligns them bottom-right): a chunked prefill writes the chunk's K/V into the cache
    // first, or passes them as k_new / v_new below.
    const std::int32_t* seqlens_k = nullptr;  // device [batch]: keys cached per sequence (<= seqlen_k; larger values
                                              // are read as seqlen_k); null: every sequence has seqlen_k
    // Paged KV (config.paged_kv): k and v are [num_pages, page_size, heads_kv, dim] caches, so their batch_stride is
    // the page stride and seq_stride the token stride inside a page. Token t of sequence b lives in page
    // block_table[b * block_table_stride + t / page_size], slot t % page_size.
    const std::int32_t* block_table = nullptr;  // device [batch, block_table_stride] int32
    std::int64_t block_table_stride = 0;        // elements between the table's rows (>= pages_per_seq)
    int pages_per_seq = 0;                      // the table's columns: pages_per_seq * page_size >= seqlen_k
    int page_size = 0;                          // tokens per page: 1, 2, 4, ..., 65536
    int num_pages = 0;                          // pages in k and v (required): a table entry outside 0..num_pages-1
                                                // reads the last page (wrong rows, never outside the cache)
    int num_splits = 0;                         // key splits per sequence (1..128); 0: the library chooses
    void* workspace = nullptr;                  // device, 256-byte aligned: Kernel::workspace_bytes(...)
    std::size_t workspace_bytes = 0;

    // Varlen configs (config.varlen) only, FlashAttention's varlen layout: q, k, v and o are [total, heads, dim]
    // (batch_stride 0) and sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q and o, cu_seqlens_k[b] ..
    // of k and v. batch is the number of sequences, seqlen_q / seqlen_k the longest (max_seqlen_q / max_seqlen_k:
    // they size the grid, so a longer sequence's rows past them are not computed). lse is [heads_q, total_q].
    // Causal is aligned bottom-right per sequence. The offsets stay on the device: only total_q / total_k are
    // checked here, and the kernels clamp offsets into them, so bad offsets cannot touch memory outside the tensors.
    const std::int32_t* cu_seqlens_q = nullptr;  // device [batch + 1] int32, non-decreasing, cu_seqlens_q[0] = 0
    const std::int32_t* cu_seqlens_k = nullptr;  // device [batch + 1] int32
    int total_q = 0, total_k = 0;                // rows of the packed q/o and k/v

    // Local configs (config.local) only: key j is seen by query i iff i + seqlen_k - seqlen_q - window_size_left
    // <= j <= i + seqlen_k - seqlen_q + window_size_right (per sequence; FlashAttention's window_size); -1: that side
    // unbounded. Causal kernels take a right bound of 0 (or -1, read as 0). Any other kernel: both -1.
    int window_size_left = -1, window_size_right = -1;

    // Sinks configs (config.sinks) only, and required there: device float32 [heads_q], each query head's sink logit
    // (in the units of the scaled scores), joining every row's softmax denominator. Null for any other kernel.
    const float* sinks = nullptr;

    // Softcap configs (config.softcap) only, and required there: scores s (scaled) become softcap * tanh(s / softcap)
    // before the softmax; finite and > 0. 0 for any other kernel.
    float softcap = 0;

    // ALiBi configs (config.alibi) only, and required there: device float32 slopes, [heads_q] (batch stride 0: every
    // sequence alike) or [batch, heads_q] rows alibi_slopes_batch_stride (>= heads_q) elements apart; the score of
    // query i and key j loses slope * |i + seqlen_k - seqlen_q - j| (FlashAttention's alibi_slopes). Null otherwise.
    const float* alibi_slopes = nullptr;
    std::int64_t alibi_slopes_batch_stride = 0;

    // KV append (a cache call: decode, paged, or a dense batch with seqlens_k; not varlen), FlashAttention's
    // flash_attn_with_kvcache k= / v=: seqlen_new new tokens per sequence, k_new [batch, seqlen_new, heads_kv, d_qk]
    // and v_new (d_v), are written into the cache (k and v, which this call then modifies) at rows seqlens_k[b] ..
    // seqlens_k[b] + seqlen_new - 1 (seqlens_k required: the lengths before the call; rows at or past seqlen_k, or in
    // a page outside 0..num_pages-1, are dropped), and the attention reads seqlens_k[b] + seqlen_new keys (at most
    // seqlen_k, which bounds the lengths after the append). Two launches on the stream: graph-capturable.
    TensorArg k_new, v_new;
    int seqlen_new = 0;

    // A packed [total, heads, dim] tensor with contiguous rows, for varlen configs.
    static TensorArg packed(const void* ptr, int heads, int dim) {
        return TensorArg{ptr, 0, std::int64_t(heads) * dim, dim};
    }

    // Fills strides for a contiguous [batch, seq, head, dim] tensor.
    static TensorArg contiguous(const void* ptr, int seqlen, int heads, int dim) {
        return TensorArg{ptr, std::int64_t(seqlen) * heads * dim, std::int64_t(heads) * dim, dim};
    }
};

// Two attention states of the same query rows, each over its own set of keys (a shared prefix and each request's
// own keys in cascade attention, one device's keys in ring attention), and where their merge goes: the attention over
// both sets. O tensors are [batch, seqlen, heads_q, d_v] like the forward's o, LSE [batch, heads_q, seqlen] float32
// like its lse (varlen: batch 1, seqlen total_q). A state whose LSE is +inf or -inf has no keys and weight 0. o may be
// o_a or o_b and lse lse_a or lse_b (in place).
struct MergeArgs {
    TensorArg o_a, o_b;
    TensorArg o;                   // written
    const float* lse_a = nullptr;  // required
    const float* lse_b = nullptr;  // required
    float* lse = nullptr;          // optional: the merged LSE
    int batch = 0, seqlen = 0;
};

// One backward call: the forward's inputs, its output O and LSE, the gradient dO of the loss with respect to O, and
// the gradients to write. Layouts as ForwardArgs: [batch, seq, head, dim], strides in elements, dim contiguous.
struct BackwardArgs {
    TensorArg q, k, v;               // the forward's inputs
    TensorArg o;                     // the forward's output, [batch, seqlen_q, heads_q, d_v]
    TensorArg dout;                  // dO, same shape as o
    const float* lse = nullptr;      // the forward's LSE, [batch, heads_q, seqlen_q] float32 (required)
    const float* dlse = nullptr;     // optional: the loss's gradient with respect to that LSE, same layout
    TensorArg dq;                    // written: dQ, same shape as q
    TensorArg dk, dv;                // written: per KV head (the GQA group's gradients summed), shapes of k and v
    int batch = 0;
    int seqlen_q = 0;
    int seqlen_k = 0;
    void* workspace = nullptr;       // device memory, 256-byte aligned, at least workspace_bytes(...) of the kernel
    std::size_t workspace_bytes = 0; // its size
    bool deterministic = false;      // bitwise-identical gradients run to run (dQ added in a fixed order; slower)
    // Varlen configs: as ForwardArgs (every tensor [total, heads, dim], lse and dlse [heads_q, total_q]); the
    // workspace is sized by batch and the longest sequence: workspace_bytes(batch, seqlen_q, seqlen_k).
    const std::int32_t* cu_seqlens_q = nullptr;
    const std::int32_t* cu_seqlens_k = nullptr;
    int total_q = 0, total_k = 0;
    int window_size_left = -1, window_size_right = -1;  // local configs: the forward's window (ForwardArgs)
    // Sinks configs: the forward's sinks (required) and, optionally (null: not computed), dsinks: device float32
    // [heads_q], written (not added to) with the loss's gradient with respect to each sink, summed over the batch.
    const float* sinks = nullptr;
    float* dsinks = nullptr;
    float softcap = 0;  // softcap configs: the forward's cap (required, > 0); 0 for any other kernel
    // ALiBi configs: the forward's slopes (required) and their batch stride, as ForwardArgs.
    const float* alibi_slopes = nullptr;
    std::int64_t alibi_slopes_batch_stride = 0;
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

}  // namespace rtattn
