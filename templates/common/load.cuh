// Global-to-shared tile loads in padded rows (the mma.sync kernel) and the zeroing of padded columns (every kernel:
// the MMA reads them, so they must hold exact zeros).
#pragma once
#include "common/ptx.cuh"

namespace rtattn {
namespace detail {

using ptx::u16;

// Threads per row for rows of n vectors: n rounded up to a power of two, where that idles at most 40% of them; 0 (the
// general loop) elsewhere. Idle lanes still cost their warp an issue: d132's 33 four-element vectors on 64 threads
// ran its forward 5% slower than the general loop, d80's 10 vectors on 16 threads 8% faster (H200).
__device__ constexpr int row_threads(int n) {
    int c = 1;
    while (c < n) c *= 2;
    return 5 * (c - n) <= 2 * c ? c : 0;
}

// The largest power of two not above n (n >= 1).
__device__ constexpr int floor_pow2(int n) {
    int c = 1;
    while (2 * c <= n) c *= 2;
    return c;
}

// load_rows' thread layout where it has one (kUsed): kCols threads to a row, each copying one column of rows r0(tid),
// r0 + kRowStep, ... (kPerThread of them). A caller that looks something up per row (a paged cache's block table)
// can do it ahead for exactly these rows.
template <int kRows, int kHeadDim, int kVec, int kThreads>
struct RowLayout {
    static constexpr int kPerRow = kHeadDim / kVec;
    static constexpr int kCols = row_threads(kPerRow);
    static constexpr bool kUsed = kVec >= 2 && kCols > 0 && kThreads % kCols == 0;
    static constexpr int kRowStep = kUsed ? kThreads / kCols : 1;
    static constexpr int kPerThread = (kRows + kRowStep - 1) / kRowStep;
    __device__ static int r0(int tid) { return kUsed ? tid / kCols : 0; }
};

// Copies `rows` x kHeadDim elements (row r at g + r*row_stride) into shared memory at offset(r, c) (elements).
// Rows at or beyond `valid_rows` become zeros (cp.async zero-fill), so 0 * garbage never reaches PV.
template <int kRows, int kHeadDim, int kVec, int kThreads, class Offset>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                          Offset offset) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kRows * kPerRow;
    auto copy = [&](int r, int c, const u16* src) {
        const bool valid = r < valid_rows;
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + offset(r, c)), valid ? src : g, valid);
        } else {
            // Odd head dims: a row is not 4-byte aligned, cp.async cannot move it; a plain load is the only choice.
            s[offset(r, c)] = valid ? *src : u16(0);
        }
    };
    // Threads are laid out kCols to a row (row_threads), so each thread copies one column of every kRowStep-th row
    // and works its offsets out once, not per vector (this runs for every Q/dO or K/V tile; the general loop below
    // costs ~25 integer instructions a vector). Threads past the row's last vector idle. Plain loads (odd head dims)
    // keep the general loop, whose unroll of 4 bounds the loads in flight: unrolled over every row they spilled
    // (d155's backward: 320 bytes).
    constexpr int kCols = row_threads(kPerRow);
    if constexpr (kVec >= 2 && kCols > 0 && kThreads % kCols == 0) {
        constexpr int kRowStep = kThreads / kCols;
        const int r0 = tid / kCols, col = tid - r0 * kCols, c = col * kVec;
        const bool col_used = kCols == kPerRow || col < kPerRow;
        const u16* src = g + r0 * row_stride + c;
        const long long step = kRowStep * row_stride;
#pragma unroll
        for (int j = 0; j < (kRows + kRowStep - 1) / kRowStep; ++j)
            if (col_used && (kRows % kRowStep == 0 || r0 + j * kRowStep < kRows))
                copy(r0 + j * kRowStep, c, src + j * step);
    } else {
#pragma unroll 4
        for (int i = tid; i < kTotal; i += kThreads) {
            const int r = i / kPerRow;
            const int c = (i - r * kPerRow) * kVec;
            copy(r, c, g + r * row_stride + c);
        }
    }
}

// load_tile for rows anywhere (a paged cache): row r starts at row(r) in global memory, asked only for rows below
// `valid_rows` (so a paged cache's block table is never read past a sequence).
// The other rows become zeros (cp.async zero-fill, pointed at `any`, a valid address), so 0 * garbage never reaches
// PV.
template <int kRows, int kHeadDim, int kVec, int kThreads, class Row, class Offset>
__device__ __forceinline__ void load_rows(u16* s, const u16* any, Row row, int valid_rows, int tid, Offset offset) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kRows * kPerRow;
    auto copy = [&](int r, int c) {
        const bool valid = r < valid_rows;
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + offset(r, c)), valid ? row(r) + c : any, valid);
        } else {
            // Odd head dims: a row is not 4-byte aligned, cp.async cannot move it; a plain load is the only choice.
            s[offset(r, c)] = valid ? row(r)[c] : u16(0);
        }
    };
    // The thread layout of load_tile above.
    using L = RowLayout<kRows, kHeadDim, kVec, kThreads>;
    constexpr int kCols = L::kCols;
    if constexpr (L::kUsed) {
        constexpr int kRowStep = L::kRowStep;
        const int r0 = L::r0(tid), col = tid - r0 * kCols, c = col * kVec;
        const bool col_used = kCols == kPerRow || col < kPerRow;
#pragma unroll
        for (int j = 0; j < (kRows + kRowStep - 1) / kRowStep; ++j)
            if (col_used && (kRows % kRowStep == 0 || r0 + j * kRowStep < kRows)) copy(r0 + j * kRowStep, c);
    } else {
#pragma unroll 4
        for (int i = tid; i < kTotal; i += kThreads) {
            const int r = i / kPerRow;
            copy(r, (i - r * kPerRow) * kVec);
        }
    }
}

// Rows of a head dim that is 4 mod 8 (d100, d132), as 16-byte vectors: a row starts 16-byte aligned (rotation 0) or 8
// bytes past (rotation 4, in elements), so it is read as the 16-byte vectors from its first 16-byte boundary plus the
// 4 elements left over, and stored rotated: column c holds element (c + rot) mod kHeadDim. Row r's rotation is `rot`,
// or rot ^ flip for odd r (rows that alternate). Same contract as load_rows otherwise (row(r) only below valid_rows;
// the rest zero-filled from `any`). The left-over elements are one pass of whole warps (threads below kRows), so no
// warp diverges on them.
template <int kRows, int kHeadDim, int kThreads, class Row, class Offset>
__device__ __forceinline__ void load_rows_rotated(u16* s, const u16* any, Row row, int valid_rows, int rot, int flip,
                                                  int tid, Offset offset) {
    static_assert(kHeadDim % 8 == 4 && kHeadDim >= 12, "rows of 16-byte vectors and 4 elements");
    constexpr int kVectors = (kHeadDim - 4) / 8;
    constexpr int kCols = row_threads(kVectors) > 0 ? row_threads(kVectors) : 32;
    static_assert(kThreads % kCols == 0, "whole rows per pass");
    constexpr int kRowStep = kThreads / kCols;
    const int r0 = tid / kCols, v = tid - r0 * kCols;
    if (v < kVectors) {
#pragma unroll
        for (int j = 0; j < (kRows + kRowStep - 1) / kRowStep; ++j) {
            const int r = r0 + j * kRowStep;
            if (kRows % kRowStep != 0 && r >= kRows) break;
            const bool valid = r < valid_rows;
            const int rot_r = rot ^ (r & 1 ? flip : 0);  // one value per thread where kRowStep is even
            ptx::cp_async<16>(ptx::smem_u32(s + offset(r, 8 * v)), valid ? row(r) + rot_r + 8 * v : any, valid);
        }
    }
    for (int r = tid; r < kRows; r += kThreads) {
        const bool valid = r < valid_rows;
        const int left = (rot ^ (r & 1 ? flip : 0)) == 0 ? kHeadDim - 4 : 0;  // the 4 elements the vectors leave
        ptx::cp_async<8>(ptx::smem_u32(s + offset(r, kHeadDim - 4)), valid ? row(r) + left : any, valid);
    }
}

// Rows of any head dim as whole 16-byte vectors (shifted rows, the mma.sync forward): every row of the tile starts
// `end - head dim` elements (its shift) past a 16-byte boundary, g + r * row_stride, from which it is copied as kVecs
// 16-byte vectors, landing shifted right by the shift. A vector reads only the elements below `end` (cp.async
// zero-fills the rest), so nothing past a row is read; the first one reads the shift's elements in front of the row
// (a neighbouring head's, or the same allocation's: allocations start on 256-byte boundaries), which the caller keeps
// out of every result (K: masked in the MMA's fragments; V: they reach only O's columns outside the row, never
// stored). Rows at or past valid_rows are zero-filled from `any`. Threads: a power of two of them to a row, each
// with one vector (and so one byte count) for every row: the one above the vectors where at most a fifth of them
// idle, else the one below with a pass for the rest. Rows of 10-12 vectors ran 10-22% faster on 8 threads and a pass
// than on 16 with 4-6 idle (d69, 76, 84, 92: 0.78-0.80 of the pad16 ideal against 0.86-0.98), rows of 20-25 vectors
// 1-6% on 16 threads and a pass (d149..189). H200 pinned to sm_90, S = 16k, thirty-fourth session; the code here is
// the measured one: ptxas schedules it differently with any change to its form, which moved some dims by 4-9%
// (docs/PERFORMANCE.md).
template <int kRows, int kVecs, int kThreads, class Offset>
__device__ __forceinline__ void load_rows_shifted(u16* s, const u16* any, const u16* g, long long row_stride,
                                                  int valid_rows, int end, int tid, Offset offset) {
    auto bytes_of = [&](int v) {
        const int left = 2 * (end - 8 * v);
        return left < 0 ? 0 : left > 16 ? 16 : left;
    };
    constexpr int kUp = row_threads(kVecs);
    constexpr int kCols = kUp > 0 && 5 * (kUp - kVecs) <= kUp ? kUp : floor_pow2(kVecs);
    static_assert(kThreads % kCols == 0, "whole rows per pass");
    constexpr int kRowStep = kThreads / kCols;
    const int r0 = tid / kCols, v = tid - r0 * kCols, bytes = bytes_of(v);
#pragma unroll
    for (int j = 0; j < (kRows + kRowStep - 1) / kRowStep; ++j) {
        const int r = r0 + j * kRowStep;
        if ((kCols <= kVecs || v < kVecs) && (kRows % kRowStep == 0 || r < kRows)) {
            const bool valid = r < valid_rows && bytes > 0;
            ptx::cp_async_16_first(ptx::smem_u32(s + offset(r, 8 * v)), valid ? g + r * row_stride + 8 * v : any,
                                   valid ? bytes : 0);
        }
    }
    if constexpr (kCols < kVecs) {
        constexpr int kRest = kVecs - kCols;
        for (int i = tid; i < kRows * kRest; i += kThreads) {
            const int r = i / kRest, w = kCols + i - r * kRest;
            const int bytes = r < valid_rows ? bytes_of(w) : 0;
            ptx::cp_async_16_first(ptx::smem_u32(s + offset(r, 8 * w)), bytes > 0 ? g + r * row_stride + 8 * w : any,
                                   bytes);
        }
    }
}

// Zeroes columns [kHeadDim, kPad) of `rows` rows: the MMA reads them, so they must hold exact zeros.
template <int kRows, int kHeadDim, int kPad, int kThreads, class Offset>
__device__ __forceinline__ void zero_pad_cols(u16* s, int tid, Offset offset) {
    if constexpr (kPad > kHeadDim) {
        constexpr int kW = kPad - kHeadDim;
        for (int i = tid; i < kRows * kW; i += kThreads) {
            const int r = i / kW;
            s[offset(r, kHeadDim + (i - r * kW))] = u16(0);
        }
    }
}

// The same for rows shifted right by `shift` columns: the kPad - kHeadDim columns outside [shift, shift + kHeadDim).
template <int kRows, int kHeadDim, int kPad, int kThreads, class Offset>
__device__ __forceinline__ void zero_cols_outside(u16* s, int tid, Offset offset, int shift) {
    if constexpr (kPad > kHeadDim) {
        constexpr int kW = kPad - kHeadDim;
        for (int i = tid; i < kRows * kW; i += kThreads) {
            const int r = i / kW, e = i - r * kW;
            s[offset(r, e < shift ? e : kHeadDim + e)] = u16(0);
        }
    }
}

}  // namespace detail
}  // namespace rtattn
