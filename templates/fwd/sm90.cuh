// Hopper (sm_90a) forward pass: the same online-softmax algorithm as rtattn_fwd.cuh, with both GEMMs issued as
// warpgroup MMAs (wgmma). Each warpgroup (4 warps) owns 64 query rows; QK^T reads Q and K straight from shared
// memory through descriptors, PV takes P from registers (the score accumulators, repacked) and V from shared memory
// read transposed. K/V tiles stream through a cp.async ring as in the sm_80 kernel. Tiles sit in shared memory in
// one of the layouts wgmma reads directly (TileLayout: swizzled column panels, or interleaved 8x8 cores).
#pragma once
#include "common/cta_tile.cuh"
#include "common/epilogue.cuh"
#include "common/append.cuh"  // the module's KV append entry
#include "common/merge.cuh"  // the module's merge entry
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "sm90/gemm.cuh"
#include "sm90/load.cuh"
#include "sm90/tile_layout.cuh"

namespace rtattn {

template <class T>
struct FwdShapeSm90 {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideV = geometry::padded_row(T::kPadV);  // epilogue staging rows
    // Wide V tiles (kWideV) store whole 64-column panels, the last one partly used (see sm90::WideLayout).
    static constexpr int kVCols = geometry::v_tile_cols(T::kPadV, T::kWideV);
    static constexpr int kQElems = T::kBlockM * T::kPadQK;
    static constexpr int kKElems = T::kBlockN * T::kPadQK;
    static constexpr int kVElems = T::kBlockN * kVCols;
    static constexpr int kSmemBytes =
        geometry::fwd_sm90_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN, T::kStages, T::kWideV);

    static_assert(T::kPadQK % 16 == 0 && T::kPadV % 8 == 0, "pads");
    static_assert(T::kWarps % 4 == 0 && T::kBlockM == T::kWarps * 16, "each warpgroup owns 64 rows");
    static_assert(T::kBlockN % 16 == 0, "kBlockN is consumed in k-steps of 16 by PV");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
    static_assert(T::kStages >= 1 && T::kStages <= 3, "stages");
    static_assert(!T::kSwizzle || (geometry::swizzle_aligned(T::kBlockM, T::kPadQK) &&
                                   geometry::swizzle_aligned(T::kBlockN, T::kPadQK) &&
                                   geometry::swizzle_aligned(T::kBlockN, kVCols)),
                  "swizzled tiles need block_m/block_n x padded width x 2 bytes to be a multiple of 1024");
};

template <class T>
__device__ __forceinline__ void flash_fwd_sm90(const FwdParams& p) {
    static_assert(!T::kWideV, "wide V tiles are planned for the warp-specialized kernel only");
    using S = FwdShapeSm90<T>;
    using detail::u16;
    using detail::u32;
    constexpr int kThreads = S::kThreads;
    constexpr int kNB = T::kBlockN / 8;
    constexpr int kNV = T::kPadV / 8;
    using LQ = sm90::TileLayout<T::kBlockM, T::kPadQK, T::kSwizzle>;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, T::kSwizzle>;
    using LV = sm90::TileLayout<T::kBlockN, T::kPadV, T::kSwizzle>;

    extern __shared__ __align__(1024) unsigned char smem_raw[];  // swizzle atoms are 1024-byte aligned
    u16* sQ = reinterpret_cast<u16*>(smem_raw);
    u16* sK = sQ + S::kQElems;
    u16* sV = sK + T::kStages * S::kKElems;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wg = warp >> 2;
    const detail::CtaTile cta = detail::cta_tile<T>(p);
    const int q0 = cta.q0, n_first = cta.n_first, n_blocks = cta.n_blocks;
    const int seqlen_q = cta.seqlen_q, seqlen_k = cta.seqlen_k;
    const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
    if constexpr (T::kVarlen) {
        if (q0 >= seqlen_q) return;  // past this sequence's end (the grid covers the longest)
    }
    const u16 *gQ = cta.q, *gK = cta.k, *gV = cta.v;

    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, LQ::offset);
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK + st * S::kKElems, tid, LK::offset);
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sV + st * S::kVElems, tid, LV::offset);
    }

    auto load_kv = [&](int block, int slot) {
        const int k0 = (n_first + block) * T::kBlockN;
        sm90::load_tile<T::kBlockN, T::kHeadDimQK, T::kPadQK, T::kSwizzle, T::kVecQK, kThreads>(
            sK + slot * S::kKElems, gK + (long long)k0 * p.k_seq_stride, p.k_seq_stride, seqlen_k - k0, tid);
        sm90::load_tile<T::kBlockN, T::kHeadDimV, T::kPadV, T::kSwizzle, T::kVecV, kThreads>(
            sV + slot * S::kVElems, gV + (long long)k0 * p.v_seq_stride, p.v_seq_stride, seqlen_k - k0, tid);
    };

    sm90::load_tile<T::kBlockM, T::kHeadDimQK, T::kPadQK, T::kSwizzle, T::kVecQK, kThreads>(
        sQ, gQ, p.q_seq_stride, seqlen_q - q0, tid);
    ptx::cp_async_commit();
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
        if (s < n_blocks) load_kv(s, s);
        ptx::cp_async_commit();
    }

    const u32 q_addr = ptx::smem_u32(sQ);
    const int q_row0 = wg * 64;  // this warpgroup's rows


    float acc_o[1][kNV][4];
    float row_max[1][2] = {{detail::neg_inf(), detail::neg_inf()}};
    float row_sum[1][2] = {{0.f, 0.f}};
    detail::AlibiRows<T::kAlibi, 1> alibi(cta.alibi);
#pragma unroll
    for (int nb = 0; nb < kNV; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[0][nb][e] = 0.f;

    for (int j = 0; j < n_blocks; ++j) {
        __syncthreads();  // every warp is done with the slot the next load overwrites
        const int j_load = j + T::kStages - 1;
        if (j_load < n_blocks) load_kv(j_load, j_load % T::kStages);
        ptx::cp_async_commit();
        ptx::cp_async_wait<T::kStages - 1>();
        wgmma::fence_proxy_async();  // this thread's cp.async / zero-fill writes, visible to wgmma
        __syncthreads();

        const int slot = j % T::kStages;
        const u32 k_addr = ptx::smem_u32(sK + slot * S::kKElems);
        const u32 v_addr = ptx::smem_u32(sV + slot * S::kVElems);
        const int n0 = (n_first + j) * T::kBlockN;

        float s[1][kNB][4];
        wgmma::fence();
        sm90::issue_qk<T>(s, q_addr, q_row0, k_addr);
        wgmma::wait<0>();
        sm90::fence_regs<kNB * 4>(&s[0][0][0]);

        detail::apply_softcap<T::kSoftcap>(s, p.softcap_scale);
        alibi.apply(s, row_max, n0, q0 + warp * 16, lane, mask.shift());
        if (mask.needs_mask(n0, q0)) detail::apply_mask(mask, s, n0, q0 + warp * 16, lane);
        detail::online_softmax(s, row_max, row_sum, acc_o, p.scale_log2);

        u32 pa[T::kBlockN / 16][4];
        sm90::pack_p<T>(s, pa);
        wgmma::fence();
        sm90::issue_pv<T>(acc_o, pa, v_addr);
        wgmma::wait<0>();
        sm90::fence_regs<kNV * 4>(&acc_o[0][0][0]);
        sm90::fence_regs<T::kBlockN / 16 * 4>(&pa[0][0]);
    }

    ptx::cp_async_wait<0>();
    __syncthreads();  // the staging area aliases Q/K/V
    const auto seq = detail::fwd_seq_info<T>(p, blockIdx.z);  // again, rather than kept live through the loop
    alibi.settle(row_max, lane);
    detail::normalize_and_stage<T::kBF16, 1, kNV, S::kStrideV, T::kSinks>(p, seq, acc_o, row_max, row_sum, sQ,
                                                                          warp * 16, q0, lane);
    __syncthreads();
    detail::store_tile<T::kBlockM, T::kHeadDimV, T::kVecV, S::kStrideV, kThreads>(p, seq, sQ, q0, tid);
}

}  // namespace rtattn
