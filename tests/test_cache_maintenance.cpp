// The disk cache's maintenance: list, verify (and repair), prune by age and size, clear. Hostile file systems under
// the same commands are in test_cache_security.cpp.
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>

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
