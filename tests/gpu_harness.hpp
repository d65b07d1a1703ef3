// The harness of the GPU suites: what a case is, where its tensors live (placements with gaps and guards), its
// problem on the host and on the device, the float64 reference, and the judge. A backward or decode suite reuses it.
//
// Every case: fresh random inputs (seeded from the case description, so a failure reproduces), outputs and LSE
// pre-filled with NaN bit patterns (an element the kernel never wrote reads back as poison), buffers with guard
// space and, in strided layouts, gaps (a stray write shows up as a changed gap element; input gaps hold NaN so a
// stray read poisons the result).
#pragma once
#include "util/format.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "driver/driver.hpp"
#include "reference.hpp"
#include "core/rtattn.hpp"

namespace rtattn::test::gpu {

// RTATTN_TEST_ARCH pins the kernels' arch, so one device can exercise each kernel family it can run (on Hopper,
// sm_90a gives the wgmma kernels and sm_90 the mma.sync one). Unset (nullptr): the device's own arch.
const char* test_arch();
bool test_arch_runs_here();

// A visible skip on machines without a GPU (the build hosts), or whose GPU cannot run RTATTN_TEST_ARCH.
#define SKIP_WITHOUT_GPU()                                                                                    \
    do {                                                                                                      \
        if (!::rtattn::driver::gpu_available()) RTATTN_SKIP("no GPU: no CUDA driver or device found");         \
        if (!::rtattn::test::gpu::test_arch_runs_here())                                                      \
            RTATTN_SKIP("this GPU cannot run RTATTN_TEST_ARCH=" << ::rtattn::test::gpu::test_arch());          \
    } while (0)

// ---------------------------------------------------------------------------------------------------------------
// Tolerances. O is rounded to 16 bits on output and P is rounded to 16 bits before P·V, so the error floor is a
// few units of the format's epsilon (bf16 2^-8, fp16 2^-11); LSE is float32 end to end.
inline double o_tolerance(Dtype dt) { return dt == Dtype::bf16 ? 1e-2 : 2e-3; }
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
    head_gaps,   // a gap of poison (NaN) after each head, rows 16-byte multiples (d140: heads 144 + 8 apart)
};

const char* to_string(Layout l);

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
    // A local kernel (config.local) and the call's window (-1: that side unbounded; FlashAttention's window_size).
    bool local = false;
    int window_left = -1, window_right = -1;
    bool sinks = false;  // a sinks kernel (config.sinks), each query head's sink logit drawn with the inputs
    float softcap = 0;   // > 0: a softcap kernel (config.softcap) and the call's cap
    // ALiBi (config.alibi): 1, one row of [heads_q] slopes for every sequence (batch stride 0); 2, a row per
    // sequence, [batch, heads_q + 3] (padded rows). 0: none.
    int alibi = 0;

    AttentionConfig config() const {
        AttentionConfig c;
        c.head_dim_qk = d_qk;
        if (d_v != d_qk) c.head_dim_v = d_v;
        c.dtype = dtype;
        c.causal = causal;
        c.local = local;
        c.sinks = sinks;
        c.softcap = softcap > 0;
        c.alibi = alibi > 0;
        c.num_heads_q = heads_q;
        c.num_heads_kv = heads_kv;
        c.softmax_scale = scale;
        if (test_arch()) c.arch = test_arch();
        return c;
    }

    // Computed here, not with AttentionConfig::scale(), so the library's default is checked rather than trusted.
    double effective_scale() const { return scale.value_or(1.0 / std::sqrt(double(d_qk))); }

    std::string describe() const {
        std::string s = util::format("d{}{} {} {} h{}:{} b{} s{}x{} {}", d_qk,
                                     d_v != d_qk ? util::format("/{}", d_v) : "", rtattn::to_string(dtype),
                                     causal ? "causal" : "full", heads_q, heads_kv, batch, seqlen_q, seqlen_k,
                                     to_string(layout));
        if (scale) s += util::format(" scale={}", *scale);
        if (dist == Dist::normal) s += " normal";
        if (!with_lse) s += " no-lse";
        if (local) s += util::format(" window({},{})", window_left, window_right);
        if (sinks) s += " sinks";
        if (softcap > 0) s += util::format(" softcap={}", softcap);
        if (alibi) s += alibi == 1 ? " alibi" : " alibi-per-batch";
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
inline int vec_width(int dim) {
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

struct Problem {
    Case c;
    std::vector<std::vector<std::uint16_t>> buffers;  // host images: inputs randomized, gaps and O poisoned
    Placement q, k, v, o;
    // Sinks cases: [heads_q] logits, from below the rows' typical LSE to above it (the sink then dominates).
    std::vector<float> sinks;
    // ALiBi cases: the slopes as the call gives them ([heads_q], or [batch] rows of alibi_stride()).
    std::vector<float> alibi;
    std::int64_t alibi_stride() const { return c.alibi == 2 ? c.heads_q + 3 : 0; }

    std::size_t lse_count() const { return std::size_t(c.batch) * c.heads_q * c.seqlen_q; }
};

// Buffers sized to what their tensors span plus a guard; everything starts as poison, then the inputs' own elements
// get random values (rounded to 16 bits here, so the reference sees exactly what the kernel sees). `salt` varies the
// values of one case.
Problem make_problem(const Case& c, std::uint32_t salt = 0);
test::ReferenceProblem reference_problem(const Problem& p);  // the inputs as the reference reads them
test::ReferenceResult reference_for(const Problem& p);

// ---------------------------------------------------------------------------------------------------------------
// Device side.

struct DeviceResult {
    std::vector<std::uint16_t> o_buffer;  // the whole O buffer, gaps and guard included
    std::vector<float> lse;               // lse_count() + kGuard
};

class DeviceProblem {
public:
    explicit DeviceProblem(const Problem& p);
    // Synchronous copies on the legacy stream; the O buffer is an output and never shares a buffer with inputs.
    void upload_inputs(const Problem& p);
    void poison_outputs(const Problem& p);
    ForwardArgs args(const Problem& p) const;
    DeviceResult download(const Problem& p) const;

private:
    std::vector<driver::DeviceBuffer> buffers_;
    driver::DeviceBuffer lse_;
    driver::DeviceBuffer sinks_;  // 4 bytes at least: a sinks case uploads its [heads_q] logits
    driver::DeviceBuffer alibi_;  // 4 bytes at least: an ALiBi case's slopes
};

// Copies and fills run on the legacy stream. driver::Stream is created blocking, so work on it already waits for
// them; draining the legacy stream explicitly keeps the tests independent of that choice.
void sync_legacy_stream();

// ---------------------------------------------------------------------------------------------------------------
// Judging and running.

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

Outcome evaluate(const Problem& p, const DeviceResult& got, const test::ReferenceResult& ref);
// Empty when the outcome passes; otherwise every reason it does not, for the failure message.
std::string judge(const Outcome& r, const Case& c);

// One Runtime for the test program, with a private cache so every run compiles what it tests.
Runtime& runtime();
// Compiles every kernel the tables need, in parallel, once (see gpu_judge.cpp).
void warm(const std::vector<std::vector<Case>>& tables);
// get(), fresh inputs, poisoned outputs, one launch on the legacy stream, judged against the reference.
Outcome run_case(const Case& c);
// Runs a table, one CHECK per case naming it on failure, and prints the worst errors.
void run_table(const char* name, const std::vector<Case>& cases);

}  // namespace rtattn::test::gpu
