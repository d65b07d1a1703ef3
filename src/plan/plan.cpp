#include "plan/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "rtattn/errors.hpp"
#include "util/text.hpp"

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
    int schedule;    // wgmma only: 0 all warps load, 1 producer warpgroup + overlap, 2 as 1 with ping-pong
    int pv_step;     // head_dim_v is padded to a multiple of this: 8 (the MMA's n step), or 16 where that ran faster
    const char* why;
};

// Rows were chosen by timing candidates on an H200 (tools/bench/tile_sweep.sh, bf16, S=16k; docs/PERFORMANCE.md).
// The first row whose kernel the arch can run and whose max_pad covers the head dim wins.
constexpr TileRow kTiles[] = {
    // sm_90a: wgmma. A producer warpgroup streams K/V tiles (TMA where the layout allows, else cp.async) while
    // 64-row consumer warpgroups overlap the softmax of block j with the PV of block j-1; schedule 2 also has the
    // consumer warpgroups take turns on the tensor cores. Figures: H200, bf16, S=16k, non-causal/causal TFLOPS.
    {true, 64, 192, 128, 12, 1, 2, false, true, 2, 8,
     "sm_90a, d<=64: three consumer warpgroups (192 rows) halve K/V traffic per FLOP: 526/495 TFLOPS at d64 vs "
     "427/400 with 128 rows and 367/358 with 64-key tiles"},
    {true, 96, 128, 128, 8, 1, 2, false, true, 2, 8,
     "sm_90a, d<=96: 128x128 tiles, 562/518 TFLOPS at d96 vs 475/444 with 64-key tiles; 192 rows spill at 160 "
     "registers"},
    {true, 112, 128, 128, 8, 1, 2, false, true, 2, 8,
     "sm_90a, 96<d<=112: as d<=96; d100 (split rows) 468/462 TFLOPS vs 419/392 without turn-taking"},
    {true, 128, 128, 128, 8, 1, 2, false, true, 1, 16,
     "sm_90a, d<=128: 128x128 tiles without turn-taking, 674/631 TFLOPS at d128 vs 611/628 with it, 626/633 with 3 "
     "stages, 525/520 with 64-key tiles, 379/355 with 176 keys (spills). V padded to 16: d120 as one 128-wide PV "
     "chunk ran 566/584 TFLOPS vs 461/432 as four (64+32+16+8); elsewhere 16 did not pay (d132 543/554 vs 565/556)"},
    {true, 144, 128, 128, 8, 1, 2, false, true, 2, 8,
     "sm_90a, 128<d<=144: 128x128 tiles with turn-taking, d132 (split rows) 544-558/567-578 TFLOPS vs 546-570/"
     "556-561 without (a tie, kept for causal); 64-key tiles 460/451, 96 keys x 3 stages 468/475"},
    {true, 160, 128, 128, 8, 1, 2, false, true, 2, 8,
     "sm_90a, 128<d<=160: 128x128 tiles, 678/655 TFLOPS at d160 vs 609/582 with 96 keys, 561/538 with 64"},
    {true, 192, 128, 112, 8, 1, 2, false, true, 2, 8,
     "sm_90a, d<=192: 112-key tiles (fewer where a 1024-byte tile alignment needs it), 663/609 TFLOPS at d192 vs "
     "620/606 with 96 keys and 629/578 with 64"},
    {true, 256, 128, 64, 8, 1, 2, false, true, 2, 8,
     "sm_90a, d<=256: 64-key tiles leave registers for O (128 fp32/thread): 699/610 TFLOPS at d256 vs 670/614 "
     "without turn-taking and 648/583 with 80 keys (spills when causal)"},
    // Every arch: mma.sync m16n8k16.
    {false, 64, 128, 64, 4, 2, 2, true, false, 0, 8,
     "d<=64: accumulators are small, so two m-tiles per warp halve K/V shared-memory reads per MMA"},
    {false, 144, 128, 128, 8, 1, 2, true, false, 0, 8,
     "d<=144: 8 warps x 16 rows keep O (<=72 fp32/thread) and Q fragments in registers; 128-key tiles halve the "
     "per-tile softmax and barrier overhead (+12% over 64 at d128)"},
    {false, 192, 128, 64, 8, 1, 2, false, false, 0, 8,
     "d<=192: O needs up to 96 fp32/thread, so Q is re-read from shared memory instead of pinned in registers"},
    {false, 256, 128, 64, 8, 1, 2, false, false, 0, 8,
     "d<=256: O needs 128 fp32/thread; 8 warps x 16 rows with Q in shared memory stay spill-free and beat FA2's "
     "64x64/4-warp shape by 30% on Hopper"},
};

constexpr int round_up(int x, int m) { return (x + m - 1) / m * m; }

// Head dims whose rows the producer splits into a TMA part and a 4-column part it copies itself (split_rows):
// the TMA part must end where the tile's last panel begins (16 wide for K; 8 or 16 for V, by pv_step).
bool split_rows_fit(int d_qk, int d_v) { return d_qk >= 36 && d_qk % 32 == 4 && d_v >= 36 && d_v % 32 == 4; }

// Flags that follow from the tile choice; called again whenever the choice changes. Wide V (requested by default,
// off with RTATTN_TILE's 10th field) needs swizzled tiles in a producer kernel, and with split rows the TMA part of
// each V row must fill whole 64-column panels (a box there would cover the stored columns). It is used only where
// the per-width panels end in an 8-wide one: there one n=pad_v instruction per k-step beat n128 + n8 (d132
// 547-569/562-579 TFLOPS vs 521-552/557-574 on an H200); where they do not, it did not pay (d96 519-579/524-532 vs
// 525-566/540-543, d256 629-647/693-697 vs 659-675/700-701; d80, d160, d192 within noise).
void settle_layout_flags(KernelPlan& p) {
    p.split_rows = p.producer() && p.swizzle && split_rows_fit(p.head_dim_qk, p.head_dim_v);
    p.wide_v = p.wide_v && p.producer() && p.swizzle && p.pad_v % 16 == 8 &&
               (!p.split_rows || (p.head_dim_v - 4) % 64 == 0);
}

int vec_for(int d) {
    for (int v : {8, 4, 2}) if (d % v == 0) return v;
    return 1;
}

// Mirrors FwdShape::stride_for: an odd number of 16-byte chunks per shared-memory row.
constexpr int smem_stride(int pad) { return (pad / 8) % 2 == 1 ? pad : pad + 8; }

// RTATTN_TILE="block_m,block_n,warps,m_tiles,stages,q_in_regs[,schedule[,swizzle[,pv_step[,wide_v]]]]" replaces
// the table row: a tuning knob for timing variants without a rebuild. The rendered source (and so the cache key)
// carries it.
void apply_tile_override(KernelPlan& p) {
    const char* env = std::getenv("RTATTN_TILE");
    if (!env || !*env) return;
    static constexpr const char* kFields[] = {"block_m", "block_n",  "warps",  "m_tiles", "stages",
                                              "q_in_regs", "schedule", "swizzle", "pv_step", "wide_v"};
    int v[10] = {0, 0, 0, 0, 0, 0, p.schedule, p.swizzle ? 1 : 0, p.pv_step, p.wide_v ? 1 : 0};
    // Every field a whole decimal number that fits, nothing after the last: a typo is an error, never a default.
    const std::string_view text = env;
    std::size_t n = 0, at = 0;
    for (; at <= text.size() && n < 10; ++n) {
        const std::size_t end = std::min(text.find(',', at), text.size());
        const std::string field(text.substr(at, end - at));
        char* stop = nullptr;
        errno = 0;
        const long x = std::strtol(field.c_str(), &stop, 10);
        if (field.empty() || *stop != '\0' || errno == ERANGE || x < -999 || x > 999)
            throw ConfigError("RTATTN_TILE", fmt::format("{} ({}) is not a number in -999..999 in {}", kFields[n],
                                                         util::quoted(field), util::quoted(text)));
        v[n] = int(x);
        at = end + 1;
    }
    if (n < 6 || at <= text.size())
        throw ConfigError("RTATTN_TILE", fmt::format("{} is not block_m,block_n,warps,m_tiles,stages,q_in_regs"
                                                     "[,schedule[,swizzle[,pv_step[,wide_v]]]]", util::quoted(text)));
    const auto [bm, bn, w, mt, st, qr, sched, sw, pv, wide] = v;
    if (w < 1 || w > 16 || mt < 1 || mt > 4 || bm != w * mt * 16)
        throw ConfigError("RTATTN_TILE", fmt::format("block_m ({}) must equal warps ({}, 1..16) x m_tiles ({}, 1..4) x 16",
                                                     bm, w, mt));
    if (bn < 16 || bn > 256 || bn % 16 != 0)
        throw ConfigError("RTATTN_TILE", fmt::format("block_n ({}) must be a multiple of 16 in 16..256", bn));
    if (st < 1 || st > 3) throw ConfigError("RTATTN_TILE", fmt::format("stages ({}) must be 1..3", st));
    if (p.wgmma && (mt != 1 || w % 4 != 0 || qr != 0))
        throw ConfigError("RTATTN_TILE", "the wgmma kernel needs m_tiles 1, whole warpgroups (warps 4, 8, 12, 16) "
                                         "and Q in shared memory (q_in_regs 0)");
    if (sched < 0 || sched > 2 || (sched > 0 && p.wgmma && (w > 12 || st < 2)))
        throw ConfigError("RTATTN_TILE", fmt::format("schedule ({}) must be 0..2; 1 and 2 (wgmma only, ignored by "
                                                     "mma.sync plans) need at most 12 MMA warps and 2+ stages", sched));
    if (pv != 8 && pv != 16) throw ConfigError("RTATTN_TILE", fmt::format("pv_step ({}) must be 8 or 16", pv));
    for (const auto& [name, flag] : {std::pair{"q_in_regs", qr}, {"swizzle", sw}, {"wide_v", wide}})
        if (flag != 0 && flag != 1) throw ConfigError("RTATTN_TILE", fmt::format("{} ({}) must be 0 or 1", name, flag));
    p.block_m = bm, p.block_n = bn, p.warps = w, p.m_tiles = mt, p.stages = st, p.q_in_regs = qr != 0;
    p.pv_step = pv;
    p.pad_v = round_up(p.head_dim_v, pv);
    p.wide_v = wide != 0;
    p.schedule = p.wgmma ? sched : 0;
    p.swizzle = p.wgmma && sw != 0;
    p.reason = fmt::format("RTATTN_TILE override ({})", util::escaped(text));
}

// Swizzled wgmma tiles start on 1024-byte swizzle-atom boundaries, so K and V tiles of block_n rows must be whole
// multiples of 1024 bytes (64 rows always are; 96 rows of d_v 145, padded to 152, are not): narrow the key tile,
// or fall back to interleaved tiles, which have no such constraint.
void align_swizzled_tiles(KernelPlan& p) {
    if (!p.wgmma || !p.swizzle) return;
    const int v_cols = p.wide_v ? round_up(p.pad_v, 64) : p.pad_v;
    auto aligned = [&] { return p.block_n * p.pad_qk * 2 % 1024 == 0 && p.block_n * v_cols * 2 % 1024 == 0; };
    while (!aligned() && p.block_n > 16) p.block_n -= 16;
    if (!aligned()) p.swizzle = false;
}

}  // namespace

const ArchInfo& arch_info(const std::string& arch) {
    for (const auto& a : kArchTable)
        if (arch == a.name) return a;
    throw ConfigError("arch", fmt::format("'{}' cannot be planned; supported: {}", arch, known_archs()));
}

int smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wgmma, bool producer, bool wide_v) {
    // wgmma tiles are stored as packed 8x8 core matrices (no row padding); mma.sync tiles as padded rows. Wide V
    // tiles take whole 64-column panels.
    const int sqk = wgmma ? pad_qk : smem_stride(pad_qk);
    const int sv = wide_v ? round_up(pad_v, 64) : wgmma ? pad_v : smem_stride(pad_v);
    const int main_elems = block_m * sqk + stages * block_n * (sqk + sv);
    const int o_elems = block_m * smem_stride(pad_v);  // the epilogue stages O in padded rows
    const int bytes = 2 * (main_elems > o_elems ? main_elems : o_elems);
    // The producer/consumer kernel adds four mbarriers per ring slot (K and V full/empty) after the tiles.
    return producer ? round_up(bytes, 8) + 4 * stages * 8 : bytes;
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
    p.schedule = row->schedule;
    p.pv_step = row->pv_step;
    p.pad_v = round_up(p.head_dim_v, p.pv_step);  // the row's max_pad is a multiple of 16: still covered
    p.wide_v = true;  // a request: settle_layout_flags keeps it only where it applies
    p.reason = row->why;
    if (p.producer() && (p.vec_qk < 8 || p.vec_v < 8) && !split_rows_fit(p.head_dim_qk, p.head_dim_v)) {
        // A head dim that is not a multiple of 8 (and not 32k+4) leaves packed heads off 16-byte boundaries: no
        // TMA, and the warp-specialized kernel on cp.async ran slower than the cooperative kernel (d132: 243 vs 253
        // TFLOPS; d100: 146).
        p.schedule = 0;
        p.reason += "; head dim not a multiple of 8 (no TMA): cooperative kernel";
        if (p.block_m > 128) {  // 192 rows spill in the cooperative kernel; its own d<=64 tile ran 272/272 TFLOPS
            // Swizzled tiles kept: d63 98/92 TFLOPS vs 98/65 interleaved, d60 210/201 vs 221/204.
            p.block_m = 128, p.warps = 8, p.block_n = 64;
            p.reason += ", 128x64 tiles";
        } else {
            // 128-key tiles: interleaved beats swizzled on cp.async, d140 262/243 vs 187/178, d108 242/235 vs 169/163.
            p.swizzle = false;
            p.reason += ", interleaved tiles";
        }
    }
    apply_tile_override(p);

    settle_layout_flags(p);
    align_swizzled_tiles(p);
    settle_layout_flags(p);  // alignment may have given up swizzled tiles
    // Arches with less shared memory: narrow the key tile to 64 first (per-tile overhead grows, but the pipeline
    // keeps hiding load latency), then give up pipeline depth, then narrow further.
    p.smem_bytes = smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wgmma, p.producer(), p.wide_v);
    while (p.smem_bytes > ai.smem_optin) {
        if (p.block_n > 64)
            p.block_n = std::max(64, p.block_n / 32 * 16);  // halve, staying a multiple of 16
        else if (p.stages > (p.producer() ? 2 : 1))
            --p.stages;
        else if (p.block_n > 16)
            p.block_n /= 2;
        else
            throw ConfigError("arch", fmt::format("{} has {} B of shared memory per block; d{}/{} needs {} B",
                                                  ai.name, ai.smem_optin, p.head_dim_qk, p.head_dim_v, p.smem_bytes));
        align_swizzled_tiles(p);
        settle_layout_flags(p);
        p.smem_bytes = smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wgmma, p.producer(), p.wide_v);
        p.reason += fmt::format("; stepped down to {} stage(s), block_n {} to fit {} KB", p.stages, p.block_n,
                                ai.smem_optin / 1024);
    }
    return p;
}

std::string KernelPlan::kernel() const {
    if (!wgmma) return "mma.sync";
    std::string k = swizzle ? "wgmma, swizzled tiles" : "wgmma, interleaved tiles";
    if (schedule == 1) k += ", producer warpgroup";
    if (schedule == 2) k += ", producer warpgroup, ping-pong";
    if (split_rows) k += ", split rows";
    if (wide_v) k += ", one PV instruction";
    return k;
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
