// Which keys each query sees: one type, KeyMask, whose kind is a template parameter, so that every family asks its
// mask and none restates the rule (decode's rows are not consecutive queries: it keeps mask_columns, below, for now).
// For blocks of kBlockM queries (from q0 or m0) and kBlockN keys (from n0):
//
//   first_kv_block(q0), kv_blocks(q0)
//                             the key blocks [first, end) a query block visits (the forward's walk)
//   first_q_block(n0), q_block_end(n0, m_blocks)
//                             the query blocks [first, end) with a row that sees a key of the block (the backward's
//                             walk)
//   last_kv_block(m0, last)   the last key block a query block sees, `last` being the sequence's (the backward's
//                             deterministic turns)
//   edge(n0, m0)              whether the block meets the mask's edge (some of its queries do not see some of its keys)
//   needs_mask(n0, q0)        edge, or the block reaches past the last key
//   hides(q + shift(), key)   whether query q does not see the key (the edge only; shift() computed once a block)
//   first_hidden(row, col0)   the first key the row does not see (the key end included), counted from col0;
//   first_visible(row, col0)  a window's first key the row sees
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

// The kinds: none; causal (query i sees keys j <= i + seqlen_k - seqlen_q); a window (FlashAttention's local
// attention: i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, the bounds run-time values, held
// as 0 .. the sequence's size: the host writes an unbounded side as the longest sequence, which bounds nothing).
enum class MaskKind { none, causal, window };

// Int: how the sizes are held (int, or the backward's varlen SharedInt, read where used). Shaped so that the kernels
// compile as they did when each stated its rule inline (cubins byte-identical): what the backward compared inline
// is taken by reference (a compare against a function's own argument gets its operands swapped, and ptxas then
// allocated otherwise), and first_q_block divides before its test where the sizes are held, inside it where they
// are read.
template <MaskKind kKind, int kBlockM, int kBlockN, class Int = int>
struct KeyMask {
    static constexpr bool kCausal = kKind == MaskKind::causal;
    static constexpr bool kWindow = kKind == MaskKind::window;
    Int seqlen_q, seqlen_k;
    int left = 0, right = 0;  // the window's bounds (kWindow only)
    static constexpr bool kHeld = IsInt<Int>::value;  // the sizes in registers (else read from shared memory)
    // The sizes read once, for a loop that tests many elements.
    __device__ __forceinline__ KeyMask<kKind, kBlockM, kBlockN> held() const {
        return {seqlen_q, seqlen_k, left, right};
    }
    // The first key block a query block visits (0 but for a window's left bound).
    __device__ __forceinline__ int first_kv_block(int q0) const {
        if constexpr (kWindow) {
            const int first_visible = q0 + seqlen_k - seqlen_q - left;  // the first row's first key
            return first_visible < 0 ? 0 : first_visible / kBlockN;
        } else {
            return 0;
        }
    }
    // The end of the key blocks a query block visits (first_kv_block .. kv_blocks - 1; never below the first).
    __device__ __forceinline__ int kv_blocks(int q0) const {
        int n = (seqlen_k + kBlockN - 1) / kBlockN;
        if constexpr (kCausal || kWindow) {
            // the last key the block's last row may see
            const int last_visible = q0 + kBlockM - 1 + seqlen_k - seqlen_q + (kWindow ? right : 0);
            const int causal_blocks = last_visible < 0 ? 0 : last_visible / kBlockN + 1;
            n = causal_blocks < n ? causal_blocks : n;
        }
        if constexpr (kWindow) n = max(n, first_kv_block(q0));
        return n;
    }
    __device__ __forceinline__ int first_q_block(const int& n0) const {
        if constexpr (kWindow) {
            const int first = n0 - (seqlen_k - seqlen_q) - right;  // the first query whose window reaches the block
            return first > 0 ? first / kBlockM : 0;
        } else if constexpr (!kCausal) {
            return 0;
        } else if constexpr (kHeld) {
            const bool past = n0 > seqlen_k - seqlen_q;  // the key block starts past the first query's diagonal
            const int block = (n0 - (seqlen_k - seqlen_q)) / kBlockM;
            return past ? block : 0;
        } else {
            return n0 > seqlen_k - seqlen_q ? (n0 - (seqlen_k - seqlen_q)) / kBlockM : 0;  // read again where needed
        }
    }
    // The end of the query blocks a key block is seen from, of the sequence's m_blocks (never below the first).
    __device__ __forceinline__ int q_block_end(const int& n0, const int& m_blocks) const {
        if constexpr (kWindow) {
            const int last = n0 + kBlockN - 1 - (seqlen_k - seqlen_q) + left;  // the last query whose window reaches it
            const int end = last < 0 ? 0 : min(m_blocks, last / kBlockM + 1);
            return max(end, first_q_block(n0));
        } else {
            return m_blocks;
        }
    }
    __device__ __forceinline__ int last_kv_block(const int& m0, const int& last) const {
        if constexpr (kWindow) return min(last, (m0 + kBlockM - 1 + seqlen_k - seqlen_q + right) / kBlockN);
        return kCausal ? min(last, (m0 + kBlockM - 1 + seqlen_k - seqlen_q) / kBlockN) : last;
    }
    __device__ __forceinline__ bool edge(const int& n0, const int& m0) const {
        if constexpr (kWindow)
            return n0 + kBlockN - 1 > m0 + seqlen_k - seqlen_q + right ||  // the right bound crosses the block
                   n0 < m0 + kBlockM - 1 + seqlen_k - seqlen_q - left;      // the left bound does
        return kCausal && n0 + kBlockN - 1 > m0 + seqlen_k - seqlen_q;
    }
    __device__ __forceinline__ bool needs_mask(int n0, int q0) const {
        bool need = n0 + kBlockN > seqlen_k;
        if constexpr (kCausal) need = need || (n0 + kBlockN - 1 > q0 + seqlen_k - seqlen_q);
        if constexpr (kWindow) need = need || edge(n0, q0);
        return need;
    }
    // The diagonal's offset (query q's diagonal key is q + shift()), computed once where a loop tests many elements;
    // hides takes the query's diagonal (q + shift(), formed by the caller: a sum formed in here, ptxas allocated the
    // backward's element loop differently and spilled 4 bytes at d128).
    __device__ __forceinline__ int shift() const { return seqlen_k - seqlen_q; }
    __device__ __forceinline__ bool hides(int diagonal, int key) const {
        // One compare: key - diagonal in [-left, right] (both 0 or more).
        if constexpr (kWindow) return unsigned(key - diagonal + left) > unsigned(left + right);
        return kCausal && key > diagonal;
    }
    // The row's first hidden key (the key end included) and, for a window, its first visible one, from col0.
    __device__ __forceinline__ int first_hidden(int row, int col0) const {
        int first_hidden = seqlen_k - col0;
        if constexpr (kCausal || kWindow)
            first_hidden = min(first_hidden, row + seqlen_k - seqlen_q + 1 - col0 + (kWindow ? right : 0));
        return first_hidden;
    }
    __device__ __forceinline__ int first_visible(int row, int col0) const {
        return kWindow ? row + seqlen_k - seqlen_q - left - col0 : 0;
    }
};

// A kernel's mask (its traits' kind and blocks) for a sequence's sizes; p: the launch's parameters (a window's
// bounds).
template <class T>
constexpr MaskKind mask_kind() {
    return T::kLocal ? MaskKind::window : T::kCausal ? MaskKind::causal : MaskKind::none;
}
template <class T, class Int, class P>
__device__ __forceinline__ KeyMask<mask_kind<T>(), T::kBlockM, T::kBlockN, Int> mask_of(Int seqlen_q, Int seqlen_k,
                                                                                       const P& p) {
    // A causal window's right bound is 0 (the host writes it so): a constant here, which the compiler folds.
    if constexpr (T::kLocal) return {seqlen_q, seqlen_k, p.window_left, T::kCausal ? 0 : p.window_right};
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
            const int row = row0 + mt * 16 + (lane >> 2) + h * 8;
            const int first_hidden = held.first_hidden(row, col0);
            const int first_visible = held.first_visible(row, col0);
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (nb * 8 + e >= first_hidden || (Mask::kWindow && nb * 8 + e < first_visible))
                        s[mt][nb][2 * h + e] = neg_inf();
        }
}

// The ALiBi bias on one thread's fragment: element e of column block nb of row (mt, h) loses
// factor(mt, h) * |at(mt, h) + 8 * nb + e|, at(mt, h) being the row's distance (in column steps) to this lane's first
// column. Per element, one add of a constant and one FMA.
template <int kMT, int kNB, class Factor, class At>
__device__ __forceinline__ void subtract_distance(float (&s)[kMT][kNB][4], Factor factor, At at) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float f = factor(mt, h), base = at(mt, h);
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e) s[mt][nb][2 * h + e] -= f * fabsf(base + float(nb * 8 + e));
        }
}

// ALiBi (kOn: the traits' kAlibi) in the forward's blocks: the score of query row r and key c loses
// factor * |c - (r + shift)| (FlashAttention's alibi_slopes rule, bottom-right aligned: shift = seqlen_k - seqlen_q),
// factor = the head's slope over the softmax's scale, in the units the scores have here (raw, or capped). Before the
// mask, on every block; one per warp, whose rows are row0 .. row0 + 16 kMT - 1 and whose fragment spans the block's
// keys n0 .. n0 + 8 kNB - 1.
// A block wholly left of every row's diagonal (or wholly right) has the bias linear in the key: there a row's scores
// may carry a constant of its own, factor * (r - row0) (its negative right of the diagonal), which the softmax cannot
// see, so each score takes one add of its column's term factor * (c - row0 - shift), formed once per column for all
// the thread's rows, instead of an add and an FMA. The row maxima follow the block's constant (one FMA a row when it
// changes, so O and the sums stay exact); settle() takes it out before the LSE and the sinks.
template <bool kOn, int kMT>
struct AlibiRows {
    float factor;
    int side = 0;  // the constant the row maxima carry now: +1 left of the diagonal, -1 right of it, 0 none

    __device__ __forceinline__ explicit AlibiRows(float f) : factor(f) {}

    template <int kNB>
    __device__ __forceinline__ void apply(float (&s)[kMT][kNB][4], float (&row_max)[kMT][2], int n0, int row0,
                                          int lane, int shift) {
        if constexpr (kOn) {
            const int diag0 = row0 + shift;
            const int next = n0 + 8 * kNB - 1 <= diag0 ? 1 : n0 >= diag0 + 16 * kMT - 1 ? -1 : 0;
            if (next != side) move_maxima(row_max, next - side, lane);
            side = next;
            if (next == 0) {
                subtract_distance(s, [=](int, int) { return factor; }, [=](int mt, int h) {
                    return float(n0 + 2 * (lane & 3) - diag0 - (mt * 16 + (lane >> 2) + h * 8));
                });
                return;
            }
            const float f = next * factor, base = f * float(n0 + 2 * (lane & 3) - diag0);
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float col = fmaf(f, float(nb * 8 + e), base);
#pragma unroll
                    for (int mt = 0; mt < kMT; ++mt) s[mt][nb][e] += col, s[mt][nb][2 + e] += col;
                }
        }
    }
    // After the last block: the row maxima back in the scores' own units.
    __device__ __forceinline__ void settle(float (&row_max)[kMT][2], int lane) {
        if constexpr (kOn)
            if (side != 0) move_maxima(row_max, -side, lane), side = 0;
    }

  private:
    __device__ __forceinline__ void move_maxima(float (&row_max)[kMT][2], int by, int lane) const {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                row_max[mt][h] = fmaf(by * factor, float(mt * 16 + (lane >> 2) + h * 8), row_max[mt][h]);
    }
};
// The factor of a (sequence, query head): its slope (alibi_slopes[batch * alibi_batch_stride + head]) over the
// softmax's scale (p.alibi_scale); 0 without ALiBi.
template <bool kOn, class P>
__device__ __forceinline__ float alibi_factor(const P& p, int batch, int head) {
    if constexpr (kOn) return p.alibi_slopes[(long long)batch * p.alibi_batch_stride + head] * p.alibi_scale;
    return 0.f;
}

// Decode's mask (rows are not consecutive queries there): sets to -inf the scores at or past each row's first hidden key. col0: the key of this lane's first column;
// visible(mt, h): the keys this lane's row (tile mt, half h) sees are those below it; with kFloor (a window), also
// at or past from(mt, h). Every element then compares a constant (8 * nb + e) against one register per row, instead
// of rebuilding its row and column.
template <bool kFloor = false, int kMT, int kNB, class Visible, class From = int>
__device__ __forceinline__ void mask_columns(float (&s)[kMT][kNB][4], int col0, Visible visible, From from = 0) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int first_hidden = visible(mt, h) - col0;
            int first_visible = 0;
            if constexpr (kFloor) first_visible = from(mt, h) - col0;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (nb * 8 + e >= first_hidden || (kFloor && nb * 8 + e < first_visible))
                        s[mt][nb][2 * h + e] = neg_inf();
        }
}

}  // namespace detail
}  // namespace rtattn
