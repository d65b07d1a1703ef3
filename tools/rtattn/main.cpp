// rtattn: the librtattn command-line tool. Precompiles configs into the disk cache, lists, verifies and trims the
// cache, and shows what the library renders and plans for a config. It needs no GPU except to default --arch.
//
// Exit codes (also printed by `rtattn --help`):
//   0  success
//   1  some work failed: a config failed to compile (or, with --cache-only, is missing); verify found bad entries
//   2  usage or config error: a bad flag, value or manifest field (the message names it)
//   3  cache error: the cache directory cannot be used
// Every rtattn::Error (and anything else thrown) is caught in main() and printed as "rtattn: error: ...";
// nothing here calls exit().
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <nlohmann/json.hpp>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "api/runtime_internal.hpp"
#include "bench.hpp"
#include "cache/cache.hpp"
#include "compile/compile.hpp"
#include "config/config_json.hpp"
#include "manifest.hpp"
#include "rtattn/rtattn.hpp"
#include "util/text.hpp"

namespace {

using json = nlohmann::ordered_json;
using rtattn::AttentionConfig;
using rtattn::ConfigError;
using rtattn::tool::ConfigFlags;
using Clock = std::chrono::steady_clock;

enum ExitCode : int { kOk = 0, kWorkFailed = 1, kUsage = 2, kCacheFailure = 3 };

constexpr const char* kFooter =
    "Exit codes:\n"
    "  0  success\n"
    "  1  some work failed (a config did not compile, or is missing with --cache-only; verify found bad entries)\n"
    "  2  usage or config error (a bad flag, value or manifest field; the message names it)\n"
    "  3  cache error (the cache directory cannot be used)";

// ---- options shared by the subcommands ---------------------------------------------------------------------------

struct GlobalOptions {
    std::string cache_dir;  // empty: the library's default resolution ($RTATTN_CACHE_DIR, XDG, ~/.cache)
    std::string log_level = "warn";
    bool shared_cache = false;  // or RTATTN_SHARED_CACHE=1
    double lock_timeout = 60;
};

rtattn::LogLevel log_level(const GlobalOptions& g) {
    if (g.log_level == "quiet") return rtattn::LogLevel::quiet;
    if (g.log_level == "info") return rtattn::LogLevel::info;
    if (g.log_level == "debug") return rtattn::LogLevel::debug;
    return rtattn::LogLevel::warn;
}

rtattn::util::Logger logger(const GlobalOptions& g) { return {log_level(g), nullptr}; }

// The cache as the maintenance commands see it: never created by them (ls, info and verify only look), trusted
// by the same rule as the library's. DiskCache holds an atomic, so it lives on the heap.
std::unique_ptr<rtattn::cache::DiskCache> open_disk_cache(const GlobalOptions& g) {
    rtattn::cache::DiskOptions o;
    o.create = false;
    o.trust.shared = g.shared_cache || rtattn::cache::shared_cache_from_env();
    return std::make_unique<rtattn::cache::DiskCache>(g.cache_dir, o, logger(g));
}

rtattn::RuntimeOptions runtime_options(const GlobalOptions& g) {
    rtattn::RuntimeOptions ro;
    ro.cache_dir = g.cache_dir;
    ro.log_level = log_level(g);
    ro.shared_cache = g.shared_cache;
    ro.lock_timeout_seconds = g.lock_timeout;
    return ro;
}

// Text read from cache entries or files, for a terminal: control characters escaped.
std::string safe(const std::string& s) { return rtattn::util::escaped(s); }

// JSON for stdout: invalid UTF-8 from a file is replaced, never a reason to fail the whole listing.
std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace); }

// Config flags as CLI11 fills them. CLI11 2.1 cannot fill std::optional, so whether a scalar flag was given is
// read from its Option afterwards.
struct ConfigFlagOptions {
    ConfigFlags flags;
    int head_dim_v = 0, heads_q = 0, heads_kv = 0;
    double softmax_scale = 0;
    CLI::Option *head_dim_v_opt = nullptr, *heads_q_opt = nullptr, *heads_kv_opt = nullptr, *scale_opt = nullptr;

    ConfigFlags get() const {
        ConfigFlags f = flags;
        if (head_dim_v_opt->count()) f.head_dim_v = head_dim_v;
        if (heads_q_opt->count()) f.heads_q = heads_q;
        if (heads_kv_opt->count()) f.heads_kv = heads_kv;
        if (scale_opt->count()) f.softmax_scale = softmax_scale;
        return f;
    }
};

// The one definition of the config flags. `lists`: the command expands comma-separated lists (precompile);
// otherwise the flags must describe exactly one config (checked by single_config()).
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
                "target arch: " + rtattn::known_archs() + "; default: the current GPU" +
                    (lists ? "; also replaces the archs of manifest entries" : ""),
                "ARCH");
    app->add_option("--causal", o.flags.causal, lists ? "true, false or both" : "true or false")->type_name("BOOL");
    o.head_dim_v_opt = app->add_option("--head-dim-v", o.head_dim_v, "V head dim (default: the QK head dim)")
                           ->type_name("N");
    o.heads_q_opt = app->add_option("--heads-q", o.heads_q, "query heads (default 1)")->type_name("N");
    o.heads_kv_opt = app->add_option("--heads-kv", o.heads_kv, "K/V heads (default: --heads-q)")->type_name("N");
    o.scale_opt = app->add_option("--softmax-scale", o.softmax_scale, "softmax scale (default 1/sqrt(D))")
                      ->type_name("X");
}

// A config without an arch means "the current device"; precompile, render and info need a concrete one. The
// manifest reader calls this while expanding, so a failure names the entry (or flag) it came from.
std::string current_arch() {
    if (!rtattn::driver::gpu_available())
        throw ConfigError("arch", "not given and there is no GPU to take it from; give an arch (" +
                                      rtattn::known_archs() + ")");
    const std::string arch = rtattn::driver::current_device().arch();
    if (!rtattn::is_known_arch(arch))
        throw ConfigError("arch", fmt::format("the current GPU is {}, which rtattn does not support; give an arch ({})",
                                              arch, rtattn::known_archs()));
    return arch;
}

const rtattn::tool::ExpandOptions kResolveArch{{}, current_arch};

// The single config that `render` and `info` describe.
AttentionConfig single_config(const ConfigFlags& f) {
    auto configs = rtattn::tool::expand_flags(f, kResolveArch);
    if (configs.size() != 1)
        throw ConfigError("flags", fmt::format("this command takes one config, but the flags describe {}; give single "
                                               "values (lists are for precompile)",
                                               configs.size()));
    return configs[0];
}

json config_json(const AttentionConfig& c) { return json::parse(c.to_json()); }

// ---- formatting --------------------------------------------------------------------------------------------------

std::string human_bytes(std::uint64_t b) {
    if (b < 1024) return fmt::format("{} B", b);
    const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
    double v = double(b) / 1024;
    int u = 0;
    while (v >= 1024 && u < 3) v /= 1024, ++u;
    return fmt::format("{:.1f} {}", v, units[u]);
}

std::string human_seconds(double s) {
    if (s < 10) return fmt::format("{:.2f}s", s);
    if (s < 60) return fmt::format("{:.1f}s", s);
    const long t = std::lround(s);
    if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
    return fmt::format("{}h{:02}m", t / 3600, t / 60 % 60);
}

// ptxas figures are -1 when the log had no report for the entry.
std::string figure(int x, const char* unknown = "unknown") { return x < 0 ? unknown : std::to_string(x); }

std::string human_age(std::int64_t unix_seconds) {
    const std::int64_t age = std::int64_t(std::time(nullptr)) - unix_seconds;
    if (age < 60) return "just now";
    if (age < 3600) return fmt::format("{}m ago", age / 60);
    if (age < 86400) return fmt::format("{}h ago", age / 3600);
    return fmt::format("{}d ago", age / 86400);
}

// ---- parsing of sizes and durations ------------------------------------------------------------------------------

// Splits "12.5G" into 12.5 and "g"; false when there is no leading non-negative number.
bool split_number(const std::string& text, double* number, std::string* suffix) {
    const char* begin = text.c_str();
    char* end = nullptr;
    *number = std::strtod(begin, &end);
    if (end == begin || !std::isfinite(*number) || *number < 0) return false;
    *suffix = std::string(end);
    std::transform(suffix->begin(), suffix->end(), suffix->begin(), [](unsigned char c) { return std::tolower(c); });
    return true;
}

// "500M", "2G", "1.5GiB", "4096": binary units, since cache sizes are compared with file sizes.
std::uint64_t parse_size(const std::string& text) {
    double n = 0;
    std::string unit;
    int shift = -1;
    if (split_number(text, &n, &unit)) {
        const std::pair<const char*, int> units[] = {{"", 0},    {"b", 0},    {"k", 10},   {"kb", 10}, {"kib", 10},
                                                     {"m", 20},  {"mb", 20},  {"mib", 20}, {"g", 30},  {"gb", 30},
                                                     {"gib", 30}, {"t", 40},  {"tb", 40},  {"tib", 40}};
        for (const auto& [name, s] : units)
            if (unit == name) shift = s;
    }
    const double bytes = n * double(1ull << std::max(shift, 0));
    if (shift < 0 || bytes >= 18446744073709551615.0)
        throw ConfigError("--max-size", fmt::format("'{}' is not a size; use bytes or a number with K, M, G or T "
                                                    "(powers of 1024), e.g. 500M or 2G",
                                                    text));
    return std::uint64_t(bytes);
}

// "7d", "12h", "30m", "45s", "3600".
std::int64_t parse_duration(const std::string& text) {
    double n = 0;
    std::string unit;
    double scale = -1;
    if (split_number(text, &n, &unit)) {
        const std::pair<const char*, double> units[] = {{"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400},
                                                        {"w", 604800}};
        for (const auto& [name, s] : units)
            if (unit == name) scale = s;
    }
    if (scale < 0 || n * scale > 1e15)
        throw ConfigError("--older-than", fmt::format("'{}' is not a duration; use seconds or a number with s, m, h, "
                                                      "d or w, e.g. 7d, 12h or 30m",
                                                      text));
    return std::int64_t(n * scale);
}

// ---- precompile --------------------------------------------------------------------------------------------------

struct PrecompileArgs {
    std::vector<std::string> manifests;
    ConfigFlagOptions config;
    int jobs = 0;
    bool json = false;
    bool cache_only = false;
};

rtattn::tool::ManifestError manifest_not_found(const std::string& name) {
    const auto dirs = rtattn::tool::manifest_dirs();
    const std::string searched = dirs.empty() ? std::string("none") : fmt::format("{}", fmt::join(dirs, ", "));
    return {name, "manifest",
            fmt::format("no such file, and no manifest of that name in the manifest directories ({}); set "
                        "RTATTN_MANIFEST_DIR or give a path",
                        searched)};
}

// Manifests and --head-dim flags together, deduplicated; the default manifest when neither is given. --arch
// retargets manifest entries too, so `rtattn precompile --arch sm_90a` precompiles the defaults for Hopper only.
std::vector<AttentionConfig> precompile_configs(const std::vector<std::string>& manifests, const ConfigFlags& flags) {
    if (flags.any_shape_flag() && flags.head_dims.empty())
        throw ConfigError("head_dim", "--dtype, --causal, --head-dim-v, --heads-q, --heads-kv and --softmax-scale "
                                      "shape the configs built from --head-dim; add --head-dim (manifest entries set "
                                      "these fields themselves)");
    std::vector<std::string> names = manifests;
    if (names.empty() && flags.head_dims.empty()) names.push_back("default");
    rtattn::tool::UniqueConfigs configs;
    for (const auto& name : names) {
        const std::string path = rtattn::tool::find_manifest(name);
        if (path.empty()) throw manifest_not_found(name);
        configs.add_all(rtattn::tool::load_manifest(path, {flags.archs, current_arch}).configs);
    }
    if (!flags.head_dims.empty()) configs.add_all(rtattn::tool::expand_flags(flags, kResolveArch));
    return configs.take();
}

struct Outcome {
    // not_stored: compiled, but the disk cache did not take it (full, read-only, a lock not obtained): a failure of
    // precompile, whose whole point is the stored cubin.
    enum class Status { compiled, cached, not_stored, failed };
    Status status = Status::failed;
    rtattn::KernelInfo info;
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

// Progress on stderr: on a terminal one line redrawn in place, otherwise (logs, CI) one line per finished config.
// Library log messages go through here too, so they never land in the middle of the progress line.
class Progress {
public:
    Progress(std::size_t total, bool enabled, bool cache_only)
        : total_(total), enabled_(enabled), cache_only_(cache_only), tty_(::isatty(STDERR_FILENO) == 1) {}

    void log(rtattn::LogLevel level, const std::string& msg) {
        static const char* names[] = {"", "warning", "info", "debug"};
        std::lock_guard<std::mutex> g(mu_);
        clear_line();
        fmt::print(stderr, "rtattn {}: {}\n", names[static_cast<int>(level)], msg);
        if (tty_ && shown_) draw(last_);  // a log file already has the last progress line
    }

    void finished(const AttentionConfig& c, const Outcome& o) {
        std::lock_guard<std::mutex> g(mu_);
        ++done_;
        if (o.status == Outcome::Status::failed || o.status == Outcome::Status::not_stored) ++failed_;
        if (!enabled_) return;
        // Errors are listed in full by the summary; here the config is enough to see where things stand.
        draw(fmt::format("{} {} ({})", status_name(o.status, cache_only_), c.describe(), human_seconds(o.seconds)));
    }

    // Ends the redrawn line so that what follows starts on a fresh one.
    void close() {
        std::lock_guard<std::mutex> g(mu_);
        if (tty_ && shown_) fmt::print(stderr, "\n");
        shown_ = false;
    }

private:
    static std::size_t terminal_width() {
        struct winsize ws {};
        return ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col : 80;
    }
    void clear_line() {
        if (tty_ && shown_) fmt::print(stderr, "\r\x1b[K");
    }
    void draw(const std::string& what) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
        // Wall-clock rate so far, which already reflects the number of parallel jobs.
        const double eta = done_ ? elapsed / double(done_) * double(total_ - done_) : 0;
        const std::string line = fmt::format("[{}/{}] {} {}, elapsed {}, ETA {}", done_, total_, failed_,
                                             cache_only_ ? "missing" : "failed", human_seconds(elapsed),
                                             human_seconds(eta));
        if (tty_) {
            clear_line();
            // A line wider than the terminal wraps, and \r then redraws only its last part.
            fmt::print(stderr, "\r{}", fmt::format("{}  {}", line, what).substr(0, terminal_width() - 1));
        } else {
            fmt::print(stderr, "{}  {}\n", line, what);
        }
        std::fflush(stderr);
        shown_ = true;
        last_ = what;
    }

    std::mutex mu_;
    const std::size_t total_;
    const bool enabled_, cache_only_, tty_;
    const Clock::time_point start_ = Clock::now();
    std::size_t done_ = 0, failed_ = 0;
    bool shown_ = false;
    std::string last_;
};

Outcome precompile_one(rtattn::Runtime& rt, const AttentionConfig& c) {
    Outcome o;
    const auto t0 = Clock::now();
    try {
        o.info = rt.precompile(c);
        o.status = o.info.from_cache ? Outcome::Status::cached : Outcome::Status::compiled;
    } catch (const rtattn::CacheError& e) {
        o.status = Outcome::Status::not_stored;
        o.error = e.what();
    } catch (const std::exception& e) {
        o.error = e.what();
    }
    o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return o;
}

// Runs `jobs` workers over the configs; the Runtime's single flight makes configs that share a cubin wait for one
// compile instead of racing.
std::vector<Outcome> run_precompile(rtattn::Runtime& rt, const std::vector<AttentionConfig>& configs, int jobs,
                                    Progress& progress) {
    std::vector<Outcome> out(configs.size());
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    std::mutex fatal_mu;
    std::exception_ptr fatal;
    const auto worker = [&] {
        for (std::size_t i; !stop && (i = next++) < configs.size();) {
            try {
                out[i] = precompile_one(rt, configs[i]);
                progress.finished(configs[i], out[i]);
            } catch (...) {
                std::lock_guard<std::mutex> g(fatal_mu);
                if (!fatal) fatal = std::current_exception();
                stop = true;
            }
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
    if (fatal) std::rethrow_exception(fatal);
    return out;
}

void print_precompile_summary(const std::vector<AttentionConfig>& configs, const std::vector<Outcome>& outcomes,
                              double seconds, const std::string& dir, bool cache_only, bool as_json) {
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
            e["config"] = config_json(configs[i]);
            e["describe"] = configs[i].describe();
            e["status"] = o.status == Outcome::Status::not_stored ? "not_stored" : status_name(o.status, false);
            e["seconds"] = o.seconds;
            if (!o.error.empty()) {
                e["error"] = o.error;
            } else {
                e["key"] = o.info.key;
                e["registers"] = o.info.registers;
                e["spill_bytes"] = o.info.spill_bytes;
            }
            j["configs"].push_back(std::move(e));
        }
        fmt::print("{}\n", dump(j));
        return;
    }
    if (cache_only)
        fmt::print("checked {} config(s) in {}: {} present, {} missing (cache: {})\n", configs.size(),
                   human_seconds(seconds), n_cached, n_failed, dir);
    else
        fmt::print("precompiled {} config(s) in {}: {} compiled, {} cached, {} not stored, {} failed (cache: {})\n",
                   configs.size(), human_seconds(seconds), n_compiled, n_cached, n_not_stored, n_failed, dir);
    for (std::size_t i = 0; i < configs.size(); ++i)
        if (!outcomes[i].error.empty())
            fmt::print("{}: {}\n  {}\n", status_name(outcomes[i].status, cache_only), configs[i].describe(),
                       outcomes[i].error);
}

int cmd_precompile(const GlobalOptions& g, const PrecompileArgs& a) {
    if (a.jobs < 0)
        throw ConfigError("--jobs",
                          fmt::format("{} is not allowed; give 1 or more (0: one per hardware thread)", a.jobs));
    const auto configs = precompile_configs(a.manifests, a.config.get());

    Progress progress(configs.size(), log_level(g) != rtattn::LogLevel::quiet, a.cache_only);
    rtattn::RuntimeOptions ro = runtime_options(g);
    ro.mode = a.cache_only ? rtattn::CacheMode::cache_only : rtattn::CacheMode::jit;
    ro.max_concurrent_compiles = a.jobs;
    ro.log_sink = [&progress](rtattn::LogLevel l, const std::string& m) { progress.log(l, m); };
    rtattn::Runtime rt(ro);
    // More workers than the library's compile slots would only wait (and 64 NVRTC runs on 2 cores take GBs).
    const int jobs = rt.options().max_concurrent_compiles;
    if (a.jobs > jobs)
        progress.log(rtattn::LogLevel::warn,
                     fmt::format("-j {} capped at {}: the library runs at most one NVRTC compile per hardware thread "
                                 "({} here), each taking 100s of MB",
                                 a.jobs, jobs, std::thread::hardware_concurrency()));
    const auto stats = rt.stats();
    // A memory-only cache would "succeed" and keep nothing: that is a cache failure, not a precompile.
    if (!stats.disk_enabled)
        throw rtattn::CacheError(fmt::format("the disk cache{} cannot be used (see the warning above); nothing "
                                             "would be kept",
                                             stats.dir.empty() ? "" : " at " + stats.dir));

    const auto t0 = Clock::now();
    const auto outcomes = run_precompile(rt, configs, jobs, progress);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    print_precompile_summary(configs, outcomes, seconds, stats.dir, a.cache_only, a.json);
    const bool any_failed = std::any_of(outcomes.begin(), outcomes.end(), [](const Outcome& o) {
        return o.status == Outcome::Status::failed || o.status == Outcome::Status::not_stored;
    });
    return any_failed ? kWorkFailed : kOk;
}

// ---- ls / verify / prune / clear ---------------------------------------------------------------------------------

// What `ls` shows of one entry, taken from the info JSON the Runtime stored next to the cubin.
struct EntryView {
    json info;             // null when missing or unreadable
    std::string config;    // describe() without the arch (it has its own column)
    int registers = -1, spill_bytes = -1;
};

// Only sound entries have info: the cache checked that it is a JSON object whose known fields have their types.
EntryView view_of(const rtattn::cache::Listing& l) {
    EntryView v{nullptr, "?"};
    if (!l.ok) return v;
    v.info = json::parse(l.info_json, nullptr, /*allow_exceptions=*/false);
    if (!v.info.is_object()) {
        v.info = nullptr;
        return v;
    }
    v.registers = v.info.value("registers", -1);
    v.spill_bytes = v.info.value("spill_bytes", -1);
    if (v.info.contains("config")) {
        try {
            AttentionConfig c = rtattn::config_from_json(v.info["config"]);
            c.arch.clear();
            v.config = c.describe();
        } catch (const ConfigError&) {
            // Written by another library version with other fields: still list the entry.
        }
    }
    return v;
}

int cmd_ls(const GlobalOptions& g, bool as_json) {
    const auto disk = open_disk_cache(g);
    const auto listings = disk->list();
    std::uint64_t total = 0;
    for (const auto& l : listings) total += l.size;
    if (as_json) {
        json j;
        j["dir"] = disk->dir();
        j["total_bytes"] = total;
        j["entries"] = json::array();
        for (const auto& l : listings) {
            const EntryView v = view_of(l);
            json e;
            e["key"] = l.key;
            e["arch"] = l.arch;
            e["path"] = l.path;
            e["size"] = l.size;
            e["last_use"] = l.last_use;
            e["ok"] = l.ok;
            if (!l.ok) e["problem"] = l.problem;
            e["config"] = v.info.is_object() && v.info.contains("config") ? v.info["config"] : json();
            e["plan"] = v.info.is_object() && v.info.contains("plan") ? v.info["plan"] : json();
            e["registers"] = v.registers;
            e["spill_bytes"] = v.spill_bytes;
            e["compile_seconds"] = v.info.is_object() ? v.info.value("compile_seconds", -1.0) : -1.0;
            j["entries"].push_back(std::move(e));
        }
        fmt::print("{}\n", dump(j));
        return kOk;
    }
    if (!listings.empty())
        fmt::print("{:<12}  {:<7}  {:<32}  {:>10}  {:<9}  {:>4}  {:>6}\n", "KEY", "ARCH", "CONFIG", "SIZE",
                   "LAST USE", "REGS", "SPILLS");
    for (const auto& l : listings) {
        const EntryView v = view_of(l);
        const std::string config = l.ok ? v.config : "BAD: " + safe(l.problem);
        fmt::print("{:<12}  {:<7}  {:<32}  {:>10}  {:<9}  {:>4}  {:>6}\n", l.key.substr(0, 12), safe(l.arch), config,
                   human_bytes(l.size), human_age(l.last_use), figure(v.registers, "-"), figure(v.spill_bytes, "-"));
    }
    fmt::print("{} entries, {} in {}{}\n", listings.size(), human_bytes(total), disk->dir(),
               disk->absent() ? " (it does not exist yet)" : "");
    return kOk;
}

int cmd_verify(const GlobalOptions& g, bool repair, bool as_json) {
    const auto disk = open_disk_cache(g);
    const auto r = disk->verify(repair);
    if (as_json) {
        json j;
        j["dir"] = disk->dir();
        j["ok"] = r.ok;
        j["bad"] = r.bad;
        j["removed"] = r.removed;
        j["problems"] = r.problems;
        fmt::print("{}\n", dump(j));
    } else {
        for (const auto& p : r.problems) fmt::print("bad: {}\n", safe(p));
        fmt::print("verified {} entries in {}: {} ok, {} bad, {} removed\n", r.ok + r.bad, disk->dir(), r.ok, r.bad,
                   r.removed);
        if (r.bad > r.removed) fmt::print("run `rtattn verify --repair` to remove the bad entries\n");
    }
    return r.bad > r.removed ? kWorkFailed : kOk;
}

struct PruneArgs {
    std::string max_size, older_than;
    CLI::Option *max_size_opt = nullptr, *older_than_opt = nullptr;  // given or not: "" is a value to refuse
};

int cmd_prune(const GlobalOptions& g, const PruneArgs& a) {
    if (!a.max_size_opt->count() && !a.older_than_opt->count())
        throw ConfigError("--max-size", "prune needs --max-size and/or --older-than (use `rtattn clear` to remove "
                                        "everything)");
    std::optional<std::uint64_t> max_bytes;
    std::optional<std::int64_t> older_than;
    if (a.max_size_opt->count()) max_bytes = parse_size(a.max_size);
    if (a.older_than_opt->count()) older_than = parse_duration(a.older_than);
    const auto disk = open_disk_cache(g);
    const auto r = disk->prune(max_bytes, older_than);
    fmt::print("removed {} entries ({}); {} left in {}\n", r.removed, human_bytes(r.bytes_freed),
               human_bytes(disk->total_bytes()), disk->dir());
    return kOk;
}

int cmd_clear(const GlobalOptions& g) {
    const auto disk = open_disk_cache(g);
    const auto r = disk->clear();
    fmt::print("removed {} entries from {}\n", r.entries, disk->dir());
    if (r.in_use > 0)
        fmt::print("left {} lock or temp file(s) that running processes hold; they go when those finish\n", r.in_use);
    return kOk;
}

// ---- render ------------------------------------------------------------------------------------------------------

int cmd_render(const ConfigFlags& flags, bool verbose) {
    const AttentionConfig c = single_config(flags);
    const auto p = rtattn::plan::plan(c);
    const auto src = rtattn::render::render(p);
    fmt::print("{}", src.full_text());
    if (!verbose) return kOk;
    // Appended as comments, so the output stays a valid CUDA file when redirected.
    const auto out = rtattn::compile::compile(src, c.arch);
    const auto& r = out.ptxas;
    fmt::print("\n// ===== rtattn render --verbose: {} =====\n", c.describe());
    fmt::print("// registers: {}\n// spill stores: {} bytes, spill loads: {} bytes\n// stack: {} bytes\n"
               "// barriers: {}\n// shared memory: {} bytes (dynamic)\n// compile: {:.3f} s (NVRTC {}, {} bytes of "
               "cubin)\n// options: {}\n",
               figure(r.registers), figure(r.spill_store_bytes), figure(r.spill_load_bytes), figure(r.stack_bytes),
               figure(r.barriers), p.smem_bytes, out.seconds, rtattn::compile::nvrtc_version(), out.cubin.size(),
               out.options);
    if (r.registers < 0) {
        std::string log = out.log.empty() ? "(empty)" : out.log;
        for (auto at = log.find('\n'); at != std::string::npos; at = log.find('\n', at + 4))
            log.replace(at, 1, "\n// ");  // keep the output a valid CUDA file
        fmt::print("// the NVRTC log has no ptxas report for {}:\n// {}\n", src.entry, log);
    }
    return kOk;
}

// ---- info --------------------------------------------------------------------------------------------------------

json device_json() {
    if (!rtattn::driver::gpu_available()) return nullptr;
    try {
        const auto d = rtattn::driver::current_device();
        json j;
        j["name"] = d.name;
        j["cc"] = fmt::format("{}.{}", d.cc_major, d.cc_minor);
        j["sms"] = d.sms;
        j["arch"] = d.arch();
        j["smem_optin"] = d.smem_optin;
        j["driver_version"] = d.driver_version;
        return j;
    } catch (const rtattn::CudaError& e) {
        // A driver that loads but cannot give a context is worth showing, not failing on.
        return json{{"error", e.what()}};
    }
}

json cache_json(const rtattn::cache::DiskCache& disk) {
    json j;
    j["dir"] = disk.dir();
    j["state"] = disk.state_name();
    j["problem"] = disk.problem().empty() ? json(nullptr) : json(disk.problem());
    j["entries"] = std::string(disk.state_name()) != "off" ? json(disk.list().size()) : json(nullptr);
    j["total_bytes"] = disk.total_bytes();
    return j;
}

json plan_info_json(const AttentionConfig& c, const rtattn::cache::DiskCache& disk) {
    const auto p = rtattn::plan::plan(c);
    const auto key = rtattn::cache_key(rtattn::render::render(p), c.arch);
    std::error_code ec;
    json j;
    j["config"] = config_json(c);
    j["describe"] = c.describe();
    j["head_dim_qk"] = p.head_dim_qk;
    j["head_dim_v"] = p.head_dim_v;
    const json plan = json::parse(rtattn::plan_json(p));  // a named object: items() would dangle on a temporary
    for (const auto& [k, v] : plan.items()) j[k] = v;  // includes "threads"
    j["key"] = key;
    // Whether an entry file is there (not whether it verifies: `rtattn verify` does that); links do not count.
    j["cached"] = std::filesystem::is_regular_file(std::filesystem::symlink_status(disk.entry_path(key), ec));
    return j;
}

void print_info_text(const json& j) {
    fmt::print("rtattn {}\nNVRTC {}\n", j["version"].get<std::string>(), j["nvrtc"].get<std::string>());
    const json& d = j["device"];
    if (d.is_null())
        fmt::print("device: no GPU\n");
    else if (d.contains("error"))
        fmt::print("device: error: {}\n", d["error"].get<std::string>());
    else
        fmt::print("device: {} (compute capability {}, {} SMs, arch {}, driver {})\n", d["name"].get<std::string>(),
                   d["cc"].get<std::string>(), d["sms"].get<int>(), d["arch"].get<std::string>(),
                   d["driver_version"].get<int>());
    const json& c = j["cache"];
    const std::string state = c["state"].get<std::string>();
    if (state == "usable")
        fmt::print("cache: {}, {} entries, {}\n", c["dir"].get<std::string>(), c["entries"].get<int>(),
                   human_bytes(c["total_bytes"].get<std::uint64_t>()));
    else
        fmt::print("cache: {} ({}{})\n", c["dir"].get<std::string>(), state,
                   c["problem"].is_null() ? "" : ": " + c["problem"].get<std::string>());
    if (!j.contains("plan")) return;
    const json& p = j["plan"];
    const double useful = p["useful_flop_fraction"].get<double>();
    fmt::print("plan for {}:\n", p["describe"].get<std::string>());
    fmt::print("  head dims: qk {} -> padded {}, v {} -> padded {}\n", p["head_dim_qk"].get<int>(),
               p["pad_qk"].get<int>(), p["head_dim_v"].get<int>(), p["pad_v"].get<int>());
    fmt::print("  kernel: {}\n", p["kernel"].get<std::string>());
    fmt::print("  tiles: {}x{} (block_m x block_n), {} warps x {} m-tile(s), {} stage(s), Q in {}\n",
               p["block_m"].get<int>(), p["block_n"].get<int>(), p["warps"].get<int>(), p["m_tiles"].get<int>(),
               p["stages"].get<int>(), p["q_in_regs"].get<bool>() ? "registers" : "shared memory");
    fmt::print("  shared memory: {} bytes\n", p["smem_bytes"].get<int>());
    fmt::print("  useful/issued FLOPs: {:.4f} ({:.1f}% spent on padding)\n", useful, 100 * (1 - useful));
    fmt::print("  reason: {}\n", p["reason"].get<std::string>());
    fmt::print("  cache key: {} ({})\n", p["key"].get<std::string>(),
               p["cached"].get<bool>() ? "cached" : "not cached");
}

int cmd_info(const GlobalOptions& g, const ConfigFlags& flags, bool as_json) {
    json j;
    j["version"] = rtattn::version();
    j["nvrtc"] = rtattn::compile::nvrtc_version();
    j["device"] = device_json();
    const auto disk = open_disk_cache(g);
    j["cache"] = cache_json(*disk);
    if (flags.any_shape_flag() || !flags.archs.empty()) j["plan"] = plan_info_json(single_config(flags), *disk);
    if (as_json)
        fmt::print("{}\n", dump(j));
    else
        print_info_text(j);
    return kOk;
}

// ---- main --------------------------------------------------------------------------------------------------------

int report_error(const char* what, int code) {
    std::fflush(stdout);
    fmt::print(stderr, "rtattn: error: {}\n", what);
    return code;
}

// Parse errors from CLI11: help and --version are successes, anything else is a usage error.
int parse_error_exit(const CLI::App& app, const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    report_error(e.what(), kUsage);
    fmt::print(stderr, "run `rtattn --help` (or `rtattn <command> --help`) for usage\n");
    return kUsage;
}

}  // namespace

int main(int argc, char** argv) {
    // With a driver present, NVRTC serves repeat compiles from the driver's JIT cache and then prints no ptxas
    // report; the CLI shows registers and spills, so it opts out (rtattn's own cache makes NVRTC's redundant).
    setenv("CUDA_CACHE_DISABLE", "1", /*overwrite=*/0);
    CLI::App app{"rtattn: precompile, inspect and maintain librtattn's attention kernel cache"};
    app.footer(kFooter);
    app.require_subcommand(1);
    app.fallthrough();  // global options may also follow the subcommand
    app.set_version_flag("--version", std::string(rtattn::version()));

    GlobalOptions g;
    app.add_option("--cache-dir", g.cache_dir, "cache directory (default: $RTATTN_CACHE_DIR, else "
                                               "$XDG_CACHE_HOME/rtattn, else ~/.cache/rtattn)")
        ->type_name("DIR");
    app.add_option("--log-level", g.log_level, "how much the library logs to stderr (default warn)")
        ->check(CLI::IsMember({"quiet", "warn", "info", "debug"}))
        ->type_name("LEVEL");
    app.add_flag("--shared-cache", g.shared_cache,
                 "trust a cache dir that others can write (a team cache; also RTATTN_SHARED_CACHE=1): anyone who can "
                 "write it can run code in this process");
    app.add_option("--lock-timeout", g.lock_timeout,
                   "seconds to wait for another process building the same kernel, then compile without storing "
                   "(default 60)")
        ->check(CLI::Range(0.0, 86400.0))
        ->type_name("SECONDS");

    PrecompileArgs pre;
    auto* precompile = app.add_subcommand(
        "precompile", "compile configs into the disk cache: from manifests, from --head-dim flags, or (neither "
                      "given) the default manifest");
    precompile->add_option("manifests", pre.manifests, "manifest files, or names of manifests in the manifest "
                                                       "directories (e.g. default)")
        ->type_name("MANIFEST");
    add_config_flags(precompile, pre.config, /*lists=*/true);
    precompile->add_option("-j,--jobs", pre.jobs, "parallel compiles (default: one per hardware thread)")
        ->type_name("N");
    precompile->add_flag("--json", pre.json, "print a JSON summary on stdout (progress stays on stderr)");
    precompile->add_flag("--cache-only", pre.cache_only, "compile nothing; only check that every config is cached");

    bool ls_json = false;
    auto* ls = app.add_subcommand("ls", "list cache entries: config, arch, size, last use, registers, spills");
    ls->add_flag("--json", ls_json, "print JSON");

    bool repair = false, verify_json = false;
    auto* verify = app.add_subcommand("verify", "check every entry's header and checksum (exit 1 if any is bad)");
    verify->add_flag("--repair", repair, "remove bad entries (they are rebuilt on next use)");
    verify->add_flag("--json", verify_json, "print JSON");

    PruneArgs prune_args;
    auto* prune = app.add_subcommand("prune", "remove least recently used or old entries");
    prune_args.max_size_opt =
        prune->add_option("--max-size", prune_args.max_size, "keep at most this much, e.g. 500M, 2G or bytes")
            ->type_name("SIZE");
    prune_args.older_than_opt = prune->add_option("--older-than", prune_args.older_than,
                                                  "remove entries unused for this long, e.g. 7d, 12h, 30m or seconds")
                                    ->type_name("AGE");

    auto* clear = app.add_subcommand("clear", "remove every cache entry");

    ConfigFlagOptions render_flags;
    bool render_verbose = false;
    auto* render = app.add_subcommand("render", "print the CUDA source rendered for one config");
    add_config_flags(render, render_flags, /*lists=*/false);
    render->add_flag("-v,--verbose", render_verbose,
                     "also compile with NVRTC and report registers, spills, stack, barriers, shared memory and time");

    ConfigFlagOptions info_flags;
    bool info_json = false;
    auto* info = app.add_subcommand("info", "library, NVRTC, device and cache; with config flags also the plan");
    add_config_flags(info, info_flags, /*lists=*/false);
    info->add_flag("--json", info_json, "print JSON");

    rtattn::tools::BenchOptions bench_opts;
    std::vector<std::string> bench_causal;
    auto* bench = app.add_subcommand("bench", "forward TFLOPS over a shape grid (needs a GPU), or JIT latency");
    bench->add_option("--head-dims", bench_opts.head_dims, "head dims (comma separated)")->delimiter(',');
    bench->add_option("--seqlens", bench_opts.seqlens, "sequence lengths; batch = tokens / seqlen")->delimiter(',');
    bench->add_option("--dtype", bench_opts.dtypes, "bf16, fp16")->delimiter(',');
    bench->add_option("--causal", bench_causal, "true, false or both (default both)")
        ->check(CLI::IsMember({"true", "false", "both"}));
    bench->add_option("--gqa", bench_opts.gqa, "q heads per kv head (default 1)")->check(CLI::Range(1, 64));
    bench->add_option("--tokens", bench_opts.tokens, "batch * seqlen (default 16384)")->check(CLI::Range(1, 1 << 24));
    bench->add_option("--reps", bench_opts.reps, "timed runs; the median is reported (default 30)")
        ->check(CLI::Range(1, 10000));
    bench->add_option("--json", bench_opts.json_path, "write the results as JSON to this file")->type_name("FILE");
    bench->add_flag("--interleave", bench_opts.interleave,
                    "prepare every shape first, then launch them round-robin (ratios between shapes)");
    bench->add_flag("--latency", bench_opts.latency,
                    "JIT latency instead: cold compile, disk hit (fresh Runtime), in-memory hit");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return parse_error_exit(app, e);
    }

    try {
        if (precompile->parsed()) return cmd_precompile(g, pre);
        if (ls->parsed()) return cmd_ls(g, ls_json);
        if (verify->parsed()) return cmd_verify(g, repair, verify_json);
        if (prune->parsed()) return cmd_prune(g, prune_args);
        if (clear->parsed()) return cmd_clear(g);
        if (render->parsed()) return cmd_render(render_flags.get(), render_verbose);
        if (info->parsed()) return cmd_info(g, info_flags.get(), info_json);
        if (bench->parsed()) {
            if (!bench_causal.empty() && bench_causal[0] != "both")
                bench_opts.causal = {bench_causal[0] == "true"};
            bench_opts.cache_dir = g.cache_dir;
            return rtattn::tools::run_bench(bench_opts);
        }
        return report_error("no command given", kUsage);
    } catch (const ConfigError& e) {
        return report_error(e.what(), kUsage);
    } catch (const rtattn::ArgumentError& e) {
        return report_error(e.what(), kUsage);
    } catch (const rtattn::CacheError& e) {
        return report_error(e.what(), kCacheFailure);
    } catch (const rtattn::Error& e) {
        return report_error(e.what(), kWorkFailed);
    } catch (const std::exception& e) {
        return report_error(e.what(), kWorkFailed);
    } catch (...) {
        return report_error("unknown exception", kWorkFailed);
    }
}
