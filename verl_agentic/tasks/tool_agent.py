"""``tool_agent``: any tools plus any interaction, from config. The generic multi-turn task.

Each assistant turn is parsed for tool calls (``parser``). With calls, they run (concurrently,
each under ``call_timeout_s``) and their results go back as ``tool`` messages. Without calls,
the interaction the sample names (``extra_info.interaction_kwargs.name``, default ``gsm8k``)
answers: it may end the episode or send the next user message, with a reward for the turn.
Without an interaction, an answer without tool calls ends the episode.

Config (``task.tool_agent.*``; the gsm8k task accepts the same keys to add tools/interactions):

- ``tools``: a tools YAML path, or the list ``[{class_name, config?, tool_schema?}, ...]`` or
  names (``[python, calculator]``), or ``{mcp: {command | url}}`` entries for MCP servers' tools;
  see ``verl_agentic.tools.registry`` and ``verl_agentic.tools.mcp_tools``.
- ``tool_config_path``, ``function_tool_path``: verl's tool files, unchanged (a YAML of verl
  ``BaseTool`` subclasses; a Python file of ``@function_tool`` functions; ``tools/verl_tools.py``),
  besides ``tools``. Inside verl's trainer, ``task_agent`` fills them from verl's own keys
  ``actor_rollout_ref.rollout.multi_turn.tool_config_path`` / ``function_tool_path``.
- ``interaction``: an interaction YAML path, the list ``[{name?, class_name, config?}]``, or
  one class name (``code_verify``); see ``verl_agentic.interactions.registry``.
- ``parser`` (hermes | json | react | openai), ``call_timeout_s``, ``max_calls_per_turn``,
  ``parse_feedback`` (the message after an unparsable tool call; default: the parser's).
- ``max_consecutive_invalid_tool_calls``: end the episode (``finish_reason="invalid_tool_calls"``)
  at that many invalid calls in a row (unparseable markup or unknown tools; ``tools/runner.py``);
  null: ``rollout.max_consecutive_invalid_tool_calls``; 0: no limit.

Row fields (verl's conventions): ``extra_info.tools_kwargs`` (per tool: ``create_kwargs``),
``extra_info.interaction_kwargs`` (``name`` + kwargs for ``start_interaction``; the row's
``reward_model.ground_truth`` is passed as ``ground_truth`` unless given).

Reward: the interaction's ``calculate_score`` at the end plus the tools' rewards; per-turn
rewards are the interaction's scores. Metrics: tool calls / ok / error / timeout, parse errors,
feedback turns, answer flips wrong->right and right->wrong (from the interaction's scores).
"""

from __future__ import annotations

import copy
import functools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interactions import call_with_instance, load_interactions
from verl_agentic.interfaces import (
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
    check_keys,
)
from verl_agentic.record.tape import digest, door
from verl_agentic.rollout.task_spec import TaskSpec, register_task
from verl_agentic.tools import load_tools
from verl_agentic.tools.parsers import get_parser
from verl_agentic.tools.runner import ToolRunner, invalid_call_limit


@dataclass
class ToolAgentConfig:
    tools: Any = None
    tool_config_path: Optional[str] = None
    function_tool_path: Optional[str] = None
    interaction: Any = None
    parser: str = "hermes"
    call_timeout_s: Optional[float] = 30.0
    max_calls_per_turn: int = 8
    parse_feedback: Optional[str] = None
    max_consecutive_invalid_tool_calls: Optional[int] = None

    KEYS = ("tools", "tool_config_path", "function_tool_path", "interaction", "parser", "call_timeout_s",
            "max_calls_per_turn", "parse_feedback", "max_consecutive_invalid_tool_calls")

    @classmethod
    def from_dict(cls, d: dict, section: str = "task.tool_agent") -> "ToolAgentConfig":
        check_keys(d, sorted(cls.KEYS), section)
        return cls(**d).checked(section)

    def checked(self, section: str = "task.tool_agent") -> "ToolAgentConfig":
        """This config, its values checked and its tools, parser and interactions loaded (and cached):
        config errors surface now, named by ``section``."""
        invalid_call_limit(self.max_consecutive_invalid_tool_calls, None, section)  # checks the value
        _components(self.key())
        return self

    def has_tools(self) -> bool:
        return any(v is not None for v in (self.tools, self.tool_config_path, self.function_tool_path))

    def key(self) -> str:
        return json.dumps({k: getattr(self, k) for k in self.KEYS}, sort_keys=True, default=str)


@functools.lru_cache(maxsize=32)
def _components(key: str) -> tuple:
    """Tools, parser and interactions for a config, built once per process (instances are per episode)."""

    d = json.loads(key)
    tools = load_tools(d["tools"], tool_config_path=d["tool_config_path"], function_tool_path=d["function_tool_path"])
    return tools, get_parser(d["parser"]), load_interactions(d["interaction"])


@dataclass
class ToolAgentState:
    config: ToolAgentConfig
    runner: Any
    interaction: Any = None
    interaction_id: Optional[str] = None
    interaction_kwargs: dict = field(default_factory=dict)
    scores: list[float] = field(default_factory=list)
    feedback_turns: int = 0


async def tool_agent_start(row: dict, ctx: RolloutContext, config: Optional[ToolAgentConfig] = None) -> EpisodeState:
    cfg = config or ToolAgentConfig.from_dict(dict(ctx.task_config))
    tools, parser, interactions = _components(cfg.key())
    extra = row.get("extra_info") or {}
    runner = ToolRunner(tools, parser, call_timeout_s=cfg.call_timeout_s, max_calls_per_turn=cfg.max_calls_per_turn,
                        parse_feedback=cfg.parse_feedback,
                        max_consecutive_invalid=invalid_call_limit(cfg.max_consecutive_invalid_tool_calls, ctx,
                                                                   f"task.{row.get('task_type') or 'tool_agent'}"))
    task = ToolAgentState(cfg, runner)
    state = EpisodeState(row=row, messages=copy.deepcopy(list(row["prompt"])), ctx=ctx, task=task,
                         tools=runner.schemas() or None)
    await runner.start(extra.get("tools_kwargs"))
    if interactions:
        try:
            kwargs = dict(extra.get("interaction_kwargs") or {})
            _, task.interaction = interactions.select(kwargs)
            kwargs.pop("name", None)
            kwargs.setdefault("ground_truth", (row.get("reward_model") or {}).get("ground_truth"))
            task.interaction_kwargs = kwargs
            task.interaction_id = await task.interaction.start_interaction(uuid.uuid4().hex, **kwargs)
        except BaseException:
            await runner.close()
            raise
    return state


async def tool_agent_obs(state: EpisodeState, out: GenOutput) -> Observation:
    task: ToolAgentState = state.task
    turn = await task.runner.run_turn(state.last_assistant_text)
    if turn.has_calls:
        return Observation(messages=turn.messages, info=turn.info())
    if task.interaction is None:
        return Observation(done=True)
    # the interaction door (record/tape.py): its reply is recorded, or answered from a recording on replay
    terminate, response, score, _meta = await door(
        "interaction", {"method": "generate_response", "messages": digest(state.messages)},
        lambda: task.interaction.generate_response(task.interaction_id, state.messages, **task.interaction_kwargs),
        encode=list, decode=tuple)
    task.scores.append(float(score))
    if terminate:
        return Observation(done=True, turn_reward=float(score))
    if state.num_turns < state.ctx.max_turns:
        task.feedback_turns += 1
    return Observation(messages=[{"role": "user", "content": response}], turn_reward=float(score))


async def tool_agent_end(state: EpisodeState) -> EpisodeResult:
    task: Optional[ToolAgentState] = state.task
    if task is None:
        return EpisodeResult(0.0, {})
    reward = 0.0
    try:
        await task.runner.close()
        if task.interaction is not None and task.interaction_id is not None:
            reward = float(await door("interaction", {"method": "calculate_score"},
                                      lambda: call_with_instance(task.interaction.calculate_score,
                                                                 task.interaction_id)))
    finally:
        if task.interaction is not None and task.interaction_id is not None:
            await call_with_instance(task.interaction.finalize_interaction, task.interaction_id)
    right = [s >= 1.0 for s in task.scores]
    metrics = {**task.runner.metrics(), "feedback_turns": float(task.feedback_turns),
               "flips_wrong_to_right": float(sum(1 for a, b in zip(right, right[1:]) if not a and b)),
               "flips_right_to_wrong": float(sum(1 for a, b in zip(right, right[1:]) if a and not b))}
    if right:
        metrics["first_correct"] = float(right[0])
        metrics["final_correct"] = float(right[-1])
    return EpisodeResult(reward + task.runner.reward, metrics)


TOOL_AGENT = register_task("tool_agent", TaskSpec(start=tool_agent_start, obs=tool_agent_obs, end=tool_agent_end,
                                                  check_config=ToolAgentConfig.from_dict))
