// Kernel: has its family check a forward call's arguments against the plan, then launch it (a prefill config's
// few-query calls through its decode twin); the merge entry every forward module carries.
#include "util/format.hpp"

#include <cstdint>
#include <mutex>
#include <utility>

#include "api/kernel_impl.hpp"
#include "api/runtime_internal.hpp"
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

// A prefill config's calls of 1..16 query tokens against this many keys or more run its decode twin: a KV group's
// query heads in one CTA, the keys split across the device. Same attention (O, LSE, masks, cache, append); issue 24
// measured the prefill kernel reading such a cache at 0.39-0.41x cuDNN (H100), the decode kernels at 0.84-0.90x.
constexpr int kRouteMinKeys = 2048;

// The decode twin for a call of these sizes, or null. Looked up once per kernel (a compile on first use, unless
// cached); a config the decode kernels do not take, a cache-only miss or a failed compile leave the prefill kernel.
const Kernel::Impl* decode_twin(const Kernel::Impl& k, int seqlen_q, int seqlen_k) {
    if (k.config.decode || k.config.varlen || seqlen_q < 1 || seqlen_q > kernels::kDecodeMaxSeqlenQ ||
        seqlen_k < kRouteMinKeys)
        return nullptr;
    std::call_once(k.decode_once, [&k] {
        if (const auto rt = k.runtime.lock()) {
            AttentionConfig c = k.config;
            c.decode = true;
            try {
                k.decode = get_kernel(rt, c);
            } catch (const Error&) {  // the prefill kernel serves every call it served before
            }
        }
    });
    return k.decode.get();
}

void launch(const Kernel::Impl& k, const ForwardArgs& a, void* stream) {
    const kernels::ForwardLaunch l{k.plan, k.config, a, *k.module, stream, k.resident_ctas};
    if (a.seqlen_new > 0) kernels::launch_append(l);  // first: the attention reads the new rows
    k.plan.family->launch(l);
}

// Sizes checked by the kernel, then by the one a call of them runs (the decode twin, for a routed call): its splits
// and their workspace are the answers.
std::pair<const Kernel::Impl&, kernels::CallSizes> sized(const Kernel::Impl& k, int batch, int seqlen_q, int seqlen_k,
                                                         int num_splits) {
    k.plan.family->check_call(k.plan, k.config, call_sizes(k, batch, seqlen_q, seqlen_k, num_splits));
    const Kernel::Impl* d = decode_twin(k, seqlen_q, seqlen_k);
    const Kernel::Impl& r = d ? *d : k;
    const kernels::CallSizes z = call_sizes(r, batch, seqlen_q, seqlen_k, num_splits);
    r.plan.family->check_call(r.plan, r.config, z);
    return {r, z};
}

}  // namespace

void Kernel::forward(const ForwardArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    // The decode twin takes the call when its checks pass, the workspace its splits need among them (a caller who
    // sized the workspace with workspace_bytes() gave it); anything it refuses, the prefill kernel runs (or refuses).
    if (const Impl* d = decode_twin(k, a.seqlen_q, a.seqlen_k)) {
        bool takes = true;
        try {
            d->plan.family->validate_args(d->plan, d->config, a,
                                          call_sizes(*d, a.batch, a.seqlen_q, a.seqlen_k, a.num_splits));
            kernels::check_append(d->plan, d->config, a);
        } catch (const ArgumentError&) {
            takes = false;
        }
        if (takes) return launch(*d, a, stream);
    }
    k.plan.family->validate_args(k.plan, k.config, a, call_sizes(k, a.batch, a.seqlen_q, a.seqlen_k, a.num_splits));
    kernels::check_append(k.plan, k.config, a);
    launch(k, a, stream);
}

std::size_t Kernel::workspace_bytes(int batch, int seqlen_q, int seqlen_k, int num_splits) const {
    const auto [r, z] = sized(impl_of(impl_), batch, seqlen_q, seqlen_k, num_splits);
    return r.plan.family->workspace_bytes(r.plan, r.config, z);
}

int Kernel::num_splits(int batch, int seqlen_q, int seqlen_k, int num_splits) const {
    const auto [r, z] = sized(impl_of(impl_), batch, seqlen_q, seqlen_k, num_splits);
    return r.plan.family->num_splits(r.plan, r.config, z);
}

void Kernel::merge(const MergeArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    const plan::KernelPlan& p = k.plan;
    const int heads = k.config.num_heads_q;
    if (a.batch < 1) throw ArgumentError("batch", util::format("{} is out of range; allowed >= 1", a.batch));
    if (a.seqlen < 1) throw ArgumentError("seqlen", util::format("{} is out of range; allowed >= 1", a.seqlen));
    // One warp per row, the rows along the grid's x.
    const std::int64_t rows = std::int64_t(a.batch) * heads * a.seqlen;
    const std::int64_t max_rows = kernels::max_warp_rows(kernels::kMergeThreads);
    if (rows > max_rows)
        throw ArgumentError("seqlen", util::format("batch {} x heads_q {} x seqlen {} = {} rows; the merge takes at "
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
