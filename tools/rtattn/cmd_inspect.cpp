// The commands that show what the library does with a config: render (the CUDA source, ptxas figures, or the files
// for nvcc) and info (library, device, cache and plan). They resolve configs as the Runtime does and open no cache
// for writing.
#include "util/format.hpp"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>

#include "api/resolver.hpp"
#include "common.hpp"
#include "compile/compile.hpp"
#include "driver/driver.hpp"

namespace rtattn::cli {

namespace {

namespace fs = std::filesystem;

struct RenderArgs {
    ConfigFlagOptions config;
    bool verbose = false;
    bool backward = false;
    std::string out_dir, cubin;
};

// The Runtime's resolver, built from the same options, without the Runtime's cache.
std::shared_ptr<const Resolved> resolve_one(const GlobalOptions& g, const AttentionConfig& c) {
    return Resolver(plan_options(runtime_options(g))).resolve(c);
}
std::shared_ptr<const ResolvedBackward> resolve_backward_one(const GlobalOptions& g, const AttentionConfig& c) {
    return Resolver(plan_options(runtime_options(g))).resolve_backward(c);
}

// What render needs of a forward or backward resolution.
struct RenderTarget {
    AttentionConfig config;
    render::RenderedSource source;
    int smem_bytes = 0;
};

void write_file(const fs::path& p, const std::string& text) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
    std::ofstream out(p, std::ios::binary);
    out << text;
    if (!out) throw Error(util::format("cannot write {}", p.string()));
}

// The stub and every header as files, laid out as the stub includes them: `nvcc -I DIR` compiles them as they are.
int write_sources(const RenderTarget& r, const std::string& dir) {
    const fs::path root(dir);
    write_file(root / r.source.name, r.source.stub);
    for (const auto& h : *r.source.headers) write_file(root / h.name, h.text);
    util::print("wrote {} and {} headers to {}\ncompile with: nvcc -std=c++17 -arch={} -cubin -I {} {}\n",
                r.source.name, r.source.headers->size(), dir, r.config.arch, dir, (root / r.source.name).string());
    return kOk;
}

int render(const GlobalOptions& g, const RenderArgs& a) {
    const AttentionConfig config = single_config(a.config.get());
    RenderTarget target;
    if (a.backward) {
        const auto b = resolve_backward_one(g, config);
        target = {b->config, b->source, b->plan.smem_bytes};
    } else {
        const auto f = resolve_one(g, config);
        target = {f->config, f->source, f->plan.smem_bytes};
    }
    const RenderTarget* r = &target;
    if (!a.out_dir.empty()) return write_sources(*r, a.out_dir);
    if (!a.cubin.empty()) {  // for cuobjdump, or tools/bench/cubin_code.py comparing two builds
        const auto out = compile::compile(r->source, r->config.arch);
        write_file(a.cubin, out.cubin);
        util::print("wrote {} ({} bytes, {} for {})\n", a.cubin, out.cubin.size(), r->config.describe(),
                    r->config.arch);
        return kOk;
    }
    util::print("{}", r->source.full_text());
    if (!a.verbose) return kOk;
    // Appended as comments, so the output stays a valid CUDA file when redirected.
    const auto out = compile::compile(r->source, r->config.arch);
    const auto& p = out.ptxas;
    util::print("\n// ===== rtattn render --verbose: {} =====\n", r->config.describe());
    util::print("// registers: {}\n// spill stores: {} bytes, spill loads: {} bytes\n// stack: {} bytes\n"
                "// barriers: {}\n// shared memory: {} bytes (dynamic)\n// compile: {:.3f} s (NVRTC {}, {} bytes of "
                "cubin)\n// options: {}\n",
                figure(p.registers), figure(p.spill_store_bytes), figure(p.spill_load_bytes), figure(p.stack_bytes),
                figure(p.barriers), r->smem_bytes, out.seconds, compile::nvrtc_version(), out.cubin.size(),
                out.options);
    if (p.registers < 0) {
        std::string log = out.log.empty() ? "(empty)" : out.log;
        for (auto at = log.find('\n'); at != std::string::npos; at = log.find('\n', at + 4))
            log.replace(at, 1, "\n// ");  // keep the output a valid CUDA file
        util::print("// the NVRTC log has no ptxas report for {}:\n// {}\n", r->source.entries.at(0), log);
    }
    return kOk;
}

json device_json() {
    if (!driver::gpu_available()) return nullptr;
    try {
        const auto d = driver::current_device();
        json j;
        j["name"] = d.name;
        j["cc"] = util::format("{}.{}", d.cc_major, d.cc_minor);
        j["sms"] = d.sms;
        j["arch"] = d.arch();
        j["smem_optin"] = d.smem_optin;
        j["driver_version"] = d.driver_version;
        return j;
    } catch (const CudaError& e) {
        // A driver that loads but cannot give a context is worth showing, not failing on.
        return json{{"error", e.what()}};
    }
}

json cache_json(const cache::DiskCache& disk) {
    json j;
    j["dir"] = disk.dir();
    j["state"] = disk.state_name();
    j["problem"] = disk.problem().empty() ? json(nullptr) : json(disk.problem());
    j["entries"] = std::string(disk.state_name()) != "off" ? json(disk.list().size()) : json(nullptr);
    j["total_bytes"] = disk.total_bytes();
    return j;
}

json plan_info_json(const Resolved& r, const cache::DiskCache& disk) {
    std::error_code ec;
    json j;
    j["config"] = json::parse(r.config.to_json());
    j["describe"] = r.config.describe();
    j["plan"] = json::parse(plan::plan_json(r.plan));
    j["key"] = r.key;
    // Whether an entry file is there (not whether it verifies: `rtattn verify` does that); links do not count.
    j["cached"] = fs::is_regular_file(fs::symlink_status(disk.entry_path(r.key), ec));
    return j;
}

// The backward plan, and the workspace a call needs per query token (for heads_q of the config).
json backward_info_json(const ResolvedBackward& r, const cache::DiskCache& disk) {
    std::error_code ec;
    json j;
    j["plan"] = json::parse(plan::backward_plan_json(r.plan));
    j["kernel"] = r.plan.kernel();
    j["key"] = r.key;
    j["cached"] = fs::is_regular_file(fs::symlink_status(disk.entry_path(r.key), ec));
    const int tokens = 1 << 16;  // large enough that the per-block rounding and alignment vanish
    j["workspace_bytes_per_query_token"] =
        double(r.plan.workspace(1, r.config.num_heads_q, tokens).bytes) / double(tokens);
    return j;
}

void print_backward_text(const json& b) {
    if (b.contains("unavailable")) {  // a config whose forward runs and whose backward cannot be planned
        util::print("backward plan: none ({})\n", b["unavailable"].get<std::string>());
        return;
    }
    const json& p = b["plan"];
    util::print("backward plan:\n");
    util::print("  kernel: {} ({})\n", b["kernel"].get<std::string>(), p["family"].get<std::string>());
    util::print("  head dims padded: qk {}, v {}\n", p["pad_qk"].get<int>(), p["pad_v"].get<int>());
    util::print("  tiles: {} query rows x {} keys per CTA, {} warps, {} Q/dO buffer(s)\n", p["block_m"].get<int>(),
                p["block_n"].get<int>(), p["warps"].get<int>(), p["stages"].get<int>());
    util::print("  shared memory: {} bytes\n", p["smem_bytes"].get<int>());
    util::print("  workspace: {:.1f} bytes per query token (batch x seqlen_q of them)\n",
                b["workspace_bytes_per_query_token"].get<double>());
    util::print("  reason: {}\n", p["reason"].get<std::string>());
    util::print("  cache key: {} ({})\n", b["key"].get<std::string>(),
                b["cached"].get<bool>() ? "cached" : "not cached");
}

void print_info_text(const json& j) {
    util::print("rtattn {}\nNVRTC {}\n", j["version"].get<std::string>(), j["nvrtc"].get<std::string>());
    const json& d = j["device"];
    if (d.is_null())
        util::print("device: no GPU\n");
    else if (d.contains("error"))
        util::print("device: error: {}\n", d["error"].get<std::string>());
    else
        util::print("device: {} (compute capability {}, {} SMs, arch {}, driver {})\n", d["name"].get<std::string>(),
                    d["cc"].get<std::string>(), d["sms"].get<int>(), d["arch"].get<std::string>(),
                    d["driver_version"].get<int>());
    const json& c = j["cache"];
    const std::string state = c["state"].get<std::string>();
    if (state == "usable")
        util::print("cache: {}, {} entries, {}\n", c["dir"].get<std::string>(), c["entries"].get<int>(),
                    human_bytes(c["total_bytes"].get<std::uint64_t>()));
    else
        util::print("cache: {} ({}{})\n", c["dir"].get<std::string>(), state,
                    c["problem"].is_null() ? "" : ": " + c["problem"].get<std::string>());
    if (!j.contains("plan")) return;
    const json& info = j["plan"];
    const json& p = info["plan"];
    const double useful = p["useful_flop_fraction"].get<double>();
    util::print("plan for {}:\n", info["describe"].get<std::string>());
    util::print("  head dims: qk {} -> padded {}, v {} -> padded {}\n", p["head_dim_qk"].get<int>(),
                p["pad_qk"].get<int>(), p["head_dim_v"].get<int>(), p["pad_v"].get<int>());
    util::print("  kernel: {} ({})\n", p["kernel"].get<std::string>(), p["family"].get<std::string>());
    util::print("  tiles: {}x{} (block_m x block_n), {} MMA warps, {} threads, {} stage(s)\n", p["block_m"].get<int>(),
                p["block_n"].get<int>(), p["warps"].get<int>(), p["threads"].get<int>(), p["stages"].get<int>());
    util::print("  shared memory: {} bytes\n", p["smem_bytes"].get<int>());
    util::print("  vector width: {} elements for Q/K, {} for V/O: pointers and strides must be multiples\n",
                p["vec_qk"].get<int>(), p["vec_v"].get<int>());
    util::print("  useful/issued FLOPs: {:.4f} ({:.1f}% spent on padding)\n", useful, 100 * (1 - useful));
    util::print("  reason: {}\n", p["reason"].get<std::string>());
    util::print("  cache key: {} ({})\n", info["key"].get<std::string>(),
                info["cached"].get<bool>() ? "cached" : "not cached");
    if (j.contains("backward")) print_backward_text(j["backward"]);
}

int info(const GlobalOptions& g, const tool::ConfigFlags& flags, bool as_json) {
    json j;
    j["version"] = version();
    j["nvrtc"] = compile::nvrtc_version();
    j["device"] = device_json();
    const auto disk = open_disk_cache(g);
    j["cache"] = cache_json(*disk);
    if (flags.any_shape_flag() || !flags.archs.empty()) {
        const AttentionConfig config = single_config(flags);
        j["plan"] = plan_info_json(*resolve_one(g, config), *disk);
        if (!config.decode && !config.paged_kv) {
            try {
                j["backward"] = backward_info_json(*resolve_backward_one(g, config), *disk);
            } catch (const ConfigError& e) {  // the forward's plan stands; say why there is no backward
                j["backward"] = json{{"unavailable", e.what()}};
            }
        }
    }
    if (as_json)
        util::print("{}\n", dump(std::move(j)));
    else
        print_info_text(j);
    return kOk;
}

}  // namespace

void add_inspect_commands(CLI::App& app, const GlobalOptions& g, Action& action) {
    auto r = std::make_shared<RenderArgs>();
    auto* render_cmd = app.add_subcommand("render", "print the CUDA source rendered for one config");
    add_config_flags(render_cmd, r->config, /*lists=*/false);
    render_cmd->add_flag("-v,--verbose", r->verbose,
                         "also compile with NVRTC and report registers, spills, stack, barriers, shared memory, time");
    render_cmd->add_option("--out-dir", r->out_dir, "write the stub and its headers as files nvcc compiles as they are")
        ->type_name("DIR");
    render_cmd->add_flag("--backward", r->backward, "the backward kernels (preprocess, main, postprocess) instead");
    render_cmd->add_option("--cubin", r->cubin, "compile with NVRTC and write the cubin to FILE")->type_name("FILE");
    render_cmd->callback([&action, &g, r] { action = [&g, r] { return render(g, *r); }; });

    struct InfoArgs {
        ConfigFlagOptions config;
        bool json = false;
    };
    auto i = std::make_shared<InfoArgs>();
    auto* info_cmd = app.add_subcommand("info", "library, NVRTC, device and cache; with config flags also the plan");
    add_config_flags(info_cmd, i->config, /*lists=*/false);
    info_cmd->add_flag("--json", i->json, "print JSON");
    info_cmd->callback([&action, &g, i] { action = [&g, i] { return info(g, i->config.get(), i->json); }; });
}

}  // namespace rtattn::cli
