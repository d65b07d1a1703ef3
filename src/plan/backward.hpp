// plan_backward(): which backward kernel family and tiles serve a config, from the backward tile table
// (backward_tiles.cpp), and the workspace a call needs. Pure: no CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.hpp"
#include "core/runtime.hpp"

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
    bool bf16 = true, causal = false;
    std::string arch;
    int block_m = 0;    // query rows per step of the main kernel
    int block_n = 0;    // keys per CTA
    int warps = 0;
    int col_split = 1;  // warps sharing a 16-key row group of dK/dV (block_n = 16 * warps / col_split)
    int vec_qk = 0, vec_v = 0;
    int smem_bytes = 0;
    std::string reason;

    int threads() const { return warps * 32; }
    std::string kernel() const;
    double useful_flop_fraction() const { return double(head_dim_qk + head_dim_v) / double(pad_qk + pad_v); }
    BackwardWorkspace workspace(int batch, int heads_q, int seqlen_q) const;
    PlanSummary summary() const;
};

// Validates the config and plans its backward; config.arch must be non-empty. Throws ConfigError when it cannot be
// served.
BackwardPlan plan_backward(const AttentionConfig& config);

std::string backward_plan_json(const BackwardPlan& p);

}  // namespace rtattn::plan
