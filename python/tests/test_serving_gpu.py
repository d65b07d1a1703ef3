"""rtattn.attention_varlen, attention_with_kvcache and merge_states on the GPU against float64 SDPA per sequence:
packed ragged batches with empty sequences (forward and gradients), decode from a dense and a paged cache (vLLM block
table, shuffled pages, ragged lengths, several splits), sliding windows, attention sinks and logit softcapping in each,
ALiBi in varlen (its and softcap's gradients judged as test_torch_gpu's) and in the decode, a dense cache's prefill,
the KV append (k=, v=), cascade attention through merge_states; torch.compile and CUDA graph capture of a decode step
(with an append too); argument errors naming the argument."""
import math

import pytest

torch = pytest.importorskip("torch", reason="no GPU tests here: torch is not installed")

import rtattn  # noqa: E402
from test_torch_gpu import (CAPS, TOL, compiled_grads_match_eager, grad_err, judge_against_torch, lse_tol,  # noqa: E402
                            make_sinks, make_slopes, poison_allocator, rel_err, sdpa_reference)

pytestmark = pytest.mark.gpu


def packed_batch(lens_q, lens_k, hq, hkv, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(sum(lens_k), hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(sum(lens_k), hkv, d, device="cuda", dtype=dtype, generator=g)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    return q, k, v, cu(lens_q), cu(lens_k)


def per_sequence_reference(q, k, v, lens_q, lens_k, causal, scale, window=(-1, -1), sinks=None, softcap=0.0,
                           dtype=torch.float64, alibi_slopes=None):
    """O [total_q, hq, dv] and LSE [hq, total_q] in float64, one SDPA per sequence (with sinks, sdpa_reference's
    explicit softmax, which gives a sequence without keys O = 0 and LSE = the sinks; softcap > 0 caps the scores;
    alibi_slopes [heads_q] or [sequences, heads_q] bias them, each sequence's distances its own). dtype: the math in
    another dtype, as sdpa_reference's."""
    os, lses, i, j = [], [], 0, 0
    for n, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq and (lk or sinks is not None):
            slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[n]
            o, lse = sdpa_reference(q[None, i:i + lq], k[None, j:j + lk], v[None, j:j + lk], causal, scale, window,
                                    sinks, softcap, dtype, slopes)
            os.append(o[0]), lses.append(lse[0])
        elif lq:
            os.append(torch.zeros(lq, q.shape[1], v.shape[2], dtype=dtype, device="cuda"))
            lses.append(torch.full((q.shape[1], lq), math.inf, dtype=dtype, device="cuda"))
        i, j = i + lq, j + lk
    return torch.cat(os), torch.cat(lses, 1)


@pytest.mark.parametrize("d, causal, dtype, window, sinks", [(128, True, torch.bfloat16, (-1, -1), False),
                                                             (64, False, torch.float16, (-1, -1), False),
                                                             (132, True, torch.bfloat16, (-1, -1), False),
                                                             (80, True, torch.float16, (-1, -1), False),
                                                             (128, True, torch.bfloat16, (50, -1), False),
                                                             (132, False, torch.float16, (20, 3), False),
                                                             (128, True, torch.bfloat16, (-1, -1), True),
                                                             (64, False, torch.float16, (-1, -1), True),
                                                             (132, True, torch.bfloat16, (50, -1), True),
                                                             (64, False, torch.float16, (20, 3), True)])
def test_varlen_forward_and_gradients(d, causal, dtype, window, sinks):
    lens_q, lens_k = [37, 0, 300, 1, 129], [37, 5, 300, 64, 129]
    if sinks:  # rows without keys too: a sequence with none, and 80 queries on 64 keys (causal, windows)
        lens_q, lens_k = lens_q + [20, 80], lens_k + [0, 64]
    q, k, v, cu_q, cu_k = packed_batch(lens_q, lens_k, 8, 2, d, dtype, seed=d)
    scale = 1 / math.sqrt(d)
    poison_allocator(1 << 24)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    if sinks:
        leaves.append(make_sinks(8, d).requires_grad_())
        ref_leaves.append(leaves[3].detach().double().requires_grad_())
    o, lse = rtattn.attention_varlen(*leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                     return_lse=True, window_size=window, sinks=leaves[3] if sinks else None)
    ref_o, ref_lse = per_sequence_reference(*ref_leaves[:3], lens_q, lens_k, causal, scale, window,
                                            ref_leaves[3] if sinks else None)
    assert rel_err(o, ref_o) < TOL[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < 1e-3
    dout = torch.randn_like(o)
    o.backward(dout)
    ref_o.backward(dout.double())
    for t, r in zip(leaves, ref_leaves):
        assert rel_err(t.grad, r.grad) < TOL[dtype] * 1.5


@pytest.mark.parametrize("d, causal, dtype, window, sinks", [(128, True, torch.bfloat16, (-1, -1), False),
                                                             (64, False, torch.float16, (-1, -1), False),
                                                             (132, True, torch.bfloat16, (50, -1), False),
                                                             (64, False, torch.float16, (20, 3), True),
                                                             (132, True, torch.bfloat16, (-1, -1), True)])
@pytest.mark.parametrize("softcap, spread", [(5.0, 3.0), (30.0, 1.0)])
def test_varlen_forward_with_softcap(d, causal, dtype, window, sinks, softcap, spread):
    # Rows without keys too: a sequence with none, and 80 queries on 64 keys (causal, windows).
    lens_q, lens_k = [37, 0, 300, 1, 129, 20, 80], [37, 5, 300, 64, 129, 0, 64]
    q, k, v, cu_q, cu_k = packed_batch(lens_q, lens_k, 8, 2, d, dtype, seed=d + 1)
    q = q * spread  # the scaled scores' standard deviation: 3 reaches +-10, where a cap of 5 bites
    s = make_sinks(8, d) if sinks else None
    poison_allocator(1 << 24)
    o, lse = rtattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, return_lse=True,
                                     window_size=window, sinks=s, softcap=softcap)
    ref_o, ref_lse = per_sequence_reference(q, k, v, lens_q, lens_k, causal, 1 / math.sqrt(d), window, s, softcap)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ref_o) < TOL[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < lse_tol(max(lens_k))


def per_sequence_grads(leaves, dout, lens_q, lens_k, causal, scale, window, softcap, dtype, alibi_slopes=None):
    """The gradients of per_sequence_reference's O, dout into it, with respect to leaves (q, k, v, and the sinks
    where there is a fourth), the math and its autograd in dtype; alibi_slopes, constants, as given."""
    ref = [t.detach().to(dtype).requires_grad_() for t in leaves]
    o, _ = per_sequence_reference(*ref[:3], lens_q, lens_k, causal, scale, window, ref[3] if len(ref) > 3 else None,
                                  softcap, dtype, alibi_slopes)
    return torch.autograd.grad(o, ref, dout.to(dtype))


@pytest.mark.parametrize("d, causal, dtype, window, sinks", [(64, False, torch.bfloat16, (-1, -1), False),
                                                             (128, True, torch.float16, (-1, -1), False),
                                                             (132, True, torch.bfloat16, (50, -1), True),
                                                             (256, False, torch.float16, (20, 3), True),
                                                             (128, True, torch.bfloat16, (-1, -1), True)])
@pytest.mark.parametrize("softcap, spread", CAPS)
def test_varlen_gradients_with_softcap(d, causal, dtype, window, sinks, softcap, spread):
    # Sequences without queries or keys, and 80 queries on 64 keys (causal, windows): rows without keys.
    lens_q, lens_k = [37, 0, 300, 1, 129, 20, 80], [37, 5, 300, 64, 129, 0, 64]
    q, k, v, cu_q, cu_k = packed_batch(lens_q, lens_k, 8, 2, d, dtype, seed=d + 2)
    leaves = [t.detach().requires_grad_() for t in (q * spread, k, v)]
    if sinks:  # values bf16 holds exactly, so PyTorch's 16-bit run has the sinks ours has
        leaves.append(make_sinks(8, d, torch.bfloat16).float().requires_grad_())
    g = torch.Generator(device="cuda").manual_seed(d + 3)
    dout = torch.randn(sum(lens_q), 8, d, device="cuda", dtype=dtype, generator=g)
    poison_allocator(1 << 24)
    o = rtattn.attention_varlen(*leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, window_size=window,
                                sinks=leaves[3] if sinks else None, softcap=softcap)
    got = torch.autograd.grad(o, leaves, dout)
    torch.cuda.synchronize()
    for name, grad, leaf in zip(("dq", "dk", "dv", "dsinks"), got, leaves):
        assert grad.dtype == leaf.dtype, name
    ref, low = (per_sequence_grads(leaves, dout, lens_q, lens_k, causal, 1 / math.sqrt(d), window, softcap, dt)
                for dt in (torch.float64, dtype))
    judge_against_torch(("dq", "dk", "dv", "dsinks"), got, ref, low, dtype)


@pytest.mark.parametrize("d, causal, dtype, dims, extras", [(64, True, torch.bfloat16, 2, False),
                                                            (128, False, torch.float16, 1, False),
                                                            (128, True, torch.float16, 2, False),
                                                            (64, False, torch.bfloat16, 2, True)])
def test_varlen_with_alibi(d, causal, dtype, dims, extras):
    """Forward and gradients with ALiBi slopes per sequence (2 dims: [sequences, heads_q], rows 2 * heads_q apart)
    or shared (1 dim); extras: with sinks, a cap and a window too. Sequences without queries or keys, and 80 queries on
    64 keys: rows without keys, and a diagonal before the first key."""
    lens_q, lens_k = [37, 0, 300, 1, 129, 20, 80], [37, 5, 300, 64, 129, 0, 64]
    q, k, v, cu_q, cu_k = packed_batch(lens_q, lens_k, 8, 2, d, dtype, seed=d + 11)
    slopes = make_slopes(len(lens_q), 8, d + 11, dims)
    softcap, spread = CAPS[0] if extras else (0.0, 1.0)
    window = (50, -1) if extras else (-1, -1)
    leaves = [t.detach().requires_grad_() for t in (q * spread, k, v)]
    if extras:  # values bf16 holds exactly, so PyTorch's 16-bit run has the sinks ours has
        leaves.append(make_sinks(8, d, torch.bfloat16).float().requires_grad_())
    g = torch.Generator(device="cuda").manual_seed(d + 12)
    dout = torch.randn(sum(lens_q), 8, d, device="cuda", dtype=dtype, generator=g)
    poison_allocator(1 << 24)
    o, lse = rtattn.attention_varlen(*leaves[:3], cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                     return_lse=True, window_size=window, sinks=leaves[3] if extras else None,
                                     softcap=softcap, alibi_slopes=slopes)
    got = torch.autograd.grad(o, leaves, dout)
    torch.cuda.synchronize()
    scale = 1 / math.sqrt(d)
    ref_o, ref_lse = per_sequence_reference(*(t.detach() for t in leaves[:3]), lens_q, lens_k, causal, scale, window,
                                            leaves[3].detach() if extras else None, softcap, alibi_slopes=slopes)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert rel_err(o, ref_o) < TOL[dtype]
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() < lse_tol(max(lens_k))
    ref, low = (per_sequence_grads(leaves, dout, lens_q, lens_k, causal, scale, window, softcap, dt, slopes)
                for dt in (torch.float64, dtype))
    judge_against_torch(("dq", "dk", "dv", "dsinks"), got, ref, low, dtype)
    # The slopes matter: the unbiased attention is far off.
    plain, _ = per_sequence_reference(*(t.detach() for t in leaves[:3]), lens_q, lens_k, causal, scale, window,
                                      leaves[3].detach() if extras else None, softcap)
    assert rel_err(o, plain) > 0.1


def test_varlen_alibi_through_the_ops_and_errors():
    q, k, v, cu_q, cu_k = packed_batch([100, 50], [100, 50], 4, 2, 64, torch.bfloat16, seed=14)
    slopes = make_slopes(2, 4, 14, dims=2)
    dout = torch.randn(150, 4, 64, device="cuda", dtype=torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = rtattn.attention_varlen(*leaves, cu_q, cu_k, 100, 100, causal=True, deterministic=True, alibi_slopes=slopes)
    grads = torch.autograd.grad(o, leaves, dout)
    # The forward op called directly (its autograd too), and the backward op given the forward's slopes.
    leaves2 = [t.detach().requires_grad_() for t in (q, k, v)]
    o2, lse = torch.ops.rtattn.attention_varlen(*leaves2, cu_q, cu_k, 100, 100, True, None, True, -1, -1, None, 0.0,
                                                slopes)
    assert torch.equal(o2, o)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(o2, leaves2, dout), grads))
    o, lse = o.detach(), lse.detach()
    run = lambda s: torch.ops.rtattn.attention_varlen_backward(dout, q, k, v, o, lse, None, cu_q, cu_k, 100, 100,
                                                               True, None, True, -1, -1, None, False, 0.0, s)
    assert all(torch.equal(a, b) for a, b in zip(run(slopes)[:3], grads))
    assert grad_err(run(None)[0], grads[0]) > 0.1
    # A training step traced whole, both varlen ops' fakes taking the slopes; gradients equal to eager's.
    compiled_grads_match_eager(lambda q, k, v: rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True,
                                                                       alibi_slopes=slopes).float().square().mean(),
                               (q, k, v))
    # [sequences, heads_q]: the batch is the number of sequences, not 1.
    for bad, match in ((torch.zeros(1, 4, device="cuda"), "shape"), (torch.zeros(3, 4, device="cuda"), "shape"),
                       (torch.zeros(4, dtype=torch.float16, device="cuda"), "float32"), (torch.zeros(4), "is on cpu")):
        with pytest.raises(rtattn.ArgumentError, match=match) as e:
            rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, alibi_slopes=bad)
        assert e.value.field == "alibi_slopes"


def test_kvcache_alibi_through_the_op_and_errors():
    # flash_attn_with_kvcache's alibi_slopes: the op called directly, under torch.compile, and bad slopes named.
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(2, 128, 2, 64, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([128, 50], dtype=torch.int32, device="cuda")
    slopes = make_slopes(2, 8, 15, dims=2)
    with torch.no_grad():
        o = rtattn.attention_with_kvcache(q, cache, cache, lens, alibi_slopes=slopes)
        o_op, _ = torch.ops.rtattn.attention_with_kvcache(q, cache, cache, lens, None, 128, False, None, 0, -1, -1,
                                                          None, 0.0, slopes)
        assert torch.equal(o, o_op)
        step = torch.compile(lambda q: rtattn.attention_with_kvcache(q, cache, cache, lens, alibi_slopes=slopes),
                             fullgraph=True)
        assert torch.equal(step(q), o)
        assert rel_err(rtattn.attention_with_kvcache(q, cache, cache, lens), o) > 0.05  # the slopes matter
    for bad, match in ((torch.zeros(3, 8, device="cuda"), "shape"), (torch.zeros(4, device="cuda"), "shape"),
                       (torch.zeros(8, dtype=torch.float16, device="cuda"), "float32"), (torch.zeros(8), "is on cpu")):
        with pytest.raises(rtattn.ArgumentError, match=match) as e:
            rtattn.attention_with_kvcache(q, cache, cache, lens, alibi_slopes=bad)
        assert e.value.field == "alibi_slopes"


def test_varlen_softcap_backward_through_the_ops_and_under_torch_compile():
    q, k, v, cu_q, cu_k = packed_batch([100, 50], [100, 50], 4, 2, 64, torch.bfloat16, seed=4)
    q = q * 3.0
    sinks = make_sinks(4, 4)
    dout = torch.randn(150, 4, 64, device="cuda", dtype=torch.bfloat16)
    # Deterministic: attention_varlen and the op called directly must agree bit for bit.
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    o = rtattn.attention_varlen(*leaves[:3], cu_q, cu_k, 100, 100, causal=True, deterministic=True, sinks=leaves[3],
                                softcap=5.0)
    grads = torch.autograd.grad(o, leaves, dout)
    leaves2 = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    o2, lse = torch.ops.rtattn.attention_varlen(*leaves2[:3], cu_q, cu_k, 100, 100, True, None, True, -1, -1,
                                                leaves2[3], 5.0)
    assert torch.equal(o2, o)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(o2, leaves2, dout), grads))
    # The backward op itself, given the forward's cap; with 0 it runs the uncapped kernel, whose gradients differ.
    o, lse = o.detach(), lse.detach()
    run = lambda cap: torch.ops.rtattn.attention_varlen_backward(dout, q, k, v, o, lse, None, cu_q, cu_k, 100, 100,
                                                                 True, None, True, -1, -1, sinks, True, cap)
    assert all(torch.equal(a, b) for a, b in zip(run(5.0), grads))
    assert grad_err(run(0.0)[0], grads[0]) > 0.1
    for cap in (-1.0, math.nan, 1e39):
        with pytest.raises(rtattn.ArgumentError) as e:
            run(cap)
        assert e.value.field == "softcap"

    # A training step traced whole, both varlen ops' fakes taking the cap; gradients equal to eager's.
    compiled_grads_match_eager(lambda q, k, v, s: rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True,
                                                                          sinks=s, softcap=5.0).float().square().mean(),
                               (q, k, v, sinks))


def test_varlen_under_torch_compile_and_errors():
    q, k, v, cu_q, cu_k = packed_batch([100, 50], [100, 50], 4, 4, 64, torch.bfloat16, seed=3)
    f = torch.compile(lambda q, k, v: rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True),
                      fullgraph=True)
    eager = rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True)
    assert torch.equal(f(q, k, v), eager)
    sinks = make_sinks(4, 3)
    f = torch.compile(lambda q, k, v, s: rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True, sinks=s),
                      fullgraph=True)
    assert torch.equal(f(q, k, v, sinks), rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True,
                                                                  sinks=sinks))
    with pytest.raises(rtattn.ArgumentError) as e:
        rtattn.attention_varlen(q, k, v, cu_q.long(), cu_k, 100, 100)
    assert e.value.field == "cu_seqlens_q"
    with pytest.raises(rtattn.ArgumentError, match="one logit per query head") as e:
        rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, sinks=sinks[:2])
    assert e.value.field == "sinks"
    f = torch.compile(lambda q, k, v: rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True,
                                                              softcap=5.0), fullgraph=True)
    assert torch.equal(f(q, k, v), rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, causal=True, softcap=5.0))
    with pytest.raises(rtattn.ArgumentError) as e:
        rtattn.attention_varlen(q, k, v, cu_q, cu_k, 200, 100)  # above total_q: the library names it
    assert e.value.field == "seqlen_q"
    for cap in (-1.0, math.nan, math.inf, "5", None):
        with pytest.raises(rtattn.ArgumentError) as e:
            rtattn.attention_varlen(q, k, v, cu_q, cu_k, 100, 100, softcap=cap)
        assert e.value.field == "softcap"


def test_a_repeated_varlen_call_launches_its_checked_struct(monkeypatch):
    """attention_varlen in plain eager mode (inference) runs the op's body without the dispatcher; a call whose
    signature repeats an earlier one's (all but the totals, the longest sequences and the layouts) launches the
    struct that call filled: the op's bits for batches of other lengths; a bad argument after a good call is still
    refused by name."""
    from rtattn import _prepared
    launched = []
    real = _prepared.launch_varlen
    monkeypatch.setattr(_prepared, "launch_varlen", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    first = packed_batch([100, 50], [120, 60], 8, 2, 128, torch.bfloat16, seed=21)
    with torch.no_grad():
        for return_lse in (False, True):
            rtattn.attention_varlen(*first, 100, 120, causal=True, return_lse=return_lse)  # the signature's first
            for lens_q, lens_k in (([3, 90], [200, 95]), ([1, 1], [3000, 17])):
                q, k, v, cu_q, cu_k = packed_batch(lens_q, lens_k, 8, 2, 128, torch.bfloat16, seed=22)
                n = len(launched)
                out = rtattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                              return_lse=return_lse)
                assert len(launched) == n + 1, "the repeated call did not take its prepared launch"
                o_op, lse_op = torch.ops.rtattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), True,
                                                                 None, False)
                o, lse = out if return_lse else (out, lse_op)
                assert torch.isfinite(o).all() and torch.equal(o, o_op) and torch.equal(lse, lse_op)
        q, k, v, cu_q, cu_k = first
        for args, field in [((100.0, 120), "max_seqlen_q"), ((True, 120), "max_seqlen_q"), ((100, -1), "max_seqlen_k"),
                            ((200, 120), "seqlen_q")]:  # the last past total_q: the library names it
            with pytest.raises(rtattn.ArgumentError) as e:
                rtattn.attention_varlen(q, k, v, cu_q, cu_k, *args, causal=True)
            assert e.value.field == field, args
        with pytest.raises(rtattn.ArgumentError) as e:
            rtattn.attention_varlen(q, k, v, cu_q, cu_k.long(), 100, 120, causal=True)
        assert e.value.field == "cu_seqlens_k"
        with pytest.raises(rtattn.ArgumentError, match="contiguous") as e:  # every other entry: not what is read
            rtattn.attention_varlen(q, k, v, cu_q.repeat_interleave(2)[::2], cu_k, 100, 120, causal=True)
        assert e.value.field == "cu_seqlens_q"
        # Keys expanded past int32 rows (stride 0: no memory): the total is checked, never wrapped into the struct.
        n = 2 ** 32 + 10
        with pytest.raises(rtattn.ArgumentError) as e:
            rtattn.attention_varlen(q, k[:1].expand(n, *k.shape[1:]), v[:1].expand(n, *v.shape[1:]), cu_q, cu_k, 100,
                                    120, causal=True)
        assert e.value.field == "total_k"


def decode_setup(lens, page_size, hq, hkv, d, dtype, sq=1, seed=0):
    """A KV cache holding `lens` keys per sequence: dense [b, cap, hkv, d], or pages shuffled over a pool with a
    block table. Slots past each length hold NaN. Returns q, caches, seqlens, table and the per-sequence K/V."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, cap = len(lens), max(lens) + 3
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    ks = [torch.randn(n, hkv, d, device="cuda", dtype=dtype, generator=g) for n in lens]
    vs = [torch.randn(n, hkv, d, device="cuda", dtype=dtype, generator=g) for n in lens]
    if page_size == 0:
        kc = torch.full((b, cap, hkv, d), math.nan, device="cuda", dtype=dtype)
        vc = kc.clone()
        for i, n in enumerate(lens):
            kc[i, :n], vc[i, :n] = ks[i], vs[i]
        table = None
    else:
        pages = (cap + page_size - 1) // page_size
        order = torch.randperm(b * pages + 2, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
        table = order[:b * pages].view(b, pages).cuda()
        kc = torch.full((b * pages + 2, page_size, hkv, d), math.nan, device="cuda", dtype=dtype)
        vc = kc.clone()
        for i, n in enumerate(lens):
            for t in range(n):
                page = table[i, t // page_size]
                kc[page, t % page_size], vc[page, t % page_size] = ks[i][t], vs[i][t]
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return q, kc, vc, seqlens, table, ks, vs


@pytest.mark.parametrize("page_size, causal, sq, window, sinks", [
    (0, False, 1, (-1, -1), False), (16, False, 1, (-1, -1), False), (1, False, 1, (-1, -1), False),
    (16, True, 4, (-1, -1), False), (64, True, 2, (-1, -1), False), (16, True, 100, (-1, -1), False),
    (1, False, 40, (-1, -1), False), (16, True, 1, (128, -1), False), (0, False, 3, (40, 1), False),
    (16, True, 100, (70, 0), False), (0, True, 100, (-1, -1), False), (0, False, 40, (70, 0), False),
    (1024, True, 100, (-1, -1), False), (512, False, 1, (-1, -1), False),
    (0, False, 1, (-1, -1), True), (16, False, 1, (-1, -1), True), (0, True, 4, (-1, -1), True),
    (16, True, 3, (128, -1), True), (16, True, 100, (-1, -1), True), (64, True, 100, (70, 0), True),
    (0, True, 100, (-1, -1), True)])
def test_decode_from_a_kv_cache(page_size, causal, sq, window, sinks):
    check_decode(page_size, causal, sq, window, sinks)


def check_decode(page_size, causal, sq, window, sinks, softcap=0.0, spread=1.0, alibi=0):
    """O and LSE of decode (or a paged cache's chunked prefill) against float64 per sequence, with the library's
    split count, a fixed one (3; the chunked prefill's 0) and one split. spread scales q (see make_capped). alibi:
    slopes [heads_q] (1) or [batch, heads_q] (2)."""
    lens = [1000, 5, 333, 2048, 77]
    if sinks:  # a sequence with no cached key: O = 0 and LSE = the sinks
        lens.append(0)
    q, kc, vc, seqlens, table, ks, vs = decode_setup(lens, page_size, 32, 8, 128, torch.bfloat16, sq, seed=page_size)
    q = q * spread
    s = make_sinks(32, page_size + sq) if sinks else None
    slopes = make_slopes(len(lens), 32, page_size + sq, alibi) if alibi else None
    with torch.no_grad():
        run = lambda **kw: rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, causal=causal, window_size=window,
                                                         sinks=s, softcap=softcap, alibi_slopes=slopes, **kw)
        o, lse = run(return_lse=True)
        o3 = run(num_splits=3 if sq <= 16 else 0)  # a fixed split count (decode), or the chunked prefill's 0
        o1 = run(num_splits=1)
    # The capped scores' LSE has the dense check's tolerance (tanh.approx adds about 2^-11 of each score).
    tol = lse_tol(max(lens)) if softcap or alibi else 1e-3
    for i, n in enumerate(lens):
        row = slopes if slopes is None or slopes.dim() == 1 else slopes[i]
        ref_o, ref_lse = sdpa_reference(q[i:i + 1], ks[i][None], vs[i][None], causal, 1 / math.sqrt(128), window, s,
                                        softcap, torch.float64, row)
        assert rel_err(o[i:i + 1], ref_o) < TOL[torch.bfloat16]
        assert rel_err(o3[i:i + 1], ref_o) < TOL[torch.bfloat16]
        assert rel_err(o1[i:i + 1], ref_o) < TOL[torch.bfloat16]
        finite = torch.isfinite(ref_lse)  # a chunk longer than its keys: early rows see none (LSE +inf)
        assert torch.equal(torch.isinf(lse[i:i + 1]), ~finite)
        assert (lse[i:i + 1][finite].double() - ref_lse[finite]).abs().max().item() < tol


@pytest.mark.parametrize("page_size, causal, sq, window, sinks", [
    (0, False, 1, (-1, -1), False), (16, False, 1, (-1, -1), False), (0, True, 4, (-1, -1), False),
    (16, True, 3, (128, -1), False), (16, True, 100, (-1, -1), False), (64, True, 100, (70, 0), False),
    (0, False, 1, (-1, -1), True), (16, True, 4, (128, -1), True), (16, True, 100, (-1, -1), True)])
@pytest.mark.parametrize("softcap, spread", [(5.0, 3.0), (30.0, 1.0)])
def test_decode_from_a_kv_cache_with_softcap(page_size, causal, sq, window, sinks, softcap, spread):
    check_decode(page_size, causal, sq, window, sinks, softcap, spread)


@pytest.mark.parametrize("page_size, causal, sq, window, sinks, softcap, alibi", [
    (0, False, 1, (-1, -1), False, 0.0, 1), (16, False, 1, (-1, -1), False, 0.0, 2),
    (1, False, 3, (-1, -1), False, 0.0, 2), (0, True, 4, (-1, -1), False, 0.0, 2),
    (16, True, 3, (128, -1), True, 0.0, 1), (0, False, 3, (40, 1), False, 5.0, 2),
    (16, True, 100, (-1, -1), False, 0.0, 2), (64, True, 100, (70, 0), True, 5.0, 1)])
def test_decode_from_a_kv_cache_with_alibi(page_size, causal, sq, window, sinks, softcap, alibi):
    check_decode(page_size, causal, sq, window, sinks, softcap, 3.0 if softcap else 1.0, alibi)


def test_decode_step_in_a_cuda_graph_and_compiled():
    lens = [500, 900, 30]
    q, kc, vc, seqlens, table, ks, vs = decode_setup(lens, 16, 16, 4, 64, torch.float16, seed=7)
    step = lambda: rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, max_seqlen_k=900)
    with torch.no_grad():
        eager = step()
        compiled = torch.compile(lambda q: rtattn.attention_with_kvcache(q, kc, vc, seqlens, table,
                                                                         max_seqlen_k=900), fullgraph=True)
        assert torch.equal(compiled(q), eager)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm: kernels loaded, workspace allocated outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()
        seqlens.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))  # new lengths, same graph
        graph.replay()
        torch.cuda.synchronize()
    for i, n in enumerate([1, 2, 3]):
        ref_o, _ = sdpa_reference(q[i:i + 1], ks[i][None, :n], vs[i][None, :n], False, 1 / math.sqrt(64))
        assert rel_err(out[i:i + 1], ref_o) < TOL[torch.float16]


def test_a_32_layer_decode_step_in_one_cuda_graph_replays_with_new_lengths():
    """A decode step of a 32-layer model (an attention_with_kvcache per layer, each layer's own paged cache, one
    lengths tensor for all, as a server holds them) captured in one CUDA graph, then replayed with new lengths and
    new queries written into the captured ones: each layer's attention over its sequences' first lengths keys."""
    lens = [300, 77, 129]
    layers = [decode_setup(lens, 16, 8, 2, 64, torch.bfloat16, seed=100 + i) for i in range(32)]
    seqlens = layers[0][3]
    step = lambda: [rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, max_seqlen_k=303)
                    for q, kc, vc, _, table, _, _ in layers]
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()  # warm: kernels loaded, every layer's signature seen
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
        new = [299, 50, 1]
        seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        g = torch.Generator(device="cuda").manual_seed(3)
        for layer in layers:
            layer[0].copy_(torch.randn(layer[0].shape, device="cuda", dtype=layer[0].dtype, generator=g))
        graph.replay()
        torch.cuda.synchronize()
    for (q, _, _, _, _, ks, vs), out in zip(layers, outs):
        for i, n in enumerate(new):
            ref_o, _ = sdpa_reference(q[i:i + 1], ks[i][None, :n], vs[i][None, :n], False, 1 / math.sqrt(64))
            assert rel_err(out[i:i + 1], ref_o) < TOL[torch.bfloat16]


def test_decode_errors_name_the_argument():
    q, kc, vc, seqlens, table, _, _ = decode_setup([10, 20], 16, 4, 2, 64, torch.bfloat16)
    with torch.no_grad():
        for kwargs, field in [(dict(cache_seqlens=seqlens.long()), "cache_seqlens"),
                              (dict(cache_seqlens=seqlens.repeat_interleave(2)[::2]), "cache_seqlens"),
                              (dict(block_table=table.long()), "block_table"),
                              (dict(block_table=table, max_seqlen_k=10 ** 6), "max_seqlen_k"),
                              (dict(block_table=table, num_splits=200), "num_splits"),
                              (dict(block_table=table, sinks=torch.zeros(2, device="cuda")), "sinks"),
                              (dict(block_table=table, sinks=torch.zeros(4, device="cuda", dtype=torch.int64)),
                               "sinks"),
                              (dict(block_table=table, softcap=-1.0), "softcap"),
                              (dict(block_table=table, softcap=math.nan), "softcap"),
                              (dict(block_table=table, softcap=math.inf), "softcap"),
                              (dict(block_table=table, softcap="50"), "softcap")]:
            with pytest.raises(rtattn.ArgumentError) as e:
                rtattn.attention_with_kvcache(q, kc, vc, **kwargs)
            assert e.value.field == field, kwargs
        # An append's new tokens: both, shaped as the cache's rows, with lengths to put them after, and room.
        new = torch.zeros(2, 3, 2, 64, device="cuda", dtype=torch.bfloat16)
        for kwargs, field in [(dict(k=new), "v"), (dict(v=new), "k"), (dict(k=new, v=new[:, :2]), "v"),
                              (dict(k=new[..., :32], v=new), "k"),
                              (dict(k=new, v=new, cache_seqlens=None), "cache_seqlens"),
                              (dict(k=new, v=new, max_seqlen_k=2), "k"), (dict(k=new.float(), v=new), "k"),
                              (dict(k=new, v=new, cache_seqlens=-1), "cache_seqlens")]:
            kwargs = {"cache_seqlens": seqlens, "block_table": table, **kwargs}
            with pytest.raises(rtattn.ArgumentError) as e:
                rtattn.attention_with_kvcache(q, kc, vc, **kwargs)
            assert e.value.field == field, kwargs
    with pytest.raises(NotImplementedError):  # a model's sinks require grad: no gradient dropped silently
        rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, sinks=make_sinks(4, 1).requires_grad_())
    with pytest.raises(NotImplementedError):
        rtattn.attention_with_kvcache(q.requires_grad_(), kc, vc, seqlens, table)
    with pytest.raises(NotImplementedError, match="inference only"):  # q requires grad (above), capped or not
        rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, softcap=50.0)


@pytest.mark.parametrize("page_size, sq, s_new, causal, d", [(0, 1, 1, False, 128), (16, 1, 1, False, 64),
                                                         (16, 4, 4, True, 128), (0, 3, 5, True, 132),
                                                         (1, 2, 2, True, 80), (0, 40, 40, True, 128),
                                                         (16, 40, 40, True, 128), (0, 100, 20, False, 256),
                                                         (1024, 1, 1, False, 128)])
def test_kvcache_append_writes_the_new_tokens_then_attends(page_size, sq, s_new, causal, d):
    """flash_attn_with_kvcache's k= / v=: the new tokens land in the cache at cache_seqlens (every other slot as it
    was, NaN included), and O is the attention over cache_seqlens + s_new keys."""
    lens = [s_new, 700, 2000, 65]  # keys after the append; the first sequence had none cached
    q, kc, vc, seqlens, table, ks, vs = decode_setup(lens, page_size, 12, 3 if d == 132 else 4, d, torch.bfloat16,
                                                     sq, seed=page_size + sq)
    b, hkv = len(lens), kc.shape[2]
    k_new = torch.stack([k[n - s_new:] for k, n in zip(ks, lens)])
    v_new = torch.stack([v[n - s_new:] for v, n in zip(vs, lens)])
    cached = seqlens - s_new

    def slots(i, n):  # where sequence i's keys n.. n + s_new - 1 are in the cache: (page or batch, slot) indices
        t = torch.arange(n, n + s_new, device="cuda")
        if table is None:
            return torch.full_like(t, i), t
        return table[i, t // page_size].long(), t % page_size

    after_k, after_v = kc.clone(), vc.clone()
    for i, n in enumerate(cached.tolist()):
        kc[slots(i, n)] = math.nan  # as yet unwritten: the kernel must put the rows there
        vc[slots(i, n)] = math.nan
    with torch.no_grad():
        o, lse = rtattn.attention_with_kvcache(q, kc, vc, cached, table, causal=causal, k=k_new, v=v_new,
                                               return_lse=True)
    assert torch.equal(kc.isnan(), after_k.isnan()) and torch.equal(kc.nan_to_num(), after_k.nan_to_num())
    assert torch.equal(vc.isnan(), after_v.isnan()) and torch.equal(vc.nan_to_num(), after_v.nan_to_num())
    for i in range(b):
        ref_o, ref_lse = sdpa_reference(q[i:i + 1], ks[i][None], vs[i][None], causal, 1 / math.sqrt(d))
        assert rel_err(o[i:i + 1], ref_o) < TOL[torch.bfloat16]
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse[i:i + 1]), ~finite)
        assert (lse[i:i + 1][finite].double() - ref_lse[finite]).abs().max().item() < 1e-3
    del hkv


def test_kvcache_append_without_queries_only_writes():
    """seqlen_q 0 with new tokens (a prefill chunk whose queries run elsewhere): the rows land, O is empty."""
    q, kc, vc, seqlens, table, _, _ = decode_setup([10, 20], 16, 4, 2, 64, torch.bfloat16, seed=4)
    new_k = torch.randn(2, 3, 2, 64, device="cuda", dtype=torch.bfloat16)
    new_v = torch.randn_like(new_k)
    with torch.no_grad():
        o = rtattn.attention_with_kvcache(q[:, :0], kc, vc, seqlens, table, k=new_k, v=new_v)
    assert o.shape == (2, 0, 4, 64)
    for i, n in enumerate([10, 20]):
        t = torch.arange(n, n + 3, device="cuda")
        pages, slots = table[i, t // 16].long(), t % 16
        assert torch.equal(kc[pages, slots], new_k[i]) and torch.equal(vc[pages, slots], new_v[i])


def test_kvcache_append_drops_rows_past_the_cache_and_takes_an_int_length():
    q, kc, vc, seqlens, _, ks, vs = decode_setup([10, 10], 0, 4, 2, 64, torch.float16, seed=3)  # capacity 13
    new = torch.randn(2, 5, 2, 64, device="cuda", dtype=torch.float16)
    before = kc.clone()
    with torch.no_grad():
        o = rtattn.attention_with_kvcache(q, kc, vc, 10, k=new, v=new)  # an int length, FlashAttention's form
    assert torch.equal(kc[:, 10:], new[:, :3]) and torch.equal(kc[:, :10], before[:, :10])  # 2 rows dropped
    for i in range(2):
        keys = torch.cat([ks[i], new[i, :3]])[None]
        values = torch.cat([vs[i], new[i, :3]])[None]
        assert rel_err(o[i:i + 1], sdpa_reference(q[i:i + 1], keys, values, False, 1 / 8)[0]) < TOL[torch.float16]


def test_kvcache_append_in_a_cuda_graph_and_compiled():
    """A decode step that appends: captured once, replayed with new lengths; torch.compile sees the cache written."""
    lens = [500, 900, 30]
    q, kc, vc, seqlens, table, ks, vs = decode_setup(lens, 16, 16, 4, 64, torch.float16, seed=9)
    k_new = torch.randn(3, 1, 4, 64, device="cuda", dtype=torch.float16)
    v_new = torch.randn_like(k_new)
    step = lambda q: rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, max_seqlen_k=910, k=k_new, v=v_new)
    with torch.no_grad():
        eager = step(q)
        compiled = torch.compile(step, fullgraph=True)
        assert torch.equal(compiled(q), eager)  # the same rows written again: the same result
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step(q)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(q)
        seqlens.copy_(torch.tensor([1, 2, 3], dtype=torch.int32))  # new lengths, same graph
        graph.replay()
        torch.cuda.synchronize()
    for i, n in enumerate([1, 2, 3]):
        keys = torch.cat([ks[i][:n], k_new[i]])[None]
        values = torch.cat([vs[i][:n], v_new[i]])[None]
        ref_o, _ = sdpa_reference(q[i:i + 1], keys, values, False, 1 / math.sqrt(64))
        assert rel_err(out[i:i + 1], ref_o) < TOL[torch.float16]


@pytest.mark.parametrize("page_size, sq", [(0, 1), (16, 1), (16, 40), (0, 40)])
def test_kvcache_eager_path_matches_the_op(page_size, sq, monkeypatch):
    """attention_with_kvcache in plain eager mode runs the op's body without the dispatcher: the same bits as the op
    with every argument away from its default, and the op still serves what eager cannot (a dispatch mode)."""
    import rtattn._serving as serving
    q, kc, vc, seqlens, table, _, _ = decode_setup([300, 77, 129], page_size, 8, 2, 128, torch.bfloat16, sq=sq,
                                                   seed=5)
    g = torch.Generator(device="cuda").manual_seed(6)
    sinks = torch.randn(8, device="cuda", generator=g)
    alibi = torch.rand(8, device="cuda", generator=g) * 0.1
    splits = 3 if sq == 1 else 0
    kw = dict(causal=True, softmax_scale=0.07, num_splits=splits, window_size=(64, 0), sinks=sinks, softcap=20.0,
              alibi_slopes=alibi, max_seqlen_k=301)
    took = []
    real = serving._plain_eager
    monkeypatch.setattr(serving, "_plain_eager", lambda *a: took.append(real(*a)) or took[-1])
    with torch.no_grad():
        o, lse = rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, return_lse=True, **kw)
        assert took == [True]  # the eager path ran
        o_op, lse_op = torch.ops.rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, 301, True, 0.07, splits, 64,
                                                               0, sinks, 20.0, alibi)
        assert torch.isfinite(o).all()
        assert torch.equal(o, o_op) and torch.equal(lse, lse_op)
        o_alone = rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, **kw)  # no LSE asked: none allocated
        assert took[-1] is True and torch.equal(o_alone, o)
        from torch.utils._python_dispatch import TorchDispatchMode

        class Passthrough(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        with Passthrough():
            o_mode = rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, **kw)
        assert took[-1] is False and torch.equal(o_mode, o)


@pytest.mark.parametrize("page_size, sq", [(0, 1), (16, 1), (16, 40)])
def test_a_repeated_kvcache_call_launches_its_checked_struct(page_size, sq, monkeypatch):
    """A cache call whose shapes, strides, dtypes, device and options repeat an earlier one's (a decode loop's next
    step) launches the struct that call filled (rtattn._prepared): new data and new lengths (device values) give the
    op's bits, sinks, cap and slopes included; a bad argument after a good call is still refused by name."""
    from rtattn import _prepared
    launched = []
    real = _prepared.launch
    monkeypatch.setattr(_prepared, "launch", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    q, kc, vc, seqlens, table, _, _ = decode_setup([300, 77, 129], page_size, 8, 2, 128, torch.bfloat16, sq=sq,
                                                   seed=7)
    g = torch.Generator(device="cuda").manual_seed(8)
    sinks, alibi = torch.randn(8, device="cuda", generator=g), torch.rand(8, device="cuda", generator=g) * 0.1
    lens2 = torch.tensor([120, 45, 129], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        for extras in ({}, dict(sinks=sinks, softcap=20.0, alibi_slopes=alibi, window_size=(64, 0))):
            kw = dict(causal=True, max_seqlen_k=303, **extras)
            rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, **kw)  # the signature's first call
            n = len(launched)
            q2 = torch.randn(q.shape, device="cuda", dtype=q.dtype, generator=g)
            o, lse = rtattn.attention_with_kvcache(q2, kc, vc, lens2, table, return_lse=True, **kw)  # first, with LSE
            o = rtattn.attention_with_kvcache(q2, kc, vc, lens2, table, **kw)
            assert len(launched) == n + 1, "the repeated call did not take its prepared launch"
            o_op, lse_op = torch.ops.rtattn.attention_with_kvcache(
                q2, kc, vc, lens2, table, 303, True, None, 0, *kw.get("window_size", (-1, -1)), extras.get("sinks"),
                extras.get("softcap", 0.0), extras.get("alibi_slopes"))
            assert torch.isfinite(o).all() and torch.equal(o, o_op)
            o, lse = rtattn.attention_with_kvcache(q2, kc, vc, lens2, table, return_lse=True, **kw)
            assert len(launched) == n + 2 and torch.equal(o, o_op) and torch.equal(lse, lse_op)
            # max_seqlen_k is no part of the signature: a server's bound that moves step by step (the split count and
            # the workspace follow it); a bound past the cache's capacity takes the full path, which refuses it (below).
            for max_k in (200, 130, 303):
                got = rtattn.attention_with_kvcache(q2, kc, vc, lens2 // 2 + 1, table, **{**kw, "max_seqlen_k": max_k})
                want, _ = torch.ops.rtattn.attention_with_kvcache(
                    q2, kc, vc, lens2 // 2 + 1, table, max_k, True, None, 0, *kw.get("window_size", (-1, -1)),
                    extras.get("sinks"), extras.get("softcap", 0.0), extras.get("alibi_slopes"))
                assert len(launched) == n + 3 and torch.equal(got, want)
                n += 1
        for bad, field in [(dict(cache_seqlens=seqlens.long()), "cache_seqlens"), (dict(num_splits=200), "num_splits"),
                           (dict(causal=1), "causal"), (dict(max_seqlen_k=True), "max_seqlen_k"),
                           (dict(max_seqlen_k=10 ** 6), "max_seqlen_k"), (dict(return_lse=1), "return_lse")] + (
                [(dict(block_table=table.long()), "block_table")] if table is not None else []):
            with pytest.raises(rtattn.ArgumentError) as e:
                rtattn.attention_with_kvcache(q, kc, vc, **{"cache_seqlens": seqlens, "block_table": table,
                                                            "causal": True, "max_seqlen_k": 303, **bad})
            assert e.value.field == field, bad


@pytest.mark.parametrize("page_size", [0, 16])
def test_an_eager_append_writes_what_the_op_writes_and_bumps_the_versions(page_size, monkeypatch):
    """attention_with_kvcache(k=, v=) in plain eager mode runs the append op's body without the dispatcher, its
    repeated steps from a prepared launch: the op's output and cache rows, and the caches' version counters moved
    (autograd then refuses a backward through a tensor saved before the write, as after an in-place op)."""
    from rtattn import _prepared
    launched = []
    real = _prepared.launch
    monkeypatch.setattr(_prepared, "launch", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    q, kc, vc, seqlens, table, _, _ = decode_setup([300, 77, 129], page_size, 8, 2, 64, torch.bfloat16, seed=11)
    g = torch.Generator(device="cuda").manual_seed(12)
    x = torch.ones(1, device="cuda", dtype=kc.dtype, requires_grad=True)
    saved = (x * kc[0, :1, 0, :1]).sum()  # keeps a view of k_cache for its backward
    for step in range(3):
        k_new, v_new = (torch.randn(3, 1, 2, 64, device="cuda", dtype=kc.dtype, generator=g) for _ in range(2))
        lens = seqlens + step  # each step appends after the last
        kc_op, vc_op = kc.clone(), vc.clone()
        with torch.no_grad():
            want, _ = torch.ops.rtattn.attention_with_kvcache_append(q, kc_op, vc_op, lens, table, 303, False, None, 0,
                                                                     -1, -1, None, 0.0, None, k_new, v_new)
            n, versions = len(launched), (kc._version, vc._version)
            got = rtattn.attention_with_kvcache(q, kc, vc, lens, table, max_seqlen_k=303, k=k_new, v=v_new)
        assert len(launched) == n + (step > 0), "a repeated append did not take its prepared launch"
        assert torch.isfinite(got).all() and torch.equal(got, want)
        assert torch.equal(kc.nan_to_num(), kc_op.nan_to_num()) and torch.equal(vc.nan_to_num(), vc_op.nan_to_num())
        assert kc._version > versions[0] and vc._version > versions[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()
    with torch.inference_mode():  # a server's caches, made in inference mode: no version counter to move
        kc_i, vc_i = kc.clone(), vc.clone()
        for step in range(2):
            got = rtattn.attention_with_kvcache(q, kc_i, vc_i, seqlens - 10 + step, table, max_seqlen_k=303, k=k_new,
                                                v=v_new)
            assert torch.isfinite(got).all()


@pytest.mark.parametrize("sq, causal, extras", [(1, False, False), (16, True, False), (4, True, True)])
def test_attention_with_few_queries_runs_the_decode_kernels(sq, causal, extras):
    """rtattn.attention with a few query tokens against thousands of keys takes the decode kernels (the runtime then
    holds a decode kernel for the config), with the same O and LSE, and a backward through them."""
    g = torch.Generator(device="cuda").manual_seed(sq)
    q = torch.randn(3, sq, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(3, 5000, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    kw = dict(window_size=(3000, 0), sinks=make_sinks(16, 3), softcap=30.0) if extras else {}
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o, lse = rtattn.attention(*leaves, causal=causal, return_lse=True, **kw)
    kernels = rtattn._api.default_runtime().__dict__.get("_torch_kernels", {})
    # (kind, device, dtype, d, dv, hq, hkv, causal, scale, flags): this config's decode kernel (no other test's)
    assert any(key[3:8] == (128, 128, 16, 4, causal) and "decode" in key[-1] for key in kernels), "no decode kernel"
    ref_o, ref_lse = sdpa_reference(q, k, v, causal, 1 / math.sqrt(128), kw.get("window_size", (-1, -1)),
                                    kw.get("sinks"), kw.get("softcap", 0.0), torch.float64)
    assert rel_err(o, ref_o) < TOL[torch.bfloat16]
    assert (lse.double() - ref_lse).abs().max().item() < lse_tol(5000)
    with torch.no_grad():  # the eager path without an LSE (none allocated): the same O
        assert torch.equal(rtattn.attention(q, k, v, causal=causal, **kw), o.detach())
    dout = torch.randn_like(o)
    o.backward(dout)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_o2, _ = sdpa_reference(*ref, causal, 1 / math.sqrt(128), kw.get("window_size", (-1, -1)), kw.get("sinks"),
                               kw.get("softcap", 0.0), torch.float64)
    ref_o2.backward(dout.double())
    for t, r in zip(leaves, ref):
        assert rel_err(t.grad, r.grad) < TOL[torch.bfloat16] * 1.5


@pytest.mark.parametrize("packed", [False, True])
def test_merge_states_gives_attention_over_both_key_sets(packed):
    g = torch.Generator(device="cuda").manual_seed(5)
    b, sq, sk, h, d = 2, 64, 700, 8, 128
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cut = 300
    oa, la = rtattn.attention(q, k[:, :cut], v[:, :cut], return_lse=True)
    ob, lb = rtattn.attention(q, k[:, cut:], v[:, cut:], return_lse=True)
    lb[0, 0, 0] = math.inf  # row 0 of head 0 "saw no key" in part b: it keeps part a alone
    if packed:  # [total, heads, d] with LSE [heads, total], attention_varlen's layout
        flat = lambda o: o.reshape(b * sq, h, d)
        lay = lambda l: l.permute(1, 0, 2).reshape(h, b * sq)
        o, lse = rtattn.merge_states(flat(oa), lay(la), flat(ob), lay(lb))
        o, lse = o.view(b, sq, h, d), lse.view(h, b, sq).permute(1, 0, 2)
    else:
        o, lse = rtattn.merge_states(oa, la, ob, lb)
    ref_o, ref_lse = sdpa_reference(q, k, v, False, 1 / math.sqrt(d))
    ref_o[0, 0, 0] = oa[0, 0, 0].double()
    ref_lse[0, 0, 0] = la[0, 0, 0].double()
    assert rel_err(o, ref_o) < TOL[torch.bfloat16]
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3
    with pytest.raises(rtattn.ArgumentError) as e:
        rtattn.merge_states(oa, la.double(), ob, lb)
    assert e.value.field == "lse_a"
