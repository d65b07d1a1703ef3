// plan(): the one place that decides whether a config is supported and with which tiles. Pure: no CUDA.
#pragma once
#include <string>

#include "rtattn/config.hpp"
#include "rtattn/runtime.hpp"

namespace rtattn::plan {

struct ArchInfo {
    const char* name;     // "sm_90a"
    int sm;               // 80, 86, 89, 90
    int smem_optin;       // max dynamic shared memory per block after cuFuncSetAttribute
};
// Throws ConfigError("arch", ...) for an unknown or empty arch.
const ArchInfo& arch_info(const std::string& arch);

struct KernelPlan {
    // What is computed.
    int head_dim_qk = 0, head_dim_v = 0;
    int pad_qk = 0;       // head_dim_qk rounded up to 16: the k of mma.m16n8k16 in QK^T
    int pad_v = 0;        // head_dim_v rounded up to pv_step (8: the n of mma.m16n8k16 in PV; 16 where the table says)
    int pv_step = 8;
    bool bf16 = true, causal = false;
    std::string arch;
    // How: one row of the tile table, possibly stepped down to fit the arch's shared memory.
    bool wgmma = false;  // Hopper warpgroup-MMA kernel (templates/rtattn_fwd_sm90.cuh), else mma.sync
    int block_m = 0, block_n = 0, warps = 0, m_tiles = 0, stages = 0;
    bool q_in_regs = false;
    bool swizzle = false;  // wgmma only: swizzled column panels in shared memory (else interleaved cores)
    // wgmma only. 0: every warp loads and computes (templates/rtattn_fwd_sm90.cuh). 1: a producer warpgroup loads,
    // consumers overlap softmax with PV (rtattn_fwd_sm90_ws.cuh). 2: as 1, consumer warpgroups take turns (ping-pong).
    int schedule = 0;
    // Producer kernels with head dims 32k+4 (36, 68, 100, 132, ...): packed heads alternate between 16- and
    // 8-byte aligned starts, so TMA moves the aligned d-4 columns of each row and the producer threads the other 4.
    bool split_rows = false;
    // Producer kernels: V tiles in whole 64-column panels (the last one partly used), so PV is one wgmma of n = pad_v
    // per k-step instead of one per panel width (templates: sm90::WideLayout).
    bool wide_v = false;
    int vec_qk = 0, vec_v = 0;  // elements per global vector access (largest of 8/4/2/1 dividing the head dim)
    int smem_bytes = 0;
    bool producer() const { return wgmma && schedule > 0; }
    int threads() const { return warps * 32 + (producer() ? 128 : 0); }  // `warps` counts the MMA warps
    std::string kernel() const;
    std::string reason;

    // Useful / issued MMA FLOPs per (query, key) pair: the cost of padding the head dims.
    double useful_flop_fraction() const {
        return double(head_dim_qk + head_dim_v) / double(pad_qk + pad_v);
    }
    PlanSummary summary() const;
};

// config.arch must be non-empty (the Runtime resolves "current device" before planning).
// Throws ConfigError when the config is invalid or the plan cannot serve it; support and dispatch are one function.
KernelPlan plan(const AttentionConfig& config);

// Shared memory the kernel template will declare for these tiles (mirrors FwdShape / FwdShapeSm90 in templates/;
// the rendered stub static_asserts the two agree).
int smem_bytes(int pad_qk, int pad_v, int block_m, int block_n, int stages, bool wgmma, bool producer, bool wide_v);

}  // namespace rtattn::plan
