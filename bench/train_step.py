"""One policy update through our trainer vs a plain hand-written HF training step, same batch.

    .venv/bin/python bench/train_step.py [--episodes 8] [--response 256] [--micro 4] [--repeats 3]

Both sides get the same model (the embedded SmolLM2-135M, fp32), the same padded batch of
GSM8K prompts with multi-turn responses (generated spans mask 1, an injected feedback span
mask 0), the same micro-batching (gradient accumulation) and AdamW with gradient clipping:

* ``ours``: ``PPOTrainer.actor.update`` — verl's clipped-PPO loss (``get_policy_loss_fn("vanilla")``),
  ``agg_loss`` token-mean, entropy, metrics, all as in training.
* ``plain``: forward, log-softmax + gather, ``-(A * logp * mask).sum() / mask.sum()``, backward,
  clip, step: the least a policy-gradient step can do.

Runs alternate (plain, ours, plain, ours, ...) so that machine noise hits both; prints the
median wall time of each, the ratio ours/plain (target <= 1.15) and tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_trajectories(tokenizer, episodes: int, response: int, seed: int = 0) -> list[dict]:
    """GSM8K prompts (chat template) + responses: generated / injected / generated spans."""
    g = torch.Generator().manual_seed(seed)
    rows = [json.loads(x) for x in (ROOT / "data/gsm8k/test.jsonl").read_text().splitlines()[:episodes]]
    vocab = len(tokenizer)
    trajs = []
    for i, row in enumerate(rows):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["question"]}],
                                               add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        gen1, inj = response // 2, min(32, response // 4)
        gen2 = response - gen1 - inj
        ids = torch.randint(0, vocab, (response,), generator=g).tolist()
        mask = [1] * gen1 + [0] * inj + [1] * gen2
        trajs.append({"uid": str(i), "index": i, "prompt_ids": prompt, "response_ids": ids, "response_mask": mask,
                      "response_logprobs": [0.0 if m else None for m in mask]})
    return trajs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)

    from verl_agentic.main_rollout import load_config
    from verl_agentic.models.embedded import embedded_model_dir
    from verl_agentic.trainer import PPOTrainer
    from verl_agentic.trainer.batch import build_batch
    from verl_agentic.trainer.actor import forward_batch

    cfg = load_config([
        "data.path=data/gsm8k/test.jsonl", "data.max_samples=8", "output.quiet=true", "output.dir=/tmp/va-bench-train",
        f"actor.ppo_mini_batch_size={args.episodes}", f"actor.ppo_micro_batch_size={args.micro}",
        "actor.optim.lr=1e-6", "trainer.logger=[jsonl]", "reward.manager=none",
    ], config_name="ppo")
    trainer = PPOTrainer(cfg)
    model, tok = trainer.model, trainer.tokenizer
    trajs = make_trajectories(tok, args.episodes, args.response)
    scores = [float(i % 2) for i in range(len(trajs))]
    batch = build_batch(trajs, scores, trainer.pad_id, uids=[str(i // 2) for i in range(len(trajs))])
    with torch.no_grad():  # old logprobs = the current policy's, as after a rollout
        batch.rollout_log_probs = forward_batch(model, batch, 1.0).log_probs
    batch.extra["old_log_probs"] = batch.rollout_log_probs
    adv = (batch.scores - batch.scores.mean()).unsqueeze(-1) * batch.response_mask
    batch.extra["advantages"] = adv
    batch.extra["returns"] = adv
    tokens = float(batch.attention_mask.sum())
    plain_opt = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def plain_step() -> None:
        n_tok = batch.response_mask.sum()
        for start in range(0, batch.size, args.micro):
            mb = batch.select(list(range(start, min(batch.size, start + args.micro))))
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                        use_cache=False)
            logits = out.logits[:, mb.prompt_len - 1:-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, mb.responses.unsqueeze(-1)).squeeze(-1)
            loss = -(mb.extra["advantages"] * logp * mb.response_mask).sum() / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)

    def ours_step() -> None:
        trainer.actor.update(batch, measure_gap=False)

    ours_step(), plain_step()  # warm-up (allocations, optimizer state)
    times: dict[str, list[float]] = {"plain": [], "ours": []}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain_step), ("ours", ours_step)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    trainer.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"batch: {args.episodes} episodes, prompt <= {batch.prompt_len} + response {args.response} tokens "
          f"({int(tokens)} real tokens), micro-batch {args.micro}, SmolLM2-135M fp32, {torch.get_num_threads()} threads")
    print(f"{'step':<8}{'median s':>10}{'tokens/s':>10}   runs")
    for k in ("plain", "ours"):
        print(f"{k:<8}{med[k]:>10.2f}{tokens / med[k]:>10.0f}   {', '.join(f'{t:.2f}' for t in times[k])}")
    print(f"ratio ours/plain: {med['ours'] / med['plain']:.3f} (target <= 1.15)")


if __name__ == "__main__":
    main()
