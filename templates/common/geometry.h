// Geometry rules stated once for the host and the kernels: NVRTC compiles this file into every kernel and src/
// includes it (planning, TMA maps), so shared-memory sizes, strides and panel splits cannot drift between the two.
// Plain constexpr C++ and no headers; a CUDA compiler sees the functions as __host__ __device__ (NVRTC's
// -default-device would make them device functions anyway; nvcc, compiling `rtattn render --out-dir`, needs it said).
#pragma once

#if defined(__CUDACC__)
#define RTATTN_GEOMETRY __host__ __device__ constexpr
#else
#define RTATTN_GEOMETRY constexpr
#endif

namespace rtattn {
namespace geometry {

RTATTN_GEOMETRY int round_up(int x, int m) { return (x + m - 1) / m * m; }

// mma.sync tiles (and every kernel's O staging tile) store padded rows: an odd number of 16-byte chunks puts the 8
// rows an ldmatrix reads in 8 different bank groups, for any head dim (an XOR swizzle needs power-of-two rows).
RTATTN_GEOMETRY int padded_row(int pad) { return (pad / 8) % 2 == 1 ? pad : pad + 8; }

// Hopper tiles are column panels (sm90::TileLayout): 64-wide ones with the 128-byte swizzle, then at most one each
// of 32, 16 and 8 columns. Kind 0..3 = width 64, 32, 16, 8: also the index of the panel's TMA map.
RTATTN_GEOMETRY int panel_width(int kind) { return 64 >> kind; }
RTATTN_GEOMETRY bool has_panel(int cols, int kind) {
    return kind == 0 ? cols >= 64 : (cols % 64 & panel_width(kind)) != 0;
}

// wgmma issues D(64 x N) in column chunks: 128-wide ones, then at most one each of 64, 32, 16 and 8 (N is part of
// the instruction, and wide chunks re-read A least). Whether N columns have a chunk of `width`:
RTATTN_GEOMETRY bool has_chunk(int n, int width) { return width == 128 ? n >= 128 : (n % 128 & width) != 0; }

// Wide V tiles keep V in whole 64-column panels (the last one partly used), so PV is one wgmma of n = pad_v.
RTATTN_GEOMETRY int v_tile_cols(int pad_v, bool wide_v) { return wide_v ? round_up(pad_v, 64) : pad_v; }

// Swizzle atoms (and TMA boxes with a swizzle) start 1024-byte aligned, so every swizzled tile must be a multiple of
// 1024 bytes.
RTATTN_GEOMETRY bool swizzle_aligned(int rows, int cols) { return rows * cols * 2 % 1024 == 0; }

// The narrowest panel of a `cols`-wide tile: its last.
RTATTN_GEOMETRY int last_panel_width(int cols) {
    return has_panel(cols, 3) ? 8 : has_panel(cols, 2) ? 16 : has_panel(cols, 1) ? 32 : 64;
}

// Split rows: packed heads of a width of 4 mod 8 start alternately 16- and 8-byte aligned, and a TMA box must start
// 16-byte aligned (one 8 bytes off traps with an illegal instruction, H100) and runs at full speed only 32-byte
// aligned (heads of 8 mod 16 alternate 32 and 16). Per class of heads, TMA moves every panel of the tile but the last
// from the row's aligned columns on (the row rotated by up to 12 columns to reach them); the producer threads store
// the other `tail` columns (4 to 28, in pieces, one per thread, held in registers) into the last panel, whose rest
// stays zero.
constexpr int kSplitTail = 4;      // the narrowest tail and piece: 8 bytes
constexpr int kSplitMaxTail = 28;  // where the last panel is 16 or 32 wide; 64-wide ones would leave 52-60 columns
// Tails as 8-byte pieces, one per producer thread (128), the lanes of a row a power of 2: any rotation keeps such
// pieces aligned, so rows may rotate to 32-byte aligned boxes in four head classes (16 bytes off 32 ran the d144
// kernel at 0.73x, H100). The pieces of a K and a V tile must fit 8 registers' pairs per thread (passes below);
// beyond that (20-28 column tails on 128-key tiles) tails go as 16-byte pieces, aligned only when rows rotate to
// 16-byte boxes, in two classes (sm90_ws.cuh, SplitTail).
RTATTN_GEOMETRY int split_lanes(int pieces) { return pieces <= 1 ? 1 : pieces <= 2 ? 2 : pieces <= 4 ? 4 : 8; }
RTATTN_GEOMETRY int split_narrow_passes(int tail, int block_n) {
    const int rows = 128 / split_lanes(tail / kSplitTail);
    return (block_n + rows - 1) / rows;
}
RTATTN_GEOMETRY bool split_narrow(int tail_qk, int tail_v, int block_n) {
    return split_narrow_passes(tail_qk, block_n) + split_narrow_passes(tail_v, block_n) <= 8;
}
RTATTN_GEOMETRY int split_classes(int tail_qk, int tail_v, int block_n) {
    return split_narrow(tail_qk, tail_v, block_n) ? 4 : 2;
}
RTATTN_GEOMETRY int split_main(int cols) { return cols - last_panel_width(cols); }  // TMA columns of a tile
RTATTN_GEOMETRY bool split_fits(int d, int cols) {
    const int main = split_main(cols), tail = d - main;
    return (d % 8 == 4 || d % 16 == 8) && main >= 32 && main % 32 == 0 && tail >= kSplitTail && tail <= kSplitMaxTail;
}
RTATTN_GEOMETRY bool split_rows_fit(int d_qk, int pad_qk, int d_v, int v_cols) {
    return split_fits(d_qk, pad_qk) && split_fits(d_v, v_cols);
}

// A paged cache's TMA boxes (the warp-specialized forward): the rows of one box, which must not cross a page and must
// start a tile's rows on a whole swizzle atom (8 rows): the page size, at most the largest power of two dividing the
// key tile (a 112-key tile's blocks start on 16-row bounds only). Pages of fewer than kMinPagedBox rows go by
// cp.async.
constexpr int kMinPagedBox = 8;
RTATTN_GEOMETRY int paged_box_rows(int block_n, int page_size) {
    return (block_n & -block_n) < page_size ? (block_n & -block_n) : page_size;
}

// Shifted rows: packed heads of a width off the 16 grid start anywhere modulo 32 bytes. Each K/V row lands whole, by
// a TMA box that starts at the 32-byte boundary at or before the row (16-byte where the tile has too little room:
// a box may not start off 16 bytes, and runs at full speed only 32-byte aligned), so the tile holds the row shifted
// right by `shift` columns (0 to 15), the columns before and after it being the neighbouring heads' (zeroed in K by
// the producer threads; in V they only reach O's columns outside the row, which are never stored). Q is loaded and O
// stored with the same shift. The shift must fit the tile's room beyond the head dim: every packed head of
// `d` columns fits a `cols`-wide tile if the 16-byte shift of the worst head (8 - gcd(d, 8) columns) does.
RTATTN_GEOMETRY int gcd8(int d) { return d % 8 == 0 ? 8 : d % 4 == 0 ? 4 : d % 2 == 0 ? 2 : 1; }
RTATTN_GEOMETRY bool shift_fits(int d, int cols) { return cols - d >= 8 - gcd8(d); }
RTATTN_GEOMETRY bool shift_rows_fit(int d_qk, int pad_qk, int d_v, int pad_v) {
    return (d_qk % 16 != 0 || d_v % 16 != 0) && shift_fits(d_qk, pad_qk) && shift_fits(d_v, pad_v);
}
// The mma.sync forward's shifted rows (fwd/mma.cuh): the same placement from 16-byte boundaries by cp.async, for
// head dims off the 8 grid. A row is then at most this many 16-byte vectors, and a pad of `step` holds its shift.
RTATTN_GEOMETRY int shifted_vectors(int d) { return (d + 8 - gcd8(d) + 7) / 8; }
RTATTN_GEOMETRY int shifted_pad(int d, int step) { return round_up(d + 8 - gcd8(d), step); }

// A forward kernel's shared memory: Q (block_m rows), a ring of `stages` K and V tiles (block_n rows), and the O
// staging tile of the epilogue (block_m padded rows), which reuses the same bytes. Sizes in 16-bit elements.
RTATTN_GEOMETRY int fwd_tile_bytes(int q_elems, int k_elems, int v_elems, int o_elems, int stages) {
    const int main_elems = q_elems + stages * (k_elems + v_elems);
    return 2 * (main_elems > o_elems ? main_elems : o_elems);
}

// mma.sync forward (fwd/mma.cuh): every tile in padded rows.
RTATTN_GEOMETRY int fwd_mma_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages) {
    return fwd_tile_bytes(block_m * padded_row(pad_qk), block_n * padded_row(pad_qk), block_n * padded_row(pad_v),
                          block_m * padded_row(pad_v), stages);
}

// Hopper forward (fwd/sm90.cuh): Q/K/V as packed panels or cores, no row padding.
RTATTN_GEOMETRY int fwd_sm90_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wide_v) {
    return fwd_tile_bytes(block_m * pad_qk, block_n * pad_qk, block_n * v_tile_cols(pad_v, wide_v),
                          block_m * padded_row(pad_v), stages);
}

// The warp-specialized Hopper forward (fwd/sm90_ws.cuh) adds its K/V ring's mbarriers after the tiles: full and
// empty, for K and for V, per slot, 8 bytes each (shifted rows add one per slot: K landed, before the producer zeroes
// the columns outside the row and marks it full). Where it stages O (kStage*): over Q/K/V once a grid-launched CTA's
// only tile is done with them; persistent (a CTA per SM looping over tiles, the producer filling the next tile's K/V
// meanwhile), in bytes of its own after the K/V ring, so that the next Q loads under the epilogue, or, where those do
// not fit, over Q and a tail of up to 4 KB before the ring (padded O rows are 8 columns wider than Q's at d160,
// d192, d256), the next Q loading after the store.
enum Staging { kStageOverTiles = 0, kStageApart = 1, kStageOverQ = 2 };  // an enum: no device variables in cubins
RTATTN_GEOMETRY int kv_ring_barriers(int stages, bool landed = false) { return (landed ? 5 : 4) * stages; }
RTATTN_GEOMETRY int fwd_sm90_ws_q_bytes(int pad_qk, int pad_v, int block_m, int staging) {
    const int q = 2 * block_m * pad_qk, o = 2 * block_m * padded_row(pad_v);
    return staging == kStageOverQ && o > q ? round_up(o, 1024) : q;  // the K/V ring stays on 1024-byte swizzle atoms
}
RTATTN_GEOMETRY int fwd_sm90_ws_tile_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wide_v,
                                           int staging) {
    if (staging == kStageOverTiles) return fwd_sm90_smem_bytes(pad_qk, pad_v, block_m, block_n, stages, wide_v);
    return fwd_sm90_ws_q_bytes(pad_qk, pad_v, block_m, staging) +
           2 * stages * block_n * (pad_qk + v_tile_cols(pad_v, wide_v)) +
           (staging == kStageApart ? 2 * block_m * padded_row(pad_v) : 0);
}
RTATTN_GEOMETRY int fwd_sm90_ws_barrier_offset(int tile_bytes) { return round_up(tile_bytes, 8); }
RTATTN_GEOMETRY int fwd_sm90_ws_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wide_v,
                                           int staging, bool shift_rows = false) {
    return fwd_sm90_ws_barrier_offset(
               fwd_sm90_ws_tile_bytes(pad_qk, pad_v, block_m, block_n, stages, wide_v, staging)) +
           8 * kv_ring_barriers(stages, shift_rows);
}

// The backward's fp32 dQ rows (workspace accumulator and shared staging tile) are pad_qk + 8 floats apart: a stride
// of 8 or 24 modulo 32 banks lets the 16 lanes of a half-warp store their float2 fragment pieces (4 rows x 4 column
// pairs) into 32 different banks.
RTATTN_GEOMETRY int bwd_dq_stride(int pad_qk) { return pad_qk + 8; }
// The deterministic backward's dQ turn counters (workspace): one per this many query rows of a head. At most 64:
// bwd_sm90_ws's fallback kernel walks 64-row blocks under a plan of 128 (a kernel of 128-row blocks reads every
// other counter, all zeroed by the preprocess alike).
RTATTN_GEOMETRY int bwd_turn_rows(int block_m) { return block_m < 64 ? block_m : 64; }

// mma.sync backward (bwd/mma.cuh): the fp32 dQ staging tile when dQ leaves by bulk reduction; K and V tiles of
// block_n keys; `stages` buffers of the Q and dO tiles (block_m queries) with their rows' LSE and D (fp32); the P and
// dS tiles (block_m x block_n) the transposed GEMMs read. Every 16-bit tile in padded rows.
RTATTN_GEOMETRY int bwd_mma_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool bulk_dq) {
    return (bulk_dq ? 4 * block_m * bwd_dq_stride(pad_qk) : 0) +
           2 * ((block_n + stages * block_m) * (padded_row(pad_qk) + padded_row(pad_v)) +
                2 * block_m * padded_row(block_n)) +
           8 * stages * block_m;
}

// Hopper backward (bwd/sm90.cuh): the fp32 dQ staging tiles (block_m rows of bwd_dq_stride: one, whose columns the
// two warpgroups split, where pad_qk is 80..144; else one per warpgroup, each over its own keys), K and V tiles
// of block_n keys, `stages` buffers of the Q and dO tiles (block_m queries) with their rows' LSE and D (fp32), the
// dS^T tile (block_n x block_m) and 16 bytes of varlen sizes. 16-bit tiles in the swizzled panel layouts
// (sm90/tile_layout.cuh) of bwd_sm90_tile_cols columns, unpadded.
// The Q and dO tiles are read N-major by the dK and dV GEMMs (and K by dQ's). Past a pad of 96 they are kept as
// whole 64-column panels (pad 144 as 192 columns, pad 112 as 128), so that dK and dV are one wgmma each, as wide as
// the accumulator, across the panels (d132: 128 + 8 columns as two ran at 0.87x; pad 112, which this kernel serves
// only as bwd_sm90_ws's fallback, spilled 8-16 bytes causal in 64 + 32 + 16 chunks); where the tile is whole
// 64-column panels the accumulators span the head dim rounded up to 8 (wgmma's N step; d132: 136 columns, not 144:
// 144 spilled in bf16). Pads 80 and 96 keep their per-width panels and chunk the GEMMs by them
// (sm90::for_each_chunk), accumulators of the pad.
RTATTN_GEOMETRY int bwd_sm90_tile_cols(int pad) { return pad > 96 ? round_up(pad, 64) : pad; }
RTATTN_GEOMETRY bool bwd_sm90_whole(int pad) { return bwd_sm90_tile_cols(pad) % 64 == 0; }
RTATTN_GEOMETRY int bwd_sm90_acc_cols(int head_dim, int pad) {
    return bwd_sm90_whole(pad) ? round_up(head_dim, 8) : pad;
}
// How the two warpgroups split dQ's columns, over all the CTA's keys: the first 64 to one and the rest to the other;
// on whole panels each issues the same widths, max(64, acc - 64) from column 64 x warpgroup (d132: 72 from 0 and
// from 64, each storing its own columns), chunked (one 72- or 80-wide wgmma spilled 8-16 bytes in bf16).
RTATTN_GEOMETRY int bwd_sm90_dq_width(int acc_qk) { return acc_qk - 64 > 64 ? acc_qk - 64 : 64; }
RTATTN_GEOMETRY bool bwd_sm90_dq_by_panel(int pad_qk, int block_n) {
    return block_n == 128 && pad_qk > 64 && pad_qk <= 144;
}
RTATTN_GEOMETRY int bwd_sm90_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages) {
    return 4 * (bwd_sm90_dq_by_panel(pad_qk, block_n) ? 1 : block_n / 64) * block_m * bwd_dq_stride(pad_qk) +
           2 * ((block_n + stages * block_m) * (bwd_sm90_tile_cols(pad_qk) + bwd_sm90_tile_cols(pad_v)) +
                block_n * block_m) +
           8 * stages * block_m + 16;
}
// Warp-specialized Hopper backward (bwd/sm90_ws.cuh): the dQ staging tile (or the warps' dQ boxes), K and V, `stages` slots of Q and dO, two
// dS^T buffers (a step writes the one its predecessor's predecessor read), the slots' LSE and D, the mbarriers, 16
// bytes of varlen sizes. Pads 32..144, per-width panels.
// Its dK/dV/dQ accumulators: the pad, or past 128 the head dim rounded up to 8 (d136: 136 columns, not 144).
RTATTN_GEOMETRY int bwd_sm90_ws_acc_cols(int head_dim, int pad) { return pad > 128 ? round_up(head_dim, 8) : pad; }
// Its dQ columns between the two consumer warpgroups (each a dQ GEMM over all keys): the first 64 and the rest, or
// at pads up to 64 the first half (48: 32, a panel's; the second warpgroup's N-major K operand then starts inside
// a 64- or 32-column panel, 16 or 32 bytes into its swizzled rows).
RTATTN_GEOMETRY int bwd_sm90_ws_dq_split(int acc_cols) {
    return acc_cols > 64 ? 64 : acc_cols == 48 ? 32 : acc_cols / 2;
}
// Its wide form (bwd/sm90_ws.cuh kWide: 64 keys a CTA, both warpgroups on all of them, each on half of the
// accumulators' columns) at pads past 144: pads 64, 128 and 160..256, so that each of a half's wgmma chunks lies
// inside one panel of the tile (see bwd_sm90_ws_wide_col).
RTATTN_GEOMETRY bool bwd_sm90_ws_wide_tile(int block_n) { return block_n == 64; }  // a plan of the wide form
RTATTN_GEOMETRY bool bwd_sm90_ws_wide(int pad_qk, int pad_v) {
    auto ok = [](int pad) { return pad == 64 || pad == 128 || (pad >= 160 && pad <= 256 && pad % 16 == 0); };
    return (pad_qk > 144 || pad_v > 144) && ok(pad_qk) && ok(pad_v);
}
// Where the wide form's warpgroup wg keeps its chunk of `width` (a half, pad / 2 columns, chunked as
// sm90::for_each_chunk does: 128, or 64 then at most one each of 32, 16 and 8): the tile column it starts at. The
// 64- and 128-wide chunks take whole 64-column panels (the first warpgroup's the first, the second's the next ones),
// the 32-wide ones the third panel's halves (pads 192..240), and the 16- and 8-wide ones the tile's narrow panels
// past the 64-column ones, a chunk of each warpgroup side by side: the 32-column panel's halves for the 16s, the
// 16-column panel's for the 8s. Pad 64's halves are the panel's.
RTATTN_GEOMETRY int bwd_sm90_ws_wide_chunk(int pad, int wg, int width) {
    if (pad <= 128) return wg * pad / 2;
    const int tail = pad / 64 * 64;  // the narrow panels': 32 wide then 16 wide
    if (width >= 64) return wg == 0 ? 0 : pad < 192 ? 64 : 128;
    if (width == 32) return 64 + 32 * wg;
    if (width == 16) return tail + 16 * wg;
    return tail + (pad % 64 >= 32 ? 32 : 0) + 8 * wg;
}
// The tile column of a warpgroup's accumulator column j in the wide form: its chunk's start plus j's offset in it.
// (Tiles of whole 64-column panels said directly: the same columns, and the code d192 and d256 were measured with.)
RTATTN_GEOMETRY int bwd_sm90_ws_wide_col(int pad, int wg, int j) {
    if (pad % 64 == 0) return wg == 0 ? j : pad == 192 ? (j < 64 ? 128 + j : 96 + (j - 64)) : pad / 2 + j;
    const int half = pad / 2, first = half >= 128 ? 128 : 64;  // the first chunk's width
    if (j < first) return bwd_sm90_ws_wide_chunk(pad, wg, first) + j;
    for (int width = 32; width >= 8; width /= 2) {
        const int c = first + (half - first) / (2 * width) * (2 * width);  // where the chunk of `width` starts
        if ((half - first) & width && j >= c && j < c + width) return bwd_sm90_ws_wide_chunk(pad, wg, width) + j - c;
    }
    return -1;  // past the half
}
// Its shifted rows (bwd/sm90_ws.cuh): head dims of 4 mod 8 at pad 144 (d132, d140), placed 0 or 4 columns right.
RTATTN_GEOMETRY bool bwd_sm90_ws_shift_rows(int head_dim, int pad) { return pad == 144 && head_dim % 8 == 4; }
// Its wide form past pad_qk 192 has no dQ staging tile of the CTA's (two Q/dO slots need the room; at 208 the tile
// would be 80 bytes too many): each consumer warp adds its own dQ rows (bwd_sm90_ws_dq_box_bytes below).
RTATTN_GEOMETRY bool bwd_sm90_ws_dq_direct(int pad_qk, int block_n) {
    return bwd_sm90_ws_wide_tile(block_n) && pad_qk > 192;
}
// Its wide form split by GEMM instead of by columns (bwd/sm90_ws_gemms.cuh), where dQ leaves by reductions.
RTATTN_GEOMETRY bool bwd_sm90_ws_by_gemm(int pad_qk, int block_n) { return bwd_sm90_ws_dq_direct(pad_qk, block_n); }
// There each consumer warp adds its 16 rows of dQ 32 columns at a time through a box of its own in shared memory
// (rows of 128 bytes, the 128-byte swizzle) by one TMA reduction into the accumulator (whose map the host encodes
// with this box); columns past a half's last whole box by vector reductions. 8 warps' boxes: the 16 KB of shared
// memory the two Q/dO slots leave.
constexpr int kBwdDqBoxCols = 32, kBwdDqBoxRows = 16;
RTATTN_GEOMETRY int bwd_sm90_ws_dq_box_bytes() { return 4 * kBwdDqBoxCols * kBwdDqBoxRows; }
// Its dQ a step late (bwd/sm90_ws.cuh kDqLag: no barrier a step between the consumer warpgroups), where that
// measured faster: 64 queries a step, dQ staged, accumulators of up to 136 columns (d140 and d144 spilled more and
// ran slower) or the wide form.
RTATTN_GEOMETRY bool bwd_sm90_ws_dq_lag(int head_dim_qk, int head_dim_v, int pad_qk, int pad_v, int block_m,
                                        int block_n) {
    if (bwd_sm90_ws_dq_direct(pad_qk, block_n) || block_m != 64) return false;
    return bwd_sm90_ws_wide_tile(block_n) ||
           (bwd_sm90_ws_acc_cols(head_dim_qk, pad_qk) <= 136 && bwd_sm90_ws_acc_cols(head_dim_v, pad_v) <= 136);
}
// Its mbarriers: full and empty per slot; K/V, dQ staged and read, a tile landed; lagged, dS^T written and read per
// buffer.
RTATTN_GEOMETRY int bwd_sm90_ws_barriers(int stages, bool lag) { return 2 * stages + 4 + (lag ? 4 : 0); }
RTATTN_GEOMETRY int bwd_sm90_ws_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool lag) {
    return (bwd_sm90_ws_dq_direct(pad_qk, block_n) ? 8 * bwd_sm90_ws_dq_box_bytes() : 4 * block_m * bwd_dq_stride(pad_qk)) +
           2 * ((block_n + stages * block_m) * (pad_qk + pad_v) + 2 * block_n * block_m) +
           8 * stages * block_m + 8 * bwd_sm90_ws_barriers(stages, lag) + 16;
}

// Decode (dec/mma.cuh): the query rows' tile and `stages` K/V tiles of block_n keys in padded rows; after the key
// loop the same bytes hold each warp's fp32 O rows (pad_v + 8 floats apart, as the backward's dQ rows: conflict-free
// float2 stores) and its row maxima and sums, which the CTA combines.
RTATTN_GEOMETRY int dec_o_stride(int pad_v) { return pad_v + 8; }
// Rows of a head dim of 4 mod 8 on 8-byte vectors move as 16-byte vectors rotated in shared memory (common/load.cuh
// load_rows_rotated: the mma.sync forward and decode). A decode kernel for packed rows that alternate rotation key by
// key (heads_kv x d of 4 mod 8) keeps two query tiles, one per rotation, where K's rows rotate (two_q).
RTATTN_GEOMETRY bool rotated_rows(int head_dim, int vec) { return head_dim % 8 == 4 && head_dim >= 12 && vec == 4; }
// The query tile, then the ring; the combine's O, max, sum and weight reuse the bytes from the start once the key loop
// is done. Each K and V row's padding (padded_row: 16 bytes) holds the row's address while its tile loads.
RTATTN_GEOMETRY int dec_mma_smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, int warps,
                                       bool two_q) {
    const int q = (two_q ? 2 : 1) * block_m * padded_row(pad_qk);
    const int tiles = 2 * (q + stages * block_n * (padded_row(pad_qk) + padded_row(pad_v)));
    const int combine = 4 * warps * block_m * (dec_o_stride(pad_v) + 3);  // O, max, sum, weight
    return tiles > combine ? tiles : combine;
}
// Splits a decode call may run: the combine kernel keeps one weight per split per row in shared memory.
constexpr int kDecMaxSplits = 128;

}  // namespace geometry
}  // namespace rtattn

#undef RTATTN_GEOMETRY
