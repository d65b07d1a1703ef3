// Merging attention states: (O_a, LSE_a) over one set of keys and (O_b, LSE_b) over another, for the same query rows,
// give the attention over both sets: O = (e^LSE_a O_a + e^LSE_b O_b) / (e^LSE_a + e^LSE_b), LSE = log of that sum.
// What cascade attention (a shared prefix, then each request's own keys) and ring attention across devices do between
// partial results. An entry of every forward module (the dtype and d_v of the kernel's config).
#pragma once
#include "common/params.h"
#include "common/ptx.cuh"

namespace rtattn {

constexpr int kMergeWarps = 8;  // rows per CTA: one warp per (sequence, head, token) row

template <class T>
__device__ __forceinline__ void merge_states(const MergeParams& p) {
    using ptx::u16;
    const long long row = (long long)blockIdx.x * kMergeWarps + threadIdx.x / 32;  // LSE order: [batch, heads, seqlen]
    if (row >= (long long)p.batch * p.heads * p.seqlen) return;
    const int lane = threadIdx.x & 31;
    const int s = int(row % p.seqlen), h = int(row / p.seqlen % p.heads), b = int(row / p.seqlen / p.heads);
    const float inf = __int_as_float(0x7f800000);
    // A state without keys has LSE +inf (the forward's convention, as FlashAttention's) or -inf: weight 0. NaN is not
    // empty and stays NaN through the arithmetic below.
    const float la = p.lse_a[row], lb = p.lse_b[row];
    const bool empty_a = la == inf || la == -inf, empty_b = lb == inf || lb == -inf;
    const float m = fmaxf(empty_a ? -inf : la, empty_b ? -inf : lb);
    const float wa = empty_a ? 0.f : __expf(la - m), wb = empty_b ? 0.f : __expf(lb - m);
    const float sum = wa + wb;
    const float inv = sum == 0.f ? 0.f : 1.f / sum;  // NaN stays NaN
    __syncwarp();  // every lane has read the LSEs before lane 0 may overwrite one (in place)
    if (p.lse != nullptr && lane == 0) p.lse[row] = sum == 0.f ? inf : m + __logf(sum);
    if (isnan(la) || isnan(lb)) {  // fmaxf drops a NaN: carry it into O explicitly
        const float nan = __int_as_float(0x7fc00000);
        u16* o = static_cast<u16*>(p.o) + b * p.o_batch_stride + s * p.o_seq_stride + h * p.o_head_stride;
        for (int c = lane; c < T::kHeadDimV; c += 32) o[c] = u16(ptx::pack2<T::kBF16>(nan, nan));
        return;
    }
    const u16* oa = static_cast<const u16*>(p.o_a) + b * p.a_batch_stride + s * p.a_seq_stride + h * p.a_head_stride;
    const u16* ob = static_cast<const u16*>(p.o_b) + b * p.b_batch_stride + s * p.b_seq_stride + h * p.b_head_stride;
    u16* o = static_cast<u16*>(p.o) + b * p.o_batch_stride + s * p.o_seq_stride + h * p.o_head_stride;
    // An empty state's O is not read (0 x anything must not turn into NaN); in place (o == oa or ob) each element is
    // read before the same thread writes it.
    for (int c = lane; c < T::kHeadDimV; c += 32) {
        float x = 0.f;
        if (wa != 0.f) x += wa * ptx::unpack<T::kBF16>(oa[c], 0);
        if (wb != 0.f) x += wb * ptx::unpack<T::kBF16>(ob[c], 0);
        o[c] = u16(ptx::pack2<T::kBF16>(x * inv, 0.f));
    }
}

}  // namespace rtattn
