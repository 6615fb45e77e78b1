"""``task_agent``: any registered verl_agentic task as a verl agent loop.

Registered in verl's agent-loop registry when verl loads the plugin (``import verl``, entry point
group ``verl.plugins``). Select it for every row with
``actor_rollout_ref.rollout.agent.default_agent_loop=task_agent`` (or per row with an
``agent_name`` column). Each sample runs the task its ``task_type`` names, through the task's
own loop (``ids_agent_loop`` unless the task replaces it), with verl's ``server_manager`` as the
generation backend (``verl_plugin.backend.ServerManagerBackend``); the trajectory becomes an
``AgentLoopOutput`` (``verl_plugin.convert``).

Settings, from the trainer config's top-level ``agentic`` section (``+agentic.*`` on the command
line: verl's config is in struct mode) and, per agent name, from an agent-loop YAML entry's
``agentic`` mapping (``actor_rollout_ref.rollout.agent.agent_loop_config_path``; it wins over
the command line, deep-merged)::

    python -m verl.trainer.main_ppo ... \\
        actor_rollout_ref.rollout.agent.default_agent_loop=task_agent \\
        +agentic.task_type=gsm8k +agentic.task.gsm8k.feedback=verify +agentic.max_turns=3

- ``imports``: your modules (``+agentic.imports=[my_tasks]``), imported in every agent-loop worker
  before a task is looked up, and by our reward managers in every reward-loop worker (and prime's
  processes) as ``scorer_modules``: a task and its scorer in a module of your own, no package needed.
- ``task_type``: the task of rows without a ``task_type`` column value (a row's own wins).
- ``task``: ``{task_type: {key: value}}``, each task's config section, exactly what
  ``task.<name>`` is in ``python -m verl_agentic.main_rollout`` (e.g. gsm8k's ``feedback``,
  ``extraction``, ``tools``, ``interaction``, ``parser``). Checked by the task's
  ``check_config`` once per process.
- ``max_turns``: assistant turns per episode (default: verl's
  ``rollout.multi_turn.max_assistant_turns``, else 3). verl's ``rollout.multi_turn.max_user_turns``
  (when set) bounds the user turns (feedback, interaction replies; tool results are not user
  turns): an observation that would add one more ends the episode instead, unsent.
- ``max_new_tokens``: tokens per assistant turn (default: ``rollout.response_length``).
- ``episode_timeout_s``: wall-clock limit of an episode (typed ``timeout`` error; default none).
- ``max_consecutive_invalid_tool_calls``: the default of tasks with tools (a task's own key of the
  same name wins): at that many invalid tool calls in a row (unparseable markup or unknown tools) the
  episode ends with ``finish_reason="invalid_tool_calls"`` and that error type (kept for training;
  counted per data source in validation as ``invalid_tool_call_stop``). Default none.
- ``monitors``: the reward-hacking and collapse monitors of verl's trainer (``verl_plugin/monitors.py``;
  not read by the loop, checked here with the rest).
- ``turn_rewards``: put each assistant turn's own reward (the task's ``turn_reward``) on that turn's
  last generated token in verl's token-level rewards, besides the episode's score on the last token
  (the rule of ``main_ppo``'s ``algorithm.turn_rewards``; ``verl_plugin/turn_rewards.py``); off by
  default (verl then sees the outcome only).
- ``record``: record every episode for replay (``python -m verl_agentic.replay``, docs/replay.md) into
  ``<rollout_data_dir>/recordings/step_NNNNNN/`` (validation: ``recordings_val/``), beside the dump;
  needs ``trainer.rollout_data_dir``. Default false.
- ``raise_on_errors``: episode error types that fail the sample instead of training on what it
  generated (default ``[generation_error]``: a server failure). verl's v1 trainer then drops the
  sample's group; the legacy trainer stops. An episode whose prompt could not be built
  (``start`` or the chat template failed) always fails the sample: there is nothing to train on.

Token budget: verl's ``rollout.response_length`` bounds the response (every turn, injected
tokens included), ``rollout.prompt_length`` the prompt. Each episode's budget is set to its
prompt's length plus ``response_length`` as soon as its prompt is known, so our loop's context
rule (turns shrink to the budget left; an observation that does not fit ends the episode with
``finish_reason=length`` and a ``context_overflow`` error) keeps the response within
``response_length`` exactly; nothing is cut after the fact. A prompt longer than
``prompt_length`` ends the episode at once with ``context_overflow``.

Sampling: verl's sampling dict (temperature, top-p, top-k, ``logprobs`` =
``rollout.calculate_log_probs``; the validation values in validation) applies to every turn;
the model's EOS ids are sent as ``stop_token_ids``. Chat template kwargs are verl's
``data.apply_chat_template_kwargs`` (the dataset uses them to filter long prompts, too).

Trajectory dump: with ``trainer.rollout_data_dir`` set, every episode is also appended, in our dump
schema (token ids as generated, ``response_mask``, logprobs, turns, messages), to
``<rollout_data_dir>/rollouts/step_NNNNNN.jsonl`` (validation: ``rollouts_val/``, under
``trainer.validation_data_dir`` when set), so ``python -m verl_agentic.inspect <rollout_data_dir>``
reads a verl run (see ``TaskAgentLoop._dump``).

verl's tools: ``rollout.multi_turn.tool_config_path`` (a YAML of verl ``BaseTool`` subclasses) and
``rollout.multi_turn.function_tool_path`` (a file of ``@function_tool`` functions), the keys of verl's
``tool_agent``, become the task's ``tool_config_path`` / ``function_tool_path`` (``tasks/tool_agent.py``;
a task's own ``agentic.task.<name>`` key wins), resolved as verl resolves them. The tasks with tools
(``tool_agent``, ``gsm8k``) take them; any other task refuses them by name. Each tool's per-call
reward is the sample's ``tool_rewards`` (verl's column); see docs/tools-and-interactions.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.utils.import_utils import resolve_config_path
from verl.utils.rollout_trace import rollout_trace_op

from verl_agentic.backends.base import eos_ids
from verl_agentic.interfaces import (
    ERROR_TYPES,
    ConfigError,
    EpisodeFailure,
    EpisodeState,
    RolloutContext,
    SamplingParams,
    UnknownKeysError,
    parse_section,
)
from verl_agentic.jsonl import JsonLinesAppender
from verl_agentic.monitors import MonitorsConfig
from verl_agentic.record import RecordingWriters, Tape, recording_header, taped, using
from verl_agentic.registry import import_modules
from verl_agentic.verl_plugin import upstream
from verl_agentic.verl_plugin.backend import ServerManagerBackend
from verl_agentic.verl_plugin.convert import plain, to_agent_loop_output

logger = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 3
VERL_TOOL_KEYS = ("tool_config_path", "function_tool_path")  # verl's rollout.multi_turn keys, the tasks' keys

__all__ = ["TaskAgentLoop", "TaskAgentSettings", "TaskAgentError"]


class TaskAgentError(RuntimeError):
    """A sample that cannot be trained on (see ``raise_on_errors``); names the sample and the error."""


@dataclass
class TaskAgentSettings:
    """The ``agentic`` settings of the ``task_agent`` loop (see the module docstring)."""

    task_type: Optional[str] = None
    task: dict = field(default_factory=dict)
    max_turns: Optional[int] = None
    max_new_tokens: Optional[int] = None
    episode_timeout_s: Optional[float] = None
    max_consecutive_invalid_tool_calls: Optional[int] = None  # the rollout's default for tasks with tools
    raise_on_errors: tuple = ("generation_error",)
    monitors: dict = field(default_factory=dict)  # the trainer's monitors (verl_plugin/monitors.py), not the loop's
    turn_rewards: bool = False
    imports: list = field(default_factory=list)  # the user's modules, imported before a task is looked up
    record: bool = False  # record every episode for replay, beside the dump (see the module docstring)

    @classmethod
    def from_sources(cls, trainer_section: Any = None, loop_section: Any = None) -> "TaskAgentSettings":
        """Deep-merge the trainer config's ``agentic`` and an agent-loop YAML entry's ``agentic``
        (the latter wins) and check them; a bad key or value is a ``ConfigError`` naming it."""
        from omegaconf import OmegaConf

        sections = []
        for where, section in (("agentic", trainer_section), ("agentic (agent-loop YAML entry)", loop_section)):
            section = plain(section)
            if section is None:
                continue
            if not isinstance(section, dict):
                raise ConfigError(f"{where} must be a mapping of settings, got {type(section).__name__}: {section!r}")
            unknown = set(section) - set(cls.__dataclass_fields__)
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
            sections.append(OmegaConf.create(section))
        merged = plain(OmegaConf.merge(*sections)) if sections else {}
        settings = cls(**merged)
        settings._check()
        return settings

    def _check(self) -> None:
        # first: the user's modules register the tasks (and scorers) named below, in this agent-loop worker
        self.imports = [m.__name__ for m in import_modules(self.imports, "agentic.imports")]
        if self.task_type is not None and (not isinstance(self.task_type, str) or not self.task_type):
            raise ConfigError(f"agentic.task_type must be a task name, got {self.task_type!r}")
        if not isinstance(self.task, dict) or not all(isinstance(v, dict) for v in self.task.values()):
            raise ConfigError(f"agentic.task must map task names to their config sections, got {self.task!r}")
        for name in ("max_turns", "max_new_tokens"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"agentic.{name} must be an integer >= 1, got {value!r}")
        if self.episode_timeout_s is not None and not (
                isinstance(self.episode_timeout_s, (int, float)) and self.episode_timeout_s > 0):
            raise ConfigError(f"agentic.episode_timeout_s must be a number > 0, got {self.episode_timeout_s!r}")
        for name in ("turn_rewards", "record"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"agentic.{name} must be true or false, got {getattr(self, name)!r}")
        if isinstance(self.raise_on_errors, str):
            raise ConfigError(f"agentic.raise_on_errors must be a list of error types, got {self.raise_on_errors!r}")
        bad = sorted(set(self.raise_on_errors) - set(ERROR_TYPES))
        if bad:
            raise ConfigError(f"agentic.raise_on_errors: unknown error types {bad}; known: {list(ERROR_TYPES)}")
        self.raise_on_errors = tuple(self.raise_on_errors)
        parse_section(MonitorsConfig, self.monitors, "agentic.monitors")
        limit = self.max_consecutive_invalid_tool_calls
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ConfigError(f"agentic.max_consecutive_invalid_tool_calls must be an integer >= 0 (0: no limit), "
                              f"got {limit!r}")


# --------------------------------------------------------------------------------------------
# once per process: task config checks, the model's stop ids

_CHECKED: set[str] = set()
_CHECKED_LOCK = threading.Lock()
_KEPT_ERRORS = 0  # episodes that ended with an error and were kept (logged sparsely)
_RECORDERS = RecordingWriters(max_open=8)  # agentic.record: a writer per recordings folder, per process


def check_task_config(name: str, spec: Any, task_config: dict) -> None:
    if spec.check_config is None:
        return
    key = f"{name}:{json.dumps(task_config, sort_keys=True, default=str)}"
    with _CHECKED_LOCK:
        if key in _CHECKED:
            return
    try:
        spec.check_config(dict(task_config))
    except ConfigError as e:
        unknown = e.unknown if isinstance(e, UnknownKeysError) else []
        verl_keys = [k for k in VERL_TOOL_KEYS if k in unknown]
        hint = (f" ({' / '.join(verl_keys)}: from verl's actor_rollout_ref.rollout.multi_turn keys; only tasks with "
                "tools take them, e.g. tool_agent and gsm8k: unset them or pick such a task)") if verl_keys else ""
        raise ConfigError(f"agentic.task.{name}: {e}{hint}") from None
    with _CHECKED_LOCK:
        _CHECKED.add(key)


def task_section(settings: TaskAgentSettings, rollout_config: Any, name: str) -> dict:
    """The task's ``agentic.task.<name>`` section, with verl's tool keys (``rollout.multi_turn.
    tool_config_path`` / ``function_tool_path``) as its ``tool_config_path`` / ``function_tool_path``
    where the section has none (see the module docstring)."""
    config = dict(settings.task.get(name, {}))
    multi_turn = rollout_config.get("multi_turn") or {}
    for key in VERL_TOOL_KEYS:
        if multi_turn.get(key) and config.get(key) is None:
            config[key] = resolve_config_path(str(multi_turn[key]))
    return config


@functools.lru_cache(maxsize=8)
def _generation_config_eos(config_path: str, use_shm: bool, trust_remote_code: bool) -> tuple[int, ...]:
    """EOS ids of the model's generation config (or its config), as verl's ``HFModelConfig`` loads it."""
    from verl.utils.fs import copy_to_local
    from verl.utils.model import get_generation_config

    gen = get_generation_config(copy_to_local(config_path, use_shm=use_shm), trust_remote_code=trust_remote_code)
    return tuple(eos_ids(getattr(gen, "eos_token_id", None)))


def model_stop_token_ids(model_config: Any, tokenizer: Any) -> list[int]:
    """The ids a server stops on: the generation config's EOS ids and the tokenizer's EOS id."""
    path = model_config.get("hf_config_path") or model_config.get("path")
    ids = eos_ids(*_generation_config_eos(str(path), bool(model_config.get("use_shm", False)),
                                          bool(model_config.get("trust_remote_code", False))),
                  tokenizer.eos_token_id)
    if not ids:
        raise ConfigError(f"model {path!r}: no EOS token id in its generation config, config or tokenizer; "
                          "the task_agent loop cannot tell where a turn ends")
    return ids


# --------------------------------------------------------------------------------------------
# the loop


class _EpisodeHooks:
    """Wraps a task's ``start`` and ``obs`` for one episode inside verl.

    ``start``: once the task has built the conversation, its prompt length sets the episode's
    token budget (prompt + ``response_length``; see the module docstring). The prompt is
    rendered here once more than the loop renders it (a few milliseconds), so that the budget
    is exact before the first turn. ``obs``: its wall time is verl's ``tool_calls`` metric.
    """

    def __init__(self, spec: Any, template: Any, limits: Any, prompt_length: int, response_length: int,
                 max_user_turns: Optional[int] = None):
        self.spec = spec
        self.max_user_turns = max_user_turns
        self.user_turns = 0
        self.template = template
        self.limits = limits
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.prompt_tokens: Optional[int] = None
        self.obs_s = 0.0

    async def start(self, row: dict, ctx: RolloutContext) -> Any:
        # the plugin is imported by `import verl` in every verl process: the rest loads on first use
        from verl_agentic.rollout.loops import maybe_await

        state = await maybe_await(self.spec.start(row, ctx))
        if isinstance(state, EpisodeState):
            try:
                n = len(self.template.prompt_ids(state.messages, state.tools))
            except EpisodeFailure:
                return state  # the loop renders it again, records the template error and runs end()
            self.prompt_tokens = n
            # too long: a budget of n makes the loop end the episode on its prompt (and still run end())
            self.limits.max_total_tokens = n + self.response_length if n <= self.prompt_length else n
        return state

    async def obs(self, state: EpisodeState, out: Any) -> Any:
        # the plugin is imported by `import verl` in every verl process: the rest loads on first use
        from verl_agentic.rollout.loops import maybe_await

        t0 = time.perf_counter()
        try:
            ob = await maybe_await(self.spec.obs(state, out))
        finally:
            self.obs_s += time.perf_counter() - t0
        # verl's rollout.multi_turn.max_user_turns: feedback (user) turns beyond it end the episode
        if self.max_user_turns is not None and not ob.done and any(m.get("role") == "user" for m in ob.messages):
            if self.user_turns >= self.max_user_turns:
                return dataclasses.replace(ob, messages=[], done=True)
            self.user_turns += 1
        return ob


@register("task_agent")
class TaskAgentLoop(AgentLoopBase):
    """Runs the row's verl_agentic task (``task_type``) through verl's server manager.

    verl builds one instance per sample (``hydra.utils.instantiate`` of the registry entry,
    plus the entry's own keys: ``agentic`` from an agent-loop YAML, see the module docstring).
    """

    def __init__(self, *args: Any, tools: Any = None, agentic: Any = None, name: Optional[str] = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.agent_name = name or "task_agent"
        self.settings = TaskAgentSettings.from_sources(self.config.get("agentic"), agentic)
        reward_model = (self.config.get("reward") or {}).get("reward_model") or {}
        if self.settings.turn_rewards and reward_model.get("enable") and not reward_model.get("enable_resource_pool"):
            raise ConfigError("agentic.turn_rewards needs verl's streaming reward (rule-based rewards, or a reward "
                              "model with reward.reward_model.enable_resource_pool=true); a colocated reward model "
                              "scores after the rollout, where the per-turn rewards cannot be added")
        if self.settings.turn_rewards and not upstream.apply("turn_rewards"):
            raise ConfigError(f"agentic.turn_rewards needs verl's AgentLoopOutput.as_dict wrapped, and the registry "
                              f"did not apply it: {upstream.status(upstream.BY_NAME['turn_rewards'])}")
        if self.settings.record and not (self.config.get("trainer") or {}).get("rollout_data_dir"):
            raise ConfigError("agentic.record needs trainer.rollout_data_dir: the recordings go beside the "
                              "trajectory dump (<rollout_data_dir>/recordings/step_NNNNNN/)")
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)
        # ``tools``: verl's worker loaded them from rollout.multi_turn; the task loads the same files
        # itself (``_task_config``) and runs them per episode through our ToolRunner

    # -- the row --------------------------------------------------------------------------
    @staticmethod
    def _describe(kwargs: dict) -> str:
        return (f"sample index={plain(kwargs.get('index'))!r} uid={plain(kwargs.get('uid'))!r} "
                f"data_source={plain(kwargs.get('data_source'))!r}")

    def _row(self, kwargs: dict) -> dict:
        """The dataset row as our tasks read it: verl's columns, with ``prompt`` = verl's
        ``raw_prompt`` (the chat messages RLHFDataset built from ``data.prompt_key``)."""
        if kwargs.get("raw_prompt") is None:
            raise ConfigError(f"{self._describe(kwargs)}: no 'raw_prompt' (verl's RLHFDataset provides it: keep "
                              "data.return_raw_chat=true)")
        row = {k: plain(v) for k, v in kwargs.items() if k != "raw_prompt"}
        row["prompt"] = [dict(m) for m in plain(kwargs["raw_prompt"])]
        return row

    def _task(self, row: dict, kwargs: dict) -> tuple[str, Any]:
        # the plugin is imported by `import verl` in every verl process: the rest loads on first use
        from verl_agentic.rollout.task_spec import TASKS

        name = row.get("task_type") or self.settings.task_type
        if not name:
            raise ConfigError(f"{self._describe(kwargs)} has no 'task_type' and agentic.task_type is not set "
                              f"(+agentic.task_type=NAME); registered tasks: {', '.join(TASKS.names())}")
        try:
            spec = TASKS.get(str(name))
        except ConfigError as e:
            raise ConfigError(f"{self._describe(kwargs)}: {e}") from None
        check_task_config(str(name), spec, self._task_config(str(name)))
        return str(name), spec

    def _task_config(self, name: str) -> dict:
        return task_section(self.settings, self.rollout_config, name)

    # -- verl entry point -------------------------------------------------------------------
    @rollout_trace_op
    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        # imported on first use, not with the plugin: the plugin loads in every process that imports verl
        from verl_agentic.rollout.loops import LoopLimits
        from verl_agentic.rollout.template import ChatTemplate
        from verl_agentic.rollout.trajectory import build_trajectory, training_rows

        started = time.time()
        row = self._row(kwargs)
        task_type, spec = self._task(row, kwargs)
        multi_turn = self.rollout_config.get("multi_turn") or {}
        max_turns = self.settings.max_turns or multi_turn.get("max_assistant_turns") or DEFAULT_MAX_TURNS
        sample_id = int(plain(kwargs.get("session_id", 0)) or 0)  # verl's v1 trainer: which of the n samples
        index = plain(kwargs.get("index", 0))
        ctx = RolloutContext(tokenizer=self.tokenizer, task_config=self._task_config(task_type),
                             sample_index=sample_id, max_turns=int(max_turns),
                             max_consecutive_invalid_tool_calls=self.settings.max_consecutive_invalid_tool_calls,
                             max_total_tokens=self.prompt_length + self.response_length)
        sampling = SamplingParams(
            max_new_tokens=self.settings.max_new_tokens or self.response_length,
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)), top_k=int(sampling_params.get("top_k", -1)),
        )
        # verl's loops: one request id per episode (sticky session), fixed under full determinism
        request_id = (f"det-{plain(kwargs.get('priority', 0))}" if self.rollout_config.get("full_determinism")
                      else uuid.uuid4().hex)
        backend = ServerManagerBackend(
            self.server_manager, self.tokenizer,
            model_stop_token_ids(self.config.actor_rollout_ref.model, self.tokenizer),
            base_params=sampling_params, request_id=request_id,
            generate_kwargs={"priority": int(plain(kwargs["priority"]))} if "priority" in kwargs else None,
        )
        limits = LoopLimits(int(max_turns), self.prompt_length + self.response_length, self.settings.episode_timeout_s)
        template = ChatTemplate(self.tokenizer, plain(self.apply_chat_template_kwargs) or {})
        max_user_turns = multi_turn.get("max_user_turns")
        hooks = _EpisodeHooks(spec, template, limits, self.prompt_length, self.response_length,
                              None if max_user_turns is None else int(max_user_turns))
        task = dataclasses.replace(spec, start=hooks.start, obs=hooks.obs)

        tape = Tape("record") if self.settings.record else None
        with using(tape):
            state, result = await spec.loop(task, row, ctx, backend if tape is None else taped(backend, tape),
                                            sampling, limits, template)
        traj = build_trajectory(state, result, uid=str(row.get("uid") or f"{task_type}-{index}"),
                                task_type=task_type, index=int(index or 0), sample_id=sample_id, scorer=spec.scorer)
        rows = training_rows(traj)
        refusal = self._rows_refusal(rows) if len(rows) > 1 and traj["error"] is None else None
        if refusal is not None:  # the sample keeps the episode's last row and says why
            traj["error"] = {"type": "task_error", "message": (
                f"the episode made {len(rows)} training rows (its agent changed the conversation's history) and "
                f"{refusal}: set task.<name>.split_rows=false to refuse such requests instead, or train with main_ppo")}
            traj["finish_reason"] = "error"
        if traj["error"] is not None:
            rows = [traj]
        if tape is not None:  # before the errors are checked: an episode that fails its sample is recorded too
            self._record(tape, traj, backend, sampling_params, row=row, ctx=ctx, sampling=sampling, limits=limits,
                         episode_id=request_id)
        self._check_errors(traj, hooks, kwargs)

        self._dump(traj, backend, sampling_params, started)

        metrics = AgentLoopMetrics(generate_sequences=backend.generate_s, tool_calls=hooks.obs_s,
                                   num_preempted=-1 if backend.num_preempted is None else backend.num_preempted)
        # an episode of several rows: one output per row, in order (verl's v1 worker stores each under
        # {uid}_{session}_{row} and gives the earlier rows the last one's reward); the episode's timings
        # are counted once, on its last row
        outputs = [to_agent_loop_output(
            row, prompt_length=self.prompt_length, response_length=self.response_length,
            logprobs_expected=bool(sampling_params.get("logprobs", False)),
            metrics=metrics if row is rows[-1] else AgentLoopMetrics(),
            extra_fields={"min_global_steps": backend.min_global_steps, "max_global_steps": backend.max_global_steps},
            turn_rewards=self.settings.turn_rewards,
        ) for row in rows]
        return outputs[0] if len(outputs) == 1 else outputs

    def _rows_refusal(self, rows: list[dict]) -> Optional[str]:
        """Why verl's trainer cannot train this episode's rows as they are (None: it can). verl 0.9.1's v1
        trainer (the default, ``trainer.use_v1``) takes a list of outputs per sample and, for
        ``algorithm.adv_estimator=grpo`` only, computes the advantage once per sample from its last row and
        gives it to every row (``compute_advantage_for_multi_trajectories``); its other estimators would
        count each row as a sample of its own but ``turn_loo`` (``turn_loo_rows.py`` joins them), and the
        legacy trainer takes one output per sample."""
        trainer = self.config.get("trainer") or {}
        if not trainer.get("use_v1", True):
            return "verl's legacy trainer (trainer.use_v1=false) takes one row per episode"
        estimator = (self.config.get("algorithm") or {}).get("adv_estimator")
        estimator = str(getattr(estimator, "value", estimator))
        if estimator == "turn_loo":  # joined by our wrap of verl's function in the trainer (turn_loo_rows.py)
            on, why = upstream.state(upstream.BY_NAME["turn_loo_rows"])
            if not on:
                return f"the turn_loo_rows patch that joins them for turn_loo is {why}"
        elif estimator != "grpo":
            return (f"verl's trainer joins the rows of an episode for algorithm.adv_estimator=grpo and turn_loo only "
                    f"(with {estimator} each row would count as an episode of its own)")
        for i, row in enumerate(rows):
            if len(row["prompt_ids"]) > self.prompt_length:
                return (f"its row {i}'s prompt has {len(row['prompt_ids'])} tokens, more than "
                        f"actor_rollout_ref.rollout.prompt_length={self.prompt_length}")
        return None

    def _is_validation(self, sampling_params: dict) -> bool:
        """verl does not tell an agent loop whether it runs validation; its sampling does: the
        validation values (``rollout.val_kwargs``) where they differ from training's."""
        val, train = self.rollout_config.get("val_kwargs") or {}, self.rollout_config
        keys = [k for k in ("temperature", "top_p", "top_k") if k in val and val[k] != train.get(k)]
        return bool(keys) and all(sampling_params.get(k) == val[k] for k in keys)

    def _dump(self, traj: dict, backend: ServerManagerBackend, sampling_params: dict, started: float) -> None:
        """Append the trajectory (our dump schema, the tokens as generated) to
        ``<trainer.rollout_data_dir>/rollouts/step_NNNNNN.jsonl`` (training) or
        ``<trainer.validation_data_dir or rollout_data_dir>/rollouts_val/step_NNNNNN.jsonl``
        (validation), the layout ``python -m verl_agentic.inspect`` reads. The step is the oldest policy
        version the episode was generated with (the rollout's ``global_steps``; 0 before the first
        update); ``policy_versions`` holds the oldest, the newest and each turn's ``[min, max]`` (an
        async trainer's partial rollouts span several); ``timing`` the episode's start and end (wall
        clock), its seconds waiting for the server (the long tail of a step shows there) and each
        request's (``requests_s``). Each line is appended whole under the file's lock
        (``JsonLinesAppender``): safe across agent-loop workers, and a line torn by a worker killed
        mid-write is cut off before the next one is appended."""
        trainer = self.config.get("trainer") or {}
        validation = self._is_validation(sampling_params)
        root = (trainer.get("validation_data_dir") or trainer.get("rollout_data_dir")) if validation \
            else trainer.get("rollout_data_dir")
        if not root:
            return
        step = backend.min_global_steps if backend.min_global_steps is not None else 0
        folder = os.path.join(str(root), "rollouts_val" if validation else "rollouts")
        os.makedirs(folder, exist_ok=True)
        versions = {"min": backend.min_global_steps, "max": backend.max_global_steps, "turns": backend.turn_versions}
        timing = {"start": round(started, 3), "end": round(time.time(), 3), "generate_s": round(backend.generate_s, 3),
                  "requests_s": [round(s, 4) for s in backend.request_s]}
        line = json.dumps({**traj, "step": int(step), "agent_name": self.agent_name, "policy_versions": versions,
                           "timing": timing}, ensure_ascii=False, default=str) + "\n"
        with JsonLinesAppender(os.path.join(folder, f"step_{int(step):06d}.jsonl")) as out:
            out.append_bytes(line.encode("utf-8"))

    def _record(self, tape: Tape, traj: dict, backend: ServerManagerBackend, sampling_params: dict,
                **episode: Any) -> None:
        """``agentic.record``: the episode's recording, in ``<rollout_data_dir>/recordings/step_NNNNNN/``
        (validation: ``recordings_val/``; the step as in ``_dump``), one writer per folder and process."""
        trainer = self.config.get("trainer") or {}
        step = backend.min_global_steps if backend.min_global_steps is not None else 0
        kind = "recordings_val" if self._is_validation(sampling_params) else "recordings"
        folder = os.path.join(str(trainer.get("rollout_data_dir")), kind, f"step_{int(step):06d}")
        def header() -> dict:
            config = {"model": {"path": str(self.config.actor_rollout_ref.model.path)},
                      "agentic": dataclasses.asdict(self.settings)}
            rollout = {"chat_template_kwargs": plain(self.apply_chat_template_kwargs) or {}}
            return recording_header(config, backend, rollout, self.settings.task, self.settings.task_type, None)

        _RECORDERS.get(folder, header).finish(tape, traj, **episode)

    def _check_errors(self, traj: dict, hooks: _EpisodeHooks, kwargs: dict) -> None:
        error = traj["error"]
        if error is None:
            return
        too_long = hooks.prompt_tokens is not None and hooks.prompt_tokens > self.prompt_length
        if too_long and error["type"] == "context_overflow":
            error["message"] = (f"the prompt has {hooks.prompt_tokens} tokens, more than "
                                f"actor_rollout_ref.rollout.prompt_length={self.prompt_length}")
        where = f"{self._describe(kwargs)} (task {traj['task_type']}, agent {self.agent_name})"
        if not traj["prompt_ids"]:
            raise TaskAgentError(f"{where}: the episode could not start: {error['type']}: {error['message']}")
        if error["type"] in self.settings.raise_on_errors:
            raise TaskAgentError(f"{where}: {error['type']}: {error['message']} (agentic.raise_on_errors="
                                 f"{list(self.settings.raise_on_errors)})")
        global _KEPT_ERRORS
        _KEPT_ERRORS += 1
        if _KEPT_ERRORS <= 10 or _KEPT_ERRORS % 1000 == 0:
            logger.warning("%s: episode ended with %s (kept for training; #%d in this process): %s", where,
                           error["type"], _KEPT_ERRORS, error["message"][:300])
