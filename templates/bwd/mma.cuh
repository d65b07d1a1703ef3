// FlashAttention-2's backward pass for any head_dim, on mma.m16n8k16: three kernels of one module.
//
//   preprocess  per query row: D = rowsum(dO * O) (minus the LSE's own gradient, if any), LSE in log2 units;
//               zeroes the dQ accumulator (bwd/rows.cuh, every backward family's).
//   main        one CTA per (key block, kv head, batch) walks every query block of every query head of its GQA
//               group: it recomputes S = Q K^T and P = exp(S * scale - LSE), then
//                 dV += P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dK += dS^T Q,   dQ += dS K,
//               (softcapped: S is capped first and dS takes the cap's slope, dS = P * (1 - tanh^2) * (dP - D)),
//               keeping dK and dV in registers (summed over the group: the caller never reduces) and adding dQ into
//               an fp32 accumulator in global memory (in key-block order when deterministic).
//   postprocess dQ = accumulator * scale, to the dtype and the caller's strides (bwd/rows.cuh).
//
// Head dims are padded to 16 (both are the k of an MMA here: QK^T reduces over d_qk, dO V^T over d_v); padded
// columns are zero in shared memory and never stored. Query rows past seqlen_q (and rows that see no key) carry
// LSE = +inf, so their P is 0 and they add nothing; key rows past seqlen_k are zero and masked. A masked score is
// -inf, so its P is exp2(-inf) = 0 with no select per element.
#pragma once
#include "common/epilogue.cuh"
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "common/seq.cuh"
#include "common/ptx.cuh"
#include "common/warp_gemm.cuh"
#include "bwd/rows.cuh"

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV   the real head dims
//   kPadQK, kPadV           both padded to 16
//   kBF16, kCausal, kVarlen (packed sequences: common/seq.cuh)
//   kBlockM, kBlockN        query rows per step, keys per CTA
//   kWarps
//   kSdpWarpsM              S and dP: warps along the query rows (the rest split the keys)
//   kDkvWarpsN              dK and dV: warps along the keys (the rest split the columns, 16 at a time, interleaved)
//   kDqWarpsM               dQ: warps along the query rows (the rest split the columns as above)
//   kStages                 Q/dO buffers: 2 loads the next step's during this one's last three GEMMs, 1 (shared
//                           memory or registers short) loads it during dQ only
//   kBulkDQ                 dQ leaves each step as one bulk reduction from shared memory (sm_90) instead of one
//                           atomic add per element
//   kVecQK, kVecV           elements per global vector access (each divides its head dim)
template <class T>
struct BwdShape {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideQK = geometry::padded_row(T::kPadQK);
    static constexpr int kStrideV = geometry::padded_row(T::kPadV);
    static constexpr int kStrideN = geometry::padded_row(T::kBlockN);  // P and dS tiles
    static constexpr int kDqStride = geometry::bwd_dq_stride(T::kPadQK);  // fp32 dQ rows, here and in the workspace
    static constexpr int kPairsQK = T::kPadQK / 16;  // 16-column pairs of 8-wide MMA blocks
    static constexpr int kPairsV = T::kPadV / 16;
    // S and dP: each warp a (kSdpM x 16*kSdpNP) tile.
    static constexpr int kSdpM = T::kBlockM / T::kSdpWarpsM;
    static constexpr int kSdpNP = T::kBlockN / (T::kWarps / T::kSdpWarpsM) / 16;
    // dK and dV: each warp kDkvN keys x every kDkvWarpsD-th column pair.
    static constexpr int kDkvN = T::kBlockN / T::kDkvWarpsN;
    static constexpr int kDkvWarpsD = T::kWarps / T::kDkvWarpsN;
    static constexpr int kMyPairsQK = (kPairsQK + kDkvWarpsD - 1) / kDkvWarpsD;
    static constexpr int kMyPairsV = (kPairsV + kDkvWarpsD - 1) / kDkvWarpsD;
    // dQ: each warp kDqM query rows x every kDqWarpsD-th column pair.
    static constexpr int kDqM = T::kBlockM / T::kDqWarpsM;
    static constexpr int kDqWarpsD = T::kWarps / T::kDqWarpsM;
    static constexpr int kDqPairs = (kPairsQK + kDqWarpsD - 1) / kDqWarpsD;
    // ... computed in column chunks of at most 32 accumulator registers, so dQ never competes with dK and dV for
    // registers (d256: 64 rows x 256 columns would be 64 per thread).
    static constexpr int kDqPairRegs = kDqM / 16 * 8;
    static constexpr int kDqChunkPairs = kDqPairs * kDqPairRegs <= 32 ? kDqPairs
                                         : kDqPairRegs >= 32         ? 1
                                                                     : 32 / kDqPairRegs;
    static constexpr int kDqChunks = (kDqPairs + kDqChunkPairs - 1) / kDqChunkPairs;
    static constexpr int kSmemBytes = geometry::bwd_mma_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN,
                                                                   T::kStages, T::kBulkDQ);

    static_assert(T::kPadQK % 16 == 0 && T::kPadQK >= T::kHeadDimQK && T::kPadQK - T::kHeadDimQK < 16, "QK pad");
    static_assert(T::kPadV % 16 == 0 && T::kPadV >= T::kHeadDimV && T::kPadV - T::kHeadDimV < 16, "V pad");
    static_assert(T::kWarps % T::kSdpWarpsM == 0 && kSdpM % 16 == 0 && kSdpNP >= 1 &&
                      kSdpNP * 16 * (T::kWarps / T::kSdpWarpsM) == T::kBlockN,
                  "S/dP warps tile the block in 16 x 16 pieces");
    static_assert(T::kWarps % T::kDkvWarpsN == 0 && kDkvN % 16 == 0 && kDkvN * T::kDkvWarpsN == T::kBlockN,
                  "dK/dV warps own whole 16-key groups");
    static_assert(T::kWarps % T::kDqWarpsM == 0 && kDqM % 16 == 0 && kDqM * T::kDqWarpsM == T::kBlockM,
                  "dQ warps own whole 16-row groups");
    static_assert(T::kStages == 1 || T::kStages == 2, "one or two Q/dO buffers");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
};

template <class T>
__device__ __forceinline__ void flash_bwd_main(const BwdParams& p) {
    using S = BwdShape<T>;
    using ptx::u16;
    using ptx::u32;
    constexpr int kThreads = S::kThreads;

    // Shared memory: the dQ staging tile (fp32, first: bulk copies want it aligned); K, V (the CTA's keys, loaded
    // once); kStages buffers of Q, dO and their rows' LSE and D (the next step's load while this one computes); P
    // and dS of the current step.
    extern __shared__ __align__(128) unsigned char smem_raw[];
    float* sdQ = reinterpret_cast<float*>(smem_raw);
    u16* sK = reinterpret_cast<u16*>(smem_raw + (T::kBulkDQ ? 4 * T::kBlockM * S::kDqStride : 0));
    u16* sV = sK + T::kBlockN * S::kStrideQK;
    u16* sQ0 = sV + T::kBlockN * S::kStrideV;
    u16* sdO0 = sQ0 + T::kStages * T::kBlockM * S::kStrideQK;
    u16* sP = sdO0 + T::kStages * T::kBlockM * S::kStrideV;
    u16* sdS = sP + T::kBlockM * S::kStrideN;
    float* sLse0 = reinterpret_cast<float*>(sdS + T::kBlockM * S::kStrideN);
    float* sD0 = sLse0 + T::kStages * T::kBlockM;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Deterministic mode adds each query block's dQ in descending key-block order and dispatches the key blocks in
    // that order too: a CTA waits only on CTAs dispatched before it (so the wait ends), and under the causal mask
    // the key block that starts on a query block is the first to add to it, so no CTA waits at all there.
    const int n_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int kv_head = blockIdx.y, batch = blockIdx.z;
    const detail::Seq<T::kVarlen> seq = detail::seq_info<T::kVarlen>(p, batch);
    const int n0 = n_block * T::kBlockN;
    __shared__ int sSeq[4];  // varlen: the sequence's sizes, read where used (detail::BwdSeqView)
    if constexpr (T::kVarlen) {
        if (n0 >= seq.seqlen_k) return;  // past this sequence's keys (the grid covers the longest)
    }
    const auto view = detail::bwd_seq_view<T::kVarlen>(seq, batch, sSeq, tid);
    const auto seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
    auto q_off = [&](long long batch_stride, long long seq_stride) { return view.q_off(batch_stride, seq_stride); };
    auto k_off = [&](long long batch_stride, long long seq_stride) { return view.k_off(batch_stride, seq_stride); };
    const int g = lane >> 2, t2 = (lane & 3) * 2;  // C fragment: rows g and g + 8, columns t2 and t2 + 1

    auto at_qk = [](int r, int c) { return r * S::kStrideQK + c; };
    auto at_v = [](int r, int c) { return r * S::kStrideV + c; };
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK, tid, at_qk);
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sV, tid, at_v);
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
        detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ0 + st * T::kBlockM * S::kStrideQK,
                                                                             tid, at_qk);
        detail::zero_pad_cols<T::kBlockM, T::kHeadDimV, T::kPadV, kThreads>(sdO0 + st * T::kBlockM * S::kStrideV,
                                                                           tid, at_v);
    }
    if constexpr (T::kBulkDQ) {  // the staging rows' tail past kPadQK is reduced too (into workspace padding)
        for (int i = tid; i < T::kBlockM * (S::kDqStride - T::kPadQK); i += kThreads) {
            const int r = i / (S::kDqStride - T::kPadQK);
            sdQ[r * S::kDqStride + T::kPadQK + i % (S::kDqStride - T::kPadQK)] = 0.f;
        }
    }

    const u16* gK = static_cast<const u16*>(p.k) + k_off(p.k_batch_stride, p.k_seq_stride) +
                    kv_head * p.k_head_stride + (long long)n0 * p.k_seq_stride;
    const u16* gV = static_cast<const u16*>(p.v) + k_off(p.v_batch_stride, p.v_seq_stride) +
                    kv_head * p.v_head_stride + (long long)n0 * p.v_seq_stride;
    detail::load_tile<T::kBlockN, T::kHeadDimQK, T::kVecQK, kThreads>(sK, gK, p.k_seq_stride, seqlen_k - n0, tid,
                                                                      at_qk);
    detail::load_tile<T::kBlockN, T::kHeadDimV, T::kVecV, kThreads>(sV, gV, p.v_seq_stride, seqlen_k - n0, tid, at_v);

    // Steps: every query block this key block is seen from, for each query head of the GQA group. Causal
    // (bottom-right) skips the blocks entirely above the key block, a window those past its left bound too.
    const int m_blocks = (seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
    const int m_begin = mask.first_q_block(n0), m_end = mask.q_block_end(n0, m_blocks);
    const int steps_per_head = m_end - m_begin;
    const int steps = steps_per_head * p.q_per_kv;

    // Step i is query block m_begin + i % steps_per_head of the group's query head i / steps_per_head: both are
    // counted along (a division per step costs ~20 integer instructions).
    auto next_step = [&](int& head, int& m_block) {
        if (++m_block == m_end) m_block = m_begin, ++head;
    };
    // Loads query block m_block of `head` (Q, dO, LSE and D) into stage buffer `st` (cp.async; the caller commits).
    auto load_step = [&](int head, int m_block, int st) {
        const int m0 = m_block * T::kBlockM;
        const u16* gQ = static_cast<const u16*>(p.q) + q_off(p.q_batch_stride, p.q_seq_stride) +
                        head * p.q_head_stride + (long long)m0 * p.q_seq_stride;
        const u16* gdO = static_cast<const u16*>(p.dout) + q_off(p.do_batch_stride, p.do_seq_stride) +
                         head * p.do_head_stride + (long long)m0 * p.do_seq_stride;
        detail::load_tile<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(sQ0 + st * T::kBlockM * S::kStrideQK, gQ,
                                                                          p.q_seq_stride, seqlen_q - m0, tid, at_qk);
        detail::load_tile<T::kBlockM, T::kHeadDimV, T::kVecV, kThreads>(sdO0 + st * T::kBlockM * S::kStrideV, gdO,
                                                                        p.do_seq_stride, seqlen_q - m0, tid, at_v);
        // The workspace has m_pad rows per head (a multiple of kBlockM): these reads never leave it.
        const long long ws = ((long long)batch * p.heads_q + head) * p.m_pad + m0;
        static_assert(T::kBlockM <= kThreads, "one thread per row loads its LSE and D");
        if (tid < T::kBlockM) {
            ptx::cp_async<4>(ptx::smem_u32(sLse0 + st * T::kBlockM + tid), p.lse2 + ws + tid, true);
            ptx::cp_async<4>(ptx::smem_u32(sD0 + st * T::kBlockM + tid), p.delta + ws + tid, true);
        }
    };
    int head = kv_head * p.q_per_kv, m_block = m_begin;  // step i's
    if (steps > 0) load_step(head, m_block, 0);
    ptx::cp_async_commit();  // K, V and the first step

    // Warp roles: (sm, sn) for S and dP, (kn, kd) for dK and dV, (qm, qd) for dQ.
    const int sm = warp / (T::kWarps / T::kSdpWarpsM), sn = warp % (T::kWarps / T::kSdpWarpsM);
    const int kn = warp / S::kDkvWarpsD, kd = warp % S::kDkvWarpsD;
    const int qm = warp / S::kDqWarpsD, qd = warp % S::kDqWarpsD;
    constexpr int kSdpMI = S::kSdpM / 16, kDkvMI = S::kDkvN / 16, kDqMI = S::kDqM / 16;

    float acc_dk[kDkvMI][S::kMyPairsQK * 2][4];
    float acc_dv[kDkvMI][S::kMyPairsV * 2][4];
    warp::zero(acc_dk);
    warp::zero(acc_dv);
    const u32 aK = ptx::smem_u32(sK), aV = ptx::smem_u32(sV), aP = ptx::smem_u32(sP), adS = ptx::smem_u32(sdS);

    for (int i = 0; i < steps; ++i, next_step(head, m_block)) {
        const int st = T::kStages > 1 ? i % T::kStages : 0;
        const int m0 = m_block * T::kBlockM;
        // The next step's load (issued below): its head and query block.
        int next_head = head, next_m_block = m_block;
        next_step(next_head, next_m_block);
        const long long ws_head = ((long long)batch * p.heads_q + head) * p.m_pad;
        const float alibi = detail::alibi_factor<T::kAlibi>(p, batch, head);  // kAlibi: this head's
        const u32 aQ = ptx::smem_u32(sQ0 + st * T::kBlockM * S::kStrideQK);
        const u32 adO = ptx::smem_u32(sdO0 + st * T::kBlockM * S::kStrideV);
        const float* sLse = sLse0 + st * T::kBlockM;
        const float* sD = sD0 + st * T::kBlockM;
        if constexpr (T::kBulkDQ) {
            if (tid == 0) ptx::bulk_wait_read<0>();  // the previous step's reduction has read sdQ
        }
        ptx::cp_async_wait<0>();
        __syncthreads();  // this step's tiles are in; every warp is past the previous step (its buffer is free)

        // S = Q K^T (capped: kSoftcap), then P = exp(S * scale - LSE) (0 where masked), to shared memory for dV and
        // kept packed in 16 bits (the value dV sees) for dS: S's fp32 registers are free before dP's are taken.
        const bool masked = n0 + T::kBlockN > seqlen_k || mask.edge(n0, m0);
        // A C fragment's rows r and r + 8 (columns c, c + 1, packed) into a [query][key] 16-bit tile.
        auto store_rows = [](u16* tile, int r, int c, u32 top, u32 bottom) {
            *reinterpret_cast<u32*>(tile + r * S::kStrideN + c) = top;
            *reinterpret_cast<u32*>(tile + (r + 8) * S::kStrideN + c) = bottom;
        };
        u32 p16[kSdpMI][S::kSdpNP * 2][2];
        {
            float s[kSdpMI][S::kSdpNP * 2][4];
            warp::gemm<T::kBF16, kSdpMI, S::kSdpNP, T::kBlockN / 16, T::kPadQK / 16, false, false, true>(
                s, aQ, S::kStrideQK, sm * S::kSdpM, aK, S::kStrideQK, sn * S::kSdpNP, 1, lane);
            detail::apply_softcap<T::kSoftcap>(s, p.softcap_scale);
            if (masked) detail::apply_mask(mask, s, n0 + sn * S::kSdpNP * 16, m0 + sm * S::kSdpM, lane);
#pragma unroll
            for (int mi = 0; mi < kSdpMI; ++mi) {
                const int r_local = sm * S::kSdpM + 16 * mi + g;
                const float lse2[2] = {sLse[r_local], sLse[r_local + 8]};
                // kAlibi: the row's distance from its diagonal to this lane's first key, formed once.
                const float alibi_row = T::kAlibi ? float(n0 + sn * S::kSdpNP * 16 + t2 - (m0 + r_local) - mask.shift())
                                                  : 0.f;
#pragma unroll
                for (int nb = 0; nb < S::kSdpNP * 2; ++nb) {
                    const int c_local = sn * S::kSdpNP * 16 + nb * 8 + t2;
                    float pr[4];
                    if constexpr (T::kAlibi) {  // the bias in the exponent: s stays the capped score (the cap's slope)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float dist = fabsf(alibi_row + float(nb * 8 + (e & 1) - 8 * (e >> 1)));
                            pr[e] = ptx::fast_exp2((s[mi][nb][e] - alibi * dist) * p.scale_log2 - lse2[e >> 1]);
                        }
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            pr[e] = ptx::fast_exp2(s[mi][nb][e] * p.scale_log2 - lse2[e >> 1]);
                    }
                    const u32 top = ptx::pack2<T::kBF16>(pr[0], pr[1]), bottom = ptx::pack2<T::kBF16>(pr[2], pr[3]);
                    store_rows(sP, r_local, c_local, top, bottom);
                    if constexpr (T::kSoftcap) {
                        // dS takes P times the cap's slope (dV P itself), which waits in dS's places of its tile:
                        // in registers it spilled (d100).
#pragma unroll
                        for (int e = 0; e < 4; ++e) pr[e] *= detail::softcap_slope(s[mi][nb][e]);
                        store_rows(sdS, r_local, c_local, ptx::pack2<T::kBF16>(pr[0], pr[1]),
                                   ptx::pack2<T::kBF16>(pr[2], pr[3]));
                    } else {
                        p16[mi][nb][0] = top, p16[mi][nb][1] = bottom;
                    }
                }
            }
        }

        // dP = dO V^T, dS = P * (dP - D), to shared memory.
        {
            float dp[kSdpMI][S::kSdpNP * 2][4];
            warp::gemm<T::kBF16, kSdpMI, S::kSdpNP, T::kBlockN / 16, T::kPadV / 16, false, false, true>(
                dp, adO, S::kStrideV, sm * S::kSdpM, aV, S::kStrideV, sn * S::kSdpNP, 1, lane);
#pragma unroll
            for (int mi = 0; mi < kSdpMI; ++mi) {
                const int r_local = sm * S::kSdpM + 16 * mi + g;
                const float dd[2] = {sD[r_local], sD[r_local + 8]};
#pragma unroll
                for (int nb = 0; nb < S::kSdpNP * 2; ++nb) {
                    const int c_local = sn * S::kSdpNP * 16 + nb * 8 + t2;
                    float ds[4];
                    if constexpr (T::kSoftcap) {  // P times the cap's slope, from dS's places
                        const u32 pp[2] = {*reinterpret_cast<const u32*>(sdS + r_local * S::kStrideN + c_local),
                                           *reinterpret_cast<const u32*>(sdS + (r_local + 8) * S::kStrideN + c_local)};
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            ds[e] = ptx::unpack<T::kBF16>(pp[e >> 1], e & 1) * (dp[mi][nb][e] - dd[e >> 1]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            ds[e] = ptx::unpack<T::kBF16>(p16[mi][nb][e >> 1], e & 1) * (dp[mi][nb][e] - dd[e >> 1]);
                    }
                    store_rows(sdS, r_local, c_local, ptx::pack2<T::kBF16>(ds[0], ds[1]),
                               ptx::pack2<T::kBF16>(ds[2], ds[3]));
                }
            }
        }
        __syncthreads();
        // The next step's tiles load during this step's last three GEMMs: issued here, after S and dP, so their
        // addresses do not share registers with S and dP.
        if constexpr (T::kStages > 1) {
            if (i + 1 < steps) load_step(next_head, next_m_block, (i + 1) % T::kStages);
            ptx::cp_async_commit();
        }

        // dV += P^T dO and dK += dS^T Q (P and dS read transposed: stored [query][key]), reducing over the block's
        // query rows.
        warp::gemm<T::kBF16, kDkvMI, S::kMyPairsV, S::kPairsV, T::kBlockM / 16, true, true>(
            acc_dv, aP, S::kStrideN, kn * S::kDkvN, adO, S::kStrideV, kd, S::kDkvWarpsD, lane);
        warp::gemm<T::kBF16, kDkvMI, S::kMyPairsQK, S::kPairsQK, T::kBlockM / 16, true, true>(
            acc_dk, adS, S::kStrideN, kn * S::kDkvN, aQ, S::kStrideQK, kd, S::kDkvWarpsD, lane);

        // One buffer: Q, dO, LSE and D are free once every warp is past dK, so the next step's load overlaps dQ.
        if constexpr (T::kStages == 1) {
            __syncthreads();
            if (i + 1 < steps) load_step(next_head, next_m_block, 0);
            ptx::cp_async_commit();
        }

        // dQ = dS K for this warp's rows and column pairs, added into the fp32 accumulator: staged in shared memory
        // for one bulk reduction, or one atomic add per element. Deterministic turn: the key blocks that reach this
        // query block are a run ending at n_last (the masks are monotone; the same rule as m_begin above), and they add
        // from n_last down.
        int* turn = p.dq_sem + (ws_head + m0) / T::kBlockM;
        auto my_turn = [&] {
            const int n_keys_last = (seqlen_k - 1) / T::kBlockN;
            return mask.last_kv_block(m0, n_keys_last) - n_block;
        };
        float* acc_tile = p.dq_accum + (ws_head + m0) * S::kDqStride;
        if (!T::kBulkDQ && p.deterministic) {
            if (tid == 0)
                while (*reinterpret_cast<volatile int*>(turn) != my_turn()) {
                }
            __syncthreads();
            __threadfence();
        }
#pragma unroll
        for (int chunk = 0; chunk < S::kDqChunks; ++chunk) {
            const int first_pair = qd + chunk * S::kDqChunkPairs * S::kDqWarpsD;
            float dq[kDqMI][S::kDqChunkPairs * 2][4];
            warp::gemm<T::kBF16, kDqMI, S::kDqChunkPairs, S::kPairsQK, T::kBlockN / 16, false, true, true>(
                dq, adS, S::kStrideN, qm * S::kDqM, aK, S::kStrideQK, first_pair, S::kDqWarpsD, lane);
#pragma unroll
            for (int mi = 0; mi < kDqMI; ++mi)
#pragma unroll
                for (int j = 0; j < S::kDqChunkPairs; ++j) {
                    const int pair = first_pair + j * S::kDqWarpsD;
                    if (pair < S::kPairsQK)
#pragma unroll
                        for (int half = 0; half < 2; ++half) {
                            const int r = qm * S::kDqM + 16 * mi + g, c = pair * 16 + half * 8 + t2;
                            const float* v = dq[mi][2 * j + half];
                            if constexpr (T::kBulkDQ) {
                                *reinterpret_cast<float2*>(sdQ + r * S::kDqStride + c) = make_float2(v[0], v[1]);
                                *reinterpret_cast<float2*>(sdQ + (r + 8) * S::kDqStride + c) =
                                    make_float2(v[2], v[3]);
                            } else {
                                float* row = acc_tile + r * S::kDqStride;
                                if (c < T::kHeadDimQK) {
                                    atomicAdd(row + c, v[0]);
                                    atomicAdd(row + 8 * S::kDqStride + c, v[2]);
                                }
                                if (c + 1 < T::kHeadDimQK) {
                                    atomicAdd(row + c + 1, v[1]);
                                    atomicAdd(row + 8 * S::kDqStride + c + 1, v[3]);
                                }
                            }
                        }
                }
        }
        if constexpr (T::kBulkDQ) {
            ptx::fence_proxy_async_smem();  // the bulk copy reads through the async proxy
            __syncthreads();
            if (tid == 0) {
                if (p.deterministic)
                    while (*reinterpret_cast<volatile int*>(turn) != my_turn()) {
                    }
                ptx::bulk_reduce_add_f32(acc_tile, ptx::smem_u32(sdQ), 4 * T::kBlockM * S::kDqStride);
                ptx::bulk_commit();
                if (p.deterministic) {
                    ptx::bulk_wait<0>();  // the additions are done before the turn is passed on
                    __threadfence();
                    atomicAdd(turn, 1);
                }
            }
        } else if (p.deterministic) {
            __threadfence();  // this CTA's additions are visible before its turn is passed on
            __syncthreads();
            if (tid == 0) atomicAdd(turn, 1);
        }
    }
    if constexpr (T::kBulkDQ) {
        if (tid == 0) ptx::bulk_wait_read<0>();  // shared memory must outlive the last reduction's read
    }

    // dK (scaled) and dV for this warp's keys, to the caller's layout: rows below seqlen_k, real columns.
    u16* dk = static_cast<u16*>(p.dk) + k_off(p.dk_batch_stride, p.dk_seq_stride) + kv_head * p.dk_head_stride;
    u16* dv = static_cast<u16*>(p.dv) + k_off(p.dv_batch_stride, p.dv_seq_stride) + kv_head * p.dv_head_stride;
#pragma unroll
    for (int mi = 0; mi < kDkvMI; ++mi)
#pragma unroll
        for (int half_row = 0; half_row < 2; ++half_row) {
            const int key = n0 + kn * S::kDkvN + 16 * mi + g + 8 * half_row;
            if (key >= seqlen_k) continue;
            u16* dk_row = dk + key * p.dk_seq_stride;
            u16* dv_row = dv + key * p.dv_seq_stride;
#pragma unroll
            for (int j = 0; j < S::kMyPairsQK; ++j) {
                const int pair = kd + j * S::kDkvWarpsD;
                if (pair < S::kPairsQK)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const float* v = acc_dk[mi][2 * j + half] + 2 * half_row;
                        detail::store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(dk_row, pair * 16 + half * 8 + t2,
                                                                              v[0] * p.scale, v[1] * p.scale);
                    }
            }
#pragma unroll
            for (int j = 0; j < S::kMyPairsV; ++j) {
                const int pair = kd + j * S::kDkvWarpsD;
                if (pair < S::kPairsV)
#pragma unroll
                    for (int half = 0; half < 2; ++half) {
                        const float* v = acc_dv[mi][2 * j + half] + 2 * half_row;
                        detail::store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(dv_row, pair * 16 + half * 8 + t2, v[0],
                                                                            v[1]);
                    }
            }
        }
}

}  // namespace rtattn
