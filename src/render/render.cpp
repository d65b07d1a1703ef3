#include "render/render.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/errors.hpp"
#include "util/format.hpp"

namespace rtattn::render {

std::shared_ptr<const std::vector<TemplateFile>> active_templates() {
    const char* dir = std::getenv("RTATTN_TEMPLATE_DIR");
    // The embedded set is static: an aliasing pointer that owns nothing.
    if (!dir || !*dir) return {std::shared_ptr<void>(), &embedded_templates()};
    auto files = std::make_shared<std::vector<TemplateFile>>();
    for (const auto& t : embedded_templates()) {
        const std::string path = std::string(dir) + "/" + t.name;
        std::ifstream in(path, std::ios::binary);
        if (!in) throw ConfigError("RTATTN_TEMPLATE_DIR", util::format("cannot read {}", path));
        std::stringstream ss;
        ss << in.rdbuf();
        files->push_back({t.name, ss.str()});
    }
    return files;
}

std::string RenderedSource::full_text() const {
    std::string s = stub;
    for (const auto& h : *headers) s += util::format("\n// ===== {} =====\n{}", h.name, h.text);
    return s;
}

RenderedSource render(const StubSpec& spec) {
    RenderedSource r;
    r.name = spec.program;
    r.headers = active_templates();
    std::string traits;
    for (const auto& t : spec.traits) traits += util::format("    static constexpr {} {} = {};\n", t.type, t.name, t.value);
    std::string entries;
    for (const auto& e : spec.entries) {
        entries += util::format("\nextern \"C\" __global__ void __launch_bounds__({}, 1) {}({}) {{\n    {};\n}}\n",
                                e.threads, e.name, e.params, e.call);
        r.entries.push_back(e.name);
    }
    r.stub = util::format(R"({comment}#include "{header}"
{generated}
struct Traits {{
{traits}}};
static_assert(rtattn::{shape}<Traits>::kSmemBytes == {smem}, "host plan and kernel disagree on shared memory");
{entries})",
                         fmt::arg("comment", spec.comment), fmt::arg("header", spec.header),
                         fmt::arg("generated", spec.generated), fmt::arg("traits", traits),
                         fmt::arg("shape", spec.shape), fmt::arg("smem", spec.smem_bytes),
                         fmt::arg("entries", entries));
    return r;
}

}  // namespace rtattn::render
