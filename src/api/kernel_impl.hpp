#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "driver/driver.hpp"
#include "kernels/forward.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "core/runtime.hpp"

namespace rtattn {

struct Kernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::KernelPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
    int resident_ctas = 0;  // CTAs of the main entry the device holds at once (a split-KV family's wave size)
};

struct BackwardKernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::BackwardPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
};

// One [batch, seq, head, dim] tensor argument: non-null, aligned to the kernel's vector width, strides >= 0 and
// multiples of it; an output's elements must not overlap. Throws ArgumentError naming "<name>.<field>".
void check_tensor(const char* name, const TensorArg& t, int vec, bool is_output, int batch, int seqlen, int heads,
                  int dim);
// Query tokens per sequence a decode call takes.
inline constexpr int kDecodeMaxSeqlenQ = 16;

// Sequences up to 2^30 rows: a row count plus a tile stays inside int32 (the kernels' row arithmetic) and the
// grid's x. The batch is the grid's z (at most 65535).
inline constexpr int kMaxSeqlen = 1 << 30;
inline constexpr int kMaxBatch = 65535;
void check_sizes(int batch, int seqlen_q, int seqlen_k);
// check_sizes, then what the config allows of a call: decode's query tokens, and the split count (decode: 0 = the
// library's choice or 1..kDecMaxSplits; other kernels: 0 or 1, "no split"). forward(), workspace_bytes() and
// num_splits() refuse the same calls.
void check_call_sizes(const AttentionConfig& c, int batch, int seqlen_q, int seqlen_k, int num_splits);

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

// Checks every forward() argument against the plan (and, for decode, the call's split count and workspace); throws
// ArgumentError naming the field.
void validate_forward_args(const plan::KernelPlan& plan, const AttentionConfig& config, const ForwardArgs& a,
                           const kernels::CallSizes& sizes);

}  // namespace rtattn
