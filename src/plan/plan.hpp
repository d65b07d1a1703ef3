// plan(): the one place that decides whether a config is supported and with which kernel family and tiles. Pure:
// no CUDA. The forward tile table is in forward_tiles.cpp, what each family needs in src/kernels/.
#pragma once
#include <string>

#include "core/config.hpp"
#include "plan/mask.hpp"
#include "rtattn/types.hpp"

namespace rtattn::kernels {
class ForwardFamily;
}
namespace rtattn::arch {
struct Arch;
}

namespace rtattn::plan {

struct KernelPlan {
    const kernels::ForwardFamily* family = nullptr;
    // What is computed.
    int head_dim_qk = 0, head_dim_v = 0;
    int pad_qk = 0;   // head_dim_qk rounded up to 16: the k of the MMA in QK^T
    int pad_v = 0;    // head_dim_v rounded up to pv_step (8: the n of mma.m16n8k16 in PV; 16 where the table says)
    int pv_step = 8;
    bool bf16 = true;
    MaskSpec mask;  // which keys each query sees
    bool varlen = false;  // packed sequences (cu_seqlens): every prefill family serves them through one trait
    std::string arch;
    // The tile: one row of the table, possibly overridden, then stepped down to fit the arch's shared memory.
    int block_m = 0, block_n = 0, warps = 0, stages = 0;  // `warps` counts the MMA warps
    // Knobs a family reads; a family's settle() leaves the others at these defaults.
    int m_tiles = 1;          // fwd_mma: 16-row MMA tiles per warp
    bool q_in_regs = false;   // fwd_mma: Q fragments loaded once into registers
    bool kv_apart = false;    // fwd_mma: a block's K and V loaded as two cp.async groups, V after the softmax
    bool swizzle = false;     // Hopper families: swizzled column panels (else interleaved 8x8 cores)
    bool ping_pong = false;   // fwd_sm90_ws: consumer warpgroups take turns on the tensor cores
    // fwd_sm90_ws, head dims 4 mod 8 and 8 mod 16 whose tail fits the last panel (geometry::split_fits: 36, 40, 68,
    // 72, 76, 84, ..., 132, 136, 140, ...): packed heads start off 32-byte (or 16-byte) boundaries, so TMA moves the
    // aligned main panels of each row, rotated, and the producer threads the other 4 to 28 columns.
    bool split_rows = false;
    // fwd_sm90_ws, head dims off the 16 grid (geometry::shift_fits): TMA moves whole rows from the 32-byte (or
    // 16-byte) boundary at or before each, so the tile holds them shifted right by up to 15 columns within the pads
    // (both to 16, or 16 columns more where that leaves no room), and the producer threads zero K's columns outside
    // the row. Where split rows fit too, forward_tiles.cpp's measured rule picks one.
    // fwd_mma, head dims off the 8 grid: K and V rows move as whole 16-byte vectors (cp.async) from the 16-byte
    // boundary before each, shifted right by up to 7 columns within pads that leave room (geometry::shifted_pad);
    // Q takes K's shift, O is stored from V's. Calls whose strides leave a head's rows unlike modulo 16 bytes load
    // kVec vectors at the same pads.
    bool shift_rows = false;
    // fwd_mma, head dims 4 mod 8 (geometry::rotated_rows): K and V rows move as 16-byte vectors rotated in shared
    // memory (Q with K's rotation, O stored rotated back) instead of 8-byte vectors, where that measured faster
    // (forward_tiles.cpp); calls whose strides leave rows unlike modulo 16 bytes take the 8-byte path anyway.
    bool rotate_rows = false;
    // The config's kv heads make packed K/V rows (heads_kv x d elements) a multiple of 16 bytes, as split rows' maps
    // need, and decode's rows that do not alternate rotation (dec/mma.cuh): the only way head counts enter a plan
    // (kv_rows_16b below).
    bool kv_rows_16b = true;
    // fwd_sm90_ws: V tiles in whole 64-column panels (the last one partly used), so PV is one wgmma of n = pad_v
    // per k-step instead of one per panel width (templates: sm90::WideLayout).
    bool wide_v = false;
    // fwd_sm90_ws: a CTA per SM loops over tiles (where O's staging fits shared memory: over Q at least), with O
    // staged in bytes of its own where those fit too (o_apart; geometry::kStage*).
    bool persistent = false, o_apart = false;
    bool paged_kv = false;    // K and V through a block table (decode, prefill against a paged cache)
    int vec_qk = 0, vec_v = 0;  // elements per global vector access (largest of 8/4/2/1 dividing the head dim)
    int smem_bytes = 0;
    std::string reason;  // the table row's reason, and what changed it
    // A tuning override (RTATTN_TILE, RTATTN_ROWS), not the table, chose the tile: its spills are reported as warnings;
    // the table's own choices are measured, spills included (README, known spills), and reported at info level.
    bool overridden = false;

    int threads() const;
    std::string kernel() const;  // the family's description, e.g. "wgmma, swizzled tiles, producer warpgroup"
    // Useful / issued MMA FLOPs per (query, key) pair: the cost of padding the head dims.
    double useful_flop_fraction() const { return double(head_dim_qk + head_dim_v) / double(pad_qk + pad_v); }
    PlanSummary summary() const;
};

struct PlanOptions {
    // Replaces the table's tile choice: "block_m,block_n,warps,m_tiles,stages,q_in_regs[,schedule[,swizzle
    // [,pv_step[,wide_v]]]]" (tools/bench/tile_sweep.sh times candidates this way). Empty: the table decides.
    std::string tile_override;
    std::string tile_field = "tile_override";  // what errors about it name (the Runtime says RTATTN_TILE when set)
    // The same for the backward table: "block_m,block_n,warps,sdp_warps_m,dkv_warps_n,dq_warps_m,stages[,bulk_dq]"
    // (RTATTN_BWD_TILE).
    std::string backward_tile_override;
    // How rows off the 16 grid load: "" the table's choice; for the warp-specialized Hopper forward "split" (split
    // rows where they fit, nothing shifted: the planner before shifted rows) or "shift" (shifted rows wherever they
    // fit); for the mma.sync forward off the 8 grid "shift" (shifted 16-byte rows wherever they apply), "rotate"
    // (at 4 mod 8: rotated 16-byte rows wherever they apply) or "plain" (kVec vectors). A timing knob (RTATTN_ROWS);
    // "split" leaves the mma.sync family at its table's choice, "rotate" and "plain" the Hopper one.
    std::string rows;
    std::string rows_field = "rows";
};

// Elements per global vector access for rows of `head_dim` 16-bit elements (8, 4, 2 or 1: the largest that divides
// it): what pointers and strides must be multiples of, for the forward and the backward alike.
int vector_width(int head_dim);

// Whether packed K and V rows of the config's kv heads (heads_kv x head_dim elements) are 16-byte multiples.
bool kv_rows_16b(const AttentionConfig& c);

// The config as far as the kernel depends on it: heads only through kv_rows_16b (kept as 8 or 1 heads), no softmax
// scale. Configs equal here share a kernel (the resolver's memo).
AttentionConfig kernel_relevant(AttentionConfig c);

// The part of a plan that the config alone fixes, the same for the forward and the backward: validates the config
// (its one check per resolve), requires a concrete arch, and fills head dims, pads (QK to 16, V to pad_v_step),
// dtype, mask, arch and vector widths. Returns the arch's facts. Defined for KernelPlan and BackwardPlan.
template <class Plan>
const arch::Arch& fill_problem(Plan& plan, const AttentionConfig& c, int pad_v_step);

// Validates the config (its one check per resolve) and plans it; config.arch must be non-empty (the Runtime resolves
// "current device" first). Throws ConfigError when the config is invalid or the plan cannot serve it: support and
// dispatch are one function.
KernelPlan plan(const AttentionConfig& config, const PlanOptions& options = {});

// The whole plan as JSON: what `rtattn info` and `ls` show, what a cache entry records and the stub's comment.
std::string plan_json(const KernelPlan& p);

}  // namespace rtattn::plan
