// The backward tile table and plan_backward(): tiles per padded head dim and arch, a reason on every row.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "arch/arch.hpp"
#include "common/geometry.h"
#include "core/errors.hpp"
#include "kernels/backward.hpp"
#include "plan/backward.hpp"

namespace rtattn::plan {

namespace {

struct BwdTileRow {
    const kernels::BackwardFamily& (*family)();
    int max_pad;     // largest padded head dim (the larger of the QK and V pads) the row serves
    int min_smem;    // the arch's shared memory per block must reach this (the tiles need it)
    int block_m, block_n, warps, col_split;
    const char* why;
};

using kernels::bwd_mma;

// dK and dV stay in registers for a CTA's whole life: a warp holds 16 keys x (pad_qk + pad_v) / col_split columns,
// (pad_qk + pad_v) / (2 * col_split) fp32 registers per thread, which the rows keep at or below 128. First row whose
// pad and shared memory fit wins.
constexpr BwdTileRow kBwdTiles[] = {
    {bwd_mma, 64, 0, 64, 128, 8, 1,
     "d<=64: 128 keys per CTA, one warp per 16 keys holding all of dK/dV (<=64 fp32 registers): Q/dO are re-read "
     "once per 128 keys"},
    {bwd_mma, 128, 0, 64, 64, 8, 2,
     "d<=128: 64 keys per CTA, two warps per 16 keys each holding half of dK/dV's columns (<=64 registers), so S, "
     "dP and the dQ fragments fit beside them without spilling"},
    {bwd_mma, 256, 160 * 1024, 32, 64, 8, 2,
     "d<=256 with >=160 KB of shared memory (sm_80, sm_90): 64 keys, two warps per 16 keys (<=128 registers of "
     "dK/dV); 32 query rows per step, so each warp's dQ fragment is 16x64 (64 query rows spilled at 255 registers), "
     "110 KB"},
    {bwd_mma, 256, 0, 32, 32, 4, 2,
     "d<=256 on ~100 KB of shared memory (sm_86, sm_89): 32x32 tiles, 4 warps, 73 KB"},
};

int vec_for(int d) {
    for (int v : {8, 4, 2})
        if (d % v == 0) return v;
    return 1;
}

std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

BackwardPlan plan_backward(const AttentionConfig& c) {
    c.validate();
    if (c.arch.empty()) throw ConfigError("arch", "must be resolved to a concrete arch before planning");
    const arch::Arch& ai = arch::get(c.arch);
    BackwardPlan p;
    p.head_dim_qk = c.head_dim_qk;
    p.head_dim_v = c.dv();
    p.pad_qk = geometry::round_up(p.head_dim_qk, 16);
    p.pad_v = geometry::round_up(p.head_dim_v, 16);
    p.bf16 = c.dtype == Dtype::bf16;
    p.causal = c.causal;
    p.arch = c.arch;
    p.vec_qk = vec_for(p.head_dim_qk);
    p.vec_v = vec_for(p.head_dim_v);
    const int pad = std::max(p.pad_qk, p.pad_v);
    for (const BwdTileRow& row : kBwdTiles) {
        const kernels::BackwardFamily& f = row.family();
        if (pad > row.max_pad || ai.smem_optin < row.min_smem || !f.runs_on(ai)) continue;
        p.family = &f;
        p.block_m = row.block_m, p.block_n = row.block_n, p.warps = row.warps, p.col_split = row.col_split;
        p.reason = row.why;
        break;
    }
    if (!p.family) throw ConfigError("head_dim_qk", fmt::format("no backward tile serves d{}/{} on {}", p.head_dim_qk,
                                                                p.head_dim_v, c.arch));
    p.smem_bytes = p.family->smem_bytes(p);
    if (p.smem_bytes > ai.smem_optin)
        throw ConfigError("arch", fmt::format("{} has {} B of shared memory per block; the d{}/{} backward needs {} B",
                                              ai.name, ai.smem_optin, p.head_dim_qk, p.head_dim_v, p.smem_bytes));
    return p;
}

std::string BackwardPlan::kernel() const { return family->describe(*this); }

BackwardWorkspace BackwardPlan::workspace(int batch, int heads_q, int seqlen_q) const {
    BackwardWorkspace w;
    w.m_pad = (std::int64_t(seqlen_q) + block_m - 1) / block_m * block_m;
    const std::size_t rows = std::size_t(batch) * std::size_t(heads_q) * std::size_t(w.m_pad);
    w.dq_accum = 0;
    w.lse2 = align256(w.dq_accum + rows * std::size_t(pad_qk) * 4);
    w.delta = align256(w.lse2 + rows * 4);
    w.dq_sem = align256(w.delta + rows * 4);
    w.bytes = align256(w.dq_sem + rows / std::size_t(block_m) * 4);
    return w;
}

PlanSummary BackwardPlan::summary() const {
    PlanSummary s;
    s.padded_qk = pad_qk, s.padded_v = pad_v;
    s.block_m = block_m, s.block_n = block_n, s.warps = warps, s.stages = 1;
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
    j["causal"] = p.causal;
    j["arch"] = p.arch;
    j["block_m"] = p.block_m;
    j["block_n"] = p.block_n;
    j["warps"] = p.warps;
    j["col_split"] = p.col_split;
    j["vec_qk"] = p.vec_qk;
    j["vec_v"] = p.vec_v;
    j["smem_bytes"] = p.smem_bytes;
    j["reason"] = p.reason;
    return j.dump();
}

}  // namespace rtattn::plan
