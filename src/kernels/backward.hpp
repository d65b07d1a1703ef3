// Backward kernel families. A family is one template folder entry (templates/bwd/) and this description of it: its
// shared memory and threads, the stub (three entries: its main kernel, then the shared preprocess and postprocess)
// and how a call is launched.
// The backward tile table (src/plan/backward_tiles.cpp) names a family per row.
#pragma once
#include <set>
#include <string>

#include "arch/arch.hpp"
#include "common/params.h"
#include "driver/driver.hpp"
#include "kernels/family.hpp"
#include "plan/backward.hpp"
#include "render/render.hpp"
#include "core/config.hpp"
#include "rtattn/types.hpp"

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
    int window_size_left = -1, window_size_right = -1;  // local: as BackwardArgs
    const float* sinks = nullptr;  // sinks: as BackwardArgs
    float* dsinks = nullptr;
    float softcap = 0;  // softcap: as BackwardArgs
    const float* alibi_slopes = nullptr;  // alibi: as BackwardArgs
    std::int64_t alibi_slopes_batch_stride = 0;
};

struct BackwardLaunch {
    const plan::BackwardPlan& plan;
    const AttentionConfig& config;
    const BackwardCall& call;
    const driver::Module& module;  // functions in the order of the stub's entries
    void* stream;
};

// What every backward family shares is the default (backward.cpp): the call's sizes, the plan's workspace, the
// arguments of a dense or packed batch.
class BackwardFamily : public Family<plan::BackwardPlan, BackwardArgs, BackwardLaunch> {
public:
    void check_call(const plan::BackwardPlan& p, const AttentionConfig& c, const CallSizes& z) const override;
    std::size_t workspace_bytes(const plan::BackwardPlan& p, const AttentionConfig& c,
                                const CallSizes& z) const override;
    void validate_args(const plan::BackwardPlan& p, const AttentionConfig& c, const BackwardArgs& a,
                       const CallSizes& z) const override;
};

const BackwardFamily& bwd_mma();   // mma.sync m16n8k16, every arch (bwd/mma.cuh)
const BackwardFamily& bwd_sm90();  // Hopper wgmma, a warpgroup per 64 keys, sm_90a (bwd/sm90.cuh)
const BackwardFamily& bwd_sm90_ws();  // bwd_sm90's GEMMs with a producer warpgroup: TMA loads, dQ reductions

render::RenderedSource render_backward(const plan::BackwardPlan& p);

// The wgmma widths bwd/sm90.cuh's kernel issues for a plan (both operands from shared memory: ss; A from registers:
// rs), for the families whose modules hold it.
void bwd_sm90_widths(const plan::BackwardPlan& p, std::set<int>& ss, std::set<int>& rs);

// ---- pieces every backward family shares: the row kernels (templates/bwd/rows.cuh) before and after the family's
// main kernel, the parameter block and the workspace's parts (plan::BackwardWorkspace) --------------------------------

// A backward module's entries, in order: the family's main kernel, preprocess, postprocess.
inline constexpr const char* kBackwardMainEntry = "rtattn_bwd_main";
inline constexpr int kBackwardPreIndex = 1, kBackwardPostIndex = 2;
// A stub spec with the program name, the plan comment, the traits every backward template reads and the three
// entries (main calls rtattn::<main_fn><Traits>(params), params declared as main_params); the family adds its own
// traits.
render::StubSpec backward_stub(const plan::BackwardPlan& p, const char* header, const char* shape,
                               const char* main_fn, const char* main_params = "const rtattn::BwdParams params");
// The parameter block: the call's tensors and sizes, the config's heads and scale, the workspace's parts.
BwdParams backward_params(const BackwardLaunch& l);
// The preprocess (before the main kernel: D, LSE in log2 units, the zeroed dQ accumulator) and the postprocess
// (after it: dQ) over every query row of every head and sequence.
void launch_backward_pre(const BackwardLaunch& l, BwdParams& params);
void launch_backward_post(const BackwardLaunch& l, BwdParams& params);
// A whole call: the preprocess, the main kernel (a CTA per key block, kv head and sequence), the postprocess; the
// second form with the family's own parameter block for the main kernel (`main_block`, which holds `prm`) and, where
// `main` names one, another of the module's main kernels (its entry index, threads and shared memory).
struct MainKernel {
    int index = 0, threads = 0, smem_bytes = 0;  // threads 0: the plan's
    int cluster_y = 1;  // > 1: clusters of that many CTAs along y, the grid's y that many times the kv heads
};
void launch_backward(const BackwardLaunch& l);
void launch_backward(const BackwardLaunch& l, BwdParams& prm, void* main_block, MainKernel main = {});

}  // namespace rtattn::kernels
