"""rtattn.attention on the GPU against torch.nn.functional.scaled_dot_product_attention in float64: head dims 1..256
(72, 100, 132, 200 among them), GQA/MQA, causal with seqlen_q != seqlen_k, strided views, LSE, sliding windows,
attention sinks, logit softcapping and ALiBi (against an explicit float64 softmax: the sink as one more column, the
scores capped, then biased, before the mask), gradients of each (softcap's and ALiBi's judged against twice PyTorch's
own error in the inputs' 16-bit dtype); every output element written (the allocator is poisoned with NaN first);
torch.compile(fullgraph=True); CUDA graph capture and replay; argument errors naming the argument."""
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="no GPU tests here: torch is not installed")
import torch.nn.functional as F  # noqa: E402

import rtattn  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative Frobenius error against float64


def window_mask(sq, sk, causal, window, device):
    """Which keys each query sees, FlashAttention's rule aligned bottom-right: causal, and a window (left, right), -1
    leaving a side unbounded (causal: right 0); None when every key is seen."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    i = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= j <= i + right
    if left >= 0:
        mask &= j >= i - left
    return mask


def sdpa_reference(q, k, v, causal, scale, window=(-1, -1), sinks=None, softcap=0.0, dtype=torch.float64,
                   alibi_slopes=None):
    """float64 SDPA in [batch, seq, heads, dim] layout, causal aligned bottom-right, a sliding window as
    window_mask's; rows that see no key give O = 0 and LSE = +inf (the library's convention, as FlashAttention's).
    sinks ([heads_q]), softcap (> 0) and alibi_slopes ([heads_q] or [batch, heads_q]): see explicit_reference.
    dtype: another one (the inputs' 16-bit dtype) runs explicit_reference's math in it, every input (sinks too)
    converted to it: PyTorch's own error in that dtype."""
    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    qd, kd, vd = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1)
    mask = window_mask(sq, sk, causal, window, q.device)
    if sinks is not None or softcap or alibi_slopes is not None or dtype != torch.float64:
        return explicit_reference(qd, kd, vd, mask, scale, sinks, softcap, alibi_slopes)
    # Rows without keys would be NaN in SDPA: they see key 0 there, and are replaced below.
    o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=None if mask is None else mask | ~mask.any(-1, True),
                                       scale=scale)
    s = (qd @ kd.transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(lse)
    o = torch.where(empty[..., None], torch.zeros_like(o), o)
    lse = torch.where(empty, torch.full_like(lse, math.inf), lse)
    return o.transpose(1, 2), lse


def explicit_reference(qd, kd, vd, mask, scale, sinks=None, softcap=0.0, alibi_slopes=None):
    """The softmax spelt out, for what no SDPA takes. softcap > 0 (FlashAttention's convention): each scaled score s
    becomes softcap * tanh(s / softcap), before the mask. alibi_slopes (FlashAttention's ALiBi): then the score of
    query i and key j loses slope * |i + seqlen_k - seqlen_q - j|, before the mask; the bias is computed in float64
    and rounded to the math's dtype once, as a model adds a precomputed bias. Sinks: each head's sink is one more
    score column, a key whose value is zero, so it joins the softmax's denominator and the LSE and is dropped before
    P V; a row that sees no key gives O = 0 and LSE = its sink, with no special case (without sinks: O = 0 and
    LSE = +inf, as sdpa_reference's). [batch, heads, seq, dim] in (float64, or the dtype the math runs in); the
    layouts of sdpa_reference out. Differentiable in every input, the sinks too; the cap and the slopes are
    constants."""
    b, hq, sq, _ = qd.shape
    s = (qd @ kd.transpose(-1, -2)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s - alibi_bias(alibi_slopes, b, hq, sq, kd.shape[2]).to(s.dtype)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype).view(1, hq, 1, 1).expand(b, hq, sq, 1)], -1)
        o = torch.softmax(s, -1)[..., :-1] @ vd
        return o.transpose(1, 2), torch.logsumexp(s, -1)
    lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(lse)[..., None]
    # A keyless row's softmax is 0/0 (every score -inf): it is given the library's O = 0 and LSE = +inf instead.
    o = torch.softmax(s.masked_fill(empty, 0.0), -1) @ vd
    o = torch.where(empty, torch.zeros_like(o), o)
    return o.transpose(1, 2), torch.where(empty[..., 0], torch.full_like(lse, math.inf), lse)


def alibi_bias(slopes, b, hq, sq, sk):
    """slope * |i + sk - sq - j| in float64, [b or 1, hq, sq, sk]: the amount each score loses."""
    i = torch.arange(sq, device=slopes.device, dtype=torch.float64)[:, None] + (sk - sq)
    j = torch.arange(sk, device=slopes.device, dtype=torch.float64)[None, :]
    rows = slopes.double().reshape(-1, hq)  # [1, hq] for [heads_q] slopes: every sequence alike
    return rows[:, :, None, None] * (i - j).abs()


def make_slopes(b, hq, seed, dims=1):
    """ALiBi slopes, float32. 1 dim: the paper's geometric 2**(-8 (h + 1) / hq), [hq]. 2 dims: [b, hq], each
    sequence's row those times a random factor from 0.5 to 1.5, viewed out of a [b, 2 hq] tensor so the rows are 2 hq
    apart (a batch stride that is not heads_q)."""
    h = torch.arange(1, hq + 1, device="cuda", dtype=torch.float64)
    slopes = (2.0 ** (-8 * h / hq)).float()
    if dims == 1:
        return slopes
    g = torch.Generator(device="cuda").manual_seed(seed)
    wide = torch.rand(b, 2 * hq, device="cuda", generator=g) + 0.5
    wide[:, :hq] *= slopes
    return wide[:, :hq]


def make_sinks(hq, seed, dtype=torch.float32):
    """Sinks from -1 to 8: a row over a few hundred keys has an LSE of about 6, so some heads' sinks barely count and
    others take most of the weight."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(hq, device="cuda", generator=g) * 9 - 1).to(dtype)


def lse_tol(seqlen_k):
    """The LSE's allowed absolute error: it sums over seqlen_k keys' rounded scores."""
    return 1e-3 * max(1, math.log(max(seqlen_k, 1)))


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def poison_allocator(nbytes):
    """Fills the caching allocator's free blocks with NaN, so an element the kernel skips shows up."""
    t = torch.full((nbytes // 4 + 4096,), float("nan"), device="cuda")
    del t


def make(b, sq, sk, hq, hkv, d, dv, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=dtype, generator=g)
    return q, k, v


def check(q, k, v, causal=False, scale=None, dtype=None, window=(-1, -1), sinks=None, softcap=0.0,
          alibi_slopes=None):
    dtype = dtype or q.dtype
    eff = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    poison_allocator(q.shape[0] * q.shape[1] * q.shape[2] * v.shape[3] * 2 + q.shape[0] * q.shape[2] * q.shape[1] * 4)
    o, lse = rtattn.attention(q, k, v, causal=causal, softmax_scale=scale, return_lse=True, window_size=window,
                              sinks=sinks, softcap=softcap, alibi_slopes=alibi_slopes)
    torch.cuda.synchronize()
    ref_o, ref_lse = sdpa_reference(q, k, v, causal, eff, window, sinks, softcap, alibi_slopes=alibi_slopes)
    assert o.shape == (q.shape[0], q.shape[1], q.shape[2], v.shape[3]) and o.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    assert not torch.isnan(o).any() and not torch.isnan(lse).any(), "an element was not written (NaN poison)"
    err = rel_err(o, ref_o)
    assert err < TOL[dtype], f"relative Frobenius error {err:.2e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max().item() < lse_tol(k.shape[1])
    return err


HEAD_DIMS = [1, 17, 40, 64, 72, 100, 128, 132, 160, 200, 256]


@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims_gqa_bf16(d, causal):
    check(*make(2, 257, 257, 4, 2, d, d, torch.bfloat16, seed=d), causal=causal)


@pytest.mark.parametrize("d", [72, 100, 132, 200])
def test_head_dims_fp16_mqa(d):
    check(*make(1, 200, 333, 8, 1, d, d, torch.float16, seed=d), causal=False)


@pytest.mark.parametrize("sq, sk", [(100, 300), (300, 100), (1, 1000), (77, 77)])
def test_causal_bottom_right(sq, sk):
    check(*make(2, sq, sk, 4, 4, 132, 132, torch.bfloat16, seed=sq * 7 + sk), causal=True)


def test_head_dim_v_differs_and_scale():
    check(*make(2, 129, 190, 6, 3, 132, 100, torch.bfloat16, seed=5), causal=True, scale=0.3)
    check(*make(2, 129, 190, 6, 3, 72, 200, torch.float16, seed=6), causal=False, scale=0.05)


@pytest.mark.parametrize("d", [72, 132])
def test_strided_views(d):
    g = torch.Generator(device="cuda").manual_seed(d)
    b, s, h = 2, 150, 4
    qkv = torch.randn(b, s, 3, h, d, device="cuda", dtype=torch.bfloat16, generator=g)  # packed projections
    check(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    bhsd = torch.randn(3, b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)  # [batch, heads, seq, dim]
    check(*(t.transpose(1, 2) for t in bhsd), causal=False)
    big = torch.randn(b, 300, h, d, device="cuda", dtype=torch.bfloat16, generator=g)  # a window of a longer cache
    check(big[:, 100:150], big[:, :200], big[:, 50:250], causal=True)


def test_every_element_written_with_a_poisoned_output():
    """The C ABI path with an output we poison ourselves (the op's own outputs come from torch's allocator)."""
    q, k, v = make(3, 131, 257, 4, 2, 132, 132, torch.bfloat16, seed=11)
    kernel = rtattn.default_runtime().get(head_dim=132, num_heads_q=4, num_heads_kv=2, causal=True)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((3, 4, 131), float("nan"), device="cuda")
    a = kernel.forward_args()
    for field, t in (("q", q), ("k", k), ("v", v), ("o", o)):
        x = getattr(a, field)
        x.ptr, x.batch_stride, x.seq_stride, x.head_stride = t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)
    a.lse, a.batch, a.seqlen_q, a.seqlen_k = lse.data_ptr(), 3, 131, 257
    kernel.launch(a, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    ref_o, _ = sdpa_reference(q, k, v, True, 1 / math.sqrt(132))
    assert rel_err(o, ref_o) < TOL[torch.bfloat16]
    assert kernel.info.padded_qk == 144 and kernel.config.arch.startswith("sm_")


def test_side_stream_and_kernel_reuse():
    q, k, v = make(2, 512, 512, 8, 2, 100, 100, torch.bfloat16, seed=3)
    ref = rtattn.attention(q, k, v, causal=True)
    stats = rtattn.default_runtime().stats()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        outs = [rtattn.attention(q, k, v, causal=True) for _ in range(5)]
    s.synchronize()
    for o in outs:
        assert torch.equal(o, ref)
    after = rtattn.default_runtime().stats()
    # Looked up once per config and kept: no further runtime lookups.
    assert (after.memory_hits, after.disk_hits, after.misses) == (stats.memory_hits, stats.disk_hits, stats.misses)


def test_empty_and_keyless_inputs():
    q, k, v = make(0, 16, 16, 2, 2, 64, 64, torch.bfloat16, seed=1)
    assert rtattn.attention(q, k, v).shape == (0, 16, 2, 64)
    q, k, v = make(2, 16, 0, 2, 2, 64, 64, torch.bfloat16, seed=1)
    o, lse = rtattn.attention(q, k, v, return_lse=True)
    assert torch.count_nonzero(o) == 0 and torch.isposinf(lse).all()


class TinyAttention(torch.nn.Module):
    def __init__(self, dim=256, hq=4, hkv=2, d=100):
        super().__init__()
        self.hq, self.hkv, self.d = hq, hkv, d
        self.qkv = torch.nn.Linear(dim, (hq + 2 * hkv) * d, bias=False)
        self.out = torch.nn.Linear(hq * d, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.hq + 2 * self.hkv, self.d)
        q, k, v = qkv.split([self.hq, self.hkv, self.hkv], dim=2)  # strided views, no copies
        return self.out(rtattn.attention(q, k, v, causal=True).reshape(b, s, self.hq * self.d))


def test_torch_compile_fullgraph():
    torch.manual_seed(0)
    m = TinyAttention().cuda().to(torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        eager = m(x)
        compiled = torch.compile(m, fullgraph=True)  # a graph break would raise
        got = compiled(x)
        got2 = compiled(torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16))
    assert got2.shape == eager.shape
    assert rel_err(got, eager.double()) < 1e-2


def test_first_use_under_torch_compile_in_a_fresh_process():
    """rtattn imported before torch, and its first call made while dynamo traces: the op registers mid-trace."""
    code = ("import rtattn, torch\n"
            "q = torch.randn(1, 64, 2, 72, device='cuda', dtype=torch.bfloat16)\n"
            "f = torch.compile(lambda q: rtattn.attention(q, q, q, causal=True), fullgraph=True, backend='aot_eager')\n"
            "torch.testing.assert_close(f(q), rtattn.attention(q, q, q, causal=True))\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def test_cuda_graph_capture_and_replay():
    q, k, v = make(2, 384, 384, 8, 2, 132, 132, torch.bfloat16, seed=21)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up: the kernel is loaded before capture
        rtattn.attention(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = rtattn.attention(q, k, v, causal=True)
    for seed in (22, 23):
        nq, nk, nv = make(2, 384, 384, 8, 2, 132, 132, torch.bfloat16, seed=seed)
        q.copy_(nq), k.copy_(nk), v.copy_(nv)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(o, rtattn.attention(nq, nk, nv, causal=True))
        ref, _ = sdpa_reference(nq, nk, nv, True, 1 / math.sqrt(132))
        assert rel_err(o, ref) < TOL[torch.bfloat16]


def test_meta_tensors_give_shapes():
    q = torch.empty(2, 10, 8, 132, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 20, 2, 132, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 20, 2, 100, device="meta", dtype=torch.bfloat16)
    o, lse = rtattn.attention(q, k, v, return_lse=True)
    assert o.shape == (2, 10, 8, 100) and lse.shape == (2, 8, 10) and o.device.type == "meta"
    o, lse = rtattn.attention(q, k, v, return_lse=True, sinks=torch.empty(8, device="meta"))
    assert o.shape == (2, 10, 8, 100) and lse.shape == (2, 8, 10) and o.device.type == "meta"


def test_the_op_and_the_eager_path_agree():
    """rtattn.attention skips the dispatcher for plain eager calls; torch.ops.rtattn.attention is the same code."""
    q, k, v = make(2, 200, 300, 6, 2, 100, 100, torch.bfloat16, seed=31)
    o, lse = rtattn.attention(q, k, v, causal=True, return_lse=True)
    o2, lse2 = torch.ops.rtattn.attention(q, k, v, True, None, False)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    with torch.inference_mode():
        assert torch.equal(rtattn.attention(q, k, v, causal=True), o)
    sinks = make_sinks(6, 31)
    o, lse = rtattn.attention(q, k, v, causal=True, return_lse=True, sinks=sinks)
    o2, lse2 = torch.ops.rtattn.attention(q, k, v, True, None, False, -1, -1, sinks)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_a_repeated_call_launches_its_checked_struct_and_anything_new_is_checked(monkeypatch):
    """An eager call whose shapes, strides, dtypes, device and options repeat an earlier one's launches the struct that
    call filled (rtattn._prepared): the op's bits on new data, the decode route's too; the library still checks each
    launch's pointers, and options of other types or a new layout are checked anew and refused by name."""
    from rtattn import _prepared
    launched = []
    real = _prepared.launch
    monkeypatch.setattr(_prepared, "launch", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    for sq, sk in ((200, 300), (3, 4096)):  # the prefill kernel; few queries: the decode kernels
        first = make(2, sq, sk, 6, 2, 100, 100, torch.bfloat16, seed=41)
        q, k, v = make(2, sq, sk, 6, 2, 100, 100, torch.bfloat16, seed=42)
        kw = dict(causal=True, window_size=(150, 0))
        with torch.no_grad():
            for return_lse in (False, True):
                rtattn.attention(*first, return_lse=return_lse, **kw)  # the signature's first call
                n = len(launched)
                out = rtattn.attention(q, k, v, return_lse=return_lse, **kw)
                assert len(launched) == n + 1, "the repeated call did not take its prepared launch"
                o_op, lse_op = torch.ops.rtattn.attention(q, k, v, True, None, False, 150, 0)
                o, lse = out if return_lse else (out, lse_op)
                assert torch.isfinite(o).all() and torch.equal(o, o_op) and torch.equal(lse, lse_op)
            # Keys that grow call by call (a decode loop's), as slices or as new tensors: the same prepared launch,
            # the op's bits. Few queries: each side of the decode kernels' threshold of keys (2048) has its entry.
            if sq <= 16:
                for n_keys, prepared in ((2046, False), (2047, True), (2048, True), (2049, True)):
                    n = len(launched)
                    got = rtattn.attention(q, k[:, :n_keys], v[:, :n_keys], **kw)
                    assert len(launched) == n + prepared, n_keys
                    assert torch.equal(got, torch.ops.rtattn.attention(q, k[:, :n_keys], v[:, :n_keys], True, None,
                                                                       False, 150, 0)[0])
            for grow in (1, 7):
                kg = torch.cat([k, k[:, :grow]], 1)
                vg = torch.cat([v, v[:, :grow]], 1)
                for kk, vv in ((kg, vg), (kg[:, :sk + grow - 1], vg[:, :sk + grow - 1])):
                    n = len(launched)
                    got = rtattn.attention(q, kk, vv, **kw)
                    assert len(launched) == n + 1 and torch.equal(
                        got, torch.ops.rtattn.attention(q, kk, vv, True, None, False, 150, 0)[0])
            # The same signature with q two bytes off a 16-byte boundary: the library refuses the pointer.
            buf = torch.empty(q.numel() + 1, device="cuda", dtype=q.dtype)
            shifted = buf[1:].view(q.shape).copy_(q)
            assert shifted.stride() == q.stride()
            with pytest.raises(rtattn.ArgumentError) as e:
                rtattn.attention(shifted, k, v, **kw)
            assert e.value.field == "q.ptr"
            # Equal options of other types match no checked signature: checked and refused.
            for bad, field in [(dict(causal=1), "causal"),
                               (dict(window_size=(150.0, 0)), "window_size"),
                               (dict(window_size=(True, 0)), "window_size"),
                               (dict(return_lse=1), "return_lse"), (dict(deterministic=0), "deterministic"),
                               (dict(softmax_scale=True), "softmax_scale")]:
                with pytest.raises(rtattn.ArgumentError) as e:
                    rtattn.attention(q, k, v, **{**kw, **bad})
                assert e.value.field == field, bad
            # K in another layout (a strided view, 8-byte aligned: the library loads it without TMA) takes the same
            # prepared launch, K/V's strides being set per call, and gives the op's bits for that layout.
            kt = torch.empty(2, sk, 4, 100, device="cuda", dtype=k.dtype)[:, :, 1:3].copy_(k)
            o_kt, _ = torch.ops.rtattn.attention(q, kt, v, True, None, False, 150, 0)
            n = len(launched)
            assert all(torch.equal(rtattn.attention(q, kt, v, **kw), o_kt) for _ in range(2))
            assert len(launched) == n + 2 and rel_err(o_kt, o_op.double()) < 1e-2


def test_what_is_recorded_or_transformed_is_never_silently_dropped():
    """Forward-mode AD and torch.func transforms are refused (there is a reverse-mode backward only), never answered
    with a result that silently lacks its tangent or gradient."""
    from torch.autograd import forward_ad
    q, k, v = make(1, 32, 32, 2, 2, 64, 64, torch.bfloat16, seed=32)
    sinks = make_sinks(2, 32)
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(q, torch.randn_like(q))
        with pytest.raises(NotImplementedError, match="q: carries a forward-mode AD tangent"):
            rtattn.attention(dual, k, v)
        with pytest.raises(NotImplementedError, match="sinks: carries a forward-mode AD tangent"):
            rtattn.attention(q, k, v, sinks=forward_ad.make_dual(sinks, torch.randn_like(sinks)))
        assert rtattn.attention(q, k, v).shape == q.shape  # no tangent anywhere: runs
    with pytest.raises(NotImplementedError):
        torch.func.grad(lambda x: rtattn.attention(x, k, v).float().sum())(q)
    with pytest.raises(NotImplementedError, match="forward-mode AD|torch.func"):
        torch.func.jvp(lambda x: rtattn.attention(x, k, v), (q,), (torch.randn_like(q),))
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.vmap(lambda x: rtattn.attention(x, k, v))(q[None])


def sdpa_grads(q, k, v, do, causal, scale, dlse=None, window=(-1, -1), sinks=None, softcap=0.0,
               dtype=torch.float64, alibi_slopes=None):
    """dQ, dK, dV of float64 SDPA (the reference above) by torch.autograd; and dsinks, given sinks. dtype: the
    reference's math and its autograd in another dtype (sdpa_reference's). alibi_slopes: constants, no gradient."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.detach().to(dtype).requires_grad_())
    o, lse = sdpa_reference(*leaves[:3], causal, scale, window, leaves[3] if sinks is not None else None, softcap,
                            dtype, alibi_slopes)
    loss = (o * do.to(dtype)).sum()
    if dlse is not None:
        finite = torch.isfinite(lse)
        loss = loss + (torch.where(finite, lse, torch.zeros_like(lse)) * dlse.to(dtype)).sum()
    return torch.autograd.grad(loss, leaves)


def check_grads(b, sq, sk, hq, hkv, d, dv, dtype, causal, seed, deterministic=False, with_dlse=False,
                window=(-1, -1), sinks=None):
    """Gradients against float64 SDPA's; sinks that require grad are checked too (dsinks, in the sinks' dtype)."""
    q, k, v = (t.requires_grad_() for t in make(b, sq, sk, hq, hkv, d, dv, dtype, seed))
    g = torch.Generator(device="cuda").manual_seed(seed + 1)  # the same dO for the same seed: runs compare bitwise
    do = torch.randn(b, sq, hq, dv, device="cuda", dtype=dtype, generator=g)
    dlse = torch.randn(b, hq, sq, device="cuda", generator=g) if with_dlse else None
    poison_allocator(4 * (q.numel() + k.numel() + v.numel()) + 8 * b * hq * sq * (d + 16))
    o, lse = rtattn.attention(q, k, v, causal=causal, return_lse=True, deterministic=deterministic,
                              window_size=window, sinks=sinks)
    outs, grads_in = [o], [do]
    if with_dlse:
        outs.append(lse)
        grads_in.append(dlse)
    leaves = (q, k, v) + ((sinks,) if sinks is not None and sinks.requires_grad else ())
    grads = torch.autograd.grad(outs, leaves, grads_in)
    torch.cuda.synchronize()
    ref = sdpa_grads(q, k, v, do, causal, 1 / math.sqrt(d), dlse, window, sinks)
    tol = {torch.bfloat16: 1e-2, torch.float16: 3e-3}[dtype]
    for name, got, want, leaf in zip(("dq", "dk", "dv", "dsinks"), grads, ref, leaves):
        assert got.shape == want.shape and got.dtype == leaf.dtype, name
        assert not torch.isnan(got).any(), f"{name}: NaN (an element was not written, or a keyless row)"
        err = ((got.double() - want).norm() / want.norm().clamp_min(1e-3 * math.sqrt(want.numel()))).item()
        assert err < tol, f"{name}: relative Frobenius error {err:.2e}"
    return grads


@pytest.mark.parametrize("d, dv, dtype, causal, heads, sq, sk", [
    (64, 64, torch.bfloat16, False, (4, 4), 128, 128),
    (132, 132, torch.bfloat16, True, (8, 2), 300, 200),   # GQA 4:1, causal with keyless rows
    (100, 100, torch.float16, True, (4, 1), 77, 211),     # MQA, Sq < Sk
    (192, 128, torch.bfloat16, False, (4, 2), 65, 130),   # d_qk != d_v
    (17, 17, torch.float16, False, (2, 2), 1, 1000),      # odd head dim, one query
    (256, 256, torch.bfloat16, True, (2, 1), 200, 200),
])
def test_gradients_match_float64_sdpa(d, dv, dtype, causal, heads, sq, sk):
    check_grads(2, sq, sk, heads[0], heads[1], d, dv, dtype, causal, seed=d + sq)


@pytest.mark.parametrize("d", [64, 128, 132])
@pytest.mark.parametrize("causal, window", [(False, (0, 0)), (False, (100, 37)), (False, (-1, 20)), (True, (16, -1)),
                                            (True, (1000, 0)), (True, (-1, -1))])
def test_sliding_window_matches_sdpa(d, causal, window):
    # 300 queries on 500 keys (the window bottom-right) and 500 on 300 (rows whose window misses every key).
    check(*make(2, 300, 500, 8, 2, d, d, torch.bfloat16, seed=d + window[0]), causal=causal, window=window)
    check(*make(1, 500, 300, 4, 1, d, d, torch.float16, seed=d + 7), causal=causal, window=window)


@pytest.mark.parametrize("d, causal, window", [(64, True, (37, -1)), (128, False, (50, 20)), (132, True, (0, 0)),
                                               (256, False, (-1, 9))])
def test_sliding_window_gradients(d, causal, window):
    check_grads(2, 300, 200, 4, 2, d, d, torch.bfloat16, causal, seed=d, window=window)


@pytest.mark.parametrize("d", [64, 128, 132])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (100, 37)), (True, (16, -1))])
def test_sinks_match_float64(d, causal, window):
    # 300 queries on 500 keys, GQA 4:1; 500 on 300, MQA, where causal and the windows leave rows without keys.
    check(*make(2, 300, 500, 8, 2, d, d, torch.bfloat16, seed=d), causal=causal, window=window,
          sinks=make_sinks(8, d))
    check(*make(1, 500, 300, 4, 1, d, d, torch.float16, seed=d + 7), causal=causal, window=window,
          sinks=make_sinks(4, d + 7))


def test_sinks_rows_without_keys_give_zero_and_the_sink():
    q, k, v = make(2, 300, 100, 4, 2, 64, 64, torch.bfloat16, seed=41)
    sinks = make_sinks(4, 41)
    o, lse = rtattn.attention(q, k, v, causal=True, return_lse=True, sinks=sinks)
    # Causal bottom-right: query i sees keys up to i - 200, so rows 0..199 see none.
    assert torch.count_nonzero(o[:, :200]) == 0
    torch.testing.assert_close(lse[:, :, :200], sinks[None, :, None].expand(2, 4, 200), rtol=0, atol=1e-4)
    # No key at all (seqlen_k 0, answered in Python): the same.
    q, k, v = make(2, 16, 0, 4, 2, 64, 64, torch.bfloat16, seed=42)
    o, lse = rtattn.attention(q, k, v, return_lse=True, sinks=sinks)
    assert torch.count_nonzero(o) == 0 and torch.equal(lse, sinks[None, :, None].expand(2, 4, 16))
    # Its gradient: LSE = the sink on every row, so dsinks is dLSE summed over the batch and the rows.
    s = sinks.clone().requires_grad_()
    dlse = torch.randn(2, 4, 16, device="cuda")
    _, lse = rtattn.attention(q, k, v, return_lse=True, sinks=s)
    (dsinks,) = torch.autograd.grad(lse, s, dlse)
    torch.testing.assert_close(dsinks, dlse.sum((0, 2)))


@pytest.mark.parametrize("d, causal, window, heads, with_dlse", [
    (64, False, (-1, -1), (4, 4), False),
    (132, True, (-1, -1), (8, 2), True),    # GQA 4:1; 300 queries on 200 keys: rows without keys; dLSE too
    (128, False, (50, 20), (4, 2), False),
    (64, True, (37, -1), (4, 1), True),     # MQA, a window
    (256, True, (-1, -1), (2, 1), False),
])
def test_sinks_gradients(d, causal, window, heads, with_dlse):
    check_grads(2, 300, 200, heads[0], heads[1], d, d, torch.bfloat16, causal, seed=d, with_dlse=with_dlse,
                window=window, sinks=make_sinks(heads[0], d).requires_grad_())


def test_sinks_in_other_dtypes_and_layouts_and_without_their_gradient():
    # bf16 sinks (as a checkpoint may hold them) are computed in float32 and get a bf16 gradient; the same values in
    # float32, or a strided view of them, give the same output bit for bit.
    sinks = make_sinks(4, 43, torch.bfloat16)
    q, k, v = make(2, 150, 170, 4, 2, 132, 132, torch.bfloat16, seed=43)
    o = rtattn.attention(q, k, v, causal=True, sinks=sinks)
    assert torch.equal(o, rtattn.attention(q, k, v, causal=True, sinks=sinks.float()))
    strided = torch.stack([sinks.float(), torch.zeros_like(sinks.float())], 1)[:, 0]
    assert not strided.is_contiguous() and torch.equal(o, rtattn.attention(q, k, v, causal=True, sinks=strided))
    check_grads(2, 150, 170, 4, 2, 132, 132, torch.bfloat16, True, seed=43, sinks=sinks.clone().requires_grad_())
    # Sinks that need no gradient: dq, dk, dv alone (the backward is told to skip dsinks).
    check_grads(2, 150, 170, 4, 2, 132, 132, torch.bfloat16, True, seed=44, with_dlse=True, sinks=sinks.float())


def test_sinks_training_step_under_torch_compile_fullgraph():
    """Both ops' fake implementations with sinks (the backward's fourth output, dsinks) traced; gradients, the
    sinks' among them, equal to eager's."""
    q, k, v = make(2, 256, 256, 8, 2, 64, 64, torch.bfloat16, seed=51)
    sinks = make_sinks(8, 51)

    compiled_grads_match_eager(lambda q, k, v, s: rtattn.attention(q, k, v, causal=True, sinks=s)
                               .float().square().mean(), (q, k, v, sinks))


def compiled_grads_match_eager(loss_fn, inputs):
    """A training step traced whole (fullgraph: a graph break raises): the gradients of every input equal eager's."""
    runs = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        fn(*leaves).backward()
        runs.append([t.grad for t in leaves])
    for a, b in zip(*runs):
        assert b is not None and (a.double() - b.double()).norm() <= 1e-2 * a.double().norm()


# ---- logit softcapping -----------------------------------------------------------------------------------------------

# (softcap, spread): a cap that bites (the scaled scores, spread 3x, reach +-10) and a mild one (Gemma 2's 50 is
# milder still). The kernels' tanh is tanh.approx (about 2^-11 of the score): the usual tolerances hold.
CAPS = [(5.0, 3.0), (30.0, 1.0)]


def make_capped(b, sq, sk, hq, hkv, d, dtype, seed, spread):
    """make's q, k, v (d_v = d) with q times `spread`, the scaled scores' standard deviation."""
    q, k, v = make(b, sq, sk, hq, hkv, d, d, dtype, seed)
    return q * spread, k, v


@pytest.mark.parametrize("d", [64, 128, 132])
@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (False, (100, 37)), (True, (16, -1))])
@pytest.mark.parametrize("softcap, spread", CAPS)
def test_softcap_matches_float64(d, causal, window, softcap, spread):
    # 300 queries on 500 keys, GQA 4:1; 500 on 300, MQA, where causal and the windows leave rows without keys.
    check(*make_capped(2, 300, 500, 8, 2, d, torch.bfloat16, d, spread), causal=causal, window=window,
          softcap=softcap)
    check(*make_capped(1, 500, 300, 4, 1, d, torch.float16, d + 7, spread), causal=causal, window=window,
          softcap=softcap)


@pytest.mark.parametrize("d, causal, window", [(64, True, (-1, -1)), (128, False, (100, 37)), (132, True, (16, -1)),
                                               (128, False, (-1, -1))])
def test_softcap_with_sinks(d, causal, window):
    # The sinks are logits in the capped scores' units, themselves uncapped; rows without keys: O = 0, LSE = sink.
    for (softcap, spread), dtype, shape, seed in zip(CAPS, (torch.bfloat16, torch.float16),
                                                     ((2, 300, 500, 8, 2), (1, 500, 300, 4, 1)), (d, d + 7)):
        check(*make_capped(*shape, d, dtype, seed, spread), causal=causal, window=window,
              sinks=make_sinks(shape[3], seed), softcap=softcap)


def test_softcap_is_applied_and_0_is_none():
    q, k, v = make_capped(2, 200, 300, 4, 2, 128, torch.bfloat16, 61, 3.0)
    ref, _ = sdpa_reference(q, k, v, True, 1 / math.sqrt(128))
    capped = rtattn.attention(q, k, v, causal=True, softcap=5.0)
    assert rel_err(capped, ref) > 0.1, "a cap of 5 on scores reaching 10 left O as the uncapped attention's"
    assert torch.equal(rtattn.attention(q, k, v, causal=True, softcap=5), capped)  # an int cap
    # 0: the kernel without softcap, bit for bit; a cap far above every score: the uncapped attention.
    assert torch.equal(rtattn.attention(q, k, v, causal=True, softcap=0.0), rtattn.attention(q, k, v, causal=True))
    assert rel_err(rtattn.attention(q, k, v, causal=True, softcap=1e4), ref) < TOL[torch.bfloat16]
    # No key at all (answered in Python): O = 0, LSE = +inf, as without a cap.
    q, k, v = make(2, 16, 0, 4, 2, 64, 64, torch.bfloat16, seed=62)
    o, lse = rtattn.attention(q, k, v, return_lse=True, softcap=5.0)
    assert torch.count_nonzero(o) == 0 and torch.isposinf(lse).all()


def test_softcap_through_the_op_and_under_torch_compile():
    q, k, v = make_capped(2, 200, 300, 6, 2, 100, torch.bfloat16, 63, 3.0)
    o, lse = rtattn.attention(q, k, v, causal=True, return_lse=True, softcap=5.0)
    o2, lse2 = torch.ops.rtattn.attention(q, k, v, True, None, False, -1, -1, None, 5.0)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    assert torch.equal(torch.ops.rtattn.attention(q, k, v, True, None, False, softcap=5.0)[0], o)
    f = torch.compile(lambda q, k, v: rtattn.attention(q, k, v, causal=True, softcap=5.0), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(f(q, k, v), o)
    meta = [torch.empty(t.shape, device="meta", dtype=t.dtype) for t in (q, k, v)]
    o, lse = rtattn.attention(*meta, return_lse=True, softcap=5.0)
    assert o.shape == q.shape and lse.shape == (2, 6, 200) and o.device.type == "meta"


# softcap's gradients are judged against PyTorch's own: the same math and autograd in the inputs' 16-bit dtype
# (sdpa_grads with dtype) sets how far from float64 a 16-bit computation may land; ours may be twice as far, plus a
# floor for where PyTorch's error happens to be small. A fixed tolerance would have to guess how much the cap's
# slope (1 - tanh^2, near 0 where a cap of 5 saturates) amplifies rounding.
GRAD_FLOOR = {torch.bfloat16: 1e-3, torch.float16: 3e-4}


def grad_err(got, want):
    """check_grads' measure: relative Frobenius error, the norm floored so a gradient near zero everywhere does not
    turn rounding noise into a large ratio."""
    return ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-3 * math.sqrt(want.numel()))
            ).item()


def judge_against_torch(names, got, ref, low, dtype):
    """Each gradient of `got` within twice the error of `low` (PyTorch's, in dtype) against `ref` (float64), plus
    GRAD_FLOOR. A NaN in ours fails by name; one in PyTorch's makes the bound NaN, which nothing is <= to."""
    assert len(got) == len(ref) == len(low)
    for name, g, r, lo in zip(names, got, ref, low):
        assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)}, expected {tuple(r.shape)}"
        assert not torch.isnan(g).any(), f"{name}: NaN (an element was not written, or a keyless row)"
        ours, theirs = grad_err(g, r), grad_err(lo, r)
        bound = 2 * theirs + GRAD_FLOOR[dtype]
        assert ours <= bound, (f"{name}: relative Frobenius error {ours:.2e}; PyTorch's in {dtype} {theirs:.2e}, "
                               f"bound {bound:.2e}")


def check_softcap_grads(b, sq, sk, hq, hkv, d, dtype, causal, seed, softcap, spread, window=(-1, -1), sinks=False,
                        with_dlse=False, deterministic=False, alibi_slopes=None):
    """rtattn.attention's dQ, dK, dV (and dsinks: sinks that require grad, given sinks) with a cap (0: none) and
    ALiBi slopes (None: none), by judge_against_torch. q is scaled by spread (make_capped). Returns the gradients."""
    q, k, v = (t.detach().requires_grad_() for t in make_capped(b, sq, sk, hq, hkv, d, dtype, seed, spread))
    g = torch.Generator(device="cuda").manual_seed(seed + 1)  # the same dO for the same seed: runs compare bitwise
    do = torch.randn(b, sq, hq, d, device="cuda", dtype=dtype, generator=g)
    # Sinks and dLSE of values a 16-bit dtype holds exactly: PyTorch's run in it starts from the inputs ours has.
    dlse = torch.randn(b, hq, sq, device="cuda", generator=g).to(torch.bfloat16).float() if with_dlse else None
    s = make_sinks(hq, seed, torch.bfloat16).float().requires_grad_() if sinks else None
    poison_allocator(4 * (q.numel() + k.numel() + v.numel()) + 8 * b * hq * sq * (d + 16))
    o, lse = rtattn.attention(q, k, v, causal=causal, return_lse=True, deterministic=deterministic,
                              window_size=window, sinks=s, softcap=softcap, alibi_slopes=alibi_slopes)
    outs, grads_in = ([o, lse], [do, dlse]) if with_dlse else ([o], [do])
    leaves = (q, k, v) + ((s,) if sinks else ())
    got = torch.autograd.grad(outs, leaves, grads_in)
    torch.cuda.synchronize()
    for name, grad, leaf in zip(("dq", "dk", "dv", "dsinks"), got, leaves):
        assert grad.dtype == leaf.dtype, name
    scale = 1 / math.sqrt(d)
    ref = sdpa_grads(q, k, v, do, causal, scale, dlse, window, s, softcap, alibi_slopes=alibi_slopes)
    low = sdpa_grads(q, k, v, do, causal, scale, dlse, window, s, softcap, dtype, alibi_slopes)
    judge_against_torch(("dq", "dk", "dv", "dsinks"), got, ref, low, dtype)
    return got


@pytest.mark.parametrize("d", [64, 128, 132, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("softcap, spread", CAPS)
def test_softcap_gradients_match_float64(d, causal, dtype, softcap, spread):
    # GQA 4:1; 300 queries on 200 keys: causal (bottom-right) leaves the first 100 rows without keys.
    check_softcap_grads(2, 300, 200, 8, 2, d, dtype, causal, seed=d + causal, softcap=softcap, spread=spread)


@pytest.mark.parametrize("d, dtype, causal, window, heads, sinks, with_dlse", [
    (64, torch.bfloat16, True, (37, -1), (4, 1), True, True),      # MQA; a gradient into LSE too
    (128, torch.float16, False, (50, 20), (8, 2), True, False),    # rows whose window misses every key
    (132, torch.bfloat16, True, (-1, -1), (8, 2), True, True),     # keyless rows: O = 0, LSE = the sink
    (256, torch.bfloat16, False, (-1, 9), (4, 2), True, False),
    (128, torch.float16, True, (16, -1), (4, 4), False, True),     # a window without sinks: keyless LSE +inf
])
@pytest.mark.parametrize("softcap, spread", CAPS)
def test_softcap_gradients_with_sinks_and_windows(d, dtype, causal, window, heads, sinks, with_dlse, softcap, spread):
    check_softcap_grads(2, 300, 200, heads[0], heads[1], d, dtype, causal, seed=d + 5, softcap=softcap,
                        spread=spread, window=window, sinks=sinks, with_dlse=with_dlse)


def test_softcap_gradients_are_the_capped_scores_ones():
    """The judge can tell: the gradients of the uncapped scores (a backward that dropped the cap) are far outside
    its bound for a cap that bends most scores."""
    q, k, v = make_capped(2, 300, 200, 8, 2, 128, torch.bfloat16, 67, 3.0)
    do = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)
    scale = 1 / math.sqrt(128)
    ref = sdpa_grads(q, k, v, do, True, scale, softcap=5.0)
    low = sdpa_grads(q, k, v, do, True, scale, softcap=5.0, dtype=torch.bfloat16)
    uncapped = sdpa_grads(q, k, v, do, True, scale)
    for name, r, lo, u in zip(("dq", "dk", "dv"), ref, low, uncapped):
        bound = 2 * grad_err(lo, r) + GRAD_FLOOR[torch.bfloat16]
        assert grad_err(u, r) > 3 * bound, name
    check_softcap_grads(2, 300, 200, 8, 2, 128, torch.bfloat16, True, seed=67, softcap=5.0, spread=3.0)


def test_softcap_deterministic_gradients_are_bitwise_reproducible():
    args = (2, 500, 400, 4, 2, 128, torch.bfloat16, True)
    first = check_softcap_grads(*args, seed=9, softcap=5.0, spread=3.0, deterministic=True, sinks=True,
                                with_dlse=True)
    again = check_softcap_grads(*args, seed=9, softcap=5.0, spread=3.0, deterministic=True, sinks=True,
                                with_dlse=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_softcap_backward_through_the_ops_and_under_torch_compile():
    q, k, v = make_capped(2, 200, 300, 6, 2, 100, torch.bfloat16, 65, 3.0)
    sinks = make_sinks(6, 65)
    do = torch.randn(2, 200, 6, 100, device="cuda", dtype=torch.bfloat16)
    # Deterministic: the three paths below must agree bit for bit.
    leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    o, lse = rtattn.attention(*leaves[:3], causal=True, return_lse=True, deterministic=True, sinks=leaves[3],
                              softcap=5.0)
    grads = torch.autograd.grad(o, leaves, do)
    # The forward op called directly, and its autograd.
    leaves2 = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    o2, lse2 = torch.ops.rtattn.attention(*leaves2[:3], True, None, True, -1, -1, leaves2[3], 5.0)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(o2, leaves2, do), grads))
    # The backward op itself, given the forward's cap; with 0 it runs the uncapped kernel, whose gradients differ.
    o, lse = o.detach(), lse.detach()
    out = torch.ops.rtattn.attention_backward(do, q, k, v, o, lse, None, True, None, True, -1, -1, sinks, True, 5.0)
    assert all(torch.equal(a, b) for a, b in zip(out, grads))
    out0 = torch.ops.rtattn.attention_backward(do, q, k, v, o, lse, None, True, None, True, -1, -1, sinks, True, 0.0)
    assert grad_err(out0[0], grads[0]) > 0.1
    # Its fake implementation: shapes on meta tensors, dsinks included.
    meta = [torch.empty(t.shape, device="meta", dtype=t.dtype) for t in (do, q, k, v, o, lse, sinks)]
    out = torch.ops.rtattn.attention_backward(*meta[:6], None, True, None, False, -1, -1, meta[6], True, 5.0)
    assert [tuple(t.shape) for t in out] == [q.shape, k.shape, v.shape, (6,)]
    assert all(t.device.type == "meta" for t in out)
    for cap, match in ((-1.0, ">= 0"), (math.nan, ">= 0"), (1e39, "float32")):
        bad(lambda: torch.ops.rtattn.attention_backward(do, q, k, v, o, lse, None, True, None, False, -1, -1, None,
                                                        False, cap), "softcap", match)

    # A training step traced whole (fullgraph: a graph break raises), both ops' fakes taking the cap; gradients, the
    # sinks' among them, equal to eager's.
    compiled_grads_match_eager(lambda q, k, v, s: rtattn.attention(q, k, v, causal=True, sinks=s, softcap=5.0)
                               .float().square().mean(), (q, k, v, sinks))


# ---- ALiBi -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", [1, 2])
def test_alibi_matches_float64(d, causal, dims):
    # 300 queries on 500 keys, GQA 4:1; 500 on 300, MQA, where the diagonal starts 200 keys before the first one (a
    # large bias on every key of the first rows) and causal leaves rows without keys.
    check(*make(2, 300, 500, 8, 2, d, d, torch.bfloat16, d), causal=causal,
          alibi_slopes=make_slopes(2, 8, d + causal, dims))
    check(*make(2, 500, 300, 4, 1, d, d, torch.float16, d + 7), causal=causal,
          alibi_slopes=make_slopes(2, 4, d + 7 + causal, dims))


def test_alibi_with_softcap_sinks_and_a_window():
    # The bias comes after the cap (FlashAttention's order); the sinks are neither capped nor biased.
    for (softcap, spread), dtype, shape, seed in zip(CAPS, (torch.bfloat16, torch.float16),
                                                     ((2, 300, 500, 8, 2), (2, 500, 300, 4, 1)), (81, 82)):
        check(*make_capped(*shape, 128, dtype, seed, spread), causal=True, window=(100, -1),
              sinks=make_sinks(shape[3], seed), softcap=softcap, alibi_slopes=make_slopes(2, shape[3], seed, 2))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dims", [1, 2])
def test_alibi_gradients_match_float64(d, causal, dims):
    # GQA 4:1; 300 queries on 200 keys: causal (bottom-right) leaves the first 100 rows without keys.
    dtype = torch.bfloat16 if dims == 1 else torch.float16
    check_softcap_grads(2, 300, 200, 8, 2, d, dtype, causal, seed=d + causal + 90, softcap=0.0, spread=1.0,
                        alibi_slopes=make_slopes(2, 8, d + causal, dims))


def test_alibi_gradients_with_softcap_sinks_and_a_window():
    check_softcap_grads(2, 300, 200, 8, 2, 128, torch.bfloat16, True, seed=93, softcap=5.0, spread=3.0,
                        window=(37, -1), sinks=True, with_dlse=True, alibi_slopes=make_slopes(2, 8, 93, 2))


def test_alibi_is_applied_through_the_ops_and_under_torch_compile():
    q, k, v = make(2, 200, 300, 8, 2, 128, 128, torch.bfloat16, seed=71)
    slopes = make_slopes(2, 8, 71, dims=2)
    ref, _ = sdpa_reference(q, k, v, True, 1 / math.sqrt(128))
    o, lse = rtattn.attention(q, k, v, causal=True, return_lse=True, alibi_slopes=slopes)
    assert rel_err(o, ref) > 0.1, "slopes up to 0.75 over hundreds of keys left O as plain attention's"
    zero = torch.zeros(8, device="cuda")  # the alibi kernel with no bias: plain attention
    assert rel_err(rtattn.attention(q, k, v, causal=True, alibi_slopes=zero), ref) < TOL[torch.bfloat16]
    # The batch stride: the strided rows, their contiguous copy, and each sequence alone with its row agree; a
    # [heads_q] row and that row expanded over the batch (stride 0) too.
    assert torch.equal(rtattn.attention(q, k, v, causal=True, alibi_slopes=slopes.contiguous()), o)
    for b in range(2):
        alone = rtattn.attention(q[b:b + 1], k[b:b + 1], v[b:b + 1], causal=True, alibi_slopes=slopes[b].contiguous())
        assert rel_err(alone[0], o[b].double()) < 1e-3, f"sequence {b} did not get its own slopes"
    row = slopes[0].contiguous()
    assert torch.equal(rtattn.attention(q, k, v, causal=True, alibi_slopes=row),
                       rtattn.attention(q, k, v, causal=True, alibi_slopes=row.expand(2, 8)))
    # The forward op called directly; torch.compile; the fake on meta tensors.
    o2, lse2 = torch.ops.rtattn.attention(q, k, v, True, None, False, -1, -1, None, 0.0, slopes)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    f = torch.compile(lambda q, k, v, s: rtattn.attention(q, k, v, causal=True, alibi_slopes=s), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(f(q, k, v, slopes), o)
    meta = [torch.empty(t.shape, device="meta", dtype=t.dtype) for t in (q, k, v, slopes)]
    om, lsem = rtattn.attention(*meta[:3], return_lse=True, alibi_slopes=meta[3])
    assert om.shape == q.shape and lsem.shape == (2, 8, 200) and om.device.type == "meta"

    # Backward: the slopes get no gradient (constants, as in FlashAttention), even when they require one.
    do = torch.randn(2, 200, 8, 128, device="cuda", dtype=torch.bfloat16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, slopes)]
    o, lse = rtattn.attention(*leaves[:3], causal=True, return_lse=True, deterministic=True, alibi_slopes=leaves[3])
    grads = torch.autograd.grad(o, leaves, do, allow_unused=True)
    assert grads[3] is None and all(g is not None for g in grads[:3])
    # The backward op itself, given the forward's slopes; without them it runs the unbiased kernel, whose gradients
    # differ. Its fake: shapes on meta tensors.
    o, lse = o.detach(), lse.detach()
    run = lambda s: torch.ops.rtattn.attention_backward(do, q, k, v, o, lse, None, True, None, True, -1, -1, None,
                                                        False, 0.0, s)
    assert all(torch.equal(a, b) for a, b in zip(run(slopes)[:3], grads[:3]))
    assert grad_err(run(None)[0], grads[0]) > 0.1
    meta = [torch.empty(t.shape, device="meta", dtype=t.dtype) for t in (do, q, k, v, o, lse, slopes)]
    out = torch.ops.rtattn.attention_backward(*meta[:6], None, True, None, False, -1, -1, None, False, 0.0, meta[6])
    assert [tuple(t.shape) for t in out] == [q.shape, k.shape, v.shape, (0,)]
    # A training step traced whole, both ops' fakes taking the slopes; gradients equal to eager's.
    compiled_grads_match_eager(lambda q, k, v: rtattn.attention(q, k, v, causal=True, alibi_slopes=slopes)
                               .float().square().mean(), (q, k, v))


def test_alibi_argument_errors_name_alibi_slopes():
    q, k, v = make(2, 64, 64, 4, 2, 64, 64, torch.bfloat16, seed=73)
    cases = [(torch.zeros(3, device="cuda"), "shape"), (torch.zeros(3, 4, device="cuda"), "shape"),
             (torch.zeros(4, 2, device="cuda"), "shape"), (torch.zeros(2, 4, 1, device="cuda"), "shape"),
             (torch.zeros(4, dtype=torch.bfloat16, device="cuda"), "float32"),
             (torch.zeros(4, dtype=torch.float64, device="cuda"), "float32"),
             (torch.zeros(4), "is on cpu"), ([0.1] * 4, "torch.Tensor"),
             (torch.zeros(8, device="cuda")[::2], "contiguous"),
             (torch.zeros(8, device="cuda").as_strided((2, 4), (2, 1)), "overlap")]
    for slopes, match in cases:
        bad(lambda: rtattn.attention(q, k, v, alibi_slopes=slopes), "alibi_slopes", match)
        # With q needing a gradient (the custom op's path), and in the op called directly.
        bad(lambda: rtattn.attention(q.detach().requires_grad_(), k, v, alibi_slopes=slopes), "alibi_slopes", match)
        if isinstance(slopes, torch.Tensor) and slopes.is_cuda:
            bad(lambda: torch.ops.rtattn.attention(q, k, v, False, None, False, -1, -1, None, 0.0, slopes),
                "alibi_slopes", match)


def test_gradient_through_the_returned_lse():
    check_grads(2, 150, 100, 4, 2, 64, 64, torch.bfloat16, True, seed=8, with_dlse=True)


def test_deterministic_gradients_are_bitwise_reproducible():
    first = check_grads(2, 500, 400, 4, 2, 128, 128, torch.bfloat16, True, seed=9, deterministic=True)
    again = check_grads(2, 500, 400, 4, 2, 128, 128, torch.bfloat16, True, seed=9, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_training_step_under_torch_compile_fullgraph():
    """A layer's forward and loss traced as one graph (fullgraph: a graph break raises), its backward compiled by
    AOTAutograd through the backward op's fake implementation; gradients equal to eager's."""
    q, k, v = make(2, 256, 256, 8, 2, 132, 132, torch.bfloat16, seed=11)
    w = torch.randn(132, 132, device="cuda", dtype=torch.bfloat16) * 0.1

    def loss_fn(q, k, v, w):
        o = rtattn.attention(q @ w, k, v, causal=True)
        return o.float().square().mean()

    grads = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, w)]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads):
        assert b is not None and (a.double() - b.double()).norm() <= 1e-2 * a.double().norm()


def test_training_step_with_backward_call_compiled():
    q, k, v = (t.requires_grad_() for t in make(1, 128, 128, 4, 4, 64, 64, torch.bfloat16, seed=12))

    @torch.compile(fullgraph=True)
    def loss_fn(q, k, v):
        return rtattn.attention(q, k, v).float().sum()

    loss_fn(q, k, v).backward()
    assert q.grad is not None and k.grad is not None and v.grad is not None
    ref = sdpa_grads(q, k, v, torch.ones(1, 128, 4, 64, device="cuda"), False, 1 / 8)
    assert ((q.grad.double() - ref[0]).norm() / ref[0].norm()).item() < 1e-2


@pytest.mark.parametrize("softcap", [0.0, 5.0])
def test_backward_of_empty_and_keyless_inputs(softcap):
    for sq, sk in ((0, 5), (5, 0)):
        q, k, v = (t.requires_grad_() for t in make(1, sq, sk, 2, 2, 64, 64, torch.bfloat16, seed=13))
        o = rtattn.attention(q, k, v, softcap=softcap)
        dq, dk, dv = torch.autograd.grad(o.float().sum(), (q, k, v), allow_unused=True)
        for g in (dq, dk, dv):
            assert g is None or (g.numel() == 0 or torch.count_nonzero(g) == 0)


def bad(fn, field, match):
    with pytest.raises(rtattn.ArgumentError, match=match) as e:
        fn()
    assert e.value.field == field


def test_argument_errors_name_the_argument():
    q, k, v = make(2, 64, 64, 4, 2, 132, 132, torch.bfloat16, seed=9)
    bad(lambda: rtattn.attention(q.cpu(), k, v), "q", "CUDA tensors")
    bad(lambda: rtattn.attention(q, k.float(), v), "k", "dtype")
    bad(lambda: rtattn.attention(q, k, v.to(torch.float16)), "v", "dtype")
    bad(lambda: rtattn.attention(q[0], k, v), "q", "4 dims")
    bad(lambda: rtattn.attention(q, k[:, :, :1].expand(2, 64, 3, 132), v[:, :, :1].expand(2, 64, 3, 132)), "k",
        "multiple")
    bad(lambda: rtattn.attention(q, k, v[:, :32]), "v", "must match")
    bad(lambda: rtattn.attention(q, k[..., :100], v), "k", "head_dim")
    bad(lambda: rtattn.attention(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), "q", "contiguous")
    bad(lambda: rtattn.attention(q, k, v, causal=1), "causal", "True or False")
    bad(lambda: rtattn.attention(q, k, v, softmax_scale=-1.0), "softmax_scale", "> 0")
    bad(lambda: rtattn.attention(q, k, v, window_size=(-2, 0)), "window_size", "out of range")
    bad(lambda: rtattn.attention(q, k, v, window_size=4), "window_size", "left, right")
    bad(lambda: rtattn.attention(q, k, v, causal=True, window_size=(8, 3)), "window_size", "causal")
    bad(lambda: rtattn.attention(q, k, v, sinks=torch.zeros(3, device="cuda")), "sinks", r"shape \(3,\)")
    bad(lambda: rtattn.attention(q, k, v, sinks=torch.zeros(4, 1, device="cuda")), "sinks", "one logit per query head")
    bad(lambda: rtattn.attention(q, k, v, sinks=torch.zeros(4)), "sinks", "is on cpu")
    bad(lambda: rtattn.attention(q, k, v, sinks=torch.zeros(4, dtype=torch.int32, device="cuda")), "sinks", "floating")
    bad(lambda: rtattn.attention(q, k, v, sinks=[0.0] * 4), "sinks", "torch.Tensor")
    for cap, match in ((-1.0, ">= 0"), (math.nan, ">= 0"), (math.inf, ">= 0"), (-math.inf, ">= 0"),
                       ("5", "not a real number"), (True, "not a real number"), (None, "not a real number"),
                       (torch.tensor(5.0), "not a real number"), (1e39, "float32"), (1e-39, "float32")):
        bad(lambda: rtattn.attention(q, k, v, softcap=cap), "softcap", match)
    # With q needing a gradient (the custom op's path), and in the op called directly.
    bad(lambda: rtattn.attention(q.detach().requires_grad_(), k, v, softcap=-1.0), "softcap", ">= 0")
    bad(lambda: torch.ops.rtattn.attention(q, k, v, False, None, False, -1, -1, None, math.nan), "softcap", ">= 0")
    # Through the custom op (q needs a gradient): the same check.
    bad(lambda: rtattn.attention(q.detach().requires_grad_(), k, v, sinks=torch.zeros(5, device="cuda")), "sinks",
        "shape")
    # What only the library can see (alignment for this kernel's vector width) comes back named too.
    base = torch.zeros(2, 64, 4, 136, device="cuda", dtype=torch.bfloat16)
    bad(lambda: rtattn.attention(base[..., 2:134], k, v), "q.ptr", "aligned")
    with pytest.raises(rtattn.ConfigError) as e:
        rtattn.attention(*make(1, 8, 8, 1, 1, 300, 300, torch.bfloat16, seed=1))
    assert e.value.field == "head_dim_qk"
