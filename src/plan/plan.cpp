#include "plan/plan.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>

#include "arch/arch.hpp"
#include "common/geometry.h"
#include "kernels/forward.hpp"
#include "plan/backward.hpp"
#include "plan/forward_tiles.hpp"
#include "core/errors.hpp"
#include "util/format.hpp"

namespace rtattn::plan {

int vector_width(int d) {
    for (int v : {8, 4, 2})
        if (d % v == 0) return v;
    return 1;
}

bool kv_rows_16b(const AttentionConfig& c) {
    return std::int64_t(c.num_heads_kv) * c.head_dim_qk % 8 == 0 && std::int64_t(c.num_heads_kv) * c.dv() % 8 == 0;
}

namespace {
// The forward families whose loads gather a paged cache's rows (through the block table): the warp-specialized
// wgmma kernel (TMA boxes of a page, or cp.async) and mma.sync; the cooperative wgmma kernel does not.
bool gathers_pages(const KernelPlan& p) {
    return p.family == &kernels::fwd_sm90_ws() || p.family == &kernels::fwd_mma();
}
}  // namespace

AttentionConfig kernel_relevant(AttentionConfig c) {
    c.num_heads_q = c.num_heads_kv = kv_rows_16b(c) ? 8 : 1;  // 8 heads: always 16-byte rows; 1: as the config's
    c.softmax_scale.reset();
    return c;
}

template <class Plan>
const arch::Arch& fill_problem(Plan& plan, const AttentionConfig& c, int pad_v_step) {
    c.validate();
    if (c.arch.empty()) throw ConfigError("arch", "must be resolved to a concrete arch before planning");
    plan.head_dim_qk = c.head_dim_qk;
    plan.head_dim_v = c.dv();
    plan.pad_qk = geometry::round_up(plan.head_dim_qk, 16);
    plan.pad_v = geometry::round_up(plan.head_dim_v, pad_v_step);
    plan.bf16 = c.dtype == Dtype::bf16;
    plan.mask = {c.causal, c.local, c.sinks, c.softcap, c.alibi};
    plan.varlen = c.varlen;
    plan.arch = c.arch;
    plan.vec_qk = vector_width(plan.head_dim_qk);
    plan.vec_v = vector_width(plan.head_dim_v);
    return arch::get(c.arch);
}
template const arch::Arch& fill_problem(KernelPlan&, const AttentionConfig&, int);
template const arch::Arch& fill_problem(BackwardPlan&, const AttentionConfig&, int);

KernelPlan plan(const AttentionConfig& c, const PlanOptions& options) {
    KernelPlan p;
    if (c.decode) {
        const arch::Arch& ai = fill_problem(p, c, 16);
        p.paged_kv = c.paged_kv;
        p.kv_rows_16b = kv_rows_16b(c);
        choose_decode_tile(p, ai);
        if (!options.tile_override.empty()) apply_decode_tile_override(p, ai, options.tile_override, options.tile_field);
        return p;
    }
    // V pads to 8 first (the n of mma.m16n8k16 in PV); a table row may ask for 16.
    const arch::Arch& ai = fill_problem(p, c, 8);
    // A paged cache in prefill (chunked prefill against it): the warp-specialized Hopper kernel, whose producer
    // boxes K/V by TMA a page at a time (fwd/sm90_ws.cuh, KvBoxes), where its rows go by TMA; else the mma.sync
    // family. (The cooperative wgmma kernel, with a table lookup per 16-byte cp.async, ran 0.29-0.31x the dense
    // kernel on an H200, mma.sync 0.38-0.42x.)
    p.paged_kv = c.paged_kv;
    p.kv_rows_16b = kv_rows_16b(c);
    choose_forward_tile(p, ai, false, options.rows, options.rows_field);
    p.overridden = !options.rows.empty();
    if (c.paged_kv && !gathers_pages(p)) {
        choose_forward_tile(p, ai, /*mma_only=*/true, options.rows, options.rows_field);
        p.reason += "; paged KV cache without TMA rows: the mma.sync family (the cooperative kernel's loads do not "
                    "gather pages)";
    } else if (c.paged_kv && p.family == &kernels::fwd_sm90_ws()) {
        p.reason += "; paged KV cache: TMA boxes of a page or less, a table lookup per box";
    }
    if (!options.tile_override.empty()) {
        apply_tile_override(p, options.tile_override, options.tile_field);
        if (c.paged_kv && !gathers_pages(p))
            throw ConfigError(options.tile_field, "a paged KV cache runs on the warp-specialized wgmma kernel "
                                                  "(schedule 1 or 2) or the mma.sync one; schedule 0 (cooperative) "
                                                  "does not gather pages");
    }
    const int asked_block_n = p.block_n;
    p.family->settle(p);
    // An override is run as asked or refused: the swizzled Hopper tiles narrow a key tile that is not whole 1024-byte
    // blocks (48 keys at pad 272), which a table row never asks for but an override may.
    if (!options.tile_override.empty() && p.block_n != asked_block_n)
        throw ConfigError(options.tile_field,
                          util::format("block_n ({}) does not fit the {} kernel at d{}/{} (swizzled K and V tiles are "
                                       "whole 1024-byte blocks: {} keys would run); ask for {}",
                                       asked_block_n, p.family->name(), p.head_dim_qk, p.head_dim_v, p.block_n,
                                       p.block_n));

    // Arches with less shared memory: narrow the key tile to 64 first (per-tile overhead grows, but the pipeline
    // keeps hiding load latency), then to 32 before giving up the second stage (d128 on 99 KB: 128 x 32 with two
    // stages, FlashAttention 2's sm8x shape, where one stage of 64 keys spilled at 255 registers), then give up
    // pipeline depth, then narrow further.
    p.smem_bytes = p.family->smem_bytes(p);
    while (p.smem_bytes > ai.smem_optin) {
        if (p.block_n > 64)
            p.block_n = std::max(64, p.block_n / 32 * 16);  // halve, staying a multiple of 16
        else if (p.stages > 2)
            --p.stages;
        else if (p.block_n > 32)
            p.block_n /= 2;
        else if (p.stages > p.family->min_stages())
            --p.stages;
        else if (p.block_n > 16)
            p.block_n /= 2;
        else
            throw ConfigError("arch", util::format("{} has {} B of shared memory per block; d{}/{} needs {} B",
                                                   ai.name, ai.smem_optin, p.head_dim_qk, p.head_dim_v, p.smem_bytes));
        p.family->settle(p);
        p.smem_bytes = p.family->smem_bytes(p);
        p.reason += util::format("; stepped down to {} stage(s), block_n {} to fit {} KB", p.stages, p.block_n,
                                 ai.smem_optin / 1024);
    }
    return p;
}

int KernelPlan::threads() const { return family->threads(*this); }

std::string KernelPlan::kernel() const { return family->describe(*this); }

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

std::string plan_json(const KernelPlan& p) {
    nlohmann::ordered_json j;
    j["family"] = p.family->name();
    j["kernel"] = p.kernel();
    j["head_dim_qk"] = p.head_dim_qk;
    j["head_dim_v"] = p.head_dim_v;
    j["pad_qk"] = p.pad_qk;
    j["pad_v"] = p.pad_v;
    j["pv_step"] = p.pv_step;
    j["dtype"] = p.bf16 ? "bf16" : "fp16";
    p.mask.to_json(j);
    j["varlen"] = p.varlen;
    j["arch"] = p.arch;
    j["block_m"] = p.block_m;
    j["block_n"] = p.block_n;
    j["warps"] = p.warps;
    j["threads"] = p.threads();
    j["stages"] = p.stages;
    j["m_tiles"] = p.m_tiles;
    j["q_in_regs"] = p.q_in_regs;
    j["kv_apart"] = p.kv_apart;
    j["swizzle"] = p.swizzle;
    j["ping_pong"] = p.ping_pong;
    j["split_rows"] = p.split_rows;
    j["shift_rows"] = p.shift_rows;
    j["rotate_rows"] = p.rotate_rows;
    j["wide_v"] = p.wide_v;
    j["persistent"] = p.persistent;
    j["o_apart"] = p.o_apart;
    j["paged_kv"] = p.paged_kv;
    j["vec_qk"] = p.vec_qk;
    j["vec_v"] = p.vec_v;
    j["smem_bytes"] = p.smem_bytes;
    j["useful_flop_fraction"] = p.useful_flop_fraction();
    j["reason"] = p.reason;
    return j.dump();
}

}  // namespace rtattn::plan
