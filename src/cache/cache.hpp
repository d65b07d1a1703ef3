// Two-tier cubin cache: in-memory map + content-addressed disk store.
//
// Disk layout: <dir>/v<format>/<key[0:2]>/<key>.rtc (entries) and <key>.lock (per-key lock files).
// Entry file (little-endian):
//   magic "RTATTNC\0" (8) | format u32 | arch_len u32 | key (64 hex chars) | arch (arch_len bytes)
//   | cubin_size u64 | info_size u64 | sha256(cubin ‖ info) (32) | cubin | info (JSON: config, plan, ptxas figures)
// Verify on read: magic, format, key == file name, arch == requested arch, sizes == file size, checksum. A bad
// entry is removed, logged and reported as a miss; it is never served.
// Writes: temp file in the same dir -> fsync -> rename -> fsync(dir). Readers never lock.
// Single flight: one build per key across threads (in-process) and processes (flock on the key's lock file; the
// kernel drops a dead holder's flock, so stale locks cannot wedge anyone).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "util/log.hpp"

namespace rtattn::cache {

inline constexpr std::uint32_t kFormatVersion = 1;

struct Entry {
    std::string key;        // 64 lowercase hex chars (SHA-256)
    std::string arch;       // e.g. "sm_90a"
    std::string cubin;      // raw bytes
    std::string info_json;  // {"config":{...},"plan":{...},"registers":..,"spill_bytes":..,"compile_seconds":..}
};

struct Listing {
    std::string key, arch, path, info_json;
    std::uint64_t size = 0;       // file bytes
    std::int64_t last_use = 0;    // unix seconds (mtime; touched on every disk hit)
    bool ok = true;               // header and checksum verified
    std::string problem;          // why not ok
};

struct VerifyReport {
    int ok = 0, bad = 0, removed = 0;
    std::vector<std::string> problems;  // "<path>: <what is wrong>"
};

struct PruneReport {
    int removed = 0;
    std::uint64_t bytes_freed = 0;
};

// $RTATTN_CACHE_DIR, else $XDG_CACHE_HOME/rtattn, else $HOME/.cache/rtattn.
std::string default_dir();

class DiskCache {
public:
    // Creates `dir` (empty = default_dir()). If it cannot be created or written, the cache is disabled: one warning
    // is logged and every operation becomes a no-op miss.
    DiskCache(std::string dir, std::uint64_t max_bytes, util::Logger log);
    bool enabled() const { return enabled_; }
    // An existing directory we may read but not write (e.g. cubins baked into a container image): entries are
    // served, nothing is written, locked or removed, and new kernels live in memory only.
    bool read_only() const { return read_only_; }
    const std::string& dir() const { return dir_; }

    // Verified read; touches the entry's mtime. `was_bad` is set when a corrupt entry was found and removed.
    std::optional<Entry> load(const std::string& key, const std::string& arch, bool* was_bad = nullptr);
    // Atomic write, then eviction of least recently used entries while the total exceeds max_bytes (never the
    // entry just written). Returns bytes written (0 when disabled or on a logged I/O failure).
    std::uint64_t store(const Entry& e);

    class KeyLock {
    public:
        KeyLock() = default;
        explicit KeyLock(int fd) : fd_(fd) {}
        KeyLock(KeyLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
        KeyLock& operator=(KeyLock&& o) noexcept;
        ~KeyLock();
    private:
        int fd_ = -1;
    };
    // Blocks until this process holds the key's cross-process lock (a no-op lock when disabled).
    KeyLock lock(const std::string& key);

    std::vector<Listing> list() const;
    VerifyReport verify(bool repair);
    PruneReport prune(std::optional<std::uint64_t> max_bytes, std::optional<std::int64_t> older_than_seconds);
    int clear();  // removes every entry and lock file; returns entries removed
    std::uint64_t total_bytes() const;
    std::uint64_t evictions() const { return evictions_; }

    std::string entry_path(const std::string& key) const;

private:
    void require_enabled(const char* op) const;
    void require_writable(const char* op) const;
    void evict_over_cap(const std::string& keep);
    void discard_bad(const std::string& path, int fd, const std::string& problem);

    std::string dir_;      // <root>/v<format>
    std::uint64_t max_bytes_;  // 0: no cap
    util::Logger log_;
    bool enabled_ = false;
    bool read_only_ = false;
    std::string disabled_reason_;
    std::atomic<std::uint64_t> evictions_{0};  // stores of different keys run on several threads at once
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
    KernelCache(std::string dir, std::uint64_t max_bytes, util::Logger log);

    using Builder = std::function<Entry()>;
    // `build` == nullptr means cache-only: a miss throws CacheMissError("... " + what + ...).
    // `what` describes the request for messages (e.g. the config's describe()).
    std::shared_ptr<const Entry> get(const std::string& key, const std::string& arch, const Builder& build,
                                     const std::string& what, Source* source = nullptr);

    CacheCounters counters() const;
    DiskCache& disk() { return disk_; }
    const DiskCache& disk() const { return disk_; }

private:
    struct Flight;
    // The leader's work: disk, else (under the key's lock) disk again, else build and store.
    Entry fetch(const std::string& key, const std::string& arch, const Builder& build, const std::string& what,
                Source* source);
    std::optional<Entry> load_counted(const std::string& key, const std::string& arch);

    DiskCache disk_;
    util::Logger log_;
    mutable std::mutex mu_;
    std::map<std::string, std::shared_ptr<const Entry>> memory_;
    std::map<std::string, std::shared_ptr<Flight>> flights_;
    CacheCounters counters_;
};

}  // namespace rtattn::cache
