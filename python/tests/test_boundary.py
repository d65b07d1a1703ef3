"""Issue 21 at the Python boundary, without torch or a GPU: what ctypes would wrap (2**32 + 1 into an int32 as 1),
cut (a string at a NUL byte) or guess ("false" as true) is refused with the package's error naming the field and,
for numbers, the allowed range; wrong types too, instead of AttributeError or OverflowError. And an old torch leaves
everything that needs no torch working."""
import ctypes
import os
import pathlib
import re
import subprocess
import sys

import pytest

import rtattn
from rtattn import _convert, _lib

STRUCTS = [_lib.Config, _lib.RuntimeOptions, _lib.KernelInfo, _lib.CacheStats, _lib.Tensor, _lib.ForwardArgs,
           _lib.BackwardArgs, _lib.MergeArgs]


INT_FIELDS = [pytest.param(struct, name, _convert._C_RANGES[ctype], id=f"{struct.__name__}.{name}")
              for struct in STRUCTS for name, ctype in struct._fields_ if ctype in _convert._C_RANGES]


@pytest.mark.parametrize("struct, name, bounds", INT_FIELDS)
def test_every_integer_field_is_range_checked(struct, name, bounds):
    lo, hi = bounds
    s = struct()
    _convert.fill(s, rtattn.ArgumentError, **{name: hi})
    assert getattr(s, name) == hi
    for bad in (hi + 1, lo - 1, hi + 2**32 + 1):  # ctypes alone would store these wrapped
        with pytest.raises(rtattn.ArgumentError) as e:
            _convert.fill(s, rtattn.ArgumentError, **{name: bad})
        assert e.value.field == name and "out of range; allowed" in str(e.value)
    with pytest.raises(rtattn.ArgumentError, match="not an integer"):
        _convert.fill(s, rtattn.ArgumentError, **{name: 1.5})


FLOAT32_FIELDS = [pytest.param(struct, name, id=f"{struct.__name__}.{name}")
                  for struct in STRUCTS for name, ctype in struct._fields_ if ctype is ctypes.c_float]


@pytest.mark.parametrize("struct, name", FLOAT32_FIELDS)
def test_every_float32_field_is_range_checked(struct, name):
    s = struct()
    _convert.fill(s, rtattn.ArgumentError, **{name: _convert.FLOAT32_MAX})
    assert getattr(s, name) == _convert.FLOAT32_MAX
    _convert.fill(s, rtattn.ArgumentError, **{name: 50})
    assert getattr(s, name) == 50.0
    # inf and NaN are left to the library, which names them; a finite value past float32 would become inf unsaid.
    _convert.fill(s, rtattn.ArgumentError, **{name: float("inf")})
    assert getattr(s, name) == float("inf")
    for bad, match in ((1e39, "out of a float32's range"), (-1e39, "out of a float32's range"),
                       ("5", "not a number"), (True, "not a number")):
        with pytest.raises(rtattn.ArgumentError, match=match) as e:
            _convert.fill(s, rtattn.ArgumentError, **{name: bad})
        assert e.value.field == name


def test_a_misspelt_field_is_refused():
    with pytest.raises(rtattn.ArgumentError) as e:
        _convert.fill(_lib.ForwardArgs(), rtattn.ArgumentError, bacth=2)  # ctypes would add a Python attribute
    assert e.value.field == "bacth"


def kernel_without_a_gpu(cls=rtattn.Kernel):
    """A Kernel with a null handle: its argument checks run before any C call (which would refuse the null)."""
    k = cls.__new__(cls)
    k._handle = None
    k._forward = _lib.lib.rtattn_kernel_forward
    k._backward = _lib.lib.rtattn_kernel_backward
    return k


@pytest.mark.parametrize("call, field", [
    (lambda k: k.workspace_bytes(2**32 + 1, 1, 1), "batch"),
    (lambda k: k.workspace_bytes(1, 2**32 + 64, 1), "seqlen_q"),
    (lambda k: k.num_splits(1, 1, -2**32 + 8), "seqlen_k"),
    (lambda k: k.workspace_bytes(1, 1, 1, num_splits=10**6), "num_splits"),  # would have sized a 16 TB workspace
    (lambda k: k.num_splits(1, 1, 1, num_splits=2**32 + 1), "num_splits"),
    (lambda k: k.workspace_bytes(1, 1, "1"), "seqlen_k"),
    (lambda k: k.forward_args(batch=2**32 + 1), "batch"),
    (lambda k: k.forward_args(num_splits=2**32 + 1), "num_splits"),
    (lambda k: k.forward_args(lse=-1), "lse"),
    (lambda k: k.merge_args(seqlen=2**31), "seqlen"),
    (lambda k: k.launch(k.forward_args(), stream=-1), "stream"),
    (lambda k: k.launch(k.merge_args()), "args"),
    (lambda k: k.merge(k.merge_args(), stream=2**64), "stream"),
    (lambda k: kernel_without_a_gpu(rtattn.BackwardKernel).workspace_bytes(1, 1, 2**32 + 64), "seqlen_k"),
    (lambda k: kernel_without_a_gpu(rtattn.BackwardKernel).backward_args(total_q=2**32), "total_q"),
    (lambda k: kernel_without_a_gpu(rtattn.BackwardKernel).backward_args(softcap=1e39), "softcap"),
    (lambda k: kernel_without_a_gpu(rtattn.BackwardKernel).launch("args"), "args"),
])
def test_kernel_arguments_are_checked_before_the_library_sees_them(call, field):
    with pytest.raises(rtattn.ArgumentError) as e:
        call(kernel_without_a_gpu())
    assert e.value.field == field, e.value
    assert field in str(e.value)


def test_num_splits_allows_0_and_1_to_128():
    k = kernel_without_a_gpu()
    for n in (0, 1, rtattn._api.MAX_SPLITS):
        with pytest.raises(rtattn.ArgumentError) as e:  # passed on: the library refuses the null kernel
            k.workspace_bytes(1, 1, 1, n)
        assert e.value.field == "kernel"
    with pytest.raises(rtattn.ArgumentError, match=r"allowed 0\.\.128 \(0: the library chooses\)"):
        k.num_splits(1, 1, 1, rtattn._api.MAX_SPLITS + 1)


def test_max_splits_is_the_librarys():
    geometry = pathlib.Path(__file__).resolve().parents[2] / "templates" / "common" / "geometry.h"
    if not geometry.exists():
        pytest.skip("no source tree next to these tests")
    m = re.search(r"constexpr int kDecMaxSplits = (\d+);", geometry.read_text())
    assert m and int(m.group(1)) == rtattn._api.MAX_SPLITS


@pytest.mark.parametrize("fields, field", [
    (dict(head_dim=2**32 + 64), "head_dim_qk"), (dict(num_heads_q=2**32 + 1), "num_heads_q"),
    (dict(head_dim_v=-2**32 + 64), "head_dim_v"), (dict(num_heads_kv=1.0), "num_heads_kv"),
    (dict(arch="sm_80\0junk"), "arch"), (dict(arch=80), "arch"), (dict(arch="sm_\ud800"), "arch"),
    (dict(dtype="bf16\0"), "dtype"), (dict(dtype=16), "dtype"), (dict(softmax_scale=10**400), "softmax_scale"),
    (dict(softmax_scale="0.5"), "softmax_scale"), (dict(decode=1), "decode"), (dict(varlen="false"), "varlen")])
def test_config_conversions_name_the_field(fields, field, cache_dir):
    fields.setdefault("arch", "sm_80")
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(cache_dir=cache_dir).plan(**fields)
    assert e.value.field == field and field in str(e.value)


@pytest.mark.parametrize("text", ['{"head_dim_qk": 64}\0junk', b'{"head_dim_qk": 64}', 64])
def test_config_from_json_takes_only_a_whole_string(text):
    if isinstance(text, bytes):
        assert rtattn.AttentionConfig.from_json(text).head_dim_qk == 64  # the C string it stands for
        return
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.AttentionConfig.from_json(text)
    assert e.value.field == "text"


@pytest.mark.parametrize("options, field", [
    (dict(shared_cache="false"), "shared_cache"), (dict(shared_cache=1), "shared_cache"),
    (dict(cache_only="no"), "cache_only"), (dict(cache_dir=5), "cache_dir"),
    (dict(cache_dir="/tmp/a\0b"), "cache_dir"), (dict(cache_dir="/tmp/\ud800"), "cache_dir"),
    (dict(tile_override=64), "tile_override"), (dict(tile_override="64,64,4\0"), "tile_override"),
    (dict(max_concurrent_compiles=2**32 + 1), "max_concurrent_compiles"),
    (dict(max_cache_bytes=2**64), "max_cache_bytes"), (dict(max_cache_bytes=True), "max_cache_bytes"),
    (dict(lock_timeout_seconds=10**400), "lock_timeout_seconds"),
    (dict(lock_timeout_seconds="5"), "lock_timeout_seconds"),
    (dict(log_level=["warn"]), "log_level"), (dict(log_callback="print"), "log_callback")])
def test_runtime_options_are_converted_strictly(options, field):
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(**options)
    assert e.value.field == field and field in str(e.value)


def test_runtime_takes_a_path_and_real_bools(tmp_path):
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    rt = rtattn.Runtime(cache_dir=d, shared_cache=True, cache_only=False)
    assert rt.options["cache_dir"] == str(d) and rt.options["shared_cache"] and not rt.options["cache_only"]
    assert not rtattn.Runtime(cache_dir=str(d), shared_cache=False).options["shared_cache"]


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                          timeout=120)


# torch 1.13 has torch.library (the Library class) but no custom_op, which rtattn's ops are made with.
OLD_TORCH = """
import sys, types
torch = types.ModuleType("torch")
torch.__version__ = "1.13.1"
torch.library = types.ModuleType("torch.library")
"""


@pytest.mark.parametrize("torch_first", [True, False])
def test_an_old_torch_leaves_the_rest_working(torch_first):
    inject = 'sys.modules["torch"] = torch\n'
    code = OLD_TORCH + (inject + "import rtattn\n" if torch_first else "import rtattn\n" + inject) + """
print(rtattn.plan(head_dim=64, arch="sm_80").padded_qk)
for call in (lambda: rtattn.attention(None, None, None), lambda: rtattn.merge_states(None, None, None, None),
             lambda: rtattn.attention_with_kvcache(None, None, None)):
    try:
        call()
    except ImportError as e:
        print("ImportError:", e)
"""
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "64"
    assert len(lines) == 4 and all(line.startswith("ImportError:") for line in lines[1:]), r.stdout
    assert "torch >= 2.4" in lines[1] and "1.13.1" in lines[1]
