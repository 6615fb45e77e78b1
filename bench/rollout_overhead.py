"""Overhead of AsyncRollout over a plain batched ``model.generate`` loop.

The same GSM8K prompts, one greedy turn each (feedback ``none``), through:
  baseline: left-padded batches of ``--batch`` prompts through ``model.generate`` (no logprobs),
  ours:     AsyncRollout with the hf backend (concurrency = batch), logprobs, trajectories.
Both run in this process on the same weights (the baseline on the model as transformers loads
it, ours with the backend's copy-free grouped attention unless --no-grouped-attention),
alternating, ``--repeats`` times; the ratio of the medians is printed (target <= 1.10), with
the share of tokens that agree.

    .venv/bin/python bench/rollout_overhead.py                # embedded SmolLM2-135M
    .venv/bin/python bench/rollout_overhead.py --model tiny   # tiny random Qwen2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from verl_agentic.tasks.data import load_rows
from verl_agentic.backends.hf import HFBackend
from verl_agentic.interfaces import SamplingParams
from verl_agentic.rollout import AsyncRollout, ChatTemplate, RolloutConfig

REPO = Path(__file__).resolve().parent.parent


def baseline_generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch: int) -> list[list[int]]:
    """The plain loop: left-pad each batch, ``model.generate`` greedy, strip padding after EOS."""
    pad = tokenizer.pad_token_id
    eos = model.generation_config.eos_token_id
    outs = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.inference_mode():
            gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=pad)
        for row in gen[:, width:].tolist():
            out = []
            for t in row:
                out.append(t)
                if t == eos:
                    break
            outs.append(out)
    return outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="embedded | tiny | a local HF folder")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-grouped-attention", dest="grouped_attention", action="store_false",
                    help="run our backend on stock sdpa too (isolates the loop's own overhead)")
    args = ap.parse_args()

    if args.model == "tiny":
        from verl_agentic.models.tiny import make_tiny_model

        path = make_tiny_model(str(REPO / "tests" / "assets" / "tokenizers" / "qwen2.5-instruct"))
    else:
        from verl_agentic.models.embedded import resolve_model_path

        path = str(resolve_model_path(args.model))
    backend = HFBackend.from_pretrained(path, max_batch_size=args.batch, grouped_attention=args.grouped_attention)
    tok = backend.tokenizer
    # the baseline is what a user would write: the model as transformers loads it (stock sdpa)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = load_rows(REPO / "data" / "gsm8k" / "test.jsonl", "gsm8k", args.prompts)
    template = ChatTemplate(tok)
    prompts = [template.prompt_ids(r["prompt"]) for r in rows]
    cfg = RolloutConfig(max_turns=1, max_new_tokens=args.max_new_tokens, max_total_tokens=4096,
                        temperature=0.0, concurrency=args.batch)
    rollout = AsyncRollout(backend, cfg, task_configs={"gsm8k": {"feedback": "none"}})

    # warm up both paths once
    baseline_generate(model, tok, prompts[:2], 4, 2)
    asyncio.run(backend.generate(prompts[0], SamplingParams(max_new_tokens=4, temperature=0.0)))

    times_base, times_ours = [], []
    base_out = ours_out = None
    for r in range(args.repeats):
        t0 = time.perf_counter()
        base_out = baseline_generate(model, tok, prompts, args.max_new_tokens, args.batch)
        times_base.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        trajs = rollout.run_sync(rows)
        times_ours.append(time.perf_counter() - t0)
        ours_out = [t["response_ids"] for t in trajs]
        print(f"repeat {r}: generate {times_base[-1]:.2f} s, AsyncRollout {times_ours[-1]:.2f} s", flush=True)

    same = sum(a == b for a, b in zip(base_out, ours_out))
    tokens_base = sum(len(o) for o in base_out)
    tokens_ours = sum(len(o) for o in ours_out)
    agree = sum(x == y for a, b in zip(base_out, ours_out) for x, y in zip(a, b))
    mb, mo = statistics.median(times_base), statistics.median(times_ours)
    print(f"\nmodel={args.model} prompts={args.prompts} batch={args.batch} max_new_tokens={args.max_new_tokens} "
          f"threads={torch.get_num_threads()} grouped_attention={backend.grouped_attention}")
    print(f"identical responses: {same}/{len(base_out)}; agreeing tokens: {agree}/{max(tokens_base, tokens_ours)}")
    print(f"model.generate : median {mb:.2f} s, {tokens_base / mb:.1f} tok/s")
    print(f"AsyncRollout   : median {mo:.2f} s, {tokens_ours / mo:.1f} tok/s")
    print(f"wall-time ratio AsyncRollout / generate = {mo / mb:.3f} (target <= 1.10)")
    asyncio.run(backend.close())


if __name__ == "__main__":
    main()
