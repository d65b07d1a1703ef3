"""rtattn: attention kernels for any head_dim, compiled at run time with NVRTC, cached on disk, launched through the
CUDA Driver API. This package calls librtattn's C ABI through ctypes: it works with any Python 3.8+, without torch or
a GPU for everything but launching (precompile, plan, info, the cache), and with any torch; the torch ops (attention,
attention_varlen, attention_with_kvcache, merge_states) need torch >= 2.4.

    import rtattn
    rtattn.precompile(head_dim=132, causal=True, arch="sm_90a")   # no GPU needed
    o = rtattn.attention(q, k, v, causal=True)                     # torch tensors [batch, seq, heads, dim]

The library is found through RTATTN_LIBRARY, else next to this package (pip install), else installed.
"""
import sys as _sys

from ._api import (AttentionConfig, ArgumentError, BackwardKernel, CacheError, CacheMissError, CacheStats, CompileError,
                   ConfigError, CudaError, Error, Kernel, KernelInfo, Runtime, default_runtime, info, known_archs,
                   plan, precompile, precompile_backward, set_default_runtime, version)

__version__ = version()

__all__ = ["AttentionConfig", "ArgumentError", "BackwardKernel", "CacheError", "CacheMissError", "CacheStats", "CompileError",
           "ConfigError", "CudaError", "Error", "Kernel", "KernelInfo", "Runtime", "attention", "default_runtime",
           "info", "known_archs", "plan", "precompile", "precompile_backward", "set_default_runtime", "version",
           "attention_varlen", "attention_with_kvcache", "merge_states"]

_torch_ops = None
_serving_ops = None


def _load_torch_ops():
    """Registers the custom ops on first use; importing rtattn alone never imports torch."""
    global _torch_ops, _serving_ops, attention, attention_varlen, attention_with_kvcache, merge_states
    if _torch_ops is None:
        from . import _serving, _torch
        _torch_ops, _serving_ops = _torch, _serving
        attention = _torch.attention
        attention_varlen = _serving.attention_varlen
        attention_with_kvcache = _serving.attention_with_kvcache
        merge_states = _serving.merge_states
    return _torch_ops


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     softmax_scale=None, return_lse=False, deterministic=False, window_size=(-1, -1), sinks=None,
                     softcap=0.0, alibi_slopes=None):
    """Attention over packed sequences [total, heads, head_dim] with cu_seqlens (flash_attn_varlen_func),
    differentiable (see rtattn._serving.attention_varlen); needs torch."""
    _load_torch_ops()
    return _serving_ops.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                         causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                                         deterministic=deterministic, window_size=window_size, sinks=sinks,
                                         softcap=softcap, alibi_slopes=alibi_slopes)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=False,
                           softmax_scale=None, num_splits=0, max_seqlen_k=None, return_lse=False,
                           window_size=(-1, -1), sinks=None, softcap=0.0, alibi_slopes=None, k=None, v=None):
    """Attention against a dense or paged KV cache, any number of query tokens, with the new tokens' K/V (k, v)
    appended into the cache first when given (flash_attn_with_kvcache; see rtattn._serving.attention_with_kvcache);
    needs torch."""
    _load_torch_ops()
    return _serving_ops.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                               block_table=block_table, causal=causal, softmax_scale=softmax_scale,
                                               num_splits=num_splits, max_seqlen_k=max_seqlen_k,
                                               return_lse=return_lse, window_size=window_size, sinks=sinks,
                                               softcap=softcap, alibi_slopes=alibi_slopes, k=k, v=v)


def merge_states(o_a, lse_a, o_b, lse_b):
    """Merges two attention states (O, LSE) of the same rows over different keys (see rtattn._serving.merge_states);
    needs torch."""
    _load_torch_ops()
    return _serving_ops.merge_states(o_a, lse_a, o_b, lse_b)


def attention(q, k, v, causal=False, softmax_scale=None, return_lse=False, deterministic=False, window_size=(-1, -1),
              sinks=None, softcap=0.0, alibi_slopes=None):
    """Scaled dot-product attention on torch CUDA tensors [batch, seqlen, heads, head_dim], differentiable (see
    rtattn._torch.attention); needs torch."""
    return _load_torch_ops().attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                                       deterministic=deterministic, window_size=window_size, sinks=sinks,
                                       softcap=softcap, alibi_slopes=alibi_slopes)


# A program that imported torch first gets torch.ops.rtattn.attention registered now, so torch.compile and CUDA
# graph capture never see the registration happen mid-trace. A torch too old for the ops (below 2.4) leaves them
# unregistered: calling one raises the ImportError that names the version; everything else works.
if "torch" in _sys.modules:
    try:
        _load_torch_ops()
    except ImportError:
        pass
