// Warpgroup MMAs over the tile layouts: a GEMM with both operands in shared memory or A in registers, issued in
// column chunks as wide as wgmma allows; the forward pass's two (QK^T with Q and K from shared memory, PV with P
// from registers and V read transposed) in those terms.
#pragma once
#include "common/geometry.h"
#include "common/softmax.cuh"
#include "common/wgmma.cuh"
#include "sm90/tile_layout.cuh"

namespace rtattn {
namespace detail {
template <int N>
struct IntC {  // a width as a type, for a generic lambda's compile-time use
    static constexpr int value = N;
};
}  // namespace detail

namespace sm90 {

using detail::u16;
using detail::u32;

// Issues D(64 x kN) (+)= A * B as column chunks of width 128, then at most one each of 64, 32, 16, 8: wgmma's N is
// part of the instruction, and wide chunks re-read A least. kWhole: one instruction of width kN (B in whole 64-column
// panels, which one descriptor spans; the width's wrapper comes from the rendered source).
template <int kN, bool kBF16, bool kWhole = false, class Issue>
__device__ __forceinline__ void for_each_chunk(Issue issue) {
    if constexpr (kWhole) {
        issue(wgmma::Mma<kN, kBF16>(), 0);
    } else {
        // The renderer writes wrappers for exactly these widths (geometry::has_chunk), so only they are instantiated.
        constexpr int k128 = kN / 128, r = kN % 128;
        if constexpr (geometry::has_chunk(kN, 128)) {
#pragma unroll
            for (int i = 0; i < k128; ++i) issue(wgmma::Mma<128, kBF16>(), i * 128);
        }
        constexpr int c64 = k128 * 128, c32 = c64 + (r & 64), c16 = c32 + (r & 32), c8 = c16 + (r & 16);
        if constexpr (geometry::has_chunk(kN, 64)) issue(wgmma::Mma<64, kBF16>(), c64);
        if constexpr (geometry::has_chunk(kN, 32)) issue(wgmma::Mma<32, kBF16>(), c32);
        if constexpr (geometry::has_chunk(kN, 16)) issue(wgmma::Mma<16, kBF16>(), c16);
        if constexpr (geometry::has_chunk(kN, 8)) issue(wgmma::Mma<8, kBF16>(), c8);
    }
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

// D(64 x kN) (+)= A B over kSteps k-steps of 16, A and B from shared memory: a(kk) is A's descriptor for k-step kk,
// b(kk, c0) B's for the chunk of columns from c0. kTransA / kTransB: an M- / N-major operand, read transposed. The
// first k-step overwrites D unless kAccumulate; kWhole as for_each_chunk. Not committed: the caller fences, commits
// and waits.
template <int kN, int kSteps, bool kBF16, bool kTransA, bool kTransB, bool kAccumulate, bool kWhole = false, class A,
          class B>
__device__ __forceinline__ void gemm_ss(float (&d)[kN / 8][4], A a, B b) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
        const wgmma::u64 ad = a(kk);
        for_each_chunk<kN, kBF16, kWhole>([&](auto mma, int c0) {
            mma.template ss<kTransA, kTransB>(&d[c0 / 8][0], ad, b(kk, c0), kAccumulate || kk > 0);
        });
    }
}

// D(64 x kN) += A B with A from registers (k-step kk's m16k16 fragment of each warp, as mma.sync's A) and B from
// shared memory as in gemm_ss.
template <int kN, int kSteps, bool kBF16, bool kTransB, bool kWhole = false, class B>
__device__ __forceinline__ void gemm_rs(float (&d)[kN / 8][4], const u32 (&a)[kSteps][4], B b) {
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk)
        for_each_chunk<kN, kBF16, kWhole>([&](auto mma, int c0) {
            mma.template rs<kTransB>(&d[c0 / 8][0], a[kk], b(kk, c0), 1);
        });
}

// One warpgroup's S(64 x kBlockN) = Q K^T: A = Q rows [q_row0, q_row0 + 64), B = K, both K-major. Issued and
// committed as one wgmma group; the caller fences before and waits after. (Q is always read through a descriptor:
// a variant with Q in registers gave wrong results on an H200 for some shapes, d64 with 64-key tiles and d128 with
// 128-key tiles, and was removed.)
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[1][T::kBlockN / 8][4], u32 q_addr, int q_row0, u32 k_addr) {
    using LQ = TileLayout<T::kBlockM, T::kPadQK, T::kSwizzle>;
    using LK = TileLayout<T::kBlockN, T::kPadQK, T::kSwizzle>;
    gemm_ss<T::kBlockN, T::kPadQK / 16, T::kBF16, false, false, false>(
        s[0], [&](int kk) { return LQ::k_major(q_addr, q_row0, kk); },
        [&](int kk, int c0) { return LK::k_major(k_addr, c0, kk); });
    wgmma::commit();
}

// O(64 x kPadV) += P V: A = P from registers, B = V read transposed (N-major). One committed group.
template <class T>
__device__ __forceinline__ void issue_pv(float (&acc)[1][T::kPadV / 8][4], const u32 (&pa)[T::kBlockN / 16][4],
                                         u32 v_addr) {
    using LV = VLayout<T>;
    if constexpr (T::kWideV) {
        // One instruction per k-step; widths other than 8/16/32/64/128 come from the rendered source.
#pragma unroll
        for (int kk = 0; kk < T::kBlockN / 16; ++kk)
            wgmma::Mma<T::kPadV, T::kBF16>::template rs<true>(&acc[0][0][0], pa[kk], LV::n_major(v_addr, kk), 1);
    } else {
        gemm_rs<T::kPadV, T::kBlockN / 16, T::kBF16, true>(acc[0], pa,
                                                           [&](int kk, int c0) { return LV::n_major(v_addr, kk, c0); });
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
}  // namespace rtattn
