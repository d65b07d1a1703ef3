// The backward's row kernels, one warp per query row, shared by every backward family (a family's module has them as
// its entries rtattn_bwd_pre and rtattn_bwd_post; kernels/backward.cpp launches them):
//   preprocess  D = rowsum(dO * O) (minus the LSE's own gradient, if any) and LSE in log2 units into the workspace,
//               whose dQ accumulator rows (geometry::bwd_dq_stride floats) it zeroes, with the deterministic mode's
//               turn counters (one per kBlockM rows);
//   postprocess dQ = accumulator * scale, to the dtype and the caller's strides.
// Traits: kHeadDimQK, kHeadDimV, kPadQK, kBF16, kVarlen, kBlockM (the main kernel's query rows per step), kVecQK.
#pragma once
#include "common/epilogue.cuh"
#include "common/geometry.h"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/seq.cuh"
#include "common/softmax.cuh"

namespace rtattn {

namespace detail {

template <bool kBF16>
__device__ __forceinline__ float to_float(ptx::u16 x) {
    if constexpr (kBF16) {
        return __uint_as_float(unsigned(x) << 16);
    } else {
        float f;
        asm("{ .reg .f16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x));
        return f;
    }
}

}  // namespace detail

// Preprocess: one warp per query row of the workspace (m_pad rows per head; grid x covers them 8 rows per CTA).
template <class T>
__device__ __forceinline__ void flash_bwd_pre(const BwdParams& p) {
    using ptx::u16;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int head = blockIdx.y, batch = blockIdx.z;
    if (row >= p.m_pad) return;
    const long long ws_row = ((long long)batch * p.heads_q + head) * p.m_pad + row;
    float* acc = p.dq_accum + ws_row * geometry::bwd_dq_stride(T::kPadQK);
    for (int c = lane; c < geometry::bwd_dq_stride(T::kPadQK); c += 32) acc[c] = 0.f;
    if (row % T::kBlockM == 0 && lane == 0) p.dq_sem[ws_row / T::kBlockM] = 0;
    float d = 0.f, lse2 = __int_as_float(0x7f800000);  // past seqlen_q: D 0, LSE +inf
    const detail::Seq<T::kVarlen> seq = detail::seq_info<T::kVarlen>(p, batch);
    if (row < seq.seqlen_q) {
        const u16* o = static_cast<const u16*>(p.o) + seq.q_offset(p.o_batch_stride, p.o_seq_stride) +
                       head * p.o_head_stride + row * p.o_seq_stride;
        const u16* dout = static_cast<const u16*>(p.dout) + seq.q_offset(p.do_batch_stride, p.do_seq_stride) +
                          head * p.do_head_stride + row * p.do_seq_stride;
        for (int c = lane; c < T::kHeadDimV; c += 32)
            d += detail::to_float<T::kBF16>(o[c]) * detail::to_float<T::kBF16>(dout[c]);
        d = detail::warp_sum(d);
        const long long stat = seq.lse_index(p, head) + row;
        lse2 = p.lse[stat] * 1.4426950408889634f;
        // A gradient g flowing into LSE adds g * P to dS (dLSE/dS = P): the same as lowering D by g.
        if (p.dlse) d -= p.dlse[stat];
    }
    if (lane == 0) {
        p.delta[ws_row] = d;
        p.lse2[ws_row] = lse2;
    }
}

// Postprocess: dQ = accumulator * scale for the rows below seqlen_q, one warp per row.
template <class T>
__device__ __forceinline__ void flash_bwd_post(const BwdParams& p) {
    using ptx::u16;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int head = blockIdx.y, batch = blockIdx.z;
    const detail::Seq<T::kVarlen> seq = detail::seq_info<T::kVarlen>(p, batch);
    if (row >= seq.seqlen_q) return;
    const float* acc =
        p.dq_accum + (((long long)batch * p.heads_q + head) * p.m_pad + row) * geometry::bwd_dq_stride(T::kPadQK);
    u16* dq = static_cast<u16*>(p.dq) + seq.q_offset(p.dq_batch_stride, p.dq_seq_stride) + head * p.dq_head_stride +
              row * p.dq_seq_stride;
    for (int c = 2 * lane; c < T::kHeadDimQK; c += 64)
        detail::store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(dq, c, acc[c] * p.scale, acc[c + 1] * p.scale);
}

}  // namespace rtattn
