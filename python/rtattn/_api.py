"""rtattn's Python API over the C ABI: configs, the Runtime, Kernels and the exceptions. Needs neither torch nor a GPU
(except Runtime.get and launching)."""
import ctypes
import dataclasses
import threading
from typing import Callable, Optional

from . import _lib
from ._convert import boolean, cstring, fill, integer
from ._lib import lib

# Key splits a decode call may run: kDecMaxSplits (templates/common/geometry.h), checked here before a caller sizes a
# workspace from the count (10**6 splits would ask for terabytes before the launch refused them).
MAX_SPLITS = 128
_POINTER_MAX = 2**(8 * ctypes.sizeof(ctypes.c_void_p)) - 1


class Error(RuntimeError):
    """Every librtattn failure; the subclasses say which kind."""


class ConfigError(Error, ValueError):
    """A config (or runtime option) field is out of range, or the plan cannot serve it. `.field` names it."""

    def __init__(self, message, field=""):
        super().__init__(message)
        self.field = field


class ArgumentError(Error, ValueError):
    """A bad call argument (tensor, shape, stride, pointer). `.field` names it."""

    def __init__(self, message, field=""):
        super().__init__(message)
        self.field = field


class CompileError(Error):
    """NVRTC rejected the rendered source: `.log`, `.options` and `.source` reproduce it."""

    def __init__(self, message, log="", options="", source=""):
        super().__init__(message)
        self.log, self.options, self.source = log, options, source


class CudaError(Error):
    """A CUDA Driver API call failed, or there is no driver or GPU: `.call` and `.result` (a CUresult)."""

    def __init__(self, message, call="", result=0):
        super().__init__(message)
        self.call, self.result = call, result


class CacheMissError(Error):
    """Cache-only mode and the config is not in the disk cache."""


class CacheError(Error):
    """The disk cache cannot do what was asked (e.g. a precompiled kernel could not be stored)."""


def _s(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def _raise(status: int):
    """Raises the exception for a failed C call, from the thread's last error."""
    msg = _s(lib.rtattn_last_error_message()) or f"librtattn: status {status}"
    if status == _lib.ERROR_CONFIG:
        raise ConfigError(msg, _s(lib.rtattn_last_error_field()))
    if status == _lib.ERROR_ARGUMENT:
        raise ArgumentError(msg, _s(lib.rtattn_last_error_field()))
    if status == _lib.ERROR_COMPILE:
        raise CompileError(msg, _s(lib.rtattn_last_error_log()), _s(lib.rtattn_last_error_options()),
                           _s(lib.rtattn_last_error_source()))
    if status == _lib.ERROR_CUDA:
        raise CudaError(msg, _s(lib.rtattn_last_error_cuda_call()), lib.rtattn_last_error_cuda_result())
    if status == _lib.ERROR_CACHE_MISS:
        raise CacheMissError(msg)
    if status == _lib.ERROR_CACHE:
        raise CacheError(msg)
    if status == _lib.ERROR_OUT_OF_MEMORY:
        raise MemoryError(msg)
    raise Error(msg)


def _check(status: int):
    if status != _lib.OK:
        _raise(status)


def _text(fn, *args) -> str:
    needed = ctypes.c_size_t(0)
    _check(fn(*args, None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value)
    _check(fn(*args, buf, needed.value, ctypes.byref(needed)))
    return buf.value.decode()


@dataclasses.dataclass
class AttentionConfig:
    """What a caller asks for; the same fields as the C++ rtattn::AttentionConfig. validate() checks the ranges."""
    head_dim_qk: int = 128                 # 1..256
    head_dim_v: Optional[int] = None       # 1..256; None: head_dim_qk
    dtype: str = "bf16"                    # "bf16" or "fp16" (also "bfloat16", "float16", "half")
    causal: bool = False                   # bottom-right aligned when seqlen_q != seqlen_k
    num_heads_q: int = 1                   # >= 1, a multiple of num_heads_kv
    num_heads_kv: Optional[int] = None     # None: num_heads_q (1 = MQA, fewer = GQA)
    softmax_scale: Optional[float] = None  # > 0; None: 1/sqrt(head_dim_qk)
    arch: str = ""                         # "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"; "": the current device
    decode: bool = False                   # 1..16 query tokens per sequence against a KV cache (split-KV decode)
    paged_kv: bool = False                 # K and V in a paged cache with a block table (decode or prefill)
    varlen: bool = False                   # packed sequences of different lengths (cu_seqlens), forward and backward
    local: bool = False                    # a sliding window, its bounds per call (window_size_left/right)
    sinks: bool = False                    # a per-head logit in every softmax denominator (the call's sinks)
    softcap: bool = False                  # scores capped as cap * tanh(s / cap), the cap per call; every pass
    alibi: bool = False                    # ALiBi: scores lose slope * |distance|, the slopes per call; no decode

    def _to_c(self) -> "_lib.Config":
        c = _lib.Config()
        lib.rtattn_config_init(ctypes.byref(c))
        dtype = ctypes.c_int32(0)
        _check(lib.rtattn_dtype_from_string(cstring("dtype", self.dtype, ConfigError), ctypes.byref(dtype)))
        flags = {name: int(boolean(name, getattr(self, name), ConfigError))
                 for name in ("causal", "decode", "paged_kv", "varlen", "local", "sinks", "softcap",
                              "alibi")}
        kv = self.num_heads_q if self.num_heads_kv is None else self.num_heads_kv
        fill(c, ConfigError, head_dim_qk=self.head_dim_qk, dtype=dtype.value, num_heads_q=self.num_heads_q,
             num_heads_kv=kv, arch="" if self.arch is None else self.arch, **flags)
        if self.head_dim_v is not None:
            fill(c, ConfigError, has_head_dim_v=1, head_dim_v=self.head_dim_v)
        if self.softmax_scale is not None:
            fill(c, ConfigError, has_softmax_scale=1, softmax_scale=self.softmax_scale)
        return c

    @staticmethod
    def _from_c(c: "_lib.Config") -> "AttentionConfig":
        return AttentionConfig(head_dim_qk=c.head_dim_qk, head_dim_v=c.head_dim_v if c.has_head_dim_v else None,
                               dtype="bf16" if c.dtype == _lib.BF16 else "fp16", causal=bool(c.causal),
                               num_heads_q=c.num_heads_q, num_heads_kv=c.num_heads_kv,
                               softmax_scale=c.softmax_scale if c.has_softmax_scale else None,
                               arch=_s(c.arch), decode=bool(c.decode), paged_kv=bool(c.paged_kv),
                               varlen=bool(c.varlen), local=bool(c.local), sinks=bool(c.sinks),
                               softcap=bool(c.softcap), alibi=bool(c.alibi))

    def validate(self) -> None:
        """Raises ConfigError naming the first bad field and its allowed range."""
        _check(lib.rtattn_config_validate(ctypes.byref(self._to_c())))

    def to_json(self) -> str:
        c = self._to_c()
        return _text(lib.rtattn_config_to_json, ctypes.byref(c))

    @staticmethod
    def from_json(text: str) -> "AttentionConfig":
        c = _lib.Config()
        lib.rtattn_config_init(ctypes.byref(c))
        arch = ctypes.create_string_buffer(64)
        _check(lib.rtattn_config_from_json(cstring("text", text, ConfigError), ctypes.byref(c), arch, len(arch)))
        return AttentionConfig._from_c(c)

    def describe(self) -> str:
        """e.g. "d132 bf16 causal h32:8 sm_90a"."""
        c = self._to_c()
        return _text(lib.rtattn_config_describe, ctypes.byref(c))


@dataclasses.dataclass(frozen=True)
class KernelInfo:
    """The plan for a config and what ptxas reported (registers and spill_bytes are -1 unless compiled here)."""
    key: str
    arch: str
    padded_qk: int
    padded_v: int
    block_m: int
    block_n: int
    warps: int
    stages: int
    smem_bytes: int
    vec_qk: int       # elements per vector access: pointers and strides must be multiples
    vec_v: int
    useful_flop_fraction: float
    kernel: str
    reason: str
    registers: int
    spill_bytes: int
    from_cache: bool

    @staticmethod
    def _from_c(i: "_lib.KernelInfo") -> "KernelInfo":
        kw = {f.name: getattr(i, f.name) for f in dataclasses.fields(KernelInfo)}
        for name in ("key", "arch", "kernel", "reason"):
            kw[name] = _s(kw[name])
        kw["from_cache"] = bool(kw["from_cache"])
        return KernelInfo(**kw)


@dataclasses.dataclass(frozen=True)
class CacheStats:
    memory_hits: int
    disk_hits: int
    misses: int
    compiles: int
    compile_seconds: float
    bad_entries: int
    evictions: int
    bytes_written: int
    disk_bytes: int
    disk_enabled: bool   # False: the cache dir cannot be used or is not trusted (memory only)
    dir: str


def _as_config(config, fields) -> AttentionConfig:
    if config is not None and fields:
        raise TypeError("give a config or config fields, not both")
    if config is None:
        if "head_dim" in fields:  # FlashAttention's and the CLI's name for it
            fields["head_dim_qk"] = fields.pop("head_dim")
        return AttentionConfig(**fields)
    if isinstance(config, AttentionConfig):
        return config
    raise TypeError(f"config: expected rtattn.AttentionConfig, got {type(config).__name__}")


def _sizes(batch, seqlen_q, seqlen_k, num_splits=None) -> tuple:
    """The int32 size arguments of the workspace and split queries, checked (ctypes would wrap them)."""
    sizes = tuple(integer(name, value, ArgumentError) for name, value in
                  (("batch", batch), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)))
    if num_splits is None:
        return sizes
    return sizes + (integer("num_splits", num_splits, ArgumentError, 0, MAX_SPLITS, " (0: the library chooses)"),)


def _struct_ref(name, args, struct_type):
    if type(args) is not struct_type:
        raise ArgumentError(f"{name}: expected a {struct_type.__name__} (from the kernel's *_args()), got "
                            f"{type(args).__name__}", name)
    return ctypes.byref(args)


def _stream(stream) -> int:
    """A cudaStream_t as an int (None: 0, the legacy default stream); ctypes would wrap -1 into a pointer."""
    return 0 if stream is None else integer("stream", stream, ArgumentError, 0, _POINTER_MAX)


class Kernel:
    """One loaded kernel, for the CUDA context that was current when Runtime.get made it. Thread-safe."""

    def __init__(self, handle: ctypes.c_void_p):
        self._handle = handle
        c = _lib.Config()
        lib.rtattn_config_init(ctypes.byref(c))
        _check(lib.rtattn_kernel_get_config(handle, ctypes.byref(c)))
        self.config = AttentionConfig._from_c(c)  # arch resolved
        i = _lib.KernelInfo()
        lib.rtattn_kernel_info_init(ctypes.byref(i))
        _check(lib.rtattn_kernel_get_info(handle, ctypes.byref(i)))
        self.info = KernelInfo._from_c(i)
        self._forward = lib.rtattn_kernel_forward

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and lib is not None:
            lib.rtattn_kernel_release(handle)

    def forward_args(self, **fields) -> "_lib.ForwardArgs":
        """A fresh argument struct for launch(): q/k/v/o (pointer and strides in elements), lse, sizes. Fields given
        here are range-checked (ArgumentError); ctypes' own attribute assignment wraps 2**32 + 1 to 1 silently."""
        a = _lib.ForwardArgs()
        lib.rtattn_forward_args_init(ctypes.byref(a))
        return fill(a, ArgumentError, **fields)

    def launch(self, args: "_lib.ForwardArgs", stream: int = 0) -> None:
        """Launches on `stream` (a cudaStream_t as an int; 0 = the legacy default stream). Never synchronizes or
        allocates. Raises ArgumentError naming a bad argument (e.g. "q.seq_stride")."""
        status = self._forward(self._handle, _struct_ref("args", args, _lib.ForwardArgs), _stream(stream))
        if status:
            _raise(status)

    def workspace_bytes(self, batch: int, seqlen_q: int, seqlen_k: int, num_splits: int = 0) -> int:
        """Device workspace one call with these sizes needs (decode kernels: the splits' partial results; else 0)."""
        n = ctypes.c_size_t()
        _check(lib.rtattn_kernel_workspace_bytes(self._handle, *_sizes(batch, seqlen_q, seqlen_k, num_splits),
                                                 ctypes.byref(n)))
        return n.value

    def num_splits(self, batch: int, seqlen_q: int, seqlen_k: int, num_splits: int = 0) -> int:
        """Key splits a decode call with these sizes runs (0: the library's choice); 1 for the prefill kernels."""
        n = ctypes.c_int32()
        _check(lib.rtattn_kernel_num_splits(self._handle, *_sizes(batch, seqlen_q, seqlen_k, num_splits),
                                            ctypes.byref(n)))
        return n.value

    def merge_args(self, **fields) -> "_lib.MergeArgs":
        """A fresh argument struct for merge(); fields given here are range-checked, as in forward_args()."""
        a = _lib.MergeArgs()
        lib.rtattn_merge_args_init(ctypes.byref(a))
        return fill(a, ArgumentError, **fields)

    def merge(self, args: "_lib.MergeArgs", stream: int = 0) -> None:
        """Merges two attention states (O, LSE) of the same rows over different keys on `stream`."""
        _check(lib.rtattn_kernel_merge(self._handle, _struct_ref("args", args, _lib.MergeArgs), _stream(stream)))


class BackwardKernel:
    """The backward kernels of one config (dQ, dK, dV), for the CUDA context current when Runtime.get_backward made
    them. Thread-safe."""

    def __init__(self, handle: ctypes.c_void_p):
        self._handle = handle
        c = _lib.Config()
        lib.rtattn_config_init(ctypes.byref(c))
        _check(lib.rtattn_backward_kernel_get_config(handle, ctypes.byref(c)))
        self.config = AttentionConfig._from_c(c)
        i = _lib.KernelInfo()
        lib.rtattn_kernel_info_init(ctypes.byref(i))
        _check(lib.rtattn_backward_kernel_get_info(handle, ctypes.byref(i)))
        self.info = KernelInfo._from_c(i)
        self._backward = lib.rtattn_kernel_backward

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and lib is not None:
            lib.rtattn_backward_kernel_release(handle)

    def workspace_bytes(self, batch: int, seqlen_q: int, seqlen_k: int) -> int:
        """Device memory one call with these sizes needs as its workspace (256-byte aligned)."""
        n = ctypes.c_size_t()
        _check(lib.rtattn_backward_kernel_workspace_bytes(self._handle, *_sizes(batch, seqlen_q, seqlen_k),
                                                          ctypes.byref(n)))
        return n.value

    def backward_args(self, **fields) -> "_lib.BackwardArgs":
        """A fresh argument struct for launch(); fields given here are range-checked, as in Kernel.forward_args()."""
        a = _lib.BackwardArgs()
        lib.rtattn_backward_args_init(ctypes.byref(a))
        return fill(a, ArgumentError, **fields)

    def launch(self, args: "_lib.BackwardArgs", stream: int = 0) -> None:
        """Writes dQ, dK, dV on `stream`. Never synchronizes or allocates. Raises ArgumentError naming a bad
        argument."""
        status = self._backward(self._handle, _struct_ref("args", args, _lib.BackwardArgs), _stream(stream))
        if status:
            _raise(status)


class Runtime:
    """Compiles, caches and loads kernels (plan -> render -> NVRTC -> disk cache -> Driver API). Thread-safe.

    The environment overrides some options: RTATTN_CACHE_ONLY=1, RTATTN_LOG_LEVEL, RTATTN_SHARED_CACHE=1,
    RTATTN_TILE; `options` shows what is in effect."""

    def __init__(self, cache_dir: Optional[str] = None, cache_only: bool = False, max_concurrent_compiles: int = 0,
                 max_cache_bytes: int = 2 << 30, log_level: str = "warn",
                 log_callback: Optional[Callable[[str, str], None]] = None, shared_cache: bool = False,
                 lock_timeout_seconds: float = 60.0, tile_override: Optional[str] = None):
        self._handle = None
        o = _lib.RuntimeOptions()
        lib.rtattn_runtime_options_init(ctypes.byref(o))
        if not (isinstance(log_level, str) and log_level in _lib.LOG_LEVELS):
            raise ConfigError(f"log_level: {log_level!r} is not one of {', '.join(_lib.LOG_LEVELS)}", "log_level")
        fill(o, ConfigError, cache_dir="" if cache_dir is None else cache_dir,
             cache_mode=_lib.CACHE_ONLY if boolean("cache_only", cache_only, ConfigError) else _lib.CACHE_JIT,
             max_concurrent_compiles=max_concurrent_compiles, max_cache_bytes=max_cache_bytes,
             log_level=_lib.LOG_LEVELS.index(log_level),
             shared_cache=int(boolean("shared_cache", shared_cache, ConfigError)),
             lock_timeout_seconds=lock_timeout_seconds, tile_override=None if tile_override == "" else tile_override)
        self._log = None
        if log_callback is not None:
            if not callable(log_callback):
                raise ConfigError(f"log_callback: expected a callable (level, message), got "
                                  f"{type(log_callback).__name__}", "log_callback")
            def trampoline(_user, level, message, _cb=log_callback):
                try:
                    _cb(_lib.LOG_LEVELS[level], _s(message))
                except Exception:  # a logger's failure must not unwind through the library
                    pass
            self._log = _lib.LogFn(trampoline)  # kept alive as long as the runtime
            o.log_callback = self._log
        handle = ctypes.c_void_p()
        _check(lib.rtattn_runtime_create(ctypes.byref(o), ctypes.byref(handle)))
        self._handle = handle
        e = _lib.RuntimeOptions()
        lib.rtattn_runtime_options_init(ctypes.byref(e))
        _check(lib.rtattn_runtime_options_get(self._handle, ctypes.byref(e)))
        self.options = {
            "cache_dir": _s(e.cache_dir), "cache_only": e.cache_mode == _lib.CACHE_ONLY,
            "max_concurrent_compiles": e.max_concurrent_compiles, "max_cache_bytes": e.max_cache_bytes,
            "log_level": _lib.LOG_LEVELS[e.log_level], "shared_cache": bool(e.shared_cache),
            "lock_timeout_seconds": e.lock_timeout_seconds, "tile_override": _s(e.tile_override),
        }

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", None), None
        if handle and lib is not None:
            lib.rtattn_runtime_destroy(handle)

    def _kernel_info(self, c_call, config: Optional[AttentionConfig], fields: dict) -> KernelInfo:
        """One of the C calls that fill a KernelInfo for a config (precompile, plan, and their backward twins)."""
        c = _as_config(config, fields)._to_c()
        i = _lib.KernelInfo()
        lib.rtattn_kernel_info_init(ctypes.byref(i))
        _check(c_call(self._handle, ctypes.byref(c), ctypes.byref(i)))
        return KernelInfo._from_c(i)

    def _kernel_handle(self, c_call, config: Optional[AttentionConfig], fields: dict) -> ctypes.c_void_p:
        """One of the C calls that compile or load a config's kernels and hand back a handle (get, get_backward)."""
        c = _as_config(config, fields)._to_c()
        handle = ctypes.c_void_p()
        _check(c_call(self._handle, ctypes.byref(c), ctypes.byref(handle)))
        return handle

    def get(self, config: Optional[AttentionConfig] = None, **fields) -> Kernel:
        """Compiles or loads the config's kernel into the current CUDA context (needs a GPU)."""
        return Kernel(self._kernel_handle(lib.rtattn_runtime_get, config, fields))

    def precompile(self, config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
        """Makes sure the config's cubin (an explicit arch) is in the disk cache; needs no GPU. CacheError when it
        was compiled but could not be stored."""
        return self._kernel_info(lib.rtattn_runtime_precompile, config, fields)

    def plan(self, config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
        """The plan for a config, compiling nothing (registers and spill_bytes are -1)."""
        return self._kernel_info(lib.rtattn_runtime_plan, config, fields)

    def get_backward(self, config: Optional[AttentionConfig] = None, **fields) -> BackwardKernel:
        """Compiles or loads the config's backward kernels into the current CUDA context (needs a GPU)."""
        return BackwardKernel(self._kernel_handle(lib.rtattn_runtime_get_backward, config, fields))

    def precompile_backward(self, config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
        """precompile() for the config's backward kernels (their own cache entry)."""
        return self._kernel_info(lib.rtattn_runtime_precompile_backward, config, fields)

    def plan_backward(self, config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
        """The backward plan for a config, compiling nothing."""
        return self._kernel_info(lib.rtattn_runtime_plan_backward, config, fields)

    def stats(self) -> CacheStats:
        s = _lib.CacheStats()
        lib.rtattn_cache_stats_init(ctypes.byref(s))
        _check(lib.rtattn_runtime_stats(self._handle, ctypes.byref(s)))
        kw = {f.name: getattr(s, f.name) for f in dataclasses.fields(CacheStats)}
        kw["dir"], kw["disk_enabled"] = _s(s.dir), bool(s.disk_enabled)
        return CacheStats(**kw)


_default = None
_default_lock = threading.Lock()


def default_runtime() -> Runtime:
    """The process's shared Runtime (options from the environment), made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Runtime()
        return _default


def set_default_runtime(runtime: Runtime) -> None:
    """Replaces the shared Runtime (e.g. one with a cache_dir or cache_only); kernels already obtained stay valid."""
    global _default
    if not isinstance(runtime, Runtime):
        raise TypeError(f"runtime: expected rtattn.Runtime, got {type(runtime).__name__}")
    with _default_lock:
        _default = runtime


def precompile(config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
    """Runtime.precompile on the shared runtime: e.g. rtattn.precompile(head_dim=132, causal=True, arch="sm_90a")."""
    return default_runtime().precompile(config, **fields)


def precompile_backward(config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
    """Runtime.precompile_backward on the shared runtime: the training kernels, e.g. before a job starts."""
    return default_runtime().precompile_backward(config, **fields)


def plan(config: Optional[AttentionConfig] = None, **fields) -> KernelInfo:
    """Runtime.plan on the shared runtime."""
    return default_runtime().plan(config, **fields)


def version() -> str:
    return _s(lib.rtattn_version())


def known_archs() -> list:
    return [a.strip() for a in _s(lib.rtattn_known_archs()).split(",") if a.strip()]


def info() -> dict:
    """The library, NVRTC and cache this process uses (what `rtattn info` shows without a config)."""
    stats = default_runtime().stats()
    return {"version": version(), "abi_version": lib.rtattn_abi_version(), "nvrtc": _s(lib.rtattn_nvrtc_version()),
            "library": lib.path, "archs": known_archs(), "cache_dir": stats.dir,
            "cache_enabled": stats.disk_enabled}


# Shown as rtattn.ConfigError etc. in tracebacks and reprs, where users catch them.
for _cls in (Error, ConfigError, ArgumentError, CompileError, CudaError, CacheMissError, CacheError, AttentionConfig,
             KernelInfo, CacheStats, Kernel, BackwardKernel, Runtime):
    _cls.__module__ = "rtattn"
