// Which keys each query sees: one type, KeyMask, whose kind is a template parameter, so that every family asks its
// mask and none restates the rule (decode's rows are not consecutive queries: it keeps mask_columns, below, for now).
// For blocks of kBlockM queries (from q0 or m0) and kBlockN keys (from n0):
//
//   kv_blocks(q0)             the key blocks [0, n) a query block visits (the forward's walk)
//   first_q_block(n0)         the first query block with a row that sees a key of the block (the backward's walk)
//   last_kv_block(m0, last)   the last key block a query block sees, `last` being the sequence's (the backward's
//                             deterministic turns)
//   edge(n0, m0)              whether the block meets the mask's edge (some of its queries do not see some of its keys)
//   needs_mask(n0, q0)        edge, or the block reaches past the last key
//   hides(q + shift(), key)   whether query q does not see the key (the edge only; shift() computed once a block)
//   first_hidden(row, col0)   the first key the row does not see (the key end included), counted from col0
//
// Alignment is bottom-right throughout: query i's diagonal is key i + seqlen_k - seqlen_q (FlashAttention 2.1+).
// apply_mask sets the hidden scores of a block's fragments to -inf.
#pragma once
#include "common/softmax.cuh"

namespace rtattn {
namespace detail {

template <class Int>
struct IsInt {
    static constexpr bool value = false;
};
template <>
struct IsInt<int> {
    static constexpr bool value = true;
};

// The kinds so far: none and causal (query i sees keys j <= i + seqlen_k - seqlen_q). Int: how the sizes are held
// (int, or the backward's varlen SharedInt, read where used). Shaped so that the kernels compile as they did when
// each stated its rule inline (cubins byte-identical): what the backward compared inline is taken by reference (a
// compare against a function's own argument gets its operands swapped, and ptxas then allocated otherwise), and
// first_q_block divides before its test where the sizes are held, inside it where they are read.
template <bool kCausal, int kBlockM, int kBlockN, class Int = int>
struct KeyMask {
    Int seqlen_q, seqlen_k;
    static constexpr bool kHeld = IsInt<Int>::value;  // the sizes in registers (else read from shared memory)
    // The sizes read once, for a loop that tests many elements.
    __device__ __forceinline__ KeyMask<kCausal, kBlockM, kBlockN> held() const { return {seqlen_q, seqlen_k}; }
    __device__ __forceinline__ int kv_blocks(int q0) const {
        int n = (seqlen_k + kBlockN - 1) / kBlockN;
        if constexpr (kCausal) {
            const int last_visible = q0 + kBlockM - 1 + seqlen_k - seqlen_q;  // last key the block's last row may see
            const int causal_blocks = last_visible < 0 ? 0 : last_visible / kBlockN + 1;
            n = causal_blocks < n ? causal_blocks : n;
        }
        return n;
    }
    __device__ __forceinline__ int first_q_block(const int& n0) const {
        if constexpr (!kCausal) {
            return 0;
        } else if constexpr (kHeld) {
            const bool past = n0 > seqlen_k - seqlen_q;  // the key block starts past the first query's diagonal
            const int block = (n0 - (seqlen_k - seqlen_q)) / kBlockM;
            return past ? block : 0;
        } else {
            return n0 > seqlen_k - seqlen_q ? (n0 - (seqlen_k - seqlen_q)) / kBlockM : 0;  // read again where needed
        }
    }
    __device__ __forceinline__ int last_kv_block(const int& m0, const int& last) const {
        return kCausal ? min(last, (m0 + kBlockM - 1 + seqlen_k - seqlen_q) / kBlockN) : last;
    }
    __device__ __forceinline__ bool edge(const int& n0, const int& m0) const {
        return kCausal && n0 + kBlockN - 1 > m0 + seqlen_k - seqlen_q;
    }
    __device__ __forceinline__ bool needs_mask(int n0, int q0) const {
        bool need = n0 + kBlockN > seqlen_k;
        if constexpr (kCausal) need = need || (n0 + kBlockN - 1 > q0 + seqlen_k - seqlen_q);
        return need;
    }
    // The diagonal's offset (query q's diagonal key is q + shift()), computed once where a loop tests many elements;
    // hides takes the query's diagonal (q + shift(), formed by the caller: a sum formed in here, ptxas allocated the
    // backward's element loop differently and spilled 4 bytes at d128).
    __device__ __forceinline__ int shift() const { return seqlen_k - seqlen_q; }
    __device__ __forceinline__ bool hides(int diagonal, int key) const { return kCausal && key > diagonal; }
    __device__ __forceinline__ int first_hidden(int row, int col0) const {
        int first_hidden = seqlen_k - col0;
        if constexpr (kCausal) first_hidden = min(first_hidden, row + seqlen_k - seqlen_q + 1 - col0);
        return first_hidden;
    }
};

// A kernel's mask (its traits' kind and blocks) for a sequence's sizes.
template <class T, class Int>
__device__ __forceinline__ KeyMask<T::kCausal, T::kBlockM, T::kBlockN, Int> mask_of(Int seqlen_q, Int seqlen_k) {
    return {seqlen_q, seqlen_k};
}

// Sets to -inf the scores a block's fragments hold past each row's first hidden key; only called for blocks that
// need it. row0: the query row of this warp's first 16-row tile. Per row, the first hidden column counted from this
// lane's first column (col0): every element then compares a constant (8 * nb + e) against one register, instead of
// rebuilding its row and column.
template <class Mask, int kMT, int kNB>
__device__ __forceinline__ void apply_mask(const Mask& mask, float (&s)[kMT][kNB][4], int n0, int row0, int lane) {
    const auto held = mask.held();
    const int col0 = n0 + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int first_hidden = held.first_hidden(row0 + mt * 16 + (lane >> 2) + h * 8, col0);
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

}  // namespace detail
}  // namespace rtattn
