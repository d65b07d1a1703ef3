"""FlexAttention (torch.nn.attention.flex_attention, compiled) on the variants PyTorch's SDPA kernels lack: sliding
windows (a block mask) and ALiBi (a score modifier), forward and backward alone, beside the same shapes without the
variant. The peer of `rtattn bench --window ... / --alibi off,on [--backward]`: run both in one device command and
compare milliseconds shape by shape (this script prints the FLOP counts rtattn bench uses: 4 B H Sq Sk d over the
(query, key) pairs a window or the causal mask keeps; backward 2.5x).

Shapes as rtattn bench's: bf16, B = 16384 / S, H = 2048 / d (16 at d132). Env: HDIMS (64,128,256), SEQ (16384),
WINDOWS (4096,128: causal windows (W, 0)), REPS (20).
    python3 tools/bench/flex_variants.py"""
import os
import statistics
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

dev = "cuda"
REPS = int(os.environ.get("REPS", "20"))
HDIMS = [int(v) for v in os.environ.get("HDIMS", "64,128,256").split(",")]
S = int(os.environ.get("SEQ", "16384"))
WINDOWS = [int(v) for v in os.environ.get("WINDOWS", "4096,128").split(",")]
flex = torch.compile(flex_attention, dynamic=False)
props = torch.cuda.get_device_properties(0)
print(f"# device {props.name} torch={torch.__version__}; flex_attention compiled; bf16, B*S = 16384", flush=True)


def median_ms(fn, reps=REPS, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def pairs(causal, window):
    """(query, key) pairs the mask keeps, S x S, bottom-right (here Sq = Sk)."""
    if window is None:
        return S * S / 2 if causal else S * S
    w = min(window, S - 1)
    return (w + 1) * S - w * (w + 1) / 2  # keys i - w .. i per query, cut at 0


def run(d, name, causal, window=None, alibi=False):
    # Each call's mask and score functions are new closures: past dynamo's recompile limit flex_attention would fall
    # back to its unfused path (scores materialized: 8 TFLOPS, then out of memory), so each run compiles afresh.
    torch._dynamo.reset()
    B, H = max(1, 16384 // S), (16 if d == 132 else max(1, 2048 // d))
    q, k, v = (torch.randn(B, H, S, d, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1, device=dev) / H)  # BLOOM's, as rtattn bench's

    def mask_mod(b, h, qi, ki):
        keep = qi >= ki if causal else qi >= 0
        return keep & (qi - ki <= window) if window is not None else keep

    def alibi_mod(score, b, h, qi, ki):
        return score - slopes[h] * (qi - ki).abs()

    bm = create_block_mask(mask_mod, B, H, S, S, device=dev) if (causal or window is not None) else None
    kw = dict(block_mask=bm, score_mod=alibi_mod if alibi else None)
    fl = 4 * B * H * pairs(causal, window) * d
    try:
        t0 = time.time()
        o = flex(q, k, v, **kw)
        torch.cuda.synchronize()
        first = time.time() - t0
        with torch.no_grad():
            fwd = median_ms(lambda: flex(q, k, v, **kw))
        g = torch.randn_like(o)
        bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), reps=max(5, REPS // 2))
        print(f"flex d={d:3d} S={S} B={B} H={H:2d} {name:<22} fwd {fwd:8.3f} ms {fl / fwd / 1e9:6.1f} TFLOPS | "
              f"bwd {bwd:8.3f} ms {2.5 * fl / bwd / 1e9:6.1f} TFLOPS | first call {first:.1f} s", flush=True)
    except Exception as ex:  # a shape flex cannot take is reported, not fatal
        msg = str(ex).splitlines()[0][:100] if str(ex) else type(ex).__name__
        print(f"flex d={d:3d} S={S} {name:<22} ERR {msg}", flush=True)
    del q, k, v
    torch.cuda.empty_cache()


for d in HDIMS:  # "causal alibi off" is the full causal the windows compare with
    for w in WINDOWS:
        run(d, f"causal window {w}:0", True, window=w)
    for causal in (False, True):
        run(d, f"{'causal' if causal else 'full'} alibi off", causal)
        run(d, f"{'causal' if causal else 'full'} alibi on", causal, alibi=True)
