// wgmma (sm_90a): shared-memory matrix descriptors, fences and groups. The instructions themselves,
// D(64xN, fp32) += A(64x16) * B(16xN), need their own text and N/2 accumulator operands per width N, so the renderer
// (src/render/wgmma.cpp) writes a specialization of Mma for exactly the widths a plan issues into its source.
#pragma once
#include "common/ptx.cuh"

namespace rtattn {
namespace wgmma {

typedef unsigned long long u64;
using ptx::u32;

// Shared-memory matrix descriptor for the no-swizzle ("interleaved") canonical layout: 8x8 core matrices of 128
// contiguous bytes; lbo = byte distance between cores adjacent along K, sbo = along M/N.
// swizzle: 0 none (interleaved), 1 = 128-byte swizzle (atoms of 8 rows x 128 bytes, 1024-byte aligned).
__device__ __forceinline__ u64 desc(u32 smem_addr, u32 lbo, u32 sbo, int swizzle = 0) {
    return u64((smem_addr & 0x3FFFF) >> 4) | (u64((lbo & 0x3FFFF) >> 4) << 16) | (u64((sbo & 0x3FFFF) >> 4) << 32) |
           (u64(swizzle) << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }
// Shared memory written through the generic proxy (cp.async, st.shared) must be made visible to the async proxy
// that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ss<kTransA, kTransB>: A and B from shared memory, each K-major (false, the default) or M/N-major (true: read
// transposed, as the backward's dV += P^T dO and dK += dS^T Q need). rs<kTransB>: A from registers (per warp, the
// mma.m16n8k16 A-fragment layout), B from shared memory, K-major (false) or N-major (true).
template <int N, bool kBF16> struct Mma;

}  // namespace wgmma
}  // namespace rtattn
