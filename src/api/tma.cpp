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

bool panel_present(int pad, int kind) {
    return kind == 0 ? pad >= 64 : (pad % 64 & kWidths[kind]) != 0;
}

// One map per panel width of a [batch, seq, heads, dim] tensor with arbitrary strides; dims are ordered by stride
// (seq before head unless the head stride is the smaller) as the driver wants each stride to cover the previous.
bool encode_tensor(TmaMap (&maps)[4], const TensorArg& t, int dim, int pad, int block_n, int seqlen, int heads,
                   int batch, bool bf16, int seq_dim) {
    if (reinterpret_cast<std::uintptr_t>(t.ptr) % 16 != 0) return false;
    struct Outer {
        std::int64_t extent, stride_bytes;
    };
    Outer seq{seqlen, t.seq_stride * 2}, head{heads, t.head_stride * 2}, bat{batch, t.batch_stride * 2};
    Outer outer[3] = {seq_dim == 1 ? seq : head, seq_dim == 1 ? head : seq, bat};
    std::int64_t covered = std::int64_t(dim) * 2;
    for (auto& o : outer) {
        if (o.extent == 1) o.stride_bytes = (covered + 15) / 16 * 16;  // never stepped: any legal stride will do
        if (o.stride_bytes <= 0 || o.stride_bytes % 16 != 0 || o.stride_bytes >= (std::int64_t(1) << 40)) return false;
        covered = std::max(covered, o.stride_bytes * o.extent);
    }
    const cuuint64_t dims[4] = {cuuint64_t(dim), cuuint64_t(outer[0].extent), cuuint64_t(outer[1].extent),
                                cuuint64_t(outer[2].extent)};
    const cuuint64_t strides[3] = {cuuint64_t(outer[0].stride_bytes), cuuint64_t(outer[1].stride_bytes),
                                   cuuint64_t(outer[2].stride_bytes)};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    for (int kind = 0; kind < 4; ++kind) {
        if (!panel_present(pad, kind)) continue;
        const cuuint32_t box[4] = {cuuint32_t(kWidths[kind]), cuuint32_t(seq_dim == 1 ? block_n : 1),
                                   cuuint32_t(seq_dim == 1 ? 1 : block_n), 1};
        const CUresult r = driver::api().cuTensorMapEncodeTiled(
            reinterpret_cast<CUtensorMap*>(&maps[kind]),
            bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(t.ptr),
            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, kSwizzles[kind],
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) return false;
    }
    return true;
}

bool tma_disabled() {
    static const bool off = [] {
        const char* env = std::getenv("RTATTN_TMA");
        return env && std::strcmp(env, "0") == 0;
    }();
    return off;
}

}  // namespace

void encode_kv_maps(const plan::KernelPlan& p, const ForwardArgs& a, int heads_kv, FwdParamsTma& out) {
    out.use_tma = 0;
    if (!p.producer() || !p.swizzle || tma_disabled()) return;
    out.tma_seq_dim = a.k.seq_stride <= a.k.head_stride ? 1 : 2;
    if ((a.v.seq_stride <= a.v.head_stride ? 1 : 2) != out.tma_seq_dim) return;  // one coordinate order for both
    const bool ok =
        encode_tensor(out.k_map, a.k, p.head_dim_qk, p.pad_qk, p.block_n, a.seqlen_k, heads_kv, a.batch, p.bf16,
                      out.tma_seq_dim) &&
        encode_tensor(out.v_map, a.v, p.head_dim_v, p.pad_v, p.block_n, a.seqlen_k, heads_kv, a.batch, p.bf16,
                      out.tma_seq_dim);
    out.use_tma = ok ? 1 : 0;
}

}  // namespace rtattn
