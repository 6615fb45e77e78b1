"""The hf engine's forward pass for Llama-family models, without transformers' layers: same numbers, less work.

transformers' forward spends a decode step's time outside the arithmetic too: seven linear calls per
layer, each module's Python, the attention interface's dispatch. For the models whose layers are plain
Llama (``llama``, ``qwen2``, ``mistral``: RMSNorm, rotary, grouped attention, SiLU-gated MLP) this module
runs the same operations in one loop over the layers, with q/k/v and gate/up as one matmul each (their
weights concatenated into one copy, packed as :mod:`verl_agentic.backends.packed_linear` packs them,
in the engine's ``weight_dtype``):

    h = embed(ids); cos, sin = rotary(positions)
    per layer:  x = rms_norm(h);  q, k, v = x @ [Wq; Wk; Wv];  rotate q, k;  the cache stores k, v
                h += attention(q, cached keys, cached values, mask) @ Wo
                x = rms_norm(h);  g, u = x @ [Wg; Wu];  h += (silu(g) * u) @ Wd
    logits of each row's last position = rms_norm(h[:, -1]) @ W_head

**Exact or off**: a concatenated matmul computes each output column as the separate one does, but
whether a GEMM library keeps the summation order for another shape is not promised. So
:meth:`FusedForward.matches` runs a prefill and a decode pass both ways on the real model and the engine
uses this forward only when the logits agree to the bit there; otherwise it keeps transformers' (a warning
says so). That check covers its shapes only: on others the two may differ by rounding (tests compare
whole engine runs: the same tokens, logprobs within 1e-4). The norms are the model's own modules (their arithmetic, not ``F.rms_norm``'s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from verl_agentic.backends.attention import grouped_sdpa_attention
from verl_agentic.backends.kv_slots import SlotKVCache
from verl_agentic.backends.packed_linear import linear_copy

logger = logging.getLogger(__name__)

# config.model_type values whose decoder layers are plain Llama layers
MODEL_TYPES = ("llama", "qwen2", "mistral")

Linear = Callable[[torch.Tensor], torch.Tensor]


def fused_forward_supported(model: torch.nn.Module) -> bool:
    """Whether :class:`FusedForward` can run ``model`` (architecture and options it implements)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in MODEL_TYPES:
        return False
    if getattr(config, "use_sliding_window", False) or (config.model_type == "mistral"
                                                         and getattr(config, "sliding_window", None)):
        return False  # a sliding window masks differently
    if getattr(config, "hidden_act", "silu") != "silu":
        return False
    inner = getattr(model, "model", None)
    return (inner is not None and hasattr(inner, "layers") and hasattr(inner, "rotary_emb")
            and hasattr(model, "lm_head") and all(hasattr(layer, "self_attn") and hasattr(layer, "mlp")
                                                  for layer in inner.layers))


def _cat_bias(*modules: torch.nn.Linear) -> torch.Tensor | None:
    biases = [m.bias for m in modules]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else torch.zeros(m.out_features) for b, m in zip(biases, modules)])


class FusedForward:
    """A Llama-family forward over the engine's slot KV cache (see the module docstring).

    Args:
        model: the model (its weights are read, never changed; copies are made by :meth:`pack`).
        weight_dtype: the dtype of the weight copies (``torch.float32``, ``torch.bfloat16``, ``torch.int8``).
        batch_hint: the batch size oneDNN packs for.
        onednn: pack through oneDNN (else plain ``F.linear`` copies).
    """

    def __init__(self, model: torch.nn.Module, weight_dtype: torch.dtype = torch.float32, batch_hint: int = 8,
                 onednn: bool = True) -> None:
        if not fused_forward_supported(model):
            raise ValueError(f"no fused forward for model type {getattr(model.config, 'model_type', None)!r}")
        self.model = model
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.weight_dtype, self.batch_hint, self.onednn = weight_dtype, batch_hint, onednn
        self._layers: list[tuple] = []
        self._head: Linear | None = None

    def pack(self) -> None:
        """(Re)build the weight copies from the model's current weights."""
        def copy(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            return linear_copy(weight, bias, self.weight_dtype, self.batch_hint, self.onednn)

        layers = []
        with torch.inference_mode():
            for layer in self.model.model.layers:
                a, mlp = layer.self_attn, layer.mlp
                qkv = copy(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
                           _cat_bias(a.q_proj, a.k_proj, a.v_proj))
                gate_up = copy(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(),
                               _cat_bias(mlp.gate_proj, mlp.up_proj))
                o = copy(a.o_proj.weight.detach(), a.o_proj.bias)
                down = copy(mlp.down_proj.weight.detach(), mlp.down_proj.bias)
                layers.append((layer.input_layernorm, qkv, a, o, layer.post_attention_layernorm, gate_up, down,
                               mlp.act_fn, mlp.gate_proj.out_features))
            self._head = copy(self.model.lm_head.weight.detach(), self.model.lm_head.bias)
        self._layers = layers

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                 cache: SlotKVCache) -> torch.Tensor:
        """Logits of each row's last position, ``[rows, vocab]`` (float32), after ``cache.plan(...)``."""
        if not self._layers:
            self.pack()
        rows, q_len = input_ids.shape
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        inner = self.model.model
        h = inner.embed_tokens(input_ids)
        cos, sin = inner.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        half = d // 2
        for i, (ln1, qkv, attn, o, ln2, gate_up, down, act, inter) in enumerate(self._layers):
            q, k, v = qkv(ln1(h)).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            q = q.view(rows, q_len, heads, d).transpose(1, 2)
            k = k.view(rows, q_len, kv_heads, d).transpose(1, 2)
            v = v.view(rows, q_len, kv_heads, d).transpose(1, 2)
            # transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            keys, values = cache.update(k, v, i)
            out, _ = grouped_sdpa_attention(attn, q, keys, values, mask, scaling=attn.scaling)
            h = h + o(out.reshape(rows, q_len, heads * d))
            g, u = gate_up(ln2(h)).split([inter, inter], dim=-1)
            h = h + down(act(g) * u)
        return self._head(inner.norm(h[:, -1:]))[:, -1].float()

    def matches(self, transformers_forward: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, SlotKVCache],
                                                     torch.Tensor], cache: SlotKVCache) -> bool:
        """Whether this forward's logits equal ``transformers_forward``'s to the bit on a prefill of two
        rows and the decode step after it (run on a scratch cache like ``cache``)."""
        scratch = SlotKVCache(cache.num_layers, cache.kv_heads, cache.head_dim, cache.dtype, cache.device)
        vocab = self.model.get_input_embeddings().num_embeddings
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, vocab, (2, 7), generator=gen)
        results = []
        with torch.inference_mode():
            for forward in (transformers_forward, self):
                scratch.reserve(2, 16)
                scratch.tokens = [[], []]
                logits = []
                for ids, start in ((prompt, 0), (prompt[:, -1:] * 0 + 3, 7)):
                    q = ids.shape[1]
                    pos = torch.arange(start, start + q).expand(2, q)
                    mask = torch.arange(start + q).view(1, 1, 1, -1) <= pos.unsqueeze(1).unsqueeze(-1)
                    scratch.plan([0, 1], pos, start + q)
                    try:
                        logits.append(forward(ids, pos, mask, scratch))
                    except Exception as exc:  # a variant of the architecture this forward does not handle
                        if forward is not self:
                            raise
                        logger.warning("the fused forward fails on this model (%s): using transformers'", exc)
                        return False
                results.append(torch.cat(logits))
        same = torch.equal(results[0], results[1])
        if not same:
            logger.warning("the fused forward differs from transformers' here (max %.1e): using transformers'",
                           (results[0] - results[1]).abs().max().item())
        return same
