// Forward kernel families. A family is one mainloop template (templates/fwd/) and this description of it: what it
// asks of the arch, which flags follow from a tile choice, its shared memory and threads, the stub the renderer
// writes for it, and how a call is launched. The forward tile table (src/plan/forward_tiles.cpp) names a family
// per row; plan, render and launch ask the family and never branch on its knobs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arch/arch.hpp"
#include "common/params.h"
#include "driver/driver.hpp"
#include "kernels/family.hpp"
#include "plan/plan.hpp"
#include "render/render.hpp"
#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::kernels {

// One forward call, its arguments already validated.
struct ForwardLaunch {
    const plan::KernelPlan& plan;
    const AttentionConfig& config;
    const ForwardArgs& args;
    const driver::Module& module;  // functions in the order of the stub's entries
    void* stream;
    int resident_ctas;
};

// What the prefill families share is the default (forward.cpp): sizes without splits, no workspace, a dense batch's
// arguments. The split-KV family and the paged prefill say otherwise.
class ForwardFamily : public Family<plan::KernelPlan, ForwardArgs, ForwardLaunch> {
public:
    // Split-KV families: the key splits a call runs (the others: 1).
    virtual int num_splits(const plan::KernelPlan&, const AttentionConfig&, const CallSizes&) const { return 1; }
    void check_call(const plan::KernelPlan& p, const AttentionConfig& c, const CallSizes& z) const override;
    std::size_t workspace_bytes(const plan::KernelPlan&, const AttentionConfig&, const CallSizes&) const override {
        return 0;
    }
    void validate_args(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a,
                       const CallSizes& z) const override;
};

// The kernel source of a plan: its family's stub, rendered.
render::RenderedSource render_plan(const plan::KernelPlan& p);

// The three forward families.
const ForwardFamily& fwd_mma();      // mma.sync m16n8k16, every arch (fwd/mma.cuh)
const ForwardFamily& fwd_sm90();     // Hopper wgmma, every warp loads and computes (fwd/sm90.cuh)
const ForwardFamily& fwd_sm90_ws();  // Hopper wgmma, producer warpgroup with TMA, consumers overlap (fwd/sm90_ws.cuh)
const ForwardFamily& dec_mma();      // decode: GQA-packed rows, split-KV, dense or paged cache (dec/mma.cuh)
const ForwardFamily* forward_family(const std::string& name);  // nullptr when unknown

// ---- pieces every forward family shares ----------------------------------------------------------------------------

inline constexpr const char* kForwardEntry = "rtattn_fwd_kernel";
// Every forward module's second entry merges two attention states (templates/common/merge.cuh): a warp per row.
inline constexpr const char* kMergeEntry = "rtattn_merge";
inline constexpr int kMergeIndex = 1;
inline constexpr int kMergeThreads = 256;  // merge.cuh's kMergeWarps
// The third, in modules that read a cache (all but varlen): a call's KV append (templates/common/append.cuh), a warp
// per new (token, kv head) row, launched before the attention kernel.
inline constexpr const char* kAppendEntry = "rtattn_kv_append";
inline constexpr int kAppendIndex = 2;
inline constexpr int kAppendThreads = 256;  // append.cuh's kAppendWarps
// The rows a warp-per-row launch of `threads` a CTA holds: its CTAs go along the grid's x, at most 2^31 - 1 of them
// (the merge and the append check their calls against it before launching).
inline constexpr std::int64_t max_warp_rows(int threads) { return std::int64_t(0x7fffffff) * (threads / 32); }

// The traits every forward template reads: head dims and pads, dtype, mask, tile, vector widths.
std::vector<render::Trait> common_traits(const plan::KernelPlan& p);
// A stub spec with the program name, the plan comment and the common traits filled in; the family adds the rest.
render::StubSpec forward_stub(const plan::KernelPlan& p, const char* header, const char* shape, const char* param,
                              const char* kernel_fn);
// log2 of a page size (a power of two, validated); 0 for none.
int page_shift(int page_size);
// How rows of a head dim of 4 mod 8 rotate (common/load.cuh load_rows_rotated; strides in elements, rows at least
// 8-byte aligned): 1 where every row of a sequence and head starts alike modulo 16 bytes, 2 where rows alternate key
// by key (a token stride of 4 mod 8 elements: an odd count of kv heads at d132) and the kernel is built for that
// (`alternate`: decode), 0 otherwise (pages that start unlike each other, or alternating rows elsewhere): the rows
// then move as 8-byte vectors.
int row_rotation(const TensorArg& t, int page_size, bool alternate);
// The parameter block every forward kernel starts with.
FwdParams forward_params(const AttentionConfig& c, const ForwardArgs& a);
// The merge entry over params.batch x heads x seqlen rows.
void launch_merge(const driver::Module& module, const MergeParams& params, void* stream);
// A call's KV append (seqlen_new > 0, validated: check_append), on the call's stream.
void launch_append(const ForwardLaunch& l);
// Grid: x = query block, y = query head, z = batch; one launch of the module's first entry.
void launch_forward_grid(const ForwardLaunch& l, void* params);

}  // namespace rtattn::kernels
