// Hopper (sm_90a) forward pass: the same online-softmax algorithm as rtattn_fwd.cuh, with both GEMMs issued as
// warpgroup MMAs (wgmma). Each warpgroup (4 warps) owns 64 query rows; QK^T reads Q and K straight from shared
// memory through descriptors, PV takes P from registers (the score accumulators, repacked) and V from shared memory
// read transposed. K/V tiles stream through a cp.async ring as in the sm_80 kernel. Tiles sit in shared memory in
// one of the layouts wgmma reads directly (TileLayout: swizzled column panels, or interleaved 8x8 cores).
#pragma once
#include "rtattn_params.h"
#include "rtattn_ptx.cuh"
#include "rtattn_softmax.cuh"
#include "rtattn_wgmma.cuh"

namespace rtattn {

template <class T>
struct FwdShapeSm90 {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideV = (T::kPadV / 8) % 2 == 1 ? T::kPadV : T::kPadV + 8;  // epilogue staging rows
    // Wide V tiles (kWideV) store whole 64-column panels, the last one partly used (see sm90::WideLayout).
    static constexpr int kVCols = T::kWideV ? (T::kPadV + 63) / 64 * 64 : T::kPadV;
    static constexpr int kQElems = T::kBlockM * T::kPadQK;
    static constexpr int kKElems = T::kBlockN * T::kPadQK;
    static constexpr int kVElems = T::kBlockN * kVCols;
    static constexpr int kOElems = T::kBlockM * kStrideV;
    static constexpr int kMainElems = kQElems + T::kStages * (kKElems + kVElems);
    static constexpr int kSmemBytes = 2 * (kMainElems > kOElems ? kMainElems : kOElems);

    static_assert(T::kPadQK % 16 == 0 && T::kPadV % 8 == 0, "pads");
    static_assert(T::kWarps % 4 == 0 && T::kBlockM == T::kWarps * 16 && T::kMTiles == 1,
                  "each warpgroup owns 64 rows");
    static_assert(T::kBlockN % 16 == 0, "kBlockN is consumed in k-steps of 16 by PV");
    static_assert(T::kHeadDimQK % T::kVecQK == 0 && T::kHeadDimV % T::kVecV == 0, "vectors tile the row");
    static_assert(T::kStages >= 1 && T::kStages <= 3, "stages");
    // Swizzle atoms (and TMA boxes with a swizzle) must start 1024-byte aligned: so must every tile.
    static_assert(!T::kSwizzle || (2 * kQElems % 1024 == 0 && 2 * kKElems % 1024 == 0 && 2 * kVElems % 1024 == 0),
                  "swizzled tiles need block_m/block_n x padded width x 2 bytes to be a multiple of 1024");
    // A Q-in-registers variant (QK^T with A from registers) gave wrong results on an H200 for some shapes (d64 with
    // 64-key tiles, d128 with 128-key tiles) and was removed; Q is always read through a descriptor.
    static_assert(!T::kQInRegs, "the wgmma kernel reads Q from shared memory");
};

namespace sm90 {

using detail::u16;
using detail::u32;

// Shared-memory layout of one tile (kRows x kPad, 16-bit) as column panels, each in the widest form wgmma reads
// without bank conflicts: panels of 64 columns with the 128-byte swizzle, then at most one panel each of 32 columns
// (64-byte swizzle), 16 columns (32-byte swizzle) and 8 columns (interleaved, no swizzle) for the rest of the
// padded width. In a panel of width W, row r is 2W contiguous bytes and its 16-byte chunks are XOR-permuted by
// address bits 7.. (Swizzle<B,4,3>), so 8 rows of one chunk column land in 8 different bank groups. Panels are
// ordered widest first, which keeps each one aligned to its swizzle atom (8 rows x 2W bytes).
// (Interleaved layouts everywhere, tried first, ran at ~230 TFLOPS on an H200 where swizzled ones reach ~350.)
template <int kRows, int kPad, bool kSwizzle>
struct TileLayout;

// Interleaved (no swizzle) throughout: 8x8 cores of 128 contiguous bytes, core (r/8, c/8) at index
// (r/8)*(kPad/8) + c/8; LBO steps to the next core along K, SBO along M/N.
template <int kRows, int kPad>
struct TileLayout<kRows, kPad, false> {
    static constexpr int kRowBlock = kPad / 8 * 128;  // bytes between core rows
    static __device__ __forceinline__ int offset(int r, int c) {
        return ((r >> 3) * (kPad / 8) + (c >> 3)) * 64 + (r & 7) * 8 + (c & 7);
    }
    static __device__ __forceinline__ wgmma::u64 k_major(u32 base, int row0, int kk) {
        return wgmma::desc(base + (row0 / 8) * kRowBlock + 2 * kk * 128, 128, kRowBlock);
    }
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk, int c0) {
        return wgmma::desc(base + 2 * kk * kRowBlock + (c0 / 8) * 128, kRowBlock, 128);
    }
};

template <int kRows, int kPad>
struct TileLayout<kRows, kPad, true> {
    static constexpr int kN64 = kPad / 64;
    static constexpr bool kHas32 = (kPad & 32) != 0, kHas16 = (kPad & 16) != 0, kHas8 = (kPad & 8) != 0;
    static constexpr int kCol32 = kN64 * 64;                       // first column of the 32-wide panel
    static constexpr int kCol16 = kCol32 + (kHas32 ? 32 : 0);
    static constexpr int kCol8 = kCol16 + (kHas16 ? 16 : 0);
    static constexpr int kPanel64Bytes = kRows * 128;
    static constexpr int kBase32 = kN64 * kPanel64Bytes;            // byte offsets of the narrow panels
    static constexpr int kBase16 = kBase32 + (kHas32 ? kRows * 64 : 0);
    static constexpr int kBase8 = kBase16 + (kHas16 ? kRows * 32 : 0);

    static __device__ __forceinline__ int swizzle(int byte, int bits) {
        return byte ^ (((byte >> 7) & ((1 << bits) - 1)) << 4);
    }
    static __device__ __forceinline__ int offset(int r, int c) {  // in elements
        int byte;
        if (c < kCol32)
            byte = (c >> 6) * kPanel64Bytes + swizzle(r * 128 + (c & 63) * 2, 3);
        else if (kHas32 && c < kCol16)
            byte = kBase32 + swizzle(r * 64 + (c - kCol32) * 2, 2);
        else if (kHas16 && c < kCol8)
            byte = kBase16 + swizzle(r * 32 + (c - kCol16) * 2, 1);
        else
            byte = kBase8 + r * 16 + (c - kCol8) * 2;
        return byte >> 1;
    }
    // Calls f(kind, first column, byte offset) for each panel; kind 0..3 = width 64, 32, 16, 8 (the TMA map index
    // in FwdParamsTma). A panel is exactly one TMA box with the matching swizzle mode.
    template <class F>
    static __device__ __forceinline__ void for_each_panel(F f) {
#pragma unroll
        for (int i = 0; i < kN64; ++i) f(0, i * 64, i * kPanel64Bytes);
        if constexpr (kHas32) f(1, kCol32, kBase32);
        if constexpr (kHas16) f(2, kCol16, kBase16);
        if constexpr (kHas8) f(3, kCol8, kBase8);
    }
    // K-major operand (Q or K): rows [row0, row0 + 64) x columns [16*kk, 16*kk + 16). SBO = one 8-row atom; LBO is
    // unused by swizzled K-major layouts (a k-step never leaves its panel).
    static __device__ __forceinline__ wgmma::u64 k_major(u32 base, int row0, int kk) {
        const int c = 16 * kk;
        if (c < kCol32)
            return wgmma::desc(base + (c >> 6) * kPanel64Bytes + row0 * 128 + (c & 63) * 2, 16, 1024, 1);
        if (kHas32 && c < kCol16) return wgmma::desc(base + kBase32 + row0 * 64 + (c - kCol32) * 2, 16, 512, 2);
        return wgmma::desc(base + kBase16 + row0 * 32, 16, 256, 3);  // kPad is a multiple of 16: no 8-wide rest
    }
    // N-major operand (V read transposed): K rows [16*kk, 16*kk + 16) x N columns from c0, as chunked by
    // for_each_chunk (a 128-wide chunk spans two 64-column panels: LBO is the panel stride).
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk, int c0) {
        if (c0 < kCol32) return wgmma::desc(base + (c0 >> 6) * kPanel64Bytes + 16 * kk * 128, kPanel64Bytes, 1024, 1);
        if (kHas32 && c0 == kCol32) return wgmma::desc(base + kBase32 + 16 * kk * 64, 16, 512, 2);
        if (kHas16 && c0 == kCol16) return wgmma::desc(base + kBase16 + 16 * kk * 32, 16, 256, 3);
        return wgmma::desc(base + kBase8 + 16 * kk * 16, 128, 128, 0);  // interleaved: next core along K is 128 B on
    }
};

// V tiles as whole 64-column panels with the 128-byte swizzle, the last one only partly used: PV is then one wgmma
// of n = kPad per k-step through a single descriptor (LBO = panel stride), where the per-width panels of
// TileLayout need one per panel width. (The same addresses as TileLayout<kRows, kPad rounded up to 64, true>,
// written out: that one's per-width branches cost ~1 KB more code where the column is not a constant.) The plan uses it where those panels would end in an 8-wide unswizzled one
// (d132: n136 instead of n128 + n8, 2-5% faster on an H200); it costs shared memory for the unused columns.
template <int kRows, int kPad>
struct WideLayout {
    static constexpr int kPanels = (kPad + 63) / 64;
    static constexpr int kPanel64Bytes = kRows * 128;
    static __device__ __forceinline__ int offset(int r, int c) {  // in elements
        return ((c >> 6) * kPanel64Bytes + ((r * 128 + (c & 63) * 2) ^ ((r & 7) << 4))) >> 1;
    }
    // Calls f(kind 0 = 64-wide TMA map, first column, byte offset) for each panel.
    template <class F>
    static __device__ __forceinline__ void for_each_panel(F f) {
#pragma unroll
        for (int i = 0; i < kPanels; ++i) f(0, i * 64, i * kPanel64Bytes);
    }
    // N-major operand: K rows [16*kk, 16*kk + 16) x all kPad columns, across the panels (LBO).
    static __device__ __forceinline__ wgmma::u64 n_major(u32 base, int kk) {
        return wgmma::desc(base + 16 * kk * 128, kPanel64Bytes, 1024, 1);
    }
};

// The V tile layout of a plan.
template <class T, bool kWide = T::kWideV>
struct VLayoutOf {
    using type = TileLayout<T::kBlockN, T::kPadV, T::kSwizzle>;
};
template <class T>
struct VLayoutOf<T, true> {
    using type = WideLayout<T::kBlockN, T::kPadV>;
};
template <class T>
using VLayout = typename VLayoutOf<T>::type;

// Loads rows x kHeadDim into layout L (default TileLayout<kRows, kPad, kSwizzle>). Eight consecutive threads take
// the same 16-byte column chunk of eight consecutive rows (one core, or one chunk per row of a swizzle atom:
// distinct bank groups either way), so a warp still reads whole 32-byte sectors of each global row.
// kLoadRows rows (default: the whole tile) go to tile rows [row_base, row_base + kLoadRows). kUnroll trades
// registers for issue rate (the producer warpgroup of the warp-specialized kernel runs on few registers).
// rot (a multiple of kVec): tile column c holds row element (c + rot) mod kHeadDim (the split-row TMA layout).
template <int kRows, int kHeadDim, int kPad, bool kSwizzle, int kVec, int kThreads, int kLoadRows = kRows,
          int kUnroll = 4, class L = TileLayout<kRows, kPad, kSwizzle>>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, long long row_stride, int valid_rows, int tid,
                                          int row_base = 0, int rot = 0) {
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kTotal = kLoadRows * kPerRow;
#pragma unroll kUnroll
    for (int i = tid; i < kTotal; i += kThreads) {
        const int rest = i >> 3;
        const int rb = rest / kPerRow;
        const int r = rb * 8 + (i & 7);
        const int c = (rest - rb * kPerRow) * kVec;
        const bool valid = r < valid_rows;
        const int c_src = c + rot < kHeadDim ? c + rot : c + rot - kHeadDim;
        const u16* src = valid ? g + r * row_stride + c_src : g;
        const int at = L::offset(row_base + r, c);
        if constexpr (kVec >= 2) {
            ptx::cp_async<kVec * 2>(ptx::smem_u32(s + at), src, valid);
        } else {
            s[at] = valid ? *src : u16(0);
        }
    }
}

// Issues D(64 x kN) (+)= A * B as column chunks of width 128, then at most one each of 64, 32, 16, 8: wgmma's N is
// part of the instruction, and wide chunks re-read A least.
template <int kN, bool kBF16, class Issue>
__device__ __forceinline__ void for_each_chunk(Issue issue) {
    constexpr int k128 = kN / 128, r = kN % 128;
#pragma unroll
    for (int i = 0; i < k128; ++i) issue(wgmma::Mma<128, kBF16>(), i * 128);
    constexpr int c64 = k128 * 128, c32 = c64 + (r & 64), c16 = c32 + (r & 32), c8 = c16 + (r & 16);
    if constexpr ((r & 64) != 0) issue(wgmma::Mma<64, kBF16>(), c64);
    if constexpr ((r & 32) != 0) issue(wgmma::Mma<32, kBF16>(), c32);
    if constexpr ((r & 16) != 0) issue(wgmma::Mma<16, kBF16>(), c16);
    if constexpr ((r & 8) != 0) issue(wgmma::Mma<8, kBF16>(), c8);
}

// Keeps the compiler from touching accumulator or operand registers across the asynchronous wgmma window.
template <int kN>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(u32* r) {
#pragma unroll
    for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// One warpgroup's S(64 x kBlockN) = Q K^T: A = Q rows [q_row0, q_row0 + 64), B = K, both K-major. Issued and
// committed as one wgmma group; the caller fences before and waits after.
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[1][T::kBlockN / 8][4], u32 q_addr, int q_row0, u32 k_addr) {
    using LQ = TileLayout<T::kBlockM, T::kPadQK, T::kSwizzle>;
    using LK = TileLayout<T::kBlockN, T::kPadQK, T::kSwizzle>;
#pragma unroll
    for (int kk = 0; kk < T::kPadQK / 16; ++kk) {
        const wgmma::u64 a = LQ::k_major(q_addr, q_row0, kk);
        for_each_chunk<T::kBlockN, T::kBF16>([&](auto mma, int c0) {
            mma.ss(&s[0][c0 / 8][0], a, LK::k_major(k_addr, c0, kk), kk > 0);
        });
    }
    wgmma::commit();
}

// O(64 x kPadV) += P V: A = P from registers, B = V read transposed (N-major). One committed group.
template <class T>
__device__ __forceinline__ void issue_pv(float (&acc)[1][T::kPadV / 8][4], const u32 (&pa)[T::kBlockN / 16][4],
                                         u32 v_addr) {
    using LV = VLayout<T>;
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk) {
        if constexpr (T::kWideV) {
            // One instruction per k-step; widths other than 8/16/32/64/128 come from the rendered source.
            wgmma::Mma<T::kPadV, T::kBF16>::template rs<true>(&acc[0][0][0], pa[kk], LV::n_major(v_addr, kk), 1);
        } else {
            for_each_chunk<T::kPadV, T::kBF16>([&](auto mma, int c0) {
                mma.template rs<true>(&acc[0][c0 / 8][0], pa[kk], LV::n_major(v_addr, kk, c0), 1);
            });
        }
    }
    wgmma::commit();
}

// P (the softmaxed scores) as wgmma A fragments, 16 keys per k-step.
template <class T>
__device__ __forceinline__ void pack_p(const float (&s)[1][T::kBlockN / 8][4], u32 (&pa)[T::kBlockN / 16][4]) {
#pragma unroll
    for (int kk = 0; kk < T::kBlockN / 16; ++kk) detail::pack_p<T::kBF16>(s[0], kk, pa[kk]);
}

}  // namespace sm90

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
    const int seqlen_q = p.seqlen_q;
    const int seqlen_k = p.seqlen_k;
    const detail::CtaTile cta = detail::cta_tile<T::kCausal, T::kBlockM, T::kBlockN>(p);
    const int q0 = cta.q0, n_blocks = cta.n_blocks;
    const u16 *gQ = cta.q, *gK = cta.k, *gV = cta.v;

    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, LQ::offset);
#pragma unroll
    for (int st = 0; st < T::kStages; ++st) {
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK + st * S::kKElems, tid, LK::offset);
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sV + st * S::kVElems, tid, LV::offset);
    }

    auto load_kv = [&](int block, int slot) {
        const int k0 = block * T::kBlockN;
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
        const int n0 = j * T::kBlockN;

        float s[1][kNB][4];
        wgmma::fence();
        sm90::issue_qk<T>(s, q_addr, q_row0, k_addr);
        wgmma::wait<0>();
        sm90::fence_regs<kNB * 4>(&s[0][0][0]);

        if (detail::block_needs_mask<T::kCausal, T::kBlockM, T::kBlockN>(n0, q0, seqlen_q, seqlen_k))
            detail::mask_scores<T::kCausal>(s, n0, q0 + warp * 16, lane, seqlen_q, seqlen_k);
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
    detail::normalize_and_stage<T::kBF16, 1, kNV, S::kStrideV>(p, acc_o, row_max, row_sum, sQ, warp * 16, q0, lane);
    __syncthreads();
    detail::store_tile<T::kBlockM, T::kHeadDimV, T::kVecV, S::kStrideV, kThreads>(p, sQ, q0, tid);
}

}  // namespace rtattn
