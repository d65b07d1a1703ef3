// What the Hopper families share on the host side: the swizzle-atom alignment of the forward tiles and the
// wgmma widths a plan issues (the renderer writes a wrapper for exactly those).
#pragma once
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "render/render.hpp"

namespace rtattn::kernels::sm90 {

// Swizzled tiles start on 1024-byte swizzle-atom boundaries, so K and V tiles of block_n rows must be whole multiples
// of 1024 bytes (64 rows always are; 96 rows of d_v 145, padded to 152, are not): narrow the key tile, or fall back to
// interleaved tiles, which have no such constraint.
void align_swizzled_tiles(plan::KernelPlan& p);

// The wgmma widths sm90::for_each_chunk (templates/sm90/gemm.cuh) issues for a GEMM of n columns.
std::vector<int> chunk_widths(int n);

// wgmma wrappers for the plan: QK^T (A and B from shared memory) in chunks of block_n columns; PV (A from registers)
// in chunks of pad_v columns, or one pad_v-wide instruction with wide V tiles.
std::string wgmma_wrappers(const plan::KernelPlan& p);

// "wgmma, swizzled tiles" / "wgmma, interleaved tiles".
std::string describe_tiles(const plan::KernelPlan& p);

}  // namespace rtattn::kernels::sm90
