// Cache stage: disk entry format and verification, atomic writes, eviction, single flight across threads and
// processes, unwritable directories, cache-only mode.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "catch.hpp"
#include "rtattn/errors.hpp"
#include "testutil.hpp"
#include "util/sha256.hpp"

namespace fs = std::filesystem;
using namespace rtattn;
using namespace rtattn::cache;
using rtattn::test::TempDir;

namespace {

constexpr std::uint64_t kNoCap = 0;

std::string key_of(const std::string& name) { return util::to_hex(util::sha256(name.data(), name.size())); }

// Binary cubin bytes (NULs included) that differ per name.
Entry make_entry(const std::string& name, const std::string& arch = "sm_90a", std::size_t cubin_size = 256) {
    Entry e;
    e.key = key_of(name);
    e.arch = arch;
    for (std::size_t i = 0; i < cubin_size; ++i) e.cubin.push_back(static_cast<char>((i * 31 + name.size()) & 0xff));
    e.info_json = R"({"config":")" + name + R"(","registers":96})";
    return e;
}

// Offset of the cubin in an entry file: magic, format, arch_len, key, arch, cubin_size, info_size, checksum.
std::size_t header_len(const std::string& arch) { return 8 + 4 + 4 + 64 + arch.size() + 8 + 8 + 32; }

// A Logger whose messages the test can inspect; copies share one buffer.
class CapturedLog {
public:
    util::Logger logger(LogLevel level = LogLevel::warn) const {
        auto state = state_;
        return util::Logger(level, [state](LogLevel lv, const std::string& msg) {
            std::lock_guard<std::mutex> g(state->mu);
            if (lv == LogLevel::warn) state->warnings.push_back(msg);
        });
    }
    std::vector<std::string> warnings() const {
        std::lock_guard<std::mutex> g(state_->mu);
        return state_->warnings;
    }
    bool any_warning_contains(const std::string& a, const std::string& b = "") const {
        for (const auto& w : warnings())
            if (w.find(a) != std::string::npos && w.find(b) != std::string::npos) return true;
        return false;
    }
private:
    struct State {
        std::mutex mu;
        std::vector<std::string> warnings;
    };
    std::shared_ptr<State> state_ = std::make_shared<State>();
};

void patch_byte(const fs::path& p, std::size_t offset, const std::function<char(char)>& change) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    f.seekg(std::streamoff(offset));
    char c = 0;
    f.get(c);
    f.seekp(std::streamoff(offset));
    f.put(change(c));
}

void set_age(const fs::path& p, int seconds_ago) {
    struct timespec now {};
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec times[2] = {now, now};
    times[0].tv_sec -= seconds_ago;
    times[1].tv_sec -= seconds_ago;
    REQUIRE(utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

void write_file(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out << bytes;
}

std::vector<fs::path> files_under(const fs::path& dir, const std::string& prefix = "") {
    std::vector<fs::path> out;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
        if (it->is_regular_file() && it->path().filename().string().rfind(prefix, 0) == 0) out.push_back(it->path());
    return out;
}

// A builder that counts its calls and can be slowed down to widen races.
struct CountingBuilder {
    Entry entry;
    std::chrono::milliseconds delay{0};
    std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
    KernelCache::Builder fn() const {
        return [*this] {
            ++*calls;
            std::this_thread::sleep_for(delay);
            return entry;
        };
    }
};

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("entries round-trip through the disk cache") {
    TempDir tmp;
    CapturedLog log;
    DiskCache disk(tmp.str(), kNoCap, log.logger());
    REQUIRE(disk.enabled());
    CHECK(disk.dir() == tmp.str() + "/v1");

    const Entry e = make_entry("round-trip");
    const std::uint64_t written = disk.store(e);
    const std::string path = disk.entry_path(e.key);
    CHECK(path == tmp.str() + "/v1/" + e.key.substr(0, 2) + "/" + e.key + ".rtc");
    REQUIRE(fs::exists(path));
    CHECK(written == fs::file_size(path));
    CHECK(written == header_len(e.arch) + e.cubin.size() + e.info_json.size());
    CHECK(disk.total_bytes() == written);

    bool bad = true;
    const auto got = disk.load(e.key, e.arch, &bad);
    REQUIRE(got);
    CHECK_FALSE(bad);
    CHECK(got->key == e.key);
    CHECK(got->arch == e.arch);
    CHECK(got->cubin == e.cubin);
    CHECK(got->info_json == e.info_json);
    CHECK(files_under(tmp.path(), ".tmp-").empty());
    CHECK(log.warnings().empty());
}

TEST_CASE("a missing entry is a plain miss") {
    TempDir tmp;
    CapturedLog log;
    DiskCache disk(tmp.str(), kNoCap, log.logger());
    bool bad = true;
    CHECK_FALSE(disk.load(key_of("never stored"), "sm_90a", &bad));
    CHECK_FALSE(bad);
    CHECK(log.warnings().empty());
    CHECK_THROWS_AS(disk.load("../../etc/passwd", "sm_90a"), CacheError);
}

TEST_CASE("memory and disk hits are counted per tier") {
    TempDir tmp;
    CountingBuilder b{make_entry("counters")};
    const Entry& e = b.entry;

    KernelCache first(tmp.str(), kNoCap, util::Logger());
    Source src = Source::memory;
    auto got = first.get(e.key, e.arch, b.fn(), "counters", &src);
    CHECK(src == Source::compiled);
    CHECK(got->cubin == e.cubin);
    got = first.get(e.key, e.arch, b.fn(), "counters", &src);
    CHECK(src == Source::memory);
    auto c = first.counters();
    CHECK(c.memory_hits == 1);
    CHECK(c.disk_hits == 0);
    CHECK(c.misses == 1);
    CHECK(c.compiles == 1);
    CHECK(c.compile_seconds >= 0);
    CHECK(c.bytes_written == fs::file_size(first.disk().entry_path(e.key)));

    // A second cache on the same directory (another process, in effect) finds it on disk.
    KernelCache second(tmp.str(), kNoCap, util::Logger());
    got = second.get(e.key, e.arch, b.fn(), "counters", &src);
    CHECK(src == Source::disk);
    CHECK(got->cubin == e.cubin);
    second.get(e.key, e.arch, b.fn(), "counters", &src);
    CHECK(src == Source::memory);
    c = second.counters();
    CHECK(c.disk_hits == 1);
    CHECK(c.memory_hits == 1);
    CHECK(c.misses == 0);
    CHECK(c.compiles == 0);
    CHECK(*b.calls == 1);
}

TEST_CASE("corrupt entries are removed, logged and rebuilt, never served") {
    struct Case {
        std::string name;
        std::string stored_arch, requested_arch;
        std::function<void(DiskCache&, const Entry&, const fs::path&)> damage;
        std::string problem;  // expected in the warning
    };
    const auto nothing = [](DiskCache&, const Entry&, const fs::path&) {};
    const std::vector<Case> cases = {
        {"truncated payload", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { fs::resize_file(p, fs::file_size(p) - 100); },
         "truncated"},
        {"truncated header", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { fs::resize_file(p, 20); },
         "truncated"},
        {"flipped cubin byte", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry& e, const fs::path& p) {
             patch_byte(p, header_len(e.arch) + 10, [](char c) { return char(c ^ 0x01); });
         },
         "checksum"},
        {"flipped info byte", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) {
             patch_byte(p, fs::file_size(p) - 2, [](char c) { return char(c ^ 0x20); });
         },
         "checksum"},
        {"wrong magic", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { patch_byte(p, 0, [](char) { return 'X'; }); }, "magic"},
        {"wrong format version", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { patch_byte(p, 8, [](char) { return char(2); }); },
         "format version 2"},
        {"key differs from file name", "sm_90a", "sm_90a",
         [](DiskCache& disk, const Entry& e, const fs::path& p) {
             Entry other = make_entry("someone else", e.arch);
             disk.store(other);
             fs::copy_file(disk.entry_path(other.key), p, fs::copy_options::overwrite_existing);
         },
         "named"},
        {"foreign arch", "sm_80", "sm_90a", nothing, "arch sm_80, requested sm_90a"},
    };
    for (const auto& c : cases) {
        DYNAMIC_SECTION(c.name) {
            TempDir tmp;
            CapturedLog log;
            DiskCache disk(tmp.str(), kNoCap, log.logger());
            const Entry stored = make_entry("corrupt", c.stored_arch);
            const fs::path path = disk.entry_path(stored.key);

            disk.store(stored);
            c.damage(disk, stored, path);
            bool bad = false;
            CHECK_FALSE(disk.load(stored.key, c.requested_arch, &bad));
            CHECK(bad);
            CHECK_FALSE(fs::exists(path));
            CHECK(log.any_warning_contains(path.string(), c.problem));

            // Through KernelCache: the bad entry is counted and rebuilt once.
            disk.store(stored);
            c.damage(disk, stored, path);
            KernelCache kc(tmp.str(), kNoCap, log.logger());
            CountingBuilder b{make_entry("corrupt", c.requested_arch)};
            Source src = Source::memory;
            const auto got = kc.get(stored.key, c.requested_arch, b.fn(), "corrupt", &src);
            CHECK(src == Source::compiled);
            CHECK(*b.calls == 1);
            CHECK(got->arch == c.requested_arch);
            CHECK(got->cubin == b.entry.cubin);
            CHECK(kc.counters().bad_entries == 1);
            CHECK(kc.counters().misses == 1);
            CHECK(disk.load(stored.key, c.requested_arch));  // the rebuilt entry is sound
        }
    }
}

TEST_CASE("threads racing one cold key build it once") {
    TempDir tmp;
    KernelCache kc(tmp.str(), kNoCap, util::Logger());
    CountingBuilder b{make_entry("race"), std::chrono::milliseconds(300)};
    constexpr int kThreads = 8;
    std::latch start(kThreads);
    std::vector<std::shared_ptr<const Entry>> results(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            start.arrive_and_wait();
            results[i] = kc.get(b.entry.key, b.entry.arch, b.fn(), "race");
        });
    for (auto& t : threads) t.join();

    CHECK(*b.calls == 1);
    for (const auto& r : results) {
        REQUIRE(r);
        CHECK(r->cubin == b.entry.cubin);
        CHECK(r == results[0]);
    }
    const auto c = kc.counters();
    CHECK(c.compiles == 1);
    CHECK(c.misses == 1);
    CHECK(c.memory_hits == kThreads - 1);
}

// Under -fsanitize=thread this test reports a false race on the shared exception object: libstdc++ (not
// instrumented) frees it after an atomic refcount drop TSan cannot see. Suppress with
// "race:std::runtime_error::~runtime_error" and "race:error_of".
TEST_CASE("threads waiting on a failing build all get its exception") {
    TempDir tmp;
    KernelCache kc(tmp.str(), kNoCap, util::Logger());
    auto calls = std::make_shared<std::atomic<int>>(0);
    const KernelCache::Builder failing = [calls]() -> Entry {
        ++*calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        throw std::runtime_error("nvrtc exploded");
    };
    const Entry e = make_entry("failing race");
    constexpr int kThreads = 4;
    std::latch start(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i)
        threads.emplace_back([&, i] {
            start.arrive_and_wait();
            errors[i] = error_of([&] { kc.get(e.key, e.arch, failing, "failing race"); });
        });
    for (auto& t : threads) t.join();
    CHECK(*calls == 1);
    for (const auto& err : errors) CHECK(err == "nvrtc exploded");
}

TEST_CASE("a builder exception propagates and is not cached") {
    TempDir tmp;
    KernelCache kc(tmp.str(), kNoCap, util::Logger());
    const Entry e = make_entry("flaky");
    int calls = 0;
    const KernelCache::Builder failing = [&]() -> Entry {
        ++calls;
        throw CompileError("NVRTC failed for flaky", "error: boom", "-arch=sm_90a", "source");
    };
    CHECK_THROWS_AS(kc.get(e.key, e.arch, failing, "flaky"), CompileError);
    CHECK_FALSE(fs::exists(kc.disk().entry_path(e.key)));

    const KernelCache::Builder working = [&] {
        ++calls;
        return e;
    };
    Source src = Source::memory;
    CHECK(kc.get(e.key, e.arch, working, "flaky", &src)->cubin == e.cubin);
    CHECK(src == Source::compiled);
    CHECK(calls == 2);
    CHECK(kc.counters().compiles == 1);  // only builds that returned count
}

TEST_CASE("two processes racing a cold key build it once") {
    TempDir tmp;
    const std::string dir = tmp.str() + "/cache";
    const std::string counter = tmp.str() + "/builds.txt";
    const Entry e = make_entry("fork");
    // Returns how this process got the kernel, or -1 when it got the wrong bytes.
    const auto run = [&]() -> int {
        KernelCache kc(dir, kNoCap, util::Logger());
        const KernelCache::Builder build = [&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
            const int fd = ::open(counter.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
            const std::string line = "built by " + std::to_string(::getpid()) + "\n";
            if (fd >= 0) {
                (void)!::write(fd, line.data(), line.size());
                ::close(fd);
            }
            return e;
        };
        Source src = Source::memory;
        return kc.get(e.key, e.arch, build, "fork", &src)->cubin == e.cubin ? static_cast<int>(src) : -1;
    };

    std::fflush(nullptr);  // or the child would repeat buffered output
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int result = -1;
        try {
            result = run();
        } catch (...) {
        }
        ::_exit(result < 0 ? 100 : result);
    }
    const int parent = run();
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    const int from_child = WEXITSTATUS(status);
    // One built it; the other waited on the key lock and then found it on disk.
    CHECK(std::min(parent, from_child) == static_cast<int>(Source::disk));
    CHECK(std::max(parent, from_child) == static_cast<int>(Source::compiled));

    const std::string builds = test::read_file(counter);
    CHECK(std::count(builds.begin(), builds.end(), '\n') == 1);
    DiskCache disk(dir, kNoCap, util::Logger());
    const auto report = disk.verify(false);
    CHECK(report.ok == 1);
    CHECK(report.bad == 0);
    CHECK(files_under(dir, ".tmp-").empty());
}

TEST_CASE("the cross-process key lock excludes other holders until released") {
    TempDir tmp;
    DiskCache disk(tmp.str(), kNoCap, util::Logger());
    const std::string key = key_of("locked");
    auto held = std::make_unique<DiskCache::KeyLock>(disk.lock(key));
    std::atomic<bool> acquired{false};
    std::thread other([&] {
        auto l = disk.lock(key);
        acquired = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(acquired);
    held.reset();
    other.join();
    CHECK(acquired);
    CHECK(fs::exists(tmp.str() + "/v1/" + key.substr(0, 2) + "/" + key + ".lock"));
}

TEST_CASE("eviction keeps the cache under its cap, least recently used first") {
    TempDir tmp;
    const Entry e1 = make_entry("evict 1", "sm_90a", 1000), e2 = make_entry("evict 2", "sm_90a", 1000),
                e3 = make_entry("evict 3", "sm_90a", 1000), e4 = make_entry("evict 4", "sm_90a", 1000);
    const std::uint64_t size = header_len("sm_90a") + 1000 + e1.info_json.size();
    DiskCache disk(tmp.str(), size * 2 + size / 2, util::Logger());  // room for two

    CHECK(disk.store(e1) == size);
    set_age(disk.entry_path(e1.key), 300);
    disk.store(e2);
    set_age(disk.entry_path(e2.key), 200);
    disk.store(e3);
    CHECK_FALSE(fs::exists(disk.entry_path(e1.key)));
    CHECK(fs::exists(disk.entry_path(e2.key)));
    CHECK(fs::exists(disk.entry_path(e3.key)));
    CHECK(disk.evictions() == 1);

    // A hit makes e2 the most recently used, so e3 goes next.
    REQUIRE(disk.load(e2.key, e2.arch));
    set_age(disk.entry_path(e3.key), 100);
    disk.store(e4);
    CHECK(fs::exists(disk.entry_path(e2.key)));
    CHECK_FALSE(fs::exists(disk.entry_path(e3.key)));
    CHECK(fs::exists(disk.entry_path(e4.key)));
    CHECK(disk.evictions() == 2);
    CHECK(disk.total_bytes() == 2 * size);
}

TEST_CASE("the entry just written survives even a cap smaller than itself") {
    TempDir tmp;
    DiskCache disk(tmp.str(), 10, util::Logger());
    const Entry a = make_entry("big a"), b = make_entry("big b");
    disk.store(a);
    CHECK(fs::exists(disk.entry_path(a.key)));
    CHECK(disk.evictions() == 0);
    disk.store(b);
    CHECK_FALSE(fs::exists(disk.entry_path(a.key)));
    CHECK(fs::exists(disk.entry_path(b.key)));
    CHECK(disk.evictions() == 1);
}

namespace {

// Unwritable cache dirs: the cache warns once and keeps working from memory.
void check_memory_only(const std::string& dir) {
    CapturedLog log;
    KernelCache kc(dir, kNoCap, log.logger());
    CHECK_FALSE(kc.disk().enabled());
    REQUIRE(log.warnings().size() == 1);
    const std::string w = log.warnings()[0];
    CHECK(w.rfind("cache dir " + dir + " is not writable (", 0) == 0);
    CHECK(w.find("); caching in memory only") != std::string::npos);

    CountingBuilder b{make_entry("memory only")};
    Source src = Source::disk;
    CHECK(kc.get(b.entry.key, b.entry.arch, b.fn(), "memory only", &src)->cubin == b.entry.cubin);
    CHECK(src == Source::compiled);
    kc.get(b.entry.key, b.entry.arch, b.fn(), "memory only", &src);
    CHECK(src == Source::memory);
    CHECK(*b.calls == 1);
    CHECK(kc.counters().bytes_written == 0);

    DiskCache& disk = kc.disk();
    CHECK(disk.store(b.entry) == 0);
    CHECK_FALSE(disk.load(b.entry.key, b.entry.arch));
    CHECK(disk.total_bytes() == 0);
    { auto l = disk.lock(b.entry.key); }
    CHECK_THROWS_AS(disk.list(), CacheError);
    CHECK_THROWS_AS(disk.verify(true), CacheError);
    CHECK_THROWS_AS(disk.prune(0, std::nullopt), CacheError);
    CHECK_THROWS_AS(disk.clear(), CacheError);
    CHECK(log.warnings().size() == 1);  // none of that warned again
}

}  // namespace

TEST_CASE("a cache dir under a regular file disables the disk tier") {
    TempDir tmp;
    write_file(tmp.path() / "plain-file", "not a directory");
    check_memory_only((tmp.path() / "plain-file" / "cache").string());
}

TEST_CASE("a read-only parent directory disables the disk tier") {
    TempDir tmp;
    const fs::path locked = tmp.path() / "locked";
    fs::create_directory(locked);
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    // Root ignores permission bits; only assert when the directory really refuses new files.
    const std::string probe = (locked / "probe").string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
        ::close(fd);
        ::unlink(probe.c_str());
        WARN("SKIPPED: a chmod 0500 directory is writable here (running as root); covered by the regular-file case");
        return;
    }
    check_memory_only((locked / "cache").string());
}

// A cache baked into a read-only image: entries are served, nothing is written. The check runs in a child process
// that, when we are root (who may write anywhere), drops to an unprivileged user first.
TEST_CASE("a readable but unwritable cache dir serves its entries and writes nothing") {
    TempDir tmp;
    const std::string dir = (tmp.path() / "image-cache").string();
    const Entry baked = make_entry("baked");
    {
        DiskCache writer(dir, kNoCap, util::Logger(rtattn::LogLevel::quiet, nullptr));
        REQUIRE(writer.store(baked) > 0);
    }
    for (auto it = fs::recursive_directory_iterator(tmp.path()); it != fs::recursive_directory_iterator(); ++it)
        fs::permissions(it->path(), it->is_directory() ? fs::perms(0555) : fs::perms(0444));
    fs::permissions(tmp.path(), fs::perms(0755));

    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // Child: report failures through the exit status (no Catch2 assertions across fork).
        if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(90);
        int failures = 0;
        auto expect = [&](bool ok) { failures += ok ? 0 : 1; };
        std::vector<std::string> warnings;
        KernelCache kc(dir, kNoCap, util::Logger(rtattn::LogLevel::warn, [&](rtattn::LogLevel, const std::string& m) {
                           warnings.push_back(m);
                       }));
        expect(kc.disk().enabled() && kc.disk().read_only());
        expect(warnings.size() == 1 && warnings[0].find("read-only") != std::string::npos);
        CountingBuilder unused{baked};
        Source src = Source::compiled;
        expect(kc.get(baked.key, baked.arch, unused.fn(), "baked", &src)->cubin == baked.cubin);
        expect(src == Source::disk && *unused.calls == 0);
        CountingBuilder fresh{make_entry("fresh")};
        expect(kc.get(fresh.entry.key, fresh.entry.arch, fresh.fn(), "fresh", &src)->cubin == fresh.entry.cubin);
        expect(src == Source::compiled && *fresh.calls == 1 && kc.counters().bytes_written == 0);
        expect(!fs::exists(kc.disk().entry_path(fresh.entry.key)));
        expect(kc.disk().list().size() == 1);
        bool refused = false;
        try {
            kc.disk().clear();
        } catch (const CacheError& e) {
            refused = std::string(e.what()).find("read-only") != std::string::npos;
        }
        expect(refused);
        ::_exit(failures);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    for (auto it = fs::recursive_directory_iterator(tmp.path()); it != fs::recursive_directory_iterator(); ++it)
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(fs::exists(DiskCache(dir, kNoCap, util::Logger()).entry_path(baked.key)));
}

TEST_CASE("cache-only mode refuses to compile and names the request") {
    TempDir tmp;
    KernelCache kc(tmp.str(), kNoCap, util::Logger());
    const Entry e = make_entry("cache only");
    const std::string what = "d128 causal bf16 sm_90a";
    CHECK_THROWS_AS(kc.get(e.key, e.arch, nullptr, what), CacheMissError);
    const std::string msg = error_of([&] { kc.get(e.key, e.arch, nullptr, what); });
    CHECK(msg.find(what) != std::string::npos);
    CHECK(msg.find(e.key) != std::string::npos);
    CHECK(msg.find(kc.disk().dir()) != std::string::npos);
    CHECK(msg.find("rtattn precompile") != std::string::npos);
    CHECK(kc.counters().misses == 2);
    CHECK(kc.counters().compiles == 0);

    // Once precompiled, cache-only serves it from disk.
    kc.disk().store(e);
    Source src = Source::compiled;
    CHECK(kc.get(e.key, e.arch, nullptr, what, &src)->cubin == e.cubin);
    CHECK(src == Source::disk);
}

TEST_CASE("verify reports bad entries and repair removes them") {
    TempDir tmp;
    DiskCache disk(tmp.str(), kNoCap, util::Logger());
    const Entry good = make_entry("good"), bad = make_entry("bad");
    disk.store(good);
    disk.store(bad);
    const std::string bad_path = disk.entry_path(bad.key);
    patch_byte(bad_path, header_len(bad.arch) + 3, [](char c) { return char(~c); });

    auto r = disk.verify(false);
    CHECK(r.ok == 1);
    CHECK(r.bad == 1);
    CHECK(r.removed == 0);
    REQUIRE(r.problems.size() == 1);
    CHECK(r.problems[0].rfind(bad_path + ": ", 0) == 0);
    CHECK(r.problems[0].find("checksum") != std::string::npos);
    CHECK(fs::exists(bad_path));

    r = disk.verify(true);
    CHECK(r.bad == 1);
    CHECK(r.removed == 1);
    CHECK_FALSE(fs::exists(bad_path));
    r = disk.verify(false);
    CHECK(r.ok == 1);
    CHECK(r.bad == 0);
}

TEST_CASE("list shows each entry's header, info and health, and ignores temp files") {
    TempDir tmp;
    DiskCache disk(tmp.str(), kNoCap, util::Logger());
    const Entry a = make_entry("listed a", "sm_80"), b = make_entry("listed b", "sm_90a");
    disk.store(a);
    disk.store(b);
    patch_byte(disk.entry_path(b.key), header_len(b.arch), [](char c) { return char(c ^ 0x40); });
    write_file(fs::path(disk.entry_path(a.key)).parent_path() / (".tmp-" + a.key + "-abcdef"), "half written");

    const auto listing = disk.list();
    REQUIRE(listing.size() == 2);
    for (const auto& l : listing) {
        const Entry& e = l.key == a.key ? a : b;
        CHECK(l.key == e.key);
        CHECK(l.arch == e.arch);
        CHECK(l.path == disk.entry_path(e.key));
        CHECK(l.size == fs::file_size(l.path));
        CHECK(std::abs(l.last_use - std::int64_t(std::time(nullptr))) < 60);
        if (l.key == a.key) {
            CHECK(l.ok);
            CHECK(l.problem.empty());
            CHECK(l.info_json == a.info_json);
        } else {
            CHECK_FALSE(l.ok);
            CHECK(l.problem.find("checksum") != std::string::npos);
        }
    }
}

TEST_CASE("prune by age and by size") {
    TempDir tmp;
    DiskCache disk(tmp.str(), kNoCap, util::Logger());
    const Entry old1 = make_entry("old 1"), old2 = make_entry("old 2"), fresh = make_entry("fresh");
    const std::uint64_t size = header_len("sm_90a") + old1.cubin.size() + old1.info_json.size();
    for (const auto* e : {&old1, &old2, &fresh}) disk.store(*e);
    set_age(disk.entry_path(old1.key), 3000);
    set_age(disk.entry_path(old2.key), 2000);
    set_age(disk.entry_path(fresh.key), 10);
    const fs::path shard = fs::path(disk.entry_path(fresh.key)).parent_path();
    const fs::path stale_tmp = shard / ".tmp-crashed-writer", live_tmp = shard / ".tmp-live-writer";
    write_file(stale_tmp, "left by a crash");
    write_file(live_tmp, "being written");
    set_age(stale_tmp, 7200);

    SECTION("by age") {
        const auto r = disk.prune(std::nullopt, 1000);
        CHECK(r.removed == 2);
        CHECK(r.bytes_freed == 2 * size);
        CHECK_FALSE(fs::exists(disk.entry_path(old1.key)));
        CHECK_FALSE(fs::exists(disk.entry_path(old2.key)));
        CHECK(fs::exists(disk.entry_path(fresh.key)));
        CHECK_FALSE(fs::exists(stale_tmp));
        CHECK(fs::exists(live_tmp));
    }
    SECTION("by size") {
        const auto r = disk.prune(size + size / 2, std::nullopt);
        CHECK(r.removed == 2);
        CHECK(r.bytes_freed == 2 * size);
        CHECK(fs::exists(disk.entry_path(fresh.key)));
        CHECK(disk.total_bytes() == size);
    }
    SECTION("by size, after age") {
        const auto r = disk.prune(size * 2, 2500);
        CHECK(r.removed == 1);  // old1 by age; then two entries fit
        CHECK(fs::exists(disk.entry_path(old2.key)));
    }
}

TEST_CASE("clear removes entries, lock files and temp files") {
    TempDir tmp;
    DiskCache disk(tmp.str(), kNoCap, util::Logger());
    for (const char* name : {"clear 1", "clear 2", "clear 3"}) disk.store(make_entry(name));
    const Entry e = make_entry("clear 1");
    { auto l = disk.lock(e.key); }
    write_file(fs::path(disk.entry_path(e.key)).parent_path() / ".tmp-orphan", "orphan");
    REQUIRE(files_under(disk.dir()).size() == 5);

    CHECK(disk.clear() == 3);
    CHECK(files_under(disk.dir()).empty());
    CHECK(disk.total_bytes() == 0);
    CHECK(disk.list().empty());
    CHECK(disk.clear() == 0);
}

TEST_CASE("default_dir follows RTATTN_CACHE_DIR, XDG_CACHE_HOME, HOME") {
    struct SavedEnv {
        std::vector<std::pair<std::string, std::optional<std::string>>> saved;
        void set(const std::string& name, const char* value) {
            const char* old = std::getenv(name.c_str());
            saved.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
            if (value)
                ::setenv(name.c_str(), value, 1);
            else
                ::unsetenv(name.c_str());
        }
        ~SavedEnv() {
            for (auto it = saved.rbegin(); it != saved.rend(); ++it)
                if (it->second)
                    ::setenv(it->first.c_str(), it->second->c_str(), 1);
                else
                    ::unsetenv(it->first.c_str());
        }
    } env;
    env.set("RTATTN_CACHE_DIR", "/srv/kernels");
    env.set("XDG_CACHE_HOME", "/xdg");
    env.set("HOME", "/home/u");
    CHECK(default_dir() == "/srv/kernels");
    env.set("RTATTN_CACHE_DIR", nullptr);
    CHECK(default_dir() == "/xdg/rtattn");
    env.set("XDG_CACHE_HOME", "relative/ignored");
    CHECK(default_dir() == "/home/u/.cache/rtattn");
    env.set("XDG_CACHE_HOME", "");
    CHECK(default_dir() == "/home/u/.cache/rtattn");
}
