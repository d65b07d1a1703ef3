// The rtattn CLI end to end (each test on its own temp cache dir), and the manifest expansion it is built on.
// Needs NVRTC but no GPU: every config names its arch.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "catch.hpp"
#include "cli_harness.hpp"
#include "manifest.hpp"
#include "testutil.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using rtattn::test::Cli;
using rtattn::test::Result;
using rtattn::test::TempDir;

void flip_byte_in_middle(const std::string& path) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f);
    f.seekg(0, std::ios::end);
    const auto middle = f.tellg() / 2;
    f.seekg(middle);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0xff);
    f.seekp(middle);
    f.write(&c, 1);
}

const char* const kFourConfigs = "precompile --head-dim 64,132 --dtype bf16 --causal both --arch sm_80 -j 2 --json";

}  // namespace

TEST_CASE("rtattn --help documents the exit codes", "[cli]") {
    const Cli cli;
    const Result r = cli("--help");
    CHECK(r.code == 0);
    CHECK(r.out.find("Exit codes") != std::string::npos);
    for (const char* cmd : {"precompile", "ls", "verify", "prune", "clear", "render", "info"})
        CHECK(r.out.find(cmd) != std::string::npos);
}

TEST_CASE("rtattn info reports library, NVRTC, device and cache", "[cli]") {
    const Cli cli;
    const Result text = cli("info");
    REQUIRE(text.code == 0);
    CHECK(text.out.find("NVRTC") != std::string::npos);
    CHECK(text.out.find(cli.cache.str()) != std::string::npos);

    const json j = cli.json_of("info --json");
    CHECK(j["version"].is_string());
    CHECK(j["nvrtc"].is_string());
    CHECK((j["device"].is_null() || j["device"].is_object()));
    CHECK(j["cache"]["dir"].get<std::string>().find(cli.cache.str()) == 0);
    CHECK(j["cache"]["state"] == "absent");  // info only looks: the directory is made by the first store
    CHECK(j["cache"]["entries"] == 0);
    CHECK_FALSE(j.contains("plan"));

    SECTION("with config flags it shows the plan and the padding waste") {
        const json p = cli.json_of("info --json --head-dim 132 --arch sm_90a")["plan"];
        CHECK(p["pad_qk"] == 144);
        CHECK(p["pad_v"] == 136);
        CHECK(p["block_m"].get<int>() > 0);
        CHECK(p["warps"].get<int>() > 0);
        CHECK(p["smem_bytes"].get<int>() > 0);
        CHECK(p["useful_flop_fraction"].get<double>() == Approx(264.0 / 280.0));
        CHECK(p["cached"] == false);
        const Result t = cli("info --head-dim 132 --arch sm_90a");
        CHECK(t.out.find("useful/issued FLOPs") != std::string::npos);
    }
}

TEST_CASE("rtattn bench --interleave times every shape of the grid, or says that a GPU is needed", "[cli]") {
    const Cli cli;
    const bool gpu = !cli.json_of("info --json")["device"].is_null();
    const std::string out = (cli.scratch.path() / "bench.json").string();
    const Result r = cli("bench --interleave --head-dims 16,24 --seqlens 256 --tokens 512 --reps 3 --json '" + out + "'");
    if (!gpu) {
        CHECK(r.code == 1);
        CHECK(r.all().find("a GPU is needed") != std::string::npos);
        return;
    }
    REQUIRE(r.code == 0);
    CHECK(r.out.find("interleaved") != std::string::npos);
    const json rows = json::parse(rtattn::test::read_file(out));
    REQUIRE(rows.size() == 4);  // 2 head dims x causal and not
    std::set<std::pair<int, bool>> seen;
    for (const auto& row : rows) {
        seen.insert({row["d"].get<int>(), row["causal"].get<bool>()});
        CHECK(row["ms"].get<double>() > 0);
        CHECK(row["tflops"].get<double>() > 0);
    }
    CHECK(seen.size() == 4);
}

TEST_CASE("rtattn render prints the source; --verbose adds the ptxas report", "[cli]") {
    const Cli cli;
    const Result r = cli("render --head-dim 132 --arch sm_90a");
    REQUIRE(r.code == 0);
    CHECK(r.out.find("kHeadDimQK = 132") != std::string::npos);
    CHECK(r.out.find("kPadQK = 144") != std::string::npos);
    CHECK(r.out.find("kPadV = 136") != std::string::npos);
    CHECK(r.out.find("rtattn_fwd_kernel") != std::string::npos);

    const Result v = cli("render --head-dim 64 --arch sm_80 --verbose");
    REQUIRE(v.code == 0);
    const auto at = v.out.find("// registers: ");
    REQUIRE(at != std::string::npos);
    CHECK(std::atoi(v.out.c_str() + at + 14) > 0);  // a real ptxas figure, not "unknown"
    CHECK(v.out.find("spill") != std::string::npos);
    CHECK(v.out.find("shared memory") != std::string::npos);

    const Result lists = cli("render --head-dim 64,128 --arch sm_80");
    CHECK(lists.code == 2);
    CHECK(lists.err.find("one config") != std::string::npos);
}

TEST_CASE("rtattn precompile, ls, verify, prune and clear on a private cache", "[cli]") {
    const Cli cli;

    const json first = cli.json_of(kFourConfigs);
    CHECK(first["total"] == 4);
    CHECK(first["compiled"] == 4);
    CHECK(first["failed"] == 0);
    for (const auto& c : first["configs"]) CHECK(c["status"] == "compiled");

    const json again = cli.json_of(kFourConfigs);
    CHECK(again["cached"] == 4);
    CHECK(again["compiled"] == 0);

    const json listing = cli.json_of("ls --json");
    REQUIRE(listing["entries"].size() == 4);
    std::multiset<int> dims;
    for (const auto& e : listing["entries"]) {
        CHECK(e["ok"] == true);
        CHECK(e["arch"] == "sm_80");
        REQUIRE(e["config"].is_object());
        dims.insert(e["config"]["head_dim_qk"].get<int>());
    }
    CHECK(dims == std::multiset<int>{64, 64, 132, 132});
    CHECK(cli("ls").out.find("d132 bf16 causal") != std::string::npos);

    // A flipped byte must be caught by verify, and --repair must remove exactly that entry.
    const std::string victim = listing["entries"][0]["path"];
    flip_byte_in_middle(victim);
    const Result bad = cli("verify");
    CHECK(bad.code == 1);
    CHECK(bad.out.find(victim) != std::string::npos);
    CHECK(cli("verify --repair").code == 0);
    CHECK_FALSE(fs::exists(victim));
    CHECK(cli("verify").code == 0);
    CHECK(cli.json_of("ls --json")["entries"].size() == 3);

    CHECK(cli("prune --max-size 0").code == 0);
    CHECK(cli.json_of("ls --json")["entries"].empty());

    REQUIRE(cli("precompile --head-dim 64 --arch sm_80").code == 0);
    CHECK(cli.json_of("ls --json")["entries"].size() == 1);
    const Result cleared = cli("clear");
    CHECK(cleared.code == 0);
    CHECK(cleared.out.find("removed 1") != std::string::npos);
    CHECK(cli.json_of("ls --json")["entries"].empty());
}

TEST_CASE("rtattn prune parses sizes and ages", "[cli]") {
    const Cli cli;
    CHECK(cli("prune --max-size 2G").code == 0);
    CHECK(cli("prune --max-size 500M --older-than 7d").code == 0);
    CHECK(cli("prune --older-than 30m").code == 0);
    const Result size = cli("prune --max-size 2X");
    CHECK(size.code == 2);
    CHECK(size.err.find("--max-size") != std::string::npos);
    const Result age = cli("prune --older-than soon");
    CHECK(age.code == 2);
    CHECK(age.err.find("--older-than") != std::string::npos);
    CHECK(cli("prune").code == 2);
}

TEST_CASE("rtattn rejects bad input with exit code 2 and names the field", "[cli]") {
    const Cli cli;

    const Result zero = cli("precompile --head-dim 0 --arch sm_80");
    CHECK(zero.code == 2);
    CHECK(zero.err.find("rtattn: error:") != std::string::npos);
    CHECK(zero.err.find("head_dim") != std::string::npos);

    const Result fp8 = cli("precompile --head-dim 64 --dtype fp8 --arch sm_80");
    CHECK(fp8.code == 2);
    CHECK(fp8.err.find("dtype") != std::string::npos);

    CHECK(cli("precompile --head-dim 64 --arch sm_70").code == 2);
    CHECK(cli("precompile --head-dim 64 --causal maybe --arch sm_80").code == 2);
    CHECK(cli("precompile --head-dim abc").code == 2);
    CHECK(cli("no-such-command").code == 2);

    const std::string manifest = cli.write_manifest("bad.json", R"({"name": "bad", "configs": [
        {"model": "fine", "head_dim": 64, "arch": "sm_80"},
        {"model": "broken", "head_dim": [64, 128], "dtype": ["bf16", "fp8"], "arch": "sm_80"}]})");
    const Result entry = cli("precompile '" + manifest + "'");
    CHECK(entry.code == 2);
    CHECK(entry.err.find("configs[1]") != std::string::npos);
    CHECK(entry.err.find("bad.json") != std::string::npos);
    CHECK(entry.err.find("dtype") != std::string::npos);
    CHECK(cli.json_of("ls --json")["entries"].empty());  // nothing compiled before the error

    const Result missing = cli("precompile '" + (cli.scratch.path() / "nope.json").string() + "'");
    CHECK(missing.code == 2);
    CHECK(missing.err.find("nope.json") != std::string::npos);
}

TEST_CASE("rtattn precompile --cache-only on an empty cache names the missing configs", "[cli]") {
    const Cli cli;
    const Result r = cli("precompile --cache-only");
    CHECK(r.code == 1);
    CHECK(r.all().find("missing") != std::string::npos);
    CHECK(r.all().find("d128 bf16") != std::string::npos);
    CHECK(cli.json_of("ls --json")["entries"].empty());  // cache-only never compiles
}

TEST_CASE("rtattn precompile --cache-only passes once everything is cached", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 64 --heads-q 8 --heads-kv 2 --arch sm_80").code == 0);
    // Heads do not enter the cache key: a different head count is served by the same cubin.
    const json j = cli.json_of("precompile --head-dim 64 --heads-q 32 --arch sm_80 --cache-only --json");
    CHECK(j["cached"] == 1);
    CHECK(j["failed"] == 0);
}

// ---- manifest expansion, in-process ---------------------------------------------------------------------------

TEST_CASE("manifest entries expand to the cartesian product, deduplicated", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    const std::string path = (dir.path() / "m.json").string();
    std::ofstream(path) << R"({"name": "m", "description": "test", "configs": [
        {"model": "A", "head_dim": [64, 128], "dtype": ["bf16", "fp16"], "causal": "both",
         "arch": ["sm_80", "sm_90a"], "num_heads_q": 32, "num_heads_kv": 8},
        {"model": "A again", "head_dim": 64, "head_dim_v": 64, "num_heads_q": 32, "num_heads_kv": 8,
         "arch": "sm_80"}]})";
    const auto m = rtattn::tool::load_manifest(path);
    CHECK(m.name == "m");
    CHECK(m.description == "test");
    REQUIRE(m.configs.size() == 16);  // the second entry repeats one of the first's configs
    CHECK(m.configs[0].head_dim_qk == 64);  // earlier fields vary slowest
    CHECK(m.configs.back().head_dim_qk == 128);
    for (const auto& c : m.configs) CHECK(c.num_heads_kv == 8);

    SECTION("--arch overrides the entries' archs") {
        const auto hopper = rtattn::tool::load_manifest(path, {{"sm_90a"}});
        CHECK(hopper.configs.size() == 8);
        for (const auto& c : hopper.configs) CHECK(c.arch == "sm_90a");
    }
}

TEST_CASE("manifest errors name the file, the entry and the field", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    const auto expect_error = [&](const std::string& text, const std::string& field, const std::string& where) {
        const std::string path = (dir.path() / "e.json").string();
        std::ofstream(path) << text;
        try {
            rtattn::tool::load_manifest(path);
            FAIL("no error for " << text);
        } catch (const rtattn::ConfigError& e) {
            INFO(e.what());
            CHECK(e.field() == field);
            CHECK(std::string(e.what()).find("e.json") != std::string::npos);
            CHECK(std::string(e.what()).find(where) != std::string::npos);
        }
    };
    expect_error(R"({"configs": [{"head_dim": 64, "arch": "sm_80"}, {"head_dim": 300, "arch": "sm_80"}]})",
                 "head_dim", "configs[1]");
    expect_error(R"({"configs": [{"head_dim": 64, "arch": "sm_80", "colour": "red"}]})", "colour", "configs[0]");
    expect_error(R"({"configs": [{"head_dim": 64, "causal": "sometimes", "arch": "sm_80"}]})", "causal",
                 "configs[0]");
    expect_error(R"({"configs": [{"head_dim": [], "arch": "sm_80"}]})", "head_dim", "configs[0]");
    expect_error(R"({"configs": [{"model": 7, "head_dim": 64}]})", "model", "configs[0]");
    expect_error(R"({"configs": {}})", "configs", "e.json");
    expect_error(R"({"configs": [], "nmae": "x"})", "nmae", "e.json");
    expect_error("{not json", "manifest", "e.json");
}

TEST_CASE("config flags expand like a manifest entry and errors name the flag", "[manifest]") {
    rtattn::tool::ConfigFlags f;
    f.head_dims = {64, 80, 128, 132};
    f.dtypes = {"bf16", "fp16"};
    f.causal = "both";
    f.archs = {"sm_80", "sm_90a"};
    CHECK(rtattn::tool::expand_flags(f).size() == 32);

    f.dtypes = {"fp8"};
    try {
        rtattn::tool::expand_flags(f);
        FAIL("fp8 accepted");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "dtype");
        CHECK(std::string(e.what()).find("--dtype") != std::string::npos);
    }
}

TEST_CASE("the default manifest covers the common models for both dtypes, masks and archs", "[manifest]") {
    const std::string path = std::string(RTATTN_SOURCE_DIR) + "/cache/default.json";
    const auto m = rtattn::tool::load_manifest(path);
    std::set<int> dims;
    std::set<std::string> dtypes, archs;
    std::set<bool> causal;
    for (const auto& c : m.configs) {
        dims.insert(c.head_dim_qk);
        dtypes.insert(rtattn::to_string(c.dtype));
        archs.insert(c.arch);
        causal.insert(c.causal);
    }
    CHECK(dims == std::set<int>{64, 80, 96, 128, 132, 256});
    CHECK(dtypes == std::set<std::string>{"bf16", "fp16"});
    CHECK(archs == std::set<std::string>{"sm_80", "sm_90a"});
    CHECK(causal.size() == 2);
    CHECK(rtattn::tool::find_manifest("default").size() > 0);
}

TEST_CASE("a 64k-config manifest is read in linear time", "[manifest]") {
    // Deduplication used to compare every config with every earlier one: 16k configs took 10 s and 64k 125 s on a
    // 2-core machine before anything printed. A hash set reads 64k in about a second there; the bound leaves room
    // for a slow machine and still fails the quadratic reader by far.
    const TempDir dir("rtattn-manifest");
    const std::string path = (dir.path() / "big.json").string();
    {
        std::ofstream out(path);
        out << R"({"name": "big", "configs": [)";
        for (int h = 1; h <= 65536; ++h)
            out << (h > 1 ? "," : "") << R"({"head_dim": 64, "num_heads_q": )" << h
                << R"(, "num_heads_kv": 1, "arch": "sm_80"})";
        out << "]}";
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto m = rtattn::tool::load_manifest(path);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(m.configs.size() == 65536);
    CHECK(seconds < 30);
}
