// The backward's row kernels, one warp per query row, shared by every backward family (a family's module has them as
// its entries rtattn_bwd_pre and rtattn_bwd_post; kernels/backward.cpp launches them):
//   preprocess  D = rowsum(dO * O) (minus the LSE's own gradient, if any) and LSE in log2 units into the workspace,
//               whose dQ accumulator rows (geometry::bwd_dq_stride floats) it zeroes, with the deterministic mode's
//               turn counters (one per kBlockM rows);
//   postprocess dQ = accumulator * scale, to the dtype and the caller's strides; with kSinks and dsinks, the
//               first CTA of each head also sums the sink's gradient.
// The sinks need nothing else: the forward's LSE includes them, so P (from it) and D = rowsum(dO * O) are already
// right for the main kernels.
// Traits: kHeadDimQK, kHeadDimV, kPadQK, kBF16, kVarlen, kBlockM (the main kernel's query rows per step), kVecQK,
// kSinks.
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

template <bool kVarlen>
struct BwdInt {
    using type = int;
};
template <>
struct BwdInt<true> {
    using type = SharedInt;
};

// A backward main kernel's sequence as its query-block walk reads it (both families): dense, the sizes as given;
// varlen, a copy in 4 ints of shared memory (q_begin, seqlen_q, seqlen_k, k_begin), read where used: held in
// registers through the loop they pushed some tiles past 255 (spills at d36 on sm_80, fp16 d113-127 on sm_90).
template <bool kVarlen>
struct BwdSeqView {
    typename BwdInt<kVarlen>::type seqlen_q, seqlen_k, q_begin, k_begin;
    int batch;
    // Element offsets of the sequence's first row (Seq::q_offset / k_offset with the begins read as above).
    __device__ __forceinline__ long long q_off(long long batch_stride, long long seq_stride) const {
        return kVarlen ? (long long)int(q_begin) * seq_stride : (long long)batch * batch_stride;
    }
    __device__ __forceinline__ long long k_off(long long batch_stride, long long seq_stride) const {
        return kVarlen ? (long long)int(k_begin) * seq_stride : (long long)batch * batch_stride;
    }
};
// Varlen: writes the shared copy (4 ints at `shared`) and waits for it; the caller has already returned where its
// key block is past the sequence's keys.
template <bool kVarlen>
__device__ __forceinline__ BwdSeqView<kVarlen> bwd_seq_view(const Seq<kVarlen>& seq, int batch, int* shared, int tid) {
    if constexpr (kVarlen) {
        if (tid == 0) shared[0] = seq.q_begin, shared[1] = seq.seqlen_q, shared[2] = seq.seqlen_k, shared[3] = seq.k_begin;
        __syncthreads();
        return {SharedInt{shared + 1}, SharedInt{shared + 2}, SharedInt{shared}, SharedInt{shared + 3}, batch};
    } else {
        return {seq.seqlen_q, seq.seqlen_k, 0, 0, batch};
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
    constexpr int kTurnRows = geometry::bwd_turn_rows(T::kBlockM);
    if (row % kTurnRows == 0 && lane == 0) p.dq_sem[ws_row / kTurnRows] = 0;
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

namespace detail {

// dsinks[head] = -sum over the head's rows (every sequence) of P_sink * D, P_sink = exp(sink - LSE) being the sink's
// share of the row's softmax and D (dO . O, less dLSE) the workspace's: a key of value zero contributes -P * D to its
// score's gradient. Read from the workspace the preprocess wrote (rows past seqlen_q: LSE +inf, D 0, adding 0), by the
// whole CTA in a fixed order, so the sum is the same every run.
__device__ __forceinline__ void sink_gradient(const BwdParams& p, int head) {
    __shared__ float warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float sink2 = p.sinks[head] * 1.4426950408889634f;
    float sum = 0.f;
    for (unsigned b = 0; b < gridDim.z; ++b) {
        const long long base = ((long long)b * p.heads_q + head) * p.m_pad;
        for (int r = threadIdx.x; r < p.m_pad; r += blockDim.x)
            sum += ptx::fast_exp2(sink2 - p.lse2[base + r]) * p.delta[base + r];
    }
    sum = warp_sum(sum);
    if (lane == 0) warp_sums[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
        p.dsinks[head] = -total;
    }
}

}  // namespace detail

// Postprocess: dQ = accumulator * scale for the rows below seqlen_q, one warp per row.
template <class T>
__device__ __forceinline__ void flash_bwd_post(const BwdParams& p) {
    using ptx::u16;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int head = blockIdx.y, batch = blockIdx.z;
    if constexpr (T::kSinks)
        if (p.dsinks != nullptr && blockIdx.x == 0 && blockIdx.z == 0) detail::sink_gradient(p, head);
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
