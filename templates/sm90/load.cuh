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

// Whether every row of a [batch, seq, heads, d] tensor lies in 16-byte blocks of the tensor's own: base 16-byte
// aligned, packed heads (head stride d) whose token rows are whole blocks (heads x d and the seq and batch strides
// multiples of 8 elements; a packed sequence's caller passes batch stride 0). Then the aligned blocks that hold any
// element of a row lie inside its token row, so a row of an odd head dim can be read as 16-byte blocks.
__device__ __forceinline__ bool rows_in_blocks(const void* base, long long batch_stride, long long seq_stride,
                                               long long head_stride, int heads, int d) {
    return (reinterpret_cast<unsigned long long>(base) & 15) == 0 && head_stride == d && (heads * d) % 8 == 0 &&
           seq_stride % 8 == 0 && batch_stride % 8 == 0;
}

// load_tile_shifted for rows in whole blocks (rows_in_blocks; kVec 1: odd head dims, whose rows start on any 2-byte
// boundary). Tile chunk c (columns 8c..8c+7) is row elements 8c - shift on: the two aligned 16-byte blocks around
// them, each read only where it holds an element of the row, are cut to those 16 bytes in registers (the cut is the
// same for every row: row strides are whole blocks), elements outside the row zeroed. One chunk takes 2 loads where
// 2-byte loads took 8.
template <int kRows, int kHeadDim, int kPad, bool kSwizzle, int kThreads, int kLoadRows = kRows, int kUnroll = 4,
          class L = TileLayout<kRows, kPad, kSwizzle>>
__device__ __forceinline__ void load_tile_shifted_blocks(u16* s, const u16* g, long long row_stride, int valid_rows,
                                                         int tid, int row_base, int shift) {
    constexpr int kPerRow = kPad / 8, kTotal = kLoadRows * kPerRow;
    // Chunk c's first element sits `cut` elements into its block (g's own misalignment less the shift, mod 8).
    const int cut = (int(reinterpret_cast<unsigned long long>(g) >> 1) - shift) & 7;
    const int words = cut >> 1, half = (cut & 1) * 16;
#pragma unroll kUnroll
    for (int i = tid; i < kTotal; i += kThreads) {
        const int rest = i >> 3;
        const int rb = rest / kPerRow;
        const int r = rb * 8 + (i & 7);
        const int c = rest - rb * kPerRow;
        const int e0 = c * 8 - shift, b0 = e0 - cut;  // b0: the first block's first element (may be before the row)
        const bool valid = r < valid_rows;
        const u16* src = g + r * row_stride + b0;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        const uint4 x = valid && b0 + 8 > 0 && b0 < kHeadDim ? *reinterpret_cast<const uint4*>(src) : zero;
        const uint4 y = valid && b0 + 16 > 0 && b0 + 8 < kHeadDim ? *reinterpret_cast<const uint4*>(src + 8) : zero;
        u32 w[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
        if (words & 2) {
#pragma unroll
            for (int k = 0; k < 6; ++k) w[k] = w[k + 2];
        }
        if (words & 1) {
#pragma unroll
            for (int k = 0; k < 7; ++k) w[k] = w[k + 1];
        }
        u32 out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) out[k] = __funnelshift_r(w[k], w[k + 1], half);
        if (e0 < 0 || e0 + 8 > kHeadDim) {  // the row's first or last chunk: elements outside it are zero
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int e = e0 + 2 * k;
                out[k] &= (unsigned(e) < unsigned(kHeadDim) ? 0xffffu : 0u) |
                          (unsigned(e + 1) < unsigned(kHeadDim) ? 0xffff0000u : 0u);
            }
        }
        *reinterpret_cast<uint4*>(s + L::offset(row_base + r, c * 8)) = make_uint4(out[0], out[1], out[2], out[3]);
    }
}

}  // namespace sm90
}  // namespace rtattn
