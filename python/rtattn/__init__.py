"""rtattn: attention kernels for any head_dim, compiled at run time with NVRTC, cached on disk, launched through the
CUDA Driver API. This package calls librtattn's C ABI through ctypes: it works with any Python 3.8+ and any PyTorch,
and without torch or a GPU for everything but launching (precompile, plan, info, the cache).

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
           "info", "known_archs", "plan", "precompile", "precompile_backward", "set_default_runtime", "version"]

_torch_ops = None


def _load_torch_ops():
    """Registers the custom op on first use; importing rtattn alone never imports torch."""
    global _torch_ops, attention
    if _torch_ops is None:
        from . import _torch
        _torch_ops = _torch
        attention = _torch.attention
    return _torch_ops


def attention(q, k, v, causal=False, softmax_scale=None, return_lse=False, deterministic=False):
    """Scaled dot-product attention on torch CUDA tensors [batch, seqlen, heads, head_dim], differentiable (see
    rtattn._torch.attention); needs torch."""
    return _load_torch_ops().attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=return_lse,
                                       deterministic=deterministic)


# A program that imported torch first gets torch.ops.rtattn.attention registered now, so torch.compile and CUDA
# graph capture never see the registration happen mid-trace.
if "torch" in _sys.modules:
    _load_torch_ops()
