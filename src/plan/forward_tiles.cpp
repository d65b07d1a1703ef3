// The forward tile table: which kernel family and tiles serve a head dim on an arch, with the measurement behind
// each row; and the tile override that replaces a row for timing variants.
#include "util/format.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/geometry.h"
#include "kernels/forward.hpp"
#include "plan/forward_tiles.hpp"
#include "core/errors.hpp"
#include "util/text.hpp"

namespace rtattn::plan {

namespace {

struct TileRow {
    const kernels::ForwardFamily& (*family)();
    int max_pad;  // largest padded head dim (the larger of the QK and V pads) the row serves
    int block_m;  // query rows per CTA = warps * m_tiles * 16
    int block_n;  // keys per K/V tile
    int warps;    // MMA warps (a producer warpgroup comes on top)
    int m_tiles = 1;           // fwd_mma: 16-row MMA tiles per warp: more reuse each K/V fragment, at a register cost
    int stages = 2;            // K/V ring depth
    bool q_in_regs = false;    // fwd_mma: Q fragments loaded once into registers (vs. re-read every K tile)
    bool kv_apart = false;     // fwd_mma: K and V of a block in two load groups, V issued after the softmax
    bool swizzle = false;      // Hopper: swizzled column panels (else interleaved 8x8 cores throughout)
    bool ping_pong = false;    // fwd_sm90_ws: consumer warpgroups take turns on the tensor cores
    int pv_step = 8;           // head_dim_v is padded to a multiple of this: 8 (the MMA's n step), or 16
    // Serves only head dims that load in 16-byte vectors: multiples of 8, and shifted rows (fwd_mma) up to pad 96,
    // 80 at odd head dims (ptxas, sm_80 and sm_86: past those they spilled 4-56 bytes in FA2's shape; odd dims load
    // Q an element at a time).
    bool whole_vectors = false;
    const char* why;
};

using kernels::fwd_mma;
using kernels::fwd_sm90_ws;

// Rows were chosen by timing candidates on an H200 (tools/bench/tile_sweep.sh, bf16, S=16k; docs/PERFORMANCE.md).
// The first row whose family the arch can run and whose max_pad covers the head dim wins.
constexpr TileRow kTiles[] = {
    // sm_90a: wgmma. A producer warpgroup streams K/V tiles (TMA where the layout allows, else cp.async) while
    // 64-row consumer warpgroups overlap the softmax of block j with the PV of block j-1; ping-pong also has the
    // consumer warpgroups take turns on the tensor cores. Figures: H200, bf16, S=16k, non-causal/causal TFLOPS.
    {.family = fwd_sm90_ws, .max_pad = 64, .block_m = 192, .block_n = 128, .warps = 12, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, d<=64: three consumer warpgroups (192 rows) halve K/V traffic per FLOP: 526/495 TFLOPS at d64 vs "
            "427/400 with 128 rows and 367/358 with 64-key tiles"},
    {.family = fwd_sm90_ws, .max_pad = 96, .block_m = 128, .block_n = 128, .warps = 8, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, d<=96: 128x128 tiles, 562/518 TFLOPS at d96 vs 475/444 with 64-key tiles; 192 rows spill at 160 "
            "registers"},
    {.family = fwd_sm90_ws, .max_pad = 112, .block_m = 128, .block_n = 128, .warps = 8, .swizzle = true,
     .ping_pong = true, .why = "sm_90a, 96<d<=112: as d<=96; d100 (split rows) 468/462 TFLOPS vs 419/392 without turn-taking"},
    {.family = fwd_sm90_ws, .max_pad = 128, .block_m = 128, .block_n = 128, .warps = 8, .swizzle = true,
     .pv_step = 16,
     .why = "sm_90a, d<=128: 128x128 tiles without turn-taking, 674/631 TFLOPS at d128 vs 611/628 with it, 626/633 "
            "with 3 stages, 525/520 with 64-key tiles, 379/355 with 176 keys (spills). V padded to 16: d120 as one "
            "128-wide PV chunk ran 566/584 TFLOPS vs 461/432 as four (64+32+16+8); elsewhere 16 did not pay (d132 "
            "543/554 vs 565/556)"},
    {.family = fwd_sm90_ws, .max_pad = 144, .block_m = 128, .block_n = 128, .warps = 8, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, 128<d<=144: 128x128 tiles with turn-taking, d132 (split rows) 544-558/567-578 TFLOPS vs 546-570/"
            "556-561 without (a tie, kept for causal); 64-key tiles 460/451, 96 keys x 3 stages 468/475"},
    {.family = fwd_sm90_ws, .max_pad = 160, .block_m = 128, .block_n = 128, .warps = 8, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, 128<d<=160: 128x128 tiles, 678/655 TFLOPS at d160 vs 609/582 with 96 keys, 561/538 with 64"},
    {.family = fwd_sm90_ws, .max_pad = 192, .block_m = 128, .block_n = 112, .warps = 8, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, d<=192: 112-key tiles (fewer where a 1024-byte tile alignment needs it), 663/609 TFLOPS at d192 "
            "vs 620/606 with 96 keys and 629/578 with 64"},
    {.family = fwd_sm90_ws, .max_pad = 256, .block_m = 128, .block_n = 64, .warps = 8, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, d<=256: 64-key tiles leave registers for O (128 fp32/thread): 699/610 TFLOPS at d256 vs 670/614 "
            "without turn-taking and 648/583 with 80 keys (spills when causal)"},
    {.family = fwd_sm90_ws, .max_pad = 272, .block_m = 128, .block_n = 32, .warps = 8, .stages = 3, .swizzle = true,
     .ping_pong = true,
     .why = "sm_90a, shifted rows of d251, 253, 254, 255 (the shift needs 4-7 columns past 256): O at 136 fp32/thread "
            "spilled 88-104 bytes with 64-key tiles (36-56 with 232 consumer registers); 32-key tiles and 3 stages: "
            "d253 381/348 TFLOPS vs 339/309 with 2 stages and 360/334 without turn-taking, 0.51-0.71 of the d256 "
            "ideal where mma.sync ran 0.08 (H200)"},
    // Every arch: mma.sync m16n8k16.
    {.family = fwd_mma, .max_pad = 64, .block_m = 128, .block_n = 64, .warps = 4, .m_tiles = 2, .q_in_regs = true,
     .why = "d<=64: accumulators are small, so two m-tiles per warp halve K/V shared-memory reads per MMA"},
    {.family = fwd_mma, .max_pad = 128, .block_m = 128, .block_n = 64, .warps = 4, .m_tiles = 2, .kv_apart = true,
     .whole_vectors = true,
     .why = "d<=128, multiples of 8: FlashAttention-2's shape, 4 warps x 32 rows (each K/V fragment feeds two "
            "m-tiles), K and V loaded apart (together it spills 20 bytes at d128): d128 338-345/308-316 TFLOPS vs "
            "291/292 with the 8-warp row below, d120 315/292 vs 270/273, d96 307/303 vs 264/257, d80 283/273 vs "
            "240/238. Narrower vectors' loads need registers this shape does not have (spills). Loading apart costs "
            "a barrier: 8-warp rows ran 11-17% slower with it, the d<=64 row 4%"},
    {.family = fwd_mma, .max_pad = 144, .block_m = 128, .block_n = 128, .warps = 8, .q_in_regs = true,
     .why = "d<=144 (d<=128 where not a multiple of 8): 8 warps x 16 rows keep O (<=72 fp32/thread) and Q fragments "
            "in registers; 128-key tiles halve the per-tile softmax and barrier overhead (+12% over 64 at d128)"},
    {.family = fwd_mma, .max_pad = 192, .block_m = 128, .block_n = 64, .warps = 8,
     .why = "d<=192: O needs up to 96 fp32/thread, so Q is re-read from shared memory instead of pinned in registers"},
    {.family = fwd_mma, .max_pad = 256, .block_m = 128, .block_n = 64, .warps = 8,
     .why = "d<=256: O needs 128 fp32/thread; 8 warps x 16 rows with Q in shared memory stay spill-free and beat "
            "FA2's 64x64/4-warp shape by 30% on Hopper"},
};

// Whether the Hopper kernels can load K/V with TMA: head dims that are multiples of 8 always; 4 mod 8 by split rows
// (geometry.h) where the tail fits the last panel and the config's kv heads make packed rows 16-byte multiples
// (the maps' seq stride; a box may not start off 16 bytes, so there is no other way around).
// The producer holds the next tile's tails in registers: one vector per tensor fits everywhere (d36 with three
// consumer warpgroups, whose producer has 32 registers); three fit the 64 of two consumers when K and V share a
// head dim, where d44 (three consumers) and d76/140 (two load loops) spilled 32 bytes.
bool tma_addressable(const KernelPlan& p) {
    if (p.shift_rows || (p.vec_qk == 8 && p.vec_v == 8)) return true;
    const bool one_vector = p.head_dim_qk - geometry::split_main(p.pad_qk) == geometry::kSplitTail &&
                            p.head_dim_v - geometry::split_main(p.pad_v) == geometry::kSplitTail;
    return p.kv_rows_16b && geometry::split_rows_fit(p.head_dim_qk, p.pad_qk, p.head_dim_v, p.pad_v) &&
           (one_vector || (p.warps < 12 && p.head_dim_qk == p.head_dim_v));
}

// Where the Hopper kernels have no TMA path, the mma.sync kernel ran faster than the cooperative wgmma one for odd
// head dims (2-byte loads: 1.03-1.40x) and for d<=64 of 4 mod 8 (1.22-1.41x); for the wider 4 mod 8 dims the
// cooperative kernel stayed ahead or even (d76 0.91x, d108 1.02x, d140 0.91x, d252 0.87x with mma.sync). Head dims
// of 2 mod 4 were not measured and keep the cooperative kernel. H100, `.devbuild/mma26.sh`, docs/PERFORMANCE.md.
bool mma_beats_cp_async(const KernelPlan& p) {
    const bool odd = p.vec_qk == 1 || p.vec_v == 1;
    const bool narrow_4_mod_8 = std::max(p.pad_qk, p.pad_v) <= 64 && p.vec_qk == 4 && p.vec_v == 4;
    return odd || narrow_4_mod_8;
}

// Shifted rows (geometry::shift_fits): whole rows by TMA, shifted to 32-byte (or 16-byte) aligned boxes, wherever the
// kv heads make packed rows 16-byte multiples. Each tensor's row needs room for its shift beyond the head dim: the
// pad to 16, or 16 columns more where that leaves too little (d = 11, 13, 14, 15 mod 16: 16 more columns of MMA
// work, against kernels without TMA at 0.1-0.3 of the pad16 ideal), within the table's widest row (272: d251, 253,
// 254 and 255 on a row of their own, where d_qk = d_v: pairs with one side there spilled 8-44 bytes, 128/253, 251/200,
// 254/256). d162 and d226 take the 16 columns too: at the pad to 16 their consumers spilled 4 bytes (ptxas, every
// dtype and mask; no tile, staging or walk change removed it), at 192 and 256 none.
int shift_pad(int d) {
    const int pad = geometry::round_up(d, 16);
    return geometry::shift_fits(d, pad) && d != 162 && d != 226 ? pad : pad + 16;
}
bool shift_addressable(const KernelPlan& p) {
    const int pad_qk = shift_pad(p.head_dim_qk), pad_v = shift_pad(p.head_dim_v);
    const int widest = std::max(pad_qk, pad_v);
    const bool row = widest <= AttentionConfig::kMaxHeadDim ||
                     (widest <= shift_pad(AttentionConfig::kMaxHeadDim - 1) && p.head_dim_qk == p.head_dim_v);
    return p.kv_rows_16b && row &&
           geometry::shift_rows_fit(p.head_dim_qk, pad_qk, p.head_dim_v, pad_v);
}

// How the warp-specialized kernel loads rows off the 16 grid (rows: PlanOptions::rows). Split rows where every box of
// theirs starts 32-byte aligned (four head classes, each rotating its rows by up to 12 columns, which the tail must
// hold) and either their PV is narrower (8 mod 16 in one wide instruction: d72, 136, 200) or, at d108 and d236,
// shifted rows would put half the heads on 16-byte boxes (12 mod 16); or where their wide PV saves a tenth of V's
// padded width (d68: 72 columns, not 80; 4-6% on an H100 and an H200). At 12 mod 16 split rows ran 0-12% faster on an
// H100 and 0-8% on an H200 (fourteenth session), but since shifted rows zero from a cache and load Q in blocks
// (H200, thirty-eighth session, of the pad16 ideal, split / shifted, non-causal and causal): d76 1.00/0.97 vs
// 1.04/1.01, d140 0.91/0.93 vs 0.93/0.94, d172 0.89/0.88 vs 0.92/0.89, d204 0.91/0.96 vs 0.95/0.96, d220 0.91/0.88 vs
// 0.96/0.96 shifted; split still d108 0.93/0.92 vs 0.91/0.90, d236 0.96/0.96 vs 0.95/0.86. Not re-run on an H100.
// Shifted rows at every other head dim where they fit: split rows with 16-byte boxes ran 2-17% slower on the H100
// (d132 0.89/0.79 of the pad16 ideal vs 0.95/0.95, d196; d84, 92, 148, 156 in two classes) and even on the H200, and
// the other 8 mod 16 dims (104, 168, 232) and d212 ran as fast or faster shifted (H200). Each dim against pad16(d)
// interleaved, bf16, S = 16k (docs/PERFORMANCE.md, fourteenth session).
// The mma.sync forward at head dims 4 mod 8 where rows do not shift (rows: PlanOptions::rows; kv heads that leave
// packed rows off 16 bytes, whose calls may still pass strides that keep them alike): rotated 16-byte rows, or 8-byte
// vectors.
// Rotated rows measured faster (H200, pinned to sm_90, S=16k, H=16, each against pad16 in two rounds of each mode):
// at every 4 mod 8 dim from 148 up (1.00-1.09x non-causal, 0.99-1.06x causal; d252 0.85 -> 0.93 of the pad16
// ideal) and where a row is a power of two of 16-byte vectors, 4 or more, so every thread of a row copies (d36
// 1.07x, d68 1.02x, d132 1.05x: 0.88 -> 0.93). Elsewhere 8-byte vectors: d12-28 0.85-0.97x, d44-60 0.91-0.95x,
// d76 0.80x (9 vectors on 32 threads), d84-124 0.96-1.00x, d140 0.92x. Not for a paged cache (fwd/mma.cuh).
bool rotation_pays(int d, int vec) {
    const int vectors = (d - 4) / 8;
    return geometry::rotated_rows(d, vec) && (d >= 148 || (vectors >= 4 && (vectors & (vectors - 1)) == 0));
}
// Shifted rows on the mma.sync forward (fwd/mma.cuh): rows off the 8 grid as whole 16-byte vectors from the boundary
// before each, where the config's kv heads make packed rows 16-byte multiples (the calls' strides then keep a head's
// rows alike modulo 16 bytes; others take kVec vectors at the same pads), within the widest pad. Not for a paged cache.
// Against the pad16 ideal (H200 pinned to sm_90, S = 16k, H = 16, bf16, non-causal / causal; thirty-fourth session,
// one command, the loader's first form; the final one's sweep is in docs/PERFORMANCE.md), shifted / as before: d65
// 0.99 / 0.99 vs 0.34 / 0.28 (one element a copy), d129 0.95 / 0.93 vs 0.27 / 0.24, d130 0.99 / 0.99 vs 0.72 / 0.72,
// d250 0.93 / 0.95 vs 0.77 / 0.78; at 4 mod 8 against rotated or 8-byte rows d76 0.85 / 0.88 vs 0.76 / 0.84, d140
// 0.93 / 0.96 vs 0.85 / 0.87, d132 0.995 vs 0.98, d36, 100, 188 +1-3%, d252 even.
bool mma_shift_applies(const KernelPlan& p) {
    return !p.paged_kv && p.kv_rows_16b && (p.vec_qk < 8 || p.vec_v < 8) &&
           std::max(geometry::shifted_pad(p.head_dim_qk, 16), geometry::shifted_pad(p.head_dim_v, 8)) <=
               AttentionConfig::kMaxHeadDim;
}
void choose_mma_rows(KernelPlan& p, const std::string& rows) {
    p.shift_rows = mma_shift_applies(p) && rows != "rotate" && rows != "plain";
    if (p.shift_rows) {
        if (p.vec_qk < 8) p.pad_qk = geometry::shifted_pad(p.head_dim_qk, 16);
        if (p.vec_v < 8) p.pad_v = geometry::shifted_pad(p.head_dim_v, 8);
        p.reason += "; shifted rows: whole 16-byte vectors from the boundary before each row";
        return;
    }
    const bool applies = !p.paged_kv && (geometry::rotated_rows(p.head_dim_qk, p.vec_qk) ||
                                          geometry::rotated_rows(p.head_dim_v, p.vec_v));
    const bool pays = rotation_pays(p.head_dim_qk, p.vec_qk) || rotation_pays(p.head_dim_v, p.vec_v);
    p.rotate_rows = applies && (rows == "rotate" || (rows != "plain" && pays));
    if (p.rotate_rows) p.reason += "; rows as rotated 16-byte vectors";
}

void choose_rows(KernelPlan& p, const std::string& rows) {
    // Split rows with V padded to 16 where 8 would end in an 8-wide panel that leaves V's TMA part off the 32-column
    // grid (d84: 64 + 16 + 8): they then split like K (64 + 32), for a few percent more PV work.
    KernelPlan split = p;
    if (!tma_addressable(split) && split.pv_step == 8) {
        split.pv_step = 16, split.pad_v = geometry::round_up(p.head_dim_v, 16);
        split.reason += "; V padded to 16 so that its rows split like K's (split rows)";
    }
    const bool split_fits =
        tma_addressable(split) && geometry::split_rows_fit(p.head_dim_qk, p.pad_qk, p.head_dim_v, split.pad_v);
    const bool wide_pv =
        split.pad_v % 16 == 8 && geometry::split_fits(p.head_dim_v, geometry::v_tile_cols(split.pad_v, true));
    const int tail_k = p.head_dim_qk - geometry::split_main(p.pad_qk);
    const int tail_v = p.head_dim_v - geometry::split_main(geometry::v_tile_cols(split.pad_v, wide_pv));
    const auto rotation = [](int d) { return d % 8 == 4 ? 12 : 8; };  // the most a 32-byte box needs
    const bool boxes_32 = geometry::split_classes(tail_k, tail_v, p.block_n) == 4 &&
                          tail_k >= rotation(p.head_dim_qk) && tail_v >= rotation(p.head_dim_v);
    const bool pv_saves = wide_pv && 10 * (shift_pad(p.head_dim_v) - split.pad_v) >= shift_pad(p.head_dim_v);
    const bool split_boxes_pay = p.head_dim_qk == 108 || p.head_dim_qk == 236;  // the 12 mod 16 dims split ran faster
    const bool split_pays = split_fits && ((boxes_32 && (wide_pv || split_boxes_pay)) || pv_saves);
    // A paged cache's split rows would look a page up for every row's tail in the producer threads (d76..236 spilled
    // 4-104 bytes there); shifted rows look pages up only per box.
    const bool shift = rows == "shift"   ? shift_addressable(p)
                       : rows == "split" ? false
                                         : shift_addressable(p) && (!split_pays || p.paged_kv);
    if (shift) {
        p.shift_rows = true;
        p.pv_step = 16, p.pad_qk = shift_pad(p.head_dim_qk), p.pad_v = shift_pad(p.head_dim_v);
        p.reason += "; shifted rows: whole rows by TMA from 32-byte boundaries, V padded to 16 for the shift";
        if (p.pad_qk > geometry::round_up(p.head_dim_qk, 16) || p.pad_v > geometry::round_up(p.head_dim_v, 16))
            p.reason += ", 16 more columns where the pad to 16 leaves too little room for it";
    } else if (!tma_addressable(p) && tma_addressable(split)) {
        p.pv_step = split.pv_step, p.pad_v = split.pad_v, p.reason = split.reason;
    }
}

// Shifted rows leave K's columns outside each row to be zeroed in the producer, at odd head dims one 2-byte piece at
// a time. Three consumer warpgroups leave it 32 registers, too few for the zeroing cache (ZeroOutside) that two
// consumers' producer keeps; where a row leaves many columns to zero (pad - d), that costs more than 192 rows save.
// 128 / 192 rows, H200, bf16, S = 16k, H = 16, non-causal / causal (thirty-eighth session, docs/PERFORMANCE.md):
// 17-21 columns (d = 11, 13, 15 mod 16, which take 16 more) 1.09-1.26x / 1.12-1.35x (d43 0.59 -> 0.75 of the pad16
// ideal); 13-15 columns causal 1.03-1.17x (d17, 33, 35, 49, 51; non-causal 0.94-1.07x, kept); 11 or fewer 0.85-0.95x
// / 0.96-1.06x. Even dims zero in 4-byte pieces or none: d30, 46 (16 more columns) 0.88-0.94x non-causal. A window
// at any odd dim: its 192-row kernels spilled 4 bytes at d9, 17, 25, 33, 41, 49, 57 (ptxas; the window's bounds take
// registers), 128 rows none with or without sinks, caps, ALiBi or packed sequences; a window skips and masks tiles as
// causal does, where 128 rows ran 0.96-1.17x at every odd dim measured (not timed with a window).
bool odd_rows_leave_192(const KernelPlan& p) {
    const int zeroed = p.pad_qk - p.head_dim_qk;
    return p.vec_qk == 1 && (zeroed > 16 || p.mask.local || (p.mask.causal && zeroed >= 13));
}

// Why a three-consumer plan (192 query rows: a producer of 32 registers, consumers of 160) takes 128 rows instead
// (two consumer warpgroups at these pads: a producer of 64-72 registers, consumers of 208-216); nullptr: it keeps 192.
const char* why_two_consumers(const KernelPlan& p) {
    if (p.shift_rows && odd_rows_leave_192(p))
        return p.mask.local ? "odd head dim with a window: 128 query rows (192 spilled)"
                            : "odd head dim with many columns to zero: 128 query rows (the producer's zeroing cache)";
    // Packed causal sequences' tile walk plus the shifted rows' zeroing spilled 4 bytes in the producer (d33, 34, 41),
    // a paged cache's boxes 4-64 bytes (d1..60).
    if (p.shift_rows && p.paged_kv) return "paged KV cache: 128 query rows (three consumers' producer spilled)";
    if (p.shift_rows && p.varlen && p.mask.causal)
        return "packed causal sequences: 128 query rows (three consumers' producer spilled)";
    // Both score transforms at once: the consumers spilled 12-24 bytes at d48..64 (ptxas, bf16 and fp16, causal,
    // windowed or packed); either alone, or with two consumer warpgroups, none.
    if (p.mask.softcap && p.mask.alibi) return "softcap with ALiBi: 128 query rows (three consumers spilled)";
    return nullptr;
}

// The first row of the table that the arch runs and whose max_pad covers the plan's padded head dims.
const TileRow& find_row(const KernelPlan& p, const arch::Arch& a, bool mma_only) {
    const int widest = std::max(p.pad_qk, p.pad_v);
    for (const auto& r : kTiles)
        if (r.family().runs_on(a) && (!mma_only || &r.family() == &fwd_mma()) && widest <= r.max_pad &&
            (!r.whole_vectors || (p.vec_qk == 8 && p.vec_v == 8) ||
             (p.shift_rows && widest <= (std::min(p.vec_qk, p.vec_v) == 1 ? 80 : 96))))
            return r;
    throw ConfigError("head_dim_qk", util::format("padded width {} has no tile row; allowed head dims 1..{}", widest,
                                                  AttentionConfig::kMaxHeadDim));
}

// The row's family and tile into the plan, V padded to its pv_step.
void apply_row(KernelPlan& p, const TileRow& row) {
    p.family = &row.family();
    p.block_m = row.block_m;
    p.block_n = row.block_n;
    p.warps = row.warps;
    p.m_tiles = row.m_tiles;
    p.stages = row.stages;
    p.q_in_regs = row.q_in_regs;
    p.kv_apart = row.kv_apart;
    p.swizzle = row.swizzle;
    p.ping_pong = row.ping_pong;
    p.pv_step = row.pv_step;
    p.pad_v = geometry::round_up(p.head_dim_v, p.pv_step);  // the row's max_pad is a multiple of 16: still covered
    p.wide_v = true;  // a request: the family keeps it only where it applies
    p.reason = row.why;
}

}  // namespace

void choose_forward_tile(KernelPlan& p, const arch::Arch& a, bool mma_only, const std::string& rows,
                         const std::string& rows_field) {
    if (!rows.empty() && rows != "split" && rows != "shift" && rows != "rotate" && rows != "plain")
        throw ConfigError(rows_field, util::format("{} is not split, shift, rotate or plain (or empty: the table's "
                                                   "choice)",
                                                   util::quoted(rows)));
    const TileRow& row = find_row(p, a, mma_only);
    apply_row(p, row);
    p.shift_rows = p.rotate_rows = false;
    if (p.family == &fwd_mma()) {
        choose_mma_rows(p, rows);
        if (p.shift_rows) {  // the shifted pads' row, which may load whole vectors only
            const KernelPlan shifted = p;
            apply_row(p, find_row(shifted, a, true));
            p.pad_qk = shifted.pad_qk, p.pad_v = shifted.pad_v, p.shift_rows = true;
            p.reason += shifted.reason.substr(shifted.reason.find("; shifted rows"));
        }
    }
    if (p.family == &fwd_sm90_ws()) {
        choose_rows(p, rows);
        if (p.shift_rows && std::max(p.pad_qk, p.pad_v) > row.max_pad) {  // 16 more columns: the wider pads' row
            const KernelPlan shifted = p;
            apply_row(p, find_row(shifted, a, false));
            p.pad_qk = shifted.pad_qk, p.pad_v = shifted.pad_v, p.pv_step = shifted.pv_step, p.shift_rows = true;
            p.reason += shifted.reason.substr(shifted.reason.find("; shifted rows"));
        }
        if (const char* why = p.warps == 12 ? why_two_consumers(p) : nullptr) {
            p.block_m = 128, p.warps = 8;
            p.reason += std::string("; ") + why;
        }
        const int widest = std::max(p.pad_qk, p.pad_v);
        if (p.mask.alibi && !p.mask.softcap && widest == 224 && p.block_n == 64) {
            // ALiBi beside O at pad 224 spilled 8-12 bytes with 64-key tiles (ptxas, causal, packed causal, fp16:
            // d206, 210..224 even); 80 keys spill none there (paged, windowed, non-causal too) and ran even (H200,
            // S = 16k, 80 / 64 keys, non-causal / causal: d216 0.97 / 0.99, d224 1.01 / 0.99). At pad 208 the
            // family keeps 64 keys (1024-byte tile alignment), where nothing spilled.
            p.block_n = 80;
            p.reason += "; ALiBi: 80-key tiles (64 keys spilled)";
        }
        if (p.mask.softcap && p.mask.alibi && widest == 160 && p.block_n > 64) {
            // Both score transforms beside 128-key scores and O at pad 160 (d139..160): 40-60 bytes spilled, 76-100
            // with packed causal sequences; 64-key tiles spill none (ptxas, bf16 and fp16, causal, packed, paged,
            // windowed, with sinks). Pads up to 144 spill none with 128 keys.
            p.block_n = 64;
            p.reason += "; softcap with ALiBi: 64-key tiles (128 keys spilled)";
        }
    }
    if (p.family == &fwd_sm90_ws() && !tma_addressable(p) && mma_beats_cp_async(p)) {
        choose_forward_tile(p, a, true, rows, rows_field);
        p.reason += "; sm_90a without TMA (odd head dim, or d<=64 of 4 mod 8): the mma.sync kernel beat the "
                    "cooperative wgmma one on cp.async (H100, bf16, S=16k, TFLOPS non-causal/causal: d44 218/205 vs "
                    "167/159, d60 270/251 vs 216/206, d33 71/58 vs 51/42, d99 78/60 vs 56/55, d131 59/62 vs 54/56, "
                    "d255 57/60 vs 55/56)";
        return;
    }
    if (p.family == &fwd_sm90_ws() && !tma_addressable(p)) {
        // No TMA: the warp-specialized kernel on cp.async ran slower than the cooperative kernel (d132: 243 vs 253
        // TFLOPS; d100: 146).
        p.family = &kernels::fwd_sm90();
        p.ping_pong = false;
        p.reason += "; head dim not a multiple of 8 (no TMA): cooperative kernel";
        if (p.block_m > 128) {  // 192 rows spill in the cooperative kernel; its own d<=64 tile ran 272/272 TFLOPS
            // Swizzled tiles kept: d63 98/92 TFLOPS vs 98/65 interleaved, d60 210/201 vs 221/204.
            p.block_m = 128, p.warps = 8, p.block_n = 64;
            p.reason += ", 128x64 tiles";
        } else {
            // 128-key tiles: interleaved beats swizzled on cp.async, d140 262/243 vs 187/178, d108 242/235 vs 169/163.
            p.swizzle = false;
            p.reason += ", interleaved tiles";
        }
    }
}

int parse_tile_fields(const std::string& text, const std::string& field, const char* const* names, int count,
                      int* v) {
    // Every field a whole decimal number that fits, nothing after the last: a typo is an error, never a default.
    int n = 0;
    std::size_t at = 0;
    for (; at <= text.size() && n < count; ++n) {
        const std::size_t end = std::min(text.find(',', at), text.size());
        const std::string part = text.substr(at, end - at);
        char* stop = nullptr;
        errno = 0;
        const long x = std::strtol(part.c_str(), &stop, 10);
        if (part.empty() || *stop != '\0' || errno == ERANGE || x < -999 || x > 999)
            throw ConfigError(field, util::format("{} ({}) is not a number in -999..999 in {}", names[n],
                                                  util::quoted(part), util::quoted(text)));
        v[n] = int(x);
        at = end + 1;
    }
    return at <= text.size() ? -1 : n;  // -1: more fields than `count`
}

void apply_tile_override(KernelPlan& p, const std::string& text, const std::string& field) {
    static constexpr const char* kFields[] = {"block_m",   "block_n",  "warps",   "m_tiles", "stages",
                                              "q_in_regs", "schedule", "swizzle", "pv_step", "wide_v"};
    const bool hopper = p.family != &fwd_mma();
    // schedule: on Hopper the family (0 cooperative, 1 warp-specialized, 2 with ping-pong); on mma.sync, whether a
    // block's K and V load apart (1) or together (0).
    const int schedule = p.family == &fwd_sm90_ws() ? (p.ping_pong ? 2 : 1) : hopper ? 0 : p.kv_apart ? 1 : 0;
    int v[10] = {0, 0, 0, 0, 0, 0, schedule, p.swizzle ? 1 : 0, p.pv_step, p.wide_v ? 1 : 0};
    const int n = parse_tile_fields(text, field, kFields, 10, v);
    if (n < 6)
        throw ConfigError(field, util::format("{} is not block_m,block_n,warps,m_tiles,stages,q_in_regs"
                                              "[,schedule[,swizzle[,pv_step[,wide_v]]]]",
                                              util::quoted(text)));
    const auto [bm, bn, w, mt, st, qr, sched, sw, pv, wide] = v;
    if (w < 1 || w > 16 || mt < 1 || mt > 4 || bm != w * mt * 16)
        throw ConfigError(field, util::format("block_m ({}) must equal warps ({}, 1..16) x m_tiles ({}, 1..4) x 16",
                                              bm, w, mt));
    if (bn < 16 || bn > 256 || bn % 16 != 0)
        throw ConfigError(field, util::format("block_n ({}) must be a multiple of 16 in 16..256", bn));
    if (st < 1 || st > 3) throw ConfigError(field, util::format("stages ({}) must be 1..3", st));
    if (hopper && (mt != 1 || w % 4 != 0 || qr != 0))
        throw ConfigError(field, "the wgmma kernel needs m_tiles 1, whole warpgroups (warps 4, 8, 12, 16) and Q in "
                                 "shared memory (q_in_regs 0)");
    if (sched < 0 || sched > (hopper ? 2 : 1) || (sched > 0 && hopper && (w > 12 || st < 2)))
        throw ConfigError(field, util::format("schedule ({}) must be 0..2 for wgmma plans (1 and 2 need at most 12 "
                                              "MMA warps and 2+ stages) and 0..1 for mma.sync plans (1: K and V load "
                                              "apart)", sched));
    if (pv != 8 && pv != 16) throw ConfigError(field, util::format("pv_step ({}) must be 8 or 16", pv));
    for (const auto& [name, flag] : {std::pair{"q_in_regs", qr}, {"swizzle", sw}, {"wide_v", wide}})
        if (flag != 0 && flag != 1) throw ConfigError(field, util::format("{} ({}) must be 0 or 1", name, flag));
    p.block_m = bm, p.block_n = bn, p.warps = w, p.m_tiles = mt, p.stages = st, p.q_in_regs = qr != 0;
    p.pv_step = pv;
    // Shifted rows keep the room their shift needs (16 more columns at d = 11, 13, 14, 15 mod 16): a narrower V would
    // drop them for cp.async loads, not time them.
    const int shifted_v = !p.shift_rows ? 0
                          : hopper      ? shift_pad(p.head_dim_v)
                          : p.vec_v < 8 ? geometry::shifted_pad(p.head_dim_v, pv)
                                        : 0;
    p.pad_v = std::max(geometry::round_up(p.head_dim_v, pv), shifted_v);
    p.wide_v = wide != 0;
    // schedule picks the Hopper family: 0 cooperative, 1 warp-specialized, 2 warp-specialized with ping-pong.
    if (hopper) p.family = sched == 0 ? &kernels::fwd_sm90() : &fwd_sm90_ws();
    p.ping_pong = hopper && sched == 2;
    p.kv_apart = !hopper && sched == 1;
    p.swizzle = hopper && sw != 0;
    p.reason = util::format("{} override ({})", field, util::escaped(text));
    p.overridden = true;
}

}  // namespace rtattn::plan
