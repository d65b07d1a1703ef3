#include "plan/plan.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "rtattn/errors.hpp"

namespace rtattn::plan {

namespace {

constexpr ArchInfo kArchTable[] = {
    {"sm_80", 80, 163 * 1024},   // A100: 164 KB per SM, 163 KB per block
    {"sm_86", 86, 99 * 1024},    // GA10x: 100 KB per SM
    {"sm_89", 89, 99 * 1024},    // Ada
    {"sm_90", 90, 227 * 1024},   // H100/H200: 228 KB per SM
    {"sm_90a", 90, 227 * 1024},
};

// The tile table. A row serves padded head dims up to `max_pad_qk` (the larger of the QK and V pads decides).
struct TileRow {
    bool wgmma;      // Hopper warpgroup MMA kernel (sm_90a only) vs. mma.sync kernel (every arch)
    int max_pad;     // largest padded head dim this row serves
    int block_m;     // query rows per CTA = warps * m_tiles * 16
    int block_n;     // keys per K/V tile
    int warps;
    int m_tiles;     // 16-row MMA tiles per warp: more tiles reuse each K/V fragment, at a register cost
    int stages;      // K/V cp.async ring depth
    bool q_in_regs;  // Q fragments loaded once into registers (vs. re-read from shared memory every K tile)
    bool swizzle;    // wgmma only: swizzled column panels (else interleaved 8x8 cores throughout)
    const char* why;
};

// Rows were chosen by timing candidates on an H200 (tools/bench/tile_sweep.sh, bf16, S=16k; docs/PERFORMANCE.md).
// The first row whose kernel the arch can run and whose max_pad covers the head dim wins.
constexpr TileRow kTiles[] = {
    // sm_90a: wgmma, 2 warpgroups x 64 rows, Q and K through shared-memory descriptors, P from registers.
    {true, 64, 128, 64, 8, 1, 2, false, true,
     "sm_90a, d<=64: wgmma with swizzled tiles; 64-key tiles (272/272 TFLOPS at d64 vs 243/238 with 128 keys and "
     "272/256 for mma.sync)"},
    {true, 96, 128, 64, 8, 1, 2, false, true,
     "sm_90a, d<=96: wgmma with swizzled tiles, 64-key tiles (283/269 at d96 vs 260/250 with 128 keys, 257/248 "
     "mma.sync)"},
    {true, 128, 128, 128, 8, 1, 2, false, true,
     "sm_90a, d<=128: wgmma with swizzled tiles, 128-key tiles (327-347 TFLOPS at d128 vs 281 for mma.sync, 231 "
     "with interleaved tiles)"},
    {true, 144, 128, 128, 8, 1, 2, false, false,
     "sm_90a, 128<d<=144: wgmma with interleaved tiles: at d132 they ran 254 TFLOPS against 206 for the swizzled "
     "panels (whose 16- and 8-wide tail panels this width needs) and 221 for mma.sync"},
    {true, 256, 128, 64, 8, 1, 2, false, true,
     "sm_90a, d<=256: wgmma with swizzled tiles; 64-key tiles leave registers for O (<=128 fp32/thread) and fit "
     "two stages in 227 KB (d160 279, d192 316-356, d256 372 TFLOPS vs 240/250/268 for mma.sync)"},
    // Every arch: mma.sync m16n8k16.
    {false, 64, 128, 64, 4, 2, 2, true, false,
     "d<=64: accumulators are small, so two m-tiles per warp halve K/V shared-memory reads per MMA"},
    {false, 144, 128, 128, 8, 1, 2, true, false,
     "d<=144: 8 warps x 16 rows keep O (<=72 fp32/thread) and Q fragments in registers; 128-key tiles halve the "
     "per-tile softmax and barrier overhead (+12% over 64 at d128)"},
    {false, 192, 128, 64, 8, 1, 2, false, false,
     "d<=192: O needs up to 96 fp32/thread, so Q is re-read from shared memory instead of pinned in registers"},
    {false, 256, 128, 64, 8, 1, 2, false, false,
     "d<=256: O needs 128 fp32/thread; 8 warps x 16 rows with Q in shared memory stay spill-free and beat FA2's "
     "64x64/4-warp shape by 30% on Hopper"},
};

constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

int vec_for(int d) {
    for (int v : {8, 4, 2}) if (d % v == 0) return v;
    return 1;
}

// Mirrors FwdShape::stride_for: an odd number of 16-byte chunks per shared-memory row.
constexpr int smem_stride(int pad) { return (pad / 8) % 2 == 1 ? pad : pad + 8; }

// RTATTN_TILE="block_m,block_n,warps,m_tiles,stages,q_in_regs" replaces the table row: a tuning knob for timing
// variants without a rebuild. The rendered source (and so the cache key) carries the choice.
void apply_tile_override(KernelPlan& p) {
    const char* env = std::getenv("RTATTN_TILE");
    if (!env || !*env) return;
    int v[6];
    if (std::sscanf(env, "%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
        throw ConfigError("RTATTN_TILE", fmt::format("'{}' is not block_m,block_n,warps,m_tiles,stages,q_in_regs", env));
    const auto [bm, bn, w, mt, st, qr] = v;
    if (w < 1 || w > 16 || mt < 1 || mt > 4 || bm != w * mt * 16)
        throw ConfigError("RTATTN_TILE", fmt::format("block_m ({}) must equal warps ({}, 1..16) x m_tiles ({}, 1..4) x 16",
                                                     bm, w, mt));
    if (bn < 16 || bn > 256 || bn % 16 != 0)
        throw ConfigError("RTATTN_TILE", fmt::format("block_n ({}) must be a multiple of 16 in 16..256", bn));
    if (st < 1 || st > 3) throw ConfigError("RTATTN_TILE", fmt::format("stages ({}) must be 1..3", st));
    if (p.wgmma && (mt != 1 || w % 4 != 0 || qr != 0))
        throw ConfigError("RTATTN_TILE", "the wgmma kernel needs m_tiles 1, whole warpgroups (warps 4, 8, 12, 16) "
                                         "and Q in shared memory (q_in_regs 0)");
    p.block_m = bm, p.block_n = bn, p.warps = w, p.m_tiles = mt, p.stages = st, p.q_in_regs = qr != 0;
    p.reason = fmt::format("RTATTN_TILE override ({})", env);
}

}  // namespace

const ArchInfo& arch_info(const std::string& arch) {
    for (const auto& a : kArchTable)
        if (arch == a.name) return a;
    throw ConfigError("arch", fmt::format("'{}' cannot be planned; supported: {}", arch, known_archs()));
}

int smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wgmma) {
    // wgmma tiles are stored as packed 8x8 core matrices (no row padding); mma.sync tiles as padded rows.
    const int sqk = wgmma ? pad_qk : smem_stride(pad_qk), sv = wgmma ? pad_v : smem_stride(pad_v);
    const int main_elems = block_m * sqk + stages * block_n * (sqk + sv);
    const int o_elems = block_m * smem_stride(pad_v);  // the epilogue stages O in padded rows
    return 2 * (main_elems > o_elems ? main_elems : o_elems);
}

KernelPlan plan(const AttentionConfig& c) {
    c.validate();
    if (c.arch.empty()) throw ConfigError("arch", "must be resolved to a concrete arch before planning");
    const ArchInfo& ai = arch_info(c.arch);

    KernelPlan p;
    p.head_dim_qk = c.head_dim_qk;
    p.head_dim_v = c.dv();
    p.pad_qk = round_up(p.head_dim_qk, 16);
    p.pad_v = round_up(p.head_dim_v, 8);
    p.bf16 = c.dtype == Dtype::bf16;
    p.causal = c.causal;
    p.arch = c.arch;
    p.vec_qk = vec_for(p.head_dim_qk);
    p.vec_v = vec_for(p.head_dim_v);

    const int widest = std::max(p.pad_qk, p.pad_v);
    const TileRow* row = nullptr;
    const bool has_wgmma = c.arch == "sm_90a";
    for (const auto& r : kTiles)
        if ((!r.wgmma || has_wgmma) && widest <= r.max_pad) {
            row = &r;
            break;
        }
    if (!row)
        throw ConfigError("head_dim_qk", fmt::format("padded width {} has no tile row; allowed head dims 1..{}",
                                                     widest, AttentionConfig::kMaxHeadDim));
    p.wgmma = row->wgmma;
    p.block_m = row->block_m;
    p.block_n = row->block_n;
    p.warps = row->warps;
    p.m_tiles = row->m_tiles;
    p.stages = row->stages;
    p.q_in_regs = row->q_in_regs;
    p.swizzle = row->swizzle;
    p.reason = row->why;
    apply_tile_override(p);

    // Arches with less shared memory: narrow the key tile to 64 first (per-tile overhead grows, but the pipeline
    // keeps hiding load latency), then give up pipeline depth, then narrow further.
    p.smem_bytes = smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wgmma);
    while (p.smem_bytes > ai.smem_optin) {
        if (p.block_n > 64)
            p.block_n /= 2;
        else if (p.stages > 1)
            --p.stages;
        else if (p.block_n > 16)
            p.block_n /= 2;
        else
            throw ConfigError("arch", fmt::format("{} has {} B of shared memory per block; d{}/{} needs {} B",
                                                  ai.name, ai.smem_optin, p.head_dim_qk, p.head_dim_v, p.smem_bytes));
        p.smem_bytes = smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wgmma);
        p.reason += fmt::format("; stepped down to {} stage(s), block_n {} to fit {} KB", p.stages, p.block_n,
                                ai.smem_optin / 1024);
    }
    return p;
}

PlanSummary KernelPlan::summary() const {
    PlanSummary s;
    s.padded_qk = pad_qk;
    s.padded_v = pad_v;
    s.block_m = block_m;
    s.block_n = block_n;
    s.warps = warps;
    s.stages = stages;
    s.smem_bytes = smem_bytes;
    s.vec_qk = vec_qk;
    s.vec_v = vec_v;
    s.useful_flop_fraction = useful_flop_fraction();
    s.reason = reason;
    s.kernel = kernel();
    return s;
}

}  // namespace rtattn::plan
