// Disk tier of the kernel cache: verified entry files, atomic writes, per-key lock files, LRU-ish eviction.
// The file format and layout are described in cache.hpp.
#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>

#include "cache/cache.hpp"
#include "rtattn/errors.hpp"
#include "util/sha256.hpp"

namespace rtattn::cache {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'R', 'T', 'A', 'T', 'T', 'N', 'C', '\0'};
constexpr std::size_t kKeyLen = 64;
constexpr std::size_t kMaxArchLen = 64;  // anything longer is a corrupt header, not a real arch name
constexpr std::size_t kHeadLen = 8 + 4 + 4 + kKeyLen;  // magic, format, arch_len, key: everything before the arch
constexpr std::size_t kTailLen = 8 + 8 + 32;           // cubin_size, info_size, checksum: after the arch
constexpr std::string_view kEntrySuffix = ".rtc";
constexpr std::string_view kLockSuffix = ".lock";
constexpr std::string_view kTempPrefix = ".tmp-";
// A live writer holds its temp file for milliseconds; one this old was left by a crashed process.
constexpr std::int64_t kStaleTempSeconds = 3600;

// std::strerror is not thread-safe; the system category's message is.
std::string errno_text(int err) { return std::system_category().message(err); }

bool valid_key(std::string_view key) {
    return key.size() == kKeyLen &&
           std::all_of(key.begin(), key.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

void check_key(const std::string& key) {
    // Keys become file names: anything but a SHA-256 hex digest is a caller bug (and could escape the directory).
    if (!valid_key(key)) throw CacheError("invalid cache key '" + key + "': expected 64 lowercase hex characters");
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// ---- little-endian encoding ----------------------------------------------------------------------------------

void put_le(std::string& out, std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint64_t get_le(std::string_view in, std::size_t pos, int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= std::uint64_t(static_cast<unsigned char>(in[pos + i])) << (8 * i);
    return v;
}

util::Digest payload_digest(std::string_view cubin, std::string_view info) {
    return util::Sha256().update(cubin).update(info).finish();
}

std::string encode_entry(const Entry& e) {
    std::string out;
    out.reserve(kHeadLen + e.arch.size() + kTailLen + e.cubin.size() + e.info_json.size());
    out.append(kMagic, sizeof kMagic);
    put_le(out, kFormatVersion, 4);
    put_le(out, e.arch.size(), 4);
    out += e.key;
    out += e.arch;
    put_le(out, e.cubin.size(), 8);
    put_le(out, e.info_json.size(), 8);
    const util::Digest d = payload_digest(e.cubin, e.info_json);
    out.append(reinterpret_cast<const char*>(d.data()), d.size());
    out += e.cubin;
    out += e.info_json;
    return out;
}

// Decodes an entry file named after `expect_key`. Returns "" when it is sound, else what is wrong. Fields are
// filled as far as they could be read, so a listing can still show the arch of an entry with a bad checksum.
std::string decode_entry(std::string_view bytes, const std::string& expect_key, Entry* out) {
    const auto size_text = [&] { return std::to_string(bytes.size()) + " bytes"; };
    if (bytes.size() < kHeadLen)
        return "truncated: " + size_text() + ", a header needs at least " + std::to_string(kHeadLen + 1 + kTailLen);
    if (bytes.substr(0, sizeof kMagic) != std::string_view(kMagic, sizeof kMagic))
        return "bad magic (not an rtattn cache entry)";
    const std::uint64_t format = get_le(bytes, 8, 4);
    if (format != kFormatVersion)
        return "entry format version " + std::to_string(format) + ", expected " + std::to_string(kFormatVersion);
    const std::uint64_t arch_len = get_le(bytes, 12, 4);
    if (arch_len == 0 || arch_len > kMaxArchLen) return "corrupt header: arch length " + std::to_string(arch_len);
    out->key = std::string(bytes.substr(16, kKeyLen));
    if (out->key != expect_key) return "entry holds key " + out->key + " but is named " + expect_key;
    const std::uint64_t header_len = kHeadLen + arch_len + kTailLen;
    if (bytes.size() < header_len)
        return "truncated: " + size_text() + ", the header needs " + std::to_string(header_len);
    out->arch = std::string(bytes.substr(kHeadLen, arch_len));
    const std::size_t tail = kHeadLen + arch_len;
    const std::uint64_t cubin_size = get_le(bytes, tail, 8);
    const std::uint64_t info_size = get_le(bytes, tail + 8, 8);
    const std::uint64_t payload = bytes.size() - header_len;
    // Compared one at a time so that huge (corrupt) sizes cannot overflow the sum.
    if (cubin_size > payload || info_size != payload - cubin_size) {
        const bool short_file = cubin_size > payload || info_size > payload - cubin_size;
        return std::string(short_file ? "truncated" : "trailing bytes") + ": header declares " +
               std::to_string(cubin_size) + " + " + std::to_string(info_size) + " payload bytes, file has " +
               std::to_string(payload);
    }
    const std::string_view cubin = bytes.substr(header_len, cubin_size);
    const std::string_view info = bytes.substr(header_len + cubin_size);
    const util::Digest want = payload_digest(cubin, info);
    if (bytes.substr(tail + 16, 32) != std::string_view(reinterpret_cast<const char*>(want.data()), want.size()))
        return "checksum mismatch (cubin or info corrupted)";
    out->cubin = std::string(cubin);
    out->info_json = std::string(info);
    return "";
}

// ---- small POSIX helpers -------------------------------------------------------------------------------------

class Fd {
public:
    explicit Fd(int fd) : fd_(fd) {}
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }
private:
    int fd_;
};

// Returns 0 or the errno of the failing read.
int read_all(int fd, std::size_t size_hint, std::string* out) {
    out->clear();
    out->reserve(size_hint);
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return 0;
        out->append(buf, static_cast<std::size_t>(n));
    }
}

int write_all(int fd, std::string_view data) {
    while (!data.empty()) {
        const ssize_t n = ::write(fd, data.data(), data.size());
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        data.remove_prefix(static_cast<std::size_t>(n));
    }
    return 0;
}

int make_dir(const std::string& path) { return ::mkdir(path.c_str(), 0777) == 0 || errno == EEXIST ? 0 : errno; }

// Makes a rename durable: the directory entry itself must reach the disk.
int fsync_dir(const std::string& path) {
    Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return errno;
    return ::fsync(fd.get()) == 0 ? 0 : errno;
}

// Temp file that removes itself unless committed (renamed into place): no half-written file is ever visible
// under an entry's name, and a failed write leaves nothing behind.
class TempFile {
public:
    explicit TempFile(std::string pattern) : path_(std::move(pattern)) {
        fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
        if (fd_ < 0) open_error_ = "cannot create temp file " + path_ + ": " + errno_text(errno);
        exists_ = fd_ >= 0;
    }
    ~TempFile() {
        if (fd_ >= 0) ::close(fd_);
        if (exists_) ::unlink(path_.c_str());
    }
    TempFile(const TempFile&) = delete;
    TempFile& operator=(const TempFile&) = delete;

    // Each step returns "" or what failed.
    const std::string& open_error() const { return open_error_; }
    std::string write_and_sync(std::string_view data) {
        if (int e = write_all(fd_, data)) return "cannot write " + path_ + ": " + errno_text(e);
        if (::fsync(fd_) != 0) return "cannot fsync " + path_ + ": " + errno_text(errno);
        // mkstemp creates 0600; other users sharing RTATTN_CACHE_DIR must be able to read entries.
        ::fchmod(fd_, 0644);
        if (::close(std::exchange(fd_, -1)) != 0) return "cannot close " + path_ + ": " + errno_text(errno);
        return "";
    }
    std::string commit(const std::string& final_path) {
        if (::rename(path_.c_str(), final_path.c_str()) != 0)
            return "cannot rename " + path_ + " to " + final_path + ": " + errno_text(errno);
        exists_ = false;
        return "";
    }
private:
    std::string path_, open_error_;
    int fd_ = -1;
    bool exists_ = false;
};

// ---- directory scans -----------------------------------------------------------------------------------------

enum class Kind { entry, lock, temp };

struct FileStat {
    std::string path, name;
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
};

std::int64_t mtime_ns(const struct stat& st) {
    return std::int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

std::optional<Kind> classify(std::string_view name) {
    if (name.substr(0, kTempPrefix.size()) == kTempPrefix) return Kind::temp;
    if (ends_with(name, kEntrySuffix)) return Kind::entry;
    if (ends_with(name, kLockSuffix)) return Kind::lock;
    return std::nullopt;
}

// Files of the given kinds in the shard directories. Files vanishing mid-scan (other processes evict too) are
// simply skipped.
std::vector<FileStat> scan(const std::string& dir, std::initializer_list<Kind> kinds) {
    std::vector<FileStat> out;
    std::error_code ec;
    for (fs::directory_iterator shard(dir, ec), end; !ec && shard != end; shard.increment(ec)) {
        if (shard->path().filename().string().size() != 2) continue;
        std::error_code ec2;
        for (fs::directory_iterator f(shard->path(), ec2); !ec2 && f != end; f.increment(ec2)) {
            FileStat s;
            s.name = f->path().filename().string();
            const auto kind = classify(s.name);
            if (!kind || std::find(kinds.begin(), kinds.end(), *kind) == kinds.end()) continue;
            s.path = f->path().string();
            struct stat st {};
            if (::lstat(s.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
            s.size = static_cast<std::uint64_t>(st.st_size);
            s.mtime_ns = mtime_ns(st);
            out.push_back(std::move(s));
        }
    }
    return out;
}

// Removes a file; "already gone" is not worth a warning, any other failure is.
bool remove_file(const std::string& path, const util::Logger& log) {
    if (::unlink(path.c_str()) == 0) return true;
    if (errno != ENOENT) log.warn("cannot remove " + path + ": " + errno_text(errno));
    return false;
}

struct Removed {
    int files = 0;
    std::uint64_t bytes = 0;
};

// Removes the least recently used files until their total is at most `cap`, sparing `keep`.
Removed remove_oldest(std::vector<FileStat> files, std::uint64_t cap, const std::string& keep,
                      const util::Logger& log) {
    std::uint64_t total = 0;
    for (const auto& f : files) total += f.size;
    Removed r;
    if (total <= cap) return r;
    std::sort(files.begin(), files.end(), [](const FileStat& a, const FileStat& b) {
        return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.path < b.path;
    });
    for (const auto& f : files) {
        if (total <= cap) break;
        if (f.path == keep) continue;
        // Someone else removing it first frees the space just the same.
        if (remove_file(f.path, log)) {
            ++r.files;
            r.bytes += f.size;
            total -= f.size;
        } else if (::access(f.path.c_str(), F_OK) != 0) {
            total -= f.size;
        }
    }
    return r;
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

// "" when `dir` exists (created if needed) and accepts new files, else why not.
std::string prepare_dir(const std::string& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    // Another process creating the same tree at the same moment is not a failure.
    if (ec && !fs::is_directory(dir)) return "cannot create " + dir + ": " + ec.message();
    // Permission bits do not tell the whole story (read-only mounts, ACLs, root): try it.
    std::string probe = dir + "/" + std::string(kTempPrefix) + "probe-XXXXXX";
    const int fd = ::mkostemp(probe.data(), O_CLOEXEC);
    if (fd < 0) return "cannot create a file in " + dir + ": " + errno_text(errno);
    ::close(fd);
    ::unlink(probe.c_str());
    return "";
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------------------------

std::string default_dir() {
    if (const char* d = std::getenv("RTATTN_CACHE_DIR"); d && *d) return d;
    // The XDG spec says to ignore a relative XDG_CACHE_HOME.
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x == '/') return std::string(x) + "/rtattn";
    const std::string home = home_dir();
    return home.empty() ? "" : home + "/.cache/rtattn";
}

DiskCache::DiskCache(std::string dir, std::uint64_t max_bytes, util::Logger log)
    : max_bytes_(max_bytes), log_(std::move(log)) {
    std::string root = dir.empty() ? default_dir() : std::move(dir);
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    if (root.empty()) {
        disabled_reason_ = "no cache directory: set RTATTN_CACHE_DIR or HOME";
        log_.warn("cache dir is unknown (" + disabled_reason_ + "); caching in memory only");
        return;
    }
    dir_ = root + "/v" + std::to_string(kFormatVersion);
    disabled_reason_ = prepare_dir(dir_);
    if (!disabled_reason_.empty()) {
        if (::access(dir_.c_str(), R_OK | X_OK) == 0) {
            read_only_ = enabled_ = true;
            log_.warn("cache dir " + root + " is read-only (" + disabled_reason_ +
                      "); serving its entries, caching new kernels in memory only");
            return;
        }
        log_.warn("cache dir " + root + " is not writable (" + disabled_reason_ + "); caching in memory only");
        return;
    }
    enabled_ = true;
}

void DiskCache::require_writable(const char* op) const {
    require_enabled(op);
    if (read_only_)
        throw CacheError(std::string("cannot ") + op + " the disk cache at " + dir_ + ": it is read-only (" +
                         disabled_reason_ + ")");
}

std::string DiskCache::entry_path(const std::string& key) const {
    check_key(key);
    return dir_ + "/" + key.substr(0, 2) + "/" + key + std::string(kEntrySuffix);
}

void DiskCache::require_enabled(const char* op) const {
    if (!enabled_)
        throw CacheError(std::string("cannot ") + op + " the disk cache at " + (dir_.empty() ? "(none)" : dir_) +
                         ": it is disabled (" + disabled_reason_ + ")");
}

std::optional<Entry> DiskCache::load(const std::string& key, const std::string& arch, bool* was_bad) {
    if (was_bad) *was_bad = false;
    if (!enabled_) return std::nullopt;
    const std::string path = entry_path(key);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
        if (errno != ENOENT) log_.warn("cannot open cache entry " + path + ": " + errno_text(errno));
        return std::nullopt;
    }
    struct stat st {};
    std::string bytes;
    const int err = ::fstat(fd.get(), &st) != 0 ? errno : read_all(fd.get(), std::size_t(st.st_size), &bytes);
    if (err) {
        // An I/O error says nothing about the entry's contents: report a miss but leave the file alone.
        log_.warn("cannot read cache entry " + path + ": " + errno_text(err));
        return std::nullopt;
    }
    Entry e;
    std::string problem = decode_entry(bytes, key, &e);
    // The key hashes the arch, so a foreign arch under this name means a broken writer or a tampered file.
    if (problem.empty() && e.arch != arch) problem = "entry is for arch " + e.arch + ", requested " + arch;
    if (!problem.empty()) {
        if (read_only_)
            log_.warn("ignoring bad cache entry " + path + " in a read-only cache: " + problem);
        else
            discard_bad(path, fd.get(), problem);
        if (was_bad) *was_bad = true;
        return std::nullopt;
    }
    // The mtime is the LRU clock. A read-only (shared) cache cannot be touched; that only weakens eviction.
    if (!read_only_ && ::futimens(fd.get(), nullptr) != 0) log_.debug("cannot touch " + path + ": " + errno_text(errno));
    return e;
}

void DiskCache::discard_bad(const std::string& path, int fd, const std::string& problem) {
    // A writer may have renamed a fresh entry over the bad one since we opened it; do not delete that one.
    struct stat opened {}, now {};
    const bool same = ::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &now) == 0 && opened.st_dev == now.st_dev &&
                      opened.st_ino == now.st_ino;
    if (!same) {
        log_.warn("bad cache entry " + path + ": " + problem + " (already replaced by another writer)");
        return;
    }
    log_.warn("removing bad cache entry " + path + ": " + problem);
    remove_file(path, log_);
}

std::uint64_t DiskCache::store(const Entry& e) {
    if (!enabled_ || read_only_) return 0;
    const std::string path = entry_path(e.key);
    if (e.arch.empty() || e.arch.size() > kMaxArchLen)
        throw CacheError("cannot cache key " + e.key + ": arch '" + e.arch + "' must be 1 to " +
                         std::to_string(kMaxArchLen) + " characters");
    const std::string shard = dir_ + "/" + e.key.substr(0, 2);
    if (int err = make_dir(shard)) {
        log_.warn("cannot create cache shard " + shard + ": " + errno_text(err) + "; entry not cached");
        return 0;
    }
    const std::string bytes = encode_entry(e);
    std::string error;
    {
        TempFile tmp(shard + "/" + std::string(kTempPrefix) + e.key + "-XXXXXX");
        error = tmp.open_error();
        if (error.empty()) error = tmp.write_and_sync(bytes);
        if (error.empty()) error = tmp.commit(path);
    }
    if (!error.empty()) {
        log_.warn(error + "; entry not cached");
        return 0;
    }
    // The entry is already visible; losing it on power failure only costs a recompile.
    if (int err = fsync_dir(shard)) log_.warn("cannot fsync " + shard + ": " + errno_text(err));
    evict_over_cap(path);
    return bytes.size();
}

void DiskCache::evict_over_cap(const std::string& keep) {
    if (max_bytes_ == 0) return;
    const Removed r = remove_oldest(scan(dir_, {Kind::entry}), max_bytes_, keep, log_);
    if (r.files > 0) {
        evictions_ += std::uint64_t(r.files);
        log_.debug("evicted " + std::to_string(r.files) + " cache entries (" + std::to_string(r.bytes) +
                   " bytes) to stay under " + std::to_string(max_bytes_) + " bytes in " + dir_);
    }
}

DiskCache::KeyLock& DiskCache::KeyLock::operator=(KeyLock&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
}

// Closing the descriptor drops the flock.
DiskCache::KeyLock::~KeyLock() {
    if (fd_ >= 0) ::close(fd_);
}

DiskCache::KeyLock DiskCache::lock(const std::string& key) {
    if (!enabled_ || read_only_) return {};
    check_key(key);
    const std::string shard = dir_ + "/" + key.substr(0, 2);
    const std::string path = shard + "/" + key + std::string(kLockSuffix);
    const auto unlocked = [&](const std::string& why) {
        log_.warn("cannot lock " + path + ": " + why + "; building without the cross-process lock");
        return KeyLock();
    };
    if (int err = make_dir(shard)) return unlocked(errno_text(err));
    // clear() may unlink the lock file while we wait; a lock on an orphaned inode excludes nobody, so retry.
    for (int attempt = 0; attempt < 100; ++attempt) {
        Fd fd(::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0666));
        if (fd.get() < 0) return unlocked(errno_text(errno));
        while (::flock(fd.get(), LOCK_EX) != 0)
            if (errno != EINTR) return unlocked(errno_text(errno));
        struct stat held {}, named {};
        if (::fstat(fd.get(), &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
            held.st_ino == named.st_ino)
            return KeyLock(fd.release());
    }
    return unlocked("the lock file keeps being replaced");
}

std::vector<Listing> DiskCache::list() const {
    require_enabled("list");
    std::vector<Listing> out;
    for (const auto& f : scan(dir_, {Kind::entry})) {
        Listing l;
        l.path = f.path;
        l.size = f.size;
        l.last_use = f.mtime_ns / 1'000'000'000;
        l.key = f.name.substr(0, f.name.size() - kEntrySuffix.size());
        Fd fd(::open(f.path.c_str(), O_RDONLY | O_CLOEXEC));
        std::string bytes;
        const int err = fd.get() < 0 ? errno : read_all(fd.get(), f.size, &bytes);
        if (err == ENOENT) continue;  // evicted since the scan
        Entry e;
        l.problem = err ? "cannot read: " + errno_text(err)
                  : valid_key(l.key) ? decode_entry(bytes, l.key, &e)
                                     : "file name is not a cache key";
        l.ok = l.problem.empty();
        l.arch = e.arch;
        l.info_json = e.info_json;
        out.push_back(std::move(l));
    }
    std::sort(out.begin(), out.end(), [](const Listing& a, const Listing& b) { return a.key < b.key; });
    return out;
}

VerifyReport DiskCache::verify(bool repair) {
    if (repair) require_writable("repair");
    VerifyReport r;
    for (const auto& l : list()) {
        if (l.ok) {
            ++r.ok;
            continue;
        }
        ++r.bad;
        r.problems.push_back(l.path + ": " + l.problem);
        if (repair && remove_file(l.path, log_)) ++r.removed;
    }
    return r;
}

PruneReport DiskCache::prune(std::optional<std::uint64_t> max_bytes, std::optional<std::int64_t> older_than_seconds) {
    require_writable("prune");
    const std::int64_t now = now_ns();
    const auto older = [&](const FileStat& f, std::int64_t seconds) {
        return f.mtime_ns < now - seconds * 1'000'000'000;
    };
    // Leftovers of crashed writers are garbage, not entries: removed but not reported.
    for (const auto& f : scan(dir_, {Kind::temp}))
        if (older(f, kStaleTempSeconds) && remove_file(f.path, log_)) log_.info("removed stale temp file " + f.path);

    PruneReport r;
    std::vector<FileStat> kept;
    for (auto& f : scan(dir_, {Kind::entry})) {
        if (older_than_seconds && older(f, *older_than_seconds) && remove_file(f.path, log_)) {
            ++r.removed;
            r.bytes_freed += f.size;
        } else {
            kept.push_back(std::move(f));
        }
    }
    if (max_bytes) {
        const Removed e = remove_oldest(std::move(kept), *max_bytes, "", log_);
        r.removed += e.files;
        r.bytes_freed += e.bytes;
    }
    return r;
}

// A process holding a key's lock right now keeps its (now unnamed) lock; a newcomer may then build the same key
// alongside it. Both writes are atomic, so that costs a compile, never a bad entry.
int DiskCache::clear() {
    require_writable("clear");
    int entries = 0;
    for (const auto& f : scan(dir_, {Kind::entry, Kind::lock, Kind::temp}))
        if (remove_file(f.path, log_) && classify(f.name) == Kind::entry) ++entries;
    return entries;
}

std::uint64_t DiskCache::total_bytes() const {
    if (!enabled_) return 0;
    std::uint64_t total = 0;
    for (const auto& f : scan(dir_, {Kind::entry})) total += f.size;
    return total;
}

}  // namespace rtattn::cache
