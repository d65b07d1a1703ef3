#pragma once
#include <memory>

#include "driver/driver.hpp"
#include "plan/plan.hpp"
#include "core/runtime.hpp"

namespace rtattn {

struct Kernel::Impl {
    AttentionConfig config;  // arch resolved
    plan::KernelPlan plan;
    KernelInfo info;
    std::shared_ptr<driver::Module> module;
};

// Checks every forward() argument against the plan; throws ArgumentError naming the field.
void validate_forward_args(const plan::KernelPlan& plan, const AttentionConfig& config, const ForwardArgs& a);

}  // namespace rtattn
