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

// Rows of a head dim of 4 mod 8 (d132) placed `shift` (0 or 4) columns right in the tile: tile column c holds row
// element c - shift (the columns outside stay as they are: zeroed once by the caller). kWide: each row starts
// 16-byte aligned after `shift` elements, so all but 4 of its elements move as 16-byte vectors (d132: 17 copies a
// row, not 33); else 8-byte ones. Rows at or past valid_rows are zero.
template <int kRows, int kHeadDim, int kTileCols, int kThreads, bool kWide>
__device__ __forceinline__ void load_rows_shift4_as(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                                    int shift) {
    static_assert(kHeadDim % 8 == 4 && kHeadDim + 4 <= kTileCols, "4 columns of room on either side");
    using L = TileLayout<kRows, kTileCols, true>;
    // Each kind of piece in a loop of its own, so a warp's threads take one path (mixed, they ran 5% slower).
    constexpr int kVec = kWide ? 8 : 4, kPieces = kWide ? (kHeadDim - 4) / 8 : kHeadDim / 4;
    const int first = kWide ? shift : 0;  // the first element the vectors move
#pragma unroll 4
    for (int i = tid; i < kRows * kPieces; i += kThreads) {
        const int rest = i >> 3;
        const int rb = rest / kPieces;
        const int r = rb * 8 + (i & 7);
        const int e = first + (rest - rb * kPieces) * kVec;
        const bool valid = r < valid_rows;
        ptx::cp_async<kVec * 2>(ptx::smem_u32(s + L::offset(r, e + shift)), valid ? g + r * row_stride + e : g, valid);
    }
    if constexpr (kWide) {
        for (int r = tid; r < kRows; r += kThreads) {  // the 4 elements the vectors leave: the first ones, or the last
            const int e = shift ? 0 : kHeadDim - 4;
            const bool valid = r < valid_rows;
            ptx::cp_async<8>(ptx::smem_u32(s + L::offset(r, e + shift)), valid ? g + r * row_stride + e : g, valid);
        }
    }
}
template <int kRows, int kHeadDim, int kTileCols, int kThreads>
__device__ __forceinline__ void load_rows_shift4(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                                 int shift, bool wide) {
    if (wide)
        load_rows_shift4_as<kRows, kHeadDim, kTileCols, kThreads, true>(s, g, row_stride, valid_rows, tid, shift);
    else
        load_rows_shift4_as<kRows, kHeadDim, kTileCols, kThreads, false>(s, g, row_stride, valid_rows, tid, shift);
}

// A tile's rows: placed `shift` columns right with 16-byte vectors where `wide` (kShift: load_rows_shift4), else
// load_tile's.
template <int kRows, int kHeadDim, int kTileCols, int kVec, int kThreads, bool kShift>
__device__ __forceinline__ void load_rows(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                          int shift, bool wide) {
    if constexpr (kShift)
        load_rows_shift4<kRows, kHeadDim, kTileCols, kThreads>(s, g, row_stride, valid_rows, tid, shift, wide);
    else
        load_tile<kRows, kHeadDim, kTileCols, true, kVec, kThreads>(s, g, row_stride, valid_rows, tid);
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
