"""The policy being trained: its forward passes and its update, on verl's losses.

One update (``Actor.update``), per ``actor.ppo_epochs`` and per mini-batch of ``actor.ppo_mini_batch_size``
episodes::

    for each micro-batch of actor.ppo_micro_batch_size rows (the rows that give a gradient, see below):
        logprobs (+ entropy, + values) = forward_batch(...)
        loss = verl's policy loss (clipped PPO, ...; IS weights of rollout correction)
               - entropy_coeff * entropy + kl_loss_coef * KL to the reference (+ vf_coef * value loss)
        loss.backward()                        gradients accumulate over the micro-batches
    clip the gradient norm; AdamW step; LR schedule step (a non-finite norm: the step is skipped)

Every loss term is aggregated by verl's ``agg_loss`` over ``response_mask`` and normalised by the whole
mini-batch (verl's ``global_batch_info``), so the micro-batching does not change the update. The metrics
it returns sit beside the terms they measure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from verl_agentic.config import RunConfig
from verl_agentic.trainer.batch import TrainBatch
from verl_agentic.trainer.verl_config import verl_modules

# verl policy losses whose value and gradient are 0 for a token with advantage 0 (checked for each
# by tests/test_trainer.py); kl_cov and dro add terms that are not, bypass_mode is left out
ZERO_AT_ZERO_ADVANTAGE = ("vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "geo_mean", "cispo")


@dataclass
class ForwardOut:
    log_probs: torch.Tensor  # [b, R]
    entropy: Optional[torch.Tensor] = None  # [b, R]
    values: Optional[torch.Tensor] = None  # [b, R]


def forward_batch(model: torch.nn.Module, mb: TrainBatch, temperature: float, *, entropy: str | bool = False,
                  value_head: Optional[torch.nn.Module] = None, bf16: bool = False) -> ForwardOut:
    """Logprobs of ``mb.responses`` under ``model`` at ``temperature`` (as the rollout computed them).

    ``entropy``: ``"grad"`` (a loss term), ``"metric"``/True (no graph) or False (not computed).

    Only the response positions' logits are materialised (``logits_to_keep``). ``values`` (GAE)
    come from ``value_head`` on the last hidden state at the position before each token.
    """
    _, _, verl_F = verl_modules()
    r = mb.response_len
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids,
                    use_cache=False, logits_to_keep=r + 1, output_hidden_states=value_head is not None)
    logits = out.logits[:, :-1].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    result = ForwardOut(log_probs=verl_F.logprobs_from_logits(logits, mb.responses))
    if entropy:
        # Without an entropy bonus the entropy is a metric only: no graph (saves a softmax-sized
        # tensor kept for backward per micro-batch).
        with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
            result.entropy = verl_F.entropy_from_logits(logits)
    if value_head is not None:
        hidden = out.hidden_states[-1][:, mb.prompt_len - 1: mb.prompt_len - 1 + r].float()
        result.values = value_head(hidden).squeeze(-1)
    return result


def chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def logprob_gap(trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``actor/logprob_gap_mean|max``: how far the rollout's logprobs are from the trainer's, per token."""
    diff = (trainer_lp - rollout_lp).abs() * mask
    return {"actor/logprob_gap_mean": float(diff.sum() / max(float(mask.sum()), 1.0)),
            "actor/logprob_gap_max": float(diff.max())}


class Actor:
    """``model`` (fp32) and, for ``adv_estimator=gae``, a value head on its last hidden state; AdamW over
    both (the head at ``critic.lr``) with ``actor.optim``'s schedule. ``actor_cfg`` is verl's
    ``ActorConfig`` (what its policy-loss functions read)."""

    def __init__(self, model: torch.nn.Module, c: RunConfig, actor_cfg: Any, adv_estimator: str) -> None:
        a = self.conf = c.actor
        self.critic = c.critic
        self.model, self.actor_cfg = model, actor_cfg
        self.temperature = c.rollout.temperature or 1.0
        self.bf16 = a.dtype == "bfloat16"
        self.value_head: Optional[torch.nn.Module] = None
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": a.optim.lr}]
        if adv_estimator == "gae":
            self.value_head = torch.nn.Linear(model.config.hidden_size, 1)
            torch.nn.init.zeros_(self.value_head.weight)
            torch.nn.init.zeros_(self.value_head.bias)
            groups.append({"params": list(self.value_head.parameters()), "lr": c.critic.lr})
        self.optimizer = torch.optim.AdamW(groups, betas=a.optim.betas, weight_decay=a.optim.weight_decay)
        self.scheduler = self._lr_schedule(c)

    def _lr_schedule(self, c: RunConfig) -> torch.optim.lr_scheduler.LambdaLR:
        """``actor.optim.lr_scheduler_type``: ``constant`` (after ``lr_warmup_steps`` of linear warm-up)
        or ``cosine`` (verl's, decaying to ``min_lr_ratio`` x lr at the last optimizer step of
        ``trainer.total_steps``, counted as full batches of ``batch_size * rollout.n`` episodes)."""
        _, _, verl_F = verl_modules()
        a = c.actor
        warmup = a.optim.lr_warmup_steps
        if a.optim.lr_scheduler_type == "constant":
            return torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)
        per_step = a.ppo_epochs * math.ceil(c.trainer.batch_size * c.rollout.n / a.ppo_mini_batch_size)
        return verl_F.get_cosine_schedule_with_warmup(
            self.optimizer, num_warmup_steps=warmup, num_training_steps=c.trainer.total_steps * per_step,
            min_lr_ratio=a.optim.min_lr_ratio, zero_indexed_step=False)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(),
                "value_head": self.value_head.state_dict() if self.value_head is not None else None,
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.model.load_state_dict(s["model"])
        if self.value_head is not None and s["value_head"] is not None:
            self.value_head.load_state_dict(s["value_head"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ------------------------------------------------------------------ forward passes

    @torch.no_grad()
    def no_grad_pass(self, batch: TrainBatch, model: Optional[torch.nn.Module] = None, *,
                     values: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Logprobs of the batch's responses under ``model`` (default: the policy) and, with ``values``,
        the value head's values, a micro-batch at a time."""
        model = model if model is not None else self.model
        lps = torch.zeros_like(batch.response_mask)
        vals = torch.zeros_like(batch.response_mask) if values else None
        for idx in chunks(batch.size, self.conf.ppo_micro_batch_size):
            mb = batch.select(idx)
            out = forward_batch(model, mb, self.temperature, value_head=self.value_head if values else None,
                                bf16=self.bf16)
            lps[idx, :mb.response_len] = out.log_probs
            if values:
                vals[idx, :mb.response_len] = out.values
        return lps, vals

    # ------------------------------------------------------------------ the update

    def rows_with_gradient(self, batch: TrainBatch) -> list[bool]:
        """Which rows the update must forward. A row whose advantages are all 0 adds nothing to the
        policy-gradient loss or its gradient under the losses in ``ZERO_AT_ZERO_ADVANTAGE`` (GRPO's
        all-wrong or all-right groups: most groups when rewards are sparse), so with
        ``actor.skip_zero_advantage`` and no other loss term (entropy bonus, KL loss, critic) it is
        not forwarded. The result is the same update: bitwise when each micro-batch holds one row,
        otherwise up to the GEMMs' summation order over other shapes (``tests/test_trainer.py``)."""
        a = self.conf
        if (not a.skip_zero_advantage or a.entropy_coeff or a.use_kl_loss or self.value_head is not None
                or self.actor_cfg.policy_loss.loss_mode not in ZERO_AT_ZERO_ADVANTAGE):
            return [True] * batch.size
        adv = batch.extra["advantages"] * batch.response_mask
        return (adv.abs().amax(-1) > 0).tolist()

    def update(self, batch: TrainBatch, measure_gap: bool) -> dict[str, float]:
        """``actor.ppo_epochs`` passes of optimizer steps over ``batch``'s mini-batches; returns the update's
        metrics. ``measure_gap``: the first forwarded mini-batch also measures ``actor/logprob_gap_*``
        (the old logprobs were not recomputed, so the gap is not known yet)."""
        a = self.conf
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        grad_norms, skipped = [], 0
        live = self.rows_with_gradient(batch)
        for _ in range(a.ppo_epochs):
            for mini_idx in chunks(batch.size, a.ppo_mini_batch_size):
                rows = [j for j, i in enumerate(mini_idx) if live[i]]
                self._accumulate(batch.select(mini_idx), rows, sums, weights, measure_gap)
                if measure_gap and rows:
                    measure_gap = False
                norm = self._step(params)
                if norm is None:
                    skipped += 1
                else:
                    grad_norms.append(norm)
        return self._update_metrics(batch, sums, weights, grad_norms, skipped)

    def _accumulate(self, mini: TrainBatch, rows: list[int], sums: dict, weights: dict, measure_gap: bool) -> None:
        """Forward and backward the ``rows`` of ``mini``, a micro-batch at a time; the loss is normalised by
        the whole mini-batch (verl's ``global_batch_info``), so leaving out rows that give no gradient
        changes nothing but the time."""
        gbi = {"dp_size": 1, "batch_num_tokens": float(mini.response_mask.sum()),
               "global_batch_size": float((mini.response_mask.sum(-1) > 0).sum())}
        self.actor_cfg.global_batch_info.clear()
        self.actor_cfg.global_batch_info.update(gbi)
        for micro in chunks(len(rows), self.conf.ppo_micro_batch_size):
            self._micro_batch(mini.select([rows[j] for j in micro]), gbi, sums, weights, measure_gap)

    def _micro_batch(self, mb: TrainBatch, gbi: dict, sums: dict, weights: dict, measure_gap: bool) -> None:
        """One micro-batch's loss terms, their backward, and their metrics beside them."""
        core_algos, _, verl_F = verl_modules()
        a, m = self.conf, mb.response_mask
        mode = a.loss_agg_mode
        out = forward_batch(self.model, mb, self.temperature, entropy="grad" if a.entropy_coeff else "metric",
                            value_head=self.value_head, bf16=self.bf16)
        if measure_gap:
            gap = (out.log_probs.detach() - mb.rollout_log_probs).abs() * m
            sums["gap_sum"] += float(gap.sum())
            sums["gap_n"] += float(m.sum())
            sums["gap_max"] = max(sums["gap_max"], float(gap.max()))
        pg_loss, pg_metrics = core_algos.get_policy_loss_fn(self.actor_cfg.policy_loss.loss_mode)(  # bypass_mode too
            old_log_prob=mb.extra["old_log_probs"], log_prob=out.log_probs, advantages=mb.extra["advantages"],
            response_mask=m, loss_agg_mode=mode, config=self.actor_cfg,
            rollout_is_weights=mb.extra.get("rollout_is_weights"))
        loss = pg_loss
        if a.entropy_coeff:
            loss = loss - a.entropy_coeff * core_algos.agg_loss(out.entropy, m, mode, **gbi)
        if a.use_kl_loss:
            kl_loss = core_algos.agg_loss(core_algos.kl_penalty(out.log_probs, mb.extra["ref_log_prob"],
                                                                a.kl_loss_type), m, mode, **gbi)
            loss = loss + a.kl_loss_coef * kl_loss
            sums["actor/kl_loss"] += float(kl_loss.detach())
        if self.value_head is not None:
            vf_loss, vf_clip = core_algos.compute_value_loss(
                vpreds=out.values, returns=mb.extra["returns"], values=mb.extra["values"], response_mask=m,
                cliprange_value=self.critic.cliprange_value, loss_agg_mode=mode, **gbi)
            loss = loss + self.critic.vf_coef * vf_loss
            sums["critic/vf_loss"] += float(vf_loss.detach())
            sums["critic/vf_clipfrac"] += float(vf_clip) * float(m.sum())
            weights["critic/vf_clipfrac"] += float(m.sum())
        loss.backward()
        sums["actor/pg_loss"] += float(pg_loss.detach())
        tok = float(m.sum())
        # a token mean over the rows forwarded (all rows unless some were skipped)
        sums["actor/entropy"] += float(verl_F.masked_mean(out.entropy.detach(), m)) * tok
        weights["actor/entropy"] += tok
        sums["actor/updated_rows"] += float(m.shape[0])
        for k, v in pg_metrics.items():
            sums[k] += float(v) * tok
            weights[k] += tok

    def _step(self, params: list[torch.Tensor]) -> Optional[float]:
        """Clip and take the optimizer and schedule step; the gradient norm, or None when it was not
        finite (the step is skipped)."""
        for p in params:  # a mini-batch with no live row still takes its (momentum) step
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.clip_grad_norm_(params, self.conf.grad_clip)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def _update_metrics(self, batch: TrainBatch, sums: dict, weights: dict, grad_norms: list[float],
                        skipped: int) -> dict[str, float]:
        _, _, verl_F = verl_modules()
        a = self.conf
        n_updates = a.ppo_epochs * len(chunks(batch.size, a.ppo_mini_batch_size))
        out = {k: v / weights[k] if k in weights else v / n_updates for k, v in sums.items() if not k.startswith("gap_")}
        if sums.get("gap_n"):
            out["actor/logprob_gap_mean"] = sums["gap_sum"] / sums["gap_n"]
            out["actor/logprob_gap_max"] = sums["gap_max"]
        if "actor/ppo_kl" in out:
            out["actor/kl"] = out["actor/ppo_kl"]
        if "ref_log_prob" in batch.extra:
            out["actor/kl_ref"] = float(verl_F.masked_mean(
                batch.extra["old_log_probs"] - batch.extra["ref_log_prob"], batch.response_mask))
        out["actor/updated_rows"] = sums["actor/updated_rows"] / (a.ppo_epochs * batch.size)
        out.setdefault("actor/pg_loss", 0.0)  # every row skipped: the loss is exactly 0
        out["actor/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else float("nan")
        out["actor/skipped_updates"] = float(skipped)
        return out
