// plan_backward(): which backward kernel family and tiles serve a config, from the backward tile table
// (backward_tiles.cpp), and the workspace a call needs. Pure: no CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.hpp"
#include "plan/mask.hpp"
#include "rtattn/types.hpp"

namespace rtattn::kernels {
class BackwardFamily;
}

namespace rtattn::plan {

// Where the parts of a call's workspace start (bytes from its base, each 256-byte aligned) and its size.
struct BackwardWorkspace {
    std::int64_t m_pad = 0;  // rows per (batch, query head): seqlen_q rounded up to block_m
    std::size_t dq_accum = 0, lse2 = 0, delta = 0, dq_sem = 0, bytes = 0;
};

struct BackwardPlan {
    const kernels::BackwardFamily* family = nullptr;
    int head_dim_qk = 0, head_dim_v = 0;
    int pad_qk = 0, pad_v = 0;  // both rounded up to 16: each is the k of an MMA here (QK^T, dO V^T)
    bool bf16 = true;
    MaskSpec mask;  // which keys each query sees
    bool varlen = false;  // packed sequences (cu_seqlens): the same kernels, addressing through them
    std::string arch;
    int block_m = 0;    // query rows per step of the main kernel
    int block_n = 0;    // keys per CTA
    int warps = 0;
    // How the warps split each GEMM's output (the rest of the warps split the other dimension):
    int sdp_warps_m = 0;  // S and dP (block_m x block_n): warps along the query rows
    int dkv_warps_n = 0;  // dK and dV (block_n x pad): warps along the keys
    int dq_warps_m = 0;   // dQ (block_m x pad_qk): warps along the query rows
    int stages = 1;       // Q/dO buffers: 2 loads the next query block while this one computes
    bool bulk_dq = false; // dQ added by one bulk reduction per step (sm_90) instead of an atomic per element
    int vec_qk = 0, vec_v = 0;
    int smem_bytes = 0;
    std::string reason;
    bool overridden = false;  // RTATTN_BWD_TILE chose the tile (KernelPlan::overridden)

    int threads() const;  // the family's: its main kernel's CTA
    std::string kernel() const;
    double useful_flop_fraction() const { return double(head_dim_qk + head_dim_v) / double(pad_qk + pad_v); }
    BackwardWorkspace workspace(int batch, int heads_q, int seqlen_q) const;
    PlanSummary summary() const;
};

// Validates the config and plans its backward; config.arch must be non-empty. Throws ConfigError when it cannot be
// served. `tile_override` ("block_m,block_n,warps,sdp_warps_m,dkv_warps_n,dq_warps_m,stages[,bulk_dq]",
// RTATTN_BWD_TILE) replaces the table's choice:
// a tuning knob, checked as the table's rows are.
BackwardPlan plan_backward(const AttentionConfig& config, const std::string& tile_override = "");

std::string backward_plan_json(const BackwardPlan& p);

}  // namespace rtattn::plan
