// `rtattn precompile`: compile configs (from manifests, from --head-dim flags, or the default manifest) into the disk
// cache, in parallel, with progress; or, with --cache-only, check that every one is there.
#include <CLI/CLI.hpp>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <thread>

#include "api/runtime_internal.hpp"
#include "common.hpp"
#include "progress.hpp"
#include "util/format.hpp"

namespace rtattn::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct PrecompileArgs {
    std::vector<std::string> manifests;
    ConfigFlagOptions config;
    int jobs = 0;
    bool json = false;
    bool cache_only = false;
    std::string pass;  // empty: each manifest entry's own (forward by default)
};

// One thing to build: a config's forward kernel or its backward kernel set.
struct Item {
    AttentionConfig config;
    bool backward = false;
    std::string describe() const { return config.describe() + (backward ? " (backward)" : ""); }
};

tool::ManifestError manifest_not_found(const std::string& name) {
    const auto dirs = tool::manifest_dirs();
    const std::string searched = dirs.empty() ? std::string("none") : util::format("{}", fmt::join(dirs, ", "));
    return {name, "manifest",
            util::format("no such file, and no manifest of that name in the manifest directories ({}); set "
                         "RTATTN_MANIFEST_DIR or give a path",
                         searched)};
}

// Manifests and --head-dim flags together, deduplicated, forward kernels first; the default manifest when neither is
// given. --arch and --pass retarget manifest entries too, so `rtattn precompile --arch sm_90a --pass both`
// precompiles the defaults' forward and backward kernels for Hopper only.
std::vector<Item> precompile_items(const std::vector<std::string>& manifests, const tool::ConfigFlags& flags,
                                   const std::string& pass) {
    if (flags.any_shape_flag() && flags.head_dims.empty())
        throw ConfigError("head_dim", "--dtype, --causal, --head-dim-v, --heads-q, --heads-kv and --softmax-scale "
                                      "shape the configs built from --head-dim; add --head-dim (manifest entries set "
                                      "these fields themselves)");
    std::vector<std::string> names = manifests;
    if (names.empty() && flags.head_dims.empty()) names.push_back("default");
    tool::ExpandOptions opts = resolve_arch();
    opts.archs = flags.archs;
    opts.pass = pass;
    tool::UniqueConfigs forward, backward;
    for (const auto& name : names) {
        const std::string path = tool::find_manifest(name);
        if (path.empty()) throw manifest_not_found(name);
        const auto m = tool::load_manifest(path, opts);
        forward.add_all(m.configs);
        backward.add_all(m.backward_configs);
    }
    if (!flags.head_dims.empty()) {
        const auto x = tool::expand_flag_passes(flags, opts);
        forward.add_all(x.forward);
        backward.add_all(x.backward);
    }
    std::vector<Item> items;
    for (auto& c : forward.take()) items.push_back({std::move(c), false});
    for (auto& c : backward.take()) items.push_back({std::move(c), true});
    return items;
}

struct Outcome {
    // not_stored: compiled, but the disk cache did not take it (full, read-only, a lock not obtained): a failure of
    // precompile, whose whole point is the stored cubin.
    enum class Status { compiled, cached, not_stored, failed };
    Status status = Status::failed;
    KernelInfo info;
    double seconds = 0;
    std::string error;
};

const char* status_name(Outcome::Status s, bool cache_only) {
    switch (s) {
        case Outcome::Status::compiled: return "compiled";
        case Outcome::Status::cached: return cache_only ? "present" : "cached";
        case Outcome::Status::not_stored: return "not stored";
        case Outcome::Status::failed: return cache_only ? "missing" : "failed";
    }
    return "?";
}

Outcome precompile_one(Runtime& rt, const Item& item) {
    Outcome o;
    const auto t0 = Clock::now();
    try {
        o.info = item.backward ? rt.precompile_backward(item.config) : rt.precompile(item.config);
        o.status = o.info.from_cache ? Outcome::Status::cached : Outcome::Status::compiled;
    } catch (const CacheError& e) {
        o.status = Outcome::Status::not_stored;
        o.error = e.what();
    } catch (const std::exception& e) {
        o.error = e.what();
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return o;
}

// How many configs need a compile: those whose entry file is not on disk yet (the progress line's ETA).
std::size_t compile_work(Runtime& rt, const std::vector<Item>& items, const cache::DiskCache& disk) {
    std::size_t n = 0;
    for (const auto& item : items) {
        std::error_code ec;
        const std::string& key =
            item.backward ? resolve_backward(rt, item.config)->key : resolve(rt, item.config)->key;
        const std::string path = disk.entry_path(key);
        n += !std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec));
    }
    return n;
}

// Runs `jobs` workers over the configs; the Runtime's single flight makes configs that share a cubin wait for one
// compile instead of racing.
std::vector<Outcome> run_precompile(Runtime& rt, const std::vector<Item>& configs, int jobs,
                                    Progress& progress, bool cache_only) {
    std::vector<Outcome> out(configs.size());
    std::atomic<std::size_t> next{0};
    const auto worker = [&] {
        for (std::size_t i; (i = next++) < configs.size();) {
            out[i] = precompile_one(rt, configs[i]);
            const auto s = out[i].status;
            // A spilling kernel says so here (the library logs a plan table's spills at info level only): its
            // spill stores and loads, in bytes.
            const int spills = out[i].info.spill_bytes;
            progress.finished(configs[i].describe() + (spills > 0 ? util::format(" ({} B spilled)", spills) : ""),
                              status_name(s, cache_only),
                              s == Outcome::Status::compiled || s == Outcome::Status::not_stored,
                              s == Outcome::Status::failed || s == Outcome::Status::not_stored);
        }
    };
    std::vector<std::thread> threads;
    const std::size_t n = std::min<std::size_t>(std::size_t(jobs), configs.size());
    for (std::size_t t = 0; t < n; ++t) {
        try {
            threads.emplace_back(worker);
        } catch (const std::system_error&) {
            if (threads.empty()) throw;
            break;  // out of threads: the ones running still finish every config
        }
    }
    for (auto& t : threads) t.join();
    progress.close();
    return out;
}

void print_summary(const std::vector<Item>& configs, const std::vector<Outcome>& outcomes, double seconds,
                   const std::string& dir, bool cache_only, bool as_json) {
    const auto count = [&](Outcome::Status s) {
        return std::count_if(outcomes.begin(), outcomes.end(), [s](const Outcome& o) { return o.status == s; });
    };
    const auto n_compiled = count(Outcome::Status::compiled), n_cached = count(Outcome::Status::cached),
               n_not_stored = count(Outcome::Status::not_stored), n_failed = count(Outcome::Status::failed);
    if (as_json) {
        json j;
        j["total"] = configs.size();
        j["compiled"] = n_compiled;
        j["cached"] = n_cached;
        j["not_stored"] = n_not_stored;
        j["failed"] = n_failed;
        j["seconds"] = seconds;
        j["cache_only"] = cache_only;
        j["cache_dir"] = dir;
        j["configs"] = json::array();
        for (std::size_t i = 0; i < configs.size(); ++i) {
            const auto& o = outcomes[i];
            json e;
            e["config"] = json::parse(configs[i].config.to_json());
            e["pass"] = configs[i].backward ? "backward" : "forward";
            e["describe"] = configs[i].describe();
            e["status"] = o.status == Outcome::Status::not_stored ? "not_stored" : status_name(o.status, false);
            e["seconds"] = o.seconds;
            if (!o.error.empty()) {
                e["error"] = o.error;
            } else {
                e["key"] = o.info.key;
                e["registers"] = figure_json(o.info.registers);
                e["spill_bytes"] = figure_json(o.info.spill_bytes);
            }
            j["configs"].push_back(std::move(e));
        }
        util::print("{}\n", dump(std::move(j)));
        return;
    }
    if (cache_only)
        util::print("checked {} config(s) in {}: {} present, {} missing (cache: {})\n", configs.size(),
                    human_seconds(seconds), n_cached, n_failed, dir);
    else
        util::print("precompiled {} config(s) in {}: {} compiled, {} cached, {} not stored, {} failed (cache: {})\n",
                    configs.size(), human_seconds(seconds), n_compiled, n_cached, n_not_stored, n_failed, dir);
    for (std::size_t i = 0; i < configs.size(); ++i)
        if (!outcomes[i].error.empty())
            util::print("{}: {}\n  {}\n", status_name(outcomes[i].status, cache_only), configs[i].describe(),
                        outcomes[i].error);
}

int run(const GlobalOptions& g, const PrecompileArgs& a) {
    if (a.jobs < 0)
        throw ConfigError("--jobs",
                          util::format("{} is not allowed; give 1 or more (0: one per hardware thread)", a.jobs));
    const auto configs = precompile_items(a.manifests, a.config.get(), a.pass);

    // The Runtime logs through the progress display, which exists only once the work is known: forward to it.
    Progress* shown = nullptr;
    std::mutex early_mu;
    RuntimeOptions ro = runtime_options(g);
    ro.mode = a.cache_only ? CacheMode::cache_only : CacheMode::jit;
    ro.max_concurrent_compiles = a.jobs;
    ro.log_sink = [&](LogLevel l, const std::string& m) {
        std::lock_guard<std::mutex> lock(early_mu);
        if (shown) return shown->log(l, m);
        static const char* names[] = {"", "warning", "info", "debug"};
        util::print(stderr, "rtattn {}: {}\n", names[static_cast<int>(l)], m);
    };
    Runtime rt(ro);
    const bool cache_only = rt.options().mode == CacheMode::cache_only;  // or RTATTN_CACHE_ONLY=1
    const auto stats = rt.stats();
    // A memory-only cache would "succeed" and keep nothing: that is a cache failure, not a precompile.
    if (!stats.disk_enabled)
        throw CacheError(util::format("the disk cache{} cannot be used (see the warning above); nothing would be kept",
                                      stats.dir.empty() ? "" : " at " + stats.dir));
    // More workers than the library's compile slots would only wait (and 64 NVRTC runs on 2 cores take GBs).
    const int jobs = rt.options().max_concurrent_compiles;
    if (a.jobs > jobs)
        ro.log_sink(LogLevel::warn, util::format("-j {} capped at {}: the library runs at most one NVRTC compile per "
                                                 "hardware thread ({} here), each taking 100s of MB",
                                                 a.jobs, jobs, std::thread::hardware_concurrency()));
    const auto disk = open_disk_cache(g);
    Progress progress(configs.size(), cache_only ? 0 : compile_work(rt, configs, *disk),
                      log_level(g) != LogLevel::quiet, cache_only);
    {
        std::lock_guard<std::mutex> lock(early_mu);
        shown = &progress;
    }

    const auto t0 = Clock::now();
    const auto outcomes = run_precompile(rt, configs, jobs, progress, cache_only);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    {
        std::lock_guard<std::mutex> lock(early_mu);
        shown = nullptr;
    }
    print_summary(configs, outcomes, seconds, stats.dir, cache_only, a.json);
    const bool any_failed = std::any_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) {
        return o.status == Outcome::Status::failed || o.status == Outcome::Status::not_stored;
    });
    return any_failed ? kWorkFailed : kOk;
}

}  // namespace

void add_precompile(CLI::App& app, const GlobalOptions& g, Action& action) {
    auto a = std::make_shared<PrecompileArgs>();
    auto* cmd = app.add_subcommand("precompile", "compile configs into the disk cache: from manifests, from "
                                                 "--head-dim flags, or (neither given) the default manifest");
    cmd->add_option("manifests", a->manifests, "manifest files, or names of manifests in the manifest directories "
                                               "(e.g. default)")
        ->type_name("MANIFEST");
    add_config_flags(cmd, a->config, /*lists=*/true);
    cmd->add_option("-j,--jobs", a->jobs, "parallel compiles (default: one per hardware thread, at most 8; never more "
                                          "than the hardware threads)")
        ->type_name("N");
    cmd->add_option("--pass", a->pass, "which kernels of each config: forward, backward (the training kernels) or both "
                                       "(default: forward, or each manifest entry's \"pass\")")
        ->type_name("PASS")
        ->check(CLI::IsMember({"forward", "backward", "both"}));
    cmd->add_flag("--json", a->json, "print a JSON summary on stdout (progress stays on stderr)");
    cmd->add_flag("--cache-only", a->cache_only, "compile nothing; only check that every config is cached (also RTATTN_CACHE_ONLY=1)");
    cmd->callback([&action, &g, a] { action = [&g, a] { return run(g, *a); }; });
}

}  // namespace rtattn::cli
