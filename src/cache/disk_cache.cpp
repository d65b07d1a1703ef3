// The disk tier's policy, part 1: open and trust the tree, load, store, lock. The scans behind eviction, list,
// verify, prune and clear are in disk_scan.cpp; the system calls in fsys.cpp, the byte format in entry_file.cpp,
// the trust rule in trust.cpp.
#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>

#include "cache/cache.hpp"
#include "core/errors.hpp"
#include "util/text.hpp"

namespace rtattn::cache {

namespace {

constexpr mode_t kDirMode = 0755;         // less the umask: what the cache creates is never wider
constexpr mode_t kPrivateDirMode = 0700;  // a per-user default root, as XDG asks for its tree

// (Appended, not "v" + ...: GCC 12 warns falsely about that form.)
std::string version_dir() { return std::string("v").append(std::to_string(kFormatVersion)); }

void check_key(const std::string& key) {
    // Keys become file names: anything but a SHA-256 hex digest is a caller bug (and could escape the directory).
    if (!is_key(key)) throw CacheError("invalid cache key " + util::quoted(key) + ": expected 64 lowercase hex digits");
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

CacheRoot default_root() {
    if (const char* d = std::getenv("RTATTN_CACHE_DIR"); d && *d) return {d, false};
    // The XDG spec says to ignore a relative XDG_CACHE_HOME.
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return {std::string(x) + "/rtattn", true};
    const std::string home = home_dir();
    return {home.empty() ? "" : home + "/.cache/rtattn", true};
}

std::string default_dir() { return default_root().path; }

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
        warn_once(untrusted,
                  "not loading from " + untrusted + "; " + trust_advice(untrusted.substr(0, untrusted.find(' '))));
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

}  // namespace rtattn::cache
