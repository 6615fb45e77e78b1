"""``turn_loo`` over an episode's rows in verl's v1 trainer (``algorithm.adv_estimator=turn_loo``).

An agent whose history changed makes an episode of several training rows (``rollout.trajectory.
training_rows``); the ``task_agent`` loop returns one verl output per row. verl 0.9.1's v1 trainer stores
them under ``{uid}_{session}_{row}``, gives every row the episode's score on its last token
(``AgentLoopWorkerTQ._agent_loop_postprocess``) and, in ``PPOTrainer._compute_advantage``, calls
``compute_advantage_for_multi_trajectories(data, batch_keys, ...)``: for GRPO it joins a session's rows
itself; any other estimator sees each row as an episode of its own. :func:`install` wraps that function
(the name ``trainer_base`` calls) so that ``turn_loo`` sees episodes::

    if the estimator is not turn_loo, or no session has two rows:  verl's function, unchanged
    episode of row i  = (uid, session) from its key; its position = the key's row index
    score             = the episode's last row's rewards from its last turn's first token on
    each earlier row  : that score taken off its last turn (verl put it there; it counts once)
    advantages        = compute_turn_loo_advantage(rewards, mask, uid, config, episode_rows=...)

which is what ``main_ppo`` computes for the same rows (``trainer.ppo.episode_advantages``: the episode's
score on its last row, an earlier row ending with its last turn's own reward, which the ``task_agent``
loop puts there with ``agentic.turn_rewards``). ``tests/test_turn_advantage.py`` compares the two.

Applied in the process that trains (verl's ``TaskRunner``) once verl's trainer module is imported;
each step it acts at prints one line (``turn_loo_rows: joined 2 episodes of 2 rows for turn_loo``).
``VERL_AGENTIC_TURN_LOO_ROWS=0`` leaves verl's function alone, and the ``task_agent`` loop then keeps
only the last row of such an episode, saying why, as it does for estimators other than grpo and
turn_loo. It reads tensors and keys only, the same on any device; it has run on this CPU only.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

from verl_agentic.verl_plugin.on_import import after_import
from verl_agentic.verl_plugin.turn_advantage import NAME, compute_turn_loo_advantage, turn_spans

TRAINER_MODULE = "verl.trainer.ppo.v1.trainer_base"


def episode_rows(batch_keys: list[str]) -> list[tuple[str, int]]:
    """``(episode, row)`` of each key ``{uid}_{session}_{row}`` (verl's v1 storage keys)."""
    out = []
    for key in batch_keys:
        episode, sep, row = key.rpartition("_")
        if not sep or not row.isdigit():
            raise ValueError(f"turn_loo: verl's batch key {key!r} is not {{uid}}_{{session}}_{{row}}")
        out.append((episode, int(row)))
    return out


def turn_loo_over_rows(data: Any, batch_keys: list[str], config: Any) -> Any:
    """``data.batch["advantages"]`` and ``["returns"]`` by ``turn_loo`` with each session's rows joined
    (the module docstring); ``data`` is what verl's ``_compute_advantage`` passes on."""
    rows = episode_rows(batch_keys)
    rewards = data.batch["token_level_rewards"].clone()
    scores, mask = data.batch["token_level_scores"], data.batch["response_mask"]
    last: dict[str, tuple[int, int]] = {}  # episode -> (its last row's position, batch index)
    for i, (episode, position) in enumerate(rows):
        if episode not in last or last[episode][0] < position:
            last[episode] = (position, i)
    for i, (episode, position) in enumerate(rows):
        final = last[episode][1]
        spans, final_spans = turn_spans(mask[i]), turn_spans(mask[final])
        if i == final or not spans:
            continue
        score = scores[final, final_spans[-1][0]:].sum() if final_spans else scores[final].sum()
        rewards[i, spans[-1][1] - 1] -= score
    data.batch["advantages"], data.batch["returns"] = compute_turn_loo_advantage(
        rewards, mask, index=data.non_tensor_batch["uid"], config=config, episode_rows=rows)
    sizes = sorted(Counter(Counter(episode for episode, _ in rows).values()).items())
    joined = ", ".join(f"{n} episodes of {k} rows" for k, n in sizes if k > 1)
    print(f"[verl-agentic] turn_loo_rows: joined {joined} for turn_loo", flush=True)
    return data


def install(trainer_base: Any = None) -> None:
    """Wrap ``trainer_base.compute_advantage_for_multi_trajectories`` once (idempotent)."""
    if trainer_base is None:  # tests, and a process that imported the trainer before the plugin
        from verl.trainer.ppo.v1 import trainer_base

    original = trainer_base.compute_advantage_for_multi_trajectories
    if getattr(original, "__verl_agentic_turn_loo_rows__", False):
        return

    @functools.wraps(original)
    def compute_advantage_for_multi_trajectories(data: Any, batch_keys: list[str], adv_estimator: Any,
                                                 *args: Any, **kwargs: Any) -> Any:
        estimator = str(getattr(adv_estimator, "value", adv_estimator))
        if estimator != NAME or len({e for e, _ in episode_rows(batch_keys)}) == len(batch_keys):
            return original(data, batch_keys, adv_estimator, *args, **kwargs)
        return turn_loo_over_rows(data, batch_keys, kwargs.get("config"))

    compute_advantage_for_multi_trajectories.__verl_agentic_turn_loo_rows__ = True
    trainer_base.compute_advantage_for_multi_trajectories = compute_advantage_for_multi_trajectories


def install_on_import() -> None:
    """:func:`install` now if verl's trainer module is loaded, else as soon as it is (``on_import``)."""
    after_import(TRAINER_MODULE, install)
