"""Serving calls through the Python package, timed per call (CUDA events around each call, host time included, 5
warm-ups, median of 50, three interleaved rounds, median of rounds), on the current GPU:

- kvcache: a d128 decode step (32 query heads on 8, one token) with its new token appended by the call (k=, v=)
  against the same step over a cache that already holds it;
- dense-cache prefill: 512 queries against 8192 keys of a dense cache with lengths (seqlens_k) against the same
  kernel on the same keys without them (on sm_90a the lengths cost the TMA loads);
- paged prefill: 512 queries against 8192 keys of a paged cache (pages of 1 to 256 tokens, shuffled in the pool)
  against rtattn.attention on the same keys dense (issue 24's target: 0.9x at pages of 16..256);
- few-queries: rtattn.attention with one query token (routed to the decode kernels) against attention_with_kvcache
  and PyTorch SDPA's cuDNN and flash backends (enable_gqa), GB/s of K/V read.

    PYTHONPATH=python RTATTN_LIBRARY=build/librtattn.so python3 tools/bench/kvcache_calls.py \
        [kvcache|prefill|paged|route]"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import rtattn

DT = torch.bfloat16


def time_us(fn, n=50):
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    for _ in range(5):
        fn()
    out = []
    for _ in range(n):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return statistics.median(out)


def interleaved(fns, rounds=3):
    """Median over rounds of each function's median, the functions taken in turn within a round (clock drift)."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(time_us(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def kvcache():
    for b, n in [(64, 4096), (8, 32768)]:
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=DT)
        kc = torch.randn(b, n + 16, 8, 128, device="cuda", dtype=DT)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), n - 1, dtype=torch.int32, device="cuda")
        k_new, v_new = torch.randn(b, 1, 8, 128, device="cuda", dtype=DT), torch.randn(b, 1, 8, 128, device="cuda",
                                                                                          dtype=DT)
        t = interleaved({"plain": lambda: rtattn.attention_with_kvcache(q, kc, vc, lens + 1, max_seqlen_k=n),
                         "append": lambda: rtattn.attention_with_kvcache(q, kc, vc, lens, max_seqlen_k=n, k=k_new,
                                                                         v=v_new)})
        print(f"decode d128 32:8 B{b}x{n}: plain {t['plain']:.1f} us, with append {t['append']:.1f} us "
              f"({t['append'] / t['plain']:.3f}x)")


def prefill():
    for d, causal in [(128, True), (128, False), (64, True), (132, True)]:
        b, n, sq = 4, 8192, 512
        q = torch.randn(b, sq, 16, d, device="cuda", dtype=DT)
        kc = torch.randn(b, n, 4, d, device="cuda", dtype=DT)
        vc = torch.randn_like(kc)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        ragged = lens - 37  # each sequence's last key block partly filled
        t = interleaved({"cache": lambda: rtattn.attention_with_kvcache(q, kc, vc, lens, causal=causal),
                         "ragged": lambda: rtattn.attention_with_kvcache(q, kc, vc, ragged, causal=causal),
                         "dense": lambda: rtattn.attention(q, kc, vc, causal=causal)})
        print(f"dense-cache prefill d{d} {'causal' if causal else 'full'} B{b} q{sq} k{n}: with lengths "
              f"{t['cache']:.1f} us ({t['dense'] / t['cache']:.3f}x), {n - 37} each {t['ragged']:.1f} us "
              f"({t['dense'] / t['ragged']:.3f}x), without {t['dense']:.1f} us")


def paged():
    for d, causal in [(128, True), (128, False), (64, True), (132, True), (192, True), (256, True)]:
        b, n, sq, hkv = 4, 8192, 512, 4
        q = torch.randn(b, sq, 16, d, device="cuda", dtype=DT)
        k = torch.randn(b, n, hkv, d, device="cuda", dtype=DT)
        v = torch.randn_like(k)
        lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
        calls = {"dense": lambda: rtattn.attention(q, k, v, causal=causal)}
        for ps in (1, 16, 64, 256):
            # Sequence b's page j is pool page order[b * per + j]: the pool holds the dense keys, shuffled by pages.
            per = n // ps
            order = torch.randperm(b * per, device="cuda")
            pool_k, pool_v = (torch.empty(b * per, ps, hkv, d, device="cuda", dtype=DT) for _ in range(2))
            pool_k[order] = k.reshape(b * per, ps, hkv, d)
            pool_v[order] = v.reshape(b * per, ps, hkv, d)
            table = order.view(b, per).to(torch.int32)
            calls[f"page{ps}"] = (lambda kp=pool_k, vp=pool_v, t=table: rtattn.attention_with_kvcache(
                q, kp, vp, lens, block_table=t, causal=causal))
        t = interleaved(calls)
        print(f"paged prefill d{d} {'causal' if causal else 'full'} B{b} q{sq} k{n} 16:{hkv}: "
              f"dense {t['dense']:.1f} us; " +
              ", ".join(f"{name} {m:.1f} us ({t['dense'] / m:.3f}x)" for name, m in t.items() if name != "dense"))


def route():
    def sdpa(backend, q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    for b, n in [(64, 4096), (8, 32768), (1, 131072)]:
        q = torch.randn(b, 1, 32, 128, device="cuda", dtype=DT)
        k = torch.randn(b, n, 8, 128, device="cuda", dtype=DT)
        v = torch.randn_like(k)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        t = interleaved({"attention": lambda: rtattn.attention(q, k, v),
                         "kvcache": lambda: rtattn.attention_with_kvcache(q, k, v),
                         "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, qt, kt, vt),
                         "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, qt, kt, vt)})
        gb = 2 * b * n * 8 * 128 * 2 / 1e9
        print(f"B{b}x{n}: " + ", ".join(f"{k} {m:.1f} us ({gb / (m * 1e-6):.0f} GB/s)" for k, m in t.items()) +
              f"; cudnn/attention {t['cudnn'] / t['attention']:.3f}, kvcache/attention "
              f"{t['kvcache'] / t['attention']:.3f}")


if __name__ == "__main__":
    with torch.no_grad():
        for part in sys.argv[1:] or ["kvcache", "prefill", "route"]:
            {"kvcache": kvcache, "prefill": prefill, "paged": paged, "route": route}[part]()
