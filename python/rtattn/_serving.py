"""Packed sequences and serving for PyTorch, over the C ABI, in FlashAttention's conventions:

- attention_varlen: flash_attn_varlen_func's packed batch ([total, heads, dim] with cu_seqlens), differentiable
  (custom ops "rtattn::attention_varlen" and "rtattn::attention_varlen_backward", autograd between them);
- attention_with_kvcache: flash_attn_with_kvcache's attention against a dense or paged KV cache, with its KV append
  (inference only);
- merge_states: two attention states (O, LSE) of the same rows over different keys merged into one (cascade
  attention, ring attention).

Every op is a torch.library custom op with a fake implementation, so torch.compile traces it and CUDA graphs capture
it; workspaces come from torch's caching allocator."""
import ctypes
from typing import Optional, Tuple

import torch

from . import _lib
from ._api import MAX_SPLITS, ArgumentError
from ._convert import INT32_MAX, boolean, fill, integer
from ._torch import (_ARGS_SIZE, _BWD_ARGS_SIZE, _DECODE_MAX_Q, _DTYPES, _alibi_args, _alibi_flag, _bwd_sinks_args,
                     _cached, _check_alibi, _check_scale, _check_sinks, _check_softcap, _dsinks_out, _keyless_dsinks,
                     _keyless_lse, _local, _plain_eager, _raw_stream, _sinks_args, _sinks_f32, _sinks_flag,
                     _softcap_args, _softcap_flag, _tensor, _window, _window_args)
from . import _prepared  # after _torch, whose torch version check comes first: it reads torch._C

_MERGE_ARGS_SIZE = ctypes.sizeof(_lib.MergeArgs)


_packed = _prepared.packed_arg


def _tail(t: torch.Tensor):
    """A packed tensor's part of a signature: all but its total and its layout (set per call)."""
    return t.shape[1:], t.stride(-1), t.dtype, t.device


def _check_inputs(tensors, dims: int, layout: str) -> None:
    q = tensors[0][1]
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{name}: expected a torch.Tensor, got {type(t).__name__}", name)
        if t.dim() != dims:
            raise ArgumentError(f"{name}: expected {dims} dims {layout}, got shape {tuple(t.shape)}", name)
        if t.dtype not in _DTYPES:
            raise ArgumentError(f"{name}: dtype {t.dtype} is not supported; allowed torch.float16, torch.bfloat16",
                                name)
        if t.dtype != q.dtype:
            raise ArgumentError(f"{name}: dtype {t.dtype} differs from {tensors[0][0]}'s {q.dtype}", name)
        if t.device.type not in ("cuda", "meta") or t.device != q.device:
            raise ArgumentError(f"{name}: is on {t.device}; expected CUDA tensors on one device ({q.device})", name)
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ArgumentError(f"{name}: the last (head_dim) dim must be contiguous (stride 1); strides are "
                                f"{tuple(t.stride())}", name)


def _check_int32(name: str, t, q: torch.Tensor, length: Optional[int] = None, dims: int = 1) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims:
        raise ArgumentError(f"{name}: expected a {dims}-dim torch.int32 tensor, got "
                            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}", name)
    if t.device != q.device:
        raise ArgumentError(f"{name}: is on {t.device}, q on {q.device} (the offsets are read on the device)", name)
    if length is not None and t.shape[0] != length:
        raise ArgumentError(f"{name}: has {t.shape[0]} entries; expected {length}", name)
    if dims == 1 and t.shape[0] > 1 and t.stride(0) != 1:  # the kernels read entry i at i (FlashAttention: the same)
        raise ArgumentError(f"{name}: must be contiguous (stride 1), as the kernels read it; stride is {t.stride(0)}",
                            name)


def _on_device(q: torch.Tensor, fn, *args):
    """Runs fn with q's device current: kernels are loaded into, and launched in, its context."""
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return fn(*args)
    return fn(*args)


# ---- varlen ----------------------------------------------------------------------------------------------------------

def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale):
    """Returns max_seqlen_q and max_seqlen_k as Python ints (the op's schema takes no numpy int)."""
    _check_inputs((("q", q), ("k", k), ("v", v)), 3, "[total_tokens, heads, head_dim]")
    _check_int32("cu_seqlens_q", cu_seqlens_q, q)
    _check_int32("cu_seqlens_k", cu_seqlens_k, q, cu_seqlens_q.shape[0])
    if cu_seqlens_q.shape[0] < 2:
        raise ArgumentError("cu_seqlens_q: needs batch + 1 >= 2 entries", "cu_seqlens_q")
    max_seqlen_q, max_seqlen_k = (integer(name, x, ArgumentError, 0, INT32_MAX) for name, x in
                                  (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)))
    if k.shape[2] != q.shape[2]:
        raise ArgumentError(f"k: head_dim {k.shape[2]} differs from q's {q.shape[2]}", "k")
    if tuple(v.shape[:2]) != tuple(k.shape[:2]):
        raise ArgumentError(f"v: shape {tuple(v.shape)} must match k's [total_k, heads_kv] = {tuple(k.shape[:2])}", "v")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ArgumentError(f"k: q's heads ({q.shape[1]}) must be a multiple of k's heads ({k.shape[1]})", "k")
    _check_scale(causal, softmax_scale)
    return max_seqlen_q, max_seqlen_k


def _varlen_fields(q, k, cu_q, cu_k, max_q, max_k) -> dict:
    return dict(batch=cu_q.shape[0] - 1, seqlen_q=max_q, seqlen_k=max_k, cu_seqlens_q=cu_q.data_ptr(),
                cu_seqlens_k=cu_k.data_ptr(), total_q=q.shape[0], total_k=k.shape[0])


def _varlen_run(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window=(-1, -1), sinks=None, softcap=0.0,
                alibi_slopes=None, want_lse=True, record=None):
    """O and LSE (None without want_lse). record: a list that gets the launch's (kernel, args, None: no workspace),
    for _prepared.store."""
    tq, hq, d = q.shape
    tk, hkv, dv = k.shape[0], k.shape[1], v.shape[2]
    o = torch.empty((tq, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device) if want_lse else None
    if tq == 0 or max_q == 0:
        return o, lse
    if tk == 0 or max_k == 0:  # no sequence has a key: the library's convention for keyless rows
        return o.zero_(), lse if lse is None else _keyless_lse(lse, sinks, (hq, 1))
    sinks = _sinks_f32(sinks)
    kernel = _cached("get", q.device, q.dtype, d, dv, hq, hkv, causal, scale,
                     ("varlen",) + _local(causal, *window) + _sinks_flag(sinks) + _softcap_flag(softcap) +
                     _alibi_flag(alibi_slopes))
    args = fill(_lib.ForwardArgs(_ARGS_SIZE, _packed(q), _packed(k), _packed(v), _packed(o),
                                 lse.data_ptr() if want_lse else None),
                ArgumentError, **_varlen_fields(q, k, cu_q, cu_k, max_q, max_k), **_window_args(causal, *window),
                **_sinks_args(sinks), **_softcap_args(softcap), **_alibi_args(alibi_slopes))
    kernel.launch(args, _raw_stream(q.device.index))
    if record is not None:
        record.append((kernel, args, None))
    return o, lse


@torch.library.custom_op("rtattn::attention_varlen", mutates_args=(), device_types="cuda")
def _varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
               softmax_scale: Optional[float], deterministic: bool, window_left: int = -1,
               window_right: int = -1, sinks: Optional[torch.Tensor] = None,
               softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
    return _on_device(q, _varlen_run, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                      softmax_scale, (window_left, window_right), sinks, _check_softcap(softcap), alibi_slopes)


@_varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                 deterministic, window_left=-1, window_right=-1, sinks=None, softcap=0.0, alibi_slopes=None):
    _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
    return (q.new_empty((q.shape[0], q.shape[1], v.shape[2])),
            q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))


def _varlen_backward_run(dout, q, k, v, o, lse, dlse, cu_q, cu_k, max_q, max_k, causal, scale, deterministic,
                         window=(-1, -1), sinks=None, want_dsinks=False, softcap=0.0, alibi_slopes=None):
    tq, hq, d = q.shape
    tk, hkv, dv = k.shape[0], k.shape[1], v.shape[2]
    dq, dk, dvv = torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty(
        (tk, hkv, d), dtype=q.dtype, device=q.device), torch.empty((tk, hkv, dv), dtype=q.dtype, device=q.device)
    dsinks = _dsinks_out(sinks, want_dsinks, hq, q)
    if tq == 0 or tk == 0 or max_q == 0 or max_k == 0:  # no (query, key) pair: every gradient but the sinks' is zero
        # max_q 0: the forward computed no row, so no LSE there took a sink.
        return dq.zero_(), dk.zero_(), dvv.zero_(), _keyless_dsinks(dsinks, dlse if max_q else None, (1,))
    sinks = _sinks_f32(sinks)
    kernel = _cached("get_backward", q.device, q.dtype, d, dv, hq, hkv, causal, scale,
                     ("varlen",) + _local(causal, *window) + _sinks_flag(sinks) + _softcap_flag(softcap) +
                     _alibi_flag(alibi_slopes))
    batch = cu_q.shape[0] - 1
    workspace = torch.empty(kernel.workspace_bytes(batch, max_q, max_k), dtype=torch.uint8, device=q.device)
    args = fill(_lib.BackwardArgs(_BWD_ARGS_SIZE, _packed(q), _packed(k), _packed(v), _packed(o), _packed(dout),
                                  lse.data_ptr(), dlse.data_ptr() if dlse is not None else None, _packed(dq),
                                  _packed(dk), _packed(dvv)), ArgumentError, workspace=workspace.data_ptr(),
                workspace_bytes=workspace.numel(), deterministic=int(deterministic),
                **_varlen_fields(q, k, cu_q, cu_k, max_q, max_k), **_window_args(causal, *window),
                **_bwd_sinks_args(sinks, dsinks), **_softcap_args(softcap), **_alibi_args(alibi_slopes))
    kernel.launch(args, _raw_stream(q.device.index))
    return dq, dk, dvv, dsinks


@torch.library.custom_op("rtattn::attention_varlen_backward", mutates_args=(), device_types="cuda")
def _varlen_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        lse: torch.Tensor, dlse: Optional[torch.Tensor], cu_seqlens_q: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                        softmax_scale: Optional[float], deterministic: bool, window_left: int = -1,
                        window_right: int = -1, sinks: Optional[torch.Tensor] = None, want_dsinks: bool = False,
                        softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # The fourth output, dsinks, softcap and alibi_slopes (the forward's), as rtattn::attention_backward's.
    softcap = _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
    if dout.stride(-1) != 1 and dout.shape[-1] > 1:
        dout = dout.contiguous()
    if dlse is not None:
        dlse = dlse.float().contiguous()
    return _on_device(q, _varlen_backward_run, dout, q, k, v, o, lse, dlse, cu_seqlens_q, cu_seqlens_k,
                      max_seqlen_q, max_seqlen_k, causal, softmax_scale, deterministic, (window_left, window_right),
                      sinks, want_dsinks, softcap, alibi_slopes)


@_varlen_backward_op.register_fake
def _varlen_backward_fake(dout, q, k, v, o, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          causal, softmax_scale, deterministic, window_left=-1, window_right=-1, sinks=None,
                          want_dsinks=False, softcap=0.0, alibi_slopes=None):
    _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsinks_out(sinks, want_dsinks, q.shape[1], q))


def _varlen_setup(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, deterministic, window_left, window_right, sinks, softcap,
     alibi_slopes) = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_q, cu_k, sinks, alibi_slopes)
    ctx.sizes = (max_q, max_k, causal, scale, deterministic, window_left, window_right)
    ctx.softcap = softcap
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, cu_q, cu_k, sinks, alibi_slopes = ctx.saved_tensors
    none = (None,) * 9
    if grad_o is None and grad_lse is None:
        return (None, None, None) + none + (None, None, None)
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    max_q, max_k, causal, scale, deterministic, window_left, window_right = ctx.sizes
    want_dsinks = sinks is not None and ctx.needs_input_grad[12]
    dq, dk, dv, dsinks = torch.ops.rtattn.attention_varlen_backward(grad_o, q, k, v, o, lse, grad_lse, cu_q, cu_k,
                                                                    max_q, max_k, causal, scale, deterministic,
                                                                    window_left, window_right, sinks, want_dsinks,
                                                                    ctx.softcap, alibi_slopes)
    # float32 from the kernels; autograd wants the gradient in the dtype of the sinks given. No gradient for the
    # slopes (constants, as in FlashAttention).
    return (dq, dk, dv) + none + (dsinks.to(sinks.dtype) if want_dsinks else None, None, None)


_varlen_op.register_autograd(_varlen_backward, setup_context=_varlen_setup)


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, causal: bool = False,
                     softmax_scale: Optional[float] = None, return_lse: bool = False, deterministic: bool = False,
                     window_size: Tuple[int, int] = (-1, -1), sinks: Optional[torch.Tensor] = None,
                     softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None):
    """Attention over a packed batch of sequences of different lengths (FlashAttention's flash_attn_varlen_func),
    differentiable.

    q: [total_q, heads_q, head_dim], k: [total_k, heads_kv, head_dim], v: [total_k, heads_kv, head_dim_v]; sequence b
    is rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q (cu_seqlens_k: of k and v), int32 CUDA tensors of batch + 1
    entries. max_seqlen_q/k: the longest sequences (host ints; they size the grid, so pass the true maxima: rows of a
    longer sequence past them are not computed). Causal aligns bottom-right per sequence. Returns o [total_q, heads_q,
    head_dim_v] and, with return_lse, the float32 LSE [heads_q, total_q]. The offsets are not checked (they are on the
    device); the kernels clamp them into the tensors, so wrong offsets give wrong rows but no stray memory access.
    window_size = (left, right): a sliding window per sequence, as rtattn.attention's. sinks: [heads_q] attention
    sinks, as rtattn.attention's (differentiable; a sequence without keys gives O = 0, LSE = the sink). softcap:
    logit softcapping, as rtattn.attention's (differentiable). alibi_slopes: ALiBi, as rtattn.attention's: float32
    [heads_q] or [batch, heads_q] (batch = the number of sequences), the distance per sequence (bottom-right
    aligned); no gradient for the slopes."""
    eager = _plain_eager(q, k, v, sinks, alibi_slopes) and type(cu_seqlens_q) is torch.Tensor and \
        type(cu_seqlens_k) is torch.Tensor
    key = None
    if eager and q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and type(max_seqlen_q) is int and \
            type(max_seqlen_k) is int and _prepared.plain_options(causal, softmax_scale, softcap, window_size,
                                                                 return_lse, deterministic) and \
            _prepared.on_current_device(q):
        # The totals, the longest sequences and the layouts stay out of the signature: a server's batches differ in
        # every one of them.
        key = ("varlen", _tail(q), _tail(k), _tail(v), _prepared.meta(cu_seqlens_q), _prepared.meta(cu_seqlens_k),
               _prepared.meta(sinks), _prepared.meta(alibi_slopes), causal, softmax_scale, softcap, window_size,
               return_lse)
        p = _prepared.table().get(key)
        if p is not None and v.shape[0] == k.shape[0] and 0 < q.shape[0] <= INT32_MAX and \
                0 < k.shape[0] <= INT32_MAX and 0 < max_seqlen_q <= INT32_MAX and 0 < max_seqlen_k <= INT32_MAX:
            # This signature's checks passed before: allocate, set the pointers and sizes, launch.
            try:
                o, lse = _prepared.launch_varlen(p, q, k, v, return_lse, max_seqlen_q, max_seqlen_k, cu_seqlens_q,
                                                 cu_seqlens_k, _sinks_f32(sinks), alibi_slopes)
                return (o, lse) if return_lse else o
            except ArgumentError:  # a pointer the kernel refuses: the full path names it
                pass
    max_seqlen_q, max_seqlen_k = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               causal, softmax_scale)
    _check_sinks(sinks, q, q.shape[1])
    _check_alibi(alibi_slopes, q, cu_seqlens_q.shape[0] - 1, q.shape[1])
    boolean("deterministic", deterministic, ArgumentError)
    boolean("return_lse", return_lse, ArgumentError)
    window = _window(window_size, causal)
    softcap = _check_softcap(softcap)
    if eager:
        # The op's body without the dispatcher (nothing to record for autograd, as rtattn.attention's eager path);
        # the launch's struct kept for the signature's next calls.
        record = [] if key is not None else None
        o, lse = _on_device(q, _varlen_run, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                            softmax_scale, window, sinks, softcap, alibi_slopes, return_lse, record)
        _prepared.store(key, record, o, lse)
        return (o, lse) if return_lse else o
    o, lse = torch.ops.rtattn.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                               causal, softmax_scale, deterministic, *window, sinks, softcap,
                                               alibi_slopes)
    return (o, lse) if return_lse else o


# ---- decode from a KV cache ------------------------------------------------------------------------------------------

def _kvcache_run(q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal, scale, num_splits,
                 window=(-1, -1), sinks=None, softcap=0.0, alibi_slopes=None, k_new=None, v_new=None, want_lse=True,
                 record=None):
    """O and LSE (None without want_lse: the eager callers that return no LSE skip its allocation). record: a list
    that gets the launch's (kernel, args, the sizes its workspace follows), for _prepared.store."""
    b, sq, hq, d = q.shape
    hkv, dv = k_cache.shape[2], v_cache.shape[3]
    o = torch.empty((b, sq, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if want_lse else None
    s_new = 0 if k_new is None else k_new.shape[1]
    if b == 0 or (sq == 0 and s_new == 0):
        return o, lse
    if max_seqlen_k == 0:  # no key anywhere (an append is refused before: it needs room)
        return o.zero_(), lse if lse is None else _keyless_lse(lse, sinks, (1, hq, 1))
    # Up to 16 query tokens: the decode kernels (split-KV); more: a prefill kernel reading the cache (chunked
    # prefill: the queries are the last seqlen_q of each sequence's keys; causal aligns them bottom-right), through the
    # block table or, dense, with each sequence's length.
    decode = sq <= _DECODE_MAX_Q
    paged = block_table is not None
    flags = (("decode",) if decode else ()) + (("paged_kv",) if paged else ())
    sinks = _sinks_f32(sinks)
    flags += _local(causal, *window) + _sinks_flag(sinks) + _softcap_flag(softcap) + _alibi_flag(alibi_slopes)
    kernel = _cached("get", q.device, q.dtype, d, dv, hq, hkv, causal, scale, flags)
    ws_bytes = _prepared.workspace_bytes(kernel, b, max(sq, 1), max_seqlen_k, num_splits)
    workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=q.device) if ws_bytes else None
    fields = {}
    if paged:
        fields = dict(block_table=block_table.data_ptr(), block_table_stride=block_table.stride(0),
                      pages_per_seq=block_table.shape[1], page_size=k_cache.shape[1], num_pages=k_cache.shape[0])
    k_arg, v_arg = _tensor(k_cache), _tensor(v_cache)
    if paged:  # a page's stride is needed even for one page
        k_arg.batch_stride, v_arg.batch_stride = k_cache.stride(0), v_cache.stride(0)
    if s_new:
        fields.update(k_new=_tensor(k_new), v_new=_tensor(v_new), seqlen_new=s_new)
    lse_ptr = lse.data_ptr() if want_lse else None
    args = fill(_lib.ForwardArgs(_ARGS_SIZE, _tensor(q), k_arg, v_arg, _tensor(o), lse_ptr), ArgumentError,
                batch=b, seqlen_q=max(sq, 1), seqlen_k=max_seqlen_k,
                seqlens_k=cache_seqlens.data_ptr() if cache_seqlens is not None else None, num_splits=num_splits,
                workspace=workspace.data_ptr() if ws_bytes else None, workspace_bytes=ws_bytes, **fields,
                **_window_args(causal, *window), **_sinks_args(sinks), **_softcap_args(softcap),
                **_alibi_args(alibi_slopes))
    if sq == 0:  # an append alone: the rows are written, then one dummy query token attends into a scratch output
        q1 = torch.zeros((b, 1, hq, d), dtype=q.dtype, device=q.device)
        o1 = torch.empty((b, 1, hq, dv), dtype=q.dtype, device=q.device)
        args.q, args.o, args.lse = _tensor(q1), _tensor(o1), None
    kernel.launch(args, _raw_stream(q.device.index))
    if record is not None and sq > 0:
        record.append((kernel, args, (b, sq, num_splits)))
    return o, lse


@torch.library.custom_op("rtattn::attention_with_kvcache", mutates_args=(), device_types="cuda")
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], max_seqlen_k: int, causal: bool, softmax_scale: Optional[float],
                num_splits: int, window_left: int = -1, window_right: int = -1,
                sinks: Optional[torch.Tensor] = None, softcap: float = 0.0,
                alibi_slopes: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    return _on_device(q, _kvcache_run, q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal,
                      softmax_scale, num_splits, (window_left, window_right), sinks, _check_softcap(softcap),
                      alibi_slopes)


def _kvcache_fake(q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal, softmax_scale, num_splits,
                  window_left=-1, window_right=-1, sinks=None, softcap=0.0, alibi_slopes=None, *new):
    _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    b, sq, hq, _ = q.shape
    return q.new_empty((b, sq, hq, v_cache.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32)


_kvcache_op.register_fake(_kvcache_fake)


# The same call with the new tokens' K/V appended into the cache first (flash_attn_with_kvcache's k= / v=): an op of
# its own, since it writes k_cache and v_cache (torch.compile must know), while the plain one keeps the caches
# read-only (a mutating op's functionalization could copy a whole cache).
@torch.library.custom_op("rtattn::attention_with_kvcache_append", mutates_args=("k_cache", "v_cache"),
                         device_types="cuda")
def _kvcache_append_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                       block_table: Optional[torch.Tensor], max_seqlen_k: int, causal: bool,
                       softmax_scale: Optional[float], num_splits: int, window_left: int,
                       window_right: int, sinks: Optional[torch.Tensor], softcap: float,
                       alibi_slopes: Optional[torch.Tensor], k: torch.Tensor,
                       v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    # Here, not in attention_with_kvcache: torch.compile traces that function and cannot trace ctypes (fullgraph
    # failed on it); an op's body runs as it is.
    if not _library_appends():
        raise ArgumentError("k: the loaded librtattn predates the KV append (k, v); upgrade it", "k")
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    return _on_device(q, _kvcache_run, q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal,
                      softmax_scale, num_splits, (window_left, window_right), sinks, _check_softcap(softcap),
                      alibi_slopes, k, v)


_kvcache_append_op.register_fake(_kvcache_fake)


_LIB_ARGS_SIZE = []  # the loaded librtattn's own rtattn_forward_args size, once asked

# Where it is missing (another torch version), appends take the op, whose mutates_args bumps the counters.
_increment_version = getattr(getattr(torch.autograd, "graph", None), "increment_version", None)


def _written(k_cache, v_cache) -> None:
    """An eager append wrote the caches: their version counters move, so autograd refuses a backward through a tensor
    saved before the write, as after any in-place op. Inference tensors (a cache made under torch.inference_mode)
    have no counter, and nothing saved for a backward can hold them."""
    for t in (k_cache, v_cache):
        if not t.is_inference():
            _increment_version(t)


def _library_appends() -> bool:
    """Whether the loaded librtattn reads the append's fields: an older one reads its own, shorter struct and would
    drop them without a word."""
    if not _LIB_ARGS_SIZE:
        a = _lib.ForwardArgs()
        _lib.lib.rtattn_forward_args_init(ctypes.byref(a))
        _LIB_ARGS_SIZE.append(a.struct_size)
    return _LIB_ARGS_SIZE[0] >= _lib.ForwardArgs.seqlen_new.offset + ctypes.sizeof(ctypes.c_int32)


def _check_new_kv(k, v, q, k_cache, v_cache, cache_seqlens):
    """The new tokens' K/V of an append: [batch, seqlen_new, heads_kv, head_dim(_v)], as the cache's rows."""
    if (k is None) != (v is None):
        name = "v" if k is not None else "k"
        raise ArgumentError(f"{name}: is None while {'k' if name == 'v' else 'v'} is given; an append takes both "
                            "(the new tokens' K and V)", name)
    if k is None:
        return
    _check_inputs((("q", q), ("k", k), ("v", v)), 4, "[batch, seqlen_new, heads_kv, head_dim]")
    want_k = (q.shape[0], k.shape[1], k_cache.shape[2], k_cache.shape[3])
    want_v = want_k[:3] + (v_cache.shape[3],)
    for name, t, want in (("k", k, want_k), ("v", v, want_v)):
        if tuple(t.shape) != want:
            raise ArgumentError(f"{name}: shape {tuple(t.shape)}; expected {want} ([batch, seqlen_new, heads_kv, "
                                f"head_dim] as q and the cache)", name)
    if cache_seqlens is None:
        raise ArgumentError("cache_seqlens: is None; an append (k, v) writes each sequence's new tokens after its "
                            "cache_seqlens cached ones", "cache_seqlens")


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens=None, block_table: Optional[torch.Tensor] = None,
                           causal: bool = False, softmax_scale: Optional[float] = None, num_splits: int = 0,
                           max_seqlen_k: Optional[int] = None, return_lse: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), sinks: Optional[torch.Tensor] = None,
                           softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None,
                           k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None):
    """Attention of new query tokens against each sequence's cached keys (FlashAttention's flash_attn_with_kvcache):
    decode (1..16 query tokens: the split-KV decode kernels) or any number (a prefill kernel reading the cache, e.g.
    chunked prefill), optionally appending the new tokens' K/V into the cache first.

    q: [batch, seqlen_q, heads_q, head_dim]: the last seqlen_q tokens of each sequence (causal aligns them
    bottom-right: speculative decoding, chunked prefill). Dense cache: k_cache/v_cache [batch, capacity, heads_kv,
    head_dim(_v)]. Paged (block_table given, int32 [batch, max_pages]): k_cache/v_cache [num_pages, page_size,
    heads_kv, head_dim(_v)], page_size a power of two up to 65536 (1 works). cache_seqlens: int32 [batch] on the
    device (or a Python int for all), the keys each sequence has cached (None: the whole capacity). k, v: optional
    [batch, seqlen_new, heads_kv, head_dim(_v)], the new tokens' K/V, written into the cache (which this call
    modifies) at rows cache_seqlens .. cache_seqlens + seqlen_new - 1 before attending over cache_seqlens +
    seqlen_new keys, as FlashAttention's (cache_seqlens is not updated: the caller adds seqlen_new); rows past the
    capacity (or max_seqlen_k) are dropped. max_seqlen_k: a host bound on the lengths (after the append; default: the
    capacity); it and the sizes fix the split-KV count, never the device values, so a captured CUDA graph stays
    valid as lengths change; num_splits fixes it: 1..128, or 0 for the library's choice (more than 16 query tokens
    run no splits: 0 or 1). Inference only (no backward). Returns o [batch, seqlen_q, heads_q, head_dim_v] (and LSE
    [batch, heads_q, seqlen_q] with return_lse). window_size = (left, right): a sliding window, as rtattn.attention's
    (each query token's own, its diagonal its position among the sequence's keys); the split-KV count stays the
    library's choice for the whole cache, its splits cut the window. sinks: [heads_q] attention sinks, as
    rtattn.attention's (gpt-oss's decode). softcap: logit softcapping, as rtattn.attention's (Gemma 2's decode).
    alibi_slopes: ALiBi, float32 [heads_q] or [batch, heads_q] as rtattn.attention's; a token's query position is its
    place among its sequence's keys (cache_seqlens + seqlen_new - seqlen_q + t), as flash_attn_with_kvcache's."""
    eager = _plain_eager(q, k_cache, v_cache, sinks, alibi_slopes)
    key = None
    appends = type(k) is torch.Tensor and type(v) is torch.Tensor and k.dim() == 4 and k.shape[1] > 0 and not (
        torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)) and _increment_version is not None
    if eager and (appends or (k is None and v is None)) and type(num_splits) is int and all(
            t is None or type(t) is torch.Tensor for t in (cache_seqlens, block_table)) and (
            max_seqlen_k is None or type(max_seqlen_k) is int) and _prepared.plain_options(
            causal, softmax_scale, softcap, window_size, return_lse) and _prepared.on_current_device(q):
        # max_seqlen_k's value stays out of the signature (a server passes the batch's longest, step by step).
        key = ("kvcache", _prepared.meta(q), _prepared.meta(k_cache), _prepared.meta(v_cache),
               _prepared.meta(cache_seqlens), _prepared.meta(block_table), _prepared.meta(sinks),
               _prepared.meta(alibi_slopes), causal, softmax_scale, softcap, window_size, return_lse, num_splits,
               max_seqlen_k is None, _prepared.meta(k), _prepared.meta(v))
        p = _prepared.table().get(key)
        if p is not None:
            max_k = p.max_keys if max_seqlen_k is None else max_seqlen_k
            if 0 < max_k <= p.max_keys and (not appends or k.shape[1] <= max_k):
                # This signature's checks passed before: allocate, set the pointers, launch.
                try:
                    o, lse = _prepared.launch(p, q, k_cache, v_cache, return_lse, max_k, False, cache_seqlens,
                                              block_table, _sinks_f32(sinks), alibi_slopes, k, v)
                    if appends:
                        _written(k_cache, v_cache)
                    return (o, lse) if return_lse else o
                except ArgumentError:  # a pointer the kernel refuses: the full path names it
                    pass
    _check_inputs((("q", q), ("k_cache", k_cache), ("v_cache", v_cache)), 4, "[batch/pages, seq, heads, head_dim]")
    b = q.shape[0]
    _check_alibi(alibi_slopes, q, b, q.shape[2])
    if cache_seqlens is not None and not isinstance(cache_seqlens, torch.Tensor):
        n = integer("cache_seqlens", cache_seqlens, ArgumentError, 0, INT32_MAX)  # FlashAttention's int form
        cache_seqlens = torch.full((b,), n, dtype=torch.int32, device=q.device)
    if cache_seqlens is not None:
        _check_int32("cache_seqlens", cache_seqlens, q, b)
    if block_table is not None:
        _check_int32("block_table", block_table, q, b, dims=2)
        if block_table.stride(1) != 1 and block_table.shape[1] > 1:
            raise ArgumentError("block_table: rows must be contiguous (stride 1 along the pages)", "block_table")
        capacity = block_table.shape[1] * k_cache.shape[1]
    else:
        if k_cache.shape[0] != b:
            raise ArgumentError(f"k_cache: batch {k_cache.shape[0]} differs from q's {b} (dense cache)", "k_cache")
        capacity = k_cache.shape[1]
    if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]) or k_cache.shape[3] != q.shape[3]:
        raise ArgumentError(f"k_cache/v_cache: shapes {tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not match "
                            f"each other or q's head_dim {q.shape[3]}", "v_cache")
    if k_cache.shape[2] == 0 or q.shape[2] % k_cache.shape[2] != 0:
        raise ArgumentError(f"k_cache: q's heads ({q.shape[2]}) must be a multiple of the cache's heads "
                            f"({k_cache.shape[2]})", "k_cache")
    _check_new_kv(k, v, q, k_cache, v_cache, cache_seqlens)
    # A stride-0 (expanded) cache can claim any capacity: past int32 it is refused, not wrapped.
    max_seqlen_k = integer("max_seqlen_k", capacity if max_seqlen_k is None else max_seqlen_k, ArgumentError, 0,
                           min(capacity, INT32_MAX), f" (the cache's capacity is {capacity})")
    if k is not None and k.shape[1] > max_seqlen_k:
        raise ArgumentError(f"k: {k.shape[1]} new tokens do not fit max_seqlen_k {max_seqlen_k} (the lengths' bound "
                            "after the append)", "k")
    # Checked before the op sizes a workspace from it (10**6 splits would ask torch for terabytes).
    num_splits = integer("num_splits", num_splits, ArgumentError, 0, MAX_SPLITS, " (0: the library chooses)")
    _check_scale(causal, softmax_scale)
    _check_sinks(sinks, q, q.shape[2])
    softcap = _check_softcap(softcap)
    boolean("return_lse", return_lse, ArgumentError)
    window = _window(window_size, causal)
    # The sinks too: a model's sinks are parameters that require grad, and a gradient would be dropped silently.
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, sinks, k, v)):
        raise NotImplementedError("attention_with_kvcache is inference only (no backward): call it under "
                                  "torch.no_grad() or with tensors that do not require grad")
    plain = eager and all(t is None or type(t) is torch.Tensor for t in (cache_seqlens, block_table))
    if appends and plain:
        # The append op's body without the dispatcher (the caches' version counters bumped here, as the op's
        # mutates_args does); the launch's struct kept for the signature's next calls.
        if not _library_appends():
            raise ArgumentError("k: the loaded librtattn predates the KV append (k, v); upgrade it", "k")
        record = [] if key is not None else None
        o, lse = _on_device(q, _kvcache_run, q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal,
                            softmax_scale, num_splits, window, sinks, softcap, alibi_slopes, k, v, return_lse, record)
        _written(k_cache, v_cache)
        _prepared.store(key, record, o, lse, max_keys=min(capacity, INT32_MAX))
    elif k is not None and k.shape[1] > 0:
        o, lse = torch.ops.rtattn.attention_with_kvcache_append(q, k_cache, v_cache, cache_seqlens, block_table,
                                                                max_seqlen_k, causal, softmax_scale, num_splits,
                                                                *window, sinks, softcap, alibi_slopes, k, v)
    elif plain:
        # The op's body without the dispatcher's round trip, as rtattn.attention's eager path (its arguments are
        # checked above; the launch's struct kept for the signature's next calls).
        record = [] if key is not None else None
        o, lse = _on_device(q, _kvcache_run, q, k_cache, v_cache, cache_seqlens, block_table, max_seqlen_k, causal,
                            softmax_scale, num_splits, window, sinks, softcap, alibi_slopes, None, None, return_lse,
                            record)
        _prepared.store(key, record, o, lse, max_keys=min(capacity, INT32_MAX))
    else:
        o, lse = torch.ops.rtattn.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table,
                                                         max_seqlen_k, causal, softmax_scale, num_splits, *window,
                                                         sinks, softcap, alibi_slopes)
    return (o, lse) if return_lse else o


# ---- merging attention states ----------------------------------------------------------------------------------------

def _merge_run(o_a, lse_a, o_b, lse_b):
    o = torch.empty_like(o_a, memory_format=torch.contiguous_format)
    lse = torch.empty_like(lse_a, memory_format=torch.contiguous_format)
    if o.numel() == 0:
        return o, lse
    packed = o_a.dim() == 3
    heads, dv = o_a.shape[-2], o_a.shape[-1]
    # Any forward kernel of this dtype, d_v and head count carries the merge entry; the plain one is used.
    kernel = _cached("get", o_a.device, o_a.dtype, dv, dv, heads, heads, False, None)
    view = _packed if packed else _tensor
    args = fill(_lib.MergeArgs(_MERGE_ARGS_SIZE, view(o_a), view(o_b), view(o), lse_a.data_ptr(), lse_b.data_ptr(),
                               lse.data_ptr()), ArgumentError,
                batch=1 if packed else o_a.shape[0], seqlen=o_a.shape[0] if packed else o_a.shape[1])
    kernel.merge(args, _raw_stream(o_a.device.index))
    return o, lse


@torch.library.custom_op("rtattn::merge_states", mutates_args=(), device_types="cuda")
def _merge_op(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor,
              lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    return _on_device(o_a, _merge_run, o_a, lse_a.contiguous(), o_b, lse_b.contiguous())


@_merge_op.register_fake
def _merge_fake(o_a, lse_a, o_b, lse_b):
    return o_a.new_empty(o_a.shape), lse_a.new_empty(lse_a.shape)


def merge_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """Merges two attention states of the same query rows over different keys into the attention over both keys:
    o = (e^lse_a o_a + e^lse_b o_b) / (e^lse_a + e^lse_b), lse = log(e^lse_a + e^lse_b). What cascade attention
    (a shared prefix, then each request's own keys) and ring attention do between partial results.

    o_a, o_b: [batch, seqlen, heads, head_dim_v] with lse [batch, heads, seqlen] (attention's layout), or packed
    [total, heads, head_dim_v] with lse [heads, total] (attention_varlen's); float32 LSE. A row whose LSE is +inf
    (the library's mark of a query that saw no key) or -inf has weight 0. Returns (o, lse); no backward."""
    packed = isinstance(o_a, torch.Tensor) and o_a.dim() == 3
    _check_inputs((("o_a", o_a), ("o_b", o_b)), 3 if packed else 4,
                  "[total, heads, head_dim_v]" if packed else "[batch, seqlen, heads, head_dim_v]")
    if o_b.shape != o_a.shape:
        raise ArgumentError(f"o_b: shape {tuple(o_b.shape)} differs from o_a's {tuple(o_a.shape)}", "o_b")
    want = (o_a.shape[-2], o_a.shape[0]) if packed else (o_a.shape[0], o_a.shape[2], o_a.shape[1])
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != want:
            raise ArgumentError(f"{name}: expected a float32 tensor of shape {want}, got "
                                f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}", name)
        if t.device != o_a.device:
            raise ArgumentError(f"{name}: is on {t.device}, o_a on {o_a.device}", name)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (o_a, lse_a, o_b, lse_b)):
        raise NotImplementedError("merge_states has no backward: call it under torch.no_grad()")
    return torch.ops.rtattn.merge_states(o_a, lse_a, o_b, lse_b)
