"""Decode-step time of transformers' ``sdpa`` vs the copy-free grouped attention (backends/attention.py).

The embedded SmolLM2 (9 query heads, 3 KV heads), a left-padded batch (half the rows padded),
prefill then greedy decode steps with a DynamicCache, as the hf backend runs them. Both
variants run in this process, one after the other, per shape; prints the median decode-step
time, the ratio, and the largest logit difference.

    .venv/bin/python bench/grouped_attention.py
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from verl_agentic.backends.attention import use_grouped_attention
from verl_agentic.models.embedded import embedded_model_dir


def decode_steps(model, batch: int, length: int, steps: int) -> tuple[list[float], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[: batch // 2, :8] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    times, logits = [], []
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        tok, nxt = out.logits[:, -1].argmax(-1, keepdim=True), pos[:, -1:] + 1
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones(batch, 1)], 1)
            t0 = time.perf_counter()
            out = model(input_ids=tok, attention_mask=mask, position_ids=nxt, past_key_values=cache, use_cache=True,
                        logits_to_keep=1)
            times.append(time.perf_counter() - t0)
            logits.append(out.logits[:, -1])
            tok, nxt = out.logits[:, -1].argmax(-1, keepdim=True), nxt + 1
    return times, torch.stack(logits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x200,16x900,64x200,64x900", help="BATCHxCONTEXT,...")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    stock = AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    grouped = copy.deepcopy(stock)
    assert use_grouped_attention(grouped)
    print(f"{'batch x context':>16}  {'sdpa ms/step':>12}  {'grouped ms/step':>15}  {'speed-up':>8}  max|dlogit|")
    for shape in args.shapes.split(","):
        b, n = (int(x) for x in shape.split("x"))
        t_stock, l_stock = decode_steps(stock, b, n, args.steps)
        t_grouped, l_grouped = decode_steps(grouped, b, n, args.steps)
        ms_s, ms_g = 1000 * statistics.median(t_stock), 1000 * statistics.median(t_grouped)
        print(f"{shape:>16}  {ms_s:12.0f}  {ms_g:15.0f}  {ms_s / ms_g:7.2f}x  {(l_stock - l_grouped).abs().max():.1e}",
              flush=True)


if __name__ == "__main__":
    main()
