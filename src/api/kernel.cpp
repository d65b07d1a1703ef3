// Kernel: has its family check a forward call's arguments against the plan, then launch it; the merge entry every
// forward module carries.
#include <fmt/format.h>

#include <cstdint>

#include "api/kernel_impl.hpp"
#include "kernels/args.hpp"
#include "kernels/forward.hpp"
#include "core/errors.hpp"

namespace rtattn {

namespace {

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

const Kernel::Impl& impl_of(const std::shared_ptr<const Kernel::Impl>& impl) {
    if (!impl) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get()");
    return *impl;
}

kernels::CallSizes call_sizes(const Kernel::Impl& k, int batch, int seqlen_q, int seqlen_k, int num_splits) {
    return {batch, seqlen_q, seqlen_k, num_splits, k.resident_ctas};
}

}  // namespace

void Kernel::forward(const ForwardArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    k.plan.family->validate_args(k.plan, k.config, a, call_sizes(k, a.batch, a.seqlen_q, a.seqlen_k, a.num_splits));
    kernels::check_append(k.plan, k.config, a);
    const kernels::ForwardLaunch l{k.plan, k.config, a, *k.module, stream, k.resident_ctas};
    if (a.seqlen_new > 0) kernels::launch_append(l);  // first: the attention reads the new rows
    k.plan.family->launch(l);
}

std::size_t Kernel::workspace_bytes(int batch, int seqlen_q, int seqlen_k, int num_splits) const {
    const Impl& k = impl_of(impl_);
    const kernels::CallSizes z = call_sizes(k, batch, seqlen_q, seqlen_k, num_splits);
    k.plan.family->check_call(k.plan, k.config, z);
    return k.plan.family->workspace_bytes(k.plan, k.config, z);
}

int Kernel::num_splits(int batch, int seqlen_q, int seqlen_k, int num_splits) const {
    const Impl& k = impl_of(impl_);
    const kernels::CallSizes z = call_sizes(k, batch, seqlen_q, seqlen_k, num_splits);
    k.plan.family->check_call(k.plan, k.config, z);
    return k.plan.family->num_splits(k.plan, k.config, z);
}

void Kernel::merge(const MergeArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    const plan::KernelPlan& p = k.plan;
    const int heads = k.config.num_heads_q;
    if (a.batch < 1) throw ArgumentError("batch", fmt::format("{} is out of range; allowed >= 1", a.batch));
    if (a.seqlen < 1) throw ArgumentError("seqlen", fmt::format("{} is out of range; allowed >= 1", a.seqlen));
    // One warp per row, the rows along the grid's x (at most 2^31 - 1 CTAs).
    const std::int64_t rows = std::int64_t(a.batch) * heads * a.seqlen, max_rows = std::int64_t(INT32_MAX) * 8;
    if (rows > max_rows)
        throw ArgumentError("seqlen", fmt::format("batch {} x heads_q {} x seqlen {} = {} rows; the merge takes at "
                                                  "most {}",
                                                  a.batch, heads, a.seqlen, rows, max_rows));
    using kernels::check_tensor;
    check_tensor("o_a", a.o_a, p.vec_v, false, a.batch, a.seqlen, heads, p.head_dim_v);
    check_tensor("o_b", a.o_b, p.vec_v, false, a.batch, a.seqlen, heads, p.head_dim_v);
    check_tensor("o", a.o, p.vec_v, true, a.batch, a.seqlen, heads, p.head_dim_v);
    for (const auto& [field, ptr] : {std::pair{"lse_a", a.lse_a}, std::pair{"lse_b", a.lse_b}})
        if (!ptr) throw ArgumentError(field, "is null; each state's LSE ([batch, heads_q, seqlen] float32) is required");
    for (const auto& [field, ptr] : {std::pair<const char*, const float*>{"lse_a", a.lse_a}, {"lse_b", a.lse_b}, {"lse", a.lse}})
        if (!aligned(ptr, 4)) throw ArgumentError(field, "must be 4-byte aligned (float32)");
    MergeParams m{};
    m.o_a = a.o_a.ptr, m.o_b = a.o_b.ptr, m.o = const_cast<void*>(a.o.ptr);
    m.lse_a = a.lse_a, m.lse_b = a.lse_b, m.lse = a.lse;
    m.a_batch_stride = a.o_a.batch_stride, m.a_seq_stride = a.o_a.seq_stride, m.a_head_stride = a.o_a.head_stride;
    m.b_batch_stride = a.o_b.batch_stride, m.b_seq_stride = a.o_b.seq_stride, m.b_head_stride = a.o_b.head_stride;
    m.o_batch_stride = a.o.batch_stride, m.o_seq_stride = a.o.seq_stride, m.o_head_stride = a.o.head_stride;
    m.batch = a.batch, m.seqlen = a.seqlen, m.heads = heads;
    kernels::launch_merge(*k.module, m, stream);
}

const AttentionConfig& Kernel::config() const {
    if (!impl_) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get()");
    return impl_->config;
}

const KernelInfo& Kernel::info() const {
    if (!impl_) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get()");
    return impl_->info;
}

}  // namespace rtattn
