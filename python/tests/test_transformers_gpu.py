"""rtattn as a transformers attention backend (rtattn.integrations.transformers) on the GPU: small models built from
configs with random weights (nothing downloaded), bf16, against the same model with attn_implementation="sdpa" and a
float32 "eager" reference. Logits of a padded batch and a training step's gradients within the 2x-PyTorch-error rule;
greedy generate() from left-padded prompts gives sdpa's tokens (or diverges only at a near-tie, reported)."""
import copy

import pytest

torch = pytest.importorskip("torch", reason="no GPU tests here: torch is not installed")
transformers = pytest.importorskip("transformers", reason="no transformers here")

from rtattn.integrations import transformers as rt_hf  # noqa: E402

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("no GPU tests here: no CUDA device", allow_module_level=True)

NAME = rt_hf.register()


def small(kind, head_dim=128):
    """A two-layer config of the family, scaled down, with the family's attention features."""
    common = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=512,
                  attention_dropout=0.0)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":  # biases on q/k/v
        return transformers.Qwen2Config(**common)
    if kind == "mistral":  # a sliding window shorter than the prompts
        return transformers.MistralConfig(**common, sliding_window=24)
    if kind == "phi3":  # fused qkv_proj; head_dim is hidden_size / heads in Phi-3
        common.update(hidden_size=8 * head_dim, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # ids in the vocab
        return transformers.Phi3Config(**common)
    if kind == "gemma2":  # softcap, alternating sliding layers, query_pre_attn_scalar scaling
        return transformers.Gemma2Config(**common, sliding_window=24, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=None, query_pre_attn_scalar=96)
    if kind == "gptoss":  # sinks (s_aux), alternating sliding layers; one expert, so no routing choice can flip
        return transformers.GptOssConfig(**common, sliding_window=24, num_local_experts=1, num_experts_per_tok=1,
                                         layer_types=["sliding_attention", "full_attention"])
    raise ValueError(kind)


CASES = [("llama", 128), ("llama", 132), ("qwen2", 64), ("qwen2", 128), ("phi3", 96), ("mistral", 128),
         ("gemma2", 128), ("gptoss", 64)]


def baseline(kind):
    """The bf16 implementation ours is held to: sdpa, or eager where the family refuses sdpa (gpt-oss's sinks)."""
    return "eager" if kind == "gptoss" else "sdpa"


def build(cfg, impl, dtype):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl)
    return model.to(device="cuda", dtype=dtype).eval()


def models(cfg, base="sdpa"):
    ref = build(cfg, "eager", torch.float32)
    g = torch.Generator(device="cuda").manual_seed(3)
    with torch.no_grad():  # the reference runs the bf16 models' own weights, in float32
        for name, p in ref.named_parameters():
            if name.endswith(".sinks"):  # initialized near 0; sinks of 0.5..3.5 take a real share of the softmax
                p.copy_(torch.rand(p.shape, device="cuda", generator=g) * 3 + 0.5)
            p.copy_(p.to(torch.bfloat16).float())
    other = build(cfg, base, torch.bfloat16)
    ours = build(cfg, NAME, torch.bfloat16)
    for m in (other, ours):
        m.load_state_dict({k: v.to(torch.bfloat16) for k, v in ref.state_dict().items()})
    return ref, other, ours


def batch(lens, total, vocab):
    """Left-padded prompts of the given lengths (pad id 0) and their mask."""
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(1, vocab, (len(lens), total), device="cuda", generator=g)
    mask = torch.zeros(len(lens), total, dtype=torch.long, device="cuda")
    for i, n in enumerate(lens):
        mask[i, total - n:] = 1
        ids[i, :total - n] = 0
    return ids, mask


def rel(a, b, keep):
    a, b = a.double()[keep], b.double()[keep]
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kind,d", CASES)
def test_logits_of_a_padded_batch(kind, d):
    cfg = small(kind, d)
    ref, sdpa, ours = models(cfg, baseline(kind))
    ids, mask = batch([70, 33, 70, 5], 70, cfg.vocab_size)
    keep = mask.bool()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        base = rel(sdpa(input_ids=ids, attention_mask=mask).logits, want, keep)
        got = ours(input_ids=ids, attention_mask=mask).logits
    assert torch.isfinite(got[keep]).all()
    err = rel(got, want, keep)
    assert err <= 2 * base + 1e-5, (kind, d, err, base)
    # Unpadded (no mask): the dense call.
    with torch.no_grad():
        full = torch.ones_like(mask)
        err_full = rel(ours(input_ids=ids, attention_mask=full).logits, ref(input_ids=ids, attention_mask=full).logits,
                       full.bool())
        base_full = rel(sdpa(input_ids=ids, attention_mask=full).logits,
                        ref(input_ids=ids, attention_mask=full).logits, full.bool())
    assert err_full <= 2 * base_full + 1e-5, (kind, d, err_full, base_full)


@pytest.mark.parametrize("kind,d", CASES)
def test_training_step_gradients(kind, d):
    cfg = small(kind, d)
    # The baseline is eager attention in bf16: sdpa's backward gave NaN gradients on this left-padded batch (the
    # padding rows, masked whole, on an H200 with torch 2.11 and transformers 5.17).
    ref, eager, ours = models(cfg, base="eager")
    ids, mask = batch([64, 40], 64, cfg.vocab_size)
    # No label is predicted from a padding position: the loss shifts labels by one, so the first real token of a
    # left-padded row is masked too (a padding row's output is each implementation's own, rtattn's zeros; with that
    # label in the loss, layer 0's weight gradients differed from eager's by 6-10%, sdpa's were NaN).
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:].masked_fill_((mask[:, 1:] == 1) & (mask[:, :-1] == 0), -100)

    def grads(model):
        model.train()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        return {n: p.grad.double() for n, p in model.named_parameters()
                if p.grad is not None and ("proj" in n or n.endswith(".sinks"))}

    want, base, got = grads(ref), grads(eager), grads(ours)
    for name in want:
        assert torch.isfinite(got[name]).all(), (kind, d, name)
        e = ((got[name] - want[name]).norm() / want[name].norm()).item()
        b = ((base[name] - want[name]).norm() / want[name].norm()).item()
        assert e <= 2 * b + 1e-5, (kind, d, name, e, b)


@pytest.mark.parametrize("kind,d,cache", [("llama", 128, "dynamic"), ("llama", 132, "dynamic"),
                                          ("mistral", 128, "dynamic"), ("llama", 128, "static"),
                                          ("gptoss", 64, "dynamic")])
def test_greedy_generate_matches_sdpa(kind, d, cache):
    cfg = small(kind, d)
    _, sdpa, ours = models(cfg, baseline(kind))
    ids, mask = batch([20, 7, 13], 20, cfg.vocab_size)
    kw = dict(attention_mask=mask, max_new_tokens=32, do_sample=False, pad_token_id=0)
    if cache == "static":  # the preallocated buffer: keys past the filled slots must not be attended
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        a = sdpa.generate(ids, **kw, output_scores=True, return_dict_in_generate=True)
        b = ours.generate(ids, **kw)
    new_a, new_b = a.sequences[:, ids.shape[1]:], b[:, ids.shape[1]:]
    for row in range(ids.shape[0]):
        diff = (new_a[row] != new_b[row]).nonzero()
        if diff.numel() == 0:
            continue
        step = diff[0].item()
        top2 = a.scores[step][row].float().topk(2).values
        gap = (top2[0] - top2[1]).item()
        # A divergence is allowed only at a near-tie of sdpa's own logits (bf16's resolution there).
        assert gap < 0.05 * top2[0].abs().item() + 0.1, (kind, d, row, step, gap)


@pytest.mark.parametrize("kind,d", [("llama", 128), ("mistral", 128)])
def test_padding_free_packed_batch(kind, d):
    """Sequences packed in one row, their positions restarting (a padding-free collator): each attends only to its
    own, as when run alone."""
    cfg = small(kind, d)
    ref, sdpa, ours = models(cfg)
    lens = [30, 7, 41]
    g = torch.Generator(device="cuda").manual_seed(2)
    seqs = [torch.randint(1, cfg.vocab_size, (1, n), device="cuda", generator=g) for n in lens]
    ids = torch.cat(seqs, dim=1)
    pos = torch.cat([torch.arange(n, device="cuda") for n in lens])[None]
    with torch.no_grad():
        got = ours(input_ids=ids, position_ids=pos).logits
        want = torch.cat([ref(input_ids=x).logits for x in seqs], dim=1)
        base = torch.cat([sdpa(input_ids=x).logits for x in seqs], dim=1)
    keep = torch.ones(ids.shape, dtype=torch.bool, device="cuda")
    assert torch.isfinite(got).all()
    err, b = rel(got, want, keep), rel(base, want, keep)
    assert err <= 2 * b + 1e-5, (kind, d, err, b)


def test_set_attn_implementation_switches_a_built_model():
    """A model built with sdpa, switched to rtattn afterwards (where the installed transformers offers it)."""
    cfg = small("llama")
    ref, model, _ = models(cfg)
    if not hasattr(model, "set_attn_implementation"):
        pytest.skip(f"transformers {transformers.__version__} has no set_attn_implementation")
    ids, mask = batch([40, 17], 40, cfg.vocab_size)
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
        base = rel(model(input_ids=ids, attention_mask=mask).logits, want, mask.bool())
        model.set_attn_implementation(NAME)
        assert model.config._attn_implementation == NAME
        err = rel(model(input_ids=ids, attention_mask=mask).logits, want, mask.bool())
    assert err <= 2 * base + 1e-5, (err, base)


def test_refusals_name_the_feature():
    cfg = small("llama")
    model = build(cfg, NAME, torch.bfloat16)
    layer = model.model.layers[0].self_attn
    q = torch.randn(1, 8, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 4, 128, device="cuda", dtype=torch.bfloat16)
    layer.train()
    with pytest.raises(NotImplementedError, match="dropout"):
        rt_hf.attention_forward(layer, q, k, k, None, dropout=0.1)
    layer.eval()
    with pytest.raises(NotImplementedError, match="output_attentions"):
        rt_hf.attention_forward(layer, q, k, k, None, output_attentions=True)
    with pytest.raises(ValueError, match="4-D"):
        rt_hf.attention_forward(layer, q, k, k, torch.zeros(1, 1, 4, 4, device="cuda"))
