// The argument checks the families' validate_args are built from: a tensor against the kernel's vector width, a
// call's sizes, varlen packing, the query side every forward shares, a KV cache (dense or paged) and a workspace.
// Each throws ArgumentError naming the field and what is allowed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "plan/plan.hpp"
#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::kernels {

// Query tokens per sequence a decode call takes.
inline constexpr int kDecodeMaxSeqlenQ = 16;
// Sequences up to 2^30 rows: a row count plus a tile stays inside int32 (the kernels' row arithmetic) and the grid's
// x. The batch is the grid's z (at most 65535).
inline constexpr int kMaxSeqlen = 1 << 30;
inline constexpr int kMaxBatch = 65535;
// Tokens per page of a paged cache: any power of two up to this. The kernels find a key's page and slot with a shift
// and a mask (pages of any size cost the same); past 64k tokens a page is a whole sequence (a dense cache).
inline constexpr int kMaxPageSize = 1 << 16;
// 2^62 bytes of 2-byte elements: past any address space, and twice it still fits an int64.
inline constexpr std::int64_t kMaxTensorElements = std::int64_t(1) << 61;

// One [batch, seq, head, dim] tensor argument: non-null, aligned to the kernel's vector width, strides >= 0 and
// multiples of it, its last element an address; an output's elements must not overlap. Names "<name>.<field>".
void check_tensor(const char* name, const TensorArg& t, int vec, bool is_output, int batch, int seqlen, int heads,
                  int dim);
// batch 1..kMaxBatch, both sequence lengths 1..kMaxSeqlen.
void check_sizes(int batch, int seqlen_q, int seqlen_k);
// A prefill call's split count: 0 or 1 ("no split", as FlashAttention's callers pass it to every kernel).
void check_no_splits(int num_splits);

// Where a call's sequences are: FlashAttention's varlen fields of ForwardArgs / BackwardArgs.
struct Packing {
    const std::int32_t* cu_seqlens_q;
    const std::int32_t* cu_seqlens_k;
    int total_q, total_k;
};
// The row extents the tensor checks use: [batch, seqlen_q / seqlen_k] dense, [1, total_q / total_k] packed.
struct Rows {
    int batch, q, k;
};
// Dense configs: none of the varlen fields may be set. Varlen: offsets non-null and aligned, totals >= 1 and at
// least the longest sequence, every tensor's batch_stride 0 (tensors: name and argument). paged: the keys come from a
// paged cache, so cu_seqlens_k and total_k must be unset (only the queries are packed).
Rows check_packing(bool varlen, bool paged, const Packing& s, int batch, int seqlen_q, int seqlen_k,
                   std::initializer_list<std::pair<const char*, const TensorArg*>> tensors);

// What every forward call is checked for alike: its packing (K/V packed too unless the plan reads a paged cache),
// q, o and lse. Returns the rows.
Rows check_forward_queries(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a);
// A prefill's dense K/V, and the serving fields refused (set, a prefill kernel would ignore them).
void check_prefill_kv(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a, const Rows& rows);
// A call's KV append (k_new / v_new, seqlen_new): none (seqlen_new 0, no tensors), or a cache call's (not varlen)
// with seqlens_k and the new tokens' tensors [batch, seqlen_new, heads_kv, d].
void check_append(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a);
// The KV cache of a decode or paged call: dense, or paged through a block table that covers seqlen_k.
void check_cache(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a);
// A call's window bounds (window_size_left / right: -1 unbounded, else 0 or more; FlashAttention's convention): only
// a local kernel takes any but (-1, -1), and a causal one no right bound past 0.
void check_window(const AttentionConfig& c, int left, int right);
// A call's sinks (and the backward's dsinks, null for a forward): a sinks kernel needs sinks (float32, 4-byte
// aligned; dsinks optional), any other takes neither.
void check_sinks(const AttentionConfig& c, const float* sinks, const float* dsinks = nullptr);
// A call's softcap: a softcap kernel needs a finite cap > 0, any other takes 0.
void check_softcap(const AttentionConfig& c, float softcap);
// A call's ALiBi slopes: an alibi kernel needs them (float32, 4-byte aligned; batch stride 0 or at least heads_q, and
// batch rows of it addressable), any other takes none (null, stride 0).
void check_alibi(const AttentionConfig& c, const float* slopes, std::int64_t batch_stride, int batch);
// The bounds as the kernels hold them (common/mask.cuh): an unbounded side, or one past every key it could bound,
// becomes the longest sequence's size (seqlen_k on the left, seqlen_q on the right), which bounds nothing; causal: a
// right bound of 0.
struct Window {
    int left, right;
};
Window window_bounds(const AttentionConfig& c, int left, int right, int seqlen_q, int seqlen_k);
// A device workspace of `need` bytes (none needed: nothing checked); `why` says what the call runs, for the message.
void check_workspace(const void* workspace, std::size_t bytes, std::size_t need, const char* why);

}  // namespace rtattn::kernels
