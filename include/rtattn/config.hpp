// AttentionConfig: what a caller asks for. Plain data; validate() enforces the ranges. Header-only over the C ABI.
#pragma once
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "rtattn/config_fields.h"
#include "rtattn/errors.hpp"
#include "rtattn/rtattn.h"

namespace rtattn {

enum class Dtype { fp16, bf16 };

inline const char* to_string(Dtype d) noexcept { return d == Dtype::bf16 ? "bf16" : "fp16"; }

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
    bool decode = false;                // 1..16 query tokens per sequence against a KV cache (split-KV decode)
    bool paged_kv = false;              // K and V in a paged cache with a block table (decode, or prefill against the cache)
    bool varlen = false;                // packed sequences of different lengths (cu_seqlens), forward and backward
    bool local = false;                 // a sliding window, its bounds per call (window_size_left/right)
    bool sinks = false;                 // a learned per-head logit in every softmax denominator (call's sinks)
    bool softcap = false;               // scores softcap * tanh(score / softcap), the cap per call
    bool alibi = false;                 // scores minus slope * |i + Sk - Sq - j|, the slopes per call

    int dv() const noexcept { return head_dim_v.value_or(head_dim_qk); }
    double scale() const { return softmax_scale.value_or(1.0 / std::sqrt(double(head_dim_qk))); }

    // Throws ConfigError naming the first bad field and its allowed range.
    void validate() const;

    // Canonical JSON (all fields explicit). from_json validates and names unknown or mistyped fields.
    std::string to_json() const;
    static AttentionConfig from_json(const std::string& json);

    // Short human-readable tag, e.g. "d132 bf16 causal h32:8 sm_90a".
    std::string describe() const;

    friend bool operator==(const AttentionConfig& a, const AttentionConfig& b) {
#define RTATTN_CONFIG_EQ(n, kind) a.n == b.n&&
        return RTATTN_CONFIG_FIELDS(RTATTN_CONFIG_EQ) true;
#undef RTATTN_CONFIG_EQ
    }
    friend bool operator!=(const AttentionConfig& a, const AttentionConfig& b) { return !(a == b); }
};

// The arch names the library knows.
inline bool is_known_arch(const std::string& arch) noexcept { return rtattn_is_known_arch(arch.c_str()) != 0; }
inline std::string known_archs() { return detail::str(rtattn_known_archs()); }

// "bf16"/"bfloat16", "fp16"/"float16"/"half"; throws ConfigError("dtype", ...).
inline Dtype dtype_from_string(const std::string& s) {
    std::int32_t d = 0;
    detail::check(rtattn_dtype_from_string(s.c_str(), &d));
    return d == RTATTN_BF16 ? Dtype::bf16 : Dtype::fp16;
}

namespace detail {

// The C view of a config; its arch points into `c`, which must outlive it. Field by field as
// rtattn/config_fields.h lists them, each converted as its kind is.
inline rtattn_config to_c(const AttentionConfig& c) {
    rtattn_config out;
    rtattn_config_init(&out);
#define RTATTN_TO_C_INT(n) out.n = c.n;
#define RTATTN_TO_C_OPT_INT(n) out.has_##n = c.n.has_value(), out.n = c.n.value_or(0);
#define RTATTN_TO_C_DTYPE(n) out.n = c.n == Dtype::bf16 ? RTATTN_BF16 : RTATTN_FP16;
#define RTATTN_TO_C_FLAG(n) out.n = c.n;
#define RTATTN_TO_C_STRING(n) out.n = c.n.c_str();
#define RTATTN_TO_C(n, kind) RTATTN_TO_C_##kind(n)
#define RTATTN_TO_C_OPT_DOUBLE(n) RTATTN_TO_C_OPT_INT(n)
    RTATTN_CONFIG_FIELDS(RTATTN_TO_C)
#undef RTATTN_TO_C
#undef RTATTN_TO_C_INT
#undef RTATTN_TO_C_OPT_INT
#undef RTATTN_TO_C_DTYPE
#undef RTATTN_TO_C_FLAG
#undef RTATTN_TO_C_OPT_DOUBLE
#undef RTATTN_TO_C_STRING
    return out;
}

inline AttentionConfig from_c(const rtattn_config& c) {
    AttentionConfig out;
#define RTATTN_FROM_C_INT(n) out.n = c.n;
#define RTATTN_FROM_C_OPT_INT(n) \
    if (c.has_##n) out.n = c.n;
#define RTATTN_FROM_C_DTYPE(n) out.n = c.n == RTATTN_BF16 ? Dtype::bf16 : Dtype::fp16;
#define RTATTN_FROM_C_FLAG(n) out.n = c.n != 0;
#define RTATTN_FROM_C_OPT_DOUBLE(n) RTATTN_FROM_C_OPT_INT(n)
#define RTATTN_FROM_C_STRING(n) out.n = str(c.n);
#define RTATTN_FROM_C(n, kind) RTATTN_FROM_C_##kind(n)
    RTATTN_CONFIG_FIELDS(RTATTN_FROM_C)
#undef RTATTN_FROM_C
#undef RTATTN_FROM_C_INT
#undef RTATTN_FROM_C_OPT_INT
#undef RTATTN_FROM_C_DTYPE
#undef RTATTN_FROM_C_FLAG
#undef RTATTN_FROM_C_OPT_DOUBLE
#undef RTATTN_FROM_C_STRING
    return out;
}

}  // namespace detail

inline void AttentionConfig::validate() const {
    const rtattn_config c = detail::to_c(*this);
    detail::check(rtattn_config_validate(&c));
}

inline std::string AttentionConfig::to_json() const {
    const rtattn_config c = detail::to_c(*this);
    return detail::read_text([&](char* b, std::size_t n, std::size_t* need) {
        return rtattn_config_to_json(&c, b, n, need);
    });
}

inline std::string AttentionConfig::describe() const {
    const rtattn_config c = detail::to_c(*this);
    return detail::read_text([&](char* b, std::size_t n, std::size_t* need) {
        return rtattn_config_describe(&c, b, n, need);
    });
}

inline AttentionConfig AttentionConfig::from_json(const std::string& json) {
    rtattn_config c;
    rtattn_config_init(&c);
    char arch[64];
    detail::check(rtattn_config_from_json(json.c_str(), &c, arch, sizeof arch));
    return detail::from_c(c);
}

}  // namespace rtattn
