// bwd/sm90_ws.cuh's consumers split by GEMM (kByGemm: the wide form past pad 192, where no dQ staging tile fits).
// The wide form's warpgroups each compute S^T and dP^T of the CTA's 64 keys whole and keep half of dK's and dV's
// columns: 7 GEMM units a step for 5. Here each GEMM is computed once:
//
//   warpgroup 0  S^T = K Q^T, P^T (its exponentials), dV += P^T dO with dV whole (every column) in its registers;
//   warpgroup 1  dP^T = V dO^T, then with warpgroup 0's P^T dS^T = P^T (dP^T - D), dK += dS^T Q with dK whole;
//   both         dQ = dS K, half of the columns each (the wide form's halves), each warp adding its 16 rows by TMA
//                reductions 32 columns at a time from a box of its own in shared memory.
//
// S^T and dP^T are issued at the same time by the two warpgroups (64-wide wgmmas, as the wide form's); P^T and dV,
// dS^T and dK stay in the registers of the warpgroup that computed them (A from registers). Two named barriers a
// step: P^T handed to warpgroup 1 through shared memory (each thread's fragments as they are: both warpgroups'
// accumulators lie alike; softcapped, P^T times the cap's slope, all dS^T takes), and dS^T stored for dQ. One buffer
// each: a warpgroup writes its next step's only after the other has passed this step's barrier that follows its reads
// (warpgroup 0 writes P^T after the dS^T barrier, before which warpgroup 1 read it; warpgroup 1 writes dS^T after the
// P^T barrier, to which warpgroup 0 comes once its previous dQ is done).
#pragma once
#include "bwd/sm90.cuh"

namespace rtattn {
template <class T>
struct BwdShapeSm90Ws;
namespace detail {
template <class L, int kPad>
__device__ __forceinline__ wgmma::u64 wide_n_major(u32 base, int kk, int wg, int j);

// What the consumers need of the CTA: shared memory (K, V, the Q/dO slots, the dS^T tile and the P^T exchange, the
// slots' LSE and D), the slots' barriers, and the walk.
struct ByGemmCta {
    u32 aK, aV, aQ0, adO0, adS;
    u16* sdS;
    uint4* sX;  // P^T handed over: 4 x 128 uint4, thread t's k-th at [k * 128 + t]
    const float* sLse0;
    const float* sD0;
    u32 full0, empty0, kv_bar, dq_full, dq_empty;  // full(st) = full0 + 8 st, empty(st) likewise
    u32 sdq;             // the consumer warps' dQ boxes (geometry::bwd_sm90_ws_dq_box_bytes each, warp by warp)
    const void* dq_map;  // the accumulator's (BwdParamsTma::dq_map)
    int steps, head, m_begin, m_end, n0, batch;  // the walk: query blocks [m_begin, m_end) of each head
    u16* dk;  // the key block's head's rows of dK and dV (the view's sequence)
    u16* dv;
};

// Whether a warpgroup's accumulator columns [j, j + 32) are 32 tile columns in order (a dQ box of either).
template <int kPad>
__device__ constexpr bool dq_box_whole(int j) {
    return geometry::bwd_sm90_ws_wide_col(kPad, 0, j + 31) == geometry::bwd_sm90_ws_wide_col(kPad, 0, j) + 31 &&
           geometry::bwd_sm90_ws_wide_col(kPad, 1, j + 31) == geometry::bwd_sm90_ws_wide_col(kPad, 1, j) + 31;
}

template <class T, class View>
__device__ __forceinline__ void bwd_ws_by_gemm(const BwdParams& p, const ByGemmCta& c, const View& view) {
    using S = BwdShapeSm90Ws<T>;
    constexpr int kSt = T::kStages;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, true>;
    using LV = sm90::TileLayout<T::kBlockN, T::kPadV, true>;
    using LQ = sm90::TileLayout<T::kBlockM, T::kPadQK, true>;
    using LdO = sm90::TileLayout<T::kBlockM, T::kPadV, true>;
    using LdS = sm90::TileLayout<T::kBlockN, T::kBlockM, true>;
    constexpr u32 kBarP = 1, kBarDS = 2;  // named barriers: P^T handed over, dS^T stored
    constexpr int kPairs = T::kBlockM / 16;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, ctid = tid & 127;
    const int wq = warp & 3, g = lane >> 2, t2 = (lane & 3) * 2;
    const int key0 = c.n0 + wq * 16 + g;  // this thread's first key; the other is key0 + 8
    const auto seqlen_k = view.seqlen_k;
    const auto mask = mask_of<T>(view.seqlen_q, seqlen_k, p);
    if (c.steps > 0) ptx::mbar_wait(c.kv_bar, 0);
    wgmma::fence_proxy_async();  // the producer's generic-proxy writes (cp.async), ordered before wgmma

    // This warpgroup's half of dQ (the wide form's columns), in two parts (the first 64 columns and the rest). Each
    // part's whole boxes of 32 columns leave through the warp's box in shared memory by one TMA reduction each (a
    // thread's vector reductions of 8 bytes were one L2 request a 32-byte sector: L2-bound at d256); the columns past
    // a half's last whole box (d208, d224, d240: 8 to 24) by vector reductions.
    const u32 box = c.sdq + warp * geometry::bwd_sm90_ws_dq_box_bytes();
    auto dq = [&](int i, int m0, int head, u32 aK) {
        constexpr int kW = S::kColsQK, kP0 = 64, kP1 = kW - 64, kBox = geometry::kBwdDqBoxCols;
        static_assert(kW > 64 && kW <= 128, "a half of 72..128 columns");
        const long long ws_row = ((long long)c.batch * p.heads_q + head) * p.m_pad + m0 + wq * 16;
        float* row = p.dq_accum + (ws_row + g) * S::kDqStride;
        // Part kC's GEMM (columns [kC, kC + kN) of the half), issued.
        auto issue = [&](auto first, auto& acc) {
            constexpr int kC = decltype(first)::value, kN = kC == 0 ? kP0 : kP1;
            wgmma::fence();
            sm90::gemm_ss<kN, T::kBlockN / 16, T::kBF16, true, true, false>(
                acc, [&](int kk) { return LdS::n_major(c.adS, kk, 0); },
                [&](int kk, int c0) { return wide_n_major<LK, T::kPadQK>(aK, kk, wg, kC + c0); });
            wgmma::commit();
        };
        // Box b of part kC out of the warp's box in shared memory, once its last reduction has read it.
        auto put_box = [&](auto first, auto& acc, int b) {
            constexpr int kC = decltype(first)::value;
            static_assert(dq_box_whole<T::kPadQK>(kC), "a part's boxes are whole");
            if (lane == 0) ptx::bulk_wait_read<0>();
            __syncwarp();
            // Rows of 128 bytes, 16-byte piece k of row r at piece k ^ (r % 8) (the map's swizzle).
#pragma unroll
            for (int nb = 0; nb < kBox / 8; ++nb)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = g + 8 * h, col = nb * 8 + t2;
                    ptx::st_shared_f32x2(box + r * 4 * kBox + (((col >> 2) ^ (r & 7)) << 4) + (col & 3) * 4,
                                         acc[b * kBox / 8 + nb][2 * h], acc[b * kBox / 8 + nb][2 * h + 1]);
                }
            ptx::fence_proxy_async_smem();  // the box, visible to the TMA reduction
            __syncwarp();
            if (lane == 0) {
                ptx::tma_reduce_add_2d(c.dq_map, geometry::bwd_sm90_ws_wide_col(T::kPadQK, wg, kC + b * kBox),
                                       int(ws_row), box);
                ptx::bulk_commit();
            }
        };
        // Part kC's columns past its whole boxes, by vector reductions.
        auto put_rest = [&](auto first, auto& acc) {
            constexpr int kC = decltype(first)::value, kN = kC == 0 ? kP0 : kP1;
#pragma unroll
            for (int nb = kN / kBox * kBox / 8; nb < kN / 8; ++nb) {
                const int col = geometry::bwd_sm90_ws_wide_col(T::kPadQK, wg, kC + nb * 8 + t2);
                ptx::red_add_f32x2(row + col, acc[nb][0], acc[nb][1]);
                ptx::red_add_f32x2(row + 8 * S::kDqStride + col, acc[nb][2], acc[nb][3]);
            }
        };
        float acc0[kP0 / 8][4];
        float acc1[kP1 / 8][4];
        issue(IntC<0>(), acc0);
        wgmma::wait<0>();
        sm90::fence_regs<kP0 / 2>(&acc0[0][0]);
        // Deterministic: this CTA's turn, waited for once the first part is in (as the wide form did; before the
        // GEMM: d256 0.98-0.99x, d208 1.01-1.03x).
        if (p.deterministic) ptx::mbar_wait(c.dq_empty, i & 1);
        put_box(IntC<0>(), acc0, 0);
        // The second part's GEMM while the first box is read (after the first part's boxes: d208 0.96-0.97x
        // non-causal, d256 the same; H200).
        issue(IntC<kP0>(), acc1);
        put_box(IntC<0>(), acc0, 1);
        wgmma::wait<0>();
        sm90::fence_regs<kP1 / 2>(&acc1[0][0]);
        if constexpr (kP1 >= kBox) put_box(IntC<kP0>(), acc1, 0);
        if constexpr (kP1 >= 2 * kBox) put_box(IntC<kP0>(), acc1, 1);
        put_rest(IntC<kP0>(), acc1);
        if (p.deterministic) {
            // The adds ordered before the turn passes on by the producer's fence after dq_full (cumulative: a
            // fence here held each consumer warp until its reductions had reached L2); the TMA reductions complete
            // first.
            if (lane == 0) ptx::bulk_wait<0>();
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(c.dq_full);
        }
    };
    // The walk, step by step (each query block of each query head of the group).
    auto walk = [&](auto body) {
        int head = c.head, m_block = c.m_begin;
        for (int i = 0; i < c.steps; ++i) {
            const int st = kSt > 1 ? i % kSt : 0;
            ptx::mbar_wait(c.full0 + 8 * st, (i / kSt) & 1);
            wgmma::fence_proxy_async();
            // K's address opaque each step: hoisted, its wgmma descriptors were spilled and reloaded.
            u32 aK = c.aK;
            asm volatile("" : "+r"(aK));
            body(i, st, head, m_block * T::kBlockM, aK);
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(c.empty0 + 8 * st);  // this warp is done with the slot
            if (++m_block == c.m_end) m_block = c.m_begin, ++head;
        }
    };

    if (wg == 0) {
        float acc_dv[T::kPadV / 8][4];
        zero_frags(acc_dv);
        walk([&](int i, int st, int head, int m0, u32 aK) {
            const u32 aQ = c.aQ0 + 2 * st * S::kQElems, adO = c.adO0 + 2 * st * S::kdOElems;
            float s[S::kNB][4];
            wgmma::fence();
            bwd_scores_t<LK, LQ, T::kPadQK / 16, T::kBF16>(s, aK, aQ, 0);
            wgmma::commit();
            wgmma::wait<0>();
            sm90::fence_regs<S::kNB * 4>(&s[0][0]);
            const bool masked = mask.edge(c.n0, m0);
            // The other warpgroup's dS takes P^T, softcapped times the cap's slope (packed as P^T: psa).
            u32 pa[kPairs][4], psa[kPairs][4];
            bwd_p_t<T::kBF16, T::kSoftcap, T::kAlibi>(s, pa, c.sLse0 + st * T::kBlockM, p, mask, masked, key0, m0,
                                                      mask.shift(), t2, alibi_factor<T::kAlibi>(p, c.batch, head),
                                                      bwd_capped_ps_t<T::kBF16>(psa));
            const u32(&ph)[kPairs][4] = T::kSoftcap ? psa : pa;
#pragma unroll
            for (int k = 0; k < kPairs; ++k) c.sX[k * 128 + ctid] = make_uint4(ph[k][0], ph[k][1], ph[k][2], ph[k][3]);
            ptx::bar_arrive(kBarP, 2 * 128);
            wgmma::fence();
            sm90::gemm_rs<T::kPadV, kPairs, T::kBF16, true>(
                acc_dv, pa, [&](int kk, int c0) { return LdO::template n_major<false>(adO, kk, c0); });
            wgmma::commit();
            ptx::bar_sync(kBarDS, 2 * 128);  // dS^T stored
            dq(i, m0, head, aK);
            sm90::fence_regs<T::kPadV / 2>(&acc_dv[0][0]);
            sm90::fence_regs<kPairs * 4>(&pa[0][0]);
        });
        if (lane == 0) ptx::bulk_wait<0>();  // the box's reductions done before the CTA's shared memory goes
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = key0 + 8 * h;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nb = 0; nb < T::kPadV / 8; ++nb)
                store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(c.dv + key * p.dv_seq_stride, nb * 8 + t2,
                                                              acc_dv[nb][2 * h], acc_dv[nb][2 * h + 1]);
        }
    } else {
        float acc_dk[T::kPadQK / 8][4];
        zero_frags(acc_dk);
        walk([&](int i, int st, int head, int m0, u32 aK) {
            const u32 aQ = c.aQ0 + 2 * st * S::kQElems, adO = c.adO0 + 2 * st * S::kdOElems;
            u32 aV = c.aV;
            asm volatile("" : "+r"(aV));
            float dp[S::kNB][4];
            wgmma::fence();
            bwd_scores_t<LV, LdO, T::kPadV / 16, T::kBF16>(dp, aV, adO, 0);
            wgmma::commit();
            wgmma::wait<0>();
            sm90::fence_regs<S::kNB * 4>(&dp[0][0]);
            ptx::bar_sync(kBarP, 2 * 128);  // P^T handed over
            u32 pa[kPairs][4];
#pragma unroll
            for (int k = 0; k < kPairs; ++k) {
                const uint4 v = c.sX[k * 128 + ctid];
                pa[k][0] = v.x, pa[k][1] = v.y, pa[k][2] = v.z, pa[k][3] = v.w;
            }
            u32 dsa[kPairs][4];
            bwd_ds_t<T::kBF16, S::kNB, LdS>(dp, pa, dsa, c.sD0 + st * T::kBlockM, c.sdS, wq * 16 + g, t2);
            wgmma::fence_proxy_async();  // dS^T's stores, visible to wgmma
            ptx::bar_sync(kBarDS, 2 * 128);
            wgmma::fence();
            sm90::gemm_rs<T::kPadQK, kPairs, T::kBF16, true>(
                acc_dk, dsa, [&](int kk, int c0) { return LQ::template n_major<false>(aQ, kk, c0); });
            wgmma::commit();
            dq(i, m0, head, aK);
            sm90::fence_regs<T::kPadQK / 2>(&acc_dk[0][0]);
            sm90::fence_regs<kPairs * 4>(&dsa[0][0]);
        });
        if (lane == 0) ptx::bulk_wait<0>();  // the box's reductions done before the CTA's shared memory goes
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = key0 + 8 * h;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nb = 0; nb < T::kPadQK / 8; ++nb)
                store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(c.dk + key * p.dk_seq_stride, nb * 8 + t2,
                                                                acc_dk[nb][2 * h] * p.scale,
                                                                acc_dk[nb][2 * h + 1] * p.scale);
        }
    }
}

}  // namespace detail
}  // namespace rtattn
