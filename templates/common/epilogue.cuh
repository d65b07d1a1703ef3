// The forward epilogue: normalize O by the row sums, stage it in shared memory, write LSE, then store whole rows
// with full-width vectors.
#pragma once
#include "common/softmax.cuh"
#include "common/params.h"
#include "common/seq.cuh"

namespace rtattn {
namespace detail {

template <int kElems> struct VecOf;
struct alignas(16) Vec16 { u32 w[4]; };
struct alignas(8) Vec8 { u32 w[2]; };
template <> struct VecOf<8> { typedef Vec16 type; };
template <> struct VecOf<4> { typedef Vec8 type; };
template <> struct VecOf<2> { typedef u32 type; };
template <> struct VecOf<1> { typedef u16 type; };

// An 8-wide MMA accumulator block's two adjacent columns (c, c+1) of one row, to 16-bit at `dst` (row start):
// only the columns below kCols; a 32-bit store when both are and the row allows it (kVec >= 2).
template <bool kBF16, int kCols, int kVec>
__device__ __forceinline__ void store_pair(ptx::u16* dst, int c, float x0, float x1) {
    const ptx::u32 packed = ptx::pack2<kBF16>(x0, x1);
    if constexpr (kVec >= 2) {
        if (c + 1 < kCols) {
            *reinterpret_cast<ptx::u32*>(dst + c) = packed;
            return;
        }
    }
    if (c < kCols) dst[c] = ptx::u16(packed & 0xffff);
    if (c + 1 < kCols) dst[c + 1] = ptx::u16(packed >> 16);
}

// Epilogue, part 1 (per warp): normalize this warp's rows, write them as 16-bit into the row-major staging tile
// sO (row stride kStrideO) and write LSE. Rows with no visible key get O = 0 and LSE = +inf, as FlashAttention
// (kSinks: the head's sink joins each row's denominator; a keyless row's LSE is the sink).
// warp_row0: the warp's first row inside the CTA tile. `seq`: the CTA's sequence (seq_info, worked out again here
// rather than kept live through the main loop); `head`: its query head, -1 for the grid's y (read where it is used).
template <bool kBF16, int kMT, int kNV, int kStrideO, bool kSinks, bool kVarlen>
__device__ __forceinline__ void normalize_and_stage(const FwdParams& p, const Seq<kVarlen>& seq,
                                                    float (&acc_o)[kMT][kNV][4],
                                                    const float (&row_max)[kMT][2], const float (&row_sum)[kMT][2],
                                                    u16* sO, int warp_row0, int q0, int lane, int head = -1) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float sum = quad_sum(row_sum[mt][h]);
            float inv = sum > 0.f ? 1.f / sum : 0.f;
            SinkJoin sink{};
            if constexpr (kSinks) {
                sink = join_sink(row_max[mt][h] * p.scale, sum, p.sinks[head < 0 ? blockIdx.y : unsigned(head)]);
                inv = sink.inv;
            }
            const int r = warp_row0 + mt * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int nb = 0; nb < kNV; ++nb) {
                const u32 v = ptx::pack2<kBF16>(acc_o[mt][nb][2 * h] * inv, acc_o[mt][nb][2 * h + 1] * inv);
                *reinterpret_cast<u32*>(sO + r * kStrideO + nb * 8 + 2 * (lane & 3)) = v;
            }
            if (p.lse != nullptr && (lane & 3) == 0 && q0 + r < seq.seqlen_q) {
                const float lse = kSinks      ? sink.lse
                                  : sum > 0.f ? row_max[mt][h] * p.scale + logf(sum)
                                              : __int_as_float(0x7f800000);
                p.lse[seq.lse_index(p, head < 0 ? blockIdx.y : unsigned(head)) + q0 + r] = lse;
            }
        }
    }
}

// Epilogue, part 2 (the kThreads that staged it, after a barrier): copy the staged tile of kBlockM rows, query rows
// q0.. of query head `head` (-1: the grid's y), to global memory with full-width vectors.
// rot (a multiple of kVecV): staged column c is output element (c + rot) mod kHeadDimV (split-row TMA layout);
// shift (a multiple of kVecV): output element e is staged column e + shift (shifted-row TMA layout).
template <int kBlockM, int kHeadDimV, int kVecV, int kStrideO, int kThreads, bool kVarlen>
__device__ __forceinline__ void store_tile(const FwdParams& p, const Seq<kVarlen>& seq, const u16* sO, int q0,
                                           int tid, int rot = 0, int head = -1, int shift = 0) {
    using OVec = typename VecOf<kVecV>::type;
    constexpr int kPerRow = kHeadDimV / kVecV;
    u16* gO = static_cast<u16*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_seq_stride) +
              (head < 0 ? blockIdx.y : unsigned(head)) * p.o_head_stride + (long long)q0 * p.o_seq_stride;
    const int valid_rows = seq.seqlen_q - q0;
    for (int i = tid; i < kBlockM * kPerRow; i += kThreads) {
        const int r = i / kPerRow;
        const int c = (i - r * kPerRow) * kVecV;
        const int c_dst = c + rot < kHeadDimV ? c + rot : c + rot - kHeadDimV;
        if (r < valid_rows)
            *reinterpret_cast<OVec*>(gO + r * p.o_seq_stride + c_dst) =
                *reinterpret_cast<const OVec*>(sO + r * kStrideO + c + shift);
    }
}

}  // namespace detail
}  // namespace rtattn
