// FlashAttention-2 style forward pass for any head_dim.
//
// One CTA owns kBlockM query rows of one (batch, head); each warp owns kMTiles consecutive 16-row MMA tiles.
// The CTA streams K/V tiles of kBlockN keys through a kStages-deep cp.async ring and keeps the running row max,
// row sum and the fp32 output accumulator in registers (online softmax), so no Sq x Sk matrix ever exists.
//
// Head dims are padded to the MMA shape: QK^T reduces over kPadQK (a multiple of 16, the k of m16n8k16) and PV
// produces kPadV columns (a multiple of 8, the n). Padded columns are zeroed in shared memory once and never
// written by loads, so they contribute exact zeros; they are never stored.
#pragma once
#include "rtattn_params.h"
#include "rtattn_ptx.cuh"

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV   the real head dims
//   kPadQK, kPadV           padded to 16 and 8
//   kBF16, kCausal
//   kBlockM, kBlockN, kWarps, kMTiles, kStages, kQInRegs
//   kVecQK, kVecV           elements per global vector access (each divides its head dim)
template <class T>
struct FwdShape {
    static constexpr int kThreads = T::kWarps * 32;
    // Row strides in shared memory: an odd number of 16-byte chunks puts the 8 rows an ldmatrix reads in 8
    // different bank groups, for any head dim (an XOR swizzle would need a power-of-two row width).
    static constexpr int stride_for(int pad) { return (pad / 8) % 2 == 1 ? pad : pad + 8; }
    static constexpr int kStrideQK = stride_for(T::kPadQK);
    static constexpr int kStrideV = stride_for(T::kPadV);
    static constexpr int kQElems = T::kBlockM * kStrideQK;
    static constexpr int kKElems = T::kBlockN * kStrideQK;
    static constexpr int kVElems = T::kBlockN * kStrideV;
    static constexpr int kOElems = T::kBlockM * kStrideV;
    static constexpr int kMainElems = kQElems + T::kStages * (kKElems + kVElems);
    static constexpr int kSmemBytes = 2 * (kMainElems > kOElems ? kMainElems : kOElems);

    static_assert(T::kPadQK % 16 == 0 && T::kPadQK >= T::kHeadDimQK && T::kPadQK - T::kHeadDimQK < 16, "QK pad");
    static_assert(T::kPadV % 8 == 0 && T::kPadV >= T::kHeadDimV && T::kPadV - T::kHeadDimV < 8, "V pad");
    static_assert(T::kBlockM == T::kWarps * T::kMTiles * 16, "each warp owns kMTiles 16-row tiles");
    static_assert(T::kBlockN % 16 == 0, "kBlockN is consumed in k-steps of 16 by PV");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
    static_assert(T::kStages >= 1 && T::kStages <= 3, "stages");
};

namespace detail {

using ptx::u16;
using ptx::u32;

struct alignas(16) Vec16 { u32 w[4]; };
struct alignas(8) Vec8 { u32 w[2]; };

template <int kElems> struct VecOf;
template <> struct VecOf<8> { typedef Vec16 type; };
template <> struct VecOf<4> { typedef Vec8 type; };
template <> struct VecOf<2> { typedef u32 type; };
template <> struct VecOf<1> { typedef u16 type; };

// Copies `rows` x kHeadDim elements (row r at g + r*row_stride) into shared memory with row stride kStride.
// Rows at or beyond `valid_rows` become zeros.
template <int kRows, int kHeadDim, int kStride, int kVec, int kThreads>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, long long row_stride, int valid_rows, int tid) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kRows * kPerRow;
#pragma unroll 4
    for (int i = tid; i < kTotal; i += kThreads) {
        const int r = i / kPerRow;
        const int c = (i - r * kPerRow) * kVec;
        const bool valid = r < valid_rows;
        const u16* src = valid ? g + r * row_stride + c : g;
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + r * kStride + c), src, valid);
        } else {
            // Odd head dims: a row is not 4-byte aligned, cp.async cannot move it; a plain load is the only choice.
            s[r * kStride + c] = valid ? *src : u16(0);
        }
    }
}

// Zeroes columns [kHeadDim, kPad) of `rows` rows: the MMA reads them, so they must hold exact zeros.
template <int kRows, int kHeadDim, int kPad, int kStride, int kThreads>
__device__ __forceinline__ void zero_pad_cols(u16* s, int tid) {
    if constexpr (kPad > kHeadDim) {
        constexpr int kW = kPad - kHeadDim;
        for (int i = tid; i < kRows * kW; i += kThreads) {
            const int r = i / kW;
            s[r * kStride + kHeadDim + (i - r * kW)] = u16(0);
        }
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace detail

template <class T>
__device__ __forceinline__ void flash_fwd(const FwdParams& p) {
    using S = FwdShape<T>;
    using detail::u16;
    using detail::u32;
    constexpr int kThreads = S::kThreads;
    constexpr int kNB = T::kBlockN / 8;    // 8-wide score column blocks per warp tile
    constexpr int kKQ = T::kPadQK / 16;    // k-steps of QK^T
    constexpr int kNV = T::kPadV / 8;      // 8-wide output column blocks
    const float kNegInf = -__int_as_float(0x7f800000);

    extern __shared__ __align__(16) unsigned char smem_raw[];
    u16* sQ = reinterpret_cast<u16*>(smem_raw);
    u16* sK = sQ + S::kQElems;
    u16* sV = sK + T::kStages * S::kKElems;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int m_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int kv_head = head / p.q_per_kv;
    const int q0 = m_block * T::kBlockM;
    const int seqlen_q = p.seqlen_q;
    const int seqlen_k = p.seqlen_k;
    // Causal alignment is bottom-right: query i sees keys j <= i + (seqlen_k - seqlen_q), as FlashAttention 2.1+.
    const int diag = seqlen_k - seqlen_q;

    const u16* gQ = static_cast<const u16*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                    (long long)q0 * p.q_seq_stride;
    const u16* gK = static_cast<const u16*>(p.k) + batch * p.k_batch_stride + kv_head * p.k_head_stride;
    const u16* gV = static_cast<const u16*>(p.v) + batch * p.v_batch_stride + kv_head * p.v_head_stride;

    int n_blocks = (seqlen_k + T::kBlockN - 1) / T::kBlockN;
    if constexpr (T::kCausal) {
        const int last_visible = q0 + T::kBlockM - 1 + diag;  // last key the block's last row may see
        const int causal_blocks = last_visible < 0 ? 0 : last_visible / T::kBlockN + 1;
        n_blocks = causal_blocks < n_blocks ? causal_blocks : n_blocks;
    }

    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, S::kStrideQK, kThreads>(sQ, tid);
    detail::zero_pad_cols<T::kStages * T::kBlockN, T::kHeadDimQK, T::kPadQK, S::kStrideQK, kThreads>(sK, tid);
    detail::zero_pad_cols<T::kStages * T::kBlockN, T::kHeadDimV, T::kPadV, S::kStrideV, kThreads>(sV, tid);

    auto load_kv = [&](int block, int slot) {
        const int k0 = block * T::kBlockN;
        detail::load_tile<T::kBlockN, T::kHeadDimQK, S::kStrideQK, T::kVecQK, kThreads>(
            sK + slot * S::kKElems, gK + (long long)k0 * p.k_seq_stride, p.k_seq_stride, seqlen_k - k0, tid);
        detail::load_tile<T::kBlockN, T::kHeadDimV, S::kStrideV, T::kVecV, kThreads>(
            sV + slot * S::kVElems, gV + (long long)k0 * p.v_seq_stride, p.v_seq_stride, seqlen_k - k0, tid);
    };

    // Group order: Q, then the first kStages-1 K/V blocks. Groups complete in order.
    detail::load_tile<T::kBlockM, T::kHeadDimQK, S::kStrideQK, T::kVecQK, kThreads>(sQ, gQ, p.q_seq_stride,
                                                                                    seqlen_q - q0, tid);
    ptx::cp_async_commit();
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
        if (s < n_blocks) load_kv(s, s);
        ptx::cp_async_commit();
    }

    const int warp_row0 = warp * T::kMTiles * 16;
    // ldmatrix lane addressing (see the fragment layouts of mma.m16n8k16):
    //   A (row-major 16x16): lane -> row lane%16, column 8*(lane/16)
    //   B from K [n][k] (x4 = two n-blocks): row 8*(lane/16) + lane%8, column 8*((lane/8)%2)
    //   B from V [k][n] via .trans (x4 = two n-blocks): row lane%16, column 8*(lane/16)
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
    const int v_row = lane & 15, v_col = (lane >> 4) * 8;

    u32 q_frag[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? kKQ : 1][4];
    auto load_q_frag = [&](int mt, int kk, u32 (&a)[4]) {
        const u16* src = sQ + (warp_row0 + mt * 16 + a_row) * S::kStrideQK + kk * 16 + a_col;
        ptx::ldsm_x4(ptx::smem_u32(src), a[0], a[1], a[2], a[3]);
    };
    if constexpr (T::kQInRegs) {
        ptx::cp_async_wait<T::kStages - 1>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
            for (int kk = 0; kk < kKQ; ++kk) load_q_frag(mt, kk, q_frag[mt][kk]);
    }

    float acc_o[T::kMTiles][kNV][4];
    float row_max[T::kMTiles][2];
    float row_sum[T::kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
        for (int nb = 0; nb < kNV; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[mt][nb][e] = 0.f;
        row_max[mt][0] = row_max[mt][1] = kNegInf;
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }

    for (int j = 0; j < n_blocks; ++j) {
        __syncthreads();  // every warp is done with the slot the next load overwrites
        const int j_load = j + T::kStages - 1;
        if (j_load < n_blocks) load_kv(j_load, j_load % T::kStages);
        ptx::cp_async_commit();
        ptx::cp_async_wait<T::kStages - 1>();
        __syncthreads();

        const int slot = j % T::kStages;
        const u16* k_tile = sK + slot * S::kKElems;
        const u16* v_tile = sV + slot * S::kVElems;
        const int n0 = j * T::kBlockN;

        // S = Q K^T for this warp's rows.
        float s[T::kMTiles][kNB][4];
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nb][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kKQ; ++kk) {
            u32 a_tmp[T::kMTiles][4];
            if constexpr (!T::kQInRegs) {
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) load_q_frag(mt, kk, a_tmp[mt]);
            }
#pragma unroll
            for (int np = 0; np < kNB / 2; ++np) {
                u32 b0, b1, b2, b3;
                ptx::ldsm_x4(ptx::smem_u32(k_tile + (np * 16 + k_row) * S::kStrideQK + kk * 16 + k_col), b0, b1, b2,
                             b3);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) {
                    const u32(&a)[4] = T::kQInRegs ? q_frag[mt][T::kQInRegs ? kk : 0] : a_tmp[mt];
                    ptx::mma<T::kBF16>(s[mt][2 * np], a, b0, b1);
                    ptx::mma<T::kBF16>(s[mt][2 * np + 1], a, b2, b3);
                }
            }
        }

        // Mask only where needed: the key tail, and (causal) blocks that cross the diagonal.
        bool need_mask = n0 + T::kBlockN > seqlen_k;
        if constexpr (T::kCausal) need_mask = need_mask || (n0 + T::kBlockN - 1 > q0 + diag);
        if (need_mask) {
#pragma unroll
            for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
                for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = n0 + nb * 8 + 2 * (lane & 3) + (e & 1);
                        const int row = q0 + warp_row0 + mt * 16 + (lane >> 2) + (e >> 1) * 8;
                        bool masked = col >= seqlen_k;
                        if constexpr (T::kCausal) masked = masked || col > row + diag;
                        if (masked) s[mt][nb][e] = kNegInf;
                    }
        }

        // Online softmax: rescale the running sum and output by exp2((m_old - m_new) * scale_log2).
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = row_max[mt][h];
#pragma unroll
                for (int nb = 0; nb < kNB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
                mx = detail::quad_max(mx);
                // A row with every key masked so far keeps max -inf; using 0 avoids (-inf) - (-inf) = NaN.
                const float m_use = mx == kNegInf ? 0.f : mx;
                const float corr = ptx::fast_exp2((row_max[mt][h] - m_use) * p.scale_log2);
                row_max[mt][h] = mx;
                const float m_scaled = m_use * p.scale_log2;
                float sum = 0.f;
#pragma unroll
                for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float pe = ptx::fast_exp2(fmaf(s[mt][nb][2 * h + e], p.scale_log2, -m_scaled));
                        s[mt][nb][2 * h + e] = pe;
                        sum += pe;
                    }
                }
                row_sum[mt][h] = row_sum[mt][h] * corr + sum;
#pragma unroll
                for (int nb = 0; nb < kNV; ++nb) {
                    acc_o[mt][nb][2 * h] *= corr;
                    acc_o[mt][nb][2 * h + 1] *= corr;
                }
            }
        }

        // O += P V: the score accumulator layout is exactly the A-fragment layout, so P never leaves registers.
#pragma unroll
        for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
            u32 a[T::kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < T::kMTiles; ++mt) {
                a[mt][0] = ptx::pack2<T::kBF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = ptx::pack2<T::kBF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = ptx::pack2<T::kBF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = ptx::pack2<T::kBF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int np = 0; np < kNV / 2; ++np) {
                u32 b0, b1, b2, b3;
                ptx::ldsm_x4_t(ptx::smem_u32(v_tile + (kk * 16 + v_row) * S::kStrideV + np * 16 + v_col), b0, b1, b2,
                               b3);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) {
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np], a[mt], b0, b1);
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
            if constexpr (kNV % 2 == 1) {  // a last 8-wide column block (kPadV = 8 mod 16)
                u32 b0, b1;
                ptx::ldsm_x2_t(ptx::smem_u32(v_tile + (kk * 16 + v_row) * S::kStrideV + (kNV - 1) * 8), b0, b1);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) ptx::mma<T::kBF16>(acc_o[mt][kNV - 1], a[mt], b0, b1);
            }
        }
    }

    // Epilogue: normalize, stage the tile in shared memory, then write rows with full-width vector stores.
    ptx::cp_async_wait<0>();
    __syncthreads();  // the staging area aliases Q/K/V
    u16* sO = sQ;
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float sum = detail::quad_sum(row_sum[mt][h]);
            // No visible key (causal with seqlen_q > seqlen_k): output 0 and LSE +inf, as FlashAttention does.
            const float inv = sum > 0.f ? 1.f / sum : 0.f;
            const int r = warp_row0 + mt * 16 + (lane >> 2) + h * 8;
#pragma unroll
            for (int nb = 0; nb < kNV; ++nb) {
                const u32 v = ptx::pack2<T::kBF16>(acc_o[mt][nb][2 * h] * inv, acc_o[mt][nb][2 * h + 1] * inv);
                *reinterpret_cast<u32*>(sO + r * S::kStrideV + nb * 8 + 2 * (lane & 3)) = v;
            }
            if (p.lse != nullptr && (lane & 3) == 0 && q0 + r < seqlen_q) {
                const float m = row_max[mt][h];
                const float lse = sum > 0.f ? m * p.scale + logf(sum) : __int_as_float(0x7f800000);
                p.lse[((long long)batch * p.heads_q + head) * seqlen_q + q0 + r] = lse;
            }
        }
    }
    __syncthreads();

    using OVec = typename detail::VecOf<T::kVecV>::type;
    constexpr int kPerRow = T::kHeadDimV / T::kVecV;
    u16* gO = static_cast<u16*>(p.o) + batch * p.o_batch_stride + head * p.o_head_stride +
              (long long)q0 * p.o_seq_stride;
    const int valid_rows = seqlen_q - q0;
    for (int i = tid; i < T::kBlockM * kPerRow; i += kThreads) {
        const int r = i / kPerRow;
        const int c = (i - r * kPerRow) * T::kVecV;
        if (r < valid_rows)
            *reinterpret_cast<OVec*>(gO + r * p.o_seq_stride + c) = *reinterpret_cast<const OVec*>(sO + r * S::kStrideV + c);
    }
}

}  // namespace rtattn
