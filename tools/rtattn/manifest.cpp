#include "manifest.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "config/config_json.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "util/json_input.hpp"
#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::tool {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Fields that may hold a list of alternatives; every other field is passed through to from_json as is.
constexpr const char* kListFields[] = {"head_dim", "head_dim_qk", "head_dim_v", "dtype", "causal", "arch"};
// Documentation-only entry fields: the manifest's business, not AttentionConfig's.
constexpr const char* kCommentFields[] = {"model", "comment"};
// Which kernels an entry asks for: also the manifest's business.
constexpr const char* kPassField = "pass";
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
            {"num_heads_kv", "--heads-kv"}, {"softmax_scale", "--softmax-scale"}, {"arch", "--arch"},
            {"pass", "--pass"},           {"decode", "--decode"},         {"paged_kv", "--paged-kv"},
            {"varlen", "--varlen"},       {"local", "--local"},
            {"sinks", "--sinks"},         {"softcap", "--softcap"},     {"alibi", "--alibi"}};
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
        origin.fail(key, util::format("{} is not allowed; use true, false or \"both\"", json_for_message(value)));
    }
    if (!value.is_array()) return {value};
    if (value.empty()) origin.fail(key, "is an empty list; give at least one value or leave the field out");
    return {value.begin(), value.end()};
}

struct Passes {
    bool forward = true, backward = false;
};

Passes passes_of(const json& value, const Origin& origin) {
    const char* allowed = "use \"forward\", \"backward\", \"both\" or a list of the first two";
    if (value == "both") return {true, true};
    Passes p{false, false};
    for (const json& v : value.is_array() ? value : json::array({value})) {
        if (v == "forward")
            p.forward = true;
        else if (v == "backward")
            p.backward = true;
        else
            origin.fail(kPassField, util::format("{} is not allowed; {}", json_for_message(v), allowed));
    }
    if (!p.forward && !p.backward) origin.fail(kPassField, util::format("is an empty list; {}", allowed));
    return p;
}

// How many configs the entry stands for (the product of its lists' lengths), refused before any is built when it
// would take the manifest past kMaxManifestConfigs: a few KB of lists would otherwise fill gigabytes. *so_far:
// what the manifest's earlier entries stand for; the entry's count is added.
void count_expansion(const json& entry, const Origin& origin, std::uint64_t* so_far) {
    std::uint64_t n = 1;
    bool overflow = false;
    std::string factors;
    for (const char* key : kListFields) {
        if (!entry.contains(key)) continue;
        const std::uint64_t k = alternatives(key, entry[key], origin).size();
        if (k > 1) factors += util::format("{}{} {}", factors.empty() ? "" : " x ", key, k);
        overflow = overflow || __builtin_mul_overflow(n, k, &n);
    }
    const std::string limit = util::format("the limit is {} configs per manifest; shorten the lists or split the "
                                           "entries over several manifests", kMaxManifestConfigs);
    if (overflow || n > kMaxManifestConfigs)
        origin.fail("configs", util::format("expands to {}{} configs ({}); {}", overflow ? "more than " : "",
                                            overflow ? std::numeric_limits<std::uint64_t>::max() : n, factors, limit));
    if (n > kMaxManifestConfigs - *so_far)
        origin.fail("configs", util::format("expands to {} configs, which takes the manifest to {}; {}", n,
                                            *so_far + n, limit));
    *so_far += n;
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

// Parses and checks one expanded config, as JSON (a dump and re-parse would turn NaN into null, i.e. the default).
// Resolving "the current GPU" and planning here too means that an unsupported config (e.g. shared memory) is
// reported with its origin up front, not as a failed compile later.
// A backward config is planned both ways: its forward supplies the LSE the backward reads.
AttentionConfig checked_config(const json& single, const ExpandOptions& opts, const Origin& origin, bool backward) {
    try {
        AttentionConfig c = config_from_json(single);
        if (c.arch.empty() && opts.current_arch) c.arch = opts.current_arch();
        if (!c.arch.empty()) (void)plan::plan(c);
        if (!c.arch.empty() && backward) (void)plan::plan_backward(c);
        return c;
    } catch (const ConfigError& e) {
        origin.rethrow(e);
    }
}

constexpr int kDefaultHeads = 8;

Expanded expand_entry(json entry, const ExpandOptions& opts, const Origin& origin, std::uint64_t* so_far) {
    if (!entry.is_object())
        origin.fail("entry", util::format("must be a JSON object, got {}", json_for_message(entry)));
    for (const char* key : kCommentFields)
        if (entry.contains(key) && !entry[key].is_string()) origin.fail(key, "must be a string (it is a comment)");
    if (!opts.archs.empty()) entry["arch"] = opts.archs;
    if (!opts.pass.empty()) entry[kPassField] = opts.pass;
    Passes passes;
    if (entry.contains(kPassField)) {
        passes = passes_of(entry[kPassField], origin);
        entry.erase(kPassField);
    }
    // Heads reach a kernel only through whether packed K/V rows are 16-byte multiples (plan::kv_rows_16b: on sm_90a
    // it picks the kernel for head dims that are not multiples of 8). An entry or command line that names no heads
    // gets 8, which has such rows as nearly every model does, rather than the one head whose rows of d132 and the
    // like start 8 bytes off 16.
    if (!entry.contains("num_heads_q") && !entry.contains("num_heads_kv")) entry["num_heads_q"] = kDefaultHeads;
    count_expansion(entry, origin, so_far);
    UniqueConfigs out;
    for (const auto& single : cartesian(entry, origin)) out.add(checked_config(single, opts, origin, passes.backward));
    Expanded e;
    if (passes.backward) e.backward = out.list();
    if (passes.forward) e.forward = out.take();
    return e;
}

// Equality up to spelling: an explicit default is the same config as an omitted one.
std::string canonical(AttentionConfig c) {
    if (c.head_dim_v == c.head_dim_qk) c.head_dim_v.reset();
    if (c.softmax_scale && *c.softmax_scale == 1.0 / std::sqrt(double(c.head_dim_qk))) c.softmax_scale.reset();
    return c.to_json();
}

json read_json_file(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw ManifestError(path, "manifest", errno == ENOENT ? "no such file" : std::string(std::strerror(errno)));
    // A FIFO would block the read, a device never end it: only a regular file is a manifest.
    if (!S_ISREG(st.st_mode))
        throw ManifestError(path, "manifest", S_ISDIR(st.st_mode) ? "is a directory, not a manifest file"
                                                                  : "is not a regular file (a device, FIFO or socket)");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw ManifestError(path, "manifest", "cannot open the file for reading");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (in.bad()) throw ManifestError(path, "manifest", "cannot read the file");
    json top;
    if (std::string problem = util::parse_json(text, &top); !problem.empty())
        throw ManifestError(path, "manifest", problem);
    return top;
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
            throw ManifestError(path, util::escaped(key.substr(0, 64)),
                                "unknown top-level field; allowed: name, description, configs, comment");
    if (!top.contains("configs") || !top["configs"].is_array())
        throw ManifestError(path, "configs", "missing or not a list; give a list of config objects");

    Manifest m;
    UniqueConfigs configs, backward;
    m.path = path;
    m.name = string_field(top, "name", path, fs::path(path).stem().string());
    m.description = string_field(top, "description", path, "");
    const json& entries = top["configs"];
    std::uint64_t expanded = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const json& e = entries[i];
        Origin origin{util::format("{}: configs[{}]", path, i)};
        if (e.is_object() && e.contains("model") && e["model"].is_string()) {
            const std::string model = e["model"].get<std::string>();
            origin.where +=
                util::format(" ({})", util::escaped(model.substr(0, 64)) + (model.size() > 64 ? "..." : ""));
        }
        const Expanded x = expand_entry(e, opts, origin, &expanded);
        configs.add_all(x.forward);
        backward.add_all(x.backward);
    }
    m.configs = configs.take();
    m.backward_configs = backward.take();
    return m;
}

bool ConfigFlags::any_shape_flag() const {
    return !head_dims.empty() || head_dim_v || !dtypes.empty() || !causal.empty() || heads_q || heads_kv ||
           softmax_scale || decode || paged_kv || varlen || local || sinks || softcap || alibi;
}

std::vector<AttentionConfig> expand_flags(const ConfigFlags& f, const ExpandOptions& opts) {
    return expand_flag_passes(f, {{}, opts.current_arch, "forward"}).forward;
}

Expanded expand_flag_passes(const ConfigFlags& f, const ExpandOptions& opts) {
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
    if (f.decode) entry["decode"] = true;
    if (f.paged_kv) entry["paged_kv"] = true;
    if (f.varlen) entry["varlen"] = true;
    if (f.local) entry["local"] = true;
    if (f.sinks) entry["sinks"] = true;
    if (f.softcap) entry["softcap"] = true;
    if (f.alibi) entry["alibi"] = true;
    std::uint64_t expanded = 0;
    return expand_entry(entry, {{}, opts.current_arch, opts.pass}, origin, &expanded);
}

bool UniqueConfigs::add(const AttentionConfig& c) {
    if (!seen_.insert(canonical(c)).second) return false;
    list_.push_back(c);
    return true;
}

void UniqueConfigs::add_all(const std::vector<AttentionConfig>& configs) {
    for (const auto& c : configs) add(c);
}

std::vector<std::string> manifest_dirs() {
    std::vector<std::string> dirs;
    if (const char* env = std::getenv("RTATTN_MANIFEST_DIR"); env && *env) dirs.emplace_back(env);
    // <prefix>/bin/rtattn finds <prefix>/share/rtattn/manifests wherever the prefix was moved; the build tree has
    // the same shape (tools/rtattn next to share/), and so has the Python package.
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) dirs.push_back((exe.parent_path().parent_path() / "share" / "rtattn" / "manifests").string());
    return dirs;
}

std::string find_manifest(const std::string& name) {
    std::error_code ec;
    // Only bare names are looked up, so a mistyped path is reported as such (by load_manifest) instead of
    // matching elsewhere.
    if (name.find('/') != std::string::npos || fs::exists(name, ec)) return name;
    if (name.empty()) return "";
    const std::string file = fs::path(name).extension() == ".json" ? name : name + ".json";
    for (const auto& dir : manifest_dirs()) {
        const fs::path candidate = fs::path(dir) / file;
        if (fs::is_regular_file(candidate, ec)) return candidate.string();
    }
    return "";
}

}  // namespace rtattn::tool
