#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "rtattn/config.hpp"
#include "rtattn/errors.hpp"

namespace rtattn {

namespace {

constexpr const char* kArchs[] = {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"};

void check_range(const char* field, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) throw ConfigError(field, fmt::format("{} is out of range; allowed {}..{}", v, lo, hi));
}

}  // namespace

const char* to_string(Dtype d) noexcept { return d == Dtype::bf16 ? "bf16" : "fp16"; }

Dtype dtype_from_string(const std::string& s) {
    if (s == "bf16" || s == "bfloat16") return Dtype::bf16;
    if (s == "fp16" || s == "float16" || s == "half") return Dtype::fp16;
    throw ConfigError("dtype", fmt::format("'{}' is not supported; allowed: fp16, bf16", s));
}

bool is_known_arch(const std::string& arch) noexcept {
    for (const char* a : kArchs)
        if (arch == a) return true;
    return false;
}

std::string known_archs() { return fmt::format("{}", fmt::join(kArchs, ", ")); }

double AttentionConfig::scale() const { return softmax_scale.value_or(1.0 / std::sqrt(double(head_dim_qk))); }

void AttentionConfig::validate() const {
    check_range("head_dim_qk", head_dim_qk, 1, kMaxHeadDim);
    if (head_dim_v) check_range("head_dim_v", *head_dim_v, 1, kMaxHeadDim);
    check_range("num_heads_q", num_heads_q, 1, 1 << 16);
    check_range("num_heads_kv", num_heads_kv, 1, num_heads_q);
    if (num_heads_q % num_heads_kv != 0)
        throw ConfigError("num_heads_kv", fmt::format("num_heads_q ({}) must be a multiple of num_heads_kv ({})",
                                                      num_heads_q, num_heads_kv));
    if (softmax_scale && !(std::isfinite(*softmax_scale) && *softmax_scale > 0))
        throw ConfigError("softmax_scale", fmt::format("{} is not allowed; must be finite and > 0", *softmax_scale));
    if (!arch.empty() && !is_known_arch(arch))
        throw ConfigError("arch", fmt::format("'{}' is not supported; allowed: {} (or empty for the current device)",
                                              arch, known_archs()));
}

std::string AttentionConfig::to_json() const {
    nlohmann::ordered_json j;
    j["head_dim_qk"] = head_dim_qk;
    if (head_dim_v)
        j["head_dim_v"] = *head_dim_v;
    else
        j["head_dim_v"] = nullptr;  // explicit "same as head_dim_qk", so the round trip is exact
    j["dtype"] = to_string(dtype);
    j["causal"] = causal;
    j["num_heads_q"] = num_heads_q;
    j["num_heads_kv"] = num_heads_kv;
    if (softmax_scale)
        j["softmax_scale"] = *softmax_scale;
    else
        j["softmax_scale"] = nullptr;
    j["arch"] = arch;
    return j.dump();
}

AttentionConfig AttentionConfig::from_json(const std::string& text) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw ConfigError("json", fmt::format("not valid JSON: {}", e.what()));
    }
    if (!j.is_object()) throw ConfigError("json", "a config must be a JSON object");
    AttentionConfig c;
    auto get_int = [&](const char* key, int& out) {
        if (!j.contains(key) || j[key].is_null()) return false;
        const auto& v = j[key];
        if (!v.is_number_integer()) throw ConfigError(key, fmt::format("must be an integer, got {}", v.dump()));
        const long long x = v.get<long long>();
        if (x < -(1LL << 31) || x > (1LL << 31) - 1) throw ConfigError(key, fmt::format("{} is out of range", x));
        out = int(x);
        return true;
    };
    for (const auto& [key, value] : j.items()) {
        static const char* known[] = {"head_dim",   "head_dim_qk",  "head_dim_v",    "dtype", "causal",
                                      "num_heads_q", "num_heads_kv", "softmax_scale", "arch"};
        bool ok = false;
        for (const char* k : known) ok = ok || key == k;
        if (!ok)
            throw ConfigError(key, "unknown field; allowed: head_dim (or head_dim_qk), head_dim_v, dtype, causal, "
                                   "num_heads_q, num_heads_kv, softmax_scale, arch");
    }
    if (!get_int("head_dim_qk", c.head_dim_qk) && !get_int("head_dim", c.head_dim_qk))
        throw ConfigError("head_dim_qk", "missing; give head_dim_qk (or head_dim), 1..256");
    int dv = 0;
    if (get_int("head_dim_v", dv)) c.head_dim_v = dv;
    if (j.contains("dtype")) {
        if (!j["dtype"].is_string()) throw ConfigError("dtype", "must be a string: fp16 or bf16");
        c.dtype = dtype_from_string(j["dtype"].get<std::string>());
    }
    if (j.contains("causal")) {
        if (!j["causal"].is_boolean()) throw ConfigError("causal", "must be true or false");
        c.causal = j["causal"].get<bool>();
    }
    get_int("num_heads_q", c.num_heads_q);
    if (!get_int("num_heads_kv", c.num_heads_kv)) c.num_heads_kv = c.num_heads_q;
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
    std::string d = dv() == head_dim_qk ? fmt::format("d{}", head_dim_qk) : fmt::format("d{}/{}", head_dim_qk, dv());
    return fmt::format("{} {} {} h{}:{}{}{}", d, to_string(dtype), causal ? "causal" : "noncausal", num_heads_q,
                       num_heads_kv, softmax_scale ? fmt::format(" scale={}", *softmax_scale) : "",
                       arch.empty() ? "" : " " + arch);
}

}  // namespace rtattn
