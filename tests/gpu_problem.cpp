// Placements and problems of the GPU harness (gpu_harness.hpp), on the host and on the device.
#include <algorithm>
#include <cstdlib>
#include <random>

#include "api/runtime_internal.hpp"
#include "gpu_harness.hpp"

namespace rtattn::test::gpu {

const char* test_arch() {
    const char* a = std::getenv("RTATTN_TEST_ARCH");
    return a && *a ? a : nullptr;
}

// Asks the device even without a pin: that makes its primary context current, which the suites' first
// allocations need.
bool test_arch_runs_here() {
    const auto dev = driver::current_device();
    return !test_arch() || arch_runs_on(test_arch(), dev);
}

const char* to_string(Layout l) {
    switch (l) {
        case Layout::contiguous: return "contiguous";
        case Layout::padded: return "padded";
        case Layout::head_major: return "head-major";
        case Layout::packed_qkv: return "packed-qkv";
        case Layout::shared_kv: return "shared-kv";
        case Layout::shifted: return "shifted";
        case Layout::head_gaps: return "head-gaps";
    }
    return "?";
}

namespace {

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

// NaN gaps after each head where rows stay 16-byte multiples (TMA-addressable): a kernel reading past a head's end
// meets NaN, which must not reach O.
Placement head_gaps(int buffer, Shape sh) {
    const std::int64_t hs = (sh.dim + 7) / 8 * 8 + 8, ss = hs * sh.heads, bs = ss * sh.seqlen;
    return strided(buffer, 0, sh, hs, ss, bs);
}

Placement head_major(int buffer, Shape sh) {
    const std::int64_t ss = sh.dim, hs = ss * sh.seqlen, bs = hs * sh.heads;
    return strided(buffer, 0, sh, hs, ss, bs);
}

}  // namespace

static void place_tensors(Problem& p) {
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
        case Layout::head_gaps:
            p.q = head_gaps(0, qs), p.k = head_gaps(1, ks), p.v = head_gaps(2, vs), p.o = head_gaps(3, os);
            break;
        case Layout::shared_kv: {
            p.q = dense(0, qs), p.o = dense(3, os);
            p.k = dense(1, ks), p.v = dense(2, vs);
            p.k.batch_stride = 0, p.v.batch_stride = 0;
            break;
        }
    }
}

Problem make_problem(const Case& c, std::uint32_t salt) {
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
    if (c.sinks) {
        // Scores here are O(1), so a row's LSE is about log(keys seen): sinks from 2 below that to 2 above.
        std::uniform_real_distribution<float> sink(-2.f, 2.f + std::log(float(c.seqlen_k)));
        for (int h = 0; h < c.heads_q; ++h) p.sinks.push_back(sink(rng));
    }
    if (c.alibi) {
        // BLOOM's slopes for 8 heads run 2^-1 .. 2^-8: drawn in that range (a row's bias spans many keys or few).
        std::uniform_real_distribution<float> log2_slope(-8.f, -1.f);
        const int rows = c.alibi == 2 ? c.batch : 1;
        p.alibi.assign(std::size_t(rows) * std::max<std::int64_t>(p.alibi_stride(), c.heads_q), -1e30f);
        for (int b = 0; b < rows; ++b)
            for (int h = 0; h < c.heads_q; ++h) p.alibi[b * p.alibi_stride() + h] = std::exp2(log2_slope(rng));
    }
    return p;
}

test::ReferenceProblem reference_problem(const Problem& p) {
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
    r.window_left = p.c.window_left, r.window_right = p.c.window_right;
    r.scale = p.c.effective_scale();
    r.sinks.assign(p.sinks.begin(), p.sinks.end());
    r.softcap = p.c.softcap;
    for (int b = 0; !p.alibi.empty() && b < p.c.batch; ++b)
        for (int h = 0; h < p.c.heads_q; ++h) r.alibi.push_back(p.alibi[b * p.alibi_stride() + h]);
    r.q = view(p.q), r.k = view(p.k), r.v = view(p.v);
    return r;
}

test::ReferenceResult reference_for(const Problem& p) { return test::reference_forward(reference_problem(p)); }

DeviceProblem::DeviceProblem(const Problem& p)
    : lse_((p.lse_count() + kGuard) * sizeof(float)), sinks_(std::max<std::size_t>(p.sinks.size(), 1) * 4),
      alibi_(std::max<std::size_t>(p.alibi.size(), 1) * 4) {
    for (const auto& b : p.buffers) buffers_.emplace_back(b.size() * sizeof(std::uint16_t));
}

void DeviceProblem::upload_inputs(const Problem& p) {
    for (std::size_t i = 0; i < buffers_.size(); ++i)
        if (int(i) != p.o.buffer) buffers_[i].upload(p.buffers[i].data(), buffers_[i].bytes());
    if (!p.sinks.empty()) sinks_.upload(p.sinks.data(), p.sinks.size() * 4);
    if (!p.alibi.empty()) alibi_.upload(p.alibi.data(), p.alibi.size() * 4);
}

void DeviceProblem::poison_outputs(const Problem& p) {
    buffers_[p.o.buffer].fill_u16(kPoison16);
    lse_.fill_u32(kPoison32);
}

ForwardArgs DeviceProblem::args(const Problem& p) const {
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
    a.window_size_left = p.c.window_left, a.window_size_right = p.c.window_right;
    if (p.c.sinks) a.sinks = static_cast<const float*>(sinks_.get());
    a.softcap = p.c.softcap;
    if (p.c.alibi)
        a.alibi_slopes = static_cast<const float*>(alibi_.get()), a.alibi_slopes_batch_stride = p.alibi_stride();
    return a;
}

DeviceResult DeviceProblem::download(const Problem& p) const {
    DeviceResult r;
    const auto& ob = buffers_[p.o.buffer];
    r.o_buffer.resize(ob.bytes() / sizeof(std::uint16_t));
    ob.download(r.o_buffer.data(), ob.bytes());
    r.lse.resize(lse_.bytes() / sizeof(float));
    lse_.download(r.lse.data(), lse_.bytes());
    return r;
}

void sync_legacy_stream() {
    driver::check(driver::api().cuStreamSynchronize(CU_STREAM_LEGACY), "cuStreamSynchronize(legacy)");
}

}  // namespace rtattn::test::gpu
