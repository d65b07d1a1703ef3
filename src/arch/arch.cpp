#include "arch/arch.hpp"

#include "core/errors.hpp"
#include "util/text.hpp"
#include "util/format.hpp"

namespace rtattn::arch {

namespace {

constexpr Arch kArchs[] = {
    // name     cc      'a'    smem/block    wgmma  tma    setmaxnreg bulk
    {"sm_80", 8, 0, false, 163 * 1024, false, false, false, false, "A100 (164 KB of shared memory per SM)"},
    {"sm_86", 8, 6, false, 99 * 1024, false, false, false, false, "A10, A40, RTX 30xx (100 KB per SM)"},
    {"sm_89", 8, 9, false, 99 * 1024, false, false, false, false, "L4, L40S, RTX 40xx (100 KB per SM)"},
    // Bulk copies are sm_90 itself, not Hopper-only ('a'); the forward kernels use TMA only on sm_90a.
    {"sm_90", 9, 0, false, 227 * 1024, false, false, false, true, "H100, H200 without Hopper-only instructions"},
    {"sm_90a", 9, 0, true, 227 * 1024, true, true, true, true, "H100, H200 (228 KB per SM)"},
};

}  // namespace

const Arch* find(std::string_view name) {
    for (const auto& a : kArchs)
        if (name == a.name) return &a;
    return nullptr;
}

const Arch& get(std::string_view name) {
    if (const Arch* a = find(name)) return *a;
    throw ConfigError("arch", util::format("{} is not supported; allowed: {}", util::quoted(name), known_names()));
}

std::string known_names() {
    std::string s;
    for (const auto& a : kArchs) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

std::string for_device(int major, int minor) {
    for (const auto& a : kArchs)
        if (a.specific && a.major == major && a.minor == minor) return a.name;
    return util::format("sm_{}{}", major, minor);
}

bool runs_on(const Arch& a, int major, int minor) {
    if (a.specific) return major == a.major && minor == a.minor;
    return major == a.major && minor >= a.minor;  // SASS runs on later minors of the same major
}

}  // namespace rtattn::arch
