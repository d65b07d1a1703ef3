// `rtattn bench --decode`: the decode kernels' GB/s of K/V read (each cached byte once per KV group), against the
// card's copy bandwidth measured in the same run (a 2 GiB device-to-device copy, read + write bytes, as the peers'
// script counts it). Device events around each launch, warm-up, median; two cache copies rotated so a launch never
// starts with the previous one's K/V in L2; --interleave launches the shapes round-robin. --cache-prefill times the
// prefill kernels on the same caches instead (any query count; TFLOPS beside the bytes).
#include "util/format.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include "bench.hpp"
#include "common.hpp"
#include "driver/driver.hpp"
#include "core/rtattn.hpp"

namespace rtattn::cli {

namespace {

using driver::api;
using driver::check;

struct DecodeShape {
    int batch = 0, keys = 0;
};

DecodeShape parse_shape(const std::string& s) {
    DecodeShape d;
    char tail = 0;
    if (std::sscanf(s.c_str(), "%d:%d%c", &d.batch, &d.keys, &tail) != 2 || d.batch < 1 || d.keys < 1)
        throw ConfigError("--decode-shapes", util::format("'{}' is not batch:cached_keys (two positive integers)", s));
    return d;
}

struct DecodeCase {
    int d = 0, H = 0, Hkv = 0, q = 1, page = 0;
    DecodeShape shape;
    bool causal = false;
    std::string dtype;
    Kernel kernel;
    int splits = 1;
    struct Set {
        driver::DeviceBuffer q, k, v, o, table, ws, sinks, alibi;
        ForwardArgs args;
    } sets[2];
    std::vector<double> ms;
    int launches = 0;
    int window_left = -1;  // a local kernel's left bound (-1: none, or unbounded)
    int window_right = -1;  // and its right bound
    std::string window;    // "L:R", or empty
    bool sinks = false;
    float softcap = 0;
    bool alibi = false;

    // K and V bytes the step must read: each sequence's keys, or those its window spans (its tokens' windows
    // together: the last window_left + q keys).
    double keys_read() const {
        return window_left < 0 ? shape.keys : std::min<double>(shape.keys, double(window_left) + q);
    }
    double bytes() const { return double(shape.batch) * keys_read() * Hkv * 2.0 * d * 2.0; }
    // 4 FLOPs per (query, key) pair and column: the pairs the mask keeps, token t of q at position keys - q + t
    // (bottom-right): causal sees keys up to it, a window from window_left before it to window_right after it.
    double flops() const {
        double pairs = 0;
        for (int t = 0; t < q; ++t) {
            const double at = double(shape.keys) - q + t;
            const double right = causal ? 0 : window_right;  // keys after it (-1: all)
            const double last = std::min(double(shape.keys) - 1, right < 0 ? double(shape.keys) : at + right);
            const double first = window_left < 0 ? 0 : std::max(0.0, at - window_left);
            pairs += std::max(0.0, last - first + 1);
        }
        return 4.0 * shape.batch * H * d * pairs;
    }
};

std::unique_ptr<DecodeCase> prepare(Runtime& rt, const BenchOptions& o, int d, DecodeShape shape, int q, int page,
                                    bool causal, const std::string& dt, int splits, const Variant& variant) {
    auto cs = std::make_unique<DecodeCase>();
    DecodeCase& c = *cs;
    c.d = d, c.shape = shape, c.q = q, c.page = page, c.causal = causal, c.dtype = dt;
    c.H = o.heads > 0 ? o.heads : (d == 132 ? 16 : 32);
    c.Hkv = o.heads_kv > 0 ? o.heads_kv : c.H % o.gqa == 0 ? c.H / o.gqa : c.H;
    AttentionConfig cfg;
    cfg.head_dim_qk = d;
    cfg.dtype = dtype_from_string(dt);
    cfg.causal = causal;
    cfg.num_heads_q = c.H, cfg.num_heads_kv = c.Hkv;
    cfg.decode = !o.cache_prefill, cfg.paged_kv = page > 0;
    const auto bounds = parse_window(variant.window);
    cfg.local = bounds.has_value();
    if (bounds) c.window = variant.window, c.window_left = bounds->first, c.window_right = bounds->second;
    c.sinks = cfg.sinks = variant.sinks;
    c.softcap = variant.softcap;
    cfg.softcap = c.softcap > 0;
    c.alibi = cfg.alibi = variant.alibi;
    if (!o.arch.empty()) cfg.arch = o.arch;
    c.kernel = rt.get(cfg);
    const int B = shape.batch, S = shape.keys;
    const int pages_per_seq = page ? (S + page - 1) / page : 0;
    const std::size_t nq = std::size_t(B) * q * c.H * d;
    const std::size_t nkv = std::size_t(B) * (page ? std::size_t(pages_per_seq) * page : S) * c.Hkv * d;
    const auto host = random_halves(std::max(nq, std::size_t(1) << 22) + 64, cfg.dtype == Dtype::bf16,
                                    unsigned(d * 7919 + S));
    std::mt19937 rng(unsigned(B * 31 + S));
    for (int i = 0; i < 2; ++i) {
        auto& s = c.sets[i];
        s.q = driver::DeviceBuffer(nq * 2);
        s.o = driver::DeviceBuffer(nq * 2);
        s.k = driver::DeviceBuffer(nkv * 2);
        s.v = driver::DeviceBuffer(nkv * 2);
        s.q.upload(host.data() + 1 + i, nq * 2);
        // The cache: the random block repeated (uploading gigabytes of fresh randoms would dominate the run).
        const std::size_t block = std::size_t(1) << 22;
        for (std::size_t at = 0; at < nkv; at += block) {
            const std::size_t n = std::min(block, nkv - at);
            s.k.upload(host.data() + 17 + i, n * 2, at * 2);
            s.v.upload(host.data() + 33 + i, n * 2, at * 2);
        }
        ForwardArgs& a = s.args;
        a.q = ForwardArgs::contiguous(s.q.get(), q, c.H, d);
        a.o = ForwardArgs::contiguous(s.o.get(), q, c.H, d);
        a.batch = B, a.seqlen_q = q, a.seqlen_k = S;
        if (page) {
            // Pages in a shuffled order, as a serving engine's allocator leaves them.
            std::vector<std::int32_t> table(std::size_t(B) * pages_per_seq);
            std::iota(table.begin(), table.end(), 0);
            std::shuffle(table.begin(), table.end(), rng);
            s.table = driver::DeviceBuffer(table.size() * 4);
            s.table.upload(table.data(), table.size() * 4);
            a.k = TensorArg{s.k.get(), std::int64_t(page) * c.Hkv * d, std::int64_t(c.Hkv) * d, d};
            a.v = TensorArg{s.v.get(), std::int64_t(page) * c.Hkv * d, std::int64_t(c.Hkv) * d, d};
            a.block_table = static_cast<const std::int32_t*>(s.table.get());
            a.block_table_stride = a.pages_per_seq = pages_per_seq;
            a.page_size = page;
            a.num_pages = int(table.size());
        } else {
            a.k = ForwardArgs::contiguous(s.k.get(), S, c.Hkv, d);
            a.v = ForwardArgs::contiguous(s.v.get(), S, c.Hkv, d);
        }
        a.num_splits = splits;
        if (bounds) a.window_size_left = bounds->first, a.window_size_right = bounds->second;
        if (c.sinks) s.sinks = sink_logits(c.H), a.sinks = static_cast<const float*>(s.sinks.get());
        a.softcap = c.softcap;
        if (c.alibi) s.alibi = alibi_slopes(c.H), a.alibi_slopes = static_cast<const float*>(s.alibi.get());
        a.workspace_bytes = c.kernel.workspace_bytes(B, q, S, splits);
        s.ws = driver::DeviceBuffer(std::max<std::size_t>(a.workspace_bytes, 256));
        a.workspace = s.ws.get();
    }
    c.splits = c.kernel.num_splits(B, q, S, splits);
    return cs;
}

struct DecodeTimer {
    driver::Stream stream;
    CUevent e0 = nullptr, e1 = nullptr;
    DecodeTimer() {
        check(api().cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
        check(api().cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    }
    ~DecodeTimer() {
        api().cuEventDestroy(e0);
        api().cuEventDestroy(e1);
    }
    float time(const std::function<void()>& run) {
        check(api().cuEventRecord(e0, stream.get()), "cuEventRecord");
        run();
        check(api().cuEventRecord(e1, stream.get()), "cuEventRecord");
        check(api().cuEventSynchronize(e1), "cuEventSynchronize");
        float t = 0;
        check(api().cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
        return t;
    }
    void launch(DecodeCase& c, bool timed) {
        auto& set = c.sets[c.launches++ % 2];
        auto run = [&] { c.kernel.forward(set.args, stream.get()); };
        if (!timed) return run();
        c.ms.push_back(time(run));
    }
};

// The card's copy bandwidth, counted as the peers' script counts it: read + write bytes of a 2 GiB copy.
double copy_gbs(DecodeTimer& t) {
    const std::size_t bytes = std::size_t(2) << 30;
    driver::DeviceBuffer a(bytes), b(bytes);
    auto run = [&] {
        check(api().cuMemcpyDtoDAsync(CUdeviceptr(b.get()), CUdeviceptr(a.get()), bytes, t.stream.get()),
              "cuMemcpyDtoDAsync");
    };
    run();
    std::vector<double> ms;
    for (int i = 0; i < 10; ++i) ms.push_back(t.time(run));
    return 2.0 * bytes / (median(ms) * 1e-3) / 1e9;
}

}  // namespace

int run_decode_bench(const BenchOptions& o) {
    std::FILE* table = o.json ? stderr : stdout;
    Runtime rt(o.runtime);
    const auto dev = driver::current_device();
    DecodeTimer timer;
    const double copy = copy_gbs(timer);
    util::print(table, "# rtattn bench --decode: {} ({}), {} SMs, driver {}, rtattn {}; copy {:.0f} GB/s (read + write)"
                      "{}{}\n",
               dev.name, dev.arch(), dev.sms, dev.driver_version, version(), copy,
               o.arch.empty() ? "" : ", kernels for " + o.arch, o.interleave ? ", shapes interleaved" : "");
    util::print(table, "{:>4} {:>4} {:>7} {:>6} {:>3} {:>5} {:>6} {:>5} {:>6} {:>9} {:>8} {:>6} {:>7}  {}\n", "d",
                "B", "keys", "heads", "q", "page", "causal", "dtype", "splits", "us", "GB/s", "%copy", "TFLOPS",
                "kernel");
    std::vector<std::unique_ptr<DecodeCase>> cases;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    int failures = 0;
    auto finish = [&](DecodeCase& c) {
        const double ms = median(c.ms), gbs = c.bytes() / (ms * 1e-3) / 1e9, tflops = c.flops() / (ms * 1e-3) / 1e12;
        util::print(table,
                    "{:>4} {:>4} {:>7} {:>3}:{:<2} {:>3} {:>5} {:>6} {:>5} {:>6} {:>9.1f} {:>8.0f} {:>5.1f}% {:>7.1f}"
                    "  {}\n",
                    c.d, c.shape.batch, c.shape.keys, c.H, c.Hkv, c.q, c.page, c.causal ? 1 : 0, c.dtype, c.splits,
                    ms * 1e3, gbs, 100 * gbs / copy, tflops,
                    c.kernel.info().plan.kernel + (c.window.empty() ? "" : ", window " + c.window) +
                       (c.sinks ? ", sinks" : "") + (c.softcap > 0 ? util::format(", softcap {}", c.softcap) : "") +
                       (c.alibi ? ", alibi" : ""));
        std::fflush(table);
        nlohmann::ordered_json j;
        j["d"] = c.d, j["batch"] = c.shape.batch, j["keys"] = c.shape.keys, j["H"] = c.H, j["H_kv"] = c.Hkv;
        j["seqlen_q"] = c.q, j["page_size"] = c.page, j["causal"] = c.causal, j["dtype"] = c.dtype;
        j["splits"] = c.splits, j["ms"] = ms, j["gbs"] = gbs, j["copy_gbs"] = copy, j["of_copy"] = gbs / copy;
        j["tflops"] = tflops;
        if (o.cache_prefill) j["cache_prefill"] = true;
        j["registers"] = figure_json(c.kernel.info().registers);
        j["kernel"] = c.kernel.info().plan.kernel;
        if (!c.window.empty()) j["window"] = c.window, j["keys_read"] = c.keys_read();
        if (c.sinks) j["sinks"] = true;
        if (c.softcap > 0) j["softcap"] = c.softcap;
        if (c.alibi) j["alibi"] = true;
        rows.push_back(std::move(j));
    };
    const std::vector<Variant> all_variants = variants(o);  // a bad --window/--sinks/--softcap: refused once
    for (const auto& dt : o.dtypes)
        for (int d : o.head_dims)
            for (const auto& text : o.decode_shapes)
                for (int q : o.decode_q)
                    for (int page : o.page_sizes)
                        for (bool causal : o.causal)
                            for (int splits : o.num_splits)
                            for (const Variant& variant : all_variants) {
                                try {
                                    auto c = prepare(rt, o, d, parse_shape(text), q, page, causal, dt, splits,
                                                     variant);
                                    if (o.interleave) {
                                        cases.push_back(std::move(c));
                                        continue;
                                    }
                                    for (int i = 0; i < o.warmup; ++i) timer.launch(*c, false);
                                    for (int i = 0; i < o.reps; ++i) timer.launch(*c, true);
                                    finish(*c);
                                } catch (const Error& e) {
                                    ++failures;
                                    util::print(table, "{:>4} {} q={} page={}: error: {}\n", d, text, q, page,
                                                e.what());
                                }
                            }
    for (int i = 0; i < o.warmup; ++i)
        for (auto& c : cases) timer.launch(*c, false);
    for (int i = 0; i < o.reps; ++i)
        for (auto& c : cases) timer.launch(*c, true);
    for (auto& c : cases) finish(*c);
    write_results(o, o.interleave ? "decode, interleaved" : "decode", std::move(rows));
    return failures ? 1 : 0;
}

}  // namespace rtattn::cli
