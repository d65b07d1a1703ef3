// The rtattn CLI end to end, each test on its own temp cache dir. The manifest reader is tested in test_manifest.cpp,
// attacks and input slips in test_cli_security.cpp.
// Needs NVRTC but no GPU: every config names its arch.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "cache/entry_file.hpp"
#include "catch.hpp"
#include "cli_harness.hpp"
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

TEST_CASE("rtattn with no arguments prints usage", "[cli]") {
    const Cli cli;
    const Result r = cli.raw("");
    CHECK(r.code == 0);
    CHECK(r.out.find("Subcommands") != std::string::npos);
    CHECK(r.out.find("precompile") != std::string::npos);
}

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
        const json info = cli.json_of("info --json --head-dim 132 --heads-q 16 --arch sm_90a")["plan"];
        CHECK(info["cached"] == false);
        CHECK(info["key"].get<std::string>().size() == 64);
        const json& p = info["plan"];  // the whole plan, as the cache entry and the stub record it
        CHECK(p["family"] == "fwd_sm90_ws");
        CHECK(p["shift_rows"] == true);
        CHECK(p["split_rows"] == false);
        CHECK(p["vec_qk"] == 4);
        CHECK(p["pad_qk"] == 144);
        CHECK(p["pad_v"] == 144);
        CHECK(p["block_m"].get<int>() > 0);
        CHECK(p["warps"].get<int>() > 0);
        CHECK(p["smem_bytes"].get<int>() > 0);
        CHECK(p["useful_flop_fraction"].get<double>() == Approx(264.0 / 288.0));
        const Result t = cli("info --head-dim 132 --arch sm_90a");
        CHECK(t.out.find("useful/issued FLOPs") != std::string::npos);
        CHECK(t.out.find("vector width: 4 elements") != std::string::npos);
        CHECK(t.out.find("runtime stats") == std::string::npos);  // a fresh process has none worth showing
    }

    SECTION("and the backward plan with its workspace per query token") {
        const json b = cli.json_of("info --json --head-dim 132 --heads-q 8 --heads-kv 2 --arch sm_80")["backward"];
        CHECK(b["plan"]["family"] == "bwd_mma");
        CHECK(b["plan"]["pad_qk"] == 144);
        CHECK(b["plan"]["bulk_dq"] == false);  // sm_80 has no bulk reduction
        CHECK(b["key"].get<std::string>().size() == 64);
        // 8 heads x (fp32 dQ row of 144 + 8 floats, LSE and D): about 8 * (4 * 152 + 8) bytes per query token.
        CHECK(b["workspace_bytes_per_query_token"].get<double>() == Approx(8 * (4 * 152 + 8)).epsilon(0.01));
        const Result t = cli("info --head-dim 132 --arch sm_90");
        CHECK(t.out.find("backward plan:") != std::string::npos);
        CHECK(t.out.find("dQ by bulk reduction") != std::string::npos);
    }

    SECTION("a config whose backward cannot be planned (a bad backward tile override): the forward's plan, and why "
            "there is no backward") {
        const std::string env = "RTATTN_BWD_TILE=1,2,3 ";
        const Result j = cli.raw("--cache-dir '" + cli.cache.str() + "' info --json --head-dim 64 --arch sm_80", env);
        REQUIRE(j.code == 0);
        const json parsed = json::parse(j.out);
        CHECK(parsed["plan"]["plan"]["family"] == "fwd_mma");
        CHECK(parsed["backward"]["unavailable"].get<std::string>().find("RTATTN_BWD_TILE") != std::string::npos);
        const Result t = cli.raw("--cache-dir '" + cli.cache.str() + "' info --head-dim 64 --arch sm_80", env);
        CHECK(t.code == 0);
        CHECK(t.out.find("backward plan: none (RTATTN_BWD_TILE") != std::string::npos);
    }

    SECTION("softcap and ALiBi: a backward plan too; ALiBi's decode plan") {
        const json j = cli.json_of("info --json --head-dim 64 --arch sm_80 --softcap");
        CHECK(j["backward"]["plan"]["softcap"] == true);
        CHECK(j["backward"]["plan"]["family"] == "bwd_mma");
        const json a = cli.json_of("info --json --head-dim 128 --arch sm_90a --alibi");
        CHECK(a["plan"]["plan"]["alibi"] == true);
        CHECK(a["backward"]["plan"]["alibi"] == true);
        const json d = cli.json_of("info --json --head-dim 128 --arch sm_90a --alibi --decode");
        CHECK(d["plan"]["plan"]["alibi"] == true);
        CHECK(d["plan"]["plan"]["family"] == "dec_mma");
    }
}

TEST_CASE("without NVRTC, precompile says what it looked for and how to point at it", "[cli]") {
    const Cli cli;
    const Result r = cli.raw("--cache-dir '" + cli.cache.str() + "' precompile --head-dim 64 --arch sm_80",
                             "RTATTN_NVRTC=/nonexistent/libnvrtc.so");
    CHECK(r.code != 0);
    CHECK(r.err.find("NVRTC") != std::string::npos);
    CHECK(r.err.find("RTATTN_NVRTC") != std::string::npos);
    CHECK(r.err.find("/nonexistent/libnvrtc.so") != std::string::npos);  // what was tried
}

TEST_CASE("rtattn bench names its heads as the other commands do: --heads-q, --heads-kv (or --gqa, not both)",
          "[cli]") {
    const Cli cli;
    const Result both = cli("bench --head-dim 64 --heads-kv 2 --gqa 2");
    CHECK(both.code == 2);
    CHECK(both.all().find("--heads-kv") != std::string::npos);
    const Result named = cli("bench --head-dim 64 --heads-q 8 --heads-kv 2 --seqlens 256 --tokens 256 --reps 1");
    CHECK(named.code != 2);  // parsed: it runs, or says a GPU is needed
}

TEST_CASE("rtattn bench --interleave times every shape of the grid, or says that a GPU is needed", "[cli]") {
    const Cli cli;
    const bool gpu = !cli.json_of("info --json")["device"].is_null();
    const std::string out = (cli.scratch.path() / "bench.json").string();
    const Result r = cli("bench --interleave --head-dim 16,24 --seqlens 256 --tokens 512 --reps 3 --json-out '" + out + "'");
    if (!gpu) {
        CHECK(r.code == 1);
        CHECK(r.all().find("a GPU is needed") != std::string::npos);
        return;
    }
    REQUIRE(r.code == 0);
    CHECK(r.out.find("interleaved") != std::string::npos);
    const json doc = json::parse(rtattn::test::read_file(out));
    CHECK(doc["schema_version"].is_number());
    const json& rows = doc["results"];
    REQUIRE(rows.size() == 4);  // 2 head dims x causal and not
    std::set<std::pair<int, bool>> seen;
    for (const auto& row : rows) {
        seen.insert({row["d"].get<int>(), row["causal"].get<bool>()});
        CHECK(row["ms"].get<double>() > 0);
        CHECK(row["tflops"].get<double>() > 0);
    }
    CHECK(seen.size() == 4);
}

TEST_CASE("rtattn bench --vs-padded times each head dim against the next multiple of 16", "[cli]") {
    const Cli cli;
    CHECK(cli("bench --head-dim-range 32:300:4").code == 2);  // past 256
    CHECK(cli("bench --head-dim-range 4:2:1").code == 2);
    CHECK(cli("bench --vs-padded --decode").code == 2);
    const bool gpu = !cli.json_of("info --json")["device"].is_null();
    const std::string out = (cli.scratch.path() / "padded.json").string();
    const Result r = cli("bench --vs-padded --head-dim-range 24:32:4 --seqlens 256 --tokens 512 --reps 3 --causal false "
                         "--json-out '" + out + "'");
    if (!gpu) {
        CHECK(r.code == 1);
        return;
    }
    REQUIRE(r.code == 0);
    const json& rows = json::parse(rtattn::test::read_file(out))["results"];
    // d24 with d32, d28 with d32, d32 alone: 5 rows, the off-grid ones with their ratio to the ideal.
    REQUIRE(rows.size() == 5);
    int with_ratio = 0;
    for (const auto& row : rows)
        if (row.contains("vs_padded_ideal")) {
            ++with_ratio;
            CHECK(row["d"].get<int>() % 16 != 0);
            CHECK(row["vs_padded_ideal"].get<double>() > 0);
        }
    CHECK(with_ratio == 2);
}

TEST_CASE("rtattn bench --decode --cache-prefill times the prefill kernels on a dense or paged cache", "[cli]") {
    const Cli cli;
    CHECK(cli("bench --cache-prefill").code == 2);  // needs --decode
    const bool gpu = !cli.json_of("info --json")["device"].is_null();
    const std::string out = (cli.scratch.path() / "prefill.json").string();
    const Result r = cli("bench --decode --cache-prefill --head-dim 64 --decode-shapes 2:512 --decode-q 64 "
                         "--page-size 0,16 --reps 3 --json-out '" + out + "'");
    if (!gpu) {
        CHECK(r.code == 1);
        return;
    }
    REQUIRE(r.code == 0);
    const json& rows = json::parse(rtattn::test::read_file(out))["results"];
    REQUIRE(rows.size() == 4);  // two caches, causal and not
    for (const auto& row : rows) {
        CHECK(row["seqlen_q"] == 64);
        CHECK(row["tflops"].get<double>() > 0);
        CHECK(row["kernel"].get<std::string>().find("decode") == std::string::npos);
    }
}

TEST_CASE("rtattn render prints the source; --verbose adds the ptxas report", "[cli]") {
    const Cli cli;
    const Result r = cli("render --head-dim 132 --arch sm_90a");
    REQUIRE(r.code == 0);
    CHECK(r.out.find("kHeadDimQK = 132") != std::string::npos);
    CHECK(r.out.find("kPadQK = 144") != std::string::npos);
    CHECK(r.out.find("kPadV = 144") != std::string::npos);  // shifted rows (8 kv heads): V padded to 16
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

TEST_CASE("rtattn precompile --pass builds backward kernels, and --cache-only checks them", "[cli]") {
    const Cli cli;
    const json j = cli.json_of("precompile --head-dim 80 --dtype bf16 --causal true --arch sm_80 --pass both --json");
    REQUIRE(j["total"] == 2);
    CHECK(j["compiled"] == 2);
    CHECK(j["configs"][0]["pass"] == "forward");
    CHECK(j["configs"][1]["pass"] == "backward");
    CHECK(j["configs"][1]["describe"].get<std::string>().find("(backward)") != std::string::npos);
    CHECK(j["configs"][0]["key"] != j["configs"][1]["key"]);
    const json listed = cli.json_of("ls --json")["entries"];
    REQUIRE(listed.size() == 2);
    CHECK(((listed[0]["pass"] == "forward" && listed[1]["pass"] == "backward") ||
           (listed[0]["pass"] == "backward" && listed[1]["pass"] == "forward")));
    const std::string table = cli("ls").out;  // the same config twice: the backward entry says so
    CHECK(table.find("d80 bf16 causal h8:8 (backward)") != std::string::npos);
    // The backward set is cached, and a forward-only check of another config still reports it missing.
    const json again = cli.json_of("precompile --head-dim 80 --dtype bf16 --causal true --arch sm_80 --pass backward "
                                   "--cache-only --json");
    CHECK(again["cached"] == 1);
    const Result missing = cli("precompile --head-dim 96 --dtype bf16 --causal true --arch sm_80 --pass backward "
                               "--cache-only");
    CHECK(missing.code == 1);
    CHECK(missing.all().find("d96 bf16 causal h8:8 sm_80 (backward)") != std::string::npos);
    const Result bad = cli("precompile --head-dim 80 --arch sm_80 --pass sideways");
    CHECK(bad.code == 2);
    CHECK(bad.all().find("--pass") != std::string::npos);
}

TEST_CASE("rtattn precompile --cache-only passes once everything is cached", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 64 --heads-q 8 --heads-kv 2 --arch sm_80").code == 0);
    // Heads do not enter the cache key: a different head count is served by the same cubin.
    const json j = cli.json_of("precompile --head-dim 64 --heads-q 32 --arch sm_80 --cache-only --json");
    CHECK(j["cached"] == 1);
    CHECK(j["failed"] == 0);
}

TEST_CASE("rtattn render --out-dir writes files nvcc compiles as they are", "[cli]") {
    const Cli cli;
    const fs::path dir = cli.scratch.path() / "src";
    const Result r = cli("render --head-dim 132 --arch sm_90a --out-dir '" + dir.string() + "'");
    REQUIRE(r.code == 0);
    const fs::path stub = dir / "rtattn_fwd_d132x132_bf16_sm_90a.cu";
    REQUIRE(fs::exists(stub));
    CHECK(fs::exists(dir / "fwd" / "sm90_ws.cuh"));
    CHECK(fs::exists(dir / "common" / "geometry.h"));
    if (std::string(RTATTN_NVCC).empty() || !fs::exists(RTATTN_NVCC)) {
        WARN("SKIPPED: no nvcc to compile the written files with");
        return;
    }
    for (const char* arch : {"sm_90a", "sm_80"}) {
        const fs::path sub = cli.scratch.path() / arch;
        REQUIRE(cli(std::string("render --head-dim 100 --causal true --arch ") + arch + " --out-dir '" + sub.string() +
                    "'")
                    .code == 0);
        std::string log;
        const std::string cmd = std::string("'") + RTATTN_NVCC + "' -std=c++17 -arch=" + arch + " -cubin -I '" +
                                sub.string() + "' -o '" + (sub / "out.cubin").string() + "' '" +
                                (sub / (std::string("rtattn_fwd_d100x100_bf16_causal_") + arch + ".cu")).string() + "'";
        INFO(cmd << "\n" << log);
        CHECK(rtattn::test::run_command(cmd, &log) == 0);
        CHECK(fs::file_size(sub / "out.cubin") > 1000);
    }
}

TEST_CASE("rtattn render --cubin writes the compiled cubin", "[cli]") {
    const Cli cli;
    const fs::path out = cli.scratch.path() / "k.cubin";
    REQUIRE(cli("render --head-dim 64 --arch sm_80 --cubin '" + out.string() + "'").code == 0);
    const std::string bytes = rtattn::test::read_file(out);
    CHECK(bytes.size() > 1000);
    CHECK(bytes.substr(0, 4) == "\x7f" "ELF");
}

TEST_CASE("rtattn prune --dry-run lists what would go and removes nothing; --json", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 64 --dtype bf16 --causal both --arch sm_80").code == 0);
    const Result dry = cli("prune --max-size 0 --dry-run");
    CHECK(dry.code == 0);
    CHECK(dry.out.find("would remove 2 entries") != std::string::npos);
    CHECK(cli.json_of("ls --json")["entries"].size() == 2);
    const json j = cli.json_of("prune --max-size 0 --dry-run --json");
    CHECK(j["dry_run"] == true);
    CHECK(j["removed"] == 2);
    CHECK(j["paths"].size() == 2);
    CHECK(cli.json_of("ls --json")["entries"].size() == 2);
    const json done = cli.json_of("prune --older-than 0 --json");
    CHECK(done["removed"] == 2);
    CHECK(done["bytes_left"] == 0);
    CHECK(cli.json_of("ls --json")["entries"].empty());
}

TEST_CASE("rtattn ls sorts by config and filters by arch and head dim", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 96,64 --dtype bf16 --causal false --arch sm_90a,sm_80").code == 0);
    const json all = cli.json_of("ls --json");
    REQUIRE(all["entries"].size() == 4);
    std::vector<std::pair<int, std::string>> order;
    for (const auto& e : all["entries"]) order.emplace_back(e["config"]["head_dim_qk"], e["arch"]);
    CHECK(order == std::vector<std::pair<int, std::string>>{{64, "sm_80"}, {64, "sm_90a"}, {96, "sm_80"}, {96, "sm_90a"}});
    const json hopper = cli.json_of("ls --json --arch sm_90a");
    CHECK(hopper["entries"].size() == 2);
    for (const auto& e : hopper["entries"]) CHECK(e["arch"] == "sm_90a");
    const json d96 = cli.json_of("ls --json --head-dim 96 --arch sm_80");
    REQUIRE(d96["entries"].size() == 1);
    CHECK(d96["entries"][0]["config"]["head_dim_qk"] == 96);
    CHECK(cli("ls --arch sm_80").out.find("2 entries (of 4)") != std::string::npos);
}

TEST_CASE("JSON outputs carry a schema version and null for unknown figures", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 64 --arch sm_80 --causal false --dtype bf16").code == 0);
    for (const char* cmd : {"ls --json", "verify --json", "info --json", "prune --max-size 1G --json",
                            "precompile --head-dim 64 --arch sm_80 --causal false --dtype bf16 --json"})
        CHECK(cli.json_of(cmd)["schema_version"].is_number());
    // An entry whose info has no ptxas figures: null, not -1.
    const json entry = cli.json_of("ls --json")["entries"][0];
    CHECK((entry["registers"].is_null() || entry["registers"].get<int>() > 0));
    rtattn::cache::Entry bare{std::string(64, 'a'), "sm_80", "cubin", R"({"config":{"head_dim":64}})"};
    const std::string dir = cli.json_of("ls --json")["dir"];
    fs::create_directories(dir + "/aa");
    std::ofstream(dir + "/aa/" + bare.key + ".rtc", std::ios::binary) << rtattn::cache::encode_entry(bare);
    for (const auto& e : cli.json_of("ls --json")["entries"])
        if (e["key"] == bare.key) {
            CHECK(e["registers"].is_null());
            CHECK(e["spill_bytes"].is_null());
            CHECK(e["compile_seconds"].is_null());
        }
}

TEST_CASE("precompile names a kernel that spills, which the library itself only logs at info level", "[cli]") {
    const Cli cli;
    // A cap with a window at d34 on sm_90a: the plan table keeps an 8-byte spill there (README, known spills).
    const Result r = cli("precompile --head-dim 34,64 --arch sm_90a --heads-q 16 --softcap --local --causal false -j 1");
    REQUIRE(r.code == 0);
    CHECK(r.err.find("sm_90a (") != std::string::npos);
    CHECK(r.err.find("B spilled)") != std::string::npos);
    CHECK(r.err.find("d64 bf16 noncausal h16:16 local softcap sm_90a\n") != std::string::npos);  // d64 spills none
    CHECK(r.err.find("warning") == std::string::npos);
}

TEST_CASE("precompile's ETA counts compile work left, not configs", "[cli]") {
    const Cli cli;
    REQUIRE(cli("precompile --head-dim 64 --arch sm_80 --causal false --dtype bf16").code == 0);
    // One cached, one to compile, one at a time: after the cached one, a compile is still ahead and none has been
    // timed, so the ETA is unknown (counting the cache hit, it would have read "0.00s").
    const Result r = cli("precompile --head-dim 64,80 --arch sm_80 --causal false --dtype bf16 -j 1");
    REQUIRE(r.code == 0);
    CHECK(r.err.find("[1/2] 0 failed") != std::string::npos);
    CHECK(r.err.find("ETA ?  cached d64") != std::string::npos);
    CHECK(r.err.find("ETA 0s  compiled d80") != std::string::npos);
    for (std::size_t at = 0, end; (end = r.err.find('\n', at)) != std::string::npos; at = end + 1)
        CHECK(end - at <= 80);  // each progress line fits an 80-column terminal
}
