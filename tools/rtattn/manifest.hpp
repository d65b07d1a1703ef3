// Precompile manifests: JSON files listing the configs worth having in the cache before anyone asks for them.
//
//   {"name": "default", "description": "...",
//    "configs": [ {"model": "Llama-3 8B", "head_dim": 128, "dtype": ["bf16", "fp16"], "causal": "both",
//                  "num_heads_q": 32, "num_heads_kv": 8, "arch": ["sm_80", "sm_90a"]}, ... ]}
//
// An entry is an AttentionConfig JSON object (see AttentionConfig::from_json) in which some fields may list
// several values; the entry stands for the cartesian product of those lists:
//   head_dim / head_dim_qk / head_dim_v : an integer or a list of integers
//   dtype                               : a string or a list of strings
//   causal                              : true, false, "both" or a list of booleans
//   arch                                : a string or a list of strings
//   pass                                : "forward" (the default), "backward", "both", or a list of the first two:
//                                         which kernels of each config to build (backward: the training kernels)
// "model" and "comment" are documentation only. This reader owns the manifest schema: it strips them and
// expands lists before handing each single config to AttentionConfig::from_json, which stays strict.
//
// The CLI's config flags (--head-dim 64,128 --dtype bf16,fp16 ...) are turned into one such entry, so a flag and
// a manifest field are expanded and checked by the same code and fail with the same messages.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/config.hpp"
#include "core/errors.hpp"

namespace rtattn::tool {

// A bad manifest or flag. field() is the AttentionConfig field at fault (as for ConfigError); what() also names
// where it came from: "<file>: configs[3] (Llama-3 8B): dtype: 'fp8' is not supported; allowed: fp16, bf16".
class ManifestError : public ConfigError {
public:
    ManifestError(std::string where, std::string field, const std::string& message)
        : ConfigError(field, message), where_(std::move(where)),
          text_(where_ + ": " + field + ": " + message) {}
    const char* what() const noexcept override { return text_.c_str(); }
    const std::string& where() const noexcept { return where_; }
private:
    std::string where_, text_;
};

// Configs in first-seen order without repeats: head_dim_v equal to head_dim_qk and an explicit softmax_scale equal
// to the default count as leaving them out. A hash set of canonical forms keeps it linear (64k configs).
class UniqueConfigs {
public:
    bool add(const AttentionConfig& c);  // false when an equal config is already in
    void add_all(const std::vector<AttentionConfig>& configs);
    const std::vector<AttentionConfig>& list() const { return list_; }
    std::vector<AttentionConfig> take() { return std::move(list_); }

private:
    std::vector<AttentionConfig> list_;
    std::unordered_set<std::string> seen_;
};

// The most configs one manifest (or one command line) may expand to, counted before deduplication. Real manifests
// hold hundreds; the bound keeps a small file of long lists from allocating gigabytes (README: Manifests).
inline constexpr std::uint64_t kMaxManifestConfigs = 100000;

// Expanded, deduplicated configs in first-seen order, by the kernels asked for.
struct Expanded {
    std::vector<AttentionConfig> forward;
    std::vector<AttentionConfig> backward;
};

struct Manifest {
    std::string path, name, description;
    std::vector<AttentionConfig> configs;           // forward kernels
    std::vector<AttentionConfig> backward_configs;  // backward kernels
};

// Overrides applied while expanding, before each config is checked.
struct ExpandOptions {
    std::vector<std::string> archs;  // non-empty: replaces every entry's "arch" (e.g. `precompile --arch sm_90a`)
    // Gives the arch of a config that names none ("the current GPU"), or throws ConfigError; null: leave it empty.
    std::function<std::string()> current_arch;
    std::string pass;  // non-empty: replaces every entry's "pass" (`precompile --pass both`)
};

// Reads and expands a manifest file. Every config is validated and, when its arch is known, planned, so an
// unsupported entry is reported here with its file and index rather than halfway through a precompile run.
Manifest load_manifest(const std::string& path, const ExpandOptions& opts = {});

// The CLI's config flags, as given (empty / unset = not given).
struct ConfigFlags {
    std::vector<int> head_dims;
    std::optional<int> head_dim_v;
    std::vector<std::string> dtypes;
    std::string causal;  // "true", "false", "both" or empty
    std::optional<int> heads_q, heads_kv;
    std::optional<double> softmax_scale;
    std::vector<std::string> archs;
    bool decode = false, paged_kv = false, varlen = false, local = false;  // --decode, --paged-kv, --varlen, --local
    bool sinks = false, softcap = false, alibi = false;                    // --sinks, --softcap, --alibi

    // Whether any flag that shapes a config (everything but --arch) was given.
    bool any_shape_flag() const;
};

// Expands the flags like a one-entry manifest (errors name the flag). Requires head_dims to be non-empty.
// expand_flags: the forward configs; expand_flag_passes: by opts.pass (forward when empty).
std::vector<AttentionConfig> expand_flags(const ConfigFlags& flags, const ExpandOptions& opts = {});
Expanded expand_flag_passes(const ConfigFlags& flags, const ExpandOptions& opts);

// Where `name` resolves to: a path (anything with a '/', or an existing file) as given, else <dir>/<name>.json in
// the first manifest directory that has it. Returns "" when a bare name matches nothing.
std::string find_manifest(const std::string& name);

// The manifest directories searched, in order: $RTATTN_MANIFEST_DIR, then share/rtattn/manifests beside the
// executable's directory (<prefix>/bin -> <prefix>/share; the build tree and the Python package have that shape).
std::vector<std::string> manifest_dirs();

}  // namespace rtattn::tool
