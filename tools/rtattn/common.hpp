// What every rtattn command shares: global options, exit codes, the cache and Runtime as the commands open them,
// the config flags, and text/JSON output helpers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cache/cache.hpp"
#include "manifest.hpp"
#include "core/rtattn.hpp"

// CLI11 costs 9 s of compile per file that includes it (2 cores): the files that use it include it themselves.
namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace rtattn::cli {

using json = nlohmann::ordered_json;

enum ExitCode : int { kOk = 0, kWorkFailed = 1, kUsage = 2, kCacheFailure = 3 };

// Version of the layout of every --json output; bumped when a field changes meaning or goes away.
inline constexpr int kJsonSchemaVersion = 2;

struct GlobalOptions {
    std::string cache_dir;  // empty: the library's default ($RTATTN_CACHE_DIR, XDG, ~/.cache)
    std::string log_level;  // empty: $RTATTN_LOG_LEVEL, else warn
    bool shared_cache = false;  // or RTATTN_SHARED_CACHE=1
    double lock_timeout = 60;
};

// The selected subcommand's work, set while parsing; main() runs it.
using Action = std::function<int()>;

// Command groups: each registers its subcommands and, when one is selected, sets `action`.
void add_precompile(CLI::App& app, const GlobalOptions& g, Action& action);
void add_cache_commands(CLI::App& app, const GlobalOptions& g, Action& action);  // ls, verify, prune, clear
void add_inspect_commands(CLI::App& app, const GlobalOptions& g, Action& action);  // render, info
void add_bench(CLI::App& app, const GlobalOptions& g, Action& action);

LogLevel log_level(const GlobalOptions& g);
// The Runtime options the globals describe (cache dir, log level, trust, lock timeout).
RuntimeOptions runtime_options(const GlobalOptions& g);
// The cache as maintenance commands see it: never created by them (ls, info and verify only look), trusted by the
// same rule as the library's.
std::unique_ptr<cache::DiskCache> open_disk_cache(const GlobalOptions& g);

// Config flags as CLI11 fills them. CLI11 2.1 cannot fill std::optional, so whether a scalar flag was given is read
// from its Option afterwards.
struct ConfigFlagOptions {
    tool::ConfigFlags flags;
    int head_dim_v = 0, heads_q = 0, heads_kv = 0;
    double softmax_scale = 0;
    CLI::Option *head_dim_v_opt = nullptr, *heads_q_opt = nullptr, *heads_kv_opt = nullptr, *scale_opt = nullptr;
    tool::ConfigFlags get() const;
};
// The one definition of the config flags. `lists`: the command expands comma-separated lists (precompile);
// otherwise the flags must describe exactly one config (single_config()).
void add_config_flags(CLI::App* app, ConfigFlagOptions& o, bool lists);
// Expansion options that resolve "no arch" to the current GPU, naming the entry or flag when that fails.
const tool::ExpandOptions& resolve_arch();
// The single config that `render` and `info` describe.
AttentionConfig single_config(const tool::ConfigFlags& f);

// Text read from cache entries or files, for a terminal: control characters escaped.
std::string safe(const std::string& s);
// JSON for stdout: invalid UTF-8 from a file is replaced, never a reason to fail the whole output; schema_version
// first.
std::string dump(json j);
// A figure that may be unknown (< 0): null in JSON.
json figure_json(long long x);

std::string human_bytes(std::uint64_t b);
std::string human_seconds(double s);
std::string human_age(std::int64_t unix_seconds);
// ptxas figures are -1 when the log had no report for the entry.
std::string figure(int x, const char* unknown = "unknown");

}  // namespace rtattn::cli
