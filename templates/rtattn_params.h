// Kernel parameter block, shared verbatim by the host (src/api) and the device templates so the layout cannot
// drift. Plain C types only: NVRTC sees no host headers.
#pragma once

namespace rtattn {

struct FwdParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;                 // nullptr: not written. Layout [batch, heads_q, seqlen_q].
    long long q_batch_stride, q_seq_stride, q_head_stride;  // in elements
    long long k_batch_stride, k_seq_stride, k_head_stride;
    long long v_batch_stride, v_seq_stride, v_head_stride;
    long long o_batch_stride, o_seq_stride, o_head_stride;
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int q_per_kv;               // heads_q / heads_kv (GQA group size)
    float scale_log2;           // softmax_scale * log2(e): exp(x*scale) == exp2(x*scale_log2)
    float scale;                // softmax_scale, for the natural-log LSE
};

}  // namespace rtattn
