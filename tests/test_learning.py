"""The learning regression test (issue 38): would a broken learner be caught by ``make test``?

Two checks, each cheap enough for every run of the suite:

1. The hf engine samples from the model's softmax at T=1: 4,000 one-token requests with their own
   seeds, through the engine's real batching and sampler, against the softmax of a plain forward of the
   same prompt; a chi-square test over the tokens with at least 5 expected draws. A negative control
   shows the test has the power to see a distribution sharpened by T=0.8.
2. GRPO learns: ``PPOTrainer`` on a tiny random model, a task it can learn in a few steps (the answer's
   first letter is a vowel, ``va_scorers.va_starts_with_vowel``: decided by the first generated token,
   about a fifth of the vocabulary at step 0). On seeds 0 and 1, the mean reward of the last 3 of 10
   steps must be at least 0.9 and exceed the first 3 steps' by at least 0.4 (measured at 76c9fe4: 1.0,
   reached by step 4, from 0.27-0.34). The first criterion was the gain alone; the 0.9 floor was added
   after the logprobs-one-position-off mutation drifted to +0.27 and +0.13 (one step at 0.81): a gain
   that size can come from weights moving at random, a policy at 0.9 cannot.

DEVLOG (2026-11-26, thirteenth session) shows check 2 failing under three mutations of the trainer:
a flipped advantage sign, the loss mask shifted by one token, and logprobs read one position off.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest
import torch

import va_scorers  # noqa: F401 - registers va_starts_with_vowel
from verl_agentic.interfaces import SamplingParams
from verl_agentic.main_rollout import load_config

DRAWS = 4000


def _chi_square_p(counts: Counter, probs: torch.Tensor, n: int) -> float:
    """p-value of the counts under ``probs``: bins with >= 5 expected draws, the rest pooled."""
    big = [i for i in range(probs.numel()) if probs[i] * n >= 5]
    expected = [float(probs[i]) * n for i in big]
    observed = [counts.get(i, 0) for i in big]
    rest = n - sum(expected)
    if rest >= 5:
        expected.append(rest)
        observed.append(n - sum(observed))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(expected) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_the_engines_sampler_draws_from_the_models_softmax_at_t1(smol_dir):
    from verl_agentic.backends.hf import HFBackend

    backend = HFBackend.from_pretrained(str(smol_dir), seed=0, max_batch_size=64)
    prompt = backend.tokenizer.apply_chat_template([{"role": "user", "content": "Name a fruit."}],
                                                   add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]

    async def draw():
        try:
            return await asyncio.gather(*(backend.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=1,
                                                                                  seed=i)) for i in range(DRAWS)))
        finally:
            await backend.close()

    outs = asyncio.run(draw())
    counts = Counter(o.token_ids[0] for o in outs)
    with torch.inference_mode():
        logits = backend.model(input_ids=torch.tensor([prompt])).logits[0, -1].double()
    probs = logits.softmax(-1)
    p = _chi_square_p(counts, probs, DRAWS)
    assert p > 1e-3, f"the sampled tokens are not the softmax's (chi-square p = {p:.2g})"
    # each draw's logprob is the model's log-softmax at the drawn token
    worst = max(abs(o.logprobs[0] - float(probs[o.token_ids[0]].log())) for o in outs)
    assert worst < 1e-4, worst
    # negative control: the same draws are told apart from a mildly sharper distribution
    assert _chi_square_p(counts, (logits / 0.8).softmax(-1), DRAWS) < 1e-6
    assert math.isclose(sum(counts.values()), DRAWS)


def _learn(model_dir: str, out, seed: int) -> list[float]:
    from verl_agentic.trainer import PPOTrainer

    cfg = load_config([
        f"model.path={model_dir}", "data.path=data/gsm8k/train.jsonl", "data.max_samples=64", f"seed={seed}",
        "trainer.total_steps=10", "trainer.batch_size=4", "rollout.n=8", "rollout.max_turns=1",
        "rollout.max_new_tokens=1", "rollout.temperature=1.0", "actor.ppo_mini_batch_size=32",
        "actor.ppo_micro_batch_size=32", "actor.optim.lr=2e-2", "reward.scorer=va_starts_with_vowel",
        "reward.scorer_modules=[va_scorers]", "trainer.val_before_train=false", "trainer.save_hf_model=false",
        "trainer.monitors.enabled=false", f"output.dir={out}", "output.quiet=true"], config_name="ppo")
    trainer = PPOTrainer(cfg)
    try:
        return [m["reward/mean"] for m in trainer.fit()]
    finally:
        trainer.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_learns_a_task_a_tiny_model_can_learn_in_a_few_steps(tiny_smol_dir, tmp_path, seed):
    rewards = _learn(tiny_smol_dir, tmp_path, seed)
    assert len(rewards) == 10
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last >= 0.9 and last - first >= 0.4, f"seed {seed}: reward {first:.2f} -> {last:.2f} (per step: {rewards})"
