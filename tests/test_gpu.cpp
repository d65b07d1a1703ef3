// The forward suite on the GPU: Runtime::get -> Kernel::forward over tables of cases (head dims x dtypes x masks x
// head layouts; degenerate and long shapes; strides and layouts; softmax scales), a CUDA-graph capture, argument
// errors and the memory tier, judged against the float64 host reference by the harness in gpu_harness.hpp.
#include <array>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "catch.hpp"
#include "gpu_harness.hpp"

using namespace rtattn;
using namespace rtattn::test::gpu;
using rtattn::test::kPoison16;

namespace {

constexpr Dtype kDtypes[] = {Dtype::bf16, Dtype::fp16};
constexpr bool kCausal[] = {false, true};

std::vector<Case> matrix_cases() {
    // MHA, GQA (group 4) and MQA; seqlens that are tile multiples of nothing, with seqlen_q != seqlen_k.
    constexpr std::pair<int, int> kHeads[] = {{4, 4}, {8, 2}, {4, 1}};
    std::vector<Case> out;
    for (int d : {1, 8, 17, 32, 44, 48, 64, 76, 80, 96, 100, 128, 132, 136, 140, 144, 160, 192, 255, 256})
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                for (auto [hq, hkv] : kHeads)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = hq,
                                   .heads_kv = hkv, .batch = 2, .seqlen_q = 77, .seqlen_k = 211});
    return out;
}

std::vector<Case> shape_cases() {
    // Single rows and keys, one partial tile, many full tiles, and (300, 77) / (1000, 1) where causal leaves
    // leading query rows with no key at all.
    constexpr std::pair<int, int> kSeqlens[] = {{1, 1}, {1, 1000}, {1000, 1}, {77, 77}, {1000, 1000}, {300, 77}};
    std::vector<Case> out;
    for (int d : {64, 128, 132, 256})
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                for (auto [sq, sk] : kSeqlens)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = 4, .heads_kv = 2,
                                   .batch = 3, .seqlen_q = sq, .seqlen_k = sk, .dist = Dist::normal});
    // Long key ranges: the K/V ring wraps a dozen times, so every barrier phase flips many times per CTA.
    for (int d : {100, 128, 132})
        for (bool causal : kCausal)
            out.push_back({.d_qk = d, .d_v = d, .causal = causal, .heads_q = 2, .heads_kv = 1, .batch = 1,
                           .seqlen_q = 700, .seqlen_k = 3001, .dist = Dist::normal});
    return out;
}

std::vector<Case> stride_cases() {
    // vec widths 1 (d17), 8 (d64), 4 (d100, d132, d140, d132/100: split rows on sm_90a; d76/140 the cooperative
    // kernel); d256 (the largest tiles); and head_dim_v != head_dim_qk. Split rows load
    // with TMA where a layout keeps rows 8 bytes from 16-byte boundaries at most (contiguous, packed, shifted, head
    // gaps: K/V heads alternate or swap alignment, NaN between heads), else with cp.async.
    constexpr std::pair<int, int> kDims[] = {{17, 17},   {64, 64},   {100, 100}, {132, 132}, {140, 140},
                                             {256, 256}, {192, 128}, {132, 100}, {76, 140}};
    constexpr Layout kLayouts[] = {Layout::contiguous, Layout::padded,  Layout::head_major, Layout::packed_qkv,
                                   Layout::shared_kv,  Layout::shifted, Layout::head_gaps};
    std::vector<Case> out;
    for (auto [dqk, dv] : kDims)
        for (Layout layout : kLayouts)
            for (Dtype dt : kDtypes)
                for (bool causal : kCausal) {
                    const bool self = layout == Layout::packed_qkv;  // one buffer: seqlen_q == seqlen_k
                    out.push_back({.d_qk = dqk, .d_v = dv, .dtype = dt, .causal = causal, .heads_q = 4,
                                   .heads_kv = 2, .batch = 2, .seqlen_q = self ? 150 : 77,
                                   .seqlen_k = self ? 150 : 211, .layout = layout});
                }
    // LSE is optional: with a null pointer nothing may be written to where it would have gone.
    for (int d : {64, 132})
        out.push_back({.d_qk = d, .d_v = d, .causal = true, .seqlen_q = 300, .seqlen_k = 77, .with_lse = false});
    return out;
}

std::vector<Case> split_row_cases() {
    // Head dims of 4 mod 8 load K/V through split rows on sm_90a (TMA for the main panels, 4 to 28 columns by the
    // producer threads; d84 with V padded to 96) where the kv heads make packed rows 16-byte multiples: even counts
    // here, and d140 with 15 heads does not (the cooperative kernel). d108 and d236 with 4 kv heads rotate rows to
    // 32-byte boxes in four classes (up to 12 columns), 2 and 6 in two; the other 12 mod 16 dims (d76, 140, 172, 204,
    // 220) shift whole rows instead. 8 mod 16 (d72, d136, d200) split at any count, odd ones too.
    // d44: mma.sync (a 3-consumer tile). Normal inputs, several key tiles.
    constexpr int kShapes[][3] = {{44, 8, 2},  {76, 8, 2},   {108, 6, 2},  {140, 30, 6}, {172, 4, 4},
                                  {204, 4, 2}, {236, 2, 2},  {140, 15, 15}, {132, 9, 3}, {108, 3, 1},
                                  {84, 8, 4},  {92, 4, 2},   {156, 6, 2},  {220, 2, 2},  {136, 4, 2},
                                  {72, 3, 3},  {200, 5, 5},  {140, 8, 4},  {220, 8, 4},  {212, 4, 4},
                                  {108, 8, 4}, {236, 4, 4}};
    std::vector<Case> out;
    for (auto [d, hq, hkv] : kShapes)
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = hq, .heads_kv = hkv,
                               .batch = 2, .seqlen_q = 190, .seqlen_k = 333, .dist = Dist::normal});
    return out;
}

std::vector<Case> shift_row_cases() {
    // Head dims off the 16 grid load whole rows by TMA on sm_90a, each box from the 32-byte boundary at or before the
    // row (16-byte where the pad leaves too little room), where the kv heads make packed rows 16-byte multiples:
    // odd dims with 8 or 16 kv heads (every shift 0..15; rows 16- or 32-byte multiples), 2 mod 4 with 4 or 8, 4 mod
    // 8 (last panels 16, 32 or 64 wide), 12 mod 16 (half the heads on 16-byte boxes), 8 mod 16 with 1 or 2 kv heads,
    // d_qk != d_v (K and V shift apart); 11, 13, 14, 15 mod 16 (and d162, d226) with 16 more columns of room, past
    // 256 at d251, 253, 254, 255 (272 columns, 32-key tiles; d255/128 stays off that row: mma.sync). Odd dims up to
    // 64 with many columns to zero on 128 query rows, not 192: d1, d3, d33 causal, d43 both.
    // Normal inputs, several key tiles.
    constexpr int kShapes[][4] = {  // d_qk, d_v, heads_q, heads_kv
        {1, 1, 16, 16},     {3, 3, 8, 8},       {9, 9, 8, 8},       {33, 33, 16, 8},    {131, 131, 16, 16},
        {131, 131, 8, 8},   {201, 201, 16, 16}, {241, 241, 8, 8},   {130, 130, 8, 8},   {130, 130, 8, 4},
        {138, 138, 4, 4},   {54, 54, 8, 4},     {250, 250, 8, 4},   {116, 116, 8, 4},   {180, 180, 4, 2},
        {244, 244, 4, 4},   {52, 52, 8, 2},     {20, 20, 8, 8},     {124, 124, 8, 4},   {188, 188, 4, 4},
        {252, 252, 4, 2},   {44, 44, 8, 4},     {60, 60, 4, 4},     {88, 88, 4, 1},     {120, 120, 8, 8},
        {152, 152, 4, 2},   {216, 216, 2, 1},   {248, 248, 2, 2},   {24, 24, 8, 1},     {132, 100, 8, 4},
        {100, 132, 8, 4},   {131, 64, 16, 16},  {64, 131, 16, 8},   {131, 128, 8, 8},   {127, 127, 8, 8},
        {141, 141, 16, 8},  {46, 46, 8, 4},     {239, 239, 8, 8},   {162, 162, 8, 8},   {226, 226, 4, 4},
        {253, 253, 16, 16}, {251, 251, 8, 8},   {254, 254, 8, 4},   {255, 255, 16, 8},  {255, 128, 8, 8},
        {43, 43, 8, 8}};
    std::vector<Case> out;
    for (auto [dqk, dv, hq, hkv] : kShapes)
        for (Dtype dt : kDtypes)
            for (bool causal : kCausal)
                out.push_back({.d_qk = dqk, .d_v = dv, .dtype = dt, .causal = causal, .heads_q = hq,
                               .heads_kv = hkv, .batch = 2, .seqlen_q = 190, .seqlen_k = 333, .dist = Dist::normal});
    // Layouts: NaN gaps between heads (the producer zeroes them in K; mma.sync masks them out of K's fragments), a
    // fused QKV row, K/V shared by the batch; head-major rows and offset pointers load with cp.async (a box may not
    // start off 16 bytes; mma.sync's shifted rows read from the boundary before the first row, inside the buffer).
    // Pinned to sm_90 (test_gpu_sm90_mma) the whole table runs the mma.sync forward's shifted rows.
    constexpr Layout kLayouts[] = {Layout::head_gaps, Layout::packed_qkv, Layout::shared_kv, Layout::padded,
                                   Layout::head_major, Layout::shifted};
    for (auto [d, hq, hkv] : {std::array{131, 16, 8}, std::array{130, 8, 4}, std::array{116, 8, 4},
                              std::array{88, 4, 2}})
        for (Layout layout : kLayouts)
            for (bool causal : kCausal) {
                const bool self = layout == Layout::packed_qkv;
                out.push_back({.d_qk = d, .d_v = d, .causal = causal, .heads_q = hq, .heads_kv = hkv, .batch = 2,
                               .seqlen_q = self ? 150 : 77, .seqlen_k = self ? 150 : 211, .layout = layout});
            }
    return out;
}

std::vector<Case> persistent_cases() {
    // More work units than an H100 or H200 has SMs (132), so that persistent CTAs walk several (sm_90a, d<=128 and
    // d140): query blocks one at a time, or, causal, pairs of them (the longest with the shortest; an odd count
    // leaves the middle block alone); the K/V ring, Q loaded under the last PV and O's own staging tile carry over
    // from one tile to the next. Keyless causal rows (600 x 200) make tiles with no key block at all.
    // d64: 192-row tiles; d96: ping-pong; d140 with 4 kv heads: split rows in four classes. O staged over Q, the next
    // Q loaded after the store: d132 (split rows, wide V tiles), d192 (112-key tiles), d256.
    struct Shape {
        int d, hq, hkv, batch, sq, sk;
    };
    constexpr Shape kShapes[] = {{128, 32, 8, 5, 300, 520}, {64, 32, 4, 4, 400, 333}, {140, 16, 4, 6, 300, 600},
                                 {96, 32, 8, 4, 600, 200},  {132, 16, 4, 5, 300, 500}, {192, 16, 8, 5, 260, 300},
                                 {256, 16, 4, 5, 300, 300}};
    std::vector<Case> out;
    for (const auto& s : kShapes)
        for (bool causal : kCausal)
            out.push_back({.d_qk = s.d, .d_v = s.d, .causal = causal, .heads_q = s.hq, .heads_kv = s.hkv,
                           .batch = s.batch, .seqlen_q = s.sq, .seqlen_k = s.sk, .dist = Dist::normal});
    return out;
}

std::vector<Case> scale_cases() {
    // Both differ from every default here (1/sqrt(d) <= 0.25 for d >= 17); with normal inputs 2.0 makes rows
    // nearly one-hot, which stresses the running-max rescaling.
    std::vector<Case> out;
    for (int d : {17, 64, 132, 256})
        for (double scale : {0.5, 2.0})
            for (Dtype dt : kDtypes)
                for (bool causal : kCausal)
                    out.push_back({.d_qk = d, .d_v = d, .dtype = dt, .causal = causal, .heads_q = 4, .heads_kv = 2,
                                   .scale = scale, .dist = Dist::normal});
    return out;
}

// Sliding windows (config.local; the bounds are call arguments, so one kernel serves every window): 0 and 1 keys,
// bounds that cut tiles anywhere, one side unbounded, bounds past the sequence, (-1, -1) (the plain mask); queries
// fewer and more than keys (rows whose window misses every key: O = 0, LSE = +inf). sm_90a: d64/d128/d256 the
// warp-specialized family, d100 shifted and d132 split rows; the 32-head d128 shapes walk persistent tiles.
std::vector<Case> window_cases() {
    const std::vector<std::pair<int, int>> full = {{0, 0}, {1, 3}, {50, -1}, {-1, 50}, {130, 77}, {1000, 1000},
                                                   {-1, -1}};
    const std::vector<std::pair<int, int>> causal_windows = {{0, 0}, {1, -1}, {100, 0}, {1000, -1}, {-1, -1}};
    std::vector<Case> out;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 256})
        for (bool causal : kCausal)
            for (auto [left, right] : causal ? causal_windows : full)
                for (auto [sq, sk] : {std::pair{300, 500}, {500, 300}}) {
                    if (sq > sk && left > 1) continue;  // more queries than keys: the narrow windows
                    out.push_back({.d_qk = d, .d_v = d, .dtype = i % 3 ? Dtype::bf16 : Dtype::fp16, .causal = causal,
                                   .heads_q = 4, .heads_kv = i++ % 2 ? 2 : 1, .seqlen_q = sq, .seqlen_k = sk,
                                   .local = true, .window_left = left, .window_right = right});
                }
    for (bool causal : kCausal)
        out.push_back({.d_qk = 128, .d_v = 128, .causal = causal, .heads_q = 32, .heads_kv = 8, .batch = 3,
                       .seqlen_q = 1000, .seqlen_k = 1000, .dist = Dist::normal, .local = true, .window_left = 256,
                       .window_right = causal ? 0 : 300});
    return out;
}

// Attention sinks (config.sinks; the logits are a call argument): every forward family's epilogue (sm_90a: d64/d128/
// d256 warp-specialized, d100 shifted and d132 split rows, d1 mma.sync), queries fewer and more than keys (causal rows
// with no key: O = 0, LSE = the sink), with a window, strided layouts, without LSE, and persistent tiles (32 heads).
std::vector<Case> sink_cases() {
    std::vector<Case> out;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 256})
        for (bool causal : kCausal)
            for (auto [sq, sk] : {std::pair{300, 500}, {500, 300}})
                out.push_back({.d_qk = d, .d_v = d, .dtype = i % 3 ? Dtype::bf16 : Dtype::fp16, .causal = causal,
                               .heads_q = 4, .heads_kv = i++ % 2 ? 2 : 1, .seqlen_q = sq, .seqlen_k = sk,
                               .layout = i % 4 == 1 ? Layout::padded : Layout::contiguous,
                               .dist = i % 5 == 0 ? Dist::normal : Dist::uniform, .sinks = true});
    for (bool causal : kCausal) {
        out.push_back({.d_qk = 128, .d_v = 128, .causal = causal, .heads_q = 32, .heads_kv = 8, .batch = 3,
                       .seqlen_q = 1000, .seqlen_k = 1000, .dist = Dist::normal, .sinks = true});
        out.push_back({.d_qk = 64, .d_v = 64, .causal = causal, .heads_q = 8, .heads_kv = 1, .seqlen_q = 400,
                       .seqlen_k = 700, .local = true, .window_left = 128, .window_right = causal ? -1 : 0,
                       .sinks = true});
        out.push_back({.d_qk = 80, .d_v = 80, .dtype = Dtype::fp16, .causal = causal, .with_lse = false,
                       .sinks = true});
    }
    return out;
}

// A score variant's cases over every forward family (d1, 64, 100, 128, 132, 256; causal and not; Sq < Sk and Sq > Sk;
// fp16 and bf16; padded layouts; GQA): vary(case, index) sets the variant.
template <class Vary>
std::vector<Case> family_cases(Vary vary) {
    std::vector<Case> out;
    int i = 0;
    for (int d : {1, 64, 100, 128, 132, 256})
        for (bool causal : kCausal)
            for (auto [sq, sk] : {std::pair{300, 500}, {500, 300}}) {
                Case c{.d_qk = d, .d_v = d, .dtype = i % 4 == 3 ? Dtype::fp16 : Dtype::bf16, .causal = causal,
                       .heads_q = 4, .heads_kv = i % 2 ? 2 : 1, .seqlen_q = sq, .seqlen_k = sk,
                       .layout = i % 4 == 1 ? Layout::padded : Layout::contiguous};
                vary(c, i++);
                out.push_back(c);
            }
    return out;
}

// Softcapping (config.softcap; the cap is a call argument): every forward family (as sink_cases), scores scaled up
// (N(0, 9)) so a cap of 5 bends most of them and 30 the tails, keyless rows, with a window, with sinks, without LSE,
// and persistent tiles.
std::vector<Case> softcap_cases() {
    std::vector<Case> out = family_cases([](Case& c, int i) {
        c.scale = 3.0 / std::sqrt(double(c.d_qk)), c.dist = Dist::normal;
        c.softcap = i % 3 == 0 ? 30.f : 5.f;
    });
    for (bool causal : kCausal) {
        out.push_back({.d_qk = 128, .d_v = 128, .causal = causal, .heads_q = 32, .heads_kv = 8, .batch = 3,
                       .seqlen_q = 1000, .seqlen_k = 1000, .dist = Dist::normal, .softcap = 2.f});
        out.push_back({.d_qk = 64, .d_v = 64, .causal = causal, .heads_q = 8, .heads_kv = 1, .seqlen_q = 400,
                       .seqlen_k = 700, .scale = 0.4, .dist = Dist::normal, .local = true, .window_left = 128,
                       .window_right = causal ? -1 : 0, .sinks = true, .softcap = 8.f});
        out.push_back({.d_qk = 80, .d_v = 80, .dtype = Dtype::fp16, .causal = causal, .with_lse = false,
                       .softcap = 0.5f});
    }
    return out;
}

// ALiBi (config.alibi; slopes a call argument, [heads_q] or [batch, heads_q]): every forward family (as sink_cases),
// bottom-right aligned distances (Sq < Sk and Sq > Sk, keyless rows), with a cap, a window and sinks, without LSE.
std::vector<Case> alibi_cases() {
    std::vector<Case> out = family_cases([](Case& c, int i) {
        c.softcap = i % 5 == 2 ? 5.f : 0.f;
        c.alibi = i % 3 == 0 ? 2 : 1;
    });
    for (bool causal : kCausal) {
        out.push_back({.d_qk = 128, .d_v = 128, .causal = causal, .heads_q = 32, .heads_kv = 8, .batch = 3,
                       .seqlen_q = 1000, .seqlen_k = 1000, .alibi = 2});
        out.push_back({.d_qk = 64, .d_v = 64, .causal = causal, .heads_q = 8, .heads_kv = 1, .seqlen_q = 400,
                       .seqlen_k = 700, .local = true, .window_left = 128, .window_right = causal ? -1 : 0,
                       .sinks = true, .alibi = 1});
        out.push_back({.d_qk = 80, .d_v = 80, .dtype = Dtype::fp16, .causal = causal, .with_lse = false, .alibi = 1});
        // Pad 224 takes 80-key tiles with ALiBi: d216 shifted rows, d224 whole ones.
        out.push_back({.d_qk = 216, .d_v = 216, .causal = causal, .heads_q = 4, .heads_kv = 2, .seqlen_q = 300,
                       .seqlen_k = 500, .alibi = 1});
        out.push_back({.d_qk = 224, .d_v = 224, .causal = causal, .heads_q = 4, .heads_kv = 4, .seqlen_q = 500,
                       .seqlen_k = 300, .alibi = 2});
    }
    return out;
}

std::vector<Case> graph_cases() {
    return {{.d_qk = 128, .d_v = 128, .dtype = Dtype::bf16, .causal = true, .heads_q = 8, .heads_kv = 2},
            {.d_qk = 132, .d_v = 132, .dtype = Dtype::fp16, .causal = false, .layout = Layout::padded}};
}

// Configs the argument-error and cache tests use: vec 8 (d128) and vec 4 (d132).
std::vector<Case> error_cases() {
    return {{.d_qk = 128, .d_v = 128, .dtype = Dtype::bf16}, {.d_qk = 132, .d_v = 132, .dtype = Dtype::fp16}};
}

void warm_all_tables() {
    warm({matrix_cases(), shape_cases(), stride_cases(), split_row_cases(), shift_row_cases(), persistent_cases(),
          scale_cases(), window_cases(), sink_cases(), softcap_cases(), alibi_cases(), graph_cases(),
          error_cases()});
}

}  // namespace

TEST_CASE("forward matches the float64 reference: head_dim x dtype x causal x MHA/GQA/MQA", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    const auto cases = matrix_cases();
    REQUIRE(cases.size() == 20 * 2 * 2 * 3);  // head dims x dtypes x causal x head layouts
    run_table("matrix", cases);
}

TEST_CASE("forward handles degenerate and long sequence shapes, including keyless causal rows", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("shapes", shape_cases());
}

TEST_CASE("forward honours arbitrary strides and head_dim_v != head_dim_qk", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("strides", stride_cases());
}

TEST_CASE("head dims of 4 mod 8 with kv head counts that do and do not make 16-byte rows", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("split rows", split_row_cases());
}

TEST_CASE("head dims off the 16 grid: whole rows shifted to aligned TMA boxes, any shift, any layout", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("shifted rows", shift_row_cases());
}

TEST_CASE("persistent CTAs walk many tiles: query blocks, causal pairs, keyless tiles", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("persistent", persistent_cases());
}

TEST_CASE("softmax_scale override is applied to O and LSE", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("scale", scale_cases());
}

TEST_CASE("sliding windows: every forward family, window sizes 0, 1, unaligned, unbounded and past the sequence",
          "[gpu][local]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("windows", window_cases());
}

TEST_CASE("attention sinks: every forward family's epilogue, keyless rows, windows, persistent tiles",
          "[gpu][sinks]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("sinks", sink_cases());
}

TEST_CASE("ALiBi: every forward family, slopes per head or per sequence, with caps, windows and sinks",
          "[gpu][alibi]") {
    SKIP_WITHOUT_GPU();
    run_table("alibi", alibi_cases());
}

TEST_CASE("softcapping: every forward family, caps that bend most scores and only the tails, with windows and sinks",
          "[gpu][softcap]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    run_table("softcap", softcap_cases());
}

namespace {

// Owns a captured graph and its executable instance.
struct Graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    ~Graph() {
        if (exec) driver::api().cuGraphExecDestroy(exec);
        if (graph) driver::api().cuGraphDestroy(graph);
    }
};

// Capturing fails (and invalidates the capture) if forward() synchronizes or allocates, so a successful capture
// plus correct replays with new data proves it only enqueues the launch.
void check_graph_replay(const Case& c) {
    const auto& api = driver::api();
    const Kernel kernel = runtime().get(c.config());
    const Problem inputs[2] = {make_problem(c, 0), make_problem(c, 1)};  // same layout, different values
    DeviceProblem dev(inputs[0]);
    dev.upload_inputs(inputs[0]);
    dev.poison_outputs(inputs[0]);
    sync_legacy_stream();  // the capture stream does not wait for the legacy stream

    driver::Stream stream;
    Graph g;
    driver::check(api.cuStreamBeginCapture(stream.get(), CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture");
    try {
        kernel.forward(dev.args(inputs[0]), stream.get());
    } catch (...) {
        api.cuStreamEndCapture(stream.get(), &g.graph);  // leave the stream usable, then report
        throw;
    }
    driver::check(api.cuStreamEndCapture(stream.get(), &g.graph), "cuStreamEndCapture");
    REQUIRE(g.graph != nullptr);

    // Capture records the launch without running it: the output must still be all poison.
    {
        const DeviceResult untouched = dev.download(inputs[0]);
        CHECK(test::count_bits(untouched.o_buffer, kPoison16) == untouched.o_buffer.size());
    }

    driver::check(api.cuGraphInstantiate(&g.exec, g.graph, 0), "cuGraphInstantiate");
    for (int run = 0; run < 2; ++run) {
        INFO("graph launch " << run + 1 << " of 2");
        const Problem& p = inputs[run];
        if (run > 0) {  // new values into the same device buffers the graph was captured with
            dev.upload_inputs(p);
            dev.poison_outputs(p);
            sync_legacy_stream();
        }
        driver::check(api.cuGraphLaunch(g.exec, stream.get()), "cuGraphLaunch");
        stream.sync();
        const Outcome r = evaluate(p, dev.download(p), reference_for(p));
        CHECK(judge(r, c) == "");
    }
}

}  // namespace

TEST_CASE("forward is capturable into a CUDA graph and replays with new inputs", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    for (const Case& c : graph_cases()) {
        INFO("case: " << c.describe());
        try {
            check_graph_replay(c);
        } catch (const std::exception& e) {
            FAIL_CHECK("exception: " << e.what());
        }
    }
}

namespace {

// The field an ArgumentError names, or a description of what happened instead.
std::string argument_error_field(const Kernel& kernel, const ForwardArgs& a) {
    try {
        kernel.forward(a);
        return "<no error>";
    } catch (const ArgumentError& e) {
        // The message must lead with the field, so a user reading only what() knows which argument is wrong.
        if (std::string(e.what()).rfind(e.field() + ":", 0) != 0) return "<what() does not start with field>";
        return e.field();
    } catch (const std::exception& e) {
        return std::string("<other exception: ") + e.what() + ">";
    }
}

const void* offset_elems(const void* p, std::int64_t elems) {
    return static_cast<const char*>(p) + elems * std::int64_t(sizeof(std::uint16_t));
}

struct BadArgs {
    const char* what;
    std::function<void(ForwardArgs&)> mutate;
    const char* field;
};

// Mutations of a valid ForwardArgs, each expected to be refused naming `field`. `vec` is the kernel's vector
// width (>= 2 here), so "vec / 2" is the smallest misalignment it must reject.
std::vector<BadArgs> bad_args(int vec, int dim) {
    const int half = vec / 2;
    return {
        {"null q", [](ForwardArgs& a) { a.q.ptr = nullptr; }, "q.ptr"},
        {"null k", [](ForwardArgs& a) { a.k.ptr = nullptr; }, "k.ptr"},
        {"null v", [](ForwardArgs& a) { a.v.ptr = nullptr; }, "v.ptr"},
        {"null o", [](ForwardArgs& a) { a.o.ptr = nullptr; }, "o.ptr"},
        {"q one element off", [](ForwardArgs& a) { a.q.ptr = offset_elems(a.q.ptr, 1); }, "q.ptr"},
        {"k half a vector off", [=](ForwardArgs& a) { a.k.ptr = offset_elems(a.k.ptr, half); }, "k.ptr"},
        {"o one element off", [](ForwardArgs& a) { a.o.ptr = offset_elems(a.o.ptr, 1); }, "o.ptr"},
        {"q seq_stride off by half a vector", [=](ForwardArgs& a) { a.q.seq_stride += half; }, "q.seq_stride"},
        {"k head_stride odd", [](ForwardArgs& a) { a.k.head_stride += 1; }, "k.head_stride"},
        {"v batch_stride off by half a vector", [=](ForwardArgs& a) { a.v.batch_stride += half; }, "v.batch_stride"},
        {"o seq_stride odd", [](ForwardArgs& a) { a.o.seq_stride += 1; }, "o.seq_stride"},
        {"q negative batch_stride", [=](ForwardArgs& a) { a.q.batch_stride = -vec; }, "q.batch_stride"},
        {"o heads overlap", [=](ForwardArgs& a) { a.o.head_stride = vec * ((dim / 2) / vec); }, "o"},
        {"o rows overlap heads", [](ForwardArgs& a) { a.o.seq_stride = a.o.head_stride; }, "o"},
        {"o batches alias", [](ForwardArgs& a) { a.o.batch_stride = 0; }, "o"},
        {"batch 0", [](ForwardArgs& a) { a.batch = 0; }, "batch"},
        {"batch -1", [](ForwardArgs& a) { a.batch = -1; }, "batch"},
        {"batch 65536 (grid z limit)", [](ForwardArgs& a) { a.batch = 65536; }, "batch"},
        {"seqlen_q 0", [](ForwardArgs& a) { a.seqlen_q = 0; }, "seqlen_q"},
        {"seqlen_k 0", [](ForwardArgs& a) { a.seqlen_k = 0; }, "seqlen_k"},
        {"lse not 4-byte aligned",
         [](ForwardArgs& a) { a.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(a.lse) + 2); }, "lse"},
    };
}

}  // namespace

TEST_CASE("forward rejects bad arguments with an ArgumentError naming the field", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    for (const Case& c : error_cases()) {
        const int vec = vec_width(c.d_qk);
        INFO("case: " << c.describe() << " (vector width " << vec << ")");
        const Kernel kernel = runtime().get(c.config());
        const Problem p = make_problem(c);
        DeviceProblem dev(p);
        dev.upload_inputs(p);
        dev.poison_outputs(p);
        const ForwardArgs valid = dev.args(p);

        for (const BadArgs& bad : bad_args(vec, c.d_v)) {
            INFO("mutation: " << bad.what);
            ForwardArgs a = valid;
            bad.mutate(a);
            CHECK(argument_error_field(kernel, a) == bad.field);
        }
        CHECK(argument_error_field(Kernel{}, valid) == "kernel");

        // Refused calls must not have launched anything; then the unmutated args must work, proving the refusals
        // came from the mutation and not from a broken baseline.
        const DeviceResult before = dev.download(p);
        CHECK(test::count_bits(before.o_buffer, kPoison16) == before.o_buffer.size());
        kernel.forward(valid);
        CHECK(judge(evaluate(p, dev.download(p), reference_for(p)), c) == "");
    }
}

TEST_CASE("get() for a cached config is a memory hit and returns an equivalent kernel", "[gpu]") {
    SKIP_WITHOUT_GPU();
    warm_all_tables();
    const Case c = error_cases().front();
    Runtime& rt = runtime();
    const Kernel first = rt.get(c.config());

    const CacheStats before = rt.stats();
    const Kernel second = rt.get(c.config());
    const CacheStats after = rt.stats();
    CHECK(after.memory_hits == before.memory_hits + 1);
    CHECK(after.disk_hits == before.disk_hits);
    CHECK(after.misses == before.misses);
    CHECK(after.compiles == before.compiles);
    CHECK(second.info().from_cache);
    CHECK(second.info().key == first.info().key);
    CHECK(second.config() == first.config());

    // Copying a Kernel shares its state rather than duplicating it (cheap to pass by value).
    const Kernel copy = first;
    CHECK(&copy.info() == &first.info());
    CHECK(&copy.config() == &first.config());

    // All three launch the same code: bit-identical outputs on the same inputs.
    const Problem p = make_problem(c);
    DeviceProblem dev(p);
    dev.upload_inputs(p);
    std::vector<DeviceResult> results;
    for (const Kernel* k : {&first, &second, &copy}) {
        dev.poison_outputs(p);
        k->forward(dev.args(p));
        results.push_back(dev.download(p));
    }
    CHECK(judge(evaluate(p, results[0], reference_for(p)), c) == "");
    const bool second_same = results[1].o_buffer == results[0].o_buffer;  // (not CHECKed directly: Catch would
    const bool copy_same = results[2].o_buffer == results[0].o_buffer;    // print every element on failure)
    CHECK(second_same);
    CHECK(copy_same);
}

