// One warp's share of C += A B on mma.m16n8k16 with both operands in shared memory (16-bit, padded rows) and C held
// in registers as kMI blocks of 16 rows x kNP pairs of 8-wide column blocks. The warp's column pairs are strided, pair j
// at `first_pair + j * pair_step`, and a pair at or past kPairs is skipped: a padded head dim whose 16-column pairs do
// not split evenly across warps still gives every warp a fixed-size fragment.
//
// ldmatrix lane addressing (fragment layouts of mma.m16n8k16), elements (row, column) of the stored tile:
//   A (m x k) stored [m][k]:  .x4        row m0 + lane%16,               column k0 + 8*(lane/16)
//   A (m x k) stored [k][m]:  .x4.trans  row k0 + lane%8 + 8*(lane/16),  column m0 + 8*((lane/8)%2)
//   B (k x n) stored [n][k]:  .x4        row n0 + lane%8 + 8*(lane/16),  column k0 + 8*((lane/8)%2)
//   B (k x n) stored [k][n]:  .x4.trans  row k0 + lane%16,               column n0 + 8*(lane/16)
// Each B load gives two 8-wide column blocks: registers 0, 1 the first, 2, 3 the second.
// C fragment c[i][b][e]: row 16*i + lane/4 + 8*(e/2), column 8*b (within the pair list) + 2*(lane%4) + e%2.
#pragma once
#include "common/ptx.cuh"

namespace rtattn {
namespace warp {

using ptx::u32;

// Byte offset of this lane's ldmatrix row start inside a 16x16 block of a tile with rows of `ld` elements: pattern
// 0 is (row lane%16, column 8*(lane/16)) -- A stored [m][k], B stored [k][n] --, pattern 1 is
// (row lane%8 + 8*(lane/16), column 8*((lane/8)%2)) -- A stored [k][m], B stored [n][k].
template <bool kPattern1>
__device__ __forceinline__ u32 lane_offset(int ld, int lane) {
    if constexpr (!kPattern1) return 2 * ((lane & 15) * ld + (lane >> 4) * 8);
    else return 2 * (((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8);
}

// Byte offset of the 16x16 block at (row r, column c) of the stored tile.
__device__ __forceinline__ u32 block_offset(int ld, int r, int c) { return 2 * (r * ld + c); }

template <int kMI, int kNB>
__device__ __forceinline__ void zero(float (&c)[kMI][kNB][4]) {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int b = 0; b < kNB; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[i][b][e] = 0.f;
}

template <bool kValue>
struct FirstStep {
    static constexpr bool value = kValue;
};

// C[16*kMI x 16*kNP] += A[m0.., 0..16*kKSteps] B[0..16*kKSteps, pairs] (kSet: C = A B, C's old value unread);
// `a`, `b`: shared addresses of element (0, 0). The k steps run four at a time in a rolled loop, the rest unrolled: a
// fully unrolled reduction over d = 256 lets ptxas hoist every step's fragments at once and spill next to dK/dV's
// accumulators (d256 64x64, d128 64x128). kSet's first step is peeled: its MMAs take C from the zero register.
template <bool kBF16, int kMI, int kNP, int kPairs, int kKSteps, bool kAStoredKM, bool kBStoredKN, bool kSet = false>
__device__ __forceinline__ void gemm(float (&c)[kMI][kNP * 2][4], u32 a, int lda, int m0, u32 b, int ldb,
                                     int first_pair, int pair_step, int lane) {
    // Each lane's addresses are worked out once; inside the loop every ldmatrix is a base plus a constant (A block i
    // at rows/columns m0 + 16i, B pair j at columns 16 * (first_pair + j * pair_step), k step kk at 16kk).
    const u32 a_lane = a + lane_offset<kAStoredKM>(lda, lane) + (kAStoredKM ? block_offset(lda, 0, m0)
                                                                             : block_offset(lda, m0, 0));
    const u32 b_lane = b + lane_offset<!kBStoredKN>(ldb, lane) + (kBStoredKN ? block_offset(ldb, 0, 16 * first_pair)
                                                                              : block_offset(ldb, 16 * first_pair, 0));
    auto step = [&](int kk, auto first) {
        u32 af[kMI][4];
#pragma unroll
        for (int i = 0; i < kMI; ++i) {
            const u32 at = a_lane + (kAStoredKM ? block_offset(lda, 16 * kk, 16 * i) : block_offset(lda, 16 * i, 16 * kk));
            if constexpr (kAStoredKM)
                ptx::ldsm_x4_t(at, af[i][0], af[i][1], af[i][2], af[i][3]);
            else
                ptx::ldsm_x4(at, af[i][0], af[i][1], af[i][2], af[i][3]);
        }
#pragma unroll
        for (int j = 0; j < kNP; ++j) {
            if (first_pair + j * pair_step < kPairs) {
                const int n = 16 * j * pair_step;
                const u32 at = b_lane + (kBStoredKN ? block_offset(ldb, 16 * kk, n) : block_offset(ldb, n, 16 * kk));
                u32 bf[4];
                if constexpr (kBStoredKN)
                    ptx::ldsm_x4_t(at, bf[0], bf[1], bf[2], bf[3]);
                else
                    ptx::ldsm_x4(at, bf[0], bf[1], bf[2], bf[3]);
#pragma unroll
                for (int i = 0; i < kMI; ++i) {
                    if constexpr (decltype(first)::value) {
                        ptx::mma_first<kBF16>(c[i][2 * j], af[i], bf[0], bf[1]);
                        ptx::mma_first<kBF16>(c[i][2 * j + 1], af[i], bf[2], bf[3]);
                    } else {
                        ptx::mma<kBF16>(c[i][2 * j], af[i], bf[0], bf[1]);
                        ptx::mma<kBF16>(c[i][2 * j + 1], af[i], bf[2], bf[3]);
                    }
                }
            }  // a skipped pair's C is left as it was: callers skip that pair too
        }
    };
    constexpr int kFirst = kSet ? 1 : 0;
    if constexpr (kSet) step(0, FirstStep<true>{});
    constexpr int kRolled = (kKSteps - kFirst) / 4 * 4;
#pragma unroll 1
    for (int k0 = kFirst; k0 < kFirst + kRolled; k0 += 4)
#pragma unroll
        for (int k1 = 0; k1 < 4; ++k1) step(k0 + k1, FirstStep<false>{});
#pragma unroll
    for (int kk = kFirst + kRolled; kk < kKSteps; ++kk) step(kk, FirstStep<false>{});
}

}  // namespace warp
}  // namespace rtattn
