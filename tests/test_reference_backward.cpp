// The backward reference checked on its own, with no GPU: against central finite differences of the forward on
// tiny problems (every head layout the kernels meet: MHA, GQA, causal both ways, d_qk != d_v), and on cases whose
// gradients are known in closed form.
#include <cmath>
#include <random>

#include "catch.hpp"
#include "reference_backward.hpp"

using namespace rtattn;
using test::DenseProblem;

namespace {

DenseProblem random_problem(int sq, int sk, int hq, int hkv, int dqk, int dv, bool causal, unsigned seed) {
    DenseProblem p;
    p.seqlen_q = sq, p.seqlen_k = sk, p.heads_q = hq, p.heads_kv = hkv, p.head_dim_qk = dqk, p.head_dim_v = dv;
    p.batch = 2, p.causal = causal, p.scale = 0.7;
    std::mt19937 rng(seed);
    std::normal_distribution<double> n(0.0, 1.0);
    auto fill = [&](std::vector<double>& x, std::size_t count) {
        x.resize(count);
        for (auto& e : x) e = n(rng);
    };
    fill(p.q, std::size_t(p.batch) * sq * hq * dqk);
    fill(p.k, std::size_t(p.batch) * sk * hkv * dqk);
    fill(p.v, std::size_t(p.batch) * sk * hkv * dv);
    fill(p.dout, std::size_t(p.batch) * sq * hq * dv);
    return p;
}

// L = sum(dO * O) + sum(dLSE * LSE) over rows that see a key: its gradient with respect to Q, K, V is what
// dense_backward computes.
double loss(const DenseProblem& p) {
    const auto o = test::dense_forward(p);
    double l = 0;
    for (std::size_t i = 0; i < o.size(); ++i) l += p.dout[i] * o[i];
    if (!p.dlse.empty()) {
        const auto lse = test::dense_lse(p);
        for (std::size_t i = 0; i < lse.size(); ++i)
            if (std::isfinite(lse[i])) l += p.dlse[i] * lse[i];
    }
    return l;
}

// Largest |analytic - numeric| over every element of one input, relative to the largest gradient.
double fd_error(DenseProblem p, std::vector<double> DenseProblem::*input, const std::vector<double>& analytic) {
    const double h = 1e-6;
    double worst = 0, scale = 1e-12;
    for (std::size_t i = 0; i < (p.*input).size(); ++i) {
        const double x = (p.*input)[i];
        (p.*input)[i] = x + h;
        const double up = loss(p);
        (p.*input)[i] = x - h;
        const double down = loss(p);
        (p.*input)[i] = x;
        const double numeric = (up - down) / (2 * h);
        worst = std::max(worst, std::fabs(numeric - analytic[i]));
        scale = std::max(scale, std::fabs(analytic[i]));
    }
    return worst / scale;
}

}  // namespace

TEST_CASE("backward reference matches finite differences", "[reference]") {
    struct Case {
        int sq, sk, hq, hkv, dqk, dv;
        bool causal;
    };
    const Case cases[] = {
        {3, 4, 2, 2, 3, 2, false},  // MHA, Sq < Sk
        {4, 4, 4, 2, 5, 5, true},   // GQA 2:1, causal square
        {5, 3, 3, 1, 2, 4, true},   // MQA, causal with Sq > Sk: two rows see no key
        {2, 6, 2, 1, 4, 3, true},   // causal with Sq < Sk (bottom-right: row 0 sees 5 keys)
        {1, 1, 1, 1, 1, 1, false},  // one key: softmax is 1, dQ and dK are 0
    };
    unsigned seed = 1;
    for (const Case& c : cases) {
        INFO("sq " << c.sq << " sk " << c.sk << " h " << c.hq << ":" << c.hkv << " d " << c.dqk << "/" << c.dv
                   << (c.causal ? " causal" : ""));
        DenseProblem p = random_problem(c.sq, c.sk, c.hq, c.hkv, c.dqk, c.dv, c.causal, seed++);
        for (bool with_dlse : {false, true}) {
            INFO((with_dlse ? "with" : "without") << " a gradient into LSE");
            if (with_dlse) {
                p.dlse.resize(std::size_t(p.batch) * p.heads_q * p.seqlen_q);
                for (std::size_t i = 0; i < p.dlse.size(); ++i) p.dlse[i] = std::sin(1.0 + double(i));
            }
            const auto g = test::dense_backward(p, 2);
            CHECK(fd_error(p, &DenseProblem::q, g.dq) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::k, g.dk) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::v, g.dv) < 1e-6);
        }
    }
}

TEST_CASE("backward reference: closed-form cases", "[reference]") {
    // One key: P = 1, so dV = sum of dO over the queries (and heads of the group) that see it, dQ = dK = 0.
    DenseProblem p = random_problem(3, 1, 2, 1, 4, 2, false, 42);
    auto g = test::dense_backward(p, 1);
    for (int b = 0; b < p.batch; ++b)
        for (int e = 0; e < p.head_dim_v; ++e) {
            double sum = 0;
            for (int i = 0; i < p.seqlen_q; ++i)
                for (int h = 0; h < p.heads_q; ++h) sum += p.dout[p.o_index(b, i, h, e)];
            CHECK(g.dv[p.v_index(b, 0, 0, e)] == Approx(sum).epsilon(1e-12));
        }
    for (double x : g.dq) CHECK(std::fabs(x) < 1e-12);
    for (double x : g.dk) CHECK(std::fabs(x) < 1e-12);

    // Causal with Sq > Sk: the rows that see no key get zero dQ and add nothing to dK/dV.
    p = random_problem(5, 2, 1, 1, 3, 3, true, 7);
    g = test::dense_backward(p, 1);
    for (int b = 0; b < p.batch; ++b)
        for (int i = 0; i < 3; ++i)  // rows 0..2 see keys [0, i - 3 + 1) = none
            for (int e = 0; e < p.head_dim_qk; ++e) CHECK(g.dq[p.q_index(b, i, 0, e)] == 0.0);
    DenseProblem trimmed = p;  // the same problem without those rows gives the same dK and dV
    trimmed.seqlen_q = 2;
    trimmed.q.clear(), trimmed.dout.clear();
    for (int b = 0; b < p.batch; ++b)
        for (int i = 3; i < 5; ++i) {
            for (int e = 0; e < p.head_dim_qk; ++e) trimmed.q.push_back(p.q[p.q_index(b, i, 0, e)]);
            for (int e = 0; e < p.head_dim_v; ++e) trimmed.dout.push_back(p.dout[p.o_index(b, i, 0, e)]);
        }
    const auto gt = test::dense_backward(trimmed, 1);
    for (std::size_t i = 0; i < g.dk.size(); ++i) CHECK(g.dk[i] == Approx(gt.dk[i]).epsilon(1e-12));
    for (std::size_t i = 0; i < g.dv.size(); ++i) CHECK(g.dv[i] == Approx(gt.dv[i]).epsilon(1e-12));
}

TEST_CASE("backward reference reads the 16-bit strided views exactly", "[reference]") {
    // A [b, s, h, d] view whose rows are strided (every other head slot unused): the dense copy takes each element.
    test::ReferenceProblem rp;
    rp.dtype = Dtype::bf16;
    rp.batch = 1, rp.seqlen_q = 2, rp.seqlen_k = 3, rp.heads_q = 2, rp.heads_kv = 1, rp.head_dim_qk = 2;
    rp.head_dim_v = 2, rp.scale = 0.5;
    std::vector<std::uint16_t> buf(64);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = test::to_bits(float(i % 7) * 0.25f - 0.5f, Dtype::bf16);
    rp.q = {buf.data(), 32, 8, 4};  // head stride 4: two slots of 2 used of 4
    rp.k = {buf.data() + 1, 32, 4, 4};
    rp.v = {buf.data() + 2, 32, 4, 4};
    const test::HostTensorView dout{buf.data() + 3, 32, 8, 4};
    const DenseProblem d = test::dense_from(rp, dout);
    CHECK(d.q[d.q_index(0, 1, 1, 1)] == test::from_bits(buf[8 + 4 + 1], Dtype::bf16));
    CHECK(d.k[d.k_index(0, 2, 0, 0)] == test::from_bits(buf[1 + 8], Dtype::bf16));
    CHECK(d.dout[d.o_index(0, 1, 1, 0)] == test::from_bits(buf[3 + 8 + 4], Dtype::bf16));
    const auto g = test::reference_backward(rp, dout, 1);
    CHECK(g.dq.size() == 8);
    CHECK(g.dk.size() == 6);
}

TEST_CASE("backward reference with sinks matches finite differences, dsinks included", "[reference][sinks]") {
    struct Case {
        int sq, sk, hq, hkv;
        bool causal;
        int left, right;
    };
    const Case cases[] = {
        {3, 4, 2, 2, false, -1, -1},  // MHA
        {5, 3, 4, 2, true, -1, -1},   // GQA, causal with Sq > Sk: two rows see only the sink
        {4, 6, 2, 1, false, 1, 0},    // MQA, a window
    };
    unsigned seed = 11;
    for (const Case& c : cases) {
        INFO("sq " << c.sq << " sk " << c.sk << " h " << c.hq << ":" << c.hkv << (c.causal ? " causal" : "")
                   << " window " << c.left << "," << c.right);
        DenseProblem p = random_problem(c.sq, c.sk, c.hq, c.hkv, 3, 2, c.causal, seed++);
        p.window_left = c.left, p.window_right = c.right;
        for (int h = 0; h < p.heads_q; ++h) p.sinks.push_back(0.5 * h - 0.3);
        for (bool with_dlse : {false, true}) {
            INFO((with_dlse ? "with" : "without") << " a gradient into LSE");
            if (with_dlse) {
                p.dlse.resize(std::size_t(p.batch) * p.heads_q * p.seqlen_q);
                for (std::size_t i = 0; i < p.dlse.size(); ++i) p.dlse[i] = std::cos(2.0 + double(i));
            }
            const auto g = test::dense_backward(p, 2);
            REQUIRE(g.dsinks.size() == std::size_t(p.heads_q));
            CHECK(fd_error(p, &DenseProblem::q, g.dq) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::k, g.dk) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::v, g.dv) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::sinks, g.dsinks) < 1e-6);
        }
    }
}

namespace {

// The GPU suites judge the forward with reference_forward (16-bit views) and the backward with dense_*, so a variant
// must read alike in both: rp (1 sequence of at most 4 queries and 5 keys, 2 query heads on 1 kv head, d 3, dv 2)
// over fixed 16-bit values, both forwards compared. Returns reference_forward's result.
test::ReferenceResult forward_references_agree(test::ReferenceProblem rp) {
    rp.dtype = Dtype::bf16;
    rp.batch = 1, rp.heads_q = 2, rp.heads_kv = 1, rp.head_dim_qk = 3, rp.head_dim_v = 2;
    std::vector<std::uint16_t> buf(64), zeros(64, 0);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = test::to_bits(std::sin(double(i)), Dtype::bf16);
    rp.q = {buf.data(), 6 * rp.seqlen_q, 6, 3};
    rp.k = {buf.data() + 24, 3 * rp.seqlen_k, 3, 3};
    rp.v = {buf.data() + 40, 2 * rp.seqlen_k, 2, 2};
    const test::ReferenceResult r = test::reference_forward(rp, 1);
    const DenseProblem d = test::dense_from(rp, {zeros.data(), 4 * rp.seqlen_q, 4, 2});
    const auto o = test::dense_forward(d);
    const auto lse = test::dense_lse(d);
    for (std::size_t i = 0; i < o.size(); ++i) CHECK(r.o[i] == Approx(o[i]).epsilon(1e-12).margin(1e-15));
    for (std::size_t i = 0; i < lse.size(); ++i) CHECK(r.lse[i] == Approx(lse[i]).epsilon(1e-12));
    return r;
}

}  // namespace

TEST_CASE("sinks: the forward references agree, and a keyless row is (O = 0, LSE = sink)", "[reference][sinks]") {
    test::ReferenceProblem rp;
    rp.seqlen_q = 4, rp.seqlen_k = 2, rp.scale = 0.6, rp.causal = true;
    rp.sinks = {0.25, -1.5};
    const test::ReferenceResult r = forward_references_agree(rp);
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < 2; ++i) {  // rows 0, 1 see keys [0, i - 2 + 1) = none
            CHECK(r.lse[r.lse_index(0, h, i)] == rp.sinks[h]);
            for (int e = 0; e < 2; ++e) CHECK(r.o[r.o_index(0, i, h, e)] == 0.0);
        }
    // A row with keys: the sink adds to its denominator, so its LSE rises against the same row without it.
    test::ReferenceProblem plain = rp;
    plain.sinks.clear();
    const test::ReferenceResult r0 = forward_references_agree(plain);
    CHECK(r.lse[r.lse_index(0, 0, 3)] > r0.lse[r0.lse_index(0, 0, 3)]);
}

TEST_CASE("backward reference with softcapping matches finite differences", "[reference][softcap]") {
    // Caps that bend the scores hard (0.5: scores of these inputs reach a few units) and mildly (3), with sinks and a
    // window; the forward references agree on the capped scores.
    struct Case {
        double cap;
        bool causal, sinks;
        int left;
    };
    const Case cases[] = {{0.5, false, false, -1}, {3.0, true, true, -1}, {1.0, false, true, 1}};
    unsigned seed = 21;
    for (const Case& c : cases) {
        INFO("cap " << c.cap << (c.causal ? " causal" : "") << (c.sinks ? " sinks" : "") << " left " << c.left);
        DenseProblem p = random_problem(4, 5, 4, 2, 3, 2, c.causal, seed++);
        p.softcap = c.cap, p.window_left = c.left;
        for (int h = 0; c.sinks && h < p.heads_q; ++h) p.sinks.push_back(0.3 * h - 0.4);
        p.dlse.resize(std::size_t(p.batch) * p.heads_q * p.seqlen_q);
        for (std::size_t i = 0; i < p.dlse.size(); ++i) p.dlse[i] = std::sin(3.0 + double(i));
        const auto g = test::dense_backward(p, 2);
        CHECK(fd_error(p, &DenseProblem::q, g.dq) < 1e-6);
        CHECK(fd_error(p, &DenseProblem::k, g.dk) < 1e-6);
        CHECK(fd_error(p, &DenseProblem::v, g.dv) < 1e-6);
        if (c.sinks) CHECK(fd_error(p, &DenseProblem::sinks, g.dsinks) < 1e-6);
        // The cap bends: the same problem uncapped gives other gradients.
        DenseProblem plain = p;
        plain.softcap = 0;
        CHECK(test::dense_backward(plain, 2).dq != g.dq);
    }
    // reference_forward (16-bit views) caps as dense_forward does.
    test::ReferenceProblem rp;
    rp.seqlen_q = 3, rp.seqlen_k = 4, rp.scale = 2.0, rp.softcap = 0.7;
    forward_references_agree(rp);
}

TEST_CASE("backward reference with ALiBi matches finite differences", "[reference][alibi]") {
    // Slopes per (sequence, head), with a cap (the cap's slope is of the capped part only: the bias is a constant),
    // causal and not, Sq != Sk (bottom-right distances); the forward references agree on the biased scores.
    unsigned seed = 31;
    for (const bool causal : {false, true})
        for (const double cap : {0.0, 1.5}) {
            INFO((causal ? "causal" : "full") << " cap " << cap);
            DenseProblem p = random_problem(4, 5, 4, 2, 3, 2, causal, seed++);
            p.softcap = cap;
            for (int i = 0; i < p.batch * p.heads_q; ++i) p.alibi.push_back(0.25 + 0.5 * i);
            const auto g = test::dense_backward(p, 2);
            CHECK(fd_error(p, &DenseProblem::q, g.dq) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::k, g.dk) < 1e-6);
            CHECK(fd_error(p, &DenseProblem::v, g.dv) < 1e-6);
            DenseProblem plain = p;  // the bias moves the gradients
            plain.alibi.clear();
            CHECK(test::dense_backward(plain, 2).dq != g.dq);
        }
    test::ReferenceProblem rp;
    rp.seqlen_q = 3, rp.seqlen_k = 4, rp.scale = 2.0, rp.softcap = 0.7, rp.alibi = {0.5, 0.125};
    const test::ReferenceResult r = forward_references_agree(rp);
    // Key j of row i (diagonal i + 1) weighs exp(-slope * |j - i - 1|) less than without the bias: the LSE falls.
    rp.alibi.clear();
    const test::ReferenceResult plain = forward_references_agree(rp);
    CHECK(r.lse[r.lse_index(0, 0, 0)] < plain.lse[plain.lse_index(0, 0, 0)]);
}
