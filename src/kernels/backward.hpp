// Backward kernel families. A family is one template folder entry (templates/bwd/) and this description of it: its
// shared memory and threads, the stub (three entries: main, preprocess, postprocess) and how a call is launched.
// The backward tile table (src/plan/backward_tiles.cpp) names a family per row.
#pragma once
#include <string>

#include "arch/arch.hpp"
#include "common/params.h"
#include "driver/driver.hpp"
#include "plan/backward.hpp"
#include "render/render.hpp"
#include "core/runtime.hpp"

namespace rtattn::kernels {

// One backward call: tensors as the forward's, plus O, dO, the forward's LSE, the gradients and the workspace.
struct BackwardCall {
    TensorArg q, k, v, o, dout;
    const float* lse = nullptr;  // [batch, heads_q, seqlen_q], the forward's
    const float* dlse = nullptr; // optional, same layout: a gradient flowing into the LSE
    TensorArg dq, dk, dv;        // written: dQ like Q, dK like K, dV like V
    int batch = 0, seqlen_q = 0, seqlen_k = 0;
    void* workspace = nullptr;   // plan.workspace(...).bytes, 256-byte aligned
    bool deterministic = false;
    const std::int32_t* cu_seqlens_q = nullptr;  // varlen: as BackwardArgs
    const std::int32_t* cu_seqlens_k = nullptr;
    int total_q = 0, total_k = 0;
};

struct BackwardLaunch {
    const plan::BackwardPlan& plan;
    const AttentionConfig& config;
    const BackwardCall& call;
    const driver::Module& module;  // functions in the order of the stub's entries
    void* stream;
};

class BackwardFamily {
public:
    virtual ~BackwardFamily() = default;
    virtual const char* name() const = 0;  // "bwd_mma"
    virtual bool runs_on(const arch::Arch& a) const = 0;
    virtual int smem_bytes(const plan::BackwardPlan& p) const = 0;  // from templates/common/geometry.h
    virtual std::string describe(const plan::BackwardPlan& p) const = 0;
    virtual render::StubSpec stub(const plan::BackwardPlan& p) const = 0;
    virtual void launch(const BackwardLaunch& l) const = 0;
};

const BackwardFamily& bwd_mma();  // mma.sync m16n8k16, every arch (bwd/mma.cuh)

render::RenderedSource render_backward(const plan::BackwardPlan& p);

}  // namespace rtattn::kernels
