// The C ABI's functions (include/rtattn/rtattn.h) over the library's own API (rtattn::core). Conversions only: what a
// call means is decided behind them.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "api/runtime_internal.hpp"
#include "capi/boundary.hpp"
#include "compile/compile.hpp"
#include "core/rtattn.hpp"
#include "rtattn/config_fields.h"

struct rtattn_runtime {
    std::unique_ptr<rtattn::core::Runtime> runtime;
    std::string cache_dir, tile_override;  // what rtattn_runtime_options_get points at
    std::string stats_dir;                 // rtattn_cache_stats.dir: the cache's root, fixed for the runtime's life
    rtattn_log_fn log_callback = nullptr;
    void* log_user_data = nullptr;
    // The strings of infos handed out by rtattn_runtime_plan / _precompile, which live as long as the runtime: each
    // distinct string is kept once and never replaced (a set's nodes do not move), so a second call, or another
    // thread's, never frees what an earlier one handed out.
    std::mutex mu;
    std::set<std::string> strings;
};

struct rtattn_kernel {
    std::atomic<int> refs{1};
    rtattn::core::Kernel kernel;
};

struct rtattn_backward_kernel {
    std::atomic<int> refs{1};
    rtattn::core::BackwardKernel kernel;
};

namespace rtattn::capi {
namespace {

void config_defaults(rtattn_config* c) {
    std::memset(c, 0, sizeof *c);
    const core::AttentionConfig d;
    c->struct_size = sizeof *c;
    c->head_dim_qk = d.head_dim_qk;
    c->dtype = d.dtype == core::Dtype::bf16 ? RTATTN_BF16 : RTATTN_FP16;
    c->num_heads_q = d.num_heads_q;
    c->num_heads_kv = d.num_heads_kv;
}

// The fields as rtattn/config_fields.h lists them, each converted as its kind is. A presence flag (has_<name>) is a
// boolean like the others: any other value is a caller's mistake, not "present".
bool flag_from_c(const char* field, std::int32_t v) {
    if (v != 0 && v != 1) throw core::ConfigError(field, std::to_string(v) + " is not 0 or 1");
    return v != 0;
}
core::Dtype dtype_from_c(std::int32_t v) {
    if (v != RTATTN_FP16 && v != RTATTN_BF16)
        throw core::ConfigError("dtype", std::to_string(v) + " is not RTATTN_FP16 (0) or RTATTN_BF16 (1)");
    return v == RTATTN_BF16 ? core::Dtype::bf16 : core::Dtype::fp16;
}

core::AttentionConfig to_core(const rtattn_config* in) {
    const rtattn_config c = read_struct(in, "config", config_defaults);
    core::AttentionConfig out;
#define RTATTN_TO_CORE_INT(n) out.n = c.n;
#define RTATTN_TO_CORE_OPT_INT(n) \
    if (flag_from_c("has_" #n, c.has_##n)) out.n = c.n;
#define RTATTN_TO_CORE_DTYPE(n) out.n = dtype_from_c(c.n);
#define RTATTN_TO_CORE_FLAG(n) out.n = flag_from_c(#n, c.n);
#define RTATTN_TO_CORE_OPT_DOUBLE(n) RTATTN_TO_CORE_OPT_INT(n)
#define RTATTN_TO_CORE_STRING(n) out.n = c.n ? c.n : "";
#define RTATTN_TO_CORE(n, kind) RTATTN_TO_CORE_##kind(n)
    RTATTN_CONFIG_FIELDS(RTATTN_TO_CORE)
    return out;
}

// `text`: the characters of the STRING field (arch), which must outlive the result.
rtattn_config from_core(const core::AttentionConfig& in, const char* text) {
    rtattn_config c;
    config_defaults(&c);
#define RTATTN_FROM_CORE_INT(n) c.n = in.n;
#define RTATTN_FROM_CORE_OPT_INT(n) c.has_##n = in.n.has_value(), c.n = in.n.value_or(0);
#define RTATTN_FROM_CORE_DTYPE(n) c.n = in.n == core::Dtype::bf16 ? RTATTN_BF16 : RTATTN_FP16;
#define RTATTN_FROM_CORE_FLAG(n) c.n = in.n;
#define RTATTN_FROM_CORE_OPT_DOUBLE(n) RTATTN_FROM_CORE_OPT_INT(n)
#define RTATTN_FROM_CORE_STRING(n) c.n = text;
#define RTATTN_FROM_CORE(n, kind) RTATTN_FROM_CORE_##kind(n)
    RTATTN_CONFIG_FIELDS(RTATTN_FROM_CORE)
    return c;
}

void options_defaults(rtattn_runtime_options* o) {
    std::memset(o, 0, sizeof *o);
    const core::RuntimeOptions d;
    o->struct_size = sizeof *o;
    o->max_cache_bytes = d.max_cache_bytes;
    o->log_level = static_cast<std::int32_t>(d.log_level);
    o->lock_timeout_seconds = d.lock_timeout_seconds;
}

void info_defaults(rtattn_kernel_info* i) {
    std::memset(i, 0, sizeof *i);
    i->struct_size = sizeof *i;
    i->registers = i->spill_bytes = -1;
}

rtattn_kernel_info to_c(const core::KernelInfo& k) {
    rtattn_kernel_info i;
    info_defaults(&i);
    i.key = k.key.c_str();
    i.arch = k.arch.c_str();
    i.padded_qk = k.plan.padded_qk, i.padded_v = k.plan.padded_v;
    i.block_m = k.plan.block_m, i.block_n = k.plan.block_n, i.warps = k.plan.warps, i.stages = k.plan.stages;
    i.smem_bytes = k.plan.smem_bytes;
    i.vec_qk = k.plan.vec_qk, i.vec_v = k.plan.vec_v;
    i.useful_flop_fraction = k.plan.useful_flop_fraction;
    i.kernel = k.plan.kernel.c_str();
    i.reason = k.plan.reason.c_str();
    i.registers = k.registers, i.spill_bytes = k.spill_bytes;
    i.from_cache = k.from_cache;
    return i;
}

// Writes an info whose strings point at the runtime's kept copies of them.
void hand_out(rtattn_runtime* rt, const core::KernelInfo& info, rtattn_kernel_info* out) {
    if (!out) return;
    rtattn_kernel_info c = to_c(info);
    std::lock_guard<std::mutex> lock(rt->mu);
    for (const char** s : {&c.key, &c.arch, &c.kernel, &c.reason}) *s = rt->strings.insert(*s).first->c_str();
    write_struct(c, out, "info");
}

core::Runtime& runtime_of(rtattn_runtime* rt) {
    if (!rt || !rt->runtime) throw core::ArgumentError("runtime", "is NULL");
    return *rt->runtime;
}

const core::Kernel& kernel_of(const rtattn_kernel* k) {
    if (!k) throw core::ArgumentError("kernel", "is NULL");
    return k->kernel;
}

const core::BackwardKernel& backward_of(const rtattn_backward_kernel* k) {
    if (!k) throw core::ArgumentError("kernel", "is NULL");
    return k->kernel;
}

// The C struct's window (has_window, window_size_left/right) into the library's args (-1, -1: none). Without
// has_window the fields must be what a zeroed or initialized struct holds: a window set without it is refused, not
// dropped.
template <class C, class Args>
void window_of(const C& a, Args& out) {
    if (a.has_window != 0 && a.has_window != 1)
        throw core::ArgumentError("has_window", std::to_string(a.has_window) + " is not 0 or 1");
    if (a.has_window) {
        out.window_size_left = a.window_size_left, out.window_size_right = a.window_size_right;
        return;
    }
    for (const auto& [field, v] : {std::pair{"window_size_left", a.window_size_left},
                                   std::pair{"window_size_right", a.window_size_right}})
        if (v != 0 && v != -1)
            throw core::ArgumentError(field, std::to_string(v) + " given with has_window 0; set has_window to 1 "
                                             "for a window");
    out.window_size_left = out.window_size_right = -1;
}

void backward_args_defaults(rtattn_backward_args* a) {
    std::memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->window_size_left = a->window_size_right = -1;
}

void write_text(const std::string& text, char* buf, std::size_t size, std::size_t* needed) {
    if (needed) *needed = text.size() + 1;
    if (!buf || size == 0) return;
    const std::size_t n = std::min(text.size(), size - 1);
    std::memcpy(buf, text.data(), n);
    buf[n] = '\0';
}

core::TensorArg tensor(const rtattn_tensor& t) {
    core::TensorArg a;
    a.ptr = t.ptr;
    a.batch_stride = t.batch_stride, a.seq_stride = t.seq_stride, a.head_stride = t.head_stride;
    return a;
}

}  // namespace
}  // namespace rtattn::capi

using namespace rtattn::capi;
namespace core = rtattn::core;

extern "C" {

const char* rtattn_version(void) { return core::version(); }
int32_t rtattn_abi_version(void) { return RTATTN_ABI_VERSION; }
const char* rtattn_nvrtc_version(void) {
    // Kept once known; "unknown" while NVRTC cannot be loaded (asked again next time: it may be found later, e.g.
    // once the Python package has loaded pip's). The strings outlive every caller.
    static std::mutex mu;
    static const std::string* known = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (!known) {
        try {
            known = new std::string(rtattn::compile::nvrtc_version());
        } catch (...) {
            return "unknown";
        }
    }
    return known->c_str();
}

rtattn_status rtattn_last_error(void) { return last_error().status; }
const char* rtattn_last_error_message(void) { return last_error().message.c_str(); }
const char* rtattn_last_error_field(void) { return last_error().field.c_str(); }
const char* rtattn_last_error_log(void) { return last_error().log.c_str(); }
const char* rtattn_last_error_options(void) { return last_error().options.c_str(); }
const char* rtattn_last_error_source(void) { return last_error().source.c_str(); }
const char* rtattn_last_error_cuda_call(void) { return last_error().cuda_call.c_str(); }
int32_t rtattn_last_error_cuda_result(void) { return last_error().cuda_result; }

void rtattn_config_init(rtattn_config* config) {
    if (config) config_defaults(config);
}

rtattn_status rtattn_config_validate(const rtattn_config* config) {
    return guard([&] { to_core(config).validate(); });
}

rtattn_status rtattn_config_to_json(const rtattn_config* config, char* buf, size_t buf_size, size_t* needed) {
    return guard([&] { write_text(to_core(config).to_json(), buf, buf_size, needed); });
}

rtattn_status rtattn_config_describe(const rtattn_config* config, char* buf, size_t buf_size, size_t* needed) {
    return guard([&] { write_text(to_core(config).describe(), buf, buf_size, needed); });
}

rtattn_status rtattn_config_from_json(const char* json, rtattn_config* out, char* arch_buf, size_t arch_buf_size) {
    return guard([&] {
        if (!json) throw core::ArgumentError("json", "is NULL");
        const core::AttentionConfig c = core::AttentionConfig::from_json(json);
        if (c.arch.size() + 1 > arch_buf_size || !arch_buf)
            throw core::ArgumentError("arch_buf", "needs " + std::to_string(c.arch.size() + 1) + " bytes");
        std::memcpy(arch_buf, c.arch.c_str(), c.arch.size() + 1);
        write_struct(from_core(c, arch_buf), out, "out");
    });
}

rtattn_status rtattn_dtype_from_string(const char* name, int32_t* dtype) {
    return guard([&] {
        if (!name) throw core::ArgumentError("name", "is NULL");
        if (!dtype) throw core::ArgumentError("dtype", "is NULL");
        *dtype = core::dtype_from_string(name) == core::Dtype::bf16 ? RTATTN_BF16 : RTATTN_FP16;
    });
}

int32_t rtattn_is_known_arch(const char* arch) { return arch && core::is_known_arch(arch); }

const char* rtattn_known_archs(void) {
    static const std::string names = core::known_archs();
    return names.c_str();
}

void rtattn_runtime_options_init(rtattn_runtime_options* options) {
    if (options) options_defaults(options);
}

rtattn_status rtattn_runtime_create(const rtattn_runtime_options* options, rtattn_runtime** out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is NULL");
        *out = nullptr;
        rtattn_runtime_options o;
        options_defaults(&o);
        if (options) o = read_struct(options, "options", options_defaults);
        if (o.cache_mode != RTATTN_CACHE_JIT && o.cache_mode != RTATTN_CACHE_ONLY)
            throw core::ConfigError("cache_mode", std::to_string(o.cache_mode) + " is not RTATTN_CACHE_JIT (0) or "
                                                                                 "RTATTN_CACHE_ONLY (1)");
        if (o.log_level < RTATTN_LOG_QUIET || o.log_level > RTATTN_LOG_DEBUG)
            throw core::ConfigError("log_level", std::to_string(o.log_level) + " is out of range; allowed 0..3");
        if (o.shared_cache != 0 && o.shared_cache != 1)
            throw core::ConfigError("shared_cache", std::to_string(o.shared_cache) + " is not 0 or 1");
        auto rt = std::make_unique<rtattn_runtime>();
        rt->log_callback = o.log_callback;
        rt->log_user_data = o.log_user_data;
        core::RuntimeOptions ro;
        ro.cache_dir = o.cache_dir ? o.cache_dir : "";
        ro.mode = o.cache_mode == RTATTN_CACHE_ONLY ? core::CacheMode::cache_only : core::CacheMode::jit;
        ro.max_concurrent_compiles = o.max_concurrent_compiles;
        ro.max_cache_bytes = o.max_cache_bytes;
        ro.log_level = static_cast<core::LogLevel>(o.log_level);
        if (o.log_callback) {
            const rtattn_log_fn fn = o.log_callback;
            void* user = o.log_user_data;
            ro.log_sink = [fn, user](core::LogLevel level, const std::string& m) {
                fn(user, static_cast<std::int32_t>(level), m.c_str());
            };
        }
        ro.shared_cache = o.shared_cache != 0;
        ro.lock_timeout_seconds = o.lock_timeout_seconds;
        ro.tile_override = o.tile_override ? o.tile_override : "";
        rt->runtime = std::make_unique<core::Runtime>(ro);
        rt->cache_dir = rt->runtime->options().cache_dir;
        rt->stats_dir = rt->runtime->stats().dir;
        rt->tile_override = rt->runtime->options().tile_override;
        *out = rt.release();
    });
}

void rtattn_runtime_destroy(rtattn_runtime* runtime) { delete runtime; }

rtattn_status rtattn_runtime_options_get(const rtattn_runtime* runtime, rtattn_runtime_options* out) {
    return guard([&] {
        if (!runtime || !runtime->runtime) throw core::ArgumentError("runtime", "is NULL");
        const core::RuntimeOptions& e = runtime->runtime->options();
        rtattn_runtime_options o;
        options_defaults(&o);
        o.cache_dir = runtime->cache_dir.c_str();
        o.cache_mode = e.mode == core::CacheMode::cache_only ? RTATTN_CACHE_ONLY : RTATTN_CACHE_JIT;
        o.max_concurrent_compiles = e.max_concurrent_compiles;
        o.max_cache_bytes = e.max_cache_bytes;
        o.log_level = static_cast<std::int32_t>(e.log_level);
        o.log_callback = runtime->log_callback;
        o.log_user_data = runtime->log_user_data;
        o.shared_cache = e.shared_cache;
        o.lock_timeout_seconds = e.lock_timeout_seconds;
        o.tile_override = runtime->tile_override.empty() ? nullptr : runtime->tile_override.c_str();
        write_struct(o, out, "out");
    });
}

void rtattn_kernel_info_init(rtattn_kernel_info* info) {
    if (info) info_defaults(info);
}

rtattn_status rtattn_runtime_plan(rtattn_runtime* runtime, const rtattn_config* config, rtattn_kernel_info* info) {
    return guard([&] {
        const auto r = rtattn::resolve(runtime_of(runtime), to_core(config));
        core::KernelInfo k;
        k.key = r->key;
        k.arch = r->config.arch;
        k.plan = r->plan.summary();
        hand_out(runtime, k, info);
    });
}

rtattn_status rtattn_runtime_precompile(rtattn_runtime* runtime, const rtattn_config* config,
                                        rtattn_kernel_info* info) {
    return guard([&] { hand_out(runtime, runtime_of(runtime).precompile(to_core(config)), info); });
}

rtattn_status rtattn_runtime_get(rtattn_runtime* runtime, const rtattn_config* config, rtattn_kernel** out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is NULL");
        *out = nullptr;
        auto k = std::make_unique<rtattn_kernel>();
        k->kernel = runtime_of(runtime).get(to_core(config));
        *out = k.release();
    });
}

void rtattn_cache_stats_init(rtattn_cache_stats* stats) {
    if (!stats) return;
    std::memset(stats, 0, sizeof *stats);
    stats->struct_size = sizeof *stats;
}

rtattn_status rtattn_runtime_stats(rtattn_runtime* runtime, rtattn_cache_stats* out) {
    return guard([&] {
        const core::CacheStats s = runtime_of(runtime).stats();
        rtattn_cache_stats c;
        rtattn_cache_stats_init(&c);
        c.memory_hits = s.memory_hits, c.disk_hits = s.disk_hits, c.misses = s.misses, c.compiles = s.compiles;
        c.compile_seconds = s.compile_seconds;
        c.bad_entries = s.bad_entries, c.evictions = s.evictions, c.bytes_written = s.bytes_written;
        c.disk_bytes = s.disk_bytes;
        c.disk_enabled = s.disk_enabled;
        c.dir = runtime->stats_dir.c_str();
        write_struct(c, out, "out");
    });
}

void rtattn_forward_args_init(rtattn_forward_args* args) {
    if (!args) return;
    std::memset(args, 0, sizeof *args);
    args->struct_size = sizeof *args;
    args->window_size_left = args->window_size_right = -1;
}

rtattn_tensor rtattn_tensor_contiguous(const void* ptr, int32_t seqlen, int32_t heads, int32_t dim) {
    const core::TensorArg t = core::ForwardArgs::contiguous(ptr, seqlen, heads, dim);
    return rtattn_tensor{t.ptr, t.batch_stride, t.seq_stride, t.head_stride};
}

void rtattn_kernel_retain(rtattn_kernel* kernel) {
    if (kernel) kernel->refs.fetch_add(1, std::memory_order_relaxed);
}

void rtattn_kernel_release(rtattn_kernel* kernel) {
    if (kernel && kernel->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete kernel;
}

rtattn_status rtattn_kernel_forward(const rtattn_kernel* kernel, const rtattn_forward_args* args, void* stream) {
    return guard([&] {
        const core::Kernel& k = kernel_of(kernel);
        const rtattn_forward_args a =
            read_struct(args, "args", rtattn_forward_args_init, offsetof(rtattn_forward_args, num_pages));
        core::ForwardArgs f;
        f.q = tensor(a.q), f.k = tensor(a.k), f.v = tensor(a.v), f.o = tensor(a.o);
        f.lse = a.lse;
        f.batch = a.batch, f.seqlen_q = a.seqlen_q, f.seqlen_k = a.seqlen_k;
        f.seqlens_k = a.seqlens_k, f.block_table = a.block_table, f.block_table_stride = a.block_table_stride;
        f.pages_per_seq = a.pages_per_seq, f.page_size = a.page_size, f.num_splits = a.num_splits;
        f.workspace = a.workspace, f.workspace_bytes = a.workspace_bytes;
        f.cu_seqlens_q = a.cu_seqlens_q, f.cu_seqlens_k = a.cu_seqlens_k, f.total_q = a.total_q, f.total_k = a.total_k;
        f.num_pages = a.num_pages;
        window_of(a, f);
        f.sinks = a.sinks;
        f.softcap = a.softcap;
        f.alibi_slopes = a.alibi_slopes, f.alibi_slopes_batch_stride = a.alibi_slopes_batch_stride;
        f.k_new = tensor(a.k_new), f.v_new = tensor(a.v_new), f.seqlen_new = a.seqlen_new;
        k.forward(f, stream);
    });
}

void rtattn_merge_args_init(rtattn_merge_args* args) {
    if (!args) return;
    std::memset(args, 0, sizeof *args);
    args->struct_size = sizeof *args;
}

rtattn_status rtattn_kernel_merge(const rtattn_kernel* kernel, const rtattn_merge_args* args, void* stream) {
    return guard([&] {
        const core::Kernel& k = kernel_of(kernel);
        const rtattn_merge_args a = read_struct(args, "args", rtattn_merge_args_init);
        core::MergeArgs m;
        m.o_a = tensor(a.o_a), m.o_b = tensor(a.o_b), m.o = tensor(a.o);
        m.lse_a = a.lse_a, m.lse_b = a.lse_b, m.lse = a.lse;
        m.batch = a.batch, m.seqlen = a.seqlen;
        k.merge(m, stream);
    });
}

rtattn_status rtattn_kernel_workspace_bytes(const rtattn_kernel* kernel, int32_t batch, int32_t seqlen_q,
                                            int32_t seqlen_k, int32_t num_splits, size_t* out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is null");
        *out = kernel_of(kernel).workspace_bytes(batch, seqlen_q, seqlen_k, num_splits);
    });
}

rtattn_status rtattn_kernel_num_splits(const rtattn_kernel* kernel, int32_t batch, int32_t seqlen_q,
                                       int32_t seqlen_k, int32_t num_splits, int32_t* out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is null");
        *out = kernel_of(kernel).num_splits(batch, seqlen_q, seqlen_k, num_splits);
    });
}

rtattn_status rtattn_kernel_get_info(const rtattn_kernel* kernel, rtattn_kernel_info* out) {
    return guard([&] { write_struct(to_c(kernel_of(kernel).info()), out, "out"); });
}

rtattn_status rtattn_kernel_get_config(const rtattn_kernel* kernel, rtattn_config* out) {
    return guard([&] {
        const core::AttentionConfig& c = kernel_of(kernel).config();
        write_struct(from_core(c, c.arch.c_str()), out, "out");
    });
}

rtattn_status rtattn_runtime_get_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                         rtattn_backward_kernel** out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is NULL");
        *out = nullptr;
        auto k = std::make_unique<rtattn_backward_kernel>();
        k->kernel = runtime_of(runtime).get_backward(to_core(config));
        *out = k.release();
    });
}

rtattn_status rtattn_runtime_precompile_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                                 rtattn_kernel_info* info) {
    return guard([&] { hand_out(runtime, runtime_of(runtime).precompile_backward(to_core(config)), info); });
}

rtattn_status rtattn_runtime_plan_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                           rtattn_kernel_info* info) {
    return guard([&] {
        const auto r = rtattn::resolve_backward(runtime_of(runtime), to_core(config));
        core::KernelInfo k;
        k.key = r->key;
        k.arch = r->config.arch;
        k.plan = r->plan.summary();
        hand_out(runtime, k, info);
    });
}

void rtattn_backward_args_init(rtattn_backward_args* args) {
    if (args) backward_args_defaults(args);
}

void rtattn_backward_kernel_retain(rtattn_backward_kernel* kernel) {
    if (kernel) kernel->refs.fetch_add(1, std::memory_order_relaxed);
}

void rtattn_backward_kernel_release(rtattn_backward_kernel* kernel) {
    if (kernel && kernel->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete kernel;
}

rtattn_status rtattn_backward_kernel_workspace_bytes(const rtattn_backward_kernel* kernel, int32_t batch,
                                                     int32_t seqlen_q, int32_t seqlen_k, size_t* out) {
    return guard([&] {
        if (!out) throw core::ArgumentError("out", "is NULL");
        *out = backward_of(kernel).workspace_bytes(batch, seqlen_q, seqlen_k);
    });
}

rtattn_status rtattn_kernel_backward(const rtattn_backward_kernel* kernel, const rtattn_backward_args* args,
                                     void* stream) {
    return guard([&] {
        const core::BackwardKernel& k = backward_of(kernel);
        const rtattn_backward_args a = read_struct(args, "args", backward_args_defaults);
        if (a.deterministic != 0 && a.deterministic != 1)
            throw core::ArgumentError("deterministic", std::to_string(a.deterministic) + " is not 0 or 1");
        core::BackwardArgs b;
        b.q = tensor(a.q), b.k = tensor(a.k), b.v = tensor(a.v), b.o = tensor(a.o), b.dout = tensor(a.dout);
        b.lse = a.lse, b.dlse = a.dlse;
        b.dq = tensor(a.dq), b.dk = tensor(a.dk), b.dv = tensor(a.dv);
        b.batch = a.batch, b.seqlen_q = a.seqlen_q, b.seqlen_k = a.seqlen_k;
        b.workspace = a.workspace, b.workspace_bytes = a.workspace_bytes;
        b.deterministic = a.deterministic != 0;
        b.cu_seqlens_q = a.cu_seqlens_q, b.cu_seqlens_k = a.cu_seqlens_k, b.total_q = a.total_q, b.total_k = a.total_k;
        window_of(a, b);
        b.sinks = a.sinks, b.dsinks = a.dsinks;
        b.softcap = a.softcap;
        b.alibi_slopes = a.alibi_slopes, b.alibi_slopes_batch_stride = a.alibi_slopes_batch_stride;
        k.backward(b, stream);
    });
}

rtattn_status rtattn_backward_kernel_get_info(const rtattn_backward_kernel* kernel, rtattn_kernel_info* out) {
    return guard([&] { write_struct(to_c(backward_of(kernel).info()), out, "out"); });
}

rtattn_status rtattn_backward_kernel_get_config(const rtattn_backward_kernel* kernel, rtattn_config* out) {
    return guard([&] {
        const core::AttentionConfig& c = backward_of(kernel).config();
        write_struct(from_core(c, c.arch.c_str()), out, "out");
    });
}

}  // extern "C"
