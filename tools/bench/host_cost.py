"""Host cost per Python call (docs/PERFORMANCE.md): tiny problems, so the GPU idles between launches and the wall
clock per call is the host's; 300 calls between syncs, rounds interleaved over the calls, median of rounds. Needs
torch and a GPU; run with PYTHONPATH=python RTATTN_LIBRARY=<librtattn.so>. Prints one line per call, then a JSON line.

Calls (bf16, d128, 16 query heads on 4): rtattn.attention with 32 queries on 256 keys (the prefill kernel) and one
query on 2048 keys (routed to the decode kernels); attention_with_kvcache with lengths, one query (decode) from a dense
and a 16-row paged cache, one query appending a token into a dense cache (the same rows each call), and 32 queries
(a cache's prefill); attention_varlen with one query a sequence on 256 keys each (the decode shapes packed); PyTorch
SDPA on the same prefill and decode shapes."""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import rtattn

DT, B, HQ, HKV, D = torch.bfloat16, 2, 16, 4, 128
CALLS, ROUNDS = 300, int(sys.argv[1]) if len(sys.argv) > 1 else 7


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=DT)


q32, q1 = rand(B, 32, HQ, D), rand(B, 1, HQ, D)
k, v = rand(B, 256, HKV, D), rand(B, 256, HKV, D)
k2k, v2k = rand(B, 2048, HKV, D), rand(B, 2048, HKV, D)
lens = torch.full((B,), 256, dtype=torch.int32, device="cuda")
k512, v512, k_new, v_new = rand(B, 512, HKV, D), rand(B, 512, HKV, D), rand(B, 1, HKV, D), rand(B, 1, HKV, D)
cu_q = torch.arange(B + 1, device="cuda", dtype=torch.int32)
cu_k = torch.arange(0, 256 * B + 1, 256, device="cuda", dtype=torch.int32)
pk, pv = k.reshape(B * 16, 16, HKV, D).contiguous(), v.reshape(B * 16, 16, HKV, D).contiguous()
table = torch.arange(B * 16, device="cuda", dtype=torch.int32).view(B, 16)
t = lambda x: x.transpose(1, 2)  # noqa: E731 (SDPA's [batch, heads, seq, dim])

calls = {
    "attention prefill": lambda: rtattn.attention(q32, k, v, causal=True),
    "attention 1 query (decode route)": lambda: rtattn.attention(q1, k2k, v2k),
    "kvcache decode dense": lambda: rtattn.attention_with_kvcache(q1, k, v, lens),
    "kvcache decode paged16": lambda: rtattn.attention_with_kvcache(q1, pk, pv, lens, block_table=table),
    "kvcache decode dense + append": lambda: rtattn.attention_with_kvcache(q1, k512, v512, lens, k=k_new, v=v_new),
    "kvcache prefill dense": lambda: rtattn.attention_with_kvcache(q32, k, v, lens, causal=True),
    "varlen 1 query a sequence": lambda: rtattn.attention_varlen(q1.view(B, HQ, D), k.view(-1, HKV, D),
                                                                 v.view(-1, HKV, D), cu_q, cu_k, 1, 256),
    "sdpa prefill": lambda: F.scaled_dot_product_attention(t(q32), t(k), t(v), is_causal=True, enable_gqa=True),
    "sdpa 1 query": lambda: F.scaled_dot_product_attention(t(q1), t(k), t(v), enable_gqa=True),
}
with torch.no_grad():
    for fn in calls.values():
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    rounds = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, fn in calls.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                fn()
            rounds[name].append((time.perf_counter() - start) / CALLS * 1e6)
            torch.cuda.synchronize()
us = {name: round(statistics.median(r), 2) for name, r in rounds.items()}
for name, x in us.items():
    print(f"{name:34s} {x:7.2f} us per call")
print(json.dumps({"host_us_per_call": us, "rounds": ROUNDS, "calls_per_round": CALLS}))
