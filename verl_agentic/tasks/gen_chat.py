"""``gen_chat``: a chat-speaking policy against an environment that lives behind HTTP.

The policy side runs here, in ``openai_chat_agent_loop`` (chat messages in, one assistant message
out per turn, token ids kept when the backend reports them). The environment side (any
registered task's start / obs / end) runs in ``python -m verl_agentic.envserver``, maybe on
another machine; this task's functions are its client:

- ``start``: ``POST /start`` with the row (the service hands it to the environment task with that
  task's ``task_type``), the task's config and a fresh session id -> the prompt messages and tools.
- ``obs``: ``POST /step`` with the assistant message (``content`` + ``tool_calls``) -> the
  messages to append, done, the turn reward, metrics.
- ``end``: ``POST /end`` with the finish reason and error -> the reward and metrics (the
  environment's ``end`` runs there: tools released, sandboxes destroyed).

Config (``task.gen_chat.*``):

- ``url``: the service (``http://host:port``); required.
- ``env_task``: the task the service runs; a row's ``extra_info.env_task`` overrides it.
- ``env_config``: that task's config, sent with ``/start`` (the service merges it over its own
  ``--task-config`` defaults).
- ``parser``: the tool-call format the policy writes (token backends go through
  ``ChatAdapter``), default ``hermes``.
- ``request_timeout_s`` (60), ``max_retries`` (3), ``retry_backoff_s`` (0.5): see
  ``verl_agentic.envserver.client``.

Failures are typed episode errors, and the episode keeps what it generated: an environment that
does not answer in time is a ``timeout``; a task that raised on the service keeps its type
(``task_error``, ...); everything else (unreachable after the retries, 5xx, garbage, a lost
session, a request the service refused) is an ``env_error`` whose message names the kind and the
call, e.g. ``[service_unavailable] environment service http://host:8100/step: ... (gave up after 4 attempts)``.
``env_requests``, ``env_retries`` and ``env_errors`` are in each episode's metrics.

Rows: any task's rows with ``task_type: gen_chat`` and ``extra_info.env_task``; convert a
dataset with::

    python -m verl_agentic.envserver.rows gsm8k data/gsm8k/test.jsonl outputs/gen_chat_gsm8k.jsonl
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from verl_agentic.tasks.data import PREPROCESS_DATASET, DatasetError
from verl_agentic.envserver.client import EnvClient, EnvServiceError
from verl_agentic.interfaces import (
    ERROR_TYPES,
    ConfigError,
    EpisodeFailure,
    EpisodeResult,
    EpisodeState,
    Observation,
    RolloutContext,
    check_keys,
)
from verl_agentic.rollout.chat_loop import openai_chat_agent_loop
from verl_agentic.rollout.task_spec import TaskSpec, register_task


@dataclass
class GenChatConfig:
    url: Optional[str] = None
    env_task: Optional[str] = None
    env_config: dict = field(default_factory=dict)
    parser: str = "hermes"
    request_timeout_s: float = 60.0
    max_retries: int = 3
    retry_backoff_s: float = 0.5

    @classmethod
    def from_dict(cls, d: dict) -> "GenChatConfig":
        check_keys(d, [f.name for f in fields(cls)], "task.gen_chat")
        cfg = cls(**d)
        if not isinstance(cfg.url, str) or not re.match(r"^https?://[^/]+", cfg.url):
            raise ConfigError("task.gen_chat.url must be the http://host:port of an environment service "
                              f"(start one with `python -m verl_agentic.envserver --port 8100`), got {cfg.url!r}")
        if cfg.env_config is None:
            cfg.env_config = {}
        if not isinstance(cfg.env_config, dict):
            raise ConfigError(f"task.gen_chat.env_config must be a mapping, got {cfg.env_config!r}")
        EnvClient(cfg.url, request_timeout_s=cfg.request_timeout_s, max_retries=cfg.max_retries,
                  retry_backoff_s=cfg.retry_backoff_s)  # validates the numbers
        return cfg


@dataclass
class GenChatState:
    client: EnvClient
    session_id: str
    env_task: str


def _failure(e: EnvServiceError) -> EpisodeFailure:
    """A typed episode error for a failed service call (see the module docstring)."""
    if e.type in ERROR_TYPES:
        return EpisodeFailure(e.type, e.message)
    return EpisodeFailure("env_error", f"[{e.type}] {e.message}")


def _env_task(row: dict, cfg: GenChatConfig) -> str:
    name = (row.get("extra_info") or {}).get("env_task") or cfg.env_task
    if not isinstance(name, str) or not name:
        raise EpisodeFailure("task_error", "gen_chat: the row names no extra_info.env_task and "
                                           "task.gen_chat.env_task is not set")
    return name


async def gen_chat_start(row: dict, ctx: RolloutContext) -> EpisodeState:
    cfg = GenChatConfig.from_dict(dict(ctx.task_config))
    env_task = _env_task(row, cfg)
    client = EnvClient(cfg.url, request_timeout_s=cfg.request_timeout_s, max_retries=cfg.max_retries,
                       retry_backoff_s=cfg.retry_backoff_s)
    session_id = uuid.uuid4().hex
    try:
        answer = await client.start(env_task, row, session_id=session_id,
                                    task_config=cfg.env_config, sample_index=ctx.sample_index,
                                    max_turns=ctx.max_turns, seed=ctx.seed)
    except EnvServiceError as e:
        await client.close()
        raise _failure(e) from None
    except BaseException:
        await client.close()
        raise
    return EpisodeState(row=row, messages=answer["messages"], ctx=ctx, tools=answer["tools"] or None,
                        task=GenChatState(client, session_id, env_task))


async def gen_chat_obs(state: EpisodeState, out: Any) -> Observation:
    task: GenChatState = state.task
    try:
        answer = await task.client.step(task.session_id, state.num_turns, state.messages[-1],
                                        getattr(out, "finish_reason", None))
    except EnvServiceError as e:
        raise _failure(e) from None
    return Observation(messages=answer["messages"], done=answer["done"], turn_reward=answer["turn_reward"],
                       metrics={k: v for k, v in answer["metrics"].items() if isinstance(v, (int, float))},
                       info=answer.get("info") or {})


async def gen_chat_end(state: EpisodeState) -> EpisodeResult:
    task: Optional[GenChatState] = state.task
    if task is None:
        return EpisodeResult(0.0, {})
    try:
        answer = await task.client.end(task.session_id, state.finish_reason,
                                       state.error.as_dict() if state.error else None)
    except EnvServiceError as e:
        raise _failure(e) from None
    finally:
        await task.client.close()
        for metric, name in (("requests", "requests"), ("retries", "retries"), ("errors", "failed_requests")):
            state.metrics[f"env_{metric}"] = float(task.client.counts.get(name, 0))
    metrics = {k: float(v) for k, v in answer["metrics"].items() if isinstance(v, (int, float))}
    return EpisodeResult(float(answer["reward"]), metrics)


@PREPROCESS_DATASET.register("gen_chat")
def gen_chat_preprocess(raw: dict, index: int) -> dict:
    """A raw row of the task named in its ``env_task`` field, preprocessed by that task, as a gen_chat row."""
    env_task = raw.get("env_task")
    if not isinstance(env_task, str) or env_task not in PREPROCESS_DATASET:
        raise DatasetError(f"field 'env_task' must name a task with a preprocessor "
                           f"({', '.join(n for n in PREPROCESS_DATASET.names() if n != 'gen_chat')}), got "
                           f"{env_task!r}; or convert a dataset with `python -m verl_agentic.envserver.rows "
                           "ENV_TASK IN OUT`")
    return as_gen_chat_row(PREPROCESS_DATASET[env_task](raw, index), env_task)


def as_gen_chat_row(row: dict, env_task: str) -> dict:
    """A rollout row of ``env_task`` that runs through gen_chat instead."""
    row = copy.deepcopy(row)
    row["task_type"] = "gen_chat"
    row["extra_info"] = {**(row.get("extra_info") or {}), "env_task": env_task}
    return row


GEN_CHAT = register_task("gen_chat", TaskSpec(start=gen_chat_start, obs=gen_chat_obs, end=gen_chat_end,
                                              loop=openai_chat_agent_loop, check_config=GenChatConfig.from_dict))
