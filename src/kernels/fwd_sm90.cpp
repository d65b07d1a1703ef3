// The cooperative Hopper forward family (templates/fwd/sm90.cuh): both GEMMs as wgmma, every warp loads K/V with
// cp.async and computes. Serves the head dims whose packed rows TMA cannot address; also the host pieces both Hopper
// families share (kernels/sm90.hpp).
#include <vector>

#include "common/geometry.h"
#include "kernels/forward.hpp"
#include "kernels/sm90.hpp"

namespace rtattn::kernels {

namespace sm90 {

void align_swizzled_tiles(plan::KernelPlan& p) {
    if (!p.swizzle) return;
    const int v_cols = geometry::v_tile_cols(p.pad_v, p.wide_v);
    auto aligned = [&] {
        return geometry::swizzle_aligned(p.block_n, p.pad_qk) && geometry::swizzle_aligned(p.block_n, v_cols);
    };
    while (!aligned() && p.block_n > 16) p.block_n -= 16;
    if (!aligned()) p.swizzle = false;
}

std::vector<int> chunk_widths(int n) {
    std::vector<int> w;
    for (int width : {128, 64, 32, 16, 8})
        if (geometry::has_chunk(n, width)) w.push_back(width);
    return w;
}

std::string wgmma_wrappers(const plan::KernelPlan& p) {
    return render::wgmma_wrappers(chunk_widths(p.block_n), p.wide_v ? std::vector<int>{p.pad_v} : chunk_widths(p.pad_v),
                                  p.bf16);
}

std::string describe_tiles(const plan::KernelPlan& p) {
    return p.swizzle ? "wgmma, swizzled tiles" : "wgmma, interleaved tiles";
}

}  // namespace sm90

namespace {

class FwdSm90 final : public ForwardFamily {
public:
    const char* name() const override { return "fwd_sm90"; }
    bool runs_on(const arch::Arch& a) const override { return a.wgmma; }
    void settle(plan::KernelPlan& p) const override {
        // the producer family's knobs
        p.ping_pong = p.split_rows = p.shift_rows = p.wide_v = p.persistent = p.o_apart = false;
        p.m_tiles = 1, p.q_in_regs = p.kv_apart = false;  // the mma.sync family's
        sm90::align_swizzled_tiles(p);
    }
    int threads(const plan::KernelPlan& p) const override { return p.warps * 32; }
    int smem_bytes(const plan::KernelPlan& p) const override {
        return geometry::fwd_sm90_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wide_v);
    }
    std::string describe(const plan::KernelPlan& p) const override { return sm90::describe_tiles(p); }
    render::StubSpec stub(const plan::KernelPlan& p) const override {
        render::StubSpec s =
            forward_stub(p, "fwd/sm90.cuh", "FwdShapeSm90", "const rtattn::FwdParams params", "flash_fwd_sm90");
        s.generated = sm90::wgmma_wrappers(p);
        s.traits.push_back({"bool", "kSwizzle", p.swizzle ? "true" : "false"});
        s.traits.push_back({"bool", "kWideV", "false"});  // the V layout both Hopper kernels share; never wide here
        return s;
    }
    void launch(const ForwardLaunch& l) const override {
        FwdParams prm = forward_params(l.config, l.args);
        launch_forward_grid(l, &prm);
    }
};

}  // namespace

const ForwardFamily& fwd_sm90() {
    static const FwdSm90 f;
    return f;
}

}  // namespace rtattn::kernels
