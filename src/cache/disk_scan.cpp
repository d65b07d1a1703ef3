// The disk tier's policy, part 2: the scans behind eviction, list, verify, prune and clear. A scan looks only into
// shard directories named by two hex digits, opened without following links, and sees only the names the cache
// creates there (entry_file.hpp); everything it removes is removed through remove_node or remove_unlocked.
#include <algorithm>
#include <cerrno>
#include <ctime>
#include <limits>

#include "cache/cache.hpp"
#include "core/errors.hpp"

namespace rtattn::cache {

namespace {

constexpr std::int64_t kMinNs = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMaxNs = std::numeric_limits<std::int64_t>::max();

// seconds * 1e9 + nanos, clamped to int64 (which ends in the years 1677 and 2262): an age of 150000 days or a file
// dated in the year 3000 stays in order instead of wrapping around (a wrapped cutoff pruned every entry).
std::int64_t to_ns(std::int64_t seconds, std::int64_t nanos) {
    std::int64_t ns = 0;
    if (__builtin_mul_overflow(seconds, std::int64_t(1'000'000'000), &ns) || __builtin_add_overflow(ns, nanos, &ns))
        return seconds < 0 ? kMinNs : kMaxNs;
    return ns;
}

std::int64_t mtime_ns(const struct stat& st) { return to_ns(st.st_mtim.tv_sec, st.st_mtim.tv_nsec); }

std::int64_t now_ns() {
    struct timespec ts {};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return to_ns(ts.tv_sec, ts.tv_nsec);
}

// Entries last used before this have been unused for longer than `age_seconds`; clamped like to_ns.
std::int64_t cutoff_ns(std::int64_t age_seconds) {
    const std::int64_t age = to_ns(age_seconds, 0);
    std::int64_t cutoff = 0;
    if (__builtin_sub_overflow(now_ns(), age, &cutoff)) return age > 0 ? kMinNs : kMaxNs;
    return cutoff;
}

}  // namespace

DiskCache::Scan DiskCache::scan(const fsys::Dir& vdir, const std::string& tree_distrust) const {
    Scan sc;
    std::vector<std::string> shards, names;
    if (auto s = vdir.list(&shards); !s.ok()) log_.warn(s.message());
    std::sort(shards.begin(), shards.end());
    for (const auto& name : shards) {
        // Write probes a killed process left behind (shard "": the version directory itself).
        Node n{"", name, Kind::temp, {}, tree_distrust};
        if (classify("", name) == Kind::temp && vdir.stat_child(name, &n.st).ok()) sc.nodes.push_back(std::move(n));
    }
    for (const auto& shard_name : shards) {
        if (!is_shard(shard_name)) continue;  // not a name the cache creates: never looked into, never removed
        fsys::Dir shard;
        std::string untrusted;
        const fsys::Status s = open_shard(vdir, shard_name, false, &shard, &untrusted);
        if (!s.ok() && !shard.is_open()) {
            struct stat st {};
            if (vdir.stat_child(shard_name, &st).ok() && !S_ISDIR(st.st_mode))
                sc.stray_shards.push_back(shard_name);
            else if (s.err() != ENOENT)
                log_.warn(s.message());
            continue;
        }
        if (auto l = shard.list(&names); !l.ok()) {
            log_.warn(l.message());
            continue;
        }
        for (const auto& name : names) {
            const auto kind = classify(shard_name, name);
            if (!kind) continue;  // not ours
            Node n{shard_name, name, *kind, {}, tree_distrust.empty() ? untrusted : tree_distrust};
            if (shard.stat_child(name, &n.st).ok()) sc.nodes.push_back(std::move(n));  // else removed since
        }
    }
    return sc;
}

std::optional<Listing> DiskCache::inspect(const fsys::Dir& shard, const Node& n) const {
    Listing l;
    l.path = shard.child_path(n.name);
    l.key = n.name.substr(0, n.name.find('.'));
    l.size = std::uint64_t(n.st.st_size);
    l.last_use = mtime_ns(n.st) / 1'000'000'000;
    fsys::Fd fd;
    struct stat st {};
    const fsys::Status s = fsys::open_regular(shard, n.name, &fd, &st);
    if (s.err() == ENOENT) return std::nullopt;  // evicted since the scan
    Entry e;
    if (!s.ok())
        l.problem = s.message();
    else if (!n.shard_distrust.empty())
        l.problem = "not trusted: " + n.shard_distrust;
    else if (std::string d = distrust(st, options_.trust); !d.empty())
        l.problem = "not trusted: it " + d;
    else
        l.problem = read_entry(fd.get(), std::uint64_t(st.st_size), l.path, l.key, &e);
    l.ok = l.problem.empty();
    l.arch = e.arch;
    l.info_json = e.info_json;
    return l;
}

std::vector<Listing> DiskCache::list_entries(const fsys::Dir& vdir, const Scan& sc) const {
    std::vector<Listing> out;
    fsys::Dir shard;
    for (const auto& n : sc.nodes) {
        if (n.kind != Kind::entry) continue;
        if (shard.path() != vdir.child_path(n.shard) && !vdir.open_child(n.shard, false, 0, &shard).ok()) continue;
        if (auto l = inspect(shard, n)) out.push_back(std::move(*l));
    }
    std::sort(out.begin(), out.end(), [](const Listing& a, const Listing& b) { return a.key < b.key; });
    return out;
}

std::vector<Listing> DiskCache::list() const {
    require_listable("list");
    fsys::Dir vdir;
    std::string untrusted;
    if (!open_to_look(&vdir, &untrusted)) return {};
    return list_entries(vdir, scan(vdir, untrusted));
}

DiskCache::Removal DiskCache::remove_node(const fsys::Dir& vdir, const Node& n, bool only_unheld) const {
    fsys::Dir shard;
    fsys::Status s = n.shard.empty() ? fsys::Status() : vdir.open_child(n.shard, false, 0, &shard);
    const fsys::Dir& dir = n.shard.empty() ? vdir : shard;
    bool busy = false;
    if (s.ok()) s = only_unheld ? fsys::remove_unlocked(dir, n.name, &busy) : dir.remove(n.name);
    if (s.err() == ENOENT) return Removal::gone;  // someone else removed it first
    if (!s.ok()) {
        log_.warn(s.message());
        return Removal::failed;
    }
    return busy ? Removal::busy : Removal::removed;
}

void DiskCache::remove_stale(const fsys::Dir& vdir, const Scan& sc, ClearReport* report) const {
    for (const auto& n : sc.nodes) {
        if (n.kind == Kind::entry) continue;
        const Removal r = remove_node(vdir, n, /*only_unheld=*/true);
        if (r == Removal::busy && report) ++report->in_use;
        if (r == Removal::removed && n.kind == Kind::temp) log_.info("removed a dead writer's temp file " + n.name);
    }
}

// Removes the least recently used regular entries until their total is at most `cap`, sparing `keep`.
PruneReport DiskCache::remove_oldest(const fsys::Dir& vdir, std::vector<Node> entries, std::uint64_t cap,
                                     const std::string& keep, bool dry_run) const {
    PruneReport r;
    std::uint64_t total = 0;
    for (const auto& n : entries) total += std::uint64_t(n.st.st_size);
    if (total <= cap) return r;
    std::sort(entries.begin(), entries.end(), [](const Node& a, const Node& b) {
        return mtime_ns(a.st) != mtime_ns(b.st) ? mtime_ns(a.st) < mtime_ns(b.st) : a.name < b.name;
    });
    for (const auto& n : entries) {
        if (total <= cap) break;
        if (n.name == keep) continue;
        const Removal how = dry_run ? Removal::removed : remove_node(vdir, n, /*only_unheld=*/false);
        if (how == Removal::removed) {
            ++r.removed;
            r.bytes_freed += std::uint64_t(n.st.st_size);
            r.paths.push_back(vdir.child_path(n.shard + "/" + n.name));
        }
        // Someone else removing it first frees the space just the same.
        if (how == Removal::removed || how == Removal::gone) total -= std::uint64_t(n.st.st_size);
    }
    return r;
}

std::vector<DiskCache::Node> DiskCache::regular_entries(const Scan& sc) {
    std::vector<Node> out;
    for (const auto& n : sc.nodes)
        if (n.kind == Kind::entry && S_ISREG(n.st.st_mode)) out.push_back(n);
    return out;
}

void DiskCache::evict_over_cap(const fsys::Dir& vdir, const std::string& keep_key) {
    if (options_.max_bytes == 0) return;
    const Scan sc = scan(vdir, "");
    remove_stale(vdir, sc, nullptr);  // dead writers' temp files, proven dead by their free lock
    const PruneReport r = remove_oldest(vdir, regular_entries(sc), options_.max_bytes, entry_name(keep_key));
    if (r.removed > 0) {
        evictions_ += std::uint64_t(r.removed);
        log_.debug("evicted " + std::to_string(r.removed) + " cache entries (" + std::to_string(r.bytes_freed) +
                   " bytes) to stay under " + std::to_string(options_.max_bytes) + " bytes in " + dir_);
    }
}

// ---- maintenance ----------------------------------------------------------------------------------------------------

void DiskCache::require_listable(const char* op) const {
    if (state_ == State::disabled)
        throw CacheError(std::string("cannot ") + op + " the disk cache at " + (dir_.empty() ? "(none)" : dir_) +
                         ": " + problem_);
}

void DiskCache::require_writable(const char* op) const {
    require_listable(op);
    if (state_ == State::read_only || state_ == State::refused)
        throw CacheError(std::string("cannot ") + op + " the disk cache at " + dir_ + ": " + problem_);
}

VerifyReport DiskCache::verify(bool repair) {
    if (repair) require_writable("repair");
    require_listable("verify");
    VerifyReport r;
    fsys::Dir vdir;
    std::string untrusted;
    if (!open_to_look(&vdir, &untrusted)) return r;
    const Scan sc = scan(vdir, untrusted);
    for (const auto& name : sc.stray_shards) {
        struct stat st {};
        const std::string what = vdir.stat_child(name, &st).ok() ? fsys::node_type(st.st_mode) : "not a directory";
        ++r.bad;
        r.problems.push_back(vdir.child_path(name) + ": is " + what + " where a shard directory belongs; not followed");
        if (repair && vdir.remove(name).ok()) ++r.removed;
    }
    for (const auto& l : list_entries(vdir, sc)) {
        if (l.ok) {
            ++r.ok;
            continue;
        }
        ++r.bad;
        r.problems.push_back(l.path + ": " + l.problem);
        if (repair) {
            fsys::Dir shard;
            const std::string name = l.path.substr(l.path.rfind('/') + 1);
            if (vdir.open_child(shard_of(l.key), false, 0, &shard).ok()) {
                if (auto s = shard.remove(name); s.ok())
                    ++r.removed;
                else
                    r.problems.back() += " (cannot remove it: " + fsys::errno_text(s.err()) + ")";
            }
        }
    }
    if (repair) remove_stale(vdir, sc, nullptr);
    return r;
}

PruneReport DiskCache::prune(std::optional<std::uint64_t> max_bytes, std::optional<std::int64_t> older_than_seconds,
                             bool dry_run) {
    if (!dry_run) require_writable("prune");
    require_listable("prune");
    fsys::Dir vdir;
    std::string untrusted;
    if (absent() || !open_tree(false, &vdir, &untrusted).ok()) return {};
    const Scan sc = scan(vdir, "");
    // Lock files nobody holds and dead writers' temp files are garbage, not entries: removed but not reported.
    if (!dry_run) remove_stale(vdir, sc, nullptr);
    std::vector<Node> old, kept;
    const std::int64_t cutoff = older_than_seconds ? cutoff_ns(*older_than_seconds) : kMinNs;
    for (auto& n : regular_entries(sc)) (mtime_ns(n.st) < cutoff ? old : kept).push_back(std::move(n));
    PruneReport r = remove_oldest(vdir, std::move(old), 0, "", dry_run);  // a cap of 0 takes every one
    if (max_bytes) {
        const PruneReport e = remove_oldest(vdir, std::move(kept), *max_bytes, "", dry_run);
        r.removed += e.removed;
        r.bytes_freed += e.bytes_freed;
        r.paths.insert(r.paths.end(), e.paths.begin(), e.paths.end());
    }
    return r;
}

// Lock and temp files a live process holds stay: its build or write finishes as if nothing happened.
ClearReport DiskCache::clear() {
    require_writable("clear");
    ClearReport r;
    fsys::Dir vdir;
    std::string untrusted;
    if (absent() || !open_tree(false, &vdir, &untrusted).ok()) return r;
    const Scan sc = scan(vdir, "");
    for (const auto& name : sc.stray_shards)
        if (auto s = vdir.remove(name); !s.ok()) log_.warn(s.message());
    for (const auto& n : sc.nodes)
        if (n.kind == Kind::entry && remove_node(vdir, n, false) == Removal::removed) ++r.entries;
    remove_stale(vdir, sc, &r);
    return r;
}

std::uint64_t DiskCache::total_bytes() const {
    fsys::Dir vdir;
    std::string untrusted;
    if (!enabled() || !open_tree(false, &vdir, &untrusted).ok()) return 0;
    std::uint64_t total = 0;
    for (const auto& n : regular_entries(scan(vdir, ""))) total += std::uint64_t(n.st.st_size);
    return total;
}

}  // namespace rtattn::cache
