// The Hopper backward family (templates/bwd/sm90.cuh): bwd/mma.cuh's algorithm with its five GEMMs as warpgroup
// MMAs, a warpgroup per 64 keys, dQ by bulk reduction. sm_90a only.
#include <set>
#include <vector>

#include "common/geometry.h"
#include "kernels/backward.hpp"
#include "kernels/sm90.hpp"

namespace rtattn::kernels {

void bwd_sm90_widths(const plan::BackwardPlan& p, std::set<int>& ss, std::set<int>& rs) {
    // S^T and dP^T: block_m columns; dQ: 64-column pieces and the rest, or on whole panels each warpgroup's
    // width, chunked (both operands from shared memory). dV and dK (A from registers): their accumulators'
    // columns, one instruction on whole panels, else chunked (geometry::bwd_sm90_whole).
    const int acc_qk = geometry::bwd_sm90_acc_cols(p.head_dim_qk, p.pad_qk);
    const int acc_v = geometry::bwd_sm90_acc_cols(p.head_dim_v, p.pad_v);
    auto widths = [](int n, bool whole) { return whole ? std::vector<int>{n} : sm90::chunk_widths(n); };
    for (int n : {p.block_m, 64, acc_qk % 64, geometry::bwd_sm90_dq_width(acc_qk)})
        if (n > 0)
            for (int w : sm90::chunk_widths(n)) ss.insert(w);
    for (int w : widths(acc_v, geometry::bwd_sm90_whole(p.pad_v))) rs.insert(w);
    for (int w : widths(acc_qk, geometry::bwd_sm90_whole(p.pad_qk))) rs.insert(w);
}

namespace {

class BwdSm90 final : public BackwardFamily {
public:
    const char* name() const override { return "bwd_sm90"; }
    bool runs_on(const arch::Arch& a) const override { return a.wgmma && a.bulk; }
    int threads(const plan::BackwardPlan& p) const override { return p.warps * 32; }
    int smem_bytes(const plan::BackwardPlan& p) const override {
        return geometry::bwd_sm90_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages);
    }
    std::string describe(const plan::BackwardPlan&) const override {
        return "wgmma backward, dQ by bulk reduction";
    }
    render::StubSpec stub(const plan::BackwardPlan& p) const override {
        render::StubSpec s = backward_stub(p, "bwd/sm90.cuh", "BwdShapeSm90", "flash_bwd_sm90");
        using render::int_trait;
        s.traits.push_back(int_trait("kWarps", p.warps));
        s.traits.push_back(int_trait("kStages", p.stages));
        std::set<int> ss, rs;
        bwd_sm90_widths(p, ss, rs);
        s.generated = render::wgmma_wrappers(std::vector<int>(ss.begin(), ss.end()),
                                             std::vector<int>(rs.begin(), rs.end()), p.bf16);
        return s;
    }
    void launch(const BackwardLaunch& l) const override { launch_backward(l); }
};

}  // namespace

const BackwardFamily& bwd_sm90() {
    static const BwdSm90 f;
    return f;
}

}  // namespace rtattn::kernels
