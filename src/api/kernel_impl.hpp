#pragma once
#include <memory>
#include <mutex>

#include "driver/driver.hpp"
#include "kernels/forward.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "core/runtime.hpp"

namespace rtattn {

struct Kernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::KernelPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
    int resident_ctas = 0;  // CTAs of the main entry the device holds at once (a split-KV family's wave size)
    // A prefill config's few-query calls run its decode twin (kernel.cpp), looked up on the first such call through
    // the runtime that made this kernel, if that still lives.
    std::weak_ptr<Runtime::Impl> runtime;
    mutable std::once_flag decode_once;          // after the lookup, a call pays one atomic load, no lock
    mutable std::shared_ptr<const Impl> decode;  // null: none (no decode plan, a cache-only miss, a failed compile)
};

struct BackwardKernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::BackwardPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
};

}  // namespace rtattn
