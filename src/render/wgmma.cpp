// The wgmma instruction wrappers, written per plan. Each width N is its own instruction text with N/2 accumulator
// operands per thread, so the renderer spells out exactly the widths a plan issues.
#include "util/format.hpp"

#include <set>

#include "render/render.hpp"

namespace rtattn::render {

namespace {

// "%0,%1,...,%{n-1}" and the matching "+f"(d[i]) outputs.
std::string operand_list(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += util::format("{}%{}", i ? "," : "", i);
    return s;
}
std::string accumulator_outputs(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += util::format("{}\"+f\"(d[{}])", i ? ", " : "", i);
    return s;
}

std::string ss_wrapper(int n, const char* t) {
    const int acc = n / 2;
    return util::format(R"(    template <bool kTransA = false, bool kTransB = false>
    static __device__ __forceinline__ void ss(float* d, u64 a, u64 b, int accumulate) {{
        asm volatile(
            "{{ .reg .pred p; setp.ne.b32 p, %{pred}, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{regs}}}, %{a}, %{b}, p, 1, 1, %{ta}, %{tb}; }}\n"
            : {outs}
            : "l"(a), "l"(b), "r"(accumulate), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
    }}
)",
                       fmt::arg("n", n), fmt::arg("t", t), fmt::arg("regs", operand_list(acc)),
                       fmt::arg("outs", accumulator_outputs(acc)), fmt::arg("a", acc), fmt::arg("b", acc + 1),
                       fmt::arg("pred", acc + 2), fmt::arg("ta", acc + 3), fmt::arg("tb", acc + 4));
}

std::string rs_wrapper(int n, const char* t) {
    const int acc = n / 2;
    return util::format(R"(    template <bool kTransB>
    static __device__ __forceinline__ void rs(float* d, const u32 (&a)[4], u64 b, int accumulate) {{
        asm volatile(
            "{{ .reg .pred p; setp.ne.b32 p, %{pred}, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{regs}}}, {{%{a0},%{a1},%{a2},%{a3}}}, %{b}, p, 1, 1, %{tr}; }}\n"
            : {outs}
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(kTransB ? 1 : 0));
    }}
)",
                       fmt::arg("n", n), fmt::arg("t", t), fmt::arg("regs", operand_list(acc)),
                       fmt::arg("outs", accumulator_outputs(acc)), fmt::arg("a0", acc), fmt::arg("a1", acc + 1),
                       fmt::arg("a2", acc + 2), fmt::arg("a3", acc + 3), fmt::arg("b", acc + 4),
                       fmt::arg("pred", acc + 5), fmt::arg("tr", acc + 6));
}

}  // namespace

std::string wgmma_wrappers(const std::vector<int>& ss_widths, const std::vector<int>& rs_widths, bool bf16) {
    const std::set<int> ss(ss_widths.begin(), ss_widths.end()), rs(rs_widths.begin(), rs_widths.end());
    std::set<int> widths = ss;
    widths.insert(rs.begin(), rs.end());
    if (widths.empty()) return "";
    const char* t = bf16 ? "bf16" : "f16";
    std::string out = "namespace rtattn {\nnamespace wgmma {\n";
    for (const int n : widths) {
        out += util::format("\ntemplate <> struct Mma<{}, {}> {{\n", n, bf16 ? "true" : "false");
        if (ss.count(n)) out += ss_wrapper(n, t);
        if (rs.count(n)) out += rs_wrapper(n, t);
        out += "};\n";
    }
    return out + "\n}  // namespace wgmma\n}  // namespace rtattn\n";
}

}  // namespace rtattn::render
