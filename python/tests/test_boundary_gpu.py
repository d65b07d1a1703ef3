"""Issue 21 at the Python boundary with torch on a GPU: sizes past int32 (a stride-0 expand makes them free) and
split counts are refused before anything is allocated; FlashAttention's num_splits=1 ("no split") works everywhere
0 does; flags and scales of the wrong type name the argument."""
import pytest

torch = pytest.importorskip("torch", reason="no GPU tests here: torch is not installed")

import rtattn  # noqa: E402
from test_serving_gpu import decode_setup, packed_batch  # noqa: E402

pytestmark = pytest.mark.gpu

HUGE = 2**32 + 64  # an int32 would hold it as 64


def test_num_splits_is_checked_before_any_allocation():
    q, kc, vc, seqlens, table, _, _ = decode_setup([10, 20], 16, 4, 2, 64, torch.bfloat16)
    with torch.no_grad():
        rtattn.attention_with_kvcache(q, kc, vc, seqlens, table)  # kernels loaded: only the call's memory is left
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.max_memory_allocated()
        for call in (lambda: rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, num_splits=10**6),
                     # the op itself, as torch.compile calls it: the workspace query refuses the count
                     lambda: torch.ops.rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, 20, False, None,
                                                                     10**6)):
            with pytest.raises(rtattn.ArgumentError) as e:
                call()
            assert e.value.field == "num_splits" and "0..128" in str(e.value)
        assert torch.cuda.max_memory_allocated() - before < 1 << 20  # it was about 16 TB asked of torch


@pytest.mark.parametrize("page_size, sq", [(0, 1), (16, 4), (16, 40)])
def test_num_splits_1_means_no_split(page_size, sq):
    """FlashAttention passes 1 for "no split", also to a paged prefill (more than 16 query tokens)."""
    q, kc, vc, seqlens, table, _, _ = decode_setup([300, 41], page_size, 8, 2, 64, torch.bfloat16, sq, seed=sq)
    with torch.no_grad():
        one = rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, num_splits=1, causal=True)
        chosen = rtattn.attention_with_kvcache(q, kc, vc, seqlens, table, num_splits=0, causal=True)
    torch.testing.assert_close(one, chosen, atol=2e-2, rtol=2e-2)


def test_sizes_past_int32_are_refused_not_wrapped():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 2, 64, device="cuda", dtype=torch.bfloat16).expand(1, HUGE, 2, 64)  # no memory
    with pytest.raises(rtattn.ArgumentError) as e:
        rtattn.attention(q, k, k)
    assert e.value.field == "seqlen_k" and "2^31-1" in str(e.value)
    with torch.no_grad(), pytest.raises(rtattn.ArgumentError) as e:  # capacity from the expanded dense cache
        rtattn.attention_with_kvcache(q[:, :1], k, k)
    assert e.value.field == "max_seqlen_k"
    qp, kp, vp, cu_q, cu_k = packed_batch([8, 8], [8, 8], 2, 2, 64, torch.bfloat16, seed=1)
    for args, field in (((HUGE, 8), "max_seqlen_q"), ((8, -1), "max_seqlen_k"), ((8.0, 8), "max_seqlen_q")):
        with pytest.raises(rtattn.ArgumentError) as e:
            rtattn.attention_varlen(qp, kp, vp, cu_q, cu_k, *args)
        assert e.value.field == field


def test_flags_and_scales_of_the_wrong_type_name_the_argument():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    for kwargs, field in ((dict(return_lse="no"), "return_lse"), (dict(causal="false"), "causal"),
                          (dict(softmax_scale=10**400), "softmax_scale"), (dict(deterministic=1), "deterministic")):
        with pytest.raises(rtattn.ArgumentError) as e:
            rtattn.attention(q, q, q, **kwargs)
        assert e.value.field == field, kwargs
