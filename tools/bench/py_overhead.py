"""Host cost of one rtattn.attention call from Python (and of the torch.ops entry and of PyTorch's own SDPA flash
call, for scale), and the kernel's device time, to compare with tools/bench/call_overhead (the C++ API). Prints JSON
lines. Needs torch and a GPU; run with PYTHONPATH=python RTATTN_LIBRARY=<librtattn.so>.
  host: batch 1, 128 tokens, 8 heads, d128; 256 calls back to back, wall time per call, median of 30 rounds.
  device: batch 4 x 4096 tokens x 32 heads, d128, random data, 10 calls between two CUDA events, median of 30."""
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import rtattn

CALLS, ROUNDS = 256, 30


def host_us(fn):
    for _ in range(3):
        fn()
    out = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        out.append((time.perf_counter() - t0) / CALLS * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def device_ms(fn, per_event=10):
    """Ten calls between two events, so that the host's cost per call never shows on the device clock."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per_event):
            fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / per_event)
    return statistics.median(out)


def emit(**kw):
    print(json.dumps(kw), flush=True)


def tensors(b, s, h, d):
    return [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]


q, k, v = tensors(1, 128, 8, 128)
emit(api="python", what="host_us_per_call", value=round(host_us(lambda: rtattn.attention(q, k, v)), 3))
with torch.inference_mode():
    emit(api="python, inference_mode", what="host_us_per_call",
         value=round(host_us(lambda: rtattn.attention(q, k, v)), 3))
    op = torch.ops.rtattn.attention
    emit(api="torch.ops", what="host_us_per_call",
         value=round(host_us(lambda: op(q, k, v, False, None, False)), 3))
    # Where the Python call's time goes (each piece alone).
    from rtattn import _torch as rt_torch
    emit(api="part: argument checks", what="host_us_per_call",
         value=round(host_us(lambda: rt_torch._check(q, k, v, False, None)), 3))
    emit(api="part: torch.empty of the output", what="host_us_per_call",
         value=round(host_us(lambda: torch.empty((1, 128, 8, 128), dtype=q.dtype, device=q.device)), 3))
    kernel = rt_torch._kernel(q.device, q.dtype, 128, 128, 8, 8, False, None)
    o = torch.empty_like(q)
    args = rt_torch._lib.ForwardArgs(rt_torch._ARGS_SIZE, rt_torch._tensor(q), rt_torch._tensor(k),
                                     rt_torch._tensor(v), rt_torch._tensor(o), None, 1, 128, 128)
    stream = rt_torch._raw_stream(0)
    emit(api="part: args struct", what="host_us_per_call", value=round(host_us(
        lambda: rt_torch._lib.ForwardArgs(rt_torch._ARGS_SIZE, rt_torch._tensor(q), rt_torch._tensor(k),
                                          rt_torch._tensor(v), rt_torch._tensor(o), None, 1, 128, 128)), 3))
    emit(api="part: ctypes launch (C ABI + C++)", what="host_us_per_call",
         value=round(host_us(lambda: kernel.launch(args, stream)), 3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        emit(api="torch sdpa flash", what="host_us_per_call",
             value=round(host_us(lambda: F.scaled_dot_product_attention(qt, kt, vt)), 3))
    q, k, v = tensors(4, 4096, 32, 128)
    for causal in (False, True):
        ms = device_ms(lambda: rtattn.attention(q, k, v, causal=causal))
        flops = 4.0 * 4 * 32 * 4096 * 4096 * 128 / (2 if causal else 1)
        emit(api="python", what="device_ms", causal=causal, value=round(ms, 4), tflops=round(flops / ms / 1e9, 1))
