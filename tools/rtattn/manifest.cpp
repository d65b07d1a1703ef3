#include "manifest.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plan/plan.hpp"

namespace rtattn::tool {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Fields that may hold a list of alternatives; every other field is passed through to from_json as is.
constexpr const char* kListFields[] = {"head_dim", "head_dim_qk", "head_dim_v", "dtype", "causal", "arch"};
// Documentation-only entry fields: the manifest's business, not AttentionConfig's.
constexpr const char* kCommentFields[] = {"model", "comment"};
constexpr const char* kTopLevelFields[] = {"name", "description", "configs", "comment"};

template <std::size_t N>
bool one_of(const std::string& s, const char* const (&set)[N]) {
    for (const char* x : set)
        if (s == x) return true;
    return false;
}

// Names where a config came from, for error messages. For the command line the field is reported as the flag
// that sets it, since that is what the user typed.
struct Origin {
    std::string where;  // "<file>: configs[3] (Llama-3 8B)"; empty for the command line
    bool command_line = false;

    std::string place(const std::string& field) const {
        if (!command_line) return where;
        static const std::map<std::string, std::string> flag_of = {
            {"head_dim", "--head-dim"},   {"head_dim_qk", "--head-dim"},  {"head_dim_v", "--head-dim-v"},
            {"dtype", "--dtype"},         {"causal", "--causal"},         {"num_heads_q", "--heads-q"},
            {"num_heads_kv", "--heads-kv"}, {"softmax_scale", "--softmax-scale"}, {"arch", "--arch"}};
        const auto it = flag_of.find(field);
        return it != flag_of.end() ? it->second : "command line";
    }
    [[noreturn]] void fail(const std::string& field, const std::string& message) const {
        throw ManifestError(place(field), field, message);
    }
    // Re-raises a ConfigError from the library with this origin attached.
    [[noreturn]] void rethrow(const ConfigError& e) const {
        const std::string prefix = e.field() + ": ";
        std::string message = e.what();
        if (message.compare(0, prefix.size(), prefix) == 0) message.erase(0, prefix.size());
        fail(e.field(), message);
    }
};

// The alternatives one list-capable field stands for.
std::vector<json> alternatives(const std::string& key, const json& value, const Origin& origin) {
    if (key == "causal" && value.is_string()) {
        if (value == "both") return {false, true};
        origin.fail(key, fmt::format("{} is not allowed; use true, false or \"both\"", value.dump()));
    }
    if (!value.is_array()) return {value};
    if (value.empty()) origin.fail(key, "is an empty list; give at least one value or leave the field out");
    return {value.begin(), value.end()};
}

// The cartesian product of the entry's list fields, each element a plain from_json object.
std::vector<json> cartesian(const json& entry, const Origin& origin) {
    json base = json::object();
    for (const auto& [key, value] : entry.items())
        if (!one_of(key, kListFields) && !one_of(key, kCommentFields)) base[key] = value;
    std::vector<json> out = {base};
    for (const char* key : kListFields) {
        if (!entry.contains(key)) continue;
        std::vector<json> next;
        const auto alts = alternatives(key, entry[key], origin);
        // Earlier fields vary slowest, so the order reads like the entry: all of d64, then all of d128, ...
        for (const json& partial : out)
            for (const auto& alt : alts) {
                next.push_back(partial);
                next.back()[key] = alt;
            }
        out = std::move(next);
    }
    return out;
}

// Parses and checks one expanded config. Planning it too means "valid but unsupported on this arch" (e.g. shared
// memory) is caught up front with its origin, not reported as a failed compile later.
AttentionConfig checked_config(const json& single, const Origin& origin) {
    try {
        AttentionConfig c = AttentionConfig::from_json(single.dump());
        if (!c.arch.empty()) (void)plan::plan(c);
        return c;
    } catch (const ConfigError& e) {
        origin.rethrow(e);
    }
}

std::vector<AttentionConfig> expand_entry(json entry, const ExpandOptions& opts, const Origin& origin) {
    if (!entry.is_object()) origin.fail("entry", fmt::format("must be a JSON object, got {}", entry.dump()));
    for (const char* key : kCommentFields)
        if (entry.contains(key) && !entry[key].is_string()) origin.fail(key, "must be a string (it is a comment)");
    if (!opts.archs.empty()) entry["arch"] = opts.archs;
    std::vector<AttentionConfig> out;
    for (const auto& single : cartesian(entry, origin)) append_unique(out, {checked_config(single, origin)});
    return out;
}

// Equality up to spelling: an explicit default is the same config as an omitted one.
AttentionConfig normalized(AttentionConfig c) {
    if (c.head_dim_v == c.head_dim_qk) c.head_dim_v.reset();
    if (c.softmax_scale && *c.softmax_scale == 1.0 / std::sqrt(double(c.head_dim_qk))) c.softmax_scale.reset();
    return c;
}

json read_json_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ManifestError(path, "manifest", "cannot open the file for reading");
    std::stringstream ss;
    ss << in.rdbuf();
    try {
        return json::parse(ss.str());
    } catch (const json::exception& e) {
        throw ManifestError(path, "manifest", fmt::format("not valid JSON: {}", e.what()));
    }
}

std::string string_field(const json& top, const char* key, const std::string& path, std::string fallback) {
    if (!top.contains(key)) return fallback;
    if (!top[key].is_string()) throw ManifestError(path, key, "must be a string");
    return top[key].get<std::string>();
}

}  // namespace

Manifest load_manifest(const std::string& path, const ExpandOptions& opts) {
    const json top = read_json_file(path);
    if (!top.is_object())
        throw ManifestError(path, "manifest", "must be a JSON object with \"name\", \"description\" and \"configs\"");
    for (const auto& [key, value] : top.items())
        if (!one_of(key, kTopLevelFields))
            throw ManifestError(path, key, "unknown top-level field; allowed: name, description, configs, comment");
    if (!top.contains("configs") || !top["configs"].is_array())
        throw ManifestError(path, "configs", "missing or not a list; give a list of config objects");

    Manifest m;
    m.path = path;
    m.name = string_field(top, "name", path, fs::path(path).stem().string());
    m.description = string_field(top, "description", path, "");
    const json& entries = top["configs"];
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const json& e = entries[i];
        Origin origin{fmt::format("{}: configs[{}]", path, i)};
        if (e.is_object() && e.contains("model") && e["model"].is_string())
            origin.where += fmt::format(" ({})", e["model"].get<std::string>());
        append_unique(m.configs, expand_entry(e, opts, origin));
    }
    return m;
}

bool ConfigFlags::any_shape_flag() const {
    return !head_dims.empty() || head_dim_v || !dtypes.empty() || !causal.empty() || heads_q || heads_kv ||
           softmax_scale;
}

std::vector<AttentionConfig> expand_flags(const ConfigFlags& f) {
    const Origin origin{"", true};
    if (f.head_dims.empty()) origin.fail("head_dim", "is required here");
    json entry = json::object();
    entry["head_dim"] = f.head_dims;
    if (f.head_dim_v) entry["head_dim_v"] = *f.head_dim_v;
    if (!f.dtypes.empty()) entry["dtype"] = f.dtypes;
    if (f.causal == "true" || f.causal == "false")
        entry["causal"] = f.causal == "true";
    else if (!f.causal.empty())
        entry["causal"] = f.causal;  // "both" expands; anything else is reported by the expansion
    if (f.heads_q) entry["num_heads_q"] = *f.heads_q;
    if (f.heads_kv) entry["num_heads_kv"] = *f.heads_kv;
    if (f.softmax_scale) entry["softmax_scale"] = *f.softmax_scale;
    if (!f.archs.empty()) entry["arch"] = f.archs;
    return expand_entry(entry, {}, origin);
}

void append_unique(std::vector<AttentionConfig>& into, const std::vector<AttentionConfig>& more) {
    for (const auto& c : more) {
        const AttentionConfig n = normalized(c);
        bool seen = false;
        for (const auto& have : into) seen = seen || normalized(have) == n;
        if (!seen) into.push_back(c);
    }
}

std::vector<std::string> manifest_dirs() {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("RTATTN_MANIFEST_DIR"); env && *env) dirs.emplace_back(env);
#ifdef RTATTN_SOURCE_MANIFEST_DIR
    dirs.emplace_back(RTATTN_SOURCE_MANIFEST_DIR);
#endif
#ifdef RTATTN_INSTALL_MANIFEST_DIR
    dirs.emplace_back(RTATTN_INSTALL_MANIFEST_DIR);
#endif
    return dirs;
}

std::string find_manifest(const std::string& name) {
    std::error_code ec;
    if (fs::is_regular_file(name, ec)) return name;
    // Only bare names are looked up, so a mistyped path is reported as such instead of matching elsewhere.
    if (name.empty() || name.find('/') != std::string::npos) return "";
    const std::string file = fs::path(name).extension() == ".json" ? name : name + ".json";
    for (const auto& dir : manifest_dirs()) {
        const fs::path candidate = fs::path(dir) / file;
        if (fs::is_regular_file(candidate, ec)) return candidate.string();
    }
    return "";
}

}  // namespace rtattn::tool
