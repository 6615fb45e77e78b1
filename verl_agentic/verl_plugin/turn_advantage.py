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
from typing import Any, Optional, Sequence

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
                               index: Any = None, config: Any = None, episode_rows: Optional[Sequence[tuple]] = None,
                               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: ``(advantages, returns)``, both ``[batch, response_length]``, zero
    outside ``response_mask``. ``config.gamma`` (default 1.0) discounts per turn. ``index`` groups the
    rows (one group per row when absent).

    ``episode_rows`` (not verl's: ``verl_plugin/turn_loo_rows.py`` passes it): ``(episode, position)`` of
    each row, for episodes of several rows (an agent whose history changed). An episode's turns are then
    its rows' turns in ``position`` order, as if its rows were one sequence, and a group counts episodes,
    not rows. Each row's rewards are its own: the episode's score belongs on its last row only."""
    gamma = float(config.get("gamma", 1.0) if hasattr(config, "get") else getattr(config, "gamma", 1.0))
    rewards = token_level_rewards.detach().float().cpu()
    mask = response_mask.detach().cpu()
    batch = rewards.shape[0]
    index = list(range(batch)) if index is None else list(index)
    if len(index) != batch:
        raise ValueError(f"turn_loo: {len(index)} group ids for {batch} rows")

    # an episode: its rows in order, each row's turns [(row, start, end), ...] and each turn's reward (its
    # tokens and whatever follows them up to the next turn: an outcome after the last generated token
    # counts for the last turn)
    if episode_rows is None:
        episode_rows = [(i, 0) for i in range(batch)]
    if len(episode_rows) != batch:
        raise ValueError(f"turn_loo: {len(episode_rows)} episode rows for {batch} rows")
    rows_of: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    group_of: dict[Any, Any] = {}
    for i, (episode, position) in enumerate(episode_rows):
        rows_of[episode].append((int(position), i))
        if group_of.setdefault(episode, index[i]) != index[i]:
            raise ValueError(f"turn_loo: episode {episode!r} has rows in groups {group_of[episode]!r} and {index[i]!r}")
    turns: dict[Any, list[tuple[int, int, int]]] = {}
    returns_per_turn: dict[Any, list[float]] = {}
    for episode, members in rows_of.items():
        turns[episode], r = [], []
        for _, i in sorted(members):
            s = turn_spans(mask[i])
            bounds = [a for a, _ in s[1:]] + [rewards.shape[1]]
            turns[episode] += [(i, a, b) for a, b in s]
            r += [float(rewards[i, a:b].sum()) for (a, _), b in zip(s, bounds)]
        g, acc = [0.0] * len(r), 0.0
        for t in range(len(r) - 1, -1, -1):
            acc = r[t] + gamma * acc
            g[t] = acc
        returns_per_turn[episode] = g

    groups: dict[Any, list[Any]] = defaultdict(list)
    for episode, uid in group_of.items():
        groups[uid].append(episode)
    advantages = torch.zeros_like(rewards)
    returns = torch.zeros_like(rewards)
    for members in groups.values():
        for e in members:
            others = [returns_per_turn[o] for o in members if o != e]
            for t, (i, a, b) in enumerate(turns[e]):
                peers = [g[t] for g in others if len(g) > t]
                if not peers:  # nobody else reached turn t: any baseline free of episode e will do
                    peers = [g[0] for g in others if g]
                baseline = float(np.mean(peers)) if peers else 0.0
                g = returns_per_turn[e][t]
                advantages[i, a:b] = g - baseline
                returns[i, a:b] = g
    advantages = advantages * mask.to(advantages.dtype)
    returns = returns * mask.to(returns.dtype)
    return advantages.to(token_level_rewards.device), returns.to(token_level_rewards.device)


# importing this module registers the estimator (the verl plugin and main_ppo both import it)
if core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME) is not compute_turn_loo_advantage:
    core_algos.register_adv_est(NAME)(compute_turn_loo_advantage)
