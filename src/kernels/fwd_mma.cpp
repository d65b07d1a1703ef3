// The mma.sync forward family (templates/fwd/mma.cuh): FlashAttention-2's algorithm on mma.m16n8k16, ldmatrix and a
// cp.async ring. Runs on every arch the library knows.
#include "common/geometry.h"
#include "kernels/args.hpp"
#include "kernels/forward.hpp"

namespace rtattn::kernels {

namespace {

class FwdMma final : public ForwardFamily {
public:
    const char* name() const override { return "fwd_mma"; }
    bool runs_on(const arch::Arch&) const override { return true; }
    void settle(plan::KernelPlan& p) const override {
        // Hopper knobs (shift_rows is both families': the plan sets it for this one where it applies)
        p.swizzle = p.ping_pong = p.split_rows = p.wide_v = p.persistent = p.o_apart = false;
    }
    int threads(const plan::KernelPlan& p) const override { return p.warps * 32; }
    int smem_bytes(const plan::KernelPlan& p) const override {
        return geometry::fwd_mma_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages);
    }
    std::string describe(const plan::KernelPlan& p) const override {
        return std::string(p.kv_apart ? "mma.sync, K and V loaded apart" : "mma.sync") +
               (p.paged_kv ? ", paged KV cache" : "") + (p.shift_rows ? ", shifted rows" : "");
    }
    render::StubSpec stub(const plan::KernelPlan& p) const override {
        render::StubSpec s = forward_stub(p, "fwd/mma.cuh", "FwdShape", "const rtattn::FwdParams params", "flash_fwd");
        s.traits.push_back({"int", "kMTiles", std::to_string(p.m_tiles)});
        s.traits.push_back({"bool", "kQInRegs", p.q_in_regs ? "true" : "false"});
        s.traits.push_back({"bool", "kKVApart", p.kv_apart ? "true" : "false"});
        s.traits.push_back(render::bool_trait("kRotateRows", p.rotate_rows));
        s.traits.push_back(render::bool_trait("kShiftRows", p.shift_rows));
        return s;
    }
    void launch(const ForwardLaunch& l) const override {
        FwdParams prm = forward_params(l.config, l.args);
        launch_forward_grid(l, &prm);
    }
};

}  // namespace

const ForwardFamily& fwd_mma() {
    static const FwdMma f;
    return f;
}

}  // namespace rtattn::kernels
