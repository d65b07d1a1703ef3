#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "arch/arch.hpp"
#include "config/config_json.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "rtattn/config_fields.h"
#include "util/json_input.hpp"
#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::core {

namespace {

void check_range(const char* field, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) throw ConfigError(field, util::format("{} is out of range; allowed {}..{}", v, lo, hi));
}

}  // namespace

const char* to_string(Dtype d) noexcept { return d == Dtype::bf16 ? "bf16" : "fp16"; }

Dtype dtype_from_string(const std::string& s) {
    if (s == "bf16" || s == "bfloat16") return Dtype::bf16;
    if (s == "fp16" || s == "float16" || s == "half") return Dtype::fp16;
    throw ConfigError("dtype", util::format("{} is not supported; allowed: fp16, bf16", util::quoted(s)));
}

bool is_known_arch(const std::string& arch) noexcept { return arch::find(arch) != nullptr; }

std::string known_archs() { return arch::known_names(); }

double AttentionConfig::scale() const { return softmax_scale.value_or(1.0 / std::sqrt(double(head_dim_qk))); }

void AttentionConfig::validate() const {
    check_range("head_dim_qk", head_dim_qk, 1, kMaxHeadDim);
    if (head_dim_v) check_range("head_dim_v", *head_dim_v, 1, kMaxHeadDim);
    check_range("num_heads_q", num_heads_q, 1, kMaxHeads);
    check_range("num_heads_kv", num_heads_kv, 1, num_heads_q);
    if (num_heads_q % num_heads_kv != 0)
        throw ConfigError("num_heads_kv", util::format("num_heads_q ({}) must be a multiple of num_heads_kv ({})",
                                                       num_heads_q, num_heads_kv));
    // The kernels take the scale as a float, and scale * log2(e) too (the exponent base 2): a double that is finite
    // but turns into infinity or 0 (or a subnormal) there would run as all-NaN or all-uniform attention.
    constexpr double kMinScale = std::numeric_limits<float>::min();
    constexpr double kMaxScale = std::numeric_limits<float>::max() / 1.4426950408889634;
    if (softmax_scale && !(*softmax_scale >= kMinScale && *softmax_scale <= kMaxScale))
        throw ConfigError("softmax_scale", util::format("{} is not allowed; allowed {:g}..{:g} (finite, > 0, a normal "
                                                        "float32 once multiplied by log2(e))",
                                                        *softmax_scale, kMinScale, kMaxScale));
    if (!arch.empty() && !is_known_arch(arch))
        throw ConfigError("arch", util::format("{} is not supported; allowed: {} (or empty for the current device)",
                                               util::quoted(arch), known_archs()));
    if (varlen && decode)
        throw ConfigError("varlen", "and decode cannot both be set (decode takes a dense query batch against "
                                    "per-sequence cache lengths; varlen is the packed prefill)");
}

std::string AttentionConfig::to_json() const {
    nlohmann::ordered_json j;  // every field, in rtattn/config_fields.h's order
#define RTATTN_JSON_INT(n) j[#n] = n;
#define RTATTN_JSON_OPT_INT(n) \
    if (n)                     \
        j[#n] = *n;            \
    else                       \
        j[#n] = nullptr;  // explicit "the default", so the round trip is exact
#define RTATTN_JSON_DTYPE(n) j[#n] = to_string(n);
#define RTATTN_JSON_FLAG(n) j[#n] = n;
#define RTATTN_JSON_OPT_DOUBLE(n) RTATTN_JSON_OPT_INT(n)
#define RTATTN_JSON_STRING(n) j[#n] = n;
#define RTATTN_JSON(n, kind) RTATTN_JSON_##kind(n)
    RTATTN_CONFIG_FIELDS(RTATTN_JSON)
    return j.dump();
}

AttentionConfig AttentionConfig::from_json(const std::string& text) {
    nlohmann::json j;
    if (std::string problem = util::parse_json(text, &j); !problem.empty()) throw ConfigError("json", problem);
    return config_from_json(j);
}

std::string json_for_message(const nlohmann::json& v) {
    const std::string text = v.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
    return text.size() <= 64 ? text : text.substr(0, 64) + util::format("... ({} bytes)", text.size());
}

namespace {

// An integer field in lo..hi; nothing when absent or null. The value is echoed as written, so 2^64-1 is not
// reported as -1.
std::optional<int> int_field(const nlohmann::json& j, const char* key, long long lo, long long hi) {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    const auto& v = j[key];
    if (!v.is_number_integer()) throw ConfigError(key, util::format("must be an integer, got {}", json_for_message(v)));
    const bool fits = v.is_number_unsigned() ? v.get<unsigned long long>() <= static_cast<unsigned long long>(hi)
                                             : v.get<long long>() >= lo && v.get<long long>() <= hi;
    if (!fits) throw ConfigError(key, util::format("{} is out of range; allowed {}..{}", json_for_message(v), lo, hi));
    return int(v.get<long long>());
}

}  // namespace

AttentionConfig config_from_json(const nlohmann::json& j) {
    if (!j.is_object()) throw ConfigError("json", "a config must be a JSON object");
#define RTATTN_FIELD_NAME(n, kind) #n,
    static const char* known[] = {"head_dim", RTATTN_CONFIG_FIELDS(RTATTN_FIELD_NAME)};
    for (const auto& [key, value] : j.items()) {
        bool ok = false;
        for (const char* k : known) ok = ok || key == k;
        if (!ok) {
            std::string allowed = "head_dim (or head_dim_qk)";
            for (const char* k : known)
                if (std::string(k) != "head_dim" && std::string(k) != "head_dim_qk") allowed += std::string(", ") + k;
            throw ConfigError(util::escaped(key.substr(0, 64)), "unknown field; allowed: " + allowed);
        }
    }
    constexpr int kMaxHeads = AttentionConfig::kMaxHeads;
    AttentionConfig c;
    // Both spellings are checked, so a bad value cannot hide behind the other one.
    const auto qk = int_field(j, "head_dim_qk", 1, AttentionConfig::kMaxHeadDim),
               plain = int_field(j, "head_dim", 1, AttentionConfig::kMaxHeadDim);
    if (qk && plain && *qk != *plain)
        throw ConfigError("head_dim", util::format("head_dim ({}) and head_dim_qk ({}) disagree; give one of them",
                                                   *plain, *qk));
    if (!qk && !plain) throw ConfigError("head_dim_qk", "missing; give head_dim_qk (or head_dim), 1..256");
    c.head_dim_qk = qk ? *qk : *plain;
    c.head_dim_v = int_field(j, "head_dim_v", 1, AttentionConfig::kMaxHeadDim);
    if (j.contains("dtype")) {
        if (!j["dtype"].is_string()) throw ConfigError("dtype", "must be a string: fp16 or bf16");
        c.dtype = dtype_from_string(j["dtype"].get<std::string>());
    }
    auto bool_field = [&](const char* key, bool& out) {
        if (!j.contains(key)) return;
        if (!j[key].is_boolean()) throw ConfigError(key, "must be true or false");
        out = j[key].get<bool>();
    };
    // The flags alike; the other kinds are read one by one (each field its own range, alias or default).
#define RTATTN_READ_FLAG(n) bool_field(#n, c.n);
#define RTATTN_READ(n, kind) RTATTN_READ_##kind(n)
#define RTATTN_READ_INT(n)
#define RTATTN_READ_OPT_INT(n)
#define RTATTN_READ_DTYPE(n)
#define RTATTN_READ_OPT_DOUBLE(n)
#define RTATTN_READ_STRING(n)
    RTATTN_CONFIG_FIELDS(RTATTN_READ)
    c.num_heads_q = int_field(j, "num_heads_q", 1, kMaxHeads).value_or(1);
    c.num_heads_kv = int_field(j, "num_heads_kv", 1, kMaxHeads).value_or(c.num_heads_q);
    if (j.contains("softmax_scale") && !j["softmax_scale"].is_null()) {
        if (!j["softmax_scale"].is_number()) throw ConfigError("softmax_scale", "must be a number > 0");
        c.softmax_scale = j["softmax_scale"].get<double>();
    }
    if (j.contains("arch")) {
        if (!j["arch"].is_string()) throw ConfigError("arch", "must be a string such as \"sm_90a\"");
        c.arch = j["arch"].get<std::string>();
    }
    c.validate();
    return c;
}

std::string AttentionConfig::describe() const {
    std::string d =
        dv() == head_dim_qk ? util::format("d{}", head_dim_qk) : util::format("d{}/{}", head_dim_qk, dv());
    return util::format("{} {} {} h{}:{}{}{}{}{}{}{}{}{}", d, to_string(dtype), causal ? "causal" : "noncausal",
                        num_heads_q, num_heads_kv,
                        decode ? (paged_kv ? " decode paged" : " decode") : paged_kv ? " paged" : "",
                        varlen ? " varlen" : "", local ? " local" : "", sinks ? " sinks" : "",
                        softcap ? " softcap" : "", alibi ? " alibi" : "",
                        softmax_scale ? util::format(" scale={}", *softmax_scale) : "",
                        arch.empty() ? "" : " " + arch);
}

}  // namespace rtattn::core
