// Backward ground truth: dQ, dK, dV of O = softmax(scale Q K^T) V for a given dO (the gradient of any loss whose
// derivative with respect to O is dO), in float64. GQA: dK and dV are per KV head, summed over the group's query heads.
// Causal is aligned bottom-right, as the forward; a query that sees no key contributes nothing (its dQ row is zero).
// Attention sinks: a per-head logit in each row's denominator (a key of value zero), with its gradient dsinks.
// Softcapping: scores softcap * tanh(s / softcap), whose derivative 1 - tanh^2 scales dS.
#pragma once
#include <cstdint>
#include <vector>

#include "reference.hpp"

namespace rtattn::test {

// A problem on contiguous float64 arrays, [batch, seq, head, dim]: what the finite-difference check perturbs.
struct DenseProblem {
    int batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim_qk = 1, head_dim_v = 1;
    bool causal = false;
    int window_left = -1, window_right = -1;  // a sliding window (visible_keys); -1: unbounded
    double scale = 1.0;
    std::vector<double> q, k, v, dout;
    std::vector<double> sinks;  // [heads_q] sink logits (ReferenceProblem::sinks); empty: none
    double softcap = 0;         // > 0: scaled scores s become softcap * tanh(s / softcap) (ReferenceProblem::softcap)
    std::vector<double> alibi;  // [batch, heads_q] ALiBi slopes (ReferenceProblem::alibi); empty: none
    // Optional [batch, heads_q, seqlen_q]: the loss's gradient with respect to the forward's LSE (empty: none).
    std::vector<double> dlse;

    std::size_t q_index(int b, int s, int h, int d) const {
        return ((std::size_t(b) * seqlen_q + s) * heads_q + h) * head_dim_qk + d;
    }
    std::size_t k_index(int b, int s, int h, int d) const {
        return ((std::size_t(b) * seqlen_k + s) * heads_kv + h) * head_dim_qk + d;
    }
    std::size_t v_index(int b, int s, int h, int d) const {
        return ((std::size_t(b) * seqlen_k + s) * heads_kv + h) * head_dim_v + d;
    }
    std::size_t o_index(int b, int s, int h, int d) const {
        return ((std::size_t(b) * seqlen_q + s) * heads_q + h) * head_dim_v + d;
    }
    // Keys query i sees.
    KeyRange keys(int i) const { return visible_keys(i, seqlen_q, seqlen_k, causal, window_left, window_right); }
};

struct BackwardResult {
    std::vector<double> dq;  // [batch, seqlen_q, heads_q, head_dim_qk]
    std::vector<double> dk;  // [batch, seqlen_k, heads_kv, head_dim_qk]
    std::vector<double> dv;  // [batch, seqlen_k, heads_kv, head_dim_v]
    std::vector<double> dsinks;  // [heads_q] when the problem has sinks
};

// O on dense inputs ([batch, seqlen_q, heads_q, head_dim_v]; zero rows for queries that see no key).
std::vector<double> dense_forward(const DenseProblem& p);

// LSE on dense inputs, [batch, heads_q, seqlen_q] (+inf for queries that see no key; sinks: the sink).
std::vector<double> dense_lse(const DenseProblem& p);

// dQ, dK, dV on dense inputs, over `threads` threads (0: hardware concurrency): one pass over query rows (softmax
// statistics, D = rowsum(dO * O), dQ), one over key rows (dK, dV), so neither needs a lock.
BackwardResult dense_backward(const DenseProblem& p, int threads = 0);

// The same from the 16-bit strided views the kernels read (values taken exactly, as rounded).
DenseProblem dense_from(const ReferenceProblem& p, const HostTensorView& dout);
BackwardResult reference_backward(const ReferenceProblem& p, const HostTensorView& dout, int threads = 0);

}  // namespace rtattn::test
