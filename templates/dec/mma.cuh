// Decode: a few query tokens per sequence against its cached keys, on mma.m16n8k16; two kernels of one module.
//
//   main     one CTA per (split, KV head, row block, sequence). Its rows are the query heads of one GQA group times
//            the query tokens, so every K/V byte is read once per group, not once per query head. The CTA streams
//            its split's key tiles through a cp.async ring; each warp takes its own slice of every tile's keys and
//            keeps its own online softmax (decode has too few rows to split the rows across warps), and at the end
//            the warps' (max, sum, O) are merged in shared memory. One split: O and LSE are final. Several: each
//            writes its O (normalized) and LSE to the workspace.
//   combine  one warp per (sequence, query head, token): O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s).
//
// K and V come from a dense cache ([batch, seqlen_k, heads_kv, d] with per-sequence lengths) or a paged one
// ([pages, page_size, heads_kv, d] and a block table): row addresses kept in the ring serve both, so one mainloop
// serves both.
// Causal (several query tokens: speculative decoding, chunked prefill) is bottom-right: token t of a sequence with
// L keys and seqlen_q tokens sees keys j <= L - seqlen_q + t.
#pragma once
#include "common/epilogue.cuh"
#include "common/append.cuh"  // the module's KV append entry
#include "common/merge.cuh"  // the module's merge entry
#include "common/geometry.h"
#include "common/load.cuh"
#include "common/mask.cuh"
#include "common/params.h"
#include "common/ptx.cuh"
#include "common/softmax.cuh"
#include "common/warp_gemm.cuh"

namespace rtattn {

// Traits (from the rendered stub) must provide:
//   kHeadDimQK, kHeadDimV, kPadQK, kPadV (both padded to 16), kBF16, kCausal
//   kBlockM     packed rows per CTA (16 x kMTiles), kMTiles
//   kBlockN     keys per K/V tile; each of the kWarps warps takes kBlockN / kWarps of them (a multiple of 16)
//   kStages     K/V ring depth (>= 2)
//   kPaged      K/V through a block table
//   kAlternate  packed K/V rows of 4 mod 8 elements (an odd count of kv heads at d132): rows may alternate rotation
//   kVecQK, kVecV
//   kLocal, kSinks, kSoftcap, kAlibi   the mask's traits (plan/mask.hpp)
template <class T>
struct DecShape {
    static constexpr int kThreads = T::kWarps * 32;
    static constexpr int kStrideQK = geometry::padded_row(T::kPadQK);
    static constexpr int kStrideV = geometry::padded_row(T::kPadV);
    static constexpr int kStrideO = geometry::dec_o_stride(T::kPadV);
    static constexpr int kWarpKeys = T::kBlockN / T::kWarps;
    static constexpr int kNB = kWarpKeys / 8;  // 8-key score blocks per warp and tile
    static constexpr int kNV = T::kPadV / 8;   // 8-column O blocks
    static constexpr int kStageElems = T::kBlockN * (kStrideQK + kStrideV);
    static constexpr bool kRotK = geometry::rotated_rows(T::kHeadDimQK, T::kVecQK);
    static constexpr bool kRotV = geometry::rotated_rows(T::kHeadDimV, T::kVecV);
    static constexpr bool kTwoQ = kRotK && T::kAlternate;
    static constexpr int kSmemBytes = geometry::dec_mma_smem_bytes(T::kPadQK, T::kPadV, T::kBlockM, T::kBlockN,
                                                                    T::kStages, T::kWarps, kTwoQ);

    static_assert(T::kBlockM == 16 * T::kMTiles, "rows are whole 16-row MMA tiles");
    static_assert(kWarpKeys % 16 == 0 && kWarpKeys * T::kWarps == T::kBlockN, "each warp takes 16-key steps");
    static_assert(T::kPadQK % 16 == 0 && T::kPadV % 16 == 0, "both pads are whole 16-column pairs");
    static_assert(T::kStages >= 2, "a ring of at least two tiles");
    static_assert(kStrideQK - T::kPadQK >= 4 && kStrideV - T::kPadV >= 4, "each K/V row's padding holds its address");
    static_assert(T::kBlockM <= kThreads, "a thread per row merges the warps' statistics");
    static_assert(!T::kAlternate || T::kWarps % 2 == 0, "rows by key parity: half the warps take each parity");
};

template <class T>
__device__ __forceinline__ void flash_decode(const DecParams& p) {
    using S = DecShape<T>;
    using ptx::u16;
    using ptx::u32;
    constexpr int kThreads = S::kThreads;

    extern __shared__ __align__(128) unsigned char smem_raw[];
    u16* sQ = reinterpret_cast<u16*>(smem_raw);
    u16* sQ1 = S::kTwoQ ? sQ + T::kBlockM * S::kStrideQK : sQ;  // Q in the odd keys' rotation (below)
    u16* sRing = sQ + (S::kTwoQ ? 2 : 1) * T::kBlockM * S::kStrideQK;  // stage s: K at s * kStageElems, V after it

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int split = blockIdx.x, batch = blockIdx.z;
    const int kv_head = blockIdx.y / p.row_blocks, row0 = (blockIdx.y - kv_head * p.row_blocks) * T::kBlockM;
    const int seqlen_q = p.seqlen_q, group_rows = p.q_per_kv * seqlen_q;
    const int len = p.seqlens_k ? detail::cached_keys(p.seqlens_k[batch], p.seqlen_new, p.seqlen_k) : p.seqlen_k;
    // This split's key tiles: the sequence's tiles cut into num_splits runs (a short sequence's splits are short);
    // a window's, from the tile of the first key its first token sees.
    const int tiles = (len + T::kBlockN - 1) / T::kBlockN;
    const int tile0 = T::kLocal ? max(len - seqlen_q - p.window_left, 0) / T::kBlockN : 0;
    const int per_split = (tiles - tile0 + p.num_splits - 1) / p.num_splits;
    const int t_begin = min(tile0 + split * per_split, tiles), t_end = min(t_begin + per_split, tiles);

    auto at_qk = [](int r, int c) { return r * S::kStrideQK + c; };
    auto at_v = [](int r, int c) { return r * S::kStrideV + c; };
    // Packed row i is query head (kv_head * q_per_kv + i / seqlen_q), token i % seqlen_q.
    const u16* gQ = static_cast<const u16*>(p.q) + batch * p.q_batch_stride;
    auto q_row = [&](int r) {
        const int i = row0 + r, h = i / seqlen_q;
        return gQ + (i - h * seqlen_q) * p.q_seq_stride + (kv_head * p.q_per_kv + h) * p.q_head_stride;
    };
    // K and V of this kv head: key j's row through the block table (page and slot) or the sequence's own rows.
    const u16* gK = static_cast<const u16*>(p.k) + kv_head * p.k_head_stride;
    const u16* gV = static_cast<const u16*>(p.v) + kv_head * p.v_head_stride;
    const int* table = p.block_table + batch * p.block_table_stride;

    detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ, tid, at_qk);
    if constexpr (S::kTwoQ) detail::zero_pad_cols<T::kBlockM, T::kHeadDimQK, T::kPadQK, kThreads>(sQ1, tid, at_qk);
    for (int st = 0; st < T::kStages; ++st) {
        u16* sK = sRing + st * S::kStageElems;
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimQK, T::kPadQK, kThreads>(sK, tid, at_qk);
        detail::zero_pad_cols<T::kBlockN, T::kHeadDimV, T::kPadV, kThreads>(sK + T::kBlockN * S::kStrideQK, tid,
                                                                           at_v);
    }
    // Head dims of 4 mod 8 (d132): K and V rows move as 16-byte vectors, each stored rotated in shared memory by where
    // it starts (load_rows_rotated: 0 or 4 columns); Q takes K's rotation (a common permutation of the columns leaves
    // QK^T as it is) and each warp's O is rotated back as the warps merge. Rotation 1: every row of the sequence
    // starts alike modulo 16 bytes. Rotation 2: the row stride is 8 bytes past a 16-byte multiple (an odd count of
    // kv heads at d132, MQA), so rows alternate: a tile keeps its even keys in the first half of its slots and its
    // odd keys in the second, half the warps take each half, and Q is kept in both rotations (kernels for such kv
    // heads only: kAlternate). On 8-byte vectors d132 read 71% of the copy bandwidth, d160 91%; few kv heads
    // (alternating rows) 52-63% on 8-byte vectors, 54-74% by parity (H200, B=64 x 4k and 8 x 32k).
    constexpr bool kRotK = S::kRotK, kRotV = S::kRotV;
    auto mode = [](bool rotates, int m) { return rotates && (m == 1 || (T::kAlternate && m == 2)) ? m : 0; };
    const int rotate_k = mode(kRotK, p.rotate_k), rotate_v = mode(kRotV, p.rotate_v);
    const bool by_parity = T::kAlternate && ((rotate_k | rotate_v) & 2);
    constexpr int kHalf = T::kBlockN / 2;
    const int parity = by_parity && warp >= T::kWarps / 2 ? 1 : 0;  // of the keys this warp takes
    auto slot = [&](int r) { return by_parity ? (r & 1) * kHalf + (r >> 1) : r; };
    auto at_k = [&](int r, int c) { return at_qk(slot(r), c); };
    auto at_kv = [&](int r, int c) { return at_v(slot(r), c); };
    // The rotation of this CTA's even keys (key 0: pages start alike modulo 16 bytes, or rotation is off), then of
    // this warp's keys.
    auto rotation = [&](int mode, const u16* g, long long batch_stride, int par) {
        if (!mode) return 0;
        const u16* key0 = T::kPaged ? g : g + batch * batch_stride;
        return ((reinterpret_cast<unsigned long long>(key0) & 8) ? 4 : 0) ^ (mode == 2 && par ? 4 : 0);
    };
    const int rot_k0 = rotation(rotate_k, gK, p.k_batch_stride, 0), rot_k1 = rotation(rotate_k, gK, p.k_batch_stride, 1);
    const int rot_v0 = rotation(rotate_v, gV, p.v_batch_stride, 0), rot_v = rotation(rotate_v, gV, p.v_batch_stride, parity);
    auto at_q = [&](int rot) {
        return [=](int r, int c) { return at_qk(r, c >= rot ? c - rot : c - rot + T::kHeadDimQK); };
    };
    detail::load_rows<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(sQ, gQ, q_row, group_rows - row0, tid,
                                                                       at_q(rot_k0));
    if constexpr (S::kTwoQ)
        if (by_parity)
            detail::load_rows<T::kBlockM, T::kHeadDimQK, T::kVecQK, kThreads>(sQ1, gQ, q_row, group_rows - row0, tid,
                                                                               at_q(rot_k1));
    // Each row's address (K's and V's), written a tile ahead by one thread per row into the 16 bytes of padding that
    // end the row's own K and V slots in the ring (padded_row: no copy or ldmatrix touches them), so the lists cost no
    // shared memory and a tile's lists live in its stage. A copy reads its row's address (one LDS.64) instead of
    // computing it from 64-bit multiplies, which held paged d256 to 0.70x dense and cost dense rows up to 6% (H200).
    // Paged, that thread read the block table's entry a tile before and clamps it to the pool where it is used (a
    // clamp beside the load stalls on it), so the table's latency never falls on a tile's copies (docs/PERFORMANCE.md,
    // fortieth session: the forms tried, their figures).
    auto k_row_slot = [&](int st, int r) {
        return reinterpret_cast<const u16**>(sRing + st * S::kStageElems + at_qk(r, T::kPadQK));
    };
    auto v_row_slot = [&](int st, int r) {
        return reinterpret_cast<const u16**>(sRing + st * S::kStageElems + T::kBlockN * S::kStrideQK + at_v(r, T::kPadV));
    };
    constexpr int kRowsPerThread = (T::kBlockN + kThreads - 1) / kThreads;
    unsigned table_entries[T::kPaged ? kRowsPerThread : 1];
    auto read_table = [&](int t) {
        if constexpr (T::kPaged) {
#pragma unroll
            for (int j = 0; j < kRowsPerThread; ++j) {
                const int r = tid + j * kThreads, key = t * T::kBlockN + r;
                table_entries[j] = r < T::kBlockN && t < t_end && key < len
                                       ? unsigned(__ldg(table + (key >> p.page_shift))) : 0u;
            }
        }
    };
    auto fetch_rows = [&](int t) {
        const int st = (t - t_begin) % T::kStages;
#pragma unroll
        for (int j = 0; j < kRowsPerThread; ++j) {
            const int r = tid + j * kThreads;
            if (r < T::kBlockN) {
                if constexpr (T::kPaged) {
                    const long long page = detail::clamp_page(table_entries[j], p.num_pages);
                    const long long slot = (t * T::kBlockN + r) & ((1 << p.page_shift) - 1);
                    *k_row_slot(st, r) = gK + page * p.k_batch_stride + slot * p.k_seq_stride;
                    *v_row_slot(st, r) = gV + page * p.v_batch_stride + slot * p.v_seq_stride;
                } else {
                    const long long key = t * T::kBlockN + r;
                    *k_row_slot(st, r) = gK + batch * p.k_batch_stride + key * p.k_seq_stride;
                    *v_row_slot(st, r) = gV + batch * p.v_batch_stride + key * p.v_seq_stride;
                }
            }
        }
        read_table(t + 1);
    };
    auto load_stage = [&](int t, int st) {
        const int n0 = t * T::kBlockN;
        u16* sK = sRing + st * S::kStageElems;
        u16* sV = sK + T::kBlockN * S::kStrideQK;
        auto k_row = [=](int r) { return *k_row_slot(st, r); };  // the addresses fetch_rows left in the stage
        auto v_row = [=](int r) { return *v_row_slot(st, r); };
        if (rotate_k)
            detail::load_rows_rotated<T::kBlockN, kRotK ? T::kHeadDimQK : 12, kThreads>(
                sK, gK, k_row, len - n0, rot_k0, T::kAlternate ? rot_k0 ^ rot_k1 : 0, tid, at_k);
        else
            detail::load_rows<T::kBlockN, T::kHeadDimQK, T::kVecQK, kThreads>(sK, gK, k_row, len - n0, tid, at_k);
        if (rotate_v)
            detail::load_rows_rotated<T::kBlockN, kRotV ? T::kHeadDimV : 12, kThreads>(
                sV, gV, v_row, len - n0, rot_v0, T::kAlternate && rotate_v == 2 ? 4 : 0, tid, at_kv);
        else
            detail::load_rows<T::kBlockN, T::kHeadDimV, T::kVecV, kThreads>(sV, gV, v_row, len - n0, tid, at_kv);
    };
    // Prologue: Q rides with the first tile's group; kStages - 1 tiles in flight.
    int t_load = t_begin;
    read_table(t_load);
#pragma unroll
    for (int st = 0; st < T::kStages - 1; ++st, ++t_load) {
        fetch_rows(t_load);
        __syncthreads();  // the tile's row addresses, before its copies read them
        if (t_load < t_end) load_stage(t_load, st);
        ptx::cp_async_commit();
    }
    fetch_rows(t_load);

    // Per thread: the token of each of its rows, for the causal limit (token t sees keys below len - seqlen_q + t + 1).
    const int g = lane >> 2;
    int visible_shift[T::kMTiles][2];
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = row0 + mt * 16 + g + 8 * h;
            visible_shift[mt][h] = i % seqlen_q - seqlen_q + 1;
        }
    // ALiBi: rows mix heads, so each row keeps its head's factor (slope / scale). Slot c holds key step * c + parity
    // (step 2 by parity, else 1): |key - pos| = step * |c - (pos - parity) / step|, pos = len + visible_shift - 1.
    float alibi_factor[T::kAlibi ? T::kMTiles : 1][2];
    const float alibi_step = by_parity ? 0.5f : 1.f;  // 1 / step
    if constexpr (T::kAlibi) {
        const float* slopes = p.alibi_slopes + batch * p.alibi_batch_stride + kv_head * p.q_per_kv;
#pragma unroll
        for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = min(row0 + mt * 16 + g + 8 * h, group_rows - 1);  // past the group: any head's slope
                alibi_factor[mt][h] = slopes[i / seqlen_q] * p.alibi_scale / alibi_step;
            }
    }

    float acc_o[T::kMTiles][S::kNV][4];
    float row_max[T::kMTiles][2], row_sum[T::kMTiles][2];
    warp::zero(acc_o);
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt) row_max[mt][0] = row_max[mt][1] = detail::neg_inf(), row_sum[mt][0] = row_sum[mt][1] = 0.f;

    const u32 aQ = ptx::smem_u32(parity ? sQ1 : sQ);
    const u32 v_lane = warp::lane_offset<false>(S::kStrideV, lane);
    const int warp_key0 = warp * S::kWarpKeys;
    for (int t = t_begin; t < t_end; ++t) {
        ptx::cp_async_wait<T::kStages - 2>();
        __syncthreads();  // tile t is in; every warp is done with tile t - 1, whose slot the next load reuses
        if (t_load < t_end) load_stage(t_load, (t_load - t_begin) % T::kStages);
        ptx::cp_async_commit();
        ++t_load;
        fetch_rows(t_load);  // read after the next iteration's barrier; a paged table's next entries land meanwhile

        const u32 aK = ptx::smem_u32(sRing + ((t - t_begin) % T::kStages) * S::kStageElems);
        const u32 aV = aK + 2 * T::kBlockN * S::kStrideQK;
        const int n0 = t * T::kBlockN;
        float s[T::kMTiles][S::kNB][4];
        warp::gemm<T::kBF16, T::kMTiles, S::kNB / 2, T::kBlockN / 16, T::kPadQK / 16, false, false, true>(
            s, aQ, S::kStrideQK, 0, aK, S::kStrideQK, warp_key0 / 16, 1, lane);
        detail::apply_softcap<T::kSoftcap>(s, p.softcap_scale);
        // By parity, slot j of this warp's half holds key 2 j + parity: keys below L are slots below (L - parity + 1) / 2.
        auto slot_of = [&](int key) { return by_parity ? (key - parity + 1) >> 1 : key; };  // the first at or past key
        auto col0 = [&] { return (by_parity ? n0 / 2 + warp_key0 - parity * kHalf : n0 + warp_key0) + 2 * (lane & 3); };
        if constexpr (T::kAlibi) {
            const int pos0 = len - 1 - parity;  // the row's position less its visible_shift, less the parity
            detail::subtract_distance(s, [&](int mt, int h) { return alibi_factor[mt][h]; }, [&](int mt, int h) {
                return float(col0()) - float(pos0 + visible_shift[mt][h]) * alibi_step;
            });
        }
        if constexpr (T::kLocal) {
            // A window: token t sees keys len + visible_shift - 1 - left .. len + visible_shift - 1 + right (the host
            // holds right at 0 when causal, at most seqlen_q else).
            const int right = T::kCausal ? 0 : p.window_right;
            if (n0 + T::kBlockN > len || n0 + T::kBlockN > len - seqlen_q + 1 + right || n0 < len - 1 - p.window_left)
                detail::mask_columns<true>(
                    s, col0(), [&](int mt, int h) { return slot_of(min(len, len + visible_shift[mt][h] + right)); },
                    [&](int mt, int h) { return slot_of(len + visible_shift[mt][h] - 1 - p.window_left); });
        } else if (n0 + T::kBlockN > len || (T::kCausal && n0 + T::kBlockN > len - seqlen_q + 1)) {
            detail::mask_columns(s, col0(), [&](int mt, int h) {
                return slot_of(T::kCausal ? len + visible_shift[mt][h] : len);
            });
        }
        detail::online_softmax(s, row_max, row_sum, acc_o, p.scale_log2);

        // O += P V for this warp's keys: P never leaves registers.
#pragma unroll
        for (int kk = 0; kk < S::kWarpKeys / 16; ++kk) {
            u32 a[T::kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < T::kMTiles; ++mt) detail::pack_p<T::kBF16>(s[mt], kk, a[mt]);
#pragma unroll
            for (int np = 0; np < S::kNV / 2; ++np) {
                u32 b0, b1, b2, b3;
                ptx::ldsm_x4_t(aV + v_lane + warp::block_offset(S::kStrideV, warp_key0 + 16 * kk, 16 * np), b0, b1,
                               b2, b3);
#pragma unroll
                for (int mt = 0; mt < T::kMTiles; ++mt) {
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np], a[mt], b0, b1);
                    ptx::mma<T::kBF16>(acc_o[mt][2 * np + 1], a[mt], b2, b3);
                }
            }
        }
    }

    // Merge the warps: each leaves its rows' max, sum and unnormalized O in shared memory (over the ring).
    ptx::cp_async_wait<0>();
    __syncthreads();
    float* sO = reinterpret_cast<float*>(smem_raw);                    // [warp][row][kStrideO]
    float* sMax = sO + T::kWarps * T::kBlockM * S::kStrideO;           // [warp][row]
    float* sSum = sMax + T::kWarps * T::kBlockM;                       // [warp][row]
    float* sWeight = sSum + T::kWarps * T::kBlockM;                    // [warp][row]: the merge's factor
#pragma unroll
    for (int mt = 0; mt < T::kMTiles; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = warp * T::kBlockM + mt * 16 + g + 8 * h;
            const float sum = detail::quad_sum(row_sum[mt][h]);
            if ((lane & 3) == 0) sMax[r] = row_max[mt][h], sSum[r] = sum;
#pragma unroll
            for (int nb = 0; nb < S::kNV; ++nb) {
                const int c = nb * 8 + 2 * (lane & 3);  // V's rotated column; its element, for the pad as it is
                const int e = c >= T::kHeadDimV ? c : c + rot_v < T::kHeadDimV ? c + rot_v : c + rot_v - T::kHeadDimV;
                *reinterpret_cast<float2*>(sO + r * S::kStrideO + e) =
                    make_float2(acc_o[mt][nb][2 * h], acc_o[mt][nb][2 * h + 1]);
            }
        }
    __syncthreads();

    // A row's LSE (natural log); a row that saw no key: O = 0, LSE +inf when final (as the forward), -inf when
    // partial (so the combine gives it no weight). kSinks: a final row's sink joins it here; partial rows' in the
    // combine.
    const int rows_total = p.batch * p.heads_q * seqlen_q;
    auto out_row = [&](int i) {  // (sequence, query head, token) of packed row i, in [batch, heads_q, seqlen_q] order
        const int h = i / seqlen_q;
        return (batch * p.heads_q + kv_head * p.q_per_kv + h) * seqlen_q + (i - h * seqlen_q);
    };
    if (tid < T::kBlockM) {
        float m = detail::neg_inf();
        for (int w = 0; w < T::kWarps; ++w) m = fmaxf(m, sMax[w * T::kBlockM + tid]);
        float l = 0.f;
        for (int w = 0; w < T::kWarps; ++w) {
            const float mw = sMax[w * T::kBlockM + tid];
            const float f = mw == detail::neg_inf() ? 0.f : ptx::fast_exp2((mw - m) * p.scale_log2);
            sWeight[w * T::kBlockM + tid] = f;
            l += f * sSum[w * T::kBlockM + tid];
        }
        float inv = l > 0.f ? 1.f / l : 0.f;
        const bool sink_joins = T::kSinks && p.num_splits == 1 && row0 + tid < group_rows;
        detail::SinkJoin sink{};
        if (sink_joins) {
            sink = detail::join_sink(m * p.scale, l, p.sinks[kv_head * p.q_per_kv + (row0 + tid) / seqlen_q]);
            inv = sink.inv;
        }
        for (int w = 0; w < T::kWarps; ++w) sWeight[w * T::kBlockM + tid] *= inv;
        const float inf = __int_as_float(0x7f800000);
        float lse = l > 0.f ? m * p.scale + logf(l) : (p.num_splits == 1 ? inf : -inf);
        if (sink_joins) lse = sink.lse;
        if (row0 + tid < group_rows) {
            const int out = out_row(row0 + tid);
            if (p.num_splits > 1)
                p.part_lse[split * rows_total + out] = lse;
            else if (p.lse)
                p.lse[out] = lse;
        }
    }
    __syncthreads();

    // O rows: column pairs spread over the threads.
    constexpr int kPairs = (T::kHeadDimV + 1) / 2;
    for (int i = tid; i < T::kBlockM * kPairs; i += kThreads) {
        const int r = i / kPairs, c = 2 * (i - r * kPairs);
        if (row0 + r >= group_rows) continue;
        float o0 = 0.f, o1 = 0.f;
#pragma unroll
        for (int w = 0; w < T::kWarps; ++w) {
            const float f = sWeight[w * T::kBlockM + r];
            const float2 x = *reinterpret_cast<const float2*>(sO + (w * T::kBlockM + r) * S::kStrideO + c);
            o0 += f * x.x, o1 += f * x.y;
        }
        const int packed = row0 + r, h = packed / seqlen_q;
        if (p.num_splits > 1) {
            *reinterpret_cast<float2*>(p.part_o + ((long long)split * rows_total + out_row(packed)) * T::kPadV + c) =
                make_float2(o0, o1);
        } else {
            u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + (packed - h * seqlen_q) * p.o_seq_stride +
                     (kv_head * p.q_per_kv + h) * p.o_head_stride;
            detail::store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(o, c, o0, o1);
        }
    }
}

// Combine: one warp per output row (sequence, query head, token), over the splits' partial results.
constexpr int kDecCombineWarps = 4;
template <class T>
__device__ __forceinline__ void flash_decode_combine(const DecParams& p) {
    using ptx::u16;
    __shared__ float weight[kDecCombineWarps][geometry::kDecMaxSplits];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows_total = p.batch * p.heads_q * p.seqlen_q;
    const int row = blockIdx.x * kDecCombineWarps + warp;
    if (row >= rows_total) return;
    float m = detail::neg_inf();
    for (int s = lane; s < p.num_splits; s += 32) m = fmaxf(m, p.part_lse[s * rows_total + row]);
    m = detail::warp_max(m);
    // kSinks: the head's sink joins as one more part, whose O is zero.
    const float sink = T::kSinks ? p.sinks[row / p.seqlen_q % p.heads_q] : detail::neg_inf();
    if constexpr (T::kSinks) m = fmaxf(m, sink);
    float l = 0.f;
    for (int s = lane; s < p.num_splits; s += 32) {
        const float e = m == detail::neg_inf() ? 0.f : __expf(p.part_lse[s * rows_total + row] - m);
        weight[warp][s] = e;
        l += e;
    }
    l = detail::warp_sum(l);
    if (T::kSinks && m != detail::neg_inf()) l += __expf(sink - m);
    __syncwarp();
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (lane == 0 && p.lse) p.lse[row] = l > 0.f ? m + logf(l) : __int_as_float(0x7f800000);
    // row = (batch * heads_q + head) * seqlen_q + token
    const int token = row % p.seqlen_q, bh = row / p.seqlen_q, head = bh % p.heads_q, batch = bh / p.heads_q;
    u16* o = static_cast<u16*>(p.o) + batch * p.o_batch_stride + token * p.o_seq_stride + head * p.o_head_stride;
    for (int c = 2 * lane; c < T::kHeadDimV; c += 64) {
        float o0 = 0.f, o1 = 0.f;
        for (int s = 0; s < p.num_splits; ++s) {
            const float2 x = *reinterpret_cast<const float2*>(p.part_o + ((long long)s * rows_total + row) * T::kPadV + c);
            o0 += weight[warp][s] * x.x, o1 += weight[warp][s] * x.y;
        }
        detail::store_pair<T::kBF16, T::kHeadDimV, T::kVecV>(o, c, o0 * inv, o1 * inv);
    }
}

}  // namespace rtattn
