// Host-side ground truth for the GPU tests: 16-bit float conversions, a float64 attention forward that reads the
// same strided [batch, seq, head, dim] layout as the kernel, and the comparison helpers the tests judge with.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/config.hpp"

namespace rtattn::test {

// --- 16-bit floats ---------------------------------------------------------------------------------------------
// Round-to-nearest-even, as the hardware's cvt.rn does; NaN stays NaN (quieted), overflow becomes inf.
std::uint16_t float_to_bf16(float f);
float bf16_to_float(std::uint16_t bits);
// IEEE binary16 with subnormals, inf and NaN.
std::uint16_t float_to_half(float f);
float half_to_float(std::uint16_t bits);

std::uint16_t to_bits(float f, Dtype dtype);
float from_bits(std::uint16_t bits, Dtype dtype);

// Fills outputs before a launch so that an element the kernel never wrote reads back as NaN.
// 0x7fff is a NaN in both bf16 (exponent 0xff, mantissa 0x7f) and fp16 (exponent 0x1f, mantissa 0x3ff).
inline constexpr std::uint16_t kPoison16 = 0x7fff;
inline constexpr std::uint32_t kPoison32 = 0x7fffffff;  // float32 NaN, for LSE

// --- reference attention ---------------------------------------------------------------------------------------
// A host view of one 16-bit tensor; strides in elements, the dim axis contiguous (the kernel's contract).
struct HostTensorView {
    const std::uint16_t* data = nullptr;
    std::int64_t batch_stride = 0, seq_stride = 0, head_stride = 0;

    std::uint16_t at(int b, int s, int h, int d) const {
        return data[b * batch_stride + s * seq_stride + h * head_stride + d];
    }
};

// The keys [first, end) query i sees, FlashAttention's rule with the diagonal bottom-right aligned (key
// i + seqlen_k - seqlen_q): all of them; causal, those up to the diagonal; a window (left, right; -1: that side
// unbounded), those from diagonal - left to diagonal + right (causal: right 0). Empty when end <= first.
struct KeyRange {
    int first = 0, end = 0;
    int size() const { return end > first ? end - first : 0; }
};
KeyRange visible_keys(int i, int seqlen_q, int seqlen_k, bool causal, int window_left = -1, int window_right = -1);

struct ReferenceProblem {
    Dtype dtype = Dtype::bf16;
    int batch = 1, seqlen_q = 1, seqlen_k = 1;
    int heads_q = 1, heads_kv = 1;
    int head_dim_qk = 1, head_dim_v = 1;
    bool causal = false;   // bottom-right aligned: query i sees key j iff j <= i + (seqlen_k - seqlen_q)
    int window_left = -1, window_right = -1;  // a sliding window (visible_keys); -1: unbounded
    double scale = 1.0;    // the caller states it; the reference does not reproduce the library's default
    // Attention sinks: [heads_q] logits (in the scaled scores' units) joining each row's softmax denominator as a key
    // whose value is zero; a row that sees no key gets O = 0, LSE = its sink. Empty: none.
    std::vector<double> sinks;
    // Softcapping (> 0): each scaled score s becomes softcap * tanh(s / softcap) before the mask and softmax. 0: off.
    double softcap = 0;
    // ALiBi: [batch, heads_q] slopes; the (capped) score of query i and key j loses slope * |j - (i + Sk - Sq)|.
    // Empty: none.
    std::vector<double> alibi;
    HostTensorView q, k, v;
};

struct ReferenceResult {
    int batch = 0, seqlen_q = 0, heads_q = 0, head_dim_v = 0;
    std::vector<double> o;    // contiguous [batch, seqlen_q, heads_q, head_dim_v]
    std::vector<double> lse;  // [batch, heads_q, seqlen_q]; +inf for a query that sees no key (sinks: the sink)

    std::size_t o_index(int b, int s, int h, int d) const {
        return ((std::size_t(b) * seqlen_q + s) * heads_q + h) * head_dim_v + d;
    }
    std::size_t lse_index(int b, int h, int s) const { return (std::size_t(b) * heads_q + h) * seqlen_q + s; }
};

// float64 softmax(scale * Q K^T) V over the already-rounded 16-bit inputs, so the only differences left to
// measure are the kernel's own. Work is split over (batch, head, block of query rows) across `threads` threads
// (0: hardware concurrency).
ReferenceResult reference_forward(const ReferenceProblem& p, int threads = 0);

// --- comparison ------------------------------------------------------------------------------------------------
// ||out - ref|| / ||ref|| (Frobenius, every element). +inf when any `out` element is NaN or inf: a non-finite
// output is a failure however few there are. 0 when both are all zeros.
double rel_frobenius(std::span<const double> out, std::span<const double> ref);

// Like rel_frobenius, but the denominator is at least sqrt(n): an absolute error for data of magnitude < 1.
// LSE values can sit near zero (one key, small scores), where a pure relative norm would blow up on noise.
double rel_frobenius_floor1(std::span<const double> out, std::span<const double> ref);
// The general form: the denominator is at least floor_rms * sqrt(n).
double rel_frobenius_floor(std::span<const double> out, std::span<const double> ref, double floor_rms);

std::size_t count_nonfinite(std::span<const double> values);
std::size_t count_bits(std::span<const std::uint16_t> values, std::uint16_t bits);

}  // namespace rtattn::test
