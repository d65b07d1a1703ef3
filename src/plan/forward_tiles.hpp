// The forward operation's tile table (forward_tiles.cpp).
#pragma once
#include <string>

#include "arch/arch.hpp"
#include "plan/plan.hpp"

namespace rtattn::plan {

// Fills the plan's family and tile fields (and reason) from the first row that serves its padded head dims on `a`.
// mma_only: only the mma.sync family's rows (a paged cache where the Hopper kernels have no TMA rows). rows:
// PlanOptions::rows ("", "split", "shift", "rotate" or "plain"; errors name rows_field).
void choose_forward_tile(KernelPlan& p, const arch::Arch& a, bool mma_only = false, const std::string& rows = "",
                         const std::string& rows_field = "rows");
// The same for decode configs, from the decode table (decode_tiles.cpp); steps down to fit the arch's shared memory.
void choose_decode_tile(KernelPlan& p, const arch::Arch& a);
// Replaces them with a tile given as text (PlanOptions::tile_override); errors name `field`.
void apply_tile_override(KernelPlan& p, const std::string& text, const std::string& field);

}  // namespace rtattn::plan
