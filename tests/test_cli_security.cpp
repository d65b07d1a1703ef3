// The attacks and slips of issues 9 and 21, run through the CLI as an attacker or a careless operator would. Each one
// failed before the fix (run them against another build with RTATTN_CLI_UNDER_TEST=path/to/rtattn).
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cache/cache.hpp"
#include "catch.hpp"
#include "cli_harness.hpp"
#include "testutil.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using rtattn::test::Cli;
using rtattn::test::Result;
using rtattn::test::TempDir;

const char* const kOne = "--head-dim 64 --dtype bf16 --causal false --arch sm_80";

// Where the CLI keeps the entry for kOne: asked of the binary itself, so the test follows its layout.
struct Target {
    std::string dir, key, shard, entry, lock;
};

Target target_of(const Cli& cli) {
    const json j = cli.json_of(std::string("info --json ") + kOne);
    Target t;
    t.dir = j["cache"]["dir"];
    t.key = j["plan"]["key"];
    t.shard = t.dir + "/" + t.key.substr(0, 2);
    t.entry = t.shard + "/" + t.key + ".rtc";
    t.lock = t.shard + "/" + t.key + ".lock";
    return t;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

int mode_of(const fs::path& p) { return int(fs::status(p).permissions() & fs::perms::mask); }

bool has_control_chars(const std::string& s) {
    for (const char c : s)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f) return true;
    return false;
}

}  // namespace

TEST_CASE("verify --repair, clear and prune never touch what a symlinked shard points to", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    const fs::path foreign = cli.scratch.path() / "F";
    fs::create_directories(foreign);
    const std::vector<std::string> names = {"thesis.rtc", "project.lock", ".tmp-x", "ab" + t.key.substr(2) + ".rtc",
                                            "ab" + t.key.substr(2) + ".lock", ".tmp-ab" + t.key.substr(2) + "-abcdef"};
    for (const auto& n : names) {
        write(foreign / n, "precious");
        rtattn::test::run_command("touch -d '100 days ago' '" + (foreign / n).string() + "'");
    }
    // (Re)links a name in the version dir to the foreign folder; removing a link never touches its target.
    const auto link = [&](const char* name) {
        std::error_code ec;
        fs::remove(fs::path(t.dir) / name, ec);
        fs::create_directory_symlink(foreign, fs::path(t.dir) / name);
    };
    link("zz");
    link("ab");
    cli("verify --repair");
    link("ab");
    cli("prune --older-than 1d --max-size 0");
    link("ab");
    cli("clear");
    for (const auto& n : names) CHECK(fs::exists(foreign / n));
}

TEST_CASE("a planted lock symlink creates nothing; the kernel is reported as not stored", "[cli][security]") {
    const Cli cli;
    const Target t = target_of(cli);
    fs::create_directories(t.shard);
    const fs::path victim = cli.scratch.path() / "victim-created";
    fs::create_symlink(victim, t.lock);
    const Result r = cli(std::string("precompile ") + kOne);
    CHECK_FALSE(fs::exists(fs::symlink_status(victim)));
    CHECK(r.code == 1);
    CHECK(r.all().find("not stored") != std::string::npos);
}

TEST_CASE("a FIFO or a link to /dev/zero at an entry path neither hangs nor exhausts memory", "[cli][security]") {
    for (const bool fifo : {true, false}) {
        DYNAMIC_SECTION((fifo ? "FIFO" : "/dev/zero")) {
            const Cli cli;
            const Target t = target_of(cli);
            fs::create_directories(t.shard);
            if (fifo)
                REQUIRE(::mkfifo(t.entry.c_str(), 0644) == 0);
            else
                fs::create_symlink("/dev/zero", t.entry);
            const Result r = cli.raw("--cache-dir '" + cli.cache.str() + "' precompile " + kOne,
                                     "ulimit -v 4000000; timeout 30");
            CHECK(r.code == 0);  // the node is removed and the kernel rebuilt and stored
            CHECK(fs::is_regular_file(fs::symlink_status(t.entry)));
        }
    }
}

TEST_CASE("ls, info and verify create no directories", "[cli][security]") {
    const Cli cli;
    const fs::path typo = cli.scratch.path() / "typo";
    for (const char* cmd : {"ls", "ls --json", "info", "info --json", "verify", "verify --json"}) {
        const Result r = cli.raw("--cache-dir '" + typo.string() + "' " + cmd);
        CHECK(r.code == 0);
        CHECK_FALSE(fs::exists(typo));
    }
}

TEST_CASE("an entry others could have replaced is refused, even with a valid checksum", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    fs::permissions(t.entry, fs::perms::group_write | fs::perms::others_write, fs::perm_options::add);
    const Result r = cli(std::string("precompile --cache-only ") + kOne);
    CHECK(r.code == 1);
    CHECK(r.all().find("refused") != std::string::npos);
    CHECK(r.all().find(t.entry) != std::string::npos);
}

TEST_CASE("an edited header fails verify", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    std::string bytes = rtattn::test::read_file(t.entry);
    const auto at = bytes.find("sm_80");
    REQUIRE(at != std::string::npos);
    bytes[at + 4] = '6';
    write(t.entry, bytes);
    CHECK(cli("verify").code == 1);
}

TEST_CASE("files the cache creates follow the umask and a default root is private", "[cli][security]") {
    const Cli cli;
    const Result r = cli.raw("--cache-dir '" + cli.cache.str() + "/c' precompile " + kOne, "umask 077;");
    REQUIRE(r.code == 0);
    const Target t = target_of(cli);
    const std::string entry = cli.cache.str() + "/c" + t.entry.substr(cli.cache.str().size());
    CHECK(mode_of(entry) == 0600);
    CHECK(mode_of(fs::path(entry).parent_path()) == 0700);

    const fs::path xdg = cli.scratch.path() / "xdg";
    const Result d = cli.raw(std::string("precompile ") + kOne,
                             "umask 022; env -u RTATTN_CACHE_DIR XDG_CACHE_HOME='" + xdg.string() + "'");
    REQUIRE(d.code == 0);
    CHECK(mode_of(xdg / "rtattn") == 0700);
}

TEST_CASE("a compiled kernel the cache could not store fails precompile, counted and named", "[cli][security]") {
    const Cli cli;
    const Target t = target_of(cli);
    fs::create_directories(t.dir);
    write(t.shard, "a file where the shard directory belongs");
    const Result r = cli(std::string("precompile ") + kOne);
    CHECK(r.code == 1);
    CHECK(r.out.find("1 not stored") != std::string::npos);
    CHECK(r.out.find("d64 bf16 noncausal") != std::string::npos);
    const json j = cli.json_of(std::string("precompile --json ") + kOne, 1);
    CHECK(j["not_stored"] == 1);
    CHECK(j["configs"][0]["status"] == "not_stored");
    CHECK(j["configs"][0]["error"].get<std::string>().find("not stored") != std::string::npos);
}

TEST_CASE("a cache dir that cannot be looked up is a cache error (exit 3), never a crash", "[cli][security]") {
    const Cli cli;
    const std::string long_dir = cli.scratch.str() + "/" + std::string(5000, 'a');
    const Result pre = cli.raw("--cache-dir '" + long_dir + "' precompile " + kOne);
    CHECK(pre.code == 3);
    CHECK(pre.err.size() < 2000 + long_dir.size() * 3);
    CHECK(cli.raw("--cache-dir '" + long_dir + "' ls").code == 3);
}

TEST_CASE("a lock held by a stuck process is waited on for a bounded time, naming it", "[cli][security]") {
    const Cli cli;
    const Target t = target_of(cli);
    rtattn::cache::DiskCache holder(cli.cache.str(), {}, rtattn::util::Logger(rtattn::LogLevel::quiet, nullptr));
    const auto held = holder.lock(t.key);  // this process holds it and does not let go, like a stopped one
    REQUIRE(held.held());
    const Result r = cli.raw("--cache-dir '" + cli.cache.str() + "' --lock-timeout 1 precompile " + kOne, "timeout 30");
    CHECK(r.code == 1);
    CHECK(r.all().find("pid " + std::to_string(::getpid())) != std::string::npos);
    CHECK(r.all().find("not stored") != std::string::npos);
}

TEST_CASE("clear leaves a live writer's temp file alone", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    rtattn::cache::fsys::Dir shard;
    REQUIRE(rtattn::cache::fsys::Dir::open_path(t.shard, false, 0755, &shard).ok());
    rtattn::cache::fsys::TempFile live;
    REQUIRE(rtattn::cache::fsys::TempFile::create(shard, rtattn::cache::temp_prefix(t.key), &live).ok());
    const Result r = cli("clear");
    CHECK(r.code == 0);
    CHECK(fs::exists(live.path()));
    CHECK(r.out.find("left 1") != std::string::npos);
}

TEST_CASE("ls lists every entry when one has odd info, and prints what entries say escaped", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    rtattn::cache::Entry odd{std::string(64, 'e'), "sm_80", "cubin", R"({"config":{},"registers":"lots"})"};
    rtattn::cache::Entry evil{std::string(64, 'f'), "\x1b]0;pwned\x07\x1b[2J", "cubin", "{}"};
    for (const auto* e : {&odd, &evil}) {
        fs::create_directories(t.dir + "/" + e->key.substr(0, 2));
        write(t.dir + "/" + e->key.substr(0, 2) + "/" + e->key + ".rtc", rtattn::cache::encode_entry(*e));
    }
    const Result text = cli("ls");
    CHECK(text.code == 0);
    CHECK(text.out.find("3 entries") != std::string::npos);
    CHECK(text.out.find("registers is not an integer") != std::string::npos);
    CHECK_FALSE(has_control_chars(text.out + text.err));
    const json j = cli.json_of("ls --json");
    CHECK(j["entries"].size() == 3);
    const Result verify = cli("verify");
    CHECK(verify.code == 1);
    CHECK_FALSE(has_control_chars(verify.out + verify.err));
}

TEST_CASE("--softmax-scale must be finite and positive, on the command line too", "[cli][security]") {
    const Cli cli;
    for (const char* bad : {"nan", "inf", "-inf", "1e999", "-1", "0"}) {
        const Result r = cli(std::string("precompile --head-dim 64 --arch sm_80 --softmax-scale ") + bad);
        CHECK(r.code == 2);
        CHECK((r.err.find("softmax_scale") != std::string::npos || r.err.find("--softmax-scale") != std::string::npos));
    }
}

TEST_CASE("-j beyond the hardware threads is capped, and the CLI says so", "[cli][security]") {
    const Cli cli;
    const Result r = cli("precompile --head-dim 64 --dtype bf16 --causal both --arch sm_80 -j 512");
    CHECK(r.code == 0);
    CHECK(r.err.find("-j 512 capped at") != std::string::npos);
}

TEST_CASE("input slips: each gets a clear error naming the field, escaped and short", "[cli][security]") {
    const Cli cli;
    const auto manifest_error = [&](const std::string& entry) {
        const std::string path = cli.write_manifest("m.json", R"({"configs": [)" + entry + "]}");
        const Result r = cli("precompile '" + path + "'");
        CHECK(r.code == 2);
        CHECK(r.err.find("m.json: configs[0]") != std::string::npos);
        return r.err;
    };
    CHECK(manifest_error(R"({"head_dim": "abc", "head_dim_qk": 64, "arch": "sm_80"})").find("head_dim:") !=
          std::string::npos);
    CHECK(manifest_error(R"({"head_dim": 64, "head_dim_qk": 128, "arch": "sm_80"})").find("disagree") !=
          std::string::npos);
    CHECK(manifest_error(R"({"head_dim": 18446744073709551615, "arch": "sm_80"})").find("18446744073709551615") !=
          std::string::npos);
    const std::string nul = manifest_error(R"({"head_dim": 64, "dtype": "bf\u0000junk", "arch": "sm_80"})");
    CHECK(nul.find("junk") != std::string::npos);
    CHECK(nul.find("\\x00") != std::string::npos);
    CHECK(manifest_error(R"({"head_dim": 64, "dtype": ")" + std::string(1 << 20, 'x') + R"(", "arch": "sm_80"})")
              .size() < 2000);
    if (cli.json_of("info --json")["device"].is_null())  // "" = the current GPU, and there is none
        CHECK(manifest_error(R"({"head_dim": 64, "arch": ""})").find("arch") != std::string::npos);

    const Result dev_null = cli("precompile /dev/null");
    CHECK(dev_null.code == 2);
    CHECK(dev_null.err.find("not a regular file") != std::string::npos);
    const Result empty_age = cli("prune --older-than ''");
    CHECK(empty_age.code == 2);
    CHECK(empty_age.err.find("--older-than") != std::string::npos);
    for (const char* tile : {"128,128,8,1,2,0,2,1,8,1garbage", "99999999999,128,8,1,2,0", "128,128,8,1,2,0,"}) {
        const Result r = cli.raw("--cache-dir '" + cli.cache.str() + "' render --head-dim 64 --arch sm_90a",
                                 std::string("RTATTN_TILE='") + tile + "'");
        CHECK(r.code == 2);
        CHECK(r.err.find("RTATTN_TILE") != std::string::npos);
        CHECK(r.err.find("1215752191") == std::string::npos);
    }
}

// Issue 21: bad input never corrupts memory, hangs or crashes.

TEST_CASE("prune --older-than past a century is refused, naming the flag and the range; nothing is removed",
          "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    // 150000 days of nanoseconds wrapped int64 around: the cutoff landed in the future and every entry went.
    for (const char* age : {"150000d", "1e15", "nan"}) {
        const Result r = cli(std::string("prune --older-than ") + age);
        CHECK(r.code == 2);
        CHECK(r.err.find("--older-than") != std::string::npos);
        CHECK((r.err.find("allowed 0..36500d") != std::string::npos || std::string(age) == "nan"));
    }
    CHECK(cli("prune --older-than 36500d").code == 0);
    CHECK(cli.json_of("ls --json")["entries"].size() == 1);
}

TEST_CASE("ls and verify survive an entry whose info is nested too deep, and report it as bad", "[cli][security]") {
    const Cli cli;
    REQUIRE(cli(std::string("precompile ") + kOne).code == 0);
    const Target t = target_of(cli);
    // A config object, as ls expects, holding 200000 levels of arrays: `ls --json` copied it recursively (SIGSEGV)
    // and verify called the entry sound.
    const rtattn::cache::Entry deep{std::string(64, 'd'), "sm_80", "cubin",
                                    R"({"config":{"comment":)" + std::string(200000, '[') + std::string(200000, ']') +
                                        "}}"};
    fs::create_directories(t.dir + "/dd");
    write(t.dir + "/dd/" + deep.key + ".rtc", rtattn::cache::encode_entry(deep));
    const Result text = cli("ls");
    CHECK(text.code == 0);
    CHECK(text.out.find("2 entries") != std::string::npos);
    CHECK(text.out.find("BAD: bad info: nested deeper than 64 levels") != std::string::npos);
    const json j = cli.json_of("ls --json");
    REQUIRE(j["entries"].size() == 2);
    int bad = 0;
    for (const auto& e : j["entries"]) bad += e["ok"] == false && e["key"] == deep.key;
    CHECK(bad == 1);
    const Result verify = cli("verify");
    CHECK(verify.code == 1);
    CHECK(verify.out.find(deep.key + ".rtc: bad info: nested deeper than 64 levels") != std::string::npos);
    CHECK(cli("verify --repair").code == 0);
    CHECK(cli.json_of("ls --json")["entries"].size() == 1);
}

TEST_CASE("manifests: deep nesting, repeated keys and huge expansions are usage errors, not crashes",
          "[cli][security]") {
    const Cli cli;
    const auto run = [&](const std::string& text) {
        const std::string path = cli.write_manifest("m.json", text);
        // Bounded memory: the 9M-config manifest took 5.8 GB before it aborted.
        const Result r =
            cli.raw("--cache-dir '" + cli.cache.str() + "' precompile '" + path + "'", "ulimit -v 3000000;");
        CHECK(r.code == 2);
        CHECK(r.err.find("m.json") != std::string::npos);
        return r.err;
    };
    CHECK(run(R"({"configs": )" + std::string(200000, '[') + std::string(200000, ']') + "}")
              .find("nested deeper than 64 levels") != std::string::npos);
    CHECK(run(R"({"configs": [{"head_dim": 64, "arch": "sm_80", "head_dim": 128}]})")
              .find("'head_dim' appears twice") != std::string::npos);
    std::string dims, archs;
    for (int d = 1; d <= 250; ++d) dims += (d > 1 ? "," : "") + std::to_string(d);
    for (int i = 0; i < 9000; ++i) archs += (i ? "," : "") + std::string(R"("sm_80")");
    const std::string huge = run(R"({"configs": [{"head_dim": [)" + dims +
                                 R"(], "dtype": ["bf16", "fp16"], "causal": "both", "arch": [)" + archs + "]}]}");
    CHECK(huge.find("configs[0]: configs: expands to 9000000 configs") != std::string::npos);
    CHECK(huge.find("the limit is 100000 configs per manifest") != std::string::npos);
    CHECK(cli.json_of("ls --json")["entries"].empty());
}
