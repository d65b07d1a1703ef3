// Memory tier + single flight in front of the disk tier.
//
// Every successful get counts exactly once as a memory hit, a disk hit or a miss. A thread that waited on
// another thread's flight counts as a memory hit: it got the kernel from this process without touching disk.
#include <chrono>
#include <exception>
#include <future>

#include "cache/cache.hpp"
#include "core/errors.hpp"

namespace rtattn::cache {

// One in-progress lookup. The leader fulfils the promise; followers wait on the shared future, which hands all
// of them the same entry or rethrows the same exception.
struct KernelCache::Flight {
    std::shared_future<Lookup> result;
};

namespace {

// The key already hashes the arch; keying memory by both keeps a misuse from serving a foreign cubin.
std::string memory_key(const std::string& key, const std::string& arch) { return key + '/' + arch; }

std::string cache_miss_message(const std::string& what, const std::string& key, const std::string& arch,
                               const DiskCache& disk, const std::string& refused) {
    if (!refused.empty())
        return "cache_only mode: the cached kernel for " + what + " (key " + key + ", arch " + arch +
               ") was refused: " + refused + "; an entry is loaded only where nobody else can have written it";
    const std::string where = disk.enabled() ? disk.dir() : disk.dir() + " (disk cache off: " + disk.problem() + ")";
    return "cache_only mode: no cached kernel for " + what + " (key " + key + ", arch " + arch + ") in " + where +
           "; precompile it with `rtattn precompile`";
}

}  // namespace

KernelCache::KernelCache(std::string dir, DiskOptions options, util::Logger log)
    : disk_(std::move(dir), options, log), log_(std::move(log)) {}

CacheCounters KernelCache::counters() const {
    std::lock_guard<std::mutex> g(mu_);
    return counters_;
}

KernelCache::Lookup KernelCache::get(const std::string& key, const std::string& arch, const Builder& build,
                                     const std::string& what) {
    const std::string mkey = memory_key(key, arch);
    std::promise<Lookup> promise;
    std::shared_future<Lookup> follow;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (auto it = memory_.find(mkey); it != memory_.end()) {
            ++counters_.memory_hits;
            return {it->second.entry, Source::memory, it->second.not_stored};
        }
        if (auto it = flights_.find(mkey); it != flights_.end()) {
            follow = it->second->result;
        } else {
            auto flight = std::make_shared<Flight>();
            flight->result = promise.get_future().share();
            flights_.emplace(mkey, std::move(flight));
        }
    }

    if (follow.valid()) {
        Lookup got = follow.get();  // rethrows the leader's exception
        std::lock_guard<std::mutex> g(mu_);
        ++counters_.memory_hits;
        got.source = Source::memory;
        return got;
    }

    // Leader. The memory insert and the flight removal happen under one lock so a new caller always finds one.
    try {
        Lookup got = fetch(key, arch, build, what);
        {
            std::lock_guard<std::mutex> g(mu_);
            memory_.emplace(mkey, Held{got.entry, got.not_stored});
            flights_.erase(mkey);
        }
        promise.set_value(got);
        return got;
    } catch (...) {
        // Failures are not cached: the next get starts a new flight and retries.
        {
            std::lock_guard<std::mutex> g(mu_);
            flights_.erase(mkey);
        }
        promise.set_exception(std::current_exception());
        throw;
    }
}

DiskCache::Loaded KernelCache::load_counted(const std::string& key, const std::string& arch) {
    DiskCache::Loaded loaded = disk_.load(key, arch);
    std::lock_guard<std::mutex> g(mu_);
    if (loaded.bad) ++counters_.bad_entries;
    if (loaded.entry) ++counters_.disk_hits;
    return loaded;
}

KernelCache::Lookup KernelCache::fetch(const std::string& key, const std::string& arch, const Builder& build,
                                       const std::string& what) {
    const auto from_disk = [](DiskCache::Loaded& l) {
        return Lookup{std::make_shared<const Entry>(std::move(*l.entry)), Source::disk, ""};
    };
    DiskCache::Loaded loaded = load_counted(key, arch);
    if (loaded.entry) return from_disk(loaded);
    if (!build) {
        {
            std::lock_guard<std::mutex> g(mu_);
            ++counters_.misses;
        }
        throw CacheMissError(cache_miss_message(what, key, arch, disk_, loaded.refused));
    }

    // Another process may be building the same key: wait for it, then its entry is a disk hit. Without the lock
    // (a timeout, a cache we may not write) the kernel is built but not stored: an entry never has two writers.
    const DiskCache::KeyLock lock = disk_.lock(key);
    if (lock.held()) {
        loaded = load_counted(key, arch);
        if (loaded.entry) return from_disk(loaded);
    }
    {
        std::lock_guard<std::mutex> g(mu_);
        ++counters_.misses;
    }

    const auto t0 = std::chrono::steady_clock::now();
    Entry entry = build();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
        std::lock_guard<std::mutex> g(mu_);
        ++counters_.compiles;
        counters_.compile_seconds += seconds;
    }
    // The builder knows the key only through us; an entry for another key/arch would poison the cache.
    if (entry.key.empty()) entry.key = key;
    if (entry.arch.empty()) entry.arch = arch;
    if (entry.key != key || entry.arch != arch)
        throw CacheError("builder for " + what + " returned an entry for key " + entry.key + " arch " + entry.arch +
                         ", expected key " + key + " arch " + arch);

    Lookup got{std::make_shared<const Entry>(std::move(entry)), Source::compiled, lock.problem()};
    if (lock.held()) {
        std::uint64_t written = 0;
        got.not_stored = disk_.store(*got.entry, &written);
        std::lock_guard<std::mutex> g(mu_);
        counters_.bytes_written += written;
    }
    log_.debug("compiled " + what + " in " + std::to_string(seconds) + " s (key " + key + ")");
    return got;
}

}  // namespace rtattn::cache
