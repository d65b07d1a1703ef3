// The families' argument checks, without a GPU: a call's sizes and arguments against a plan, each bad input refused
// with the field named (the checks never read device memory, so pointers here are addresses only). The GPU suites
// run the same checks through Kernel::forward and BackwardKernel::backward.
#include <cstdint>
#include <limits>
#include <string>

#include "catch.hpp"
#include "kernels/args.hpp"
#include "kernels/backward.hpp"
#include "kernels/forward.hpp"
#include "plan/backward.hpp"
#include "plan/plan.hpp"
#include "core/errors.hpp"

using rtattn::AttentionConfig;
using rtattn::ForwardArgs;
using rtattn::TensorArg;
using rtattn::kernels::CallSizes;

namespace {

const void* at(std::uintptr_t address) { return reinterpret_cast<const void*>(address); }
constexpr std::uintptr_t kBase = std::uintptr_t(1) << 40;  // 256-byte aligned, never dereferenced

// A config and a well-formed dense call for it: B=2, S=64, 4 query heads on 2 kv heads, packed [B, S, H, d].
struct Call {
    AttentionConfig c;
    rtattn::plan::KernelPlan p;
    ForwardArgs a;
    CallSizes z() const { return {a.batch, a.seqlen_q, a.seqlen_k, a.num_splits, 264}; }
    std::string field() const {  // the field of the ArgumentError validate_args throws; "" when it accepts
        try {
            p.family->validate_args(p, c, a, z());
            rtattn::kernels::check_append(p, c, a);  // as Kernel::forward runs them
        } catch (const rtattn::ArgumentError& e) {
            return e.field();
        }
        return "";
    }
};

TensorArg dense(std::uintptr_t offset, int s, int h, int d) {
    return {at(kBase + offset), std::int64_t(s) * h * d, std::int64_t(h) * d, d};
}

Call call(int d, bool decode = false, bool paged = false) {
    Call x;
    x.c.head_dim_qk = d, x.c.num_heads_q = 4, x.c.num_heads_kv = 2, x.c.arch = "sm_90a";
    x.c.decode = decode, x.c.paged_kv = paged;
    x.p = rtattn::plan::plan(x.c);
    const int sq = decode ? 1 : 64;
    x.a.batch = 2, x.a.seqlen_q = sq, x.a.seqlen_k = 64;
    x.a.q = dense(0, sq, 4, d), x.a.o = dense(std::uintptr_t(1) << 30, sq, 4, d);
    if (paged) {  // 8 pages of 16 keys, a table of 4 pages per sequence
        x.a.k = {at(kBase + (std::uintptr_t(2) << 30)), 16 * 2 * d, 2 * d, d};
        x.a.v = {at(kBase + (std::uintptr_t(3) << 30)), 16 * 2 * d, 2 * d, d};
        x.a.block_table = static_cast<const std::int32_t*>(at(kBase + (std::uintptr_t(4) << 30)));
        x.a.block_table_stride = 4, x.a.pages_per_seq = 4, x.a.page_size = 16, x.a.num_pages = 8;
    } else {
        x.a.k = dense(std::uintptr_t(2) << 30, 64, 2, d), x.a.v = dense(std::uintptr_t(3) << 30, 64, 2, d);
    }
    return x;
}

}  // namespace

TEST_CASE("prefill calls: every bad argument is refused with its field", "[args]") {
    for (int d : {64, 132}) {
        CAPTURE(d);
        CHECK(call(d).field() == "");
        auto bad = [&](auto change) {
            Call x = call(d);
            change(x.a);
            return x.field();
        };
        CHECK(bad([](ForwardArgs& a) { a.q.ptr = nullptr; }) == "q.ptr");
        CHECK(bad([](ForwardArgs& a) { a.k.ptr = at(kBase + 2); }) == "k.ptr");  // not vector-aligned
        CHECK(bad([](ForwardArgs& a) { a.v.seq_stride = -8; }) == "v.seq_stride");
        CHECK(bad([](ForwardArgs& a) { a.o.seq_stride = 8; }) == "o");  // rows overlap
        CHECK(bad([](ForwardArgs& a) { a.batch = 0; }) == "batch");
        CHECK(bad([](ForwardArgs& a) { a.seqlen_k = (1 << 30) + 1; }) == "seqlen_k");
        CHECK(bad([](ForwardArgs& a) { a.num_splits = 2; }) == "num_splits");
        CHECK(bad([](ForwardArgs& a) { a.num_splits = 1; }) == "");  // "no split"
        // A dense batch may be a KV cache with its sequences' lengths (aligned int32).
        CHECK(bad([](ForwardArgs& a) { a.seqlens_k = static_cast<const std::int32_t*>(at(kBase)); }) == "");
        CHECK(bad([](ForwardArgs& a) { a.seqlens_k = static_cast<const std::int32_t*>(at(kBase + 2)); }) ==
              "seqlens_k");
        CHECK(bad([](ForwardArgs& a) { a.page_size = 16; }) == "page_size");
        CHECK(bad([](ForwardArgs& a) { a.lse = reinterpret_cast<float*>(kBase + 2); }) == "lse");
        CHECK(bad([](ForwardArgs& a) { a.total_q = 5; }) == "total_q");  // a varlen field on a dense config
    }
}

TEST_CASE("window bounds: only a local kernel takes them; -1 or more; causal: no right bound", "[args][local]") {
    for (int d : {64, 132}) {
        CAPTURE(d);
        auto field = [&](bool local, bool causal, int left, int right) {
            Call x = call(d);
            x.c.local = local, x.c.causal = causal;
            x.p = rtattn::plan::plan(x.c);
            x.a.window_size_left = left, x.a.window_size_right = right;
            return x.field();
        };
        CHECK(field(false, false, -1, -1) == "");
        CHECK(field(false, false, 0, -1) == "window_size_left");  // a zeroed struct on a kernel without a window
        CHECK(field(false, true, -1, 0) == "window_size_right");
        CHECK(field(true, false, -1, -1) == "");
        CHECK(field(true, false, 0, 0) == "");
        CHECK(field(true, false, 4096, 5) == "");
        CHECK(field(true, false, -2, 0) == "window_size_left");
        CHECK(field(true, false, 3, -7) == "window_size_right");
        CHECK(field(true, true, 100, 0) == "");
        CHECK(field(true, true, 100, -1) == "");
        CHECK(field(true, true, 100, 1) == "window_size_right");
    }
    // As the kernels hold them: an unbounded side (or one past the sequence) bounds nothing; causal: right 0.
    AttentionConfig c;
    c.local = true;
    using rtattn::kernels::window_bounds;
    CHECK(window_bounds(c, -1, -1, 300, 500).left == 500);
    CHECK(window_bounds(c, -1, -1, 300, 500).right == 300);
    CHECK(window_bounds(c, 7, 9, 300, 500).left == 7);
    CHECK(window_bounds(c, 7, 9, 300, 500).right == 9);
    CHECK(window_bounds(c, 600, 301, 300, 500).left == 500);
    CHECK(window_bounds(c, 600, 301, 300, 500).right == 300);
    c.causal = true;
    CHECK(window_bounds(c, 7, -1, 300, 500).right == 0);
}

TEST_CASE("sinks: a sinks kernel needs them (float32, aligned), any other refuses them, every pass", "[args][sinks]") {
    for (bool decode : {false, true}) {
        CAPTURE(decode);
        auto field = [&](bool sinks, const float* ptr) {
            Call x = call(128, decode, decode);
            x.c.sinks = sinks;
            x.p = rtattn::plan::plan(x.c);
            x.a.sinks = ptr;
            return x.field();
        };
        const float* some = static_cast<const float*>(at(kBase + 64));
        CHECK(field(false, nullptr) == "");
        CHECK(field(false, some) == "sinks");
        CHECK(field(true, nullptr) == "sinks");
        CHECK(field(true, some) == "");
        CHECK(field(true, reinterpret_cast<const float*>(kBase + 66)) == "sinks");
    }
}

TEST_CASE("softcap: a softcap kernel needs a finite cap > 0, any other takes 0, prefill and decode",
          "[args][softcap]") {
    for (bool decode : {false, true}) {
        CAPTURE(decode);
        auto field = [&](bool softcap, float cap) {
            Call x = call(128, decode, decode);
            x.c.softcap = softcap;
            x.p = rtattn::plan::plan(x.c);
            x.a.softcap = cap;
            return x.field();
        };
        CHECK(field(false, 0.f) == "");
        CHECK(field(false, 30.f) == "softcap");
        CHECK(field(true, 0.f) == "softcap");
        CHECK(field(true, -1.f) == "softcap");
        CHECK(field(true, std::numeric_limits<float>::infinity()) == "softcap");
        CHECK(field(true, std::numeric_limits<float>::quiet_NaN()) == "softcap");
        CHECK(field(true, 1e-35f) == "softcap");  // scale / softcap past a float
        CHECK(field(true, 30.f) == "");
        CHECK(field(true, 0.01f) == "");
    }
}

TEST_CASE("alibi: an ALiBi kernel needs slopes (float32, a row or a row per sequence), any other refuses them",
          "[args][alibi]") {
    auto field = [&](bool alibi, const float* slopes, std::int64_t stride) {
        Call x = call(128, false, false);
        x.c.alibi = alibi;
        x.p = rtattn::plan::plan(x.c);
        x.a.alibi_slopes = slopes, x.a.alibi_slopes_batch_stride = stride;
        return x.field();
    };
    const float* some = static_cast<const float*>(at(kBase + 64));
    const int hq = call(128, false, false).c.num_heads_q;
    CHECK(field(false, nullptr, 0) == "");
    CHECK(field(false, some, 0) == "alibi_slopes");
    CHECK(field(false, nullptr, hq) == "alibi_slopes_batch_stride");
    CHECK(field(true, nullptr, 0) == "alibi_slopes");
    CHECK(field(true, some, 0) == "");
    CHECK(field(true, some, hq) == "");
    CHECK(field(true, some, hq + 5) == "");  // padded rows
    CHECK(field(true, some, hq - 1) == "alibi_slopes_batch_stride");  // rows would overlap
    CHECK(field(true, some, -1) == "alibi_slopes_batch_stride");
    CHECK(field(true, reinterpret_cast<const float*>(kBase + 66), 0) == "alibi_slopes");
}

TEST_CASE("decode calls: query tokens, splits, the workspace and the cache", "[args]") {
    for (bool paged : {false, true}) {
        CAPTURE(paged);
        Call ok = call(128, true, paged);
        CHECK(ok.field() == "");
        auto bad = [&](auto change) {
            Call x = call(128, true, paged);
            change(x.a);
            return x.field();
        };
        CHECK(bad([](ForwardArgs& a) { a.seqlen_q = 17; }) == "seqlen_q");
        CHECK(bad([](ForwardArgs& a) { a.num_splits = 129; }) == "num_splits");
        CHECK(bad([](ForwardArgs& a) { a.num_splits = -1; }) == "num_splits");
        // Several splits need a workspace of the family's size, 256-byte aligned.
        Call split = call(128, true, paged);
        split.a.num_splits = 4;
        const std::size_t need = split.p.family->workspace_bytes(split.p, split.c, split.z());
        CHECK(need > 0);
        CHECK(split.field() == "workspace");
        split.a.workspace = const_cast<void*>(at(kBase + 128));
        split.a.workspace_bytes = need;
        CHECK(split.field() == "workspace");
        split.a.workspace = const_cast<void*>(at(kBase));
        split.a.workspace_bytes = need - 1;
        CHECK(split.field() == "workspace_bytes");
        split.a.workspace_bytes = need;
        CHECK(split.field() == "");
        if (paged) {
            CHECK(bad([](ForwardArgs& a) { a.page_size = 24; }) == "page_size");
            CHECK(bad([](ForwardArgs& a) { a.num_pages = 0; }) == "num_pages");
            CHECK(bad([](ForwardArgs& a) { a.block_table = nullptr; }) == "block_table");
            CHECK(bad([](ForwardArgs& a) { a.block_table_stride = 3; }) == "block_table_stride");
            CHECK(bad([](ForwardArgs& a) { a.seqlen_k = 65; }) == "seqlen_k");  // 4 pages x 16 keys
        } else {
            CHECK(bad([](ForwardArgs& a) { a.page_size = 16; }) == "page_size");  // a dense cache
        }
    }
    // The family's check of a workspace query is the call's: no workspace size for a call it would refuse.
    Call x = call(128, true);
    CHECK_THROWS_AS(x.p.family->check_call(x.p, x.c, {2, 17, 64, 0, 264}), rtattn::ArgumentError);
    CHECK_NOTHROW(x.p.family->check_call(x.p, x.c, {2, 16, 64, 0, 264}));
    Call prefill = call(128);
    CHECK_THROWS_AS(prefill.p.family->check_call(prefill.p, prefill.c, {2, 64, 64, 3, 264}), rtattn::ArgumentError);
}

TEST_CASE("KV append: a cache call's new tokens, with seqlens_k, tensors checked; none for varlen", "[args]") {
    const auto* lens = static_cast<const std::int32_t*>(at(kBase + (std::uintptr_t(5) << 30)));
    for (const auto& [decode, paged] : {std::pair{true, false}, {true, true}, {false, true}, {false, false}}) {
        for (int d : {64, 132}) {
            CAPTURE(decode, paged, d);
            auto field = [&](auto change) {
                Call x = call(d, decode, paged);
                x.a.seqlens_k = lens, x.a.seqlen_new = 3;
                x.a.k_new = dense(std::uintptr_t(6) << 30, 3, 2, d);
                x.a.v_new = dense(std::uintptr_t(7) << 30, 3, 2, d);
                if (decode && !paged) x.a.seqlen_q = 1;
                change(x);
                return x.field();
            };
            CHECK(field([](Call&) {}) == "");
            CHECK(field([](Call& x) { x.a.seqlens_k = nullptr; }) == "seqlens_k");  // where would they go?
            CHECK(field([](Call& x) { x.a.seqlen_new = -1; }) == "seqlen_new");
            CHECK(field([](Call& x) { x.a.seqlen_new = x.a.seqlen_k + 1; }) == "seqlen_new");
            CHECK(field([](Call& x) { x.a.seqlen_new = 0; }) == "k_new");  // tensors without a count
            CHECK(field([](Call& x) { x.a.seqlen_new = 0, x.a.k_new = x.a.v_new = {}; }) == "");
            CHECK(field([](Call& x) { x.a.k_new.ptr = nullptr; }) == "k_new.ptr");
            CHECK(field([](Call& x) { x.a.v_new.ptr = at(kBase + 2); }) == "v_new.ptr");  // not vector-aligned
            CHECK(field([](Call& x) { x.a.k_new.head_stride = 0; }) == "");  // read only: a broadcast is fine
            CHECK(field([](Call& x) { x.a.v.head_stride = 0; }) == "v");  // written: rows must not overlap
        }
    }
    Call x = call(64);
    x.c.varlen = true;
    x.p = rtattn::plan::plan(x.c);
    x.a.seqlen_new = 1;
    CHECK_THROWS_AS(rtattn::kernels::check_append(x.p, x.c, x.a), rtattn::ArgumentError);  // "is varlen"
    // One warp per new row along the grid's x: at most (2^31 - 1) x 8 rows (batch x seqlen_new x heads_kv, 2 here).
    Call big = call(64, false, false);
    big.a.seqlens_k = lens, big.a.batch = 64, big.a.seqlen_k = 1 << 28;
    auto append_field = [&](int seqlen_new) {
        big.a.seqlen_new = seqlen_new;
        try {
            rtattn::kernels::check_append(big.p, big.c, big.a);
        } catch (const rtattn::ArgumentError& e) {
            return e.field();
        }
        return std::string();
    };
    CHECK(append_field(1 << 28) == "seqlen_new");                          // 2^35 rows
    CHECK(append_field(std::int32_t(std::int64_t(INT32_MAX) * 8 / 128)) != "seqlen_new");  // the most that fit
}

TEST_CASE("a prefill against a paged cache checks the cache, and takes packed queries only", "[args]") {
    Call x = call(128, false, true);
    CHECK(x.field() == "");
    x.a.page_size = 0;
    CHECK(x.field() == "page_size");
    Call packed = call(128, false, true);
    packed.c.varlen = true;
    packed.p = rtattn::plan::plan(packed.c);
    packed.a.q.batch_stride = packed.a.o.batch_stride = 0;
    packed.a.cu_seqlens_q = static_cast<const std::int32_t*>(at(kBase));
    packed.a.total_q = 64;
    packed.a.batch = 1;
    CHECK(packed.field() == "");
    packed.a.cu_seqlens_k = packed.a.cu_seqlens_q;  // keys come from the cache, not packed rows
    CHECK(packed.field() == "cu_seqlens_k");
}

TEST_CASE("backward calls: tensors, the LSE and the plan's workspace", "[args][bwd]") {
    AttentionConfig c;
    c.head_dim_qk = 128, c.num_heads_q = 4, c.num_heads_kv = 2, c.arch = "sm_90a";
    const auto p = rtattn::plan::plan_backward(c);
    rtattn::BackwardArgs a;
    a.batch = 2, a.seqlen_q = a.seqlen_k = 64;
    a.q = dense(0, 64, 4, 128), a.o = dense(std::uintptr_t(1) << 30, 64, 4, 128);
    a.dout = dense(std::uintptr_t(2) << 30, 64, 4, 128), a.dq = dense(std::uintptr_t(3) << 30, 64, 4, 128);
    a.k = dense(std::uintptr_t(4) << 30, 64, 2, 128), a.v = dense(std::uintptr_t(5) << 30, 64, 2, 128);
    a.dk = dense(std::uintptr_t(6) << 30, 64, 2, 128), a.dv = dense(std::uintptr_t(7) << 30, 64, 2, 128);
    a.lse = static_cast<const float*>(at(kBase + (std::uintptr_t(8) << 30)));
    const CallSizes z{2, 64, 64};
    const std::size_t need = p.family->workspace_bytes(p, c, z);
    CHECK(need == p.workspace(2, 4, 64).bytes);
    a.workspace = const_cast<void*>(at(kBase + (std::uintptr_t(9) << 30)));
    a.workspace_bytes = need;
    auto field = [&](const rtattn::BackwardArgs& args) -> std::string {
        try {
            p.family->validate_args(p, c, args, z);
        } catch (const rtattn::ArgumentError& e) {
            return e.field();
        }
        return "";
    };
    CHECK(field(a) == "");
    auto bad = [&](auto change) {
        rtattn::BackwardArgs b = a;
        change(b);
        return field(b);
    };
    CHECK(bad([](rtattn::BackwardArgs& b) { b.lse = nullptr; }) == "lse");
    CHECK(bad([](rtattn::BackwardArgs& b) { b.dlse = reinterpret_cast<const float*>(kBase + 1); }) == "dlse");
    CHECK(bad([](rtattn::BackwardArgs& b) { b.dk.seq_stride = 8; }) == "dk");  // output rows overlap
    CHECK(bad([](rtattn::BackwardArgs& b) { b.workspace = nullptr; }) == "workspace");
    CHECK(bad([&](rtattn::BackwardArgs& b) { b.workspace_bytes = need - 1; }) == "workspace_bytes");
    CHECK(bad([](rtattn::BackwardArgs& b) { b.window_size_left = 16; }) == "window_size_left");  // not a local kernel
    const float* some = static_cast<const float*>(at(kBase + (std::uintptr_t(10) << 30)));
    CHECK(bad([&](rtattn::BackwardArgs& b) { b.sinks = some; }) == "sinks");  // not a sinks kernel
    CHECK(bad([&](rtattn::BackwardArgs& b) { b.dsinks = const_cast<float*>(some); }) == "dsinks");
    // A sinks kernel: sinks required, dsinks optional, both float32-aligned.
    c.sinks = true;
    const auto ps = rtattn::plan::plan_backward(c);
    auto sink_field = [&](const float* sinks, const float* dsinks) -> std::string {
        rtattn::BackwardArgs b = a;
        b.sinks = sinks, b.dsinks = const_cast<float*>(dsinks);
        try {
            ps.family->validate_args(ps, c, b, z);
        } catch (const rtattn::ArgumentError& e) {
            return e.field();
        }
        return "";
    };
    CHECK(sink_field(nullptr, nullptr) == "sinks");
    CHECK(sink_field(some, nullptr) == "");
    CHECK(sink_field(some, some + 64) == "");
    CHECK(sink_field(reinterpret_cast<const float*>(kBase + 2), nullptr) == "sinks");
    CHECK(sink_field(some, reinterpret_cast<const float*>(kBase + 6)) == "dsinks");
    // Softcap: the forward's cap, as the forward checks it (a softcap kernel needs one, any other takes 0).
    c.sinks = false;
    CHECK(bad([](rtattn::BackwardArgs& b) { b.softcap = 30.f; }) == "softcap");
    c.softcap = true;
    const auto pc = rtattn::plan::plan_backward(c);
    auto cap_field = [&](float cap) -> std::string {
        rtattn::BackwardArgs b = a;
        b.softcap = cap;
        try {
            pc.family->validate_args(pc, c, b, z);
        } catch (const rtattn::ArgumentError& e) {
            return e.field();
        }
        return "";
    };
    CHECK(cap_field(0.f) == "softcap");
    CHECK(cap_field(-2.f) == "softcap");
    CHECK(cap_field(std::numeric_limits<float>::quiet_NaN()) == "softcap");
    CHECK(cap_field(30.f) == "");
    CHECK_THROWS_AS(p.family->check_call(p, c, {0, 64, 64}), rtattn::ArgumentError);
}
