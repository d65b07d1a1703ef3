// FlashAttention-2 style forward pass for any head_dim.
//
// One CTA owns kBlockM query rows of one (batch, head); each warp owns kMTiles consecutive 16-row MMA tiles.
// The CTA streams K/V tiles of kBlockN keys through a kStages-deep cp.async ring and keeps the running row max,
// row sum and the fp32 output accumulator in registers (online softmax), so no Sq x Sk matrix ever exists.
//
// Head dims are padded to the MMA shape: QK^T reduces over kPadQK (a multiple of 16, the k of m16n8k16) and PV
// produces kPadV columns (a multiple of 8, the n). Padded columns are zeroed in shared memory once and never
// written by loads, so they contribute exact zeros; they are never stored. Shifted rows (head dims off the 8 grid)
// place each row a few columns right, as 16-byte vectors from the boundary before it (below).
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

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV   the real head dims
//   kPadQK, kPadV           padded to 16 and 8
//   kBF16, kCausal, kVarlen (packed sequences: common/seq.cuh), kPaged (K/V in a paged cache)
//   kBlockM, kBlockN, kWarps, kMTiles, kStages, kQInRegs, kKVApart
//   kVecQK, kVecV           elements per global vector access (each divides its head dim)
//   kRotateRows             head dims 4 mod 8: K and V rows as rotated 16-byte vectors where the call's strides allow
//   kShiftRows              head dims off the 8 grid: K and V rows as shifted 16-byte vectors where the strides allow
template <class T>
struct FwdShape {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideQK = geometry::padded_row(T::kPadQK);  // shared-memory row strides
    static constexpr int kStrideV = geometry::padded_row(T::kPadV);
    static constexpr int kQElems = T::kBlockM * kStrideQK;
    static constexpr int kKElems = T::kBlockN * kStrideQK;
    static constexpr int kVElems = T::kBlockN * kStrideV;
    static constexpr int kSmemBytes =
        geometry::fwd_mma_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN, T::kStages);

    // Each tensor's rows off the 8 grid are shifted (kShiftRows: pads with room for the shift) or not (the next pad).
    static constexpr bool kShiftK = T::kShiftRows && !T::kPaged && T::kVecQK < 8;
    static constexpr bool kShiftV = T::kShiftRows && !T::kPaged && T::kVecV < 8;
    static constexpr int kVecsK = geometry::shifted_vectors(T::kHeadDimQK);
    static constexpr int kVecsV = geometry::shifted_vectors(T::kHeadDimV);
    static_assert(T::kPadQK % 16 == 0 && T::kPadQK >= (kShiftK ? 8 * kVecsK : T::kHeadDimQK) &&
                      T::kPadQK - T::kHeadDimQK < 32, "QK pad");
    static_assert(T::kPadV % 8 == 0 && T::kPadV >= (kShiftV ? 8 * kVecsV : T::kHeadDimV) && T::kPadV - T::kHeadDimV < 16,
                  "V pad");
    static_assert(!T::kShiftRows || !T::kRotateRows, "rows shift or rotate");
    static_assert(T::kBlockM == T::kWarps * T::kMTiles * 16, "each warp owns kMTiles 16-row tiles");
    static_assert(T::kBlockN % 16 == 0, "kBlockN is consumed in k-steps of 16 by PV");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
    static_assert(T::kStages >= 1 && T::kStages <= 3, "stages");
};


template <class T>
__device__ __forceinline__ void flash_fwd(const FwdParams& p) {
    using S = FwdShape<T>;
    using detail::u16;
    using detail::u32;
    constexpr int kThreads = S::kThreads;
    constexpr int kNB = T::kBlockN / 8;    // 8-wide score column blocks per warp tile
    constexpr int kKQ = T::kPadQK / 16;    // k-steps of QK^T
    constexpr int kNV = T::kPadV / 8;      // 8-wide output column blocks

    extern __shared__ __align__(16) unsigned char smem_raw[];
    u16* sQ = reinterpret_cast<u16*>(smem_raw);
    u16* sK = sQ + S::kQElems;
    u16* sV = sK + T::kStages * S::kKElems;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const detail::CtaTile cta = detail::cta_tile<T, T::kPaged>(p);
    const int q0 = cta.q0, n_first = cta.n_first, n_blocks = cta.n_blocks;
    const int seqlen_q = cta.seqlen_q, seqlen_k = cta.seqlen_k;
    const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
    if constexpr (T::kVarlen) {
        if (q0 >= seqlen_q) return;  // past this sequence's end (the grid covers the longest)
    }
    const u16 *gQ = cta.q, *gK = cta.k, *gV = cta.v;

    auto at_qk = [](int r, int c) { return r * S::kStrideQK + c; };
    auto at_v = [](int r, int c) { return r * S::kStrideV + c; };

    // Shifted rows (head dims off the 8 grid, rows of a sequence and head all alike modulo 16 bytes: p.rotate_*):
    // K and V rows move as whole 16-byte vectors from the boundary at or before each (load_rows_shifted), landing
    // `shift` columns right. Q is placed with K's shift, its other columns zero; K's columns in front of the row (a
    // neighbour's, maybe NaN) are masked out of its MMA fragments, the loads zero-fill those after it; V's reach only
    // O's columns outside the row, and O is stored from V's shift. Elsewhere (shift 0) rows move in kVec vectors.
    const bool shift_k = S::kShiftK && p.rotate_k == 1, shift_v = S::kShiftV && p.rotate_v == 1;
    auto shift_of = [](bool on, const u16* g) { return on ? int(reinterpret_cast<unsigned long long>(g) & 15) / 2 : 0; };
    const int sh_k = shift_of(shift_k, gK), sh_v = shift_of(shift_v, gV);
    if constexpr (S::kShiftK)
        detail::zero_cols_outside<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, at_qk, sh_k);
    else
        detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, at_qk);
    if (shift_k)  // the loads write every vector's columns, data or zeros
        detail::zero_pad_cols<T::kStages * T::kBlockN, 8 * S::kVecsK, T::kPadQK, kThreads>(sK, tid, at_qk);
    else
        detail::zero_pad_cols<T::kStages * T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK, tid, at_qk);
    if (shift_v)
        detail::zero_pad_cols<T::kStages * T::kBlockN, 8 * S::kVecsV, T::kPadV, kThreads>(sV, tid, at_v);
    else
        detail::zero_pad_cols<T::kStages * T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sV, tid, at_v);
    // K's fragments of the first k-step: this lane's two columns (2 * (lane % 4) and one more) kept where not in
    // front of the row.
    const u32 lead_mask = (2 * (lane & 3) >= sh_k ? 0xffffu : 0u) | (2 * (lane & 3) + 1 >= sh_k ? 0xffff0000u : 0u);

    // Head dims of 4 mod 8 (d132) whose rows of this sequence and head all start alike modulo 16 bytes
    // (p.rotate_*): K and V rows move as 16-byte vectors, stored rotated by 0 or 4 columns (load_rows_rotated); Q
    // takes K's rotation (a common permutation of the columns leaves QK^T as it is) and O is stored rotated back.
    // Not for a paged cache: its per-row page lookups beside the rotation spilled (d140 causal on sm_90, 68 bytes).
    constexpr bool kRotK = T::kRotateRows && !T::kPaged && geometry::rotated_rows(T::kHeadDimQK, T::kVecQK);
    constexpr bool kRotV = T::kRotateRows && !T::kPaged && geometry::rotated_rows(T::kHeadDimV, T::kVecV);
    auto rot_of = [](bool on, const u16* g) { return on && (reinterpret_cast<unsigned long long>(g) & 8) ? 4 : 0; };
    const bool rotate_k = kRotK && p.rotate_k == 1, rotate_v = kRotV && p.rotate_v == 1;
    const int rot_k = rot_of(rotate_k, gK), rot_v = rot_of(rotate_v, gV);

    // A paged cache (chunked prefill) finds each K/V row through the block table; else rows are strided.
    const int* table = T::kPaged ? p.block_table + blockIdx.z * p.block_table_stride : nullptr;
    auto load_k = [&](int block, int slot) {
        const int k0 = (n_first + block) * T::kBlockN;
        if constexpr (S::kShiftK) {
            if (shift_k) {
                detail::load_rows_shifted<T::kBlockN, S::kVecsK, kThreads>(
                    sK + slot * S::kKElems, gK, gK - sh_k + (long long)k0 * p.k_seq_stride, p.k_seq_stride,
                    seqlen_k - k0, sh_k + T::kHeadDimQK, tid, at_qk);
                return;
            }
        }
        if constexpr (kRotK) {
            if (rotate_k) {
                detail::load_rows_rotated<T::kBlockN, T::kHeadDimQK, kThreads>(
                    sK + slot * S::kKElems, gK, [&](int r) { return gK + (long long)(k0 + r) * p.k_seq_stride; },
                    seqlen_k - k0, rot_k, 0, tid, at_qk);
                return;
            }
        }
        if constexpr (T::kPaged) {
            detail::load_rows<T::kBlockN, T::kHeadDimQK, T::kVecQK, kThreads>(
                sK + slot * S::kKElems, gK,
                [&](int r) { return detail::paged_row(gK, table, p.page_shift, p.num_pages, p.k_batch_stride, p.k_seq_stride, k0 + r); },
                seqlen_k - k0, tid, at_qk);
        } else {
            detail::load_tile<T::kBlockN, T::kHeadDimQK, T::kVecQK, kThreads>(
                sK + slot * S::kKElems, gK + (long long)k0 * p.k_seq_stride, p.k_seq_stride, seqlen_k - k0, tid, at_qk);
        }
    };
    auto load_v = [&](int block, int slot) {
        const int k0 = (n_first + block) * T::kBlockN;
        if constexpr (S::kShiftV) {
            if (shift_v) {
                detail::load_rows_shifted<T::kBlockN, S::kVecsV, kThreads>(
                    sV + slot * S::kVElems, gV, gV - sh_v + (long long)k0 * p.v_seq_stride, p.v_seq_stride,
                    seqlen_k - k0, sh_v + T::kHeadDimV, tid, at_v);
                return;
            }
        }
        if constexpr (kRotV) {
            if (rotate_v) {
                detail::load_rows_rotated<T::kBlockN, T::kHeadDimV, kThreads>(
                    sV + slot * S::kVElems, gV, [&](int r) { return gV + (long long)(k0 + r) * p.v_seq_stride; },
                    seqlen_k - k0, rot_v, 0, tid, at_v);
                return;
            }
        }
        if constexpr (T::kPaged) {
            detail::load_rows<T::kBlockN, T::kHeadDimV, T::kVecV, kThreads>(
                sV + slot * S::kVElems, gV,
                [&](int r) { return detail::paged_row(gV, table, p.page_shift, p.num_pages, p.v_batch_stride, p.v_seq_stride, k0 + r); },
                seqlen_k - k0, tid, at_v);
        } else {
            detail::load_tile<T::kBlockN, T::kHeadDimV, T::kVecV, kThreads>(
                sV + slot * S::kVElems, gV + (long long)k0 * p.v_seq_stride, p.v_seq_stride, seqlen_k - k0, tid, at_v);
        }
    };

    // Group order: Q, then the first kStages-1 blocks' K and V, one group per block or, with kKVApart, one for K
    // and one for V; groups complete in order. In the loop, block j+kStages-1's K is issued at the top of iteration
    // j, its V there too or (kKVApart) after the softmax: either way each load has an iteration to land. Apart, the
    // two loads' address registers are never live at once (FA2's d128 shape, 128x64 on 4 warps, spilled 20 bytes
    // otherwise), at the cost of a second barrier per block.
    constexpr int kPending = (T::kKVApart ? 2 : 1) * (T::kStages - 1);  // groups issued after block j's K
    if constexpr (kRotK)
        detail::load_tile<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(
            sQ, gQ, p.q_seq_stride, seqlen_q - q0, tid,
            [=](int r, int c) { return at_qk(r, c >= rot_k ? c - rot_k : c - rot_k + T::kHeadDimQK); });
    else
        detail::load_tile<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(
            sQ, gQ, p.q_seq_stride, seqlen_q - q0, tid, [=](int r, int c) { return at_qk(r, c + sh_k); });
    ptx::cp_async_commit();
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
        if (s < n_blocks) load_k(s, s);
        if constexpr (T::kKVApart) ptx::cp_async_commit();
        if (s < n_blocks) load_v(s, s);
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

    // Each lane's ldmatrix addresses are a base worked out once plus constants (the block's row and column).
    const u32 q_lane = ptx::smem_u32(sQ + (warp_row0 + a_row) * S::kStrideQK + a_col);
    const u32 k_lane = ptx::smem_u32(sK + k_row * S::kStrideQK + k_col);
    const u32 v_lane = ptx::smem_u32(sV + v_row * S::kStrideV + v_col);
    u32 q_frag[T::kQInRegs ? T::kMTiles : 1][T::kQInRegs ? kKQ : 1][4];
    auto load_q_frag = [&](int mt, int kk, u32 (&a)[4]) {
        ptx::ldsm_x4(q_lane + 2 * (mt * 16 * S::kStrideQK + kk * 16), a[0], a[1], a[2], a[3]);
    };
    if constexpr (T::kQInRegs) {
        ptx::cp_async_wait<kPending>();
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
        row_max[mt][0] = row_max[mt][1] = detail::neg_inf();
        row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    detail::AlibiRows<T::kAlibi, T::kMTiles> alibi(cta.alibi);

    for (int j = 0; j < n_blocks; ++j) {
        __syncthreads();  // every warp is done with the slot the next load overwrites
        const int j_load = j + T::kStages - 1;
        if (j_load < n_blocks) {
            load_k(j_load, j_load % T::kStages);
            if constexpr (!T::kKVApart) load_v(j_load, j_load % T::kStages);
        }
        ptx::cp_async_commit();
        ptx::cp_async_wait<kPending>();  // K (and V, unless apart) of block j has landed
        __syncthreads();

        const int slot = j % T::kStages;
        const u32 k_tile = k_lane + 2 * slot * S::kKElems;
        const u32 v_tile = v_lane + 2 * slot * S::kVElems;
        const int n0 = (n_first + j) * T::kBlockN;

        // S = Q K^T for this warp's rows (the first k-step sets S: no clearing).
        float s[T::kMTiles][kNB][4];
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
                ptx::ldsm_x4(k_tile + 2 * (np * 16 * S::kStrideQK + kk * 16), b0, b1, b2, b3);
                if (S::kShiftK && kk == 0) b0 &= lead_mask, b2 &= lead_mask;  // columns 0..7 of two key blocks
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) {
                    const u32(&a)[4] = T::kQInRegs ? q_frag[mt][T::kQInRegs ? kk : 0] : a_tmp[mt];
                    if (kk == 0) {
                        ptx::mma_first<T::kBF16>(s[mt][2 * np], a, b0, b1);
                        ptx::mma_first<T::kBF16>(s[mt][2 * np + 1], a, b2, b3);
                    } else {
                        ptx::mma<T::kBF16>(s[mt][2 * np], a, b0, b1);
                        ptx::mma<T::kBF16>(s[mt][2 * np + 1], a, b2, b3);
                    }
                }
            }
        }

        detail::apply_softcap<T::kSoftcap>(s, p.softcap_scale);
        alibi.apply(s, row_max, n0, q0 + warp_row0, lane, mask.shift());
        if (mask.needs_mask(n0, q0)) detail::apply_mask(mask, s, n0, q0 + warp_row0, lane);
        detail::online_softmax(s, row_max, row_sum, acc_o, p.scale_log2);
        if constexpr (T::kKVApart) {
            if (j_load < n_blocks) load_v(j_load, j_load % T::kStages);
            ptx::cp_async_commit();
            ptx::cp_async_wait<kPending>();  // V of block j has landed
            __syncthreads();
        }

        // O += P V: P never leaves registers.
#pragma unroll
        for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
            u32 a[T::kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < T::kMTiles; ++mt) detail::pack_p<T::kBF16>(s[mt], kk, a[mt]);
#pragma unroll
            for (int np = 0; np < kNV / 2; ++np) {
                u32 b0, b1, b2, b3;
                ptx::ldsm_x4_t(v_tile + 2 * (kk * 16 * S::kStrideV + np * 16), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) {
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np], a[mt], b0, b1);
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
            if constexpr (kNV % 2 == 1) {  // a last 8-wide column block (kPadV = 8 mod 16)
                u32 b0, b1;
                // .x2 reads lanes 0-15's addresses only, whose v_col is 0.
                ptx::ldsm_x2_t(v_tile + 2 * (kk * 16 * S::kStrideV + (kNV - 1) * 8), b0, b1);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) ptx::mma<T::kBF16>(acc_o[mt][kNV - 1], a[mt], b0, b1);
            }
        }
    }

    // Epilogue: normalize, stage the tile in shared memory, then write rows with full-width vector stores.
    ptx::cp_async_wait<0>();
    __syncthreads();  // the staging area aliases Q/K/V
    const auto seq = detail::fwd_seq_info<T>(p, blockIdx.z);  // again, not kept live through the loop
    alibi.settle(row_max, lane);
    detail::normalize_and_stage<T::kBF16, T::kMTiles, kNV, S::kStrideV, T::kSinks>(p, seq, acc_o, row_max, row_sum,
                                                                                   sQ, warp_row0, q0, lane);
    __syncthreads();
    detail::store_tile<T::kBlockM, T::kHeadDimV, T::kVecV, S::kStrideV, kThreads>(p, seq, sQ, q0, tid, rot_v, -1,
                                                                                  sh_v);
}

}  // namespace rtattn
