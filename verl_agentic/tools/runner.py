"""Runs an episode's tool calls: parse the assistant text, execute the calls, count what happened.

One ``ToolRunner`` per episode::

    runner = ToolRunner(tools, parser="hermes", call_timeout_s=10)
    await runner.start(tools_kwargs)              # create() every tool for this episode
    turn = await runner.run_turn(assistant_text)  # -> TurnResult(messages, calls, parse_errors)
    ...
    await runner.close()                          # release() every tool, always

Several calls of one turn run concurrently, each under ``call_timeout_s``. A call to an unknown
tool, with missing arguments, that raises, or that times out returns an error message to the
model (it is not an episode failure) and is counted. A turn whose markup cannot be parsed gets
the parser's feedback message and counts as a parse error.

The invalid-tool-call policy: with ``max_consecutive_invalid`` = n, the n-th invalid call in a row
(a call to an unknown tool, or markup that does not parse; a turn's parse failures count after its
calls, and a call to a known tool resets the count) ends the episode: ``run_turn`` raises
``EpisodeFailure("invalid_tool_calls", ...)`` with the turn's facts, and the loop ends the episode
with ``finish_reason="invalid_tool_calls"``. ``invalid_call_limit`` resolves n from a task's config
key ``max_consecutive_invalid_tool_calls`` and the rollout's default of the same name.

Metrics (summed over the episode): ``tool_calls``, ``tool_ok``, ``tool_error``, ``tool_timeout``,
``parse_errors``, ``invalid_tool_calls`` (unknown tools + parse failures), ``tool_turns``;
``tool_reward`` sums the tools' step rewards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError, EpisodeFailure, RolloutContext
from verl_agentic.record.tape import door
from verl_agentic.tools.base import BaseTool, ToolResult
from verl_agentic.tools.parsers import get_parser

logger = logging.getLogger(__name__)


@dataclass
class TurnResult:
    messages: list[dict]  # tool messages (and a parse-feedback message) to append
    calls: list = field(default_factory=list)  # parsed ToolCalls
    results: list[ToolResult] = field(default_factory=list)
    parse_errors: list = field(default_factory=list)
    invalid: int = 0  # calls to unknown tools + unparseable calls

    @property
    def has_calls(self) -> bool:
        return bool(self.calls) or bool(self.parse_errors)

    def info(self) -> dict[str, Any]:
        """This turn's tool facts for ``Observation.info``: each run call's name, status
        (``ok`` | ``error`` | ``timeout``) and step reward (when not 0), and the count of unparseable
        calls; empty without calls."""
        out: dict[str, Any] = {}
        if self.calls:
            out["tool_calls"] = [{"name": c.name, "status": r.status, **({"reward": r.reward} if r.reward else {})}
                                 for c, r in zip(self.calls, self.results)]
        if self.parse_errors:
            out["parse_errors"] = len(self.parse_errors)
        if self.invalid:
            out["invalid_calls"] = self.invalid
        return out


def invalid_call_limit(task_value: Optional[int], ctx: Optional[RolloutContext], section: str) -> Optional[int]:
    """The episode's ``max_consecutive_invalid_tool_calls``: the task config's (``section``) when set,
    else the rollout's default (``ctx``); None or 0: no limit."""
    value = task_value if task_value is not None else getattr(ctx, "max_consecutive_invalid_tool_calls", None)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ConfigError(f"{section}.max_consecutive_invalid_tool_calls must be an integer >= 0 (0: no limit) "
                          f"or null, got {value!r}")
    return value or None


class ToolRunner:
    def __init__(self, tools: list[BaseTool], parser: Any = "hermes", *, call_timeout_s: Optional[float] = 30.0,
                 max_calls_per_turn: int = 8, parse_feedback: Optional[str] = None,
                 max_consecutive_invalid: Optional[int] = None):
        self.tools = {t.name: t for t in tools}
        self.parser = get_parser(parser) if isinstance(parser, str) else parser
        self.call_timeout_s = call_timeout_s
        self.max_calls_per_turn = max_calls_per_turn
        self.parse_feedback = parse_feedback
        self.instance_ids: dict[str, str] = {}
        self.counts: Counter = Counter()
        self.reward = 0.0
        self.episode_id = uuid.uuid4().hex
        self.max_consecutive_invalid = max_consecutive_invalid
        self.invalid_streak = 0  # invalid calls in a row so far

    def schemas(self) -> list[dict]:
        return [t.get_openai_tool_schema() for t in self.tools.values()]

    async def start(self, tools_kwargs: Optional[dict] = None) -> None:
        """``create`` every tool; ``tools_kwargs[name]`` (verl's per-sample ``create_kwargs``) goes to it."""
        for name, t in self.tools.items():
            kwargs = (tools_kwargs or {}).get(name) or {}
            kwargs = kwargs.get("create_kwargs", kwargs) if isinstance(kwargs, dict) else {}
            self.instance_ids[name] = await t.create(f"{self.episode_id}-{name}", **kwargs)

    def _release_error(self, name: str, step: str, error: Exception) -> None:
        self.counts["tool_release_error"] += 1
        logger.warning("tool %r: %s failed at the end of episode %s (counted in tool_release_error): %s: %s",
                       name, step, self.episode_id, type(error).__name__, error)

    async def close(self) -> None:
        """``release`` every created tool (errors are swallowed: release must not mask the episode)."""
        for name, iid in list(self.instance_ids.items()):
            try:
                self.reward += await door("tool_reward", {"name": name},
                                          lambda: self._calc_reward(self.tools[name], iid))
            except Exception as e:  # counted and logged: a tool's reward must not mask the episode's result
                self._release_error(name, "calc_reward", e)
            try:
                await self.tools[name].release(iid)
            except Exception as e:  # counted and logged: a tool's release must not mask the episode's result
                self._release_error(name, "release", e)
        self.instance_ids.clear()

    async def _call(self, call: Any) -> ToolResult:
        t = self.tools.get(call.name)
        if t is None:
            return ToolResult(f"Error: unknown tool {call.name!r}. Available tools: {', '.join(sorted(self.tools))}",
                              status="error")
        missing = [a for a in t.required_arguments() if a not in call.arguments]
        if missing:
            return ToolResult(f"Error: {call.name} is missing required arguments {missing}", status="error")
        # the tool door (record/tape.py): recorded, or answered from a recording on replay
        return await door("tool", {"name": call.name, "arguments": call.arguments}, lambda: self._execute(t, call),
                          encode=dataclasses.asdict, decode=lambda d: ToolResult(**d),
                          compared=lambda d: {k: d[k] for k in ("text", "status", "reward")})

    async def _execute(self, t: BaseTool, call: Any) -> ToolResult:
        t0 = time.perf_counter()
        try:
            out = await asyncio.wait_for(t.execute(self.instance_ids[call.name], call.arguments),
                                         self.call_timeout_s)
            result = ToolResult.coerce(out)
        except asyncio.TimeoutError:
            result = ToolResult(f"Error: {call.name} timed out after {self.call_timeout_s} s", status="timeout")
        except Exception as e:  # a crashing tool is reported to the model and counted, never fatal
            result = ToolResult(f"Error: {call.name} raised {type(e).__name__}: {str(e)[:500]}", status="error")
        result.metrics.setdefault("latency_s", time.perf_counter() - t0)
        return result

    @staticmethod
    async def _calc_reward(t: BaseTool, instance_id: str) -> float:
        return float(await t.calc_reward(instance_id) or 0.0)

    async def run_turn(self, text: str) -> TurnResult:
        """Parse ``text`` and execute its calls; the messages to append (empty: no calls)."""
        parsed = self.parser.parse(text)
        calls = parsed.calls[: self.max_calls_per_turn]
        messages: list[dict] = []
        results: list[ToolResult] = []
        if calls:
            self.counts["tool_turns"] += 1
            results = list(await asyncio.gather(*(self._call(c) for c in calls)))
            for c, r in zip(calls, results):
                self.counts["tool_calls"] += 1
                self.counts[f"tool_{r.status}"] += 1
                self.reward += r.reward
                msg = {"role": "tool", "name": c.name, "content": r.text}
                if getattr(c, "id", None):
                    msg["tool_call_id"] = c.id
                messages.append(msg)
            if len(parsed.calls) > len(calls):
                messages[-1]["content"] += (f"\n(Only the first {self.max_calls_per_turn} tool calls of a turn "
                                            f"are run; {len(parsed.calls) - len(calls)} were ignored.)")
        if parsed.errors:
            self.counts["parse_errors"] += len(parsed.errors)
            feedback = self.parse_feedback or self.parser.feedback_message(parsed.errors)
            messages.append({"role": "user", "content": feedback})
        turn = TurnResult(messages, calls, results, parsed.errors)
        self._count_invalid(turn)
        return turn

    def _count_invalid(self, turn: TurnResult) -> None:
        """Update the run of invalid calls; at ``max_consecutive_invalid`` end the episode (module docstring)."""
        for c in turn.calls:
            if c.name in self.tools:
                self.invalid_streak = 0
            else:
                self.invalid_streak += 1
                turn.invalid += 1
        self.invalid_streak += len(turn.parse_errors)
        turn.invalid += len(turn.parse_errors)
        self.counts["invalid_tool_calls"] += turn.invalid
        limit = self.max_consecutive_invalid
        if limit and turn.invalid and self.invalid_streak >= limit:
            what = sorted({f"unknown tool {c.name!r}" for c in turn.calls if c.name not in self.tools}
                          | {f"unparseable call ({e.type})" for e in turn.parse_errors})
            raise EpisodeFailure("invalid_tool_calls",
                                 f"{self.invalid_streak} invalid tool calls in a row (max_consecutive_invalid_tool_calls="
                                 f"{limit}); the last turn's: {', '.join(what)}", info=turn.info())

    def metrics(self) -> dict[str, float]:
        m = {k: float(self.counts.get(k, 0)) for k in ("tool_calls", "tool_ok", "tool_error", "tool_timeout",
                                                     "parse_errors", "invalid_tool_calls", "tool_turns")}
        m["tool_reward"] = self.reward
        return m


def tools_system_block(tools: list[dict]) -> str:
    """A hermes-style system prompt that describes ``tools``, for chat templates without ``tools=``."""
    lines = ["# Tools", "", "You may call one or more functions to assist with the user query.", "",
             "You are provided with function signatures within <tools></tools> XML tags:", "<tools>"]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines += ["</tools>", "", "For each function call, return a json object with function name and arguments "
              "within <tool_call></tool_call> XML tags:", "<tool_call>",
              '{"name": <function-name>, "arguments": <args-json-object>}', "</tool_call>"]
    return "\n".join(lines)
