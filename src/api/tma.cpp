#include "api/tma.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "driver/driver.hpp"

namespace rtattn {

static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) == alignof(CUtensorMap),
              "TmaMap mirrors CUtensorMap");

namespace {

// Panel widths in the order of the kernel's map index (templates/rtattn_params.h), each with its swizzle mode.
constexpr int kWidths[4] = {64, 32, 16, 8};
constexpr CUtensorMapSwizzle kSwizzles[4] = {CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_64B,
                                             CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_SWIZZLE_NONE};

// Does a tile of `cols` columns (a multiple of 8) have a panel of width kWidths[kind]? (TileLayout's split.)
bool panel_present(int cols, int kind) {
    return kind == 0 ? cols >= 64 : (cols % 64 & kWidths[kind]) != 0;
}

struct Outer {
    std::int64_t extent, stride_bytes;
};

// A K or V tensor as the kernel's maps see it: `cols` columns from `base`, then seq, head and batch dimensions.
struct View {
    const void* base;
    int cols;
    Outer seq, head, batch;
};

// One map per panel width of a `tile_cols`-wide tile into maps[kind]. Dims are ordered by stride (seq before head
// when seq_dim is 1) as the driver wants each stride to cover the previous.
bool encode_view(TmaMap* maps, const View& v, int tile_cols, int block_n, bool bf16, int seq_dim) {
    if (reinterpret_cast<std::uintptr_t>(v.base) % 16 != 0) return false;
    Outer outer[3] = {seq_dim == 1 ? v.seq : v.head, seq_dim == 1 ? v.head : v.seq, v.batch};
    std::int64_t covered = std::int64_t(v.cols) * 2;
    for (auto& o : outer) {
        if (o.extent == 1) o.stride_bytes = (covered + 15) / 16 * 16;  // never stepped: any legal stride will do
        if (o.stride_bytes <= 0 || o.stride_bytes % 16 != 0 || o.stride_bytes >= (std::int64_t(1) << 40)) return false;
        covered = std::max(covered, o.stride_bytes * o.extent);
    }
    const cuuint64_t dims[4] = {cuuint64_t(v.cols), cuuint64_t(outer[0].extent), cuuint64_t(outer[1].extent),
                                cuuint64_t(outer[2].extent)};
    const cuuint64_t strides[3] = {cuuint64_t(outer[0].stride_bytes), cuuint64_t(outer[1].stride_bytes),
                                   cuuint64_t(outer[2].stride_bytes)};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    for (int kind = 0; kind < 4; ++kind) {
        if (!panel_present(tile_cols, kind)) continue;
        const cuuint32_t box[4] = {cuuint32_t(kWidths[kind]), cuuint32_t(seq_dim == 1 ? block_n : 1),
                                   cuuint32_t(seq_dim == 1 ? 1 : block_n), 1};
        const CUresult r = driver::api().cuTensorMapEncodeTiled(
            reinterpret_cast<CUtensorMap*>(&maps[kind]),
            bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(v.base),
            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, kSwizzles[kind],
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) return false;
    }
    return true;
}

View whole_rows(const TensorArg& t, int dim, int seqlen, int heads, int batch) {
    return {t.ptr, dim, {seqlen, t.seq_stride * 2}, {heads, t.head_stride * 2}, {batch, t.batch_stride * 2}};
}

// Split rows: kv heads of parity `cls` (every other head, so the map's head stride is a multiple of 16 bytes).
// Their rows start 16-byte aligned or 8 bytes past (rot = 0 or 4 columns); the map covers the d-4 columns from
// the first 16-byte boundary, the kernel moves the other 4 itself.
View split_rows(const TensorArg& t, int dim, int seqlen, int heads, int batch, int cls, int& rot) {
    const auto* head0 = static_cast<const unsigned char*>(t.ptr) + std::int64_t(cls) * t.head_stride * 2;
    rot = reinterpret_cast<std::uintptr_t>(head0) % 16 == 0 ? 0 : 4;
    return {head0 + 2 * rot, dim - 4, {seqlen, t.seq_stride * 2}, {(heads - cls + 1) / 2, t.head_stride * 4},
            {batch, t.batch_stride * 2}};
}

bool tma_disabled() {
    static const bool off = [] {
        const char* env = std::getenv("RTATTN_TMA");
        return env && std::strcmp(env, "0") == 0;
    }();
    return off;
}

bool encode_split(const plan::KernelPlan& p, const ForwardArgs& a, int heads_kv, FwdParamsTma& out) {
    // Vector-4 arguments (checked before launch) leave every row 8-byte aligned, so rot is 0 or 4 for each class.
    if (reinterpret_cast<std::uintptr_t>(a.k.ptr) % 8 != 0 || reinterpret_cast<std::uintptr_t>(a.v.ptr) % 8 != 0)
        return false;
    for (int cls = 0; cls < std::min(2, heads_kv); ++cls) {
        const View k = split_rows(a.k, p.head_dim_qk, a.seqlen_k, heads_kv, a.batch, cls, out.k_rot[cls]);
        const View v = split_rows(a.v, p.head_dim_v, a.seqlen_k, heads_kv, a.batch, cls, out.v_rot[cls]);
        if (!encode_view(out.k_map + 2 * cls, k, k.cols, p.block_n, p.bf16, out.tma_seq_dim) ||
            !encode_view(out.v_map + 2 * cls, v, v.cols, p.block_n, p.bf16, out.tma_seq_dim))
            return false;
    }
    return true;
}

}  // namespace

void encode_kv_maps(const plan::KernelPlan& p, const ForwardArgs& a, int heads_kv, FwdParamsTma& out) {
    out.use_tma = 0;
    if (!p.producer() || !p.swizzle || tma_disabled()) return;
    // Map dims follow the smaller of the seq and head strides (split rows: the head stride of a map is two heads).
    const int head_step = p.split_rows ? 2 : 1;
    out.tma_seq_dim = a.k.seq_stride <= head_step * a.k.head_stride ? 1 : 2;
    if ((a.v.seq_stride <= head_step * a.v.head_stride ? 1 : 2) != out.tma_seq_dim) return;  // one order for both
    bool ok;
    if (p.split_rows) {
        ok = encode_split(p, a, heads_kv, out);
    } else {
        ok = encode_view(out.k_map, whole_rows(a.k, p.head_dim_qk, a.seqlen_k, heads_kv, a.batch), p.pad_qk,
                         p.block_n, p.bf16, out.tma_seq_dim) &&
             encode_view(out.v_map, whole_rows(a.v, p.head_dim_v, a.seqlen_k, heads_kv, a.batch),
                         p.wide_v ? (p.pad_v + 63) / 64 * 64 : p.pad_v, p.block_n, p.bf16, out.tma_seq_dim);
    }
    out.use_tma = ok ? 1 : 0;
    if (!ok) out.k_rot[0] = out.k_rot[1] = out.v_rot[0] = out.v_rot[1] = 0;  // cp.async loads rows unrotated
}

}  // namespace rtattn
