// The parts of the forward pass that do not depend on how the two GEMMs are issued (mma.sync on sm_80+, wgmma on
// sm_90a): key-block range, masking, the online softmax, P packing and the epilogue. Scores and the output
// accumulator use the mma.m16n8 C-fragment layout in both kernels: per warp and 16-row tile, thread `lane` holds
// rows lane/4 and lane/4 + 8, columns 2*(lane%4) + {0,1} of each 8-wide column block.
#pragma once
#include "rtattn_params.h"
#include "rtattn_ptx.cuh"

namespace rtattn {
namespace detail {

using ptx::u16;
using ptx::u32;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

// Causal alignment is bottom-right: query i sees keys j <= i + (seqlen_k - seqlen_q), as FlashAttention 2.1+.
template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ int kv_block_count(int q0, int seqlen_q, int seqlen_k) {
    int n = (seqlen_k + kBlockN - 1) / kBlockN;
    if constexpr (kCausal) {
        const int last_visible = q0 + kBlockM - 1 + seqlen_k - seqlen_q;  // last key the block's last row may see
        const int causal_blocks = last_visible < 0 ? 0 : last_visible / kBlockN + 1;
        n = causal_blocks < n ? causal_blocks : n;
    }
    return n;
}

// What one CTA works on: grid x = query block (the last one first when causal), y = query head, z = batch. GQA:
// query head h reads kv head h / q_per_kv in place. Pointers are to the first element of this (batch, head); gQ is
// already at row q0.
struct CtaTile {
    const u16* q;
    const u16* k;
    const u16* v;
    int q0;        // first query row of the block
    int n_blocks;  // key blocks this query block visits (causal: none right of the diagonal)
};

template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ CtaTile cta_tile(const FwdParams& p) {
    const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / p.q_per_kv;
    CtaTile t;
    // Causal: the last query blocks see the most keys; launching them first (blocks are dispatched in x order)
    // leaves the short ones to fill the final wave. Per head on purpose: longest-first across all heads evens out
    // the last wave better on paper but ran 2-14% slower on an H200 (a wave then mixes every head's K/V in L2).
    t.q0 = (kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * kBlockM;
    t.q = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
          (long long)t.q0 * p.q_seq_stride;
    t.k = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    t.v = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;
    t.n_blocks = kv_block_count<kCausal, kBlockM, kBlockN>(t.q0, p.seqlen_q, p.seqlen_k);
    return t;
}

// Masks the key tail and, when causal, keys right of the diagonal; only called for blocks that need it.
// row0: the query row of this warp's first 16-row tile.
template <bool kCausal, int kMT, int kNB>
__device__ __forceinline__ void mask_scores(float (&s)[kMT][kNB][4], int n0, int row0, int lane, int seqlen_q,
                                            int seqlen_k) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = n0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                const int row = row0 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                bool masked = col >= seqlen_k;
                if constexpr (kCausal) masked = masked || col > row + seqlen_k - seqlen_q;
                if (masked) s[mt][nb][e] = neg_inf();
            }
}

template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ bool block_needs_mask(int n0, int q0, int seqlen_q, int seqlen_k) {
    bool need = n0 + kBlockN > seqlen_k;
    if constexpr (kCausal) need = need || (n0 + kBlockN - 1 > q0 + seqlen_k - seqlen_q);
    return need;
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Online softmax for one key block, statistics part: new row max, running sum rescaled, scores become
// unnormalized probabilities exp2(s * c - m_new * c). `corr` = exp2((m_old - m_new) * c) is the factor the output
// accumulator must be multiplied by; the caller applies it (at once, or after an in-flight PV has landed).
template <int kMT, int kNB>
__device__ __forceinline__ void softmax_update(float (&s)[kMT][kNB][4], float (&row_max)[kMT][2],
                                               float (&row_sum)[kMT][2], float (&corr)[kMT][2], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[mt][h];
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
            mx = quad_max(mx);
            // A row with every key masked so far keeps max -inf; using 0 avoids (-inf) - (-inf) = NaN.
            const float m_use = mx == neg_inf() ? 0.f : mx;
            corr[mt][h] = ptx::fast_exp2((row_max[mt][h] - m_use) * scale_log2);
            row_max[mt][h] = mx;
            const float m_scaled = m_use * scale_log2;
            float sum = 0.f;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pe = ptx::fast_exp2(fmaf(s[mt][nb][2 * h + e], scale_log2, -m_scaled));
                    s[mt][nb][2 * h + e] = pe;
                    sum += pe;
                }
            }
            row_sum[mt][h] = row_sum[mt][h] * corr[mt][h] + sum;
        }
    }
}

template <int kMT, int kNV>
__device__ __forceinline__ void rescale(float (&acc_o)[kMT][kNV][4], const float (&corr)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nb = 0; nb < kNV; ++nb) {
            acc_o[mt][nb][0] *= corr[mt][0];
            acc_o[mt][nb][1] *= corr[mt][0];
            acc_o[mt][nb][2] *= corr[mt][1];
            acc_o[mt][nb][3] *= corr[mt][1];
        }
}

// Both parts at once, for kernels with no PV in flight during the softmax.
template <int kMT, int kNB, int kNV>
__device__ __forceinline__ void online_softmax(float (&s)[kMT][kNB][4], float (&row_max)[kMT][2],
                                               float (&row_sum)[kMT][2], float (&acc_o)[kMT][kNV][4],
                                               float scale_log2) {
    float corr[kMT][2];
    softmax_update(s, row_max, row_sum, corr, scale_log2);
    rescale(acc_o, corr);
}

// P for keys [16*kk, 16*kk + 16) as an m16k16 A fragment: the score C-fragment layout is the A-fragment layout.
template <bool kBF16, int kNB>
__device__ __forceinline__ void pack_p(const float (&s)[kNB][4], int kk, u32 (&a)[4]) {
    a[0] = ptx::pack2<kBF16>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = ptx::pack2<kBF16>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = ptx::pack2<kBF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = ptx::pack2<kBF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

template <int kElems> struct VecOf;
struct alignas(16) Vec16 { u32 w[4]; };
struct alignas(8) Vec8 { u32 w[2]; };
template <> struct VecOf<8> { typedef Vec16 type; };
template <> struct VecOf<4> { typedef Vec8 type; };
template <> struct VecOf<2> { typedef u32 type; };
template <> struct VecOf<1> { typedef u16 type; };

// Epilogue, part 1 (per warp): normalize this warp's rows, write them as 16-bit into the row-major staging tile
// sO (row stride kStrideO) and write LSE. Rows with no visible key get O = 0 and LSE = +inf, as FlashAttention.
// warp_row0: the warp's first row inside the CTA tile.
template <bool kBF16, int kMT, int kNV, int kStrideO>
__device__ __forceinline__ void normalize_and_stage(const FwdParams& p, float (&acc_o)[kMT][kNV][4],
                                                    const float (&row_max)[kMT][2], const float (&row_sum)[kMT][2],
                                                    u16* sO, int warp_row0, int q0, int lane) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float sum = quad_sum(row_sum[mt][h]);
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            const int r = warp_row0 + mt * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int nb = 0; nb < kNV; ++nb) {
                const u32 v = ptx::pack2<kBF16>(acc_o[mt][nb][2 * h] * inv, acc_o[mt][nb][2 * h + 1] * inv);
                *reinterpret_cast<u32*>(sO + r * kStrideO + nb * 8 + 2 * (lane & 3)) = v;
            }
            if (p.lse != nullptr && (lane & 3) == 0 && q0 + r < p.seqlen_q) {
                const float lse = sum > 0.f ? row_max[mt][h] * p.scale + logf(sum) : __int_as_float(0x7f800000);
                p.lse[((long long)blockIdx.z * p.heads_q + blockIdx.y) * p.seqlen_q + q0 + r] = lse;
            }
        }
    }
}

// Epilogue, part 2 (whole CTA, after a barrier): copy the staged tile to global memory with full-width vectors.
// rot (a multiple of kVecV): staged column c is output element (c + rot) mod kHeadDimV (split-row TMA layout).
template <int kBlockM, int kHeadDimV, int kVecV, int kStrideO, int kThreads>
__device__ __forceinline__ void store_tile(const FwdParams& p, const u16* sO, int q0, int tid, int rot = 0) {
    using OVec = typename VecOf<kVecV>::type;
    constexpr int kPerRow = kHeadDimV / kVecV;
    u16* gO = static_cast<u16*>(p.o) + blockIdx.z * p.o_batch_stride + blockIdx.y * p.o_head_stride +
              (long long)q0 * p.o_seq_stride;
    const int valid_rows = p.seqlen_q - q0;
    for (int i = tid; i < kBlockM * kPerRow; i += kThreads) {
        const int r = i / kPerRow;
        const int c = (i - r * kPerRow) * kVecV;
        const int c_dst = c + rot < kHeadDimV ? c + rot : c + rot - kHeadDimV;
        if (r < valid_rows)
            *reinterpret_cast<OVec*>(gO + r * p.o_seq_stride + c_dst) =
                *reinterpret_cast<const OVec*>(sO + r * kStrideO + c);
    }
}

// Copies `rows` x kHeadDim elements (row r at g + r*row_stride) into shared memory at offset(r, c) (elements).
// Rows at or beyond `valid_rows` become zeros (cp.async zero-fill), so 0 * garbage never reaches PV.
template <int kRows, int kHeadDim, int kVec, int kThreads, class Offset>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                          Offset offset) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kRows * kPerRow;
#pragma unroll 4
    for (int i = tid; i < kTotal; i += kThreads) {
        const int r = i / kPerRow;
        const int c = (i - r * kPerRow) * kVec;
        const bool valid = r < valid_rows;
        const u16* src = valid ? g + r * row_stride + c : g;
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + offset(r, c)), src, valid);
        } else {
            // Odd head dims: a row is not 4-byte aligned, cp.async cannot move it; a plain load is the only choice.
            s[offset(r, c)] = valid ? *src : u16(0);
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

}  // namespace detail
}  // namespace rtattn
