// The tile table: padding to the MMA shape, shared-memory budgets, and one answer for "supported?".
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>

#include "arch/arch.hpp"
#include "catch.hpp"
#include "common/geometry.h"
#include "kernels/backward.hpp"
#include "kernels/forward.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "api/resolver.hpp"
#include "core/errors.hpp"

using rtattn::AttentionConfig;
using rtattn::plan::KernelPlan;

namespace {
AttentionConfig cfg(int d, const char* arch, int dv = 0, int heads = 1) {
    AttentionConfig c;
    c.head_dim_qk = d;
    if (dv) c.head_dim_v = dv;
    c.arch = arch;
    c.num_heads_q = c.num_heads_kv = heads;
    return c;
}
// Plans with a tile override ("" = the table's choice) and a row-loading choice (PlanOptions::rows).
KernelPlan plan(const AttentionConfig& c, const std::string& tile = "", const std::string& rows = "") {
    rtattn::plan::PlanOptions o;
    o.tile_override = tile, o.rows = rows;
    return rtattn::plan::plan(c, o);
}
bool hopper(const KernelPlan& p) { return p.family != &rtattn::kernels::fwd_mma(); }
bool producer(const KernelPlan& p) { return p.family == &rtattn::kernels::fwd_sm90_ws(); }
// A config's plans without score transforms, with a cap, with ALiBi and with both.
struct TransformPlans {
    KernelPlan none, cap, alibi, both;
};
TransformPlans transform_plans(AttentionConfig c) {
    TransformPlans t{.none = plan(c)};
    c.softcap = true;
    t.cap = plan(c);
    c.alibi = true;
    t.both = plan(c);
    c.softcap = false;
    t.alibi = plan(c);
    return t;
}
}  // namespace

TEST_CASE("head dims pad to the MMA shape, not to a bucket", "[plan]") {
    struct Case { int d, pad_qk, pad_v; };
    for (auto [d, pq, pv] : {Case{1, 16, 8}, Case{17, 32, 24}, Case{132, 144, 136}, Case{255, 256, 256},
                             Case{256, 256, 256}, Case{80, 80, 80}, Case{100, 112, 104}}) {
        const auto p = plan(cfg(d, "sm_80"));
        CAPTURE(d);
        CHECK(p.pad_qk == pq);
        CHECK(p.pad_v == pv);
    }
    CHECK(plan(cfg(132, "sm_80")).useful_flop_fraction() == Approx(264.0 / 280.0));
    // A wgmma row may pad V to 16 (d120: one 128-wide PV chunk instead of four).
    for (int d = 1; d <= 256; ++d) {
        CAPTURE(d);
        const auto p = plan(cfg(d, "sm_90a"));
        CHECK(p.pad_qk == (d + 15) / 16 * 16);
        CHECK(p.pad_v == (d + p.pv_step - 1) / p.pv_step * p.pv_step);
        CHECK((p.pv_step == 8 || (p.pv_step == 16 && hopper(p))));
    }
    CHECK(plan(cfg(120, "sm_90a")).pad_v == 128);
    CHECK(plan(cfg(132, "sm_90a")).pad_v == 136);
    CHECK(plan(cfg(132, "sm_90a"), "128,128,8,1,2,0,2,1,16").pad_v == 144);
    CHECK_THROWS_AS(plan(cfg(132, "sm_90a"), "128,128,8,1,2,0,2,1,12"), rtattn::ConfigError);
    for (const char* bad : {"128,128,8,1,2,0,2,1,8,2", "128,128,8,1,2,0,2,5", "128,128,8,1,2,3,2"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(plan(cfg(132, "sm_90a"), bad), rtattn::ConfigError);  // flags are 0 or 1, nothing else
    }
    // Whole numbers only, nothing after the last field, nothing that overflows: never a silent default.
    for (const char* bad : {"128,128,8,1,2,0,2,1,8,1garbage", "99999999999,128,8,1,2,0", "128,128,8,1,2,0,", "",
                            "128,128,8,1,2", "128,128,8,1,2,0,2,1,8,1,1"}) {
        CAPTURE(bad);
        if (*bad) CHECK_THROWS_AS(plan(cfg(128, "sm_90a"), bad), rtattn::ConfigError);
    }
    try {
        rtattn::plan::plan(cfg(128, "sm_90a"), {"99999999999,128,8,1,2,0", "RTATTN_TILE"});
        FAIL("no error");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "RTATTN_TILE");  // errors name where the override came from
        CHECK(std::string(e.what()).find("'99999999999'") != std::string::npos);
    }
}

TEST_CASE("every head dim plans on every arch within its shared memory", "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}) {
        const int limit = rtattn::arch::get(arch).smem_optin;
        for (int d = 1; d <= 256; ++d) {
            CAPTURE(arch, d);
            const auto p = plan(cfg(d, arch));
            CHECK(p.smem_bytes <= limit);
            CHECK(p.smem_bytes == p.family->smem_bytes(p));
            if (hopper(p)) CHECK(std::string(arch) == "sm_90a");
            CHECK(p.family->runs_on(rtattn::arch::get(arch)));
            CHECK(p.block_m == p.warps * p.m_tiles * 16);
            CHECK(p.block_n % 16 == 0);
            CHECK(p.head_dim_qk % p.vec_qk == 0);
            CHECK(p.head_dim_v % p.vec_v == 0);
            CHECK(!p.reason.empty());
        }
    }
}

TEST_CASE("swizzled wgmma tiles keep every K/V tile on a 1024-byte swizzle atom", "[plan]") {
    for (int dq : {16, 64, 100, 128, 132, 145, 160, 192, 200, 256})
        for (int dv = 8; dv <= 256; dv += 8) {
            CAPTURE(dq, dv);
            const auto p = plan(cfg(dq, "sm_90a", dv));
            if (!p.swizzle) continue;
            CHECK(p.block_n * p.pad_qk * 2 % 1024 == 0);
            CHECK(p.block_n * (p.wide_v ? (p.pad_v + 63) / 64 * 64 : p.pad_v) * 2 % 1024 == 0);
            CHECK(p.block_m * p.pad_qk * 2 % 1024 == 0);
        }
    // 96-key tiles of d_v 152 would end mid-atom: an override asking for them is refused, naming the tile that would
    // fit, rather than mis-address wgmma or run another tile than asked.
    try {
        plan(cfg(146, "sm_90a"), "128,96,8,1,2,0,2,1,8,0");
        FAIL("a 96-key override at pad 152 ran");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "tile_override");
        CHECK(std::string(e.what()).find("ask for 64") != std::string::npos);
    }
    const auto p = plan(cfg(146, "sm_90a"), "128,64,8,1,2,0,2,1,8,0");
    CHECK(p.block_n * p.pad_v * 2 % 1024 == 0);
    CHECK(p.block_n == 64);
}

TEST_CASE("the warp-specialized kernel adds a producer warpgroup and its barriers", "[plan]") {
    const auto ws = plan(cfg(128, "sm_90a"), "128,128,8,1,2,0,2");
    const auto coop = plan(cfg(128, "sm_90a"), "128,128,8,1,2,0,0");
    CHECK(producer(ws));
    CHECK(!producer(coop));
    CHECK(ws.threads() == coop.threads() + 128);
    // K/V full/empty barriers per stage, and (persistent) O's staging tile apart from Q/K/V
    CHECK(ws.persistent);
    CHECK(ws.smem_bytes == coop.smem_bytes + 4 * 2 * 8 + 2 * 128 * rtattn::geometry::padded_row(128));
    CHECK(ws.kernel().find("ping-pong") != std::string::npos);
    CHECK_THROWS_AS(plan(cfg(128, "sm_90a"), "128,128,8,1,1,0,2"), rtattn::ConfigError);  // the overlap needs 2 stages
    CHECK_THROWS_AS(plan(cfg(128, "sm_80"), "128,128,8,1,2,0,2"), rtattn::ConfigError);  // mma.sync: 0..1
}

TEST_CASE("the warp-specialized kernel is persistent, O staged in bytes of its own where they fit, else over Q",
          "[plan]") {
    namespace g = rtattn::geometry;
    const int optin = rtattn::arch::get("sm_90a").smem_optin;
    int apart = 0, over_q = 0;
    for (int d = 1; d <= 256; ++d) {
        INFO("d" << d);
        for (const bool causal : {false, true}) {
            auto c = cfg(d, "sm_90a", 0, 8);
            c.causal = causal;
            const auto p = plan(c);
            if (!producer(p)) {
                CHECK(!p.persistent);  // the grid-launched families
                CHECK(!p.o_apart);
                continue;
            }
            const auto bytes = [&](int staging) {
                return g::fwd_sm90_ws_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wide_v, staging,
                                                 p.shift_rows);
            };
            // Every tile of the table leaves room for O over Q; d148 and d156 spilled walking.
            CHECK(p.persistent == !(p.split_rows && p.pad_v == 160 && !p.o_apart));
            if (!p.persistent) continue;
            CHECK(p.o_apart == (bytes(g::kStageApart) <= optin));
            CHECK(p.smem_bytes == bytes(p.o_apart ? g::kStageApart : g::kStageOverQ));
            CHECK(p.smem_bytes <= optin);
            CHECK((p.kernel().find("O staged over Q") != std::string::npos) == !p.o_apart);
            if (d <= 128) CHECK(p.o_apart);  // d64 (192-row tiles) and d128 included
            // The K/V ring after Q (and O's tail) stays on 1024-byte swizzle atoms.
            CHECK(g::fwd_sm90_ws_q_bytes(p.pad_qk, p.pad_v, p.block_m, g::kStageOverQ) % 1024 == 0);
            apart += p.o_apart, over_q += !p.o_apart;
        }
    }
    CHECK(apart > 0);
    CHECK(over_q > 0);
    const auto d256 = plan(cfg(256, "sm_90a"));  // 192 KB of Q/K/V leave no room for O's own 66 KB
    CHECK(!d256.o_apart);
    CHECK(g::fwd_sm90_ws_q_bytes(256, 256, 128, g::kStageOverQ) == 128 * 264 * 2);  // O's rows are 264 wide
    CHECK(g::fwd_sm90_ws_q_bytes(240, 240, 128, g::kStageOverQ) == 62 * 1024);  // 128 x 248 x 2
    CHECK(g::fwd_sm90_ws_q_bytes(256, 256, 128, g::kStageApart) == 128 * 256 * 2);
}

TEST_CASE("mma.sync: FA2's 4-warp shape loads K and V apart, for head dims that load in 16-byte vectors", "[plan]") {
    for (const char* arch : {"sm_80", "sm_90"})
        for (int d = 65; d <= 128; ++d) {
            CAPTURE(arch, d);
            const auto p = plan(cfg(d, arch));
            CHECK(p.kv_apart == (d % 8 == 0));  // narrower vectors' loads need registers this shape does not have
            if (p.kv_apart) CHECK((p.warps == 4 && p.m_tiles == 2 && p.block_n == 64));
            CHECK((p.kernel().find("apart") != std::string::npos) == p.kv_apart);  // bench and info say so
        }
    CHECK(!plan(cfg(64, "sm_80")).kv_apart);
    CHECK(!plan(cfg(136, "sm_80")).kv_apart);
    CHECK(!plan(cfg(128, "sm_90a")).kv_apart);  // the wgmma families have their own pipelines
    CHECK(!plan(cfg(128, "sm_80"), "128,64,4,2,2,0,0").kv_apart);  // the override's schedule field
    CHECK(plan(cfg(64, "sm_80"), "128,64,4,2,2,0,1").kv_apart);
    CHECK(!plan(cfg(128, "sm_90a"), "128,128,8,1,2,0,1").kv_apart);
}

TEST_CASE("head dims off the 16 grid load whole rows shifted to aligned boxes, or split rows where faster", "[plan]") {
    // Split rows where their PV is narrower (V padded to 8 in one wide instruction) or, at d108 and d236 (12 mod 16 in
    // four head classes), all their boxes start 32-byte aligned and ran faster; shifted rows everywhere else that kv
    // heads make packed rows 16-byte multiples, 16 columns wider where the pad to 16 leaves too little room for the
    // shift (11, 13, 14, 15 mod 16; d251, 253, 254, 255: 272, past 256, on a row of their own with 32-key tiles).
    const std::set<int> split = {68, 72, 108, 136, 200, 236};
    for (int d = 1; d <= 256; ++d) {
        CAPTURE(d);
        const auto p = plan(cfg(d, "sm_90a", 0, 16));
        if (d % 16 == 0) {
            CHECK(!p.split_rows);
            CHECK(!p.shift_rows);
            continue;
        }
        CHECK(p.split_rows == (split.count(d) > 0));
        const bool shift = split.count(d) == 0;
        CHECK(p.shift_rows == shift);
        CHECK(producer(p) == (shift || p.split_rows));
        if (!p.shift_rows) continue;
        const bool room = !(d % 16 == 11 || d % 16 == 13 || d % 16 == 14 || d % 16 == 15);
        CHECK(rtattn::geometry::shift_fits(d, (d + 15) / 16 * 16) == room);
        const bool spilled = d == 162 || d == 226;  // at the pad to 16 (ptxas): 16 more columns too
        CHECK(p.pad_qk == (d + 15) / 16 * 16 + (room && !spilled ? 0 : 16));
        CHECK(p.pad_v == p.pad_qk);
        CHECK(rtattn::geometry::shift_fits(d, p.pad_qk));
        CHECK(p.swizzle);
        CHECK(!p.wide_v);
        CHECK(p.kernel().find("shifted rows") != std::string::npos);
        CHECK(p.smem_bytes == rtattn::kernels::fwd_sm90_ws().smem_bytes(p));
        if (p.pad_qk > 256) CHECK(p.block_n == 32);  // 272 columns: O at 136 fp32/thread
        // An override is run as asked or refused, naming the field: 48 keys x 272 columns are not whole 1024-byte
        // swizzle blocks (the tiles would narrow to 32 keys), 64 are.
        if (p.pad_qk > 256) {
            try {
                plan(cfg(d, "sm_90a", 0, 16), "128,48,8,1,3,0,1");
                FAIL("a 48-key override ran as another tile");
            } catch (const rtattn::ConfigError& e) {
                CHECK(e.field() == "tile_override");
                CHECK(std::string(e.what()).find("ask for 32") != std::string::npos);
            }
            CHECK(plan(cfg(d, "sm_90a", 0, 16), "128,64,8,1,2,0,1").block_n == 64);
        }
        // Shifted rows need packed K/V rows of 16-byte multiples: none with one kv head off the 8 grid. sm_80 shifts
        // by cp.async (the mma.sync forward: the next test case).
        CHECK(plan(cfg(d, "sm_90a", 0, 1)).shift_rows == (d % 8 == 0));
        CHECK(plan(cfg(d, "sm_80", 0, 16)).kernel().find("mma.sync") == 0);
    }
    // Split rows: TMA fills every panel but the last (64/32 wide), the threads 4 to 28 columns at the last one's start.
    for (int d : split) {
        CAPTURE(d);
        const auto p = plan(cfg(d, "sm_90a", 0, 2));
        const int tail = d - rtattn::geometry::split_main(p.pad_qk);
        CHECK(p.split_rows);
        CHECK((tail >= 4 && tail <= 28));
        CHECK(rtattn::geometry::split_main(p.pad_qk) % 32 == 0);
        CHECK(p.kernel().find("split rows") != std::string::npos);
    }
    // Packed causal sequences leave the three-consumer tile (its producer's 32 registers spilled).
    for (int d : {1, 33, 60}) {
        auto c = cfg(d, "sm_90a", 0, 8);
        c.varlen = c.causal = true;
        CHECK(plan(c).block_m == 128);
        c.causal = false;
        CHECK(plan(c).block_m == 192);
    }
    // Odd head dims with many of K's columns to zero leave the three-consumer tile (its producer has no zeroing
    // cache): 17 or more columns (16 more: d = 11, 13, 15 mod 16) always, 13-15 when causal, any with a window (192
    // rows spilled there); even dims keep it.
    for (int d = 1; d <= 64; ++d) {
        CAPTURE(d);
        for (int mask : {0, 1, 2}) {  // none, causal, a window
            auto c = cfg(d, "sm_90a", 0, 16);
            c.causal = mask == 1, c.local = mask == 2;
            const KernelPlan p = plan(c);
            if (p.pad_qk > 64) continue;  // the 128x128 row already (d59, 61, 62, 63)
            const int zeroed = p.pad_qk - d;
            const bool many = d % 2 == 1 && (zeroed > 16 || (mask == 1 && zeroed >= 13));
            const bool window = d % 2 == 1 && mask == 2;
            CHECK(p.block_m == (many || window ? 128 : 192));
            CHECK(p.warps == p.block_m / 16);
            CHECK((p.reason.find("many columns to zero") != std::string::npos) == (many && !window));
            CHECK((p.reason.find("odd head dim with a window") != std::string::npos) == window);
        }
    }
    CHECK(plan(cfg(43, "sm_90a", 0, 16)).block_m == 128);  // 21 columns
    CHECK(plan(cfg(53, "sm_90a", 0, 16)).block_m == 192);  // 11
    // Mixed head dims: each tensor's own pad; the rule looks at both.
    CHECK(plan(cfg(132, "sm_90a", 100, 8)).shift_rows);   // V's split would not be one wide instruction
    CHECK(plan(cfg(131, "sm_90a", 128, 8)).pad_v == 128);  // a multiple of 16 needs no room: 32-byte rows (or 16)
    CHECK(plan(cfg(141, "sm_90a", 64, 8)).pad_qk == 160);
    // PlanOptions::rows (RTATTN_ROWS): "split" plans as before shifted rows, "shift" wherever they fit.
    CHECK(plan(cfg(84, "sm_90a", 0, 2), "", "split").split_rows);
    CHECK(plan(cfg(84, "sm_90a", 0, 2), "", "split").pad_v == 96);  // V padded to 16 to split like K
    CHECK(plan(cfg(84, "sm_90a", 0, 1), "", "split").pad_v == 88);  // no split rows: V keeps its padding to 8
    CHECK(plan(cfg(116, "sm_90a", 0, 2), "", "split").family == &rtattn::kernels::fwd_sm90());
    CHECK(plan(cfg(132, "sm_90a", 0, 2), "", "shift").shift_rows);
    CHECK(plan(cfg(132, "sm_90a", 0, 2), "", "shift").pad_v == 144);
    CHECK(plan(cfg(140, "sm_90a", 0, 2), "", "shift").shift_rows);
    CHECK_THROWS_AS(plan(cfg(132, "sm_90a", 0, 2), "", "rotated"), rtattn::ConfigError);
    ::setenv("RTATTN_ROWS", "split ", 1);  // read where a Runtime's plan options are made; errors name the variable
    const auto from_env = rtattn::plan_options({});
    ::unsetenv("RTATTN_ROWS");
    CHECK(from_env.rows == "split ");
    try {
        rtattn::plan::plan(cfg(132, "sm_90a", 0, 2), from_env);
        FAIL("no error");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "RTATTN_ROWS");
    }
    CHECK(rtattn::plan_options({}).rows.empty());
    CHECK(!plan(cfg(132, "sm_90a", 0, 2), "128,128,8,1,2,0,0").split_rows);  // a cooperative plan has no producer
    CHECK(!plan(cfg(131, "sm_90a", 0, 8), "128,128,8,1,2,0,0").shift_rows);
    // A tile override keeps the rows' choice, and V's pad keeps the room the shift needs whatever its pv_step.
    CHECK(plan(cfg(131, "sm_90a", 0, 8), "128,128,8,1,2,0,2").shift_rows);
    CHECK(plan(cfg(131, "sm_90a", 0, 8), "128,128,8,1,2,0,2,1,8").pad_v == 144);  // 136 leaves 5: 16-byte shifts need 7
    CHECK(plan(cfg(235, "sm_90a", 0, 8), "128,64,8,1,2,0,2,1,16").pad_v == 256);  // 16 more columns
    CHECK(plan(cfg(235, "sm_90a", 0, 8), "128,64,8,1,2,0,2,1,16").shift_rows);
    CHECK(plan(cfg(132, "sm_90a", 0, 8), "128,128,8,1,2,0,2,1,8").pad_v == 144);
}

TEST_CASE("split rows take four head classes (32-byte boxes) where the tail pieces fit the producer's registers",
          "[plan]") {
    using namespace rtattn::geometry;
    CHECK(split_classes(4, 4, 128) == 4);     // d132: one 8-byte piece per row (rotations past 4 then fall back)
    CHECK(split_classes(12, 12, 128) == 4);   // d140: 3 pieces on 4 lanes, 4 passes per tensor
    CHECK(split_classes(8, 8, 128) == 4);     // d136 (8 mod 16)
    CHECK(split_classes(20, 20, 128) == 2);   // d84: 8 passes per tensor on 128-key tiles, 16-byte pieces instead
    CHECK(split_classes(28, 28, 128) == 2);   // d92, d156
    CHECK(split_classes(28, 28, 64) == 4);    // d220 on 64-key tiles: 4 passes per tensor
    CHECK(split_lanes(3) == 4);
    CHECK(split_lanes(7) == 8);
    CHECK(split_narrow_passes(12, 128) == 4);
}

TEST_CASE("kv heads enter a kernel only through whether packed K/V rows are 16-byte multiples", "[plan]") {
    using rtattn::plan::kernel_relevant;
    using rtattn::plan::kv_rows_16b;
    CHECK(kv_rows_16b(cfg(140, "sm_90a", 0, 2)));
    CHECK(!kv_rows_16b(cfg(140, "sm_90a", 0, 15)));
    CHECK(kv_rows_16b(cfg(128, "sm_90a", 0, 15)));
    CHECK(!kv_rows_16b(cfg(33, "sm_90a", 0, 4)));
    CHECK(kv_rows_16b(cfg(33, "sm_90a", 0, 8)));
    CHECK(kernel_relevant(cfg(140, "sm_90a", 0, 2)).to_json() == kernel_relevant(cfg(140, "sm_90a", 0, 16)).to_json());
    CHECK(kernel_relevant(cfg(140, "sm_90a", 0, 15)).to_json() != kernel_relevant(cfg(140, "sm_90a", 0, 16)).to_json());
    CHECK(kernel_relevant(cfg(128, "sm_90a", 0, 15)).to_json() == kernel_relevant(cfg(128, "sm_90a", 0, 16)).to_json());
    auto scaled = cfg(132, "sm_90a", 0, 4);
    scaled.softmax_scale = 0.5;
    CHECK(kernel_relevant(scaled).to_json() == kernel_relevant(cfg(132, "sm_90a", 0, 2)).to_json());
    CHECK(plan(cfg(140, "sm_90a", 0, 15)).family == &rtattn::kernels::fwd_sm90());
    CHECK(plan(cfg(140, "sm_90a", 0, 16)).family == &rtattn::kernels::fwd_sm90_ws());
}

TEST_CASE("softcap with ALiBi leaves the tiles that spilled: 128 query rows at pads <= 64, 64 keys at pad 160",
          "[plan]") {
    // Either transform alone keeps the table's tile (none spills); both at once take the smaller one where the
    // table's spilled (ptxas: d48..64 12-24 bytes with three consumers, pad 160 40-100 with 128 keys).
    struct Case {
        int d, rows, keys;  // the tile with both transforms
    };
    for (auto [d, rows, keys] : {Case{16, 128, 128}, {48, 128, 128}, {64, 128, 128}, {128, 128, 128}, {139, 128, 64},
                                 {144, 128, 128}, {148, 128, 64}, {160, 128, 64}}) {
        CAPTURE(d);
        const auto [none, cap, alibi, both] = transform_plans(cfg(d, "sm_90a", 0, 8));
        CHECK(alibi.block_m == cap.block_m);
        CHECK(alibi.block_n == cap.block_n);
        CHECK(cap.block_m == (d <= 64 ? 192 : 128));
        CHECK(cap.block_n == 128);
        CHECK(both.block_m == rows);
        CHECK(both.block_n == keys);
        CHECK(both.warps == rows / 16);
        const bool moved = rows != cap.block_m || keys != cap.block_n;
        CHECK((both.reason.find("softcap with ALiBi") != std::string::npos) == moved);
    }
}

TEST_CASE("ALiBi alone at pad 224 takes 80-key tiles (64 keys spilled there)", "[plan]") {
    for (int d = 177; d <= 256; ++d) {
        CAPTURE(d);
        for (bool causal : {false, true}) {
            auto c = cfg(d, "sm_90a", 0, 16);
            c.causal = causal;
            const auto [none, cap, alibi, both] = transform_plans(c);
            const bool moved = none.pad_qk == 224;  // d209..224 and d206 (shifted rows with 16 more columns)
            CHECK(alibi.block_n == (moved ? 80 : none.block_n));
            CHECK((alibi.reason.find("ALiBi: 80-key tiles") != std::string::npos) == moved);
            CHECK(both.block_n == none.block_n);  // with a cap: the table's 64 keys (80 spilled 24-68 bytes)
            CHECK(alibi.block_m == none.block_m);
        }
    }
}

TEST_CASE("sm_90a without TMA: odd head dims and d<=64 of 4 mod 8 take mma.sync, the others the cooperative kernel",
          "[plan]") {
    for (int heads : {1, 2}) {
        for (int d = 1; d <= 256; ++d) {
            CAPTURE(heads, d);
            const auto p = plan(cfg(d, "sm_90a", 0, heads));
            const bool tma = p.split_rows || p.shift_rows;
            const bool mma = !tma && (d % 2 == 1 || (d % 8 == 4 && d <= 64));
            CHECK((p.family == &rtattn::kernels::fwd_mma()) == mma);
            if (mma) CHECK(p.reason.find("mma.sync kernel beat") != std::string::npos);
        }
    }
    CHECK(plan(cfg(124, "sm_90a", 0, 1)).family == &rtattn::kernels::fwd_sm90());   // cooperative stayed ahead
    CHECK(plan(cfg(76, "sm_90a", 0, 1)).family == &rtattn::kernels::fwd_sm90());
    CHECK(plan(cfg(36, "sm_90a", 0, 2)).family == &rtattn::kernels::fwd_sm90_ws());  // shifted rows: TMA
    CHECK(plan(cfg(36, "sm_90a", 0, 1)).family == &rtattn::kernels::fwd_mma());
    CHECK(plan(cfg(50, "sm_90a")).family == &rtattn::kernels::fwd_sm90());  // 2 mod 4 without TMA: unmeasured
    CHECK(plan(cfg(254, "sm_90a", 0, 8)).family == &rtattn::kernels::fwd_sm90_ws());  // shifted rows in 272 columns
    CHECK(plan(cfg(254, "sm_90a", 0, 8)).pad_v == 272);
    // Past 256 only where d_qk = d_v: mixed pairs with a side there spilled (ptxas).
    CHECK(!plan(cfg(128, "sm_90a", 253, 8)).shift_rows);
    CHECK(!plan(cfg(251, "sm_90a", 200, 8)).shift_rows);
    CHECK(plan(cfg(251, "sm_90a", 200, 8)).family == &rtattn::kernels::fwd_mma());
    CHECK(plan(cfg(254, "sm_90a", 0, 1)).family == &rtattn::kernels::fwd_sm90());  // rows off 16 bytes: no TMA
    CHECK(plan(cfg(255, "sm_90a", 0, 1)).family == &rtattn::kernels::fwd_mma());
}

TEST_CASE("wide V tiles: one PV instruction where per-width panels would end in an 8-wide one", "[plan]") {
    for (int d = 1; d <= 256; ++d) {
        CAPTURE(d);
        const auto p = plan(cfg(d, "sm_90a", 0, 2));
        if (!p.wide_v) continue;
        CHECK(producer(p));
        CHECK(p.swizzle);
        CHECK(p.pad_v % 16 == 8);  // only where per-width panels would end in an 8-wide one
        if (p.split_rows) CHECK(rtattn::geometry::split_fits(d, rtattn::geometry::v_tile_cols(p.pad_v, true)));
        CHECK(p.kernel().find("one PV instruction") != std::string::npos);
    }
    const auto d136 = plan(cfg(136, "sm_90a", 0, 2));
    CHECK(d136.wide_v);
    CHECK(d136.smem_bytes ==
          rtattn::geometry::fwd_sm90_ws_smem_bytes(144, 136, d136.block_m, d136.block_n, d136.stages, false,
                                                   rtattn::geometry::kStageOverQ) +
              2 * d136.stages * d136.block_n * (192 - 136));
    CHECK(!plan(cfg(132, "sm_90a", 0, 2)).wide_v);  // shifted rows: V padded to 144, 128 + 16
    CHECK(!plan(cfg(100, "sm_90a", 0, 2)).wide_v);  // split rows: V's tail (36) would not fit the last panel
    CHECK(!plan(cfg(128, "sm_90a")).wide_v);  // one 128-wide instruction already
    CHECK(!plan(cfg(96, "sm_90a")).wide_v);   // 64 + 32: timed no faster as one instruction
    CHECK(plan(cfg(136, "sm_90a")).wide_v);
    CHECK(!plan(cfg(132, "sm_80")).wide_v);
    CHECK(!plan(cfg(132, "sm_90a"), "128,128,8,1,2,0,2,1,8,0").wide_v);
    CHECK(!plan(cfg(136, "sm_90a"), "128,128,8,1,2,0,0,1,8,1").wide_v);  // the cooperative kernel: per-width panels
}

TEST_CASE("smaller shared memory steps the plan down and says so", "[plan]") {
    const auto big = plan(cfg(256, "sm_90a"));
    const auto small = plan(cfg(256, "sm_86"));
    CHECK(big.stages == 2);
    CHECK(small.smem_bytes <= 99 * 1024);
    CHECK((small.stages < big.stages || small.block_n < big.block_n));
    CHECK(small.reason.find("stepped down") != std::string::npos);
    // A narrower key tile before a single stage: d128 on 99 KB keeps two stages of 32 keys (one of 64 spilled).
    for (const char* arch : {"sm_86", "sm_89"}) {
        const auto p = plan(cfg(128, arch));
        CHECK((p.block_m == 128 && p.block_n == 32 && p.stages == 2));
    }
}

TEST_CASE("vector width follows head dim divisibility", "[plan]") {
    CHECK(plan(cfg(128, "sm_80")).vec_qk == 8);
    CHECK(plan(cfg(132, "sm_80")).vec_qk == 4);
    CHECK(plan(cfg(130, "sm_80")).vec_qk == 2);
    CHECK(plan(cfg(17, "sm_80")).vec_qk == 1);
    CHECK(plan(cfg(192, "sm_80", 100)).vec_v == 4);
}

TEST_CASE("plan refuses what it cannot serve, naming the field", "[plan]") {
    auto field_of = [](const AttentionConfig& c) -> std::string {
        try {
            plan(c);
        } catch (const rtattn::ConfigError& e) {
            return e.field();
        }
        return "<none>";
    };
    CHECK(field_of(cfg(0, "sm_90a")) == "head_dim_qk");
    CHECK(field_of(cfg(257, "sm_90a")) == "head_dim_qk");
    CHECK(field_of(cfg(128, "")) == "arch");
    CHECK(field_of(cfg(128, "sm_100")) == "arch");
}

TEST_CASE("varlen configs plan as their dense twins, forward and backward, with their own kernels", "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
        for (int d : {1, 64, 100, 128, 132, 192, 256})
            for (bool causal : {false, true}) {
                AttentionConfig c = cfg(d, arch);
                c.causal = causal;
                const KernelPlan dense = plan(c);
                const auto dense_bwd = rtattn::plan::plan_backward(c);
                c.varlen = true;
                const KernelPlan packed = plan(c);
                const auto packed_bwd = rtattn::plan::plan_backward(c);
                CAPTURE(arch, d, causal);
                // The same family and tile (varlen is addressing, not a tile choice), a different kernel source.
                CHECK(packed.family == dense.family);
                CHECK(packed.block_m == dense.block_m);
                CHECK(packed.block_n == dense.block_n);
                CHECK(packed.stages == dense.stages);
                CHECK(packed.varlen);
                CHECK(packed_bwd.block_n == dense_bwd.block_n);
                CHECK(rtattn::plan::plan_json(packed).find("\"varlen\":true") != std::string::npos);
                const auto src = rtattn::kernels::render_plan(packed);
                CHECK(src.stub.find("kVarlen = true") != std::string::npos);
                CHECK(src.stub != rtattn::kernels::render_plan(dense).stub);
                CHECK(rtattn::kernels::render_backward(packed_bwd).stub.find("kVarlen = true") != std::string::npos);
            }
}

TEST_CASE("a prefill against a paged cache plans on the warp-specialized kernel on sm_90a where its rows go by TMA, "
          "else on mma.sync, and has no backward",
          "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
        for (int d : {1, 64, 128, 132, 256})
            for (int heads : {1, 8})
                for (bool varlen : {false, true}) {
                    AttentionConfig c = cfg(d, arch, 0, heads);
                    c.paged_kv = true;
                    c.varlen = varlen;
                    const KernelPlan p = plan(c);
                    CAPTURE(arch, d, heads, varlen);
                    // TMA rows: head dims of 8s, or packed rows of 16-byte multiples (d1 x 8 heads, d132 x 8 heads,
                    // shifted rows). Never the cooperative wgmma kernel: its loads do not gather pages.
                    const bool tma = std::string(arch) == "sm_90a" && (d % 8 == 0 || heads == 8);
                    CHECK(p.family == (tma ? &rtattn::kernels::fwd_sm90_ws() : &rtattn::kernels::fwd_mma()));
                    if (tma) {
                        CHECK_FALSE(p.split_rows);  // a page looked up per row's tail spilled; shifted rows per box
                        CHECK((!p.shift_rows || p.block_m <= 128));  // three consumers' producer: 32 registers
                        CHECK((p.persistent || !p.o_apart));  // O's own bytes only where the plan sized them
                        CHECK(rtattn::geometry::paged_box_rows(p.block_n, 1024) >= rtattn::geometry::kMinPagedBox);
                    }
                    CHECK(p.paged_kv);
                    CHECK(p.kernel().find("paged") != std::string::npos);
                    CHECK(rtattn::kernels::render_plan(p).stub.find("kPaged = true") != std::string::npos);
                    CHECK(p.smem_bytes <= rtattn::arch::get(arch).smem_optin);
                }
    // d64 of 8s keeps three consumer warpgroups (its producer issues whole rows and did not spill).
    AttentionConfig d64 = cfg(64, "sm_90a", 0, 8);
    d64.paged_kv = true;
    CHECK(plan(d64).block_m == 192);
    // A 112-key tile (d192) meets pages on 16-row bounds: boxes of at most 16 rows.
    AttentionConfig d192 = cfg(192, "sm_90a", 0, 8);
    d192.paged_kv = true;
    CHECK(plan(d192).block_n == 112);
    CHECK(rtattn::geometry::paged_box_rows(112, 1024) == 16);
    CHECK(rtattn::geometry::paged_box_rows(128, 1024) == 128);
    CHECK(rtattn::geometry::paged_box_rows(128, 16) == 16);
    // The cooperative kernel by a tile override (schedule 0) is refused for a paged cache, naming the field.
    try {
        plan(d64, "128,128,8,1,2,0,0");
        FAIL("a paged config planned on the cooperative kernel");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "tile_override");
    }
    AttentionConfig c = cfg(128, "sm_90a");
    c.paged_kv = true;
    try {
        rtattn::plan::plan_backward(c);
        FAIL("a paged config got a backward plan");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "paged_kv");
    }
}

TEST_CASE("decode configs plan from the decode table on every arch, and have no backward", "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"})
        for (int d : {1, 64, 100, 128, 132, 192, 256})
            for (bool paged : {false, true}) {
                AttentionConfig c = cfg(d, arch);
                c.decode = true;
                c.paged_kv = paged;
                const KernelPlan p = plan(c);
                CAPTURE(arch, d, paged);
                CHECK(p.family == &rtattn::kernels::dec_mma());
                CHECK(p.paged_kv == paged);
                CHECK(p.pad_v % 16 == 0);  // V pads to whole 16-column pairs in decode
                CHECK(p.block_m == 16 * p.m_tiles);
                CHECK(p.block_n % (16 * p.warps) == 0);  // every warp takes whole 16-key steps
                CHECK(p.stages >= 2);
                CHECK(p.smem_bytes <= rtattn::arch::get(arch).smem_optin);
                CHECK(!p.reason.empty());
            }
    // d<=64's deepest ring is for two CTAs per SM: taken on sm_90 (228 KB), not where one CTA would hold an SM.
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"}) {
        AttentionConfig d64 = cfg(64, arch);
        d64.decode = true;
        const KernelPlan p = plan(d64);
        CAPTURE(arch, p.smem_bytes);
        CHECK(p.stages == (rtattn::arch::get(arch).major == 9 ? 5 : 4));
        if (p.stages == 5) CHECK(2 * (p.smem_bytes + 1024) <= rtattn::arch::get(arch).smem_optin + 1024);
    }
    AttentionConfig c = cfg(128, "sm_90");
    c.decode = true;
    try {
        rtattn::plan::plan_backward(c);
        FAIL("a decode config got a backward plan");
    } catch (const rtattn::ConfigError& e) {
        CHECK(e.field() == "decode");
    }
    // A tile override replaces the decode table's row (a timing knob), checked as the kernel needs it.
    const KernelPlan o = plan(c, "32,128,4,2,2");
    CHECK((o.block_m == 32 && o.block_n == 128 && o.warps == 4 && o.m_tiles == 2 && o.stages == 2));
    CHECK(o.reason.find("override") != std::string::npos);
    for (const char* bad : {"128,64,4,2,2,0" /* block_m != 16 x m_tiles */, "16,64,3,1,2" /* odd warps */,
                            "16,48,4,1,2" /* 12 keys a warp */, "16,64,4,1,1" /* one stage */,
                            "16,64,4,1,3,1" /* Q in registers */, "16,64,4,1" /* too few */,
                            "16,256,4,1,8" /* shared memory */, "16,64,4,1,2,0,1" /* too many */}) {
        CAPTURE(bad);
        try {
            plan(c, bad);
            FAIL("a bad decode override was taken");
        } catch (const rtattn::ConfigError& e) {
            CHECK(e.field() == "tile_override");
        }
    }
}

TEST_CASE("decode splits fill whole waves of the device's slots, a grid of more than a wave included", "[plan]") {
    auto splits = [](int hq, int hkv, int batch, int keys, int slots, int asked = 0) {
        AttentionConfig c = cfg(128, "sm_90a");
        c.decode = true;
        c.num_heads_q = hq, c.num_heads_kv = hkv;
        const KernelPlan p = plan(c);
        return p.family->num_splits(p, c, {batch, 1, keys, asked, slots});
    };
    // 2 CTAs on each of 132 SMs: 264 slots.
    CHECK(splits(16, 16, 64, 4096, 264) == 1);  // 1024 CTAs: 3.9 waves, 97% full
    CHECK(splits(30, 5, 64, 4096, 264) == 4);   // 320 CTAs: 1.2 waves (61%); 4 splits 4.8 (97%)
    CHECK(splits(24, 3, 64, 4096, 264) == 4);   // 192: 2 splits 73%, 4 splits 97%
    CHECK(splits(16, 1, 8, 32768, 264) == 32);  // 8 CTAs: 32 splits fill a wave
    CHECK(splits(16, 1, 8, 256, 264) == 1);     // 4 key tiles: too few to split
    CHECK(splits(16, 1, 8, 32768, 264, 5) == 5);  // the caller's count stands
}

TEST_CASE("the mma.sync forward rotates 4 mod 8 rows that do not shift where that measured faster", "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"}) {
        CAPTURE(arch);
        for (int d = 12; d <= 252; d += 8) {
            CAPTURE(d);
            const bool measured_faster = d >= 148 || d == 36 || d == 68 || d == 132;
            CHECK(plan(cfg(d, arch)).rotate_rows == measured_faster);
            CHECK(plan(cfg(d, arch), "", "rotate").rotate_rows);  // RTATTN_ROWS=rotate: wherever it applies
            CHECK_FALSE(plan(cfg(d, arch), "", "plain").rotate_rows);
        }
        for (int d : {64, 128, 130, 131, 256}) CHECK_FALSE(plan(cfg(d, arch)).rotate_rows);  // 16-byte rows, or none
        CHECK(plan(cfg(100, arch, 132)).rotate_rows);  // either tensor's rule
        AttentionConfig paged = cfg(132, arch);
        paged.paged_kv = true;  // per-row page lookups beside the rotation spilled
        CHECK_FALSE(plan(paged).rotate_rows);
        CHECK_FALSE(plan(paged, "", "rotate").rotate_rows);
    }
    CHECK_FALSE(plan(cfg(132, "sm_90a", 0, 2)).rotate_rows);  // the Hopper families load rows their own ways
}

TEST_CASE("the mma.sync forward shifts rows off the 8 grid where packed rows are 16-byte multiples", "[plan]") {
    for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90"}) {
        CAPTURE(arch);
        for (int d = 1; d <= 256; ++d) {
            CAPTURE(d);
            // Room for the shift (up to 7 columns at odd d) within the widest pad: d <= 249.
            const bool fits = d + 8 - (d % 8 == 0 ? 8 : d % 4 == 0 ? 4 : d % 2 == 0 ? 2 : 1) <= 256;
            const auto p = plan(cfg(d, arch, 0, 8));  // 8 kv heads: packed rows of 16-byte multiples
            CHECK(p.shift_rows == (d % 8 != 0 && fits));
            CHECK_FALSE(p.rotate_rows);
            CHECK(p.pad_qk == (p.shift_rows ? rtattn::geometry::shifted_pad(d, 16) : rtattn::geometry::round_up(d, 16)));
            CHECK(p.pad_v == (p.shift_rows ? rtattn::geometry::shifted_pad(d, 8) : rtattn::geometry::round_up(d, 8)));
            CHECK(plan(cfg(d, arch, 0, 8), "", "shift").shift_rows == p.shift_rows);
            CHECK_FALSE(plan(cfg(d, arch, 0, 8), "", "plain").shift_rows);
            CHECK_FALSE(plan(cfg(d, arch, 0, 8), "", "rotate").shift_rows);
            if (d % 8 != 0) CHECK_FALSE(plan(cfg(d, arch)).shift_rows);  // one kv head: packed rows off 16 bytes
        }
        CHECK(plan(cfg(129, arch, 0, 8)).pad_qk == 144);
        CHECK(plan(cfg(129, arch, 0, 8)).pad_v == 136);
        CHECK(plan(cfg(131, arch, 0, 8)).pad_v == 144);  // 131 + 7 columns
        const auto mixed = plan(cfg(129, arch, 128, 8));  // only K's rows shift
        CHECK((mixed.shift_rows && mixed.pad_qk == 144 && mixed.pad_v == 128));
        CHECK(plan(cfg(1, arch, 0, 8)).kernel() == "mma.sync, shifted rows");
        AttentionConfig paged = cfg(129, arch, 0, 8);
        paged.paged_kv = true;  // rows through a block table keep their vectors
        CHECK_FALSE(plan(paged).shift_rows);
        CHECK_FALSE(plan(paged, "", "shift").shift_rows);
    }
    // A tile override keeps the room of shifted rows.
    CHECK(plan(cfg(129, "sm_80", 0, 8), "128,64,8,1,2,0").pad_v == 136);
}

TEST_CASE("sm_90a's backward is a wgmma family at pads 32..256, the mma.sync one elsewhere", "[plan][bwd]") {
    for (int d = 1; d <= 256; ++d) {
        CAPTURE(d);
        AttentionConfig c = cfg(d, "sm_90a");
        const auto p = rtattn::plan::plan_backward(c);
        // Head dims of 8 at pads 32..128 and of 4 at pad 144: the warp-specialized kernel (TMA boxes, from the
        // 16-byte boundary before d132's and d140's rows); the others of pads 80, 96, 128 and 144: bwd_sm90. Head
        // dims of 8 past 144: the warp-specialized kernel's wide form, 64 keys a CTA.
        const bool wide = d > 144 && d % 8 == 0;
        CHECK((p.family == &rtattn::kernels::bwd_sm90_ws() && p.block_n == 64) == wide);
        if (wide) {
            CHECK(p.block_m == 64);
            CHECK(p.threads() == 384);
            CHECK(p.stages == 2);
            CHECK(p.smem_bytes == rtattn::geometry::bwd_sm90_ws_smem_bytes(
                                      p.pad_qk, p.pad_v, 64, 64, p.stages,
                                      rtattn::geometry::bwd_sm90_ws_dq_lag(d, d, p.pad_qk, p.pad_v, 64, 64)));
            CHECK(p.smem_bytes <= rtattn::arch::get("sm_90a").smem_optin);
        }
        const bool ws = (d > 16 && d <= 128 && d % 8 == 0) || (d > 128 && d <= 144 && d % 4 == 0) || wide;
        const bool wgmma = !ws && ((d > 64 && d <= 96) || (d > 112 && d <= 144));
        CHECK((p.family == &rtattn::kernels::bwd_sm90_ws()) == ws);
        CHECK((p.family == &rtattn::kernels::bwd_sm90()) == wgmma);
        if ((ws || wgmma) && !wide) {
            CHECK(p.block_m == (ws && d <= 64 ? 128 : 64));  // 128 queries a step where the GEMMs are small
            CHECK(p.block_n == 128);
            CHECK(p.threads() == (ws ? 384 : 256));
            // Lagged dQ (two more barrier pairs) at 64 queries a step with accumulators of up to 136 columns.
            const bool lag = ws && p.block_m == 64 && d <= 136;
            if (ws) CHECK(rtattn::geometry::bwd_sm90_ws_dq_lag(d, d, p.pad_qk, p.pad_v, p.block_m, 128) == lag);
            CHECK(p.smem_bytes == (ws ? rtattn::geometry::bwd_sm90_ws_smem_bytes(p.pad_qk, p.pad_v, p.block_m, 128,
                                                                                p.stages, lag)
                                      : rtattn::geometry::bwd_sm90_smem_bytes(p.pad_qk, p.pad_v, 64, 128, p.stages)));
            CHECK(p.smem_bytes <= rtattn::arch::get("sm_90a").smem_optin);
        }
        CHECK(rtattn::plan::plan_backward(cfg(d, "sm_90")).family == &rtattn::kernels::bwd_mma());  // no wgmma
    }
    // Pad 144 serves d_qk = d_v only (other pairs spilled); pad 128 any pair, the warp-specialized kernel where both
    // are multiples of 8 (dQ splits at column 64, or in halves up to it).
    auto family_of = [](int dq, int dv) {
        AttentionConfig c = cfg(dq, "sm_90a");
        c.head_dim_v = dv;
        return rtattn::plan::plan_backward(c).family;
    };
    CHECK(family_of(132, 128) == &rtattn::kernels::bwd_mma());
    CHECK(family_of(140, 144) == &rtattn::kernels::bwd_mma());
    CHECK(family_of(120, 128) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(124, 128) == &rtattn::kernels::bwd_sm90());
    CHECK(family_of(64, 128) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(60, 128) == &rtattn::kernels::bwd_sm90());
    CHECK(family_of(128, 64) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(rtattn::plan::plan_backward(cfg(128, "sm_90a", 64)).family == &rtattn::kernels::bwd_sm90_ws());
    // The wide form: each pad 64, 128 or 160..256, one past 144 (each of its halves' chunks inside a panel), head
    // dims of 8.
    CHECK(family_of(192, 128) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(192, 64) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(256, 192) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(240, 160) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(192, 96) == &rtattn::kernels::bwd_mma());
    CHECK(family_of(176, 144) == &rtattn::kernels::bwd_mma());
    CHECK(family_of(160, 160) == &rtattn::kernels::bwd_sm90_ws());
    CHECK(family_of(188, 188) == &rtattn::kernels::bwd_mma());  // not of 8
    CHECK(rtattn::plan::plan_backward(cfg(192, "sm_90a"), "64,64,8,0,0,0,1").stages == 1);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(192, "sm_90a"), "64,128,8,0,0,0,2"), rtattn::ConfigError);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(192, "sm_90a"), "128,64,8,0,0,0,2"), rtattn::ConfigError);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(128, "sm_90a"), "64,64,8,0,0,0,2"), rtattn::ConfigError);
    // RTATTN_BWD_TILE on the wgmma families: 64 query rows, 64 keys per warpgroup (the warp-specialized one: two).
    CHECK(rtattn::plan::plan_backward(cfg(128, "sm_90a"), "64,128,8,0,0,0,1").stages == 1);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(128, "sm_90a"), "128,128,8,0,0,0,1"), rtattn::ConfigError);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(128, "sm_90a"), "64,64,4,0,0,0,1"), rtattn::ConfigError);
    CHECK(rtattn::plan::plan_backward(cfg(124, "sm_90a"), "64,128,8,0,0,0,2").stages == 2);
    // The warp-specialized kernel at pads up to 64: 128 query rows a step by default, 64 on request; 128 refused past.
    CHECK(rtattn::plan::plan_backward(cfg(64, "sm_90a"), "64,128,8,0,0,0,2").block_m == 64);
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(80, "sm_90a"), "128,128,8,0,0,0,2"), rtattn::ConfigError);
    // Deterministic turn counters: one per 64 rows at most (the 128-row plan's fallback kernel walks 64-row blocks).
    const auto p64 = rtattn::plan::plan_backward(cfg(64, "sm_90a"));
    const auto w64 = p64.workspace(2, 3, 200);
    CHECK(w64.m_pad == 256);
    CHECK(w64.bytes - w64.dq_sem >= std::size_t(2 * 3 * 256 / 64 * 4));
    CHECK_THROWS_AS(rtattn::plan::plan_backward(cfg(124, "sm_90a"), "64,96,8,0,0,0,1"), rtattn::ConfigError);
}

TEST_CASE("the wide backward's halves cover the tile once, each chunk inside one panel", "[plan][bwd]") {
    namespace g = rtattn::geometry;
    for (int pad = 64; pad <= 256; pad += 16) {
        if (!g::bwd_sm90_ws_wide(pad, 256)) continue;
        CAPTURE(pad);
        const int half = pad / 2, whole = pad / 64 * 64;
        // The panel a tile column lies in (sm90::TileLayout): 64-wide ones, then a 32- and a 16-wide one.
        auto panel = [&](int c) { return c < whole ? c / 64 : c < whole + (pad % 64 & 32) ? 100 : 200; };
        // A half's chunks as sm90::for_each_chunk lays them out: 128, or 64 then 32, 16, 8 where present.
        std::vector<std::pair<int, int>> chunks;  // (first column, width)
        int at = 0;
        for (int w : {128, 64, 32, 16, 8})
            if (g::has_chunk(half, w))
                for (int i = 0; i < (w == 128 ? half / 128 : 1); ++i) chunks.push_back({at, w}), at += w;
        REQUIRE(at == half);
        std::vector<int> seen(pad, 0);
        for (auto [c0, w] : chunks)
            for (int wg = 0; wg < 2; ++wg) {
                CAPTURE(c0, w, wg);
                const int first = g::bwd_sm90_ws_wide_col(pad, wg, c0);
                CHECK(first == g::bwd_sm90_ws_wide_chunk(pad, wg, w));
                for (int j = c0; j < c0 + w; ++j) {
                    const int c = g::bwd_sm90_ws_wide_col(pad, wg, j);
                    REQUIRE((c >= 0 && c < pad));
                    ++seen[c];
                    CHECK(c == first + j - c0);  // contiguous
                    // inside the first column's panel (a 128-wide chunk: two whole 64-column ones from a boundary)
                    if (w == 128) CHECK((first % 64 == 0 && c < whole));
                    else CHECK(panel(c) == panel(first));
                }
                // Both warpgroups' chunks of a width in the same kind of panel: one descriptor form, moved.
                CHECK((panel(first) < 100) == (panel(g::bwd_sm90_ws_wide_chunk(pad, 0, w)) < 100));
                CHECK(panel(first) / 100 == panel(g::bwd_sm90_ws_wide_chunk(pad, 0, w)) / 100);
            }
        for (int c = 0; c < pad; ++c) CHECK(seen[c] == 1);
    }
}

TEST_CASE("backward workspace sizes that would wrap 64 bits are refused", "[plan][bwd]") {
    rtattn::AttentionConfig c;
    c.head_dim_qk = 256, c.arch = "sm_90";
    const auto p = rtattn::plan::plan_backward(c);
    CHECK(p.workspace(64, 64, 1 << 20).bytes > (std::size_t(1) << 42));  // large, still a size
    // 65535 x 65535 x 2^30 rows of 1 KB each wrapped size_t and looked small; anything past 2^60 bytes is refused.
    CHECK_THROWS_AS(p.workspace(65535, 65535, 1 << 30), rtattn::ArgumentError);
    CHECK_THROWS_AS(p.workspace(65535, 65535, 1 << 20), rtattn::ArgumentError);
}

TEST_CASE("the resolver's memo is bounded, and a bad scale never reaches it", "[plan][resolver]") {
    rtattn::Resolver r{rtattn::plan::PlanOptions{}};
    rtattn::AttentionConfig c;
    c.head_dim_qk = 64, c.arch = "sm_80";
    // Each scale is a distinct config of one kernel: ~6.5 KB each, kept forever before.
    for (int i = 0; i < 10000; ++i) {
        c.softmax_scale = 0.01 + i * 1e-6;
        CHECK(r.resolve(c)->config.softmax_scale == c.softmax_scale);
    }
    CHECK(r.memo_entries() <= 2 * 4096);
    c.softmax_scale.reset();
    (void)r.resolve(c);
    c.softmax_scale = std::nan("");
    CHECK_THROWS_AS(r.resolve(c), rtattn::ConfigError);
    CHECK_THROWS_AS(r.resolve_backward(c), rtattn::ConfigError);
}
