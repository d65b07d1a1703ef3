// Throughput: device events around each launch, warm-up first, median of many, inputs rotated between two buffer
// sets so a run never starts with the previous run's K/V in L2. FLOPs = 4*B*H*Sq*Sk*d (halved when causal).
// --interleave launches the shapes round-robin, for ratios between shapes on a card whose clock drifts.
// Latency: cold NVRTC compile, disk hit in a fresh Runtime, in-memory hit.
#include "bench.hpp"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>

#include "api/resolver.hpp"
#include "common.hpp"
#include "util/text.hpp"
#include "driver/driver.hpp"
#include "core/rtattn.hpp"
#include "util/format.hpp"

namespace rtattn::cli {

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

std::vector<int> head_dim_range(const std::string& spec) {
    int lo = 0, hi = 0, step = 0;
    char end = 0;
    if (std::sscanf(spec.c_str(), "%d:%d:%d%c", &lo, &hi, &step, &end) != 3 || lo < 1 || hi > 256 || lo > hi ||
        step < 1)
        throw ConfigError("--head-dim-range", util::format("{} is not lo:hi:step with 1 <= lo <= hi <= 256 and step >= "
                                                           "1",
                                                           util::quoted(spec)));
    std::vector<int> dims;
    for (int d = lo; d <= hi; d += step) dims.push_back(d);
    return dims;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Results: JSON on stdout with --json, and into --json-out's file.
void write_results(const BenchOptions& o, const char* kind, nlohmann::ordered_json rows) {
    json j;
    j["kind"] = kind;
    j["results"] = std::move(rows);
    const std::string text = dump(std::move(j));
    if (o.json) util::print("{}\n", text);
    if (!o.json_out.empty()) {
        std::ofstream out(o.json_out);
        out << text << "\n";
        if (!out) throw Error(util::format("cannot write {}", o.json_out));
    }
}

// A --window value: nullopt for "off", else its bounds.
std::optional<std::pair<int, int>> parse_window(const std::string& w) {
    if (w == "off") return std::nullopt;
    int l = 0, r = 0;
    char tail = 0;
    if (std::sscanf(w.c_str(), "%d:%d%c", &l, &r, &tail) != 2 || l < -1 || r < -1)
        throw Error(util::format("--window: {} is not off or LEFT:RIGHT with each -1 (unbounded) or more", w));
    return std::pair{l, r};
}

std::vector<Variant> variants(const BenchOptions& o) {
    std::vector<Variant> out;
    std::vector<float> caps;
    for (const auto& c : o.softcaps) {
        char* end = nullptr;
        const float cap = c == "off" ? 0.f : std::strtof(c.c_str(), &end);
        if (c != "off" && (end == c.c_str() || *end || !(cap > 0) || !std::isfinite(cap)))
            throw Error(util::format("--softcap: {} is not off or a finite cap > 0", c));
        caps.push_back(cap);
    }
    for (const auto& w : o.windows) {
        parse_window(w);  // refused here, before any shape or kernel is prepared
        for (const auto& s : o.sinks) {
            if (s != "off" && s != "on") throw Error(util::format("--sinks: {} is not off or on", s));
            for (float cap : caps)
                for (const auto& a : o.alibi) {
                    if (a != "off" && a != "on") throw Error(util::format("--alibi: {} is not off or on", a));
                    out.push_back({w, s == "on", cap, a == "on"});
                }
        }
    }
    return out;
}


driver::DeviceBuffer sink_logits(int heads) {
    // Around log(keys) of the shapes timed, so the sink neither vanishes nor takes every row.
    std::vector<float> v(std::size_t(std::max(heads, 1)));
    for (std::size_t h = 0; h < v.size(); ++h) v[h] = 4.f + 0.25f * float(h % 8);
    driver::DeviceBuffer buf(v.size() * 4);
    buf.upload(v.data(), v.size() * 4);
    return buf;
}

driver::DeviceBuffer alibi_slopes(int heads) {
    std::vector<float> v(std::size_t(std::max(heads, 1)));
    for (std::size_t h = 0; h < v.size(); ++h) v[h] = std::exp2(-8.f * float(h + 1) / float(v.size()));
    driver::DeviceBuffer buf(v.size() * 4);
    buf.upload(v.data(), v.size() * 4);
    return buf;
}

namespace {

using driver::api;
using driver::check;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct BufferSet {
    driver::DeviceBuffer q, k, v, o, lse;
    driver::DeviceBuffer dout, dq, dk, dv, workspace;  // backward only
    driver::DeviceBuffer cu_seqlens;                   // varlen only
    driver::DeviceBuffer sinks, dsinks;                // sinks variants only
    driver::DeviceBuffer alibi;                        // ALiBi variants only
};

int heads_for(int d, const BenchOptions& o) {
    if (o.heads > 0) return o.heads;
    return d == 132 ? 16 : std::max(1, o.hidden / d);
}

// One shape of the grid: its kernel, two input sets and the launch times taken so far.
struct Case {
    int d = 0, S = 0, B = 0, H = 0;
    bool causal = false;
    std::string dtype;
    AttentionConfig config;
    Kernel kernel;
    BackwardKernel backward;  // set when timing the backward
    BufferSet sets[2];
    ForwardArgs args[2];
    BackwardArgs bargs[2];
    std::vector<double> ms;
    int launches = 0;
    double flops = 0;  // per launch: 4*B*H*Sq*Sk*d, halved causal, 2.5x backward; summed over sequences when varlen
    bool varlen = false;
    std::string window;  // "L:R" for a local kernel, empty for the plain mask
    bool sinks = false;
    float softcap = 0;
    bool alibi = false;
};

double attention_flops(double sq, double sk, int heads, int d, bool causal, bool backward,
                       std::optional<std::pair<int, int>> window = std::nullopt) {
    double pairs = sq * sk / (causal ? 2 : 1);
    if (window) {  // the pairs the window keeps, row by row (bottom-right aligned, as the kernels)
        pairs = 0;
        for (long long i = 0; i < (long long)sq; ++i) {
            const long long diagonal = i + (long long)sk - (long long)sq;
            const long long right = causal ? 0 : window->second;
            const long long first = window->first < 0 ? 0 : std::max(0LL, diagonal - window->first);
            const long long end = right < 0 ? (long long)sk : std::min((long long)sk, diagonal + right + 1);
            pairs += double(std::max(0LL, end - first));
        }
    }
    return 4.0 * heads * pairs * d * (backward ? 2.5 : 1);
}

// A dense batch (lens empty: batch = tokens / S) or a packed varlen one (lens: each sequence's length; S is then the
// mean, for the table).
std::unique_ptr<Case> prepare(Runtime& rt, const BenchOptions& o, int d, int S, bool causal, const std::string& dt,
                              const std::vector<int>& lens = {}, const Variant& variant = {"off", false}) {
    auto cs = std::make_unique<Case>();
    Case& c = *cs;
    c.varlen = !lens.empty();
    const auto bounds = parse_window(variant.window);
    if (bounds) c.window = variant.window;
    c.config.local = bounds.has_value();
    c.sinks = c.config.sinks = variant.sinks;
    c.softcap = variant.softcap;
    c.config.softcap = c.softcap > 0;
    c.alibi = c.config.alibi = variant.alibi;
    c.d = d, c.S = S, c.causal = causal, c.dtype = dt;
    c.config.head_dim_qk = d;
    c.config.dtype = dtype_from_string(dt);
    c.config.causal = causal;
    c.config.varlen = c.varlen;
    c.H = heads_for(d, o);
    c.config.num_heads_q = c.H;
    c.config.num_heads_kv = o.heads_kv > 0 ? o.heads_kv : std::max(1, c.H / o.gqa);
    if (o.heads_kv == 0 && c.H % c.config.num_heads_kv) c.config.num_heads_kv = c.H;  // given: the config checks it
    c.B = c.varlen ? int(lens.size()) : std::max(1, o.tokens / S);
    if (!o.arch.empty()) c.config.arch = o.arch;
    c.kernel = rt.get(c.config);
    if (o.backward) c.backward = rt.get_backward(c.config);
    const int H = c.H, Hkv = c.config.num_heads_kv, B = c.B;
    std::vector<std::int32_t> cu = {0};
    for (int L : lens) cu.push_back(cu.back() + L);
    const int longest = c.varlen ? *std::max_element(lens.begin(), lens.end()) : S;
    const std::int64_t rows = c.varlen ? cu.back() : std::int64_t(B) * S;  // tokens
    for (int L : c.varlen ? lens : std::vector<int>(B, S))
        c.flops += attention_flops(L, L, H, d, causal, o.backward, bounds);

    const std::size_t nq = std::size_t(rows) * H * d, nkv = std::size_t(rows) * Hkv * d;
    // One random host array; each tensor reads it at a different offset, so no two tensors are equal.
    const auto host = random_halves(nq + 64, c.config.dtype == Dtype::bf16, unsigned(d * 7919 + S));
    for (int i = 0; i < 2; ++i) {
        BufferSet& s = c.sets[i];
        s.q = driver::DeviceBuffer(nq * 2);
        s.k = driver::DeviceBuffer(nkv * 2);
        s.v = driver::DeviceBuffer(nkv * 2);
        s.o = driver::DeviceBuffer(nq * 2);
        s.q.upload(host.data() + 1 + i, nq * 2);
        s.k.upload(host.data() + 17 + i, nkv * 2);
        s.v.upload(host.data() + 33 + i, nkv * 2);
        // [batch, S, heads, d] tensors, or [total, heads, d] when packed.
        auto tensor = [&](const driver::DeviceBuffer& buf, int heads) {
            return c.varlen ? ForwardArgs::packed(buf.get(), heads, d) : ForwardArgs::contiguous(buf.get(), S, heads, d);
        };
        ForwardArgs& a = c.args[i];
        a.q = tensor(s.q, H), a.k = tensor(s.k, Hkv), a.v = tensor(s.v, Hkv), a.o = tensor(s.o, H);
        a.batch = B;
        a.seqlen_q = a.seqlen_k = longest;
        if (bounds) a.window_size_left = bounds->first, a.window_size_right = bounds->second;
        a.softcap = c.softcap;
        if (c.alibi) s.alibi = alibi_slopes(H), a.alibi_slopes = static_cast<const float*>(s.alibi.get());
        if (c.sinks) {
            s.sinks = sink_logits(H), s.dsinks = driver::DeviceBuffer(std::size_t(H) * 4);
            a.sinks = static_cast<const float*>(s.sinks.get());
        }
        if (c.varlen) {
            s.cu_seqlens = driver::DeviceBuffer(cu.size() * 4);
            s.cu_seqlens.upload(cu.data(), cu.size() * 4);
            a.cu_seqlens_q = a.cu_seqlens_k = static_cast<const std::int32_t*>(s.cu_seqlens.get());
            a.total_q = a.total_k = int(rows);
        }
        if (!o.backward) continue;
        // The backward reads the forward's O and LSE: run it once on this set.
        s.lse = driver::DeviceBuffer(std::size_t(rows) * H * 4);
        a.lse = static_cast<float*>(s.lse.get());
        c.kernel.forward(a);
        s.dout = driver::DeviceBuffer(nq * 2);
        s.dout.upload(host.data() + 49 + i, nq * 2);
        s.dq = driver::DeviceBuffer(nq * 2);
        s.dk = driver::DeviceBuffer(nkv * 2);
        s.dv = driver::DeviceBuffer(nkv * 2);
        BackwardArgs& b = c.bargs[i];
        b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.lse = a.lse;
        b.dout = tensor(s.dout, H), b.dq = tensor(s.dq, H), b.dk = tensor(s.dk, Hkv), b.dv = tensor(s.dv, Hkv);
        b.batch = B, b.seqlen_q = b.seqlen_k = longest;
        b.window_size_left = a.window_size_left, b.window_size_right = a.window_size_right;
        if (c.sinks) b.sinks = a.sinks, b.dsinks = static_cast<float*>(s.dsinks.get());
        b.softcap = a.softcap;
        b.alibi_slopes = a.alibi_slopes;
        b.cu_seqlens_q = a.cu_seqlens_q, b.cu_seqlens_k = a.cu_seqlens_k, b.total_q = a.total_q, b.total_k = a.total_k;
        b.workspace_bytes = c.backward.workspace_bytes(B, longest, longest);
        s.workspace = driver::DeviceBuffer(b.workspace_bytes);
        b.workspace = s.workspace.get();
        b.deterministic = o.deterministic;
    }
    return cs;
}

struct Timer {
    driver::Stream stream;
    CUevent e0 = nullptr, e1 = nullptr;
    Timer() {
        check(api().cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
        check(api().cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    }
    ~Timer() {
        api().cuEventDestroy(e0);
        api().cuEventDestroy(e1);
    }
    // One launch on the next input set; `timed` records its device time.
    void launch(Case& c, bool timed) {
        const int set = c.launches++ % 2;
        auto run = [&] {
            if (c.backward) c.backward.backward(c.bargs[set], stream.get());
            else c.kernel.forward(c.args[set], stream.get());
        };
        if (!timed) return run();
        check(api().cuEventRecord(e0, stream.get()), "cuEventRecord");
        run();
        check(api().cuEventRecord(e1, stream.get()), "cuEventRecord");
        check(api().cuEventSynchronize(e1), "cuEventSynchronize");
        float t = 0;
        check(api().cuEventElapsedTime(&t, e0, e1), "cuEventElapsedTime");
        c.ms.push_back(t);
    }
};

nlohmann::ordered_json result(const Case& c) {
    const double t = median(c.ms);
    const auto& info = c.backward ? c.backward.info() : c.kernel.info();
    nlohmann::ordered_json j;
    j["d"] = c.d, j["S"] = c.S, j["B"] = c.B, j["H"] = c.H, j["H_kv"] = c.config.num_heads_kv;
    j["varlen"] = c.varlen;
    j["causal"] = c.causal;
    j["dtype"] = c.dtype;
    j["pass"] = c.backward ? "backward" : "forward";
    if (c.backward) j["deterministic"] = c.bargs[0].deterministic;
    j["arch"] = info.arch;
    j["ms"] = t;
    j["tflops"] = c.flops / (t * 1e-3) / 1e12;
    j["registers"] = figure_json(info.registers);
    j["useful_flop_fraction"] = info.plan.useful_flop_fraction;
    j["tile"] = util::format("{}x{} w{} s{}", info.plan.block_m, info.plan.block_n, info.plan.warps, info.plan.stages);
    j["kernel"] = info.plan.kernel;
    if (!c.window.empty()) j["window"] = c.window;
    if (c.sinks) j["sinks"] = true;
    if (c.softcap > 0) j["softcap"] = c.softcap;
    if (c.alibi) j["alibi"] = true;
    return j;
}

// The table goes to stdout, or to stderr when stdout carries the JSON.
void print_row(std::FILE* out, const nlohmann::ordered_json& j) {
    util::print(out, "{:>4} {:>6}{} {:>3} {:>3} {:>6} {:>5} {:>9.3f} {:>8.1f} {:>5} {:>14}  {}\n", j["d"].get<int>(),
                j["S"].get<int>(), j["varlen"].get<bool>() ? "v" : " ", j["B"].get<int>(), j["H"].get<int>(), j["causal"].get<bool>() ? 1 : 0,
                j["dtype"].get<std::string>(), j["ms"].get<double>(), j["tflops"].get<double>(),
                figure(j["registers"].is_null() ? -1 : j["registers"].get<int>(), "-"), j["tile"].get<std::string>(),
                j["kernel"].get<std::string>() +
                   (j.contains("window") ? ", window " + j["window"].get<std::string>() : std::string()) +
                   (j.contains("sinks") ? ", sinks" : "") +
                   (j.contains("softcap") ? util::format(", softcap {}", j["softcap"].get<double>()) : "") +
                   (j.contains("alibi") ? ", alibi" : ""));
    std::fflush(out);
}

// --varlen's sequence lengths: uniform in min:max, from a fixed seed (the same batch every run).
std::vector<int> varlen_lengths(const BenchOptions& o) {
    int lo = 0, hi = 0;
    if (std::sscanf(o.varlen_lens.c_str(), "%d:%d", &lo, &hi) != 2 || lo < 1 || hi < lo)
        throw Error(util::format("--varlen-lens: {} is not min:max with 1 <= min <= max", o.varlen_lens));
    std::mt19937 rng(2026);
    std::uniform_int_distribution<int> len(lo, hi);
    std::vector<int> v(o.varlen_seqs);
    for (int& x : v) x = len(rng);
    return v;
}

int pad16(int d) { return (d + 15) / 16 * 16; }

// --vs-padded: `ours` and, for a head dim off the 16 grid, the same shape at pad16(d), launched round-robin; the row
// of `ours` gets the ratio to pad16's TFLOPS scaled by d / pad16(d) (useful FLOPs are counted with the real d).
template <class Finish>
void run_against_padded(std::unique_ptr<Case> ours, Runtime& rt, const BenchOptions& o, Timer& timer,
                        Finish& finish, std::FILE* table) {
    std::vector<std::unique_ptr<Case>> group;
    group.push_back(std::move(ours));
    const Case& c = *group[0];
    if (c.d % 16 != 0) {
        BenchOptions same_heads = o;
        same_heads.heads = c.H;
        group.push_back(prepare(rt, same_heads, pad16(c.d), c.S, c.causal, c.dtype));
    }
    for (int i = 0; i < o.warmup; ++i)
        for (auto& g : group) timer.launch(*g, false);
    for (int i = 0; i < o.reps; ++i)
        for (auto& g : group) timer.launch(*g, true);
    if (group.size() == 1) return finish(*group[0], std::nullopt);
    const double ours_tf = group[0]->flops / (median(group[0]->ms) * 1e-3) / 1e12;
    const double pad_tf = group[1]->flops / (median(group[1]->ms) * 1e-3) / 1e12;
    const double ideal = pad_tf * c.d / pad16(c.d);
    finish(*group[1], std::nullopt);
    finish(*group[0], ours_tf / ideal);
    util::print(table, "# d{} causal={}: {:.1f} TFLOPS = {:.3f}x the ideal {:.1f} (d{} at {:.1f} x {}/{})\n", c.d,
                c.causal, ours_tf, ours_tf / ideal, ideal, pad16(c.d), pad_tf, c.d, pad16(c.d));
}

int run_throughput(const BenchOptions& o) {
    std::FILE* table = o.json ? stderr : stdout;
    Runtime rt(o.runtime);
    const auto dev = driver::current_device();
    util::print(table, "# rtattn bench: {} ({}), {} SMs, driver {}, rtattn {}; {}{}{}{}\n", dev.name, dev.arch(),
                dev.sms, dev.driver_version, version(), o.backward ? "backward alone (FLOPs 2.5x forward)" : "forward",
                o.backward && o.deterministic ? ", deterministic" : "", o.arch.empty() ? "" : ", kernels for " + o.arch,
                o.interleave ? ", shapes interleaved launch by launch" : "");
    if (o.vs_padded)
        util::print(table, "# each head dim off the 16 grid interleaved with the same shape at the next multiple of "
                           "16; ideal = that kernel's TFLOPS x d / pad16(d)\n");
    if (o.varlen)
        util::print(table, "# varlen: {} sequences, lengths uniform in {} (S: their mean, marked v), against a dense "
                          "batch of the same tokens\n",
                   o.varlen_seqs, o.varlen_lens);
    util::print(table, "{:>4} {:>7} {:>3} {:>3} {:>6} {:>5} {:>9} {:>8} {:>5} {:>14}  {}\n", "d", "S", "B", "H",
                "causal", "dtype", "ms", "TFLOPS", "regs", "tile", "kernel");
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    int failures = 0;
    Timer timer;
    // Interleaved, every shape is prepared first and each round launches each shape once: drift in the clock
    // (power, temperature) then falls on all shapes alike, which is what a ratio between shapes needs.
    std::vector<std::unique_ptr<Case>> cases;
    auto finish = [&](Case& c, std::optional<double> vs_ideal = std::nullopt) {
        auto j = result(c);
        if (vs_ideal) j["vs_padded_ideal"] = *vs_ideal;
        print_row(table, j);
        rows.push_back(std::move(j));
    };
    const std::vector<int> lens = o.varlen ? varlen_lengths(o) : std::vector<int>{};
    const int mean_len = lens.empty() ? 0 : int(std::accumulate(lens.begin(), lens.end(), 0LL) / lens.size());
    BenchOptions same_tokens = o;  // the dense twin of a varlen batch: its tokens, sequences of the mean length
    same_tokens.tokens = mean_len * int(lens.size());
    const std::vector<Variant> all_variants = variants(o);  // a bad --window/--sinks/--softcap: refused once
    for (const auto& dt : o.dtypes)
        for (int d : o.head_dims)
            for (int S : o.varlen ? std::vector<int>{mean_len} : o.seqlens)
                for (bool causal : o.causal)
                for (const Variant& variant : all_variants) {
                    try {
                        if (o.varlen) {
                            auto dense = prepare(rt, same_tokens, d, S, causal, dt);
                            auto packed = prepare(rt, o, d, S, causal, dt, lens);
                            cases.push_back(std::move(dense));
                            cases.push_back(std::move(packed));
                            continue;
                        }
                        auto c = prepare(rt, o, d, S, causal, dt, {}, variant);
                        if (o.vs_padded) {
                            run_against_padded(std::move(c), rt, o, timer, finish, table);
                            continue;
                        }
                        if (o.interleave) {
                            cases.push_back(std::move(c));
                            continue;
                        }
                        for (int i = 0; i < o.warmup; ++i) timer.launch(*c, false);
                        for (int i = 0; i < o.reps; ++i) timer.launch(*c, true);
                        finish(*c);
                    } catch (const Error& e) {
                        ++failures;
                        util::print(table, "{:>4} {:>6} causal={} {}: error: {}\n", d, S, causal, dt, e.what());
                    }
                }
    for (int i = 0; i < o.warmup; ++i)
        for (auto& c : cases) timer.launch(*c, false);
    for (int i = 0; i < o.reps; ++i)
        for (auto& c : cases) timer.launch(*c, true);
    for (auto& c : cases) finish(*c);
    for (std::size_t i = 0; o.varlen && i + 1 < cases.size(); i += 2)
        util::print(table, "# d{} causal={}: varlen {:.3f}x the dense TFLOPS\n", cases[i]->d, cases[i]->causal,
                    rows[i + 1]["tflops"].get<double>() / rows[i]["tflops"].get<double>());
    write_results(o, o.vs_padded ? "throughput, against the padded head dim" : o.interleave ? "throughput, interleaved" : "throughput",
                  std::move(rows));
    return failures ? 1 : 0;
}

int run_latency(const BenchOptions& o) {
    // A private cache dir so "cold" really is cold.
    RuntimeOptions ro = o.runtime;
    if (ro.cache_dir.empty()) ro.cache_dir = util::format("/tmp/rtattn-bench-{}", getpid());
    const std::string& dir = ro.cache_dir;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    const bool gpu = driver::gpu_available();
    for (int d : o.head_dims) {
        AttentionConfig c;
        c.head_dim_qk = d;
        c.arch = gpu ? device_arch(c) : "sm_90a";
        double cold, disk, mem = 0;
        {
            Runtime rt(ro);
            const auto t0 = Clock::now();
            gpu ? (void)rt.get(c) : (void)rt.precompile(c);
            cold = seconds_since(t0);
            if (rt.stats().compiles != 1)
                throw Error(util::format("latency: expected a cold compile in {}, found the kernel cached", dir));
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
        util::print(o.json ? stderr : stdout, "d={:<4} {} cold compile {:.3f} s, disk hit {:.2f} ms, memory hit {:.1f} us ({})\n", d, c.arch,
                    cold, disk * 1e3, mem * 1e6, gpu ? "get() to a launchable kernel" : "precompile, no GPU");
        rows.push_back({{"d", d}, {"arch", c.arch}, {"cold_s", cold}, {"disk_hit_s", disk}, {"memory_hit_s", mem}});
    }
    write_results(o, "latency", std::move(rows));
    return 0;
}

}  // namespace

int run_bench(const BenchOptions& o) {
    if (o.decode) return run_decode_bench(o);
    return o.latency ? run_latency(o) : run_throughput(o);
}

void add_bench(CLI::App& app, const GlobalOptions& g, Action& action) {
    auto o = std::make_shared<BenchOptions>();
    auto causal = std::make_shared<std::string>("both");
    auto* cmd = app.add_subcommand("bench", "forward or backward TFLOPS over a shape grid (needs a GPU), or JIT latency");
    cmd->add_option("--head-dim", o->head_dims, "head dims (comma-separated list)")->delimiter(',')->type_name("D");
    auto range = std::make_shared<std::string>();
    cmd->add_option("--head-dim-range", *range, "head dims lo:hi:step, e.g. 32:256:4 (replaces --head-dim)");
    cmd->add_flag("--vs-padded", o->vs_padded,
                  "time each head dim off the 16 grid interleaved with the next multiple of 16 and report it against "
                  "that kernel's TFLOPS x d/pad16(d) (forward or --backward)");
    cmd->add_option("--seqlens", o->seqlens, "sequence lengths; batch = tokens / seqlen")->delimiter(',');
    cmd->add_option("--dtype", o->dtypes, "bf16, fp16")->delimiter(',');
    cmd->add_option("--causal", *causal, "true, false or both (default both)")
        ->check(CLI::IsMember({"true", "false", "both"}));
    cmd->add_option("--gqa", o->gqa, "q heads per kv head (default 1)")->check(CLI::Range(1, 64));
    cmd->add_option("--heads,--heads-q", o->heads, "query heads (default: 2048 / head_dim, 16 for d132)")->check(CLI::Range(1, 1024));
    cmd->add_option("--heads-kv", o->heads_kv, "K/V heads, as the other commands' --heads-kv (default: the query heads / "
                                               "--gqa)")
        ->check(CLI::Range(1, 1024))
        ->excludes("--gqa");
    cmd->add_option("--tokens", o->tokens, "batch * seqlen (default 16384)")->check(CLI::Range(1, 1 << 24));
    cmd->add_option("--reps", o->reps, "timed runs; the median is reported (default 30)")->check(CLI::Range(1, 10000));
    cmd->add_flag("--json", o->json, "print the results as JSON on stdout (the table goes to stderr)");
    cmd->add_option("--json-out", o->json_out, "also write the JSON results to this file")->type_name("FILE");
    cmd->add_flag("--interleave", o->interleave,
                  "prepare every shape first, then launch them round-robin (ratios between shapes)");
    cmd->add_flag("--backward", o->backward, "time the backward pass alone (dQ, dK, dV; FLOPs 2.5x the forward's)");
    cmd->add_flag("--deterministic", o->deterministic, "with --backward: bitwise-reproducible gradients");
    cmd->add_option("--arch", o->arch, "compile for this arch instead of the GPU's (sm_90 on Hopper: the mma.sync path)");
    cmd->add_flag("--latency", o->latency, "JIT latency instead: cold compile, disk hit (fresh Runtime), in-memory hit");
    cmd->add_flag("--decode", o->decode,
                  "the decode kernels: GB/s of K/V read (default 32 query heads, --gqa 4, causal false) and the share "
                  "of the copy bandwidth measured in the same run");
    cmd->add_option("--decode-shapes", o->decode_shapes, "with --decode: batch:cached_keys pairs (default "
                                                         "64:4096,8:32768,1:131072)")
        ->delimiter(',');
    cmd->add_option("--page-size", o->page_sizes, "with --decode: KV page sizes, 0 for a dense cache (default 0)")
        ->delimiter(',');
    cmd->add_option("--decode-q", o->decode_q,
                    "with --decode: query tokens per sequence, 1..16 (--cache-prefill: any) (default 1)")
        ->delimiter(',');
    cmd->add_flag("--cache-prefill", o->cache_prefill,
                  "with --decode: the prefill kernels on the same caches (a chunked prefill of --decode-q query tokens, "
                  "any count, against the cached keys; page 0: the dense forward), TFLOPS beside GB/s")
        ->needs("--decode");
    cmd->add_option("--num-splits", o->num_splits, "with --decode: key splits, 0 for the library's choice (default 0)")
        ->delimiter(',');
    cmd->add_flag("--varlen", o->varlen,
                  "a packed batch of sequences of random lengths (cu_seqlens) against the dense kernel on the same "
                  "tokens, interleaved (with --backward: the backward)");
    cmd->add_option("--varlen-seqs", o->varlen_seqs, "with --varlen: sequences (default 64)")->check(CLI::Range(1, 65535));
    cmd->add_option("--varlen-lens", o->varlen_lens, "with --varlen: lengths uniform in min:max (default 64:4096)");
    cmd->add_option("--window", o->windows,
                    "sliding windows LEFT:RIGHT (-1 unbounded), each timed with a local kernel, or off (default off); "
                    "FLOPs count the pairs a window keeps")
        ->delimiter(',');
    cmd->add_option("--sinks", o->sinks,
                    "off and/or on: on times a sinks kernel (each head's sink a call argument; the backward writes "
                    "dsinks too) (default off)")
        ->delimiter(',');
    cmd->add_option("--softcap", o->softcaps,
                    "off and/or caps > 0: each times a softcap kernel with that cap (default off)")
        ->delimiter(',');
    cmd->add_option("--alibi", o->alibi,
                    "off and/or on: on times an ALiBi kernel (BLOOM's slopes per head) (default off)")
        ->delimiter(',');
    auto* gqa = cmd->get_option("--gqa");
    cmd->callback([&action, &g, o, causal, gqa, range] {
        action = [&g, o, causal, gqa, range] {
            if (!range->empty()) o->head_dims = head_dim_range(*range);
            if (o->vs_padded && (o->decode || o->varlen || o->latency))
                throw ConfigError("--vs-padded", "is for the throughput benchmark (not with --decode, --varlen or "
                                                 "--latency)");
            if (o->decode && gqa->count() == 0) o->gqa = 4;
            if (o->decode && !o->cache_prefill && *causal == "both") *causal = "false";
            if (*causal != "both") o->causal = {*causal == "true"};
            o->runtime = runtime_options(g);
            return run_bench(*o);
        };
    });
}

}  // namespace rtattn::cli
