// Hopper (sm_90a) backward pass: bwd/mma.cuh's algorithm with its five GEMMs as warpgroup MMAs; the preprocess and
// postprocess are every backward family's (bwd/rows.cuh).
//
//   main  one CTA per (key block, kv head, batch) walks every query block of every query head of its GQA group.
//         Each warpgroup owns 64 of the CTA's keys and keeps their dK and dV in registers across the walk. Scores
//         are computed transposed, keys along wgmma's M:
//           S^T = K Q^T,  dP^T = V dO^T            (both operands from shared memory, K-major)
//           P^T = exp2(S^T * scale_log2 - LSE2),  dS^T = P^T * (dP^T - D)   (LSE2 and D per query: per column;
//                                                   softcapped: S^T capped first, dS^T times the cap's slope)
//           dV += P^T dO,  dK += dS^T Q             (A from the accumulators, repacked; dO and Q read N-major)
//           dQ += dS K                              (dS^T from shared memory read M-major, K read N-major)
//         so P^T and dS^T come out of the accumulators in the A-fragment layout the dV and dK GEMMs take from
//         registers. dQ is staged in shared memory and added into the fp32 accumulator by one bulk reduction per
//         staging tile (in key-block order when deterministic): at pads 80..144 the two warpgroups split its
//         columns (geometry::bwd_sm90_dq_width), each over all the CTA's keys, into one tile; else each adds every
//         column over its own keys from a tile of its own (twice the bytes reduced). Q, dO and their rows' LSE and D
//         stream through a cp.async ring of kStages query blocks; d132's rows move as 16-byte vectors, every tile's
//         placed as the CTA's first query head's lie (0 or 4 columns right).
//
// Query rows past seqlen_q carry LSE = +inf and D = 0 (the preprocess), so their P^T and dS^T are 0; key rows past
// seqlen_k are zero in shared memory, so their scores are finite, their dQ terms are 0 (dS * 0) and their dK/dV
// rows are never stored. The causal mask sets S^T = -inf, so P^T = exp2(-inf) = 0.
#pragma once
#include "common/epilogue.cuh"
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/seq.cuh"
#include "common/softmax.cuh"
#include "sm90/gemm.cuh"
#include "sm90/load.cuh"
#include "sm90/tile_layout.cuh"
#include "bwd/rows.cuh"

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV   the real head dims
//   kPadQK, kPadV           both padded to 16
//   kBF16, kCausal, kVarlen (packed sequences: common/seq.cuh)
//   kBlockM                 query rows per step: 64 (the N of the transposed GEMMs, the M of dQ)
//   kBlockN                 keys per CTA: 64 per warpgroup
//   kWarps                  4 per warpgroup
//   kStages                 Q/dO buffers: 2 loads the next step's while this one computes
//   kVecQK, kVecV           elements per global vector access (each divides its head dim)
template <class T>
struct BwdShapeSm90 {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kWGs = T::kWarps / 4;
    static constexpr int kDqStride = geometry::bwd_dq_stride(T::kPadQK);  // fp32 dQ rows, here and in the workspace
    // Tiles' columns, whether the N-major reads of them are one wgmma each, the dK/dV/dQ accumulators' columns:
    // geometry.h says why.
    static constexpr int kTileQK = geometry::bwd_sm90_tile_cols(T::kPadQK);
    static constexpr int kTileV = geometry::bwd_sm90_tile_cols(T::kPadV);
    static constexpr bool kWholeQK = geometry::bwd_sm90_whole(T::kPadQK), kWholeV = geometry::bwd_sm90_whole(T::kPadV);
    static constexpr int kAccQK = geometry::bwd_sm90_acc_cols(T::kHeadDimQK, T::kPadQK);
    static constexpr int kAccV = geometry::bwd_sm90_acc_cols(T::kHeadDimV, T::kPadV);
    // d132 (a head dim of 4 mod 8 on whole panels, d_qk = d_v, 136 accumulator columns): Q and dO rows move as
    // 16-byte vectors, placed 0 or 4 columns right as the rows lie, K and V alike. (d140, 144 columns, spilled 44
    // bytes causal bf16; d_qk != d_v pairs with 132 on one side 8-60.)
    static constexpr bool kShiftRows =
        kWholeQK && T::kHeadDimQK % 8 == 4 && T::kHeadDimQK == T::kHeadDimV && kAccQK <= 136;
    static constexpr int kKElems = T::kBlockN * kTileQK, kVElems = T::kBlockN * kTileV;
    static constexpr int kQElems = T::kBlockM * kTileQK, kdOElems = T::kBlockM * kTileV;
    static constexpr int kdSElems = T::kBlockN * T::kBlockM;
    static constexpr int kNB = T::kBlockM / 8;  // 8-query column blocks of S^T and dP^T
    // dQ: the two warpgroups split the columns over all the CTA's keys, into one staging tile, where pad_qk is
    // 80..144 (d128: half the bytes reduced); else each warpgroup every column over its own keys.
    static constexpr bool kDqByPanel = geometry::bwd_sm90_dq_by_panel(T::kPadQK, T::kBlockN);
    static constexpr int kDqTiles = kDqByPanel ? 1 : kWGs;
    static constexpr int kSmemBytes =
        geometry::bwd_sm90_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN, T::kStages);

    static_assert(T::kPadQK % 16 == 0 && T::kPadQK >= T::kHeadDimQK && T::kPadQK - T::kHeadDimQK < 16, "QK pad");
    static_assert(T::kPadV % 16 == 0 && T::kPadV >= T::kHeadDimV && T::kPadV - T::kHeadDimV < 16, "V pad");
    static_assert(T::kBlockM == 64, "64 query rows per step: one wgmma M for dQ, one 64-column panel of dS^T");
    static_assert(T::kWarps % 4 == 0 && T::kBlockN == 64 * kWGs, "each warpgroup owns 64 keys");
    static_assert(T::kStages == 1 || T::kStages == 2, "one or two Q/dO buffers");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
};

namespace detail {
// The placement (0 or 4 columns right) of a row's 16-byte vectors: rows of one head share it where the seq stride is
// a multiple of 8 elements (fast); else 8-byte vectors, placed at 0.
__device__ __forceinline__ int row_shift(const void* row, bool fast) {
    return fast ? int(reinterpret_cast<unsigned long long>(row) >> 1 & 7) : 0;
}

template <int kNB>
__device__ __forceinline__ void zero_frags(float (&a)[kNB][4]) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) a[nb][e] = 0.f;
}

// S^T = K Q^T or dP^T = V dO^T for warpgroup wg's 64 keys (rows of A) and the step's kNB x 8 queries: both operands
// K-major in shared memory, kSteps k-steps of 16. Issued, not committed.
template <class LA, class LB, int kSteps, bool kBF16, int kNB>
__device__ __forceinline__ void bwd_scores_t(float (&d)[kNB][4], u32 a, u32 b, int wg) {
    sm90::gemm_ss<kNB * 8, kSteps, kBF16, false, false, false>(
        d, [&](int kk) { return LA::k_major(a, wg * 64, kk); }, [&](int kk, int c0) { return LB::k_major(b, c0, kk); });
}

// The step's arithmetic, in each thread's accumulator fragments of S^T and dP^T (rows: keys key0 and key0 + 8;
// columns: queries nb * 8 + t2 (+ 1) of the step's block starting at m0), shared by bwd/sm90.cuh and bwd/sm90_ws.cuh.
// P^T = exp2(S^T * scale_log2 - LSE2[query]), 0 where the mask hides the key (`masked`: the block meets the mask's
// edge; shift: mask.shift()), packed to 16 bits as dV's A fragments (and the value dS is computed from, as
// bwd/mma.cuh). kSoftcap: S^T is capped first (t = tanh(S^T * softcap_scale)), and capped(nb, p, t) gets each 8-query
// block's P^T and t (4 of each), for dS's factor P^T * (1 - t^2): the bwd_capped_* below. kAlibi: t loses alibi *
// |key - (query + shift)| before the exponential (common/mask.cuh's ALiBi rule; the slope is of t, not of the bias).
template <bool kBF16, bool kSoftcap, bool kAlibi, int kNB, class Mask, class Capped>
__device__ __forceinline__ void bwd_p_t(float (&s)[kNB][4], u32 (&pa)[kNB / 2][4], const float* sLse, const BwdParams& p,
                                        const Mask& mask, bool masked, int key0, int m0, int shift, int t2,
                                        float alibi, Capped&& capped) {
    // kAlibi: key0 - (m0 + t2 + shift), formed once; each element's distance adds a constant.
    const float kbase = kAlibi ? float(key0 - m0 - t2 - shift) : 0.f;
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
        const int c = nb * 8 + t2;
        const float lse2[2] = {sLse[c], sLse[c + 1]};
        float t[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            t[e] = s[nb][e];
            if constexpr (kSoftcap) t[e] = ptx::tanh_approx(t[e] * p.softcap_scale);
            float u = t[e];
            if constexpr (kAlibi) u -= alibi * fabsf(kbase + float(8 * (e >> 1) - (e & 1) - nb * 8));
            float x = u * p.scale_log2 - lse2[e & 1];
            if (masked && mask.hides(m0 + c + (e & 1) + shift, key0 + 8 * (e >> 1))) x = neg_inf();
            s[nb][e] = ptx::fast_exp2(x);
        }
        if constexpr (kSoftcap) capped(nb, s[nb], t);
    }
#pragma unroll
    for (int kk = 0; kk < kNB / 2; ++kk) pack_p<kBF16>(s, kk, pa[kk]);
}
// Where bwd_ds_t finds the P it multiplies by: pa (registers), nowhere (dp holds dS^T already: bwd_capped_ds_t), or
// this thread's own places of the dS^T tile, which it overwrites (bwd_capped_smem_t).
enum class PFrom { regs, none, smem };

// dS^T = P^T * (dP^T - D[query]), packed once: dK's A fragments (pack_p's order) and dQ's operand, rows r and r + 8
// of the dS^T tile in shared memory (layout LdS).
template <bool kBF16, int kNB, class LdS, PFrom kFrom = PFrom::regs>
__device__ __forceinline__ void bwd_ds_t(float (&dp)[kNB][4], const u32 (&pa)[kNB / 2][4], u32 (&dsa)[kNB / 2][4],
                                         const float* sD, ptx::u16* sdS, int r, int t2, bool store = true) {
#pragma unroll
    for (int nb = 0; nb < kNB; ++nb) {
        const int c = nb * 8 + t2;
        if constexpr (kFrom != PFrom::none) {
            const float d[2] = {sD[c], sD[c + 1]};
            const u32 p16[2] = {kFrom == PFrom::smem ? *reinterpret_cast<const u32*>(sdS + LdS::offset(r, c))
                                                     : pa[nb / 2][(nb & 1) * 2],
                                kFrom == PFrom::smem ? *reinterpret_cast<const u32*>(sdS + LdS::offset(r + 8, c))
                                                     : pa[nb / 2][(nb & 1) * 2 + 1]};  // rows g, g + 8
#pragma unroll
            for (int e = 0; e < 4; ++e) dp[nb][e] = ptx::unpack<kBF16>(p16[e >> 1], e & 1) * (dp[nb][e] - d[e & 1]);
        }
        u32* ds16 = &dsa[nb / 2][(nb & 1) * 2];
        ds16[0] = ptx::pack2<kBF16>(dp[nb][0], dp[nb][1]);
        ds16[1] = ptx::pack2<kBF16>(dp[nb][2], dp[nb][3]);
        if (store) {
            *reinterpret_cast<u32*>(sdS + LdS::offset(r, c)) = ds16[0];
            *reinterpret_cast<u32*>(sdS + LdS::offset(r + 8, c)) = ds16[1];
        }
    }
}
// bwd_p_t's `capped`, three ways, by where dS^T's factor P^T * (1 - t^2) waits for dP^T (bwd_ds_t's PFrom):
// - none: dP^T is in already, and becomes dS^T = P^T * (1 - t^2) * (dP^T - D[query]) in place;
template <int kNB>
__device__ __forceinline__ auto bwd_capped_ds_t(float (&dp)[kNB][4], const float* sD, int t2) {
    return [&dp, sD, t2](int nb, const float (&pr)[4], const float (&t)[4]) {
        const int c = nb * 8 + t2;
#pragma unroll
        for (int e = 0; e < 4; ++e) dp[nb][e] = pr[e] * softcap_slope(t[e]) * (dp[nb][e] - sD[c + (e & 1)]);
    };
}
// - regs: packed as P^T is, into psa (16 registers a thread at 64 queries a step);
template <bool kBF16, int kPairs>
__device__ __forceinline__ auto bwd_capped_ps_t(u32 (&psa)[kPairs][4]) {
    return [&psa](int nb, const float (&pr)[4], const float (&t)[4]) {
        float ps[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) ps[e] = pr[e] * softcap_slope(t[e]);
        psa[nb / 2][(nb & 1) * 2] = ptx::pack2<kBF16>(ps[0], ps[1]);
        psa[nb / 2][(nb & 1) * 2 + 1] = ptx::pack2<kBF16>(ps[2], ps[3]);
    };
}
// - smem: packed alike into the places of the dS^T tile (rows r, r + 8) that this thread's dS^T takes later.
template <bool kBF16, class LdS>
__device__ __forceinline__ auto bwd_capped_smem_t(ptx::u16* sdS, int r, int t2) {
    return [sdS, r, t2](int nb, const float (&pr)[4], const float (&t)[4]) {
        const int c = nb * 8 + t2;
        float ps[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) ps[e] = pr[e] * softcap_slope(t[e]);
        *reinterpret_cast<u32*>(sdS + LdS::offset(r, c)) = ptx::pack2<kBF16>(ps[0], ps[1]);
        *reinterpret_cast<u32*>(sdS + LdS::offset(r + 8, c)) = ptx::pack2<kBF16>(ps[2], ps[3]);
    };
}
// dK (scaled) and dV of this thread's two keys from their accumulators (kAccQK, kAccV columns), to rows dk and dv of
// the caller's layout (seq strides apart): keys below seqlen_k, the real columns; kShift: the tiles' columns lie sk
// (sv) right of the row's.
template <class T, int kAccQK, int kAccV, bool kShift>
__device__ __forceinline__ void bwd_store_dkdv(const float (&acc_dk)[kAccQK / 8][4], const float (&acc_dv)[kAccV / 8][4],
                                               ptx::u16* dk, ptx::u16* dv, const BwdParams& p, int key0, int seqlen_k,
                                               int t2, int sk, int sv) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int key = key0 + 8 * h;
        if (key >= seqlen_k) continue;
        ptx::u16* dk_row = dk + key * p.dk_seq_stride;
        ptx::u16* dv_row = dv + key * p.dv_seq_stride;
#pragma unroll
        for (int nb = 0; nb < kAccQK / 8; ++nb)
            if (!kShift || nb * 8 + t2 >= sk)
                store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(dk_row, nb * 8 + t2 - sk, acc_dk[nb][2 * h] * p.scale,
                                                               acc_dk[nb][2 * h + 1] * p.scale);
#pragma unroll
        for (int nb = 0; nb < kAccV / 8; ++nb)
            if (!kShift || nb * 8 + t2 >= sv)
                store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(dv_row, nb * 8 + t2 - sv, acc_dv[nb][2 * h],
                                                             acc_dv[nb][2 * h + 1]);
    }
}
}  // namespace detail

template <class T>
__device__ __forceinline__ void flash_bwd_sm90(const BwdParams& p) {
    using S = BwdShapeSm90<T>;
    using ptx::u16;
    using ptx::u32;
    constexpr int kThreads = S::kThreads;
    using LK = sm90::TileLayout<T::kBlockN, S::kTileQK, true>;
    using LV = sm90::TileLayout<T::kBlockN, S::kTileV, true>;
    using LQ = sm90::TileLayout<T::kBlockM, S::kTileQK, true>;
    using LdO = sm90::TileLayout<T::kBlockM, S::kTileV, true>;
    using LdS = sm90::TileLayout<T::kBlockN, T::kBlockM, true>;  // dS^T: keys x queries

    // Shared memory: each warpgroup's dQ staging tile (fp32, first: bulk copies want it aligned), K and V (the CTA's
    // keys, loaded once), kStages buffers of Q, dO, dS^T of the current step, and the buffers' LSE and D rows.
    // Every 16-bit tile is a whole number of 1024-byte swizzle atoms.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float* sdQ = reinterpret_cast<float*>(smem_raw);
    u16* sK = reinterpret_cast<u16*>(smem_raw + 4 * S::kDqTiles * T::kBlockM * S::kDqStride);
    u16* sV = sK + S::kKElems;
    u16* sQ0 = sV + S::kVElems;
    u16* sdO0 = sQ0 + T::kStages * S::kQElems;
    u16* sdS = sdO0 + T::kStages * S::kdOElems;
    float* sLse0 = reinterpret_cast<float*>(sdS + S::kdSElems);
    float* sD0 = sLse0 + T::kStages * T::kBlockM;
    int* sSeq = reinterpret_cast<int*>(sD0 + T::kStages * T::kBlockM);  // varlen: q_begin, seqlen_q, seqlen_k, k_begin

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    // Deterministic mode: key blocks in descending order, as bwd/mma.cuh (its comment says why no CTA waits long).
    const int n_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int kv_head = blockIdx.y, batch = blockIdx.z;
    const detail::Seq<T::kVarlen> seq = detail::seq_info<T::kVarlen>(p, batch);
    const int n0 = n_block * T::kBlockN;
    // Varlen: the sequence's sizes in shared memory (detail::BwdSeqView), in the dynamic bytes, so that nothing
    // static moves their 1024-byte alignment.
    if constexpr (T::kVarlen) {
        if (n0 >= seq.seqlen_k) return;  // past this sequence's keys (the grid covers the longest)
    }
    const auto view = detail::bwd_seq_view<T::kVarlen>(seq, batch, sSeq, tid);
    const auto seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
    auto q_off = [&](long long batch_stride, long long seq_stride) { return view.q_off(batch_stride, seq_stride); };
    auto k_off = [&](long long batch_stride, long long seq_stride) { return view.k_off(batch_stride, seq_stride); };

    detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, S::kTileQK, kThreads>(sK, tid, LK::offset);
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, S::kTileV, kThreads>(sV, tid, LV::offset);
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
        detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, S::kTileQK, kThreads>(sQ0 + st * S::kQElems, tid,
                                                                              LQ::offset);
        detail::zero_pad_cols<T::kBlockM, T::kHeadDimV, S::kTileV, kThreads>(sdO0 + st * S::kdOElems, tid,
                                                                            LdO::offset);
    }
    // The staging rows' tail past dQ's columns is reduced too (into the workspace's padding): zero, once.
    constexpr int kDqTail = S::kDqStride - S::kAccQK;
    for (int i = tid; i < S::kDqTiles * T::kBlockM * kDqTail; i += kThreads)
        sdQ[i / kDqTail * S::kDqStride + S::kAccQK + i % kDqTail] = 0.f;

    const u16* gK = static_cast<const u16*>(p.k) + k_off(p.k_batch_stride, p.k_seq_stride) +
                    kv_head * p.k_head_stride + (long long)n0 * p.k_seq_stride;
    const u16* gV = static_cast<const u16*>(p.v) + k_off(p.v_batch_stride, p.v_seq_stride) +
                    kv_head * p.v_head_stride + (long long)n0 * p.v_seq_stride;
    // Where the rows of query head `head` lie in its Q and dO tiles (0 or 4 columns right; 0 unless shifted).
    // Rows of one head (of one sequence) share their placement where the seq stride is a multiple of 8 elements
    // (fast), else 0; packed sequences start on rows, so the head's offset alone decides it.
    const bool q_fast = S::kShiftRows && p.q_seq_stride % 8 == 0;
    const bool do_fast = S::kShiftRows && p.do_seq_stride % 8 == 0;
    auto q_row0 = [&](int head) {
        return static_cast<const u16*>(p.q) + q_off(p.q_batch_stride, p.q_seq_stride) + head * p.q_head_stride;
    };
    auto do_row0 = [&](int head) {
        return static_cast<const u16*>(p.dout) + q_off(p.do_batch_stride, p.do_seq_stride) + head * p.do_head_stride;
    };
    // Every tile of the CTA places its rows as the first query head's Q and dO lie (sk, sv: worked out where used,
    // not held through the walk); a head whose rows lie otherwise loads them as 8-byte vectors into that place
    // (GQA groups alternate at d132: half their heads).
    auto shift_q = [&](int head) {
        return detail::row_shift(T::kVarlen ? static_cast<const u16*>(p.q) + head * p.q_head_stride : q_row0(head),
                                 q_fast);
    };
    auto shift_do = [&](int head) {
        return detail::row_shift(
            T::kVarlen ? static_cast<const u16*>(p.dout) + head * p.do_head_stride : do_row0(head), do_fast);
    };
    const int head0 = kv_head * p.q_per_kv, sk = shift_q(head0), sv = shift_do(head0);
    if constexpr (S::kShiftRows) {
        // Tiles whose rows lie 4 columns right: their first 4 columns zero too; the 4 after the row take data, so
        // every zeroing store is done before any load is issued.
        auto zero_first4 = [&](u16* t, int rows, auto offset) {
            for (int i = tid; i < rows * 4; i += kThreads) t[offset(i >> 2, i & 3)] = u16(0);
        };
        if (sk) {
            zero_first4(sK, T::kBlockN, LK::offset);
            for (int st = 0; st < T::kStages; ++st) zero_first4(sQ0 + st * S::kQElems, T::kBlockM, LQ::offset);
        }
        if (sv) {
            zero_first4(sV, T::kBlockN, LV::offset);
            for (int st = 0; st < T::kStages; ++st) zero_first4(sdO0 + st * S::kdOElems, T::kBlockM, LdO::offset);
        }
        __syncthreads();
    }
    sm90::load_rows<T::kBlockN, T::kHeadDimQK, S::kTileQK, T::kVecQK, kThreads, S::kShiftRows>(
        sK, gK, p.k_seq_stride, seqlen_k - n0, tid, sk, false);
    sm90::load_rows<T::kBlockN, T::kHeadDimV, S::kTileV, T::kVecV, kThreads, S::kShiftRows>(
        sV, gV, p.v_seq_stride, seqlen_k - n0, tid, sv, false);

    // Steps: every query block this key block is seen from, for each query head of the GQA group; causal
    // (bottom-right) skips the blocks entirely above the key block, a window those past its left bound too
    // (bwd/mma.cuh).
    const int m_blocks = (seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
    const int m_begin = mask.first_q_block(n0), m_end = mask.q_block_end(n0, m_blocks);
    const int steps_per_head = m_end - m_begin;
    const int steps = steps_per_head * p.q_per_kv;
    auto next_step = [&](int& head, int& m_block) {
        if (++m_block == m_end) m_block = m_begin, ++head;
    };
    auto load_step = [&](int head, int m_block, int st) {
        const int m0 = m_block * T::kBlockM;
        const u16* gQ = q_row0(head) + (long long)m0 * p.q_seq_stride;
        const u16* gdO = do_row0(head) + (long long)m0 * p.do_seq_stride;
        sm90::load_rows<T::kBlockM, T::kHeadDimQK, S::kTileQK, T::kVecQK, kThreads, S::kShiftRows>(
            sQ0 + st * S::kQElems, gQ, p.q_seq_stride, seqlen_q - m0, tid, sk, q_fast && shift_q(head) == sk);
        sm90::load_rows<T::kBlockM, T::kHeadDimV, S::kTileV, T::kVecV, kThreads, S::kShiftRows>(
            sdO0 + st * S::kdOElems, gdO, p.do_seq_stride, seqlen_q - m0, tid, sv, do_fast && shift_do(head) == sv);
        // The workspace has m_pad rows per head (a multiple of kBlockM): these reads never leave it.
        const long long ws = ((long long)batch * p.heads_q + head) * p.m_pad + m0;
        if (tid < T::kBlockM) {
            ptx::cp_async<4>(ptx::smem_u32(sLse0 + st * T::kBlockM + tid), p.lse2 + ws + tid, true);
            ptx::cp_async<4>(ptx::smem_u32(sD0 + st * T::kBlockM + tid), p.delta + ws + tid, true);
        }
    };
    int head = kv_head * p.q_per_kv, m_block = m_begin;
    if (steps > 0) load_step(head, m_block, 0);
    ptx::cp_async_commit();  // K, V and the first step

    // Accumulator fragments (per warp of a warpgroup, as mma.sync's C): rows wq * 16 + g (+ 8), columns nb * 8 + t2
    // (+ 1). In S^T and dP^T a row is a key of this warpgroup, a column a query of the step.
    const int wq = warp & 3, g = lane >> 2, t2 = (lane & 3) * 2;
    const int key0 = n0 + wg * 64 + wq * 16 + g;  // this thread's first key; the other is key0 + 8
    float acc_dk[S::kAccQK / 8][4];
    float acc_dv[S::kAccV / 8][4];
    detail::zero_frags(acc_dk);
    detail::zero_frags(acc_dv);
    const u32 aK = ptx::smem_u32(sK), aV = ptx::smem_u32(sV), adS = ptx::smem_u32(sdS);

    for (int i = 0; i < steps; ++i, next_step(head, m_block)) {
        const int st = T::kStages > 1 ? i % T::kStages : 0;
        const int m0 = m_block * T::kBlockM;
        const u32 aQ = ptx::smem_u32(sQ0 + st * S::kQElems), adO = ptx::smem_u32(sdO0 + st * S::kdOElems);
        const float* sLse = sLse0 + st * T::kBlockM;
        const float* sD = sD0 + st * T::kBlockM;
        if (tid == 0) ptx::bulk_wait_read<0>();  // the previous step's reductions have read sdQ
        ptx::cp_async_wait<0>();
        wgmma::fence_proxy_async();  // this thread's cp.async writes, visible to wgmma
        __syncthreads();  // this step's tiles are in; every warp is past the previous step (dS^T, sdQ are free)

        // S^T = K Q^T for this warpgroup's 64 keys. (dP^T is issued after P^T is packed: both in flight beside dK
        // and dV spilled at d128.)
        float s[S::kNB][4];
        wgmma::fence();
        detail::bwd_scores_t<LK, LQ, T::kPadQK / 16, T::kBF16>(s, aK, aQ, wg);
        wgmma::commit();
        wgmma::wait<0>();
        sm90::fence_regs<S::kNB * 4>(&s[0][0]);

        // P^T = exp2(S^T * scale_log2 - LSE2[query]), 0 where the causal mask hides the key; packed to 16 bits as
        // dV's A fragments (and the value dS is computed from, as bwd/mma.cuh; softcapped, P^T times the cap's slope
        // waits for dP^T in dS^T's places: in registers, or with S^T and dP^T together, it spilled at d100).
        const bool masked = mask.edge(n0, m0);
        const int shift = mask.shift();
        const int ds_row = wg * 64 + wq * 16 + g;
        u32 pa[T::kBlockM / 16][4];
        detail::bwd_p_t<T::kBF16, T::kSoftcap, T::kAlibi>(s, pa, sLse, p, mask, masked, key0, m0, shift, t2,
                                                          detail::alibi_factor<T::kAlibi>(p, batch, head),
                                                          detail::bwd_capped_smem_t<T::kBF16, LdS>(sdS, ds_row, t2));

        // dP^T = V dO^T; dS^T = P^T * (dP^T - D[query]), packed as dK's A fragments and stored to shared memory
        // for dQ.
        float dp[S::kNB][4];
        wgmma::fence();
        detail::bwd_scores_t<LV, LdO, T::kPadV / 16, T::kBF16>(dp, aV, adO, wg);
        wgmma::commit();
        wgmma::wait<0>();
        sm90::fence_regs<S::kNB * 4>(&dp[0][0]);
        sm90::fence_regs<T::kBlockM / 16 * 4>(&pa[0][0]);
        u32 dsa[T::kBlockM / 16][4];
        constexpr auto kPFrom = T::kSoftcap ? detail::PFrom::smem : detail::PFrom::regs;
        detail::bwd_ds_t<T::kBF16, S::kNB, LdS, kPFrom>(dp, pa, dsa, sD, sdS, ds_row, t2);

        // dV += P^T dO and dK += dS^T Q, one group; it runs while dS^T is published.
        wgmma::fence();
        sm90::gemm_rs<S::kAccV, T::kBlockM / 16, T::kBF16, true, S::kWholeV>(
            acc_dv, pa, [&](int kk, int c0) { return LdO::n_major(adO, kk, c0); });
        sm90::gemm_rs<S::kAccQK, T::kBlockM / 16, T::kBF16, true, S::kWholeQK>(
            acc_dk, dsa, [&](int kk, int c0) { return LQ::n_major(aQ, kk, c0); });
        wgmma::commit();
        wgmma::fence_proxy_async();  // dS^T's stores, visible to wgmma
        __syncthreads();             // ... from both warpgroups
        // P^T and dS^T leave the registers once their GEMMs are done: dQ's accumulators take their place.
        wgmma::wait<0>();
        sm90::fence_regs<S::kAccV / 2>(&acc_dv[0][0]);
        sm90::fence_regs<S::kAccQK / 2>(&acc_dk[0][0]);
        sm90::fence_regs<T::kBlockM / 4>(&pa[0][0]);
        sm90::fence_regs<T::kBlockM / 4>(&dsa[0][0]);
        // The next step's tiles load into the other buffer (its last readers, the previous step's GEMMs, are done),
        // once P^T's and dS^T's registers are free.
        // (The next step's head and query block are worked out where they are used, not held through the step.)
        auto load_next = [&](int st_next) {
            int next_head = head, next_m_block = m_block;
            next_step(next_head, next_m_block);
            if (i + 1 < steps) load_step(next_head, next_m_block, st_next);
            ptx::cp_async_commit();
        };
        if constexpr (T::kStages > 1) load_next((i + 1) % T::kStages);

        // dQ (dS from dS^T read M-major, K read N-major) in 64-column pieces to a staging tile whose rows are
        // queries: this warpgroup's panel over every key, or every column over this warpgroup's keys.
        float* stage = sdQ + (S::kDqByPanel ? 0 : wg * T::kBlockM * S::kDqStride);
        constexpr int kKeySteps = S::kDqByPanel ? T::kBlockN / 16 : 4;
        const int key_step0 = S::kDqByPanel ? 0 : wg * 4;
        auto dq_piece = [&](auto width, int c_first, int c_end) {  // stores the columns below c_end
            constexpr int kW = decltype(width)::value;
            float dq[kW / 8][4];
            wgmma::fence();
            sm90::gemm_ss<kW, kKeySteps, T::kBF16, true, true, false>(
                dq, [&](int kk) { return LdS::n_major(adS, key_step0 + kk, 0); },
                [&](int kk, int c0) { return LK::n_major(aK, key_step0 + kk, c_first + c0); });
            wgmma::commit();
            wgmma::wait<0>();
            sm90::fence_regs<kW / 2>(&dq[0][0]);
#pragma unroll
            for (int nb = 0; nb < kW / 8; ++nb) {
                if (c_first + nb * 8 >= c_end) break;
                const int col = c_first + nb * 8 + t2 - sk;  // the row's element (K's columns lie sk right)
                if (S::kShiftRows && col < 0) continue;
                float* row = stage + (wq * 16 + g) * S::kDqStride + col;
                *reinterpret_cast<float2*>(row) = make_float2(dq[nb][0], dq[nb][1]);
                *reinterpret_cast<float2*>(row + 8 * S::kDqStride) = make_float2(dq[nb][2], dq[nb][3]);
            }
        };
        if constexpr (S::kDqByPanel && S::kWholeQK) {
            dq_piece(detail::IntC<geometry::bwd_sm90_dq_width(S::kAccQK)>(), 64 * wg, wg ? S::kAccQK : 64);
        } else if constexpr (S::kDqByPanel) {
            if (wg == 0)
                dq_piece(detail::IntC<64>(), 0, 64);
            else
                dq_piece(detail::IntC<S::kAccQK - 64>(), 64, S::kAccQK);
        } else {
            constexpr int k64 = S::kAccQK / 64, kTail = S::kAccQK % 64;
#pragma unroll
            for (int j = 0; j < k64; ++j) dq_piece(detail::IntC<64>(), 64 * j, S::kAccQK);
            if constexpr (kTail > 0) dq_piece(detail::IntC<kTail>(), 64 * k64, S::kAccQK);
        }

        // One bulk reduction per staging tile into the accumulator rows of this query block; deterministic: after the
        // key blocks before this one in turn order, one warpgroup's after the other's.
        ptx::fence_proxy_async_smem();  // the bulk copy reads through the async proxy
        __syncthreads();  // both warpgroups staged, and done with this step's Q and dO
        if constexpr (T::kStages == 1) load_next(0);  // one buffer: the next step's tiles load during the reduction
        if (tid == 0) {
            const long long ws_head = ((long long)batch * p.heads_q + head) * p.m_pad;
            int* turn = p.dq_sem + (ws_head + m0) / T::kBlockM;
            float* acc_tile = p.dq_accum + (ws_head + m0) * S::kDqStride;
            if (p.deterministic) {
                const int n_keys_last = (seqlen_k - 1) / T::kBlockN;
                const int my_turn = mask.last_kv_block(m0, n_keys_last) - n_block;
                while (*reinterpret_cast<volatile int*>(turn) != my_turn) {
                }
            }
#pragma unroll
            for (int w = 0; w < S::kDqTiles; ++w) {
                ptx::bulk_reduce_add_f32(acc_tile, ptx::smem_u32(sdQ + w * T::kBlockM * S::kDqStride),
                                         4 * T::kBlockM * S::kDqStride);
                ptx::bulk_commit();
                if (p.deterministic) ptx::bulk_wait<0>();  // additions in a fixed order
            }
            if (p.deterministic) {
                __threadfence();
                atomicAdd(turn, 1);
            }
        }
    }
    if (tid == 0) ptx::bulk_wait_read<0>();  // shared memory must outlive the last reduction's read

    // dK (scaled) and dV for this thread's two keys, to the caller's layout: rows below seqlen_k, real columns.
    u16* dk = static_cast<u16*>(p.dk) + k_off(p.dk_batch_stride, p.dk_seq_stride) + kv_head * p.dk_head_stride;
    u16* dv = static_cast<u16*>(p.dv) + k_off(p.dv_batch_stride, p.dv_seq_stride) + kv_head * p.dv_head_stride;
    detail::bwd_store_dkdv<T, S::kAccQK, S::kAccV, S::kShiftRows>(acc_dk, acc_dv, dk, dv, p, key0, seqlen_k, t2, sk,
                                                                  sv);
}

}  // namespace rtattn
