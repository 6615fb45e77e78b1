"""Where a decode step of the hf engine goes, and what this machine allows: the limit behind `make demo`.

    .venv/bin/python bench/decode_step.py [--batch 8] [--context 500] [--steps 20]

One decode step (one new token for each of ``--batch`` rows whose KV cache holds ``--context`` tokens),
the embedded SmolLM2, timed side by side in this process through the engine's own forward functions:

- ``transformers``: transformers' forward over the slot KV cache with packed fp32 linears, grouped
  attention, ``logits_to_keep=1`` (the engine before the fused forward; ``rollout.hf.fused_forward=false``);
- ``unpacked``: the same without packed linears (``F.linear``, MKL's sgemm; ``rollout.hf.packed_linear=false``);
- ``fused``: the engine's default, ``backends/fused_forward.py`` (one loop over the layers, q/k/v and
  gate/up as one packed matmul each): the same logits as ``transformers`` to the bit (printed);
- ``fused bf16`` / ``fused int8``: the same with bf16 / int8 weight copies (``rollout.hf.weight_dtype``;
  only where this CPU has the instructions their kernels need).

Then a ``torch.profiler`` breakdown of the fused step (matmuls, attention, the rest) and the bounds from
this machine's rates, measured first: weights + KV cache read at the memory bandwidth, and the matmul
FLOPs at the matmul rate, per precision. The KV cache holds random values (attention cost does not
depend on them).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from multiturn_throughput import machine_rates  # noqa: E402

from verl_agentic.backends.hf import HFBackend  # noqa: E402
from verl_agentic.backends.packed_linear import FAST_PATH_FLAGS, cpu_flags  # noqa: E402
from verl_agentic.models.embedded import embedded_model_dir  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=500)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    b, ctx = args.batch, args.context
    base = HFBackend.from_pretrained(embedded_model_dir(quiet=True), max_batch_size=b, fused_forward=False)
    model, tokenizer = base.model, base.tokenizer
    cache = base._cache
    cache.reserve(b, ctx + 64)
    for t in (*cache.keys, *cache.values):
        t.normal_()
    flags = cpu_flags()
    engines = {"transformers": base._transformers_forward,
               "unpacked": HFBackend(model, tokenizer, max_batch_size=b, packed_linear=False)._transformers_forward}
    sizes = {"transformers": 4, "unpacked": 4}
    for name, dtype, size in (("fused", "float32", 4), ("fused bf16", "bfloat16", 2), ("fused int8", "int8", 1)):
        if dtype != "float32" and not any(flags.get(f) for f in FAST_PATH_FLAGS[getattr(torch, dtype)]):
            print(f"{name}: skipped, this CPU lacks {FAST_PATH_FLAGS[getattr(torch, dtype)]}", file=sys.stderr)
            continue
        fused = HFBackend(model, tokenizer, max_batch_size=b, weight_dtype=dtype)._fused
        assert fused is not None, "the fused forward is not exact on this CPU (see the warning)"
        engines[name], sizes[name] = fused, size
    gen = torch.Generator().manual_seed(0)

    def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 1000, (b, 1), generator=gen)
        pos = torch.full((b, 1), ctx)
        mask = torch.arange(ctx + 1).view(1, 1, 1, ctx + 1) <= pos.unsqueeze(1).unsqueeze(-1)
        cache.plan(slice(0, b), pos, ctx + 1)
        return ids, pos, mask

    def step(name: str) -> torch.Tensor:
        ids, pos, mask = inputs()
        return engines[name](ids, pos, mask, cache)

    times: dict[str, list[float]] = collections.defaultdict(list)
    with torch.inference_mode():
        gen.manual_seed(1)
        a = step("transformers")
        gen.manual_seed(1)
        diff = (a - step("fused")).abs().max().item()
        for _ in range(2):  # alternate, to share whatever the machine is doing
            for name in engines:
                for _ in range(3):
                    step(name)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step(name)
                times[name].append((time.perf_counter() - t0) / args.steps)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                step("fused")
    ms = {k: 1e3 * min(v) for k, v in times.items()}
    groups: collections.Counter[str] = collections.Counter()
    for e in prof.key_averages():
        name = e.key
        group = ("matmuls" if "linear" in name or name in ("aten::mm", "aten::addmm") else
                 "attention" if "scaled_dot_product" in name or "flash_attention" in name else "the rest")
        groups[group] += e.self_cpu_time_total / 10 / 1e3  # ms per step
    total = sum(groups.values())

    bw, flops = machine_rates()
    bf16_flops = machine_rates(torch.bfloat16)[1]
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    other_bytes = sum(t.numel() for t in model.parameters()) * 4 - linear_params * 4  # norms (embeddings: tied)
    kv_bytes = b * ctx * cache.bytes_per_token
    linear_flops = 2 * b * linear_params
    print(f"SmolLM2-135M, batch {b}, context {ctx}, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.2f}, CPU {flags.get('cpu_name')}")
    print(f"machine: memory read {bw / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.0f} GFLOP/s, bf16 matmul "
          f"{bf16_flops / 1e9:.0f} GFLOP/s")
    print("decode step: " + ", ".join(f"{k} {v:.1f} ms" for k, v in ms.items())
          + f" (transformers/fused {ms['transformers'] / ms['fused']:.2f}; max |logit difference| {diff:.1e})")
    print(f"fused step under the profiler, ops' self time per step ({total:.1f} ms; the rest of the step is "
          f"Python between ops): " + ", ".join(f"{g} {v:.1f} ms ({100 * v / total:.0f}%)" for g, v in groups.most_common()))
    for name, size in sizes.items():
        weight_bytes = linear_params * size + other_bytes
        mem_ms = 1e3 * (weight_bytes + kv_bytes) / bw
        comp_ms = 1e3 * linear_flops / (flops if size == 4 else bf16_flops)
        bound = max(mem_ms, comp_ms)
        print(f"bound {name}: weights {weight_bytes / 2**20:.0f} MiB + KV {kv_bytes / 2**20:.0f} MiB at "
              f"{bw / 1e9:.1f} GB/s = {mem_ms:.1f} ms; matmuls {linear_flops / 1e9:.2f} GFLOP = {comp_ms:.1f} ms; "
              f"step / bound {ms[name] / bound:.2f}x")


if __name__ == "__main__":
    main()
