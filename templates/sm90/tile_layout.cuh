// How Hopper kernels lay tiles out in shared memory: the forms wgmma reads directly through descriptors (swizzled
// column panels, interleaved 8x8 cores, or whole 64-column panels for wide V tiles), each with its element offset
// and its K-major / N-major descriptors.
#pragma once
#include "common/geometry.h"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"

namespace rtattn {
namespace sm90 {

using detail::u16;
using detail::u32;

// Shared-memory layout of one tile (kRows x kPad, 16-bit) as column panels, each in the widest form wgmma reads
// without bank conflicts: panels of 64 columns with the 128-byte swizzle, then at most one panel each of 32 columns
// (64-byte swizzle), 16 columns (32-byte swizzle) and 8 columns (interleaved, no swizzle) for the rest of the
// padded width. In a panel of width W, row r is 2W contiguous bytes and its 16-byte chunks are XOR-permuted by
// address bits 7.. (Swizzle<B,4,3>), so 8 rows of one chunk column land in 8 different bank groups. Panels are
// ordered widest first, which keeps each one aligned to its swizzle atom (8 rows x 2W bytes).
// (Interleaved layouts everywhere, tried first, ran at ~230 TFLOPS on an H200 where swizzled ones reach ~350.)
template <int kRows, int kPad, bool kSwizzle>
struct TileLayout;

// Interleaved (no swizzle) throughout: 8x8 cores of 128 contiguous bytes, core (r/8, c/8) at index
// (r/8)*(kPad/8) + c/8; LBO steps to the next core along K, SBO along M/N.
template <int kRows, int kPad>
struct TileLayout<kRows, kPad, false> {
    static constexpr int kRowBlock = kPad / 8 * 128;  // bytes between core rows
    static __device__ __forceinline__ int offset(int r, int c) {
        return ((r >> 3) * (kPad / 8) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
    }
    static __device__ __forceinline__ wgmma::u64 k_major(u32 base, int row0, int kk) {
        return wgmma::desc(base + (row0 / 8) * kRowBlock + 2 * kk * 128, 128, kRowBlock);
    }
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk, int c0) {
        return wgmma::desc(base + 2 * kk * kRowBlock + (c0 / 8) * 128, kRowBlock, 128);
    }
};

template <int kRows, int kPad>
struct TileLayout<kRows, kPad, true> {
    static constexpr int kN64 = kPad / 64;
    static constexpr bool kHas32 = geometry::has_panel(kPad, 1), kHas16 = geometry::has_panel(kPad, 2),
                          kHas8 = geometry::has_panel(kPad, 3);
    static constexpr int kCol32 = kN64 * 64;                       // first column of the 32-wide panel
    static constexpr int kCol16 = kCol32 + (kHas32 ? 32 : 0);
    static constexpr int kCol8 = kCol16 + (kHas16 ? 16 : 0);
    static constexpr int kPanel64Bytes = kRows * 128;
    static constexpr int kBase32 = kN64 * kPanel64Bytes;            // byte offsets of the narrow panels
    static constexpr int kBase16 = kBase32 + (kHas32 ? kRows * 64 : 0);
    static constexpr int kBase8 = kBase16 + (kHas16 ? kRows * 32 : 0);

    static __device__ __forceinline__ int swizzle(int byte, int bits) {
        return byte ^ (((byte >> 7) & ((1 << bits) - 1)) << 4);
    }
    static __device__ __forceinline__ int offset(int r, int c) {  // in elements
        int byte;
        if (c < kCol32)
            byte = (c >> 6) * kPanel64Bytes + swizzle(r * 128 + (c & 63) * 2, 3);
        else if (kHas32 && c < kCol16)
            byte = kBase32 + swizzle(r * 64 + (c - kCol32) * 2, 2);
        else if (kHas16 && c < kCol8)
            byte = kBase16 + swizzle(r * 32 + (c - kCol16) * 2, 1);
        else
            byte = kBase8 + r * 16 + (c - kCol8) * 2;
        return byte >> 1;
    }
    // Calls f(kind, first column, byte offset) for each panel; kind 0..3 = width 64, 32, 16, 8 (the TMA map index
    // in FwdParamsTma). A panel is exactly one TMA box with the matching swizzle mode.
    template <class F>
    static __device__ __forceinline__ void for_each_panel(F f) {
#pragma unroll
        for (int i = 0; i < kN64; ++i) f(0, i * 64, i * kPanel64Bytes);
        if constexpr (kHas32) f(1, kCol32, kBase32);
        if constexpr (kHas16) f(2, kCol16, kBase16);
        if constexpr (kHas8) f(3, kCol8, kBase8);
    }
    // K-major operand (Q or K): rows [row0, row0 + 64) x columns [16*kk, 16*kk + 16). SBO = one 8-row atom; LBO is
    // unused by swizzled K-major layouts (a k-step never leaves its panel).
    static __device__ __forceinline__ wgmma::u64 k_major(u32 base, int row0, int kk) {
        const int c = 16 * kk;
        if (c < kCol32)
            return wgmma::desc(base + (c >> 6) * kPanel64Bytes + row0 * 128 + (c & 63) * 2, 16, 1024, 1);
        if (kHas32 && c < kCol16) return wgmma::desc(base + kBase32 + row0 * 64 + (c - kCol32) * 2, 16, 512, 2);
        return wgmma::desc(base + kBase16 + row0 * 32, 16, 256, 3);  // kPad is a multiple of 16: no 8-wide rest
    }
    // Where column c starts along a row of its panel, before the swizzle: the byte offset n_major<true> adds.
    static __device__ __forceinline__ constexpr int col_bytes(int c) {
        return c < kCol32                ? (c >> 6) * kPanel64Bytes + (c & 63) * 2
               : kHas32 && c < kCol16 ? kBase32 + (c - kCol32) * 2
               : kHas16 && c < kCol8  ? kBase16 + (c - kCol16) * 2
                                      : kBase8 + (c - kCol8) * 2;
    }
    // N-major operand (V read transposed): K rows [16*kk, 16*kk + 16) x N columns from c0, as chunked by
    // for_each_chunk (a 128-wide chunk spans two 64-column panels: LBO is the panel stride). With kInside, c0 may
    // also lie inside a 64-, 32- or 16-column panel, the chunk ending within it (the backward's dQ split at pads up to
    // 64, its wide form's halves): the start moves along the swizzled row, whose pattern the hardware applies to the
    // address bits.
    template <bool kInside = false>
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk, int c0) {
        const int in64 = kInside ? (c0 & 63) * 2 : 0;
        if (c0 < kCol32)
            return wgmma::desc(base + (c0 >> 6) * kPanel64Bytes + in64 + 16 * kk * 128, kPanel64Bytes, 1024, 1);
        const int in32 = kInside ? (c0 - kCol32) * 2 : 0;
        if (kHas32 && (kInside ? c0 < kCol16 : c0 == kCol32))
            return wgmma::desc(base + kBase32 + in32 + 16 * kk * 64, 16, 512, 2);
        const int in16 = kInside ? (c0 - kCol16) * 2 : 0;
        if (kHas16 && (kInside ? c0 < kCol8 : c0 == kCol16))
            return wgmma::desc(base + kBase16 + in16 + 16 * kk * 32, 16, 256, 3);
        return wgmma::desc(base + kBase8 + 16 * kk * 16, 128, 128, 0);  // interleaved: next core along K is 128 B on
    }
};

// V tiles as whole 64-column panels with the 128-byte swizzle, the last one only partly used: PV is then one wgmma
// of n = kPad per k-step through a single descriptor (LBO = panel stride), where the per-width panels of
// TileLayout need one per panel width. (The same addresses as TileLayout<kRows, kPad rounded up to 64, true>,
// written out: that one's per-width branches cost ~1 KB more code where the column is not a constant.) The plan uses it where those panels would end in an 8-wide unswizzled one
// (d132: n136 instead of n128 + n8, 2-5% faster on an H200); it costs shared memory for the unused columns.
template <int kRows, int kPad>
struct WideLayout {
    static constexpr int kPanels = (kPad + 63) / 64;
    static constexpr int kPanel64Bytes = kRows * 128;
    static __device__ __forceinline__ int offset(int r, int c) {  // in elements
        return ((c >> 6) * kPanel64Bytes + ((r * 128 + (c & 63) * 2) ^ ((r & 7) << 4))) >> 1;
    }
    // Calls f(kind 0 = 64-wide TMA map, first column, byte offset) for each panel.
    template <class F>
    static __device__ __forceinline__ void for_each_panel(F f) {
#pragma unroll
        for (int i = 0; i < kPanels; ++i) f(0, i * 64, i * kPanel64Bytes);
    }
    // N-major operand: K rows [16*kk, 16*kk + 16) x all kPad columns, across the panels (LBO).
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk) {
        return wgmma::desc(base + 16 * kk * 128, kPanel64Bytes, 1024, 1);
    }
};

// The V tile layout of a plan.
template <class T, bool kWide = T::kWideV>
struct VLayoutOf {
    using type = TileLayout<T::kBlockN, T::kPadV, T::kSwizzle>;
};
template <class T>
struct VLayoutOf<T, true> {
    using type = WideLayout<T::kBlockN, T::kPadV>;
};
template <class T>
using VLayout = typename VLayoutOf<T>::type;

}  // namespace sm90
}  // namespace rtattn
