#include "kernels/tma.hpp"

#include <algorithm>

#include "common/geometry.h"
#include "driver/driver.hpp"
#include "util/env.hpp"

namespace rtattn::kernels::tma {

static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) == alignof(CUtensorMap),
              "TmaMap mirrors CUtensorMap");

namespace {

// The swizzle mode of each panel kind (geometry::panel_width; the kernel's map index, templates/common/params.h).
constexpr CUtensorMapSwizzle kSwizzles[4] = {CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_SWIZZLE_64B,
                                             CU_TENSOR_MAP_SWIZZLE_32B, CU_TENSOR_MAP_SWIZZLE_NONE};

}  // namespace

View whole_rows(const TensorArg& t, int dim, int seqlen, int heads, int batch) {
    return {t.ptr, dim, {seqlen, t.seq_stride * 2}, {heads, t.head_stride * 2}, {batch, t.batch_stride * 2}};
}

bool encode_panels(TmaMap* maps, const View& v, int tile_cols, int box_rows, bool bf16, int seq_dim) {
    if (reinterpret_cast<std::uintptr_t>(v.base) % 16 != 0) return false;
    Dim outer[3] = {seq_dim == 1 ? v.seq : v.head, seq_dim == 1 ? v.head : v.seq, v.batch};
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
        if (!geometry::has_panel(tile_cols, kind)) continue;
        const cuuint32_t box[4] = {cuuint32_t(geometry::panel_width(kind)), cuuint32_t(seq_dim == 1 ? box_rows : 1),
                                   cuuint32_t(seq_dim == 1 ? 1 : box_rows), 1};
        const CUresult r = driver::api().cuTensorMapEncodeTiled(
            reinterpret_cast<CUtensorMap*>(&maps[kind]),
            bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, const_cast<void*>(v.base),
            dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, kSwizzles[kind],
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (r != CUDA_SUCCESS) return false;
    }
    return true;
}

bool encode_f32_rows(TmaMap* map, float* base, int cols, std::int64_t rows, int row_floats, int box_cols,
                     int box_rows) {
    if (box_cols * 4 != 128 || rows <= 0 || rows >= (std::int64_t(1) << 31)) return false;  // coordinates are 32-bit
    const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
    const cuuint64_t strides[1] = {cuuint64_t(row_floats) * 4};
    const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
    const cuuint32_t elem_strides[2] = {1, 1};
    return driver::api().cuTensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
                                                2, base, dims, strides, box, elem_strides,
                                                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

bool disabled() {
    static const bool off = !util::env_flag("RTATTN_TMA").value_or(true);
    return off;
}

}  // namespace rtattn::kernels::tma
