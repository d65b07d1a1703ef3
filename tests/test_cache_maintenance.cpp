// The disk cache's maintenance: list, verify (and repair), prune by age and size, clear. Hostile file systems under
// the same commands are in test_cache_security.cpp.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "cache/cache.hpp"
#include "cache_testutil.hpp"
#include "catch.hpp"
#include "testutil.hpp"

namespace fs = std::filesystem;
using namespace rtattn;
using namespace rtattn::cache;
using namespace rtattn::test;

TEST_CASE("verify reports bad entries and repair removes them") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
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
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
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
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    const Entry old1 = make_entry("old 1"), old2 = make_entry("old 2"), fresh = make_entry("fresh");
    const std::uint64_t size = entry_size(old1);
    for (const auto* e : {&old1, &old2, &fresh}) disk.store(*e);
    set_age(disk.entry_path(old1.key), 3000);
    set_age(disk.entry_path(old2.key), 2000);
    set_age(disk.entry_path(fresh.key), 10);

    SECTION("by age") {
        const auto r = disk.prune(std::nullopt, 1000);
        CHECK(r.removed == 2);
        CHECK(r.bytes_freed == 2 * size);
        CHECK_FALSE(fs::exists(disk.entry_path(old1.key)));
        CHECK_FALSE(fs::exists(disk.entry_path(old2.key)));
        CHECK(fs::exists(disk.entry_path(fresh.key)));
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

TEST_CASE("clear removes entries, and lock and temp files nobody holds") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    for (const char* name : {"clear 1", "clear 2", "clear 3"}) disk.store(make_entry(name));
    const Entry e = make_entry("clear 1");
    { auto l = disk.lock(e.key); }
    write_file(fs::path(disk.entry_path(e.key)).parent_path() / (".tmp-" + e.key + "-orphan"), "orphan");
    REQUIRE(files_under(disk.dir()).size() == 5);

    const auto r = disk.clear();
    CHECK(r.entries == 3);
    CHECK(r.in_use == 0);
    CHECK(files_under(disk.dir()).empty());
    CHECK(disk.total_bytes() == 0);
    CHECK(disk.list().empty());
    CHECK(disk.clear().entries == 0);
}

// Issue 21: bad input never corrupts memory, hangs or crashes.

TEST_CASE("prune by an age beyond int64 nanoseconds removes nothing; far-future files stay in order", "[cache]") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    const Entry old = make_entry("aged"), future = make_entry("from the future");
    disk.store(old);
    disk.store(future);
    set_age(disk.entry_path(old.key), 3000);
    // 2400-01-01: seconds * 1e9 is past int64, and wrapped to a time long ago.
    struct timespec times[2] = {{13569465600, 0}, {13569465600, 0}};
    REQUIRE(::utimensat(AT_FDCWD, disk.entry_path(future.key).c_str(), times, AT_SYMLINK_NOFOLLOW) == 0);

    // 150000 days ago is before the year 1677, where int64 nanoseconds end: the cutoff wrapped to the far future.
    for (const std::int64_t age : {std::int64_t(150000) * 86400, std::numeric_limits<std::int64_t>::max()}) {
        INFO(age);
        CHECK(disk.prune(std::nullopt, age).removed == 0);
    }
    const auto r = disk.prune(std::nullopt, 1000);
    CHECK(r.removed == 1);
    CHECK_FALSE(fs::exists(disk.entry_path(old.key)));
    CHECK(fs::exists(disk.entry_path(future.key)));
}

TEST_CASE("write probes a killed process left are cleaned like other dead writers' temp files", "[cache]") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    const fs::path vdir = disk.dir();
    const fs::path stale = vdir / ".tmp-probe-Ab3xY9";
    write_file(stale, "");
    // Not names the cache creates there: kept.
    const Entry e = make_entry("probe neighbour");
    disk.store(e);
    const fs::path shard = fs::path(disk.entry_path(e.key)).parent_path();
    const std::vector<fs::path> foreign = {vdir / ".tmp-probe-toolong", vdir / ".tmp-probe-abc",
                                           vdir / ".tmp-probeXabcdef", vdir / (".tmp-" + e.key + "-abcdef"),
                                           shard / ".tmp-probe-abcdef"};
    for (const auto& f : foreign) write_file(f, "keep me");
    // A link with a probe's name: the link goes, never its target.
    const fs::path target = tmp.path() / "target";
    write_file(target, "keep me");
    fs::create_symlink(target, vdir / ".tmp-probe-link00");
    // A live probe (its writer holds the lock) stays.
    fsys::Dir v;
    REQUIRE(fsys::Dir::open_path(vdir.string(), false, 0755, &v).ok());
    fsys::TempFile live;
    REQUIRE(fsys::TempFile::create(v, temp_prefix("probe"), &live).ok());

    SECTION("by prune") { disk.prune(std::nullopt, std::int64_t(86400)); }
    SECTION("by verify --repair") { disk.verify(true); }
    SECTION("by clear") { CHECK(disk.clear().in_use == 1); }
    CHECK_FALSE(fs::exists(fs::symlink_status(stale)));
    CHECK_FALSE(fs::exists(fs::symlink_status(vdir / ".tmp-probe-link00")));
    CHECK(fs::exists(target));
    CHECK(fs::exists(live.path()));
    for (const auto& f : foreign) CHECK(fs::exists(f));
}

TEST_CASE("an entry whose info is nested too deep, or repeats a key, is a bad entry", "[cache]") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), util::Logger());
    Entry deep = make_entry("deep info"), twice = make_entry("repeated key");
    // Of the right types where it matters, so only the depth gives it away; `rtattn ls --json` copied it, once per
    // level of recursion, and crashed.
    deep.info_json = R"({"config":{"comment":)" + std::string(100000, '[') + std::string(100000, ']') + "}}";
    twice.info_json = R"({"registers":96,"registers":"lots"})";
    disk.store(deep);
    disk.store(twice);
    const auto listing = disk.list();
    REQUIRE(listing.size() == 2);
    for (const auto& l : listing) {
        CHECK_FALSE(l.ok);
        CHECK(l.problem.find(l.key == deep.key ? "nested deeper than 64 levels" : "'registers' appears twice") !=
              std::string::npos);
    }
    const auto r = disk.verify(false);
    CHECK(r.bad == 2);
    CHECK(r.ok == 0);
}
