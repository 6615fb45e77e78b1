"""Where a decode step of the hf engine goes, and what this machine allows: the limit behind `make demo`.

    .venv/bin/python bench/decode_step.py [--batch 8] [--context 500] [--steps 20]

One decode step (one new token for each of ``--batch`` rows whose KV cache holds ``--context`` tokens),
the embedded SmolLM2 in float32, timed side by side in this process:

- ``engine``: what ``HFBackend`` runs: transformers' forward over the slot KV cache, packed linears,
  grouped attention, ``logits_to_keep=1``;
- ``unpacked``: the same without packed linears (``F.linear``, MKL's sgemm; ``rollout.hf.packed_linear=false``);
- ``fused``: the same arithmetic written out for Llama-family layers with q/k/v and gate/up fused into
  one packed matmul each and ``F.rms_norm``: what removing transformers' per-layer Python and three of
  the seven matmul calls per layer would gain (same logits up to float rounding; printed).

Then a ``torch.profiler`` breakdown of the engine's step (matmuls, attention, the rest) and the bounds
from this machine's rates, measured first: weights + KV cache read at the memory bandwidth, and the
matmul FLOPs at the fp32 matmul rate. The KV cache holds random values (attention cost does not depend
on them).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from multiturn_throughput import machine_rates  # noqa: E402

from verl_agentic.backends.attention import grouped_sdpa_attention  # noqa: E402
from verl_agentic.backends.hf import HFBackend  # noqa: E402
from verl_agentic.backends.kv_slots import SlotKVCache  # noqa: E402
from verl_agentic.models.embedded import embedded_model_dir  # noqa: E402


def _pack(weight: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class FusedDecoder:
    """A Llama-family forward over the slot cache, q/k/v and gate/up fused (the comparison only)."""

    def __init__(self, model: torch.nn.Module, batch: int) -> None:
        cfg = model.config
        self.model = model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // self.heads
        self.inter = cfg.intermediate_size
        self.layers = []
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv_bias = None if a.q_proj.bias is None else torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
            self.layers.append((
                layer.input_layernorm, _pack(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), batch),
                qkv_bias, _pack(a.o_proj.weight, batch), layer.post_attention_layernorm,
                _pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), batch), _pack(mlp.down_proj.weight, batch)))
        self.head = _pack(model.lm_head.weight, batch)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: SlotKVCache) -> torch.Tensor:
        rows, q_len = ids.shape
        h = self.model.model.embed_tokens(ids)
        cos, sin = (t.unsqueeze(1) for t in self.model.model.rotary_emb(h, positions))
        heads, kv_heads, d = self.heads, self.kv_heads, self.head_dim
        for i, (ln1, qkv, qkv_bias, o, ln2, gate_up, down) in enumerate(self.layers):
            x = F.rms_norm(h, (h.shape[-1],), ln1.weight, ln1.variance_epsilon)
            q, k, v = _linear(x, qkv, qkv_bias).split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
            q = q.view(rows, q_len, heads, d).transpose(1, 2)
            k = k.view(rows, q_len, kv_heads, d).transpose(1, 2)
            v = v.view(rows, q_len, kv_heads, d).transpose(1, 2)
            q1, q2 = q.chunk(2, -1)
            k1, k2 = k.chunk(2, -1)
            q = q * cos + torch.cat((-q2, q1), -1) * sin
            k = k * cos + torch.cat((-k2, k1), -1) * sin
            keys, values = cache.update(k, v, i)
            out, _ = grouped_sdpa_attention(self.model.model.layers[i].self_attn, q, keys, values, mask, scaling=d**-0.5)
            h = h + _linear(out.reshape(rows, q_len, heads * d), o)
            x = F.rms_norm(h, (h.shape[-1],), ln2.weight, ln2.variance_epsilon)
            g, u = _linear(x, gate_up).split([self.inter, self.inter], -1)
            h = h + _linear(F.silu(g) * u, down)
        norm = self.model.model.norm
        h = F.rms_norm(h[:, -1:], (h.shape[-1],), norm.weight, norm.variance_epsilon)
        return _linear(h, self.head)[:, -1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=500)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    b, ctx = args.batch, args.context
    backend = HFBackend.from_pretrained(embedded_model_dir(quiet=True), max_batch_size=b)
    model = backend.model
    cache = backend._cache
    cache.reserve(b, ctx + 64)
    for t in (*cache.keys, *cache.values):
        t.normal_()
    packed = backend._packed
    fused = FusedDecoder(model, b)
    gen = torch.Generator().manual_seed(0)

    def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 1000, (b, 1), generator=gen)
        pos = torch.full((b, 1), ctx)
        mask = torch.arange(ctx + 1).view(1, 1, 1, ctx + 1) <= pos.unsqueeze(1).unsqueeze(-1)
        cache.plan(slice(0, b), pos, ctx + 1)
        return ids, pos, mask

    def engine() -> torch.Tensor:
        ids, pos, mask = inputs()
        with packed.active():
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                         use_cache=True, logits_to_keep=1).logits[:, -1]

    def unpacked() -> torch.Tensor:
        ids, pos, mask = inputs()
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                     use_cache=True, logits_to_keep=1).logits[:, -1]

    def fused_step() -> torch.Tensor:
        return fused(*inputs(), cache)

    times: dict[str, list[float]] = collections.defaultdict(list)
    with torch.inference_mode():
        gen.manual_seed(1)
        a = engine()
        gen.manual_seed(1)
        diff = (a - fused_step()).abs().max().item()
        for _ in range(2):  # alternate, to share whatever the machine is doing
            for name, fn in (("engine", engine), ("unpacked", unpacked), ("fused", fused_step)):
                for _ in range(3):
                    fn()
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    fn()
                times[name].append((time.perf_counter() - t0) / args.steps)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                engine()
    ms = {k: 1e3 * min(v) for k, v in times.items()}
    groups: collections.Counter[str] = collections.Counter()
    for e in prof.key_averages():
        name = e.key
        group = ("matmuls" if "linear" in name or name in ("aten::mm", "aten::addmm") else
                 "attention" if "scaled_dot_product" in name or "flash_attention" in name else "the rest")
        groups[group] += e.self_cpu_time_total / 10 / 1e3  # ms per step
    total = sum(groups.values())

    bw, flops = machine_rates()
    n_params = sum(t.numel() for t in model.parameters())
    weight_bytes = n_params * 4
    kv_bytes = b * ctx * cache.bytes_per_token
    linear_flops = 2 * b * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    print(f"SmolLM2-135M fp32, batch {b}, context {ctx}, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"machine: memory read {bw / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s")
    print(f"decode step: engine {ms['engine']:.1f} ms, without packed linears {ms['unpacked']:.1f} ms, fused {ms['fused']:.1f} ms "
          f"(engine/fused {ms['engine'] / ms['fused']:.2f}; max |logit difference| {diff:.1e})")
    print(f"engine step under the profiler, ops' self time per step ({total:.1f} ms; the rest of the step is "
          f"Python between ops): " + ", ".join(f"{g} {v:.1f} ms ({100 * v / total:.0f}%)" for g, v in groups.most_common()))
    mem_ms = 1e3 * (weight_bytes + kv_bytes) / bw
    print(f"bounds: weights {weight_bytes / 2**20:.0f} MiB + KV {kv_bytes / 2**20:.0f} MiB read at {bw / 1e9:.1f} GB/s = "
          f"{mem_ms:.1f} ms; matmuls {linear_flops / 1e9:.2f} GFLOP at {flops / 1e9:.0f} GFLOP/s = "
          f"{1e3 * linear_flops / flops:.1f} ms; engine step / memory bound {ms['engine'] / mem_ms:.1f}x")


if __name__ == "__main__":
    main()
