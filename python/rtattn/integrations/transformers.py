"""rtattn as a Hugging Face transformers attention backend (issue 27; docs/transformers.md says what transformers
hands a backend).

    from rtattn.integrations import transformers as rt_hf
    rt_hf.register()                                   # the name "rtattn", before the model is built
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="rtattn")

Every attention layer then runs on librtattn: dense causal prefill and training (gradients through rtattn's
backward), padded batches as packed sequences (the 2-D padding mask, never a [B, S, S] one), padding-free packed
batches (cu_seq_lens_* or restarting position_ids), generation against the model's cache, GQA/MQA, any head_dim,
the model's scaling, sliding windows, Gemma 2's softcap and gpt-oss's sinks. What rtattn does not do (attention
dropout, returning the weights, a 4-D float mask, float32 tensors) is refused with an error naming it."""
import torch

import rtattn

NAME = "rtattn"


def register(name: str = NAME) -> str:
    """Registers the backend (and transformers' 2-D padding mask for it: a name without a mask function gets no mask
    at all, padding included). Returns the name for attn_implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    try:
        from transformers import AttentionMaskInterface
    except ImportError:
        from transformers.masking_utils import AttentionMaskInterface
    if "flash" in name:
        raise ValueError(f"name {name!r}: transformers treats names containing 'flash' as flash-attn backends")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"])
    return name


def _window(sliding_window, causal: bool):
    """transformers' window of N: keys i-N+1 .. i (N with the current one); rtattn's is FlashAttention's."""
    if sliding_window is None or int(sliding_window) <= 0:
        return (-1, -1)
    n = int(sliding_window)
    return (n - 1, 0 if causal else n - 1)


def _unpad(x: torch.Tensor, mask: torch.Tensor):
    """Rows of x [B, S, H, D] where mask [B, S] is true, packed: (rows [total, H, D], indices, cu_seqlens, max)."""
    lens = mask.sum(dim=1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lens, dim=0, dtype=torch.int32), (1, 0))
    return x.reshape(-1, *x.shape[2:])[indices], indices, cu, int(lens.max().item()) if lens.numel() else 0


def _packed_from_positions(position_ids: torch.Tensor):
    """cu_seqlens of a padding-free batch (one row of several sequences whose positions restart), or None."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1 or position_ids.shape[1] < 2:
        return None
    pos = position_ids[0]
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1, as_tuple=False).flatten() + 1
    if starts.numel() == 0:
        return None
    total = pos.numel()
    cu = torch.cat([starts.new_zeros(1), starts, starts.new_tensor([total])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max().item())


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, sliding_window=None,
                      softcap=None, s_aux=None, is_causal=None, **kwargs):
    """The AttentionInterface function: query [B, Hq, Sq, D], key/value [B, Hkv, Skv, D] -> ([B, Sq, Hq, Dv], None)."""
    if dropout and getattr(module, "training", False):
        raise NotImplementedError(f"rtattn: attention dropout ({dropout}) is not supported; set the model's "
                                  "attention_dropout to 0 or use another attn_implementation")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("rtattn: output_attentions (the attention weights) is not supported")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"rtattn: a {attention_mask.dim()}-D attention mask; the backend takes transformers' 2-D "
                         "padding mask (rtattn.integrations.transformers.register() installs it)")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views
    b, sq = q.shape[0], q.shape[1]
    opts = dict(causal=causal, softmax_scale=scaling, window_size=_window(sliding_window, causal),
                softcap=float(softcap) if softcap else 0.0, sinks=s_aux)

    # Padding-free training: packed sequences in one row (the collator's cu_seq_lens_*, or restarting positions).
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q = kwargs.get("max_length_q", kwargs.get("max_seqlen_q"))
        max_k = kwargs.get("max_length_k", kwargs.get("max_seqlen_k"))
        o = rtattn.attention_varlen(q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]),
                                    v.reshape(-1, *v.shape[2:]), cu_q.to(torch.int32), cu_k.to(torch.int32),
                                    int(max_q), int(max_k), **opts)
        return o.view(b, sq, *o.shape[1:]), None
    if attention_mask is None and b == 1 and sq == k.shape[1]:
        packed = _packed_from_positions(kwargs.get("position_ids"))
        if packed is not None:
            cu, longest = packed
            o = rtattn.attention_varlen(q[0], k[0], v[0], cu, cu, longest, longest, **opts)
            return o.unsqueeze(0), None

    if attention_mask is None:
        # A static cache whose all-true mask an older transformers dropped: only the slots up to the query's last
        # position hold keys.
        positions = kwargs.get("cache_position")
        if positions is not None and k.shape[1] > sq:
            filled = int(positions[-1].item()) + 1
            if filled < k.shape[1]:
                k, v = k[:, :filled], v[:, :filled]
        return rtattn.attention(q, k, v, **opts), None

    # A padded batch: the mask's true columns are each sequence's keys (a static cache's mask covers only its filled
    # slots, the first mask.shape[1]); the queries are the last sq of them.
    mask = attention_mask.bool()
    k, v = k[:, :mask.shape[1]], v[:, :mask.shape[1]]
    k_rows, k_index, cu_k, max_k = _unpad(k, mask)
    v_rows = v.reshape(-1, *v.shape[2:])[k_index]
    if sq == mask.shape[1]:
        q_rows, q_index, cu_q, max_q = _unpad(q, mask)
    elif sq == 1:
        q_rows, q_index = q.reshape(b, *q.shape[2:]), None
        cu_q, max_q = torch.arange(b + 1, dtype=torch.int32, device=q.device), 1
    else:
        q_rows, q_index, cu_q, max_q = _unpad(q, mask[:, -sq:])
    o_rows = rtattn.attention_varlen(q_rows, k_rows, v_rows, cu_q, cu_k, max_q, max_k, **opts)
    if q_index is None:
        return o_rows.view(b, 1, *o_rows.shape[1:]), None
    o = o_rows.new_zeros((b * sq, *o_rows.shape[1:]))
    o[q_index] = o_rows
    return o.view(b, sq, *o.shape[1:]), None
