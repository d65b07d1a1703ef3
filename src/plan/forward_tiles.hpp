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
// The same for a decode plan: "block_m,block_n,warps,m_tiles,stages[,q_in_regs]" (q_in_regs 0: decode keeps Q in
// shared memory), checked against the arch's shared memory.
void apply_decode_tile_override(KernelPlan& p, const arch::Arch& a, const std::string& text, const std::string& field);
// Reads up to `count` comma-separated whole numbers of an override into v (names[i] in errors); returns how many, or
// -1 where more follow.
int parse_tile_fields(const std::string& text, const std::string& field, const char* const* names, int count, int* v);

}  // namespace rtattn::plan
