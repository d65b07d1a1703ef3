// cp.async tile loads into the Hopper tile layouts (the cooperative kernel, and the warp-specialized one where TMA
// cannot address the tensors).
#pragma once
#include "common/ptx.cuh"
#include "sm90/tile_layout.cuh"

namespace rtattn {
namespace sm90 {

using detail::u16;
using detail::u32;

// Loads rows x kHeadDim into layout L (default TileLayout<kRows, kPad, kSwizzle>). Eight consecutive threads take
// the same 16-byte column chunk of eight consecutive rows (one core, or one chunk per row of a swizzle atom:
// distinct bank groups either way), so a warp still reads whole 32-byte sectors of each global row.
// kLoadRows rows (default: the whole tile) go to tile rows [row_base, row_base + kLoadRows). kUnroll trades
// registers for issue rate (the producer warpgroup of the warp-specialized kernel runs on few registers).
// rot (a multiple of kVec): tile column c holds row element (c + rot) mod kHeadDim (the split-row TMA layout).
template <int kRows, int kHeadDim, int kPad, bool kSwizzle, int kVec, int kThreads, int kLoadRows = kRows,
          int kUnroll = 4, class L = TileLayout<kRows, kPad, kSwizzle>>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                          int row_base = 0, int rot = 0) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kLoadRows * kPerRow;
#pragma unroll kUnroll
    for (int i = tid; i < kTotal; i += kThreads) {
        const int rest = i >> 3;
        const int rb = rest / kPerRow;
        const int r = rb * 8 + (i & 7);
        const int c = (rest - rb * kPerRow) * kVec;
        const bool valid = r < valid_rows;
        const int c_src = c + rot < kHeadDim ? c + rot : c + rot - kHeadDim;
        const u16* src = valid ? g + r * row_stride + c_src : g;
        const int at = L::offset(row_base + r, c);
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + at), src, valid);
        } else {
            s[at] = valid ? *src : u16(0);
        }
    }
}

// load_tile for shifted rows: all kPad columns of each row, tile column c holding row element c - shift (a multiple
// of kVec), the columns before and after the row, and rows at or past valid_rows, zero-filled.
template <int kRows, int kHeadDim, int kPad, bool kSwizzle, int kVec, int kThreads, int kLoadRows = kRows,
          int kUnroll = 4, class L = TileLayout<kRows, kPad, kSwizzle>>
__device__ __forceinline__ void load_tile_shifted(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                                  int row_base, int shift) {
    constexpr int kPerRow = kPad / kVec;
    constexpr int kTotal = kLoadRows * kPerRow;
#pragma unroll kUnroll
    for (int i = tid; i < kTotal; i += kThreads) {
        const int rest = i >> 3;
        const int rb = rest / kPerRow;
        const int r = rb * 8 + (i & 7);
        const int c = (rest - rb * kPerRow) * kVec;
        const int e = c - shift;
        const bool valid = r < valid_rows && unsigned(e) < unsigned(kHeadDim);
        const u16* src = valid ? g + r * row_stride + e : g;
        const int at = L::offset(row_base + r, c);
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + at), src, valid);
        } else {
            s[at] = valid ? *src : u16(0);
        }
    }
}

}  // namespace sm90
}  // namespace rtattn
