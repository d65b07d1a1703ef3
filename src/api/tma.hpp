// Tensor maps for the warp-specialized sm_90a kernel's TMA loads, encoded per launch (the pointers change).
#pragma once
#include "plan/plan.hpp"
#include "rtattn/runtime.hpp"
#include "rtattn_params.h"

namespace rtattn {

// Fills out.k_map / v_map / tma_seq_dim and sets out.use_tma. use_tma stays 0, and the kernel loads with cp.async,
// when the tiles are not swizzled or a map cannot be encoded: base or a stride not 16-byte aligned (any head dim
// not a multiple of 8 packed as [B, S, H, D]; a box may not start mid-16 bytes either, so there is no way around).
// RTATTN_TMA=0 in the environment (read once) forces the cp.async path: for timing the two against each other.
void encode_kv_maps(const plan::KernelPlan& plan, const ForwardArgs& a, int heads_kv, FwdParamsTma& out);

}  // namespace rtattn
