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
    // Varlen (kVarlen): sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1] of [total, heads, d] tensors; seqlen_q and
    // seqlen_k are the longest sequences (the grid); LSE is [heads_q, total_q].
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    int total_q, total_k;
    // Paged KV cache (kPaged: the mma.sync and warp-specialized Hopper families): key j of sequence b is in page
    // block_table[b * block_table_stride + (j >> page_shift)], slot j & (page size - 1); the K/V batch stride is the
    // page stride. Keys per sequence: seqlens_k[b] clamped to seqlen_k (nullptr: seqlen_k), not cu_seqlens_k. Table
    // entries outside 0..num_pages-1 read as the last page (detail::page_of).
    const int* seqlens_k;
    const int* block_table;
    long long block_table_stride;
    int page_shift;
    int num_pages;
    // Head dims of 4 mod 8 on the mma.sync family: 1 where every K (V) row of a sequence and head starts alike modulo
    // 16 bytes, so the rows move as 16-byte vectors rotated in shared memory (load_rows_rotated); else 0.
    int rotate_k, rotate_v;
    // A window (kLocal: common/mask.cuh): query i sees keys i + seqlen_k - seqlen_q - window_left through
    // i + seqlen_k - seqlen_q + window_right, both 0 or more (an unbounded side is written as the longest sequence).
    int window_left, window_right;
    // Sinks (kSinks): [heads_q] logits, in the scaled scores' units, each joining its head's softmax denominators.
    const float* sinks;
    // Softcap (kSoftcap): a raw score x becomes tanh(x * softcap_scale), softcap_scale = softmax_scale / softcap, and
    // scale / scale_log2 above are softcap and softcap * log2(e): the softmax and LSE then see softcap * tanh(...).
    float softcap_scale;
    // ALiBi (kAlibi): slopes [batch, heads_q] with alibi_batch_stride between sequences (0: one row for all), and
    // 1 / scale (the scale above), which puts a slope in the units of the scores before scale_log2.
    const float* alibi_slopes;
    long long alibi_batch_stride;
    float alibi_scale;
    // KV append (a cache call's k_new/v_new; common/append.cuh wrote them before this kernel runs): sequence b's keys
    // are seqlens_k[b] (clamped to seqlen_k) plus these new ones, clamped to seqlen_k again. 0 without an append.
    int seqlen_new;
};

// Parameters of the backward kernels (bwd/mma.cuh): the forward's inputs and outputs, dO, the gradients, and the
// caller's workspace. Workspace arrays are per (batch, query head) and `m_pad` rows (seqlen_q rounded up to the main
// kernel's kBlockM), so the main kernel reads and writes them without bounds checks.
struct BwdParams {
    const void* q;
    const void* k;
    const void* v;
    const void* o;
    const void* dout;
    const float* lse;      // the forward's LSE, [batch, heads_q, seqlen_q], natural log; +inf for keyless rows
    const float* dlse;     // null, or the loss's gradient with respect to the LSE (same layout)
    void* dq;
    void* dk;
    void* dv;
    float* dq_accum;       // [batch, heads_q, m_pad, bwd_dq_stride(pad_qk)] fp32: dQ summed over key blocks (zeroed by
                           // preprocess)
    float* lse2;           // [batch, heads_q, m_pad]: LSE * log2(e); +inf past seqlen_q, so those rows get P = 0
    float* delta;          // [batch, heads_q, m_pad]: D = rowsum(dO * O); 0 past seqlen_q
    int* dq_sem;           // [batch, heads_q, m_pad / kBlockM]: deterministic mode's turn counters
    long long q_batch_stride, q_seq_stride, q_head_stride;  // in elements
    long long k_batch_stride, k_seq_stride, k_head_stride;
    long long v_batch_stride, v_seq_stride, v_head_stride;
    long long o_batch_stride, o_seq_stride, o_head_stride;
    long long do_batch_stride, do_seq_stride, do_head_stride;
    long long dq_batch_stride, dq_seq_stride, dq_head_stride;
    long long dk_batch_stride, dk_seq_stride, dk_head_stride;
    long long dv_batch_stride, dv_seq_stride, dv_head_stride;
    int seqlen_q;
    int seqlen_k;
    int heads_q;
    int q_per_kv;
    int m_pad;
    int deterministic;     // 1: dQ blocks are added in key-block order (bitwise reproducible)
    float scale;           // softmax_scale
    float scale_log2;      // softmax_scale * log2(e)
    // Varlen, as FwdParams; the workspace stays [batch, heads_q, m_pad] with m_pad from the longest sequence.
    const int* cu_seqlens_q;
    const int* cu_seqlens_k;
    int total_q, total_k;
    int window_left, window_right;  // as FwdParams
    const float* sinks;    // as FwdParams
    float* dsinks;         // null, or [heads_q]: -sum over rows of exp(sink - LSE) * D, written by the postprocess
    // Softcap (kSoftcap), as FwdParams: scores x become tanh(x * softcap_scale) and scale_log2 is softcap * log2(e)
    // (P as the forward's); scale stays softmax_scale, the factor dQ and dK take (the cap's slope 1 - tanh^2 joins
    // dS).
    float softcap_scale;
    // ALiBi (kAlibi), as FwdParams; alibi_scale is 1 / the softmax's scale (the cap's, softcapped), not of `scale`.
    const float* alibi_slopes;
    long long alibi_batch_stride;
    float alibi_scale;
};

// Parameters of the decode kernels (dec/mma.cuh). A CTA serves one (split, KV head, row block, sequence): its rows
// are the packed (query head of the group, query token) pairs, row i = head_in_group * seqlen_q + token.
struct DecParams {
    const void* q;
    const void* k;              // dense: [batch, seqlen_k, heads_kv, d]; paged: [pages, page_size, heads_kv, d]
    const void* v;
    void* o;
    float* lse;                 // nullptr: not written. [batch, heads_q, seqlen_q]
    long long q_batch_stride, q_seq_stride, q_head_stride;  // in elements
    long long k_batch_stride, k_seq_stride, k_head_stride;  // paged: batch = page stride, seq = slot stride
    long long v_batch_stride, v_seq_stride, v_head_stride;
    long long o_batch_stride, o_seq_stride, o_head_stride;
    const int* seqlens_k;       // [batch] keys per sequence (clamped to seqlen_k); nullptr: seqlen_k
    const int* block_table;     // paged: [batch, block_table_stride]
    long long block_table_stride;
    int page_shift;             // paged: log2(page_size)
    int num_pages;              // paged: pages in the cache; table entries outside 0..num_pages-1 read the last one
    float* part_o;              // num_splits > 1: [num_splits, batch * heads_q * seqlen_q, pad_v] fp32, normalized
    float* part_lse;            // num_splits > 1: [num_splits, batch * heads_q * seqlen_q], natural log; -inf: no key
    int seqlen_q, seqlen_k, batch, heads_q, q_per_kv;
    int row_blocks;             // CTAs per KV head along the packed rows
    int num_splits;
    // Head dims of 4 mod 8, whose rows move as 16-byte vectors rotated in shared memory (load_rows_rotated): 1 where
    // every row of a sequence starts alike modulo 16 bytes, 2 where rows alternate by key parity, 0: 8-byte vectors.
    int rotate_k, rotate_v;
    float scale_log2, scale;
    // A window (kLocal), as FwdParams: token t (its diagonal key len - seqlen_q + t) sees keys diagonal -
    // window_left .. diagonal + window_right.
    int window_left, window_right;
    const float* sinks;         // kSinks, as FwdParams; with splits the combine adds them
    float softcap_scale;        // kSoftcap, as FwdParams (scale, scale_log2 then the cap's)
    const float* alibi_slopes;  // kAlibi, as FwdParams: token t's position is len - seqlen_q + t
    long long alibi_batch_stride;
    float alibi_scale;
    int seqlen_new;             // KV append, as FwdParams: len counts the appended keys
};

// Parameters of the KV append entry (common/append.cuh): a cache call's new tokens, k_new/v_new [batch, seqlen_new,
// heads_kv, d], written into the dense or paged cache at each sequence's length (seqlens_k[b] clamped to seqlen_k)
// before the attention kernel reads them. Rows that would land at or past seqlen_k, or in a page outside
// 0..num_pages-1, are not written.
struct AppendParams {
    void* k_cache;
    void* v_cache;
    const void* k_new;
    const void* v_new;
    long long kc_batch_stride, kc_seq_stride, kc_head_stride;  // paged: batch = page stride, seq = slot stride
    long long vc_batch_stride, vc_seq_stride, vc_head_stride;
    long long kn_batch_stride, kn_seq_stride, kn_head_stride;
    long long vn_batch_stride, vn_seq_stride, vn_head_stride;
    const int* seqlens_k;       // [batch]: keys cached before this call
    const int* block_table;     // paged: [batch, block_table_stride]
    long long block_table_stride;
    int page_shift, num_pages;  // paged
    int batch, seqlen_new, seqlen_k, heads_kv;
};

// Parameters of the merge entry (common/merge.cuh): two attention states of the same rows and where the merged one
// goes. O tensors [batch, seqlen, heads, d_v] (strides in elements), LSE [batch, heads, seqlen] natural log.
struct MergeParams {
    const void* o_a;
    const void* o_b;
    void* o;                    // may be o_a or o_b (in place)
    const float* lse_a;
    const float* lse_b;
    float* lse;                 // nullptr: not written; may be lse_a or lse_b
    long long a_batch_stride, a_seq_stride, a_head_stride;
    long long b_batch_stride, b_seq_stride, b_head_stride;
    long long o_batch_stride, o_seq_stride, o_head_stride;
    int batch, seqlen, heads;
};

// A CUtensorMap as cuTensorMapEncodeTiled writes it: 128 opaque bytes (aligned as cuda.h declares it).
struct alignas(128) TmaMap {
    unsigned long long raw[16];
};

// Parameters of the warp-specialized sm_90a kernel: the common block, plus tensor maps that let its producer load
// K/V tiles with the tensor memory accelerator. Box = panel width x kBlockN rows.
// Whole rows (kSplitRows false): one map per shared-memory panel width, index 0: 64 columns with the 128-byte
// swizzle, 1: 32 / 64-byte, 2: 16 / 32-byte, 3: 8, no swizzle.
// Split rows (kSplitRows: head dims 4 mod 8 such as 100, 132 and 140, whose packed heads alternate between 16- and
// 8-byte aligned starts; geometry::split_fits): TMA moves the tile's main panels from each row's aligned columns,
// the producer threads copy the other 4 to 28.
// Kv heads fall into split_classes classes (kv_head % split_classes), each with its own maps, whose head stride is
// that many heads: index 2 * class + panel width index (0 or 1). 4 classes start every box row 32-byte aligned (16
// bytes off 32 ran the d144 kernel at 0.73x, H100), 2 classes 16-byte aligned, where a tail is too narrow for the
// rotation 32 bytes take. The tile holds each row rotated left by *_rot[class] columns (0 to 12), so that the TMA
// part is contiguous; Q is loaded and O stored with the same rotation.
struct FwdParamsTma {
    FwdParams p;
    TmaMap k_map[8];
    TmaMap v_map[8];
    int use_tma;        // 0: cp.async (base or a stride not 16-byte aligned, e.g. d132 heads with a padded row)
    int tma_seq_dim;    // map dims are (head_dim, seq, head, batch) when 1, (head_dim, head, seq, batch) when 2
    int split_classes;  // split rows only: 2 or 4
    int k_rot[4];       // split rows only: rotation of K (and Q) rows of each class, in elements
    int v_rot[4];       // split rows only: rotation of V (and O) rows
    // Persistent kernels: the tiles are m_blocks query blocks x heads_q x batch sequences. walk: each CTA walks them
    // (sm90::CtaTiles), else it takes tile blockIdx.x of them.
    int m_blocks, batch, walk;
    // Shifted rows (kShiftRows: head dims off the 16 grid; geometry::shift_fits): one map per panel width, whose box
    // for kv head h starts at column h * *_col_step - shift and head coordinate h * *_head_step (a view of every
    // head's columns in one seq row, or a head dimension), 32 (else 16) bytes aligned; the tile then holds the row
    // shifted right by *_shift[h % 16] columns (the shift repeats every 16 heads at most). Q is loaded with K's shift,
    // O stored with V's. All zero when loading with cp.async.
    signed char k_shift[16], v_shift[16];
    int k_col_step, v_col_step, k_head_step, v_head_step;
};

// Parameters of the warp-specialized Hopper backward (bwd/sm90_ws.cuh): the common block and tensor maps of Q and dO
// (one per panel width, as FwdParamsTma's whole-row maps; box = panel width x kBlockM rows). Dims are (head_dim, seq,
// head, batch) when tma_seq_dim is 1, (head_dim, head, seq, batch) when 2; packed sequences are one batch of total_q
// rows. Where no map can be encoded (a base or stride not 16-byte aligned, or RTATTN_TMA=0) the launch runs the
// module's other main kernel, bwd/sm90.cuh's, instead.
// Shifted rows (d132, d140: bwd/sm90_ws.cuh): the maps span every head's columns of a seq row; head h's box starts
// at column h * *_col_step less its rows' placement ((h * *_col_step) % 8: 0 or 4), head coordinate 0 (head_step 0).
// Else *_col_step is 0 and the head coordinate is h (head_step 1).
struct BwdParamsTma {
    BwdParams p;
    TmaMap q_map[4];
    TmaMap do_map[4];
    int tma_seq_dim;
    int q_col_step, do_col_step, head_step;
    // The fp32 dQ accumulator as rows of bwd_dq_stride floats, boxes of geometry::kBwdDqBoxCols x kBwdDqBoxRows
    // with the 128-byte swizzle (the kernels that add dQ by TMA reductions: geometry::bwd_sm90_ws_by_gemm).
    TmaMap dq_map;
};

}  // namespace rtattn
