// Throughput: device events around each launch, warm-up first, median of many, inputs rotated between two buffer
// sets so a run never starts with the previous run's K/V in L2. FLOPs = 4*B*H*Sq*Sk*d (halved when causal).
// Latency: cold NVRTC compile, disk hit in a fresh Runtime, in-memory hit.
#include "bench.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "driver/driver.hpp"
#include "rtattn/rtattn.hpp"

namespace rtattn::tools {

namespace {

using driver::api;
using driver::check;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Random 16-bit values in [-1, 1] (never zeros: they can run faster than real data).
std::vector<std::uint16_t> random_halves(std::size_t n, bool bf16, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    std::vector<std::uint16_t> out(n);
    for (auto& x : out) {
        const float f = dist(rng);
        if (bf16) {
            std::uint32_t u;
            std::memcpy(&u, &f, 4);
            x = std::uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        } else {
            // Values in [-1, 1] are normal halves or zero-ish; a simple truncating conversion is fine for timing.
            std::uint32_t u;
            std::memcpy(&u, &f, 4);
            const std::uint32_t sign = (u >> 16) & 0x8000;
            const int exp = int((u >> 23) & 0xff) - 127 + 15;
            x = exp <= 0 ? std::uint16_t(sign) : std::uint16_t(sign | (exp << 10) | ((u >> 13) & 0x3ff));
        }
    }
    return out;
}

struct BufferSet {
    driver::DeviceBuffer q, k, v, o;
};

int heads_for(int d, const BenchOptions& o) { return d == 132 ? 16 : std::max(1, o.hidden / d); }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

nlohmann::json bench_one(Runtime& rt, const BenchOptions& o, int d, int S, bool causal, const std::string& dt) {
    AttentionConfig c;
    c.head_dim_qk = d;
    c.dtype = dtype_from_string(dt);
    c.causal = causal;
    const int H = heads_for(d, o);
    c.num_heads_q = H;
    c.num_heads_kv = std::max(1, H / o.gqa);
    if (H % c.num_heads_kv) c.num_heads_kv = H;
    const int B = std::max(1, o.tokens / S);
    Kernel kernel = rt.get(c);

    const std::size_t nq = std::size_t(B) * S * H * d, nkv = std::size_t(B) * S * c.num_heads_kv * d;
    // One random host array; each tensor reads it at a different offset, so no two tensors are equal.
    const auto host = random_halves(nq + 64, c.dtype == Dtype::bf16, unsigned(d * 7919 + S));
    BufferSet sets[2];
    for (int i = 0; i < 2; ++i) {
        sets[i].q = driver::DeviceBuffer(nq * 2);
        sets[i].k = driver::DeviceBuffer(nkv * 2);
        sets[i].v = driver::DeviceBuffer(nkv * 2);
        sets[i].o = driver::DeviceBuffer(nq * 2);
        sets[i].q.upload(host.data() + 1 + i, nq * 2);
        sets[i].k.upload(host.data() + 17 + i, nkv * 2);
        sets[i].v.upload(host.data() + 33 + i, nkv * 2);
    }
    auto args_for = [&](const BufferSet& s) {
        ForwardArgs a;
        a.q = ForwardArgs::contiguous(s.q.get(), S, H, d);
        a.k = ForwardArgs::contiguous(s.k.get(), S, c.num_heads_kv, d);
        a.v = ForwardArgs::contiguous(s.v.get(), S, c.num_heads_kv, d);
        a.o = ForwardArgs::contiguous(s.o.get(), S, H, d);
        a.batch = B;
        a.seqlen_q = a.seqlen_k = S;
        return a;
    };
    const ForwardArgs args[2] = {args_for(sets[0]), args_for(sets[1])};
    driver::Stream stream;
    CUevent e0, e1;
    check(api().cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
    check(api().cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; i < o.warmup; ++i) kernel.forward(args[i % 2], stream.get());
    std::vector<double> ms;
    for (int i = 0; i < o.reps; ++i) {
        check(api().cuEventRecord(e0, stream.get()), "cuEventRecord");
        kernel.forward(args[i % 2], stream.get());
        check(api().cuEventRecord(e1, stream.get()), "cuEventRecord");
        check(api().cuEventSynchronize(e1), "cuEventSynchronize");
        float t = 0;
        check(api().cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
        ms.push_back(t);
    }
    api().cuEventDestroy(e0);
    api().cuEventDestroy(e1);
    const double t = median(ms);
    const double flops = 4.0 * B * H * double(S) * S * d / (causal ? 2 : 1);
    nlohmann::ordered_json j;
    j["d"] = d, j["S"] = S, j["B"] = B, j["H"] = H, j["H_kv"] = c.num_heads_kv, j["causal"] = causal;
    j["dtype"] = dt;
    j["ms"] = t;
    j["tflops"] = flops / (t * 1e-3) / 1e12;
    j["registers"] = kernel.info().registers;
    j["useful_flop_fraction"] = kernel.info().plan.useful_flop_fraction;
    j["tile"] = fmt::format("{}x{} w{} s{}", kernel.info().plan.block_m, kernel.info().plan.block_n,
                            kernel.info().plan.warps, kernel.info().plan.stages);
    j["kernel"] = kernel.info().plan.kernel;
    return j;
}

int run_throughput(const BenchOptions& o) {
    RuntimeOptions ro;
    ro.cache_dir = o.cache_dir;
    Runtime rt(ro);
    const auto dev = driver::current_device();
    fmt::print("# rtattn bench: {} ({}), {} SMs, driver {}, rtattn {}\n", dev.name, dev.arch(), dev.sms,
               dev.driver_version, version());
    fmt::print("{:>4} {:>6} {:>3} {:>3} {:>6} {:>5} {:>9} {:>8} {:>5} {:>14}  {}\n", "d", "S", "B", "H", "causal",
               "dtype", "ms", "TFLOPS", "regs", "tile", "kernel");
    nlohmann::json rows = nlohmann::json::array();
    int failures = 0;
    for (const auto& dt : o.dtypes)
        for (int d : o.head_dims)
            for (int S : o.seqlens)
                for (bool causal : o.causal) {
                    try {
                        auto j = bench_one(rt, o, d, S, causal, dt);
                        fmt::print("{:>4} {:>6} {:>3} {:>3} {:>6} {:>5} {:>9.3f} {:>8.1f} {:>5} {:>14}  {}\n", d, S,
                                   j["B"].get<int>(), j["H"].get<int>(), causal ? 1 : 0, dt, j["ms"].get<double>(),
                                   j["tflops"].get<double>(), j["registers"].get<int>(), j["tile"].get<std::string>(),
                                   j["kernel"].get<std::string>());
                        std::fflush(stdout);
                        rows.push_back(std::move(j));
                    } catch (const Error& e) {
                        ++failures;
                        fmt::print("{:>4} {:>6} causal={} {}: error: {}\n", d, S, causal, dt, e.what());
                    }
                }
    if (!o.json_path.empty()) std::ofstream(o.json_path) << rows.dump(1) << "\n";
    return failures ? 1 : 0;
}

int run_latency(const BenchOptions& o) {
    // A private cache dir so "cold" really is cold.
    std::string dir = o.cache_dir.empty() ? fmt::format("/tmp/rtattn-bench-{}", getpid()) : o.cache_dir;
    nlohmann::json rows = nlohmann::json::array();
    const bool gpu = driver::gpu_available();
    for (int d : o.head_dims) {
        AttentionConfig c;
        c.head_dim_qk = d;
        c.arch = gpu ? driver::current_device().arch() : "sm_90a";
        RuntimeOptions ro;
        ro.cache_dir = dir;
        double cold, disk, mem = 0;
        {
            Runtime rt(ro);
            const auto t0 = Clock::now();
            gpu ? (void)rt.get(c) : (void)rt.precompile(c);
            cold = seconds_since(t0);
            if (rt.stats().compiles != 1)
                throw Error(fmt::format("latency: expected a cold compile in {}, found the kernel cached", dir));
        }
        {
            Runtime rt(ro);  // a fresh Runtime has an empty memory tier: this is a disk hit
            const auto t0 = Clock::now();
            gpu ? (void)rt.get(c) : (void)rt.precompile(c);
            disk = seconds_since(t0);
            const int n = 1000;
            const auto t1 = Clock::now();
            for (int i = 0; i < n; ++i) gpu ? (void)rt.get(c) : (void)rt.precompile(c);
            mem = seconds_since(t1) / n;
        }
        fmt::print("d={:<4} {} cold compile {:.3f} s, disk hit {:.2f} ms, memory hit {:.1f} us ({})\n", d, c.arch,
                   cold, disk * 1e3, mem * 1e6, gpu ? "get() to a launchable kernel" : "precompile, no GPU");
        rows.push_back({{"d", d}, {"arch", c.arch}, {"cold_s", cold}, {"disk_hit_s", disk}, {"memory_hit_s", mem}});
    }
    if (!o.json_path.empty()) std::ofstream(o.json_path) << rows.dump(1) << "\n";
    return 0;
}

}  // namespace

int run_bench(const BenchOptions& o) { return o.latency ? run_latency(o) : run_throughput(o); }

}  // namespace rtattn::tools
