#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>

#include "api/kernel_impl.hpp"
#include "kernels/forward.hpp"
#include "core/errors.hpp"

namespace rtattn {

namespace {

struct Dim {
    std::int64_t extent, stride;
};

}  // namespace

void check_tensor(const char* name, const TensorArg& t, int vec, bool is_output, int batch, int seqlen, int heads,
                  int dim) {
    auto field = [&](const char* f) { return fmt::format("{}.{}", name, f); };
    if (!t.ptr) throw ArgumentError(field("ptr"), "is null; a device pointer is required");
    const int align = vec * 2;
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % align != 0)
        throw ArgumentError(field("ptr"), fmt::format("must be {}-byte aligned (this kernel moves {}-element vectors "
                                                      "for head dim {})",
                                                      align, vec, dim));
    const std::array<std::pair<const char*, std::int64_t>, 3> strides = {
        {{"batch_stride", t.batch_stride}, {"seq_stride", t.seq_stride}, {"head_stride", t.head_stride}}};
    for (const auto& [f, s] : strides) {
        if (s < 0) throw ArgumentError(field(f), fmt::format("{} is negative; strides must be >= 0", s));
        if (s % vec != 0)
            throw ArgumentError(field(f), fmt::format("{} must be a multiple of {} elements (vector width for head "
                                                      "dim {})",
                                                      s, vec, dim));
    }
    if (!is_output) return;
    // Output rows must not overlap, or two CTAs would race on the same elements: sorted by stride, each dimension
    // must step past everything the smaller ones span.
    std::array<Dim, 4> dims = {{{dim, 1}, {heads, t.head_stride}, {seqlen, t.seq_stride}, {batch, t.batch_stride}}};
    std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
    std::int64_t span = 1;  // elements covered by the dimensions processed so far
    for (const auto& d : dims) {
        if (d.extent <= 1) continue;
        if (d.stride < span)
            throw ArgumentError(name, fmt::format("strides (batch {}, seq {}, head {}) make output elements overlap "
                                                  "for [batch {}, seq {}, heads {}, dim {}]",
                                                  t.batch_stride, t.seq_stride, t.head_stride, batch, seqlen, heads,
                                                  dim));
        span = d.stride * d.extent;
    }
}

void check_sizes(int batch, int seqlen_q, int seqlen_k) {
    if (batch < 1 || batch > 65535)
        throw ArgumentError("batch", fmt::format("{} is out of range; allowed 1..65535", batch));
    if (seqlen_q < 1) throw ArgumentError("seqlen_q", fmt::format("{} is out of range; allowed >= 1", seqlen_q));
    if (seqlen_k < 1) throw ArgumentError("seqlen_k", fmt::format("{} is out of range; allowed >= 1", seqlen_k));
}

void validate_forward_args(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a) {
    check_sizes(a.batch, a.seqlen_q, a.seqlen_k);
    check_tensor("q", a.q, p.vec_qk, false, a.batch, a.seqlen_q, c.num_heads_q, p.head_dim_qk);
    check_tensor("k", a.k, p.vec_qk, false, a.batch, a.seqlen_k, c.num_heads_kv, p.head_dim_qk);
    check_tensor("v", a.v, p.vec_v, false, a.batch, a.seqlen_k, c.num_heads_kv, p.head_dim_v);
    check_tensor("o", a.o, p.vec_v, true, a.batch, a.seqlen_q, c.num_heads_q, p.head_dim_v);
    if (a.lse && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
        throw ArgumentError("lse", "must be 4-byte aligned (float32)");
}

void Kernel::forward(const ForwardArgs& a, void* stream) const {
    if (!impl_) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get()");
    const Impl& k = *impl_;
    validate_forward_args(k.plan, k.config, a);
    k.plan.family->launch({k.plan, k.config, a, *k.module, stream});
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
