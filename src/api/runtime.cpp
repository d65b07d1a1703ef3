// Runtime: the one place where the stages meet. config -> plan -> render -> key -> cache(compile) -> load.
#include "util/format.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <semaphore>
#include <thread>

#include "api/kernel_impl.hpp"
#include "api/resolver.hpp"
#include "api/runtime_internal.hpp"
#include "arch/arch.hpp"
#include "cache/cache.hpp"
#include "compile/compile.hpp"
#include "kernels/forward.hpp"
#include "render/render.hpp"
#include "core/errors.hpp"
#include "util/env.hpp"
#include "util/json_input.hpp"
#include "util/sha256.hpp"

namespace rtattn {

const char* core::version() noexcept { return RTATTN_VERSION; }

bool arch_runs_on(const std::string& name, const driver::DeviceInfo& dev) {
    return arch::runs_on(arch::get(name), dev.cc_major, dev.cc_minor);
}

namespace {

// The options as they take effect: the environment's opt-ins applied, ranges checked, the compile bound resolved.
RuntimeOptions effective_options(RuntimeOptions o) {
    if (o.max_concurrent_compiles < 0)
        throw ConfigError("max_concurrent_compiles",
                          util::format("{} is not allowed; give 1 or more, or 0 for one per hardware thread",
                                       o.max_concurrent_compiles));
    if (!(o.lock_timeout_seconds >= 0 && o.lock_timeout_seconds <= 86400))
        throw ConfigError("lock_timeout_seconds",
                          util::format("{} is out of range; allowed 0..86400", o.lock_timeout_seconds));
    const int hardware = std::max(1, int(std::thread::hardware_concurrency()));
    o.max_concurrent_compiles =
        o.max_concurrent_compiles == 0 ? std::min(hardware, 8) : std::min(o.max_concurrent_compiles, hardware);
    // A server's operator configures by environment: these override what the program set (README: Environment).
    if (util::env_flag("RTATTN_CACHE_ONLY").value_or(false)) o.mode = CacheMode::cache_only;
    if (const auto level = util::env_log_level()) o.log_level = *level;
    o.shared_cache = o.shared_cache || util::env_flag("RTATTN_SHARED_CACHE").value_or(false);
    return o;
}

cache::DiskOptions disk_options(const RuntimeOptions& o) {
    cache::DiskOptions d;
    d.max_bytes = o.max_cache_bytes;
    d.trust.shared = o.shared_cache;
    d.lock_timeout = std::chrono::milliseconds(std::int64_t(o.lock_timeout_seconds * 1000));
    return d;
}

}  // namespace

struct Runtime::Impl {
    RuntimeOptions options;
    Resolver resolver;
    util::Logger log;
    cache::KernelCache cache;
    std::counting_semaphore<64> compile_slots;
    std::mutex compile_time_mu;
    double compile_seconds = 0;  // NVRTC only: the cache's own timer would include waits for a slot
    std::mutex modules_mu;
    std::map<std::pair<CUcontext, std::string>, std::shared_ptr<driver::Module>> modules;

    explicit Impl(const RuntimeOptions& o)
        : options(effective_options(o)),
          resolver(plan_options(options)),
          log(options.log_level, options.log_sink),
          cache(options.cache_dir, disk_options(options), log),
          compile_slots(std::min(options.max_concurrent_compiles, 64)) {}

    // What one cache entry is built from: a forward or a backward module.
    struct Buildable {
        const AttentionConfig& config;
        const render::RenderedSource& source;
        const std::string& key;
        std::string plan_json;
        PlanSummary summary;
        const char* pass;  // "forward" or "backward"
        bool overridden;   // the plan's (KernelPlan::overridden): its spills are warnings, the table's info
    };

    cache::KernelCache::Lookup fetch(const Buildable& b) {
        const std::string what = b.config.describe() + (std::string(b.pass) == "backward" ? " backward" : "");
        cache::KernelCache::Builder build;
        if (options.mode == CacheMode::jit) {
            build = [&]() {
                compile_slots.acquire();
                struct Release {
                    std::counting_semaphore<64>& s;
                    ~Release() { s.release(); }
                } release{compile_slots};
                log.info(util::format("compiling {} (key {})", what, b.key.substr(0, 12)));
                const auto out = compile::compile(b.source, b.config.arch);
                {
                    std::lock_guard<std::mutex> lock(compile_time_mu);
                    compile_seconds += out.seconds;
                }
                // The table's spilling tiles are kept where they measured faster (README, known spills): no warning
                // for a kernel the library chose itself, only for an override's.
                if (out.ptxas.spill_store_bytes > 0)
                    log.log(b.overridden ? LogLevel::warn : LogLevel::info,
                            util::format("{}: ptxas reports {} bytes of spill stores{}", what,
                                         out.ptxas.spill_store_bytes,
                                         b.overridden ? " (a tuning override's tile)" : " (the plan table's tile)"));
                nlohmann::ordered_json info;
                info["config"] = nlohmann::json::parse(b.config.to_json());
                info["pass"] = b.pass;
                info["plan"] = nlohmann::json::parse(b.plan_json);
                info["registers"] = out.ptxas.registers;
                // -1 (unknown) when NVRTC gave no ptxas report (the driver's JIT cache served the compile).
                info["spill_bytes"] = out.ptxas.spill_store_bytes < 0 || out.ptxas.spill_load_bytes < 0
                                          ? -1
                                          : out.ptxas.spill_store_bytes + out.ptxas.spill_load_bytes;
                info["compile_seconds"] = out.seconds;
                info["nvrtc"] = compile::nvrtc_version();
                info["library"] = RTATTN_VERSION;
                return cache::Entry{b.key, b.config.arch, out.cubin, info.dump()};
            };
        }
        return cache.get(b.key, b.config.arch, build, what);
    }

    KernelInfo make_info(const Buildable& b, const cache::KernelCache::Lookup& got) const {
        KernelInfo info;
        info.key = b.key;
        info.arch = b.config.arch;
        info.plan = b.summary;
        info.from_cache = got.source != cache::Source::compiled;
        // The cache verified the info's field types (cache::info_problem), so these reads cannot throw.
        nlohmann::json j;
        if (util::parse_json(got.entry->info_json, &j).empty() && j.is_object()) {
            info.registers = j.value("registers", -1);
            info.spill_bytes = j.value("spill_bytes", -1);
        }
        return info;
    }

    static Buildable buildable(const Resolved& r) {
        return {r.config, r.source, r.key, plan::plan_json(r.plan), r.plan.summary(), "forward", r.plan.overridden};
    }
    static Buildable buildable(const ResolvedBackward& r) {
        return {r.config, r.source, r.key, plan::backward_plan_json(r.plan), r.plan.summary(), "backward",
                r.plan.overridden};
    }

    // Makes sure the entry is on disk: CacheError when it was compiled but could not be stored.
    KernelInfo precompile(const Buildable& b) {
        const auto got = fetch(b);
        if (!got.not_stored.empty())
            throw CacheError(util::format("{}{}: compiled, but not stored in the disk cache at {}: {}. This process "
                                          "serves it from memory; others will compile it again",
                                          b.config.describe(), std::string(b.pass) == "backward" ? " backward" : "",
                                          cache.disk().dir(), got.not_stored));
        return make_info(b, got);
    }

    // Loads a module into the current context, once per context and key.
    std::shared_ptr<driver::Module> module_for(const Buildable& b, const cache::KernelCache::Lookup& got,
                                               int smem_bytes, const driver::DeviceInfo& dev) {
        std::lock_guard<std::mutex> lock(modules_mu);
        auto& m = modules[{dev.context, b.key}];
        if (!m) m = driver::load(got.entry->cubin, b.source.entries, smem_bytes);
        return m;
    }
};

namespace {

// Throws when `arch`'s code cannot run on the current device, or its shared memory does not fit there.
driver::DeviceInfo device_for(const std::string& arch, int smem_bytes) {
    const auto dev = driver::current_device();
    if (!arch_runs_on(arch, dev))
        throw ConfigError("arch", util::format("{} code cannot run on {} (compute capability {}.{}); use {} or leave "
                                               "arch empty",
                                               arch, dev.name, dev.cc_major, dev.cc_minor, dev.arch()));
    if (smem_bytes > dev.smem_optin)
        throw ConfigError("arch", util::format("the plan needs {} B of shared memory; {} allows {} B per block",
                                               smem_bytes, dev.name, dev.smem_optin));
    return dev;
}

// NVRTC omits the ptxas report when the driver's JIT cache served the compile; the loaded function knows.
void registers_from_module(KernelInfo& info, const driver::Module& m) {
    if (info.registers >= 0) return;
    int regs = -1;
    if (driver::api().cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, m.functions.at(0)) == CUDA_SUCCESS)
        info.registers = regs;
}

// CTAs of one kernel an SM holds: bounded by shared memory (1 KB reserved per CTA), threads and registers.
int ctas_per_sm(const driver::DeviceInfo& dev, int smem_bytes, int threads, int registers) {
    int n = std::min((dev.smem_optin + 1024) / (smem_bytes + 1024), 2048 / threads);
    if (registers > 0) n = std::min(n, 65536 / (registers * threads));
    return std::max(1, n);
}

}  // namespace

Runtime::Runtime(RuntimeOptions options) : impl_(std::make_shared<Impl>(options)) {}
Runtime::~Runtime() = default;

std::shared_ptr<const Resolved> resolve(Runtime& rt, const AttentionConfig& config) {
    return rt.impl().resolver.resolve(config);
}

std::shared_ptr<const ResolvedBackward> resolve_backward(Runtime& rt, const AttentionConfig& config) {
    return rt.impl().resolver.resolve_backward(config);
}

const RuntimeOptions& Runtime::options() const { return impl_->options; }

KernelInfo Runtime::precompile(const AttentionConfig& config) {
    const auto r = impl_->resolver.resolve(config);
    return impl_->precompile(Impl::buildable(*r));
}

KernelInfo Runtime::precompile_backward(const AttentionConfig& config) {
    const auto r = impl_->resolver.resolve_backward(config);
    return impl_->precompile(Impl::buildable(*r));
}

std::shared_ptr<const Kernel::Impl> get_kernel(const std::shared_ptr<Runtime::Impl>& rt,
                                               const AttentionConfig& config) {
    const auto r = rt->resolver.resolve(config);
    const auto dev = device_for(r->config.arch, r->plan.smem_bytes);
    const auto b = Runtime::Impl::buildable(*r);
    const auto got = rt->fetch(b);
    auto impl = std::make_shared<Kernel::Impl>();
    impl->module = rt->module_for(b, got, r->plan.smem_bytes, dev);
    impl->info = rt->make_info(b, got);
    registers_from_module(impl->info, *impl->module);
    impl->config = r->config;
    impl->plan = r->plan;
    impl->resident_ctas = dev.sms * ctas_per_sm(dev, r->plan.smem_bytes, r->plan.threads(), impl->info.registers);
    impl->runtime = rt;
    return impl;
}

Kernel Runtime::get(const AttentionConfig& config) { return Kernel(get_kernel(impl_, config)); }

BackwardKernel Runtime::get_backward(const AttentionConfig& config) {
    const auto r = impl_->resolver.resolve_backward(config);
    const auto dev = device_for(r->config.arch, r->plan.smem_bytes);
    const auto b = Impl::buildable(*r);
    const auto got = impl_->fetch(b);
    auto impl = std::make_shared<BackwardKernel::Impl>();
    impl->module = impl_->module_for(b, got, r->plan.smem_bytes, dev);
    impl->info = impl_->make_info(b, got);
    registers_from_module(impl->info, *impl->module);
    impl->config = r->config;
    impl->plan = r->plan;
    return BackwardKernel(std::move(impl));
}

CacheStats Runtime::stats() const {
    const auto c = impl_->cache.counters();
    CacheStats s;
    s.memory_hits = c.memory_hits;
    s.disk_hits = c.disk_hits;
    s.misses = c.misses;
    s.compiles = c.compiles;
    {
        std::lock_guard<std::mutex> lock(impl_->compile_time_mu);
        s.compile_seconds = impl_->compile_seconds;
    }
    s.bad_entries = c.bad_entries;
    s.bytes_written = c.bytes_written;
    s.evictions = impl_->cache.disk().evictions();
    s.disk_enabled = impl_->cache.disk().enabled();
    s.disk_bytes = s.disk_enabled ? impl_->cache.disk().total_bytes() : 0;
    s.dir = impl_->cache.disk().dir();
    return s;
}

}  // namespace rtattn
