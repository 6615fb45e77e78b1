"""The gsm8k task's episode: the model answers, gets feedback, and may revise.

Config (``task.gsm8k.*``):

- ``feedback``: ``none`` (one answer), ``retry`` (wrong -> "Your answer is incorrect..."),
  ``verify`` (wrong -> "Are you sure? Can you write Python code to verify?"),
  ``always_verify`` (the verify question after the first answer even when it is right; later
  turns as ``verify``). Feedback is given only while turns remain (``rollout.max_turns``).
- ``extraction``: ``flexible`` (last number in the answer; default) or ``strict`` (``#### N``).
- ``retry_message`` / ``verify_message``: the feedback texts.

Per-turn reward: 1.0 when that turn's answer is right. Episode reward: the last answer's
correctness. Metrics: first/final correct, answered, flips wrong->right and right->wrong,
feedback turns.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from verl_agentic.interfaces import (
    ConfigError,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
    check_keys,
)
from verl_agentic.rollout.task_spec import TaskSpec, register_task
from verl_agentic.tasks.data import DatasetError
from verl_agentic.tasks.gsm8k.answer import EXTRACTIONS, extract_answer, normalize_number
from verl_agentic.tasks.gsm8k.texts import RETRY_MESSAGE as DEFAULT_RETRY_MESSAGE
from verl_agentic.tasks.gsm8k.texts import VERIFY_MESSAGE as DEFAULT_VERIFY_MESSAGE
from verl_agentic.tasks.tool_agent import (
    ToolAgentConfig,
    tool_agent_end,
    tool_agent_obs,
    tool_agent_start,
)

FEEDBACK_POLICIES = ("none", "retry", "verify", "always_verify")


@dataclass
class Gsm8kConfig:
    feedback: str = "verify"
    extraction: str = "flexible"
    # a turn cut at max_new_tokens still gives the answer extraction finds in its text (flexible: the last
    # number, often a step of unfinished working); false: it has no answer, so it is wrong
    answer_in_cut_turn: bool = True
    retry_message: str = DEFAULT_RETRY_MESSAGE
    verify_message: str = DEFAULT_VERIFY_MESSAGE
    # task.gsm8k also takes the tool_agent keys (tools, interaction, parser, ...): when ``tools``
    # or ``interaction`` is set, or a row names an interaction, the episode runs as tool_agent's
    agent: ToolAgentConfig = field(default_factory=ToolAgentConfig)

    def tool_agent_config(self, row: Optional[dict] = None) -> Optional[ToolAgentConfig]:
        """The tool_agent config of this episode, or None for the built-in feedback policies."""
        named = ((row or {}).get("extra_info") or {}).get("interaction_kwargs", {}) or {}
        # a row's interaction name, without one configured: that registered class, with its defaults
        interaction = self.agent.interaction if self.agent.interaction is not None else named.get("name")
        if not self.agent.has_tools() and interaction is None:
            return None
        return dataclasses.replace(self.agent, interaction=interaction)

    @classmethod
    def from_dict(cls, d: dict) -> "Gsm8kConfig":
        own = set(cls.__dataclass_fields__) - {"agent"}
        check_keys(d, sorted(own | set(ToolAgentConfig.KEYS)), "task.gsm8k")
        d = {k: v for k, v in d.items() if not (k in ("retry_message", "verify_message") and v is None)}  # null: default
        agent = ToolAgentConfig(**{k: v for k, v in d.items() if k in ToolAgentConfig.KEYS})
        if agent.has_tools() or agent.interaction is not None:
            agent.checked("task.gsm8k")  # loads them: errors surface now
        cfg = cls(**{k: v for k, v in d.items() if k in own}, agent=agent)
        if cfg.feedback not in FEEDBACK_POLICIES:
            raise ConfigError(f"task.gsm8k.feedback must be one of {FEEDBACK_POLICIES}, got {cfg.feedback!r}")
        if cfg.extraction not in EXTRACTIONS:
            raise ConfigError(f"task.gsm8k.extraction must be one of {EXTRACTIONS}, got {cfg.extraction!r}")
        return cfg


@dataclass
class Gsm8kState:
    config: Gsm8kConfig
    ground_truth: str
    answers: list[Optional[str]] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    feedback_turns: int = 0


def gsm8k_start(row: dict, ctx: RolloutContext, cfg: Optional[Gsm8kConfig] = None) -> EpisodeState:
    cfg = cfg or Gsm8kConfig.from_dict(dict(ctx.task_config))
    gt = normalize_number(str(row["reward_model"]["ground_truth"]))
    if gt is None:
        raise DatasetError(f"field 'reward_model.ground_truth' is not a number: {row['reward_model']['ground_truth']!r}")
    return EpisodeState(row=row, messages=copy.deepcopy(list(row["prompt"])), ctx=ctx, task=Gsm8kState(cfg, gt))


def _feedback(task: Gsm8kState, turn: int, correct: bool) -> Optional[str]:
    """The feedback message after assistant turn ``turn`` (1-based), or None to stop."""
    policy = task.config.feedback
    if policy == "none":
        return None
    if policy == "always_verify" and turn == 1:
        return task.config.verify_message
    if correct:
        return None
    return task.config.retry_message if policy == "retry" else task.config.verify_message


def gsm8k_obs(state: EpisodeState, out: GenOutput) -> Observation:
    task: Gsm8kState = state.task
    cut = out.finish_reason == "length" and not task.config.answer_in_cut_turn
    answer = None if cut else extract_answer(state.last_assistant_text, task.config.extraction)
    correct = answer is not None and answer == task.ground_truth
    task.answers.append(answer)
    task.correct.append(correct)
    message = _feedback(task, state.num_turns, correct)
    info = {"answer": answer}  # the answer this turn gives (the monitors' answer collapse reads it)
    if message is None:
        return Observation(done=True, turn_reward=float(correct), info=info)
    if state.num_turns < state.ctx.max_turns:  # otherwise the loop ends with "max_turns" unsent
        task.feedback_turns += 1
    return Observation(messages=[{"role": "user", "content": message}], turn_reward=float(correct), info=info)


def gsm8k_end(state: EpisodeState) -> EpisodeResult:
    task: Optional[Gsm8kState] = state.task
    if task is None or not task.correct:
        return EpisodeResult(0.0, {"first_correct": 0.0, "final_correct": 0.0, "answered": 0.0})
    flips_wr = sum(1 for a, b in zip(task.correct, task.correct[1:]) if not a and b)
    flips_rw = sum(1 for a, b in zip(task.correct, task.correct[1:]) if a and not b)
    final = float(task.correct[-1])
    return EpisodeResult(final, {
        "first_correct": float(task.correct[0]),
        "final_correct": final,
        "answered": float(task.answers[-1] is not None),
        "feedback_turns": float(task.feedback_turns),
        "flips_wrong_to_right": float(flips_wr),
        "flips_right_to_wrong": float(flips_rw),
    })


async def _start(row: dict, ctx: RolloutContext) -> EpisodeState:
    cfg = Gsm8kConfig.from_dict(dict(ctx.task_config))
    agent = cfg.tool_agent_config(row)
    if agent is None:
        return gsm8k_start(row, ctx, cfg)
    return await tool_agent_start(row, ctx, agent)


async def _obs(state: EpisodeState, out: GenOutput) -> Observation:
    if isinstance(state.task, Gsm8kState):
        return gsm8k_obs(state, out)
    return await tool_agent_obs(state, out)


async def _end(state: EpisodeState) -> EpisodeResult:
    if state.task is None or isinstance(state.task, Gsm8kState):
        return gsm8k_end(state)
    return await tool_agent_end(state)


GSM8K = register_task("gsm8k", TaskSpec(start=_start, obs=_obs, end=_end, check_config=Gsm8kConfig.from_dict))
