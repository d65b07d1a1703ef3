// Which keys a query block sees: the key-block range of a CTA and the masks of the blocks that straddle the
// sequence end or the causal diagonal. Causal alignment is bottom-right throughout.
#pragma once
#include "common/softmax.cuh"

namespace rtattn {
namespace detail {

// Causal alignment is bottom-right: query i sees keys j <= i + (seqlen_k - seqlen_q), as FlashAttention 2.1+.
template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ int kv_block_count(int q0, int seqlen_q, int seqlen_k) {
    int n = (seqlen_k + kBlockN - 1) / kBlockN;
    if constexpr (kCausal) {
        const int last_visible = q0 + kBlockM - 1 + seqlen_k - seqlen_q;  // last key the block's last row may see
        const int causal_blocks = last_visible < 0 ? 0 : last_visible / kBlockN + 1;
        n = causal_blocks < n ? causal_blocks : n;
    }
    return n;
}

// Masks the key tail and, when causal, keys right of the diagonal; only called for blocks that need it.
// row0: the query row of this warp's first 16-row tile.
template <bool kCausal, int kMT, int kNB>
__device__ __forceinline__ void mask_scores(float (&s)[kMT][kNB][4], int n0, int row0, int lane, int seqlen_q,
                                            int seqlen_k) {
    // Per row, the first hidden column counted from this lane's first column (col0): every element then compares a
    // constant (8 * nb + e) against one register, instead of rebuilding its row and column.
    const int col0 = n0 + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int first_hidden = seqlen_k - col0;
            if constexpr (kCausal) {
                const int row = row0 + mt * 16 + (lane >> 2) + h * 8;
                first_hidden = min(first_hidden, row + seqlen_k - seqlen_q + 1 - col0);
            }
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (nb * 8 + e >= first_hidden) s[mt][nb][2 * h + e] = neg_inf();
        }
}

// Decode's mask (rows are not consecutive queries there): sets to -inf the scores at or past each row's first hidden key. col0: the key of this lane's first column;
// visible(mt, h): the keys this lane's row (tile mt, half h) sees are those below it. Every element then compares a
// constant (8 * nb + e) against one register per row, instead of rebuilding its row and column.
template <int kMT, int kNB, class Visible>
__device__ __forceinline__ void mask_columns(float (&s)[kMT][kNB][4], int col0, Visible visible) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int first_hidden = visible(mt, h) - col0;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (nb * 8 + e >= first_hidden) s[mt][nb][2 * h + e] = neg_inf();
        }
}

template <bool kCausal, int kBlockM, int kBlockN>
__device__ __forceinline__ bool block_needs_mask(int n0, int q0, int seqlen_q, int seqlen_k) {
    bool need = n0 + kBlockN > seqlen_k;
    if constexpr (kCausal) need = need || (n0 + kBlockN - 1 > q0 + seqlen_k - seqlen_q);
    return need;
}

}  // namespace detail
}  // namespace rtattn
