// Rendering is deterministic, hashes what matters, and honours RTATTN_TEMPLATE_DIR.
#include <cstdlib>
#include <fstream>

#include "api/runtime_internal.hpp"
#include "catch.hpp"
#include "render/render.hpp"
#include "rtattn/errors.hpp"
#include "testutil.hpp"

using rtattn::AttentionConfig;

namespace {
rtattn::render::RenderedSource render_for(int d, bool causal, const char* arch) {
    AttentionConfig c;
    c.head_dim_qk = d;
    c.causal = causal;
    c.arch = arch;
    return rtattn::render::render(rtattn::plan::plan(c));
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
    CHECK(r.stub.find("kPadV = 136;") != std::string::npos);
    CHECK(r.stub.find("kCausal = false;") != std::string::npos);
    CHECK(r.stub.find("extern \"C\" __global__") != std::string::npos);
    CHECK(r.full_text().find("flash_fwd") != std::string::npos);
    // No host headers: NVRTC has no libstdc++.
    for (const auto& h : *r.headers) CHECK(h.text.find("#include <") == std::string::npos);
}

TEST_CASE("a wide-V plan's PV instruction wrapper is written into the stub", "[render]") {
    const auto wide = render_for(132, false, "sm_90a");  // V padded to 136: not among the header's widths
    CHECK(wide.stub.find("kWideV = true;") != std::string::npos);
    CHECK(wide.stub.find("wgmma.mma_async.sync.aligned.m64n136k16.f32.bf16.bf16") != std::string::npos);
    CHECK(wide.stub.find("\"+f\"(d[67])") != std::string::npos);
    CHECK(wide.stub.find("\"+f\"(d[68])") == std::string::npos);
    const auto narrow = render_for(128, false, "sm_90a");
    CHECK(narrow.stub.find("kWideV = false;") != std::string::npos);
    CHECK(narrow.stub.find("wgmma.mma_async") == std::string::npos);
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
        std::ofstream out(dir.path() / t.name, std::ios::binary);
        out << t.text << (t.name == "rtattn_fwd.cuh" ? "\n// edited\n" : "");
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
