#include "compile/compile.hpp"

#include <dlfcn.h>
#include <nvrtc.h>

#include <chrono>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "core/errors.hpp"
#include "util/format.hpp"

namespace rtattn::compile {

namespace {

// NVRTC is found at run time, as the driver is: linked, the library (and a wheel that carries it) would load only
// where NVRTC sits at the path it was built against. The functions this file calls, by their nvrtc.h names.
struct Nvrtc {
#define RTATTN_NVRTC_FUNCTIONS(X)                                                                            \
    X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcCompileProgram) X(nvrtcDestroyProgram) \
    X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)
#define RTATTN_DECLARE(name) decltype(&::name) name = nullptr;
    RTATTN_NVRTC_FUNCTIONS(RTATTN_DECLARE)
#undef RTATTN_DECLARE
};

// Where NVRTC is looked for, in order: $RTATTN_NVRTC (a file), the loader's own search (LD_LIBRARY_PATH, ld.so.cache),
// the toolkit this library was built with, $CUDA_HOME, $CUDA_PATH and /usr/local/cuda.
std::vector<std::string> nvrtc_candidates() {
    if (const char* f = std::getenv("RTATTN_NVRTC"); f && *f) return {f};  // set on purpose: nothing else
    const std::string soname = RTATTN_NVRTC_SONAME;  // the toolkit's, e.g. libnvrtc.so.13 (CMake)
    std::vector<std::string> c = {soname};
#ifdef RTATTN_NVRTC_BUILD_DIR
    c.push_back(std::string(RTATTN_NVRTC_BUILD_DIR) + "/" + soname);
#endif
    for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
        if (const char* d = std::getenv(var); d && *d) c.push_back(std::string(d) + "/lib64/" + soname);
    c.push_back("/usr/local/cuda/lib64/" + soname);
    return c;
}

Nvrtc load_nvrtc() {
    std::string tried;
    void* lib = nullptr;
    for (const std::string& path : nvrtc_candidates()) {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib) break;
        const char* why = dlerror();
        tried += util::format("\n  {}: {}", path, why ? why : "not found");
    }
    if (!lib)
        throw CompileError(util::format("NVRTC ({}, the CUDA runtime compiler) was not found; it compiles every "
                                        "kernel and names the cache's keys. Install the CUDA toolkit's NVRTC (or "
                                        "pip's nvidia-cuda-nvrtc) and put it on LD_LIBRARY_PATH, or set RTATTN_NVRTC "
                                        "to the file. Tried:{}",
                                        RTATTN_NVRTC_SONAME, tried),
                           "", "", "");
    Nvrtc n;
    auto resolve = [&](const char* symbol, void** slot) {
        *slot = dlsym(lib, symbol);
        if (!*slot) throw CompileError(util::format("the NVRTC found lacks {}", symbol), "", "", "");
    };
#define RTATTN_RESOLVE(name) resolve(#name, reinterpret_cast<void**>(&n.name));
    RTATTN_NVRTC_FUNCTIONS(RTATTN_RESOLVE)
#undef RTATTN_RESOLVE
    return n;
}

const Nvrtc& nvrtc() {
    // A failed load is retried on the next call (the error is rethrown each time, never cached as success).
    static std::mutex mu;
    static std::unique_ptr<Nvrtc> table;
    std::lock_guard<std::mutex> lock(mu);
    if (!table) table = std::make_unique<Nvrtc>(load_nvrtc());
    return *table;
}

void check(nvrtcResult r, const char* call) {
    if (r != NVRTC_SUCCESS) throw Error(util::format("{} failed: {}", call, nvrtc().nvrtcGetErrorString(r)));
}

struct Program {
    nvrtcProgram p = nullptr;
    ~Program() {
        if (p) nvrtc().nvrtcDestroyProgram(&p);
    }
};

}  // namespace

std::vector<std::string> options_for(const std::string& arch) {
    // -std=c++17: the templates use if constexpr. --ptxas-options=-v: registers and spills land in the log, so
    // every compile reports them. No include paths: the templates need no toolkit headers.
    return {"--gpu-architecture=" + arch, "-std=c++17", "--ptxas-options=-v", "-default-device"};
}

std::string join_options(const std::vector<std::string>& opts) {
    return util::format("{}", fmt::join(opts, " "));
}

std::string nvrtc_version() {
    int major = 0, minor = 0;
    check(nvrtc().nvrtcVersion(&major, &minor), "nvrtcVersion");
    return util::format("{}.{}", major, minor);
}

PtxasReport parse_ptxas(const std::string& log, const std::string& entry) {
    // ptxas -v prints, per function: "Function properties for <entry>", then a line with stack and spill bytes,
    // then "Used N registers, used M barriers". Parse line by line from the entry's block on (or from the top when
    // the block header is missing), taking the first match of each figure. The header must name the entry whole:
    // rtattn_bwd_main_cp's block is not rtattn_bwd_main's.
    PtxasReport r;
    const std::string header = "Function properties for " + entry;
    std::size_t at = log.find(header);
    while (at != std::string::npos && at + header.size() < log.size() &&
           (std::isalnum(static_cast<unsigned char>(log[at + header.size()])) || log[at + header.size()] == '_'))
        at = log.find(header, at + 1);
    if (at == std::string::npos) at = 0;
    auto number_before = [&](std::size_t pos) {  // the integer that ends just before `pos` (skipping spaces)
        std::size_t end = pos;
        while (end > 0 && log[end - 1] == ' ') --end;
        std::size_t begin = end;
        while (begin > 0 && std::isdigit(static_cast<unsigned char>(log[begin - 1]))) --begin;
        return begin < end ? std::stoi(log.substr(begin, end - begin)) : -1;
    };
    auto figure_before = [&](const char* label) {
        const std::size_t pos = log.find(label, at);
        return pos == std::string::npos ? -1 : number_before(pos);
    };
    r.stack_bytes = figure_before("bytes stack frame");
    r.spill_store_bytes = figure_before("bytes spill stores");
    r.spill_load_bytes = figure_before("bytes spill loads");
    r.registers = figure_before("registers");
    r.barriers = figure_before("barriers");
    return r;
}

Compiled compile(const render::RenderedSource& src, const std::string& arch) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto opts = options_for(arch);
    Compiled out;
    out.options = join_options(opts);

    std::vector<const char*> header_texts, header_names, opt_ptrs;
    for (const auto& h : *src.headers) {
        header_texts.push_back(h.text.c_str());
        header_names.push_back(h.name.c_str());
    }
    for (const auto& o : opts) opt_ptrs.push_back(o.c_str());

    const Nvrtc& n = nvrtc();
    Program prog;
    check(n.nvrtcCreateProgram(&prog.p, src.stub.c_str(), src.name.c_str(), int(header_texts.size()),
                             header_texts.data(), header_names.data()),
          "nvrtcCreateProgram");
    const nvrtcResult result = n.nvrtcCompileProgram(prog.p, int(opt_ptrs.size()), opt_ptrs.data());
    size_t log_size = 0;
    n.nvrtcGetProgramLogSize(prog.p, &log_size);
    out.log.resize(log_size);
    if (log_size) n.nvrtcGetProgramLog(prog.p, out.log.data());
    while (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
    if (result != NVRTC_SUCCESS)
        throw CompileError(util::format("NVRTC could not compile {} for {}: {}", src.name, arch,
                                        n.nvrtcGetErrorString(result)),
                           out.log, out.options, src.full_text());

    size_t cubin_size = 0;
    check(n.nvrtcGetCUBINSize(prog.p, &cubin_size), "nvrtcGetCUBINSize");
    out.cubin.resize(cubin_size);
    check(n.nvrtcGetCUBIN(prog.p, out.cubin.data()), "nvrtcGetCUBIN");
    out.ptxas = parse_ptxas(out.log, src.entries.empty() ? "" : src.entries.front());
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

}  // namespace rtattn::compile
