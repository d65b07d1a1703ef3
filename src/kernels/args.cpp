// The argument checks the families' validate_args are built from (args.hpp).
#include "kernels/args.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "common/geometry.h"
#include "core/errors.hpp"
#include "kernels/forward.hpp"  // kAppendThreads, max_warp_rows
#include "util/format.hpp"

namespace rtattn::kernels {

namespace {

struct Dim {
    std::int64_t extent, stride;
};

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace

void check_tensor(const char* name, const TensorArg& t, int vec, bool is_output, int batch, int seqlen, int heads,
                  int dim) {
    auto field = [&](const char* f) { return util::format("{}.{}", name, f); };
    if (!t.ptr) throw ArgumentError(field("ptr"), "is null; a device pointer is required");
    const int align = vec * 2;
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % align != 0)
        throw ArgumentError(field("ptr"), util::format("must be {}-byte aligned (this kernel moves {}-element vectors "
                                                       "for head dim {})",
                                                       align, vec, dim));
    const std::array<std::pair<const char*, std::int64_t>, 3> strides = {
        {{"batch_stride", t.batch_stride}, {"seq_stride", t.seq_stride}, {"head_stride", t.head_stride}}};
    for (const auto& [f, s] : strides) {
        if (s < 0) throw ArgumentError(field(f), util::format("{} is negative; strides must be >= 0", s));
        if (s % vec != 0)
            throw ArgumentError(field(f), util::format("{} must be a multiple of {} elements (vector width for head "
                                                       "dim {})",
                                                       s, vec, dim));
    }
    std::array<Dim, 4> dims = {{{dim, 1}, {heads, t.head_stride}, {seqlen, t.seq_stride}, {batch, t.batch_stride}}};
    // The last element's byte offset must be an address: the kernels add index x stride in 64 bits, and a product
    // that wraps would reach memory anywhere.
    std::int64_t last = 0;
    for (const auto& d : dims) {
        std::int64_t step = 0;
        if (__builtin_mul_overflow(d.extent - 1, d.stride, &step) || __builtin_add_overflow(last, step, &last) ||
            last > kMaxTensorElements)
            throw ArgumentError(name, util::format("strides (batch {}, seq {}, head {}) reach past 2^62 bytes for "
                                                   "[batch {}, seq {}, heads {}, dim {}]",
                                                   t.batch_stride, t.seq_stride, t.head_stride, batch, seqlen, heads,
                                                   dim));
    }
    if (!is_output) return;
    // Output rows must not overlap, or two CTAs would race on the same elements: sorted by stride, each dimension
    // must step past everything the smaller ones span (stride x extent is at most twice the offset bounded above).
    std::sort(dims.begin(), dims.end(), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
    std::int64_t span = 1;  // elements covered by the dimensions processed so far
    for (const auto& d : dims) {
        if (d.extent <= 1) continue;
        if (d.stride < span)
            throw ArgumentError(name, util::format("strides (batch {}, seq {}, head {}) make output elements overlap "
                                                   "for [batch {}, seq {}, heads {}, dim {}]",
                                                   t.batch_stride, t.seq_stride, t.head_stride, batch, seqlen, heads,
                                                   dim));
        span = d.stride * d.extent;
    }
}

void check_sizes(int batch, int seqlen_q, int seqlen_k) {
    if (batch < 1 || batch > kMaxBatch)
        throw ArgumentError("batch", util::format("{} is out of range; allowed 1..{}", batch, kMaxBatch));
    for (const auto& [field, n] : {std::pair{"seqlen_q", seqlen_q}, std::pair{"seqlen_k", seqlen_k}})
        if (n < 1 || n > kMaxSeqlen)
            throw ArgumentError(field, util::format("{} is out of range; allowed 1..{}", n, kMaxSeqlen));
}

void check_no_splits(int num_splits) {
    if (num_splits != 0 && num_splits != 1)
        throw ArgumentError("num_splits", util::format("{} is for decode configs (config.decode); a prefill runs no "
                                                       "key splits: allowed 0 or 1",
                                                       num_splits));
}

Rows check_packing(bool varlen, bool paged, const Packing& s, int batch, int seqlen_q, int seqlen_k,
                   std::initializer_list<std::pair<const char*, const TensorArg*>> tensors) {
    if (!varlen) {
        const std::pair<const char*, bool> set[] = {{"cu_seqlens_q", s.cu_seqlens_q != nullptr},
                                                    {"cu_seqlens_k", s.cu_seqlens_k != nullptr},
                                                    {"total_q", s.total_q != 0},
                                                    {"total_k", s.total_k != 0}};
        for (const auto& [field, is_set] : set)
            if (is_set)
                throw ArgumentError(field, "is for varlen configs (config.varlen); this kernel takes a dense "
                                           "[batch, seq, heads, dim] batch");
        return {batch, seqlen_q, seqlen_k};
    }
    // Paged: the keys are each sequence's cached ones (seqlens_k, the block table), not packed rows.
    if (paged && (s.cu_seqlens_k || s.total_k))
        throw ArgumentError(s.cu_seqlens_k ? "cu_seqlens_k" : "total_k",
                            "is for packed K/V; a paged cache takes each sequence's keys from seqlens_k and the block "
                            "table");
    for (const auto& [field, ptr] : {std::pair{"cu_seqlens_q", s.cu_seqlens_q}, std::pair{"cu_seqlens_k", s.cu_seqlens_k}}) {
        if (paged && ptr == s.cu_seqlens_k) continue;
        if (!ptr) throw ArgumentError(field, "is null; a varlen call needs each sequence's offsets (device int32 [batch + 1])");
        if (reinterpret_cast<std::uintptr_t>(ptr) % 4 != 0) throw ArgumentError(field, "must be 4-byte aligned (int32)");
    }
    const struct {
        const char *total_name, *max_name;
        int total, longest;
    } sides[] = {{"total_q", "seqlen_q", s.total_q, seqlen_q}, {"total_k", "seqlen_k", s.total_k, seqlen_k}};
    for (const auto& side : sides) {
        if (paged && side.total_name == sides[1].total_name) continue;
        if (side.total < 1)
            throw ArgumentError(side.total_name, util::format("{} is out of range; allowed >= 1 (the packed tensors' "
                                                              "rows)",
                                                              side.total));
        if (side.longest > side.total)
            throw ArgumentError(side.max_name, util::format("{} (the longest sequence) is above {} ({})", side.longest,
                                                            side.total_name, side.total));
    }
    for (const auto& [name, t] : tensors)
        if (t->batch_stride != 0)
            throw ArgumentError(util::format("{}.batch_stride", name),
                                util::format("{} must be 0 for varlen configs: sequences are packed along seq and "
                                             "found through cu_seqlens",
                                             t->batch_stride));
    return {1, s.total_q, s.total_k};
}

void check_window(const AttentionConfig& c, int left, int right) {
    if (!c.local) {
        for (const auto& [field, v] : {std::pair{"window_size_left", left}, std::pair{"window_size_right", right}})
            if (v != -1)
                throw ArgumentError(field, util::format("{} given, but the kernel has no window (config.local = 0): "
                                                        "pass -1, or build the kernel with local = 1",
                                                        v));
        return;
    }
    for (const auto& [field, v] : {std::pair{"window_size_left", left}, std::pair{"window_size_right", right}})
        if (v < -1)
            throw ArgumentError(field, util::format("{} is not allowed; -1 (unbounded) or 0 or more", v));
    if (c.causal && right > 0)
        throw ArgumentError("window_size_right", util::format("{} is not allowed for a causal kernel, which sees no "
                                                              "key right of the diagonal; 0 or -1",
                                                              right));
}

void check_sinks(const AttentionConfig& c, const float* sinks, const float* dsinks) {
    if (!c.sinks) {
        for (const auto& [field, ptr] : {std::pair{"sinks", sinks}, std::pair{"dsinks", dsinks}})
            if (ptr)
                throw ArgumentError(field, "given, but the kernel has no sinks (config.sinks = 0): pass null, or build "
                                           "the kernel with sinks = 1");
        return;
    }
    if (!sinks)
        throw ArgumentError("sinks", "is null; a sinks kernel needs each query head's sink logit (device float32 "
                                     "[heads_q])");
    for (const auto& [field, ptr] : {std::pair{"sinks", sinks}, std::pair{"dsinks", dsinks}})
        if (!aligned(ptr, 4)) throw ArgumentError(field, "must be 4-byte aligned (float32)");
}

void check_softcap(const AttentionConfig& c, float softcap) {
    if (!c.softcap) {
        if (softcap != 0)
            throw ArgumentError("softcap", util::format("{} given, but the kernel has no softcap (config.softcap = 0): "
                                                        "pass 0, or build the kernel with softcap = 1",
                                                        softcap));
        return;
    }
    // The kernels take scale / softcap and softcap * log2(e) as normal floats.
    const double ratio = c.scale() / softcap;
    if (!(softcap > 0) || !std::isfinite(softcap) || !(ratio >= 1e-30 && ratio <= 1e30) ||
        double(softcap) * 1.4426950408889634 > 3e38)
        throw ArgumentError("softcap", util::format("{} is not allowed for a softcap kernel: a finite cap > 0 (with "
                                                    "softmax_scale / softcap within 1e-30..1e30)",
                                                    softcap));
}

void check_alibi(const AttentionConfig& c, const float* slopes, std::int64_t batch_stride, int batch) {
    if (!c.alibi) {
        if (slopes)
            throw ArgumentError("alibi_slopes", "given, but the kernel has no ALiBi (config.alibi = 0): pass null, or "
                                                "build the kernel with alibi = 1");
        if (batch_stride != 0)
            throw ArgumentError("alibi_slopes_batch_stride", "must be 0 for a kernel without ALiBi");
        return;
    }
    if (!slopes)
        throw ArgumentError("alibi_slopes",
                            util::format("is null; an ALiBi kernel needs each query head's slope (device float32 [{}] "
                                         "or [batch, {}])",
                                         c.num_heads_q, c.num_heads_q));
    if (!aligned(slopes, 4)) throw ArgumentError("alibi_slopes", "must be 4-byte aligned (float32)");
    // The kernels index batch * stride + head in 64 bits; rows may be padded, not overlapping.
    const std::int64_t most = (std::int64_t(1) << 40) / std::max(1, batch);
    if (batch_stride != 0 && (batch_stride < c.num_heads_q || batch_stride > most))
        throw ArgumentError("alibi_slopes_batch_stride",
                            util::format("{} is not allowed: 0 (one row of {} slopes for every sequence) or at least "
                                         "heads_q = {} (a row per sequence)",
                                         batch_stride, c.num_heads_q, c.num_heads_q));
}

Window window_bounds(const AttentionConfig& c, int left, int right, int seqlen_q, int seqlen_k) {
    if (!c.local) return {0, 0};
    Window w;
    w.left = left < 0 || left > seqlen_k ? seqlen_k : left;
    w.right = c.causal ? 0 : right < 0 || right > seqlen_q ? seqlen_q : right;
    return w;
}

Rows check_forward_queries(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a) {
    check_window(c, a.window_size_left, a.window_size_right);
    check_sinks(c, a.sinks);
    check_softcap(c, a.softcap);
    check_alibi(c, a.alibi_slopes, a.alibi_slopes_batch_stride, a.batch);
    const Packing packing{a.cu_seqlens_q, a.cu_seqlens_k, a.total_q, a.total_k};
    const Rows rows = p.paged_kv ? check_packing(c.varlen, true, packing, a.batch, a.seqlen_q, a.seqlen_k,
                                                 {{"q", &a.q}, {"o", &a.o}})
                                 : check_packing(c.varlen, false, packing, a.batch, a.seqlen_q, a.seqlen_k,
                                                 {{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"o", &a.o}});
    check_tensor("q", a.q, p.vec_qk, false, rows.batch, rows.q, c.num_heads_q, p.head_dim_qk);
    check_tensor("o", a.o, p.vec_v, true, rows.batch, rows.q, c.num_heads_q, p.head_dim_v);
    if (a.lse && !aligned(a.lse, 4)) throw ArgumentError("lse", "must be 4-byte aligned (float32)");
    return rows;
}

void check_prefill_kv(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a, const Rows& rows) {
    check_tensor("k", a.k, p.vec_qk, false, rows.batch, rows.k, c.num_heads_kv, p.head_dim_qk);
    check_tensor("v", a.v, p.vec_v, false, rows.batch, rows.k, c.num_heads_kv, p.head_dim_v);
    // A dense batch may be a KV cache whose sequences hold seqlens_k keys each; a varlen one has cu_seqlens_k.
    if (c.varlen && a.seqlens_k)
        throw ArgumentError("seqlens_k", "is for cache calls; a varlen kernel takes each sequence's keys from "
                                         "cu_seqlens_k");
    if (!aligned(a.seqlens_k, 4)) throw ArgumentError("seqlens_k", "must be 4-byte aligned (int32)");
    const std::pair<const char*, bool> paged_only[] = {{"block_table", a.block_table != nullptr},
                                                       {"page_size", a.page_size != 0},
                                                       {"pages_per_seq", a.pages_per_seq != 0},
                                                       {"num_pages", a.num_pages != 0}};
    for (const auto& [field, set] : paged_only)
        if (set) throw ArgumentError(field, "is for paged configs (config.paged_kv); this kernel reads dense K/V");
}

void check_append(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a) {
    if (a.seqlen_new == 0) {
        for (const auto& [field, t] : {std::pair{"k_new", &a.k_new}, std::pair{"v_new", &a.v_new}})
            if (t->ptr) throw ArgumentError(field, "is set but seqlen_new is 0; give the new tokens' count to append");
        return;
    }
    if (c.varlen)
        throw ArgumentError("seqlen_new", "a KV append is for cache calls (dense or paged, seqlens_k); this kernel is "
                                          "varlen");
    if (a.seqlen_new < 0 || a.seqlen_new > a.seqlen_k)
        throw ArgumentError("seqlen_new", util::format("{} is out of range; allowed 0 (no append) .. seqlen_k ({}), "
                                                       "the cache's bound after the append",
                                                       a.seqlen_new, a.seqlen_k));
    if (!a.seqlens_k)
        throw ArgumentError("seqlens_k", "is null; a KV append (seqlen_new > 0) writes each sequence's new keys after "
                                         "its seqlens_k cached ones");
    // The append kernel takes one warp per new row: more than its grid holds would leave rows unwritten.
    const std::int64_t new_rows = std::int64_t(a.batch) * a.seqlen_new * c.num_heads_kv;
    const std::int64_t max_rows = max_warp_rows(kAppendThreads);
    if (new_rows > max_rows)
        throw ArgumentError("seqlen_new", util::format("batch {} x seqlen_new {} x heads_kv {} = {} new rows; the "
                                                       "append takes at most {}",
                                                       a.batch, a.seqlen_new, c.num_heads_kv, new_rows, max_rows));
    // The cache is written: its rows must not overlap (an expanded, stride-0 cache would race).
    const int slots = p.paged_kv ? a.num_pages : a.batch, rows = p.paged_kv ? a.page_size : a.seqlen_k;
    check_tensor("k", a.k, p.vec_qk, true, slots, rows, c.num_heads_kv, p.head_dim_qk);
    check_tensor("v", a.v, p.vec_v, true, slots, rows, c.num_heads_kv, p.head_dim_v);
    check_tensor("k_new", a.k_new, p.vec_qk, false, a.batch, a.seqlen_new, c.num_heads_kv, p.head_dim_qk);
    check_tensor("v_new", a.v_new, p.vec_v, false, a.batch, a.seqlen_new, c.num_heads_kv, p.head_dim_v);
}

void check_cache(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a) {
    if (p.paged_kv) {
        // k and v are [num_pages, page_size, heads_kv, d]: the pool's extent is checked with the page count given.
        if (a.page_size < 1 || a.page_size > kMaxPageSize || (a.page_size & (a.page_size - 1)) != 0)
            throw ArgumentError("page_size", util::format("{} is not allowed; a power of two in 1..{}", a.page_size,
                                                          kMaxPageSize));
        // The kernels clamp table entries into the pages, so the pool's size is part of the call.
        if (a.num_pages < 1)
            throw ArgumentError("num_pages", util::format("{} is out of range; give the pages k and v hold (>= 1): "
                                                          "block-table entries are clamped into 0..num_pages-1",
                                                          a.num_pages));
        check_tensor("k", a.k, p.vec_qk, false, a.num_pages, a.page_size, c.num_heads_kv, p.head_dim_qk);
        check_tensor("v", a.v, p.vec_v, false, a.num_pages, a.page_size, c.num_heads_kv, p.head_dim_v);
        if (!a.block_table) throw ArgumentError("block_table", "is null; a paged KV cache needs its block table");
        if (!aligned(a.block_table, 4)) throw ArgumentError("block_table", "must be 4-byte aligned (int32)");
        if (a.pages_per_seq < 1)
            throw ArgumentError("pages_per_seq", util::format("{} is out of range; allowed >= 1", a.pages_per_seq));
        if (a.block_table_stride < a.pages_per_seq || a.block_table_stride > kMaxTensorElements / kMaxBatch)
            throw ArgumentError("block_table_stride", util::format("{} is out of range; allowed pages_per_seq ({})..{}",
                                                                   a.block_table_stride, a.pages_per_seq,
                                                                   kMaxTensorElements / kMaxBatch));
        if (std::int64_t(a.pages_per_seq) * a.page_size < a.seqlen_k)
            throw ArgumentError("seqlen_k", util::format("{} is above the block table's capacity: pages_per_seq {} x "
                                                         "page_size {} = {} tokens",
                                                         a.seqlen_k, a.pages_per_seq, a.page_size,
                                                         std::int64_t(a.pages_per_seq) * a.page_size));
    } else {
        check_tensor("k", a.k, p.vec_qk, false, a.batch, a.seqlen_k, c.num_heads_kv, p.head_dim_qk);
        check_tensor("v", a.v, p.vec_v, false, a.batch, a.seqlen_k, c.num_heads_kv, p.head_dim_v);
        if (a.block_table || a.page_size || a.pages_per_seq || a.num_pages)
            throw ArgumentError(a.block_table     ? "block_table"
                                : a.page_size     ? "page_size"
                                : a.pages_per_seq ? "pages_per_seq"
                                                  : "num_pages",
                                "is for paged configs (paged_kv); this kernel reads a dense cache");
    }
    if (!aligned(a.seqlens_k, 4)) throw ArgumentError("seqlens_k", "must be 4-byte aligned (int32)");
}

void check_workspace(const void* workspace, std::size_t bytes, std::size_t need, const char* why) {
    if (need == 0) return;
    if (!workspace)
        throw ArgumentError("workspace", util::format("is null; this call ({}) needs {} bytes (workspace_bytes())", why,
                                                      need));
    if (!aligned(workspace, 256)) throw ArgumentError("workspace", "must be 256-byte aligned (cudaMalloc's pointers are)");
    if (bytes < need)
        throw ArgumentError("workspace_bytes", util::format("{} is too small; this call ({}) needs {}", bytes, why, need));
}

}  // namespace rtattn::kernels
