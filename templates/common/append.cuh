// KV append: a cache call's new tokens (FlashAttention's flash_attn_with_kvcache k= / v=) written into the cache at
// each sequence's length, launched on the caller's stream just before the attention kernel, which then counts them
// among the sequence's keys (FwdParams / DecParams seqlen_new). An entry of every forward module that reads a cache
// (not varlen). Apart from the attention kernel rather than fused into it: the new rows must be in the cache before
// any split of any CTA reads them, and a separate launch orders that for free; it moves a few KB per token.
#pragma once
#include "common/epilogue.cuh"  // VecOf
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/seq.cuh"

namespace rtattn {

constexpr int kAppendWarps = 8;  // rows per CTA: one warp per (sequence, new token, kv head)

namespace detail {

// One row of kDim 16-bit elements in vectors of kVec (the widest the checked pointers and strides allow).
template <int kDim, int kVec>
__device__ __forceinline__ void copy_row(ptx::u16* dst, const ptx::u16* src, int lane) {
    using V = typename VecOf<kVec>::type;
    for (int c = lane * kVec; c < kDim; c += 32 * kVec)
        *reinterpret_cast<V*>(dst + c) = *reinterpret_cast<const V*>(src + c);
}

}  // namespace detail

template <class T>
__device__ __forceinline__ void kv_append(const AppendParams& p) {
    using ptx::u16;
    const long long row = (long long)blockIdx.x * kAppendWarps + threadIdx.x / 32;
    if (row >= (long long)p.batch * p.seqlen_new * p.heads_kv) return;
    const int lane = threadIdx.x & 31;
    const int h = int(row % p.heads_kv), t = int(row / p.heads_kv % p.seqlen_new);
    const int b = int(row / p.heads_kv / p.seqlen_new);
    // The attention kernels' clamp of the cached length, so both agree on where the new keys are.
    const int pos = detail::cached_keys(p.seqlens_k[b], 0, p.seqlen_k) + t;
    if (pos >= p.seqlen_k) return;  // past the cache: dropped (the attention stops at seqlen_k too)
    long long kc, vc;
    if constexpr (T::kPaged) {
        // Unlike a read (which clamps a bad entry to the last page), a write there would land in another sequence's
        // rows: a bad entry writes nothing.
        const unsigned page = unsigned(__ldg(p.block_table + b * p.block_table_stride + (pos >> p.page_shift)));
        if (page >= unsigned(p.num_pages)) return;
        const int slot = pos & ((1 << p.page_shift) - 1);
        kc = page * p.kc_batch_stride + slot * p.kc_seq_stride;
        vc = page * p.vc_batch_stride + slot * p.vc_seq_stride;
    } else {
        kc = b * p.kc_batch_stride + pos * p.kc_seq_stride;
        vc = b * p.vc_batch_stride + pos * p.vc_seq_stride;
    }
    detail::copy_row<T::kHeadDimQK, T::kVecQK>(
        static_cast<u16*>(p.k_cache) + kc + h * p.kc_head_stride,
        static_cast<const u16*>(p.k_new) + b * p.kn_batch_stride + t * p.kn_seq_stride + h * p.kn_head_stride, lane);
    detail::copy_row<T::kHeadDimV, T::kVecV>(
        static_cast<u16*>(p.v_cache) + vc + h * p.vc_head_stride,
        static_cast<const u16*>(p.v_new) + b * p.vn_batch_stride + t * p.vn_seq_stride + h * p.vn_head_stride, lane);
}

}  // namespace rtattn
