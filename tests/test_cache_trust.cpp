// Whom the disk cache trusts and what it does when it cannot keep a kernel (issue 9): entries and directories
// others can write are refused (a shared cache is opted into), what it creates follows the umask, strings from
// entries are escaped, nothing is lost, hangs or escapes silently. Tests that need root (chown) or another user
// skip visibly, or drop to one in a child, where they cannot run as they are.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "cache/fsys.hpp"
#include "cache_testutil.hpp"
#include "catch.hpp"
#include "core/rtattn.hpp"
#include "testutil.hpp"

namespace fs = std::filesystem;
using namespace rtattn;
using namespace rtattn::cache;
using namespace rtattn::test;

namespace {

const util::Logger kQuiet(LogLevel::quiet, nullptr);

bool is_root() { return ::geteuid() == 0; }

fs::path shard_dir(DiskCache& disk, const Entry& e) {
    REQUIRE(disk.store(e).empty());
    return fs::path(disk.entry_path(e.key)).parent_path();
}

}  // namespace

// ---- trust ---------------------------------------------------------------------------------------------------------

TEST_CASE("an entry or shard others can write is not loaded: one warning, compiled instead, refused in cache_only") {
    TempDir tmp;
    const Entry e = make_entry("planted");
    struct Case {
        const char* name;
        std::function<fs::path(DiskCache&)> loosen;  // returns the path named in the warning
    };
    const std::vector<Case> cases = {
        {"entry writable by group",
         [&](DiskCache& d) {
             fs::permissions(d.entry_path(e.key), fs::perms::group_write, fs::perm_options::add);
             return fs::path(d.entry_path(e.key));
         }},
        {"shard writable by group",
         [&](DiskCache& d) {
             const fs::path shard = fs::path(d.entry_path(e.key)).parent_path();
             fs::permissions(shard, fs::perms::group_write, fs::perm_options::add);
             return shard;
         }},
        {"entry writable by everyone",
         [&](DiskCache& d) {
             fs::permissions(d.entry_path(e.key), fs::perms::others_write, fs::perm_options::add);
             return fs::path(d.entry_path(e.key));
         }},
    };
    for (const auto& c : cases) {
        DYNAMIC_SECTION(c.name) {
            const std::string dir = tmp.str() + "/" + c.name;
            CapturedLog log;
            KernelCache kc(dir, disk_options(), log.logger());
            REQUIRE(kc.disk().store(e).empty());  // "another user" wrote a perfectly valid entry
            const fs::path named = c.loosen(kc.disk());

            const std::string miss = error_of([&] { kc.get(e.key, e.arch, nullptr, "planted"); });
            CHECK(miss.find("refused") != std::string::npos);
            CHECK(miss.find("writable") != std::string::npos);
            CountingBuilder b{make_entry("planted")};
            b.entry.cubin = "compiled here";
            const auto got = kc.get(e.key, e.arch, b.fn(), "planted");
            CHECK(got.source == Source::compiled);
            CHECK(got.entry->cubin == "compiled here");
            CHECK(log.count_containing(named.string()) == 1);  // one warning naming the path, however often asked
            CHECK(log.any_warning_contains(named.string(), "writable"));
        }
    }
}

TEST_CASE("a cache root that others can write is not used at all; a shared cache is opted into") {
    TempDir tmp;
    const std::string dir = tmp.str() + "/team";
    const Entry e = make_entry("team entry");
    {
        DiskCache writer(dir, disk_options(), kQuiet);
        REQUIRE(writer.store(e).empty());
    }
    fs::permissions(dir, fs::perms(0775));

    CapturedLog log;
    KernelCache kc(dir, disk_options(), log.logger());
    CHECK_FALSE(kc.disk().enabled());
    REQUIRE(log.warnings().size() == 1);
    CHECK(log.warnings()[0].find(dir + " is writable by group") != std::string::npos);
    CHECK(log.warnings()[0].find("RTATTN_SHARED_CACHE") != std::string::npos);
    CountingBuilder b{e};
    const auto got = kc.get(e.key, e.arch, b.fn(), "team entry");
    CHECK(got.source == Source::compiled);
    CHECK(got.not_stored.find("not trusted") != std::string::npos);
    CHECK(log.warnings().size() == 1);
    CHECK_THROWS_AS(kc.disk().clear(), CacheError);
    CHECK(kc.disk().list().size() == 1);  // looking is fine

    DiskOptions shared = disk_options();
    shared.trust.shared = true;
    KernelCache team(dir, shared, kQuiet);
    CHECK(team.disk().enabled());
    CHECK(team.get(e.key, e.arch, nullptr, "team entry").source == Source::disk);

    fs::permissions(dir, fs::perms(0777));  // writable by every user: never trusted
    CHECK_FALSE(DiskCache(dir, shared, kQuiet).enabled());
}

TEST_CASE("entries and directories owned by another user are trusted only in a shared cache") {
    if (!is_root()) RTATTN_SKIP("needs root to give files to another user");
    TempDir tmp;
    const std::string dir = tmp.str() + "/C";
    const Entry e = make_entry("foreign owner");
    DiskCache disk(dir, disk_options(), kQuiet);
    REQUIRE(disk.store(e).empty());
    REQUIRE(::lchown(disk.entry_path(e.key).c_str(), 65534, 65534) == 0);
    const auto got = disk.load(e.key, e.arch);
    CHECK_FALSE(got.entry);
    CHECK(got.refused.find("owned by uid 65534") != std::string::npos);
    DiskOptions shared = disk_options();
    shared.trust.shared = true;
    CHECK(DiskCache(dir, shared, kQuiet).load(e.key, e.arch).entry);

    REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(DiskCache(dir, disk_options(), kQuiet).enabled());
}

TEST_CASE("what the cache creates gets modes from the umask, never wider than 0755/0644; a default root is 0700") {
    TempDir tmp;
    const auto mode = [](const fs::path& p) { return int(fs::status(p).permissions() & fs::perms::mask); };
    const Entry e = make_entry("modes");
    struct Umask {
        mode_t old;
        explicit Umask(mode_t m) : old(::umask(m)) {}
        ~Umask() { ::umask(old); }
    };
    {
        Umask open(0);
        DiskCache disk(tmp.str() + "/wide", disk_options(), kQuiet);
        REQUIRE(disk.store(e).empty());
        { auto l = disk.lock(e.key); }
        CHECK(mode(tmp.path() / "wide") == 0755);
        CHECK(mode(disk.dir()) == 0755);
        CHECK(mode(fs::path(disk.entry_path(e.key)).parent_path()) == 0755);
        CHECK(mode(disk.entry_path(e.key)) == 0644);
        CHECK(mode(fs::path(disk.entry_path(e.key)).replace_extension(".lock")) == 0644);
    }
    {
        Umask closed(077);
        DiskCache disk(tmp.str() + "/private", disk_options(), kQuiet);
        REQUIRE(disk.store(e).empty());
        CHECK(mode(disk.dir()) == 0700);
        CHECK(mode(disk.entry_path(e.key)) == 0600);
    }
    {
        Umask open(0);
        const char* old_dir = std::getenv("RTATTN_CACHE_DIR");
        const std::string saved_dir = old_dir ? old_dir : "";
        const char* old_xdg = std::getenv("XDG_CACHE_HOME");
        const std::string saved_xdg = old_xdg ? old_xdg : "";
        ::unsetenv("RTATTN_CACHE_DIR");
        ::setenv("XDG_CACHE_HOME", (tmp.path() / "xdg").c_str(), 1);
        DiskCache disk("", disk_options(), kQuiet);
        old_dir ? ::setenv("RTATTN_CACHE_DIR", saved_dir.c_str(), 1) : ::unsetenv("RTATTN_CACHE_DIR");
        old_xdg ? ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1) : ::unsetenv("XDG_CACHE_HOME");
        CHECK(disk.enabled());
        CHECK(mode(tmp.path() / "xdg") == 0700);
        CHECK(mode(tmp.path() / "xdg" / "rtattn") == 0700);
        CHECK(mode(disk.dir()) == 0755);
    }
}

// ---- what an entry says reaches a terminal escaped -------------------------------------------------------------

TEST_CASE("strings read from an entry are escaped in problems") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), kQuiet);
    Entry evil = make_entry("evil", "sm_90a");
    evil.arch = "\x1b[2J\x1b]0;pwned\x07";
    const std::string path = disk.entry_path(evil.key);
    fs::create_directories(fs::path(path).parent_path());
    write_file(path, encode_entry(evil));  // a valid checksum: whoever writes the file can compute one
    const auto listing = disk.list();
    REQUIRE(listing.size() == 1);
    CHECK_FALSE(listing[0].ok);
    CHECK(listing[0].problem.find("\\x1b[2J") != std::string::npos);
    for (const char c : listing[0].problem + listing[0].arch) CHECK((c >= 0x20 && c < 0x7f));
}

TEST_CASE("an entry whose info has a wrong type is bad; the others are listed") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), kQuiet);
    Entry odd = make_entry("odd info"), fine = make_entry("fine");
    odd.info_json = R"({"config":{},"registers":"lots"})";
    const std::string path = disk.entry_path(odd.key);
    fs::create_directories(fs::path(path).parent_path());
    write_file(path, encode_entry(odd));
    disk.store(fine);
    const auto listing = disk.list();
    REQUIRE(listing.size() == 2);
    for (const auto& l : listing) {
        CHECK(l.ok == (l.key == fine.key));
        if (l.key == odd.key) CHECK(l.problem.find("registers is not an integer") != std::string::npos);
    }
    CHECK(disk.load(odd.key, odd.arch).bad);
}

// ---- no silent loss, no silent hang, no escaped exception -----------------------------------------------------------

TEST_CASE("a kernel that could not be stored says so, and is served from memory") {
    TempDir tmp;
    CapturedLog log;
    KernelCache kc(tmp.str(), disk_options(), log.logger());
    const Entry e = make_entry("blocked");
    // A file where the entry's shard directory belongs (a disk-full or read-only mount fails the same path).
    write_file(fs::path(kc.disk().entry_path(e.key)).parent_path(), "in the way");
    CountingBuilder b{e};
    const auto got = kc.get(e.key, e.arch, b.fn(), "blocked");
    CHECK(got.source == Source::compiled);
    CHECK(got.entry->cubin == e.cubin);
    CHECK_FALSE(got.not_stored.empty());
    CHECK(kc.get(e.key, e.arch, b.fn(), "blocked").not_stored == got.not_stored);  // and a memory hit says it too
    CHECK(kc.counters().bytes_written == 0);
    CHECK(log.warnings().size() == 1);
}

TEST_CASE("a Runtime on a path that cannot be looked up warns once and caches in memory") {
    TempDir tmp;
    fs::create_symlink(tmp.path() / "loop-b", tmp.path() / "loop-a");
    fs::create_symlink(tmp.path() / "loop-a", tmp.path() / "loop-b");
    const std::vector<std::string> dirs = {tmp.str() + "/" + std::string(5000, 'a'),
                                           tmp.str() + "/" + std::string(300, 'b') + "/cache",
                                           (tmp.path() / "loop-a" / "cache").string()};
    for (const auto& dir : dirs) {
        std::vector<std::string> warnings;
        RuntimeOptions o;
        o.cache_dir = dir;
        o.log_sink = [&](LogLevel, const std::string& m) { warnings.push_back(m); };
        try {
            Runtime rt(o);
            CHECK_FALSE(rt.stats().disk_enabled);
        } catch (const std::exception& e) {
            FAIL("Runtime threw: " << e.what());
        }
        CHECK(warnings.size() == 1);
    }
    // A parent without search permission (HOME=/root as nobody): mode 0000 stops its owner too, and root is
    // stopped by dropping to nobody in the child.
    fs::create_directory(tmp.path() / "sealed");
    fs::permissions(tmp.path() / "sealed", fs::perms::none);
    fs::permissions(tmp.path(), fs::perms(0755));
    const int rc = in_child(
        [&] {
            int warnings = 0;
            RuntimeOptions o;
            o.cache_dir = (tmp.path() / "sealed" / "cache").string();
            o.log_sink = [&](LogLevel, const std::string&) { ++warnings; };
            Runtime rt(o);
            return !rt.stats().disk_enabled && warnings == 1 ? 0 : 1;
        },
        10, /*as_nobody=*/true);
    CHECK(rc == 0);
}

TEST_CASE("a lock held too long is waited on for a bounded time; the kernel is then built but not stored") {
    TempDir tmp;
    const Entry e = make_entry("held");
    DiskCache holder(tmp.str(), disk_options(), kQuiet);
    const auto held = holder.lock(e.key);  // a stopped or slow process, in effect
    REQUIRE(held.held());

    CapturedLog log;
    DiskOptions o = disk_options();
    o.lock_timeout = std::chrono::milliseconds(600);
    o.lock_warn_after = std::chrono::milliseconds(100);
    KernelCache kc(tmp.str(), o, log.logger());
    CountingBuilder b{e};
    const auto t0 = std::chrono::steady_clock::now();
    const auto got = kc.get(e.key, e.arch, b.fn(), "held");
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(waited >= std::chrono::milliseconds(600));
    CHECK(waited < std::chrono::seconds(10));
    CHECK(got.source == Source::compiled);
    CHECK(got.not_stored.find("gave up waiting") != std::string::npos);
    CHECK_FALSE(fs::exists(kc.disk().entry_path(e.key)));  // never two writers of one entry
    const std::string pid = "pid " + std::to_string(::getpid());
    CHECK(log.any_warning_contains("waiting for", pid));  // who is waited for, before giving up
    CHECK(log.any_warning_contains("gave up waiting", pid));
    CHECK(kc.disk().clear().in_use == 1);  // a held lock file stays
}

TEST_CASE("temp files: a live writer's survive clear and prune, a dead writer's are removed by the next scan") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(1 << 30), kQuiet);
    const Entry e = make_entry("temps");
    const fs::path shard = shard_dir(disk, e);
    fsys::Dir dir;
    REQUIRE(fsys::Dir::open_path(shard.string(), false, 0755, &dir).ok());
    fsys::TempFile live;
    REQUIRE(fsys::TempFile::create(dir, temp_prefix(e.key), &live).ok());
    const fs::path dead = shard / (".tmp-" + e.key + "-Dead01");
    write_file(dead, "left by a crash");
    disk.prune(std::nullopt, std::nullopt);
    CHECK(fs::exists(live.path()));
    CHECK_FALSE(fs::exists(dead));
    write_file(dead, "left by a crash");
    CHECK(disk.clear().in_use == 1);
    CHECK(fs::exists(live.path()));
    CHECK_FALSE(fs::exists(dead));
    write_file(dead, "left by a crash");
    disk.store(make_entry("another"));  // the eviction scan after a store
    CHECK_FALSE(fs::exists(dead));
    CHECK(fs::exists(live.path()));
    CHECK(live.write("done").ok());
    CHECK(live.commit(entry_name(e.key)).ok());
}

TEST_CASE("clear racing stores never costs a store its entry") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), kQuiet);
    std::atomic<bool> stop{false};
    std::thread clearer([&] {
        while (!stop) disk.clear();
    });
    int failures = 0;
    std::string first_failure;
    for (int i = 0; i < 300; ++i) {
        const std::string problem = disk.store(make_entry("race " + std::to_string(i % 4), "sm_90a", 64 << 10));
        if (!problem.empty() && failures++ == 0) first_failure = problem;
    }
    stop = true;
    clearer.join();
    INFO(first_failure);
    CHECK(failures == 0);
}

TEST_CASE("Runtime options are checked and the compile bound is capped at the hardware threads") {
    RuntimeOptions o;
    o.cache_dir = TempDir().str();
    o.lock_timeout_seconds = -1;
    CHECK_THROWS_AS(Runtime(o), ConfigError);
    o.lock_timeout_seconds = std::numeric_limits<double>::quiet_NaN();
    CHECK_THROWS_AS(Runtime(o), ConfigError);
    o.lock_timeout_seconds = 60;
    o.max_concurrent_compiles = -2;
    CHECK_THROWS_AS(Runtime(o), ConfigError);
    o.max_concurrent_compiles = 64;
    const int hardware = std::max(1, int(std::thread::hardware_concurrency()));
    CHECK(Runtime(o).options().max_concurrent_compiles == std::min(64, hardware));
    o.max_concurrent_compiles = 0;
    CHECK(Runtime(o).options().max_concurrent_compiles == std::min(8, hardware));
}
