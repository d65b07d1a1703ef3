/* librtattn's C ABI: attention kernels for any head_dim, rendered from templates, compiled at run time with NVRTC,
 * cached on disk and launched through the CUDA Driver API.
 *
 * C99. The shared library exports exactly these functions, and no C++ type crosses it: C, C++ (any standard library
 * ABI), Rust, Go and Python (ctypes) call the same kernels. The C++ API (rtattn/rtattn.hpp) is a header-only layer
 * over this one.
 *
 * Conventions
 * - Every function that can fail returns an rtattn_status. On failure, rtattn_last_error_message() and the other
 *   rtattn_last_error_* functions describe the failure for the calling thread until its next call into the library.
 * - Structs that may grow start with `struct_size`: set it with the matching *_init function (or to sizeof). The
 *   library reads and writes only the fields it knows, and never past struct_size. A caller built against an older
 *   header keeps working; a newer caller's fields past this library's struct are never read (the library cannot
 *   tell a larger struct from a wrong struct_size), so a caller that sets such a field checks rtattn_version()
 *   first.
 * - Strings returned through `const char*` fields or functions stay valid for as long as the object they came from
 *   (the runtime or the kernel), or, for rtattn_last_error_*, until the thread's next call.
 * - Nothing here synchronizes a stream or allocates device memory on the launch path: rtattn_kernel_forward can be
 *   captured into a CUDA graph. */
#ifndef RTATTN_RTATTN_H
#define RTATTN_RTATTN_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define RTATTN_API __attribute__((visibility("default")))
#else
#define RTATTN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function or struct changes incompatibly; adding functions or trailing struct fields does not. */
#define RTATTN_ABI_VERSION 1

typedef int32_t rtattn_status;
enum {
    RTATTN_OK = 0,
    RTATTN_ERROR_CONFIG = 1,        /* a config field is out of range, or the plan/arch cannot serve it (field) */
    RTATTN_ERROR_ARGUMENT = 2,      /* a bad call argument: pointer, size, stride, struct_size (field) */
    RTATTN_ERROR_COMPILE = 3,       /* NVRTC rejected the rendered source (log, options, source) */
    RTATTN_ERROR_CUDA = 4,          /* a Driver API call failed, or there is no driver or GPU (cuda call, result) */
    RTATTN_ERROR_CACHE_MISS = 5,    /* cache-only mode and the config is not cached (or its entry was refused) */
    RTATTN_ERROR_CACHE = 6,         /* the disk cache cannot do what was asked (e.g. a precompiled kernel not stored) */
    RTATTN_ERROR_OUT_OF_MEMORY = 7, /* host memory */
    RTATTN_ERROR_INTERNAL = 8       /* a bug in librtattn: the message says where */
};

enum { RTATTN_FP16 = 0, RTATTN_BF16 = 1 };                      /* rtattn_config.dtype */
enum { RTATTN_CACHE_JIT = 0, RTATTN_CACHE_ONLY = 1 };           /* rtattn_runtime_options.cache_mode */
enum { RTATTN_LOG_QUIET = 0, RTATTN_LOG_WARN = 1, RTATTN_LOG_INFO = 2, RTATTN_LOG_DEBUG = 3 };

typedef struct rtattn_runtime rtattn_runtime; /* compiles, caches and loads kernels; thread-safe */
typedef struct rtattn_kernel rtattn_kernel;   /* one loaded kernel; reference-counted, thread-safe, outlives its runtime */

/* ---- versions and errors ---------------------------------------------------------------------------------------- */

RTATTN_API const char* rtattn_version(void);      /* the library's version, e.g. "0.1.0" */
RTATTN_API int32_t rtattn_abi_version(void);      /* RTATTN_ABI_VERSION of the library */
RTATTN_API const char* rtattn_nvrtc_version(void); /* e.g. "13.0" */

RTATTN_API rtattn_status rtattn_last_error(void);         /* the status of the thread's last failed call, or OK */
RTATTN_API const char* rtattn_last_error_message(void);   /* "" when none */
RTATTN_API const char* rtattn_last_error_field(void);     /* config and argument errors: e.g. "head_dim_qk", "q.ptr" */
RTATTN_API const char* rtattn_last_error_log(void);       /* compile errors: the NVRTC log */
RTATTN_API const char* rtattn_last_error_options(void);   /* compile errors: the NVRTC options */
RTATTN_API const char* rtattn_last_error_source(void);    /* compile errors: the rendered source */
RTATTN_API const char* rtattn_last_error_cuda_call(void); /* CUDA errors: the Driver API call */
RTATTN_API int32_t rtattn_last_error_cuda_result(void);   /* CUDA errors: its CUresult */

/* ---- configs ------------------------------------------------------------------------------------------------------ */

typedef struct rtattn_config {
    size_t struct_size;
    int32_t head_dim_qk;       /* 1..256 (default 128) */
    int32_t has_head_dim_v;    /* 0: head_dim_v is head_dim_qk; 1: head_dim_v as given */
    int32_t head_dim_v;        /* 1..256 */
    int32_t dtype;             /* RTATTN_FP16 or RTATTN_BF16 (default) */
    int32_t causal;            /* 0 or 1; bottom-right aligned when seqlen_q != seqlen_k */
    int32_t num_heads_q;       /* 1..65535 (default 1), a multiple of num_heads_kv */
    int32_t num_heads_kv;      /* >= 1 (default 1): 1 = MQA, < num_heads_q = GQA */
    int32_t has_softmax_scale; /* 0: 1/sqrt(head_dim_qk); 1: softmax_scale as given */
    double softmax_scale;      /* FLT_MIN..FLT_MAX/log2(e): a normal float in the kernels, times log2(e) too */
    const char* arch;          /* "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"; NULL or "" = the current device */
    int32_t decode;            /* 0 or 1: 1..16 query tokens per sequence against a KV cache (split-KV decode) */
    int32_t paged_kv;          /* 0 or 1: K and V in a paged cache through a block table (decode or prefill) */
    int32_t varlen;            /* 0 or 1: packed sequences of different lengths (cu_seqlens_q/k), forward and backward */
    int32_t local;             /* 0 or 1: a sliding window (FlashAttention's local attention), its bounds given per call
                                * (window_size_left/right of the forward and backward args); with causal, the right
                                * bound is 0. Every pass: prefill, varlen, paged prefill, decode (dense or paged), and
                                * the backward */
    int32_t sinks;             /* 0 or 1: attention sinks (gpt-oss; vLLM's s_aux): each query head's float32 logit, the
                                * call's sinks[heads_q], joins every row's softmax denominator as a key whose value
                                * is zero (a row that sees no key gives O = 0, LSE = its sink); the backward writes
                                * its gradient, dsinks. Every pass, as local */
    int32_t softcap;           /* 0 or 1: logit softcapping (Gemma 2): each scaled score s becomes cap * tanh(s / cap)
                                * before the softmax, cap the call's softcap (> 0). Every pass (prefill, varlen,
                                * paged prefill, decode, and the backward with the forward's cap) */
    int32_t alibi;             /* 0 or 1: ALiBi (MPT, BLOOM, Falcon): each scaled score of query i and key j loses
                                * slope * |i + seqlen_k - seqlen_q - j| (after the cap), slope the call's
                                * alibi_slopes per query head (and batch); i is a decode token's position among
                                * its sequence's keys. Every pass (prefill, varlen, paged prefill, decode, backward) */
} rtattn_config;

RTATTN_API void rtattn_config_init(rtattn_config* config); /* defaults, and struct_size */
/* Checks every field; on failure the last error names the first bad field and its allowed range. */
RTATTN_API rtattn_status rtattn_config_validate(const rtattn_config* config);
/* Text outputs: writes at most buf_size bytes (NUL-terminated) and sets *needed to the full length + 1, so a call
 * with buf_size 0 asks for the size. */
RTATTN_API rtattn_status rtattn_config_to_json(const rtattn_config* config, char* buf, size_t buf_size, size_t* needed);
RTATTN_API rtattn_status rtattn_config_describe(const rtattn_config* config, char* buf, size_t buf_size, size_t* needed);
/* Parses and validates a config JSON (AttentionConfig::from_json's format). The arch is copied into arch_buf
 * (arch_buf_size >= 16 always suffices) and out->arch points at it. */
RTATTN_API rtattn_status rtattn_config_from_json(const char* json, rtattn_config* out, char* arch_buf,
                                                 size_t arch_buf_size);
/* "bf16"/"bfloat16" -> RTATTN_BF16, "fp16"/"float16"/"half" -> RTATTN_FP16; else RTATTN_ERROR_CONFIG (field "dtype"). */
RTATTN_API rtattn_status rtattn_dtype_from_string(const char* name, int32_t* dtype);
RTATTN_API int32_t rtattn_is_known_arch(const char* arch);
RTATTN_API const char* rtattn_known_archs(void); /* "sm_80, sm_86, sm_89, sm_90, sm_90a" */

/* ---- the runtime ---------------------------------------------------------------------------------------------- */

typedef void (*rtattn_log_fn)(void* user_data, int32_t level, const char* message);

typedef struct rtattn_runtime_options {
    size_t struct_size;
    const char* cache_dir;           /* NULL or "": $RTATTN_CACHE_DIR, else $XDG_CACHE_HOME/rtattn, else ~/.cache/rtattn */
    int32_t cache_mode;              /* RTATTN_CACHE_JIT, or RTATTN_CACHE_ONLY (never compile; RTATTN_CACHE_ONLY=1 too) */
    int32_t max_concurrent_compiles; /* 0: one per hardware thread, at most 8; never more than the hardware threads */
    uint64_t max_cache_bytes;        /* disk cap, least recently used entries evicted past it; 0: none (default 2 GiB) */
    int32_t log_level;               /* RTATTN_LOG_*; RTATTN_LOG_LEVEL=quiet|warn|info|debug overrides it */
    rtattn_log_fn log_callback;      /* NULL: stderr with an "rtattn" prefix; may be called from any thread */
    void* log_user_data;
    int32_t shared_cache;            /* 1: trust a group-writable team cache (README: Security and trust) */
    double lock_timeout_seconds;     /* wait for another process building the same kernel, 0..86400 (default 60) */
    const char* tile_override;       /* replaces the plan table's tile (RTATTN_TILE's format); NULL: the table */
} rtattn_runtime_options;

RTATTN_API void rtattn_runtime_options_init(rtattn_runtime_options* options);
/* options may be NULL (defaults). */
RTATTN_API rtattn_status rtattn_runtime_create(const rtattn_runtime_options* options, rtattn_runtime** out);
RTATTN_API void rtattn_runtime_destroy(rtattn_runtime* runtime); /* kernels obtained from it stay valid */
/* The options in effect (the environment applied, the compile bound resolved); strings owned by the runtime. */
RTATTN_API rtattn_status rtattn_runtime_options_get(const rtattn_runtime* runtime, rtattn_runtime_options* out);

/* What a kernel is: the plan and what ptxas reported. Strings owned by the kernel, or for rtattn_runtime_plan and
 * rtattn_runtime_precompile by the runtime. */
typedef struct rtattn_kernel_info {
    size_t struct_size;
    const char* key;     /* the SHA-256 cache key (hex) */
    const char* arch;
    int32_t padded_qk, padded_v;            /* head dims after padding to the MMA shape */
    int32_t block_m, block_n, warps, stages;
    int32_t smem_bytes;
    int32_t vec_qk, vec_v;                  /* elements per vector access: pointers and strides must be multiples */
    double useful_flop_fraction;            /* useful / issued MMA FLOPs */
    const char* kernel;                     /* e.g. "wgmma, swizzled tiles, producer warpgroup" */
    const char* reason;                     /* the plan table row's reason */
    int32_t registers, spill_bytes;         /* from ptxas when this process compiled it, else -1 */
    int32_t from_cache;
} rtattn_kernel_info;

RTATTN_API void rtattn_kernel_info_init(rtattn_kernel_info* info);
/* The plan for a config, without compiling or loading anything (registers and spills are -1). */
RTATTN_API rtattn_status rtattn_runtime_plan(rtattn_runtime* runtime, const rtattn_config* config,
                                             rtattn_kernel_info* info);
/* Makes sure a cubin for the config (with an explicit arch) is in the disk cache; needs no GPU. RTATTN_ERROR_CACHE
 * when it was compiled but could not be stored. info may be NULL. */
RTATTN_API rtattn_status rtattn_runtime_precompile(rtattn_runtime* runtime, const rtattn_config* config,
                                                   rtattn_kernel_info* info);
/* Compiles or loads the config's kernel into the current CUDA context (the device's primary context if none is
 * current). The caller owns one reference: rtattn_kernel_release it. */
RTATTN_API rtattn_status rtattn_runtime_get(rtattn_runtime* runtime, const rtattn_config* config, rtattn_kernel** out);

typedef struct rtattn_cache_stats {
    size_t struct_size;
    uint64_t memory_hits, disk_hits, misses, compiles;
    double compile_seconds; /* NVRTC time */
    uint64_t bad_entries, evictions, bytes_written, disk_bytes;
    int32_t disk_enabled;   /* 0: the cache dir cannot be used or is not trusted (memory only) */
    const char* dir;        /* owned by the runtime */
} rtattn_cache_stats;

RTATTN_API void rtattn_cache_stats_init(rtattn_cache_stats* stats);
RTATTN_API rtattn_status rtattn_runtime_stats(rtattn_runtime* runtime, rtattn_cache_stats* out);

/* ---- kernels ----------------------------------------------------------------------------------------------------- */

/* One [batch, seq, head, dim] tensor: strides in elements, the dim axis contiguous. */
typedef struct rtattn_tensor {
    const void* ptr;
    int64_t batch_stride, seq_stride, head_stride;
} rtattn_tensor;

typedef struct rtattn_forward_args {
    size_t struct_size;
    rtattn_tensor q;  /* [batch, seqlen_q, heads_q, d_qk] */
    rtattn_tensor k;  /* [batch, seqlen_k, heads_kv, d_qk] */
    rtattn_tensor v;  /* [batch, seqlen_k, heads_kv, d_v] */
    rtattn_tensor o;  /* [batch, seqlen_q, heads_q, d_v], written */
    float* lse;       /* optional [batch, heads_q, seqlen_q] float32: natural-log sum-exp of the scaled scores */
    int32_t batch, seqlen_q, seqlen_k;
    /* Cache calls (config.decode or paged_kv, or a dense prefill config given seqlens_k): seqlen_q = query tokens per
     * sequence (decode: 1..16), the last seqlen_q of each sequence's keys; seqlen_k = the most keys a sequence has
     * cached (decode: it fixes the split count, so a captured graph stays valid as lengths change). */
    const int32_t* seqlens_k;   /* device [batch]: keys cached per sequence (values above seqlen_k read as it); NULL:
                                 * seqlen_k each */
    /* Paged KV (config.paged_kv): k and v are [num_pages, page_size, heads_kv, dim]; batch_stride is the page
     * stride. Token t of sequence b is in page block_table[b * block_table_stride + t / page_size]. */
    const int32_t* block_table; /* device int32 [batch, block_table_stride] */
    int64_t block_table_stride;
    int32_t pages_per_seq;      /* the table's columns: pages_per_seq * page_size >= seqlen_k */
    int32_t page_size;          /* 1, 2, 4, ..., 65536 */
    int32_t num_splits;         /* key splits per sequence, 1..128; 0: the library chooses */
    void* workspace;            /* device, 256-byte aligned, rtattn_kernel_workspace_bytes(...) bytes (see there) */
    size_t workspace_bytes;
    /* Varlen configs only (config.varlen), FlashAttention's varlen layout: q, k, v, o are [total, heads, dim] with
     * batch_stride 0; sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q and o (cu_seqlens_k: k and v);
     * batch = number of sequences, seqlen_q / seqlen_k = the longest (max_seqlen_q/k; they size the grid); lse is
     * [heads_q, total_q]. Offsets stay on the device, unchecked; the kernels clamp them into total_q / total_k. */
    const int32_t* cu_seqlens_q; /* device [batch + 1] int32, non-decreasing from 0 */
    const int32_t* cu_seqlens_k; /* device [batch + 1] int32 */
    int32_t total_q, total_k;    /* rows of the packed q/o and k/v */
    /* Paged KV: the pages k and v hold (required, >= 1). A block-table entry outside 0..num_pages-1 (a negative one
     * too) reads the last page: wrong rows, never memory outside the cache. (Added after the first version: a caller
     * whose struct_size ends before it gets 0, and a paged call is refused.) */
    int32_t num_pages;
    /* has_window 1: the call's sliding window, FlashAttention's window_size: key j is seen by query i iff
     * i + seqlen_k - seqlen_q - window_size_left <= j <= i + seqlen_k - seqlen_q + window_size_right (per sequence),
     * -1 leaving that side unbounded; a causal kernel takes a right bound of 0 or -1; a kernel of a config without
     * local refuses any window but (-1, -1). has_window 0 (a zeroed struct, or one whose struct_size ends before
     * these fields): no window, and both fields must be 0 or -1 (rtattn_forward_args_init sets -1). */
    int32_t has_window;
    int32_t window_size_left, window_size_right;
    /* Sinks configs (config.sinks) only, and required there: device float32 [heads_q], 4-byte aligned, each query
     * head's sink logit (in the units of the scaled scores, softmax_scale * q.k). NULL for any other kernel. */
    const float* sinks;
    /* Softcap configs (config.softcap) only, and required there: the cap, a finite float > 0 (Gemma 2: 50 for
     * attention). 0 for any other kernel (a zeroed struct). */
    float softcap;
    /* ALiBi configs (config.alibi) only, and required there: device float32 slopes, 4-byte aligned, [heads_q]
     * (alibi_slopes_batch_stride 0: every sequence alike) or [batch, heads_q] rows alibi_slopes_batch_stride
     * (>= heads_q) elements apart; the score of query i and key j loses slope * |i + seqlen_k - seqlen_q - j|
     * (FlashAttention's alibi_slopes). NULL and 0 for any other kernel. */
    const float* alibi_slopes;
    int64_t alibi_slopes_batch_stride;
    /* KV append (a cache call: decode, paged, or a dense prefill config given seqlens_k; not varlen), FlashAttention's
     * flash_attn_with_kvcache k= / v=: k_new [batch, seqlen_new, heads_kv, d_qk] and v_new (d_v) are written into the
     * cache (k and v, which the call modifies) at rows seqlens_k[b] .. seqlens_k[b] + seqlen_new - 1 (seqlens_k
     * required: the lengths before the call; rows at or past seqlen_k, or in a page outside 0..num_pages-1, are
     * dropped), then the attention reads seqlens_k[b] + seqlen_new keys (seqlen_k bounds the lengths after the
     * append). Two launches on the stream (graph-capturable). seqlen_new 0 (a zeroed struct): no append, k_new and
     * v_new NULL. */
    rtattn_tensor k_new, v_new;
    int32_t seqlen_new;
} rtattn_forward_args;

RTATTN_API void rtattn_forward_args_init(rtattn_forward_args* args);
/* A contiguous [batch, seqlen, heads, dim] tensor. */
RTATTN_API rtattn_tensor rtattn_tensor_contiguous(const void* ptr, int32_t seqlen, int32_t heads, int32_t dim);

RTATTN_API void rtattn_kernel_retain(rtattn_kernel* kernel);
RTATTN_API void rtattn_kernel_release(rtattn_kernel* kernel); /* NULL is fine */
/* Launches on `stream` (a CUstream / cudaStream_t; NULL = the legacy default stream). Never synchronizes or
 * allocates. RTATTN_ERROR_ARGUMENT names the bad argument (e.g. "q.seq_stride"). */
RTATTN_API rtattn_status rtattn_kernel_forward(const rtattn_kernel* kernel, const rtattn_forward_args* args,
                                               void* stream);
/* The device workspace one forward call with these sizes needs (decode: the splits' partial results; 0 for the
 * other kernels). num_splits 0: the library's choice, as rtattn_kernel_forward makes it. A prefill kernel (not
 * varlen) runs its config's decode kernels for 1..16 query tokens against 2048 keys or more (same results, the
 * cache read 2-3x faster; the first such query compiles them unless cached): its answer is then theirs, and a call
 * given that workspace runs them. Given less (or none), the call runs them only where they need none, else the
 * prefill kernel; so does a config the decode kernels refuse, or a cache-only runtime without their entry. */
RTATTN_API rtattn_status rtattn_kernel_workspace_bytes(const rtattn_kernel* kernel, int32_t batch, int32_t seqlen_q,
                                                       int32_t seqlen_k, int32_t num_splits, size_t* out);
/* The number of key splits a decode call with these sizes runs (num_splits 0: the library's choice), a prefill
 * kernel's few-query call included (see rtattn_kernel_workspace_bytes); 1 otherwise. */
RTATTN_API rtattn_status rtattn_kernel_num_splits(const rtattn_kernel* kernel, int32_t batch, int32_t seqlen_q,
                                                  int32_t seqlen_k, int32_t num_splits, int32_t* out);
/* Two attention states of the same query rows over different keys, merged into the attention over both: O tensors
 * [batch, seqlen, heads_q, d_v] (the kernel's dtype), LSE [batch, heads_q, seqlen] float32 natural log; LSE +inf or
 * -inf marks a state without keys (weight 0). o may be o_a or o_b, lse lse_a or lse_b (in place); lse may be NULL. */
typedef struct rtattn_merge_args {
    size_t struct_size;
    rtattn_tensor o_a, o_b, o;
    const float* lse_a;
    const float* lse_b;
    float* lse;
    int32_t batch, seqlen;
} rtattn_merge_args;

RTATTN_API void rtattn_merge_args_init(rtattn_merge_args* args);
/* Launches the merge on `stream`; never synchronizes or allocates. */
RTATTN_API rtattn_status rtattn_kernel_merge(const rtattn_kernel* kernel, const rtattn_merge_args* args, void* stream);
RTATTN_API rtattn_status rtattn_kernel_get_info(const rtattn_kernel* kernel, rtattn_kernel_info* out);
/* The kernel's config, arch resolved (out->arch owned by the kernel). */
RTATTN_API rtattn_status rtattn_kernel_get_config(const rtattn_kernel* kernel, rtattn_config* out);

/* ---- the backward pass ------------------------------------------------------------------------------------------ */

/* The backward kernels of one config (dQ, dK, dV), reference-counted like rtattn_kernel and independent of it. */
typedef struct rtattn_backward_kernel rtattn_backward_kernel;

/* Compiles or loads the config's backward kernels (their own cache entry) into the current CUDA context. The caller
 * owns one reference: rtattn_backward_kernel_release it. */
RTATTN_API rtattn_status rtattn_runtime_get_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                                     rtattn_backward_kernel** out);
/* rtattn_runtime_precompile for the backward kernels; info may be NULL. */
RTATTN_API rtattn_status rtattn_runtime_precompile_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                                            rtattn_kernel_info* info);
/* The backward plan, without compiling anything. */
RTATTN_API rtattn_status rtattn_runtime_plan_backward(rtattn_runtime* runtime, const rtattn_config* config,
                                                      rtattn_kernel_info* info);

typedef struct rtattn_backward_args {
    size_t struct_size;
    rtattn_tensor q, k, v;      /* the forward's inputs */
    rtattn_tensor o;            /* the forward's output */
    rtattn_tensor dout;         /* dO: the loss's gradient with respect to o, o's shape */
    const float* lse;           /* the forward's LSE, [batch, heads_q, seqlen_q] float32 (required) */
    const float* dlse;          /* optional (NULL): the loss's gradient with respect to that LSE, same layout */
    rtattn_tensor dq, dk, dv;   /* written: q's, k's and v's shapes; dK and dV per KV head (a GQA group's sum) */
    int32_t batch, seqlen_q, seqlen_k;
    void* workspace;            /* device memory, 256-byte aligned, rtattn_backward_kernel_workspace_bytes(...) */
    size_t workspace_bytes;
    int32_t deterministic;      /* 1: bitwise-identical gradients run to run (slower) */
    /* Varlen configs: as rtattn_forward_args (lse, dlse [heads_q, total_q]; the workspace is sized by batch and
     * the longest sequence). */
    const int32_t* cu_seqlens_q;
    const int32_t* cu_seqlens_k;
    int32_t total_q, total_k;
    /* The forward's window, as rtattn_forward_args's. */
    int32_t has_window;
    int32_t window_size_left, window_size_right;
    /* Sinks configs: the forward's sinks (required) and, optionally (NULL: not computed), dsinks: device float32
     * [heads_q], written (not added to) with the loss's gradient with respect to each sink, summed over the batch and
     * the rows. NULL for any other kernel. */
    const float* sinks;
    float* dsinks;
    /* Softcap configs: the forward's cap (required, > 0). 0 for any other kernel. */
    float softcap;
    /* ALiBi configs: the forward's slopes (required) and their batch stride, as rtattn_forward_args's. */
    const float* alibi_slopes;
    int64_t alibi_slopes_batch_stride;
} rtattn_backward_args;

RTATTN_API void rtattn_backward_args_init(rtattn_backward_args* args);
RTATTN_API void rtattn_backward_kernel_retain(rtattn_backward_kernel* kernel);
RTATTN_API void rtattn_backward_kernel_release(rtattn_backward_kernel* kernel); /* NULL is fine */
/* The workspace one call with these sizes needs (fp32 dQ accumulator, row statistics, turn counters). */
RTATTN_API rtattn_status rtattn_backward_kernel_workspace_bytes(const rtattn_backward_kernel* kernel, int32_t batch,
                                                                int32_t seqlen_q, int32_t seqlen_k, size_t* out);
/* Writes dQ, dK, dV on `stream`. Never synchronizes or allocates (graph-capturable). RTATTN_ERROR_ARGUMENT names the
 * bad argument (e.g. "workspace_bytes"). */
RTATTN_API rtattn_status rtattn_kernel_backward(const rtattn_backward_kernel* kernel, const rtattn_backward_args* args,
                                                void* stream);
RTATTN_API rtattn_status rtattn_backward_kernel_get_info(const rtattn_backward_kernel* kernel,
                                                         rtattn_kernel_info* out);
RTATTN_API rtattn_status rtattn_backward_kernel_get_config(const rtattn_backward_kernel* kernel, rtattn_config* out);

#ifdef __cplusplus
}
#endif

#endif /* RTATTN_RTATTN_H */
