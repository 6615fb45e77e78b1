"""Grouped-query attention through SDPA without copying the KV cache.

transformers' ``sdpa`` attention repeats every key/value head ``num_key_value_groups`` times
whenever an attention mask is passed (``repeat_kv``), because the masked SDPA kernel cannot
group heads. A rollout batch always has a padding mask, so each decode step copies the whole
KV cache 3x for SmolLM2 (9 query heads, 3 KV heads): at batch 64 with 900-token contexts that
is ~8 GB of memory traffic per step, and most of the step's time.

Here the query heads that share a KV head are folded into the query-length axis instead:
``query [B, H, q, D] -> [B, H_kv, n_rep * q, D]``, mask ``[B, 1, q, L] -> [B, 1, n_rep * q, L]``.
SDPA then sees one KV head per group and no copy of the cache is made. The result is the same
attention (checked against ``sdpa`` in tests/test_attention.py), differentiable, for any dtype.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

NAME = "verl_agentic_grouped_sdpa"


def grouped_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                           scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-interface function: returns ``(output [B, q, H, D], None)``."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    n_rep = heads // kv_heads
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    dropout = dropout if module.training else 0.0
    if attention_mask is None and q_len > 1 and causal:
        # no padding: the fused causal kernel, which groups heads itself
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=dropout, scale=scaling,
                                             is_causal=True, enable_gqa=n_rep > 1)
        return out.transpose(1, 2).contiguous(), None
    grouped_query = query.reshape(batch, kv_heads, n_rep * q_len, head_dim)
    mask = attention_mask
    if mask is not None:
        mask = mask[:, :, :, : key.shape[-2]]
        mask = (mask.unsqueeze(2).expand(mask.shape[0], mask.shape[1], n_rep, q_len, mask.shape[-1])
                .reshape(mask.shape[0], mask.shape[1], n_rep * q_len, mask.shape[-1]))
    out = F.scaled_dot_product_attention(grouped_query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, q_len, head_dim).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register the attention function and its (sdpa-style) mask builder with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, grouped_sdpa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # without it, custom attention gets no mask at all
    return NAME


def use_grouped_attention(model: torch.nn.Module) -> bool:
    """Switch a model that uses ``sdpa`` with grouped KV heads to the copy-free version.

    Returns whether the model was switched (models on other attention implementations, or
    without grouped heads, are left alone).
    """
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or heads == kv_heads:
        return False
    model.set_attn_implementation(register())
    return True
