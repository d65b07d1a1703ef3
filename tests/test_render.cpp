// Rendering is deterministic, hashes what matters, and honours RTATTN_TEMPLATE_DIR.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "api/resolver.hpp"
#include "catch.hpp"
#include "kernels/backward.hpp"
#include "kernels/forward.hpp"
#include "render/render.hpp"
#include "core/errors.hpp"
#include "testutil.hpp"

using rtattn::AttentionConfig;

namespace {
rtattn::render::RenderedSource render_for(int d, bool causal, const char* arch) {
    AttentionConfig c;
    c.head_dim_qk = d;
    c.causal = causal;
    c.arch = arch;
    c.num_heads_q = c.num_heads_kv = 2;  // packed K/V rows of 16-byte multiples: TMA for d132 on sm_90a
    return rtattn::kernels::render_plan(rtattn::plan::plan(c));
}
}  // namespace

TEST_CASE("rendering is deterministic", "[render]") {
    const auto a = render_for(132, true, "sm_90a");
    const auto b = render_for(132, true, "sm_90a");
    CHECK(a.full_text() == b.full_text());
    CHECK(rtattn::cache_key(a, "sm_90a") == rtattn::cache_key(b, "sm_90a"));
    CHECK(rtattn::cache_key(a, "sm_90a").size() == 64);
}

TEST_CASE("the stub carries the plan as traits", "[render]") {
    const auto r = render_for(132, false, "sm_90a");
    CHECK(r.stub.find("kHeadDimQK = 132;") != std::string::npos);
    CHECK(r.stub.find("kPadQK = 144;") != std::string::npos);
    CHECK(r.stub.find("kPadV = 144;") != std::string::npos);  // shifted rows: V padded to 16
    CHECK(r.stub.find("kCausal = false;") != std::string::npos);
    CHECK(r.stub.find("extern \"C\" __global__") != std::string::npos);
    CHECK(r.full_text().find("flash_fwd") != std::string::npos);
    // No host headers: NVRTC has no libstdc++.
    for (const auto& h : *r.headers) CHECK(h.text.find("#include <") == std::string::npos);
}

TEST_CASE("sinks: one trait, the program name and plan words of every pass", "[render][sinks]") {
    for (bool sinks : {false, true}) {
        CAPTURE(sinks);
        AttentionConfig c;
        c.head_dim_qk = 128, c.causal = true, c.local = true, c.sinks = sinks, c.arch = "sm_90a";
        const std::string suffix = std::string("_causal_local") + (sinks ? "_sinks" : "");
        const auto fwd = rtattn::kernels::render_plan(rtattn::plan::plan(c));
        const auto bwd = rtattn::kernels::render_backward(rtattn::plan::plan_backward(c));
        c.decode = true;
        const auto dec = rtattn::kernels::render_plan(rtattn::plan::plan(c));
        for (const auto* r : {&fwd, &bwd, &dec}) {
            CHECK(r->stub.find(std::string("kSinks = ") + (sinks ? "true;" : "false;")) != std::string::npos);
            CHECK(r->name.find(suffix + "_sm_90a") != std::string::npos);
            CHECK(r->stub.find(std::string("\"sinks\":") + (sinks ? "true" : "false")) != std::string::npos);
        }
    }
}

TEST_CASE("softcap: one trait and the program name of every pass", "[render][softcap]") {
    for (bool softcap : {false, true}) {
        CAPTURE(softcap);
        AttentionConfig c;
        c.head_dim_qk = 128, c.causal = true, c.softcap = softcap, c.arch = "sm_90a";
        const auto fwd = rtattn::kernels::render_plan(rtattn::plan::plan(c));
        c.decode = true;
        const auto dec = rtattn::kernels::render_plan(rtattn::plan::plan(c));
        for (const auto* r : {&fwd, &dec}) {
            CHECK(r->stub.find(std::string("kSoftcap = ") + (softcap ? "true;" : "false;")) != std::string::npos);
            CHECK((r->name.find("_softcap_") != std::string::npos) == softcap);
        }
        c.decode = false;
        for (const char* arch : {"sm_90a", "sm_80"}) {
            c.arch = arch;
            const auto bwd = rtattn::kernels::render_backward(rtattn::plan::plan_backward(c));
            CHECK(bwd.stub.find(std::string("kSoftcap = ") + (softcap ? "true;" : "false;")) != std::string::npos);
            CHECK((bwd.name.find("_softcap_") != std::string::npos) == softcap);
        }
    }
}

TEST_CASE("alibi: one trait and the program name of the prefill, decode and backward passes", "[render][alibi]") {
    for (bool alibi : {false, true})
        for (const char* arch : {"sm_90a", "sm_80"}) {
            CAPTURE(alibi, arch);
            AttentionConfig c;
            c.head_dim_qk = 128, c.causal = true, c.alibi = alibi, c.arch = arch;
            const auto fwd = rtattn::kernels::render_plan(rtattn::plan::plan(c));
            const auto bwd = rtattn::kernels::render_backward(rtattn::plan::plan_backward(c));
            c.decode = true;
            const auto dec = rtattn::kernels::render_plan(rtattn::plan::plan(c));
            for (const auto* r : {&fwd, &bwd, &dec}) {
                CHECK(r->stub.find(std::string("kAlibi = ") + (alibi ? "true;" : "false;")) != std::string::npos);
                CHECK((r->name.find("_alibi_") != std::string::npos) == alibi);
            }
        }
}

TEST_CASE("the mask is stated once: traits, program name and plan words of every pass", "[render][local]") {
    for (bool causal : {false, true})
        for (bool local : {false, true}) {
            CAPTURE(causal, local);
            AttentionConfig c;
            c.head_dim_qk = 128, c.causal = causal, c.local = local, c.arch = "sm_90a";
            const std::string suffix = std::string(causal ? "_causal" : "") + (local ? "_local" : "");
            const auto fwd = rtattn::kernels::render_plan(rtattn::plan::plan(c));
            const auto bwd = rtattn::kernels::render_backward(rtattn::plan::plan_backward(c));
            for (const auto* r : {&fwd, &bwd}) {
                CHECK(r->stub.find(std::string("kCausal = ") + (causal ? "true;" : "false;")) != std::string::npos);
                CHECK(r->stub.find(std::string("kLocal = ") + (local ? "true;" : "false;")) != std::string::npos);
                CHECK(r->name.find(suffix + "_sm_90a") != std::string::npos);
                CHECK(r->stub.find(std::string("\"local\":") + (local ? "true" : "false")) != std::string::npos);
            }
            c.decode = true, c.paged_kv = true;  // decode's own stub and name
            const auto dec = rtattn::kernels::render_plan(rtattn::plan::plan(c));
            CHECK(dec.stub.find(std::string("kLocal = ") + (local ? "true;" : "false;")) != std::string::npos);
            CHECK(dec.name.find(suffix + "_paged_sm_90a") != std::string::npos);
        }
}

namespace {
// The wgmma widths whose wrapper a stub defines, as "ss64" / "rs136".
std::set<std::string> wgmma_forms(const std::string& stub) {
    std::set<std::string> out;
    std::size_t at = 0;
    while ((at = stub.find("wgmma.mma_async.sync.aligned.m64n", at)) != std::string::npos) {
        at += 33;
        const int n = std::atoi(stub.c_str() + at);
        const std::size_t end = stub.find('\n', at);
        const bool rs = stub.substr(at, end - at).find("}, {%") != std::string::npos;  // A from registers
        out.insert((rs ? "rs" : "ss") + std::to_string(n));
    }
    return out;
}
}  // namespace

TEST_CASE("the stub defines the wgmma wrappers for exactly the widths its plan issues", "[render]") {
    // d136 (split rows): QK^T over 128-key tiles, one wide PV instruction of n = 136.
    const auto wide = render_for(136, false, "sm_90a");
    CHECK(wide.stub.find("kWideV = true;") != std::string::npos);
    CHECK(wgmma_forms(wide.stub) == std::set<std::string>{"ss128", "rs136"});
    CHECK(wide.stub.find("\"+f\"(d[67])") != std::string::npos);
    CHECK(wide.stub.find("\"+f\"(d[68])") == std::string::npos);
    // d128 (V padded to 128): one 128-wide chunk each.
    CHECK(wgmma_forms(render_for(128, false, "sm_90a").stub) == std::set<std::string>{"ss128", "rs128"});
    // d100 (shifted rows, V padded to 112 = 64 + 32 + 16) and d256 (64-key tiles, V in two 128-wide chunks).
    CHECK(wgmma_forms(render_for(100, false, "sm_90a").stub) == std::set<std::string>{"ss128", "rs64", "rs32", "rs16"});
    CHECK(wgmma_forms(render_for(256, false, "sm_90a").stub) == std::set<std::string>{"ss64", "rs128"});
    // mma.sync plans issue none.
    CHECK(wgmma_forms(render_for(128, false, "sm_80").stub).empty());
}

TEST_CASE("each family emits its own traits, not the union of all", "[render]") {
    const auto mma = render_for(128, false, "sm_80").stub;
    CHECK(mma.find("kMTiles") != std::string::npos);
    CHECK(mma.find("kSwizzle") == std::string::npos);
    CHECK(mma.find("kSplitRows") == std::string::npos);
    CHECK(mma.find("kShiftRows = false;") != std::string::npos);  // both families shift rows, each its own way
    const auto ws = render_for(128, false, "sm_90a").stub;
    CHECK(ws.find("kSplitRows") != std::string::npos);
    CHECK(ws.find("kShiftRows = false;") != std::string::npos);
    CHECK(render_for(100, false, "sm_90a").stub.find("kShiftRows = true;") != std::string::npos);
    CHECK(ws.find("kMTiles") == std::string::npos);
    CHECK(ws.find("kQInRegs") == std::string::npos);
    CHECK(ws.find("\"family\":\"fwd_sm90_ws\"") != std::string::npos);  // the plan, in the stub's comment
}

TEST_CASE("different configs and arches give different keys", "[render]") {
    const auto k1 = rtattn::cache_key(render_for(128, false, "sm_90a"), "sm_90a");
    CHECK(k1 != rtattn::cache_key(render_for(128, true, "sm_90a"), "sm_90a"));
    CHECK(k1 != rtattn::cache_key(render_for(132, false, "sm_90a"), "sm_90a"));
    CHECK(rtattn::cache_key(render_for(128, false, "sm_80"), "sm_80") != k1);
}

TEST_CASE("RTATTN_TEMPLATE_DIR replaces the embedded templates and changes the key", "[render]") {
    rtattn::test::TempDir dir;
    for (const auto& t : rtattn::render::embedded_templates()) {
        std::filesystem::create_directories((dir.path() / t.name).parent_path());
        std::ofstream out(dir.path() / t.name, std::ios::binary);
        out << t.text << (t.name == "fwd/mma.cuh" ? "\n// edited\n" : "");
    }
    const auto before = rtattn::cache_key(render_for(64, false, "sm_80"), "sm_80");
    setenv("RTATTN_TEMPLATE_DIR", dir.str().c_str(), 1);
    const auto edited = render_for(64, false, "sm_80");
    const auto after = rtattn::cache_key(edited, "sm_80");
    setenv("RTATTN_TEMPLATE_DIR", (dir.str() + "/missing").c_str(), 1);
    CHECK_THROWS_AS(render_for(64, false, "sm_80"), rtattn::ConfigError);
    unsetenv("RTATTN_TEMPLATE_DIR");
    CHECK(edited.full_text().find("// edited") != std::string::npos);
    CHECK(before != after);
}
