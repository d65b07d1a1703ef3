// Tensor maps (TMA) for any family's loads: a tensor seen as contiguous 16-bit columns and three strided dimensions,
// encoded as one map per column panel of a swizzled shared-memory tile (sm90::TileLayout: 64-wide panels with the
// 128-byte swizzle, then 32, 16 and 8 wide), and the switch that turns TMA off for timing.
#pragma once
#include <cstdint>

#include "common/params.h"
#include "core/config.hpp"
#include "rtattn/types.hpp"

namespace rtattn::kernels::tma {

struct Dim {
    std::int64_t extent, stride_bytes;
};

// A tensor as a kernel's maps see it: `cols` columns from `base`, then seq, head and batch dimensions.
struct View {
    const void* base;
    int cols;
    Dim seq, head, batch;
};

// The whole rows of a [batch, seq, head, dim] tensor argument.
View whole_rows(const TensorArg& t, int dim, int seqlen, int heads, int batch);

// One map per panel of a `tile_cols`-wide tile into maps[kind] (kind = geometry::panel_width's index, as the
// kernels index their maps), each box a panel wide and `box_rows` rows along seq. Dims are ordered by stride (seq
// before head when seq_dim is 1, else head before seq) as the driver wants each stride to cover the previous. False
// where the driver cannot encode them: a base or stride not a 16-byte multiple, a stride of 2^40 bytes or more.
bool encode_panels(TmaMap* maps, const View& v, int tile_cols, int box_rows, bool bf16, int seq_dim);

// One map of a kernel's fp32 rows (`cols` floats from `base`, `rows` rows `row_floats` apart) whose boxes are
// box_cols (32: 128-byte rows, the 128-byte swizzle) x box_rows, for TMA reductions into it. False where the driver
// cannot encode it.
bool encode_f32_rows(TmaMap* map, float* base, int cols, std::int64_t rows, int row_floats, int box_cols,
                     int box_rows);

// RTATTN_TMA=0 or false: the families load with cp.async instead (README: Environment). Read once, launches are hot;
// any other value is a ConfigError naming the variable (thrown again on every launch until fixed), never TMA left on
// silently.
bool disabled();

}  // namespace rtattn::kernels::tma
