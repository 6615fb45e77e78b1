"""The gsm8k interactions: ``gsm8k`` (right -> stop, wrong -> "reflect and try again") and
``code_verify`` ("Are you sure? Can you write Python code to verify?"), found through the
``verl_agentic.interactions`` entry points. They score with the gsm8k scorer."""

from __future__ import annotations

from typing import Any

from verl_agentic.interactions.base import BaseInteraction
from verl_agentic.interactions.registry import register_interaction
from verl_agentic.tasks.gsm8k.scorer import gsm8k_score
from verl_agentic.tasks.gsm8k.texts import INTERACTION_RETRY as DEFAULT_RETRY
from verl_agentic.tasks.gsm8k.texts import INTERACTION_RIGHT
from verl_agentic.tasks.gsm8k.texts import INTERACTION_TERMINATE as DEFAULT_TERMINATE
from verl_agentic.tasks.gsm8k.texts import INTERACTION_VERIFY as DEFAULT_VERIFY


class _Gsm8kScoring(BaseInteraction):
    """Keeps the last answer and its correctness per instance (``ground_truth`` from start kwargs)."""

    def _judge(self, instance_id: str, messages: list[dict]) -> float:
        state = self._instance_dict[instance_id]
        state["response"] = self.last_assistant_content(messages)
        gt = state.get("ground_truth")
        if gt is None:
            return 0.0
        out = gsm8k_score(state["response"], gt, method=self.config.get("method", "flexible"))
        state["reward"] = out["score"]
        state.setdefault("history", []).append(out["acc"])
        return out["score"]

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return float(self._instance_dict.get(instance_id, {}).get("reward", 0.0))


@register_interaction("gsm8k")
class Gsm8kInteraction(_Gsm8kScoring):
    """Right answer -> terminate; wrong -> ``retry_message`` (default: reflect and try again)."""

    CONFIG_KEYS = ("method", "retry_message")

    async def generate_response(self, instance_id, messages, **kwargs):
        reward = self._judge(instance_id, messages)
        if reward == 1.0:
            return True, INTERACTION_RIGHT, reward, {}
        return False, self.config.get("retry_message", DEFAULT_RETRY), reward, {}


@register_interaction("code_verify")
class CodeVerifyInteraction(_Gsm8kScoring):
    """After the model's first answer: ``feedback_message`` (default "Are you sure? Can you write
    Python code to verify?"); the model may then call the Python tool (tool turns do not reach the
    interaction) and answer again. After ``max_rounds`` answers (default 2) it closes with
    ``terminate_message``. The score is the latest answer's gsm8k correctness when the episode
    has a ``ground_truth``."""

    CONFIG_KEYS = ("method", "feedback_message", "terminate_message", "max_rounds")

    async def generate_response(self, instance_id, messages, **kwargs):
        reward = self._judge(instance_id, messages)
        state = self._instance_dict[instance_id]
        state["rounds"] = state.get("rounds", 0) + 1
        if state["rounds"] >= int(self.config.get("max_rounds", 2)):
            return True, self.config.get("terminate_message", DEFAULT_TERMINATE), reward, {}
        return False, self.config.get("feedback_message", DEFAULT_VERIFY), reward, {}
