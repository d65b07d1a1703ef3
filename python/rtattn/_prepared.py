"""Prepared launches: the host path of a plain eager forward call that repeats an earlier one.

A decode loop or a serving step calls rtattn.attention and attention_with_kvcache with the same shapes, dtypes,
device and options every time but for the keys' length, which grows; only pointers and that length change. Every
check the first such call passed, the kernel it chose and each field of its argument struct (sizes, strides, window,
cap) are functions of that signature, so the first call's filled struct is kept per signature, on the runtime beside
its kernels, and later calls allocate the outputs, copy the struct, set the pointers (and the keys' length, strides
and workspace size, each checked as the full path would) and launch. The library still checks every launch (pointer
alignment, strides). Anything outside the signature's form (a non-tensor, an int where a float is expected, a
traced or differentiable call, keys past the recorded kernel's reach) takes the full path, which refuses it by name.
docs/PERFORMANCE.md, host cost per call."""
import ctypes

import torch

from . import _api, _lib
from ._convert import INT32_MAX

# The current stream as a raw handle without building a torch.cuda.Stream object (a few µs per call); the public
# call where this private one is missing.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda device: torch.cuda.current_stream(device).cuda_stream)

_MAX_ENTRIES = 1024  # signatures kept per runtime: a server's shapes, bounded where shapes churn


def tensor_arg(x: torch.Tensor) -> "_lib.Tensor":
    """A [batch, seq, head, dim] tensor as the library's struct. torch's strides are int64 and its pointers fit a
    void*, as the struct's fields: nothing can wrap here. A dim of extent 1 is never stepped over, and torch may give
    it any stride (unsqueeze, expand): pass 0."""
    n, s = x.shape, x.stride()
    return _lib.Tensor(x.data_ptr(), s[0] if n[0] > 1 else 0, s[1] if n[1] > 1 else 0, s[2] if n[2] > 1 else 0)


def packed_arg(x: torch.Tensor) -> "_lib.Tensor":
    """A packed [total, heads, dim] tensor (varlen) as the library's [batch, seq, head] strides (batch stride 0)."""
    n, s = x.shape, x.stride()
    return _lib.Tensor(x.data_ptr(), 0, s[0] if n[0] > 1 else 0, s[1] if n[1] > 1 else 0)


_WORKSPACE_BYTES = {}  # (kernel, sizes) -> bytes: a pure function of them, asked once per decode step


def workspace_bytes(kernel, b, sq, seqlen_k, num_splits) -> int:
    key = (kernel, b, sq, seqlen_k, num_splits)
    n = _WORKSPACE_BYTES.get(key)
    if n is None:
        if len(_WORKSPACE_BYTES) >= 4096:  # lengths that grow step by step keep it bounded
            _WORKSPACE_BYTES.clear()
        n = _WORKSPACE_BYTES[key] = kernel.workspace_bytes(b, sq, seqlen_k, num_splits)
    return n


class Prepared:
    """What a signature's first call left: its kernel, its argument struct as bytes (stale pointers), the sizes of
    what each call allocates, and what a later call's keys may be (max_keys; decode: the sizes its workspace follows
    with them, None for the kernels that take none)."""
    __slots__ = ("forward", "handle", "kernel", "template", "o_shape", "lse_shape", "dtype", "device", "decode",
                 "max_keys")

    def __init__(self, kernel, args, o, lse, decode, max_keys):
        self.kernel = kernel  # holds the handle alive
        self.forward, self.handle = kernel._forward, kernel._handle
        self.template = bytes(args)
        self.decode, self.max_keys = decode, max_keys
        self.o_shape, self.dtype, self.device = tuple(o.shape), o.dtype, o.device
        self.lse_shape = None if lse is None else tuple(lse.shape)


def table() -> dict:
    runtime = _api._default or _api.default_runtime()
    return runtime.__dict__.setdefault("_torch_prepared", {})


def meta(t):
    """A tensor's part of a signature (None stays None)."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def plain_options(causal, softmax_scale, softcap, window_size, *flags) -> bool:
    """Whether the options have the exact types a signature may hold: equal values of other types (1 for True, 1.0
    for -1 in a window) would match a checked signature without being checked themselves."""
    if not (causal is True or causal is False) or not (softmax_scale is None or type(softmax_scale) is float):
        return False
    if type(softcap) is not float or type(window_size) is not tuple or len(window_size) != 2:
        return False
    if type(window_size[0]) is not int or type(window_size[1]) is not int:
        return False
    return all(f is True or f is False for f in flags)


def on_current_device(q) -> bool:
    """Prepared kernels launch in the current context: q's device must be the current one (else the full path
    switches to it)."""
    return q.device.index == torch.cuda.current_device()


def store(key, record, o, lse, max_keys=INT32_MAX) -> None:
    """Keeps the struct a full call recorded (record: [(kernel, args, decode)] after its launch; decode: (batch,
    seqlen_q, num_splits) where the workspace follows the keys' count, else None) for its key, unless the key has one:
    a full call after a refused prepared launch may have taken another kernel for that pointer."""
    t = table()
    if key is None or not record or key in t:
        return
    if len(t) >= _MAX_ENTRIES:
        t.clear()
    kernel, args, decode = record[-1]
    t[key] = Prepared(kernel, args, o, lse, decode, max_keys)


def launch(p: Prepared, q, k, v, want_lse, seqlen_k, kv_layout=False, seqlens=None, block_table=None, sinks=None,
           alibi_slopes=None, k_new=None, v_new=None):
    """O (and LSE with want_lse) of a call whose signature `p` was made from, over seqlen_k keys (1..p.max_keys:
    the caller checks). kv_layout: k and v's strides are this call's (rtattn.attention's keys, whose length is not
    in the signature), else the signature's. sinks: already float32 and contiguous (_sinks_f32), as the signature's
    first call passed them. k_new, v_new: an append's new rows (their layout the signature's)."""
    o = torch.empty(p.o_shape, dtype=p.dtype, device=p.device)
    a = _lib.ForwardArgs.from_buffer_copy(p.template)
    a.q.ptr, a.o.ptr = q.data_ptr(), o.data_ptr()
    if kv_layout:
        a.k, a.v = tensor_arg(k), tensor_arg(v)
    else:
        a.k.ptr, a.v.ptr = k.data_ptr(), v.data_ptr()
    a.seqlen_k = seqlen_k
    if seqlens is not None:
        a.seqlens_k = seqlens.data_ptr()
    if block_table is not None:
        a.block_table = block_table.data_ptr()
    if k_new is not None:
        a.k_new.ptr, a.v_new.ptr = k_new.data_ptr(), v_new.data_ptr()
    ws_bytes = 0 if p.decode is None else workspace_bytes(p.kernel, p.decode[0], p.decode[1], seqlen_k, p.decode[2])
    return o, _finish(p, a, p.lse_shape if want_lse else None, sinks, alibi_slopes, ws_bytes)


def launch_varlen(p: Prepared, q, k, v, want_lse, max_q, max_k, cu_q, cu_k, sinks=None, alibi_slopes=None):
    """launch() for a packed batch (attention_varlen): every sequence's count and length per call (the totals and
    the longest of each, 1..INT32_MAX: the caller checks), the layouts the call's."""
    total_q, total_k = q.shape[0], k.shape[0]
    o = torch.empty((total_q,) + p.o_shape[1:], dtype=p.dtype, device=p.device)
    a = _lib.ForwardArgs.from_buffer_copy(p.template)
    a.q, a.k, a.v, a.o = packed_arg(q), packed_arg(k), packed_arg(v), packed_arg(o)
    a.seqlen_q, a.seqlen_k, a.total_q, a.total_k = max_q, max_k, total_q, total_k
    a.cu_seqlens_q, a.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    return o, _finish(p, a, (p.lse_shape[0], total_q) if want_lse else None, sinks, alibi_slopes, 0)


def _finish(p: Prepared, a, lse_shape, sinks, alibi_slopes, ws_bytes):
    """The LSE, the options' pointers and the workspace, then the launch; returns the LSE (None without)."""
    lse = None
    if lse_shape is not None:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=p.device)
        a.lse = lse.data_ptr()
    if sinks is not None:
        a.sinks = sinks.data_ptr()
    if alibi_slopes is not None:
        a.alibi_slopes = alibi_slopes.data_ptr()
    if ws_bytes:
        # Freed as this returns: torch's allocator orders its reuse after the launch on this stream.
        workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=p.device)
        a.workspace, a.workspace_bytes = workspace.data_ptr(), ws_bytes
    else:
        a.workspace, a.workspace_bytes = None, 0
    status = p.forward(p.handle, ctypes.byref(a), raw_stream(p.device.index))
    if status:
        _api._raise(status)
    return lse
