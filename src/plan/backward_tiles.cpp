// The backward tile table and plan_backward(): tiles per padded head dim and arch, a reason on every row.
#include "util/format.hpp"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "arch/arch.hpp"
#include "common/geometry.h"
#include "core/errors.hpp"
#include "kernels/backward.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "util/env.hpp"

namespace rtattn::plan {

namespace {

struct BwdTileRow {
    const kernels::BackwardFamily& (*family)();
    int min_pad, max_pad;  // the padded head dims (the larger of the QK and V pads) the row serves
    int block_m, block_n, warps;
    int sdp_warps_m, dkv_warps_n, dq_warps_m;  // see BackwardPlan
    int stages;
    const char* why;
    bool equal_dims = false;  // serves d_qk = d_v only
    int dims_of = 1;          // serves d_qk and d_v multiples of this (TMA boxes start 16-byte aligned); past 1, a
                              // warp-specialized row, whose dQ splits at column 64: pad_qk past 64 too
};

using kernels::bwd_mma;
using kernels::bwd_sm90;
using kernels::bwd_sm90_ws;

// dK and dV stay in registers for a CTA's whole life: block_n x (pad_qk + pad_v) fp32 over the CTA's threads. The
// warp layouts trade shared-memory reads (each GEMM re-reads A for every column split and B for every row split)
// against the fragment registers. The first row whose pad fits and whose shared memory the arch has wins, so each
// pad lists its rows from the most to the least shared memory.
constexpr BwdTileRow kBwdTiles[] = {
    // sm_90a (the warp splits do not apply: a warpgroup per 64 keys, each GEMM a warpgroup's).
    {bwd_sm90_ws, 32, 64, 128, 128, 8, 0, 0, 0, 2,
     "sm_90a, head dims of 8 up to 64 (d24..64): the row below with 128 queries a step (the warpgroups split dQ's "
     "rows), halving the steps' fixed costs (barrier, LSE/D, dQ reduction) where their GEMMs are small (H200, S=4k "
     "and 16k, causal or not: d64 1.24-1.41x 64 a step, d48 1.31-1.39x, d32 1.32-1.50x)",
     false, 8},
    {bwd_sm90_ws, 32, 128, 64, 128, 8, 0, 0, 0, 2,
     "sm_90a, head dims of 8 (d24..128): bwd_sm90's tiles on two consumer warpgroups and a producer warpgroup (TMA "
     "Q/dO into two slots, dQ reductions), S^T and dP^T in flight together, dQ staged while dK runs (H200, S=4k and "
     "16k, causal or not: d128 1.33-1.37x bwd_sm90, d120 1.34-1.41x, d96 1.26-1.31x, d80 1.24-1.27x; d104/d112 "
     "1.47-1.61x the mma.sync kernel; at pads 32..64 on request, RTATTN_BWD_TILE: d64 1.35-1.46x, d32 1.48-1.60x); "
     "dQ a step late, no barrier a step between the warpgroups: d128 1.14-1.17x",
     false, 8},
    {bwd_sm90_ws, 144, 144, 64, 128, 8, 0, 0, 0, 2,
     "sm_90a, d132, 136, 140, 144 (d_qk = d_v): as the row above, 144-column tiles in per-width panels (two slots "
     "fit 227 KB; bwd_sm90's 192-column ones do not), accumulators of the head dim rounded to 8; d132's and d140's "
     "rows placed 0 or 4 columns right as they lie, by TMA from the 16-byte boundary before them (columns outside "
     "zeroed once landed; a GQA group whose heads alternate placement runs on clusters of two CTAs, one per placement: "
     "the 70B layer's d132 backward 1.43x bwd_sm90's kernel) (H200, S=4k and 16k: d132 1.31-1.39x bwd_sm90, d136 "
     "1.32-1.39x, d140 1.34-1.53x, d144 1.24-1.29x; d132 and d136 with dQ a step late 1.02-1.08x and 1.13-1.17x; "
     "d132 with LSE/D loaded beside the tiles and the zeroing in 8/16-byte pieces 1.17-1.20x)",
     true, 4},
    {bwd_sm90_ws, 160, 256, 64, 64, 8, 0, 0, 0, 2,
     "sm_90a, head dims of 8 past 144 (d152..256) or a pair of pads 64, 128 or 160..256 (192/128): the wide form, 64 "
     "keys a CTA, both consumer warpgroups on all of them (S^T and dP^T computed twice), each keeping half of dK's, "
     "dV's and dQ's columns (dK + dV of 64 keys x 256 outgrow one warpgroup's registers), each chunk of a half inside "
     "one panel; past pad_qk 192 no staging tile of the CTA's, so that two Q/dO slots fit (one slot: 0.60x cuDNN "
     "at d256, H200; two: 0.72-0.75x), and there the warpgroups split the step's GEMMs instead of the columns, each "
     "computed once (one S^T, P^T and dV, the other dP^T, dS^T and dK: d208 1.28-1.31x, d256 1.16-1.17x), each warp "
     "adding its dQ rows 32 columns at a time by TMA reductions from a 2 KB box of its own (against each thread's "
     "8-byte reductions, L2-bound: d208 1.23-1.31x, d224 1.15-1.17x, d240 1.11-1.12x, d256 1.17x) (H200, S=16k, "
     "against the mma.sync kernel: d160 1.76-1.87x, d176 1.60-1.66x, d192 "
     "1.86-1.91x, d208..240 1.20-1.26x, d256 1.28-1.33x, before the split)",
     false, 8},
    {bwd_sm90, 80, 96, 64, 128, 8, 0, 0, 0, 1,
     "sm_90a, d65..96 where the row above does not serve (head dims off the 8 grid: a TMA box cannot start mid-16 "
     "bytes): as d113..128 below, the warpgroups splitting dQ's columns at 64 (H200, S=4k and 16k: d80 1.26-1.33x the "
     "mma.sync kernel, d96 1.19-1.27x)"},
    {bwd_sm90, 144, 144, 64, 128, 8, 0, 0, 0, 1,
     "sm_90a, d129..144 (d132), d_qk = d_v: as d113..128, Q/dO/K/V as 192-column tiles so dK and dV are one wgmma "
     "each, accumulators of the head dim rounded to 8; d132's rows as 16-byte vectors placed 0 or 4 columns right "
     "(H200, S=4k and 16k: d132 1.32-1.42x the mma.sync kernel; 128 + 8 chunks ran at 0.87x, 8-byte loads at "
     "0.94-1.01x; 144-column accumulators spilled in bf16, as did d_qk != d_v pairs here, 4-52 bytes). One Q/dO "
     "buffer: two outgrow 227 KB",
     true},
    {bwd_sm90, 128, 128, 64, 128, 8, 0, 0, 0, 1,
     "sm_90a, d113..128 where the row above does not serve (head dims off the 8 grid, d_qk of 64 or less): wgmma, "
     "128 keys per CTA (a warpgroup per 64), 64 query rows per step, each warpgroup dQ's 64-column panel over all 128 "
     "keys, one bulk reduction per step (H200, d128: 1.24-1.27x the mma.sync kernel, S=4k and 16k, causal or not; dQ "
     "over each warpgroup's own keys, two reductions, was 1.03x). One Q/dO buffer: two ran within 1-2% and spilled "
     "4-12 bytes (bf16)"},
    {bwd_mma, 0, 48, 128, 128, 8, 4, 2, 2, 1,
     "d<=48: as d64 below, but dQ 64 rows x one column pair per warp (32 rows x two spill at d48) and one Q/dO "
     "buffer, loaded during dQ (two spill at d33..47, whose scalar loads take more registers)"},
    {bwd_mma, 0, 64, 128, 128, 8, 4, 2, 4, 2,
     "d<=64: 128x128 tiles, S/dP 32 rows x 64 keys per warp, dK/dV 64 keys x half the columns; the next query "
     "block loads during this one (H200, sm_90, S=16k: 1.13x the 64x128 tile)"},
    {bwd_mma, 0, 64, 128, 128, 8, 4, 2, 4, 1, "d<=64 on 164 KB (sm_80): one Q/dO buffer, loaded during dQ"},
    {bwd_mma, 0, 64, 64, 128, 8, 2, 4, 2, 1, "d<=64 on ~100 KB (sm_86, sm_89): 64 query rows per step"},
    {bwd_mma, 0, 128, 64, 128, 8, 2, 4, 4, 2,
     "d<=128: 128 keys per CTA (Q/dO re-read once per 128 keys), S/dP and dK/dV as FA2, dQ 16 rows per warp (32 "
     "spill at d80..112), Q/dO double-buffered (H200, sm_90, S=16k: 1.5x the 64x64 tile)"},
    {bwd_mma, 0, 128, 64, 128, 8, 2, 4, 4, 1, "d<=128 on 164 KB (sm_80): one Q/dO buffer, loaded during dQ"},
    {bwd_mma, 0, 128, 64, 64, 8, 2, 4, 2, 1, "d<=128 on ~100 KB (sm_86, sm_89): 64 keys, one Q/dO buffer"},
    {bwd_mma, 0, 144, 64, 128, 8, 4, 8, 4, 1,
     "d129..144 (d132): 128 keys, each warp 16 keys x all 9 column pairs of dK/dV (split in 2 the pairs leave "
     "one warp 5 of 9 and spill); one buffer is as fast as two here (H200, sm_90, S=16k: 1.37x the 64x64 tile)"},
    {bwd_mma, 0, 192, 64, 64, 8, 4, 2, 2, 2,
     "d<=192: 64x64 tiles (128 keys spill), S/dP 16 rows x 32 keys per warp, Q/dO double-buffered"},
    {bwd_mma, 0, 192, 64, 64, 8, 4, 2, 2, 1, "d<=192 on 164 KB (sm_80): one Q/dO buffer, loaded during dQ"},
    {bwd_mma, 0, 256, 64, 64, 8, 4, 2, 2, 1,
     "d<=256: 64x64 tiles, one Q/dO buffer loaded during dQ (two outgrow 227 KB; H200, sm_90, S=16k: 1.23x the "
     "32-row double-buffered tile)"},
    {bwd_mma, 0, 256, 32, 64, 8, 2, 4, 2, 1, "d<=256 on ~100 KB with bulk dQ staging: 32 query rows per step"},
    {bwd_mma, 0, 256, 32, 32, 4, 2, 2, 2, 1, "d<=256 on ~100 KB of shared memory (sm_86, sm_89): 32x32 tiles, 4 warps"},
};

// The tile shapes the kernel can be built with (BwdShape's static_asserts, said here so an override fails as a
// ConfigError naming what is wrong, before NVRTC).
std::string tile_problem(const BackwardPlan& p) {
    if (p.family == &kernels::bwd_sm90_ws()) {
        if (geometry::bwd_sm90_ws_wide_tile(p.block_n) &&
            (p.block_m != 64 || p.warps != 8 || !geometry::bwd_sm90_ws_wide(p.pad_qk, p.pad_v)))
            return "block_n 64 is the warp-specialized wgmma backward's wide form: block_m 64, warps 8, pads 64, 128 "
                   "or 160..256, one past 144";
        if (p.block_n == 128 && std::max(p.pad_qk, p.pad_v) > 144)
            return "pads past 144 take the warp-specialized wgmma backward's wide form (block_n 64)";
        if ((p.block_m != 64 && p.block_m != 128) || (p.block_n != 128 && p.block_n != 64) || p.warps != 8)
            return "the warp-specialized wgmma backward takes block_m 64 (or 128 at pads up to 64), block_n 128 (64: "
                   "the wide form), warps 8";
        if (p.block_m == 128 && std::max(p.pad_qk, p.pad_v) > 64)
            return "block_m 128 needs pads up to 64 (S^T, dP^T and dK/dV in registers)";
        if (p.stages != 1 && p.stages != 2) return "stages must be 1 or 2";
        return "";
    }
    if (p.family == &kernels::bwd_sm90()) {
        if (p.block_m != 64) return "block_m must be 64 for the wgmma backward";
        if (p.warps % 4 || p.warps < 4 || p.warps > 8 || p.block_n != 16 * p.warps)
            return "the wgmma backward takes 64 keys per warpgroup: warps 4 or 8, block_n 16 x warps";
        if (p.stages != 1 && p.stages != 2) return "stages must be 1 or 2";
        return "";
    }
    if (p.block_m < 16 || p.block_m % 16 || p.block_n < 16 || p.block_n % 16)
        return "block_m and block_n must be positive multiples of 16";
    if (p.warps < 1 || p.warps > 16) return "warps must be 1..16";
    if (p.block_m > 32 * p.warps) return "block_m must be at most 32 x warps (a thread per query row loads its LSE and D)";
    auto splits = [&](int by, int extent, int step) { return by >= 1 && p.warps % by == 0 && extent % (by * step) == 0; };
    if (!splits(p.sdp_warps_m, p.block_m, 16) || !splits(p.warps / p.sdp_warps_m, p.block_n, 16))
        return "sdp_warps_m must divide warps, block_m into 16-row pieces and leave block_n 16-key pieces";
    if (!splits(p.dkv_warps_n, p.block_n, 16)) return "dkv_warps_n must divide warps and block_n into 16-key pieces";
    if (!splits(p.dq_warps_m, p.block_m, 16)) return "dq_warps_m must divide warps and block_m into 16-row pieces";
    if (p.stages != 1 && p.stages != 2) return "stages must be 1 or 2";
    return "";
}

void apply_tile_override(BackwardPlan& p, const std::string& text, bool arch_bulk) {
    int v[8] = {0, 0, 0, 0, 0, 0, 0, arch_bulk ? 1 : 0};
    char tail = 0;
    const int n = std::sscanf(text.c_str(), "%d,%d,%d,%d,%d,%d,%d,%d%c", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                              &v[6], &v[7], &tail);
    if (n != 7 && n != 8)
        throw ConfigError("RTATTN_BWD_TILE",
                          util::format("'{}' is not block_m,block_n,warps,sdp_warps_m,dkv_warps_n,dq_warps_m,stages"
                                       "[,bulk_dq]",
                                       text));
    p.block_m = v[0], p.block_n = v[1], p.warps = v[2], p.sdp_warps_m = v[3], p.dkv_warps_n = v[4];
    p.dq_warps_m = v[5], p.stages = v[6], p.bulk_dq = v[7] != 0;
    if (p.bulk_dq && !arch_bulk) throw ConfigError("RTATTN_BWD_TILE", util::format("'{}': {} has no bulk reduction", text, p.arch));
    if (const std::string why = tile_problem(p); !why.empty())
        throw ConfigError("RTATTN_BWD_TILE", util::format("'{}': {}", text, why));
    p.reason = util::format("RTATTN_BWD_TILE={} (a tuning override, not the table)", text);
    p.overridden = true;
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

// RTATTN_BWD_WS=0 or false: plans skip the warp-specialized Hopper backward (timing it against bwd_sm90 with the same
// build). Read once, as RTATTN_TMA; any other value is a ConfigError naming the variable.
bool warp_specialized_off() {
    static const bool off = !util::env_flag("RTATTN_BWD_WS").value_or(true);
    return off;
}

}  // namespace

BackwardPlan plan_backward(const AttentionConfig& c, const std::string& tile_override) {
    if (c.decode)
        throw ConfigError("decode", "decode kernels have no backward pass (train with a prefill config: decode false)");
    if (c.paged_kv)
        throw ConfigError("paged_kv", "a paged KV cache is for inference: it has no backward pass (train with "
                                      "paged_kv false)");
    BackwardPlan p;
    // Both pads to 16: each is the k of an MMA here (QK^T, dO V^T).
    const arch::Arch& ai = fill_problem(p, c, 16);
    const int pad = std::max(p.pad_qk, p.pad_v);
    for (const BwdTileRow& row : kBwdTiles) {
        const kernels::BackwardFamily& f = row.family();
        if (pad < row.min_pad || pad > row.max_pad || !f.runs_on(ai)) continue;
        if (row.equal_dims && p.head_dim_qk != p.head_dim_v) continue;
        if (row.dims_of > 1 && (p.head_dim_qk % row.dims_of || p.head_dim_v % row.dims_of || p.pad_qk < 32)) continue;
        if (&f == &kernels::bwd_sm90_ws() && warp_specialized_off()) continue;
        // The wide form's halves are chunks that each lie inside one panel of the tile: pads 64, 128, 160..256 only.
        if (&f == &kernels::bwd_sm90_ws() && geometry::bwd_sm90_ws_wide_tile(row.block_n) &&
            !geometry::bwd_sm90_ws_wide(p.pad_qk, p.pad_v))
            continue;
        BackwardPlan cand = p;
        cand.family = &f;
        cand.block_m = row.block_m, cand.block_n = row.block_n, cand.warps = row.warps;
        cand.sdp_warps_m = row.sdp_warps_m, cand.dkv_warps_n = row.dkv_warps_n, cand.dq_warps_m = row.dq_warps_m;
        cand.stages = row.stages;
        cand.bulk_dq = ai.bulk;
        if (f.smem_bytes(cand) > ai.smem_optin) continue;
        cand.reason = row.why;
        p = cand;
        break;
    }
    if (!p.family) throw ConfigError("head_dim_qk", util::format("no backward tile serves d{}/{} on {}", p.head_dim_qk,
                                                                 p.head_dim_v, c.arch));
    if (!tile_override.empty()) apply_tile_override(p, tile_override, ai.bulk);
    p.smem_bytes = p.family->smem_bytes(p);
    if (p.smem_bytes > ai.smem_optin)
        throw ConfigError("arch", util::format("{} has {} B of shared memory per block; the d{}/{} backward needs {} B",
                                               ai.name, ai.smem_optin, p.head_dim_qk, p.head_dim_v, p.smem_bytes));
    return p;
}

std::string BackwardPlan::kernel() const { return family->describe(*this); }
int BackwardPlan::threads() const { return family->threads(*this); }

BackwardWorkspace BackwardPlan::workspace(int batch, int heads_q, int seqlen_q) const {
    BackwardWorkspace w;
    w.m_pad = (std::int64_t(seqlen_q) + block_m - 1) / block_m * block_m;
    const std::size_t rows = std::size_t(batch) * std::size_t(heads_q) * std::size_t(w.m_pad);
    // Sizes up to the call limits (batch and heads 65535, 2^30 rows) would wrap 64 bits: refuse what no device holds.
    const auto accum = static_cast<unsigned __int128>(rows) * geometry::bwd_dq_stride(pad_qk) * 4;
    if (accum > (unsigned __int128)(1) << 60)
        throw ArgumentError("seqlen_q", util::format("batch {} x heads_q {} x seqlen_q {} needs a workspace past 2^60 "
                                                     "bytes",
                                                     batch, heads_q, seqlen_q));
    w.dq_accum = 0;
    w.lse2 = align256(w.dq_accum + rows * std::size_t(geometry::bwd_dq_stride(pad_qk)) * 4);
    w.delta = align256(w.lse2 + rows * 4);
    w.dq_sem = align256(w.delta + rows * 4);
    w.bytes = align256(w.dq_sem + rows / std::size_t(geometry::bwd_turn_rows(block_m)) * 4);
    return w;
}

PlanSummary BackwardPlan::summary() const {
    PlanSummary s;
    s.padded_qk = pad_qk, s.padded_v = pad_v;
    s.block_m = block_m, s.block_n = block_n, s.warps = warps, s.stages = stages;
    s.smem_bytes = smem_bytes;
    s.vec_qk = vec_qk, s.vec_v = vec_v;
    s.useful_flop_fraction = useful_flop_fraction();
    s.kernel = kernel();
    s.reason = reason;
    return s;
}

std::string backward_plan_json(const BackwardPlan& p) {
    nlohmann::ordered_json j;
    j["family"] = p.family ? p.family->name() : "";
    j["head_dim_qk"] = p.head_dim_qk;
    j["head_dim_v"] = p.head_dim_v;
    j["pad_qk"] = p.pad_qk;
    j["pad_v"] = p.pad_v;
    j["dtype"] = p.bf16 ? "bf16" : "fp16";
    p.mask.to_json(j);
    j["varlen"] = p.varlen;
    j["arch"] = p.arch;
    j["block_m"] = p.block_m;
    j["block_n"] = p.block_n;
    j["warps"] = p.warps;
    j["sdp_warps_m"] = p.sdp_warps_m;
    j["dkv_warps_n"] = p.dkv_warps_n;
    j["dq_warps_m"] = p.dq_warps_m;
    j["bulk_dq"] = p.bulk_dq;
    j["stages"] = p.stages;
    j["vec_qk"] = p.vec_qk;
    j["vec_v"] = p.vec_v;
    j["smem_bytes"] = p.smem_bytes;
    j["reason"] = p.reason;
    return j.dump();
}

}  // namespace rtattn::plan
