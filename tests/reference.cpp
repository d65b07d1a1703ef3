#include "reference.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <thread>

namespace rtattn::test {

// --- 16-bit floats ---------------------------------------------------------------------------------------------

std::uint16_t float_to_bf16(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // quiet NaN, sign kept
    // RNE on the low 16 bits: add 0x7fff plus the LSB of the kept part; a carry into the exponent is the correct
    // rounding (including the overflow of the largest finite values to inf).
    const std::uint32_t lsb = (u >> 16) & 1u;
    return std::uint16_t((u + 0x7fffu + lsb) >> 16);
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

std::uint16_t float_to_half(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;

    if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN: quiet, top payload
    if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 (halfway past 65504, ties to even) -> inf

    if (a >= 0x38800000u) {  // normal half (>= 2^-14)
        const std::uint32_t exp = (a >> 23) - 127 + 15;
        const std::uint32_t mant = a & 0x7fffffu;
        std::uint32_t h = (exp << 10) | (mant >> 13);
        const std::uint32_t rem = mant & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is still right
        return std::uint16_t(sign | h);
    }
    if (a <= 0x33000000u) return sign;  // <= 2^-25: rounds to (signed) zero; exactly 2^-25 ties to even zero

    // Subnormal half: count units of 2^-24. The float is mant * 2^(e - 150), i.e. mant * 2^(e - 126) units.
    const std::uint32_t e = a >> 23;  // 102..112 here
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // may carry into the smallest normal: correct
    return std::uint16_t(sign | h);
}

float half_to_float(std::uint16_t bits) {
    const std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
    const std::uint32_t exp = (bits >> 10) & 0x1fu;
    const std::uint32_t mant = bits & 0x3ffu;
    if (exp == 0) {
        const float mag = std::ldexp(float(mant), -24);  // zero or subnormal: exact in float
        return sign ? -mag : mag;
    }
    if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

std::uint16_t to_bits(float f, Dtype dtype) { return dtype == Dtype::bf16 ? float_to_bf16(f) : float_to_half(f); }

float from_bits(std::uint16_t bits, Dtype dtype) {
    return dtype == Dtype::bf16 ? bf16_to_float(bits) : half_to_float(bits);
}

// --- reference attention ---------------------------------------------------------------------------------------

namespace {

constexpr int kRowsPerItem = 32;  // query rows per work item: fine enough to balance causal rows over 16 cores

// One (batch, kv head)'s keys and values as dense doubles, converted once and reused by every query head of the
// GQA group and every row block a worker picks up for it.
struct KvSlab {
    int batch = -1, kv_head = -1;
    std::vector<double> k, v;  // [seqlen_k][head_dim]

    void load(const ReferenceProblem& p, int b, int kvh) {
        if (b == batch && kvh == kv_head) return;
        batch = b, kv_head = kvh;
        k.resize(std::size_t(p.seqlen_k) * p.head_dim_qk);
        v.resize(std::size_t(p.seqlen_k) * p.head_dim_v);
        for (int j = 0; j < p.seqlen_k; ++j) {
            for (int d = 0; d < p.head_dim_qk; ++d)
                k[std::size_t(j) * p.head_dim_qk + d] = from_bits(p.k.at(b, j, kvh, d), p.dtype);
            for (int d = 0; d < p.head_dim_v; ++d)
                v[std::size_t(j) * p.head_dim_v + d] = from_bits(p.v.at(b, j, kvh, d), p.dtype);
        }
    }
};

void reference_rows(const ReferenceProblem& p, const KvSlab& kv, int b, int h, int row_begin, int row_end,
                    ReferenceResult& r) {
    const int dqk = p.head_dim_qk, dv = p.head_dim_v;
    std::vector<double> q(dqk), scores(p.seqlen_k), acc(dv);
    for (int i = row_begin; i < row_end; ++i) {
        const KeyRange keys = visible_keys(i, p.seqlen_q, p.seqlen_k, p.causal, p.window_left, p.window_right);
        const bool sink = !p.sinks.empty();
        if (keys.size() == 0) {
            for (int d = 0; d < dv; ++d) r.o[r.o_index(b, i, h, d)] = 0.0;
            r.lse[r.lse_index(b, h, i)] = sink ? p.sinks[h] : std::numeric_limits<double>::infinity();
            continue;
        }
        for (int d = 0; d < dqk; ++d) q[d] = from_bits(p.q.at(b, i, h, d), p.dtype);

        double max_score = -std::numeric_limits<double>::infinity();
        for (int j = keys.first; j < keys.end; ++j) {
            const double* kj = &kv.k[std::size_t(j) * dqk];
            double dot = 0;
            for (int d = 0; d < dqk; ++d) dot += q[d] * kj[d];
            scores[j] = p.softcap > 0 ? p.softcap * std::tanh(dot * p.scale / p.softcap) : dot * p.scale;
            if (!p.alibi.empty())  // -slope * |j - diagonal|
                scores[j] -= p.alibi[std::size_t(b) * p.heads_q + h] *
                             std::abs(double(j) - (i + p.seqlen_k - p.seqlen_q));
            max_score = std::max(max_score, scores[j]);
        }
        if (sink) max_score = std::max(max_score, p.sinks[h]);
        double sum = sink ? std::exp(p.sinks[h] - max_score) : 0.0;  // the sink's value is zero: only the sum has it
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = keys.first; j < keys.end; ++j) {
            const double w = std::exp(scores[j] - max_score);
            sum += w;
            const double* vj = &kv.v[std::size_t(j) * dv];
            for (int d = 0; d < dv; ++d) acc[d] += w * vj[d];
        }
        for (int d = 0; d < dv; ++d) r.o[r.o_index(b, i, h, d)] = acc[d] / sum;
        r.lse[r.lse_index(b, h, i)] = max_score + std::log(sum);
    }
}

}  // namespace

KeyRange visible_keys(int i, int seqlen_q, int seqlen_k, bool causal, int window_left, int window_right) {
    const long long diagonal = (long long)i + seqlen_k - seqlen_q;
    long long first = 0, last = seqlen_k - 1;
    if (causal) window_right = 0;
    if (window_right >= 0) last = std::min(last, diagonal + window_right);
    if (window_left >= 0) first = std::max(first, diagonal - window_left);
    KeyRange r;
    r.first = int(std::clamp<long long>(first, 0, seqlen_k));
    r.end = int(std::clamp<long long>(last + 1, 0, seqlen_k));
    return r;
}

ReferenceResult reference_forward(const ReferenceProblem& p, int threads) {
    ReferenceResult r;
    r.batch = p.batch, r.seqlen_q = p.seqlen_q, r.heads_q = p.heads_q, r.head_dim_v = p.head_dim_v;
    r.o.assign(std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim_v, 0.0);
    r.lse.assign(std::size_t(p.batch) * p.heads_q * p.seqlen_q, 0.0);

    const int group = p.heads_q / p.heads_kv;
    const int blocks = (p.seqlen_q + kRowsPerItem - 1) / kRowsPerItem;
    // Items ordered so a worker's consecutive picks tend to share (batch, kv head) and reuse its KvSlab.
    const long long items = (long long)p.batch * p.heads_q * blocks;
    std::atomic<long long> next{0};
    auto worker = [&] {
        KvSlab kv;
        for (long long it; (it = next.fetch_add(1)) < items;) {
            const int blk = int(it % blocks);
            const int h = int((it / blocks) % p.heads_q);
            const int b = int(it / blocks / p.heads_q);
            kv.load(p, b, h / group);
            reference_rows(p, kv, b, h, blk * kRowsPerItem, std::min(p.seqlen_q, (blk + 1) * kRowsPerItem), r);
        }
    };

    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    threads = int(std::min<long long>(threads, items));
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();  // the calling thread works too
    for (auto& t : pool) t.join();
    return r;
}

// --- comparison ------------------------------------------------------------------------------------------------

namespace {

struct Norms {
    double diff2 = 0, ref2 = 0;
    bool nonfinite = false;
};

Norms norms(std::span<const double> out, std::span<const double> ref) {
    Norms n;
    const std::size_t count = std::min(out.size(), ref.size());
    for (std::size_t i = 0; i < count; ++i) {
        if (!std::isfinite(out[i])) {
            n.nonfinite = true;
            continue;
        }
        const double d = out[i] - ref[i];
        n.diff2 += d * d;
        n.ref2 += ref[i] * ref[i];
    }
    if (out.size() != ref.size()) n.nonfinite = true;  // a size mismatch is a harness bug; never let it pass
    return n;
}

}  // namespace

double rel_frobenius(std::span<const double> out, std::span<const double> ref) {
    const Norms n = norms(out, ref);
    if (n.nonfinite) return std::numeric_limits<double>::infinity();
    if (n.ref2 == 0) return n.diff2 == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return std::sqrt(n.diff2 / n.ref2);
}

double rel_frobenius_floor(std::span<const double> out, std::span<const double> ref, double floor_rms) {
    const Norms n = norms(out, ref);
    if (n.nonfinite) return std::numeric_limits<double>::infinity();
    return std::sqrt(n.diff2 / std::max(n.ref2, floor_rms * floor_rms * double(ref.size())));
}

double rel_frobenius_floor1(std::span<const double> out, std::span<const double> ref) {
    return rel_frobenius_floor(out, ref, 1.0);
}

std::size_t count_nonfinite(std::span<const double> values) {
    return std::size_t(std::count_if(values.begin(), values.end(), [](double x) { return !std::isfinite(x); }));
}

std::size_t count_bits(std::span<const std::uint16_t> values, std::uint16_t bits) {
    return std::size_t(std::count(values.begin(), values.end(), bits));
}

}  // namespace rtattn::test
