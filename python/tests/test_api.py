"""The package without torch or a GPU: loading the library, configs, errors with their fields, the Runtime's options
and environment, precompile/plan/stats, the log callback, the struct layouts against the C library."""
import ctypes
import os
import subprocess
import sys
import threading

import pytest

import rtattn
from conftest import gpu_unavailable
from rtattn import _lib


def run_python(code, env=None):
    """A fresh interpreter with this test's environment (plus `env`)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=120)


def test_config_fields_follow_the_list():
    """_lib.Config and AttentionConfig against include/rtattn/config_fields.h, the fields' one list: the ctypes
    struct has each field (and each optional one's presence flag) in the list's order, the dataclass each name."""
    import dataclasses
    import pathlib
    import re
    header = pathlib.Path(__file__).resolve().parents[2] / "include" / "rtattn" / "config_fields.h"
    if not header.exists():
        pytest.skip(f"{header} is not here (a package without its source tree)")
    fields = re.findall(r"X\((\w+), ([A-Z_]+)\)", header.read_text())  # the list, not its comment
    assert len(fields) >= 11
    expected = ["struct_size"]
    for name, kind in fields:
        expected += [f"has_{name}", name] if kind.startswith("OPT_") else [name]
    assert [f[0] for f in _lib.Config._fields_] == expected
    assert [f.name for f in dataclasses.fields(rtattn.AttentionConfig)] == [name for name, _ in fields]


@pytest.mark.parametrize("struct, init", [
    (_lib.Config, "rtattn_config_init"), (_lib.RuntimeOptions, "rtattn_runtime_options_init"),
    (_lib.KernelInfo, "rtattn_kernel_info_init"), (_lib.CacheStats, "rtattn_cache_stats_init"),
    (_lib.ForwardArgs, "rtattn_forward_args_init"), (_lib.BackwardArgs, "rtattn_backward_args_init"),
    (_lib.MergeArgs, "rtattn_merge_args_init")])
def test_struct_layouts_match_the_library(struct, init):
    s = struct()
    getattr(_lib.lib, init)(ctypes.byref(s))
    assert s.struct_size == ctypes.sizeof(struct), f"{struct.__name__} differs from the C struct"


def test_every_field_round_trips_through_the_c_struct():
    c = rtattn.AttentionConfig(head_dim_qk=132, head_dim_v=100, dtype="fp16", causal=True, num_heads_q=32,
                               num_heads_kv=8, softmax_scale=0.07, arch="sm_90a")
    back = rtattn.AttentionConfig.from_json(c.to_json())
    assert back == c
    assert c.describe() == "d132/100 fp16 causal h32:8 scale=0.07 sm_90a"
    assert rtattn.AttentionConfig(num_heads_q=4).num_heads_kv is None  # None: as many K/V heads as Q heads
    assert rtattn.AttentionConfig(num_heads_q=4).describe() == "d128 bf16 noncausal h4:4"


def test_softcap_config_round_trips_and_has_a_backward(cache_dir):
    c = rtattn.AttentionConfig(head_dim_qk=132, causal=True, num_heads_q=8, num_heads_kv=2, arch="sm_80",
                               sinks=True, softcap=True)
    assert rtattn.AttentionConfig.from_json(c.to_json()) == c and "softcap" in c.describe()
    rt = rtattn.Runtime(cache_dir=cache_dir)
    assert rt.plan(c).kernel
    plan = rt.plan_backward(c)
    assert "backward" in plan.kernel and plan.padded_qk == 144
    # Its own cache entry: the capped backward never answers an uncapped config's call, nor the reverse.
    uncapped = rtattn.AttentionConfig(head_dim_qk=132, causal=True, num_heads_q=8, num_heads_kv=2, arch="sm_80",
                                      sinks=True)
    assert plan.key != rt.plan_backward(uncapped).key
    info = rt.precompile_backward(c)  # compiles without a GPU (NVRTC)
    assert info.registers > 0 and info.key == plan.key


def test_alibi_config_round_trips_and_has_its_own_kernels(cache_dir):
    c = rtattn.AttentionConfig(head_dim_qk=128, causal=True, num_heads_q=8, num_heads_kv=2, arch="sm_80",
                               softcap=True, alibi=True)
    back = rtattn.AttentionConfig.from_json(c.to_json())
    assert back == c and back.alibi and '"alibi":true' in c.to_json() and "alibi" in c.describe()
    assert not rtattn.AttentionConfig.from_json(rtattn.AttentionConfig(num_heads_q=8).to_json()).alibi
    rt = rtattn.Runtime(cache_dir=cache_dir)
    plain = rtattn.AttentionConfig(head_dim_qk=128, causal=True, num_heads_q=8, num_heads_kv=2, arch="sm_80",
                                   softcap=True)
    # Their own cache entries, forward and backward: a biased kernel never answers an unbiased config, nor the reverse.
    assert rt.plan(c).key != rt.plan(plain).key
    assert rt.plan_backward(c).key != rt.plan_backward(plain).key and "backward" in rt.plan_backward(c).kernel
    for varlen, paged_kv in ((True, False), (False, True)):  # varlen and paged prefill take it too
        assert rt.plan(rtattn.AttentionConfig(head_dim_qk=128, num_heads_q=8, arch="sm_80", alibi=True, varlen=varlen,
                                              paged_kv=paged_kv)).kernel
    info = rt.precompile(c)  # compiles without a GPU (NVRTC)
    assert info.registers > 0 and info.key == rt.plan(c).key
    # The decode kernels too, a program of their own.
    dec = rt.plan(rtattn.AttentionConfig(head_dim_qk=128, num_heads_q=8, arch="sm_80", decode=True, alibi=True))
    assert dec.key != rt.plan(rtattn.AttentionConfig(head_dim_qk=128, num_heads_q=8, arch="sm_80", decode=True)).key
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.AttentionConfig(alibi="yes")._to_c()
    assert e.value.field == "alibi"


def test_alibi_argument_fields_are_the_c_structs():
    """The slopes' fields, last in the backward's struct and followed by the KV append's in the forward's, as in
    rtattn.h, set through the range-checked door."""
    names = lambda struct: [f[0] for f in struct._fields_]
    assert names(_lib.BackwardArgs)[-2:] == ["alibi_slopes", "alibi_slopes_batch_stride"]
    assert names(_lib.ForwardArgs)[-5:] == ["alibi_slopes", "alibi_slopes_batch_stride", "k_new", "v_new",
                                            "seqlen_new"]
    k = rtattn.Kernel.__new__(rtattn.Kernel)
    a = k.forward_args(alibi_slopes=4096, alibi_slopes_batch_stride=8)
    assert a.alibi_slopes == 4096 and a.alibi_slopes_batch_stride == 8
    assert not rtattn.Kernel.__new__(rtattn.Kernel).forward_args().alibi_slopes  # NULL: every kernel but alibi's
    b = rtattn.BackwardKernel.__new__(rtattn.BackwardKernel).backward_args(alibi_slopes=4096)
    assert b.alibi_slopes == 4096 and b.alibi_slopes_batch_stride == 0


def test_backward_plan_and_precompile_without_a_gpu(cache_dir):
    rt = rtattn.Runtime(cache_dir=cache_dir)
    c = rtattn.AttentionConfig(head_dim_qk=132, causal=True, num_heads_q=8, num_heads_kv=2, arch="sm_80")
    plan = rt.plan_backward(c)
    assert plan.padded_qk == 144 and plan.registers == -1 and "backward" in plan.kernel
    info = rt.precompile_backward(c)
    assert info.registers > 0 and info.spill_bytes == 0 and info.key != rt.plan(c).key
    with pytest.raises(rtattn.ConfigError) as e:
        rt.precompile_backward(head_dim=0, arch="sm_80")
    assert e.value.field == "head_dim_qk"
    previous = rtattn.default_runtime()
    rtattn.set_default_runtime(rt)
    try:
        assert rtattn.precompile_backward(c).from_cache  # the module-level door to the same cache entry
    finally:
        rtattn.set_default_runtime(previous)


def test_version_and_info():
    assert rtattn.__version__ == rtattn.version() and rtattn.version().count(".") == 2
    i = rtattn.info()
    assert i["abi_version"] == _lib.ABI_VERSION and i["nvrtc"][0].isdigit()
    assert "sm_90a" in i["archs"] and "sm_80" in rtattn.known_archs()
    assert i["cache_dir"]


@pytest.mark.parametrize("fields, field", [
    (dict(head_dim=0), "head_dim_qk"), (dict(head_dim=257), "head_dim_qk"), (dict(head_dim=2**40), "head_dim_qk"),
    (dict(head_dim_v=300), "head_dim_v"), (dict(dtype="fp8"), "dtype"), (dict(causal="yes"), "causal"),
    (dict(num_heads_q=6, num_heads_kv=4), "num_heads_kv"), (dict(num_heads_q=0), "num_heads_q"),
    (dict(softmax_scale=-1.0), "softmax_scale"), (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(softmax_scale="big"), "softmax_scale"), (dict(arch="sm_70"), "arch")])
def test_config_errors_name_the_field(fields, field, cache_dir):
    fields.setdefault("arch", "sm_80")
    rt = rtattn.Runtime(cache_dir=cache_dir)
    with pytest.raises(rtattn.ConfigError) as e:
        rt.precompile(**fields)
    assert e.value.field == field
    assert isinstance(e.value, ValueError) and isinstance(e.value, rtattn.Error)
    assert field in str(e.value)


def test_precompile_then_cached(cache_dir):
    lines = []
    rt = rtattn.Runtime(cache_dir=cache_dir, log_level="info", log_callback=lambda lvl, m: lines.append((lvl, m)))
    info = rt.precompile(head_dim=132, causal=True, num_heads_q=16, num_heads_kv=4, arch="sm_90a")
    assert len(info.key) == 64 and info.arch == "sm_90a"
    assert (info.padded_qk, info.padded_v) == (144, 144)  # shifted rows on sm_90a (4 kv heads: 16-byte rows)
    # Where a GPU driver is present, its JIT cache may serve the compile, and NVRTC then gives no ptxas report: both
    # figures are unknown (-1) then, never a made-up count.
    known = info.registers > 0 and info.spill_bytes == 0
    assert (known or (info.registers == info.spill_bytes == -1 and not gpu_unavailable())) and not info.from_cache
    assert 0.9 < info.useful_flop_fraction < 1 and info.reason
    assert any(lvl == "info" and m.startswith("compiling d132") for lvl, m in lines)
    again = rt.precompile(rtattn.AttentionConfig(head_dim_qk=132, causal=True, num_heads_q=16, num_heads_kv=4,
                                                 arch="sm_90a"))
    assert again.key == info.key
    other = rtattn.Runtime(cache_dir=cache_dir).precompile(head_dim=132, causal=True, num_heads_q=16,
                                                          num_heads_kv=4, arch="sm_90a")
    assert other.from_cache and other.key == info.key
    s = rt.stats()
    assert s.compiles == 1 and s.disk_enabled and s.dir.startswith(cache_dir) and s.bytes_written > 0
    p = rt.plan(head_dim=100, arch="sm_80")
    assert p.registers == -1 and (p.padded_qk, p.padded_v) == (112, 104) and p.vec_qk == 4


def test_a_raising_log_callback_does_not_break_the_call(cache_dir):
    def broken(level, message):
        raise RuntimeError("logger broke")
    rt = rtattn.Runtime(cache_dir=cache_dir, log_level="debug", log_callback=broken)
    assert rt.precompile(head_dim=40, arch="sm_80").padded_qk == 48


def test_runtime_option_errors(cache_dir):
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(log_level="loud")
    assert e.value.field == "log_level"
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(lock_timeout_seconds=-5)
    assert e.value.field == "lock_timeout_seconds"
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(max_cache_bytes=-1)
    assert e.value.field == "max_cache_bytes"
    with pytest.raises(rtattn.ConfigError) as e:  # checked where the plan reads it
        rtattn.Runtime(cache_dir=cache_dir, tile_override="1,2,3").plan(head_dim=64, arch="sm_80")
    assert e.value.field == "tile_override"


def test_options_in_effect_and_environment(cache_dir, monkeypatch):
    rt = rtattn.Runtime(cache_dir=cache_dir)
    assert rt.options["max_concurrent_compiles"] >= 1 and rt.options["cache_dir"] == cache_dir
    assert not rt.options["cache_only"] and rt.options["log_level"] == "warn"
    monkeypatch.setenv("RTATTN_CACHE_ONLY", "1")
    monkeypatch.setenv("RTATTN_LOG_LEVEL", "quiet")
    only = rtattn.Runtime(cache_dir=cache_dir)
    assert only.options["cache_only"] and only.options["log_level"] == "quiet"
    with pytest.raises(rtattn.CacheMissError, match="d64 bf16 noncausal h1:1 sm_80"):
        only.precompile(head_dim=64, arch="sm_80")
    monkeypatch.setenv("RTATTN_LOG_LEVEL", "chatty")
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.Runtime(cache_dir=cache_dir)
    assert e.value.field == "RTATTN_LOG_LEVEL"


def test_untrusted_cache_dir_is_not_used(tmp_path):
    d = tmp_path / "team"
    d.mkdir()
    os.chmod(d, 0o777)
    lines = []
    rt = rtattn.Runtime(cache_dir=str(d), log_callback=lambda lvl, m: lines.append(m))
    assert not rt.stats().disk_enabled
    assert any("writable" in m for m in lines)


def test_get_without_a_gpu_raises_a_clear_error(cache_dir):
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("a GPU is present: get() succeeds (tests/test_torch_gpu.py covers it)")
    rt = rtattn.Runtime(cache_dir=cache_dir)
    with pytest.raises(rtattn.ConfigError) as e:
        rt.get(head_dim=64)
    assert e.value.field == "arch" and "no GPU" in str(e.value)
    with pytest.raises(rtattn.CudaError) as e:
        rt.get(head_dim=64, arch="sm_80")
    assert e.value.call


def test_errors_are_per_thread(cache_dir):
    rt = rtattn.Runtime(cache_dir=cache_dir)
    fields, problems = {}, []

    def worker(i):
        for _ in range(50):
            name = ("head_dim_qk", "num_heads_q")[i % 2]
            try:
                rt.plan(**({"head_dim": 0} if i % 2 == 0 else {"num_heads_q": 0}), arch="sm_80")
            except rtattn.ConfigError as e:
                if e.field != name:
                    problems.append((name, e.field))
            fields[i] = name

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems and len(fields) == 4


def test_config_and_fields_are_not_mixed():
    with pytest.raises(TypeError):
        rtattn.precompile(rtattn.AttentionConfig(), head_dim=64)
    with pytest.raises(TypeError):
        rtattn.precompile(head_dimension=64)


def test_importing_rtattn_does_not_import_torch():
    r = run_python("import sys, rtattn; print('torch' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_attention_without_torch_says_so():
    r = run_python("import rtattn\ntry:\n    rtattn.attention(None, None, None)\nexcept ImportError as e:\n"
                   "    print('ImportError', e)\nexcept Exception as e:\n    print(type(e).__name__)")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here")
    except ImportError:
        pass
    assert r.stdout.startswith("ImportError") and "torch" in r.stdout


def test_a_wrong_library_path_is_reported():
    r = run_python("import rtattn", env={"RTATTN_LIBRARY": "/nonexistent/librtattn.so"})
    assert r.returncode != 0
    assert "RTATTN_LIBRARY" in r.stderr and "/nonexistent/librtattn.so" in r.stderr


def test_python_m_rtattn_runs_the_cli(cache_dir):
    env = dict(os.environ, RTATTN_CACHE_DIR=cache_dir)
    r = subprocess.run([sys.executable, "-m", "rtattn", "--version"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and rtattn.version() in r.stdout
    r = subprocess.run([sys.executable, "-m", "rtattn", "precompile", "--head-dim", "72", "--arch", "sm_80"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert rtattn.Runtime(cache_dir=cache_dir).precompile(head_dim=72, arch="sm_80").from_cache
    r = subprocess.run([sys.executable, "-m", "rtattn", "precompile", "--head-dim", "72", "--arch", "sm_80", "--pass",
                        "backward"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert rtattn.Runtime(cache_dir=cache_dir).precompile_backward(head_dim=72, arch="sm_80").from_cache
    r = subprocess.run([sys.executable, "-m", "rtattn", "info", "--head-dim", "132", "--arch", "sm_90a"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "padded 144" in r.stdout
    r = subprocess.run([sys.executable, "-m", "rtattn", "precompile", "--head-dim", "999", "--arch", "sm_80"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "head_dim" in r.stderr
