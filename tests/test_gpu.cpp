// End-to-end GPU tests: Runtime::get -> Kernel::forward, judged against the float64 host reference.
//
// Every case: fresh random inputs (seeded from the case description, so a failure reproduces), outputs and LSE
// pre-filled with NaN bit patterns (an element the kernel never wrote reads back as poison), buffers with guard
// space and, in strided layouts, gaps (a stray write shows up as a changed gap element; input gaps hold NaN so a
// stray read poisons the result). Cases are tables, run by one loop that reports the case's description on failure.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "driver/driver.hpp"
#include "reference.hpp"
#include "rtattn/rtattn.hpp"
#include "api/runtime_internal.hpp"
#include "testutil.hpp"

using namespace rtattn;

namespace {

using test::kPoison16;
using test::kPoison32;

// RTATTN_TEST_ARCH pins the kernels' arch, so one device can exercise each kernel family it can run (on Hopper,
// sm_90a gives the wgmma kernel and sm_90 the mma.sync one). Unset: the device's own arch.
const char* test_arch() {
    const char* a = std::getenv("RTATTN_TEST_ARCH");
    return a && *a ? a : nullptr;
}

bool test_arch_runs_here() {
    return !test_arch() || arch_runs_on(test_arch(), driver::current_device());
}

// A visible skip on machines without a GPU (the build hosts), or whose GPU cannot run RTATTN_TEST_ARCH.
#define SKIP_WITHOUT_GPU()                                                                    \
    do {                                                                                      \
        if (!driver::gpu_available()) RTATTN_SKIP("no GPU: no CUDA driver or device found"); \
        if (!test_arch_runs_here()) RTATTN_SKIP("this GPU cannot run RTATTN_TEST_ARCH=" << test_arch()); \
    } while (0)

// ---------------------------------------------------------------------------------------------------------------
// Tolerances. O is rounded to 16 bits on output and P is rounded to 16 bits before P·V, so the error floor is a
// few units of the format's epsilon (bf16 2^-8, fp16 2^-11); LSE is float32 end to end.
double o_tolerance(Dtype dt) { return dt == Dtype::bf16 ? 1e-2 : 2e-3; }
constexpr double kLseTolerance = 1e-4;

// Guard elements after every buffer: a write past the last row lands here instead of in someone else's memory.
constexpr std::int64_t kGuard = 256;

// ---------------------------------------------------------------------------------------------------------------
// What a case is.

enum class Layout {
    contiguous,  // [batch, seq, head, dim], dense
    padded,      // gaps after each head, each row and each batch (batch_stride > seqlen * seq_stride), offset ptr
    head_major,  // [batch, head, seq, dim] expressed through strides
    packed_qkv,  // Q, K and V interleaved in one [batch, seq, heads_q + 2 heads_kv, dim] buffer; O padded
    shared_kv,   // K and V with batch_stride 0: one K/V shared by every batch entry (inputs may alias)
    shifted,     // contiguous, but starting one vector into the buffer (d132: even heads 8 bytes off 16)
};

const char* to_string(Layout l) {
    switch (l) {
        case Layout::contiguous: return "contiguous";
        case Layout::padded: return "padded";
        case Layout::head_major: return "head-major";
        case Layout::packed_qkv: return "packed-qkv";
        case Layout::shared_kv: return "shared-kv";
        case Layout::shifted: return "shifted";
    }
    return "?";
}

enum class Dist { uniform, normal };  // uniform in [-1, 1]; normal N(0, 1) gives peakier softmax rows

struct Case {
    int d_qk = 64, d_v = 64;
    Dtype dtype = Dtype::bf16;
    bool causal = false;
    int heads_q = 4, heads_kv = 4;
    int batch = 2, seqlen_q = 77, seqlen_k = 211;
    Layout layout = Layout::contiguous;
    std::optional<double> scale = std::nullopt;  // softmax_scale override
    Dist dist = Dist::uniform;
    bool with_lse = true;         // false: ForwardArgs::lse = nullptr

    AttentionConfig config() const {
        AttentionConfig c;
        c.head_dim_qk = d_qk;
        if (d_v != d_qk) c.head_dim_v = d_v;
        c.dtype = dtype;
        c.causal = causal;
        c.num_heads_q = heads_q;
        c.num_heads_kv = heads_kv;
        c.softmax_scale = scale;
        if (test_arch()) c.arch = test_arch();
        return c;
    }

    // Computed here, not with AttentionConfig::scale(), so the library's default is checked rather than trusted.
    double effective_scale() const { return scale.value_or(1.0 / std::sqrt(double(d_qk))); }

    std::string describe() const {
        std::string s = fmt::format("d{}{} {} {} h{}:{} b{} s{}x{} {}", d_qk, d_v != d_qk ? fmt::format("/{}", d_v) : "",
                                    rtattn::to_string(dtype), causal ? "causal" : "full", heads_q, heads_kv, batch,
                                    seqlen_q, seqlen_k, to_string(layout));
        if (scale) s += fmt::format(" scale={}", *scale);
        if (dist == Dist::normal) s += " normal";
        if (!with_lse) s += " no-lse";
        return s;
    }

    // FNV-1a of the description: stable across runs and platforms, different for every case.
    std::uint32_t seed() const {
        std::uint32_t h = 2166136261u;
        for (unsigned char ch : describe()) h = (h ^ ch) * 16777619u;
        return h;
    }
};

// Elements per global vector access for a head dim: the largest of 8/4/2/1 dividing it. This is the kernel's
// documented alignment contract (pointers and strides must be multiples of it); the public API does not expose
// it, so the tests restate it.
int vec_width(int dim) {
    for (int v : {8, 4, 2})
        if (dim % v == 0) return v;
    return 1;
}

// ---------------------------------------------------------------------------------------------------------------
// Where each tensor lives: a buffer index, an element offset and strides.

struct Placement {
    int buffer = 0;
    std::int64_t offset = 0;
    std::int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;
    int batch = 0, seqlen = 0, heads = 0, dim = 0;

    std::int64_t index(int b, int s, int h, int d) const {
        return offset + b * batch_stride + s * seq_stride + h * head_stride + d;
    }
    std::int64_t end() const { return index(batch - 1, seqlen - 1, heads - 1, dim - 1) + 1; }  // strides >= 0

    template <class F>
    void for_each(F&& f) const {
        for (int b = 0; b < batch; ++b)
            for (int s = 0; s < seqlen; ++s)
                for (int h = 0; h < heads; ++h)
                    for (int d = 0; d < dim; ++d) f(b, s, h, d, index(b, s, h, d));
    }
};

struct Shape {
    int batch, seqlen, heads, dim;
};

Placement strided(int buffer, std::int64_t offset, Shape sh, std::int64_t head_stride, std::int64_t seq_stride,
                  std::int64_t batch_stride) {
    return Placement{buffer, offset, batch_stride, seq_stride, head_stride, sh.batch, sh.seqlen, sh.heads, sh.dim};
}

Placement dense(int buffer, Shape sh) {
    const std::int64_t hs = sh.dim, ss = hs * sh.heads, bs = ss * sh.seqlen;
    return strided(buffer, 0, sh, hs, ss, bs);
}

// Gaps of one vector width (the smallest legal padding) after each head, row and batch, and an offset start.
Placement padded(int buffer, Shape sh) {
    const std::int64_t pad = vec_width(sh.dim);
    const std::int64_t hs = sh.dim + pad, ss = sh.heads * hs + pad, bs = sh.seqlen * ss + 3 * pad;
    return strided(buffer, pad, sh, hs, ss, bs);
}

Placement shifted(int buffer, Shape sh) {
    Placement p = dense(buffer, sh);
    p.offset = vec_width(sh.dim);
    return p;
}

Placement head_major(int buffer, Shape sh) {
    const std::int64_t ss = sh.dim, hs = ss * sh.seqlen, bs = hs * sh.heads;
    return strided(buffer, 0, sh, hs, ss, bs);
}

struct Problem {
    Case c;
    std::vector<std::vector<std::uint16_t>> buffers;  // host images: inputs randomized, gaps and O poisoned
    Placement q, k, v, o;

    std::size_t lse_count() const { return std::size_t(c.batch) * c.heads_q * c.seqlen_q; }
};

void place_tensors(Problem& p) {
    const Case& c = p.c;
    const Shape qs{c.batch, c.seqlen_q, c.heads_q, c.d_qk}, ks{c.batch, c.seqlen_k, c.heads_kv, c.d_qk},
        vs{c.batch, c.seqlen_k, c.heads_kv, c.d_v}, os{c.batch, c.seqlen_q, c.heads_q, c.d_v};
    switch (c.layout) {
        case Layout::contiguous:
            p.q = dense(0, qs), p.k = dense(1, ks), p.v = dense(2, vs), p.o = dense(3, os);
            break;
        case Layout::padded:
            p.q = padded(0, qs), p.k = padded(1, ks), p.v = padded(2, vs), p.o = padded(3, os);
            break;
        case Layout::head_major:
            p.q = head_major(0, qs), p.k = head_major(1, ks), p.v = head_major(2, vs), p.o = head_major(3, os);
            break;
        case Layout::packed_qkv: {
            // One row per token holds every Q head, then every K head, then every V head (the usual fused QKV
            // projection output). Only meaningful for self-attention, so seqlen_q == seqlen_k.
            const std::int64_t row = std::int64_t(c.heads_q) * c.d_qk + std::int64_t(c.heads_kv) * (c.d_qk + c.d_v);
            const std::int64_t bs = row * c.seqlen_q;
            p.q = strided(0, 0, qs, c.d_qk, row, bs);
            p.k = strided(0, std::int64_t(c.heads_q) * c.d_qk, ks, c.d_qk, row, bs);
            p.v = strided(0, std::int64_t(c.heads_q + c.heads_kv) * c.d_qk, vs, c.d_v, row, bs);
            p.o = padded(1, os);
            break;
        }
        case Layout::shifted:
            p.q = shifted(0, qs), p.k = shifted(1, ks), p.v = shifted(2, vs), p.o = shifted(3, os);
            break;
        case Layout::shared_kv: {
            p.q = dense(0, qs), p.o = dense(3, os);
            p.k = dense(1, ks), p.v = dense(2, vs);
            p.k.batch_stride = 0, p.v.batch_stride = 0;
            break;
        }
    }
}

// Buffers sized to what their tensors span plus a guard; everything starts as poison, then the inputs' own
// elements get random values. Values go through the 16-bit rounding here, so the reference sees exactly what the
// kernel sees.
Problem make_problem(const Case& c, std::uint32_t salt = 0) {
    Problem p;
    p.c = c;
    place_tensors(p);
    const Placement* all[] = {&p.q, &p.k, &p.v, &p.o};
    int nbuf = 0;
    for (const Placement* t : all) nbuf = std::max(nbuf, t->buffer + 1);
    std::vector<std::int64_t> sizes(nbuf, 0);
    for (const Placement* t : all) sizes[t->buffer] = std::max(sizes[t->buffer], t->end() + kGuard);
    for (std::int64_t n : sizes) p.buffers.emplace_back(std::size_t(n), kPoison16);

    std::mt19937 rng(c.seed() ^ (salt * 0x9e3779b9u));
    std::uniform_real_distribution<float> uniform(-1.f, 1.f);
    std::normal_distribution<float> normal(0.f, 1.f);
    for (const Placement* t : {&p.q, &p.k, &p.v}) {
        auto& buf = p.buffers[t->buffer];
        t->for_each([&](int, int, int, int, std::int64_t i) {
            const float x = c.dist == Dist::uniform ? uniform(rng) : normal(rng);
            buf[i] = test::to_bits(x, c.dtype);
        });
    }
    return p;
}

test::ReferenceResult reference_for(const Problem& p) {
    auto view = [&](const Placement& t) {
        return test::HostTensorView{p.buffers[t.buffer].data() + t.offset, t.batch_stride, t.seq_stride,
                                    t.head_stride};
    };
    test::ReferenceProblem r;
    r.dtype = p.c.dtype;
    r.batch = p.c.batch, r.seqlen_q = p.c.seqlen_q, r.seqlen_k = p.c.seqlen_k;
    r.heads_q = p.c.heads_q, r.heads_kv = p.c.heads_kv;
    r.head_dim_qk = p.c.d_qk, r.head_dim_v = p.c.d_v;
    r.causal = p.c.causal;
    r.scale = p.c.effective_scale();
    r.q = view(p.q), r.k = view(p.k), r.v = view(p.v);
    return test::reference_forward(r);
}

// ---------------------------------------------------------------------------------------------------------------
// Device side.

struct DeviceResult {
    std::vector<std::uint16_t> o_buffer;  // the whole O buffer, gaps and guard included
    std::vector<float> lse;               // lse_count() + kGuard
};

class DeviceProblem {
public:
    explicit DeviceProblem(const Problem& p) : lse_((p.lse_count() + kGuard) * sizeof(float)) {
        for (const auto& b : p.buffers) buffers_.emplace_back(b.size() * sizeof(std::uint16_t));
    }

    // Synchronous copies on the legacy stream; the O buffer is an output and never shares a buffer with inputs.
    void upload_inputs(const Problem& p) {
        for (std::size_t i = 0; i < buffers_.size(); ++i)
            if (int(i) != p.o.buffer) buffers_[i].upload(p.buffers[i].data(), buffers_[i].bytes());
    }

    void poison_outputs(const Problem& p) {
        buffers_[p.o.buffer].fill_u16(kPoison16);
        lse_.fill_u32(kPoison32);
    }

    ForwardArgs args(const Problem& p) const {
        auto arg = [&](const Placement& t) {
            TensorArg a;
            a.ptr = static_cast<const char*>(buffers_[t.buffer].get()) + t.offset * sizeof(std::uint16_t);
            a.batch_stride = t.batch_stride, a.seq_stride = t.seq_stride, a.head_stride = t.head_stride;
            return a;
        };
        ForwardArgs a;
        a.q = arg(p.q), a.k = arg(p.k), a.v = arg(p.v), a.o = arg(p.o);
        a.lse = p.c.with_lse ? static_cast<float*>(lse_.get()) : nullptr;
        a.batch = p.c.batch, a.seqlen_q = p.c.seqlen_q, a.seqlen_k = p.c.seqlen_k;
        return a;
    }

    DeviceResult download(const Problem& p) const {
        DeviceResult r;
        const auto& ob = buffers_[p.o.buffer];
        r.o_buffer.resize(ob.bytes() / sizeof(std::uint16_t));
        ob.download(r.o_buffer.data(), ob.bytes());
        r.lse.resize(lse_.bytes() / sizeof(float));
        lse_.download(r.lse.data(), lse_.bytes());
        return r;
    }

private:
    std::vector<driver::DeviceBuffer> buffers_;
    driver::DeviceBuffer lse_;
};

// Copies and fills run on the legacy stream. driver::Stream is created blocking, so work on it already waits for
// them; draining the legacy stream explicitly keeps the tests independent of that choice.
void sync_legacy_stream() {
    driver::check(driver::api().cuStreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize(legacy)");
}

// ---------------------------------------------------------------------------------------------------------------
// Judging.

struct Outcome {
    double o_err = 0, lse_err = 0;
    std::size_t o_unwritten = 0;     // still poison
    std::size_t o_stray = 0;         // gap or guard elements of the O buffer that changed
    std::size_t lse_unwritten = 0;
    std::size_t lse_written = 0;     // LSE elements not poison (must be 0 when lse == nullptr)
    std::size_t lse_stray = 0;       // guard elements past the LSE array that changed
    std::size_t empty_rows = 0;      // query rows that see no key (causal, seqlen_q > seqlen_k)
    std::size_t empty_row_errors = 0;  // ... whose O row is not all zeros or whose LSE is not +inf
};

bool is_poison(float x) { return std::bit_cast<std::uint32_t>(x) == kPoison32; }

Outcome evaluate(const Problem& p, const DeviceResult& got, const test::ReferenceResult& ref) {
    Outcome r;
    const Dtype dt = p.c.dtype;

    // O: every element of the logical view, compared as a whole; everything else in the buffer must be untouched.
    std::vector<double> out(ref.o.size());
    std::vector<char> in_view(got.o_buffer.size(), 0);
    p.o.for_each([&](int b, int s, int h, int d, std::int64_t i) {
        const std::uint16_t bits = got.o_buffer[i];
        if (bits == kPoison16) ++r.o_unwritten;
        out[ref.o_index(b, s, h, d)] = test::from_bits(bits, dt);
        in_view[i] = 1;
    });
    for (std::size_t i = 0; i < got.o_buffer.size(); ++i)
        if (!in_view[i] && got.o_buffer[i] != kPoison16) ++r.o_stray;
    r.o_err = test::rel_frobenius(out, ref.o);

    // LSE: rows with keys are compared as a vector; rows without must be exactly +inf with an all-zero O row.
    std::vector<double> lse_out, lse_ref;
    for (int b = 0; b < p.c.batch; ++b)
        for (int h = 0; h < p.c.heads_q; ++h)
            for (int s = 0; s < p.c.seqlen_q; ++s) {
                const std::size_t i = ref.lse_index(b, h, s);
                const float g = got.lse[i];
                if (is_poison(g))
                    ++r.lse_unwritten;
                else
                    ++r.lse_written;
                if (std::isinf(ref.lse[i])) {
                    ++r.empty_rows;
                    bool zero_row = true;
                    for (int d = 0; d < p.c.d_v; ++d) zero_row = zero_row && out[ref.o_index(b, s, h, d)] == 0.0;
                    const bool lse_ok = !p.c.with_lse || (std::isinf(g) && g > 0);
                    if (!zero_row || !lse_ok) ++r.empty_row_errors;
                    continue;
                }
                lse_out.push_back(g);
                lse_ref.push_back(ref.lse[i]);
            }
    for (std::size_t i = p.lse_count(); i < got.lse.size(); ++i)
        if (!is_poison(got.lse[i])) ++r.lse_stray;
    if (p.c.with_lse) r.lse_err = test::rel_frobenius_floor1(lse_out, lse_ref);
    return r;
}

// Empty when the outcome passes; otherwise every reason it does not, for the failure message.
std::string judge(const Outcome& r, const Case& c) {
    std::vector<std::string> why;
    if (r.o_unwritten) why.push_back(fmt::format("{} O elements never written", r.o_unwritten));
    if (r.o_stray) why.push_back(fmt::format("{} O buffer elements outside the tensor overwritten", r.o_stray));
    if (!(r.o_err <= o_tolerance(c.dtype)))
        why.push_back(fmt::format("O rel error {:.3e} > {:.0e}", r.o_err, o_tolerance(c.dtype)));
    if (c.with_lse) {
        if (r.lse_unwritten) why.push_back(fmt::format("{} LSE elements never written", r.lse_unwritten));
        if (!(r.lse_err <= kLseTolerance))
            why.push_back(fmt::format("LSE rel error {:.3e} > {:.0e}", r.lse_err, kLseTolerance));
    } else if (r.lse_written) {
        why.push_back(fmt::format("lse == nullptr, yet {} LSE elements written", r.lse_written));
    }
    if (r.lse_stray) why.push_back(fmt::format("{} elements past the LSE array overwritten", r.lse_stray));
    if (r.empty_row_errors)
        why.push_back(fmt::format("{} of {} keyless rows not (O = 0, LSE = +inf)", r.empty_row_errors, r.empty_rows));
    std::string s;
    for (const auto& w : why) s += (s.empty() ? "" : "; ") + w;
    return s;
}

// ---------------------------------------------------------------------------------------------------------------
// One Runtime for the whole file, with a private cache so every run compiles what it tests.

struct SharedRuntime {
    test::TempDir dir{"rtattn-gpu-test"};
    Runtime runtime{options(dir)};

    static RuntimeOptions options(const test::TempDir& d) {
        RuntimeOptions o;
        o.cache_dir = d.str();
        o.max_concurrent_compiles = int(std::max(1u, std::thread::hardware_concurrency()));
        return o;
    }
};

Runtime& runtime() {
    static SharedRuntime shared;
    return shared.runtime;
}

// ---------------------------------------------------------------------------------------------------------------
// Case tables.

constexpr Dtype kDtypes[] = {Dtype::bf16, Dtype::fp16};
constexpr bool kCausal[] = {false, true};

std::vector<Case> matrix_cases() {
    // MHA, GQA (group 4) and MQA; seqlens that are tile multiples of nothing, with seqlen_q != seqlen_k.
    constexpr std::pair<int, int> kHeads[] = {{4, 4}, {8, 2}, {4, 1}};
    std::vector<Case> out;
    for (int d : {1, 8, 17, 32, 48, 64, 80, 96, 100, 128, 132, 136, 144, 160, 192, 256})
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                for (auto [hq, hkv] : kHeads)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = hq,
                                   .heads_kv = hkv, .batch = 2, .seqlen_q = 77, .seqlen_k = 211});
    return out;
}

std::vector<Case> shape_cases() {
    // Single rows and keys, one partial tile, many full tiles, and (300, 77) / (1000, 1) where causal leaves
    // leading query rows with no key at all.
    constexpr std::pair<int, int> kSeqlens[] = {{1, 1}, {1, 1000}, {1000, 1}, {77, 77}, {1000, 1000}, {300, 77}};
    std::vector<Case> out;
    for (int d : {64, 128, 132, 256})
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                for (auto [sq, sk] : kSeqlens)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = 4, .heads_kv = 2,
                                   .batch = 3, .seqlen_q = sq, .seqlen_k = sk, .dist = Dist::normal});
    // Long key ranges: the K/V ring wraps a dozen times, so every barrier phase flips many times per CTA.
    for (int d : {100, 128, 132})
        for (bool causal : kCausal)
            out.push_back({.d_qk = d, .d_v = d, .causal = causal, .heads_q = 2, .heads_kv = 1, .batch = 1,
                           .seqlen_q = 700, .seqlen_k = 3001, .dist = Dist::normal});
    return out;
}

std::vector<Case> stride_cases() {
    // vec widths 1 (d17), 8 (d64), 4 (d100, d132: split rows on sm_90a); d256 (the largest tiles); and
    // head_dim_v != head_dim_qk. Split rows load with TMA where a layout keeps rows 8 bytes from 16-byte
    // boundaries at most (contiguous, packed, shifted: K/V heads alternate or swap alignment), else with cp.async.
    constexpr std::pair<int, int> kDims[] = {{17, 17},   {64, 64},   {100, 100}, {132, 132},
                                             {256, 256}, {192, 128}, {132, 100}};
    constexpr Layout kLayouts[] = {Layout::contiguous, Layout::padded,    Layout::head_major,
                                   Layout::packed_qkv, Layout::shared_kv, Layout::shifted};
    std::vector<Case> out;
    for (auto [dqk, dv] : kDims)
        for (Layout layout : kLayouts)
            for (Dtype dt : kDtypes)
                for (bool causal : kCausal) {
                    const bool self = layout == Layout::packed_qkv;  // one buffer: seqlen_q == seqlen_k
                    out.push_back({.d_qk = dqk, .d_v = dv, .dtype = dt, .causal = causal, .heads_q = 4,
                                   .heads_kv = 2, .batch = 2, .seqlen_q = self ? 150 : 77,
                                   .seqlen_k = self ? 150 : 211, .layout = layout});
                }
    // LSE is optional: with a null pointer nothing may be written to where it would have gone.
    for (int d : {64, 132})
        out.push_back({.d_qk = d, .d_v = d, .causal = true, .seqlen_q = 300, .seqlen_k = 77, .with_lse = false});
    return out;
}

std::vector<Case> scale_cases() {
    // Both differ from every default here (1/sqrt(d) <= 0.25 for d >= 17); with normal inputs 2.0 makes rows
    // nearly one-hot, which stresses the running-max rescaling.
    std::vector<Case> out;
    for (int d : {17, 64, 132, 256})
        for (double scale : {0.5, 2.0})
            for (Dtype dt : kDtypes)
                for (bool causal : kCausal)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = 4, .heads_kv = 2,
                                   .scale = scale, .dist = Dist::normal});
    return out;
}

std::vector<Case> graph_cases() {
    return {{.d_qk = 128, .d_v = 128, .dtype = Dtype::bf16, .causal = true, .heads_q = 8, .heads_kv = 2},
            {.d_qk = 132, .d_v = 132, .dtype = Dtype::fp16, .causal = false, .layout = Layout::padded}};
}

// Configs the argument-error and cache tests use: vec 8 (d128) and vec 4 (d132).
std::vector<Case> error_cases() {
    return {{.d_qk = 128, .d_v = 128, .dtype = Dtype::bf16}, {.d_qk = 132, .d_v = 132, .dtype = Dtype::fp16}};
}

// Compiles every kernel this file needs, in parallel, once. The cubin depends only on the head dims, dtype and
// causal (heads and scale are launch parameters), so one get() per such tuple fills the Runtime's memory cache
// and the cases' own get() calls are hits. A compile failure here is not reported: the case that needs the
// kernel calls get() again and fails with the config in its message.
void warm_all() {
    static std::once_flag once;
    std::call_once(once, [] {
        std::set<std::tuple<int, int, Dtype, bool>> seen;
        std::vector<AttentionConfig> configs;
        for (const auto& table : {matrix_cases(), shape_cases(), stride_cases(), scale_cases(), graph_cases(),
                                  error_cases()})
            for (const Case& c : table)
                if (seen.emplace(c.d_qk, c.d_v, c.dtype, c.causal).second) {
                    Case canonical = c;
                    canonical.heads_q = canonical.heads_kv = 1;
                    canonical.scale.reset();
                    configs.push_back(canonical.config());
                }
        Runtime& rt = runtime();
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::future<std::string>> jobs;  // empty string: ok, else the error
        for (const auto& cfg : configs)
            jobs.push_back(std::async(std::launch::async, [&rt, cfg]() -> std::string {
                try {
                    rt.get(cfg);
                    return "";
                } catch (const std::exception& e) {
                    return cfg.describe() + ": " + e.what();
                }
            }));
        std::vector<std::string> failures;
        for (auto& j : jobs)
            if (auto err = j.get(); !err.empty()) failures.push_back(std::move(err));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const CacheStats st = rt.stats();
        std::printf("[gpu] warm-up: %zu kernels in %.1f s wall (%llu compiles, %.1f s summed over builds), %zu "
                    "failed%s%s\n",
                    configs.size(), secs, (unsigned long long)st.compiles, st.compile_seconds, failures.size(),
                    failures.empty() ? "" : "; first: ", failures.empty() ? "" : failures.front().c_str());
        std::fflush(stdout);
    });
}

// ---------------------------------------------------------------------------------------------------------------
// Running cases.

Outcome run_case(const Case& c) {
    const Kernel kernel = runtime().get(c.config());  // also makes the context current on this thread
    const Problem p = make_problem(c);
    DeviceProblem dev(p);
    dev.upload_inputs(p);
    dev.poison_outputs(p);
    kernel.forward(dev.args(p));            // legacy stream: ordered after the copies and fills above
    const auto ref = reference_for(p);      // host work overlaps the kernel
    return evaluate(p, dev.download(p), ref);
}

struct TableSummary {
    int run = 0, failed = 0;
    double worst_o[2] = {0, 0};  // indexed by dtype: bf16, fp16
    std::string worst_o_case[2];
    double worst_lse = 0;
};

void run_table(const char* name, const std::vector<Case>& cases) {
    TableSummary sum;
    for (const Case& c : cases) {
        INFO("case: " << c.describe() << " (seed " << c.seed() << ")");
        ++sum.run;
        std::string failure;
        try {
            const Outcome r = run_case(c);
            failure = judge(r, c);
            const int di = c.dtype == Dtype::bf16 ? 0 : 1;
            if (r.o_err > sum.worst_o[di]) {
                sum.worst_o[di] = r.o_err;
                sum.worst_o_case[di] = c.describe();
            }
            sum.worst_lse = std::max(sum.worst_lse, r.lse_err);
        } catch (const std::exception& e) {
            failure = std::string("exception: ") + e.what();
        }
        if (!failure.empty()) ++sum.failed;
        CHECK(failure == "");
    }
    std::printf("[gpu] %s: %d cases, %d failed; worst O rel err bf16 %.2e (%s), fp16 %.2e (%s); worst LSE rel err "
                "%.2e\n",
                name, sum.run, sum.failed, sum.worst_o[0], sum.worst_o_case[0].c_str(), sum.worst_o[1],
                sum.worst_o_case[1].c_str(), sum.worst_lse);
    std::fflush(stdout);
}

}  // namespace

// ===============================================================================================================

TEST_CASE("forward matches the float64 reference: head_dim x dtype x causal x MHA/GQA/MQA", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    const auto cases = matrix_cases();
    REQUIRE(cases.size() == 16 * 2 * 2 * 3);  // head dims x dtypes x causal x head layouts
    run_table("matrix", cases);
}

TEST_CASE("forward handles degenerate and long sequence shapes, including keyless causal rows", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    run_table("shapes", shape_cases());
}

TEST_CASE("forward honours arbitrary strides and head_dim_v != head_dim_qk", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    run_table("strides", stride_cases());
}

TEST_CASE("softmax_scale override is applied to O and LSE", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    run_table("scale", scale_cases());
}

namespace {

// Owns a captured graph and its executable instance.
struct Graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    ~Graph() {
        if (exec) driver::api().cuGraphExecDestroy(exec);
        if (graph) driver::api().cuGraphDestroy(graph);
    }
};

// Capturing fails (and invalidates the capture) if forward() synchronizes or allocates, so a successful capture
// plus correct replays with new data proves it only enqueues the launch.
void check_graph_replay(const Case& c) {
    const auto& api = driver::api();
    const Kernel kernel = runtime().get(c.config());
    const Problem inputs[2] = {make_problem(c, 0), make_problem(c, 1)};  // same layout, different values
    DeviceProblem dev(inputs[0]);
    dev.upload_inputs(inputs[0]);
    dev.poison_outputs(inputs[0]);
    sync_legacy_stream();  // the capture stream does not wait for the legacy stream

    driver::Stream stream;
    Graph g;
    driver::check(api.cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    try {
        kernel.forward(dev.args(inputs[0]), stream.get());
    } catch (...) {
        api.cuStreamEndCapture(stream.get(), &g.graph);  // leave the stream usable, then report
        throw;
    }
    driver::check(api.cuStreamEndCapture(stream.get(), &g.graph), "cuStreamEndCapture");
    REQUIRE(g.graph != nullptr);

    // Capture records the launch without running it: the output must still be all poison.
    {
        const DeviceResult untouched = dev.download(inputs[0]);
        CHECK(test::count_bits(untouched.o_buffer, kPoison16) == untouched.o_buffer.size());
    }

    driver::check(api.cuGraphInstantiate(&g.exec, g.graph, 0), "cuGraphInstantiate");
    for (int run = 0; run < 2; ++run) {
        INFO("graph launch " << run + 1 << " of 2");
        const Problem& p = inputs[run];
        if (run > 0) {  // new values into the same device buffers the graph was captured with
            dev.upload_inputs(p);
            dev.poison_outputs(p);
            sync_legacy_stream();
        }
        driver::check(api.cuGraphLaunch(g.exec, stream.get()), "cuGraphLaunch");
        stream.sync();
        const Outcome r = evaluate(p, dev.download(p), reference_for(p));
        CHECK(judge(r, c) == "");
    }
}

}  // namespace

TEST_CASE("forward is capturable into a CUDA graph and replays with new inputs", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    for (const Case& c : graph_cases()) {
        INFO("case: " << c.describe());
        try {
            check_graph_replay(c);
        } catch (const std::exception& e) {
            FAIL_CHECK("exception: " << e.what());
        }
    }
}

namespace {

// The field an ArgumentError names, or a description of what happened instead.
std::string argument_error_field(const Kernel& kernel, const ForwardArgs& a) {
    try {
        kernel.forward(a);
        return "<no error>";
    } catch (const ArgumentError& e) {
        // The message must lead with the field, so a user reading only what() knows which argument is wrong.
        if (std::string(e.what()).rfind(e.field() + ":", 0) != 0) return "<what() does not start with field>";
        return e.field();
    } catch (const std::exception& e) {
        return std::string("<other exception: ") + e.what() + ">";
    }
}

const void* offset_elems(const void* p, std::int64_t elems) {
    return static_cast<const char*>(p) + elems * std::int64_t(sizeof(std::uint16_t));
}

struct BadArgs {
    const char* what;
    std::function<void(ForwardArgs&)> mutate;
    const char* field;
};

// Mutations of a valid ForwardArgs, each expected to be refused naming `field`. `vec` is the kernel's vector
// width (>= 2 here), so "vec / 2" is the smallest misalignment it must reject.
std::vector<BadArgs> bad_args(int vec, int dim) {
    const int half = vec / 2;
    return {
        {"null q", [](ForwardArgs& a) { a.q.ptr = nullptr; }, "q.ptr"},
        {"null k", [](ForwardArgs& a) { a.k.ptr = nullptr; }, "k.ptr"},
        {"null v", [](ForwardArgs& a) { a.v.ptr = nullptr; }, "v.ptr"},
        {"null o", [](ForwardArgs& a) { a.o.ptr = nullptr; }, "o.ptr"},
        {"q one element off", [](ForwardArgs& a) { a.q.ptr = offset_elems(a.q.ptr, 1); }, "q.ptr"},
        {"k half a vector off", [=](ForwardArgs& a) { a.k.ptr = offset_elems(a.k.ptr, half); }, "k.ptr"},
        {"o one element off", [](ForwardArgs& a) { a.o.ptr = offset_elems(a.o.ptr, 1); }, "o.ptr"},
        {"q seq_stride off by half a vector", [=](ForwardArgs& a) { a.q.seq_stride += half; }, "q.seq_stride"},
        {"k head_stride odd", [](ForwardArgs& a) { a.k.head_stride += 1; }, "k.head_stride"},
        {"v batch_stride off by half a vector", [=](ForwardArgs& a) { a.v.batch_stride += half; }, "v.batch_stride"},
        {"o seq_stride odd", [](ForwardArgs& a) { a.o.seq_stride += 1; }, "o.seq_stride"},
        {"q negative batch_stride", [=](ForwardArgs& a) { a.q.batch_stride = -vec; }, "q.batch_stride"},
        {"o heads overlap", [=](ForwardArgs& a) { a.o.head_stride = vec * ((dim / 2) / vec); }, "o"},
        {"o rows overlap heads", [](ForwardArgs& a) { a.o.seq_stride = a.o.head_stride; }, "o"},
        {"o batches alias", [](ForwardArgs& a) { a.o.batch_stride = 0; }, "o"},
        {"batch 0", [](ForwardArgs& a) { a.batch = 0; }, "batch"},
        {"batch -1", [](ForwardArgs& a) { a.batch = -1; }, "batch"},
        {"batch 65536 (grid z limit)", [](ForwardArgs& a) { a.batch = 65536; }, "batch"},
        {"seqlen_q 0", [](ForwardArgs& a) { a.seqlen_q = 0; }, "seqlen_q"},
        {"seqlen_k 0", [](ForwardArgs& a) { a.seqlen_k = 0; }, "seqlen_k"},
        {"lse not 4-byte aligned",
         [](ForwardArgs& a) { a.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.lse) + 2); }, "lse"},
    };
}

}  // namespace

TEST_CASE("forward rejects bad arguments with an ArgumentError naming the field", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    for (const Case& c : error_cases()) {
        const int vec = vec_width(c.d_qk);
        INFO("case: " << c.describe() << " (vector width " << vec << ")");
        const Kernel kernel = runtime().get(c.config());
        const Problem p = make_problem(c);
        DeviceProblem dev(p);
        dev.upload_inputs(p);
        dev.poison_outputs(p);
        const ForwardArgs valid = dev.args(p);

        for (const BadArgs& bad : bad_args(vec, c.d_v)) {
            INFO("mutation: " << bad.what);
            ForwardArgs a = valid;
            bad.mutate(a);
            CHECK(argument_error_field(kernel, a) == bad.field);
        }
        CHECK(argument_error_field(Kernel{}, valid) == "kernel");

        // Refused calls must not have launched anything; then the unmutated args must work, proving the refusals
        // came from the mutation and not from a broken baseline.
        const DeviceResult before = dev.download(p);
        CHECK(test::count_bits(before.o_buffer, kPoison16) == before.o_buffer.size());
        kernel.forward(valid);
        CHECK(judge(evaluate(p, dev.download(p), reference_for(p)), c) == "");
    }
}

TEST_CASE("get() for a cached config is a memory hit and returns an equivalent kernel", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all();
    const Case c = error_cases().front();
    Runtime& rt = runtime();
    const Kernel first = rt.get(c.config());

    const CacheStats before = rt.stats();
    const Kernel second = rt.get(c.config());
    const CacheStats after = rt.stats();
    CHECK(after.memory_hits == before.memory_hits + 1);
    CHECK(after.disk_hits == before.disk_hits);
    CHECK(after.misses == before.misses);
    CHECK(after.compiles == before.compiles);
    CHECK(second.info().from_cache);
    CHECK(second.info().key == first.info().key);
    CHECK(second.config() == first.config());

    // Copying a Kernel shares its state rather than duplicating it (cheap to pass by value).
    const Kernel copy = first;
    CHECK(&copy.info() == &first.info());
    CHECK(&copy.config() == &first.config());

    // All three launch the same code: bit-identical outputs on the same inputs.
    const Problem p = make_problem(c);
    DeviceProblem dev(p);
    dev.upload_inputs(p);
    std::vector<DeviceResult> results;
    for (const Kernel* k : {&first, &second, &copy}) {
        dev.poison_outputs(p);
        k->forward(dev.args(p));
        results.push_back(dev.download(p));
    }
    CHECK(judge(evaluate(p, results[0], reference_for(p)), c) == "");
    const bool second_same = results[1].o_buffer == results[0].o_buffer;  // (not CHECKed directly: Catch would
    const bool copy_same = results[2].o_buffer == results[0].o_buffer;    // print every element on failure)
    CHECK(second_same);
    CHECK(copy_same);
}

// ===============================================================================================================
// The reference itself, on the host (tagged [gpu] to run with the GPU suite; needs no device).

namespace {

// The reference's view of the nearest 16-bit value, found by brute force over neighbouring bit patterns: the
// candidate with the smallest |error|, ties to the even pattern.
std::uint16_t nearest_by_search(float f, Dtype dt) {
    const std::uint16_t guess = test::to_bits(f, dt);
    std::uint16_t best = guess;
    double best_err = std::numeric_limits<double>::infinity();
    for (int delta = -2; delta <= 2; ++delta) {
        const std::uint16_t cand = std::uint16_t(guess + delta);
        if ((cand & 0x8000) != (guess & 0x8000)) continue;  // stay on one side of zero
        const float x = test::from_bits(cand, dt);
        if (!std::isfinite(x)) continue;
        const double err = std::fabs(double(x) - double(f));
        if (err < best_err || (err == best_err && (cand & 1) == 0)) best = cand, best_err = err;
    }
    return best;
}

}  // namespace

TEST_CASE("16-bit conversions round to nearest even and round-trip", "[gpu][reference]") {
    for (Dtype dt : kDtypes) {
        INFO("dtype " << to_string(dt));
        // Every bit pattern round-trips (NaN only has to stay NaN).
        int mismatches = 0;
        for (std::uint32_t b = 0; b <= 0xffff; ++b) {
            const float x = test::from_bits(std::uint16_t(b), dt);
            const std::uint16_t back = test::to_bits(x, dt);
            if (std::isnan(x) ? !std::isnan(test::from_bits(back, dt)) : back != b) ++mismatches;
        }
        CHECK(mismatches == 0);
        // Random finite values in the representable range agree with a brute-force nearest-even search.
        std::mt19937 rng(12345);
        std::uniform_real_distribution<float> mant(1.f, 2.f);
        // fp16 exponents stop below 65504 (the search only knows finite values); bf16 reaches deep subnormals.
        std::uniform_int_distribution<int> expo(dt == Dtype::fp16 ? -26 : -130, dt == Dtype::fp16 ? 14 : 15);
        int wrong = 0;
        for (int i = 0; i < 200000; ++i) {
            const float f = std::ldexp(mant(rng), expo(rng)) * (i % 2 ? -1.f : 1.f);
            if (test::to_bits(f, dt) != nearest_by_search(f, dt)) ++wrong;
        }
        CHECK(wrong == 0);
    }
    // Hand-picked edges.
    CHECK(test::float_to_bf16(1.0f) == 0x3f80);
    CHECK(test::float_to_bf16(1.0f + 0x1p-8f) == 0x3f80);        // tie -> even
    CHECK(test::float_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82);    // tie -> even (up)
    CHECK(test::float_to_bf16(std::numeric_limits<float>::max()) == 0x7f80);  // rounds to inf
    CHECK(test::float_to_half(65504.f) == 0x7bff);
    CHECK(test::float_to_half(65519.f) == 0x7bff);
    CHECK(test::float_to_half(65520.f) == 0x7c00);  // tie above max -> inf
    CHECK(test::float_to_half(0x1p-14f) == 0x0400);  // smallest normal
    CHECK(test::float_to_half(0x1p-24f) == 0x0001);  // smallest subnormal
    CHECK(test::float_to_half(0x1p-25f) == 0x0000);  // tie -> even zero
    CHECK(test::float_to_half(0x1.8p-25f) == 0x0001);
    CHECK(test::float_to_half(3 * 0x1p-25f) == 0x0002);  // 1.5 units, tie -> even
    CHECK(test::float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
    CHECK(std::isnan(test::half_to_float(test::float_to_half(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(std::isnan(test::half_to_float(kPoison16)));
    CHECK(std::isnan(test::bf16_to_float(kPoison16)));
}

TEST_CASE("reference attention: hand-checkable cases", "[gpu][reference]") {
    // Two keys, two queries, causal with seqlen_q > seqlen_k... built directly in bf16 bit patterns.
    // q rows: [1, 0], [0, 1], [1, 1]; keys: [1, 0], [0, 1]; values: [1, 2], [3, 4]; scale 1.
    auto b = [](float x) { return test::float_to_bf16(x); };
    const std::vector<std::uint16_t> q = {b(1), b(0), b(0), b(1), b(1), b(1)};
    const std::vector<std::uint16_t> k = {b(1), b(0), b(0), b(1)};
    const std::vector<std::uint16_t> v = {b(1), b(2), b(3), b(4)};
    test::ReferenceProblem p;
    p.dtype = Dtype::bf16;
    p.seqlen_q = 3, p.seqlen_k = 2, p.head_dim_qk = 2, p.head_dim_v = 2, p.scale = 1.0;
    p.q = {q.data(), 6, 2, 2}, p.k = {k.data(), 4, 2, 2}, p.v = {v.data(), 4, 2, 2};

    SECTION("full attention") {
        const auto r = test::reference_forward(p, 3);
        const double e = std::exp(1.0), w = e / (e + 1);  // softmax([1, 0])[0]
        CHECK(r.o[r.o_index(0, 0, 0, 0)] == Approx(w * 1 + (1 - w) * 3));
        CHECK(r.o[r.o_index(0, 1, 0, 1)] == Approx((1 - w) * 2 + w * 4));
        CHECK(r.o[r.o_index(0, 2, 0, 0)] == Approx(2.0));  // equal scores: plain average
        CHECK(r.lse[r.lse_index(0, 0, 0)] == Approx(std::log(e + 1)));
        CHECK(r.lse[r.lse_index(0, 0, 2)] == Approx(1 + std::log(2.0)));
    }
    SECTION("causal, bottom-right aligned") {
        p.causal = true;  // diagonal offset seqlen_k - seqlen_q = -1: row 0 sees nothing, row 1 key 0, row 2 both
        const auto r = test::reference_forward(p, 2);
        CHECK(std::isinf(r.lse[r.lse_index(0, 0, 0)]));
        CHECK(r.o[r.o_index(0, 0, 0, 0)] == 0.0);
        CHECK(r.o[r.o_index(0, 1, 0, 0)] == Approx(1.0));
        CHECK(r.lse[r.lse_index(0, 0, 1)] == Approx(0.0).margin(1e-12));  // q1 . k0 = 0, one key
        CHECK(r.o[r.o_index(0, 2, 0, 1)] == Approx(3.0));
    }
    SECTION("comparison helpers") {
        const std::vector<double> ref = {3, 4}, close = {3, 4.5}, bad = {3, std::nan("")};
        CHECK(test::rel_frobenius(close, ref) == Approx(0.1));
        CHECK(std::isinf(test::rel_frobenius(bad, ref)));
        CHECK(test::rel_frobenius_floor1(std::vector<double>{0.001}, std::vector<double>{0.0}) == Approx(0.001));
    }
}
