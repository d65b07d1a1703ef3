// Pieces of the Runtime that the CLI and tests use directly.
#pragma once
#include <string>

#include "driver/driver.hpp"
#include "plan/plan.hpp"
#include "render/render.hpp"

namespace rtattn {

// SHA-256 over the rendered source, NVRTC options and version, arch, library and entry-format versions.
std::string cache_key(const render::RenderedSource& src, const std::string& arch);
std::string plan_json(const plan::KernelPlan& p);
// Whether a cubin built for `arch` can run on the device.
bool arch_runs_on(const std::string& arch, const driver::DeviceInfo& dev);

}  // namespace rtattn
