"""Per-turn rewards inside verl's trainer (``+agentic.turn_rewards=true``).

verl turns an agent loop's output into its token-level reward with the episode's score on the last
response token and nothing else (``AgentLoopOutput.as_dict``,
``verl/experimental/agent_loop/agent_loop.py:143-148``: ``rm_scores[-1] = reward_score``); verl's
advantage estimators then read ``token_level_rewards = rm_scores``. A turn-level estimator (our
``turn_loo``) needs each assistant turn's own reward on that turn. With ``agentic.turn_rewards`` the
``task_agent`` loop puts ``[[position, reward], ...]`` in the output's ``agentic_turn_rewards`` field
(``convert.py``: every assistant turn but the last, on its last token, the rule of ``main_ppo``'s
``algorithm.turn_rewards``), and :func:`install` wraps ``as_dict`` to add them to ``rm_scores``: the loop
applies it (the registry's ``turn_rewards``, mode opt-in) in its agent-loop worker when the setting is on,
and only then; other processes, and runs without the setting, keep verl's ``as_dict``. Outputs without
that field are untouched, so other agent loops see verl's behaviour.

This serves verl's streaming reward path (the agent-loop worker scores each episode: rule-based
rewards, which all of our reward managers are, or a reward model with a resource pool of its own);
``task_agent`` refuses ``agentic.turn_rewards`` where verl scores after the rollout instead (a
reward model colocated with the trainer), which this wrapper cannot reach.
"""

from __future__ import annotations

import functools
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_agentic.verl_plugin.convert import TURN_REWARDS_FIELD


def install() -> None:
    """Wrap ``AgentLoopOutput.as_dict`` once (idempotent)."""
    original = AgentLoopOutput.as_dict
    if getattr(original, "_verl_agentic_turn_rewards", False):
        return

    @functools.wraps(original)
    def as_dict(self: Any) -> dict[str, Any]:
        output = original(self)
        turns = (self.extra_fields or {}).get(TURN_REWARDS_FIELD)
        if turns and "rm_scores" in output:
            scores = output["rm_scores"]
            for position, reward in turns:
                scores[int(position)] += float(reward)
        return output

    as_dict._verl_agentic_turn_rewards = True
    AgentLoopOutput.as_dict = as_dict
