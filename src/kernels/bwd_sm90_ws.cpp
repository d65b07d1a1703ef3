// The warp-specialized Hopper backward family (templates/bwd/sm90_ws.cuh): bwd_sm90's GEMMs on two consumer
// warpgroups, a producer warpgroup streaming Q and dO by TMA (maps encoded per launch) and adding dQ into the
// accumulator. sm_90a; head dims that are multiples of 8 (a box starts 16-byte aligned), pads 80..128.
#include <set>
#include <vector>

#include "common/geometry.h"
#include "kernels/backward.hpp"
#include "kernels/sm90.hpp"
#include "kernels/tma.hpp"

namespace rtattn::kernels {

namespace {

// Q and dO maps: whole rows as the forward's K/V maps, dims ordered by the smaller of the seq and head strides (both
// tensors alike, as the kernel orders their box coordinates once); false where a map cannot be encoded.
bool encode_q_maps(const BackwardLaunch& l, BwdParamsTma& out) {
    const BackwardCall& a = l.call;
    const plan::BackwardPlan& p = l.plan;
    const int heads = l.config.num_heads_q;
    const int rows = p.varlen ? a.total_q : a.seqlen_q, batch = p.varlen ? 1 : a.batch;
    const int seq_dim = a.q.seq_stride <= a.q.head_stride ? 1 : 2;
    if ((a.dout.seq_stride <= a.dout.head_stride ? 1 : 2) != seq_dim) return false;
    out.tma_seq_dim = seq_dim;
    return tma::encode_panels(out.q_map, tma::whole_rows(a.q, p.head_dim_qk, rows, heads, batch), p.pad_qk, p.block_m,
                              p.bf16, seq_dim) &&
           tma::encode_panels(out.do_map, tma::whole_rows(a.dout, p.head_dim_v, rows, heads, batch), p.pad_v,
                              p.block_m, p.bf16, seq_dim);
}

constexpr int kFallbackIndex = 3;  // after the main kernel and the row kernels

class BwdSm90Ws final : public BackwardFamily {
public:
    const char* name() const override { return "bwd_sm90_ws"; }
    bool runs_on(const arch::Arch& a) const override { return a.wgmma && a.tma && a.setmaxnreg && a.bulk; }
    int threads(const plan::BackwardPlan& p) const override { return p.warps * 32 + 128; }  // + the producer
    int smem_bytes(const plan::BackwardPlan& p) const override {
        return geometry::bwd_sm90_ws_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages);
    }
    std::string describe(const plan::BackwardPlan&) const override {
        return "wgmma backward, producer warpgroup (TMA Q/dO, dQ by bulk reduction)";
    }
    render::StubSpec stub(const plan::BackwardPlan& p) const override {
        render::StubSpec s = backward_stub(p, "bwd/sm90_ws.cuh", "BwdShapeSm90Ws", "flash_bwd_sm90_ws",
                                           "const __grid_constant__ rtattn::BwdParamsTma params");
        using render::int_trait;
        s.traits.push_back(int_trait("kWarps", p.warps));
        s.traits.push_back(int_trait("kStages", p.stages));
        // S^T, dP^T: block_m columns; dQ: 64 and pad_qk - 64; dV, dK (A from registers): the pads, chunked; and the
        // fallback kernel's.
        std::set<int> ss, rs;
        bwd_sm90_widths(p, ss, rs);
        for (int n : {p.block_m, 64, p.pad_qk - 64})
            for (int w : sm90::chunk_widths(n)) ss.insert(w);
        for (int n : {p.pad_qk, p.pad_v})
            for (int w : sm90::chunk_widths(n)) rs.insert(w);
        s.generated = render::wgmma_wrappers(std::vector<int>(ss.begin(), ss.end()),
                                             std::vector<int>(rs.begin(), rs.end()), p.bf16);
        // Where no map can be encoded: bwd/sm90.cuh's kernel (the same widths), entry kFallbackIndex.
        s.entries.push_back({"rtattn_bwd_main_cp", "const rtattn::BwdParams params",
                             "rtattn::flash_bwd_sm90<rtattn::BwdSm90Fallback<Traits>>(params)", p.warps * 32});
        return s;
    }
    void launch(const BackwardLaunch& l) const override {
        BwdParamsTma prm{};
        prm.p = backward_params(l);
        if (!tma::disabled() && encode_q_maps(l, prm)) return launch_backward(l, prm.p, &prm);
        launch_backward(l, prm.p, &prm.p,
                        {kFallbackIndex, l.plan.warps * 32,
                         geometry::bwd_sm90_smem_bytes(l.plan.pad_qk, l.plan.pad_v, l.plan.block_m, l.plan.block_n, 1)});
    }
};

}  // namespace

const BackwardFamily& bwd_sm90_ws() {
    static const BwdSm90Ws f;
    return f;
}

}  // namespace rtattn::kernels
