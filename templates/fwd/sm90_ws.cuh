// Hopper (sm_90a) forward pass, warp-specialized. Same tiles, layouts and GEMM issue as rtattn_fwd_sm90.cuh; what
// changes is who waits for what:
//  - one producer warpgroup streams K and V tiles through a ring (one TMA box per panel where the layout allows;
//    for head dims off the 16 grid, boxes of whole rows shifted to 32-byte boundaries, with K's columns outside the
//    row zeroed by the producer threads, or split rows: TMA boxes plus 8-24 bytes per row copied by the producer
//    threads; else cp.async by all 128 producer threads) and announces each landed tile on an mbarrier; the consumer
//    warpgroups (64 query rows each) never load K/V and never meet at a CTA-wide barrier, and the producer gives
//    its registers to them (setmaxnreg);
//  - per key block j a consumer issues QK^T(j) and PV(j-1) back to back, runs the softmax of block j while PV(j-1)
//    is still on the tensor cores, then rescales O (FlashAttention-3's intra-warpgroup overlap);
//  - with kPingPong, consumer warpgroups take turns issuing their GEMMs (named barriers), so one warpgroup's
//    softmax runs under the other's GEMMs instead of all of them hitting the softmax at once;
//  - with kPersistent, a CTA per SM loops over tiles (sm90::CtaTiles): the producer fills the next tile's K/V
//    while the consumers finish this one, so a short sequence's tiles do not each pay a CTA's start, its first loads
//    and its epilogue in series. With kOApart, O is staged in bytes of its own and each consumer warpgroup loads its
//    next Q rows as soon as its last QK^T is done; without, O is staged over Q and the next Q loads after the store.
// K and V have separate "full" and "empty" barriers: K of block j is released as soon as QK^T(j) is done, one
// iteration before V, so the next K load starts early.
#pragma once
#include "fwd/sm90.cuh"
#include "sm90/kv_ring.cuh"

namespace rtattn {

template <class T>
struct FwdShapeSm90Ws {
    using Base = FwdShapeSm90<T>;
    static constexpr int kConsumers = T::kWarps / 4;                 // consumer warpgroups
    static constexpr int kConsumerThreads = T::kWarps * 32;
    static constexpr int kThreads = kConsumerThreads + 128;          // + the producer warpgroup
    static constexpr int kStaging = !T::kPersistent ? geometry::kStageOverTiles
                                    : T::kOApart    ? geometry::kStageApart
                                                    : geometry::kStageOverQ;
    static constexpr int kQBytes = geometry::fwd_sm90_ws_q_bytes(T::kPadQK, T::kPadV, T::kBlockM, kStaging);
    static constexpr int kBarrierOffset = geometry::fwd_sm90_ws_barrier_offset(geometry::fwd_sm90_ws_tile_bytes(
        T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN, T::kStages, T::kWideV, kStaging));
    static constexpr int kSmemBytes = geometry::fwd_sm90_ws_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN,
                                                                       T::kStages, T::kWideV, kStaging, T::kShiftRows);
    static_assert(kQBytes >= 2 * Base::kQElems && (!T::kPersistent || T::kOApart || kQBytes >= 2 * T::kBlockM *
                                                                                                Base::kStrideV),
                  "O staged over Q fits the bytes before the K/V ring");
    // Register split (65536 per SM, one CTA). The producer computes cp.async addresses (the TMA path needs next to
    // nothing); consumers hold O, S and P. Wide O (d_v > 160) takes the registers from the producer.
    // Two different load loops (d_qk != d_v) cost the producer more registers; narrow O can spare them, and so does
    // a paged cache's producer (a page looked up per box, or per 16-byte copy on pages below 8 rows).
    static constexpr bool kMixed = T::kHeadDimQK != T::kHeadDimV && T::kPadV <= 128;
    static constexpr int kProducerRegs =
        kConsumers == 3 ? 32 : T::kPadV > 160 ? 56 : kMixed || T::kSplitRows || T::kPaged ? 72 : 64;
    static constexpr int kConsumerRegs =
        kConsumers == 3 ? 160 : kConsumers == 1 ? 240 : T::kPadV > 160 ? 224 : kMixed ? 208 : 216;
    // cp.async fallback: unrolling the producer's load loop 4x keeps more copies in flight (+13% at d128 on an
    // H200 over no unroll); with 3 consumers the producer has 32 registers and no unroll.
    static constexpr int kLoadUnroll = kConsumers == 3 ? 1 : 4;
    // setmaxnreg moves registers within the CTA's allocation: kThreads x the count each thread starts with, which
    // __launch_bounds__(kThreads, 1) makes 65536 / kThreads (at most 255) rounded down to a multiple of 8 (168 for two
    // consumer warpgroups: 64512, not 65536).
    static constexpr int kEntryRegs = (65536 / kThreads < 255 ? 65536 / kThreads : 255) / 8 * 8;
    static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kEntryRegs, "register split");
    static_assert(kConsumers >= 1 && kConsumers <= 3, "1 to 3 consumer warpgroups");
    static_assert(T::kStages >= 2, "the overlapped schedule holds block j's K and block j-1's V at once");
    // Split rows (geometry::split_fits): TMA fills every panel of a K or V tile but the last; the producer threads
    // store each row's other 4 to 12 columns at the last panel's start (its rest stays zero).
    static constexpr int kVTileCols = geometry::v_tile_cols(T::kPadV, T::kWideV);
    static constexpr int kMainQK = geometry::split_main(T::kPadQK);  // columns moved by TMA
    static constexpr int kMainV = geometry::split_main(kVTileCols);
    static_assert(!T::kSplitRows || (T::kSwizzle && T::kVecQK >= 4 && T::kVecV >= 4 &&
                                     geometry::split_rows_fit(T::kHeadDimQK, T::kPadQK, T::kHeadDimV, kVTileCols)),
                  "split rows: head dims 4 mod 8 or 8 mod 16 whose tail fits the last panel, swizzled tiles");
    // Shifted rows (geometry::shift_fits): whole rows land shifted right by up to 15 columns, within the pads.
    static_assert(!T::kShiftRows || (T::kSwizzle && !T::kSplitRows &&
                                     geometry::shift_rows_fit(T::kHeadDimQK, T::kPadQK, T::kHeadDimV, T::kPadV)),
                  "shifted rows: head dims off the 16 grid with room for the shift, swizzled tiles");
    static_assert(!T::kWideV || T::kSwizzle, "wide V tiles are 64-column swizzled panels");
    static_assert(T::kPersistent || !T::kOApart, "O's own staging bytes are a persistent kernel's (kStageApart)");
};

namespace sm90 {
// Named barrier ids (0 is __syncthreads): 1..3 turn-taking, 4..6 per-warpgroup Q, 7 all consumers before staging O
// where it overwrites Q/K/V, 8..10 per-warpgroup O staging.
constexpr int kBarTurn = 1, kBarQ = 4, kBarEpilogue = 7, kBarStage = 8;

// The tiles a CTA takes. Persistent kernels: a CTA per tile (tile blockIdx.x), or, when the host says walk, one per
// SM walking the work in rounds of gridDim.x units (in order: the unit fastest, then the head, then the sequence).
// A unit is a query block, or, when causal, a pair of them whose key blocks add up the same for every
// pair (the longest and the shortest, the second longest and the second shortest, ...), so that a static walk
// gives every CTA the same work: walked one query block at a time, causal tiles left CTAs idle for a third of the
// time at d128 S=16k (436 vs 640 TFLOPS on an H100; a simulated schedule, 1.2-1.6x the mean per CTA). Varlen
// sequences differ in length, so packed calls take a CTA per tile and leave the balance to the hardware.
// Causal tiles taken one each come longest first per head (blocks are dispatched in x order), as the grid's do.
// Other kernels: the one tile of their place in a (query block, head, sequence) grid.
template <class T>
struct CtaTiles {
    // unit << 2 | the walk's round is odd << 1 | the causal pair's second (shorter) query block: one register for
    // the three (d36 causal spilled 4 bytes with a separate flag).
    unsigned bits = 0, head = 0;
    int batch = 0;
    __device__ __forceinline__ static bool walking(const FwdParamsTma& pt) { return T::kPersistent && pt.walk != 0; }
    __device__ __forceinline__ explicit CtaTiles(const FwdParamsTma& pt) {
        if constexpr (T::kPersistent) step(blockIdx.x, pt);
    }
    // n units on (32-bit steps: the tile count itself may pass 2^31, and a 64-bit division per tile made the
    // producer spill).
    __device__ __forceinline__ void step(unsigned n, const FwdParamsTma& pt) {
        const unsigned per_head = T::kCausal && walking(pt) ? (pt.m_blocks + 1) / 2 : pt.m_blocks;
        const unsigned heads = pt.p.heads_q;
        unsigned m = (bits >> 2) + n;
        if (m >= per_head) {
            head += m / per_head, m %= per_head;
            if (head >= heads) batch += int(head / heads), head %= heads;
        }
        bits = m << 2 | (bits & 2);
    }
    __device__ __forceinline__ bool done(const FwdParamsTma& pt) const {
        return batch >= (T::kPersistent ? pt.batch : 1);
    }
    // Rounds of gridDim.x units go forth and back (CTA c takes unit c of even rounds, gridDim.x - 1 - c of odd ones):
    // where units differ (an odd count of query blocks leaves a lone middle one), a CTA does not take the small ones
    // every round (d64 S=512 causal: units of 6 and 3 key blocks, 132 SMs; simulated, 1.38x the mean per CTA going
    // forth only, 1.03x forth and back).
    __device__ __forceinline__ void next(const FwdParamsTma& pt) {
        if (!walking(pt)) {
            batch = 1 << 30;
        } else if (T::kCausal && bits % 2 == 0 && (bits >> 2) * 2 + 1 < unsigned(pt.m_blocks)) {
            ++bits;  // the pair has a second block
        } else {
            const unsigned c = blockIdx.x, odd = bits & 2;
            bits = (bits & ~3u) | (odd ^ 2);
            step(odd ? 2 * c + 1 : 2 * (gridDim.x - c) - 1, pt);
        }
    }
    __device__ __forceinline__ detail::TileCoord coord(const FwdParamsTma& pt) const {
        if constexpr (!T::kPersistent) return detail::grid_tile<T::kCausal>();
        const int m = int(bits >> 2);
        const int m_block = !T::kCausal || bits % 2 != 0 ? m : pt.m_blocks - 1 - m;
        return {m_block, int(head), batch};
    }
};

template <class T>
__device__ __forceinline__ detail::CtaTile tile_at(const FwdParamsTma& pt, detail::TileCoord c) {
    return detail::cta_tile<T, T::kPaged>(pt.p, c);
}
// Varlen: a tile past its sequence's end (the grid covers the longest) has nothing to do, not even an epilogue.
template <class T>
__device__ __forceinline__ bool idle_tile(const detail::CtaTile& cta) {
    return T::kVarlen && cta.q0 >= cta.seqlen_q;
}
}  // namespace sm90

// Where a key block's K/V rows come from, as TMA boxes. Dense or packed K/V: one box of kBlockN rows at seq
// coordinate k_begin + key, map batch coordinate the sequence (0 when packed). A paged cache (kPaged): the maps span
// the pool's [num_pages, page_size] rows (batch coordinate the page, seq the slot) in boxes of the page size, at
// most the largest power of two dividing kBlockN (a 112-key block meets pages on 16-row bounds), as the host encodes
// them (geometry::paged_box_rows). Lane i of the issuing warp takes box i and looks its page up
// itself (one coalesced read of the table row per block); only boxes that start before the sequence's last key are
// issued: the table's later entries are not the sequence's, and may lie past its row. The rows no box brings hold an
// earlier tile's data: K's are masked in S, V's zeroed by the consumers (zero_rows_from). Page sizes below 8 load
// with cp.async (the host leaves use_tma 0), so every box starts on a whole swizzle atom (8 rows) of every panel
// width: it lands as one box of the whole tile would.
template <class T>
struct KvBoxes {
    const FwdParamsTma& pt;  // (the parameter block: its fields are read where used, holding no registers)
    int seq0, batch;         // the sequence's first row and map batch coordinate; paged: 0 and the sequence
    __device__ __forceinline__ KvBoxes(const FwdParamsTma& pt_, const detail::CtaTile& cta, detail::TileCoord c)
        : pt(pt_), seq0(cta.k_begin), batch(T::kVarlen && !T::kPaged ? 0 : c.batch) {}
    // Paged: the sequence's block table row (formed where used: held across the block loop, it spilled).
    __device__ __forceinline__ const int* table() const {
        return pt.p.block_table + batch * pt.p.block_table_stride;
    }
    __device__ __forceinline__ int box_rows() const {
        return T::kPaged ? geometry::paged_box_rows(T::kBlockN, 1 << pt.p.page_shift) : T::kBlockN;
    }
    // The rows the boxes of the block starting at key `key` bring: their bytes are what its barrier expects.
    __device__ __forceinline__ int rows(int key, int seqlen_k) const {
        if constexpr (!T::kPaged) return T::kBlockN;
        const int box = box_rows();
        return min(T::kBlockN, (seqlen_k - key + box - 1) / box * box);
    }
    // This lane's box of that block, if it has one: its first row in the tile and its seq and batch coordinates.
    __device__ __forceinline__ bool mine(int key, int seqlen_k, int lane, int& row, int& seq, int& at) const {
        if constexpr (!T::kPaged) {
            row = 0, seq = seq0 + key, at = batch;
            return true;  // (the caller is the one issuing thread)
        }
        row = lane * box_rows();
        if (row >= T::kBlockN || key + row >= seqlen_k) return false;
        seq = (key + row) & ((1 << pt.p.page_shift) - 1);
        at = detail::page_of(table(), key + row, pt.p.page_shift, pt.p.num_pages);
        return true;
    }
};

// Issues one tile's boxes for a panel layout L: the box of rows from `row` of each panel lands `row` rows into it
// (a row of a panel of kind k is 128 >> k bytes: 64 columns and narrower, wide V's panels being 64 columns).
template <class L, class F>
__device__ __forceinline__ void for_each_box_panel(int row, F f) {
    L::for_each_panel([&](int kind, int col, int offset) { f(kind, col, offset + row * (128 >> kind)); });
}

// One K or V block's barrier: the issuing lane (lane 0) expects the boxes' bytes before any lane issues one.
template <class T>
__device__ __forceinline__ void expect_boxes(ptx::u32 full, int bytes, int lane) {
    if (!T::kPaged || lane == 0) ptx::mbar_arrive_expect_tx(full, bytes);
    if constexpr (T::kPaged) __syncwarp();
}

// TMA producer, one warp (lane 0 does the work; with a paged cache each lane issues a page's box): a box per panel
// and tile, completing on the slot's full barrier. Rows past seqlen_k and columns past the head dim arrive as zeros,
// so tails and padding need no extra work (a cache's rows past a sequence's length: KvBoxes).
// Varlen: the maps span the packed total_k rows, so a tile's rows past its sequence are the next sequence's keys:
// masked in S like any tail, and those V rows meet P = 0 (finite data, as the caller's other sequences are).
// `it`: the ring position of the tile's first key block (key blocks of earlier tiles, persistent).
template <class T>
__device__ __forceinline__ void produce_tma(const FwdParamsTma& pt, detail::u16* sK, detail::u16* sV,
                                            sm90::KvRing<T::kStages> ring, const detail::CtaTile& cta,
                                            detail::TileCoord c, int it, int lane) {
    using detail::u32;
    using B = FwdShapeSm90<T>;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, true>;
    using LV = sm90::VLayout<T>;
    constexpr int kSt = T::kStages;
    const int kv_head = c.head / pt.p.q_per_kv;
    const KvBoxes<T> boxes(pt, cta, c);
    for (int j = 0; j < cta.n_blocks; ++j) {
        const int b = it + j, slot = ring.slot(b), key = (cta.n_first + j) * T::kBlockN;
        const u32 full_k = ring.full_k(slot), full_v = ring.full_v(slot);
        const u32 empty_k = ring.empty_k(slot), empty_v = ring.empty_v(slot);
        const u32 parity = ring.empty_parity(b);
        const u32 k_dst = ptx::smem_u32(sK + slot * B::kKElems), v_dst = ptx::smem_u32(sV + slot * B::kVElems);
        const int rows = boxes.rows(key, cta.seqlen_k);
        int row, seq, at;
        const bool mine = boxes.mine(key, cta.seqlen_k, lane, row, seq, at);
        const int c1 = pt.tma_seq_dim == 1 ? seq : kv_head, c2 = pt.tma_seq_dim == 1 ? kv_head : seq;
        if (b >= kSt) ptx::mbar_wait(empty_k, parity);
        expect_boxes<T>(full_k, 2 * (B::kKElems / T::kBlockN) * rows, lane);
        if (mine)
            for_each_box_panel<LK>(row, [&](int kind, int col, int offset) {
                ptx::tma_load_4d(k_dst + offset, &pt.k_map[kind], col, c1, c2, at, full_k);
            });
        if (b >= kSt) ptx::mbar_wait(empty_v, parity);
        expect_boxes<T>(full_v, 2 * (B::kVElems / T::kBlockN) * rows, lane);
        if (mine)
            for_each_box_panel<LV>(row, [&](int kind, int col, int offset) {
                ptx::tma_load_4d(v_dst + offset, &pt.v_map[kind], col, c1, c2, at, full_v);
            });
    }
}

// How the producer threads share a split row's tail of kTail columns (4 to 28): one piece per thread, the lanes of a
// row side by side, so that one warp instruction reads a row's whole tail and its sector once. (One 8-byte load per
// thread and row, three loads for a d140 row, made 54.5M L1 sectors where pieces make 37.8M; ncu, H100.)
// Tails go as 8-byte pieces, which any rotation keeps aligned (vec-4 arguments), so their rows may rotate to 32-byte
// boxes; where those would not fit the producer's registers (geometry::split_narrow: 16 pieces per thread for 20-28
// column tails on 128-key tiles spilled), as 16-byte pieces and a last 8-byte one (kWide), aligned where rows rotate
// to 16 bytes only (two classes). Pieces never straddle the row's wrap.
template <int kTail, int kBlockN, bool kWide>
struct SplitTail {
    static constexpr int kPieces = kWide ? (kTail - geometry::kSplitTail) / 8 + 1 : kTail / geometry::kSplitTail;
    static constexpr int kLanes = geometry::split_lanes(kPieces);  // threads per row
    static constexpr int kRowsPerPass = 128 / kLanes;
    static constexpr int kPasses = (kBlockN + kRowsPerPass - 1) / kRowsPerPass;
    static_assert(kWide ? kTail % 8 == geometry::kSplitTail : kTail % geometry::kSplitTail == 0, "tail width");
    static_assert(kPieces <= kLanes && kLanes <= 8, "at most 8 pieces per row");
    int piece, row0, col;  // this thread's piece of rows row0 (+ kRowsPerPass), tail column `col` from the main part
    int elem;              // and the row element it starts at
    __device__ __forceinline__ SplitTail(int ptid, int main, int rot, int d) {
        piece = ptid % kLanes, row0 = ptid / kLanes, col = main + (kWide ? 8 : geometry::kSplitTail) * piece;
        elem = (col + rot) % d;  // past the head's end: its first columns (the rotation wraps)
    }
    __device__ __forceinline__ bool idle() const { return piece >= kPieces; }  // lanes past a row's pieces
    __device__ __forceinline__ bool wide() const { return kWide && piece < kPieces - 1; }  // a 16-byte piece
    // This thread's pieces of the tile's block `block` (key block first + block); rows past the tile or past seqlen_k
    // hold zeros: V rows there meet P = 0, and 0 * garbage must not be NaN. row(key): where key `key`'s row starts.
    template <class Row>
    __device__ __forceinline__ void load(uint4 (&t)[kPasses], Row row, int block, int n_blocks, int first,
                                         int seqlen_k) const {
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
            const int r = row0 + kRowsPerPass * i, key = (first + block) * kBlockN + r;
            t[i] = make_uint4(0, 0, 0, 0);
            if (block < n_blocks && r < kBlockN && key < seqlen_k && !idle()) {
                const detail::u16* src = row(key) + elem;
                if (wide()) {
                    t[i] = ptx::ldg_nc_u128(src);
                } else {
                    const ptx::u64 v = ptx::ldg_nc_u64(src);
                    t[i].x = unsigned(v), t[i].y = unsigned(v >> 32);
                }
            }
        }
    }
    template <class L>
    __device__ __forceinline__ void store(detail::u16* dst, const uint4 (&t)[kPasses]) const {
#pragma unroll
        for (int i = 0; i < kPasses; ++i) {
            const int r = row0 + kRowsPerPass * i;
            if (r >= kBlockN || idle()) continue;
            detail::u16* at = dst + L::offset(r, col);
            if (wide())
                *reinterpret_cast<uint4*>(at) = t[i];
            else
                *reinterpret_cast<uint2*>(at) = make_uint2(t[i].x, t[i].y);
        }
    }
};

// Split-row producer, all 128 producer threads: thread 0 issues a TMA box per main panel (the 32- or 16-byte aligned
// columns of each row, rotated so they start at column 0); the threads move the rows' tails (the other 4 to 28
// columns, SplitTail) into the last panel themselves. Each loads its next tail pieces into registers as soon as it
// has stored the current ones, so the load's latency passes while it waits for the next free slot, and a store plus
// a plain arrive is all that is left when the slot frees. (8-byte
// cp.asyncs issued after the wait and completing on the barrier made d132 ~7% slower on an H200 than leaving the
// copies out. The copies still cost ~4% of d132's cycles, yet loading two tiles ahead, through a cp.async staging
// ring, or just before the V-slot wait each cost cycles: +1%, +9%, +2-3%, ncu on an H200.)
// The slot's full barrier completes once the TMA bytes have landed and all 4 producer warps have arrived (1 + 4).
template <class T>
__device__ __forceinline__ void produce_split(const FwdParamsTma& pt, detail::u16* sK, detail::u16* sV,
                                              sm90::KvRing<T::kStages> ring, const detail::CtaTile& cta,
                                              detail::TileCoord c, int it, int ptid) {
    using detail::u16;
    using detail::u32;
    using B = FwdShapeSm90<T>;
    using S = FwdShapeSm90Ws<T>;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, true>;
    using LV = sm90::VLayout<T>;
    constexpr int kSt = T::kStages;
    const FwdParams& p = pt.p;
    const int kv_head = c.head / p.q_per_kv;
    const int cls = kv_head % pt.split_classes;
    const int n_blocks = cta.n_blocks;
    const int head_coord = kv_head / pt.split_classes;  // each map's head dimension steps split_classes kv heads
    constexpr int kTailK = T::kHeadDimQK - S::kMainQK, kTailV = T::kHeadDimV - S::kMainV;
    constexpr bool kWide = !geometry::split_narrow(kTailK, kTailV, T::kBlockN);  // as split_classes tells the host
    using TailK = SplitTail<kTailK, T::kBlockN, kWide>;
    using TailV = SplitTail<kTailV, T::kBlockN, kWide>;
    const TailK tail_k(ptid, S::kMainQK, pt.k_rot[cls], T::kHeadDimQK);
    const TailV tail_v(ptid, S::kMainV, pt.v_rot[cls], T::kHeadDimV);
    const TmaMap* k_maps = pt.k_map + 2 * cls;
    const TmaMap* v_maps = pt.v_map + 2 * cls;
    const KvBoxes<T> boxes(pt, cta, c);
    // Where key `key`'s K (V) row starts, for the tails: strided, or in its page (page_stride: the batch stride).
    const auto rows_of = [&](const detail::u16* head, long long page_stride, long long seq_stride) {
        return [&boxes, &p, head, page_stride, seq_stride](int key) {
            if constexpr (T::kPaged)
                return detail::paged_row(head, boxes.table(), p.page_shift, p.num_pages, page_stride, seq_stride, key);
            return head + key * seq_stride;
        };
    };
    const auto k_row = rows_of(cta.k, p.k_batch_stride, p.k_seq_stride);
    const auto v_row = rows_of(cta.v, p.v_batch_stride, p.v_seq_stride);

    // Each thread's next pieces wait in registers until their slot frees.
    uint4 k_next[TailK::kPasses], v_next[TailV::kPasses];
    tail_k.load(k_next, k_row, 0, n_blocks, cta.n_first, cta.seqlen_k);
    tail_v.load(v_next, v_row, 0, n_blocks, cta.n_first, cta.seqlen_k);
    for (int j = 0; j < n_blocks; ++j) {
        const int b = it + j, slot = ring.slot(b), key = (cta.n_first + j) * T::kBlockN;
        const u32 full_k = ring.full_k(slot), full_v = ring.full_v(slot);
        const u32 empty_k = ring.empty_k(slot), empty_v = ring.empty_v(slot);
        const u32 parity = ring.empty_parity(b);
        const int rows = boxes.rows(key, cta.seqlen_k);
        int row, seq, at;
        const bool mine = boxes.mine(key, cta.seqlen_k, ptid, row, seq, at);
        const int c1 = pt.tma_seq_dim == 1 ? seq : head_coord, c2 = pt.tma_seq_dim == 1 ? head_coord : seq;
        // One tile: wait for the slot, TMA the main panels, store this thread's tail pieces, arrive, fetch the next.
        // `layout` is LK or LV (a tag: only its static members are used).
        auto fill = [&](auto layout, int main_cols, u32 empty, u32 full, u16* dst, const TmaMap* maps,
                        const auto& tail, auto& pieces, const auto& row_of) {
            using L = decltype(layout);
            if (b >= kSt) ptx::mbar_wait(empty, parity);
            if (T::kPaged ? ptid < 32 : ptid == 0) {  // the issuing warp (lane 0 alone but for pages)
                expect_boxes<T>(full, 2 * rows * main_cols, ptid);
                if (mine)
                    for_each_box_panel<L>(row, [&](int kind, int col, int offset) {
                        if (col < main_cols)
                            ptx::tma_load_4d(ptx::smem_u32(dst) + offset, &maps[kind], col, c1, c2, at, full);
                    });
            }
            tail.template store<L>(dst, pieces);
            // One arrival per warp: the warp barrier orders every lane's stores before lane 0's release, and the
            // barrier sees 4 arrivals instead of 128 (each one an atomic on the same shared-memory word).
            __syncwarp();
            if ((ptid & 31) == 0) ptx::mbar_arrive(full);
            tail.load(pieces, row_of, j + 1, n_blocks, cta.n_first, cta.seqlen_k);
        };
        fill(LK{}, S::kMainQK, empty_k, full_k, sK + slot * B::kKElems, k_maps, tail_k, k_next, k_row);
        fill(LV{}, S::kMainV, empty_v, full_v, sV + slot * B::kVElems, v_maps, tail_v, v_next, v_row);
    }
}

// The producer's zeroing warps' share of a K tile (shifted rows): each row's columns outside the row shifted right by
// `shift` (the shift's before it, the pad's rest after it), kVec columns a store. Four threads to a row, each with its
// own pieces, rows kThreads / 4 apart: a column's XOR swizzle repeats every 8 rows, so a piece's address steps by a
// constant (its panel's row pitch x the step), and with kCache it is worked out once per tile. Working out every
// store's address for every key block cost the odd head dims 15-20% of their speed and d132 5% (H100). Without
// kCache (the 32 registers of a three-consumer kernel's producer hold no cache: 8-76 bytes of spills; produce_shift
// says where else) each thread takes whole rows kThreads apart, every element's address worked out anew.
template <int kRows, int kHeadDim, int kPad, int kVec, class L, bool kCache, int kThreads>
struct ZeroOutside {
    static constexpr int kPieces = (kPad - kHeadDim) / kVec, kLanes = 4, kStep = kThreads / kLanes;
    static constexpr int kPerLane = (kPieces + kLanes - 1) / kLanes;
    static constexpr int kCached = kCache && kPerLane > 0 ? kPerLane : 1;  // (K of a head dim on the 16 grid: none)
    static_assert(kStep % 8 == 0, "rows of a thread share their swizzle");
    static_assert(kRows * kPad < 65536, "a tile offset and its step share one 32-bit register");
    using Vec = typename detail::VecOf<kVec>::type;
    int t, shift;
    // A piece's offset in the thread's first row (low half) and its step per kStep rows (high half; 0: no piece).
    // One register a piece, so the 56-register producer caches 21 (odd dims of 11 to 15 mod 16: 16 more columns);
    // as two, 17 or more pieces spilled, and without the cache those dims ran at 0.63-0.75 of their pad's speed.
    unsigned at_step[kCached];
    __device__ __forceinline__ ZeroOutside(int t_, int shift_) : t(t_), shift(shift_) {
        if constexpr (kCache) {
            const int lane = t % kLanes, r0 = t / kLanes;
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const int e = (lane + i * kLanes) * kVec, col = e < shift ? e : e + kHeadDim;
                const bool used = lane + i * kLanes < kPieces;
                const int at = L::offset(r0, used ? col : 0), step = used ? L::offset(r0 + kStep, col) - at : 0;
                at_step[i] = unsigned(at) | unsigned(step) << 16;
            }
        }
    }
    __device__ __forceinline__ void zero(detail::u16* s) const {
        if constexpr (kCache) {
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                const int step = int(at_step[i] >> 16);
                if (step == 0) continue;
#pragma unroll 1
                for (int r = t / kLanes, a = int(at_step[i] & 0xffffu); r < kRows; r += kStep, a += step)
                    *reinterpret_cast<Vec*>(s + a) = Vec{};
            }
        } else {
#pragma unroll 1
            for (int r = t; r < kRows; r += kThreads) {
#pragma unroll 4  // fully unrolled, 20-31 columns of 2-byte pieces spilled the 32-register producer
                for (int e = 0; e < kPad - kHeadDim; e += kVec)
                    *reinterpret_cast<Vec*>(s + L::offset(r, e < shift ? e : e + kHeadDim)) = Vec{};
            }
        }
    }
};

// Shifted-row producer (kShiftRows). Boxes of whole rows from the 32-byte (or 16-byte) boundary at or before the row
// on, a box per panel: warp 0 issues K's, completing on the slot's landed barrier, warp 1 V's, on its full one (lane 0
// of each, every lane a page's box from a paged cache). Warps 2-3 wait for each K tile to land, zero its rows' columns
// outside the row (the neighbouring heads' data there, or a strided layout's gaps, would meet Q's zeros as 0 x NaN
// where they are not finite) and then mark it full (two arrivals). V's columns outside the row reach only O's columns
// outside it, never stored.
// The zeroing is on K's path to the consumers and its stores are slow to complete (likely behind the tile writes in
// flight): leaving them out ran d164..184 at 0.98-1.00 of the pad16 ideal, with them 0.93-0.95 (H200), wherever they
// went; landing K's edge panels first did not help. Issuing K apart from V gives that chain slack: one thread issuing
// both waited for V's slot (PV of the block two back) before each next K; apart, K's boxes leave once QK^T of the
// block two back is done: d164, 168, 180 0.93-0.95 -> 0.98-0.99, d148 -> 1.00, d132 even (docs/PERFORMANCE.md,
// thirty-fifth session).
// Earlier forms: one thread that waited for each K tile to land before issuing the next boxes put the TMA latency into
// every key block (d194 and d226, 64-key tiles, at 0.79-0.82 of the pad16 ideal), and zeroing after the wait for V's
// slot put the zeroing on the consumers' path (d131 0.65, d132 0.83).
template <class T>
__device__ __forceinline__ void produce_shift(const FwdParamsTma& pt, detail::u16* sK, detail::u16* sV,
                                              sm90::KvRing<T::kStages> ring, const detail::CtaTile& cta,
                                              detail::TileCoord c, int it, int ptid) {
    using detail::u32;
    using B = FwdShapeSm90<T>;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, true>;
    using LV = sm90::VLayout<T>;
    constexpr int kSt = T::kStages;
    const int kv_head = c.head / pt.p.q_per_kv;
    if (ptid >= 64) {  // warps 2-3: zero each landed K tile outside its rows
        constexpr bool kCache =
            FwdShapeSm90Ws<T>::kProducerRegs >= 56 && (T::kPadQK - T::kHeadDimQK) / T::kVecQK <= 24;
        const ZeroOutside<T::kBlockN, T::kHeadDimQK, T::kPadQK, T::kVecQK, LK, kCache, 64> zeros(
            ptid - 64, pt.k_shift[kv_head % 16]);
        for (int j = 0; j < cta.n_blocks; ++j) {
            const int b = it + j, slot = ring.slot(b);
            ptx::mbar_wait(ring.landed_k(slot), ring.full_parity(b));
            zeros.zero(sK + slot * B::kKElems);
            wgmma::fence_proxy_async();  // the zeros, visible to the consumers' wgmma
            __syncwarp();
            if ((ptid & 31) == 0) ptx::mbar_arrive(ring.full_k(slot));
        }
        return;
    }
    const int w = ptid >> 5, lane = ptid & 31;  // warp 0 issues K, warp 1 V
    if (!T::kPaged && lane != 0) return;         // (lane 0 alone but for pages)
    const int k_col = kv_head * pt.k_col_step - pt.k_shift[kv_head % 16];
    const int v_col = kv_head * pt.v_col_step - pt.v_shift[kv_head % 16];
    const int k_head = kv_head * pt.k_head_step, v_head = kv_head * pt.v_head_step;
    const bool seq_first = pt.tma_seq_dim == 1;
    const KvBoxes<T> boxes(pt, cta, c);
    for (int j = 0; j < cta.n_blocks; ++j) {
        const int b = it + j, slot = ring.slot(b), key = (cta.n_first + j) * T::kBlockN;
        const u32 parity = ring.empty_parity(b);
        const u32 landed = ring.landed_k(slot), full_v = ring.full_v(slot);
        const u32 k_dst = ptx::smem_u32(sK + slot * B::kKElems), v_dst = ptx::smem_u32(sV + slot * B::kVElems);
        const int rows = boxes.rows(key, cta.seqlen_k);
        int row, seq, at;
        const bool mine = boxes.mine(key, cta.seqlen_k, lane, row, seq, at);
        if (w == 0) {
            if (b >= kSt) ptx::mbar_wait(ring.empty_k(slot), parity);
            expect_boxes<T>(landed, 2 * (B::kKElems / T::kBlockN) * rows, lane);
            if (mine)
                for_each_box_panel<LK>(row, [&](int kind, int col, int offset) {
                    ptx::tma_load_4d(k_dst + offset, &pt.k_map[kind], k_col + col, seq_first ? seq : k_head,
                                     seq_first ? k_head : seq, at, landed);
                });
        } else {
            if (b >= kSt) ptx::mbar_wait(ring.empty_v(slot), parity);
            expect_boxes<T>(full_v, 2 * (B::kVElems / T::kBlockN) * rows, lane);
            if (mine)
                for_each_box_panel<LV>(row, [&](int kind, int col, int offset) {
                    ptx::tma_load_4d(v_dst + offset, &pt.v_map[kind], v_col + col, seq_first ? seq : v_head,
                                     seq_first ? v_head : seq, at, full_v);
                });
        }
    }
}

// cp.async of one K or V block from a paged cache (pages of fewer than 8 rows, or a pool TMA cannot address), rows
// past the sequence zero-filled. A warp copies kRows adjacent rows a pass (a row's vectors on adjacent lanes); the
// pages of its next 32 rows are looked up at once, a lane a row, and handed out by shuffle, so one table read's latency
// covers 32 rows (a lookup per 16-byte copy, each waiting on its own read, ran a 1-row page's prefill at 0.21x the
// dense kernel on an H200; this, 0.48x at d128; dealing the 32 rows' vectors flat over the lanes, rows 4 apart,
// 0.33x). Not unrolled: the producer holds 64 registers.
template <class T, bool kV, int kHeadDim, int kVec, class L>
__device__ __forceinline__ void load_paged(detail::u16* s, const detail::u16* head, const FwdParams& p, int batch,
                                           int k0, int seqlen_k, int ptid) {
    // K's or V's strides, from the parameter block; the sequence's table row.
    const long long page_stride = kV ? p.v_batch_stride : p.k_batch_stride;
    const long long slot_stride = kV ? p.v_seq_stride : p.k_seq_stride;
    const int* table = p.block_table + batch * p.block_table_stride;
    constexpr int kPerRow = kHeadDim / kVec;
    constexpr int kRows = kPerRow >= 32 ? 1 : 32 / kPerRow;  // rows a warp copies per pass
    constexpr int kColPasses = (kPerRow + 31) / 32;           // passes over a row of more than 32 vectors
    constexpr int kBatch = 32 / kRows;                        // passes whose rows one lookup round covers
    constexpr int kPasses = (T::kBlockN + 4 * kRows - 1) / (4 * kRows);
    const int warp = ptid / 32, lane = ptid % 32, sub = lane / kPerRow;
    const int slot_mask = (1 << p.page_shift) - 1;
#pragma unroll 1
    for (int t0 = 0; t0 < kPasses; t0 += kBatch) {
        // Pass t of warp w copies rows (4t + w) kRows + 0..kRows-1; lane j looks up row j % kRows of pass
        // t0 + j / kRows.
        const int mine = ((t0 + lane / kRows) * 4 + warp) * kRows + lane % kRows;
        int page = 0;
        if (lane < kBatch * kRows && mine < T::kBlockN && k0 + mine < seqlen_k)
            page = detail::page_of(table, k0 + mine, p.page_shift, p.num_pages);
        const int t_end = min(t0 + kBatch, kPasses);
#pragma unroll 1
        for (int t = t0; t < t_end; ++t) {
            const int row_page = __shfl_sync(0xffffffffu, page, ((t - t0) * kRows + sub) & 31);
            const int r = (t * 4 + warp) * kRows + sub;
            if (sub >= kRows || r >= T::kBlockN) continue;
            const bool valid = k0 + r < seqlen_k;
            const detail::u16* row = head + row_page * page_stride + ((k0 + r) & slot_mask) * slot_stride;
#pragma unroll
            for (int cp = 0; cp < kColPasses; ++cp) {
                const int vec = kPerRow >= 32 ? lane + 32 * cp : lane - sub * kPerRow;
                if (vec >= kPerRow) continue;
                const int c = vec * kVec;
                const detail::u16* src = valid ? row + c : head;
                if constexpr (kVec >= 2)
                    ptx::cp_async<kVec * 2>(ptx::smem_u32(s + L::offset(r, c)), src, valid);
                else
                    s[L::offset(r, c)] = valid ? *src : detail::u16(0);
            }
        }
    }
}

// The producer warpgroup: K/V tiles of every tile this CTA takes, into the ring. Block j of a tile is ring position
// it + j (it: the key blocks of the CTA's earlier tiles) and goes to slot (it + j) % kSt once every consumer warp
// has released that slot's previous occupant.
template <class T>
__device__ __forceinline__ void produce(const FwdParamsTma& pt, detail::u16* sK, detail::u16* sV,
                                        sm90::KvRing<T::kStages> ring, int ptid) {
    using detail::u32;
    using B = FwdShapeSm90<T>;
    using S = FwdShapeSm90Ws<T>;
    constexpr int kSt = T::kStages;
    const FwdParams& p = pt.p;
    if (!(T::kSwizzle && pt.use_tma != 0)) {
        // cp.async (the host launches a CTA per tile then): the CTA's tile, every producer thread.
        const detail::TileCoord c = sm90::CtaTiles<T>(pt).coord(pt);
        const detail::CtaTile cta = sm90::tile_at<T>(pt, c);
        if (sm90::idle_tile<T>(cta)) return;
        for (int j = 0; j < cta.n_blocks; ++j) {
            const int slot = ring.slot(j), k0 = (cta.n_first + j) * T::kBlockN;
            const u32 parity = ring.empty_parity(j);
            if (j >= kSt) ptx::mbar_wait(ring.empty_k(slot), parity);
            if constexpr (T::kPaged)
                load_paged<T, false, T::kHeadDimQK, T::kVecQK, sm90::TileLayout<T::kBlockN, T::kPadQK, T::kSwizzle>>(
                    sK + slot * B::kKElems, cta.k, p, c.batch, k0, cta.seqlen_k, ptid);
            else
                sm90::load_tile<T::kBlockN, T::kHeadDimQK, T::kPadQK, T::kSwizzle, T::kVecQK, 128, T::kBlockN,
                                S::kLoadUnroll>(sK + slot * B::kKElems, cta.k + (long long)k0 * p.k_seq_stride,
                                                p.k_seq_stride, cta.seqlen_k - k0, ptid);
            sm90::signal_loaded<T::kVecQK>(ring.full_k(slot));
            if (j >= kSt) ptx::mbar_wait(ring.empty_v(slot), parity);
            if constexpr (T::kPaged)
                load_paged<T, true, T::kHeadDimV, T::kVecV, sm90::VLayout<T>>(sV + slot * B::kVElems, cta.v, p,
                                                                              c.batch, k0, cta.seqlen_k, ptid);
            else
                sm90::load_tile<T::kBlockN, T::kHeadDimV, T::kPadV, T::kSwizzle, T::kVecV, 128, T::kBlockN,
                                S::kLoadUnroll, sm90::VLayout<T>>(sV + slot * B::kVElems,
                                                                  cta.v + (long long)k0 * p.v_seq_stride,
                                                                  p.v_seq_stride, cta.seqlen_k - k0, ptid);
            sm90::signal_loaded<T::kVecV>(ring.full_v(slot));
        }
        ptx::cp_async_wait<0>();  // exit with nothing in flight
        return;
    }
    // TMA of whole rows: one thread issues every box (a warp, a box per page, from a paged cache).
    if (!T::kSplitRows && !T::kShiftRows && (T::kPaged ? ptid >= 32 : ptid != 0)) return;
    int it = 0;
    for (sm90::CtaTiles<T> tiles(pt); !tiles.done(pt); tiles.next(pt)) {
        const detail::TileCoord c = tiles.coord(pt);
        const detail::CtaTile cta = sm90::tile_at<T>(pt, c);
        if (sm90::idle_tile<T>(cta)) continue;
        if constexpr (T::kSplitRows)
            produce_split<T>(pt, sK, sV, ring, cta, c, it, ptid);
        else if constexpr (T::kShiftRows)
            produce_shift<T>(pt, sK, sV, ring, cta, c, it, ptid);
        else if constexpr (T::kSwizzle)
            produce_tma<T>(pt, sK, sV, ring, cta, c, it, ptid);
        it += cta.n_blocks;
    }
}

// Zeroes rows [from, kRows) of a V tile, every padded column, 16 bytes a store (rows are whole 16-byte chunks in every
// layout). A cache's last key block, when TMA brought it: the box reaches past the sequence's length into slots the
// cache has not filled (stale, maybe NaN), or (paged) no box brought those rows and they hold an earlier block's,
// and P = 0 there still makes 0 x NaN in PV. (cp.async zero-fills them;
// loading the whole cache that way ran a dense cache's prefill at 0.53-0.59x the TMA kernel, d132 0.27x, H200.)
template <class L, int kRows, int kPad, int kThreads>
__device__ __forceinline__ void zero_rows_from(detail::u16* tile, int from, int tid) {
    constexpr int kChunks = kPad / 8;
#pragma unroll 1
    for (int i = from * kChunks + tid; i < kRows * kChunks; i += kThreads)
        *reinterpret_cast<detail::Vec16*>(tile + L::offset(i / kChunks, i % kChunks * 8)) = detail::Vec16{};
}

template <class T>
__device__ __forceinline__ void flash_fwd_sm90_ws(const FwdParamsTma& pt) {
    const FwdParams& p = pt.p;
    using S = FwdShapeSm90Ws<T>;
    using B = FwdShapeSm90<T>;
    using detail::u16;
    using detail::u32;
    constexpr int kNC = S::kConsumers;
    constexpr int kSt = T::kStages;
    constexpr int kNB = T::kBlockN / 8;
    constexpr int kNV = T::kPadV / 8;
    constexpr int kKP = T::kBlockN / 16;
    using LQ = sm90::TileLayout<T::kBlockM, T::kPadQK, T::kSwizzle>;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, T::kSwizzle>;
    using LV = sm90::VLayout<T>;

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    u16* sQ = reinterpret_cast<u16*>(smem_raw);
    u16* sK = reinterpret_cast<u16*>(smem_raw + S::kQBytes);
    u16* sV = sK + kSt * B::kKElems;
    // O's staging tile (geometry::kStage*): bytes of its own, or over Q (and K/V, for a grid-launched CTA's only tile).
    u16* sO = T::kOApart ? sV + kSt * B::kVElems : sQ;
    const sm90::KvRing<kSt> ring{ptx::smem_u32(smem_raw + S::kBarrierOffset)};

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wg = warp >> 2;  // 0..kNC-1: consumers; kNC: producer

    // Pad columns are zeroed once: loads never write them (TMA's out-of-bounds columns arrive as zeros).
    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, S::kThreads>(sQ, tid, LQ::offset);
#pragma unroll
    for (int st = 0; st < kSt; ++st) {
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, S::kThreads>(sK + st * B::kKElems, tid, LK::offset);
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, S::kThreads>(sV + st * B::kVElems, tid, LV::offset);
    }
    if (tid == 0) {
        // TMA: one thread arrives (with the byte count); cp.async: every producer thread arrives once per tile;
        // split rows: both (each producer warp after storing its rows' tails); shifted rows: K's box bytes land on
        // their own barrier, and producer warps 2-3 mark K full once its rows are zeroed outside the row.
        const bool tma = T::kSwizzle && pt.use_tma != 0;
        const u32 loaders = !tma ? 128 : T::kSplitRows ? 5 : 1;
        for (int st = 0; st < kSt; ++st) {
            ptx::mbar_init(ring.full_k(st), tma && T::kShiftRows ? 2 : loaders);
            ptx::mbar_init(ring.full_v(st), loaders);
            if constexpr (T::kShiftRows) ptx::mbar_init(ring.landed_k(st), 1);
            ptx::mbar_init(ring.empty_k(st), T::kWarps);  // one arrival per consumer warp
            ptx::mbar_init(ring.empty_v(st), T::kWarps);
        }
    }
    wgmma::fence_proxy_async();  // the zeroed pad columns, visible to wgmma
    __syncthreads();

    if (wg == kNC) {
        ptx::setmaxnreg_dec<S::kProducerRegs>();
        produce<T>(pt, sK, sV, ring, tid - S::kConsumerThreads);
        return;
    }

    ptx::setmaxnreg_inc<S::kConsumerRegs>();
    const int ctid = tid & 127;  // thread within the warpgroup
    const int q_row0 = wg * 64;
    // This warpgroup's 64 Q rows of a tile (its own rows: no other warpgroup reads them). Split rows: Q columns
    // rotate with K's; shifted rows: they shift with K's, every other column zero (the dot product only needs both
    // in the same order).
    // Odd head dims' Q rows as 16-byte blocks where the layout keeps them inside the tensor (else 2-byte loads).
    const bool q_blocks = T::kVecQK == 1 && sm90::rows_in_blocks(p.q, T::kVarlen ? 0 : p.q_batch_stride, p.q_seq_stride,
                                                                 p.q_head_stride, p.heads_q, T::kHeadDimQK);
    auto load_q = [&](const sm90::CtaTiles<T>& tiles) {
        const detail::TileCoord c = tiles.coord(pt);
        const detail::CtaTile cta = sm90::tile_at<T>(pt, c);
        const u16* g = cta.q + (long long)q_row0 * p.q_seq_stride;
        const int valid_rows = cta.seqlen_q - cta.q0 - q_row0;
        if constexpr (T::kShiftRows) {
            const int shift = pt.k_shift[(c.head / p.q_per_kv) % 16];
            if (q_blocks)
                sm90::load_tile_shifted_blocks<T::kBlockM, T::kHeadDimQK, T::kPadQK, T::kSwizzle, 128, 64>(
                    sQ, g, p.q_seq_stride, valid_rows, ctid, q_row0, shift);
            else
                sm90::load_tile_shifted<T::kBlockM, T::kHeadDimQK, T::kPadQK, T::kSwizzle, T::kVecQK, 128, 64>(
                    sQ, g, p.q_seq_stride, valid_rows, ctid, q_row0, shift);
        } else {
            const int q_rot = T::kSplitRows ? pt.k_rot[(c.head / p.q_per_kv) % pt.split_classes] : 0;
            sm90::load_tile<T::kBlockM, T::kHeadDimQK, T::kPadQK, T::kSwizzle, T::kVecQK, 128, 64>(
                sQ, g, p.q_seq_stride, valid_rows, ctid, q_row0, q_rot);
        }
        ptx::cp_async_commit();
    };

    // Turn-taking: warpgroup c issues after c-1 has issued (warpgroup 0 after the last one); the last warpgroup
    // opens the first turn. Turns run on across tiles: every warpgroup takes as many per tile.
    auto my_turn = [&] {
        if constexpr (T::kPingPong && kNC > 1) ptx::bar_sync(sm90::kBarTurn + wg, 256);
    };
    auto pass_turn = [&] {
        if constexpr (T::kPingPong && kNC > 1) ptx::bar_arrive(sm90::kBarTurn + (wg + 1) % kNC, 256);
    };
    if constexpr (T::kPingPong && kNC > 1)
        if (wg == kNC - 1) ptx::bar_arrive(sm90::kBarTurn, 256);

    const u32 q_addr = ptx::smem_u32(sQ);
    auto k_at = [&](int slot) { return ptx::smem_u32(sK + slot * B::kKElems); };
    auto v_at = [&](int slot) { return ptx::smem_u32(sV + slot * B::kVElems); };
    auto wait_full = [&](u32 bar, int b) {
        ptx::mbar_wait(bar, ring.full_parity(b));
        wgmma::fence_proxy_async();  // the producer's generic-proxy writes, ordered before this thread's wgmma
    };
    auto release = [&](u32 bar) {
        if (lane == 0) ptx::mbar_arrive(bar);
    };

    int it = 0;  // ring position of the tile's first key block
    sm90::CtaTiles<T> tiles(pt);
    if (!tiles.done(pt)) load_q(tiles);
    for (; !tiles.done(pt); tiles.next(pt)) {
        const detail::TileCoord c = tiles.coord(pt);
        const detail::CtaTile cta = sm90::tile_at<T>(pt, c);
        const int q0 = cta.q0, n_blocks = cta.n_blocks;
        const int seqlen_q = cta.seqlen_q, seqlen_k = cta.seqlen_k;
        const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
        // The next tile's Q rows, once this tile's last QK^T has read its own and (O staged over Q) its O has been
        // stored: with O apart, issued under the last PV where the consumers' registers allow (two warpgroups), after
        // it with three (d56 spilled 24 bytes) and for odd head dims (their blocks and cuts spilled 4-16 bytes at
        // d159 and d207 beside the scores, P and O).
        constexpr bool kQUnderPV = T::kOApart && kNC < 3 && T::kVecQK != 1;
        auto prefetch_q = [&] {
            sm90::CtaTiles<T> after = tiles;
            after.next(pt);
            if (!after.done(pt)) load_q(after);
        };
        ptx::cp_async_wait<0>();
        wgmma::fence_proxy_async();
        ptx::bar_sync(sm90::kBarQ + wg, 128);
        if (sm90::idle_tile<T>(cta)) {  // no epilogue: nothing is staged over Q
            prefetch_q();
            continue;
        }
        if (T::kOApart && n_blocks == 0) prefetch_q();

        // Scores of block j (landed in s) -> masked, statistics updated; `corr` is what O must be scaled by.
        float row_max[1][2] = {{detail::neg_inf(), detail::neg_inf()}};
        float row_sum[1][2] = {{0.f, 0.f}};
        detail::AlibiRows<T::kAlibi, 1> alibi(cta.alibi);
        auto softmax_to_p = [&](float (&s)[1][kNB][4], int j, float (&corr)[1][2]) {
            const int n0 = (cta.n_first + j) * T::kBlockN;
            detail::apply_softcap<T::kSoftcap>(s, p.softcap_scale);
            alibi.apply(s, row_max, n0, q0 + warp * 16, lane, mask.shift());
            if (mask.needs_mask(n0, q0)) detail::apply_mask(mask, s, n0, q0 + warp * 16, lane);
            detail::softmax_update(s, row_max, row_sum, corr, p.scale_log2);
        };

        float acc_o[1][kNV][4];
#pragma unroll
        for (int nb = 0; nb < kNV; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[0][nb][e] = 0.f;

        // A warpgroup whose 64 rows are all past the sequence's end (the last query block of a short sequence: at d64,
        // S=256, two of the second tile's three) issues no GEMM and computes no softmax, so the others have the tensor
        // cores to themselves; it still waits for each tile, takes its turns and releases the slots, so the ring's
        // and the turns' phases stay in step.
        if (q0 + q_row0 >= seqlen_q) {
            for (int j = 0; n_blocks > 0 && j <= n_blocks; ++j) {  // the same waits, turns and releases as below
                if (j < n_blocks) wait_full(ring.full_k(ring.slot(it + j)), it + j);
                if (j > 0) wait_full(ring.full_v(ring.slot(it + j - 1)), it + j - 1);
                my_turn();
                pass_turn();
                if (j < n_blocks) release(ring.empty_k(ring.slot(it + j)));
                if (j > 0) release(ring.empty_v(ring.slot(it + j - 1)));
            }
            if (T::kOApart && n_blocks > 0) prefetch_q();
        } else if (n_blocks > 0) {
            u32 pa[kKP][4];  // P of the block whose PV is issued next
            {
                float s[1][kNB][4];
                float corr[1][2];  // O is still zero: nothing to rescale
                const int slot = ring.slot(it);
                wait_full(ring.full_k(slot), it);
                my_turn();
                wgmma::fence();
                sm90::issue_qk<T>(s, q_addr, q_row0, k_at(slot));
                pass_turn();
                wgmma::wait<0>();
                sm90::fence_regs<kNB * 4>(&s[0][0][0]);
                release(ring.empty_k(slot));
                if (kQUnderPV && n_blocks == 1) prefetch_q();
                softmax_to_p(s, 0, corr);
                sm90::pack_p<T>(s, pa);
            }
            for (int j = 1; j < n_blocks; ++j) {
                const int slot = ring.slot(it + j), prev = ring.slot(it + j - 1);
                float s[1][kNB][4];
                float corr[1][2];
                wait_full(ring.full_k(slot), it + j);
                wait_full(ring.full_v(prev), it + j - 1);
                my_turn();
                wgmma::fence();
                sm90::issue_qk<T>(s, q_addr, q_row0, k_at(slot));
                sm90::issue_pv<T>(acc_o, pa, v_at(prev));
                pass_turn();
                wgmma::wait<1>();  // QK^T(j) done; PV(j-1) may still run
                sm90::fence_regs<kNB * 4>(&s[0][0][0]);
                release(ring.empty_k(slot));
                if (kQUnderPV && j == n_blocks - 1) prefetch_q();
                softmax_to_p(s, j, corr);
                wgmma::wait<0>();
                sm90::fence_regs<kNV * 4>(&acc_o[0][0][0]);
                sm90::fence_regs<kKP * 4>(&pa[0][0]);
                release(ring.empty_v(prev));
                detail::rescale(acc_o, corr);
                // P is packed only now: writing pa while PV(j-1) still reads it would serialize the wgmma pipeline.
                sm90::pack_p<T>(s, pa);
            }
            const int last = ring.slot(it + n_blocks - 1);
            wait_full(ring.full_v(last), it + n_blocks - 1);
            if constexpr (T::kSwizzle && (T::kPaged || !T::kVarlen)) {  // a cache's keys end inside the block
                const int keys = seqlen_k - (cta.n_first + n_blocks - 1) * T::kBlockN;
                if ((T::kPaged || p.seqlens_k != nullptr) && pt.use_tma != 0 && keys < T::kBlockN) {
                    // Every consumer warpgroup zeroes the same rows with the same zeros, then waits for its own.
                    zero_rows_from<LV, T::kBlockN, T::kPadV, 128>(sV + last * B::kVElems, keys, ctid);
                    wgmma::fence_proxy_async();  // each thread's zeros, visible to the async proxy (wgmma) ...
                    ptx::bar_sync(sm90::kBarQ + wg, 128);  // ... before any thread of the warpgroup issues PV
                }
            }
            my_turn();
            wgmma::fence();
            sm90::issue_pv<T>(acc_o, pa, v_at(last));
            pass_turn();
            wgmma::wait<0>();
            sm90::fence_regs<kNV * 4>(&acc_o[0][0][0]);
            sm90::fence_regs<kKP * 4>(&pa[0][0]);
            release(ring.empty_v(last));  // persistent: the next tile's blocks take the slot
            if (T::kOApart && !kQUnderPV) prefetch_q();
        }
        it += n_blocks;

        // Epilogue, per warpgroup: its 64 rows staged (after its previous tile's stores have read the staging rows;
        // over Q (and K/V), after every consumer is done with them), then stored.
        const int o_rot = T::kSplitRows ? pt.v_rot[(c.head / p.q_per_kv) % pt.split_classes] : 0;
        const int o_shift = T::kShiftRows ? pt.v_shift[(c.head / p.q_per_kv) % 16] : 0;
        if constexpr (T::kOApart)
            ptx::bar_sync(sm90::kBarStage + wg, 128);
        else
            ptx::bar_sync(sm90::kBarEpilogue, S::kConsumerThreads);
        const auto seq = detail::fwd_seq_info<T>(p, c.batch);  // again, rather than kept live through the loop
        alibi.settle(row_max, lane);
        detail::normalize_and_stage<T::kBF16, 1, kNV, B::kStrideV, T::kSinks>(p, seq, acc_o, row_max, row_sum, sO,
                                                                              warp * 16, q0, lane, c.head);
        ptx::bar_sync(sm90::kBarStage + wg, 128);
        detail::store_tile<64, T::kHeadDimV, T::kVecV, B::kStrideV, 128>(p, seq, sO + q_row0 * B::kStrideV,
                                                                         q0 + q_row0, ctid, o_rot, c.head, o_shift);
        if constexpr (T::kPersistent && !T::kOApart) {
            // Every warpgroup's stores have read the O staged over Q: Q's pad columns are zeroed again (O overwrote
            // them; QK^T must meet 0 there, never 0 x NaN) and the next Q loads. The pad columns (fewer than 16) all
            // lie in the last panel, whose rows of this warpgroup are one contiguous run: zeroed whole with 16-byte
            // stores, its real columns loaded again after (zero_pad_cols' per-element loop cost d148 28 bytes of
            // spills).
            ptx::bar_sync(sm90::kBarEpilogue, S::kConsumerThreads);
            if constexpr (T::kHeadDimQK < T::kPadQK && !T::kShiftRows) {  // shifted rows' Q loads write every column
                if constexpr (T::kSwizzle) {
                    constexpr int kLastW = geometry::last_panel_width(T::kPadQK);
                    uint4* z = reinterpret_cast<uint4*>(sQ + LQ::offset(q_row0, T::kPadQK - kLastW));
#pragma unroll
                    for (int i = ctid; i < 64 * kLastW / 8; i += 128) z[i] = make_uint4(0, 0, 0, 0);
                } else {
                    detail::zero_pad_cols<64, T::kHeadDimQK, T::kPadQK, 128>(
                        sQ, ctid, [&](int r, int col) { return LQ::offset(q_row0 + r, col); });
                }
                ptx::bar_sync(sm90::kBarStage + wg, 128);  // the zeros land before the loads' real columns
            }
            prefetch_q();
        }
    }
    // The last warpgroup's final pass_turn (or its opening one, with no key blocks) is still pending on
    // warpgroup 0's barrier: take it, so no arrival outlives the CTA.
    if constexpr (T::kPingPong && kNC > 1)
        if (wg == 0) ptx::bar_sync(sm90::kBarTurn, 256);
}

}  // namespace rtattn
