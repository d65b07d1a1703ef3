// Disk tier of the cache: entry format and verification, atomic writes, the key lock, eviction, unwritable
// directories. Maintenance (list, verify, prune, clear) is in test_cache_maintenance.cpp, the memory tier in
// test_kernel_cache.cpp, hostile file systems in test_cache_security.cpp.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "cache_testutil.hpp"
#include "catch.hpp"
#include "core/errors.hpp"
#include "testutil.hpp"

namespace fs = std::filesystem;
using namespace rtattn;
using namespace rtattn::cache;
using namespace rtattn::test;

TEST_CASE("SHA-256 gives FIPS 180-4's digests, fed whole or in pieces", "[cache]") {
    using rtattn::util::Sha256;
    using rtattn::util::sha256;
    using rtattn::util::to_hex;
    auto hex = [](std::string_view s) { return to_hex(sha256(s.data(), s.size())); };
    CHECK(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 56 bytes: padding
    CHECK(hex(two_blocks) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");  // spills over
    const std::string million(1000000, 'a');
    CHECK(hex(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    for (std::size_t piece : {1, 3, 55, 63, 64, 65, 1000}) {  // pieces that straddle the 64-byte blocks
        Sha256 h;
        for (std::size_t at = 0; at < 10007; at += piece) h.update(million.data() + at, std::min(piece, 10007 - at));
        CAPTURE(piece);
        CHECK(to_hex(h.finish()) == to_hex(sha256(million.data(), 10007)));
    }
}

TEST_CASE("entries round-trip through the disk cache") {
    TempDir tmp;
    CapturedLog log;
    DiskCache disk(tmp.str(), disk_options(), log.logger());
    REQUIRE(disk.enabled());
    CHECK(disk.dir() == tmp.str() + "/v2");

    const Entry e = make_entry("round-trip");
    const std::uint64_t written = stored_bytes(disk, e);
    const std::string path = disk.entry_path(e.key);
    CHECK(path == tmp.str() + "/v2/" + e.key.substr(0, 2) + "/" + e.key + ".rtc");
    REQUIRE(fs::exists(path));
    CHECK(written == fs::file_size(path));
    CHECK(written == entry_size(e));
    CHECK(disk.total_bytes() == written);

    const auto got = disk.load(e.key, e.arch);
    REQUIRE(got.entry);
    CHECK_FALSE(got.bad);
    CHECK(got.refused.empty());
    CHECK(got.entry->key == e.key);
    CHECK(got.entry->arch == e.arch);
    CHECK(got.entry->cubin == e.cubin);
    CHECK(got.entry->info_json == e.info_json);
    CHECK(files_under(tmp.path(), ".tmp-").empty());
    CHECK(log.warnings().empty());
}

TEST_CASE("a missing entry is a plain miss") {
    TempDir tmp;
    CapturedLog log;
    DiskCache disk(tmp.str(), disk_options(), log.logger());
    const auto got = disk.load(key_of("never stored"), "sm_90a");
    CHECK_FALSE(got.entry);
    CHECK_FALSE(got.bad);
    CHECK(log.warnings().empty());
    CHECK_THROWS_AS(disk.load("../../etc/passwd", "sm_90a"), CacheError);
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
        {"trailing bytes", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { std::ofstream(p, std::ios::app) << "more"; },
         "trailing bytes"},
        {"flipped cubin byte", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry& e, const fs::path& p) {
             patch_byte(p, header_len(e.arch) + 10, [](char c) { return char(c ^ 0x01); });
         },
         "checksum"},
        {"flipped info byte", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) {
             patch_byte(p, fs::file_size(p) - 32 - 2, [](char c) { return char(c ^ 0x20); });
         },
         "checksum"},
        {"flipped checksum byte", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) {
             patch_byte(p, fs::file_size(p) - 1, [](char c) { return char(c ^ 0x01); });
         },
         "checksum"},
        {"wrong magic", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { patch_byte(p, 0, [](char) { return 'X'; }); }, "magic"},
        {"wrong format version", "sm_90a", "sm_90a",
         [](DiskCache&, const Entry&, const fs::path& p) { patch_byte(p, 8, [](char) { return char(3); }); },
         "format version 3"},
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
            DiskCache disk(tmp.str(), disk_options(), log.logger());
            const Entry stored = make_entry("corrupt", c.stored_arch);
            const fs::path path = disk.entry_path(stored.key);

            disk.store(stored);
            c.damage(disk, stored, path);
            const auto got = disk.load(stored.key, c.requested_arch);
            CHECK_FALSE(got.entry);
            CHECK(got.bad);
            CHECK_FALSE(fs::exists(path));
            CHECK(log.any_warning_contains(path.string(), c.problem));

            // Through KernelCache: the bad entry is counted and rebuilt once.
            disk.store(stored);
            c.damage(disk, stored, path);
            KernelCache kc(tmp.str(), disk_options(), log.logger());
            CountingBuilder b{make_entry("corrupt", c.requested_arch)};
            const auto rebuilt = kc.get(stored.key, c.requested_arch, b.fn(), "corrupt");
            CHECK(rebuilt.source == Source::compiled);
            CHECK(*b.calls == 1);
            CHECK(rebuilt.entry->arch == c.requested_arch);
            CHECK(rebuilt.entry->cubin == b.entry.cubin);
            CHECK(kc.counters().bad_entries == 1);
            CHECK(kc.counters().misses == 1);
            CHECK(disk.load(stored.key, c.requested_arch).entry);  // the rebuilt entry is sound
        }
    }
}

TEST_CASE("the cross-process key lock excludes other holders until released") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    const std::string key = key_of("locked");
    auto held = std::make_unique<DiskCache::KeyLock>(disk.lock(key));
    REQUIRE(held->held());
    std::atomic<bool> acquired{false};
    std::thread other([&] {
        auto l = disk.lock(key);
        acquired = l.held();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(acquired);
    held.reset();
    other.join();
    CHECK(acquired);
    const std::string lock_path = tmp.str() + "/v2/" + key.substr(0, 2) + "/" + key + ".lock";
    REQUIRE(fs::exists(lock_path));
    // The holder names itself in the file, so that a waiter can say whom it waits for.
    CHECK(test::read_file(lock_path).find("pid " + std::to_string(::getpid())) == 0);
}

TEST_CASE("eviction keeps the cache under its cap, least recently used first") {
    TempDir tmp;
    const Entry e1 = make_entry("evict 1", "sm_90a", 1000), e2 = make_entry("evict 2", "sm_90a", 1000),
                e3 = make_entry("evict 3", "sm_90a", 1000), e4 = make_entry("evict 4", "sm_90a", 1000);
    const std::uint64_t size = entry_size(e1);
    DiskCache disk(tmp.str(), disk_options(size * 2 + size / 2), util::Logger());  // room for two

    CHECK(stored_bytes(disk, e1) == size);
    set_age(disk.entry_path(e1.key), 300);
    disk.store(e2);
    set_age(disk.entry_path(e2.key), 200);
    disk.store(e3);
    CHECK_FALSE(fs::exists(disk.entry_path(e1.key)));
    CHECK(fs::exists(disk.entry_path(e2.key)));
    CHECK(fs::exists(disk.entry_path(e3.key)));
    CHECK(disk.evictions() == 1);

    // A hit makes e2 the most recently used, so e3 goes next.
    REQUIRE(disk.load(e2.key, e2.arch).entry);
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
    DiskCache disk(tmp.str(), disk_options(10), util::Logger());
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

// Unusable cache dirs: the cache warns once and keeps working from memory.
void check_memory_only(const std::string& dir) {
    CapturedLog log;
    KernelCache kc(dir, disk_options(), log.logger());
    CHECK_FALSE(kc.disk().enabled());
    REQUIRE(log.warnings().size() == 1);
    const std::string w = log.warnings()[0];
    CHECK(w.rfind("cache dir " + dir + " is not usable (", 0) == 0);
    CHECK(w.find("); caching in memory only") != std::string::npos);

    CountingBuilder b{make_entry("memory only")};
    auto got = kc.get(b.entry.key, b.entry.arch, b.fn(), "memory only");
    CHECK(got.entry->cubin == b.entry.cubin);
    CHECK(got.source == Source::compiled);
    CHECK_FALSE(got.not_stored.empty());
    got = kc.get(b.entry.key, b.entry.arch, b.fn(), "memory only");
    CHECK(got.source == Source::memory);
    CHECK_FALSE(got.not_stored.empty());  // still only in memory
    CHECK(*b.calls == 1);
    CHECK(kc.counters().bytes_written == 0);

    DiskCache& disk = kc.disk();
    CHECK_FALSE(disk.store(b.entry).empty());
    CHECK_FALSE(disk.load(b.entry.key, b.entry.arch).entry);
    CHECK(disk.total_bytes() == 0);
    CHECK_FALSE(disk.lock(b.entry.key).held());
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

// A cache baked into a read-only image (root's files, read by a service user): entries are served, nothing is
// written. The check runs in a child process that, when we are root (who may write anywhere), drops to an
// unprivileged user first.
TEST_CASE("a readable but unwritable cache dir serves its entries and writes nothing") {
    TempDir tmp;
    const std::string dir = (tmp.path() / "image-cache").string();
    const Entry baked = make_entry("baked");
    {
        DiskCache writer(dir, disk_options(), util::Logger(rtattn::LogLevel::quiet, nullptr));
        REQUIRE(writer.store(baked).empty());
    }
    for (auto it = fs::recursive_directory_iterator(tmp.path()); it != fs::recursive_directory_iterator(); ++it)
        fs::permissions(it->path(), it->is_directory() ? fs::perms(0555) : fs::perms(0444));
    fs::permissions(tmp.path(), fs::perms(0755));

    const int failures = in_child(
        [&] {
            int failures = 0;
            auto expect = [&](bool ok) { failures += ok ? 0 : 1; };
            std::vector<std::string> warnings;
            KernelCache kc(dir, disk_options(),
                           util::Logger(rtattn::LogLevel::warn, [&](rtattn::LogLevel, const std::string& m) {
                               warnings.push_back(m);
                           }));
            expect(kc.disk().enabled() && kc.disk().read_only());
            expect(warnings.size() == 1 && warnings[0].find("read-only") != std::string::npos);
            CountingBuilder unused{baked};
            auto got = kc.get(baked.key, baked.arch, unused.fn(), "baked");
            expect(got.entry->cubin == baked.cubin);
            expect(got.source == Source::disk && *unused.calls == 0);
            CountingBuilder fresh{make_entry("fresh")};
            got = kc.get(fresh.entry.key, fresh.entry.arch, fresh.fn(), "fresh");
            expect(got.entry->cubin == fresh.entry.cubin);
            expect(got.source == Source::compiled && *fresh.calls == 1 && kc.counters().bytes_written == 0);
            expect(got.not_stored.find("read-only") != std::string::npos);
            expect(!fs::exists(kc.disk().entry_path(fresh.entry.key)));
            expect(kc.disk().list().size() == 1);
            expect(error_of([&] { kc.disk().clear(); }).find("read-only") != std::string::npos);
            expect(warnings.size() == 1);
            return failures;
        },
        20, /*as_nobody=*/true);
    for (auto it = fs::recursive_directory_iterator(tmp.path()); it != fs::recursive_directory_iterator(); ++it)
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add);
    CHECK(failures == 0);
    CHECK(fs::exists(DiskCache(dir, disk_options(), util::Logger()).entry_path(baked.key)));
}

TEST_CASE("default_root follows RTATTN_CACHE_DIR, XDG_CACHE_HOME, HOME") {
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
    CHECK_FALSE(default_root().per_user);  // an explicit directory keeps the umask's modes
    env.set("RTATTN_CACHE_DIR", nullptr);
    CHECK(default_dir() == "/xdg/rtattn");
    CHECK(default_root().per_user);
    env.set("XDG_CACHE_HOME", "relative/ignored");
    CHECK(default_dir() == "/home/u/.cache/rtattn");
    env.set("XDG_CACHE_HOME", "");
    CHECK(default_dir() == "/home/u/.cache/rtattn");
    CHECK(default_root().per_user);
}
