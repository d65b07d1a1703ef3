// The decode kernels on the GPU against the float64 reference, one sequence at a time. Each case: fresh random Q and
// a KV cache whose slots past each sequence's length hold NaN (a kernel that reads past a length poisons its
// result); in paged cases the pages are shuffled over a pool with unused pages (NaN too), and head-major pages are
// tried; O and LSE are poisoned before the launch and must be written everywhere, and nowhere past their guards.
// Split counts from 1 to many, ragged batches with empty and one-token sequences, GQA/MQA, several query tokens
// (causal: speculative decoding), and a CUDA graph captured once and replayed with new lengths. Also the prefill kernel
// against a paged cache (chunked prefill), with dense or packed queries.
// Tagged [gpu]: skipped, visibly, without a GPU.
#include "util/format.hpp"

#include <algorithm>
#include <cstring>
#include <climits>
#include <cstdlib>
#include <functional>
#include <memory>
#include <tuple>
#include <numeric>
#include <random>

#include "gpu_harness.hpp"
#include "testutil.hpp"

using namespace rtattn;
using namespace rtattn::test::gpu;

namespace util = rtattn::util;

namespace {

struct DecodeCase {
    int d_qk = 128, d_v = 128;
    Dtype dtype = Dtype::bf16;
    bool causal = false;
    int heads_q = 8, heads_kv = 2;
    int seqlen_q = 1;                // query tokens per sequence
    std::vector<int> lens;           // keys cached per sequence
    int page_size = 0;               // 0: a dense cache [batch, capacity, heads_kv, d]
    bool head_major = false;         // paged: pages as [heads_kv, page_size, d]
    int num_splits = 0;              // 0: the library's choice
    int extra_capacity = 5;          // seqlen_k = max(lens) + this (dense: the cache's rows; paged: table capacity)
    bool prefill = false;            // the prefill kernel against a paged cache (chunked prefill): any seqlen_q
    std::vector<int> q_lens;         // prefill: queries per sequence, packed (varlen); empty: seqlen_q each
    bool local = false;              // config.local, and the call's window (-1: unbounded)
    int window_left = -1, window_right = -1;
    bool sinks = false;              // config.sinks: each query head's sink logit, drawn with the inputs
    float softcap = 0;               // > 0: config.softcap and the call's cap
    int alibi = 0;                   // config.alibi; slopes 1: [heads_q], 2: [batch, heads_q] rows heads_q + 3 apart
    int append = 0;                  // KV append: the last `append` of each sequence's lens keys come as k_new/v_new
    bool no_workspace = false;       // the call gets no workspace (whatever workspace_bytes() says)
    bool split_rows = false;         // plans with split rows where they fit (RTATTN_ROWS=split), not the table's choice
    int cached(int b) const { return lens[b] - append; }  // seqlens_k: the keys in the cache before the call

    int batch() const { return int(lens.size()); }
    int queries(int b) const { return q_lens.empty() ? seqlen_q : q_lens[b]; }
    int q_row0(int b) const {  // the sequence's first query row: dense [batch, seqlen_q] rows are packed rows too
        int r = 0;
        for (int i = 0; i < b; ++i) r += queries(i);
        return r;
    }
    int total_q() const { return q_row0(batch()); }
    int max_q() const { return q_lens.empty() ? seqlen_q : std::max(1, *std::max_element(q_lens.begin(), q_lens.end())); }
    // LSE index of (sequence b, head h, query s): [batch, heads_q, seqlen_q], or [heads_q, total_q] when packed.
    std::size_t lse_index(int b, int h, int s) const {
        return q_lens.empty() ? (std::size_t(b) * heads_q + h) * seqlen_q + s : std::size_t(h) * total_q() + q_row0(b) + s;
    }
    int seqlen_k() const { return *std::max_element(lens.begin(), lens.end()) + extra_capacity; }
    AttentionConfig config() const {
        AttentionConfig c;
        c.head_dim_qk = d_qk;
        if (d_v != d_qk) c.head_dim_v = d_v;
        c.dtype = dtype;
        c.causal = causal;
        c.num_heads_q = heads_q;
        c.num_heads_kv = heads_kv;
        c.decode = !prefill;
        c.paged_kv = page_size > 0;
        c.varlen = !q_lens.empty();
        c.local = local;
        c.sinks = sinks;
        c.softcap = softcap > 0;
        c.alibi = alibi > 0;
        if (test_arch()) c.arch = test_arch();
        return c;
    }
    std::string describe() const {
        std::string l;
        for (int x : lens) l += util::format("{}{}", l.empty() ? "" : ",", x);
        std::string ql;
        for (int x : q_lens) ql += util::format("{}{}", ql.empty() ? "" : ",", x);
        return util::format("{}d{}{} {} {} h{}:{} q{} lens[{}] {} splits={}", prefill ? "prefill " : "", d_qk,
                            d_v != d_qk ? util::format("/{}", d_v) : "", rtattn::to_string(dtype),
                            causal ? "causal" : "full", heads_q, heads_kv,
                            q_lens.empty() ? std::to_string(seqlen_q) : "[" + ql + "]", l,
                            page_size ? util::format("paged{}{}", page_size, head_major ? "-hm" : "") : "dense",
                            num_splits) +
               (local ? util::format(" window({},{})", window_left, window_right) : "") + (sinks ? " sinks" : "") +
               (softcap > 0 ? util::format(" softcap={}", softcap) : "") +
               (alibi ? alibi == 2 ? " alibi-per-batch" : " alibi" : "") +
               (append ? util::format(" append {}", append) : "") + (no_workspace ? " no workspace" : "") +
               (split_rows ? " split rows" : "");
    }
    std::int64_t alibi_stride() const { return alibi == 2 ? heads_q + 3 : 0; }
    std::uint32_t seed() const {
        std::uint32_t h = 2166136261u;
        for (unsigned char ch : describe()) h = (h ^ ch) * 16777619u;
        return h;
    }
};

constexpr std::uint16_t kNaN16 = test::kPoison16;

// One sequence's keys as the reference reads them (contiguous [len, heads_kv, d]).
struct HostSeq {
    std::vector<std::uint16_t> k, v;
};

struct DecodeProblem {
    DecodeCase c;
    std::vector<std::uint16_t> q;          // [total_q, heads_q, d_qk] (dense: [batch, seqlen_q, ...], the same rows)
    std::vector<std::uint16_t> kc, vc;     // the cache: dense [batch, cap, hkv, d] or pages
    TensorArg k_arg, v_arg;                // strides (ptr filled on the device)
    std::vector<std::int32_t> table;       // paged: [batch, pages_per_seq]
    int pages_per_seq = 0;
    int num_pages = 0;                     // paged: the pool's pages
    std::vector<HostSeq> seqs;
    std::vector<float> sinks;              // sinks cases: [heads_q]
    std::vector<float> alibi;              // ALiBi cases: [heads_q], or [batch, alibi_stride()] (the gaps NaN)
    // Append cases: the new tokens [batch, append, heads_kv, d], and the cache as it must be after the call (kc/vc
    // are as before it: NaN where the new rows go).
    std::vector<std::uint16_t> k_new, v_new, kc_after, vc_after;
};

// Paged: the pages on the device are preceded and followed by this many pages of NaN, so a read outside the pool
// poisons the result (or, with a bad block table, shows that the kernels stayed inside it).
constexpr int kGuardPages = 4;

// Where token j of sequence b, head h, starts in the cache. A block-table entry outside the pool reads its last page
// (the kernels' contract for a bad table; a no-op for the tables make_problem writes).
std::int64_t cache_slot(const DecodeProblem& p, const TensorArg& t, int b, int j, int h) {
    if (p.c.page_size == 0) return b * t.batch_stride + j * t.seq_stride + h * t.head_stride;
    const std::int32_t entry = p.table[std::size_t(b) * p.pages_per_seq + j / p.c.page_size];
    const std::int64_t page = std::uint32_t(entry) < std::uint32_t(p.num_pages) ? entry : p.num_pages - 1;
    return page * t.batch_stride + (j % p.c.page_size) * t.seq_stride + h * t.head_stride;
}

// Each sequence's keys as the reference reads them, from the cache through the block table.
void read_back_seqs(DecodeProblem& p) {
    const DecodeCase& c = p.c;
    p.seqs.resize(c.batch());
    for (int b = 0; b < c.batch(); ++b) {
        HostSeq& s = p.seqs[b];
        s.k.resize(std::size_t(c.lens[b]) * c.heads_kv * c.d_qk);
        s.v.resize(std::size_t(c.lens[b]) * c.heads_kv * c.d_v);
        for (int j = 0; j < c.lens[b]; ++j)
            for (int h = 0; h < c.heads_kv; ++h) {
                std::copy_n(p.kc.begin() + cache_slot(p, p.k_arg, b, j, h), c.d_qk,
                            s.k.begin() + (std::size_t(j) * c.heads_kv + h) * c.d_qk);
                std::copy_n(p.vc.begin() + cache_slot(p, p.v_arg, b, j, h), c.d_v,
                            s.v.begin() + (std::size_t(j) * c.heads_kv + h) * c.d_v);
            }
    }
}

// Writes sequence b's keys into the cache and keeps a contiguous copy for the reference.
DecodeProblem make_problem(const DecodeCase& c, std::mt19937& rng) {
    DecodeProblem p;
    p.c = c;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto rnd = [&] { return test::to_bits(u(rng), c.dtype); };
    const int b_n = c.batch(), hq = c.heads_q, hkv = c.heads_kv, cap = c.seqlen_k();
    p.q.resize(std::size_t(c.total_q()) * hq * c.d_qk);
    for (auto& x : p.q) x = rnd();
    if (c.page_size == 0) {
        p.kc.assign(std::size_t(b_n) * cap * hkv * c.d_qk, kNaN16);
        p.vc.assign(std::size_t(b_n) * cap * hkv * c.d_v, kNaN16);
        auto dense = [&](int d) { return TensorArg{nullptr, std::int64_t(cap) * hkv * d, std::int64_t(hkv) * d, d}; };
        p.k_arg = dense(c.d_qk), p.v_arg = dense(c.d_v);
    } else {
        const int ps = c.page_size;
        p.pages_per_seq = (cap + ps - 1) / ps;
        const int pool = p.num_pages = b_n * p.pages_per_seq + 3;  // unused pages stay NaN
        std::vector<int> order(pool);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        p.table.assign(std::size_t(b_n) * p.pages_per_seq, 0);
        for (std::size_t i = 0; i < p.table.size(); ++i) p.table[i] = order[i];
        p.kc.assign(std::size_t(pool) * ps * hkv * c.d_qk, kNaN16);
        p.vc.assign(std::size_t(pool) * ps * hkv * c.d_v, kNaN16);
        auto paged = [&](int d) {
            const std::int64_t page = std::int64_t(ps) * hkv * d;
            return c.head_major ? TensorArg{nullptr, page, d, std::int64_t(ps) * d}
                                : TensorArg{nullptr, page, std::int64_t(hkv) * d, d};
        };
        p.k_arg = paged(c.d_qk), p.v_arg = paged(c.d_v);
    }
    for (int b = 0; b < b_n; ++b)
        for (int j = 0; j < c.lens[b]; ++j)
            for (int h = 0; h < hkv; ++h) {
                for (int d = 0; d < c.d_qk; ++d) p.kc[cache_slot(p, p.k_arg, b, j, h) + d] = rnd();
                for (int d = 0; d < c.d_v; ++d) p.vc[cache_slot(p, p.v_arg, b, j, h) + d] = rnd();
            }
    read_back_seqs(p);
    if (c.append) {  // the new tokens leave the cache (NaN there until the call writes them) for k_new / v_new
        p.kc_after = p.kc, p.vc_after = p.vc;
        p.k_new.resize(std::size_t(b_n) * c.append * hkv * c.d_qk);
        p.v_new.resize(std::size_t(b_n) * c.append * hkv * c.d_v);
        for (int b = 0; b < b_n; ++b)
            for (int t = 0; t < c.append; ++t)
                for (int h = 0; h < hkv; ++h) {
                    const std::size_t row = (std::size_t(b) * c.append + t) * hkv + h;
                    const std::int64_t ks = cache_slot(p, p.k_arg, b, c.cached(b) + t, h);
                    const std::int64_t vs = cache_slot(p, p.v_arg, b, c.cached(b) + t, h);
                    std::copy_n(p.kc.begin() + ks, c.d_qk, p.k_new.begin() + row * c.d_qk);
                    std::copy_n(p.vc.begin() + vs, c.d_v, p.v_new.begin() + row * c.d_v);
                    std::fill_n(p.kc.begin() + ks, c.d_qk, kNaN16);
                    std::fill_n(p.vc.begin() + vs, c.d_v, kNaN16);
                }
    }
    std::uniform_real_distribution<float> sink(-2.f, 8.f);  // below and above log(keys)
    for (int h = 0; c.sinks && h < c.heads_q; ++h) p.sinks.push_back(sink(rng));
    if (c.alibi) {  // BLOOM's slopes run 2^-1 .. 2^-8 (8 heads): drawn in that range
        std::uniform_real_distribution<float> log2_slope(-8.f, -1.f);
        const int rows = c.alibi == 2 ? b_n : 1;
        p.alibi.assign(std::size_t(rows) * std::max<std::int64_t>(c.alibi_stride(), hq), NAN);
        for (int b = 0; b < rows; ++b)
            for (int h = 0; h < hq; ++h) p.alibi[b * c.alibi_stride() + h] = std::exp2(log2_slope(rng));
    }
    return p;
}

// The float64 result: O [total_q, heads_q, d_v] (dense: [batch, seqlen_q, ...]) and LSE in the call's layout
// (DecodeCase::lse_index; +inf: no key; sinks: the sink).
struct Expected {
    std::vector<double> o, lse;
};

Expected reference(const DecodeProblem& p) {
    const DecodeCase& c = p.c;
    Expected e;
    e.o.assign(std::size_t(c.total_q()) * c.heads_q * c.d_v, 0.0);
    e.lse.assign(std::size_t(c.total_q()) * c.heads_q, INFINITY);
    for (int b = 0; b < c.batch(); ++b) {
        const int nq = c.queries(b);
        if (nq == 0 || (c.lens[b] == 0 && !c.sinks)) continue;
        test::ReferenceProblem r;
        r.dtype = c.dtype, r.batch = 1, r.seqlen_q = nq, r.seqlen_k = c.lens[b];
        r.heads_q = c.heads_q, r.heads_kv = c.heads_kv, r.head_dim_qk = c.d_qk, r.head_dim_v = c.d_v;
        r.causal = c.causal, r.scale = 1.0 / std::sqrt(double(c.d_qk));
        r.window_left = c.window_left, r.window_right = c.window_right;
        r.sinks.assign(p.sinks.begin(), p.sinks.end());
        r.softcap = c.softcap;
        for (int h = 0; c.alibi && h < c.heads_q; ++h) r.alibi.push_back(p.alibi[b * c.alibi_stride() + h]);
        r.q = {p.q.data() + std::size_t(c.q_row0(b)) * c.heads_q * c.d_qk, 0, std::int64_t(c.heads_q) * c.d_qk,
               c.d_qk};
        r.k = {p.seqs[b].k.data(), 0, std::int64_t(c.heads_kv) * c.d_qk, c.d_qk};
        r.v = {p.seqs[b].v.data(), 0, std::int64_t(c.heads_kv) * c.d_v, c.d_v};
        const test::ReferenceResult got = test::reference_forward(r);
        std::copy(got.o.begin(), got.o.end(), e.o.begin() + std::size_t(c.q_row0(b)) * c.heads_q * c.d_v);
        for (int h = 0; h < c.heads_q; ++h)
            for (int s = 0; s < nq; ++s) e.lse[c.lse_index(b, h, s)] = got.lse[got.lse_index(0, h, s)];
    }
    return e;
}

struct DeviceDecode {
    driver::DeviceBuffer q, kc, vc, o, lse, table, lens, ws, cu_q, sinks, alibi, k_new, v_new;
    ForwardArgs args;
};

// Elements of NaN before a paged cache's pool (none for a dense cache).
std::size_t guard_elems(const DecodeProblem& p, const TensorArg& t) {
    return p.c.page_size ? std::size_t(kGuardPages) * t.batch_stride : 0;
}

// The cache on the device: paged pools between NaN guard pages.
void upload_cache(DeviceDecode& d, const DecodeProblem& p) {
    for (auto [buf, host, t] : {std::tuple{&d.kc, &p.kc, &p.k_arg}, std::tuple{&d.vc, &p.vc, &p.v_arg}}) {
        const std::size_t g = guard_elems(p, *t);
        std::vector<std::uint16_t> all(host->size() + 2 * g, kNaN16);
        std::copy(host->begin(), host->end(), all.begin() + g);
        if (buf->bytes() != all.size() * 2) *buf = driver::DeviceBuffer(all.size() * 2);
        buf->upload(all.data(), all.size() * 2);
    }
}

DeviceDecode upload(const DecodeProblem& p, const Kernel& kernel) {
    const DecodeCase& c = p.c;
    DeviceDecode d;
    auto put = [](const auto& host, std::size_t extra = 0) {
        driver::DeviceBuffer buf(std::max<std::size_t>(host.size() * sizeof(host[0]) + extra, 16));
        if (!host.empty()) buf.upload(host.data(), host.size() * sizeof(host[0]));
        return buf;
    };
    std::vector<int> cached(c.batch());
    for (int b = 0; b < c.batch(); ++b) cached[b] = c.cached(b);
    d.q = put(p.q), d.table = put(p.table), d.lens = put(cached), d.sinks = put(p.sinks), d.alibi = put(p.alibi);
    upload_cache(d, p);
    d.o = driver::DeviceBuffer((std::size_t(c.total_q()) * c.heads_q * c.d_v + kGuard) * 2);
    d.lse = driver::DeviceBuffer((std::size_t(c.total_q()) * c.heads_q + kGuard) * 4);
    ForwardArgs& a = d.args;
    a.k = p.k_arg, a.k.ptr = static_cast<const std::uint16_t*>(d.kc.get()) + guard_elems(p, p.k_arg);
    a.v = p.v_arg, a.v.ptr = static_cast<const std::uint16_t*>(d.vc.get()) + guard_elems(p, p.v_arg);
    a.lse = static_cast<float*>(d.lse.get());
    a.batch = c.batch(), a.seqlen_q = c.max_q(), a.seqlen_k = c.seqlen_k();
    if (c.q_lens.empty()) {
        a.q = ForwardArgs::contiguous(d.q.get(), c.seqlen_q, c.heads_q, c.d_qk);
        a.o = ForwardArgs::contiguous(d.o.get(), c.seqlen_q, c.heads_q, c.d_v);
    } else {  // packed queries: sequence b's are rows cu[b] .. cu[b+1]
        std::vector<std::int32_t> cu(c.batch() + 1);
        for (int b = 0; b <= c.batch(); ++b) cu[b] = c.q_row0(b);
        d.cu_q = put(cu);
        a.q = ForwardArgs::packed(d.q.get(), c.heads_q, c.d_qk);
        a.o = ForwardArgs::packed(d.o.get(), c.heads_q, c.d_v);
        a.cu_seqlens_q = static_cast<const std::int32_t*>(d.cu_q.get());
        a.total_q = c.total_q();
    }
    a.seqlens_k = static_cast<const std::int32_t*>(d.lens.get());
    if (c.page_size) {
        a.block_table = static_cast<const std::int32_t*>(d.table.get());
        a.block_table_stride = a.pages_per_seq = p.pages_per_seq;
        a.page_size = c.page_size;
        a.num_pages = p.num_pages;
    }
    a.num_splits = c.num_splits;
    a.window_size_left = c.window_left, a.window_size_right = c.window_right;
    if (c.sinks) a.sinks = static_cast<const float*>(d.sinks.get());
    a.softcap = c.softcap;
    if (c.alibi)
        a.alibi_slopes = static_cast<const float*>(d.alibi.get()), a.alibi_slopes_batch_stride = c.alibi_stride();
    if (c.append) {
        d.k_new = put(p.k_new), d.v_new = put(p.v_new);
        a.k_new = ForwardArgs::contiguous(d.k_new.get(), c.append, c.heads_kv, c.d_qk);
        a.v_new = ForwardArgs::contiguous(d.v_new.get(), c.append, c.heads_kv, c.d_v);
        a.seqlen_new = c.append;
    }
    const std::size_t ws = kernel.workspace_bytes(a.batch, a.seqlen_q, a.seqlen_k, a.num_splits);
    d.ws = driver::DeviceBuffer(std::max<std::size_t>(ws, 256));
    if (!c.no_workspace) a.workspace = d.ws.get(), a.workspace_bytes = ws;
    return d;
}

// Errors of one run, judged as the forward suite judges.
std::string judge(const DecodeProblem& p, const DeviceDecode& d, const Expected& e) {
    const DecodeCase& c = p.c;
    std::vector<std::uint16_t> o(e.o.size() + kGuard);
    std::vector<float> lse(e.lse.size() + kGuard);
    d.o.download(o.data(), o.size() * 2);
    d.lse.download(lse.data(), lse.size() * 4);
    std::vector<double> got_o(e.o.size()), got_lse, ref_lse;
    std::size_t unwritten = 0, stray = 0, empty_bad = 0;
    for (std::size_t i = 0; i < e.o.size(); ++i) {
        unwritten += o[i] == test::kPoison16;
        got_o[i] = test::from_bits(o[i], c.dtype);
    }
    for (std::size_t i = e.o.size(); i < o.size(); ++i) stray += o[i] != test::kPoison16;
    for (std::size_t i = 0; i < e.lse.size(); ++i) {
        if (std::isinf(e.lse[i])) {  // no key: O row zero, LSE +inf
            empty_bad += !(std::isinf(lse[i]) && lse[i] > 0);
            continue;
        }
        got_lse.push_back(lse[i]), ref_lse.push_back(e.lse[i]);
    }
    for (std::size_t i = e.lse.size(); i < lse.size(); ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, &lse[i], 4);
        stray += bits != test::kPoison32;
    }
    const double o_err = test::rel_frobenius(got_o, e.o);
    const double lse_err = test::rel_frobenius_floor1(got_lse, ref_lse);
    std::string why;
    if (!(o_err <= o_tolerance(c.dtype))) why += util::format(" O error {:.3g} > {:.3g};", o_err, o_tolerance(c.dtype));
    if (!(lse_err <= kLseTolerance)) why += util::format(" LSE error {:.3g} > {:.3g};", lse_err, kLseTolerance);
    if (unwritten) why += util::format(" {} O elements unwritten;", unwritten);
    if (stray) why += util::format(" {} guard elements changed;", stray);
    if (empty_bad) why += util::format(" {} keyless rows without LSE +inf;", empty_bad);
    if (c.append) {  // the new rows where they belong, guards and every other slot untouched
        for (auto [buf, want, t, name] : {std::tuple{&d.kc, &p.kc_after, &p.k_arg, "K"},
                                          std::tuple{&d.vc, &p.vc_after, &p.v_arg, "V"}}) {
            const std::size_t g = guard_elems(p, *t);
            std::vector<std::uint16_t> got(want->size() + 2 * g);
            buf->download(got.data(), got.size() * 2);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < got.size(); ++i)
                wrong += got[i] != (i < g || i >= g + want->size() ? kNaN16 : (*want)[i - g]);
            if (wrong) why += util::format(" {} {} cache elements not as appended;", wrong, name);
        }
    }
    UNSCOPED_INFO(c.describe() << ": O error " << o_err << ", LSE error " << lse_err);
    return why;
}

void poison(DeviceDecode& d) {
    d.o.fill_u16(test::kPoison16);
    d.lse.fill_u32(test::kPoison32);
    d.ws.fill_u32(0x7fc00000u);  // partial results must be written before the combine reads them
}

// A runtime whose plans take split rows wherever they fit: RTATTN_ROWS, read when a runtime is made (a paged cache's
// prefill on sm_90a takes shifted rows by itself).
Runtime& split_rows_runtime() {
    static test::TempDir dir{"rtattn-gpu-split-rows"};
    static const std::unique_ptr<Runtime> rt = [] {
        RuntimeOptions o;
        o.cache_dir = dir.str();
        setenv("RTATTN_ROWS", "split", 1);
        auto r = std::make_unique<Runtime>(o);
        unsetenv("RTATTN_ROWS");
        return r;
    }();
    return *rt;
}

// One problem's run, judged against the float64 reference.
void run_problem(const DecodeProblem& p) {
    const DecodeCase& c = p.c;
    const Kernel kernel = (c.split_rows ? split_rows_runtime() : runtime()).get(c.config());
    DeviceDecode d = upload(p, kernel);
    poison(d);
    sync_legacy_stream();
    kernel.forward(d.args);
    sync_legacy_stream();
    const std::string why = judge(p, d, reference(p));
    INFO(c.describe() << " (" << kernel.num_splits(c.batch(), c.seqlen_q, c.seqlen_k(), c.num_splits)
                      << " splits)");
    CHECK(why.empty());
    if (!why.empty()) FAIL_CHECK(why);
}

void run_case(const DecodeCase& c) {
    std::mt19937 rng(c.seed());
    run_problem(make_problem(c, rng));
}

std::vector<int> ragged(std::mt19937& rng, int n, int max_len) {
    std::uniform_int_distribution<int> len(1, max_len);
    std::vector<int> v(n);
    for (int& x : v) x = len(rng);
    return v;
}

}  // namespace

TEST_CASE("decode: head dims, dense and paged, one query token", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(7);
    for (int d : {1, 64, 80, 100, 128, 132, 192, 256})
        for (int ps : {0, 16}) {
            DecodeCase c;
            c.d_qk = c.d_v = d;
            c.lens = ragged(rng, 3, 700);
            c.page_size = ps;
            run_case(c);
        }
}

TEST_CASE("decode: page sizes, head-major pages, splits", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    for (int ps : {1, 2, 16, 64, 256})
        for (int splits : {0, 1, 3, 17}) {
            DecodeCase c;
            c.lens = {1000, 1, 333, 64};
            c.page_size = ps;
            c.head_major = ps == 64;
            c.num_splits = splits;
            run_case(c);
        }
}

TEST_CASE("decode: ragged batches with empty and one-key sequences, GQA and MQA", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    for (auto [hq, hkv] : {std::pair{8, 8}, {32, 8}, {16, 1}, {12, 4}})
        for (Dtype dt : {Dtype::bf16, Dtype::fp16}) {
            DecodeCase c;
            c.heads_q = hq, c.heads_kv = hkv, c.dtype = dt;
            c.lens = {0, 1, 2, 65, 4096, 0, 513};
            c.page_size = hq == 32 ? 16 : 0;
            run_case(c);
        }
}

TEST_CASE("decode: several query tokens (speculative decoding), causal or not", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    for (int sq : {2, 4, 7, 16})
        for (bool causal : {false, true}) {
            DecodeCase c;
            c.heads_q = 32, c.heads_kv = 8;
            c.seqlen_q = sq, c.causal = causal;
            c.lens = {3, 17, 900, 2000};  // 3 < 7, 16: some rows see no key when causal
            c.page_size = 16;
            c.num_splits = sq == 4 ? 5 : 0;
            run_case(c);
        }
    DecodeCase wide;  // d_qk != d_v, MQA, 16 tokens x 16 heads = 256 rows over several row blocks
    wide.d_qk = 192, wide.d_v = 128, wide.heads_q = 16, wide.heads_kv = 1, wide.seqlen_q = 16, wide.causal = true;
    wide.lens = {40, 300};
    run_case(wide);
}

TEST_CASE("paged prefill (chunked prefill): query chunks against a paged cache, dense and packed queries",
          "[gpu][decode][paged]") {
    SKIP_WITHOUT_GPU();
    std::mt19937 rng(23);
    for (int d : {64, 100, 128, 132, 256})
        for (int ps : {1, 16, 64, 256}) {
            DecodeCase c;
            c.prefill = true;
            c.d_qk = c.d_v = d;
            c.dtype = d == 100 ? Dtype::fp16 : Dtype::bf16;
            c.page_size = ps;
            c.head_major = ps == 64;
            c.causal = ps != 256;
            c.seqlen_q = ps == 1 ? 37 : 130;  // the chunk: the last seqlen_q of each sequence's cached keys
            c.lens = {700, 129, 2000, 0};      // 129 < 130: the chunk's first row sees no key when causal
            run_case(c);
        }
    for (bool causal : {true, false}) {
        DecodeCase c;  // packed chunks of different lengths (varlen queries), GQA, a sequence without queries
        c.prefill = true, c.causal = causal;
        c.heads_q = 12, c.heads_kv = 4;
        c.page_size = 16;
        c.q_lens = {300, 1, 0, 64};
        c.lens = {1000, 1, 77, 64};
        run_case(c);
    }
}

TEST_CASE("paged prefill on sm_90a: every producer of the warp-specialized kernel, pages below, at and above a tile",
          "[gpu][decode][paged]") {
    SKIP_WITHOUT_GPU();
    // d64 (three consumer warpgroups), d128, d132, d36 and d140 (shifted rows), d140 with split rows too (tails
    // loaded per row through the table), d192 (112-key tiles: boxes of 16 rows at most), d256 (64-key tiles), d253
    // (shifted rows in 272 columns, 32-key tiles). Pages of 1, 2 and 4 rows load with cp.async (a lookup round per 32
    // rows), 8..1024 by TMA in boxes of a page or of the tile's largest power-of-two part. Lengths end inside pages
    // and tiles; the pool's other slots hold NaN (make_problem), so a box that brought a slot past a length into PV,
    // or a box issued past the sequence's pages, shows. (On other arches these run the mma.sync kernel, as before.)
    for (int d : {36, 64, 128, 132, 140, -140, 192, 256, 253})
        for (int ps : {1, 2, 4, 8, 32, 128, 1024}) {
            DecodeCase c;
            c.prefill = true;
            c.split_rows = d < 0, d = std::abs(d);
            c.d_qk = c.d_v = d;
            if (d == 253) c.heads_q = c.heads_kv = 8;  // packed rows of 16-byte multiples: shifted rows
            c.dtype = d % 3 == 0 ? Dtype::fp16 : Dtype::bf16;
            c.page_size = ps;
            c.head_major = ps == 32 || (ps == 8 && d % 8 == 0);  // d of 8s: maps with the seq dim first
            c.causal = ps != 128;
            c.seqlen_q = 77;
            c.lens = {700, 77, 1500, 8, 129};  // 8: keys fewer than the queries (their first rows see none, causal)
            run_case(c);
        }
    for (int d : {64, 140}) {  // packed queries, GQA, a sequence without queries or keys
        DecodeCase c;
        c.prefill = true, c.causal = true, c.d_qk = c.d_v = d;
        c.heads_q = 12, c.heads_kv = 4;
        c.page_size = 64;
        c.q_lens = {300, 1, 0, 64, 200};
        c.lens = {1000, 1, 0, 64, 333};
        run_case(c);
    }
}

TEST_CASE("KV append: new tokens written into a dense or paged cache, then attended, decode and prefill",
          "[gpu][decode][append]") {
    SKIP_WITHOUT_GPU();
    struct Row {
        bool prefill;
        int page_size, seqlen_q, append, d;
        bool causal;
    };
    for (const Row r : {Row{false, 0, 1, 1, 128, false},  // a decode step
                        Row{false, 16, 1, 1, 64, false},
                        Row{false, 16, 4, 4, 128, true},  // speculative: the drafted tokens' K/V with them
                        Row{false, 0, 3, 3, 132, true},   // rows of 4 mod 8
                        Row{false, 1, 2, 5, 80, true},    // more new keys than queries
                        Row{true, 16, 37, 37, 128, true}, // chunked prefill, paged
                        Row{true, 0, 37, 37, 128, true},  // chunked prefill, dense
                        Row{true, 0, 100, 20, 132, false},
                        Row{true, 64, 50, 50, 256, true}}) {
        DecodeCase c;
        c.prefill = r.prefill, c.page_size = r.page_size, c.seqlen_q = r.seqlen_q, c.append = r.append;
        c.d_qk = c.d_v = r.d, c.causal = r.causal;
        c.heads_q = 12, c.heads_kv = r.d == 132 ? 3 : 4;
        c.lens = {r.append, 700, 2000 + r.append, 65};  // the first sequence: nothing cached before the call
        run_case(c);
    }
}

TEST_CASE("a prefill config's few-query calls run its decode kernels: caches, masks, append, no workspace",
          "[gpu][decode][route]") {
    SKIP_WITHOUT_GPU();
    struct Row {
        int page_size, seqlen_q, d;
        bool causal, local;
        int append;
    };
    for (const Row r : {Row{0, 1, 128, false, false, 0},  // a decode step through the plain forward
                        Row{0, 16, 64, true, false, 0},   // the most queries routed
                        Row{16, 4, 132, true, false, 4},  // paged prefill config, speculative tokens appended
                        Row{0, 2, 256, false, true, 0}})  // a sliding window
        for (bool no_workspace : {false, true}) {
            DecodeCase c;
            c.prefill = true;  // a prefill config (dense, or paged prefill)
            c.page_size = r.page_size, c.seqlen_q = r.seqlen_q, c.d_qk = c.d_v = r.d;
            c.causal = r.causal, c.append = r.append;
            c.local = r.local, c.window_left = r.local ? 700 : -1, c.window_right = r.local ? 0 : -1;
            c.heads_q = 12, c.heads_kv = r.d == 132 ? 3 : 4;
            c.lens = {4000, 2048, 3000 + r.append, 5 + r.append};
            c.no_workspace = no_workspace;  // then the prefill kernel, unless the decode kernels need none
            const Kernel k = runtime().get(c.config());
            // The split count a prefill kernel reports is the decode kernels' (its own is 1): few sequences against
            // thousands of keys split many ways; 17 queries, or fewer than 2048 keys, stay with the prefill kernel.
            CHECK(k.num_splits(c.batch(), c.seqlen_q, c.seqlen_k()) > 1);
            CHECK(k.workspace_bytes(c.batch(), c.seqlen_q, c.seqlen_k()) > 0);
            CHECK(k.num_splits(c.batch(), 17, c.seqlen_k()) == 1);
            CHECK(k.workspace_bytes(c.batch(), c.seqlen_q, 2047) == 0);
            run_case(c);
        }
}

TEST_CASE("a dense cache's prefill (more than 16 queries): each sequence's own length, every head dim's family",
          "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    for (int d : {64, 100, 128, 132, 256})
        for (bool causal : {false, true}) {
            DecodeCase c;
            c.prefill = true;  // a dense prefill config given seqlens_k
            c.d_qk = c.d_v = d, c.causal = causal;
            c.heads_q = 8, c.heads_kv = 2;
            c.seqlen_q = 70;
            c.lens = {1000, 0, 69, 333, 2048};  // NaN past each length: a key read past it would show
            c.extra_capacity = 200;
            run_case(c);
        }
}

TEST_CASE("decode and paged prefill: pages of up to 65536 tokens", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    for (int ps : {512, 1024, 4096, 65536})  // 65536: the limit, the page stride's largest shift
        for (bool prefill : {false, true}) {
            if (ps == 65536 && prefill) continue;  // a 32 MB page per sequence: decode shows the addressing
            DecodeCase c;
            c.prefill = prefill, c.page_size = ps, c.causal = prefill;
            c.seqlen_q = prefill ? 40 : 1;
            c.lens = {5000, 1, 1024, 1025};
            run_case(c);
        }
}

TEST_CASE("decode: head dims of 4 mod 8 as rotated 16-byte rows, and strides that rule the rotation out",
          "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    // 3 KV heads: even heads' rows start 16-byte aligned, odd ones 8 bytes past (rotations 0 and 4); d_qk != d_v
    // rotate apart; head-major pages (a token stride of d, 4 mod 8) keep the 8-byte path; splits merge rotated O.
    for (auto [dq, dv] : {std::pair{132, 132}, {100, 132}, {36, 12}})
        for (int ps : {0, 16, 64}) {
            DecodeCase c;
            c.d_qk = dq, c.d_v = dv;
            c.heads_q = 6, c.heads_kv = 3;
            c.lens = {1000, 7, 300};
            c.page_size = ps;
            c.head_major = ps == 64;
            c.num_splits = ps == 16 ? 3 : 0;
            run_case(c);
        }
}

TEST_CASE("decode: head dims of 4 mod 8 whose rows alternate rotation key by key", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    // An odd count of kv heads at d132 (MQA included) puts the token stride 8 bytes past a 16-byte multiple, so rows
    // alternate between rotations 0 and 4: the kernel keeps even and odd keys apart (rotation 2). Against it: two kv
    // heads (every row alike: rotation 1), one-key head-major pages of a page stride of 0 mod 8 (each page starts
    // alike: rotation 1), one-key pages of a stride of 4 mod 8 (unlike: 8-byte vectors), head-major pages of two kv
    // heads (rows alternate, but the kernel, planned for packed rows of two heads, is not built for it: 8-byte
    // vectors), odd capacities (a dense batch stride of 4 mod 8: each sequence starts
    // at its own rotation), causal query tokens whose limits fall on either parity, splits, and rows cut mid-tile.
    struct Shape {
        int hq, hkv, ps, sq, splits;
        bool causal, head_major;
    };
    for (const Shape& sh :
         {Shape{16, 1, 0, 1, 0, false, false}, Shape{16, 1, 16, 1, 4, false, false}, Shape{6, 3, 2, 1, 0, false, false},
          Shape{6, 3, 1, 1, 0, false, false}, Shape{4, 2, 1, 1, 0, false, true}, Shape{4, 2, 16, 1, 0, false, true}, Shape{10, 5, 0, 4, 3, true, false},
          Shape{8, 2, 0, 1, 0, false, false}, Shape{24, 3, 16, 7, 0, true, false}, Shape{15, 3, 64, 2, 2, true, true}})
        for (auto [dq, dv] : {std::pair{132, 132}, {100, 132}, {132, 36}}) {
            DecodeCase c;
            c.d_qk = dq, c.d_v = dv;
            c.heads_q = sh.hq, c.heads_kv = sh.hkv;
            c.seqlen_q = sh.sq, c.causal = sh.causal;
            c.page_size = sh.ps, c.head_major = sh.head_major;
            c.num_splits = sh.splits;
            c.lens = {999, 1, 64, 130, 65};  // dense capacity 1004 or 1005 by the extra rows below
            c.extra_capacity = sh.hkv % 2 ? 6 : 5;
            run_case(c);
        }
}

TEST_CASE("decode and paged prefill with sliding windows: shorter and longer than a page, splits",
          "[gpu][decode][local]") {
    SKIP_WITHOUT_GPU();
    // Windows of 0, 1, unaligned, past the page and past the sequence; several query tokens (each its own window);
    // the library's splits and fixed ones (splits cut the window's tiles, not the sequence's); rows alternating
    // rotation by key parity (d132, one kv head); paged caches whose pages the window starts inside.
    struct Shape {
        int d, hq, hkv, sq, ps, splits, left, right;
        bool causal;
    };
    for (const Shape& sh : {Shape{128, 8, 2, 1, 0, 0, 0, -1, true}, Shape{128, 8, 2, 1, 16, 0, 1, -1, true},
                            Shape{128, 8, 2, 4, 16, 3, 100, 0, true}, Shape{64, 8, 1, 1, 64, 0, 128, -1, true},
                            Shape{64, 8, 1, 7, 0, 5, 300, 2, false}, Shape{132, 16, 1, 1, 0, 0, 77, -1, true},
                            Shape{132, 16, 1, 3, 16, 2, 33, 1, false}, Shape{256, 8, 2, 2, 1, 0, 5000, -1, true},
                            Shape{100, 6, 3, 16, 32, 0, 40, 5, false}, Shape{128, 8, 2, 1, 256, 4, -1, -1, true}}) {
        DecodeCase c;
        c.d_qk = c.d_v = sh.d;
        c.heads_q = sh.hq, c.heads_kv = sh.hkv, c.seqlen_q = sh.sq, c.causal = sh.causal;
        c.page_size = sh.ps, c.num_splits = sh.splits;
        c.local = true, c.window_left = sh.left, c.window_right = sh.right;
        c.lens = {2000, 3, 129, 0, 700};
        run_case(c);
    }
    for (bool causal : {true, false}) {  // the prefill kernel against a paged cache, packed query chunks
        DecodeCase c;
        c.prefill = true, c.causal = causal, c.page_size = 16;
        c.q_lens = {40, 1, 0, 130};
        c.lens = {700, 129, 50, 2000};
        c.local = true, c.window_left = 90, c.window_right = causal ? 0 : 7;
        run_case(c);
    }
}

// The prefill kernel against a paged cache (chunked prefill), causal: packed query chunks, one empty and one of a
// single token, a chunk longer than its sequence's keys.
DecodeCase chunked_prefill() {
    DecodeCase c;
    c.prefill = true, c.causal = true, c.page_size = 16;
    c.q_lens = {40, 1, 0, 130};
    c.lens = {700, 129, 50, 2000};
    return c;
}

TEST_CASE("decode and paged prefill with attention sinks: splits joined in the combine, empty caches",
          "[gpu][decode][sinks]") {
    SKIP_WITHOUT_GPU();
    // One split (the sink joins in the kernel's epilogue) and several (in the combine); an empty cache (every row the
    // sink alone); dense and paged caches, several query tokens, a window, rows rotated by key parity (d132).
    struct Shape {
        int d, hq, hkv, sq, ps, splits;
        bool causal, local;
    };
    for (const Shape& sh : {Shape{128, 8, 2, 1, 0, 1, true, false}, Shape{128, 8, 2, 1, 16, 0, true, false},
                            Shape{128, 8, 2, 4, 16, 5, true, true}, Shape{64, 64, 8, 1, 64, 0, false, false},
                            Shape{132, 16, 1, 3, 0, 2, true, false}, Shape{256, 8, 1, 2, 1, 0, false, true}}) {
        DecodeCase c;
        c.d_qk = c.d_v = sh.d;
        c.heads_q = sh.hq, c.heads_kv = sh.hkv, c.seqlen_q = sh.sq, c.causal = sh.causal;
        c.page_size = sh.ps, c.num_splits = sh.splits;
        c.sinks = true;
        if (sh.local) c.local = true, c.window_left = 150, c.window_right = sh.causal ? -1 : 3;
        c.lens = {2000, 3, 129, 0, 700};
        run_case(c);
    }
    DecodeCase c = chunked_prefill();
    c.sinks = true;
    run_case(c);
}

TEST_CASE("decode and paged prefill with softcapping: splits, pages, windows, sinks", "[gpu][decode][softcap]") {
    SKIP_WITHOUT_GPU();
    struct Shape {
        int d, hq, hkv, sq, ps, splits;
        bool causal, local, sinks;
        float cap;
    };
    for (const Shape& sh : {Shape{128, 8, 2, 1, 0, 1, true, false, false, 0.5f},
                            Shape{128, 8, 2, 1, 16, 0, true, false, true, 1.f},
                            Shape{64, 64, 8, 1, 64, 0, false, false, false, 0.3f},
                            Shape{132, 16, 1, 3, 0, 2, true, true, false, 2.f},
                            Shape{256, 8, 1, 2, 16, 5, false, false, false, 0.5f}}) {
        DecodeCase c;
        c.d_qk = c.d_v = sh.d;
        c.heads_q = sh.hq, c.heads_kv = sh.hkv, c.seqlen_q = sh.sq, c.causal = sh.causal;
        c.page_size = sh.ps, c.num_splits = sh.splits;
        c.sinks = sh.sinks, c.softcap = sh.cap;
        if (sh.local) c.local = true, c.window_left = 150, c.window_right = sh.causal ? -1 : 3;
        c.lens = {2000, 3, 129, 0, 700};
        run_case(c);
    }
    DecodeCase c = chunked_prefill();
    c.softcap = 1.f;
    run_case(c);
}

TEST_CASE("decode and paged prefill with ALiBi: per-head and per-sequence slopes, splits, parity rows, caps, windows",
          "[gpu][decode][alibi]") {
    SKIP_WITHOUT_GPU();
    // Packed rows mix the group's heads (each row its own slope) and tokens (each its own position, non-causal tokens
    // seeing keys past it); groups smaller than the row block (rows past it read no slope); rows by key parity (d132,
    // one kv head: a slot is every other key); splits, pages, one-key pages; with a cap, a window and sinks.
    struct Shape {
        int d, hq, hkv, sq, ps, splits, alibi;
        bool causal, local, sinks;
        float cap;
    };
    for (const Shape& sh : {Shape{128, 8, 2, 1, 0, 1, 1, true, false, false, 0.f},
                            Shape{128, 32, 8, 1, 16, 0, 2, true, false, false, 0.f},
                            Shape{128, 8, 2, 4, 16, 3, 1, false, false, false, 0.f},
                            Shape{64, 6, 3, 1, 64, 0, 2, false, false, true, 0.f},
                            Shape{132, 16, 1, 3, 0, 2, 1, true, false, false, 0.f},
                            Shape{132, 16, 1, 2, 0, 0, 2, false, false, false, 0.f},
                            Shape{100, 12, 4, 5, 1, 0, 1, true, true, false, 1.f},
                            Shape{256, 8, 1, 2, 16, 5, 2, true, false, false, 0.5f},
                            Shape{80, 4, 4, 16, 0, 0, 1, false, false, false, 0.f}}) {
        DecodeCase c;
        c.d_qk = c.d_v = sh.d;
        c.heads_q = sh.hq, c.heads_kv = sh.hkv, c.seqlen_q = sh.sq, c.causal = sh.causal;
        c.page_size = sh.ps, c.num_splits = sh.splits;
        c.alibi = sh.alibi, c.sinks = sh.sinks, c.softcap = sh.cap;
        if (sh.local) c.local = true, c.window_left = 150, c.window_right = sh.causal ? -1 : 3;
        c.lens = {2000, 3, 129, 0, 700};
        run_case(c);
    }
    DecodeCase c = chunked_prefill();
    c.alibi = 2;
    run_case(c);
}

TEST_CASE("decode: long sequences split many ways", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    DecodeCase c;
    c.heads_q = 8, c.heads_kv = 1;
    c.lens = {40000};
    c.page_size = 16;
    run_case(c);  // the library's choice: many splits for one sequence
    c.num_splits = 128;
    run_case(c);
}

TEST_CASE("decode: a CUDA graph captured once replays with new lengths", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    DecodeCase c;
    c.heads_q = 32, c.heads_kv = 8;
    c.lens = {100, 2000, 7};
    c.extra_capacity = 3000;  // room to grow: seqlen_k, hence the split count, stays fixed
    c.page_size = 16;
    std::mt19937 rng(c.seed());
    DecodeProblem p = make_problem(c, rng);
    const Kernel kernel = runtime().get(c.config());
    DeviceDecode d = upload(p, kernel);
    const auto& api = driver::api();
    driver::Stream s;
    CUgraph g = nullptr;
    CUgraphExec exec = nullptr;
    driver::check(api.cuStreamBeginCapture(s.get(), CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    try {
        kernel.forward(d.args, s.get());
    } catch (...) {
        api.cuStreamEndCapture(s.get(), &g);
        throw;
    }
    driver::check(api.cuStreamEndCapture(s.get(), &g), "cuStreamEndCapture");
    driver::check(api.cuGraphInstantiate(&exec, g, 0), "cuGraphInstantiate");
    // Replay twice: as captured, then after the engine appended tokens (new lengths on the device, same buffers).
    for (const std::vector<int>& lens : {c.lens, std::vector<int>{4000, 2001, 0}}) {
        DecodeCase now = c;
        now.lens = lens;
        now.extra_capacity = c.seqlen_k() - *std::max_element(lens.begin(), lens.end());
        std::mt19937 rng2(now.seed());
        const DecodeProblem q = make_problem(now, rng2);  // same shapes and table size: seqlen_k is unchanged
        REQUIRE(q.kc.size() == p.kc.size());
        REQUIRE(now.seqlen_k() <= c.seqlen_k());
        d.q.upload(q.q.data(), q.q.size() * 2);
        upload_cache(d, q);
        d.table.upload(q.table.data(), q.table.size() * 4);
        d.lens.upload(lens.data(), lens.size() * 4);
        poison(d);
        sync_legacy_stream();
        driver::check(api.cuGraphLaunch(exec, s.get()), "cuGraphLaunch");
        s.sync();
        const std::string why = judge(q, d, reference(q));
        CHECK(why.empty());
        if (!why.empty()) FAIL_CHECK(why);
    }
    api.cuGraphExecDestroy(exec);
    api.cuGraphDestroy(g);
}

TEST_CASE("paged: block-table entries outside the pool read its last page, never memory outside the cache",
          "[gpu][decode][paged]") {
    SKIP_WITHOUT_GPU();
    // Entries of num_pages, -1, 2^30 and INT_MIN (2^30 faulted the context before the kernels knew the pool's size).
    // Every pool slot holds finite values here and the guard pages around the pool NaN: a read outside it would
    // poison the row, and the rows must match the reference that reads the last page for each bad entry.
    for (bool prefill : {false, true})
        for (int ps : {1, 16}) {
            DecodeCase c;
            c.prefill = prefill, c.causal = prefill, c.seqlen_q = prefill ? 40 : 1;
            c.page_size = ps;
            c.lens = {300, 200, 100, 50, 260};
            std::mt19937 rng(c.seed());
            DecodeProblem p = make_problem(c, rng);
            std::uniform_real_distribution<float> u(-1.f, 1.f);
            for (auto* cache : {&p.kc, &p.vc})
                for (auto& x : *cache)
                    if (x == kNaN16) x = test::to_bits(u(rng), c.dtype);
            const std::int32_t bad[] = {p.num_pages, -1, 1 << 30, INT_MIN};
            for (int b = 0; b < 4; ++b) p.table[std::size_t(b) * p.pages_per_seq + b % 2] = bad[b];
            read_back_seqs(p);
            run_problem(p);
        }
}

TEST_CASE("decode: num_pages is required, and the sizes queries refuse what forward refuses", "[gpu][decode]") {
    SKIP_WITHOUT_GPU();
    DecodeCase c;
    c.lens = {100, 20};
    c.page_size = 16;
    std::mt19937 rng(c.seed());
    const DecodeProblem p = make_problem(c, rng);
    const Kernel kernel = runtime().get(c.config());
    DeviceDecode d = upload(p, kernel);
    auto refused = [](const char* field, auto&& call) {
        try {
            call();
            FAIL("accepted a bad " << field);
        } catch (const ArgumentError& e) {
            CHECK(e.field() == field);
        }
    };
    ForwardArgs a = d.args;
    a.num_pages = 0;
    refused("num_pages", [&] { kernel.forward(a); });
    // Split counts: forward, workspace_bytes and num_splits agree (a count past the limit wrapped a size before).
    for (int splits : {-1, 129, 1 << 30}) {
        a = d.args;
        a.num_splits = splits;
        refused("num_splits", [&] { kernel.forward(a); });
        refused("num_splits", [&] { (void)kernel.workspace_bytes(2, 1, c.seqlen_k(), splits); });
        refused("num_splits", [&] { (void)kernel.num_splits(2, 1, c.seqlen_k(), splits); });
    }
    refused("seqlen_q", [&] { (void)kernel.workspace_bytes(2, 17, c.seqlen_k(), 0); });
    refused("seqlen_k", [&] { (void)kernel.workspace_bytes(2, 1, (1 << 30) + 1, 0); });
    // A paged prefill takes num_splits 1 as "no split", as FlashAttention's callers pass it.
    DecodeCase pc = c;
    pc.prefill = true, pc.seqlen_q = 20;
    std::mt19937 rng2(pc.seed());
    const DecodeProblem pp = make_problem(pc, rng2);
    const Kernel prefill = runtime().get(pc.config());
    DeviceDecode pd = upload(pp, prefill);
    pd.args.num_splits = 1;
    poison(pd);
    sync_legacy_stream();
    prefill.forward(pd.args);
    sync_legacy_stream();
    CHECK(judge(pp, pd, reference(pp)).empty());
    pd.args.num_splits = 2;
    refused("num_splits", [&] { prefill.forward(pd.args); });
    CHECK(prefill.workspace_bytes(2, 20, pc.seqlen_k(), 1) == 0);
    refused("num_splits", [&] { (void)prefill.workspace_bytes(2, 20, pc.seqlen_k(), 2); });
}
