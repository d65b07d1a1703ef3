// NVRTC compiles every template variant we ship, for sm_80 and sm_90a, without spills.
#include <algorithm>
#include <future>
#include <thread>
#include <vector>
#include <atomic>
#include <mutex>

#include "catch.hpp"
#include "compile/compile.hpp"
#include "kernels/forward.hpp"
#include "plan/plan.hpp"
#include "core/errors.hpp"

using rtattn::AttentionConfig;

namespace {
rtattn::compile::Compiled build(int d, const char* arch, rtattn::Dtype dt, bool causal, int dv = 0) {
    AttentionConfig c;
    c.head_dim_qk = d;
    if (dv) c.head_dim_v = dv;
    c.arch = arch;
    c.dtype = dt;
    c.causal = causal;
    return rtattn::compile::compile(rtattn::kernels::render_plan(rtattn::plan::plan(c)), arch);
}
}  // namespace

TEST_CASE("templates compile with 0 spills for the common head dims", "[compile][nvrtc]") {
    for (const char* arch : {"sm_80", "sm_90a"}) {
        for (int d : {32, 64, 80, 96, 128, 132, 160, 192, 256}) {
            CAPTURE(arch, d);
            // Alternate dtype and causal so both template paths are covered without doubling the run time.
            const bool causal = d % 64 != 0;
            const auto dt = (d / 32) % 2 ? rtattn::Dtype::fp16 : rtattn::Dtype::bf16;
            const auto out = build(d, arch, dt, causal);
            INFO("NVRTC log:\n" << out.log);
            CHECK(out.cubin.size() > 1000);
            CHECK(out.ptxas.registers > 0);
            CHECK(out.ptxas.registers <= 255);
            CHECK(out.ptxas.spill_store_bytes == 0);
            CHECK(out.ptxas.spill_load_bytes == 0);
            CHECK(out.ptxas.stack_bytes == 0);
        }
    }
}

TEST_CASE("odd and mixed head dims compile too", "[compile][nvrtc]") {
    for (auto [dq, dv] : {std::pair{1, 1}, {17, 17}, {100, 100}, {255, 255}, {192, 128}, {132, 100}}) {
        CAPTURE(dq, dv);
        const auto out = build(dq, "sm_90a", rtattn::Dtype::bf16, true, dv);
        INFO("NVRTC log:\n" << out.log);
        CHECK(out.ptxas.spill_store_bytes == 0);
    }
}

TEST_CASE("an NVRTC failure carries log, options and source", "[compile]") {
    AttentionConfig c;
    c.arch = "sm_80";
    auto src = rtattn::kernels::render_plan(rtattn::plan::plan(c));
    src.stub += "\nthis is not CUDA;\n";
    try {
        rtattn::compile::compile(src, "sm_80");
        FAIL("broken source compiled");
    } catch (const rtattn::CompileError& e) {
        CHECK(!e.log().empty());
        CHECK(e.options().find("--gpu-architecture=sm_80") != std::string::npos);
        CHECK(e.source().find("this is not CUDA") != std::string::npos);
        CHECK(std::string(e.what()).find("NVRTC") != std::string::npos);
    }
}

TEST_CASE("ptxas report parsing", "[compile]") {
    const std::string log =
        "ptxas info    : Compiling entry function 'rtattn_fwd_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for rtattn_fwd_kernel\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 1 barriers, 416 bytes cmem[0]\n";
    const auto r = rtattn::compile::parse_ptxas(log, "rtattn_fwd_kernel");
    CHECK(r.registers == 168);
    CHECK(r.stack_bytes == 8);
    CHECK(r.spill_store_bytes == 4);
    CHECK(r.spill_load_bytes == 12);
    CHECK(r.barriers == 1);
    CHECK(rtattn::compile::nvrtc_version().find('.') != std::string::npos);
}

// Every head dim 1..256 on both archs (dtype and causal alternate with d), in parallel. Hidden by default: ctest runs
// it as its own test, test_compile_sweep.
TEST_CASE("every head dim 1..256 compiles without spills for sm_80 and sm_90a", "[.sweep]") {
    struct Result {
        int d;
        const char* arch;
        int spills, regs;
    };
    std::vector<std::pair<int, const char*>> jobs;
    for (const char* arch : {"sm_80", "sm_90a"})
        for (int d = 1; d <= 256; ++d) jobs.push_back({d, arch});
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::vector<Result> results;
    auto worker = [&] {
        for (size_t i; (i = next++) < jobs.size();) {
            const auto [d, arch] = jobs[i];
            const auto out = build(d, arch, d % 2 ? rtattn::Dtype::fp16 : rtattn::Dtype::bf16, d % 3 == 0);
            std::lock_guard<std::mutex> lock(mu);
            results.push_back({d, arch, out.ptxas.spill_store_bytes + out.ptxas.spill_load_bytes, out.ptxas.registers});
        }
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < std::max(2u, std::thread::hardware_concurrency()); ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    REQUIRE(results.size() == jobs.size());
    for (const auto& r : results) {
        CAPTURE(r.d, r.arch, r.regs);
        CHECK(r.regs > 0);
        CHECK(r.spills == 0);
    }
}
