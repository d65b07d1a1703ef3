// render(): KernelPlan -> CUDA source. The kernel is real CUDA in templates/; the renderer only writes a short
// stub (a traits struct and one extern "C" entry), so the text is deterministic and hashable.
#pragma once
#include <string>
#include <vector>

#include "plan/plan.hpp"
#include "render/templates.hpp"

namespace rtattn::render {

inline constexpr const char* kEntryName = "rtattn_fwd_kernel";

struct RenderedSource {
    std::string name;                    // program name given to NVRTC
    std::string stub;                    // the generated translation unit
    std::shared_ptr<const std::vector<TemplateFile>> headers;  // everything the stub includes
    std::string entry = kEntryName;

    // Stub and headers as one text: what `rtattn render` prints and what the cache key hashes.
    std::string full_text() const;
};

RenderedSource render(const plan::KernelPlan& plan);

}  // namespace rtattn::render
