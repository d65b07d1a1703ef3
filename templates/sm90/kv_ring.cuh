// The K/V ring of the warp-specialized kernel: kStages slots, each guarded by four mbarriers. "Full" completes when
// the producer's K (or V) tile has landed; "empty" when every consumer warp is done with it. Shifted rows add a fifth:
// "landed" completes when K's TMA bytes have arrived, and the producer completes "full" once it has zeroed the columns
// outside the rows. Key block j lives in slot
// j % kStages and is that slot's (j / kStages)-th occupant, so the parities below name phases of the slot's barriers.
#pragma once
#include "common/geometry.h"
#include "common/ptx.cuh"

namespace rtattn {
namespace sm90 {

template <int kStages>
struct KvRing {
    // Shared-memory address of the first barrier; the layout is [full K | full V | empty K | empty V (| landed K)] x
    // kStages.
    ptx::u32 base;
    static_assert(geometry::kv_ring_barriers(kStages) == 4 * kStages &&
                      geometry::kv_ring_barriers(kStages, true) == 5 * kStages,
                  "four barriers per slot, five with landed K");

    __device__ __forceinline__ ptx::u32 full_k(int slot) const { return base + 8 * slot; }
    __device__ __forceinline__ ptx::u32 full_v(int slot) const { return base + 8 * (kStages + slot); }
    __device__ __forceinline__ ptx::u32 empty_k(int slot) const { return base + 8 * (2 * kStages + slot); }
    __device__ __forceinline__ ptx::u32 empty_v(int slot) const { return base + 8 * (3 * kStages + slot); }
    __device__ __forceinline__ ptx::u32 landed_k(int slot) const { return base + 8 * (4 * kStages + slot); }

    static __device__ __forceinline__ int slot(int block) { return block % kStages; }
    // Consumers wait for this phase of block j's full barriers.
    static __device__ __forceinline__ ptx::u32 full_parity(int block) { return (block / kStages) & 1; }
    // The producer may refill block j's slot once its previous occupant (block j - kStages) was released: the empty
    // barriers' phase before this one. (Blocks j < kStages find the slot free and do not wait.)
    static __device__ __forceinline__ ptx::u32 empty_parity(int block) { return ((block / kStages) & 1) ^ 1; }
};

// A producer thread's arrival on a full barrier once its loads of the tile are done.
template <int kVec>
__device__ __forceinline__ void signal_loaded(ptx::u32 bar) {
    if constexpr (kVec >= 2)
        ptx::mbar_arrive_cp_async(bar);  // fires when this thread's cp.asyncs have landed
    else
        ptx::mbar_arrive(bar);           // plain stores (odd head dims): already done, the arrive releases them
}

}  // namespace sm90
}  // namespace rtattn
