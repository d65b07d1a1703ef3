// The varlen (packed, cu_seqlens) forward and backward on the GPU against the float64 reference, one sequence at a
// time. Each case: fresh random Q, K, V and dO packed as [total, heads, d] (optionally with padded rows, as slices of
// a fused QKV buffer), ragged lengths with empty and one-token sequences, queries shorter or longer than keys
// (causal aligned bottom-right per sequence); O, LSE, dQ, dK, dV poisoned before each launch and required written
// everywhere and nowhere past their guards. Also the merge of attention states (cascade attention: a shared prefix
// and each sequence's own keys). Tagged [gpu]: skipped, visibly, without a GPU.
#include "util/format.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>
#include <random>

#include "gpu_harness.hpp"
#include "reference_backward.hpp"

using namespace rtattn;
using namespace rtattn::test::gpu;

namespace util = rtattn::util;

namespace {

struct VarlenCase {
    int d_qk = 128, d_v = 128;
    Dtype dtype = Dtype::bf16;
    bool causal = false;
    int heads_q = 4, heads_kv = 2;
    std::vector<int> lens_q, lens_k;  // per sequence
    int row_pad = 0;        // elements of padding after each packed row (q, k, v, o, dO, gradients): strided rows
    int extra_max = 0;      // seqlen_q / seqlen_k passed this much above the longest sequence
    bool backward = true;
    bool deterministic = false;
    bool local = false;                         // config.local, and the calls' window (-1: unbounded)
    int window_left = -1, window_right = -1;
    bool sinks = false;  // config.sinks: each query head's sink logit, drawn with the inputs; dsinks checked
    float softcap = 0;   // > 0: config.softcap and the calls' cap
    bool alibi = false;  // config.alibi: a row of slopes per sequence, drawn with the inputs

    int batch() const { return int(lens_q.size()); }
    int total(const std::vector<int>& l) const { return std::accumulate(l.begin(), l.end(), 0); }
    int longest(const std::vector<int>& l) const { return std::max(1, *std::max_element(l.begin(), l.end())); }
    AttentionConfig config() const {
        AttentionConfig c;
        c.head_dim_qk = d_qk;
        if (d_v != d_qk) c.head_dim_v = d_v;
        c.dtype = dtype;
        c.causal = causal;
        c.num_heads_q = heads_q;
        c.num_heads_kv = heads_kv;
        c.varlen = true;
        c.local = local;
        c.sinks = sinks;
        c.softcap = softcap > 0;
        c.alibi = alibi;
        if (test_arch()) c.arch = test_arch();
        return c;
    }
    std::string describe() const {
        auto list = [](const std::vector<int>& l) {
            std::string s;
            for (int x : l) s += util::format("{}{}", s.empty() ? "" : ",", x);
            return s;
        };
        return util::format("d{}{} {} {} h{}:{} q[{}] k[{}] pad{} extra{}{}{}{}{}", d_qk,
                            d_v != d_qk ? util::format("/{}", d_v) : "", rtattn::to_string(dtype),
                            causal ? "causal" : "full", heads_q, heads_kv, list(lens_q), list(lens_k), row_pad,
                            extra_max, deterministic ? " deterministic" : "",
                            local ? util::format(" window({},{})", window_left, window_right) : "",
                            sinks ? " sinks" : "", softcap > 0 ? util::format(" softcap={}", softcap) : "") +
               (alibi ? " alibi" : "");
    }
    std::uint32_t seed() const {
        std::uint32_t h = 2166136261u;
        for (unsigned char ch : describe()) h = (h ^ ch) * 16777619u;
        return h;
    }
};

// A packed [total, heads, dim] 16-bit tensor (rows padded by row_pad elements) with a guard after it, host and device.
struct Packed {
    int total = 0, heads = 0, dim = 0, pad = 0;
    std::vector<std::uint16_t> host;
    driver::DeviceBuffer dev;
    Packed(int t, int h, int d, int p) : total(t), heads(h), dim(d), pad(p), dev((size() + kGuard) * 2) {}
    std::int64_t row() const { return std::int64_t(heads) * dim + pad; }
    std::size_t size() const { return std::size_t(total) * row(); }
    TensorArg arg() const { return TensorArg{dev.get(), 0, row(), dim}; }
    void random(std::mt19937& rng, Dtype dt) {
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        host.assign(size() + kGuard, test::kPoison16);  // padding stays NaN: a stray read poisons the result
        for (int t = 0; t < total; ++t)
            for (int i = 0; i < heads * dim; ++i) host[t * row() + i] = test::to_bits(u(rng), dt);
        dev.upload(host.data(), host.size() * 2);
    }
    void poison() {
        host.assign(size() + kGuard, test::kPoison16);
        dev.upload(host.data(), host.size() * 2);
    }
    void download() { dev.download(host.data(), host.size() * 2); }
    // Sequence rows [begin, begin + n) as the reference reads them.
    test::HostTensorView view(int begin) const { return {host.data() + begin * row(), 0, row(), dim}; }
};

// Accumulates one output's comparison over the sequences: values against the reference, poison left in written
// rows, padding or guard changed.
struct Tally {
    std::vector<double> got, ref;
    std::size_t unwritten = 0, stray = 0;
    // Sequence rows [begin, begin + n) of `p` against ref ([n, heads, dim] contiguous).
    void rows(const Packed& p, int begin, int n, const std::vector<double>& r, Dtype dt) {
        for (int t = 0; t < n; ++t)
            for (int i = 0; i < p.heads * p.dim; ++i) {
                const std::uint16_t bits = p.host[(begin + t) * p.row() + i];
                unwritten += bits == test::kPoison16;
                got.push_back(test::from_bits(bits, dt));
                ref.push_back(r[std::size_t(t) * p.heads * p.dim + i]);
            }
    }
    void padding(const Packed& p) {
        for (int t = 0; t < p.total; ++t)
            for (int i = p.heads * p.dim; i < p.row(); ++i) stray += p.host[t * p.row() + i] != test::kPoison16;
        for (std::size_t i = p.size(); i < p.host.size(); ++i) stray += p.host[i] != test::kPoison16;
    }
    std::string judge(const char* name, double tol, double floor_rms = 0) const {
        const double err = floor_rms > 0 ? test::rel_frobenius_floor(got, ref, floor_rms) : test::rel_frobenius(got, ref);
        std::string why;
        if (!(err <= tol)) why += util::format(" {} error {:.3g} > {:.3g};", name, err, tol);
        if (unwritten) why += util::format(" {} {} elements unwritten;", unwritten, name);
        if (stray) why += util::format(" {} {} padding/guard elements changed;", stray, name);
        UNSCOPED_INFO(name << " error " << err);
        return why;
    }
};

struct Offsets {
    std::vector<std::int32_t> q, k;  // cu_seqlens, batch + 1
    driver::DeviceBuffer dq, dk;
};

Offsets offsets(const VarlenCase& c) {
    Offsets o;
    o.q.assign(1, 0), o.k.assign(1, 0);
    for (int b = 0; b < c.batch(); ++b) o.q.push_back(o.q.back() + c.lens_q[b]), o.k.push_back(o.k.back() + c.lens_k[b]);
    o.dq = driver::DeviceBuffer(o.q.size() * 4), o.dk = driver::DeviceBuffer(o.k.size() * 4);
    o.dq.upload(o.q.data(), o.q.size() * 4), o.dk.upload(o.k.data(), o.k.size() * 4);
    return o;
}

// Sequence b as a reference problem (batch 1) over the packed host tensors.
test::ReferenceProblem sequence(const VarlenCase& c, const Offsets& off, int b, const Packed& q, const Packed& k,
                                const Packed& v, const std::vector<float>& sinks = {},
                                const std::vector<float>& alibi = {}) {
    test::ReferenceProblem r;
    r.dtype = c.dtype, r.batch = 1, r.seqlen_q = c.lens_q[b], r.seqlen_k = c.lens_k[b];
    r.heads_q = c.heads_q, r.heads_kv = c.heads_kv, r.head_dim_qk = c.d_qk, r.head_dim_v = c.d_v;
    r.causal = c.causal, r.scale = 1.0 / std::sqrt(double(c.d_qk));
    r.window_left = c.window_left, r.window_right = c.window_right;
    r.sinks.assign(sinks.begin(), sinks.end());
    r.softcap = c.softcap;
    if (!alibi.empty()) r.alibi.assign(alibi.begin() + std::size_t(b) * c.heads_q, alibi.begin() + (b + 1) * c.heads_q);
    r.q = q.view(off.q[b]), r.k = k.view(off.k[b]), r.v = v.view(off.k[b]);
    return r;
}

void run_case(const VarlenCase& c) {
    INFO(c.describe());
    std::mt19937 rng(c.seed());
    const AttentionConfig cfg = c.config();
    const Kernel fwd = runtime().get(cfg);
    Offsets off = offsets(c);
    const int tq = std::max(1, c.total(c.lens_q)), tk = std::max(1, c.total(c.lens_k));
    Packed q(tq, c.heads_q, c.d_qk, c.row_pad), k(tk, c.heads_kv, c.d_qk, c.row_pad), v(tk, c.heads_kv, c.d_v, c.row_pad);
    Packed o(tq, c.heads_q, c.d_v, c.row_pad);
    q.random(rng, c.dtype), k.random(rng, c.dtype), v.random(rng, c.dtype), o.poison();
    const std::size_t lse_n = std::size_t(c.heads_q) * tq;
    std::vector<float> lse(lse_n + kGuard);
    driver::DeviceBuffer lse_dev(lse.size() * 4);
    lse_dev.fill_u32(test::kPoison32);
    std::vector<float> sinks;
    std::uniform_real_distribution<float> sink(-2.f, 6.f);
    for (int h = 0; c.sinks && h < c.heads_q; ++h) sinks.push_back(sink(rng));
    driver::DeviceBuffer sinks_dev(std::max<std::size_t>(sinks.size(), 1) * 4);
    if (c.sinks) sinks_dev.upload(sinks.data(), sinks.size() * 4);
    std::vector<float> alibi;  // [batch, heads_q]
    std::uniform_real_distribution<float> log2_slope(-8.f, -1.f);
    for (int i = 0; c.alibi && i < c.batch() * c.heads_q; ++i) alibi.push_back(std::exp2(log2_slope(rng)));
    driver::DeviceBuffer alibi_dev(std::max<std::size_t>(alibi.size(), 1) * 4);
    if (c.alibi) alibi_dev.upload(alibi.data(), alibi.size() * 4);

    ForwardArgs a;
    a.q = q.arg(), a.k = k.arg(), a.v = v.arg(), a.o = o.arg();
    a.lse = static_cast<float*>(lse_dev.get());
    a.batch = c.batch(), a.seqlen_q = c.longest(c.lens_q) + c.extra_max, a.seqlen_k = c.longest(c.lens_k) + c.extra_max;
    a.seqlen_q = std::min(a.seqlen_q, tq), a.seqlen_k = std::min(a.seqlen_k, tk);
    a.cu_seqlens_q = static_cast<const std::int32_t*>(off.dq.get());
    a.cu_seqlens_k = static_cast<const std::int32_t*>(off.dk.get());
    a.total_q = tq, a.total_k = tk;
    a.window_size_left = c.window_left, a.window_size_right = c.window_right;
    if (c.sinks) a.sinks = static_cast<const float*>(sinks_dev.get());
    a.softcap = c.softcap;
    if (c.alibi) a.alibi_slopes = static_cast<const float*>(alibi_dev.get()), a.alibi_slopes_batch_stride = c.heads_q;
    sync_legacy_stream();
    fwd.forward(a);
    sync_legacy_stream();
    o.download();
    lse_dev.download(lse.data(), lse.size() * 4);

    // Forward: O per sequence; LSE [heads_q, total_q] (+inf where a query sees no key; sinks: the sink).
    Tally to;
    std::vector<double> got_lse, ref_lse;
    std::size_t lse_bad = 0;
    std::vector<test::ReferenceProblem> seqs;
    for (int b = 0; b < c.batch(); ++b) {
        seqs.push_back(sequence(c, off, b, q, k, v, sinks, alibi));
        if (c.lens_q[b] == 0) continue;
        test::ReferenceResult r;
        if (c.lens_k[b] > 0 || c.sinks) {
            r = test::reference_forward(seqs.back());
        } else {
            r.o.assign(std::size_t(c.lens_q[b]) * c.heads_q * c.d_v, 0.0);
            r.lse.assign(std::size_t(c.heads_q) * c.lens_q[b], INFINITY);
        }
        to.rows(o, off.q[b], c.lens_q[b], r.o, c.dtype);
        for (int h = 0; h < c.heads_q; ++h)
            for (int s = 0; s < c.lens_q[b]; ++s) {
                const double e = r.lse[std::size_t(h) * c.lens_q[b] + s];
                const float g = lse[std::size_t(h) * tq + off.q[b] + s];
                if (std::isinf(e))
                    lse_bad += !(std::isinf(g) && g > 0);
                else
                    got_lse.push_back(g), ref_lse.push_back(e);
            }
    }
    to.padding(o);
    for (std::size_t i = lse_n; i < lse.size(); ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, &lse[i], 4);
        lse_bad += bits != test::kPoison32;
    }
    std::string why = to.judge("O", o_tolerance(c.dtype));
    const double lse_err = test::rel_frobenius_floor1(got_lse, ref_lse);
    if (!(lse_err <= kLseTolerance)) why += util::format(" LSE error {:.3g};", lse_err);
    if (lse_bad) why += util::format(" {} LSE elements wrong (keyless rows not +inf, or guard changed);", lse_bad);
    CHECK(why.empty());
    if (!why.empty()) FAIL_CHECK("forward:" << why);
    if (!c.backward) return;

    // Backward: dQ, dK, dV per sequence against the reference's, from the forward's O and LSE.
    const BackwardKernel bwd = runtime().get_backward(cfg);
    Packed dout(tq, c.heads_q, c.d_v, c.row_pad);
    dout.random(rng, c.dtype);
    Packed dq(tq, c.heads_q, c.d_qk, c.row_pad), dk(tk, c.heads_kv, c.d_qk, c.row_pad), dv(tk, c.heads_kv, c.d_v, c.row_pad);
    const std::size_t ws_bytes = bwd.workspace_bytes(a.batch, a.seqlen_q, a.seqlen_k);
    driver::DeviceBuffer ws(ws_bytes);
    BackwardArgs b;
    b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.lse = a.lse, b.dout = dout.arg();
    b.dq = dq.arg(), b.dk = dk.arg(), b.dv = dv.arg();
    b.batch = a.batch, b.seqlen_q = a.seqlen_q, b.seqlen_k = a.seqlen_k;
    b.workspace = ws.get(), b.workspace_bytes = ws_bytes;
    b.deterministic = c.deterministic;
    b.cu_seqlens_q = a.cu_seqlens_q, b.cu_seqlens_k = a.cu_seqlens_k, b.total_q = tq, b.total_k = tk;
    b.window_size_left = a.window_size_left, b.window_size_right = a.window_size_right;
    b.softcap = a.softcap;
    b.alibi_slopes = a.alibi_slopes, b.alibi_slopes_batch_stride = a.alibi_slopes_batch_stride;
    std::vector<float> dsinks(std::size_t(c.heads_q) + kGuard);
    driver::DeviceBuffer dsinks_dev(dsinks.size() * 4);
    if (c.sinks) b.sinks = a.sinks, b.dsinks = static_cast<float*>(dsinks_dev.get());
    auto run = [&] {
        for (Packed* g : {&dq, &dk, &dv}) g->poison();
        dsinks_dev.fill_u32(test::kPoison32);
        ws.fill_u32(0x7fc00000u);
        sync_legacy_stream();
        bwd.backward(b);
        sync_legacy_stream();
        for (Packed* g : {&dq, &dk, &dv}) g->download();
        dsinks_dev.download(dsinks.data(), dsinks.size() * 4);
    };
    run();
    Tally tdq, tdk, tdv;
    std::vector<double> ref_dsinks(c.heads_q, 0.0);  // summed over the sequences (one without keys adds 0)
    for (int s = 0; s < c.batch(); ++s) {
        const int nq = c.lens_q[s], nk = c.lens_k[s];
        test::BackwardResult r;
        if (nq > 0 && nk > 0) {
            r = test::reference_backward(seqs[s], dout.view(off.q[s]));
            for (int h = 0; c.sinks && h < c.heads_q; ++h) ref_dsinks[h] += r.dsinks[h];
        } else {  // no pair: every gradient of the sequence is zero
            r.dq.assign(std::size_t(nq) * c.heads_q * c.d_qk, 0.0);
            r.dk.assign(std::size_t(nk) * c.heads_kv * c.d_qk, 0.0);
            r.dv.assign(std::size_t(nk) * c.heads_kv * c.d_v, 0.0);
        }
        tdq.rows(dq, off.q[s], nq, r.dq, c.dtype);
        tdk.rows(dk, off.k[s], nk, r.dk, c.dtype);
        tdv.rows(dv, off.k[s], nk, r.dv, c.dtype);
    }
    tdq.padding(dq), tdk.padding(dk), tdv.padding(dv);
    const double tol = c.dtype == Dtype::bf16 ? 1e-2 : 3e-3;
    why = tdq.judge("dQ", tol, 1e-3) + tdk.judge("dK", tol, 1e-3) + tdv.judge("dV", tol, 1e-3);
    if (c.sinks) {
        Tally ts;
        for (int h = 0; h < c.heads_q; ++h) {
            ts.unwritten += std::bit_cast<std::uint32_t>(dsinks[h]) == test::kPoison32;
            ts.got.push_back(dsinks[h]), ts.ref.push_back(ref_dsinks[h]);
        }
        for (std::size_t i = c.heads_q; i < dsinks.size(); ++i)
            ts.stray += std::bit_cast<std::uint32_t>(dsinks[i]) != test::kPoison32;
        why += ts.judge("dsinks", tol, 1e-3);
    }
    CHECK(why.empty());
    if (!why.empty()) FAIL_CHECK("backward:" << why);
    if (c.deterministic) {
        const auto first = std::vector<std::vector<std::uint16_t>>{dq.host, dk.host, dv.host};
        run();
        CHECK((first == std::vector<std::vector<std::uint16_t>>{dq.host, dk.host, dv.host}));
    }
}

std::vector<int> ragged(std::mt19937& rng, int n, int lo, int hi) {
    std::uniform_int_distribution<int> len(lo, hi);
    std::vector<int> v(n);
    for (int& x : v) x = len(rng);
    return v;
}

}  // namespace

TEST_CASE("varlen: head dims, ragged batches with empty and one-token sequences", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(7);
    for (int d : {1, 64, 80, 100, 128, 132, 140, 160, 192, 208, 256}) {
        VarlenCase c;
        c.d_qk = c.d_v = d;
        c.causal = d % 3 != 0;
        c.dtype = d % 2 ? Dtype::fp16 : Dtype::bf16;
        c.lens_q = ragged(rng, 5, 1, 300);
        c.lens_q.insert(c.lens_q.begin() + 1, 0);  // an empty sequence
        c.lens_q.push_back(1);                      // a one-token sequence
        c.lens_k = c.lens_q;                        // self-attention over each sequence
        run_case(c);
    }
    // Head dims off the 8 grid with 8 kv heads: d140 splits rows on sm_90a (32-byte boxes: four head classes over
    // the packed total_k rows), d33 and d90 take the kernels without TMA, d253 shifted rows 16 columns past 256.
    for (int d : {33, 90, 140, 253}) {
        VarlenCase c;
        c.d_qk = c.d_v = d;
        c.heads_q = 16, c.heads_kv = 8, c.causal = d == 33;
        c.lens_q = c.lens_k = ragged(rng, 4, 1, 400);
        run_case(c);
    }
}

TEST_CASE("varlen: sliding windows per sequence, forward and backward", "[gpu][varlen][local]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(23);
    // Each sequence's window is aligned bottom-right in it: empty and one-token sequences, queries fewer than keys,
    // windows of 0 keys and wider than every sequence; sm_90a: d64/d128 warp-specialized (TMA over the packed rows),
    // d132 its shifted rows, d256 dQ by TMA reductions.
    int i = 0;
    for (int d : {64, 128, 132, 256})
        for (auto [left, right] : {std::pair{0, 0}, {37, -1}, {-1, 21}, {500, 500}}) {
            VarlenCase c;
            c.d_qk = c.d_v = d;
            c.causal = right == -1 && i % 2 == 0;
            c.dtype = i++ % 3 ? Dtype::bf16 : Dtype::fp16;
            c.local = true, c.window_left = left, c.window_right = right;
            c.lens_q = ragged(rng, 4, 1, 300);
            c.lens_q.insert(c.lens_q.begin() + 1, 0);
            c.lens_q.push_back(1);
            c.lens_k = c.lens_q;
            for (std::size_t s = 0; s < c.lens_k.size(); s += 2) c.lens_k[s] += 40;  // more keys than queries
            run_case(c);
        }
}

namespace {
// The variants' tables: the i-th case of head dim d, causal every other, a dtype by turn, self-attention over 4 random
// lengths plus an empty and a one-token sequence.
VarlenCase ragged_case(int d, int i, std::mt19937& rng) {
    VarlenCase c;
    c.d_qk = c.d_v = d;
    c.causal = i % 2 == 0;
    c.dtype = i % 3 ? Dtype::bf16 : Dtype::fp16;
    c.lens_q = ragged(rng, 4, 1, 300);
    c.lens_q.insert(c.lens_q.begin() + 1, 0);
    c.lens_q.push_back(1);
    c.lens_k = c.lens_q;
    return c;
}
}  // namespace

TEST_CASE("varlen: attention sinks per head, forward and dsinks", "[gpu][varlen][sinks]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(31);
    // Empty sequences, sequences with queries but no keys (every row the sink alone), one-token ones; with a window.
    int i = 0;
    for (int d : {64, 128, 132, 256}) {
        VarlenCase c = ragged_case(d, i++, rng);
        c.sinks = true;
        c.lens_k[2] = 0;  // queries and no key
        if (d == 128) c.local = true, c.window_left = 50, c.window_right = c.causal ? -1 : 10;
        run_case(c);
    }
}

TEST_CASE("varlen: softcapping per sequence, forward and backward", "[gpu][varlen][softcap]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(37);
    int i = 0;
    for (int d : {64, 128, 132, 256}) {
        VarlenCase c = ragged_case(d, i++, rng);
        c.softcap = d == 128 ? 0.5f : 2.f;  // uniform inputs: scaled scores within about +-2
        c.deterministic = d == 256;
        c.sinks = d == 64;
        if (d == 132) c.local = true, c.window_left = 40, c.window_right = c.causal ? -1 : 5;
        run_case(c);
    }
}

TEST_CASE("varlen: ALiBi with a row of slopes per sequence, forward and backward", "[gpu][varlen][alibi]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(41);
    int i = 0;
    for (int d : {64, 128, 132, 256}) {
        VarlenCase c = ragged_case(d, i++, rng);
        c.alibi = true;
        c.softcap = d == 132 ? 2.f : 0.f;
        c.sinks = d == 64;
        if (d == 128) c.local = true, c.window_left = 40, c.window_right = c.causal ? -1 : 5;
        c.deterministic = d == 256;
        run_case(c);
    }
}

TEST_CASE("varlen: queries shorter and longer than keys (bottom-right causal), GQA, MQA", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(11);
    for (bool causal : {true, false})
        for (auto [hq, hkv] : {std::pair{8, 2}, std::pair{6, 1}, std::pair{3, 3}}) {
            VarlenCase c;
            c.causal = causal, c.heads_q = hq, c.heads_kv = hkv;
            c.lens_q = {37, 200, 1, 0, 129, 64};
            c.lens_k = {300, 200, 77, 5, 0, 1};  // chunked prefill (fewer queries), a keyless sequence, longer queries
            run_case(c);
        }
}

TEST_CASE("varlen: padded rows (a fused QKV buffer), max_seqlen above the longest, d_qk != d_v", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(13);
    VarlenCase c;
    c.d_qk = 128, c.d_v = 128, c.causal = true, c.row_pad = 64;
    c.lens_q = c.lens_k = ragged(rng, 4, 100, 500);
    run_case(c);
    c.row_pad = 0, c.extra_max = 100;
    run_case(c);
    c.d_qk = 192, c.d_v = 128, c.extra_max = 0, c.causal = false;
    run_case(c);
}

TEST_CASE("varlen: long sequences among short ones, deterministic backward", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    VarlenCase c;
    c.heads_q = 4, c.heads_kv = 1, c.causal = true;
    c.lens_q = c.lens_k = {2048, 3, 700, 1};
    run_case(c);
    c.deterministic = true;
    c.lens_q = c.lens_k = {513, 64, 1000};
    run_case(c);
}

TEST_CASE("varlen: bad arguments are refused with the field named", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    VarlenCase c;
    c.lens_q = c.lens_k = {10, 20};
    const Kernel fwd = runtime().get(c.config());
    Offsets off = offsets(c);
    Packed q(30, 4, 128, 0), k(30, 2, 128, 0), v(30, 2, 128, 0), o(30, 4, 128, 0);
    auto good = [&] {
        ForwardArgs a;
        a.q = q.arg(), a.k = k.arg(), a.v = v.arg(), a.o = o.arg();
        a.batch = 2, a.seqlen_q = a.seqlen_k = 20;
        a.cu_seqlens_q = static_cast<const std::int32_t*>(off.dq.get());
        a.cu_seqlens_k = static_cast<const std::int32_t*>(off.dk.get());
        a.total_q = a.total_k = 30;
        return a;
    };
    auto refused = [&](const char* field, auto&& mutate) {
        ForwardArgs a = good();
        mutate(a);
        try {
            fwd.forward(a);
            FAIL("accepted a bad " << field);
        } catch (const ArgumentError& e) {
            CHECK(e.field() == field);
        }
    };
    fwd.forward(good());  // the baseline is accepted
    sync_legacy_stream();
    refused("cu_seqlens_q", [](ForwardArgs& a) { a.cu_seqlens_q = nullptr; });
    refused("cu_seqlens_k", [](ForwardArgs& a) { a.cu_seqlens_k = reinterpret_cast<const std::int32_t*>(2); });
    refused("total_q", [](ForwardArgs& a) { a.total_q = 0; });
    refused("seqlen_k", [](ForwardArgs& a) { a.seqlen_k = 31; });
    refused("q.batch_stride", [](ForwardArgs& a) { a.q.batch_stride = 30 * 4 * 128; });
    refused("seqlens_k", [](ForwardArgs& a) { a.seqlens_k = a.cu_seqlens_k; });

    // A dense kernel refuses the varlen fields instead of ignoring them.
    AttentionConfig dense = c.config();
    dense.varlen = false;
    const Kernel dk = runtime().get(dense);
    ForwardArgs a = good();
    a.q.batch_stride = a.o.batch_stride = 30 * 4 * 128, a.k.batch_stride = a.v.batch_stride = 30 * 2 * 128;
    a.batch = 1, a.seqlen_q = a.seqlen_k = 30;
    try {
        dk.forward(a);
        FAIL("a dense kernel accepted cu_seqlens");
    } catch (const ArgumentError& e) {
        CHECK(e.field() == "cu_seqlens_q");
    }
}

TEST_CASE("varlen: max_seqlen below a real sequence's length cuts it inside the buffers, no hang", "[gpu][varlen]") {
    SKIP_WITHOUT_GPU();
    // The workspace is sized by batch and max_seqlen: a longer sequence wrote ~91 KB past it, and the deterministic
    // backward waited on key blocks the grid did not have. Now each sequence is cut to max_seqlen rows and keys: the
    // workspace's guard, the gradients' padding and guards stay as they were, and repeated deterministic runs agree.
    VarlenCase c;
    c.causal = true;
    c.lens_q = c.lens_k = {300, 40, 700};
    const int max_seqlen = 64, tq = 1040;
    const AttentionConfig cfg = c.config();
    const Kernel fwd = runtime().get(cfg);
    const BackwardKernel bwd = runtime().get_backward(cfg);
    Offsets off = offsets(c);
    std::mt19937 rng(c.seed());
    Packed q(tq, 4, 128, 8), k(tq, 2, 128, 8), v(tq, 2, 128, 8), o(tq, 4, 128, 8), dout(tq, 4, 128, 8);
    Packed dq(tq, 4, 128, 8), dk(tq, 2, 128, 8), dv(tq, 2, 128, 8);
    q.random(rng, c.dtype), k.random(rng, c.dtype), v.random(rng, c.dtype), dout.random(rng, c.dtype), o.poison();
    driver::DeviceBuffer lse((std::size_t(4) * tq + kGuard) * 4);
    lse.fill_u32(test::kPoison32);
    ForwardArgs a;
    a.q = q.arg(), a.k = k.arg(), a.v = v.arg(), a.o = o.arg(), a.lse = static_cast<float*>(lse.get());
    a.batch = 3, a.seqlen_q = a.seqlen_k = max_seqlen;
    a.cu_seqlens_q = static_cast<const std::int32_t*>(off.dq.get());
    a.cu_seqlens_k = static_cast<const std::int32_t*>(off.dk.get());
    a.total_q = a.total_k = tq;
    sync_legacy_stream();
    fwd.forward(a);
    sync_legacy_stream();
    o.download();
    Tally to;
    to.padding(o);
    CHECK(to.stray == 0);

    const std::size_t need = bwd.workspace_bytes(3, max_seqlen, max_seqlen), guard = 256 * 1024;
    driver::DeviceBuffer ws(need + guard);
    BackwardArgs b;
    b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.lse = a.lse, b.dout = dout.arg();
    b.dq = dq.arg(), b.dk = dk.arg(), b.dv = dv.arg();
    b.batch = 3, b.seqlen_q = b.seqlen_k = max_seqlen;
    b.workspace = ws.get(), b.workspace_bytes = need;
    b.cu_seqlens_q = a.cu_seqlens_q, b.cu_seqlens_k = a.cu_seqlens_k, b.total_q = b.total_k = tq;
    std::vector<std::vector<std::uint16_t>> first;
    for (bool deterministic : {false, true, true}) {
        INFO((deterministic ? "deterministic" : "atomic dQ"));
        b.deterministic = deterministic;
        for (Packed* g : {&dq, &dk, &dv}) g->poison();
        ws.fill_u16(0x5a5a);
        sync_legacy_stream();
        bwd.backward(b);
        sync_legacy_stream();
        std::vector<std::uint8_t> tail(guard);
        ws.download(tail.data(), guard, need);
        CHECK(std::count(tail.begin(), tail.end(), std::uint8_t(0x5a)) == std::ptrdiff_t(guard));
        Tally t;
        for (Packed* g : {&dq, &dk, &dv}) g->download(), t.padding(*g);
        CHECK(t.stray == 0);
        const std::vector<std::vector<std::uint16_t>> got{dq.host, dk.host, dv.host};
        if (deterministic && !first.empty()) CHECK(got == first);
        if (deterministic) first = got;
    }
}

// Cascade attention through the merge: every sequence's queries attend to a shared prefix (one dense call over all
// packed queries: batch 1, seqlen total_q) and to their own keys (a varlen call; some sequences have none, so their
// state is empty, LSE +inf); merging the two states must give attention over prefix + own keys (float64 reference).
TEST_CASE("merge: cascade attention (shared prefix + own keys), in place, empty and NaN states", "[gpu][varlen][merge]") {
    SKIP_WITHOUT_GPU();
    for (int d : {128, 80}) {
        VarlenCase c;
        c.d_qk = c.d_v = d;
        c.dtype = d == 80 ? Dtype::fp16 : Dtype::bf16;
        c.lens_q = {5, 130, 1, 64};
        c.lens_k = {300, 0, 17, 1000};
        const int prefix = 777;
        INFO(c.describe() << " prefix " << prefix);
        std::mt19937 rng(c.seed());
        Offsets off = offsets(c);
        const int tq = c.total(c.lens_q), tk = c.total(c.lens_k);
        Packed q(tq, c.heads_q, d, 0), k(tk, c.heads_kv, d, 0), v(tk, c.heads_kv, d, 0);
        Packed kp(prefix, c.heads_kv, d, 0), vp(prefix, c.heads_kv, d, 0), oa(tq, c.heads_q, d, 0), ob(tq, c.heads_q, d, 0);
        for (Packed* t : {&q, &k, &v, &kp, &vp}) t->random(rng, c.dtype);
        oa.poison(), ob.poison();
        driver::DeviceBuffer lse_a(std::size_t(c.heads_q) * tq * 4), lse_b(std::size_t(c.heads_q) * tq * 4);

        AttentionConfig dense_cfg = c.config();
        dense_cfg.varlen = false;
        const Kernel prefix_kernel = runtime().get(dense_cfg), own_kernel = runtime().get(c.config());
        ForwardArgs a;  // the prefix: all queries as one sequence
        a.q = q.arg(), a.k = kp.arg(), a.v = vp.arg(), a.o = oa.arg();
        a.q.batch_stride = q.size(), a.k.batch_stride = kp.size(), a.v.batch_stride = vp.size();
        a.o.batch_stride = oa.size();
        a.lse = static_cast<float*>(lse_a.get());
        a.batch = 1, a.seqlen_q = tq, a.seqlen_k = prefix;
        prefix_kernel.forward(a);
        ForwardArgs b;  // each sequence's own keys
        b.q = q.arg(), b.k = k.arg(), b.v = v.arg(), b.o = ob.arg();
        b.lse = static_cast<float*>(lse_b.get());
        b.batch = c.batch(), b.seqlen_q = c.longest(c.lens_q), b.seqlen_k = c.longest(c.lens_k);
        b.cu_seqlens_q = static_cast<const std::int32_t*>(off.dq.get());
        b.cu_seqlens_k = static_cast<const std::int32_t*>(off.dk.get());
        b.total_q = tq, b.total_k = tk;
        own_kernel.forward(b);

        // A NaN in one state's LSE (row 0 of head 0) must come out as NaN, never as a plausible value.
        const float nan = NAN;
        lse_b.upload(&nan, 4);
        MergeArgs m;
        m.o_a = oa.arg(), m.o_b = ob.arg(), m.o = oa.arg();  // in place, into the prefix state
        m.lse_a = static_cast<const float*>(lse_a.get()), m.lse_b = static_cast<const float*>(lse_b.get());
        m.lse = static_cast<float*>(lse_b.get());               // in place too
        m.batch = 1, m.seqlen = tq;
        own_kernel.merge(m);
        sync_legacy_stream();
        oa.download();
        std::vector<float> lse(std::size_t(c.heads_q) * tq);
        lse_b.download(lse.data(), lse.size() * 4);

        Tally to;
        std::vector<double> got_lse, ref_lse;
        std::size_t nan_row_ok = 0;
        for (int s = 0; s < c.batch(); ++s) {
            // This sequence's keys: the prefix, then its own.
            const int nk = prefix + c.lens_k[s];
            std::vector<std::uint16_t> kk, vv;
            for (const auto* src : {&kp, &k}) {
                const bool own = src == &k;
                const int rows = own ? c.lens_k[s] : prefix, first = own ? off.k[s] : 0;
                kk.insert(kk.end(), src->host.begin() + std::size_t(first) * src->row(),
                          src->host.begin() + std::size_t(first + rows) * src->row());
                const Packed& vs = own ? v : vp;
                vv.insert(vv.end(), vs.host.begin() + std::size_t(first) * vs.row(),
                          vs.host.begin() + std::size_t(first + rows) * vs.row());
            }
            test::ReferenceProblem r = sequence(c, off, s, q, k, v);
            r.seqlen_k = nk;
            r.k = {kk.data(), 0, k.row(), d}, r.v = {vv.data(), 0, v.row(), d};
            const test::ReferenceResult ref = test::reference_forward(r);
            for (int t = 0; t < c.lens_q[s]; ++t)
                for (int h = 0; h < c.heads_q; ++h) {
                    const int row = off.q[s] + t;
                    if (row == 0 && h == 0) {  // the NaN row: every element NaN, LSE NaN
                        for (int e = 0; e < d; ++e) nan_row_ok += std::isnan(test::from_bits(oa.host[e], c.dtype));
                        nan_row_ok += std::isnan(lse[0]);
                        continue;
                    }
                    for (int e = 0; e < d; ++e) {
                        const std::uint16_t bits = oa.host[std::size_t(row) * oa.row() + h * d + e];
                        to.unwritten += bits == test::kPoison16;
                        to.got.push_back(test::from_bits(bits, c.dtype));
                        to.ref.push_back(ref.o[ref.o_index(0, t, h, e)]);
                    }
                    got_lse.push_back(lse[std::size_t(h) * tq + row]);
                    ref_lse.push_back(ref.lse[ref.lse_index(0, h, t)]);
                }
        }
        to.padding(oa);
        std::string why = to.judge("merged O", o_tolerance(c.dtype));
        const double lse_err = test::rel_frobenius_floor1(got_lse, ref_lse);
        if (!(lse_err <= kLseTolerance)) why += util::format(" merged LSE error {:.3g};", lse_err);
        if (nan_row_ok != std::size_t(d) + 1) why += util::format(" NaN row: {} of {} NaN;", nan_row_ok, d + 1);
        CHECK(why.empty());
        if (!why.empty()) FAIL_CHECK(why);
    }
}

TEST_CASE("merge: bad arguments are refused with the field named", "[gpu][merge]") {
    SKIP_WITHOUT_GPU();
    VarlenCase c;
    AttentionConfig cfg = c.config();
    cfg.varlen = false;
    const Kernel kernel = runtime().get(cfg);
    Packed o(8, 4, 128, 0);
    driver::DeviceBuffer lse(8 * 4 * 4);
    auto good = [&] {
        MergeArgs m;
        m.o_a = m.o_b = m.o = o.arg();
        m.o_a.batch_stride = m.o_b.batch_stride = m.o.batch_stride = o.size();
        m.lse_a = m.lse_b = static_cast<const float*>(lse.get());
        m.batch = 1, m.seqlen = 8;
        return m;
    };
    auto refused = [&](const char* field, auto&& mutate) {
        MergeArgs m = good();
        mutate(m);
        try {
            kernel.merge(m);
            FAIL("accepted a bad " << field);
        } catch (const ArgumentError& e) {
            CHECK(e.field() == field);
        }
    };
    refused("lse_b", [](MergeArgs& m) { m.lse_b = nullptr; });
    refused("lse", [&](MergeArgs& m) { m.lse = reinterpret_cast<float*>(static_cast<char*>(lse.get()) + 2); });
    refused("seqlen", [](MergeArgs& m) { m.seqlen = 0; });
    refused("o.seq_stride", [](MergeArgs& m) { m.o.seq_stride = 3; });
    refused("o", [](MergeArgs& m) { m.o.seq_stride = 0; });  // rows overlap
    // A product past int64 (strides >= 2^61): it wrapped and passed the overlap check.
    refused("o", [](MergeArgs& m) { m.o.batch_stride = std::int64_t(1) << 61, m.batch = 4; });
    refused("o_a", [](MergeArgs& m) { m.o_a.seq_stride = std::int64_t(1) << 62; });
    // Rows past what the grid's x holds (batch x heads x seqlen near 2^34): the grid was truncated.
    refused("seqlen", [](MergeArgs& m) {
        m.batch = 60000, m.seqlen = 1 << 20;
        m.o_a.seq_stride = m.o_b.seq_stride = m.o.seq_stride = 0, m.o_a.batch_stride = m.o_b.batch_stride = 0;
    });
}
