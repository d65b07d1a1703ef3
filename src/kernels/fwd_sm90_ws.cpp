// The warp-specialized Hopper forward family (templates/fwd/sm90_ws.cuh): a producer warpgroup streams K/V tiles with
// TMA (tensor maps encoded per launch: the K/V views here, the maps by kernels/tma) into a ring of mbarrier-guarded
// slots; consumer warpgroups overlap the softmax of block j with the PV of block j-1 and may take turns on the tensor
// cores (ping-pong).
#include "util/format.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "arch/arch.hpp"
#include "common/geometry.h"
#include "kernels/forward.hpp"
#include "kernels/sm90.hpp"
#include "kernels/tma.hpp"
#include "core/errors.hpp"
#include "util/env.hpp"

namespace rtattn::kernels {

namespace {

using tma::View;
using tma::whole_rows;

// Split rows: kv heads of class `cls` (every `classes`-th head), rotated by `rot` columns so that each row's boxes
// start `align` bytes aligned; the map covers the d - rot columns from there, of which the boxes read the tile's main
// part (geometry::split_main); the kernel moves the rest itself.
View split_rows(const TensorArg& t, int dim, int seqlen, int heads, int batch, int cls, int classes, int rot) {
    const auto* head0 = static_cast<const unsigned char*>(t.ptr) + std::int64_t(cls) * t.head_stride * 2;
    return {head0 + 2 * rot, dim - rot, {seqlen, t.seq_stride * 2},
            {(heads - cls + classes - 1) / classes, t.head_stride * 2 * classes}, {batch, t.batch_stride * 2}};
}

// RTATTN_PERSISTENT=0 or false: persistent kernels get a CTA per tile, as the others (each does one tile); for
// timing the scheduler against the plain grid with the same cubin. Read once, as RTATTN_TMA.
bool persistence_disabled() {
    static const bool off = !util::env_flag("RTATTN_PERSISTENT").value_or(true);
    return off;
}

// The K or V rows the maps span: [batch, seqlen_k] dense, one [total_k] run when packed (varlen; the kernel adds its
// sequence's first row to the seq coordinate), [num_pages, page_size] for a paged cache (the kernel looks the page
// up); and the rows of a box (a key tile, or what fits a page: geometry::paged_box_rows).
struct KvRows {
    int batch, seqlen;
    int box;
};

// Map dims follow the smaller of the seq and head strides (a map's head stride is head_step heads: split rows'
// classes); false where K and V would need different orders.
bool set_seq_dim(const ForwardArgs& a, int head_step, FwdParamsTma& out) {
    out.tma_seq_dim = a.k.seq_stride <= head_step * a.k.head_stride ? 1 : 2;
    return (a.v.seq_stride <= head_step * a.v.head_stride ? 1 : 2) == out.tma_seq_dim;
}

// The rotation that starts class `cls`'s rows `align` bytes aligned, or -1 where a stride would move rows of the class
// off that alignment or the tail is too narrow to take it.
int class_rotation(const TensorArg& t, KvRows rows, int heads, int cls, int classes, int align, int tail) {
    const auto stepped = [&](std::int64_t extent, std::int64_t stride_elems) {
        return extent <= 1 || stride_elems * 2 % align == 0;
    };
    if (!stepped(rows.seqlen, t.seq_stride) || !stepped(rows.batch, t.batch_stride) ||
        !stepped((heads - cls + classes - 1) / classes, t.head_stride * classes))
        return -1;
    const auto at = reinterpret_cast<std::uintptr_t>(t.ptr) + std::uintptr_t(std::int64_t(cls) * t.head_stride * 2);
    const int rot = int((align - at % align) % align / 2);
    return rot <= tail ? rot : -1;
}

// Four classes with 32-byte aligned boxes where the kernel's tails allow it (geometry::split_classes) and every
// class's rotation fits them (d140: up to 12 columns), else two with 16-byte aligned ones (rotations 0 or 4: vec-4
// arguments leave every row 8-byte aligned).
bool encode_split(const plan::KernelPlan& p, const ForwardArgs& a, KvRows rows, int heads_kv, FwdParamsTma& out) {
    if (reinterpret_cast<std::uintptr_t>(a.k.ptr) % 8 != 0 || reinterpret_cast<std::uintptr_t>(a.v.ptr) % 8 != 0)
        return false;
    // Main parts are multiples of 32 columns: panel kinds 0 and 1 only, the two maps of each class.
    const int k_main = geometry::split_main(p.pad_qk);
    const int v_main = geometry::split_main(geometry::v_tile_cols(p.pad_v, p.wide_v));
    const int most = geometry::split_classes(p.head_dim_qk - k_main, p.head_dim_v - v_main, p.block_n);
    for (int classes : {4, 2}) {
        if (classes > most) continue;
        const int align = 8 * classes;
        bool fits = true;
        for (int cls = 0; cls < std::min(classes, heads_kv) && fits; ++cls) {
            out.k_rot[cls] = class_rotation(a.k, rows, heads_kv, cls, classes, align, p.head_dim_qk - k_main);
            out.v_rot[cls] = class_rotation(a.v, rows, heads_kv, cls, classes, align, p.head_dim_v - v_main);
            fits = out.k_rot[cls] >= 0 && out.v_rot[cls] >= 0;
        }
        if (!fits || !set_seq_dim(a, classes, out)) continue;
        for (int cls = 0; cls < std::min(classes, heads_kv); ++cls) {
            const View k = split_rows(a.k, p.head_dim_qk, rows.seqlen, heads_kv, rows.batch, cls, classes, out.k_rot[cls]);
            const View v = split_rows(a.v, p.head_dim_v, rows.seqlen, heads_kv, rows.batch, cls, classes, out.v_rot[cls]);
            if (!tma::encode_panels(out.k_map + 2 * cls, k, k_main, rows.box, p.bf16, out.tma_seq_dim) ||
                !tma::encode_panels(out.v_map + 2 * cls, v, v_main, rows.box, p.bf16, out.tma_seq_dim))
                return false;
        }
        out.split_classes = classes;
        return true;
    }
    return false;
}

// Shifted rows, one tensor: its maps (one per panel of a `tile_cols`-wide tile), each kv head's shift (the columns
// from the box's start to the row's: the 32-byte boundary at or before the row where the tile leaves `room` columns
// for it, else the 16-byte one) and how a head's box coordinates step (FwdParamsTma). The view spans every head's
// columns of a seq row where the heads lie within one, else has a head dimension, whose stride must then be a 16-byte
// multiple. False where rows of a head would shift differently (a seq or batch stride off the 16-byte grid), a
// shift does not fit the room, or no map can be encoded.
bool encode_shifted(const plan::KernelPlan& p, const TensorArg& t, int dim, int tile_cols, KvRows rows, int heads,
                    TmaMap* maps, signed char (&shift)[16], int& col_step, int& head_step, int& seq_dim) {
    const auto stepped = [](std::int64_t extent, std::int64_t stride_elems, int align_elems) {
        return extent <= 1 || stride_elems % align_elems == 0;
    };
    const bool a16 = stepped(rows.seqlen, t.seq_stride, 16) && stepped(rows.batch, t.batch_stride, 16);
    if (!stepped(rows.seqlen, t.seq_stride, 8) || !stepped(rows.batch, t.batch_stride, 8)) return false;
    const int room = tile_cols - dim;
    for (int h = 0; h < 16; ++h) {  // a head's shift depends on h modulo 16 only
        const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(t.ptr) + std::uintptr_t(h * t.head_stride * 2);
        const int r16 = int(at % 32 / 2), r8 = int(at % 16 / 2);
        shift[h] = static_cast<signed char>(h >= heads ? 0 : a16 && r16 <= room ? r16 : r8);
        if (shift[h] > room) return false;
    }
    View v = whole_rows(t, dim, rows.seqlen, heads, rows.batch);
    const std::int64_t packed_cols = std::int64_t(heads - 1) * t.head_stride + dim;
    if (packed_cols <= t.seq_stride || heads == 1) {
        if (packed_cols + tile_cols >= (std::int64_t(1) << 31)) return false;  // box coordinates are 32-bit
        v.cols = int(packed_cols), v.head = {1, 0};
        col_step = int(t.head_stride), head_step = 0, seq_dim = 1;
    } else {
        if (t.head_stride * 2 % 16 != 0) return false;
        col_step = 0, head_step = 1;
        seq_dim = t.seq_stride <= t.head_stride ? 1 : 2;
    }
    return tma::encode_panels(maps, v, tile_cols, rows.box, p.bf16, seq_dim);
}

bool encode_shift(const plan::KernelPlan& p, const ForwardArgs& a, KvRows rows, int heads_kv, FwdParamsTma& out) {
    int k_seq_dim = 0, v_seq_dim = 0;
    const bool ok =
        encode_shifted(p, a.k, p.head_dim_qk, p.pad_qk, rows, heads_kv, out.k_map, out.k_shift, out.k_col_step,
                       out.k_head_step, k_seq_dim) &&
        encode_shifted(p, a.v, p.head_dim_v, geometry::v_tile_cols(p.pad_v, p.wide_v), rows, heads_kv, out.v_map,
                       out.v_shift, out.v_col_step, out.v_head_step, v_seq_dim);
    out.tma_seq_dim = k_seq_dim;
    return ok && k_seq_dim == v_seq_dim;  // the kernel orders both tensors' box coordinates alike
}

// Fills out.k_map / v_map / tma_seq_dim (and, for split rows, k_rot / v_rot; for shifted rows, k_shift / v_shift and
// the coordinate steps) and sets out.use_tma. use_tma stays 0, and the kernel loads with cp.async, when the tiles are
// not swizzled or a map cannot be encoded: a base or stride not 16-byte aligned (e.g. a head dim not a multiple of 8
// packed as [B, S, H, D] without split or shifted rows; a box may not start mid-16 bytes). Encoded per launch: the
// pointers change. A dense cache's sequences (seqlens_k) load by TMA too, though its boxes fill zeros only past the
// map's rows (seqlen_k, the capacity): the consumers zero the V rows a sequence's last key block brought from past its
// length (fwd/sm90_ws.cuh, zero_rows_from); K's there are masked. A paged cache's maps span the pool, in boxes of a
// page or less (fwd/sm90_ws.cuh, KvBoxes); pages of fewer than 8 rows load with cp.async.
void encode_kv_maps(const plan::KernelPlan& p, const ForwardArgs& a, int heads_kv, FwdParamsTma& out) {
    out.use_tma = 0;
    out.split_classes = 2;
    if (!p.swizzle || tma::disabled() || (p.paged_kv && a.page_size < geometry::kMinPagedBox)) return;
    const KvRows rows = p.paged_kv ? KvRows{a.num_pages, a.page_size, geometry::paged_box_rows(p.block_n, a.page_size)}
                        : p.varlen ? KvRows{1, a.total_k, p.block_n}
                                   : KvRows{a.batch, a.seqlen_k, p.block_n};
    bool ok = false;
    if (p.split_rows) {
        ok = encode_split(p, a, rows, heads_kv, out);
    } else if (p.shift_rows) {
        ok = encode_shift(p, a, rows, heads_kv, out);
    } else if (set_seq_dim(a, 1, out)) {
        ok = tma::encode_panels(out.k_map, whole_rows(a.k, p.head_dim_qk, rows.seqlen, heads_kv, rows.batch),
                                p.pad_qk, rows.box, p.bf16, out.tma_seq_dim) &&
             tma::encode_panels(out.v_map, whole_rows(a.v, p.head_dim_v, rows.seqlen, heads_kv, rows.batch),
                                geometry::v_tile_cols(p.pad_v, p.wide_v), rows.box, p.bf16, out.tma_seq_dim);
    }
    out.use_tma = ok ? 1 : 0;
    if (!ok) {  // cp.async loads rows unrotated and unshifted (split_classes is still 2: encode_split sets it only on
                // success)
        std::fill(std::begin(out.k_rot), std::end(out.k_rot), 0);
        std::fill(std::begin(out.v_rot), std::end(out.v_rot), 0);
        std::fill(std::begin(out.k_shift), std::end(out.k_shift), 0);
        std::fill(std::begin(out.v_shift), std::end(out.v_shift), 0);
    }
}

// The grid's x holds at most this many CTAs: a persistent kernel given more query tiles must walk them.
constexpr std::int64_t kMaxGrid = 0x7fffffff;

std::int64_t query_tiles(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a) {
    return std::int64_t((a.seqlen_q + p.block_m - 1) / p.block_m) * c.num_heads_q * a.batch;
}

int staging(const plan::KernelPlan& p) {
    return !p.persistent ? geometry::kStageOverTiles : p.o_apart ? geometry::kStageApart : geometry::kStageOverQ;
}

class FwdSm90Ws final : public ForwardFamily {
public:
    const char* name() const override { return "fwd_sm90_ws"; }
    bool runs_on(const arch::Arch& a) const override { return a.wgmma && a.tma && a.setmaxnreg; }
    // Split rows and wide V follow from the tile choice, and are settled again whenever it changes. Wide V (requested
    // by default, off with the override's 10th field) needs swizzled tiles, and with split rows V's tail must still
    // fit the last (64-wide) panel (geometry::split_fits). It is used only where the
    // per-width panels end in an 8-wide one: there one n=pad_v instruction per k-step beat n128 + n8 (d132
    // 547-569/562-579 TFLOPS vs 521-552/557-574 on an H200); where they do not, it did not pay (d96 519-579/524-532
    // vs 525-566/540-543, d256 629-647/693-697 vs 659-675/700-701; d80, d160, d192 within noise).
    void settle(plan::KernelPlan& p) const override {
        p.m_tiles = 1;
        p.q_in_regs = p.kv_apart = false;
        const auto flags = [&] {
            p.shift_rows =
                p.shift_rows && p.swizzle && geometry::shift_rows_fit(p.head_dim_qk, p.pad_qk, p.head_dim_v, p.pad_v);
            p.split_rows = !p.shift_rows && p.swizzle &&
                           geometry::split_rows_fit(p.head_dim_qk, p.pad_qk, p.head_dim_v, p.pad_v);
            p.wide_v = p.wide_v && p.swizzle && p.pad_v % 16 == 8 &&
                       (!p.split_rows || geometry::split_fits(p.head_dim_v, geometry::v_tile_cols(p.pad_v, true)));
        };
        flags();
        sm90::align_swizzled_tiles(p);
        flags();  // alignment may have given up swizzled tiles
        // Persistent with O's own staging bytes where they fit, else staging over Q, else grid-launched.
        const int optin = arch::get(p.arch).smem_optin;
        p.persistent = p.o_apart = true;
        if (smem_bytes(p) > optin) p.o_apart = false;
        if (smem_bytes(p) > optin) p.persistent = false;
        // d148 and d156 (split rows, V padded to 160, O over Q): the consumers' 216 registers do not hold the tile walk
        // as well (4 bytes of spills, causal).
        if (p.persistent && !p.o_apart && p.split_rows && p.pad_v == 160) p.persistent = false;
        // A paged cache's packed queries: a CTA per tile, as packed sequences launch anyway (they walk only past 2^31
        // tiles, which a grid of query blocks x heads x sequences holds); the walk's code beside the page lookups
        // spilled 4-16 bytes in the producer with wide O (d161..233, 56 registers). Shifted rows with wide O: the
        // same, 4 bytes at d216.
        if (p.paged_kv && (p.varlen || (p.shift_rows && p.pad_v > 160))) p.persistent = p.o_apart = false;
    }
    int min_stages() const override { return 2; }  // block j's K and block j-1's V are held at once
    int threads(const plan::KernelPlan& p) const override { return p.warps * 32 + 128; }  // + the producer
    int smem_bytes(const plan::KernelPlan& p) const override {
        return geometry::fwd_sm90_ws_smem_bytes(p.pad_qk, p.pad_v, p.block_m, p.block_n, p.stages, p.wide_v,
                                                staging(p), p.shift_rows);
    }
    std::string describe(const plan::KernelPlan& p) const override {
        std::string k = sm90::describe_tiles(p) + ", producer warpgroup";
        if (p.ping_pong) k += ", ping-pong";
        if (p.split_rows) k += ", split rows";
        if (p.shift_rows) k += ", shifted rows";
        if (p.wide_v) k += ", one PV instruction";
        if (p.persistent) k += p.o_apart ? ", persistent" : ", persistent (O staged over Q)";
        if (p.paged_kv) k += ", paged KV cache";
        return k;
    }
    render::StubSpec stub(const plan::KernelPlan& p) const override {
        render::StubSpec s = forward_stub(p, "fwd/sm90_ws.cuh", "FwdShapeSm90Ws",
                                          "const __grid_constant__ rtattn::FwdParamsTma params", "flash_fwd_sm90_ws");
        s.generated = sm90::wgmma_wrappers(p);
        for (const auto& [name, v] : {std::pair{"kSwizzle", p.swizzle}, {"kPingPong", p.ping_pong},
                                      {"kSplitRows", p.split_rows}, {"kShiftRows", p.shift_rows},
                                      {"kWideV", p.wide_v},
                                      {"kPersistent", p.persistent}, {"kOApart", p.o_apart}})
            s.traits.push_back({"bool", name, v ? "true" : "false"});
        return s;
    }
    // The walk loads with TMA (the cp.async producer holds no walk): a persistent call with more query tiles than a
    // grid holds needs maps that encode. Checked here, before anything launches: an append would otherwise have
    // written the cache of a call then refused.
    void validate_args(const plan::KernelPlan& p, const AttentionConfig& c, const ForwardArgs& a,
                       const CallSizes& z) const override {
        ForwardFamily::validate_args(p, c, a, z);
        if (!p.persistent || query_tiles(p, c, a) <= kMaxGrid) return;
        FwdParamsTma prm{};
        encode_kv_maps(p, a, c.num_heads_kv, prm);
        if (prm.use_tma == 0)
            throw ArgumentError("seqlen_q", util::format("{} query tiles of {} rows (x heads x batch) without TMA (K/V "
                                                         "pointers or strides not 16-byte aligned, pages of fewer "
                                                         "than 8 tokens, or RTATTN_TMA=0); allowed up to {}",
                                                         query_tiles(p, c, a), p.block_m, kMaxGrid));
    }
    void launch(const ForwardLaunch& l) const override {
        FwdParamsTma prm{};
        prm.p = forward_params(l.config, l.args);
        encode_kv_maps(l.plan, l.args, l.config.num_heads_kv, prm);
        if (!l.plan.persistent) return launch_forward_grid(l, &prm);
        prm.m_blocks = (l.args.seqlen_q + l.plan.block_m - 1) / l.plan.block_m;
        prm.batch = l.args.batch;
        // A CTA per SM (the kernel takes every SM's registers) walking the work (sm90::CtaTiles); a CTA per tile
        // where the kernel loads with cp.async (the producer threads hold no walk), for packed sequences of different
        // lengths (the hardware balances them; they walk only where the grid's x cannot hold a CTA per tile), or
        // where that is asked for.
        const std::int64_t per_head = l.plan.mask.causal ? (prm.m_blocks + 1) / 2 : prm.m_blocks;
        const std::int64_t units = per_head * l.config.num_heads_q * l.args.batch;
        const std::int64_t tiles = query_tiles(l.plan, l.config, l.args);
        // O staged over Q, the next Q loads after the store: non-causal d132 at S=4096 (32 query blocks) walked at
        // 0.93x a CTA per tile, at S<=2048 1.04-1.29x (H100); d256 within 1-4% either way there. Causal walks gained
        // 1.04-1.18x at d132 up to S=4096.
        const bool walk_pays = l.plan.o_apart || l.plan.mask.causal || prm.m_blocks <= 16;
        prm.walk = prm.use_tma != 0 &&  // (more tiles than a grid holds: TMA, validate_args made sure)
                   (tiles > kMaxGrid || (!l.plan.varlen && walk_pays && !persistence_disabled()));
        const std::int64_t ctas = prm.walk ? std::min<std::int64_t>(units, std::max(1, l.resident_ctas)) : tiles;
        void* args[] = {&prm};
        driver::check(driver::api().cuLaunchKernel(l.module.functions.at(0), unsigned(ctas), 1, 1,
                                                   unsigned(l.plan.threads()), 1, 1, unsigned(l.plan.smem_bytes),
                                                   static_cast<CUstream>(l.stream), args, nullptr),
                      "cuLaunchKernel");
    }
};

}  // namespace

const ForwardFamily& fwd_sm90_ws() {
    static const FwdSm90Ws f;
    return f;
}

}  // namespace rtattn::kernels
