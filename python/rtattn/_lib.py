"""librtattn's C ABI (include/rtattn/rtattn.h) through ctypes: finding the library, its structs and prototypes.

Nothing here is built against Python or torch headers, so one librtattn serves every interpreter and torch version.
The structs mirror rtattn.h field for field; the library checks each one's struct_size, and the tests compare
ctypes' sizes with what the library's *_init functions report.
"""
import ctypes
import ctypes.util
import os
import pathlib
import re
import sys

ABI_VERSION = 1

# rtattn_status
OK, ERROR_CONFIG, ERROR_ARGUMENT, ERROR_COMPILE, ERROR_CUDA = 0, 1, 2, 3, 4
ERROR_CACHE_MISS, ERROR_CACHE, ERROR_OUT_OF_MEMORY, ERROR_INTERNAL = 5, 6, 7, 8
FP16, BF16 = 0, 1
CACHE_JIT, CACHE_ONLY = 0, 1
LOG_LEVELS = ("quiet", "warn", "info", "debug")

_i32, _i64, _u64, _f64, _size = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_size_t
_str = ctypes.c_char_p


class Config(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("head_dim_qk", _i32), ("has_head_dim_v", _i32), ("head_dim_v", _i32),
                ("dtype", _i32), ("causal", _i32), ("num_heads_q", _i32), ("num_heads_kv", _i32),
                ("has_softmax_scale", _i32), ("softmax_scale", _f64), ("arch", _str), ("decode", _i32),
                ("paged_kv", _i32), ("varlen", _i32), ("local", _i32),
                ("sinks", _i32), ("softcap", _i32), ("alibi", _i32)]


LogFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _i32, _str)


class RuntimeOptions(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("cache_dir", _str), ("cache_mode", _i32),
                ("max_concurrent_compiles", _i32), ("max_cache_bytes", _u64), ("log_level", _i32),
                ("log_callback", LogFn), ("log_user_data", ctypes.c_void_p), ("shared_cache", _i32),
                ("lock_timeout_seconds", _f64), ("tile_override", _str)]


class KernelInfo(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("key", _str), ("arch", _str), ("padded_qk", _i32), ("padded_v", _i32),
                ("block_m", _i32), ("block_n", _i32), ("warps", _i32), ("stages", _i32), ("smem_bytes", _i32),
                ("vec_qk", _i32), ("vec_v", _i32), ("useful_flop_fraction", _f64), ("kernel", _str),
                ("reason", _str), ("registers", _i32), ("spill_bytes", _i32), ("from_cache", _i32)]


class CacheStats(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("memory_hits", _u64), ("disk_hits", _u64), ("misses", _u64),
                ("compiles", _u64), ("compile_seconds", _f64), ("bad_entries", _u64), ("evictions", _u64),
                ("bytes_written", _u64), ("disk_bytes", _u64), ("disk_enabled", _i32), ("dir", _str)]


class Tensor(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("batch_stride", _i64), ("seq_stride", _i64), ("head_stride", _i64)]


class ForwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor),
                ("lse", ctypes.c_void_p), ("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32),
                ("seqlens_k", ctypes.c_void_p), ("block_table", ctypes.c_void_p), ("block_table_stride", _i64),
                ("pages_per_seq", _i32), ("page_size", _i32), ("num_splits", _i32), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", _size), ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("total_q", _i32), ("total_k", _i32), ("num_pages", _i32),
                ("has_window", _i32), ("window_size_left", _i32), ("window_size_right", _i32),
                ("sinks", ctypes.c_void_p), ("softcap", ctypes.c_float),
                ("alibi_slopes", ctypes.c_void_p), ("alibi_slopes_batch_stride", _i64),
                ("k_new", Tensor), ("v_new", Tensor), ("seqlen_new", _i32)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("q", Tensor), ("k", Tensor), ("v", Tensor), ("o", Tensor),
                ("dout", Tensor), ("lse", ctypes.c_void_p), ("dlse", ctypes.c_void_p),
                ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
                ("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", _size), ("deterministic", _i32), ("cu_seqlens_q", ctypes.c_void_p),
                ("cu_seqlens_k", ctypes.c_void_p), ("total_q", _i32), ("total_k", _i32),
                ("has_window", _i32), ("window_size_left", _i32), ("window_size_right", _i32),
                ("sinks", ctypes.c_void_p), ("dsinks", ctypes.c_void_p), ("softcap", ctypes.c_float),
                ("alibi_slopes", ctypes.c_void_p), ("alibi_slopes_batch_stride", _i64)]


class MergeArgs(ctypes.Structure):
    _fields_ = [("struct_size", _size), ("o_a", Tensor), ("o_b", Tensor), ("o", Tensor), ("lse_a", ctypes.c_void_p),
                ("lse_b", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("batch", _i32), ("seqlen", _i32)]


_P = ctypes.POINTER
_vp = ctypes.c_void_p
# name: (restype, argtypes)
_PROTOTYPES = {
    "rtattn_version": (_str, []),
    "rtattn_abi_version": (_i32, []),
    "rtattn_nvrtc_version": (_str, []),
    "rtattn_last_error": (_i32, []),
    "rtattn_last_error_message": (_str, []),
    "rtattn_last_error_field": (_str, []),
    "rtattn_last_error_log": (_str, []),
    "rtattn_last_error_options": (_str, []),
    "rtattn_last_error_source": (_str, []),
    "rtattn_last_error_cuda_call": (_str, []),
    "rtattn_last_error_cuda_result": (_i32, []),
    "rtattn_config_init": (None, [_P(Config)]),
    "rtattn_config_validate": (_i32, [_P(Config)]),
    "rtattn_config_to_json": (_i32, [_P(Config), ctypes.c_char_p, _size, _P(_size)]),
    "rtattn_config_describe": (_i32, [_P(Config), ctypes.c_char_p, _size, _P(_size)]),
    "rtattn_config_from_json": (_i32, [_str, _P(Config), ctypes.c_char_p, _size]),
    "rtattn_dtype_from_string": (_i32, [_str, _P(_i32)]),
    "rtattn_is_known_arch": (_i32, [_str]),
    "rtattn_known_archs": (_str, []),
    "rtattn_runtime_options_init": (None, [_P(RuntimeOptions)]),
    "rtattn_runtime_create": (_i32, [_P(RuntimeOptions), _P(_vp)]),
    "rtattn_runtime_destroy": (None, [_vp]),
    "rtattn_runtime_options_get": (_i32, [_vp, _P(RuntimeOptions)]),
    "rtattn_kernel_info_init": (None, [_P(KernelInfo)]),
    "rtattn_runtime_plan": (_i32, [_vp, _P(Config), _P(KernelInfo)]),
    "rtattn_runtime_precompile": (_i32, [_vp, _P(Config), _P(KernelInfo)]),
    "rtattn_runtime_get": (_i32, [_vp, _P(Config), _P(_vp)]),
    "rtattn_cache_stats_init": (None, [_P(CacheStats)]),
    "rtattn_runtime_stats": (_i32, [_vp, _P(CacheStats)]),
    "rtattn_forward_args_init": (None, [_P(ForwardArgs)]),
    "rtattn_kernel_retain": (None, [_vp]),
    "rtattn_kernel_release": (None, [_vp]),
    "rtattn_kernel_forward": (_i32, [_vp, _P(ForwardArgs), _vp]),
    "rtattn_kernel_workspace_bytes": (_i32, [_vp, _i32, _i32, _i32, _i32, _P(_size)]),
    "rtattn_kernel_num_splits": (_i32, [_vp, _i32, _i32, _i32, _i32, _P(_i32)]),
    "rtattn_merge_args_init": (None, [_P(MergeArgs)]),
    "rtattn_kernel_merge": (_i32, [_vp, _P(MergeArgs), _vp]),
    "rtattn_kernel_get_info": (_i32, [_vp, _P(KernelInfo)]),
    "rtattn_kernel_get_config": (_i32, [_vp, _P(Config)]),
    "rtattn_runtime_get_backward": (_i32, [_vp, _P(Config), _P(_vp)]),
    "rtattn_runtime_precompile_backward": (_i32, [_vp, _P(Config), _P(KernelInfo)]),
    "rtattn_runtime_plan_backward": (_i32, [_vp, _P(Config), _P(KernelInfo)]),
    "rtattn_backward_args_init": (None, [_P(BackwardArgs)]),
    "rtattn_backward_kernel_retain": (None, [_vp]),
    "rtattn_backward_kernel_release": (None, [_vp]),
    "rtattn_backward_kernel_workspace_bytes": (_i32, [_vp, _i32, _i32, _i32, _P(_size)]),
    "rtattn_kernel_backward": (_i32, [_vp, _P(BackwardArgs), _vp]),
    "rtattn_backward_kernel_get_info": (_i32, [_vp, _P(KernelInfo)]),
    "rtattn_backward_kernel_get_config": (_i32, [_vp, _P(Config)]),
}


def _candidates():
    """Where librtattn is looked for, in order, each with how it was found (for the error message)."""
    env = os.environ.get("RTATTN_LIBRARY")
    if env:
        # Set on purpose: nothing else is tried, so a wrong path is reported instead of silently bypassed.
        return [(env, "RTATTN_LIBRARY")]
    here = pathlib.Path(__file__).resolve().parent
    out = [(str(p), "bundled with the package") for p in sorted((here / "lib").glob("librtattn.so*"))]
    found = ctypes.util.find_library("rtattn")
    if found:
        out.append((found, "installed (ldconfig)"))
    for prefix in ("/usr/local/lib", "/usr/local/lib64", "/usr/lib", "/usr/lib64"):
        p = pathlib.Path(prefix) / "librtattn.so"
        if p.exists():
            out.append((str(p), "installed"))
    out.append(("librtattn.so", "the loader's search path (LD_LIBRARY_PATH)"))
    return out


_nvrtc_preloaded = None


def _nvrtc_major(p: pathlib.Path) -> int:
    return int(p.name.rsplit(".", 1)[1])


def _preload_pip_nvrtc(lib):
    """When librtattn finds no NVRTC of its own: NVRTC from pip's nvidia packages (nvidia-cuda-nvrtc, which PyTorch's
    CUDA wheels install), which lies where the loader does not look. Loaded here, it is the one librtattn's dlopen of
    the soname then finds (a loaded library answers to its soname), when that soname is the one librtattn was built
    for. A toolkit's NVRTC that librtattn finds comes first, so the CLI and the package name kernels alike."""
    global _nvrtc_preloaded
    if _nvrtc_preloaded is not None or os.environ.get("RTATTN_NVRTC"):
        return
    found = {p.resolve() for base in sys.path
             for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "nvidia/*/lib/libnvrtc.so.*")
             for p in pathlib.Path(base or ".").glob(pattern) if re.fullmatch(r"libnvrtc\.so\.\d+", p.name)}
    for p in sorted(found, key=_nvrtc_major, reverse=True):  # a major librtattn does not want stays unused
        try:
            handle = ctypes.CDLL(str(p))
        except OSError:
            continue
        if lib.rtattn_nvrtc_version() != b"unknown":
            _nvrtc_preloaded = handle
            return


def load():
    """Loads librtattn, declares its functions and checks its ABI version; ImportError says what was tried."""
    tried = []
    for path, how in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"  {path} ({how}): {e}")
            continue
        for name, (res, args) in _PROTOTYPES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise ImportError(f"rtattn: {path} ({how}) lacks {name}: it is not a librtattn this package can use "
                                  f"(upgrade it, or set RTATTN_LIBRARY)") from None
            fn.restype, fn.argtypes = res, args
        abi = lib.rtattn_abi_version()
        if abi != ABI_VERSION:
            raise ImportError(f"rtattn: {path} ({how}) has C ABI version {abi}; this package needs {ABI_VERSION}")
        lib.path, lib.found_how = path, how
        if lib.rtattn_nvrtc_version() == b"unknown":
            _preload_pip_nvrtc(lib)
        return lib
    raise ImportError("rtattn: librtattn could not be loaded; tried:\n" + "\n".join(tried) +
                      "\nSet RTATTN_LIBRARY to the library's path, install it (cmake --install), or "
                      "pip install the package so that it bundles one.")


lib = load()
