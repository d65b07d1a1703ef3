// The grid-to-work map of the forward kernels: which (query block, head, sequence) a CTA owns and where its Q, K and
// V start in global memory.
#pragma once
#include "common/mask.cuh"
#include "common/params.h"
#include "common/seq.cuh"

namespace rtattn {
namespace detail {

// What one CTA works on: grid x = query block (the last one first when causal), y = query head, z = sequence. GQA:
// query head h reads kv head h / q_per_kv in place. Pointers are to the first element of this (sequence, head); gQ
// is already at row q0. Varlen: the grid covers the longest sequence, so a CTA past its sequence's end has nothing
// to do (q0 >= seqlen_q; the kernels return at once).
struct CtaTile {
    const u16* q;
    const u16* k;
    const u16* v;
    int q0;        // first query row of the block
    int n_first;   // the first key block it visits (0 but for a window)
    int n_blocks;  // how many it visits, from n_first (causal: none right of the diagonal)
    int seqlen_q, seqlen_k;  // this sequence's
    int k_begin;   // its first key row in packed K/V (varlen; 0 when dense): TMA coordinates count from there
    float alibi;   // kAlibi: the head's factor (alibi_factor)
};

// Which tile: query block `m_block` of query head `head` in sequence `batch`.
struct TileCoord {
    int m_block, head, batch;
};

// The tile of a CTA in a grid of (query block, head, sequence).
template <bool kCausal>
__device__ __forceinline__ TileCoord grid_tile() {
    return {kCausal ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
}

// The tile whose query block m_block() is (a callable, evaluated where the grid's x used to be read: the
// grid-launched kernels' code stays as it was).
template <class T, bool kPaged, class MBlock>
__device__ __forceinline__ CtaTile cta_tile_of(const FwdParams& p, int head, int batch, MBlock m_block) {
    constexpr bool kVarlen = T::kVarlen;
    constexpr int kBlockM = T::kBlockM;
    const int kv_head = head / p.q_per_kv;
    const Seq<kVarlen> s = seq_info<kVarlen, kPaged, kPaged || !kVarlen>(p, batch);  // fwd_seq_info's
    CtaTile t;
    t.q0 = m_block() * kBlockM;
    t.q = static_cast<const u16*>(p.q) + s.q_offset(p.q_batch_stride, p.q_seq_stride) + head * p.q_head_stride +
          (long long)t.q0 * p.q_seq_stride;
    // Paged: k and v are the KV head's start in page 0; rows come through the block table (paged_row).
    t.k = static_cast<const u16*>(p.k) + (kPaged ? 0 : s.k_offset(p.k_batch_stride, p.k_seq_stride)) +
          kv_head * p.k_head_stride;
    t.v = static_cast<const u16*>(p.v) + (kPaged ? 0 : s.k_offset(p.v_batch_stride, p.v_seq_stride)) +
          kv_head * p.v_head_stride;
    t.seqlen_q = s.seqlen_q, t.seqlen_k = s.seqlen_k, t.k_begin = s.k_begin;
    const auto mask = mask_of<T>(s.seqlen_q, s.seqlen_k, p);
    t.n_first = mask.first_kv_block(t.q0);
    t.n_blocks = mask.kv_blocks(t.q0) - t.n_first;
    t.alibi = alibi_factor<T::kAlibi>(p, batch, head);
    return t;
}

// A grid-launched CTA's tile: grid x = query block (the last one first when causal), y = query head, z = sequence.
template <class T, bool kPaged = false>
__device__ __forceinline__ CtaTile cta_tile(const FwdParams& p) {
    return cta_tile_of<T, kPaged>(p, blockIdx.y, blockIdx.z,
                                  [] { return T::kCausal ? gridDim.x - 1 - blockIdx.x : blockIdx.x; });
}

// A persistent CTA's tile (tile_coord).
template <class T, bool kPaged = false>
__device__ __forceinline__ CtaTile cta_tile(const FwdParams& p, TileCoord c) {
    return cta_tile_of<T, kPaged>(p, c.head, c.batch, [c] { return c.m_block; });
}

}  // namespace detail
}  // namespace rtattn
