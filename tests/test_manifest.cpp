// The manifest reader, in-process: expansion to the cartesian product, deduplication, errors that name file, entry
// and field, and the default manifest's coverage.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "catch.hpp"
#include "manifest.hpp"
#include "testutil.hpp"

namespace {
using rtattn::test::TempDir;
}  // namespace

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

TEST_CASE("a manifest entry's pass asks for forward, backward or both kernels", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    const std::string path = (dir.path() / "p.json").string();
    std::ofstream(path) << R"({"configs": [
        {"head_dim": [64, 128], "dtype": "bf16", "arch": "sm_80"},
        {"head_dim": 132, "dtype": "bf16", "arch": "sm_80", "pass": "both"},
        {"head_dim": [64, 96], "dtype": "bf16", "arch": "sm_80", "pass": ["backward"]}]})";
    const auto m = rtattn::tool::load_manifest(path);
    REQUIRE(m.configs.size() == 3);  // no pass: forward only, as before passes existed
    CHECK(m.configs[2].head_dim_qk == 132);
    REQUIRE(m.backward_configs.size() == 3);
    CHECK(m.backward_configs[0].head_dim_qk == 132);
    CHECK(m.backward_configs[1].head_dim_qk == 64);
    CHECK(m.backward_configs[2].head_dim_qk == 96);

    SECTION("--pass overrides every entry's pass") {
        const auto both = rtattn::tool::load_manifest(path, {{}, {}, "both"});
        CHECK(both.configs.size() == 4);
        CHECK(both.backward_configs.size() == 4);
        const auto backward = rtattn::tool::load_manifest(path, {{}, {}, "backward"});
        CHECK(backward.configs.empty());
        CHECK(backward.backward_configs.size() == 4);
    }
    SECTION("flags take a pass too") {
        rtattn::tool::ConfigFlags f;
        f.head_dims = {64, 132};
        f.dtypes = {"bf16", "fp16"};
        f.causal = "both";
        f.archs = {"sm_80"};
        const auto x = rtattn::tool::expand_flag_passes(f, {{}, {}, "backward"});
        CHECK(x.forward.empty());
        CHECK(x.backward.size() == 8);  // 2 dtypes x causal both ways
    }
    SECTION("a bad pass is named") {
        for (const char* bad : {R"("bwd")", "[]", "true", R"(["forward", "sideways"])"}) {
            std::ofstream(path) << R"({"configs": [{"head_dim": 64, "arch": "sm_80", "pass": )" << bad << "}]}";
            try {
                rtattn::tool::load_manifest(path);
                FAIL("pass " << bad << " accepted");
            } catch (const rtattn::ConfigError& e) {
                INFO(e.what());
                CHECK(e.field() == "pass");
                CHECK(std::string(e.what()).find("configs[0]") != std::string::npos);
            }
        }
    }
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
    CHECK(archs == std::set<std::string>{"sm_80", "sm_86", "sm_89", "sm_90a"});  // A100, A10, L4/L40S, H100/H200
    CHECK(causal.size() == 2);
    CHECK(rtattn::tool::find_manifest("default").size() > 0);
    // No entry names a model whose attention needs what the library does not have yet (Gemma-2's logit softcap,
    // Mistral's sliding window): such shapes are named by head dim.
    const std::string text = rtattn::test::read_file(path);
    for (const char* model : {"Gemma", "Mistral"}) CHECK(text.find(model) == std::string::npos);
}

TEST_CASE("the training manifest asks for forward and backward kernels of the same configs", "[manifest]") {
    const auto m = rtattn::tool::load_manifest(std::string(RTATTN_SOURCE_DIR) + "/cache/training.json");
    REQUIRE(!m.backward_configs.empty());
    CHECK(m.backward_configs.size() == m.configs.size());
    std::set<int> dims;
    for (const auto& c : m.backward_configs) dims.insert(c.head_dim_qk);
    CHECK(dims == std::set<int>{64, 128, 132, 256});
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
        for (int i = 0; i < 65536; ++i)  // 65535 head counts (the most a config has), then one head dim more
            out << (i > 0 ? "," : "") << R"({"head_dim": )" << (i < 65535 ? 64 : 80) << R"(, "num_heads_q": )"
                << (i < 65535 ? i + 1 : 1) << R"(, "num_heads_kv": 1, "arch": "sm_80"})";
        out << "]}";
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto m = rtattn::tool::load_manifest(path);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(m.configs.size() == 65536);
    CHECK(seconds < 30);
}

// Issue 21: bad input never corrupts memory, hangs or crashes.

namespace {

// The ConfigError load_manifest throws for `text`, as field and message ("<no error>" for both when none).
std::pair<std::string, std::string> manifest_error(const TempDir& dir, const std::string& text) {
    const std::string path = (dir.path() / "m.json").string();
    std::ofstream(path) << text;
    try {
        rtattn::tool::load_manifest(path);
    } catch (const rtattn::ConfigError& e) {
        return {e.field(), e.what()};
    }
    return {"<no error>", "<no error>"};
}

std::string list_of(int n, const std::string& item) {
    std::string s = "[";
    for (int i = 0; i < n; ++i) s += (i ? "," : "") + item;
    return s + "]";
}

}  // namespace

TEST_CASE("a manifest that expands past 100000 configs is refused before they are built", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    // 80 KB of lists standing for 9M configs: they used to be built (5.8 GB) before the process aborted.
    std::string head_dims = "[";
    for (int d = 1; d <= 250; ++d) head_dims += (d > 1 ? "," : "") + std::to_string(d);
    head_dims += "]";
    const auto [field, message] = manifest_error(
        dir, R"({"configs": [{"head_dim": 64, "arch": "sm_80"}, {"model": "huge", "head_dim": )" + head_dims +
                 R"(, "dtype": ["bf16", "fp16"], "causal": "both", "arch": )" + list_of(9000, R"("sm_80")") + "}]}");
    CHECK(field == "configs");
    CHECK(message.find("m.json: configs[1] (huge)") != std::string::npos);
    CHECK(message.find("expands to 9000000 configs") != std::string::npos);
    CHECK(message.find("head_dim 250 x dtype 2 x causal 2 x arch 9000") != std::string::npos);
    CHECK(message.find("the limit is 100000 configs per manifest") != std::string::npos);

    // The product cannot wrap around to a small number: 2^64 reads as more than the limit, not as 0 or 1.
    const std::string sixteen = list_of(16, R"("sm_80")"), many = list_of(65536, "64");
    const auto wrapped = manifest_error(
        dir, R"({"configs": [{"head_dim": )" + many + R"(, "head_dim_qk": )" + many + R"(, "head_dim_v": )" + many +
                 R"(, "dtype": )" + many + R"(, "arch": )" + sixteen + "}]}");
    CHECK(wrapped.first == "configs");
    CHECK(wrapped.second.find("more than 18446744073709551615 configs") != std::string::npos);

    // The limit is per manifest: entries under it each still add up.
    const std::string sixty_thousand = list_of(60000, R"("sm_80")");
    const auto summed = manifest_error(dir, R"({"configs": [{"head_dim": 64, "arch": )" + sixty_thousand +
                                                R"(}, {"head_dim": 128, "arch": )" + sixty_thousand + "}]}");
    CHECK(summed.first == "configs");
    CHECK(summed.second.find("configs[1]") != std::string::npos);
    CHECK(summed.second.find("takes the manifest to 120000") != std::string::npos);
    CHECK(rtattn::tool::kMaxManifestConfigs == 100000);  // the README states it
}

TEST_CASE("a deeply nested manifest or a repeated key is refused, naming the file", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    const std::string nested = std::string(200000, '[') + std::string(200000, ']');
    const auto deep = manifest_error(dir, R"({"configs": [{"head_dim": 64, "comment": )" + nested + "}]}");
    CHECK(deep.first == "manifest");
    CHECK(deep.second.find("m.json") != std::string::npos);
    CHECK(deep.second.find("nested deeper than 64 levels") != std::string::npos);
    // A second "arch" used to replace the first silently.
    const auto twice = manifest_error(dir, R"({"configs": [{"head_dim": 64, "arch": "sm_80", "arch": "sm_90a"}]})");
    CHECK(twice.first == "manifest");
    CHECK(twice.second.find("'arch' appears twice") != std::string::npos);
    // Keys may repeat across objects.
    CHECK(manifest_error(dir, R"({"configs": [{"head_dim": 64, "arch": "sm_80"}, {"head_dim": 64, "arch": "sm_90a"}]})")
              .first == "<no error>");
}

TEST_CASE("manifest keys are echoed escaped", "[manifest]") {
    const TempDir dir("rtattn-manifest");
    const auto [field, message] = manifest_error(dir, "{\"configs\": [], \"na\\u001b[2Jme\": 1}");
    CHECK(field == "na\\x1b[2Jme");
    CHECK(message.find("na\\x1b[2Jme: unknown top-level field") != std::string::npos);
    for (const char ch : message) CHECK((ch >= 0x20 && ch < 0x7f));
}
