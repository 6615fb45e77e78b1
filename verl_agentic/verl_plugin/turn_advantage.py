"""``turn_loo``: a turn-level advantage with a leave-one-out baseline, registered in verl's estimator registry.

For episode ``i`` of a group (the ``rollout.n`` episodes of one prompt, ``index`` = verl's uid), turn
``t`` is the ``t``-th run of generated tokens (``response_mask`` = 1); injected tool results and feedback
(mask 0) separate the turns. Every token of turn ``t`` gets

    A[i, t] = G[i, t] - b[i, t]
    G[i, t] = sum over turns u >= t of gamma^(u - t) * r[i, u]     (return from turn t on)
    r[i, u] = the token-level rewards from turn u's first token up to the next turn's first token
    b[i, t] = mean of G[j, t] over the other episodes j != i of the group that have a turn t;
              if none has one, the mean of G[j, 1] over all the others; 0 for a group of one.

With the usual outcome reward (the score on the last generated token) ``G[i, t]`` is the episode's
score for every ``t``, and the baseline of turn ``t`` is the mean score of the *other* episodes that got
that far: a second turn is judged against the other episodes that also needed a second turn.

Why this is unbiased where per-turn-index normalisation is not. The policy-gradient term of turn ``t``
is ``grad log pi(turn t | history) * (G - b)``; it stays unbiased for any ``b`` that does not depend on
the turn's own sampled tokens. Episodes of a group are sampled independently given the prompt, so a
baseline built from the *other* episodes alone qualifies, whatever turns they reached. Normalising
within the episodes at turn index ``t`` *including* episode ``i`` does not: the mean then contains
``G[i, t]`` itself, which scales episode ``i``'s signal by ``1 - 1/k`` where ``k``, the number of
episodes reaching turn ``t``, depends on how the earlier turns went (a later turn is reached mostly
after failures), and the std divides by a quantity that contains ``G[i, t]``. With ``k = 1`` the
advantage is exactly 0: the one episode that needed a retry learns nothing from it.
``tests/test_turn_advantage.py`` shows both on a two-turn problem with a known gradient.

The estimator only reads ``token_level_rewards``, ``response_mask`` and ``index``, so it runs unchanged
in ``verl_agentic.main_ppo`` and in verl's trainer (``algorithm.adv_estimator=turn_loo``; importing this
module registers it: the verl plugin and main_ppo do). ``returns`` are the ``G`` of each token.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo import core_algos

NAME = "turn_loo"


def turn_spans(mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in one row's response mask: the assistant turns, in order."""
    m = mask_row.to(torch.int8).tolist()
    spans, start = [], None
    for pos, v in enumerate(m):
        if v and start is None:
            start = pos
        elif not v and start is not None:
            spans.append((start, pos))
            start = None
    if start is not None:
        spans.append((start, len(m)))
    return spans


def compute_turn_loo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                               index: Any = None, config: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: ``(advantages, returns)``, both ``[batch, response_length]``, zero
    outside ``response_mask``. ``config.gamma`` (default 1.0) discounts per turn. ``index`` groups the
    rows (one group per row when absent)."""
    gamma = float(config.get("gamma", 1.0) if hasattr(config, "get") else getattr(config, "gamma", 1.0))
    rewards = token_level_rewards.detach().float().cpu()
    mask = response_mask.detach().cpu()
    batch = rewards.shape[0]
    index = list(range(batch)) if index is None else list(index)
    if len(index) != batch:
        raise ValueError(f"turn_loo: {len(index)} group ids for {batch} rows")

    spans = [turn_spans(mask[i]) for i in range(batch)]
    returns_per_turn: list[list[float]] = []
    for i in range(batch):
        s = spans[i]
        # a turn's reward: its tokens and whatever follows them up to the next turn (an outcome placed
        # after the last generated token counts for the last turn)
        bounds = [a for a, _ in s[1:]] + [rewards.shape[1]]
        r = [float(rewards[i, a:b].sum()) for (a, _), b in zip(s, bounds)]
        g, acc = [0.0] * len(r), 0.0
        for t in range(len(r) - 1, -1, -1):
            acc = r[t] + gamma * acc
            g[t] = acc
        returns_per_turn.append(g)

    groups: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(index):
        groups[uid].append(i)
    advantages = torch.zeros_like(rewards)
    returns = torch.zeros_like(rewards)
    for members in groups.values():
        for i in members:
            others = [j for j in members if j != i]
            for t, (a, b) in enumerate(spans[i]):
                peers = [returns_per_turn[j][t] for j in others if len(returns_per_turn[j]) > t]
                if not peers:  # nobody else reached turn t: any baseline free of episode i will do
                    peers = [returns_per_turn[j][0] for j in others if returns_per_turn[j]]
                baseline = float(np.mean(peers)) if peers else 0.0
                g = returns_per_turn[i][t]
                advantages[i, a:b] = g - baseline
                returns[i, a:b] = g
    advantages = advantages * mask.to(advantages.dtype)
    returns = returns * mask.to(returns.dtype)
    return advantages.to(token_level_rewards.device), returns.to(token_level_rewards.device)


# importing this module registers the estimator (the verl plugin and main_ppo both import it)
if core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME) is not compute_turn_loo_advantage:
    core_algos.register_adv_est(NAME)(compute_turn_loo_advantage)
