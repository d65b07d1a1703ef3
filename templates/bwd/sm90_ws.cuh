// Hopper (sm_90a) warp-specialized backward: bwd/sm90.cuh's GEMMs (S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
// dK += dS^T Q, dQ = dS K) with the loads and the dQ reductions taken off the consumers.
//
//   consumers  warpgroups 0 and 1, 64 of the CTA's 128 keys each, dK and dV in registers across the walk. Per step
//              S^T and dP^T are issued back to back, P^T is computed while dP^T runs; dV is issued before the two
//              warpgroups exchange dS^T (shared memory, two buffers: a step writes the one its predecessor's
//              predecessor read), then dQ (each warpgroup its share, over all 128 keys: 64 of a step's 128 query
//              rows at pads up to 64, else the columns of
//              geometry::bwd_sm90_ws_dq_split) and dK; dQ is staged while dK runs. The wide form (pads 160..256,
//              kWide): 64 keys a CTA, both warpgroups on all of them, each with half of the columns of dK, dV
//              and dQ (S^T and dP^T computed by both; past pad 192 they split the GEMMs instead, each computed
//              once: bwd/sm90_ws_gemms.cuh).
//   producer   warpgroup 2 on few registers (setmaxnreg): its threads load K and V once (cp.async, rows past
//              seqlen_k zero); its warp 0 streams Q, dO and their rows' LSE and D into a ring of kStages slots by TMA
//              and bulk copies from one thread, and zeroes what must not reach the GEMMs once a tile has landed (a
//              packed sequence's rows past its end, which are the next sequence's; shifted rows' neighbouring
//              columns); its warp 1 adds each step's staged dQ into the fp32 accumulator by one bulk reduction (in
//              key-block order when deterministic; past pad 192 the consumer warps add theirs, bwd/sm90_ws_gemms.cuh).
//              A call no map can address runs the module's other kernel,
//              bwd/sm90.cuh's (BwdSm90Fallback).
//
// Handshakes (mbarriers): full[s] (Q, dO, LSE, D of slot s landed: one arrival with the bytes), empty[s] (every
// consumer warp is done with the slot), landed (a tile to fix has arrived: warp 0 alone), kv (K and V landed: every
// producer thread), dq_full (both warpgroups staged this step's dQ: every consumer warp), dq_empty (the reduction has
// read the staging tile); dQ a step late (kDqLag), ds_full[b] / ds_empty[b] (dS^T buffer b written / read by dQ:
// every consumer warp), else one named barrier a step between the warpgroups. A barrier's k-th phase is waited on
// as parity k & 1, in order, by one party (ds_full and ds_empty by both warpgroups, neither of which can be two
// phases behind: each phase needs the other's arrival after its wait on the phase before): a parity wait cannot tell
// a phase from the one two later.
//
// Rows past seqlen_q carry LSE = +inf and D = 0 (the preprocess), so their P^T and dS^T are 0; key rows past
// seqlen_k are zero, so their dQ terms are 0 and their dK/dV rows are never stored (bwd/sm90.cuh).
#pragma once
#include "common/epilogue.cuh"
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/seq.cuh"
#include "common/softmax.cuh"
#include "sm90/gemm.cuh"
#include "sm90/load.cuh"
#include "sm90/tile_layout.cuh"
#include "bwd/mma.cuh"
#include "bwd/rows.cuh"
#include "bwd/sm90.cuh"
#include "bwd/sm90_ws_gemms.cuh"

namespace rtattn {

// Traits (from the rendered stub): those of bwd/sm90.cuh (kWarps: the consumers' 8), with pads 32..144 and head dims
// that are multiples of 8, or of 4 at pad 144 (TMA boxes start 16-byte aligned: kShiftRows), kStages 2, and kBlockM
// 128 at pads up to 64 (a step's GEMMs are small there; its fixed costs are paid half as often).
template <class T>
struct BwdShapeSm90Ws {
    static constexpr int kConsumerThreads = T::kWarps * 32;
    static constexpr int kThreads = kConsumerThreads + 128;
    static constexpr int kDqStride = geometry::bwd_dq_stride(T::kPadQK);
    // dQ added by each consumer warp from a box of its own instead of a staged tile (wide form past pad 192).
    static constexpr bool kDqDirect = geometry::bwd_sm90_ws_dq_direct(T::kPadQK, T::kBlockN);
    static constexpr int kDqBytes =
        kDqDirect ? T::kWarps * geometry::bwd_sm90_ws_dq_box_bytes() : 4 * T::kBlockM * kDqStride;
    static constexpr int kKElems = T::kBlockN * T::kPadQK, kVElems = T::kBlockN * T::kPadV;
    static constexpr int kQElems = T::kBlockM * T::kPadQK, kdOElems = T::kBlockM * T::kPadV;
    static constexpr int kdSElems = T::kBlockN * T::kBlockM;
    static constexpr int kNB = T::kBlockM / 8;
    // The wide form (pads past 144, 64 keys a CTA): dK and dV of 64 keys x pad no longer fit one warpgroup's
    // registers, so both warpgroups take all 64 keys, each computing S^T and dP^T whole (the same values: 7 GEMM
    // units a step for 5) and keeping half of dK's, dV's and dQ's columns (geometry::bwd_sm90_ws_wide_col).
    static constexpr bool kWide = geometry::bwd_sm90_ws_wide_tile(T::kBlockN);
    // ... or, where dQ leaves by reductions, the two warpgroups split the step's GEMMs instead of the columns
    // (bwd/sm90_ws_gemms.cuh: each GEMM computed once).
    static constexpr bool kByGemm = geometry::bwd_sm90_ws_by_gemm(T::kPadQK, T::kBlockN);
    // dK, dV (and dQ) accumulators: the pad, or past 128 the head dim rounded to 8 (d136: 136, not 144); wide: the
    // pad, and a warpgroup's share half of it.
    static constexpr int kAccQK = kWide ? T::kPadQK : geometry::bwd_sm90_ws_acc_cols(T::kHeadDimQK, T::kPadQK);
    static constexpr int kAccV = kWide ? T::kPadV : geometry::bwd_sm90_ws_acc_cols(T::kHeadDimV, T::kPadV);
    static constexpr int kColsQK = kWide ? kAccQK / 2 : kAccQK, kColsV = kWide ? kAccV / 2 : kAccV;
    // Head dims of 4 mod 8 at pad 144 (d132, d140; d_qk = d_v): rows whose packed heads start 8 bytes off 16 in
    // every other head. Each tile holds its rows placed 0 or 4 columns right, as they lie (K and V as the CTA's
    // first query head's Q and dO rows); a TMA box starts at the 16-byte boundary at or before the row, and the
    // producer zeroes the columns outside it once the tile lands. The main entry takes calls whose query heads of a
    // group lie alike (MHA, or head strides of 8-element multiples); groups that alternate run the pair entry
    // (kPair below: two CTAs per key block, one per placement; walking both placements in one CTA, with K and V
    // reloaded between them, cost idle code 12% of every d132 call and spilled as an entry of its own).
    static constexpr bool kShiftRows = geometry::bwd_sm90_ws_shift_rows(T::kHeadDimQK, T::kPadQK);
    // dQ a step late (the consumer loop; geometry::bwd_sm90_ws_dq_lag), where that measured faster (H200, S=16k,
    // against one barrier a step: d128 1.14-1.16x, d132 1.04-1.08x, d136 1.13-1.18x, d192 1.02-1.08x); not with
    // 144-column accumulators (d140, d144: beside a step's dQ they spilled 44-100 bytes and serialized the wgmmas,
    // d140 0.90x), at 128 queries a step (d64 0.96x / 1.03x) nor with dQ by reductions.
    static constexpr bool kDqLag =
        geometry::bwd_sm90_ws_dq_lag(T::kHeadDimQK, T::kHeadDimV, T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN);
    static constexpr int kSmemBytes =
        geometry::bwd_sm90_ws_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN, T::kStages, kDqLag);
    // Registers: the consumers hold dK and dV (pad_qk + pad_v floats a thread) with S^T, dP^T and dQ in flight.
    static constexpr int kProducerRegs = 24;
    static constexpr int kConsumerRegs = 240;
    static constexpr int kEntryRegs = 65536 / kThreads / 8 * 8;
    static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kEntryRegs, "register split");
    static_assert(kWide ? geometry::bwd_sm90_ws_wide(T::kPadQK, T::kPadV)
                        : T::kPadQK <= 144 && T::kPadV <= 144 && T::kPadQK >= 32,
                  "pads 32..144, or the wide form's");
    // dQ between the warpgroups: 64 of 128 query rows each, or of 64 rows the columns [0, split) and the rest.
    static constexpr bool kDqByRows = T::kBlockM == 128;

    static constexpr int kDqSplit = geometry::bwd_sm90_ws_dq_split(kAccQK);
    static_assert((T::kBlockM == 64 || (T::kBlockM == 128 && T::kPadQK <= 64 && T::kPadV <= 64)) &&
                      (T::kBlockN == 128 || (kWide && T::kBlockM == 64)) && T::kWarps == 8,
                  "two warpgroups of 64 keys (wide: both on the same 64); 64 queries a step, 128 at pads up to 64");
    static_assert(T::kStages >= 1 && T::kStages <= 2, "one or two Q/dO slots");
    // Pairs' dK and dV exchange (kPair): fp32 rows of the accumulators' width, or 8 more: strides of 8 mod 16 floats
    // keep a warp's float2 stores conflict-free; at the start of shared memory, before the barriers.
    static constexpr int kXStrideQK = kAccQK % 16 == 8 ? kAccQK : kAccQK + 8;
    static constexpr int kXStrideV = kAccV % 16 == 8 ? kAccV : kAccV + 8;
    static_assert(!kShiftRows || 4 * T::kBlockN * (kXStrideQK + kXStrideV) <=
                                     kSmemBytes - 8 * geometry::bwd_sm90_ws_barriers(T::kStages, kDqLag) - 16 -
                                         8 * T::kStages * T::kBlockM,
                  "the pairs' exchange fits below the barriers");
    static_assert(!kShiftRows || (T::kHeadDimQK == T::kHeadDimV && T::kVecQK == 4 && T::kHeadDimQK + 4 <= kAccQK),
                  "shifted rows: d_qk = d_v on 8-byte vectors, 4 columns of room");
};

namespace detail {
// Rows [valid, kRows) of a tile set to zero by one warp, 16 bytes a store.
template <class L, int kRows, int kCols>
__device__ __forceinline__ void zero_rows(ptx::u16* s, int valid, int lane) {
    constexpr int kChunks = kCols / 8;
    asm volatile("" : "+r"(lane));  // opaque: hoisted out of the producer's step loop, its index math was spilled
    for (int i = lane; i < (kRows - valid) * kChunks; i += 32) {
        const int r = valid + i / kChunks;
        *reinterpret_cast<uint4*>(s + L::offset(r, i % kChunks * 8)) = make_uint4(0, 0, 0, 0);
    }
}
// The columns of a 64-row tile outside rows placed `shift` (0 or 4) columns right, zero: [0, shift) and
// [shift + kHeadDim, kCols), by one warp, a lane two rows: the 8-byte pieces, then whole 16-byte chunks (this is
// on each step's critical path). kHeadDim % 8 == 4.
template <class L, int kHeadDim, int kCols>
__device__ __forceinline__ void zero_outside(ptx::u16* s, int shift, int lane) {
    auto rows = [&](auto placed) {
        constexpr int kShift = decltype(placed)::value, kEnd = kShift + kHeadDim;
#pragma unroll 1
        for (int k = 0; k < 2; ++k) {
            const int r = lane + 32 * k;
            if constexpr (kShift == 4) *reinterpret_cast<uint2*>(s + L::offset(r, 0)) = make_uint2(0, 0);
            if constexpr (kEnd % 8 == 4) *reinterpret_cast<uint2*>(s + L::offset(r, kEnd)) = make_uint2(0, 0);
#pragma unroll
            for (int c = (kEnd + 7) / 8 * 8; c < kCols; c += 8)
                *reinterpret_cast<uint4*>(s + L::offset(r, c)) = make_uint4(0, 0, 0, 0);
        }
    };
    if (shift == 0) rows(IntC<0>());
    else rows(IntC<4>());
}
// The wide form's B operand (N-major Q, dO or K) for warpgroup wg's accumulator columns from j. Past the 64-column
// panels the second warpgroup's chunk lies as the first's, moved along the tile by a constant number of bytes within
// the same kind of panel (geometry::bwd_sm90_ws_wide_chunk), so the panel is chosen at compile time (chosen by the
// run-time column, ptxas put branches between the wgmmas and serialized them). Tiles of whole 64-column panels take
// the column as it is (moved: d192 and d256 ran 1.5-2% slower causal, H200).
template <class L, int kPad>
__device__ __forceinline__ wgmma::u64 wide_n_major(ptx::u32 base, int kk, int wg, int j) {
    if constexpr (kPad % 64 == 0) return L::template n_major<true>(base, kk, geometry::bwd_sm90_ws_wide_col(kPad, wg, j));
    const int c0 = geometry::bwd_sm90_ws_wide_col(kPad, 0, j);
    const int moved = L::col_bytes(geometry::bwd_sm90_ws_wide_col(kPad, 1, j)) - L::col_bytes(c0);
    return L::template n_major<true>(base + (wg ? moved : 0), kk, c0);
}
}  // namespace detail

// The module's other main kernel, for launches whose Q or dO no tensor map can address: bwd/sm90.cuh's (its loads are
// every thread's cp.async) with one Q/dO buffer, as its table row for these pads, and 64 query rows a step (the
// workspace's rows per head are a multiple of 128 where this family takes 128: of 64 too).
template <class T>
struct BwdSm90Fallback : T {
    static constexpr int kBlockM = 64;
    static constexpr int kStages = 1;
};
// The wide form's (pads past 144, which bwd/sm90.cuh's kernel does not take): bwd/mma.cuh's, 64 x 64 tiles on 8
// warps with one Q/dO buffer and dQ by bulk reduction, as the mma.sync table row for d<=256.
template <class T>
struct BwdMmaFallback : T {
    static constexpr int kSdpWarpsM = 4, kDkvWarpsN = 2, kDqWarpsM = 2, kStages = 1;
    static constexpr bool kBulkDQ = true;
};

// kPair: shifted rows of a GQA group whose query heads lie alternately 0 and 4 columns right (head strides of 4 mod 8)
// run on clusters of two CTAs per key block: rank r walks the group's heads r, r + 2, ... (placed alike) with K and V
// placed as they are, then rank 1 hands its dK and dV to rank 0 through shared memory and rank 0 stores the sums (the
// order of the sum fixed: deterministic either way).
template <class T, bool kPair = false>
__device__ __forceinline__ void flash_bwd_sm90_ws(const BwdParamsTma& pt) {
    using S = BwdShapeSm90Ws<T>;
    static_assert(!kPair || S::kShiftRows, "pairs for shifted rows only");
    using ptx::u16;
    using ptx::u32;
    const BwdParams& p = pt.p;
    constexpr int kSt = T::kStages;
    using LK = sm90::TileLayout<T::kBlockN, T::kPadQK, true>;
    using LV = sm90::TileLayout<T::kBlockN, T::kPadV, true>;
    using LQ = sm90::TileLayout<T::kBlockM, T::kPadQK, true>;
    using LdO = sm90::TileLayout<T::kBlockM, T::kPadV, true>;
    using LdS = sm90::TileLayout<T::kBlockN, T::kBlockM, true>;

    // Shared memory (geometry::bwd_sm90_ws_smem_bytes): the dQ staging tile (or the warps' boxes), K, V, kSt slots of Q and dO, two dS^T
    // buffers (split by GEMM: one, and the P^T handed between the warpgroups), the slots' LSE and D rows, the
    // barriers, the varlen sizes.
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float* sdQ = reinterpret_cast<float*>(smem_raw);
    u16* sK = reinterpret_cast<u16*>(smem_raw + S::kDqBytes);
    u16* sV = sK + S::kKElems;
    u16* sQ0 = sV + S::kVElems;
    u16* sdO0 = sQ0 + kSt * S::kQElems;
    u16* sdS0 = sdO0 + kSt * S::kdOElems;
    float* sLse0 = reinterpret_cast<float*>(sdS0 + 2 * S::kdSElems);
    float* sD0 = sLse0 + kSt * T::kBlockM;
    const u32 bars = ptx::smem_u32(sD0 + kSt * T::kBlockM);
    auto full = [&](int st) { return bars + 8 * st; };
    auto empty = [&](int st) { return bars + 8 * (kSt + st); };
    const u32 kv_bar = bars + 16 * kSt, dq_full = kv_bar + 8, dq_empty = kv_bar + 16, landed = kv_bar + 24;
    auto ds_full = [&](int b) { return landed + 8 + 8 * b; };    // dS^T buffer b written (every consumer warp)
    auto ds_empty = [&](int b) { return landed + 24 + 8 * b; };  // dS^T buffer b read by dQ (every consumer warp)
    int* sSeq = reinterpret_cast<int*>(smem_raw + S::kSmemBytes - 16);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
    const int n_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int part = kPair ? int(blockIdx.y & 1) : 0;  // the CTA's rank in its cluster (1 x 2 x 1)
    const int kv_head = kPair ? blockIdx.y >> 1 : blockIdx.y, batch = blockIdx.z;
    constexpr int kHeadStep = kPair ? 2 : 1;
    // The CTA's first query head (recomputed where used: held, it moved the producer's registers), then every
    // kHeadStep-th of the group.
    auto head0 = [&] { return kv_head * p.q_per_kv + part; };
    const detail::Seq<T::kVarlen> seq = detail::seq_info<T::kVarlen>(p, batch);
    const int n0 = n_block * T::kBlockN;
    if constexpr (T::kVarlen) {
        if (n0 >= seq.seqlen_k) return;
    }
    const auto view = detail::bwd_seq_view<T::kVarlen>(seq, batch, sSeq, tid);
    const auto seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;

    // The walk (bwd/sm90.cuh): every query block this key block is seen from, for each query head of the group.
    const int m_blocks = (seqlen_q + T::kBlockM - 1) / T::kBlockM;
    const auto mask = detail::mask_of<T>(seqlen_q, seqlen_k, p);
    const int m_begin = mask.first_q_block(n0), m_end = mask.q_block_end(n0, m_blocks);
    const int steps = (m_end - m_begin) * (kPair ? (p.q_per_kv - part + 1) >> 1 : p.q_per_kv);
    auto next_step = [&](int& head, int& m_block) {
        if (++m_block == m_end) m_block = m_begin, head += kHeadStep;
    };
    // Where a query head's Q (dO) rows lie in their boxes: 0 or 4 columns right (shifted rows; the launch encodes
    // maps only where the pointers are 16-byte aligned and each head's rows start alike); the CTA's tiles are placed
    // as its first head's.
    auto shift_q = [&](int head) { return S::kShiftRows ? head * pt.q_col_step & 7 : 0; };
    auto shift_do = [&](int head) { return S::kShiftRows ? head * pt.do_col_step & 7 : 0; };
    const int sk = shift_q(head0()), sv = shift_do(head0());

    // K's and V's pad columns zero once (cp.async never writes them; Q's and dO's arrive as zeros from TMA), and the
    // staging rows' tail, which the reduction adds into the workspace's padding.
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, S::kThreads>(sK, tid, LK::offset);
    detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, S::kThreads>(sV, tid, LV::offset);
    constexpr int kDqCols = S::kShiftRows ? T::kHeadDimQK : S::kAccQK;  // staged: the row's columns, shifted back
    constexpr int kDqTail = S::kDqStride - kDqCols;
    if constexpr (!S::kDqDirect)
        for (int i = tid; i < T::kBlockM * kDqTail; i += S::kThreads)
            sdQ[i / kDqTail * S::kDqStride + kDqCols + i % kDqTail] = 0.f;
    if (tid == 0) {
        for (int st = 0; st < kSt; ++st) {
            ptx::mbar_init(full(st), 1);
            ptx::mbar_init(empty(st), T::kWarps);
        }
        ptx::mbar_init(kv_bar, 128);
        ptx::mbar_init(dq_full, T::kWarps);
        ptx::mbar_init(dq_empty, 1);
        ptx::mbar_init(landed, 1);
        if constexpr (S::kDqLag)
            for (int b = 0; b < 2; ++b) {
                ptx::mbar_init(ds_full(b), T::kWarps);
                ptx::mbar_init(ds_empty(b), T::kWarps);
            }
    }
    wgmma::fence_proxy_async();  // the zeroed columns, visible to wgmma and the bulk reduction
    __syncthreads();

    if (wg == 2) {
        ptx::setmaxnreg_dec<S::kProducerRegs>();
        if (steps <= 0) return;
        const int ptid = tid - S::kConsumerThreads;
        auto k_off = [&](long long batch_stride, long long seq_stride) { return view.k_off(batch_stride, seq_stride); };
        const u16* gK = static_cast<const u16*>(p.k) + k_off(p.k_batch_stride, p.k_seq_stride) +
                        kv_head * p.k_head_stride + (long long)n0 * p.k_seq_stride;
        const u16* gV = static_cast<const u16*>(p.v) + k_off(p.v_batch_stride, p.v_seq_stride) +
                        kv_head * p.v_head_stride + (long long)n0 * p.v_seq_stride;
        if constexpr (S::kShiftRows) {  // every column: the row's placed sk (sv) right, zeros around it
            sm90::load_tile_shifted<T::kBlockN, T::kHeadDimQK, T::kPadQK, true, 4, 128, T::kBlockN, 1>(
                sK, gK, p.k_seq_stride, seqlen_k - n0, ptid, 0, sk);
            sm90::load_tile_shifted<T::kBlockN, T::kHeadDimV, T::kPadV, true, 4, 128, T::kBlockN, 1>(
                sV, gV, p.v_seq_stride, seqlen_k - n0, ptid, 0, sv);
        } else {
            sm90::load_tile<T::kBlockN, T::kHeadDimQK, T::kPadQK, true, T::kVecQK, 128, T::kBlockN, 1>(
                sK, gK, p.k_seq_stride, seqlen_k - n0, ptid);
            sm90::load_tile<T::kBlockN, T::kHeadDimV, T::kPadV, true, T::kVecV, 128, T::kBlockN, 1>(
                sV, gV, p.v_seq_stride, seqlen_k - n0, ptid);
        }
        ptx::mbar_arrive_cp_async(kv_bar);

        int head = head0(), m_block = m_begin;
        // Deterministic: a query block's dQ takes its key blocks' adds last to first; waits for this one's turn.
        auto wait_turn = [&](const int* turn, int m0) {
            const int n_keys_last = (seqlen_k - 1) / T::kBlockN;
            const int my_turn = mask.last_kv_block(m0, n_keys_last) - n_block;
            while (*reinterpret_cast<const volatile int*>(turn) != my_turn) {
            }
        };
        if (warp == 8) {
            // Q, dO, LSE, D of each step into slot i % kSt, by TMA and bulk copies from one thread. Tiles that need
            // fixing once landed (a packed sequence's last query block, whose rows past its end are the next
            // sequence's; shifted rows, whose boxes hold other heads' columns beside the row) land on `landed`
            // first, and the warp zeroes what is not the rows' before the slot is marked full. Every head the CTA
            // walks lies as its tiles (a pair's CTA walks one placement).
            // Every barrier is waited on phase by phase by one party: a wait on a parity cannot tell a phase from the
            // one two later.
            int fixes = 0;  // uses of `landed` so far: its phase
            for (int i = 0; i < steps; ++i) {
                // The step's head and query block from i alone: the producer's registers hold little across steps.
                const int in_head = i / (m_end - m_begin);
                const int head = head0() + in_head * kHeadStep;
                const int m0 = (m_begin + i - in_head * (m_end - m_begin)) * T::kBlockM;
                const int st = i % kSt;
                u16* sQ = sQ0 + st * S::kQElems;
                u16* sdO = sdO0 + st * S::kdOElems;
                if (i >= kSt) ptx::mbar_wait(empty(st), ((i / kSt) & 1) ^ 1);
                const int valid = seqlen_q - m0;
                const bool tail = T::kVarlen && valid < T::kBlockM;
                const bool fix = S::kShiftRows || tail;
                if (lane == 0) {
                    const u32 bar = fix ? landed : full(st);
                    ptx::mbar_arrive_expect_tx(bar, 2 * (S::kQElems + S::kdOElems) + (fix ? 0 : 8 * T::kBlockM));
                    const int row = (T::kVarlen ? int(view.q_begin) : 0) + m0;
                    const int b = T::kVarlen ? 0 : batch;
                    const int h = head * pt.head_step;
                    const int c1 = pt.tma_seq_dim == 1 ? row : h, c2 = pt.tma_seq_dim == 1 ? h : row;
                    const int q_col = head * pt.q_col_step - sk, do_col = head * pt.do_col_step - sv;
                    LQ::for_each_panel([&](int kind, int col, int offset) {
                        ptx::tma_load_4d(ptx::smem_u32(sQ) + offset, &pt.q_map[kind], q_col + col, c1, c2, b, bar);
                    });
                    LdO::for_each_panel([&](int kind, int col, int offset) {
                        ptx::tma_load_4d(ptx::smem_u32(sdO) + offset, &pt.do_map[kind], do_col + col, c1, c2, b, bar);
                    });
                    // LSE and D straight onto the slot's barrier, in flight beside the tiles (issued after the
                    // fix-up, they were a second memory round trip a step: d132 ran 7-12% slower); the workspace has
                    // m_pad rows per head (a multiple of kBlockM): never read past.
                    if (fix) ptx::mbar_expect_tx(full(st), 8 * T::kBlockM);
                    const long long ws = ((long long)batch * p.heads_q + head) * p.m_pad + m0;
                    ptx::bulk_load(ptx::smem_u32(sLse0 + st * T::kBlockM), p.lse2 + ws, 4 * T::kBlockM, full(st));
                    ptx::bulk_load(ptx::smem_u32(sD0 + st * T::kBlockM), p.delta + ws, 4 * T::kBlockM, full(st));
                }
                if (fix) {
                    ptx::mbar_wait(landed, fixes++ & 1);
                    if (tail) {
                        detail::zero_rows<LQ, T::kBlockM, T::kPadQK>(sQ, valid, lane);
                        detail::zero_rows<LdO, T::kBlockM, T::kPadV>(sdO, valid, lane);
                    }
                    if constexpr (S::kShiftRows) {
                        detail::zero_outside<LQ, T::kHeadDimQK, T::kPadQK>(sQ, sk, lane);
                        detail::zero_outside<LdO, T::kHeadDimV, T::kPadV>(sdO, sv, lane);
                    }
                    wgmma::fence_proxy_async();  // the zeros, visible to the consumers' wgmma
                    __syncwarp();
                    if (lane == 0) ptx::mbar_arrive(full(st));
                }
            }
        } else if (S::kDqDirect && warp == 9 && lane == 0 && p.deterministic) {
            // The consumers add dQ themselves; deterministic, each step waits for its turn here (dq_empty: go),
            // then for every consumer warp's adds to be issued (dq_full): the fence after that wait orders them all
            // before the turn passes on (a release is cumulative over what the CTA barrier ordered before it).
            for (int i = 0; i < steps; ++i, next_step(head, m_block)) {
                const int m0 = m_block * T::kBlockM;
                const long long ws_head = ((long long)batch * p.heads_q + head) * p.m_pad;
                int* turn = p.dq_sem + (ws_head + m0) / T::kBlockM;
                wait_turn(turn, m0);
                ptx::mbar_arrive(dq_empty);
                ptx::mbar_wait(dq_full, i & 1);
                __threadfence();
                atomicAdd(turn, 1);
            }
        } else if (!S::kDqDirect && warp == 9 && lane == 0) {
            // Each step's staged dQ into the accumulator rows of its query block.
            for (int i = 0; i < steps; ++i, next_step(head, m_block)) {
                const int m0 = m_block * T::kBlockM;
                ptx::mbar_wait(dq_full, i & 1);
                const long long ws_head = ((long long)batch * p.heads_q + head) * p.m_pad;
                int* turn = p.dq_sem + (ws_head + m0) / T::kBlockM;
                if (p.deterministic) wait_turn(turn, m0);
                ptx::bulk_reduce_add_f32(p.dq_accum + (ws_head + m0) * S::kDqStride, ptx::smem_u32(sdQ),
                                         4 * T::kBlockM * S::kDqStride);
                ptx::bulk_commit();
                if (p.deterministic) {
                    ptx::bulk_wait<0>();
                    __threadfence();
                    atomicAdd(turn, 1);
                } else {
                    ptx::bulk_wait_read<0>();
                }
                ptx::mbar_arrive(dq_empty);
            }
        }
        return;
    }

    ptx::setmaxnreg_inc<S::kConsumerRegs>();
    if constexpr (S::kByGemm) {
        const detail::ByGemmCta c{ptx::smem_u32(sK), ptx::smem_u32(sV), ptx::smem_u32(sQ0), ptx::smem_u32(sdO0),
                                  ptx::smem_u32(sdS0), sdS0, reinterpret_cast<uint4*>(sdS0 + S::kdSElems), sLse0,
                                  sD0, full(0), empty(0), kv_bar, dq_full, dq_empty, ptx::smem_u32(sdQ), &pt.dq_map,
                                  steps, head0(), m_begin,
                                  m_end, n0, batch,
                                  static_cast<u16*>(p.dk) + view.k_off(p.dk_batch_stride, p.dk_seq_stride) +
                                      kv_head * p.dk_head_stride,
                                  static_cast<u16*>(p.dv) + view.k_off(p.dv_batch_stride, p.dv_seq_stride) +
                                      kv_head * p.dv_head_stride};
        detail::bwd_ws_by_gemm<T>(p, c, view);
        return;
    }
    const int wq = warp & 3, g = lane >> 2, t2 = (lane & 3) * 2;
    const int key_wg = S::kWide ? 0 : wg * 64;   // the warpgroup's first key in the CTA's block
    const int key0 = n0 + key_wg + wq * 16 + g;  // this thread's first key; the other is key0 + 8
    // A warpgroup accumulator column's tile column (wide: its half's; else the same).
    auto col_qk = [&](int j) { return S::kWide ? geometry::bwd_sm90_ws_wide_col(T::kPadQK, wg, j) : j; };
    auto col_v = [&](int j) { return S::kWide ? geometry::bwd_sm90_ws_wide_col(T::kPadV, wg, j) : j; };
    float acc_dk[S::kColsQK / 8][4];
    float acc_dv[S::kColsV / 8][4];
    detail::zero_frags(acc_dk);
    detail::zero_frags(acc_dv);
    if constexpr (S::kDqLag) {
        // Opaque from here: the first step is a copy of its own (no dQ yet), where ptxas otherwise filled the known
        // zeros in between the fence and the wgmmas (C7519).
        sm90::fence_regs<S::kColsQK / 2>(&acc_dk[0][0]);
        sm90::fence_regs<S::kColsV / 2>(&acc_dv[0][0]);
    }
    const u32 aK0 = ptx::smem_u32(sK), aV0 = ptx::smem_u32(sV);
    if (steps > 0) ptx::mbar_wait(kv_bar, 0);
    wgmma::fence_proxy_async();  // the producer's generic-proxy writes (cp.async), ordered before this thread's wgmma

    // Lagged dQ (S::kDqLag): a step issues the previous step's dQ beside its own dK, so a warpgroup never waits for
    // the other's dS^T of the step it is in (one barrier a step kept the two in lockstep, their softmax arithmetic at
    // the same time and the tensor cores idle meanwhile); ds_full / ds_empty hand each dS^T buffer between them, and
    // the last step's dQ follows the walk.
    constexpr bool kLag = S::kDqLag;
    const int dq_row0 = S::kDqByRows ? wg * 64 : 0;
    constexpr bool kInside = !S::kDqByRows && S::kDqSplit % 64 != 0;
    // dQ's GEMM (this warpgroup's rows or columns over all the CTA's keys) from the dS^T at ads, and its staging.
    auto issue_dq = [&](auto& dq, auto width, int c_first, u32 ads, u32 aK) {
        constexpr int kW = decltype(width)::value;
        sm90::gemm_ss<kW, T::kBlockN / 16, T::kBF16, true, true, false>(
            dq, [&](int kk) { return LdS::n_major(ads, kk, dq_row0); },
            [&](int kk, int c0) {
                if constexpr (S::kWide) return detail::wide_n_major<LK, T::kPadQK>(aK, kk, wg, c_first + c0);
                else return LK::template n_major<kInside>(aK, kk, c_first + c0);
            });
        wgmma::commit();
    };
    // dQ into the staging tile once the last step's has been read (step j's).
    auto put_dq = [&](auto& dq, auto width, int c_first, int j) {
        constexpr int kW = decltype(width)::value;
        if (j > 0) ptx::mbar_wait(dq_empty, (j - 1) & 1);
#pragma unroll
        for (int nb = 0; nb < kW / 8; ++nb) {
            const int col = col_qk(c_first + nb * 8 + t2) - sk;  // the row's element (the tiles' lie sk right)
            if (S::kShiftRows && col < 0) continue;
            float* row = sdQ + (dq_row0 + wq * 16 + g) * S::kDqStride + col;
            *reinterpret_cast<float2*>(row) = make_float2(dq[nb][0], dq[nb][1]);
            *reinterpret_cast<float2*>(row + 8 * S::kDqStride) = make_float2(dq[nb][2], dq[nb][3]);
        }
    };
    auto stage_dq = [&](auto& dq, auto width, int c_first, int j) {
        put_dq(dq, width, c_first, j);
        ptx::fence_proxy_async_smem();  // the staged dQ, visible to the bulk reduction
        __syncwarp();
        if (lane == 0) ptx::mbar_arrive(dq_full);
    };
    // This warpgroup's dQ width and first column: rows split (128 queries a step) or wide, all its columns; else its
    // share of geometry::bwd_sm90_ws_dq_split.
    auto by_dq_cols = [&](auto f) {
        if constexpr (S::kDqByRows || S::kWide)
            f(detail::IntC<S::kColsQK>(), 0);
        else if (wg == 0)
            f(detail::IntC<S::kDqSplit>(), 0);
        else
            f(detail::IntC<S::kAccQK - S::kDqSplit>(), S::kDqSplit);
    };

    int head = head0(), m_block = m_begin;
    // One step; kDq: whether it has a dQ to compute (lagged: not the first).
    auto step = [&](int i, auto has_dq) {
        constexpr bool kDq = decltype(has_dq)::value;
        const int st = kSt > 1 ? i % kSt : 0;
        const int m0 = m_block * T::kBlockM;
        // K's and V's addresses opaque each step: hoisted, their wgmma descriptors were spilled and reloaded.
        u32 aK = aK0, aV = aV0;
        asm volatile("" : "+r"(aK), "+r"(aV));
        const u32 aQ = ptx::smem_u32(sQ0 + st * S::kQElems), adO = ptx::smem_u32(sdO0 + st * S::kdOElems);
        u16* sdS = sdS0 + (i & 1) * S::kdSElems;
        const u32 adS = ptx::smem_u32(sdS);
        // Lagged: this step's dQ reads the dS^T written now; the previous step's that of the step before.
        const int dq_step = kLag ? i - 1 : i;
        const u32 adS_dq = ptx::smem_u32(sdS0 + (dq_step & 1) * S::kdSElems);
        const float* sLse = sLse0 + st * T::kBlockM;
        const float* sD = sD0 + st * T::kBlockM;
        ptx::mbar_wait(full(st), (i / kSt) & 1);
        wgmma::fence_proxy_async();

        // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, in flight together.
        float s[S::kNB][4];
        float dp[S::kNB][4];
        wgmma::fence();
        detail::bwd_scores_t<LK, LQ, T::kPadQK / 16, T::kBF16>(s, aK, aQ, S::kWide ? 0 : wg);
        wgmma::commit();
        detail::bwd_scores_t<LV, LdO, T::kPadV / 16, T::kBF16>(dp, aV, adO, S::kWide ? 0 : wg);
        wgmma::commit();
        wgmma::wait<1>();
        sm90::fence_regs<S::kNB * 4>(&s[0][0]);

        // P^T, then dS^T once dP^T is in (bwd/sm90.cuh's arithmetic). Softcapped, both once dP^T is in, dS^T made in
        // place: P^T times the cap's slope held to dP^T in registers spilled (d64: 48 bytes, d128: 28), in the dS^T
        // tile's places more (d64: 196, d128: 68).
        constexpr auto kPFrom = T::kSoftcap ? detail::PFrom::none : detail::PFrom::regs;
        auto dp_in = [&] {
            wgmma::wait<0>();
            sm90::fence_regs<S::kNB * 4>(&dp[0][0]);
        };
        if constexpr (T::kSoftcap) dp_in();
        const bool masked = mask.edge(n0, m0);
        u32 pa[T::kBlockM / 16][4];
        detail::bwd_p_t<T::kBF16, T::kSoftcap, T::kAlibi>(s, pa, sLse, p, mask, masked, key0, m0, mask.shift(), t2,
                                                          detail::alibi_factor<T::kAlibi>(p, batch, head),
                                                          detail::bwd_capped_ds_t(dp, sD, t2));
        if constexpr (!T::kSoftcap) dp_in();
        u32 dsa[T::kBlockM / 16][4];
        // Lagged: the buffer's last reader, step i - 2's dQ (issued in step i - 1), done in every warp.
        if (kLag && i >= 2) ptx::mbar_wait(ds_empty(i & 1), ((i >> 1) & 1) ^ 1);
        // (Wide: the first warpgroup's dS^T is the second's too; it alone stores it.)
        // dS^T's row opaque each step where ptxas hoisted its 16 swizzled store offsets out of the step loop and
        // spilled them (d132, d136; lagged varlen).
        int ds_row = key_wg + wq * 16 + g;
        if constexpr (kLag && ((!S::kWide && S::kAccQK > 128) || T::kVarlen)) asm volatile("" : "+r"(ds_row));
        detail::bwd_ds_t<T::kBF16, S::kNB, LdS, kPFrom>(dp, pa, dsa, sD, sdS, ds_row, t2, !S::kWide || wg == 0);

        if constexpr (kLag) {
            wgmma::fence_proxy_async();  // dS^T's stores, visible to wgmma
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(ds_full(i & 1));
            // The previous step's dQ reads every warp's dS^T of that step (waited on before this step's GEMMs
            // are issued: a wait among them made ptxas serialize them, C7520).
            if constexpr (kDq) ptx::mbar_wait(ds_full(dq_step & 1), (dq_step >> 1) & 1);
        }
        // dV += P^T dO (while the warpgroups exchange dS^T; lagged: issued with the previous step's dQ and this
        // one's dK, after dQ's fresh registers, which ptxas otherwise filled between the fence and the wgmma and
        // serialized it, C7519).
        auto issue_dv = [&] {
            wgmma::fence();
            sm90::gemm_rs<S::kColsV, T::kBlockM / 16, T::kBF16, true>(
                acc_dv, pa, [&](int kk, int c0) {
                    if constexpr (S::kWide) return detail::wide_n_major<LdO, T::kPadV>(adO, kk, wg, c0);
                    else return LdO::template n_major<false>(adO, kk, c0);
                });
            wgmma::commit();
        };
        if constexpr (!kLag) {
            issue_dv();
            wgmma::fence_proxy_async();  // dS^T's stores, visible to wgmma (after dV's issue: before it cost d140 6%)
            ptx::bar_sync(1, S::kConsumerThreads);
        }

        // dQ (this warpgroup's rows or columns over all the CTA's keys; lagged: the previous step's), then
        // dK += dS^T Q; dQ is staged while dK runs.
        auto dq_then_dk = [&](auto width, int c_first) {
            constexpr int kW = decltype(width)::value;
            float dq[kW / 8][4];
            if constexpr (!kLag) {
                // Unlagged (pad 144, 128 queries a step): dQ and dK issued together after dV; the staged dQ's fence
                // and arrival follow in the caller (moving this path's dS^T proxy fence had cost d140 6%).
                // (Instantiated, unreached, behind the split by GEMM too.)
                static_assert(!S::kWide || S::kDqDirect,
                              "the wide form's staged dQ is lagged (geometry::bwd_sm90_ws_dq_lag)");
                issue_dq(dq, width, c_first, adS, aK);
                sm90::gemm_rs<S::kColsQK, T::kBlockM / 16, T::kBF16, true>(
                    acc_dk, dsa, [&](int kk, int c0) { return LQ::template n_major<false>(aQ, kk, c0); });
                wgmma::commit();
                wgmma::wait<1>();  // dV and dQ done
                sm90::fence_regs<kW / 2>(&dq[0][0]);
                sm90::fence_regs<S::kColsV / 2>(&acc_dv[0][0]);
                put_dq(dq, width, c_first, i);
                return;
            }
            if constexpr (kDq) sm90::fence_regs<kW / 2>(&dq[0][0]);
            issue_dv();
            if constexpr (kDq) issue_dq(dq, width, c_first, adS_dq, aK);
            sm90::gemm_rs<S::kColsQK, T::kBlockM / 16, T::kBF16, true>(
                acc_dk, dsa, [&](int kk, int c0) {
                    if constexpr (S::kWide) return detail::wide_n_major<LQ, T::kPadQK>(aQ, kk, wg, c0);
                    else return LQ::template n_major<false>(aQ, kk, c0);
                });
            wgmma::commit();
            wgmma::wait<1>();  // dV and dQ done
            sm90::fence_regs<S::kColsV / 2>(&acc_dv[0][0]);
            if constexpr (kDq) {
                sm90::fence_regs<kW / 2>(&dq[0][0]);
                if constexpr (kLag) {
                    __syncwarp();
                    if (lane == 0) ptx::mbar_arrive(ds_empty(dq_step & 1));  // its dS^T read
                }
                stage_dq(dq, width, c_first, dq_step);
            }
        };
        by_dq_cols(dq_then_dk);
        if constexpr (!kLag) {
            ptx::fence_proxy_async_smem();  // the staged dQ, visible to the bulk reduction
            __syncwarp();
            if (lane == 0) ptx::mbar_arrive(dq_full);
        }
        wgmma::wait<0>();
        sm90::fence_regs<S::kColsQK / 2>(&acc_dk[0][0]);
        sm90::fence_regs<T::kBlockM / 4>(&pa[0][0]);
        sm90::fence_regs<T::kBlockM / 4>(&dsa[0][0]);
        __syncwarp();
        if (lane == 0) ptx::mbar_arrive(empty(st));  // this warp is done with the slot
    };
    if constexpr (kLag) {
        if (steps > 0) {
            step(0, detail::IntC<0>());
            next_step(head, m_block);
        }
        for (int i = 1; i < steps; ++i, next_step(head, m_block)) step(i, detail::IntC<1>());
        if (steps > 0) {  // the last step's dQ
            const int j = steps - 1;
            ptx::mbar_wait(ds_full(j & 1), (j >> 1) & 1);
            by_dq_cols([&](auto width, int c_first) {
                float dq[decltype(width)::value / 8][4];
                sm90::fence_regs<decltype(width)::value / 2>(&dq[0][0]);
                wgmma::fence();
                issue_dq(dq, width, c_first, ptx::smem_u32(sdS0 + (j & 1) * S::kdSElems), ptx::smem_u32(sK));
                wgmma::wait<0>();
                sm90::fence_regs<decltype(width)::value / 2>(&dq[0][0]);
                stage_dq(dq, width, c_first, j);
            });
        }
    } else {
        for (int i = 0; i < steps; ++i, next_step(head, m_block)) step(i, detail::IntC<1>());
    }

    if constexpr (kPair) {
        // Rank 1's dK and dV into rank 0's shared memory (free once both walks are done and rank 0's last staged dQ
        // has been read), as the rows' columns (each CTA's tiles lie its own shift right), rows of S::kXStride floats.
        if (steps > 0) ptx::mbar_wait(dq_empty, (steps - 1) & 1);
        ptx::cluster_sync();
        const u32 rank = ptx::cluster_rank();  // read again: held through the walk, `part` took a register
        const int r0 = key0 - n0;
        const u32 x_dk = ptx::smem_u32(smem_raw), x_dv = x_dk + 4 * T::kBlockN * S::kXStrideQK;
        // Rank 1 stores its columns of the rows there; rank 0 adds them to its own (d_qk = d_v for shifted rows).
        auto exchange = [&](auto& acc, auto cols, int shift, u32 base, int stride) {
            constexpr int kCols = decltype(cols)::value;
            const u32 remote = rank == 1 ? ptx::cluster_map(base, 0) : 0;
            const float* local = reinterpret_cast<const float*>(smem_raw + (base - x_dk));
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int nb = 0; nb < kCols / 8; ++nb) {
                    const int col = nb * 8 + t2 - shift, at = (r0 + 8 * h) * stride + col;
                    if (col < 0 || col >= T::kHeadDimQK) continue;
                    if (rank == 1)
                        ptx::st_cluster_f32x2(remote + 4 * at, acc[nb][2 * h], acc[nb][2 * h + 1]);
                    else
                        acc[nb][2 * h] += local[at], acc[nb][2 * h + 1] += local[at + 1];
                }
        };
        if (rank == 1) {
            exchange(acc_dk, detail::IntC<S::kAccQK>(), sk, x_dk, S::kXStrideQK);
            exchange(acc_dv, detail::IntC<S::kAccV>(), sv, x_dv, S::kXStrideV);
        }
        ptx::cluster_sync();  // rank 1's sums have landed
        if (rank == 1) return;
        exchange(acc_dk, detail::IntC<S::kAccQK>(), sk, x_dk, S::kXStrideQK);
        exchange(acc_dv, detail::IntC<S::kAccV>(), sv, x_dv, S::kXStrideV);
    }

    // dK (scaled) and dV for this thread's two keys: rows below seqlen_k, real columns.
    u16* dk = static_cast<u16*>(p.dk) + view.k_off(p.dk_batch_stride, p.dk_seq_stride) + kv_head * p.dk_head_stride;
    u16* dv = static_cast<u16*>(p.dv) + view.k_off(p.dv_batch_stride, p.dv_seq_stride) + kv_head * p.dv_head_stride;
    if constexpr (S::kWide) {
        // Each warpgroup its half of the columns.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int key = key0 + 8 * h;
            if (key >= seqlen_k) continue;
#pragma unroll
            for (int nb = 0; nb < S::kColsQK / 8; ++nb)
                detail::store_pair<T::kBF16, T::kHeadDimQK, T::kVecQK>(
                    dk + key * p.dk_seq_stride, col_qk(nb * 8 + t2), acc_dk[nb][2 * h] * p.scale,
                    acc_dk[nb][2 * h + 1] * p.scale);
#pragma unroll
            for (int nb = 0; nb < S::kColsV / 8; ++nb)
                detail::store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(dv + key * p.dv_seq_stride, col_v(nb * 8 + t2),
                                                                     acc_dv[nb][2 * h], acc_dv[nb][2 * h + 1]);
        }
    } else {
        detail::bwd_store_dkdv<T, S::kAccQK, S::kAccV, S::kShiftRows>(acc_dk, acc_dv, dk, dv, p, key0, seqlen_k, t2,
                                                                      sk, sv);
    }
}

}  // namespace rtattn
