// BackwardKernel: has its family check a backward call's arguments against the plan, then launch it.

#include <cstdint>

#include "api/kernel_impl.hpp"
#include "core/errors.hpp"
#include "kernels/backward.hpp"

namespace rtattn {

namespace {

const BackwardKernel::Impl& impl_of(const std::shared_ptr<const BackwardKernel::Impl>& impl) {
    if (!impl) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get_backward()");
    return *impl;
}

}  // namespace

std::size_t BackwardKernel::workspace_bytes(int batch, int seqlen_q, int seqlen_k) const {
    const Impl& k = impl_of(impl_);
    const kernels::CallSizes z{batch, seqlen_q, seqlen_k};
    k.plan.family->check_call(k.plan, k.config, z);
    return k.plan.family->workspace_bytes(k.plan, k.config, z);
}

void BackwardKernel::backward(const BackwardArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    k.plan.family->validate_args(k.plan, k.config, a, {a.batch, a.seqlen_q, a.seqlen_k});
    kernels::BackwardCall call;
    call.q = a.q, call.k = a.k, call.v = a.v, call.o = a.o, call.dout = a.dout, call.lse = a.lse;
    call.dlse = a.dlse;
    call.dq = a.dq, call.dk = a.dk, call.dv = a.dv;
    call.batch = a.batch, call.seqlen_q = a.seqlen_q, call.seqlen_k = a.seqlen_k;
    call.workspace = a.workspace;
    call.deterministic = a.deterministic;
    call.cu_seqlens_q = a.cu_seqlens_q, call.cu_seqlens_k = a.cu_seqlens_k;
    call.total_q = a.total_q, call.total_k = a.total_k;
    call.window_size_left = a.window_size_left, call.window_size_right = a.window_size_right;
    call.sinks = a.sinks, call.dsinks = a.dsinks;
    call.softcap = a.softcap;
    call.alibi_slopes = a.alibi_slopes, call.alibi_slopes_batch_stride = a.alibi_slopes_batch_stride;
    k.plan.family->launch({k.plan, k.config, call, *k.module, stream});
}

const AttentionConfig& BackwardKernel::config() const { return impl_of(impl_).config; }
const KernelInfo& BackwardKernel::info() const { return impl_of(impl_).info; }

}  // namespace rtattn
