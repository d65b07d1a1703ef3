"""transformers models on rtattn against sdpa (issue 27), on the current GPU: tokens/s of a training step (forward and
backward of a small Llama-style stack, bf16, random weights, nothing downloaded) at head_dim 128 and 132, and tokens/s
of greedy generate(). Each pair is timed interleaved (rounds alternate the backends; median of rounds), device events
around each step, after warm-ups.

    PYTHONPATH=python RTATTN_LIBRARY=build/librtattn.so python3 tools/bench/transformers_step.py [train|generate]

Shapes: 4 layers, 16 query heads on 4 kv heads, hidden 2048, batch 4 x 4096 tokens (train); batch 8, 512-token
prompts, 128 new tokens (generate). The attention share of the step grows with the sequence: at 4096 tokens it is
most of it, which is where the backends differ."""
import statistics
import sys

import torch
import transformers

from rtattn.integrations import transformers as rt_hf

NAME = rt_hf.register()


def model(impl, head_dim):
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=4,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=head_dim,
                                   max_position_embeddings=8192, attention_dropout=0.0)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    return m.to(device="cuda", dtype=torch.bfloat16)


def timed(fn, reps):
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    out = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return statistics.median(out)


def interleaved(fns, warm, reps, rounds=3):
    for fn in fns.values():
        for _ in range(warm):
            fn()
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timed(fn, reps))
    return {k: statistics.median(t) for k, t in times.items()}


def train():
    b, s = 4, 4096
    for d in (128, 132):
        steps = {}
        for impl in ("sdpa", NAME):
            m = model(impl, d).train()
            ids = torch.randint(0, 32000, (b, s), device="cuda")

            def step(m=m, ids=ids):
                m.zero_grad(set_to_none=True)
                m(input_ids=ids, labels=ids).loss.backward()
            steps[impl] = step
        t = interleaved(steps, warm=2, reps=5)
        print(f"train d{d} B{b} x {s}: " + ", ".join(f"{k} {b * s / v:,.0f} tokens/s ({v * 1e3:.1f} ms)"
                                                    for k, v in t.items()) +
              f"; rtattn / sdpa {t['sdpa'] / t[NAME]:.3f}x", flush=True)
        del steps
        torch.cuda.empty_cache()


def generate():
    b, prompt, new = 8, 512, 128
    for d in (128, 132):
        runs = {}
        for impl in ("sdpa", NAME):
            m = model(impl, d).eval()
            ids = torch.randint(1, 32000, (b, prompt), device="cuda")

            def run(m=m, ids=ids):
                with torch.no_grad():
                    m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                               do_sample=False, pad_token_id=0)
            runs[impl] = run
        t = interleaved(runs, warm=1, reps=3)
        print(f"generate d{d} B{b}, {prompt}-token prompts, {new} new: " +
              ", ".join(f"{k} {b * new / v:,.0f} tokens/s" for k, v in t.items()) +
              f"; rtattn / sdpa {t['sdpa'] / t[NAME]:.3f}x", flush=True)
        del runs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for part in sys.argv[1:] or ["train", "generate"]:
        {"train": train, "generate": generate}[part]()
