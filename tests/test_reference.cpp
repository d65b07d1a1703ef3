// The float64 host reference the GPU suites judge with, checked on its own: 16-bit conversions against a brute-force
// nearest-even search, hand-checkable attention cases, the comparison helpers. Needs no GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "catch.hpp"
#include "reference.hpp"

using namespace rtattn;
using rtattn::test::kPoison16;

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

TEST_CASE("16-bit conversions round to nearest even and round-trip", "[reference]") {
    for (Dtype dt : {Dtype::bf16, Dtype::fp16}) {
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

TEST_CASE("reference attention: hand-checkable cases", "[reference]") {
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
