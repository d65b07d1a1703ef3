// FlashAttention-2's backward pass for any head_dim, on mma.m16n8k16: three kernels of one module.
//
//   preprocess  per query row: D = rowsum(dO * O), LSE in log2 units; zeroes the dQ accumulator.
//   main        one CTA per (key block, kv head, batch) walks every query block of every query head of its GQA
//               group: it recomputes S = Q K^T and P = exp(S * scale - LSE), then
//                 dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dK += dS^T Q,   dQ += dS K,
//               keeping dK and dV in registers (summed over the group: the caller never reduces) and adding dQ into
//               an fp32 accumulator in global memory (in key-block order when deterministic).
//   postprocess dQ = accumulator * scale, to the dtype and the caller's strides.
//
// Head dims are padded to 16 (both are the k of an MMA here: QK^T reduces over d_qk, dO V^T over d_v); padded
// columns are zero in shared memory and never stored. Query rows past seqlen_q carry LSE = +inf, so their P is 0
// and they add nothing; key rows past seqlen_k are zero and masked.
#pragma once
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/params.h"
#include "common/ptx.cuh"

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV   the real head dims
//   kPadQK, kPadV           both padded to 16
//   kBF16, kCausal
//   kBlockM, kBlockN        query rows per step, keys per CTA
//   kWarps, kColSplit       warps; warps sharing one 16-key row group of dK/dV (their columns interleaved)
//   kVecQK, kVecV           elements per global vector access (each divides its head dim)
template <class T>
struct BwdShape {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideQK = geometry::padded_row(T::kPadQK);
    static constexpr int kStrideV = geometry::padded_row(T::kPadV);
    static constexpr int kStrideN = geometry::padded_row(T::kBlockN);  // P and dS tiles
    // S, dP and dQ: kRowWarps groups of 16 query rows; within one, kColWarps warps split the columns.
    static constexpr int kRowWarps = T::kBlockM / 16;
    static constexpr int kColWarps = T::kWarps / kRowWarps;
    static constexpr int kSCols = T::kBlockN / kColWarps;  // S columns per warp
    // dK and dV: T::kBlockN / 16 groups of 16 key rows, kColSplit warps each.
    static constexpr int kPairsQK = T::kPadQK / 16;  // 16-column pairs of 8-wide MMA blocks
    static constexpr int kPairsV = T::kPadV / 16;
    static constexpr int kMyPairsQK = (kPairsQK + T::kColSplit - 1) / T::kColSplit;  // per warp, dK
    static constexpr int kMyPairsV = (kPairsV + T::kColSplit - 1) / T::kColSplit;    // per warp, dV
    static constexpr int kDqPairs = (kPairsQK + kColWarps - 1) / kColWarps;         // per warp, dQ
    static constexpr int kSmemBytes = geometry::bwd_mma_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN);

    static_assert(T::kPadQK % 16 == 0 && T::kPadQK >= T::kHeadDimQK && T::kPadQK - T::kHeadDimQK < 16, "QK pad");
    static_assert(T::kPadV % 16 == 0 && T::kPadV >= T::kHeadDimV && T::kPadV - T::kHeadDimV < 16, "V pad");
    static_assert(T::kBlockM % 16 == 0 && T::kWarps % kRowWarps == 0, "whole 16-row groups of query rows");
    static_assert(kSCols % 16 == 0 && kSCols * kColWarps == T::kBlockN, "S columns in 16-wide pairs");
    static_assert((T::kBlockN / 16) * T::kColSplit == T::kWarps, "every warp owns part of one 16-key row group");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
};

namespace detail {

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

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

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
    float* acc = p.dq_accum + ws_row * T::kPadQK;
    for (int c = lane; c < T::kPadQK; c += 32) acc[c] = 0.f;
    if (row % T::kBlockM == 0 && lane == 0) p.dq_sem[ws_row / T::kBlockM] = 0;
    float d = 0.f, lse2 = __int_as_float(0x7f800000);  // past seqlen_q: D 0, LSE +inf
    if (row < p.seqlen_q) {
        const u16* o = static_cast<const u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
                       row * p.o_seq_stride;
        const u16* dout = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride +
                          row * p.do_seq_stride;
        for (int c = lane; c < T::kHeadDimV; c += 32)
            d += detail::to_float<T::kBF16>(o[c]) * detail::to_float<T::kBF16>(dout[c]);
        d = detail::warp_sum(d);
        lse2 = p.lse[((long long)batch * p.heads_q + head) * p.seqlen_q + row] * 1.4426950408889634f;
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
    if (row >= p.seqlen_q) return;
    const float* acc = p.dq_accum + (((long long)batch * p.heads_q + head) * p.m_pad + row) * T::kPadQK;
    u16* dq = static_cast<u16*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride + row * p.dq_seq_stride;
    for (int c = 2 * lane; c < T::kHeadDimQK; c += 64)
        detail::store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(dq, c, acc[c] * p.scale, acc[c + 1] * p.scale);
}

template <class T>
__device__ __forceinline__ void flash_bwd_main(const BwdParams& p) {
    using S = BwdShape<T>;
    using ptx::u16;
    using ptx::u32;
    constexpr int kThreads = S::kThreads;
    constexpr int kSNB = S::kSCols / 8;  // 8-wide S column blocks per warp

    extern __shared__ __align__(16) unsigned char smem_raw[];
    u16* sK = reinterpret_cast<u16*>(smem_raw);
    u16* sV = sK + T::kBlockN * S::kStrideQK;
    u16* sQ = sV + T::kBlockN * S::kStrideV;
    u16* sdO = sQ + T::kBlockM * S::kStrideQK;
    u16* sP = sdO + T::kBlockM * S::kStrideV;
    u16* sdS = sP + T::kBlockM * S::kStrideN;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n_block = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
    const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
    const int n0 = n_block * T::kBlockN;
    const int g = lane >> 2, t2 = (lane & 3) * 2;  // accumulator fragment: rows g and g + 8, columns t2 and t2 + 1

    auto at_qk = [](int r, int c) { return r * S::kStrideQK + c; };
    auto at_v = [](int r, int c) { return r * S::kStrideV + c; };
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK, tid, at_qk);
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sV, tid, at_v);
    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, at_qk);
    detail::zero_pad_cols<T::kBlockM, T::kHeadDimV, T::kPadV, kThreads>(sdO, tid, at_v);

    const u16* gK = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride +
                    (long long)n0 * p.k_seq_stride;
    const u16* gV = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride +
                    (long long)n0 * p.v_seq_stride;
    detail::load_tile<T::kBlockN, T::kHeadDimQK, T::kVecQK, kThreads>(sK, gK, p.k_seq_stride, seqlen_k - n0, tid,
                                                                      at_qk);
    detail::load_tile<T::kBlockN, T::kHeadDimV, T::kVecV, kThreads>(sV, gV, p.v_seq_stride, seqlen_k - n0, tid, at_v);
    ptx::cp_async_commit();

    // Query blocks this key block is seen from: causal (bottom-right) skips those entirely above it.
    const int m_blocks = (seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const int first_row = T::kCausal && n0 > seqlen_k - seqlen_q ? n0 - (seqlen_k - seqlen_q) : 0;
    const int m_begin = first_row / T::kBlockM;

    // Warp roles. S, dP and dQ: 16 query rows (wm) x a column share (wn). dK, dV: 16 key rows (wr) x every
    // kColSplit-th 16-column pair (wc).
    const int wm = warp / S::kColWarps, wn = warp % S::kColWarps;
    const int wr = warp / T::kColSplit, wc = warp % T::kColSplit;
    // ldmatrix lane addressing (fragment layouts of mma.m16n8k16):
    //   A, row-major source:                 row lane%16, column 8*(lane/16)
    //   B from an [n][k] source (x4, 2 n-blocks): row 8*(lane/16) + lane%8, column 8*((lane/8)%2)
    //   B from a [k][n] source, .trans (x4):  row lane%16, column 8*(lane/16)
    //   A^T from a [k][m] source, .trans:     row (lane%8) + 8*(lane/16), column 8*((lane/8)%2)
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int bn_row = (lane & 7) + (lane >> 4) * 8, bn_col = ((lane >> 3) & 1) * 8;
    const int at_row = (lane & 7) + (lane >> 4) * 8, at_col = ((lane >> 3) & 1) * 8;

    float acc_dk[S::kMyPairsQK * 2][4];
    float acc_dv[S::kMyPairsV * 2][4];
#pragma unroll
    for (int i = 0; i < S::kMyPairsQK * 2; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dk[i][e] = 0.f;
#pragma unroll
    for (int i = 0; i < S::kMyPairsV * 2; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_dv[i][e] = 0.f;

    for (int head = kv_head * p.q_per_kv; head < (kv_head + 1) * p.q_per_kv; ++head) {
        const u16* gQ = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
        const u16* gdO = static_cast<const u16*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
        const long long ws_head = ((long long)batch * p.heads_q + head) * p.m_pad;
        for (int m = m_begin; m < m_blocks; ++m) {
            const int m0 = m * T::kBlockM;
            __syncthreads();  // the previous step is done with Q, dO, P and dS
            detail::load_tile<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(
                sQ, gQ + (long long)m0 * p.q_seq_stride, p.q_seq_stride, seqlen_q - m0, tid, at_qk);
            detail::load_tile<T::kBlockM, T::kHeadDimV, T::kVecV, kThreads>(
                sdO, gdO + (long long)m0 * p.do_seq_stride, p.do_seq_stride, seqlen_q - m0, tid, at_v);
            ptx::cp_async_commit();
            const int r_lo = m0 + wm * 16 + g;  // this thread's two query rows
            const float lse2_lo = p.lse2[ws_head + r_lo], lse2_hi = p.lse2[ws_head + r_lo + 8];
            const float d_lo = p.delta[ws_head + r_lo], d_hi = p.delta[ws_head + r_lo + 8];
            ptx::cp_async_wait<0>();
            __syncthreads();

            // S = Q K^T and dP = dO V^T for 16 rows x kSCols columns.
            float s[kSNB][4], dp[kSNB][4];
#pragma unroll
            for (int nb = 0; nb < kSNB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nb][e] = dp[nb][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < T::kPadQK / 16; ++kk) {
                u32 a[4];
                ptx::ldsm_x4(ptx::smem_u32(sQ + at_qk(wm * 16 + a_row, kk * 16 + a_col)), a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int np = 0; np < kSNB / 2; ++np) {
                    u32 b0, b1, b2, b3;
                    ptx::ldsm_x4(ptx::smem_u32(sK + at_qk(wn * S::kSCols + np * 16 + bn_row, kk * 16 + bn_col)), b0,
                                 b1, b2, b3);
                    ptx::mma<T::kBF16>(s[2 * np], a, b0, b1);
                    ptx::mma<T::kBF16>(s[2 * np + 1], a, b2, b3);
                }
            }
#pragma unroll
            for (int kk = 0; kk < T::kPadV / 16; ++kk) {
                u32 a[4];
                ptx::ldsm_x4(ptx::smem_u32(sdO + at_v(wm * 16 + a_row, kk * 16 + a_col)), a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int np = 0; np < kSNB / 2; ++np) {
                    u32 b0, b1, b2, b3;
                    ptx::ldsm_x4(ptx::smem_u32(sV + at_v(wn * S::kSCols + np * 16 + bn_row, kk * 16 + bn_col)), b0,
                                 b1, b2, b3);
                    ptx::mma<T::kBF16>(dp[2 * np], a, b0, b1);
                    ptx::mma<T::kBF16>(dp[2 * np + 1], a, b2, b3);
                }
            }

            // P = exp(S * scale - LSE) (0 where masked), dS = P * (dP - D); both to shared memory, 16-bit.
            const bool masked = n0 + T::kBlockN > seqlen_k ||
                                (T::kCausal && n0 + T::kBlockN - 1 > m0 + seqlen_k - seqlen_q);
#pragma unroll
            for (int nb = 0; nb < kSNB; ++nb) {
                const int c_local = wn * S::kSCols + nb * 8 + t2;
                float pr[4], ds[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = r_lo + (e >= 2 ? 8 : 0), col = n0 + c_local + (e & 1);
                    const bool hidden = masked && (col >= seqlen_k || (T::kCausal && col > row + seqlen_k - seqlen_q));
                    pr[e] = hidden ? 0.f : ptx::fast_exp2(s[nb][e] * p.scale_log2 - (e >= 2 ? lse2_hi : lse2_lo));
                    ds[e] = pr[e] * (dp[nb][e] - (e >= 2 ? d_hi : d_lo));
                }
                const int r_local = wm * 16 + g;
                *reinterpret_cast<u32*>(sP + r_local * S::kStrideN + c_local) = ptx::pack2<T::kBF16>(pr[0], pr[1]);
                *reinterpret_cast<u32*>(sP + (r_local + 8) * S::kStrideN + c_local) =
                    ptx::pack2<T::kBF16>(pr[2], pr[3]);
                *reinterpret_cast<u32*>(sdS + r_local * S::kStrideN + c_local) = ptx::pack2<T::kBF16>(ds[0], ds[1]);
                *reinterpret_cast<u32*>(sdS + (r_local + 8) * S::kStrideN + c_local) =
                    ptx::pack2<T::kBF16>(ds[2], ds[3]);
            }
            __syncthreads();

            // dV += P^T dO and dK += dS^T Q for this warp's 16 keys, reducing over the block's query rows.
#pragma unroll
            for (int kk = 0; kk < T::kBlockM / 16; ++kk) {
                u32 a[4];
                ptx::ldsm_x4_t(ptx::smem_u32(sP + (kk * 16 + at_row) * S::kStrideN + wr * 16 + at_col), a[0], a[1],
                               a[2], a[3]);
#pragma unroll
                for (int i = 0; i < S::kMyPairsV; ++i) {
                    const int pair = wc + i * T::kColSplit;
                    if (pair < S::kPairsV) {
                        u32 b0, b1, b2, b3;
                        ptx::ldsm_x4_t(ptx::smem_u32(sdO + at_v(kk * 16 + a_row, pair * 16 + a_col)), b0, b1, b2, b3);
                        ptx::mma<T::kBF16>(acc_dv[2 * i], a, b0, b1);
                        ptx::mma<T::kBF16>(acc_dv[2 * i + 1], a, b2, b3);
                    }
                }
                ptx::ldsm_x4_t(ptx::smem_u32(sdS + (kk * 16 + at_row) * S::kStrideN + wr * 16 + at_col), a[0], a[1],
                               a[2], a[3]);
#pragma unroll
                for (int i = 0; i < S::kMyPairsQK; ++i) {
                    const int pair = wc + i * T::kColSplit;
                    if (pair < S::kPairsQK) {
                        u32 b0, b1, b2, b3;
                        ptx::ldsm_x4_t(ptx::smem_u32(sQ + at_qk(kk * 16 + a_row, pair * 16 + a_col)), b0, b1, b2, b3);
                        ptx::mma<T::kBF16>(acc_dk[2 * i], a, b0, b1);
                        ptx::mma<T::kBF16>(acc_dk[2 * i + 1], a, b2, b3);
                    }
                }
            }

            // dQ += dS K for 16 query rows x this warp's column pairs, into the fp32 accumulator.
            float dq[S::kDqPairs * 2][4];
#pragma unroll
            for (int i = 0; i < S::kDqPairs * 2; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) dq[i][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
                u32 a[4];
                ptx::ldsm_x4(ptx::smem_u32(sdS + (wm * 16 + a_row) * S::kStrideN + kk * 16 + a_col), a[0], a[1], a[2],
                             a[3]);
#pragma unroll
                for (int i = 0; i < S::kDqPairs; ++i) {
                    const int pair = wn + i * S::kColWarps;
                    if (pair < S::kPairsQK) {
                        u32 b0, b1, b2, b3;
                        ptx::ldsm_x4_t(ptx::smem_u32(sK + at_qk(kk * 16 + a_row, pair * 16 + a_col)), b0, b1, b2, b3);
                        ptx::mma<T::kBF16>(dq[2 * i], a, b0, b1);
                        ptx::mma<T::kBF16>(dq[2 * i + 1], a, b2, b3);
                    }
                }
            }
            int* turn = p.dq_sem + (ws_head + m0) / T::kBlockM;
            if (p.deterministic) {
                // Key blocks add in their order: block n waits until blocks 0..n-1 of this query block have added.
                // Those that reach this query block are exactly a prefix of the key blocks (the causal mask is
                // monotone), and lower blocks are dispatched first, so the wait always ends.
                if (tid == 0)
                    while (*reinterpret_cast<volatile int*>(turn) != n_block) {
                    }
                __syncthreads();
                __threadfence();
            }
            float* acc = p.dq_accum + (ws_head + r_lo) * T::kPadQK;
#pragma unroll
            for (int i = 0; i < S::kDqPairs; ++i) {
                const int pair = wn + i * S::kColWarps;
                if (pair < S::kPairsQK) {
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const int c = pair * 16 + half * 8 + t2;
                        const float* v = dq[2 * i + half];
                        if (c < T::kHeadDimQK) {
                            atomicAdd(acc + c, v[0]);
                            atomicAdd(acc + 8 * T::kPadQK + c, v[2]);
                        }
                        if (c + 1 < T::kHeadDimQK) {
                            atomicAdd(acc + c + 1, v[1]);
                            atomicAdd(acc + 8 * T::kPadQK + c + 1, v[3]);
                        }
                    }
                }
            }
            if (p.deterministic) {
                __threadfence();  // this CTA's additions are visible before its turn is passed on
                __syncthreads();
                if (tid == 0) atomicAdd(turn, 1);
            }
        }
    }

    // dK (scaled) and dV for this warp's 16 keys, to the caller's layout: rows below seqlen_k, real columns.
    const int key_lo = n0 + wr * 16 + g;
    u16* dk = static_cast<u16*>(p.dk) + batch * p.dk_batch_stride + kv_head * p.dk_head_stride;
    u16* dv = static_cast<u16*>(p.dv) + batch * p.dv_batch_stride + kv_head * p.dv_head_stride;
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
        const int key = key_lo + half_row * 8;
        if (key >= seqlen_k) continue;
        u16* dk_row = dk + key * p.dk_seq_stride;
        u16* dv_row = dv + key * p.dv_seq_stride;
#pragma unroll
        for (int i = 0; i < S::kMyPairsQK; ++i) {
            const int pair = wc + i * T::kColSplit;
            if (pair < S::kPairsQK)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float* v = acc_dk[2 * i + half] + 2 * half_row;
                    detail::store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(dk_row, pair * 16 + half * 8 + t2,
                                                                          v[0] * p.scale, v[1] * p.scale);
                }
        }
#pragma unroll
        for (int i = 0; i < S::kMyPairsV; ++i) {
            const int pair = wc + i * T::kColSplit;
            if (pair < S::kPairsV)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const float* v = acc_dv[2 * i + half] + 2 * half_row;
                    detail::store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(dv_row, pair * 16 + half * 8 + t2, v[0],
                                                                        v[1]);
                }
        }
    }
}

}  // namespace rtattn
