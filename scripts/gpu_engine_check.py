"""The hf engine on an accelerator: does it generate what the model says, and how fast?

    python scripts/gpu_engine_check.py [--device cuda] [--model embedded|PATH] [--dtypes float32,bfloat16]
                                       [--out DIR] [--quick]

This is the part of a GPU check that needs neither verl nor vLLM: our own engine (``HFBackend``), the one
``main_rollout``, ``main_ppo`` and the hf replica in verl's trainer generate with. For each dtype it loads the
model on ``--device`` and measures, with the criteria fixed here before any run:

1. **Token exactness.** 64 GSM8K prompts, greedy and at T=1 (each request its own seed), 128 new tokens at
   most, all in flight at once. Each episode's prompt + generated ids are then scored by a plain forward of
   the same model on the same device (what a trainer does: one pass, no KV cache), and the engine's
   per-token logprobs are compared with it.
   - ``gap``: |engine logprob - plain forward logprob| per generated token (mean, max).
   - ``greedy_agree``: the share of greedy tokens that are the plain forward's argmax; each disagreement
     is reported with the plain forward's top-2 logit margin there (a near-tie flips under any change of
     kernel or batch shape; a real misalignment does not stay near ties).
   - ``fp32_gap``: for a bf16 engine, the gap against an fp32 forward (what a trainer in fp32 sees; the
     quantity verl's rollout correction reweights).
   - float32 passes when the gap's max is below 1e-3 and every greedy disagreement is at a margin below
     1e-3. bfloat16 is reported, not judged (its error is the format's, not the engine's).
2. **The sampler.** 4,000 one-token draws at T=1 on one prompt against the softmax of a plain forward: a
   chi-square test over the tokens with at least 5 expected draws (passes at p > 1e-3), and a negative control
   (the same draws against the T=0.8 softmax must be rejected, p < 1e-6). Both dtypes are judged.
3. **Batch invariance of a seed.** 4 of the sampled requests re-run one at a time must give the same tokens
   as in the batch of 64 (reported for both dtypes; judged for float32 only).
4. **Throughput.** Generated tokens per second of the 64 concurrent sampled requests, and of 4 requests one
   at a time; peak accelerator memory.

Writes ``OUT/engine_check.json`` and ``OUT/engine_check.md`` (the device, versions, commit, every figure) and
exits 0 when every judged check passed, 1 when one failed, 2 when the check could not run (one line: no such
device, no model). ``--quick`` shrinks the counts for a CPU smoke run of the script itself (the suite runs it
so on a tiny model); its figures judge nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
GSM8K = REPO / "data" / "gsm8k" / "test.jsonl"
FP32_GAP_MAX = 1e-3
NEAR_TIE = 1e-3
P_PASS, P_CONTROL = 1e-3, 1e-6


def chi_square_p(counts: Counter, probs: torch.Tensor, n: int) -> float:
    """p-value of ``counts`` (n draws) under ``probs``: bins with >= 5 expected draws, the rest pooled."""
    big = [i for i in range(probs.numel()) if probs[i] * n >= 5]
    expected = [float(probs[i]) * n for i in big]
    observed = [counts.get(i, 0) for i in big]
    if n - sum(expected) >= 5:
        expected.append(n - sum(expected))
        observed.append(n - sum(observed))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = max(len(expected) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def prompts(tokenizer, n: int) -> list[list[int]]:
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:n]]
    return [tokenizer.apply_chat_template(
        [{"role": "user", "content": r["question"] + " Give the final answer after '####'."}],
        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"] for r in rows]


def plain_forward(model, ids: list[int], device) -> torch.Tensor:
    """Logits [len(ids), vocab] of one forward over the whole sequence, as a trainer scores it (float32)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids], device=device)).logits[0].float()


def token_exactness(model, fp32_model, prompt_ids, outs, greedy: bool, device) -> dict:
    gaps, fp32_gaps, agree, total, flips = [], [], 0, 0, []
    for prompt, out in zip(prompt_ids, outs):
        if not out.token_ids:
            continue
        ids = prompt + out.token_ids
        logits = plain_forward(model, ids, device)[len(prompt) - 1: len(ids) - 1]
        lp = logits.log_softmax(-1)
        target = torch.tensor(out.token_ids, device=lp.device)
        ref = lp.gather(-1, target[:, None])[:, 0].cpu()
        gaps.extend((torch.tensor(out.logprobs) - ref).abs().tolist())
        if fp32_model is not None:
            ref32 = plain_forward(fp32_model, ids, device)[len(prompt) - 1: len(ids) - 1].log_softmax(-1)
            fp32_gaps.extend((torch.tensor(out.logprobs) - ref32.gather(-1, target[:, None])[:, 0].cpu())
                             .abs().tolist())
        if greedy:
            top2 = logits.topk(2, dim=-1)
            for pos, tok in enumerate(out.token_ids):
                total += 1
                if int(top2.indices[pos, 0]) == tok:
                    agree += 1
                else:
                    flips.append({"position": pos, "margin": float(top2.values[pos, 0] - top2.values[pos, 1])})
    result = {"tokens": len(gaps), "gap_mean": sum(gaps) / max(len(gaps), 1), "gap_max": max(gaps, default=0.0)}
    if fp32_gaps:
        result.update(fp32_gap_mean=sum(fp32_gaps) / len(fp32_gaps), fp32_gap_max=max(fp32_gaps))
    if greedy:
        result.update(greedy_agree=agree / max(total, 1), greedy_flips=flips[:20], greedy_flip_count=len(flips),
                      greedy_flip_margin_max=max((f["margin"] for f in flips), default=0.0))
    return result


async def generate_all(engine, prompt_ids, sampling_for) -> tuple[list, float]:
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, sampling_for(i)) for i, p in enumerate(prompt_ids)))
    return list(outs), time.perf_counter() - t0


def check_dtype(model_dir: Path, dtype: str, device, n: int, max_new: int, draws: int, fp32_model) -> dict:
    from verl_agentic.backends.hf import HFBackend
    from verl_agentic.interfaces import SamplingParams

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    engine = HFBackend.from_pretrained(str(model_dir), dtype=dtype, device=device, seed=0,
                                       max_batch_size=max(n, 1))
    model = engine.model
    load_s = time.perf_counter() - t0
    ps = prompts(engine.tokenizer, n)
    report: dict = {"dtype": dtype, "load_s": round(load_s, 2)}

    async def run() -> None:
        try:
            await generate_all(engine, ps[:2], lambda i: SamplingParams(temperature=0.0, max_new_tokens=4))  # warm
            greedy, greedy_s = await generate_all(engine, ps, lambda i: SamplingParams(temperature=0.0,
                                                                                        max_new_tokens=max_new))
            sampled, sampled_s = await generate_all(engine, ps, lambda i: SamplingParams(
                temperature=1.0, max_new_tokens=max_new, seed=1000 + i))
            alone, alone_s = [], 0.0
            for i in range(min(4, n)):
                outs, s = await generate_all(engine, [ps[i]], lambda _, i=i: SamplingParams(
                    temperature=1.0, max_new_tokens=max_new, seed=1000 + i))
                alone += outs
                alone_s += s
            one = ps[0]
            draws_out, _ = await generate_all(engine, [one] * draws, lambda i: SamplingParams(
                temperature=1.0, max_new_tokens=1, seed=i))
        finally:
            await engine.close()
        report["greedy"] = token_exactness(model, fp32_model, ps, greedy, True, device)
        report["sampled"] = token_exactness(model, fp32_model, ps, sampled, False, device)
        report["batch_invariance"] = {"requests": len(alone), "same_tokens": sum(
            a.token_ids == b.token_ids for a, b in zip(alone, sampled))}
        tokens = sum(len(o.token_ids) for o in sampled)
        report["throughput"] = {
            "concurrent_requests": n, "concurrent_tokens": tokens,
            "concurrent_tokens_per_s": round(tokens / sampled_s, 1),
            "greedy_tokens_per_s": round(sum(len(o.token_ids) for o in greedy) / greedy_s, 1),
            "one_at_a_time_tokens_per_s": round(sum(len(o.token_ids) for o in alone) / max(alone_s, 1e-9), 1)}
        counts = Counter(o.token_ids[0] for o in draws_out)
        logits = plain_forward(model, one, device)[-1].double().cpu()
        report["sampler"] = {"draws": draws, "p": chi_square_p(counts, logits.softmax(-1), draws),
                             "control_p_t08": chi_square_p(counts, (logits / 0.8).softmax(-1), draws),
                             "distinct_tokens": len(counts)}

    asyncio.run(run())
    if device.type == "cuda":
        report["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 3)
    del model, engine
    return report


def judge(report: dict, quick: bool) -> list[str]:
    """The failed checks, each one line; empty when all passed."""
    failed = []
    for r in report["dtypes"]:
        d = r["dtype"]
        s = r["sampler"]
        if s["p"] <= P_PASS:
            failed.append(f"{d}: the sampled tokens are not the softmax's (chi-square p = {s['p']:.2g})")
        if s["control_p_t08"] >= P_CONTROL:
            failed.append(f"{d}: the sampler test cannot tell T=1 from T=0.8 (p = {s['control_p_t08']:.2g})")
        if d != "float32":
            continue
        for kind in ("greedy", "sampled"):
            if r[kind]["gap_max"] >= FP32_GAP_MAX:
                failed.append(f"float32 {kind}: logprob gap {r[kind]['gap_max']:.2g} >= {FP32_GAP_MAX}")
        if r["greedy"]["greedy_flip_margin_max"] >= NEAR_TIE:
            failed.append(f"float32 greedy: a token other than the argmax at margin "
                          f"{r['greedy']['greedy_flip_margin_max']:.2g} (not a near-tie)")
        b = r["batch_invariance"]
        if b["same_tokens"] != b["requests"]:
            failed.append(f"float32: {b['requests'] - b['same_tokens']} of {b['requests']} seeded requests gave "
                          "other tokens alone than in the batch")
    return [] if quick else failed


def versions() -> dict:
    import transformers

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                       check=True).stdout.strip()
        out["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                           capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):  # a copy of the tree without .git: the caller names it
        out["commit"] = os.environ.get("VA_COMMIT", "unknown (no git here; set VA_COMMIT)")
    return out


def markdown(report: dict, failed: list[str]) -> str:
    v = report["versions"]
    lines = [f"# hf engine check on {report['device_name']}", "",
             f"Commit {v.get('commit')}{' (dirty tree)' if v.get('dirty') else ''}; torch {v['torch']}, "
             f"transformers {v['transformers']}, Python {v['python']}; model {report['model']}; "
             f"{report['prompts']} prompts, {report['max_new_tokens']} new tokens at most.", "",
             "| dtype | greedy gap mean / max | greedy argmax agree (flips, max margin) | T=1 gap mean / max | "
             "vs fp32 forward (T=1) mean / max | sampler p (T=0.8 control) | seeded alone = batched | "
             f"tokens/s {report['prompts']} at once (greedy) | tokens/s one at a time | peak GB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["dtypes"]:
        g, s, t = r["greedy"], r["sampled"], r["throughput"]
        vs32 = (f"{s['fp32_gap_mean']:.2g} / {s['fp32_gap_max']:.2g}" if "fp32_gap_mean" in s else "(is fp32)")
        lines.append(
            f"| {r['dtype']} | {g['gap_mean']:.2g} / {g['gap_max']:.2g} | {g['greedy_agree']:.4f} "
            f"({g['greedy_flip_count']}, {g['greedy_flip_margin_max']:.2g}) | {s['gap_mean']:.2g} / {s['gap_max']:.2g} "
            f"| {vs32} | {r['sampler']['p']:.3g} ({r['sampler']['control_p_t08']:.2g}) | "
            f"{r['batch_invariance']['same_tokens']}/{r['batch_invariance']['requests']} | "
            f"{t['concurrent_tokens_per_s']} ({t['greedy_tokens_per_s']}) | {t['one_at_a_time_tokens_per_s']} | "
            f"{r.get('peak_memory_gb', '-')} |")
    lines += ["", "Result: " + ("every judged check passed." if not failed else "FAILED: " + "; ".join(failed))]
    if report["quick"]:
        lines += ["", "(--quick: a smoke run of the script; its figures judge nothing.)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="embedded", help="'embedded' (SmolLM2-135M-Instruct) or an HF folder")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--out", default="outputs/gpu_engine_check")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run of the script, judges nothing")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_engine_check: no CUDA device here (torch {torch.__version__}); use --device cpu for a "
              "smoke run", file=sys.stderr)
        return 2
    try:
        from verl_agentic.models.embedded import resolve_model_path

        model_dir = resolve_model_path(a.model)
    except FileNotFoundError as exc:
        print(f"gpu_engine_check: {exc}", file=sys.stderr)
        return 2
    n, max_new, draws = (8, 16, 400) if a.quick else (64, 128, 4000)
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    fp32_model = None
    if any(d != "float32" for d in dtypes):
        from transformers import AutoModelForCausalLM

        fp32_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).eval()
    report = {"device": str(device), "quick": a.quick, "model": a.model, "prompts": n, "max_new_tokens": max_new,
              "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                              else f"CPU ({platform.processor() or platform.machine()})"),
              "versions": versions(), "dtypes": []}
    for d in dtypes:
        print(f"gpu_engine_check: {d} on {report['device_name']} ...", flush=True)
        r = check_dtype(model_dir, d, device, n, max_new, draws, fp32_model if d != "float32" else None)
        report["dtypes"].append(r)
        print(json.dumps(r), flush=True)
    failed = judge(report, a.quick)
    report["failed"] = failed
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_check.json").write_text(json.dumps(report, indent=1))
    (out / "engine_check.md").write_text(markdown(report, failed))
    print(markdown(report, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
