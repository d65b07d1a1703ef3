// The disk tier's policy: open and trust the tree, load, store, and the scans behind eviction, list, verify,
// prune and clear. The system calls are in fsys.cpp, the byte format in entry_file.cpp, the trust rule in trust.cpp.
#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>

#include "cache/cache.hpp"
#include "rtattn/errors.hpp"
#include "util/text.hpp"

namespace rtattn::cache {

namespace {

constexpr mode_t kDirMode = 0755;         // less the umask: what the cache creates is never wider
constexpr mode_t kPrivateDirMode = 0700;  // a per-user default root, as XDG asks for its tree

std::string version_dir() { return "v" + std::to_string(kFormatVersion); }

void check_key(const std::string& key) {
    // Keys become file names: anything but a SHA-256 hex digest is a caller bug (and could escape the directory).
    if (!is_key(key)) throw CacheError("invalid cache key " + util::quoted(key) + ": expected 64 lowercase hex digits");
}

std::int64_t mtime_ns(const struct stat& st) {
    return std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::int64_t now_ns() {
    struct timespec ts {};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string home_dir() {
    if (const char* h = std::getenv("HOME"); h && *h) return h;
    struct passwd pw {};
    struct passwd* found = nullptr;
    char buf[4096];
    if (::getpwuid_r(::getuid(), &pw, buf, sizeof buf, &found) == 0 && found && found->pw_dir) return found->pw_dir;
    return "";
}

}  // namespace

// One name in a shard directory that the cache could have created, as the scan found it.
struct DiskCache::Node {
    std::string shard, name;
    Kind kind;
    struct stat st {};  // of the name itself (a link is not followed)
    std::string shard_distrust;  // why the shard directory is not trusted, "" if it is
};

struct DiskCache::Scan {
    std::vector<Node> nodes;
    std::vector<std::string> stray_shards;  // shard names in v<format> that are not directories (e.g. symlinks)
};

CacheRoot default_root() {
    if (const char* d = std::getenv("RTATTN_CACHE_DIR"); d && *d) return {d, false};
    // The XDG spec says to ignore a relative XDG_CACHE_HOME.
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return {std::string(x) + "/rtattn", true};
    const std::string home = home_dir();
    return {home.empty() ? "" : home + "/.cache/rtattn", true};
}

std::string default_dir() { return default_root().path; }

bool shared_cache_from_env() {
    const char* v = std::getenv("RTATTN_SHARED_CACHE");
    return v && std::string_view(v) == "1";
}

DiskCache::DiskCache(std::string dir, DiskOptions options, util::Logger log)
    : options_(options), log_(std::move(log)) {
    CacheRoot root = dir.empty() ? default_root() : CacheRoot{std::move(dir), false};
    while (root.path.size() > 1 && root.path.back() == '/') root.path.pop_back();
    if (root.path.empty()) {
        problem_ = "no cache directory: set RTATTN_CACHE_DIR or HOME";
        log_.warn("cache dir is unknown (" + problem_ + "); caching in memory only");
        return;
    }
    root_ = root.path;
    per_user_root_ = root.per_user;
    dir_ = root_ + "/" + version_dir();

    fsys::Dir vdir;
    std::string untrusted;
    const fsys::Status s = open_tree(options_.create, &vdir, &untrusted);
    if (!untrusted.empty()) {
        state_ = State::refused;
        problem_ = "cache dir " + root_ + " is not trusted: " + untrusted;
        log_.warn(problem_ + "; its entries are neither loaded nor stored (kernels are compiled into memory). " +
                  "To use it, " + trust_advice(untrusted.substr(0, untrusted.find(' '))));
        return;
    }
    if (!s.ok()) {
        if (!options_.create && s.err() == ENOENT) {
            state_ = State::absent;
            problem_ = "cache dir " + root_ + " does not exist";
            return;
        }
        problem_ = s.message();
        log_.warn("cache dir " + root_ + " is not usable (" + problem_ + "); caching in memory only");
        return;
    }
    if (options_.create) {
        // Permission bits do not tell the whole story (read-only mounts, ACLs, root): try it.
        fsys::TempFile probe;
        const fsys::Status w = fsys::TempFile::create(vdir, temp_prefix("probe"), &probe);
        state_ = w.ok() ? State::usable : State::read_only;
        if (!w.ok()) {
            problem_ = "cache dir " + root_ + " is read-only (" + w.message() + ")";
            log_.warn(problem_ + "; serving its entries, caching new kernels in memory only");
        }
    } else {
        // Only looking: no probe file. Maintenance commands learn here whether they may remove anything.
        state_ = ::faccessat(vdir.fd(), ".", W_OK, AT_EACCESS) == 0 ? State::usable : State::read_only;
        if (state_ == State::read_only)
            problem_ = "cache dir " + root_ + " is read-only (" + fsys::errno_text(errno) + ")";
    }
}

const char* DiskCache::state_name() const {
    switch (state_) {
        case State::usable: return "usable";
        case State::read_only: return "read-only";
        case State::absent: return "absent";
        case State::refused: return "not trusted";
        case State::disabled: return "off";
    }
    return "?";
}

// An untrusted tree is still opened (without creating anything in it), so that `rtattn ls` can show it; the
// failed Status keeps every loading and writing caller out.
fsys::Status DiskCache::open_tree(bool create, fsys::Dir* vdir, std::string* untrusted) const {
    fsys::Dir root;
    if (auto s = fsys::Dir::open_path(root_, create, per_user_root_ ? kPrivateDirMode : kDirMode, &root); !s.ok())
        return s;
    struct stat st {};
    if (auto s = root.stat(&st); !s.ok()) return s;
    if (std::string d = distrust(st, options_.trust); !d.empty()) *untrusted = root_ + " " + d;
    if (auto s = root.open_child(version_dir(), create && untrusted->empty(), kDirMode, vdir); !s.ok()) return s;
    if (auto s = vdir->stat(&st); !s.ok()) return s;
    if (std::string d = distrust(st, options_.trust); !d.empty() && untrusted->empty()) *untrusted = dir_ + " " + d;
    return untrusted->empty() ? fsys::Status() : fsys::Status::failure(0, *untrusted);
}

bool DiskCache::open_to_look(fsys::Dir* vdir, std::string* untrusted) const {
    if (absent()) return false;
    return open_tree(false, vdir, untrusted).ok() || (!untrusted->empty() && vdir->is_open());
}

fsys::Status DiskCache::open_shard(const fsys::Dir& vdir, const std::string& shard, bool create, fsys::Dir* out,
                                   std::string* untrusted) const {
    if (auto s = vdir.open_child(shard, create, kDirMode, out); !s.ok()) return s;
    struct stat st {};
    if (auto s = out->stat(&st); !s.ok()) return s;
    if (std::string d = distrust(st, options_.trust); !d.empty()) {
        *untrusted = out->path() + " " + d;
        return fsys::Status::failure(0, *untrusted);
    }
    return {};
}

void DiskCache::warn_once(const std::string& what, const std::string& message) const {
    {
        std::lock_guard<std::mutex> g(warned_mu_);
        if (!warned_.insert(what).second) return;
    }
    log_.warn(message);
}

std::string DiskCache::entry_path(const std::string& key) const {
    check_key(key);
    return dir_ + "/" + shard_of(key) + "/" + entry_name(key);
}

// ---- load and store -------------------------------------------------------------------------------------------------

DiskCache::Loaded DiskCache::load(const std::string& key, const std::string& arch) {
    Loaded r;
    if (state_ == State::refused) r.refused = problem_;
    if (!enabled()) return r;
    check_key(key);
    fsys::Dir vdir, shard;
    std::string untrusted;
    fsys::Status s = open_tree(false, &vdir, &untrusted);
    if (s.ok()) s = open_shard(vdir, shard_of(key), false, &shard, &untrusted);
    if (!untrusted.empty()) {
        r.refused = untrusted;
        warn_once(untrusted, "not loading from " + untrusted + "; " + trust_advice(untrusted.substr(0, untrusted.find(' '))));
        return r;
    }
    // Anything else in the way of the directories is a miss here; the write path reports it, as "not stored".
    if (!s.ok()) return r;
    const std::string name = entry_name(key), path = shard.child_path(name);
    fsys::Fd fd;
    struct stat st {};
    s = fsys::open_regular(shard, name, &fd, &st);
    if (s.err() == ENOENT) return r;
    if (!s.ok() && s.err() != 0) {
        // An I/O error says nothing about the entry's contents: a miss, and the file is left alone.
        warn_once(path, "cannot read cache entry: " + s.message());
        return r;
    }
    std::string problem = s.message();  // a link or other node where the entry belongs
    if (problem.empty()) {
        if (std::string d = distrust(st, options_.trust); !d.empty()) {
            r.refused = path + " " + d;
            warn_once(path, "not loading cache entry " + r.refused + "; " + trust_advice(path));
            return r;
        }
        problem = read_entry(fd.get(), std::uint64_t(st.st_size), path, key, &r.entry.emplace());
        // The key hashes the arch, so a foreign arch under this name means a broken writer or a tampered file.
        if (problem.empty() && r.entry->arch != arch)
            problem = "entry is for arch " + r.entry->arch + ", requested " + util::escaped(arch);
    }
    if (!problem.empty()) {
        r.entry.reset();
        r.bad = true;
        if (read_only())
            warn_once(path, "ignoring bad cache entry " + path + " in a read-only cache: " + problem);
        else
            discard_bad(shard, name, fd.get(), problem);
        return r;
    }
    // The mtime is the LRU clock. A read-only (shared) cache cannot be touched; that only weakens eviction.
    if (!read_only() && ::futimens(fd.get(), nullptr) != 0)
        log_.debug("cannot touch " + path + ": " + fsys::errno_text(errno));
    return r;
}

void DiskCache::discard_bad(const fsys::Dir& shard, const std::string& name, int fd, const std::string& problem) {
    const std::string path = shard.child_path(name);
    // A writer may have renamed a fresh entry over the bad one since we opened it; do not delete that one.
    struct stat opened {}, now {};
    if (fd >= 0 && !(::fstat(fd, &opened) == 0 && shard.stat_child(name, &now).ok() && opened.st_dev == now.st_dev &&
                     opened.st_ino == now.st_ino)) {
        log_.warn("bad cache entry " + path + ": " + problem + " (already replaced by another writer)");
        return;
    }
    log_.warn("removing bad cache entry " + path + ": " + problem);
    if (auto s = shard.remove(name); !s.ok() && s.err() != ENOENT) log_.warn(s.message());
}

std::string DiskCache::store(const Entry& e, std::uint64_t* bytes) {
    if (bytes) *bytes = 0;
    if (state_ != State::usable) return problem_;
    check_key(e.key);
    const std::string path = entry_path(e.key);
    const auto fail = [&](const std::string& why) {
        log_.warn("cannot store " + path + ": " + why + "; the kernel is kept in memory only");
        return why;
    };
    if (e.arch.empty() || e.arch.size() > 64 || util::escaped(e.arch) != e.arch)
        return fail("arch " + util::quoted(e.arch) + " is not an arch name");
    fsys::Dir vdir, shard;
    std::string untrusted;
    fsys::Status s = open_tree(true, &vdir, &untrusted);
    if (s.ok()) s = open_shard(vdir, shard_of(e.key), true, &shard, &untrusted);
    if (!s.ok()) return untrusted.empty() ? fail(s.message()) : "not trusted: " + untrusted;  // load warned
    const std::string encoded = encode_entry(e);
    {
        fsys::TempFile tmp;
        s = fsys::TempFile::create(shard, temp_prefix(e.key), &tmp);
        if (s.ok()) s = tmp.write(encoded);
        if (s.ok()) s = tmp.commit(entry_name(e.key));
        if (!s.ok()) return fail(s.message());
    }
    // The entry is already visible; losing it on power failure only costs a recompile.
    if (s = shard.sync(); !s.ok()) log_.warn(s.message());
    if (bytes) *bytes = encoded.size();
    evict_over_cap(vdir, e.key);
    return "";
}

DiskCache::KeyLock DiskCache::lock(const std::string& key) {
    KeyLock k;
    if (state_ != State::usable) {
        k.problem_ = problem_;
        return k;
    }
    check_key(key);
    fsys::Dir vdir, shard;
    std::string untrusted;
    fsys::Status s = open_tree(true, &vdir, &untrusted);
    if (s.ok()) s = open_shard(vdir, shard_of(key), true, &shard, &untrusted);
    if (s.ok()) {
        const std::string path = shard.child_path(lock_name(key));
        fsys::LockFile::Wait wait{options_.lock_timeout, options_.lock_warn_after, [&](const std::string& holder) {
                                      log_.warn("waiting for " + path + ", held by " +
                                                (holder.empty() ? "an unknown process" : holder) +
                                                " (building the same kernel); giving up after " +
                                                std::to_string(options_.lock_timeout.count()) + " ms");
                                  }};
        s = fsys::LockFile::acquire(shard, lock_name(key), wait, &k.file_);
    }
    if (!s.ok()) {
        k.problem_ = untrusted.empty() ? s.message() : "not trusted: " + untrusted;
        // One warning per path: a shard that is not trusted was named when its entry was refused.
        warn_once(untrusted.empty() ? s.message() : untrusted,
                  k.problem_ + "; building without storing, so that the entry never has two writers");
    }
    return k;
}

// ---- scans ----------------------------------------------------------------------------------------------------------

DiskCache::Scan DiskCache::scan(const fsys::Dir& vdir, const std::string& tree_distrust) const {
    Scan sc;
    std::vector<std::string> shards, names;
    if (auto s = vdir.list(&shards); !s.ok()) log_.warn(s.message());
    std::sort(shards.begin(), shards.end());
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
    fsys::Status s = vdir.open_child(n.shard, false, 0, &shard);
    bool busy = false;
    if (s.ok()) s = only_unheld ? fsys::remove_unlocked(shard, n.name, &busy) : shard.remove(n.name);
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
                                     const std::string& keep) const {
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
        const Removal how = remove_node(vdir, n, /*only_unheld=*/false);
        if (how == Removal::removed) {
            ++r.removed;
            r.bytes_freed += std::uint64_t(n.st.st_size);
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

PruneReport DiskCache::prune(std::optional<std::uint64_t> max_bytes, std::optional<std::int64_t> older_than_seconds) {
    require_writable("prune");
    fsys::Dir vdir;
    std::string untrusted;
    if (absent() || !open_tree(false, &vdir, &untrusted).ok()) return {};
    const Scan sc = scan(vdir, "");
    // Lock files nobody holds and dead writers' temp files are garbage, not entries: removed but not reported.
    remove_stale(vdir, sc, nullptr);
    PruneReport r;
    std::vector<Node> kept;
    const std::int64_t now = now_ns();
    for (auto& n : regular_entries(sc)) {
        if (older_than_seconds && mtime_ns(n.st) < now - *older_than_seconds * 1'000'000'000 &&
            remove_node(vdir, n, false) == Removal::removed) {
            ++r.removed;
            r.bytes_freed += std::uint64_t(n.st.st_size);
        } else {
            kept.push_back(std::move(n));
        }
    }
    if (max_bytes) {
        const PruneReport e = remove_oldest(vdir, std::move(kept), *max_bytes, "");
        r.removed += e.removed;
        r.bytes_freed += e.bytes_freed;
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
