// The warp-specialized Hopper backward family (templates/bwd/sm90_ws.cuh): bwd_sm90's GEMMs on two consumer
// warpgroups, a producer warpgroup streaming Q and dO by TMA (maps encoded per launch) and adding dQ into the
// accumulator. sm_90a; head dims that are multiples of 8 (a box starts 16-byte aligned) at pads 32..128, and d132..144
// of 4 (d132's rows placed as they lie; GQA groups whose heads alternate placement on clusters of two CTAs), and in
// its wide form (64 keys a CTA, the warpgroups splitting the columns) pads 160..256.
#include <cstdint>
#include <set>
#include <vector>

#include "common/geometry.h"
#include "kernels/backward.hpp"
#include "kernels/sm90.hpp"
#include "kernels/tma.hpp"

namespace rtattn::kernels {

namespace {

// One of Q's or dO's maps (box = panel width x block_m rows) and how a head's boxes step (BwdParamsTma): whole rows
// with a head dimension; shifted rows (d132, d140) over every head's columns of a seq row, where each head's rows
// start alike (seq and batch strides of 16-byte multiples) at 0 or 8 bytes past a 16-byte boundary (a head stride of
// a multiple of 4 elements) and the heads lie within a seq row. False where no map can be encoded.
bool encode_rows(const plan::BackwardPlan& p, const TensorArg& t, int dim, int pad, int rows, int heads, int batch,
                 TmaMap* maps, int& col_step, int& seq_dim) {
    tma::View v = tma::whole_rows(t, dim, rows, heads, batch);
    if (!geometry::bwd_sm90_ws_shift_rows(p.head_dim_qk, p.pad_qk)) {
        seq_dim = t.seq_stride <= t.head_stride ? 1 : 2;
        col_step = 0;
        return tma::encode_panels(maps, v, pad, p.block_m, p.bf16, seq_dim);
    }
    const auto stepped = [](std::int64_t extent, std::int64_t stride) { return extent <= 1 || stride % 8 == 0; };
    if (!stepped(rows, t.seq_stride) || !stepped(batch, t.batch_stride) || (heads > 1 && t.head_stride % 4 != 0))
        return false;
    const std::int64_t packed_cols = std::int64_t(heads - 1) * t.head_stride + dim;
    if (heads > 1 && packed_cols > t.seq_stride) return false;
    if (packed_cols + pad >= (std::int64_t(1) << 31)) return false;  // box coordinates are 32-bit
    v.cols = int(packed_cols), v.head = {1, 0};
    col_step = int(t.head_stride), seq_dim = 1;
    return tma::encode_panels(maps, v, pad, p.block_m, p.bf16, seq_dim);
}

// Both tensors' maps, ordered alike (the kernel computes their box coordinates once).
bool encode_q_maps(const BackwardLaunch& l, BwdParamsTma& out) {
    const BackwardCall& a = l.call;
    const plan::BackwardPlan& p = l.plan;
    const int heads = l.config.num_heads_q;
    const int rows = p.varlen ? a.total_q : a.seqlen_q, batch = p.varlen ? 1 : a.batch;
    int q_seq_dim = 0, do_seq_dim = 0;
    if (!encode_rows(p, a.q, p.head_dim_qk, p.pad_qk, rows, heads, batch, out.q_map, out.q_col_step, q_seq_dim) ||
        !encode_rows(p, a.dout, p.head_dim_v, p.pad_v, rows, heads, batch, out.do_map, out.do_col_step, do_seq_dim))
        return false;
    out.tma_seq_dim = q_seq_dim;
    out.head_step = out.q_col_step ? 0 : 1;
    return q_seq_dim == do_seq_dim && (out.q_col_step == 0) == (out.do_col_step == 0);
}

// The accumulator's map where dQ leaves by TMA reductions (geometry::bwd_sm90_ws_by_gemm): every workspace row.
bool encode_dq_map(const BackwardLaunch& l, BwdParamsTma& out) {
    const plan::BackwardPlan& p = l.plan;
    if (!geometry::bwd_sm90_ws_by_gemm(p.pad_qk, p.block_n)) return true;
    const std::int64_t rows = std::int64_t(l.call.batch) * l.config.num_heads_q * out.p.m_pad;  // workspace rows
    return tma::encode_f32_rows(&out.dq_map, out.p.dq_accum, p.pad_qk, rows, geometry::bwd_dq_stride(p.pad_qk),
                                geometry::kBwdDqBoxCols, geometry::kBwdDqBoxRows);
}

// The wide form (bwd/sm90_ws.cuh kWide): 64 keys a CTA, at pads past 144.
bool is_wide(const plan::BackwardPlan& p) { return geometry::bwd_sm90_ws_wide_tile(p.block_n); }

constexpr int kFallbackIndex = 3;  // after the main kernel and the row kernels
constexpr int kPairIndex = 4;      // shifted rows only

class BwdSm90Ws final : public BackwardFamily {
public:
    const char* name() const override { return "bwd_sm90_ws"; }
    bool runs_on(const arch::Arch& a) const override { return a.wgmma && a.tma && a.setmaxnreg && a.bulk; }
    int threads(const plan::BackwardPlan& p) const override { return p.warps * 32 + 128; }  // + the producer
    int smem_bytes(const plan::BackwardPlan& p) const override {
        return geometry::bwd_sm90_ws_smem_bytes(
            p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages,
            geometry::bwd_sm90_ws_dq_lag(p.head_dim_qk, p.head_dim_v, p.pad_qk, p.pad_v, p.block_m, p.block_n));
    }
    std::string describe(const plan::BackwardPlan&) const override {
        return "wgmma backward, producer warpgroup (TMA Q/dO, dQ by bulk or TMA reduction)";
    }
    render::StubSpec stub(const plan::BackwardPlan& p) const override {
        render::StubSpec s = backward_stub(p, "bwd/sm90_ws.cuh", "BwdShapeSm90Ws", "flash_bwd_sm90_ws",
                                           "const __grid_constant__ rtattn::BwdParamsTma params");
        using render::int_trait;
        s.traits.push_back(int_trait("kWarps", p.warps));
        s.traits.push_back(int_trait("kStages", p.stages));
        // The fallback kernel's widths, then this kernel's: S^T, dP^T block_m columns; dQ the accumulator's columns
        // (128 query rows a step: each warpgroup 64 rows) or its split (wide: each warpgroup half the pad's); dV, dK
        // (A from registers) the accumulators' columns (wide: half the pads'), chunked.
        std::set<int> ss, rs;
        const bool wide = is_wide(p);
        if (!wide) bwd_sm90_widths(p, ss, rs);
        const int acc_qk = wide ? p.pad_qk / 2 : geometry::bwd_sm90_ws_acc_cols(p.head_dim_qk, p.pad_qk);
        const int acc_v = wide ? p.pad_v / 2 : geometry::bwd_sm90_ws_acc_cols(p.head_dim_v, p.pad_v);
        const int split = p.block_m == 128 || wide ? acc_qk : geometry::bwd_sm90_ws_dq_split(acc_qk);
        for (int n : {p.block_m, split, acc_qk - split})
            if (n > 0)
                for (int w : sm90::chunk_widths(n)) ss.insert(w);
        if (geometry::bwd_sm90_ws_dq_direct(p.pad_qk, p.block_n))  // dQ in two parts: 64 columns and the rest
            for (int w : sm90::chunk_widths(acc_qk - 64)) ss.insert(w);
        for (int n : {acc_qk, acc_v})
            for (int w : sm90::chunk_widths(n)) rs.insert(w);
        if (geometry::bwd_sm90_ws_by_gemm(p.pad_qk, p.block_n))  // split by GEMM: dK and dV whole, one warpgroup each
            for (int n : {p.pad_qk, p.pad_v})
                for (int w : sm90::chunk_widths(n)) rs.insert(w);
        s.generated = render::wgmma_wrappers(std::vector<int>(ss.begin(), ss.end()),
                                             std::vector<int>(rs.begin(), rs.end()), p.bf16);
        // Where no map can be encoded: bwd/sm90.cuh's kernel with one Q/dO buffer (BwdSm90Fallback), or for the
        // wide form bwd/mma.cuh's (BwdMmaFallback), entry kFallbackIndex.
        if (wide)
            s.entries.push_back({"rtattn_bwd_main_cp", "const rtattn::BwdParams params",
                                 "rtattn::flash_bwd_main<rtattn::BwdMmaFallback<Traits>>(params)", p.warps * 32});
        else
            s.entries.push_back({"rtattn_bwd_main_cp", "const rtattn::BwdParams params",
                                 "rtattn::flash_bwd_sm90<rtattn::BwdSm90Fallback<Traits>>(params)", p.warps * 32});
        // Shifted rows: GQA groups whose heads alternate placement, on clusters of two CTAs (entry kPairIndex).
        if (geometry::bwd_sm90_ws_shift_rows(p.head_dim_qk, p.pad_qk))
            s.entries.push_back({"rtattn_bwd_main_pair", "const __grid_constant__ rtattn::BwdParamsTma params",
                                 "rtattn::flash_bwd_sm90_ws<Traits, true>(params)", p.threads()});
        return s;
    }
    void launch(const BackwardLaunch& l) const override {
        BwdParamsTma prm{};
        prm.p = backward_params(l);
        // Shifted rows of a group's query heads placed alike (MHA, or head strides of 8-element multiples) run the
        // main kernel (its tiles follow the group's first head); placed alternately, a cluster of two CTAs per key
        // block, each walking the heads of one placement.
        const bool mapped = !tma::disabled() && encode_q_maps(l, prm) && encode_dq_map(l, prm);
        const bool alike = l.config.num_heads_q == l.config.num_heads_kv ||
                           (prm.q_col_step % 8 == 0 && prm.do_col_step % 8 == 0);
        if (mapped && alike) return launch_backward(l, prm.p, &prm);
        if (mapped && l.config.num_heads_kv <= 65535 / 2)  // a grid's y
            return launch_backward(l, prm.p, &prm, {kPairIndex, l.plan.threads(), l.plan.smem_bytes, 2});
        const plan::BackwardPlan& p = l.plan;
        launch_backward(l, prm.p, &prm.p,
                        {kFallbackIndex, p.warps * 32,
                         is_wide(p) ? geometry::bwd_mma_smem_bytes(p.pad_qk, p.pad_v, 64, 64, 1, true)
                                    : geometry::bwd_sm90_smem_bytes(p.pad_qk, p.pad_v, 64, p.block_n, 1)});
    }
};

}  // namespace

const BackwardFamily& bwd_sm90_ws() {
    static const BwdSm90Ws f;
    return f;
}

}  // namespace rtattn::kernels
