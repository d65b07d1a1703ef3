"""rtattn.attention for PyTorch: torch.library custom ops ("rtattn::attention" and its backward,
"rtattn::attention_backward") over the C ABI, with fake (meta) implementations so that torch.compile traces a
training step without a graph break and CUDA graphs capture it; autograd connects the two.

Kernels are looked up once per (runtime, device, dtype, head dims, heads, causal, scale) and kept. A plain eager
call skips the dispatcher, and one that repeats an earlier call's signature its checks too (_prepared): the hot path
is a dict lookup, torch.empty for the outputs, a copy of the checked argument struct and one C call
(docs/PERFORMANCE.md: host cost per call)."""
import ctypes
import math
import numbers
import re
import threading
from typing import Optional, Tuple

import torch

from . import _api, _lib
from ._api import ArgumentError
from ._convert import FLOAT32_MAX, INT32_MAX, _shown, boolean, fill, integer, number

# torch.library.custom_op, and register_fake and register_autograd on what it returns, arrived in torch 2.4. An older
# torch gets this module's ImportError from the first torch op called; rtattn itself, and all it does without torch,
# still import and work.
MIN_TORCH = (2, 4)


def _has_custom_ops(version: str) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m[1]), int(m[2])) >= MIN_TORCH and hasattr(getattr(torch, "library", None), "custom_op")


if not _has_custom_ops(str(getattr(torch, "__version__", ""))):
    raise ImportError(f"rtattn's torch ops need torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (torch.library.custom_op); "
                      f"this is torch {getattr(torch, '__version__', '(no version)')}. rtattn's configs, plan, "
                      "precompile and info work with any torch, or none.")

from . import _prepared  # noqa: E402 (after the version check: it reads torch._C)

_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_lock = threading.Lock()


def _check(q, k, v, causal, softmax_scale) -> None:
    """Every argument, named, before anything reaches the library (it checks again, naming strides and pointers)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{name}: expected a torch.Tensor, got {type(t).__name__}", name)
        if t.dim() != 4:
            raise ArgumentError(f"{name}: expected 4 dims [batch, seqlen, heads, head_dim], got shape "
                                f"{tuple(t.shape)}", name)
        if t.dtype not in _DTYPES:
            raise ArgumentError(f"{name}: dtype {t.dtype} is not supported; allowed torch.float16, torch.bfloat16",
                                name)
        if t.device.type not in ("cuda", "meta"):
            raise ArgumentError(f"{name}: is on {t.device}; rtattn.attention needs CUDA tensors", name)
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            raise ArgumentError(f"{name}: the last (head_dim) dim must be contiguous (stride 1); strides are "
                                f"{tuple(t.stride())} (call .contiguous() or pass a view with a unit last stride)",
                                name)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ArgumentError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}", name)
        if t.device != q.device:
            raise ArgumentError(f"{name}: is on {t.device}, q on {q.device}", name)
    b, _, hq, d = q.shape
    if k.shape[0] != b:
        raise ArgumentError(f"k: batch {k.shape[0]} differs from q's {b}", "k")
    if k.shape[3] != d:
        raise ArgumentError(f"k: head_dim {k.shape[3]} differs from q's {d}", "k")
    if tuple(v.shape[:3]) != tuple(k.shape[:3]):
        raise ArgumentError(f"v: shape {tuple(v.shape)} must match k's [batch, seqlen_k, heads_kv] = "
                            f"{tuple(k.shape[:3])}", "v")
    hkv = k.shape[2]
    if hkv == 0 or hq % hkv != 0:
        raise ArgumentError(f"k: q's heads ({hq}) must be a multiple of k's heads ({hkv}) (GQA/MQA)", "k")
    _check_scale(causal, softmax_scale)


def _check_scale(causal, softmax_scale) -> None:
    """causal and softmax_scale, as every op takes them (the op's schema wants a bool and a Python int or float)."""
    boolean("causal", causal, ArgumentError)
    if softmax_scale is not None and not (isinstance(softmax_scale, (int, float)) and
                                          0 < number("softmax_scale", softmax_scale, ArgumentError) < math.inf):
        raise ArgumentError(f"softmax_scale: {softmax_scale!r} is not a finite number > 0", "softmax_scale")


def _window(window_size, causal) -> Tuple[int, int]:
    """FlashAttention's window_size = (left, right), -1 for an unbounded side, as two ints (the ops' schemas take
    them apart). Causal: the right bound is 0 (give 0 or -1)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ArgumentError(f"window_size: expected (left, right) with each -1 (unbounded) or more, got "
                            f"{window_size!r}", "window_size")
    left, right = (integer("window_size", x, ArgumentError, -1, INT32_MAX, " (-1: unbounded)") for x in window_size)
    if causal and right > 0:
        raise ArgumentError(f"window_size: right bound {right} with causal=True, which sees no key right of the "
                            "diagonal; give 0 or -1", "window_size")
    return left, right


def _local(causal, window_left, window_right) -> Tuple[str, ...]:
    """The config flag a window needs: none for (-1, -1), nor for causal's own (-1, 0 or -1)."""
    if window_left == -1 and (window_right == -1 or causal):
        return ()
    return ("local",)


def _window_args(causal, window_left, window_right) -> dict:
    """The argument fields of a window (a local kernel's), none otherwise (has_window 0: the struct's zeros)."""
    if not _local(causal, window_left, window_right):
        return {}
    return dict(has_window=1, window_size_left=window_left, window_size_right=window_right)


def _check_sinks(sinks, q, heads_q: int) -> None:
    """sinks: None, or one logit per query head on q's device. Any floating dtype is taken (gpt-oss checkpoints keep
    them in bf16); the kernels read float32, and the gradient comes back in the sinks' own dtype."""
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise ArgumentError(f"sinks: expected a torch.Tensor of shape ({heads_q},) (one logit per query head) or "
                            f"None, got {type(sinks).__name__}", "sinks")
    if not sinks.is_floating_point():
        raise ArgumentError(f"sinks: dtype {sinks.dtype} is not a floating dtype; give float32 (others are computed "
                            "in float32)", "sinks")
    if tuple(sinks.shape) != (heads_q,):
        raise ArgumentError(f"sinks: shape {tuple(sinks.shape)}; expected ({heads_q},), one logit per query head",
                            "sinks")
    if sinks.device != q.device:
        raise ArgumentError(f"sinks: is on {sinks.device}, q on {q.device}", "sinks")


def _sinks_flag(sinks) -> Tuple[str, ...]:
    return () if sinks is None else ("sinks",)


def _sinks_f32(sinks):
    """What the kernels read: float32 with a unit stride. The usual float32 parameter passes through uncopied; a copy
    lives until the caller returns, and torch's allocator orders its reuse after the launch on this stream."""
    if sinks is None or (sinks.dtype == torch.float32 and sinks.is_contiguous()):
        return sinks
    return sinks.float().contiguous()


def _sinks_args(sinks) -> dict:
    """The forward's sinks field (a float32 tensor from _sinks_f32), none without sinks (NULL: the struct's zero)."""
    return {} if sinks is None else dict(sinks=sinks.data_ptr())


def _keyless_lse(lse, sinks, head_shape):
    """The LSE of rows that see no key: +inf, or each head's sink (the only term of its denominator). head_shape:
    how the sinks broadcast over lse's layout, e.g. (1, heads, 1) for [batch, heads, seqlen]."""
    if sinks is None:
        return lse.fill_(math.inf)
    return lse.copy_(sinks.float().reshape(head_shape).expand_as(lse))


_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def _check_softcap(softcap) -> float:
    """softcap as the ops' schemas take it: a Python float, 0 for none (FlashAttention's softcap=0.0). A tensor is
    refused, not read: the cap gets no gradient, and reading it would synchronize with the device."""
    if type(softcap) is float and (softcap == 0 or _FLOAT32_MIN_NORMAL <= softcap <= FLOAT32_MAX):
        return softcap  # the usual call (every op call too): one comparison on the per-call path
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise ArgumentError(f"softcap: {_shown(softcap)} is not a real number; give a cap > 0, or 0 for none",
                            "softcap")
    cap = number("softcap", softcap, ArgumentError)
    if not 0 <= cap < math.inf:  # NaN fails this too
        raise ArgumentError(f"softcap: {cap!r} is not a finite number >= 0 (a cap > 0, or 0 for none)", "softcap")
    # The kernels take the cap as a float32: past its range it would become inf, below it 0.
    if cap and not _FLOAT32_MIN_NORMAL <= cap <= FLOAT32_MAX:
        raise ArgumentError(f"softcap: {cap!r} is outside float32's normal range (the kernels take a float32 cap)",
                            "softcap")
    return cap


def _softcap_flag(softcap: float) -> Tuple[str, ...]:
    return ("softcap",) if softcap else ()


def _softcap_args(softcap: float) -> dict:
    """The softcap field of the forward's and the backward's args (the backward takes the forward's cap); none for 0
    (the struct's zero, what a kernel without softcap wants)."""
    return dict(softcap=softcap) if softcap else {}


def _check_alibi(alibi_slopes, q, batch: int, heads_q: int) -> None:
    """alibi_slopes: None, or FlashAttention's ALiBi slopes on q's device: float32 [heads_q] (every sequence alike)
    or [batch, heads_q], the last dim contiguous. float32 only, as FlashAttention: the slopes are usually computed
    in float32 (2**(-8 h / heads)), and a 16-bit copy would move every bias far from the model's own."""
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, torch.Tensor):
        raise ArgumentError(f"alibi_slopes: expected a torch.Tensor of shape ({heads_q},) or ({batch}, {heads_q}) or "
                            f"None, got {type(alibi_slopes).__name__}", "alibi_slopes")
    if alibi_slopes.dtype != torch.float32:
        raise ArgumentError(f"alibi_slopes: dtype {alibi_slopes.dtype}; expected torch.float32 (as FlashAttention's)",
                            "alibi_slopes")
    if tuple(alibi_slopes.shape) not in ((heads_q,), (batch, heads_q)):
        raise ArgumentError(f"alibi_slopes: shape {tuple(alibi_slopes.shape)}; expected ({heads_q},) or "
                            f"({batch}, {heads_q}), one slope per query head (and sequence)", "alibi_slopes")
    if alibi_slopes.device != q.device:
        raise ArgumentError(f"alibi_slopes: is on {alibi_slopes.device}, q on {q.device}", "alibi_slopes")
    if alibi_slopes.stride(-1) != 1 and heads_q > 1:
        raise ArgumentError(f"alibi_slopes: the last (heads) dim must be contiguous (stride 1); strides are "
                            f"{tuple(alibi_slopes.stride())}", "alibi_slopes")
    # A batch stride of 0 (an expanded [heads_q] row) is every sequence alike, which the library takes; rows that
    # overlap otherwise are no layout it reads.
    if alibi_slopes.dim() == 2 and batch > 1 and 0 < alibi_slopes.stride(0) < heads_q:
        raise ArgumentError(f"alibi_slopes: rows overlap (stride {alibi_slopes.stride(0)} < {heads_q} heads)",
                            "alibi_slopes")


def _alibi_flag(alibi_slopes) -> Tuple[str, ...]:
    return () if alibi_slopes is None else ("alibi",)


def _alibi_args(alibi_slopes) -> dict:
    """The alibi fields of the forward's and the backward's args: the slopes and their batch stride (0 for [heads_q],
    and for a batch of one, whose row stride is never stepped over and may be anything); none without slopes."""
    if alibi_slopes is None:
        return {}
    s = alibi_slopes
    stride = s.stride(0) if s.dim() == 2 and s.shape[0] > 1 else 0
    return dict(alibi_slopes=s.data_ptr(), alibi_slopes_batch_stride=stride)


def _cached(kind: str, device: torch.device, dtype, d: int, dv: int, hq: int, hkv: int, causal: bool,
            scale: Optional[float], flags: Tuple[str, ...] = ()):
    """The runtime's kernel of `kind` ("get" or "get_backward") for this config, made once and kept on the runtime.
    flags: the config's fields set to True besides causal ("varlen", "decode", "paged_kv", "local", "sinks",
    "softcap", "alibi")."""
    runtime = _api._default or _api.default_runtime()
    kernels = runtime.__dict__.setdefault("_torch_kernels", {})
    key = (kind, device.index, dtype, d, dv, hq, hkv, causal, scale, flags)
    kernel = kernels.get(key)
    if kernel is None:
        with _lock:
            kernel = kernels.get(key)
            if kernel is None:
                # arch "" = the current device: the caller made q's device current.
                config = _api.AttentionConfig(head_dim_qk=d, head_dim_v=dv, dtype=_DTYPES[dtype], causal=causal,
                                              num_heads_q=hq, num_heads_kv=hkv, softmax_scale=scale,
                                              **{f: True for f in flags})
                kernel = kernels[key] = getattr(runtime, kind)(config)
    return kernel


def _kernel(*config) -> _api.Kernel:
    return _cached("get", *config)


def _backward_kernel(*config) -> _api.BackwardKernel:
    return _cached("get_backward", *config)


_tensor = _prepared.tensor_arg

_ARGS_SIZE = ctypes.sizeof(_lib.ForwardArgs)
_BWD_ARGS_SIZE = ctypes.sizeof(_lib.BackwardArgs)
_raw_stream = _prepared.raw_stream


# Few queries against many keys run the decode kernels: a KV group's query heads share one read of K/V and the keys
# split across CTAs, where the prefill kernel reads K/V once per query head into a mostly empty query tile (seqlen_q
# 1 against 4k-32k keys, H100: 0.39-0.41x cuDNN through it, against 0.84-0.90x). The same O and LSE, so the
# backward of such a call is unchanged.
_DECODE_MAX_Q = 16  # query tokens per sequence the decode kernels take (kDecodeMaxSeqlenQ)
_ROUTE_MIN_KEYS = 2048


_NO_DECODE = set()  # configs whose decode kernel cannot be had (cache-only mode, no tile, a compile error)


def _decode_route(q, k, v, causal, softmax_scale, window, sinks, softcap, alibi_slopes, want_lse=True, record=None):
    """O and LSE through the decode kernels, the whole K/V as a dense cache; None when they cannot serve the call
    (cache-only mode without their kernel, no decode tile for the config on this arch, or arguments only the prefill
    kernel takes): the prefill kernel runs instead, and refuses what it refuses."""
    from . import _serving  # it imports this module
    key = (q.device, q.dtype, q.shape[3], v.shape[3], q.shape[2], k.shape[2], causal, softmax_scale,
           _local(causal, *window), sinks is not None, bool(softcap), alibi_slopes is not None)
    if key in _NO_DECODE:
        return None
    try:
        return _serving._kvcache_run(q, k, v, None, None, k.shape[1], causal, softmax_scale, 0, window, sinks,
                                     softcap, alibi_slopes, want_lse=want_lse, record=record)
    except (_api.CacheMissError, _api.ConfigError, _api.CompileError):
        _NO_DECODE.add(key)  # asked again per call, a miss would cost a disk lookup and an exception each time
        return None
    except ArgumentError:  # this call's arguments (a layout the decode kernels refuse): the prefill kernel decides
        return None


def _run(q, k, v, causal, softmax_scale, return_lse, lse_placeholder, window=(-1, -1), sinks=None, softcap=0.0,
         alibi_slopes=None, record=None):
    """Allocates the outputs and launches on the current stream of q's device (made current by the caller). record:
    a list that gets the launch's (kernel, args, None: no workspace), for _prepared.store."""
    b, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    if 0 < sq <= _DECODE_MAX_Q and _ROUTE_MIN_KEYS <= sk <= INT32_MAX and b > 0:  # else: named errors below
        routed = _decode_route(q, k, v, causal, softmax_scale, window, sinks, softcap, alibi_slopes, return_lse,
                               record)
        if routed is not None:
            return routed[0], routed[1] if return_lse else lse_placeholder(q)
    o = torch.empty((b, sq, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device) if return_lse else lse_placeholder(q)
    if b == 0 or sq == 0:
        return o, lse
    if sk == 0:  # every query sees no key: the library's convention for such rows (with sinks: LSE = the sink)
        o.zero_()
        if return_lse:
            _keyless_lse(lse, sinks, (1, hq, 1))
        return o, lse
    sinks = _sinks_f32(sinks)
    kernel = _kernel(q.device, q.dtype, d, dv, hq, hkv, causal, softmax_scale,
                     _local(causal, *window) + _sinks_flag(sinks) + _softcap_flag(softcap) + _alibi_flag(alibi_slopes))
    # Sizes through fill(): a stride-0 expand makes a dim of 2**32 + 64 cost no memory, and ctypes would pass it as 64.
    args = fill(_lib.ForwardArgs(_ARGS_SIZE, _tensor(q), _tensor(k), _tensor(v), _tensor(o),
                                 lse.data_ptr() if return_lse else None),
                ArgumentError, batch=b, seqlen_q=sq, seqlen_k=sk, **_window_args(causal, *window),
                **_sinks_args(sinks), **_softcap_args(softcap), **_alibi_args(alibi_slopes))
    kernel.launch(args, _raw_stream(q.device.index))
    if record is not None:
        record.append((kernel, args, None))
    return o, lse


def _forward(q, k, v, causal, softmax_scale, return_lse, lse_placeholder, window=(-1, -1), sinks=None,
             softcap=0.0, alibi_slopes=None, record=None):
    _check(q, k, v, causal, softmax_scale)
    _check_sinks(sinks, q, q.shape[2])
    softcap = _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):  # the kernel is loaded into, and launched in, q's device's context
            return _run(q, k, v, causal, softmax_scale, return_lse, lse_placeholder, window, sinks, softcap,
                        alibi_slopes)
    return _run(q, k, v, causal, softmax_scale, return_lse, lse_placeholder, window, sinks, softcap, alibi_slopes,
                record)



@torch.library.custom_op("rtattn::attention", mutates_args=(), device_types="cuda")
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: Optional[float],
                  deterministic: bool, window_left: int = -1, window_right: int = -1,
                  sinks: Optional[torch.Tensor] = None, softcap: float = 0.0,
                  alibi_slopes: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    # The op always returns LSE: its backward needs it. `deterministic` is the backward's, kept for it.
    return _forward(q, k, v, causal, softmax_scale, True, None, (window_left, window_right), sinks, softcap,
                    alibi_slopes)


@_attention_op.register_fake
def _attention_fake(q, k, v, causal, softmax_scale, deterministic, window_left=-1, window_right=-1, sinks=None,
                    softcap=0.0, alibi_slopes=None):
    _check(q, k, v, causal, softmax_scale)
    _check_sinks(sinks, q, q.shape[2])
    _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    b, sq, hq, _ = q.shape
    return q.new_empty((b, sq, hq, v.shape[3])), q.new_empty((b, hq, sq), dtype=torch.float32)


def _dsinks_out(sinks, want_dsinks, heads_q, q) -> torch.Tensor:
    """The backward ops' fourth output: dsinks [heads_q] where wanted, else an empty tensor (an op's outputs are fixed
    in number, so "none" is a tensor of no elements). From q.new_empty, so a fake q gives a fake one."""
    return q.new_empty((heads_q if want_dsinks and sinks is not None else 0,), dtype=torch.float32)


def _keyless_dsinks(dsinks, dlse, row_dims) -> torch.Tensor:
    """dsinks when no row saw a key (or there is no row): LSE = the sink and O = 0 on every row, so d loss / d sink is
    the rows' dLSE summed. row_dims: dlse's dims other than the heads."""
    if dsinks.numel():
        if dlse is None:
            dsinks.zero_()
        else:
            dsinks.copy_(dlse.float().sum(row_dims))
    return dsinks


def _bwd_sinks_args(sinks, dsinks) -> dict:
    """The backward's sinks fields; dsinks NULL when not wanted, so the kernels skip that reduction."""
    if sinks is None:
        return {}
    return dict(sinks=sinks.data_ptr(), dsinks=dsinks.data_ptr() if dsinks.numel() else None)


def _run_backward(dout, q, k, v, o, lse, dlse, causal, softmax_scale, deterministic, window=(-1, -1), sinks=None,
                  want_dsinks=False, softcap=0.0, alibi_slopes=None):
    """Allocates dQ, dK, dV, dsinks and the workspace (torch's caching allocator) and launches on the current
    stream. softcap and alibi_slopes: the forward's (its kernel's config and the call's values), 0 / None for none."""
    b, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    dq = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device)
    dk = torch.empty((b, sk, hkv, d), dtype=q.dtype, device=q.device)
    dvv = torch.empty((b, sk, hkv, dv), dtype=q.dtype, device=q.device)
    dsinks = _dsinks_out(sinks, want_dsinks, hq, q)
    if b == 0 or sq == 0 or sk == 0:  # no query or no key: every gradient but the sinks' is zero
        return dq.zero_(), dk.zero_(), dvv.zero_(), _keyless_dsinks(dsinks, dlse, (0, 2))
    sinks = _sinks_f32(sinks)
    kernel = _backward_kernel(q.device, q.dtype, d, dv, hq, hkv, causal, softmax_scale,
                              _local(causal, *window) + _sinks_flag(sinks) + _softcap_flag(softcap) +
                              _alibi_flag(alibi_slopes))
    workspace = torch.empty(kernel.workspace_bytes(b, sq, sk), dtype=torch.uint8, device=q.device)
    args = fill(_lib.BackwardArgs(_BWD_ARGS_SIZE, _tensor(q), _tensor(k), _tensor(v), _tensor(o), _tensor(dout),
                                  lse.data_ptr(), dlse.data_ptr() if dlse is not None else None, _tensor(dq),
                                  _tensor(dk), _tensor(dvv)), ArgumentError, batch=b, seqlen_q=sq, seqlen_k=sk,
                workspace=workspace.data_ptr(), workspace_bytes=workspace.numel(), deterministic=int(deterministic),
                **_window_args(causal, *window), **_bwd_sinks_args(sinks, dsinks), **_softcap_args(softcap),
                **_alibi_args(alibi_slopes))
    kernel.launch(args, _raw_stream(q.device.index))
    return dq, dk, dvv, dsinks


def _unit_last(name, t):
    """dO and dLSE come from whatever the loss did: any layout is accepted, copied when the kernel cannot read it."""
    if name == "dlse":
        return t.contiguous() if t is not None else None
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


@torch.library.custom_op("rtattn::attention_backward", mutates_args=(), device_types="cuda")
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                           lse: torch.Tensor, dlse: Optional[torch.Tensor], causal: bool,
                           softmax_scale: Optional[float], deterministic: bool, window_left: int = -1,
                           window_right: int = -1, sinks: Optional[torch.Tensor] = None, want_dsinks: bool = False,
                           softcap: float = 0.0, alibi_slopes: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # The fourth output, dsinks, is float32 [heads_q] given sinks and want_dsinks, else empty: an op's outputs are
    # fixed in number, and skipping the sinks' reduction is worth a flag where autograd needs no dsinks. softcap: the
    # forward's cap (0: none); the kernels recompute the capped scores and their slope from it, so it must be the same.
    # alibi_slopes: the forward's, for the same reason (the kernels recompute the biased scores).
    softcap = _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    dout, dlse = _unit_last("dout", dout), _unit_last("dlse", dlse)
    if dlse is not None and dlse.dtype != torch.float32:
        dlse = dlse.float()
    window = (window_left, window_right)
    if q.device.index != torch.cuda.current_device():
        with torch.cuda.device(q.device):
            return _run_backward(dout, q, k, v, o, lse, dlse, causal, softmax_scale, deterministic, window, sinks,
                                 want_dsinks, softcap, alibi_slopes)
    return _run_backward(dout, q, k, v, o, lse, dlse, causal, softmax_scale, deterministic, window, sinks,
                         want_dsinks, softcap, alibi_slopes)


@_attention_backward_op.register_fake
def _attention_backward_fake(dout, q, k, v, o, lse, dlse, causal, softmax_scale, deterministic, window_left=-1,
                             window_right=-1, sinks=None, want_dsinks=False, softcap=0.0, alibi_slopes=None):
    _check_softcap(softcap)
    _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsinks_out(sinks, want_dsinks, q.shape[2], q))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, deterministic, window_left, window_right, sinks, softcap, alibi_slopes = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, sinks, alibi_slopes)
    ctx.causal, ctx.softmax_scale, ctx.deterministic = causal, softmax_scale, deterministic
    ctx.window = (window_left, window_right)
    ctx.softcap = softcap
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, sinks, alibi_slopes = ctx.saved_tensors
    if grad_o is None and grad_lse is None:
        return (None,) * 11
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    want_dsinks = sinks is not None and ctx.needs_input_grad[8]
    dq, dk, dv, dsinks = torch.ops.rtattn.attention_backward(grad_o, q, k, v, o, lse, grad_lse, ctx.causal,
                                                             ctx.softmax_scale, ctx.deterministic, *ctx.window,
                                                             sinks, want_dsinks, ctx.softcap, alibi_slopes)
    # Computed in float32; returned in the dtype of the sinks given, as autograd wants a leaf's gradient. The slopes
    # get none: they are constants of the model, as in FlashAttention.
    return (dq, dk, dv) + (None,) * 5 + (dsinks.to(sinks.dtype) if want_dsinks else None, None, None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


# What tells a plain eager call from one that something records or transforms. The private probes are looked up
# once; where one is missing (another torch version), every call takes the op, which is always right.
_transforms_active = getattr(torch._C, "_are_functorch_transforms_active", None)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
try:
    from torch.autograd import forward_ad as _forward_ad
except ImportError:
    _forward_ad = None


def _plain_eager(q, k, v, sinks=None, alibi_slopes=None) -> bool:
    """True when nothing but the result is wanted: not tracing (dynamo, export, jit.trace), plain CUDA tensors (no
    fake or other subclass), no autograd graph to record, no forward-mode AD, no functorch transform, no dispatch
    mode."""
    # torch.jit.trace records only what the dispatcher sees: a launch through ctypes would be left out of the trace.
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or not (
            type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor and q.is_cuda):
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    if sinks is not None and (type(sinks) is not torch.Tensor or (torch.is_grad_enabled() and sinks.requires_grad)):
        return False
    # The slopes get no gradient, so only a fake or subclass tensor needs the op.
    if alibi_slopes is not None and type(alibi_slopes) is not torch.Tensor:
        return False
    if _transforms_active is None or _transforms_active() or _dispatch_modes is None or _dispatch_modes() > 0:
        return False
    return _forward_ad is not None and getattr(_forward_ad, "_current_level", 0) < 0


def _refuse_what_the_op_would_drop(q, k, v, sinks=None, alibi_slopes=None) -> None:
    """The custom op lets forward-mode AD through without a tangent and without an error (measured with torch
    2.11); torch.func transforms are not supported either. There is a backward (reverse mode) only: refuse the rest,
    never drop it."""
    if _forward_ad is not None and getattr(_forward_ad, "_current_level", -1) >= 0:
        for name, t in (("q", q), ("k", k), ("v", v), ("sinks", sinks), ("alibi_slopes", alibi_slopes)):
            if t is not None and _forward_ad.unpack_dual(t).tangent is not None:
                raise NotImplementedError(f"{name}: carries a forward-mode AD tangent; rtattn.attention has a "
                                          "backward (reverse mode, torch.autograd) but no forward-mode derivative")
    if _transforms_active is not None and _transforms_active():
        raise NotImplementedError("rtattn.attention does not support torch.func transforms (grad, jvp, vmap); "
                                  "use torch.autograd (loss.backward(), torch.autograd.grad) outside them")


def _no_lse(q):
    return None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: Optional[float] = None, return_lse: bool = False, deterministic: bool = False,
              window_size: Tuple[int, int] = (-1, -1), sinks: Optional[torch.Tensor] = None, softcap: float = 0.0,
              alibi_slopes: Optional[torch.Tensor] = None):
    """Scaled dot-product attention on CUDA tensors in FlashAttention's layout, differentiable.

    q: [batch, seqlen_q, heads_q, head_dim]; k: [batch, seqlen_k, heads_kv, head_dim]; v: [batch, seqlen_k,
    heads_kv, head_dim_v]; fp16 or bf16, any strides with the last dim contiguous; heads_q a multiple of heads_kv
    (GQA/MQA). causal is aligned bottom-right when seqlen_q != seqlen_k. softmax_scale defaults to 1/sqrt(head_dim).
    Runs on the tensors' device and its current stream; the output is a new [batch, seqlen_q, heads_q, head_dim_v]
    tensor. With return_lse, also the float32 [batch, heads_q, seqlen_q] natural-log sum-exp of the scaled scores
    (gradients may flow through it too). Gradients for q, k and v come from librtattn's backward kernels (dK and dV
    per KV head); deterministic=True makes them bitwise reproducible run to run, at some cost.
    window_size = (left, right): a sliding window (FlashAttention's local attention): query i sees keys
    i + seqlen_k - seqlen_q - left .. i + seqlen_k - seqlen_q + right, -1 leaving a side unbounded; with causal the
    right bound is 0. One kernel per config serves every window (the bounds are launch arguments).
    sinks: attention sinks (gpt-oss; vLLM's s_aux), a [heads_q] tensor on q's device, float32 (another floating
    dtype is computed in float32): head h's logit, in the units of the scaled scores, joins every row's softmax
    denominator as a key whose value is zero. The LSE includes it; a row that sees no key gives O = 0 and LSE = its
    sink. Differentiable: the sinks' gradient is summed over the batch and the rows.
    softcap: logit softcapping (Gemma 2, Grok; FlashAttention's softcap): a cap > 0 turns each scaled score s into
    softcap * tanh(s / softcap) before the mask and the softmax (the LSE is over the capped scores); 0, the default,
    leaves the scores as they are. Differentiable, with sinks and windows too; the cap is a constant (no gradient).
    alibi_slopes: ALiBi (MPT, BLOOM, Falcon; FlashAttention's alibi_slopes), float32 [heads_q] or [batch, heads_q]
    on q's device: the scaled (and capped) score of query i and key j loses slope * |i + seqlen_k - seqlen_q - j|
    before the mask and the softmax (the LSE includes the bias). Differentiable in q, k, v; the slopes are constants
    (no gradient)."""
    eager = _plain_eager(q, k, v, sinks, alibi_slopes)
    key = None
    if eager and k.dim() == 4 and v.dim() == 4 and _prepared.plain_options(
            causal, softmax_scale, softcap, window_size, return_lse, deterministic) and _prepared.on_current_device(q):
        # The keys' count and K/V's strides stay out of the signature: a decode loop's keys grow call by call.
        ks, vs = k.shape, v.shape
        sk = ks[1]
        # Which kernels _run takes for this many keys (q's shape is in the key): one entry per side of the threshold,
        # so that a decode loop whose keys grow past it is prepared on both.
        route = q.shape[1] <= _DECODE_MAX_Q and sk >= _ROUTE_MIN_KEYS
        key = ("attention", _prepared.meta(q), (ks[0], ks[2], ks[3], k.stride(3), k.dtype, k.device),
               (vs[0], vs[2], vs[3], v.stride(3), v.dtype, v.device), _prepared.meta(sinks),
               _prepared.meta(alibi_slopes), causal, softmax_scale, softcap, window_size, return_lse, route)
        p = _prepared.table().get(key)
        if p is not None and vs[1] == sk and 0 < sk <= p.max_keys:
            # This signature's checks passed before: allocate, set the pointers and the keys, launch.
            try:
                o, lse = _prepared.launch(p, q, k, v, return_lse, sk, True, sinks=_sinks_f32(sinks),
                                          alibi_slopes=alibi_slopes)
                return (o, lse) if return_lse else o
            except ArgumentError:
                pass  # a pointer the kernel refuses: the full path decides (a decode kernel's refusal takes the prefill
                #       kernel there) and names what it refuses
    boolean("deterministic", deterministic, ArgumentError)
    boolean("return_lse", return_lse, ArgumentError)
    boolean("causal", causal, ArgumentError)
    window = _window(window_size, causal)
    softcap = _check_softcap(softcap)
    if eager:
        # The same implementation without the dispatcher's round trip through the custom op (about half the
        # per-call host cost; docs/PERFORMANCE.md); the launch's struct kept for the signature's next calls.
        record = [] if key is not None else None
        o, lse = _forward(q, k, v, causal, softmax_scale, return_lse, _no_lse, window, sinks, softcap, alibi_slopes,
                          record)
        _prepared.store(key, record, o, lse)
    else:
        _check(q, k, v, causal, softmax_scale)  # named errors before the dispatcher sees a CPU tensor
        _check_sinks(sinks, q, q.shape[2])
        _check_alibi(alibi_slopes, q, q.shape[0], q.shape[2])
        if not torch.compiler.is_compiling():
            _refuse_what_the_op_would_drop(q, k, v, sinks, alibi_slopes)
        o, lse = torch.ops.rtattn.attention(q, k, v, causal, softmax_scale, deterministic, *window, sinks, softcap,
                                            alibi_slopes)
    return (o, lse) if return_lse else o
