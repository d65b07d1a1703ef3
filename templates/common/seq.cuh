// Where one sequence's rows are: in a dense batch, or packed with others of different lengths (varlen). The forward
// and backward kernels find their sequence through this alone, so varlen is one trait of each kernel, not a copy.
#pragma once
#include "common/params.h"

namespace rtattn {
namespace detail {

// Dense: sequence b is index b of [batch, seq, head, d] tensors, with seqlen_q / seqlen_k rows.
// Varlen: it is rows cu_seqlens[b] .. cu_seqlens[b+1] of [total, head, d] tensors (the batch stride is unused) and
// the LSE is [heads_q, total_q]. The offsets are clamped into 0..total and the lengths to the longest the call states
// (seqlen_q / seqlen_k, which size the grid and the backward's workspace), so a bad cu_seqlens or max_seqlen gives
// wrong or cut sequences but never an access outside the caller's tensors or the workspace, and never a wait on a
// key block the grid does not have (the host cannot read device offsets to check them).
template <bool kVarlen>
struct Seq {
    int batch;
    int q_begin, k_begin;  // the sequence's first row in the packed Q/O and K/V (0 when dense)
    int seqlen_q, seqlen_k;

    // Element offset of the sequence's first row in a Q/O-like or K/V-like tensor with these strides.
    __device__ __forceinline__ long long q_offset(long long batch_stride, long long seq_stride) const {
        return kVarlen ? (long long)q_begin * seq_stride : (long long)batch * batch_stride;
    }
    __device__ __forceinline__ long long k_offset(long long batch_stride, long long seq_stride) const {
        return kVarlen ? (long long)k_begin * seq_stride : (long long)batch * batch_stride;
    }
    // Index of (head, the sequence's row 0) in an LSE-shaped array.
    template <class P>
    __device__ __forceinline__ long long lse_index(const P& p, int head) const {
        return kVarlen ? (long long)head * p.total_q + q_begin : ((long long)batch * p.heads_q + head) * p.seqlen_q;
    }
};

// An int kept in shared memory and read at each use, for values a long loop needs now and then where holding them in
// registers would spill (the varlen backward's sequence offsets and lengths).
struct SharedInt {
    const volatile int* at;
    __device__ __forceinline__ operator int() const { return *at; }
};

__device__ __forceinline__ void clamped_range(const int* cu, int b, int total, int& begin, int& end) {
    end = min(max(cu[b + 1], 0), total);
    begin = min(max(cu[b], 0), end);
}

// A cache's keys for one sequence: `cached` (device-given, so clamped into 0..seqlen_k) and the call's `appended`
// ones after them, at most seqlen_k in all (the append kernel drops the rest).
__device__ __forceinline__ int cached_keys(int cached, int appended, int seqlen_k) {
    return min(min(max(cached, 0), seqlen_k) + appended, seqlen_k);
}

// kPaged (a paged KV cache, forward only): K/V rows are found through the block table (paged_row), so k_begin stays 0
// and cu_seqlens_k is not read.
// kCacheLens (forward kernels reading a cache: paged, or a dense batch): seqlens_k, when given, holds each sequence's
// cached keys, clamped to seqlen_k, plus the call's appended ones (seqlen_new, common/append.cuh), clamped again.
template <bool kVarlen, bool kPaged = false, bool kCacheLens = kPaged, class P>
__device__ __forceinline__ Seq<kVarlen> seq_info(const P& p, int batch) {
    Seq<kVarlen> s{batch, 0, 0, p.seqlen_q, p.seqlen_k};
    if constexpr (kVarlen) {
        int q_end, k_end;
        clamped_range(p.cu_seqlens_q, batch, p.total_q, s.q_begin, q_end);
        s.seqlen_q = min(q_end - s.q_begin, p.seqlen_q);
        if constexpr (!kPaged) {
            clamped_range(p.cu_seqlens_k, batch, p.total_k, s.k_begin, k_end);
            s.seqlen_k = min(k_end - s.k_begin, p.seqlen_k);
        }
    }
    if constexpr (kCacheLens) {
        if (p.seqlens_k != nullptr) s.seqlen_k = cached_keys(p.seqlens_k[batch], p.seqlen_new, p.seqlen_k);
    }
    return s;
}

// The sequence of a forward kernel's CTA: a varlen batch's offsets, or a cache's lengths (paged, or dense with
// seqlens_k).
template <class T, class P>
__device__ __forceinline__ Seq<T::kVarlen> fwd_seq_info(const P& p, int batch) {
    return seq_info<T::kVarlen, T::kPaged, T::kPaged || !T::kVarlen>(p, batch);
}

// A block table entry as a page of the cache: an entry outside 0..num_pages-1 (negative ones too, compared unsigned)
// reads as the last page, so a bad table gives wrong rows, never a read outside k_cache / v_cache.
__device__ __forceinline__ unsigned clamp_page(unsigned entry, int num_pages) {
    return min(entry, unsigned(num_pages - 1));
}

// The page holding key `key` of the sequence whose block table row is `table` (clamp_page).
__device__ __forceinline__ int page_of(const int* table, int key, int page_shift, int num_pages) {
    return int(clamp_page(unsigned(__ldg(table + (key >> page_shift))), num_pages));
}

// Key `key`'s row in a paged cache whose K (or V) head starts at `head`: its page, then its slot in the page.
__device__ __forceinline__ const unsigned short* paged_row(const unsigned short* head, const int* table, int page_shift,
                                                           int num_pages, long long page_stride, long long slot_stride,
                                                           int key) {
    const int page = page_of(table, key, page_shift, num_pages);
    return head + page * page_stride + (key & ((1 << page_shift) - 1)) * slot_stride;
}

}  // namespace detail
}  // namespace rtattn
