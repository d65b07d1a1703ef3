// Two-tier cubin cache: an in-memory map and single flight (KernelCache) in front of a content-addressed disk store
// (DiskCache). Names and entry format: entry_file.hpp. Whom it trusts: trust.hpp. POSIX plumbing: fsys.hpp.
//
// Reads verify every entry: a bad one is removed, logged and rebuilt, never served; an untrusted one is neither
// loaded nor removed, and one warning says why. Writes go to a locked temp file in the entry's shard, are fsynced
// and renamed into place. One build per key across threads (single flight) and processes (the key's lock file,
// waited on for a bounded time; past it the kernel is built into memory and not stored, so an entry never has two
// writers). Readers never lock. Nothing follows a symlink below the cache root, and only names the cache creates
// are ever removed.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cache/entry_file.hpp"
#include "cache/fsys.hpp"
#include "cache/trust.hpp"
#include "util/log.hpp"

namespace rtattn::cache {

struct Listing {
    std::string key, arch, path, info_json;
    std::uint64_t size = 0;     // file bytes
    std::int64_t last_use = 0;  // unix seconds (mtime; touched on every disk hit)
    bool ok = true;             // a trusted regular file whose header, checksum and info verified
    std::string problem;        // why not ok (escaped: safe to print)
};

struct VerifyReport {
    int ok = 0, bad = 0, removed = 0;
    std::vector<std::string> problems;  // "<path>: <what is wrong>"
};

struct PruneReport {
    int removed = 0;  // with dry_run: would be removed
    std::uint64_t bytes_freed = 0;
    std::vector<std::string> paths;  // the entries removed, oldest first
};

struct ClearReport {
    int entries = 0;  // entries removed
    int in_use = 0;   // lock and temp files left because a live process holds them
};

// Where the cache lives when no directory is given: $RTATTN_CACHE_DIR, else $XDG_CACHE_HOME/rtattn, else
// $HOME/.cache/rtattn. The last two are the user's own tree, created 0700 as XDG asks.
struct CacheRoot {
    std::string path;  // "" when none can be found
    bool per_user = false;
};
CacheRoot default_root();
std::string default_dir();  // default_root().path

struct DiskOptions {
    std::uint64_t max_bytes = 0;  // least recently used entries are evicted past this; 0: no cap
    bool create = true;           // false: never create a directory (ls, info, verify only look)
    TrustPolicy trust;
    std::chrono::milliseconds lock_timeout{60000};    // past this, a kernel is built into memory, not stored
    std::chrono::milliseconds lock_warn_after{5000};  // then one warning names the lock and its holder
};

class DiskCache {
public:
    // Opens `dir` (empty: default_root()). A directory that cannot be used, or is not trusted, gives one warning
    // and leaves the disk tier off (loads miss, stores are skipped and say why).
    DiskCache(std::string dir, DiskOptions options, util::Logger log);
    // Entries may be loaded, and, unless read_only(), stored.
    bool enabled() const { return state_ == State::usable || state_ == State::read_only; }
    // An existing directory we may read but not write (cubins baked into a read-only image): entries are served,
    // nothing is written, locked or removed.
    bool read_only() const { return state_ == State::read_only; }
    // Opened with create = false and the directory does not exist yet: an empty cache.
    bool absent() const { return state_ == State::absent; }
    const std::string& dir() const { return dir_; }  // <root>/v<format>
    const std::string& problem() const { return problem_; }  // why the tier is off or read-only; "" if usable
    // "usable", "read-only", "absent", "not trusted" or "off", for `rtattn info`.
    const char* state_name() const;

    struct Loaded {
        std::optional<Entry> entry;
        bool bad = false;     // a corrupt entry was found (and removed, when the cache is writable)
        std::string refused;  // an entry exists but was not loaded, and why (it is not trusted)
    };
    // Verified, trusted read; touches the entry's mtime (the LRU clock).
    Loaded load(const std::string& key, const std::string& arch);
    // Atomic write, then eviction of least recently used entries while the total exceeds max_bytes (never the
    // entry just written). Returns "" when stored, else why not (a failure is logged too). *bytes: bytes written.
    std::string store(const Entry& e, std::uint64_t* bytes = nullptr);

    class KeyLock {
    public:
        bool held() const { return file_.held(); }
        const std::string& problem() const { return problem_; }  // why not held
    private:
        friend class DiskCache;
        fsys::LockFile file_;
        std::string problem_;
    };
    // The key's cross-process lock, waited for at most lock_timeout. Not held (and problem() says why) when the
    // cache cannot be written, the lock file is not a regular file, or the wait timed out.
    KeyLock lock(const std::string& key);

    std::vector<Listing> list() const;  // every entry name, sound or not, sorted by key
    VerifyReport verify(bool repair);   // list() plus shard names that are not directories; repair removes them
    // Removes entries unused for longer than older_than_seconds, then least recently used ones until at most max_bytes
    // are left, and lock and temp files nobody holds. dry_run: removes nothing, reports what would go.
    PruneReport prune(std::optional<std::uint64_t> max_bytes, std::optional<std::int64_t> older_than_seconds,
                      bool dry_run = false);
    ClearReport clear();  // every entry, and every lock and temp file nobody holds
    std::uint64_t total_bytes() const;
    std::uint64_t evictions() const { return evictions_; }
    std::string entry_path(const std::string& key) const;

private:
    enum class State { usable, read_only, absent, refused, disabled };
    enum class Removal { removed, busy, gone, failed };
    // One name in a shard directory that the cache could have created, as the scan found it.
    struct Node {
        std::string shard, name;  // shard "": the version directory itself (write probes)
        Kind kind;
        struct stat st {};  // of the name itself (a link is not followed)
        std::string shard_distrust;  // why the shard (or the whole tree) is not trusted, "" if it is
    };
    struct Scan {
        std::vector<Node> nodes;
        std::vector<std::string> stray_shards;  // shard names in v<format> that are not directories (e.g. symlinks)
    };

    // Open the root and v<format> (or a shard) directories, checking trust on the way; *untrusted says why not.
    fsys::Status open_tree(bool create, fsys::Dir* vdir, std::string* untrusted) const;
    fsys::Status open_shard(const fsys::Dir& vdir, const std::string& shard, bool create, fsys::Dir* out,
                            std::string* untrusted) const;
    // Opens the tree for list and verify: trusted or not, never created. False when there is nothing to look at.
    bool open_to_look(fsys::Dir* vdir, std::string* untrusted) const;
    // The names the cache could have created under vdir; an untrusted tree marks every entry so.
    Scan scan(const fsys::Dir& vdir, const std::string& tree_distrust) const;
    static std::vector<Node> regular_entries(const Scan& sc);
    std::optional<Listing> inspect(const fsys::Dir& shard, const Node& n) const;
    std::vector<Listing> list_entries(const fsys::Dir& vdir, const Scan& sc) const;
    Removal remove_node(const fsys::Dir& vdir, const Node& n, bool only_unheld) const;
    void remove_stale(const fsys::Dir& vdir, const Scan& sc, ClearReport* report) const;
    PruneReport remove_oldest(const fsys::Dir& vdir, std::vector<Node> entries, std::uint64_t cap,
                              const std::string& keep, bool dry_run = false) const;
    void discard_bad(const fsys::Dir& shard, const std::string& name, int fd, const std::string& problem);
    void evict_over_cap(const fsys::Dir& vdir, const std::string& keep_key);
    void require_listable(const char* op) const;
    void require_writable(const char* op) const;
    void warn_once(const std::string& what, const std::string& message) const;

    std::string root_, dir_;
    bool per_user_root_ = false;
    DiskOptions options_;
    util::Logger log_;
    State state_ = State::disabled;
    std::string problem_;
    std::atomic<std::uint64_t> evictions_{0};  // stores of different keys run on several threads at once
    mutable std::mutex warned_mu_;
    mutable std::set<std::string> warned_;
};

enum class Source { memory, disk, compiled };

struct CacheCounters {
    std::uint64_t memory_hits = 0, disk_hits = 0, misses = 0, compiles = 0, bad_entries = 0, bytes_written = 0;
    double compile_seconds = 0;
};

// Memory tier + disk tier + single flight. `build` runs at most once per key across threads of this process and,
// through the disk lock, across processes sharing the directory.
class KernelCache {
public:
    KernelCache(std::string dir, DiskOptions options, util::Logger log);

    using Builder = std::function<Entry()>;
    struct Lookup {
        std::shared_ptr<const Entry> entry;
        Source source = Source::memory;
        std::string not_stored;  // non-empty: the entry lives in this process only, and why it is not on disk
    };
    // `build` == nullptr means cache-only: a miss throws CacheMissError naming `what` (the config's describe())
    // and, when an entry was refused, why.
    Lookup get(const std::string& key, const std::string& arch, const Builder& build, const std::string& what);

    CacheCounters counters() const;
    DiskCache& disk() { return disk_; }
    const DiskCache& disk() const { return disk_; }

private:
    struct Flight;
    struct Held {
        std::shared_ptr<const Entry> entry;
        std::string not_stored;
    };
    // The leader's work: disk, else (under the key's lock) disk again, else build and store.
    Lookup fetch(const std::string& key, const std::string& arch, const Builder& build, const std::string& what);
    DiskCache::Loaded load_counted(const std::string& key, const std::string& arch);

    DiskCache disk_;
    util::Logger log_;
    mutable std::mutex mu_;
    std::map<std::string, Held> memory_;
    std::map<std::string, std::shared_ptr<Flight>> flights_;
    CacheCounters counters_;
};

}  // namespace rtattn::cache
