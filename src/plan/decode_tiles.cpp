// The decode tile table: rows per CTA, keys per tile, warps and ring depth per padded head dim, a reason on every
// row. Decode reads every K/V byte once and does little math on it, so a row is about bytes in flight per SM and
// CTAs per SM, not MMA shape.
#include "util/format.hpp"

#include "common/geometry.h"
#include "core/errors.hpp"
#include "kernels/forward.hpp"
#include "plan/forward_tiles.hpp"
#include "util/text.hpp"

namespace rtattn::plan {

namespace {

struct DecodeRow {
    int max_pad;  // largest padded head dim (the larger of the QK and V pads) the row serves
    int block_m;  // packed (query head, token) rows per CTA: 16 x m_tiles
    int block_n;  // keys per K/V tile, split evenly across the warps (16 or more each)
    int warps;
    int stages;   // K/V ring depth
    int min_ctas; // the row applies only where an SM holds this many of its CTAs (1: wherever one fits)
    const char* why;
};

// The first row whose pad fits and whose shared memory the arch has wins, so each pad lists its rows from the most to
// the least shared memory.
constexpr DecodeRow kDecodeRows[] = {
    {64, 16, 64, 4, 5, 2,
     "d<=64 where an SM holds two such CTAs (sm_90): 64-key tiles (16 per warp), 5 in the ring (92 KB): 4 tiles in "
     "flight per CTA, 2 CTAs per SM. H200, GQA 32:8 d64, B=64 x 4k / 8 x 32k / 1 x 128k: 3818-3834 / 3699-3715 / "
     "3283-3292 GB/s against 3582-3644 / 3644-3706 / 3196-3200 with 4 in the ring at 3 CTAs per SM (the 3 CTAs' "
     "1.3 waves need 3-4 splits and the combine); d56 -2..+1%, d48 equal"},
    {64, 16, 64, 4, 4, 1,
     "d<=64: 64-key tiles (16 per warp), 4 in the ring (74 KB): 3 tiles in flight per CTA (sm_80: 2 CTAs per SM)"},
    {128, 16, 64, 4, 3, 1,
     "d<=128: 64-key tiles (16 per warp), 3 in the ring (109 KB): 2 CTAs per SM keep 4 tiles (139 KB) in flight per "
     "SM (H200, GQA 32:8: 91-93% of the copy bandwidth at B=64 x 4k and B=8 x 32k, 86% at B=1 x 128k)"},
    {128, 16, 64, 4, 2, 1, "d<=128 on ~100 KB (sm_86, sm_89): 2 in the ring"},
    {192, 16, 64, 4, 2, 1,
     "d<=192: 2 in the ring (83-109 KB), so two CTAs share an SM (H200, MHA 16 heads, B=64 x 4k: d192 99% of the copy "
     "bandwidth vs 80% on the d<=256 row's one CTA per SM, d160 91%; 4 in the ring on one CTA did not help, so more "
     "warps per SM, not more bytes in flight, is what the wider rows lacked). d132 (padded 144): 71% on 8-byte vectors, "
     "89% as rotated 16-byte rows (dec/mma.cuh)"},
    {256, 16, 64, 4, 3, 1,
     "d<=256: 64-key tiles, 3 in the ring (211 KB, one CTA per SM on sm_90; H200: 93% of the copy bandwidth at "
     "B=64 x 4k, 91% at B=1 x 128k)"},
    {256, 16, 64, 4, 2, 1, "d<=256 on 164 KB (sm_80): 2 in the ring"},
    {256, 16, 32, 2, 2, 1, "d<=256 on ~100 KB (sm_86, sm_89): 32-key tiles on 2 warps, 2 in the ring"},
};

}  // namespace

void choose_decode_tile(KernelPlan& p, const arch::Arch& a) {
    const int pad = std::max(p.pad_qk, p.pad_v);
    p.family = &kernels::dec_mma();
    for (const DecodeRow& row : kDecodeRows) {
        if (pad > row.max_pad) continue;
        p.block_m = row.block_m, p.block_n = row.block_n, p.warps = row.warps, p.stages = row.stages;
        p.m_tiles = row.block_m / 16;
        p.pv_step = 16;
        p.smem_bytes = p.family->smem_bytes(p);
        // An SM holds its opt-in maximum plus the 1 KB the driver reserves per CTA, on every arch the library knows.
        if (p.smem_bytes > a.smem_optin || (a.smem_optin + 1024) / (p.smem_bytes + 1024) < row.min_ctas) continue;
        p.reason = row.why;
        return;
    }
    throw ConfigError("arch", util::format("no decode tile fits d{}/{} in the {} B of shared memory of {}",
                                           p.head_dim_qk, p.head_dim_v, a.smem_optin, a.name));
}

void apply_decode_tile_override(KernelPlan& p, const arch::Arch& a, const std::string& text, const std::string& field) {
    static constexpr const char* kFields[] = {"block_m", "block_n", "warps", "m_tiles", "stages", "q_in_regs"};
    int v[6] = {};
    const int n = parse_tile_fields(text, field, kFields, 6, v);
    if (n < 5)
        throw ConfigError(field, util::format("{} is not block_m,block_n,warps,m_tiles,stages[,q_in_regs] (a decode "
                                              "plan)", util::quoted(text)));
    const auto [bm, bn, w, mt, st, qr] = v;
    if (mt < 1 || mt > 4 || bm != 16 * mt)
        throw ConfigError(field, util::format("block_m ({}) must equal 16 x m_tiles ({}, 1..4) in a decode plan", bm, mt));
    // Even warps: rows that alternate rotation give half the warps to each key parity (dec/mma.cuh).
    if (w < 2 || w > 16 || w % 2 != 0)
        throw ConfigError(field, util::format("warps ({}) must be even, 2..16, in a decode plan", w));
    if (bn < 16 * w || bn > 256 || bn % (16 * w) != 0)
        throw ConfigError(field, util::format("block_n ({}) must be a multiple of 16 x warps ({}) up to 256 in a "
                                              "decode plan: each warp takes 16-key steps", bn, 16 * w));
    if (st < 2 || st > 8) throw ConfigError(field, util::format("stages ({}) must be 2..8 in a decode plan", st));
    if (qr != 0) throw ConfigError(field, util::format("q_in_regs ({}) must be 0 in a decode plan", qr));
    p.block_m = bm, p.block_n = bn, p.warps = w, p.m_tiles = mt, p.stages = st;
    p.smem_bytes = p.family->smem_bytes(p);
    if (p.smem_bytes > a.smem_optin)
        throw ConfigError(field, util::format("{} needs {} B of shared memory; {} has {}", util::quoted(text),
                                              p.smem_bytes, a.name, a.smem_optin));
    p.reason = util::format("{} override ({})", field, util::escaped(text));
    p.overridden = true;
}

}  // namespace rtattn::plan
