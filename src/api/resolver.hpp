// The one resolver: AttentionConfig -> arch resolved, planned, rendered, keyed. The Runtime owns one; the CLI and the
// bench build one from the same options where they must not open a cache (`rtattn render`, `info`).
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "render/render.hpp"
#include "core/runtime.hpp"

namespace rtattn {

// A config as the Runtime serves it.
struct Resolved {
    AttentionConfig config;  // arch resolved
    plan::KernelPlan plan;
    render::RenderedSource source;
    std::string key;  // the cache key
};

// A config's backward as the Runtime serves it.
struct ResolvedBackward {
    AttentionConfig config;  // arch resolved
    plan::BackwardPlan plan;
    render::RenderedSource source;
    std::string key;
};

// The plan options that RuntimeOptions describe: its tile override, else RTATTN_TILE, and RTATTN_BWD_TILE (read here,
// once per Runtime).
plan::PlanOptions plan_options(const RuntimeOptions& options);

class Resolver {
public:
    explicit Resolver(plan::PlanOptions options) : options_(std::move(options)) {}
    // Thread-safe; each config is resolved once, and each kernel (configs differing only in heads or softmax scale,
    // which the source does not depend on) planned, rendered and hashed once. An empty arch means the current device.
    std::shared_ptr<const Resolved> resolve(AttentionConfig c);
    // The backward kernels of a config: planned, rendered and hashed once per config.
    std::shared_ptr<const ResolvedBackward> resolve_backward(AttentionConfig c);
    const plan::PlanOptions& options() const { return options_; }
    // Configs remembered now (bounded: a caller sweeping scales or head counts starts it over).
    std::size_t memo_entries() {
        std::lock_guard<std::mutex> lock(mu_);
        return by_config_.size() + by_kernel_.size() + backward_.size();
    }

private:
    plan::PlanOptions options_;
    std::mutex mu_;
    std::map<std::string, std::shared_ptr<const Resolved>> by_config_, by_kernel_;
    std::map<std::string, std::shared_ptr<const ResolvedBackward>> backward_;
};

// The arch of the current device, for a config that names none. Throws ConfigError("arch") when there is no GPU or
// the library does not support it (`c` is validated first, so that a bad field is the error reported).
std::string device_arch(const AttentionConfig& c);

// SHA-256 over the rendered source, NVRTC options and version, arch, library and entry-format versions.
std::string cache_key(const render::RenderedSource& src, const std::string& arch);

}  // namespace rtattn
