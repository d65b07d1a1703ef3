#pragma once
#include <memory>

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
};

struct BackwardKernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::BackwardPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
};

}  // namespace rtattn
