// The online softmax, shared by every forward kernel however it issues its GEMMs (mma.sync on sm_80+, wgmma on
// sm_90a). Scores and the output accumulator use the mma.m16n8 C-fragment layout in all of them: per warp and 16-row
// tile, thread `lane` holds rows lane/4 and lane/4 + 8, columns 2*(lane%4) + {0,1} of each 8-wide column block.
#pragma once
#include "common/ptx.cuh"

namespace rtattn {
namespace detail {

using ptx::u16;
using ptx::u32;

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Online softmax for one key block, statistics part: new row max, running sum rescaled, scores become
// unnormalized probabilities exp2(s * c - m_new * c). `corr` = exp2((m_old - m_new) * c) is the factor the output
// accumulator must be multiplied by; the caller applies it (at once, or after an in-flight PV has landed).
template <int kMT, int kNB>
__device__ __forceinline__ void softmax_update(float (&s)[kMT][kNB][4], float (&row_max)[kMT][2],
                                               float (&row_sum)[kMT][2], float (&corr)[kMT][2], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[mt][h];
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * h], s[mt][nb][2 * h + 1]));
            mx = quad_max(mx);
            // A row with every key masked so far keeps max -inf; using 0 avoids (-inf) - (-inf) = NaN.
            const float m_use = mx == neg_inf() ? 0.f : mx;
            corr[mt][h] = ptx::fast_exp2((row_max[mt][h] - m_use) * scale_log2);
            row_max[mt][h] = mx;
            const float m_scaled = m_use * scale_log2;
            float sum = 0.f;
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float pe = ptx::fast_exp2(fmaf(s[mt][nb][2 * h + e], scale_log2, -m_scaled));
                    s[mt][nb][2 * h + e] = pe;
                    sum += pe;
                }
            }
            row_sum[mt][h] = row_sum[mt][h] * corr[mt][h] + sum;
        }
    }
}

template <int kMT, int kNV>
__device__ __forceinline__ void rescale(float (&acc_o)[kMT][kNV][4], const float (&corr)[kMT][2]) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nb = 0; nb < kNV; ++nb) {
            acc_o[mt][nb][0] *= corr[mt][0];
            acc_o[mt][nb][1] *= corr[mt][0];
            acc_o[mt][nb][2] *= corr[mt][1];
            acc_o[mt][nb][3] *= corr[mt][1];
        }
}

// Both parts at once, for kernels with no PV in flight during the softmax.
template <int kMT, int kNB, int kNV>
__device__ __forceinline__ void online_softmax(float (&s)[kMT][kNB][4], float (&row_max)[kMT][2],
                                               float (&row_sum)[kMT][2], float (&acc_o)[kMT][kNV][4],
                                               float scale_log2) {
    float corr[kMT][2];
    softmax_update(s, row_max, row_sum, corr, scale_log2);
    rescale(acc_o, corr);
}

// Softcapping (kOn: the traits' kSoftcap; Gemma 2): a raw score x becomes tanh(x * softcap_scale), softcap_scale =
// softmax_scale / softcap, and the host makes the softmax's scale the cap, so the softmax and the LSE see softcap *
// tanh(scaled score / softcap). Before the mask, which writes -inf over hidden scores. tanh.approx is one MUFU op, as
// the exp is; its error (about 2^-11 of the score) is below that of scores rounded to 16 bits.
template <bool kOn, int kMT, int kNB>
__device__ __forceinline__ void apply_softcap(float (&s)[kMT][kNB][4], float softcap_scale) {
    if constexpr (kOn) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nb = 0; nb < kNB; ++nb)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][nb][e] = ptx::tanh_approx(s[mt][nb][e] * softcap_scale);
    }
}

// The backward's factor for a capped score t = tanh(x * softcap_scale): d(softcap * t) / d(x * softmax_scale) =
// 1 - t^2, which joins dS (dQ and dK take softmax_scale as uncapped). 0 where the mask wrote t = -inf (P is 0 there).
__device__ __forceinline__ float softcap_slope(float t) { return fmaxf(fmaf(-t, t, 1.f), 0.f); }

// Attention sinks: a row's sink logit (in the scaled scores' units) joins its softmax denominator as a key whose value
// is zero. m_scaled: the row's max score times the scale (-inf: the row saw no key); sum: its sum of exp(score *
// scale - m_scaled). Gives the factor that turns the row's accumulator into O (the normalization included) and the
// row's LSE: a row with no key gets O = 0 and its sink as LSE (+inf if the sink is -inf too, as a keyless row).
// The fast exp, log and divide: the accurate ones' slow paths slowed the d128 causal forward by 3% (docs/
// PERFORMANCE.md); total is 1 or more and far below 2^126, where these are exact to a few ulp.
struct SinkJoin {
    float inv, lse;
};
__device__ __forceinline__ SinkJoin join_sink(float m_scaled, float sum, float sink) {
    const float top = fmaxf(m_scaled, sink);
    if (top == neg_inf()) return {0.f, __int_as_float(0x7f800000)};
    const float keys = sum > 0.f ? __expf(m_scaled - top) : 0.f;  // the keys' weight against the top
    const float total = sum * keys + __expf(sink - top);
    return {__fdividef(keys, total), top + __logf(total)};
}

// P for keys [16*kk, 16*kk + 16) as an m16k16 A fragment: the score C-fragment layout is the A-fragment layout.
template <bool kBF16, int kNB>
__device__ __forceinline__ void pack_p(const float (&s)[kNB][4], int kk, u32 (&a)[4]) {
    a[0] = ptx::pack2<kBF16>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = ptx::pack2<kBF16>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = ptx::pack2<kBF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = ptx::pack2<kBF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

}  // namespace detail
}  // namespace rtattn
