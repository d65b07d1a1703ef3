#include "api/resolver.hpp"

#include <cstdlib>

#include "arch/arch.hpp"
#include "cache/entry_file.hpp"
#include "compile/compile.hpp"
#include "driver/driver.hpp"
#include "kernels/backward.hpp"
#include "kernels/forward.hpp"
#include "core/errors.hpp"
#include "util/sha256.hpp"
#include "util/format.hpp"

namespace rtattn {

plan::PlanOptions plan_options(const RuntimeOptions& options) {
    plan::PlanOptions o;
    if (!options.tile_override.empty()) {
        o.tile_override = options.tile_override;
    } else if (const char* env = std::getenv("RTATTN_TILE")) {
        o.tile_override = env, o.tile_field = "RTATTN_TILE";
    }
    if (const char* env = std::getenv("RTATTN_BWD_TILE")) o.backward_tile_override = env;
    if (const char* env = std::getenv("RTATTN_ROWS")) o.rows = env, o.rows_field = "RTATTN_ROWS";
    return o;
}

namespace {

// The memo's key for a config: its JSON, which holds every field exactly (a finite double prints with enough digits to
// read back the same bits). Only valid configs get here, so no NaN or infinity prints as null and meets a valid
// config's entry.
std::string memo_key(AttentionConfig& c) {
    c.validate();
    if (c.arch.empty()) c.arch = device_arch(c);
    return c.to_json();
}

// Configs differing in heads or scale are distinct entries that share their kernel's: a caller sweeping scales or
// head counts must not grow the memo without bound, so past this many it starts again (entries are shared_ptrs, and
// whoever holds one keeps it).
constexpr std::size_t kMaxMemoEntries = 4096;

template <class Map, class Value>
const Value& remember(Map& memo, const std::string& key, Value v) {
    if (memo.size() >= kMaxMemoEntries) memo.clear();
    return memo.emplace(key, std::move(v)).first->second;
}

}  // namespace

std::shared_ptr<const Resolved> Resolver::resolve(AttentionConfig c) {
    const std::string config_key = memo_key(c);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = by_config_.find(config_key); it != by_config_.end()) return it->second;
    }
    // The kernel-relevant part: heads (but for whether packed K/V rows are 16-byte multiples) and the softmax scale
    // are launch parameters.
    const std::string kernel_key = plan::kernel_relevant(c).to_json();
    std::shared_ptr<const Resolved> same_kernel;
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = by_kernel_.find(kernel_key); it != by_kernel_.end()) same_kernel = it->second;
    }
    auto r = std::make_shared<Resolved>();
    if (same_kernel) {
        *r = *same_kernel;
    } else {
        r->plan = plan::plan(c, options_);
        r->source = kernels::render_plan(r->plan);
        r->key = cache_key(r->source, c.arch);
    }
    r->config = std::move(c);
    std::lock_guard<std::mutex> lock(mu_);
    remember(by_kernel_, kernel_key, std::shared_ptr<const Resolved>(r));
    return remember(by_config_, config_key, std::shared_ptr<const Resolved>(std::move(r)));
}

std::shared_ptr<const ResolvedBackward> Resolver::resolve_backward(AttentionConfig c) {
    const std::string config_key = memo_key(c);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = backward_.find(config_key); it != backward_.end()) return it->second;
    }
    auto r = std::make_shared<ResolvedBackward>();
    r->plan = plan::plan_backward(c, options_.backward_tile_override);
    r->source = kernels::render_backward(r->plan);
    r->key = cache_key(r->source, c.arch);
    r->config = std::move(c);
    std::lock_guard<std::mutex> lock(mu_);
    return remember(backward_, config_key, std::shared_ptr<const ResolvedBackward>(std::move(r)));
}

std::string device_arch(const AttentionConfig& c) {
    if (!driver::gpu_available()) {
        c.validate();  // a bad field is the better error
        throw ConfigError("arch", "is empty (meaning: the current device), but no GPU is available; give an explicit "
                                  "arch (" + known_archs() + ") to precompile without one");
    }
    const auto dev = driver::current_device();
    const std::string name = dev.arch();
    if (!arch::find(name))
        throw ConfigError("arch", util::format("device {} is {}, which rtattn does not support; supported: {}",
                                               dev.name, name, known_archs()));
    return name;
}

std::string cache_key(const render::RenderedSource& src, const std::string& arch) {
    // Everything that can change the cubin: the exact source, options, compiler, target, library and format.
    util::Sha256 h;
    h.field("rtattn-cache-key")
        .field(src.full_text())
        .field(compile::join_options(compile::options_for(arch)))
        .field(compile::nvrtc_version())
        .field(arch)
        .field(RTATTN_VERSION)
        .field(std::to_string(cache::kFormatVersion));
    return util::to_hex(h.finish());
}

}  // namespace rtattn
