"""A cache's prefill timed two ways, and the host cost of the calls, on the current GPU (docs/PERFORMANCE.md,
thirty-first session). B4, 512 queries on 8192 keys, 16 query heads on 4, bf16; d128 causal and not, d132 and d64
causal: rtattn.attention on dense keys ("dense"), attention_with_kvcache on a dense cache with lengths ("lens") and
on paged caches of pages 1, 4, 16, 64, 256 (shuffled in the pool). Each is timed as device time (20 calls back to
back between two events, so the host's time hides under the GPU's; median of 15) and per call (events around one
call, host time included; median of 30), three interleaved rounds, median of rounds. Then the host cost per call:
tiny shapes (the GPU idles between launches), 300 calls between syncs, wall clock, against SDPA.

    PYTHONPATH=python RTATTN_LIBRARY=build/librtattn.so python3 tools/bench/cache_prefill.py"""
import statistics, torch, rtattn
DT = torch.bfloat16

def t_call(fn, n=30):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    for _ in range(5): fn()
    out = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); out.append(s.elapsed_time(e) * 1e3)
    return statistics.median(out)

def t_dev(fn, n=15, k=20):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    for _ in range(3): fn()
    out = []
    for _ in range(n):
        s.record()
        for _ in range(k): fn()
        e.record(); e.synchronize(); out.append(s.elapsed_time(e) * 1e3 / k)
    return statistics.median(out)

for d, causal in [(128, True), (128, False), (132, True), (64, True)]:
    b, n, sq, hkv = 4, 8192, 512, 4
    q = torch.randn(b, sq, 16, d, device="cuda", dtype=DT)
    k = torch.randn(b, n, hkv, d, device="cuda", dtype=DT); v = torch.randn_like(k)
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    calls = {"dense": lambda: rtattn.attention(q, k, v, causal=causal),
             "lens": lambda: rtattn.attention_with_kvcache(q, k, v, lens, causal=causal)}
    for ps in (1, 4, 16, 64, 256):
        per = n // ps
        order = torch.randperm(b * per, device="cuda")
        pk, pv = (torch.empty(b * per, ps, hkv, d, device="cuda", dtype=DT) for _ in range(2))
        pk[order] = k.reshape(b * per, ps, hkv, d); pv[order] = v.reshape(b * per, ps, hkv, d)
        tab = order.view(b, per).to(torch.int32)
        calls[f"page{ps}"] = (lambda kp=pk, vp=pv, t=tab: rtattn.attention_with_kvcache(q, kp, vp, lens, block_table=t,
                                                                                           causal=causal))
    dev = {m: [] for m in calls}; call = {m: [] for m in calls}
    for _ in range(3):
        for m, fn in calls.items():
            dev[m].append(t_dev(fn)); call[m].append(t_call(fn))
    dev = {m: statistics.median(x) for m, x in dev.items()}; call = {m: statistics.median(x) for m, x in call.items()}
    print(f"d{d} {'causal' if causal else 'full'} B{b} q{sq} k{n} 16:{hkv} "
          "device/per-call us (device ratio to dense): " +
          ", ".join(f"{m} {dev[m]:.1f}/{call[m]:.1f} ({dev['dense'] / dev[m]:.3f}x)" for m in calls))

# Host cost per call: tiny problems (the GPU idles between launches), 300 calls between syncs, wall clock.
import time
b, hkv, d = 2, 4, 128
q = torch.randn(b, 32, 16, d, device="cuda", dtype=DT)
k = torch.randn(b, 256, hkv, d, device="cuda", dtype=DT); v = torch.randn_like(k)
lens = torch.full((b,), 256, dtype=torch.int32, device="cuda")
calls = {"attention": lambda: rtattn.attention(q, k, v, causal=True),
         "kvcache lens": lambda: rtattn.attention_with_kvcache(q, k, v, lens, causal=True)}
for ps in (1, 16, 256):
    per = 256 // ps
    pk = k.reshape(b * per, ps, hkv, d).contiguous(); pv = v.reshape(b * per, ps, hkv, d).contiguous()
    tab = torch.arange(b * per, device="cuda", dtype=torch.int32).view(b, per)
    calls[f"paged{ps}"] = (lambda kp=pk, vp=pv, t=tab: rtattn.attention_with_kvcache(q, kp, vp, lens, block_table=t,
                                                                                       causal=True))
calls["sdpa"] = lambda: torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                         v.transpose(1, 2), is_causal=True,
                                                                         enable_gqa=True)
res = {}
for m, fn in calls.items():
    for _ in range(20): fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(300): fn()
        rounds.append((time.perf_counter() - t) / 300 * 1e6)
        torch.cuda.synchronize()
    res[m] = statistics.median(rounds)
print("host us per call (tiny shapes, 300 calls between syncs): " + ", ".join(f"{m} {t:.1f}" for m, t in res.items()))
