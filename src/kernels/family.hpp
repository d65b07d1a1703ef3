// One interface for every kernel family of both passes: what it asks of the arch, what its plan settles once a tile
// is chosen, its threads and shared memory, its description, the stub the renderer writes and how a call launches.
// A pass's families derive from Family<its plan, its launch> (forward.hpp, backward.hpp) and add only what that
// pass alone has (the forward's split-KV sizes).
#pragma once
#include <string>

#include "arch/arch.hpp"
#include "render/render.hpp"

namespace rtattn::kernels {

template <class Plan, class Launch>
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
    virtual void launch(const Launch& l) const = 0;
};

}  // namespace rtattn::kernels
