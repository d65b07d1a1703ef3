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

template <bool kStoredKM>
__device__ __forceinline__ void load_a(u32 (&a)[4], u32 base, int ld, int m0, int k0, int lane) {
    if constexpr (!kStoredKM)
        ptx::ldsm_x4(base + 2 * ((m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8), a[0], a[1], a[2], a[3]);
    else
        ptx::ldsm_x4_t(base + 2 * ((k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8), a[0],
                       a[1], a[2], a[3]);
}

template <bool kStoredKN>
__device__ __forceinline__ void load_b(u32 (&b)[4], u32 base, int ld, int n0, int k0, int lane) {
    if constexpr (!kStoredKN)
        ptx::ldsm_x4(base + 2 * ((n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8), b[0], b[1],
                     b[2], b[3]);
    else
        ptx::ldsm_x4_t(base + 2 * ((k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8), b[0], b[1], b[2], b[3]);
}

template <int kMI, int kNB>
__device__ __forceinline__ void zero(float (&c)[kMI][kNB][4]) {
#pragma unroll
    for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int b = 0; b < kNB; ++b)
#pragma unroll
            for (int e = 0; e < 4; ++e) c[i][b][e] = 0.f;
}

// C[16*kMI x 16*kNP] += A[m0.., 0..16*kKSteps] B[0..16*kKSteps, pairs]; `a`, `b`: shared addresses of element (0, 0).
// The k steps run four at a time in a rolled loop, the rest unrolled: a fully unrolled reduction over d = 256 lets
// ptxas hoist every step's fragments at once and spill next to dK/dV's accumulators (d256 64x64, d128 64x128).
template <bool kBF16, int kMI, int kNP, int kPairs, int kKSteps, bool kAStoredKM, bool kBStoredKN>
__device__ __forceinline__ void gemm(float (&c)[kMI][kNP * 2][4], u32 a, int lda, int m0, u32 b, int ldb,
                                     int first_pair, int pair_step, int lane) {
    auto step = [&](int kk) {
        u32 af[kMI][4];
#pragma unroll
        for (int i = 0; i < kMI; ++i) load_a<kAStoredKM>(af[i], a, lda, m0 + 16 * i, 16 * kk, lane);
#pragma unroll
        for (int j = 0; j < kNP; ++j) {
            const int pair = first_pair + j * pair_step;
            if (pair < kPairs) {
                u32 bf[4];
                load_b<kBStoredKN>(bf, b, ldb, 16 * pair, 16 * kk, lane);
#pragma unroll
                for (int i = 0; i < kMI; ++i) {
                    ptx::mma<kBF16>(c[i][2 * j], af[i], bf[0], bf[1]);
                    ptx::mma<kBF16>(c[i][2 * j + 1], af[i], bf[2], bf[3]);
                }
            }
        }
    };
    constexpr int kRolled = kKSteps / 4 * 4;
#pragma unroll 1
    for (int k0 = 0; k0 < kRolled; k0 += 4)
#pragma unroll
        for (int k1 = 0; k1 < 4; ++k1) step(k0 + k1);
#pragma unroll
    for (int kk = kRolled; kk < kKSteps; ++kk) step(kk);
}

}  // namespace warp
}  // namespace rtattn
