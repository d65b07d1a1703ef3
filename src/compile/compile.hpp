// compile(): rendered source -> cubin through NVRTC. The only file that includes nvrtc.h.
#pragma once
#include <string>
#include <vector>

#include "render/render.hpp"

namespace rtattn::compile {

struct PtxasReport {
    int registers = -1;
    int spill_store_bytes = -1, spill_load_bytes = -1;
    int stack_bytes = -1;
    int barriers = -1;
};

struct Compiled {
    std::string cubin;
    std::string log;       // full NVRTC/ptxas log
    std::string options;   // space-joined options, as given to NVRTC
    PtxasReport ptxas;
    double seconds = 0;
};

// Canonical NVRTC options for an arch (part of the cache key).
std::vector<std::string> options_for(const std::string& arch);
std::string join_options(const std::vector<std::string>& opts);

// Throws CompileError carrying the log, options and the rendered source.
Compiled compile(const render::RenderedSource& src, const std::string& arch);

std::string nvrtc_version();  // e.g. "13.0"

PtxasReport parse_ptxas(const std::string& log, const std::string& entry);

}  // namespace rtattn::compile
