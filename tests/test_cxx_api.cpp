// The public C++ API (include/rtattn/*.hpp) as a C++17 caller sees it: header-only over the C ABI, exceptions rebuilt
// from the C last error with the same types, messages and fields, options in effect, the log sink, kernels.
// Compiled as C++17 on purpose (tests/CMakeLists.txt).
#include <rtattn/rtattn.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "catch.hpp"

static_assert(__cplusplus == 201703L, "this test pins the C++ API to C++17");

extern "C" rtattn_status rtattn_test_inject(int kind);

namespace {

std::string test_cache_dir() {
    const char* d = std::getenv("RTATTN_CACHE_DIR");
    return d ? d : "";
}

template <class E, class F>
E caught(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e;
    }
    FAIL("the expected exception was not thrown");
    throw;  // unreachable
}

}  // namespace

TEST_CASE("config errors come back as ConfigError naming the field", "[cxx]") {
    rtattn::AttentionConfig c;
    c.head_dim_qk = 257;
    const auto e = caught<rtattn::ConfigError>([&] { c.validate(); });
    CHECK(e.field() == "head_dim_qk");
    CHECK(std::string(e.what()).find("head_dim_qk: 257 is out of range; allowed 1..256") == 0);

    c.head_dim_qk = 132;
    c.num_heads_q = 6;
    c.num_heads_kv = 4;
    CHECK(caught<rtattn::ConfigError>([&] { c.validate(); }).field() == "num_heads_kv");
    CHECK(caught<rtattn::ConfigError>([] { rtattn::dtype_from_string("fp8"); }).field() == "dtype");
    CHECK(rtattn::dtype_from_string("half") == rtattn::Dtype::fp16);
    // Everything derives from rtattn::Error, as before.
    CHECK_THROWS_AS(rtattn::AttentionConfig::from_json("{\"head_dim\": 0}"), rtattn::Error);
}

TEST_CASE("AttentionConfig: JSON round trip, equality, describe", "[cxx]") {
    rtattn::AttentionConfig c;
    c.head_dim_qk = 132;
    c.head_dim_v = 100;
    c.dtype = rtattn::Dtype::fp16;
    c.causal = true;
    c.num_heads_q = 32;
    c.num_heads_kv = 8;
    c.softmax_scale = 0.07;
    c.arch = "sm_90a";
    const auto back = rtattn::AttentionConfig::from_json(c.to_json());
    CHECK(back == c);
    CHECK_FALSE(back != c);
    CHECK(c.describe() == "d132/100 fp16 causal h32:8 scale=0.07 sm_90a");
    auto other = c;
    other.softmax_scale.reset();
    CHECK(other != c);
    CHECK(other.scale() == 1.0 / std::sqrt(132.0));
    CHECK(c.dv() == 100);
    CHECK(rtattn::is_known_arch("sm_89"));
    CHECK_FALSE(rtattn::is_known_arch("sm_75"));
    CHECK(rtattn::known_archs().find("sm_90a") != std::string::npos);
}

TEST_CASE("Runtime: options in effect, log sink, precompile, stats", "[cxx]") {
    std::vector<std::string> lines;
    rtattn::RuntimeOptions o;
    o.cache_dir = test_cache_dir() + "/cxx-api-fresh";
    std::filesystem::remove_all(o.cache_dir);  // so that the precompile below compiles
    o.log_level = rtattn::LogLevel::debug;
    o.log_sink = [&](rtattn::LogLevel, const std::string& m) { lines.push_back(m); };
    rtattn::Runtime rt(o);
    CHECK(rt.options().max_concurrent_compiles >= 1);  // 0 resolved
    CHECK(rt.options().cache_dir == o.cache_dir);
    CHECK(rt.options().log_level == rtattn::LogLevel::debug);

    rtattn::AttentionConfig c;
    c.head_dim_qk = 72;
    c.arch = "sm_80";
    const auto info = rt.precompile(c);
    CHECK(info.key.size() == 64);
    CHECK(info.plan.padded_qk == 80);
    CHECK(info.arch == "sm_80");
    CHECK(info.spill_bytes <= 0);
    CHECK_FALSE(info.from_cache);
    REQUIRE_FALSE(lines.empty());  // the sink got the library's messages
    CHECK(lines.front().rfind("compiling d72 bf16", 0) == 0);
    const auto stats = rt.stats();
    CHECK(stats.disk_enabled);
    CHECK(stats.dir.rfind(o.cache_dir, 0) == 0);
    CHECK(stats.compiles == 1);
}

TEST_CASE("spills of a tile the plan table chose are info, an override's a warning", "[cxx]") {
    // The table keeps a few spilling tiles where they measured faster (README, known spills): a user of such a config
    // gets no warning at run time; a tuning override that spills still warns.
    auto spill_lines = [](const std::string& dir, const std::string& tile, rtattn::AttentionConfig c) {
        std::vector<std::pair<rtattn::LogLevel, std::string>> lines;
        rtattn::RuntimeOptions o;
        o.cache_dir = test_cache_dir() + dir;
        std::filesystem::remove_all(o.cache_dir);  // so that the precompile compiles
        o.log_level = rtattn::LogLevel::debug;
        o.tile_override = tile;
        o.log_sink = [&](rtattn::LogLevel l, const std::string& m) {
            if (m.find("spill stores") != std::string::npos) lines.emplace_back(l, m);
        };
        rtattn::Runtime rt(o);
        const auto info = rt.precompile(c);
        CHECK(info.spill_bytes > 0);
        return lines;
    };
    rtattn::AttentionConfig table;  // a cap with a window at d34 on sm_90a: 8 bytes, kept (d34's plan row)
    table.head_dim_qk = 34;
    table.num_heads_q = table.num_heads_kv = 16;
    table.softcap = table.local = true;
    table.arch = "sm_90a";
    const auto quiet = spill_lines("/cxx-api-spill-table", "", table);
    REQUIRE(quiet.size() == 1);
    CHECK(quiet[0].first == rtattn::LogLevel::info);
    CHECK(quiet[0].second.find("plan table") != std::string::npos);

    rtattn::AttentionConfig tuned;  // d256 on mma.sync with 128 rows of Q in 4 warps' registers: spills thousands
    tuned.head_dim_qk = 256;
    tuned.arch = "sm_80";
    const auto loud = spill_lines("/cxx-api-spill-override", "128,128,4,2,2,1", tuned);
    REQUIRE(loud.size() == 1);
    CHECK(loud[0].first == rtattn::LogLevel::warn);
    CHECK(loud[0].second.find("override") != std::string::npos);
}

TEST_CASE("a log sink that throws does not unwind through the library", "[cxx]") {
    rtattn::RuntimeOptions o;
    o.cache_dir = test_cache_dir() + "/cxx-api";
    o.log_level = rtattn::LogLevel::debug;
    o.log_sink = [](rtattn::LogLevel, const std::string&) { throw std::runtime_error("logger broke"); };
    rtattn::Runtime rt(o);
    rtattn::AttentionConfig c;
    c.head_dim_qk = 40;
    c.arch = "sm_80";
    CHECK(rt.precompile(c).plan.padded_qk == 48);
}

TEST_CASE("bad runtime options and environment are ConfigErrors", "[cxx]") {
    rtattn::RuntimeOptions o;
    o.lock_timeout_seconds = -1;
    CHECK(caught<rtattn::ConfigError>([&] { rtattn::Runtime rt(o); }).field() == "lock_timeout_seconds");
    setenv("RTATTN_CACHE_ONLY", "maybe", 1);
    CHECK(caught<rtattn::ConfigError>([] { rtattn::Runtime rt; }).field() == "RTATTN_CACHE_ONLY");
    setenv("RTATTN_CACHE_ONLY", "1", 1);
    {
        rtattn::RuntimeOptions co;
        co.cache_dir = test_cache_dir() + "/cxx-api-empty";
        rtattn::Runtime rt(co);
        CHECK(rt.options().mode == rtattn::CacheMode::cache_only);
        rtattn::AttentionConfig c;
        c.arch = "sm_80";
        CHECK_THROWS_AS(rt.precompile(c), rtattn::CacheMissError);
    }
    unsetenv("RTATTN_CACHE_ONLY");
}

TEST_CASE("Runtime: the backward kernels' plan, precompile and refusals", "[cxx]") {
    rtattn::RuntimeOptions o;
    o.cache_dir = test_cache_dir() + "/cxx-api";
    rtattn::Runtime rt(o);
    rtattn::AttentionConfig c;
    c.head_dim_qk = 192;
    c.head_dim_v = 128;
    c.num_heads_q = 8;
    c.num_heads_kv = 1;
    c.arch = "sm_90";
    const auto info = rt.precompile_backward(c);
    CHECK(info.plan.padded_qk == 192);
    CHECK(info.plan.padded_v == 128);
    CHECK(info.plan.kernel.find("backward") != std::string::npos);
    CHECK(info.key != rt.precompile(c).key);
    CHECK(info.spill_bytes <= 0);
    const rtattn::BackwardKernel empty;
    CHECK_FALSE(empty);
    CHECK(caught<rtattn::ArgumentError>([&] { empty.backward({}); }).field() == "kernel");
    CHECK(caught<rtattn::ArgumentError>([&] { (void)empty.workspace_bytes(1, 1, 1); }).field() == "kernel");
    c.head_dim_v = 0;
    CHECK(caught<rtattn::ConfigError>([&] { rt.precompile_backward(c); }).field() == "head_dim_v");
}

TEST_CASE("an empty Kernel refuses, naming it", "[cxx]") {
    const rtattn::Kernel k;
    CHECK_FALSE(k);
    CHECK(caught<rtattn::ArgumentError>([&] { (void)k.config(); }).field() == "kernel");
    CHECK(caught<rtattn::ArgumentError>([&] { k.forward({}); }).field() == "kernel");
}

TEST_CASE("every failure kind is rebuilt into its exception with its details", "[cxx]") {
    using rtattn::detail::throw_last_error;
    REQUIRE(rtattn_test_inject(0) == RTATTN_ERROR_COMPILE);
    const auto ce = caught<rtattn::CompileError>([] { throw_last_error(RTATTN_ERROR_COMPILE); });
    CHECK(ce.log() == "line 7: error");
    CHECK(ce.options() == "--std=c++17");
    CHECK(ce.source() == "source");
    CHECK(std::string(ce.what()) == "NVRTC rejected d132 bf16\n--- NVRTC log ---\nline 7: error");

    REQUIRE(rtattn_test_inject(1) == RTATTN_ERROR_CUDA);
    const auto cu = caught<rtattn::CudaError>([] { throw_last_error(RTATTN_ERROR_CUDA); });
    CHECK(cu.call() == "cuLaunchKernel");
    CHECK(cu.result() == 719);
    CHECK(std::string(cu.what()) ==
          "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_FAILED (719): unspecified failure");

    REQUIRE(rtattn_test_inject(2) == RTATTN_ERROR_OUT_OF_MEMORY);
    CHECK_THROWS_AS(throw_last_error(RTATTN_ERROR_OUT_OF_MEMORY), std::bad_alloc);
    REQUIRE(rtattn_test_inject(3) == RTATTN_ERROR_INTERNAL);
    CHECK(std::string(rtattn_last_error_message()) == "internal error: an invariant broke");
    REQUIRE(rtattn_test_inject(4) == RTATTN_ERROR_INTERNAL);
    CHECK_THROWS_AS(throw_last_error(RTATTN_ERROR_INTERNAL), rtattn::Error);
    REQUIRE(rtattn_test_inject(5) == RTATTN_ERROR_CACHE);
    CHECK_THROWS_AS(throw_last_error(RTATTN_ERROR_CACHE), rtattn::CacheError);
    REQUIRE(rtattn_test_inject(6) == RTATTN_ERROR_CACHE_MISS);
    CHECK_THROWS_AS(throw_last_error(RTATTN_ERROR_CACHE_MISS), rtattn::CacheMissError);
    REQUIRE(rtattn_test_inject(-1) == RTATTN_OK);
    CHECK(rtattn_last_error() == RTATTN_OK);
}

TEST_CASE("the last error belongs to the thread that failed", "[cxx]") {
    rtattn::AttentionConfig bad;
    bad.head_dim_qk = 0;
    std::string other_field;
    std::thread t([&] {
        rtattn::AttentionConfig c;
        c.num_heads_q = 0;
        try {
            c.validate();
        } catch (const rtattn::ConfigError& e) {
            other_field = e.field();
        }
    });
    const rtattn_config cc = rtattn::detail::to_c(bad);
    REQUIRE(rtattn_config_validate(&cc) == RTATTN_ERROR_CONFIG);
    t.join();
    CHECK(other_field == "num_heads_q");
    CHECK(std::string(rtattn_last_error_field()) == "head_dim_qk");
}
