"""verl's own reward managers vs ours inside verl, side by side in one process, on the same batch.

    .venv/bin/python bench/reward_vs_verl.py [--n 2000] [--workers 0] [--repeats 3] [--no-symbolic]

Input: one real ``DataProto`` of N GSM8K test questions (``data/gsm8k/test.jsonl``, cycled;
Qwen2.5 chat-template prompts, left-padded) with synthetic, deterministic responses (seeded by
the row index): 35% right ``#### N``, 30% wrong ``#### M``, 15% no number at all, 10% the right
number without ``####`` (strict extraction: no answer), 10% format variants of the right answer
(``#### 1,234`` thousands separators, ``#### 18.0``). Responses are right-padded and carry a
``response_mask`` of ones (single-turn: the last assistant turn is the whole response).

Managers, each warmed up on 64 samples first (pools started, imports done), then timed over the
whole batch, round-robin over the managers ``--repeats`` times (median):

verl (its ``default_compute_score`` -> ``verl.utils.reward_score.gsm8k``, strict, format_score 0):
  - ``verl naive (loop)``: the 0.9 reward loop, ``RewardLoopWorker.compute_score_batch`` (one
    ``run_single`` task per sample, decode + score in the default thread pool) -- the baseline.
  - ``verl naive (legacy)``: ``verl.workers.reward_manager.NaiveRewardManager.__call__`` (a loop).
  - ``verl prime (legacy)``: ``verl.workers.reward_manager.PrimeRewardManager.__call__`` (a fresh
    64-process ``ProcessPoolExecutor`` per call, as verl does).
ours (``gsm8k`` scorer forced, ``scorer_kwargs={"gsm8k": {"method": "strict"}}`` to match verl):
  - ``agentic_naive (loop)`` / ``prime (loop)``: our adapters through the same
    ``RewardLoopWorker.compute_score_batch``.
  - ``naive direct`` / ``prime direct``: our managers' ``score_items`` on pre-decoded
    ``RewardItem``s (no verl, no tokenizer): the scoring engine's own cost.

Scores are compared with ``verl naive (loop)``: agreement rate, and the disagreeing samples are
counted by response kind (expected: the format variants, which our number normalisation
accepts and verl's string comparison does not).

CPU-heavy variant (``--no-symbolic`` to skip): our managers with the ``gsm8k_symbolic`` scorer
(sympy check, ~1 ms/sample) next to verl's managers as above. NOT equal work: it shows how the
managers scale when the scorer dominates, reported in a separate table.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QWEN25_DIR = REPO / "tests" / "assets" / "tokenizers" / "qwen2.5-instruct"
GSM8K_TEST = REPO / "data" / "gsm8k" / "test.jsonl"
VERL_KIND_WEIGHTS = [("right", 35), ("wrong", 30), ("none", 15), ("flexible_only", 10), ("variant", 10)]

FILLERS = [
    "Let's think step by step.", "First, list what we know.", "We compute each part separately.",
    "Then we add the partial results.", "Checking the arithmetic once more.",
]


def synth_response(i: int, truth: str) -> tuple[str, str]:
    """(kind, response text) for row i, deterministic."""
    rng = random.Random(1000003 * i + 17)
    kinds, weights = zip(*VERL_KIND_WEIGHTS)
    kind = rng.choices(kinds, weights)[0]
    steps = " ".join(rng.choice(FILLERS) for _ in range(rng.randint(2, 5)))
    t = int(float(truth)) if float(truth).is_integer() else None
    if kind == "right":
        return kind, f"{steps}\nSo the answer is {truth}.\n#### {truth}"
    if kind == "wrong":
        wrong = str((t if t is not None else 0) + rng.randint(1, 9))
        return kind, f"{steps}\nSo the answer is {wrong}.\n#### {wrong}"
    if kind == "none":
        return kind, f"{steps}\nI am not sure how to finish this."
    if kind == "flexible_only":
        return kind, f"{steps}\nThe answer is {truth}."
    if t is not None and abs(t) >= 1000:
        return kind, f"{steps}\n#### {t:,}"
    return kind, f"{steps}\n#### {truth}.0"


def build_batch(tokenizer, n: int):
    import numpy as np
    import torch

    from verl import DataProto
    from verl_agentic.tasks.gsm8k import ground_truth_from_solution

    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines() if line.strip()]
    questions, truths, kinds, texts = [], [], [], []
    for i in range(n):
        row = rows[i % len(rows)]
        truth = ground_truth_from_solution(row["answer"])
        kind, text = synth_response(i, truth)
        questions.append(row["question"])
        truths.append(truth)
        kinds.append(kind)
        texts.append(text)
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                       tokenize=False), add_special_tokens=False)["input_ids"]
               for q in questions]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    responses = [ids + [im_end] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    P, R, pad = max(map(len, prompts)), max(map(len, responses)), tokenizer.pad_token_id
    p_t = torch.full((n, P), pad, dtype=torch.long)
    r_t = torch.full((n, R), pad, dtype=torch.long)
    attn = torch.zeros((n, P + R), dtype=torch.long)
    rmask = torch.zeros((n, R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_t[i, P - len(p):] = torch.tensor(p)
        r_t[i, :len(r)] = torch.tensor(r)
        attn[i, P - len(p):P + len(r)] = 1
        rmask[i, :len(r)] = 1
    data = DataProto.from_dict(
        tensors={"prompts": p_t, "responses": r_t, "attention_mask": attn, "response_mask": rmask,
                 "input_ids": torch.cat([p_t, r_t], dim=1)},
        non_tensors={"data_source": np.array(["openai/gsm8k"] * n, dtype=object),
                     "reward_model": np.array([{"ground_truth": t, "style": "rule"} for t in truths], dtype=object),
                     "extra_info": np.array([{"index": i, "split": "test"} for i in range(n)], dtype=object)})
    return data, texts, truths, kinds


def verl_config(name: str, agentic: dict | None = None):
    """verl's composed trainer config (hydra, ppo_trainer.yaml) selecting reward manager ``name``."""
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"reward.reward_manager.name={name}",
                                                f"actor_rollout_ref.model.path={QWEN25_DIR}"])
    if agentic is not None:
        with open_dict(cfg):
            cfg.reward.agentic = OmegaConf.create(agentic)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="samples (default 2000)")
    ap.add_argument("--workers", type=int, default=0, help="our prime pool size; 0 = CPU count")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per manager (median)")
    ap.add_argument("--no-symbolic", action="store_true", help="skip the CPU-heavy gsm8k_symbolic table")
    args = ap.parse_args()
    print("$ " + shlex.join([Path(sys.executable).name] + sys.argv), flush=True)
    t_start = time.perf_counter()

    import torch
    from transformers import AutoTokenizer

    import verl  # noqa: F401  (loads our plugin through the verl.plugins entry point)
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.workers.reward_manager.naive import NaiveRewardManager as LegacyNaive
    from verl.workers.reward_manager.prime import PrimeRewardManager as LegacyPrime

    from verl_agentic.reward import RewardConfig, RewardItem, make_reward_manager
    from verl_agentic.verl_plugin.reward import close_shared_managers

    torch.set_num_threads(1)
    workers = args.workers or os.cpu_count() or 1
    tokenizer = AutoTokenizer.from_pretrained(QWEN25_DIR)
    data, texts, truths, kinds = build_batch(tokenizer, args.n)
    warm = data[:64]
    print(f"batch: {args.n} samples, prompts {data.batch['prompts'].shape[1]} + responses "
          f"{data.batch['responses'].shape[1]} tokens; kinds {dict(collections.Counter(kinds))}; "
          f"{os.cpu_count()} CPUs, prime workers {workers}", flush=True)

    def loop_runner(name: str, agentic: dict | None):
        # a fresh current loop per worker: verl's legacy prime closes the loop it sets as current
        asyncio.set_event_loop(asyncio.new_event_loop())
        worker = RewardLoopWorker(verl_config(name, agentic))

        def run(batch):
            # verl's managers keep the loop they were built in (get_event_loop()) and must run in it
            outs = worker.loop.run_until_complete(worker.compute_score_batch(batch))
            return [o["reward_score"] for o in outs]
        return worker, run

    def legacy_runner(cls):
        manager = cls(tokenizer=tokenizer, num_examine=0)

        def run(batch):
            with contextlib.redirect_stdout(io.StringIO()):  # legacy prime prints per call
                tensor = manager(batch)
            return tensor.sum(dim=1).tolist()
        return run

    items = [RewardItem(solution_str=t, ground_truth=g, data_source="openai/gsm8k") for t, g in zip(texts, truths)]

    def direct_runner(manager):
        return lambda _batch: [r.score for r in manager.score_items(items if _batch is data else items[:64])]

    def ours(scorer: str) -> dict:
        return {"scorer": scorer, "scorer_kwargs": {scorer: {"method": "strict"}}, "num_workers": workers}

    def run_table(title: str, entries: list[tuple[str, object]]) -> dict:
        results, walls = {}, collections.defaultdict(list)
        for _, run in entries:
            run(warm)
        for _ in range(args.repeats):  # round-robin, so load drift on this machine hits every manager alike
            for label, run in entries:
                t0 = time.perf_counter()
                results[label] = run(data)
                walls[label].append(time.perf_counter() - t0)
        rows = [(label, statistics.median(walls[label])) for label, _ in entries]
        for label, wall in rows:
            print(f"  {label:<24} {wall:8.3f} s  {args.n / wall:10.0f} samples/s  (runs: "
                  f"{', '.join(f'{w:.3f}' for w in walls[label])})", flush=True)
        base = dict(rows)["verl naive (loop)"]
        ref = results["verl naive (loop)"]
        print(f"\n{title}\n")
        print(f"| manager | wall s | samples/s | vs verl naive (loop) | agreement with verl naive |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, wall in rows:
            agree = sum(a == b for a, b in zip(results[label], ref))
            print(f"| {label} | {wall:.3f} | {args.n / wall:,.0f} | {base / wall:.2f}x | "
                  f"{agree / args.n:.2%} ({args.n - agree} differ) |")
        return results

    _, verl_loop = loop_runner("naive", None)
    _, ours_naive_loop = loop_runner("agentic_naive", ours("gsm8k"))
    _, ours_prime_loop = loop_runner("prime", ours("gsm8k"))
    naive_direct = make_reward_manager(RewardConfig(manager="naive", **ours("gsm8k")))
    prime_direct = make_reward_manager(RewardConfig(manager="prime", **ours("gsm8k")))
    print("\nsame work (gsm8k strict, format_score 0):", flush=True)
    results = run_table(f"Same work: gsm8k strict, N={args.n}, {os.cpu_count()} CPUs", [
        ("verl naive (loop)", verl_loop),
        ("verl naive (legacy)", legacy_runner(LegacyNaive)),
        ("verl prime (legacy)", legacy_runner(LegacyPrime)),
        ("agentic_naive (loop)", ours_naive_loop),
        ("prime (loop)", ours_prime_loop),
        ("naive direct", direct_runner(naive_direct)),
        ("prime direct", direct_runner(prime_direct)),
    ])
    ref = results["verl naive (loop)"]
    for label, scores in results.items():
        diff = collections.Counter(k for k, a, b in zip(kinds, scores, ref) if a != b)
        if diff:
            example = next(i for i, (a, b) in enumerate(zip(scores, ref)) if a != b)
            print(f"- {label} differs from verl naive on {dict(diff)}; e.g. sample {example}: ours {scores[example]}, "
                  f"verl {ref[example]}, truth {truths[example]!r}, response ends {texts[example][-24:]!r}")
    naive_direct.close()
    prime_direct.close()

    if not args.no_symbolic:
        _, sym_naive_loop = loop_runner("agentic_naive", ours("gsm8k_symbolic"))
        _, sym_prime_loop = loop_runner("prime", ours("gsm8k_symbolic"))
        sym_prime_direct = make_reward_manager(RewardConfig(manager="prime", **ours("gsm8k_symbolic")))
        print("\nCPU-heavy variant (ours: gsm8k_symbolic; verl: its gsm8k -- NOT equal work):", flush=True)
        run_table(f"CPU-heavy: ours with gsm8k_symbolic (sympy, ~1 ms/sample), verl with its gsm8k, N={args.n}", [
            ("verl naive (loop)", verl_loop),
            ("verl prime (legacy)", legacy_runner(LegacyPrime)),
            ("agentic_naive (loop)", sym_naive_loop),
            ("prime (loop)", sym_prime_loop),
            ("prime direct", direct_runner(sym_prime_direct)),
        ])
        sym_prime_direct.close()
    close_shared_managers()
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")


if __name__ == "__main__":
    main()
