#include "common.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <ctime>

#include "api/resolver.hpp"
#include "util/env.hpp"
#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::cli {

LogLevel log_level(const GlobalOptions& g) {
    if (!g.log_level.empty()) return util::parse_log_level(g.log_level, "--log-level");
    return util::env_log_level().value_or(LogLevel::warn);
}

RuntimeOptions runtime_options(const GlobalOptions& g) {
    RuntimeOptions ro;
    ro.cache_dir = g.cache_dir;
    ro.log_level = log_level(g);
    ro.shared_cache = g.shared_cache;
    ro.lock_timeout_seconds = g.lock_timeout;
    return ro;
}

std::unique_ptr<cache::DiskCache> open_disk_cache(const GlobalOptions& g) {
    cache::DiskOptions o;
    o.create = false;
    o.trust.shared = g.shared_cache || util::env_flag("RTATTN_SHARED_CACHE").value_or(false);
    return std::make_unique<cache::DiskCache>(g.cache_dir, o, util::Logger(log_level(g), nullptr));
}

tool::ConfigFlags ConfigFlagOptions::get() const {
    tool::ConfigFlags f = flags;
    if (head_dim_v_opt->count()) f.head_dim_v = head_dim_v;
    if (heads_q_opt->count()) f.heads_q = heads_q;
    if (heads_kv_opt->count()) f.heads_kv = heads_kv;
    if (scale_opt->count()) f.softmax_scale = softmax_scale;
    return f;
}

void add_config_flags(CLI::App* app, ConfigFlagOptions& o, bool lists) {
    const std::string many = lists ? " (comma-separated list)" : "";
    const auto list_option = [&](const char* name, auto& target, const std::string& help, const char* type) {
        // One value per occurrence (split at commas), so a flag never swallows a following manifest argument.
        return app->add_option(name, target, help + many)->delimiter(',')->allow_extra_args(false)->type_name(type);
    };
    const std::string head_dim_help = lists ? "head dims (QK), e.g. 64,80,128,132" : "head dim (QK), e.g. 128";
    list_option("--head-dim", o.flags.head_dims, head_dim_help, "D");
    list_option("--dtype", o.flags.dtypes, "bf16 or fp16", "DTYPE");
    list_option("--arch", o.flags.archs,
                "target arch: " + known_archs() + "; default: the current GPU" +
                    (lists ? "; also replaces the archs of manifest entries" : ""),
                "ARCH");
    app->add_option("--causal", o.flags.causal, lists ? "true, false or both" : "true or false")->type_name("BOOL");
    o.head_dim_v_opt = app->add_option("--head-dim-v", o.head_dim_v, "V head dim (default: the QK head dim)")
                           ->type_name("N");
    o.heads_q_opt = app->add_option("--heads-q", o.heads_q,
                                    "query heads (default 8; with --heads-kv, whether heads_kv x head_dim is a "
                                    "multiple of 8 picks the sm_90a kernel for head dims that are not)")
                        ->type_name("N");
    o.heads_kv_opt = app->add_option("--heads-kv", o.heads_kv, "K/V heads (default: --heads-q)")->type_name("N");
    o.scale_opt = app->add_option("--softmax-scale", o.softmax_scale, "softmax scale (default 1/sqrt(D))")
                      ->type_name("X");
    app->add_flag("--decode", o.flags.decode, "the decode kernels: 1..16 query tokens per sequence against a KV cache");
    app->add_flag("--paged-kv", o.flags.paged_kv, "K/V from a paged KV cache (decode, or prefill against the cache)");
    app->add_flag("--varlen", o.flags.varlen, "the packed variable-length prefill (cu_seqlens), forward and backward");
    app->add_flag("--local", o.flags.local,
                  "a sliding window (local attention), its bounds given per call: one kernel for every window");
    app->add_flag("--sinks", o.flags.sinks,
                  "attention sinks: a per-head logit, given per call, in every softmax denominator (gpt-oss)");
    app->add_flag("--softcap", o.flags.softcap,
                  "logit softcapping: scores cap * tanh(score / cap), the cap given per call (Gemma 2)");
    app->add_flag("--alibi", o.flags.alibi,
                  "ALiBi: scores minus slope * distance from the diagonal, the slopes given per call (MPT, BLOOM)");
}

const tool::ExpandOptions& resolve_arch() {
    // The Runtime's own rule for an empty arch (one place says what "the current GPU" is).
    static const tool::ExpandOptions options{{}, [] { return device_arch(AttentionConfig{}); }, ""};
    return options;
}

AttentionConfig single_config(const tool::ConfigFlags& f) {
    auto configs = tool::expand_flags(f, resolve_arch());
    if (configs.size() != 1)
        throw ConfigError("flags", util::format("this command takes one config, but the flags describe {}; give single "
                                                "values (lists are for precompile)",
                                                configs.size()));
    return configs[0];
}

std::string safe(const std::string& s) { return util::escaped(s); }

std::string dump(json j) {
    json out;
    out["schema_version"] = kJsonSchemaVersion;
    for (auto& [k, v] : j.items()) out[k] = std::move(v);
    return out.dump(2, ' ', false, json::error_handler_t::replace);
}

json figure_json(long long x) { return x < 0 ? json(nullptr) : json(x); }

std::string human_bytes(std::uint64_t b) {
    if (b < 1024) return util::format("{} B", b);
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = double(b) / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, ++u;
    return util::format("{:.1f} {}", v, units[u]);
}

std::string human_seconds(double s) {
    if (s < 10) return util::format("{:.2f}s", s);
    if (s < 60) return util::format("{:.1f}s", s);
    const long t = std::lround(s);
    if (t < 3600) return util::format("{}m{:02}s", t / 60, t % 60);
    return util::format("{}h{:02}m", t / 3600, t / 60 % 60);
}

std::string human_age(std::int64_t unix_seconds) {
    const std::int64_t age = std::int64_t(std::time(nullptr)) - unix_seconds;
    if (age < 60) return "just now";
    if (age < 3600) return util::format("{}m ago", age / 60);
    if (age < 86400) return util::format("{}h ago", age / 3600);
    return util::format("{}d ago", age / 86400);
}

std::string figure(int x, const char* unknown) { return x < 0 ? unknown : std::to_string(x); }

}  // namespace rtattn::cli
