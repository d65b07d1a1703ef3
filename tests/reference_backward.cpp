#include "reference_backward.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

namespace rtattn::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs body(item) for item in [0, items) over `threads` threads (the caller's included).
void parallel_for(long long items, int threads, const std::function<void(long long)>& body) {
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    threads = int(std::max<long long>(1, std::min<long long>(threads, items)));
    std::atomic<long long> next{0};
    auto worker = [&] {
        for (long long it; (it = next.fetch_add(1)) < items;) body(it);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
}

double dot(const double* a, const double* b, int n) {
    double s = 0;
    for (int d = 0; d < n; ++d) s += a[d] * b[d];
    return s;
}

// Per (batch, query head, row): the row's log-sum-exp of the scaled scores (+inf when it sees no key) and
// D = sum_j P_ij dP_ij = dO_i . O_i.
struct RowStats {
    std::vector<double> lse, delta;
    std::size_t at(const DenseProblem& p, int b, int h, int i) const {
        return (std::size_t(b) * p.heads_q + h) * p.seqlen_q + i;
    }
};

// ALiBi's bias of query i and key j in sequence b, head h: -slope * |j - (i + seqlen_k - seqlen_q)|; 0 without.
double alibi_bias(const DenseProblem& p, int b, int h, int i, int j) {
    if (p.alibi.empty()) return 0.0;
    return -p.alibi[std::size_t(b) * p.heads_q + h] * std::abs(double(j) - (i + p.seqlen_k - p.seqlen_q));
}

double score(const DenseProblem& p, int b, int h, int i, int j) {
    const int kvh = h / (p.heads_q / p.heads_kv);
    const double s = p.scale * dot(&p.q[p.q_index(b, i, h, 0)], &p.k[p.k_index(b, j, kvh, 0)], p.head_dim_qk);
    return (p.softcap > 0 ? p.softcap * std::tanh(s / p.softcap) : s) + alibi_bias(p, b, h, i, j);
}

// d score / d (scaled dot product) at a score (of query i, key j): 1, or the cap's 1 - tanh^2 (of the capped part:
// ALiBi's bias is a constant).
double cap_slope(const DenseProblem& p, double score, int b, int h, int i, int j) {
    if (p.softcap <= 0) return 1.0;
    const double t = (score - alibi_bias(p, b, h, i, j)) / p.softcap;
    return 1.0 - t * t;
}

double dp(const DenseProblem& p, int b, int h, int i, int j) {
    const int kvh = h / (p.heads_q / p.heads_kv);
    return dot(&p.dout[p.o_index(b, i, h, 0)], &p.v[p.v_index(b, j, kvh, 0)], p.head_dim_v);
}

// Row i's scaled scores against its visible keys into s[j - keys.first] and their log-sum-exp, the head's sink
// included (keys not empty, or a sink): the one softmax of the forward, LSE and backward references.
double row_lse(const DenseProblem& p, int b, int h, int i, KeyRange keys, std::vector<double>& s) {
    double mx = p.sinks.empty() ? -kInf : p.sinks[h], sum = 0;
    for (int j = keys.first; j < keys.end; ++j) mx = std::max(mx, s[j - keys.first] = score(p, b, h, i, j));
    for (int j = 0; j < keys.size(); ++j) sum += std::exp(s[j] - mx);
    if (!p.sinks.empty()) sum += std::exp(p.sinks[h] - mx);
    return mx + std::log(sum);
}

}  // namespace

std::vector<double> dense_lse(const DenseProblem& p) {
    std::vector<double> out(std::size_t(p.batch) * p.heads_q * p.seqlen_q, kInf);
    std::vector<double> s(p.seqlen_k);
    for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < p.heads_q; ++h)
            for (int i = 0; i < p.seqlen_q; ++i) {
                const KeyRange keys = p.keys(i);
                if (keys.size() > 0 || !p.sinks.empty())
                    out[(std::size_t(b) * p.heads_q + h) * p.seqlen_q + i] = row_lse(p, b, h, i, keys, s);
            }
    return out;
}

std::vector<double> dense_forward(const DenseProblem& p) {
    std::vector<double> o(std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim_v, 0.0);
    const int group = p.heads_q / p.heads_kv;
    std::vector<double> s(p.seqlen_k);
    for (int b = 0; b < p.batch; ++b)
        for (int h = 0; h < p.heads_q; ++h)
            for (int i = 0; i < p.seqlen_q; ++i) {
                const KeyRange keys = p.keys(i);
                if (keys.size() == 0) continue;
                const double lse = row_lse(p, b, h, i, keys, s);
                for (int j = keys.first; j < keys.end; ++j)
                    for (int d = 0; d < p.head_dim_v; ++d)
                        o[p.o_index(b, i, h, d)] +=
                            std::exp(s[j - keys.first] - lse) * p.v[p.v_index(b, j, h / group, d)];
            }
    return o;
}

BackwardResult dense_backward(const DenseProblem& p, int threads) {
    BackwardResult r;
    r.dq.assign(p.q.size(), 0.0);
    r.dk.assign(p.k.size(), 0.0);
    r.dv.assign(p.v.size(), 0.0);
    const int group = p.heads_q / p.heads_kv;
    RowStats st;
    st.lse.assign(std::size_t(p.batch) * p.heads_q * p.seqlen_q, kInf);
    st.delta.assign(st.lse.size(), 0.0);

    // Pass 1, query rows: softmax statistics, D, and dQ_i = scale * sum_j dS_ij k_j.
    parallel_for((long long)p.batch * p.heads_q * p.seqlen_q, threads, [&](long long it) {
        const int i = int(it % p.seqlen_q);
        const int h = int(it / p.seqlen_q % p.heads_q);
        const int b = int(it / p.seqlen_q / p.heads_q);
        const KeyRange keys = p.keys(i);
        const int n = keys.size();
        if (n == 0 && p.sinks.empty()) return;  // lse +inf, D 0, dQ row 0
        std::vector<double> s(n), pr(n), dpr(n);
        const double lse = row_lse(p, b, h, i, keys, s);
        double delta = 0;
        for (int j = 0; j < n; ++j) {
            pr[j] = std::exp(s[j] - lse);
            dpr[j] = dp(p, b, h, i, keys.first + j);
            delta += pr[j] * dpr[j];
        }
        // A gradient g flowing into LSE adds g * P to dS (dLSE/dS = P): the same as lowering D by g.
        if (!p.dlse.empty()) delta -= p.dlse[st.at(p, b, h, i)];
        st.lse[st.at(p, b, h, i)] = lse;
        st.delta[st.at(p, b, h, i)] = delta;
        double* dq = &r.dq[p.q_index(b, i, h, 0)];
        for (int j = 0; j < n; ++j) {
            const double ds = pr[j] * (dpr[j] - delta) * cap_slope(p, s[j], b, h, i, keys.first + j);
            const double* kj = &p.k[p.k_index(b, keys.first + j, h / group, 0)];
            for (int d = 0; d < p.head_dim_qk; ++d) dq[d] += p.scale * ds * kj[d];
        }
    });

    // The sinks: a key of value zero, whose score's gradient is P_sink * (0 - D) per row (D lowered by dLSE).
    if (!p.sinks.empty()) {
        r.dsinks.assign(p.heads_q, 0.0);
        for (int b = 0; b < p.batch; ++b)
            for (int h = 0; h < p.heads_q; ++h)
                for (int i = 0; i < p.seqlen_q; ++i) {
                    const std::size_t row = st.at(p, b, h, i);
                    r.dsinks[h] -= std::exp(p.sinks[h] - st.lse[row]) * st.delta[row];
                }
    }

    // Pass 2, key rows of each KV head: dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij q_i over the group.
    parallel_for((long long)p.batch * p.heads_kv * p.seqlen_k, threads, [&](long long it) {
        const int j = int(it % p.seqlen_k);
        const int kvh = int(it / p.seqlen_k % p.heads_kv);
        const int b = int(it / p.seqlen_k / p.heads_kv);
        double* dk = &r.dk[p.k_index(b, j, kvh, 0)];
        double* dv = &r.dv[p.v_index(b, j, kvh, 0)];
        for (int h = kvh * group; h < (kvh + 1) * group; ++h)
            for (int i = 0; i < p.seqlen_q; ++i) {
                const KeyRange keys = p.keys(i);
                if (j < keys.first || j >= keys.end) continue;
                const std::size_t row = st.at(p, b, h, i);
                const double sc = score(p, b, h, i, j);
                const double pr = std::exp(sc - st.lse[row]);
                const double ds = pr * (dp(p, b, h, i, j) - st.delta[row]) * cap_slope(p, sc, b, h, i, j);
                const double* qi = &p.q[p.q_index(b, i, h, 0)];
                const double* doi = &p.dout[p.o_index(b, i, h, 0)];
                for (int d = 0; d < p.head_dim_v; ++d) dv[d] += pr * doi[d];
                for (int d = 0; d < p.head_dim_qk; ++d) dk[d] += p.scale * ds * qi[d];
            }
    });
    return r;
}

DenseProblem dense_from(const ReferenceProblem& p, const HostTensorView& dout) {
    DenseProblem d;
    d.batch = p.batch, d.seqlen_q = p.seqlen_q, d.seqlen_k = p.seqlen_k;
    d.heads_q = p.heads_q, d.heads_kv = p.heads_kv, d.head_dim_qk = p.head_dim_qk, d.head_dim_v = p.head_dim_v;
    d.causal = p.causal, d.scale = p.scale;
    d.window_left = p.window_left, d.window_right = p.window_right;
    d.sinks = p.sinks;
    d.softcap = p.softcap;
    d.alibi = p.alibi;
    d.q.resize(std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim_qk);
    d.k.resize(std::size_t(p.batch) * p.seqlen_k * p.heads_kv * p.head_dim_qk);
    d.v.resize(std::size_t(p.batch) * p.seqlen_k * p.heads_kv * p.head_dim_v);
    d.dout.resize(std::size_t(p.batch) * p.seqlen_q * p.heads_q * p.head_dim_v);
    for (int b = 0; b < p.batch; ++b) {
        for (int s = 0; s < p.seqlen_q; ++s)
            for (int h = 0; h < p.heads_q; ++h) {
                for (int e = 0; e < p.head_dim_qk; ++e) d.q[d.q_index(b, s, h, e)] = from_bits(p.q.at(b, s, h, e), p.dtype);
                for (int e = 0; e < p.head_dim_v; ++e)
                    d.dout[d.o_index(b, s, h, e)] = from_bits(dout.at(b, s, h, e), p.dtype);
            }
        for (int s = 0; s < p.seqlen_k; ++s)
            for (int h = 0; h < p.heads_kv; ++h) {
                for (int e = 0; e < p.head_dim_qk; ++e) d.k[d.k_index(b, s, h, e)] = from_bits(p.k.at(b, s, h, e), p.dtype);
                for (int e = 0; e < p.head_dim_v; ++e) d.v[d.v_index(b, s, h, e)] = from_bits(p.v.at(b, s, h, e), p.dtype);
            }
    }
    return d;
}

BackwardResult reference_backward(const ReferenceProblem& p, const HostTensorView& dout, int threads) {
    return dense_backward(dense_from(p, dout), threads);
}

}  // namespace rtattn::test
