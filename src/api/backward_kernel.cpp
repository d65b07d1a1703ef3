// BackwardKernel: checks a backward call's arguments against its plan, then has the family launch it.
#include <fmt/format.h>

#include <cstdint>

#include "api/kernel_impl.hpp"
#include "core/errors.hpp"
#include "kernels/backward.hpp"

namespace rtattn {

namespace {

void validate_backward_args(const plan::BackwardPlan& p, const AttentionConfig& c, const BackwardArgs& a) {
    check_sizes(a.batch, a.seqlen_q, a.seqlen_k);
    const int hq = c.num_heads_q, hkv = c.num_heads_kv;
    const Rows r = check_packing(c.varlen, false, {a.cu_seqlens_q, a.cu_seqlens_k, a.total_q, a.total_k}, a.batch,
                                 a.seqlen_q, a.seqlen_k,
                                 {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"o", &a.o}, {"dout", &a.dout},
                                  {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}});
    check_tensor("q", a.q, p.vec_qk, false, r.batch, r.q, hq, p.head_dim_qk);
    check_tensor("k", a.k, p.vec_qk, false, r.batch, r.k, hkv, p.head_dim_qk);
    check_tensor("v", a.v, p.vec_v, false, r.batch, r.k, hkv, p.head_dim_v);
    check_tensor("o", a.o, p.vec_v, false, r.batch, r.q, hq, p.head_dim_v);
    check_tensor("dout", a.dout, p.vec_v, false, r.batch, r.q, hq, p.head_dim_v);
    check_tensor("dq", a.dq, p.vec_qk, true, r.batch, r.q, hq, p.head_dim_qk);
    check_tensor("dk", a.dk, p.vec_qk, true, r.batch, r.k, hkv, p.head_dim_qk);
    check_tensor("dv", a.dv, p.vec_v, true, r.batch, r.k, hkv, p.head_dim_v);
    if (!a.lse)
        throw ArgumentError("lse", c.varlen ? "is null; the forward's LSE ([heads_q, total_q] float32) is required"
                                            : "is null; the forward's LSE ([batch, heads_q, seqlen_q] float32) is "
                                              "required");
    if (reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0) throw ArgumentError("lse", "must be 4-byte aligned (float32)");
    if (reinterpret_cast<std::uintptr_t>(a.dlse) % 4 != 0)
        throw ArgumentError("dlse", "must be 4-byte aligned (float32)");
    const std::size_t need = p.workspace(a.batch, hq, a.seqlen_q).bytes;
    if (!a.workspace)
        throw ArgumentError("workspace", fmt::format("is null; this call needs {} bytes (workspace_bytes())", need));
    if (reinterpret_cast<std::uintptr_t>(a.workspace) % 256 != 0)
        throw ArgumentError("workspace", "must be 256-byte aligned (cudaMalloc's pointers are)");
    if (a.workspace_bytes < need)
        throw ArgumentError("workspace_bytes", fmt::format("{} is too small; this call needs {} (batch {}, seqlen_q "
                                                           "{})",
                                                           a.workspace_bytes, need, a.batch, a.seqlen_q));
}

const BackwardKernel::Impl& impl_of(const std::shared_ptr<const BackwardKernel::Impl>& impl) {
    if (!impl) throw ArgumentError("kernel", "is empty; obtain one from Runtime::get_backward()");
    return *impl;
}

}  // namespace

std::size_t BackwardKernel::workspace_bytes(int batch, int seqlen_q, int seqlen_k) const {
    const Impl& k = impl_of(impl_);
    check_sizes(batch, seqlen_q, seqlen_k);
    return k.plan.workspace(batch, k.config.num_heads_q, seqlen_q).bytes;
}

void BackwardKernel::backward(const BackwardArgs& a, void* stream) const {
    const Impl& k = impl_of(impl_);
    validate_backward_args(k.plan, k.config, a);
    kernels::BackwardCall call;
    call.q = a.q, call.k = a.k, call.v = a.v, call.o = a.o, call.dout = a.dout, call.lse = a.lse;
    call.dlse = a.dlse;
    call.dq = a.dq, call.dk = a.dk, call.dv = a.dv;
    call.batch = a.batch, call.seqlen_q = a.seqlen_q, call.seqlen_k = a.seqlen_k;
    call.workspace = a.workspace;
    call.deterministic = a.deterministic;
    call.cu_seqlens_q = a.cu_seqlens_q, call.cu_seqlens_k = a.cu_seqlens_k;
    call.total_q = a.total_q, call.total_k = a.total_k;
    k.plan.family->launch({k.plan, k.config, call, *k.module, stream});
}

const AttentionConfig& BackwardKernel::config() const { return impl_of(impl_).config; }
const KernelInfo& BackwardKernel::info() const { return impl_of(impl_).info; }

}  // namespace rtattn
