// The decode family (templates/dec/mma.cuh): a few query tokens per sequence against a dense or paged KV cache, the
// query heads of a KV group packed into one CTA's rows, keys split across CTAs when the batch leaves SMs idle, and a
// combine kernel over the splits. Runs on every arch the library knows.
#include "util/format.hpp"

#include <algorithm>
#include <cmath>

#include "common/geometry.h"
#include "kernels/args.hpp"
#include "kernels/forward.hpp"
#include "core/errors.hpp"

namespace rtattn::kernels {

namespace {

constexpr const char* kCombineEntry = "rtattn_dec_combine";
constexpr int kCombineIndex = kAppendIndex + 1;
constexpr int kCombineWarps = 4;  // dec/mma.cuh's kDecCombineWarps

int row_blocks(const plan::KernelPlan& p, const AttentionConfig& c, int seqlen_q) {
    const int rows = c.num_heads_q / c.num_heads_kv * seqlen_q;
    return (rows + p.block_m - 1) / p.block_m;
}

// The kernel for rows that alternate: packed K/V rows of the config's kv heads are 8 bytes past a 16-byte multiple.
bool alternates(const plan::KernelPlan& p) {
    return !p.kv_rows_16b && (geometry::rotated_rows(p.head_dim_qk, p.vec_qk) || geometry::rotated_rows(p.head_dim_v, p.vec_v));
}

class DecMma final : public ForwardFamily {
public:
    const char* name() const override { return "dec_mma"; }
    bool runs_on(const arch::Arch&) const override { return true; }
    int threads(const plan::KernelPlan& p) const override { return p.warps * 32; }
    int smem_bytes(const plan::KernelPlan& p) const override {
        return geometry::dec_mma_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.warps,
                                            alternates(p) && geometry::rotated_rows(p.head_dim_qk, p.vec_qk));
    }
    std::string describe(const plan::KernelPlan& p) const override {
        return util::format("mma.sync decode, split-KV{}{}", p.paged_kv ? ", paged KV cache" : "",
                            alternates(p) ? ", rows by key parity" : "");
    }
    render::StubSpec stub(const plan::KernelPlan& p) const override {
        render::StubSpec s = forward_stub(p, "dec/mma.cuh", "DecShape", "const rtattn::DecParams params", "flash_decode");
        s.program = util::format("rtattn_dec_d{}x{}_{}{}{}_{}.cu", p.head_dim_qk, p.head_dim_v,
                                 p.bf16 ? "bf16" : "fp16", p.mask.suffix(), p.paged_kv ? "_paged" : "", p.arch);
        s.traits.push_back({"int", "kMTiles", std::to_string(p.m_tiles)});
        s.traits.push_back(render::bool_trait("kAlternate", alternates(p)));
        // The fourth entry, after the main, merge and append ones.
        s.entries.push_back({kCombineEntry, "const rtattn::DecParams params",
                             "rtattn::flash_decode_combine<Traits>(params)", kCombineWarps * 32});
        return s;
    }

    // Splits: enough CTAs to fill the device's slots in whole waves. For each count up to the cap, the waves' fill
    // (work over the slots the waves hold); the fewest splits within 5% of the best fill win (each split adds a
    // partial result and the combine's reads). A split keeps at least 4 key tiles, so the combine never outweighs
    // the work. Grids of a wave or more count too: 64 sequences x 5 kv heads are 1.2 waves of 2 x 132 slots (H200:
    // 65% of the copy bandwidth at d128), 4 splits 4.8 waves (87%).
    int num_splits(const plan::KernelPlan& p, const AttentionConfig& c, const CallSizes& z) const override {
        if (z.num_splits > 0) return z.num_splits;
        const long long ctas = (long long)z.batch * c.num_heads_kv * row_blocks(p, c, z.seqlen_q);
        const int tiles = (z.seqlen_k + p.block_n - 1) / p.block_n;
        const int cap = std::max(1, std::min(geometry::kDecMaxSplits, tiles / 4));
        const int slots = std::max(1, z.resident_ctas);
        auto fill = [&](int s) {
            const double waves = double(ctas * s) / slots;
            return waves / std::ceil(waves);
        };
        double best = 0;
        for (int s = 1; s <= cap; ++s) best = std::max(best, fill(s));
        for (int s = 1; s <= cap; ++s)
            if (fill(s) >= 0.95 * best) return s;
        return 1;
    }
    // Decode calls: 1..16 query tokens, and the split count the caller may fix.
    void check_call(const plan::KernelPlan&, const AttentionConfig&, const CallSizes& z) const override {
        check_sizes(z.batch, z.seqlen_q, z.seqlen_k);
        if (z.seqlen_q > kDecodeMaxSeqlenQ)
            throw ArgumentError("seqlen_q", util::format("{} is above the decode limit; decode configs take 1..{} "
                                                         "query tokens per sequence (use a prefill config for more)",
                                                         z.seqlen_q, kDecodeMaxSeqlenQ));
        if (z.num_splits < 0 || z.num_splits > geometry::kDecMaxSplits)
            throw ArgumentError("num_splits", util::format("{} is out of range; allowed 0 (the library chooses) or "
                                                           "1..{}",
                                                           z.num_splits, geometry::kDecMaxSplits));
    }
    // The queries, the cache (dense or paged), then the workspace the call's splits need.
    void validate_args(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a,
                       const CallSizes& z) const override {
        check_call(p, c, z);
        check_forward_queries(p, c, a);
        check_cache(p, c, a);
        check_workspace(a.workspace, a.workspace_bytes, workspace_bytes(p, c, z),
                        util::format("batch {}, seqlen_q {}, seqlen_k {}, {} splits", a.batch, a.seqlen_q, a.seqlen_k,
                                     num_splits(p, c, z))
                            .c_str());
    }
    std::size_t workspace_bytes(const plan::KernelPlan& p, const AttentionConfig& c,
                                const CallSizes& z) const override {
        const int splits = num_splits(p, c, z);
        if (splits == 1) return 0;
        const std::size_t rows = std::size_t(splits) * z.batch * c.num_heads_q * z.seqlen_q;
        const std::size_t o = (rows * p.pad_v * 4 + 255) / 256 * 256;
        return o + (rows * 4 + 255) / 256 * 256;
    }

    void launch(const ForwardLaunch& l) const override {
        const ForwardArgs& a = l.args;
        const AttentionConfig& c = l.config;
        const CallSizes z{a.batch, a.seqlen_q, a.seqlen_k, a.num_splits, l.resident_ctas};
        DecParams prm{};
        const FwdParams f = forward_params(c, a);
        prm.q = f.q, prm.k = f.k, prm.v = f.v, prm.o = f.o, prm.lse = f.lse;
        prm.q_batch_stride = f.q_batch_stride, prm.q_seq_stride = f.q_seq_stride, prm.q_head_stride = f.q_head_stride;
        prm.k_batch_stride = f.k_batch_stride, prm.k_seq_stride = f.k_seq_stride, prm.k_head_stride = f.k_head_stride;
        prm.v_batch_stride = f.v_batch_stride, prm.v_seq_stride = f.v_seq_stride, prm.v_head_stride = f.v_head_stride;
        prm.o_batch_stride = f.o_batch_stride, prm.o_seq_stride = f.o_seq_stride, prm.o_head_stride = f.o_head_stride;
        prm.seqlens_k = a.seqlens_k;
        prm.block_table = a.block_table;
        prm.block_table_stride = a.block_table_stride;
        prm.page_shift = page_shift(a.page_size);
        prm.num_pages = a.num_pages;
        prm.seqlen_q = a.seqlen_q, prm.seqlen_k = a.seqlen_k, prm.batch = a.batch;
        prm.heads_q = c.num_heads_q, prm.q_per_kv = f.q_per_kv;
        prm.row_blocks = row_blocks(l.plan, c, a.seqlen_q);
        prm.num_splits = num_splits(l.plan, c, z);
        prm.scale = f.scale, prm.scale_log2 = f.scale_log2;
        prm.rotate_k = row_rotation(a.k, a.page_size, alternates(l.plan));
        prm.rotate_v = row_rotation(a.v, a.page_size, alternates(l.plan));
        prm.window_left = f.window_left, prm.window_right = f.window_right;
        prm.sinks = f.sinks;
        prm.softcap_scale = f.softcap_scale;
        prm.alibi_slopes = f.alibi_slopes, prm.alibi_batch_stride = f.alibi_batch_stride;
        prm.alibi_scale = f.alibi_scale;
        prm.seqlen_new = f.seqlen_new;
        if (prm.num_splits > 1) {
            const std::size_t rows = std::size_t(prm.num_splits) * a.batch * c.num_heads_q * a.seqlen_q;
            auto* base = static_cast<unsigned char*>(a.workspace);
            prm.part_o = reinterpret_cast<float*>(base);
            prm.part_lse = reinterpret_cast<float*>(base + (rows * l.plan.pad_v * 4 + 255) / 256 * 256);
        }
        void* args[] = {&prm};
        const auto stream = static_cast<CUstream>(l.stream);
        auto& api = driver::api();
        driver::check(api.cuLaunchKernel(l.module.functions.at(0), unsigned(prm.num_splits),
                                         unsigned(c.num_heads_kv * prm.row_blocks), unsigned(a.batch),
                                         unsigned(l.plan.threads()), 1, 1, unsigned(l.plan.smem_bytes), stream, args,
                                         nullptr),
                      "cuLaunchKernel");
        if (prm.num_splits == 1) return;
        const long long rows = (long long)a.batch * c.num_heads_q * a.seqlen_q;
        driver::check(api.cuLaunchKernel(l.module.functions.at(kCombineIndex),
                                         unsigned((rows + kCombineWarps - 1) / kCombineWarps), 1, 1, kCombineWarps * 32,
                                         1, 1, 0, stream, args, nullptr),
                      "cuLaunchKernel");
    }
};

}  // namespace

const ForwardFamily& dec_mma() {
    static const DecMma f;
    return f;
}

}  // namespace rtattn::kernels
