// The cache maintenance commands: ls, verify, prune, clear. They open the cache without creating it, and trust it by
// the library's rule (see the README's "Security and trust").
#include "util/format.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <optional>
#include <tuple>

#include "common.hpp"
#include "config/config_json.hpp"
#include "util/json_input.hpp"

namespace rtattn::cli {

namespace {

// What `ls` shows of one entry, taken from the info JSON the Runtime stored next to the cubin.
struct EntryView {
    const cache::Listing* listing = nullptr;
    json info;                             // null when the entry is bad
    std::optional<AttentionConfig> config;  // when the info holds one this library reads
    std::string describe = "?";             // describe() without the arch (it has its own column)
    const char* pass = nullptr;             // "forward" or "backward", from the stored plan's family
};

// Which pass an entry's kernels serve: the backward families are bwd_*, every other one a forward (or decode) one.
const char* pass_of(const json& info) {
    if (!info.is_object() || !info.contains("plan") || !info["plan"].is_object()) return nullptr;
    const json& family = info["plan"].contains("family") ? info["plan"]["family"] : json(nullptr);
    if (!family.is_string()) return nullptr;
    return family.get<std::string>().rfind("bwd_", 0) == 0 ? "backward" : "forward";
}

// Only sound entries have info: the cache checked that it is a JSON object whose known fields have their types.
EntryView view_of(const cache::Listing& l) {
    EntryView v;
    v.listing = &l;
    if (!l.ok) return v;
    if (!util::parse_json(l.info_json, &v.info).empty() || !v.info.is_object()) {
        v.info = nullptr;
        return v;
    }
    if (v.info.contains("config")) {
        try {
            v.config = config_from_json(v.info["config"]);
            AttentionConfig shown = *v.config;
            shown.arch.clear();
            v.describe = shown.describe();
        } catch (const ConfigError&) {
            // Written by another library version with other fields: still list the entry.
        }
    }
    v.pass = pass_of(v.info);
    if (v.pass && std::string(v.pass) == "backward") v.describe += " (backward)";  // as precompile says it
    return v;
}

long long info_int(const json& info, const char* key) {
    return info.is_object() && info.contains(key) ? info[key].get<long long>() : -1;
}

struct LsArgs {
    bool json = false;
    std::vector<std::string> archs;
    std::vector<int> head_dims;
};

// Entries sorted by config (head dims, dtype, mask, arch), then bad or unreadable ones by key.
std::vector<EntryView> sorted_views(const std::vector<cache::Listing>& listings, const LsArgs& a) {
    std::vector<EntryView> views;
    for (const auto& l : listings) {
        EntryView v = view_of(l);
        if (!a.archs.empty() && std::find(a.archs.begin(), a.archs.end(), l.arch) == a.archs.end()) continue;
        if (!a.head_dims.empty() &&
            (!v.config || std::find(a.head_dims.begin(), a.head_dims.end(), v.config->head_dim_qk) == a.head_dims.end()))
            continue;
        views.push_back(std::move(v));
    }
    const auto rank = [](const EntryView& v) {
        const AttentionConfig c = v.config.value_or(AttentionConfig{});
        return std::make_tuple(!v.config, c.head_dim_qk, c.dv(), int(c.dtype), c.causal, v.listing->arch,
                               v.listing->key);
    };
    std::sort(views.begin(), views.end(), [&](const EntryView& x, const EntryView& y) { return rank(x) < rank(y); });
    return views;
}

int ls(const GlobalOptions& g, const LsArgs& a) {
    const auto disk = open_disk_cache(g);
    const auto listings = disk->list();
    const auto views = sorted_views(listings, a);
    std::uint64_t total = 0;
    for (const auto& v : views) total += v.listing->size;
    if (a.json) {
        json j;
        j["dir"] = disk->dir();
        j["total_bytes"] = total;
        j["entries"] = json::array();
        for (const auto& v : views) {
            const cache::Listing& l = *v.listing;
            json e;
            e["key"] = l.key;
            e["arch"] = l.arch.empty() ? json(nullptr) : json(l.arch);
            e["path"] = l.path;
            e["size"] = l.size;
            e["last_use"] = l.last_use;
            e["ok"] = l.ok;
            e["problem"] = l.ok ? json(nullptr) : json(l.problem);
            e["config"] = v.info.is_object() && v.info.contains("config") ? v.info["config"] : json(nullptr);
            e["plan"] = v.info.is_object() && v.info.contains("plan") ? v.info["plan"] : json(nullptr);
            e["pass"] = v.pass ? json(v.pass) : json(nullptr);
            e["registers"] = figure_json(info_int(v.info, "registers"));
            e["spill_bytes"] = figure_json(info_int(v.info, "spill_bytes"));
            e["compile_seconds"] = v.info.is_object() && v.info.contains("compile_seconds")
                                       ? v.info["compile_seconds"]
                                       : json(nullptr);
            j["entries"].push_back(std::move(e));
        }
        util::print("{}\n", dump(std::move(j)));
        return kOk;
    }
    if (!views.empty())
        util::print("{:<12}  {:<7}  {:<32}  {:>10}  {:<9}  {:>4}  {:>6}\n", "KEY", "ARCH", "CONFIG", "SIZE",
                    "LAST USE", "REGS", "SPILLS");
    for (const auto& v : views) {
        const cache::Listing& l = *v.listing;
        const std::string config = l.ok ? v.describe : "BAD: " + safe(l.problem);
        util::print("{:<12}  {:<7}  {:<32}  {:>10}  {:<9}  {:>4}  {:>6}\n", l.key.substr(0, 12), safe(l.arch), config,
                    human_bytes(l.size), human_age(l.last_use), figure(int(info_int(v.info, "registers")), "-"),
                    figure(int(info_int(v.info, "spill_bytes")), "-"));
    }
    util::print("{} entries{}, {} in {}{}\n", views.size(),
                views.size() < listings.size() ? util::format(" (of {})", listings.size()) : "", human_bytes(total),
                disk->dir(), disk->absent() ? " (it does not exist yet)" : "");
    return kOk;
}

int verify(const GlobalOptions& g, bool repair, bool as_json) {
    const auto disk = open_disk_cache(g);
    const auto r = disk->verify(repair);
    if (as_json) {
        json j;
        j["dir"] = disk->dir();
        j["ok"] = r.ok;
        j["bad"] = r.bad;
        j["removed"] = r.removed;
        j["problems"] = r.problems;
        util::print("{}\n", dump(std::move(j)));
    } else {
        for (const auto& p : r.problems) util::print("bad: {}\n", safe(p));
        util::print("verified {} entries in {}: {} ok, {} bad, {} removed\n", r.ok + r.bad, disk->dir(), r.ok, r.bad,
                    r.removed);
        if (r.bad > r.removed) util::print("run `rtattn verify --repair` to remove the bad entries\n");
    }
    return r.bad > r.removed ? kWorkFailed : kOk;
}

constexpr int kMaxAgeDays = 36500;

struct PruneArgs {
    std::uint64_t max_size = 0;
    double older_than = 0;  // seconds
    bool dry_run = false, json = false;
    CLI::Option *max_size_opt = nullptr, *older_than_opt = nullptr;
};

int prune(const GlobalOptions& g, const PruneArgs& a) {
    if (!a.max_size_opt->count() && !a.older_than_opt->count())
        throw ConfigError("--max-size", "prune needs --max-size and/or --older-than (use `rtattn clear` to remove "
                                        "everything)");
    std::optional<std::uint64_t> max_bytes;
    std::optional<std::int64_t> older_than;
    if (a.max_size_opt->count()) max_bytes = a.max_size;
    if (a.older_than_opt->count()) {
        // Nothing is older than a century, and a bound keeps seconds * 1e9 far from int64's end (NaN fails it too).
        if (!(a.older_than >= 0 && a.older_than <= kMaxAgeDays * 86400.0))
            throw ConfigError("--older-than", util::format("{} is out of range; allowed 0..{}d ({} years)",
                                                           a.older_than >= 86400
                                                              ? util::format("{:g}d", a.older_than / 86400)
                                                              : util::format("{:g}s", a.older_than),
                                                          kMaxAgeDays, kMaxAgeDays / 365));
        older_than = std::int64_t(a.older_than);
    }
    const auto disk = open_disk_cache(g);
    const auto r = disk->prune(max_bytes, older_than, a.dry_run);
    const std::uint64_t left = disk->total_bytes() - (a.dry_run ? r.bytes_freed : 0);
    if (a.json) {
        json j;
        j["dir"] = disk->dir();
        j["dry_run"] = a.dry_run;
        j["removed"] = r.removed;
        j["bytes_freed"] = r.bytes_freed;
        j["bytes_left"] = left;
        j["paths"] = r.paths;
        util::print("{}\n", dump(std::move(j)));
        return kOk;
    }
    if (a.dry_run)
        for (const auto& p : r.paths) util::print("would remove {}\n", p);
    util::print("{} {} entries ({}); {} left in {}\n", a.dry_run ? "would remove" : "removed", r.removed,
                human_bytes(r.bytes_freed), human_bytes(left), disk->dir());
    return kOk;
}

int clear(const GlobalOptions& g) {
    const auto disk = open_disk_cache(g);
    const auto r = disk->clear();
    util::print("removed {} entries from {}\n", r.entries, disk->dir());
    if (r.in_use > 0)
        util::print("left {} lock or temp file(s) that running processes hold; they go when those finish\n", r.in_use);
    return kOk;
}

}  // namespace

void add_cache_commands(CLI::App& app, const GlobalOptions& g, Action& action) {
    auto ls_args = std::make_shared<LsArgs>();
    auto* ls_cmd = app.add_subcommand("ls", "list cache entries by config: arch, size, last use, registers, spills");
    ls_cmd->add_flag("--json", ls_args->json, "print JSON");
    ls_cmd->add_option("--arch", ls_args->archs, "only entries for these archs")->delimiter(',')->type_name("ARCH");
    ls_cmd->add_option("--head-dim", ls_args->head_dims, "only entries of these (QK) head dims")
        ->delimiter(',')
        ->type_name("D");
    ls_cmd->callback([&action, &g, ls_args] { action = [&g, ls_args] { return ls(g, *ls_args); }; });

    auto repair = std::make_shared<std::pair<bool, bool>>();  // --repair, --json
    auto* verify_cmd = app.add_subcommand("verify", "check every entry's header and checksum (exit 1 if any is bad)");
    verify_cmd->add_flag("--repair", repair->first, "remove bad entries (they are rebuilt on next use)");
    verify_cmd->add_flag("--json", repair->second, "print JSON");
    verify_cmd->callback(
        [&action, &g, repair] { action = [&g, repair] { return verify(g, repair->first, repair->second); }; });

    auto p = std::make_shared<PruneArgs>();
    auto* prune_cmd = app.add_subcommand("prune", "remove least recently used or old entries");
    // Binary units: cache sizes are compared with file sizes.
    p->max_size_opt = prune_cmd->add_option("--max-size", p->max_size, "keep at most this much, e.g. 500M, 2G or bytes")
                          ->transform(CLI::AsSizeValue(/*kb_is_1000=*/false))
                          ->type_name("SIZE");
    p->older_than_opt =
        prune_cmd
            ->add_option("--older-than", p->older_than, "remove entries unused for this long, e.g. 7d, 12h, 30m or seconds")
            ->transform(CLI::AsNumberWithUnit(std::map<std::string, double>{{"s", 1}, {"m", 60}, {"h", 3600},
                                                                            {"d", 86400}, {"w", 604800}},
                                              CLI::AsNumberWithUnit::CASE_INSENSITIVE))
            ->type_name("AGE");
    prune_cmd->add_flag("--dry-run", p->dry_run, "remove nothing; list what would be removed");
    prune_cmd->add_flag("--json", p->json, "print JSON");
    prune_cmd->callback([&action, &g, p] { action = [&g, p] { return prune(g, *p); }; });

    auto* clear_cmd = app.add_subcommand("clear", "remove every cache entry");
    clear_cmd->callback([&action, &g] { action = [&g] { return clear(g); }; });
}

}  // namespace rtattn::cli
