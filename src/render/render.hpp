// render(): a kernel family's stub spec -> CUDA source. The kernels are real CUDA in templates/; the renderer only
// writes a short stub (a traits struct, generated instruction wrappers, extern "C" entries), so the text is
// deterministic and hashable.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "render/templates.hpp"

namespace rtattn::render {

// One line of the stub's Traits struct: `static constexpr <type> <name> = <value>;`.
struct Trait {
    std::string type, name, value;
};
inline Trait int_trait(const char* name, int v) { return {"int", name, std::to_string(v)}; }
inline Trait bool_trait(const char* name, bool v) { return {"bool", name, v ? "true" : "false"}; }

// One extern "C" kernel of the module.
struct Entry {
    std::string name;    // the symbol, e.g. "rtattn_fwd_kernel"
    std::string params;  // its parameter declaration, e.g. "const rtattn::FwdParams params"
    std::string call;    // what it runs, e.g. "rtattn::flash_fwd<Traits>(params)"
    int threads = 0;     // __launch_bounds__ (one CTA per SM: the kernels size their tiles for that)
};

// What a family asks the renderer to write.
struct StubSpec {
    std::string program;    // NVRTC program name
    std::string comment;    // the stub's opening comment: what is computed and the plan (JSON)
    std::string header;     // the family's template, e.g. "fwd/mma.cuh"
    std::string generated;  // code the family generates for this plan (e.g. the wgmma wrappers it issues)
    std::vector<Trait> traits;
    // `static_assert(<shape><Traits>::kSmemBytes == smem_bytes)`: the kernel and the plan agree on shared memory.
    std::string shape;
    int smem_bytes = 0;
    std::vector<Entry> entries;
};

struct RenderedSource {
    std::string name;                                          // program name given to NVRTC
    std::string stub;                                          // the generated translation unit
    std::shared_ptr<const std::vector<TemplateFile>> headers;  // everything the stub includes
    std::vector<std::string> entries;                          // entry symbols, in the stub's order

    // Stub and headers as one text: what `rtattn render` prints and what the cache key hashes.
    std::string full_text() const;
};

RenderedSource render(const StubSpec& spec);

// wgmma wrappers: a specialization of wgmma::Mma<N, kBF16> per width N, with `ss` (A and B from shared memory) when
// N is in ss_widths and `rs` (A from registers) when in rs_widths. templates/common/wgmma.cuh declares the template.
std::string wgmma_wrappers(const std::vector<int>& ss_widths, const std::vector<int>& rs_widths, bool bf16);

}  // namespace rtattn::render
