// The disk cache against hostile and careless file systems (issue 9): nothing outside the cache is touched, no
// symlink is followed, nothing that is not a regular file of plausible size is read, the header's checksum holds,
// and looking creates nothing. Whom it trusts and what it does when it cannot store: test_cache_trust.cpp.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cache/cache.hpp"
#include "cache_testutil.hpp"
#include "catch.hpp"
#include "testutil.hpp"

namespace fs = std::filesystem;
using namespace rtattn;
using namespace rtattn::cache;
using namespace rtattn::test;

namespace {

const util::Logger kQuiet(LogLevel::quiet, nullptr);

// A foreign folder with files whose names look like the cache's, and a link to it in place of shard `shard`.
struct ForeignFolder {
    fs::path dir;
    std::vector<fs::path> files;
    ForeignFolder(const fs::path& where, const std::string& shard) : dir(where) {
        fs::create_directories(dir);
        const std::string key = shard + key_of("foreign").substr(2);
        for (const std::string& name : {std::string("thesis.rtc"), std::string("project.lock"), std::string(".tmp-x"),
                                        key + ".rtc", key + ".lock", ".tmp-" + key + "-abcdef"}) {
            files.push_back(dir / name);
            write_file(files.back(), "precious");
            set_age(files.back(), 90 * 86400);  // old enough for any prune
        }
    }
    bool intact() const {
        for (const auto& f : files)
            if (!fs::exists(f) || test::read_file(f) != "precious") return false;
        return true;
    }
};

// The shard directory an entry lives in, created by a store.
fs::path shard_dir(DiskCache& disk, const Entry& e) {
    REQUIRE(disk.store(e).empty());
    return fs::path(disk.entry_path(e.key)).parent_path();
}

}  // namespace

TEST_CASE("a symlinked shard is never followed: verify --repair, clear and prune leave its target alone") {
    TempDir tmp;
    DiskCache disk(tmp.str() + "/C", disk_options(), kQuiet);
    disk.store(make_entry("real"));
    const ForeignFolder hex(tmp.path() / "F", "ab"), other(tmp.path() / "G", "zz");
    fs::create_directory_symlink(hex.dir, fs::path(disk.dir()) / "ab");
    fs::create_directory_symlink(other.dir, fs::path(disk.dir()) / "zz");

    const auto report = disk.verify(false);
    CHECK(report.ok == 1);
    CHECK(report.bad == 1);  // the link named like a shard; "zz" is not a cache name and is not looked at
    REQUIRE(report.problems.size() == 1);
    CHECK(report.problems[0].find("symlink") != std::string::npos);
    CHECK(disk.list().size() == 1);
    CHECK(disk.total_bytes() == fs::file_size(disk.entry_path(make_entry("real").key)));

    disk.prune(0, 0);
    CHECK(hex.intact());
    disk.verify(true);
    CHECK(hex.intact());
    CHECK_FALSE(fs::exists(fs::symlink_status(fs::path(disk.dir()) / "ab")));  // the link itself went
    fs::create_directory_symlink(hex.dir, fs::path(disk.dir()) / "ab");
    disk.clear();
    CHECK(hex.intact());
    CHECK(other.intact());
    CHECK(fs::exists(fs::symlink_status(fs::path(disk.dir()) / "zz")));  // not a name the cache creates
}

TEST_CASE("only names the cache creates are ever removed") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), kQuiet);
    const Entry e = make_entry("mine");
    const fs::path shard = shard_dir(disk, e);
    const std::string other_shard_key = (e.key[0] == '0' ? "1" : "0") + e.key.substr(1);
    std::vector<fs::path> foreign;
    for (const std::string& name : {std::string("notes.txt"), std::string("abc.rtc"), std::string("x.lock"),
                                    std::string(".tmp-notes"), other_shard_key + ".rtc", e.key + ".rtc.bak",
                                    ".tmp-" + e.key + "-toolongsuffix"}) {
        foreign.push_back(shard / name);
        write_file(foreign.back(), "keep me");
        set_age(foreign.back(), 90 * 86400);
    }
    write_file(fs::path(disk.dir()) / "README", "keep me");
    disk.verify(true);
    disk.prune(0, 0);
    disk.clear();
    CHECK_FALSE(fs::exists(disk.entry_path(e.key)));
    for (const auto& f : foreign) CHECK(fs::exists(f));
    CHECK(fs::exists(fs::path(disk.dir()) / "README"));
}

TEST_CASE("a planted lock symlink is not followed: nothing is created through it") {
    TempDir tmp;
    CapturedLog log;
    KernelCache kc(tmp.str() + "/C", disk_options(), log.logger());
    const Entry e = make_entry("planted lock");
    const fs::path shard = fs::path(kc.disk().entry_path(e.key)).parent_path();
    fs::create_directories(shard);
    const fs::path victim = tmp.path() / "victim-created";
    fs::create_symlink(victim, shard / (e.key + ".lock"));

    CountingBuilder b{e};
    const auto got = kc.get(e.key, e.arch, b.fn(), "planted lock");
    CHECK(got.entry->cubin == e.cubin);
    CHECK(got.source == Source::compiled);
    CHECK(got.not_stored.find("symlink") != std::string::npos);  // no lock, so no store: never two writers
    CHECK_FALSE(fs::exists(fs::symlink_status(victim)));
    CHECK(log.any_warning_contains(e.key + ".lock", "symlink"));

    // Maintenance removes the link itself.
    kc.disk().clear();
    CHECK_FALSE(fs::exists(fs::symlink_status(shard / (e.key + ".lock"))));
    CHECK_FALSE(fs::exists(fs::symlink_status(victim)));
}

TEST_CASE("a FIFO at an entry path neither hangs a load nor a listing; verify reports it, repair removes it") {
    TempDir tmp;
    const std::string dir = tmp.str() + "/C";
    const Entry e = make_entry("fifo");
    {
        DiskCache disk(dir, disk_options(), kQuiet);
        fs::create_directories(fs::path(disk.entry_path(e.key)).parent_path());
        REQUIRE(::mkfifo(disk.entry_path(e.key).c_str(), 0644) == 0);
    }
    const int rc = in_child(
        [&] {
            DiskCache disk(dir, disk_options(), kQuiet);
            const auto listing = disk.list();
            if (listing.size() != 1 || listing[0].ok || listing[0].problem.find("FIFO") == std::string::npos) return 1;
            const auto report = disk.verify(false);
            if (report.bad != 1 || report.problems[0].find("FIFO") == std::string::npos) return 2;
            KernelCache kc(dir, disk_options(), kQuiet);
            CountingBuilder b{e};
            const auto got = kc.get(e.key, e.arch, b.fn(), "fifo");
            if (got.source != Source::compiled || !got.not_stored.empty() || kc.counters().bad_entries != 1) return 3;
            return disk.load(e.key, e.arch).entry ? 0 : 4;  // the node was replaced by a sound entry
        },
        15);
    CHECK(rc == 0);

    DiskCache disk(dir, disk_options(), kQuiet);
    disk.clear();
    REQUIRE(::mkfifo(disk.entry_path(e.key).c_str(), 0644) == 0);
    CHECK(disk.verify(true).removed == 1);
    CHECK_FALSE(fs::exists(fs::symlink_status(disk.entry_path(e.key))));
}

TEST_CASE("an entry that links to /dev/zero, or declares or has a huge size, is refused without reading it") {
    TempDir tmp;
    const std::string dir = tmp.str() + "/C";
    const Entry zero = make_entry("zero"), sparse = make_entry("sparse"), liar = make_entry("liar");
    {
        DiskCache disk(dir, disk_options(), kQuiet);
        fs::create_directories(fs::path(disk.entry_path(zero.key)).parent_path());
        fs::create_symlink("/dev/zero", disk.entry_path(zero.key));
        // 8 GiB of nothing: its first bytes are not a header.
        fs::create_directories(fs::path(disk.entry_path(sparse.key)).parent_path());
        write_file(disk.entry_path(sparse.key), "");
        fs::resize_file(disk.entry_path(sparse.key), 8ull << 30);
        // A sound header whose cubin size is over 4 GiB.
        disk.store(liar);
        patch_byte(disk.entry_path(liar.key), header_len(liar.arch) - 12, [](char) { return char(1); });
    }
    const int rc = in_child(
        [&] {
            // Reading any of them whole would need gigabytes.
            const struct rlimit cap {1ull << 30, 1ull << 30};
            if (::setrlimit(RLIMIT_AS, &cap) != 0) return 10;
            DiskCache disk(dir, disk_options(), kQuiet);
            for (const Entry* e : {&zero, &sparse, &liar}) {
                const auto got = disk.load(e->key, e->arch);
                if (got.entry || !got.bad) return 1;
            }
            return 0;
        },
        15);
    CHECK(rc == 0);
    CHECK(fs::exists("/dev/zero"));
}

TEST_CASE("the checksum covers the header: an edited arch fails verify") {
    TempDir tmp;
    DiskCache disk(tmp.str(), disk_options(), kQuiet);
    const Entry e = make_entry("edited", "sm_80");
    disk.store(e);
    patch_byte(disk.entry_path(e.key), header_len(e.arch) - 16 - 1, [](char) { return '6'; });  // sm_80 -> sm_86
    const auto report = disk.verify(false);
    CHECK(report.bad == 1);
    REQUIRE(report.problems.size() == 1);
    CHECK(report.problems[0].find("checksum") != std::string::npos);
    CHECK_FALSE(disk.load(e.key, "sm_86").entry);
}

TEST_CASE("looking at a cache creates nothing") {
    TempDir tmp;
    const fs::path typo = tmp.path() / "typo";
    DiskOptions look = disk_options();
    look.create = false;
    DiskCache disk(typo.string(), look, kQuiet);
    CHECK(disk.absent());
    CHECK_FALSE(disk.enabled());
    CHECK(disk.list().empty());
    CHECK(disk.verify(false).ok == 0);
    CHECK(disk.total_bytes() == 0);
    CHECK_FALSE(disk.load(key_of("x"), "sm_80").entry);
    CHECK_FALSE(fs::exists(typo));
    // An existing root without the version dir is just as empty, and stays as it is.
    fs::create_directory(typo);
    CHECK(DiskCache(typo.string(), look, kQuiet).list().empty());
    CHECK(fs::is_empty(typo));
}
