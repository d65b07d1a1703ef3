// One interface for every kernel family of both passes: what it asks of the arch, what its plan settles once a tile
// is chosen, its threads and shared memory, its description, the stub the renderer writes, what a call may pass
// (its sizes and arguments, the workspace it needs) and how it launches. A pass's families derive from
// Family<its plan, its arguments, its launch> (forward.hpp, backward.hpp); api/ asks the family and never branches
// on what kind of kernel it holds.
#pragma once
#include <cstddef>
#include <string>

#include "arch/arch.hpp"
#include "render/render.hpp"
#include "core/config.hpp"

namespace rtattn::kernels {

// The sizes of a call that fix its grid and workspace, and the device's room for the kernel's CTAs.
struct CallSizes {
    int batch = 0, seqlen_q = 0, seqlen_k = 0;
    int num_splits = 0;     // the caller's (0: the family chooses; only split-KV families take more than 1)
    int resident_ctas = 0;  // CTAs of this kernel the device holds at once (SMs x CTAs per SM)
};

template <class Plan, class Args, class Launch>
class Family {
public:
    virtual ~Family() = default;
    // Stable id, in plans, cache entries and `rtattn info`: "fwd_sm90_ws", "bwd_mma", ...
    virtual const char* name() const = 0;
    virtual bool runs_on(const arch::Arch& a) const = 0;
    // After the tile choice (and any override): flags that depend on it, checks of what the family can serve. It may
    // hand the plan to another family (the warp-specialized forward does, for head dims TMA cannot address).
    virtual void settle(Plan& p) const { (void)p; }
    virtual int min_stages() const { return 1; }  // fitting shared memory never goes below this
    // Threads of the main kernel's CTA: not the plan's warps x 32 where a producer warpgroup comes on top.
    virtual int threads(const Plan& p) const = 0;
    virtual int smem_bytes(const Plan& p) const = 0;  // from templates/common/geometry.h
    virtual std::string describe(const Plan& p) const = 0;  // "wgmma, swizzled tiles, ..."
    virtual render::StubSpec stub(const Plan& p) const = 0;
    // The sizes a call may have (batch, sequence lengths, query tokens, split count): the same checks for a call and
    // for a workspace query. Throws ArgumentError naming the field.
    virtual void check_call(const Plan& p, const AttentionConfig& c, const CallSizes& z) const = 0;
    // Device workspace bytes a call of these sizes needs (0: none), sizes already checked.
    virtual std::size_t workspace_bytes(const Plan& p, const AttentionConfig& c, const CallSizes& z) const = 0;
    // Every argument of a call against the plan, its sizes and workspace included; throws ArgumentError naming the
    // field. launch() runs only after it.
    virtual void validate_args(const Plan& p, const AttentionConfig& c, const Args& a, const CallSizes& z) const = 0;
    virtual void launch(const Launch& l) const = 0;
};

}  // namespace rtattn::kernels
