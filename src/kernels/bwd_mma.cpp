// The mma.sync backward family (templates/bwd/mma.cuh): FlashAttention-2's backward on mma.m16n8k16 and ldmatrix,
// three kernels in one module. Runs on every arch the library knows.
#include "common/geometry.h"
#include "kernels/backward.hpp"

namespace rtattn::kernels {

namespace {

class BwdMma final : public BackwardFamily {
public:
    const char* name() const override { return "bwd_mma"; }
    bool runs_on(const arch::Arch&) const override { return true; }
    int threads(const plan::BackwardPlan& p) const override { return p.warps * 32; }
    int smem_bytes(const plan::BackwardPlan& p) const override {
        return geometry::bwd_mma_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.bulk_dq);
    }
    std::string describe(const plan::BackwardPlan& p) const override {
        return p.bulk_dq ? "mma.sync backward, dQ by bulk reduction" : "mma.sync backward, dQ by atomics";
    }
    render::StubSpec stub(const plan::BackwardPlan& p) const override {
        render::StubSpec s = backward_stub(p, "bwd/mma.cuh", "BwdShape", "flash_bwd_main");
        using render::bool_trait, render::int_trait;
        for (const render::Trait& t : {int_trait("kWarps", p.warps), int_trait("kSdpWarpsM", p.sdp_warps_m),
                                       int_trait("kDkvWarpsN", p.dkv_warps_n), int_trait("kDqWarpsM", p.dq_warps_m),
                                       int_trait("kStages", p.stages), bool_trait("kBulkDQ", p.bulk_dq)})
            s.traits.push_back(t);
        return s;
    }
    void launch(const BackwardLaunch& l) const override { launch_backward(l); }
};

}  // namespace

const BackwardFamily& bwd_mma() {
    static const BwdMma f;
    return f;
}

}  // namespace rtattn::kernels
