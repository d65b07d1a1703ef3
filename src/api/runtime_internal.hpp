// Pieces of the Runtime that the CLI, the bench and tests use directly.
#pragma once
#include <memory>
#include <string>

#include "api/resolver.hpp"
#include "driver/driver.hpp"
#include "core/runtime.hpp"

namespace rtattn {

// The Runtime's resolver: what get() and precompile() use (so `precompile` can tell which configs need a compile).
std::shared_ptr<const Resolved> resolve(Runtime& rt, const AttentionConfig& config);
std::shared_ptr<const ResolvedBackward> resolve_backward(Runtime& rt, const AttentionConfig& config);

// What Runtime::get(config) returns, through the runtime's Impl (a kernel's decode twin is found this way).
std::shared_ptr<const Kernel::Impl> get_kernel(const std::shared_ptr<Runtime::Impl>& rt, const AttentionConfig& config);

// Whether a cubin built for `arch` can run on the device.
bool arch_runs_on(const std::string& arch, const driver::DeviceInfo& dev);

}  // namespace rtattn
