// Tensor maps for the warp-specialized sm_90a kernel's TMA loads, encoded per launch (the pointers change).
#pragma once
#include "plan/plan.hpp"
#include "rtattn/runtime.hpp"
#include "rtattn_params.h"

namespace rtattn {

// Fills out.k_map / v_map / tma_seq_dim (and, for split-row plans, k_rot / v_rot) and sets out.use_tma. use_tma
// stays 0, and the kernel loads with cp.async, when the tiles are not swizzled or a map cannot be encoded: a base
// or stride not 16-byte aligned (e.g. a head dim not a multiple of 8 packed as [B, S, H, D], unless the plan splits
// rows; a box may not start mid-16 bytes, so there is no other way around).
// RTATTN_TMA=0 in the environment (read once) forces the cp.async path: for timing the two against each other.
void encode_kv_maps(const plan::KernelPlan& plan, const ForwardArgs& a, int heads_kv, FwdParamsTma& out);

}  // namespace rtattn
