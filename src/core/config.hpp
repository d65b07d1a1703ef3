// The library's own config type (rtattn::core). Public callers use include/rtattn/config.hpp, which mirrors it over
// the C ABI.
// AttentionConfig: what a caller asks for. Plain data; validate() enforces the ranges.
#pragma once
#include <optional>
#include <string>

namespace rtattn::core {

enum class Dtype { fp16, bf16 };

const char* to_string(Dtype d) noexcept;
Dtype dtype_from_string(const std::string& s);  // throws ConfigError("dtype", ...)

struct AttentionConfig {
    static constexpr int kMaxHeadDim = 256;
    static constexpr int kMaxHeads = 65535;  // the query heads are a grid dimension (y: at most 65535)

    int head_dim_qk = 128;              // 1..256
    std::optional<int> head_dim_v;      // 1..256, defaults to head_dim_qk
    Dtype dtype = Dtype::bf16;
    bool causal = false;                // bottom-right aligned when seqlen_q != seqlen_k
    int num_heads_q = 1;                // 1..65535, divisible by num_heads_kv
    int num_heads_kv = 1;               // >= 1 (1 = MQA, < num_heads_q = GQA)
    std::optional<double> softmax_scale;  // FLT_MIN..FLT_MAX/log2(e); default 1/sqrt(head_dim_qk)
    std::string arch;                   // "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"; empty = current device
    // Serving. decode: 1..16 query tokens per sequence against cached keys of per-sequence lengths (the decode kernel
    // family: a KV group's query heads share a CTA, split-KV with a combine). paged_kv: K and V in a paged cache
    // addressed through a block table, for decode or a prefill against the cache (chunked prefill; forward only).
    // varlen: prefill over packed sequences of different lengths ([total_tokens, heads, d] with cu_seqlens), forward
    // and backward.
    bool decode = false;
    bool paged_kv = false;
    bool varlen = false;
    // local: a sliding window (FlashAttention's local attention); its bounds are the call's window_size_left/right
    // (run-time values: one kernel serves every window). With causal the right bound is 0.
    bool local = false;
    // sinks: attention sinks (gpt-oss; vLLM's s_aux): each query head's fp32 logit, the call's sinks[heads_q], joins
    // every row's softmax denominator (a key with a zero value); the backward gives its gradient dsinks.
    bool sinks = false;
    // softcap: logit softcapping (Gemma 2, Grok): each scaled score s becomes softcap * tanh(s / softcap) before the
    // softmax, softcap the call's value (> 0). Every pass (the backward takes the cap's slope 1 - tanh^2 in dS).
    bool softcap = false;
    // alibi: ALiBi (MPT, BLOOM, Falcon; FlashAttention's alibi_slopes): each scaled score of query i and key j loses
    // slope * |i + seqlen_k - seqlen_q - j| (after the cap, if any), slope the call's per head (and batch). Every
    // pass (prefill, varlen, paged prefill, decode, backward).
    bool alibi = false;

    int dv() const noexcept { return head_dim_v.value_or(head_dim_qk); }
    double scale() const;  // the effective softmax scale

    // Throws ConfigError naming the first bad field and its allowed range.
    void validate() const;

    // Canonical JSON (all fields explicit). from_json validates and names unknown or mistyped fields.
    std::string to_json() const;
    static AttentionConfig from_json(const std::string& json);

    // Short human-readable tag, e.g. "d132 bf16 causal h32:8 sm_90a".
    std::string describe() const;

    bool operator==(const AttentionConfig&) const = default;
};

// The arch names the library knows, and the compute capability each runs on.
bool is_known_arch(const std::string& arch) noexcept;
std::string known_archs();  // "sm_80, sm_86, ..." for error messages

}  // namespace rtattn::core

// Internal code names these as rtattn::X. The public C++ API (include/rtattn/*.hpp) defines its own, header-only
// over the C ABI; a translation unit includes one set or the other, never both.
namespace rtattn {
using core::Dtype;
using core::to_string;
using core::dtype_from_string;
using core::AttentionConfig;
using core::is_known_arch;
using core::known_archs;
}  // namespace rtattn
