"""The swedev episode: the model edits a repository in a remote sandbox until hidden tests pass.

Each episode gets its own sandbox from the sandbox service (``python -m verl_agentic.sandbox.server``):

- ``swedev_start`` creates a sandbox of the row's instance (its files; the instance id maps to
  the sandbox as in SWE-style runtimes) and gives the model the tools ``view_file``,
  ``write_file``, ``edit_file``, ``run_command``, ``run_tests`` (``tools.py`` in this folder).
- ``swedev_obs`` parses the assistant turn for tool calls (``parser``, hermes by default),
  runs them in the sandbox in the order written and returns the results as ``tool`` messages.
  A turn without a tool call ends the episode (the model says it is done).
- ``swedev_end`` (always, also after errors and cancellation) reads what the episode changed
  (the submission, stored in the trajectory's ``extra_info.swedev_submission``), runs the
  instance's hidden tests in the sandbox, and destroys the sandbox. Reward: 1.0 when the hidden
  tests pass, else 0.0. The ``swedev`` scorer re-runs the same tests from the submission, so
  ``reward.manager=remote reward.url=<the same service>`` scores the trajectories (or naive/prime).

Failures of the sandbox itself are typed episode errors (``tool_error``, the message starting
with ``swedev:`` and the sandbox error type): no sandbox could be created (the service is down,
or at its ``--max-sandboxes`` cap for longer than ``create_wait_s``: ``too_many_sandboxes``),
or the service went away or restarted mid-episode (``service_unavailable`` / ``sandbox_lost``).
Such episodes carry no submission, so reward managers give them a ``scorer_error`` (masked by
default), not a 0. Errors the model caused (a path outside the repository, a missing file, a
command that fails or hangs past ``command_timeout_s``) are tool messages to the model.

Config (``task.swedev.*``):

- ``url``: the sandbox service, ``http://host:port`` (required).
- ``tools`` (default: all five), ``parser``, ``call_timeout_s`` (default: command_timeout_s + 60),
  ``max_calls_per_turn``, ``parse_feedback``: as in ``tool_agent``.
- ``command_timeout_s`` (10): a ``run_command`` / ``run_tests`` call; ``test_timeout_s`` (30): the
  hidden tests; ``limits``: other ``SandboxLimits`` of the sandbox (``memory_mb``, ...).
- ``max_output_chars`` (4000): tool output the model sees; ``create_wait_s`` (30): how long to
  wait for a free sandbox while the service is at its cap; ``request_timeout_s`` (60): HTTP.

Rows (``PREPROCESS_DATASET["swedev"]``): ``extra_info.swedev`` = ``{instance_id, files: [{path,
content}], test_command}`` (the visible tests, may be null) and ``reward_model.ground_truth`` =
the hidden tests ``{test_files, test_command}`` (``verl_agentic.sandbox.runtime.HiddenTests``).
Raw rows are HumanEval problems (``data/humaneval``: ``solution.py`` holds the signature and
docstring with a ``pass`` body; visible tests: the docstring examples via ``doctest``; hidden:
HumanEval's ``check``), or generic instances ``{instance_id, problem_statement, files,
hidden_tests, test_command?}``.

Metrics: the tool metrics of ``tool_agent`` plus ``hidden_tests_passed``, ``hidden_tests_timeout``,
``files_changed``, ``commands``, ``test_runs``, ``files_written``, ``sandbox_errors``,
``sandbox_destroyed`` (1.0 when the sandbox is gone at the end).
"""

from __future__ import annotations

import copy
import functools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import (
    FINISH_ERROR,
    ConfigError,
    EpisodeError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    GenOutput,
    Observation,
    RolloutContext,
    check_keys,
)
from verl_agentic.isolation import SandboxLimits
from verl_agentic.rollout.task_spec import TaskSpec, register_task
from verl_agentic.sandbox.client import SandboxClient, SandboxError
from verl_agentic.sandbox.runtime import HiddenTests
from verl_agentic.tasks.swedev.data import instance_from_row
from verl_agentic.tasks.swedev.scorer import SUBMISSION_KEY
from verl_agentic.tasks.swedev.tools import SANDBOX_TOOLS, SandboxSession
from verl_agentic.tools.parsers import get_parser
from verl_agentic.tools.runner import ToolRunner, invalid_call_limit


# --- config ----------------------------------------------------------------------------------------
@dataclass
class SwedevConfig:
    url: Optional[str] = None
    tools: list = field(default_factory=lambda: list(SANDBOX_TOOLS))
    parser: str = "hermes"
    call_timeout_s: Optional[float] = None
    max_calls_per_turn: int = 8
    parse_feedback: Optional[str] = None
    max_consecutive_invalid_tool_calls: Optional[int] = None  # null: the rollout's default
    command_timeout_s: float = 10.0
    test_timeout_s: float = 30.0
    max_output_chars: int = 4000
    create_wait_s: float = 30.0
    request_timeout_s: float = 60.0
    limits: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "SwedevConfig":
        check_keys(d, cls.__dataclass_fields__, "task.swedev")
        cfg = cls(**{k: v for k, v in d.items() if v is not None or k in ("call_timeout_s", "parse_feedback")})
        invalid_call_limit(cfg.max_consecutive_invalid_tool_calls, None, "task.swedev")  # checks the value
        if not cfg.url:
            raise ConfigError("task.swedev.url is required: the http://host:port of a sandbox service (start one "
                              "with `python -m verl_agentic.sandbox.server --port 8100`)")
        SandboxClient(cfg.url)  # checks the URL's form
        bad_tools = [t for t in cfg.tools if t not in SANDBOX_TOOLS]
        if bad_tools or not cfg.tools:
            raise ConfigError(f"task.swedev.tools: unknown {bad_tools}; available: {list(SANDBOX_TOOLS)}")
        for key in ("command_timeout_s", "test_timeout_s", "request_timeout_s", "max_output_chars",
                    "max_calls_per_turn"):
            if not isinstance(getattr(cfg, key), (int, float)) or getattr(cfg, key) <= 0:
                raise ConfigError(f"task.swedev.{key} must be > 0, got {getattr(cfg, key)!r}")
        if cfg.create_wait_s < 0:
            raise ConfigError(f"task.swedev.create_wait_s must be >= 0, got {cfg.create_wait_s!r}")
        if not isinstance(cfg.limits, dict) or "wall_timeout_s" in cfg.limits:
            raise ConfigError("task.swedev.limits: an object of SandboxLimits fields other than wall_timeout_s "
                              "(use command_timeout_s / test_timeout_s)")
        SandboxLimits.from_dict({"wall_timeout_s": cfg.command_timeout_s, **cfg.limits})  # names and values
        _components(cfg.key())  # the parser and tools: errors surface now
        return cfg

    @property
    def call_timeout(self) -> float:
        return self.call_timeout_s if self.call_timeout_s else self.command_timeout_s + 60.0

    def key(self) -> str:
        return json.dumps({"tools": self.tools, "parser": self.parser}, sort_keys=True)


@functools.lru_cache(maxsize=32)
def _components(key: str) -> tuple:
    """Tool instances and the parser of a config, once per process (episodes bind their own sessions)."""
    d = json.loads(key)
    return [SANDBOX_TOOLS[name]() for name in d["tools"]], get_parser(d["parser"])


# --- the episode -----------------------------------------------------------------------------------
@dataclass
class SwedevState:
    config: SwedevConfig
    session: SandboxSession
    runner: Any  # ToolRunner
    tests: HiddenTests
    started: float


async def swedev_start(row: dict, ctx: RolloutContext) -> EpisodeState:
    cfg = SwedevConfig.from_dict(dict(ctx.task_config))
    instance, tests = instance_from_row(row)
    tools, parser = _components(cfg.key())
    client = SandboxClient(cfg.url, request_timeout_s=cfg.request_timeout_s)
    try:
        box = await client.create(instance.instance_id, instance.files, key=uuid.uuid4().hex,
                                  limits=cfg.limits or None, wait_s=cfg.create_wait_s)
    except SandboxError as e:
        await client.close()
        raise EpisodeFailure("tool_error", f"swedev: no sandbox for {instance.instance_id!r} from {cfg.url}: {e}"
                             ) from None
    except BaseException:
        await client.close()
        raise
    session = SandboxSession(client, box["sandbox_id"], instance.instance_id, instance.test_command,
                             cfg.command_timeout_s, cfg.max_output_chars)
    runner = ToolRunner(tools, parser, call_timeout_s=cfg.call_timeout, max_calls_per_turn=cfg.max_calls_per_turn,
                        parse_feedback=cfg.parse_feedback,
                        max_consecutive_invalid=invalid_call_limit(cfg.max_consecutive_invalid_tool_calls, ctx,
                                                                   "task.swedev"))
    try:
        await runner.start({t.name: {"session": session} for t in tools})
    except BaseException:
        await runner.close()
        await _destroy(session)
        raise
    # the episode's own copy of the row: end() adds the submission to its extra_info (the trajectory's)
    extra = {k: v for k, v in (row.get("extra_info") or {}).items() if k != SUBMISSION_KEY}
    episode_row = {**row, "extra_info": extra}
    return EpisodeState(row=episode_row, messages=copy.deepcopy(list(row["prompt"])), ctx=ctx,
                        tools=runner.schemas(), task=SwedevState(cfg, session, runner, tests, time.perf_counter()))


def _sandbox_failure(task: SwedevState, what: str) -> str:
    return f"swedev: {what} of {task.session.instance_id!r} (sandbox {task.session.sandbox_id}): {task.session.fatal}"


async def swedev_obs(state: EpisodeState, out: GenOutput) -> Observation:
    task: SwedevState = state.task
    turn = await task.runner.run_turn(state.last_assistant_text)
    if task.session.fatal is not None:
        raise EpisodeFailure("tool_error", _sandbox_failure(task, "the sandbox failed during a tool call"))
    if turn.has_calls:
        return Observation(messages=turn.messages, info=turn.info())
    return Observation(done=True)


async def _destroy(session: SandboxSession) -> bool:
    """Destroy the sandbox (True also when it is already gone) and close the client."""
    try:
        await session.client.destroy(session.sandbox_id)
        return True
    except SandboxError:
        return False
    finally:
        await session.client.close()


async def swedev_end(state: EpisodeState) -> EpisodeResult:
    task: Optional[SwedevState] = state.task
    if task is None:
        return EpisodeResult(0.0, {})
    session, metrics, reward = task.session, {}, 0.0
    try:
        await task.runner.close()
        cancelled = state.error is not None and state.error.type == "cancelled"
        if session.fatal is None and not cancelled:  # a cancelled rollout only cleans up
            try:
                changes = await session.client.changes(session.sandbox_id)
                state.row["extra_info"][SUBMISSION_KEY] = changes
                result = await session.client.run_hidden_tests(session.sandbox_id, task.tests,
                                                               task.config.test_timeout_s)
                reward = float(result.passed)
                metrics.update(hidden_tests_passed=float(result.passed), hidden_tests_timeout=float(result.timed_out),
                               files_changed=float(len(changes["files"]) + len(changes["deleted"])))
            except SandboxError as e:
                session.fatal = e
                if state.error is None:  # the episode itself went fine: this is its failure
                    state.error = EpisodeError("tool_error", _sandbox_failure(task, "the hidden tests could not run"))
                    state.finish_reason = FINISH_ERROR
    finally:
        metrics["sandbox_destroyed"] = float(await _destroy(session))
    metrics.update(task.runner.metrics())
    metrics.update({k: float(v) for k, v in session.counts.items()})
    metrics["sandbox_errors"] = float(session.fatal is not None)
    metrics["sandbox_s"] = time.perf_counter() - task.started
    return EpisodeResult(reward, metrics)


SWEDEV = register_task("swedev", TaskSpec(start=swedev_start, obs=swedev_obs, end=swedev_end,
                                          check_config=SwedevConfig.from_dict))
