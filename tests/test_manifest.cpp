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
