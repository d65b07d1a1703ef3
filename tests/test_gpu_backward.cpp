// The backward pass on the GPU against the float64 reference (test_reference_backward checks that reference against
// finite differences). Each case: fresh random Q, K, V (in the forward suite's layouts) and dO; the forward on the
// GPU gives O and LSE; dQ, dK, dV are pre-filled with NaN and must be written everywhere (and nowhere else: guards);
// relative Frobenius error per gradient <= 1e-2 (bf16) / 3e-3 (fp16). Deterministic mode is run twice and compared
// bitwise. Sinks cases also check dsinks (float32, [heads_q]) against the reference's, within the larger of that
// tolerance and twice the error the exact sum has over the O and LSE the backward is given (the forward's, 16-bit):
// dsinks sums P_sink * D, D = dO . O, over rows of either sign, so it keeps D's error, which O's rounding sets. Tagged
// [gpu]: skipped, visibly, without a GPU.
#include "util/format.hpp"

#include <bit>
#include <cstring>
#include <random>
#include <tuple>

#include "gpu_harness.hpp"
#include "reference_backward.hpp"

using namespace rtattn;
using namespace rtattn::test::gpu;

namespace util = rtattn::util;

namespace {

double grad_tolerance(Dtype dt) { return dt == Dtype::bf16 ? 1e-2 : 3e-3; }

// A contiguous [batch, seq, heads, dim] 16-bit tensor on the device with a poisoned guard after it.
struct GradBuffer {
    Shape shape;
    driver::DeviceBuffer buf;
    explicit GradBuffer(Shape s)
        : shape(s), buf((std::size_t(s.batch) * s.seqlen * s.heads * s.dim + kGuard) * 2) {}
    std::size_t count() const { return std::size_t(shape.batch) * shape.seqlen * shape.heads * shape.dim; }
    TensorArg arg() const { return ForwardArgs::contiguous(buf.get(), shape.seqlen, shape.heads, shape.dim); }
    std::vector<std::uint16_t> download() const {
        std::vector<std::uint16_t> h(count() + kGuard);
        buf.download(h.data(), h.size() * 2);
        return h;
    }
};

struct GradOutcome {
    double dq_err = 0, dk_err = 0, dv_err = 0, dsinks_err = 0;
    double dsinks_bound = 0;                // twice the error of the exact dsinks over the forward's O and LSE
    std::size_t unwritten = 0, stray = 0, keyless_nonzero = 0;
    std::vector<std::uint16_t> dq, dk, dv;  // the raw results, for the bitwise comparison
    std::vector<float> dsinks;              // sinks cases: heads_q values and a guard
};

// The gradients of one buffer against the reference: relative Frobenius error, poison left, guard changed.
double judge_grad(const std::vector<std::uint16_t>& got, std::size_t count, const std::vector<double>& ref, Dtype dt,
                  std::size_t& unwritten, std::size_t& stray) {
    std::vector<double> vals(count);
    for (std::size_t i = 0; i < count; ++i) {
        if (got[i] == test::kPoison16) ++unwritten;
        vals[i] = test::from_bits(got[i], dt);
    }
    for (std::size_t i = count; i < got.size(); ++i) stray += got[i] != test::kPoison16;
    // The floor keeps a gradient that is zero in exact arithmetic (one key: P = 1, dP = D) from dividing rounding
    // noise by zero; gradients of these inputs are far above it otherwise.
    return test::rel_frobenius_floor(vals, ref, 1e-3);
}

// dQ rows of queries that see no key (causal, row + seqlen_k - seqlen_q < 0; a window's rows whose range misses
// every key) must be exactly zero.
std::size_t keyless_nonzero(const Case& c, const std::vector<std::uint16_t>& dq) {
    std::size_t bad = 0;
    const std::size_t row = std::size_t(c.heads_q) * c.d_qk;
    for (int b = 0; b < c.batch; ++b)
        for (int s = 0; s < c.seqlen_q; ++s)
            if (test::visible_keys(s, c.seqlen_q, c.seqlen_k, c.causal, c.window_left, c.window_right).size() == 0)
                for (std::size_t i = 0; i < row; ++i)
                    bad += test::from_bits(dq[(std::size_t(b) * c.seqlen_q + s) * row + i], c.dtype) != 0.0;
    return bad;
}

// Runs the forward, then the backward (twice when deterministic, returning the first result), and judges.
GradOutcome run_backward(const Case& c, bool deterministic, bool graph = false, bool with_dlse = false) {
    const Problem p = make_problem(c);
    DeviceProblem dev(p);
    dev.upload_inputs(p);
    dev.poison_outputs(p);
    const AttentionConfig cfg = c.config();
    const Kernel fwd = runtime().get(cfg);
    const BackwardKernel bwd = runtime().get_backward(cfg);
    ForwardArgs fa = dev.args(p);
    fwd.forward(fa);
    sync_legacy_stream();
    const DeviceResult forward_out = dev.download(p);  // the backward's O and LSE, for dsinks' bound

    // dO: random, contiguous.
    const Shape o_shape{c.batch, c.seqlen_q, c.heads_q, c.d_v};
    std::vector<std::uint16_t> dout_host(std::size_t(c.batch) * c.seqlen_q * c.heads_q * c.d_v);
    std::mt19937 rng(c.seed() ^ 0x5eed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : dout_host) x = test::to_bits(u(rng), c.dtype);
    driver::DeviceBuffer dout(dout_host.size() * 2);
    dout.upload(dout_host.data(), dout_host.size() * 2);

    GradBuffer dq({c.batch, c.seqlen_q, c.heads_q, c.d_qk}), dk({c.batch, c.seqlen_k, c.heads_kv, c.d_qk}),
        dv({c.batch, c.seqlen_k, c.heads_kv, c.d_v});
    const std::size_t ws_bytes = bwd.workspace_bytes(c.batch, c.seqlen_q, c.seqlen_k);
    driver::DeviceBuffer ws(ws_bytes);

    BackwardArgs a;
    a.q = fa.q, a.k = fa.k, a.v = fa.v, a.o = fa.o, a.lse = fa.lse;
    a.dout = ForwardArgs::contiguous(dout.get(), c.seqlen_q, c.heads_q, c.d_v);
    a.dq = dq.arg(), a.dk = dk.arg(), a.dv = dv.arg();
    a.batch = c.batch, a.seqlen_q = c.seqlen_q, a.seqlen_k = c.seqlen_k;
    a.workspace = ws.get(), a.workspace_bytes = ws_bytes;
    a.deterministic = deterministic;
    a.window_size_left = fa.window_size_left, a.window_size_right = fa.window_size_right;
    // Sinks: the forward's, and dsinks with a poisoned guard after it.
    driver::DeviceBuffer dsinks((std::size_t(c.heads_q) + kGuard) * 4);
    if (c.sinks) a.sinks = fa.sinks, a.dsinks = static_cast<float*>(dsinks.get());
    a.softcap = fa.softcap;
    a.alibi_slopes = fa.alibi_slopes, a.alibi_slopes_batch_stride = fa.alibi_slopes_batch_stride;
    // A gradient into LSE (a loss that uses the returned LSE): random per row, float32.
    std::vector<float> dlse_host(with_dlse ? std::size_t(c.batch) * c.heads_q * c.seqlen_q : 0);
    for (std::size_t i = 0; i < dlse_host.size(); ++i) dlse_host[i] = u(rng);
    driver::DeviceBuffer dlse(std::max<std::size_t>(dlse_host.size() * 4, 4));
    if (with_dlse) {
        dlse.upload(dlse_host.data(), dlse_host.size() * 4);
        a.dlse = static_cast<const float*>(dlse.get());
    }

    auto run_once = [&](GradOutcome& out) {
        for (GradBuffer* g : {&dq, &dk, &dv}) g->buf.fill_u16(test::kPoison16);
        dsinks.fill_u32(test::kPoison32);
        ws.fill_u32(0x7fc00000u);  // the preprocess must initialize what the main kernel reads
        sync_legacy_stream();
        if (graph) {
            // Forward and backward in one graph, as a training step captures them. Capture fails if either
            // synchronizes or allocates; O and LSE are poisoned first, so the replay must run the forward too.
            dev.poison_outputs(p);
            sync_legacy_stream();
            const auto& api = driver::api();
            driver::Stream s;
            CUgraph g = nullptr;
            CUgraphExec exec = nullptr;
            driver::check(api.cuStreamBeginCapture(s.get(), CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
            try {
                fwd.forward(fa, s.get());
                bwd.backward(a, s.get());
            } catch (...) {
                api.cuStreamEndCapture(s.get(), &g);
                throw;
            }
            driver::check(api.cuStreamEndCapture(s.get(), &g), "cuStreamEndCapture");
            driver::check(api.cuGraphInstantiate(&exec, g, 0), "cuGraphInstantiate");
            driver::check(api.cuGraphLaunch(exec, s.get()), "cuGraphLaunch");
            s.sync();
            api.cuGraphExecDestroy(exec);
            api.cuGraphDestroy(g);
        } else {
            bwd.backward(a);
        }
        sync_legacy_stream();
        out.dq = dq.download(), out.dk = dk.download(), out.dv = dv.download();
        if (c.sinks) {
            out.dsinks.resize(std::size_t(c.heads_q) + kGuard);
            dsinks.download(out.dsinks.data(), out.dsinks.size() * 4);
        }
    };
    GradOutcome out;
    run_once(out);
    if (deterministic) {
        GradOutcome again;
        run_once(again);
        if (again.dq != out.dq || again.dk != out.dk || again.dv != out.dv ||
            std::memcmp(again.dsinks.data(), out.dsinks.data(), out.dsinks.size() * 4) != 0)
            out.stray += 1000000;  // not bitwise equal
    }

    test::ReferenceProblem rp = reference_problem(p);
    const test::HostTensorView dout_view{dout_host.data(), std::int64_t(c.seqlen_q) * c.heads_q * c.d_v,
                                         std::int64_t(c.heads_q) * c.d_v, c.d_v};
    test::DenseProblem dense = test::dense_from(rp, dout_view);
    dense.dlse.assign(dlse_host.begin(), dlse_host.end());
    const auto ref = test::dense_backward(dense);
    out.dq_err = judge_grad(out.dq, dq.count(), ref.dq, c.dtype, out.unwritten, out.stray);
    out.dk_err = judge_grad(out.dk, dk.count(), ref.dk, c.dtype, out.unwritten, out.stray);
    out.dv_err = judge_grad(out.dv, dv.count(), ref.dv, c.dtype, out.unwritten, out.stray);
    out.keyless_nonzero = keyless_nonzero(c, out.dq);
    if (c.sinks) {
        std::vector<double> got(c.heads_q);
        for (int h = 0; h < c.heads_q; ++h) {
            out.unwritten += std::bit_cast<std::uint32_t>(out.dsinks[h]) == test::kPoison32;
            got[h] = out.dsinks[h];
        }
        for (std::size_t i = c.heads_q; i < out.dsinks.size(); ++i)
            out.stray += std::bit_cast<std::uint32_t>(out.dsinks[i]) != test::kPoison32;
        out.dsinks_err = test::rel_frobenius_floor(got, ref.dsinks, 1e-3);
        std::vector<double> given(c.heads_q, 0.0);  // the exact sum over the forward's own O and LSE
        for (int b = 0; b < c.batch; ++b)
            for (int h = 0; h < c.heads_q; ++h)
                for (int i = 0; i < c.seqlen_q; ++i) {
                    const std::size_t row = (std::size_t(b) * c.heads_q + h) * c.seqlen_q + i;
                    double d = dense.dlse.empty() ? 0.0 : -dense.dlse[row];
                    for (int e = 0; e < c.d_v; ++e)
                        d += dense.dout[dense.o_index(b, i, h, e)] *
                             test::from_bits(forward_out.o_buffer[p.o.index(b, i, h, e)], c.dtype);
                    given[h] -= std::exp(dense.sinks[h] - double(forward_out.lse[row])) * d;
                }
        out.dsinks_bound = 2 * test::rel_frobenius_floor(given, ref.dsinks, 1e-3);
    }
    return out;
}

void run_backward_table(const char* name, const std::vector<Case>& cases, bool deterministic = false,
                        bool with_dlse = false) {
    double worst = 0;
    std::string worst_case, worst_sinks_case;
    std::pair<double, double> worst_sinks{0, 0};  // dsinks error, and its ratio to the bound
    for (const Case& c : cases) {
        const GradOutcome r = run_backward(c, deterministic, false, with_dlse);
        const double tol = grad_tolerance(c.dtype);
        const bool ok = r.dq_err <= tol && r.dk_err <= tol && r.dv_err <= tol &&
                        r.dsinks_err <= std::max(tol, r.dsinks_bound) &&
                        r.unwritten == 0 && r.stray == 0 && r.keyless_nonzero == 0;
        INFO(util::format("{}: {}: dq {:.2e} dk {:.2e} dv {:.2e} dsinks {:.2e} (bound {:.2e}) (tolerance {:.0e}), "
                          "unwritten {}, stray {}, nonzero in keyless rows {}{}", name, c.describe(), r.dq_err,
                          r.dk_err, r.dv_err, r.dsinks_err, r.dsinks_bound, tol, r.unwritten, r.stray,
                          r.keyless_nonzero,
                          r.stray >= 1000000 ? " (deterministic runs differ)" : ""));
        CHECK(ok);
        const double w = std::max({r.dq_err, r.dk_err, r.dv_err});
        if (w > worst) worst = w, worst_case = c.describe();
        if (c.sinks && r.dsinks_err > worst_sinks.first)
            worst_sinks = {r.dsinks_err, r.dsinks_err / r.dsinks_bound}, worst_sinks_case = c.describe();
    }
    util::print("{}: {} cases{}, worst relative error {:.2e} ({})\n", name, cases.size(),
                deterministic ? " (deterministic, each run twice)" : "", worst, worst_case);
    if (worst_sinks.first > 0)
        util::print("{}: worst dsinks error {:.2e}, {:.2f}x its bound from the forward's O ({})\n", name,
                    worst_sinks.first, worst_sinks.second, worst_sinks_case);
}

// A score variant's table over every family: d1 (the mma.sync kernel), 64 (the warp-specialized kernel's 128-query
// steps), 100 (bwd_sm90 or mma.sync), 128 (64-query steps), 132 (shifted rows), 192 (the wide form), 256 (the split by
// GEMM), causal and not (Sq > Sk: keyless rows; Sq < Sk), fp16 and bf16, GQA; vary(case, index) sets the variant.
template <class Vary>
std::vector<Case> family_cases(Vary vary) {
    std::vector<Case> cases;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 192, 256})
        for (bool causal : {false, true}) {
            Case c;
            c.d_qk = c.d_v = d;
            c.causal = causal;
            c.dtype = i % 3 ? Dtype::bf16 : Dtype::fp16;
            c.heads_q = 4, c.heads_kv = i % 2 ? 2 : 1;
            c.seqlen_q = causal ? 500 : 300, c.seqlen_k = causal ? 300 : 500;
            vary(c, i++);
            cases.push_back(c);
        }
    return cases;
}

}  // namespace

TEST_CASE("backward: head dims, dtypes, causal, GQA", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    std::vector<Case> cases;
    const int dims[] = {1, 8, 17, 32, 48, 64, 80, 96, 100, 112, 128, 132, 140, 144, 160, 168, 176, 192, 200, 224, 240, 256};
    int i = 0;
    for (int d : dims)
        for (bool causal : {false, true}) {
            Case c;
            c.d_qk = c.d_v = d;
            c.causal = causal;
            c.dtype = (i++ % 2) ? Dtype::fp16 : Dtype::bf16;
            c.heads_q = 4, c.heads_kv = (d % 3 == 0) ? 1 : 2;  // MQA and GQA 2:1
            c.batch = 2, c.seqlen_q = 77, c.seqlen_k = 211;
            cases.push_back(c);
        }
    // Pairs of pads in the wide form (sm_90a): each warpgroup's chunks of either tensor in their own panels; at pad_qk
    // 240 dQ by reductions, in two parts (64 columns and 56).
    for (auto [dq, dv] : {std::pair{192, 128}, {240, 160}, {168, 256}}) {
        Case mixed;
        mixed.d_qk = dq, mixed.d_v = dv, mixed.causal = dq != 168, mixed.heads_q = 8, mixed.heads_kv = 2;
        cases.push_back(mixed);
    }
    // d_qk != d_v within the pads of 144 (sm_90a: the wgmma kernel; dQ's panels or halves, or each warpgroup's keys;
    // accumulators of the head dim rounded to 8).
    for (auto [dq, dv] : {std::pair{128, 64}, {64, 128}, {120, 128}, {132, 128}, {128, 140}, {140, 136}}) {
        Case c;
        c.d_qk = dq, c.d_v = dv, c.causal = dq == 64, c.heads_q = 6, c.heads_kv = 3;
        cases.push_back(c);
    }
    // d132 on sm_90a: rows placed as they lie (head h starts h x 264 bytes in, so odd heads 4 columns right). MHA:
    // the main kernel; GQA groups, whose heads alternate: clusters of two CTAs, each walking one placement's heads
    // (groups of 3 start on odd heads too, one CTA walking 2 heads and the other 1; groups of 8 as the 70B model's),
    // rank 1's dK/dV added into rank 0's. RTATTN_TMA=0 runs bwd_sm90's kernel on the same cases.
    for (auto [hq, hkv] : {std::pair{6, 2}, {4, 4}, {16, 2}})
        for (bool causal : {false, true}) {
            Case c;
            c.d_qk = c.d_v = 132, c.causal = causal, c.heads_q = hq, c.heads_kv = hkv;
            c.seqlen_q = 300, c.seqlen_k = 500;
            cases.push_back(c);
        }
    run_backward_table("backward head dims", cases);
}

TEST_CASE("backward: sequence shapes and layouts", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    std::vector<Case> cases;
    // d128 (sm_90a: the warp-specialized kernel, its ring of two slots and the producer's walk) and d132.
    for (auto [sq, sk] : {std::pair{1, 1}, {1, 1000}, {1000, 1}, {77, 77}, {300, 100}, {100, 300}, {1000, 1000}})
        for (int d : {128, 132})
            for (bool causal : {false, true}) {
                Case c;
                c.d_qk = c.d_v = d;
                c.causal = causal;
                c.heads_q = 4, c.heads_kv = 1;  // MQA: four query heads summed into each dK/dV
                c.batch = 2, c.seqlen_q = sq, c.seqlen_k = sk;
                cases.push_back(c);
            }
    for (Layout l : {Layout::padded, Layout::head_major, Layout::packed_qkv, Layout::shifted, Layout::head_gaps})
        for (int d : {64, 100, 128, 132}) {
            Case c;
            c.d_qk = c.d_v = d;
            c.layout = l;
            c.causal = d != 64;
            c.heads_q = 8, c.heads_kv = 2;
            cases.push_back(c);
        }
    run_backward_table("backward shapes and layouts", cases);
}

TEST_CASE("backward: a gradient flowing into the returned LSE", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    std::vector<Case> cases;
    for (int d : {64, 128, 132}) {
        Case c;
        c.d_qk = c.d_v = d;
        c.causal = d != 64;
        c.heads_q = 4, c.heads_kv = 2;
        c.seqlen_q = 300, c.seqlen_k = 200;  // causal: 100 keyless rows, whose LSE gradient must change nothing
        cases.push_back(c);
    }
    run_backward_table("backward with dLSE", cases, false, /*with_dlse=*/true);
}

TEST_CASE("backward: deterministic mode is bitwise reproducible", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    std::vector<Case> cases;
    // d132, d140 in groups of 2: the pair kernel; d176 (dQ staged) and d208, d256 (dQ by each warp's TMA reductions):
    // the wide form
    for (int d : {64, 96, 128, 132, 140, 176, 208, 256}) {
        Case c;
        c.d_qk = c.d_v = d;
        c.causal = d != 128;
        c.heads_q = 4, c.heads_kv = 2;
        c.batch = 2, c.seqlen_q = 1000, c.seqlen_k = 700;
        cases.push_back(c);
    }
    run_backward_table("backward deterministic", cases, /*deterministic=*/true);
}

TEST_CASE("backward: sliding windows, every family, and deterministic turns", "[gpu][bwd][local]") {
    SKIP_WITHOUT_GPU();
    // Key blocks seen from a range of query blocks (both ends cut), key blocks seen by no query (dK = dV = 0), rows
    // whose window misses every key (dQ = 0). sm_90a: d64/d128 the warp-specialized kernel, d132 its shifted rows
    // (pairs with GQA 2), d256 dQ by TMA reductions; sm_80 the mma.sync kernel.
    const std::pair<int, int> full[] = {{0, 0}, {1, 3}, {130, 77}, {-1, 50}};
    const std::pair<int, int> causal_windows[] = {{1, -1}, {100, 0}, {1000, -1}, {0, 0}};
    std::vector<Case> cases;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 192, 256})
        for (bool causal : {false, true})
            for (int w = 0; w < 4; ++w) {
                Case c;
                c.d_qk = c.d_v = d;
                c.causal = causal;
                c.dtype = i % 3 ? Dtype::bf16 : Dtype::fp16;
                c.heads_q = 4, c.heads_kv = i++ % 2 ? 2 : 1;
                c.seqlen_q = w == 3 ? 500 : 300, c.seqlen_k = w == 3 ? 300 : 500;
                c.local = true;
                std::tie(c.window_left, c.window_right) = causal ? causal_windows[w] : full[w];
                cases.push_back(c);
            }
    run_backward_table("backward windows", cases);
    std::vector<Case> turns;  // a query block's key blocks start past key block 0: the turns count from its last
    for (int d : {64, 128, 256}) {
        Case c;
        c.d_qk = c.d_v = d;
        c.causal = d != 128;
        c.heads_q = 4, c.heads_kv = 2;
        c.seqlen_q = 1000, c.seqlen_k = 700;
        c.local = true, c.window_left = 200, c.window_right = c.causal ? 0 : 150;
        turns.push_back(c);
    }
    run_backward_table("backward windows deterministic", turns, /*deterministic=*/true);
}

TEST_CASE("backward: attention sinks and their gradient, every family", "[gpu][bwd][sinks]") {
    SKIP_WITHOUT_GPU();
    // dsinks from the postprocess over every sequence's rows; keyless causal rows (Sq > Sk: LSE = the sink), a
    // window, a gradient into LSE, and deterministic runs (the sum's order is fixed). sm_90a: d64/d128 the
    // warp-specialized kernel, d132 shifted rows, d256 dQ by TMA reductions; d1 the mma.sync kernel.
    std::vector<Case> cases;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 256})
        for (bool causal : {false, true}) {
            Case c;
            c.d_qk = c.d_v = d;
            c.causal = causal;
            c.dtype = i % 3 ? Dtype::bf16 : Dtype::fp16;
            c.heads_q = 4, c.heads_kv = i++ % 2 ? 2 : 1;
            c.seqlen_q = causal ? 500 : 300, c.seqlen_k = causal ? 300 : 500;
            c.sinks = true;
            cases.push_back(c);
        }
    Case windowed;
    windowed.d_qk = windowed.d_v = 64, windowed.heads_q = 8, windowed.heads_kv = 1, windowed.sinks = true;
    windowed.local = true, windowed.window_left = 100, windowed.window_right = 0;
    windowed.seqlen_q = windowed.seqlen_k = 400;
    cases.push_back(windowed);
    run_backward_table("backward sinks", cases);
    std::vector<Case> more = {cases[3], cases[7]};  // d64 causal, d128 causal
    run_backward_table("backward sinks with dLSE", more, false, /*with_dlse=*/true);
    run_backward_table("backward sinks deterministic", more, /*deterministic=*/true);
}

TEST_CASE("backward: softcapping, every family", "[gpu][bwd][softcap]") {
    SKIP_WITHOUT_GPU();
    // Scores scaled up (N(0, 9), as the forward's softcap table) so a cap of 5 bends most of them (slopes near 0) and
    // 30 the tails; with a window and sinks, a gradient into LSE, deterministic runs. sm_90a: d64 the warp-specialized
    // kernel's 128-query steps, d128 its 64-query ones, d132 shifted rows, d192 the wide form, d256 the split by GEMM
    // (P^T times the cap's slope handed over), d100 bwd_sm90; d1 the mma.sync kernel (every head dim with
    // RTATTN_TEST_ARCH=sm_90).
    std::vector<Case> cases = family_cases([](Case& c, int i) {
        // (d1's scores are single products, heavy-tailed: at 3x, bf16's rounding of its near one-hot rows took dQ to
        // 1.2e-2 against the float64 reference, as it would without the cap.)
        c.scale = (c.d_qk == 1 ? 1.5 : 3.0) / std::sqrt(double(c.d_qk)), c.dist = Dist::normal;
        c.softcap = i % 3 == 1 ? 30.f : 5.f;
    });
    Case mixed;  // a window and sinks with the cap; GQA 8:1
    mixed.d_qk = mixed.d_v = 128, mixed.heads_q = 8, mixed.heads_kv = 1, mixed.causal = true;
    mixed.local = true, mixed.window_left = 100, mixed.window_right = 0, mixed.sinks = true;
    mixed.seqlen_q = mixed.seqlen_k = 400, mixed.dist = Dist::normal, mixed.softcap = 2.f;
    cases.push_back(mixed);
    run_backward_table("backward softcap", cases);
    std::vector<Case> more = {cases[3], cases[7], cases[11]};  // d64, d128 causal, d192 causal
    run_backward_table("backward softcap with dLSE", more, false, /*with_dlse=*/true);
    run_backward_table("backward softcap deterministic", more, /*deterministic=*/true);
}

TEST_CASE("backward: ALiBi, every family", "[gpu][bwd][alibi]") {
    SKIP_WITHOUT_GPU();
    // Slopes per head (one row) or per sequence and head (padded rows), 2^-8 .. 2^-1; with a cap (the slope of the
    // capped part only), a window and sinks, dLSE, deterministic. Families as the softcap table's.
    std::vector<Case> cases = family_cases([](Case& c, int i) {
        c.alibi = i % 2 ? 2 : 1;
        c.softcap = i % 4 == 3 ? 5.f : 0.f;
    });
    Case mixed;
    mixed.d_qk = mixed.d_v = 128, mixed.heads_q = 8, mixed.heads_kv = 1, mixed.causal = true, mixed.alibi = 2;
    mixed.local = true, mixed.window_left = 100, mixed.window_right = 0, mixed.sinks = true;
    mixed.seqlen_q = mixed.seqlen_k = 400;
    cases.push_back(mixed);
    run_backward_table("backward alibi", cases);
    std::vector<Case> more = {cases[3], cases[7], cases[11]};
    run_backward_table("backward alibi with dLSE", more, false, /*with_dlse=*/true);
    run_backward_table("backward alibi deterministic", more, /*deterministic=*/true);
}

TEST_CASE("backward: a CUDA graph of forward + backward replays", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    Case c;
    c.d_qk = c.d_v = 128;
    c.causal = true;
    c.heads_q = 4, c.heads_kv = 2;
    const GradOutcome r = run_backward(c, false, /*graph=*/true);
    INFO(util::format("dq {:.2e} dk {:.2e} dv {:.2e} unwritten {} stray {}", r.dq_err, r.dk_err, r.dv_err,
                      r.unwritten, r.stray));
    CHECK(std::max({r.dq_err, r.dk_err, r.dv_err}) <= grad_tolerance(c.dtype));
    CHECK(r.unwritten == 0);
    CHECK(r.stray == 0);
}

TEST_CASE("backward: bad arguments are refused, naming them", "[gpu][bwd]") {
    SKIP_WITHOUT_GPU();
    AttentionConfig cfg;
    cfg.head_dim_qk = 132;
    cfg.num_heads_q = 4;
    cfg.num_heads_kv = 2;
    if (test_arch()) cfg.arch = test_arch();
    const BackwardKernel bwd = runtime().get_backward(cfg);
    driver::DeviceBuffer buf(1 << 22);
    BackwardArgs a;
    auto t = [&](int heads, int dim) { return ForwardArgs::contiguous(buf.get(), 16, heads, dim); };
    a.q = t(4, 132), a.k = t(2, 132), a.v = t(2, 132), a.o = t(4, 132), a.dout = t(4, 132);
    a.dq = t(4, 132), a.dk = t(2, 132), a.dv = t(2, 132);
    a.batch = 1, a.seqlen_q = a.seqlen_k = 16;
    auto field = [&](BackwardArgs b) {
        try {
            bwd.backward(b);
        } catch (const ArgumentError& e) {
            return e.field();
        }
        return std::string("(accepted)");
    };
    CHECK(field(a) == "lse");
    a.lse = static_cast<const float*>(buf.get());
    CHECK(field(a) == "workspace");
    a.workspace = buf.get();
    a.workspace_bytes = 16;
    CHECK(field(a) == "workspace_bytes");
    a.workspace_bytes = bwd.workspace_bytes(1, 16, 16);
    BackwardArgs b = a;
    b.dq.seq_stride = 6;
    CHECK(field(b) == "dq.seq_stride");
    b = a;
    b.dk.ptr = nullptr;
    CHECK(field(b) == "dk.ptr");
    b = a;
    b.batch = 0;
    CHECK(field(b) == "batch");
    // Sizes whose row arithmetic overflowed int32: refused before any kernel runs (the postprocess grid failed after
    // the first two kernels had run).
    b = a;
    b.seqlen_q = (1 << 30) + 1;
    CHECK(field(b) == "seqlen_q");
    CHECK_THROWS_AS(bwd.workspace_bytes(1, INT32_MAX, 16), ArgumentError);
    b = a;
    b.dq.batch_stride = std::int64_t(1) << 61, b.batch = 2;
    CHECK(field(b) == "dq");
    CHECK_THROWS_AS(BackwardKernel().backward(a), ArgumentError);
}
