"""The small set of types every part of verl-agentic speaks.

Task functions (see ``verl_agentic.tasks``) receive and return these:

- ``start(row, ctx) -> EpisodeState``
- ``gen(state, backend, sampling) -> GenOutput``
- ``obs(state, gen_out) -> Observation``
- ``end(state) -> EpisodeResult``

Generation backends (see ``verl_agentic.backends``) take prompt token ids and a
``SamplingParams`` and return a ``GenOutput``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

# Finish reasons of an episode (the trajectory dump's ``finish_reason``).
FINISH_STOP = "stop"  # the task said the episode is done
FINISH_LENGTH = "length"  # the token budget (rollout.max_total_tokens) ran out
FINISH_MAX_TURNS = "max_turns"  # rollout.max_turns assistant turns were used
FINISH_ERROR = "error"  # an exception ended the episode (see ``error``)
# max_consecutive_invalid_tool_calls invalid tool calls in a row (unparseable markup or unknown tools) ended it
FINISH_INVALID_TOOL_CALLS = "invalid_tool_calls"

# Typed failure kinds (docs/rollouts.md, "Trajectories and token exactness"). ``EpisodeError.type`` takes one of these.
ERROR_TYPES = (
    "timeout",  # the episode (or a turn) ran past its time limit
    "cancelled",  # the rollout was cancelled from outside while the episode ran
    "task_error",  # a task function (start / obs / gen) raised
    "end_error",  # the task's end() raised; the trajectory is kept
    "generation_error",  # the backend raised
    "env_error",  # a remote environment service gave no usable answer (unreachable, 5xx, garbage, lost session)
    "context_overflow",  # the prompt or the next observation does not fit max_total_tokens
    "template_error",  # the chat template could not render the conversation
    "tool_error",
    "parse_error",
    "truncated",
    "reward_error",
    "invalid_tool_calls",  # the invalid-tool-call policy ended the episode (tools/runner.py; finish_reason "invalid_tool_calls")
)

# An episode that fails with one of these error types ends with this finish reason (any other: "error").
FINISH_REASON_OF_ERROR = {"context_overflow": FINISH_LENGTH, "invalid_tool_calls": FINISH_INVALID_TOOL_CALLS}


@dataclass
class SamplingParams:
    """Per-request sampling parameters.

    ``temperature == 0`` means greedy decoding. ``top_k <= 0`` disables top-k.
    ``seed`` makes a request's sampling reproducible independently of how it is
    batched with others (each request gets its own random generator).
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    stop_token_ids: Optional[list[int]] = None  # extra stop ids on top of the backend's EOS ids

    def replace(self, **changes: Any) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


@dataclass
class GenOutput:
    """What the model generated for one request, exactly as produced.

    ``token_ids`` include the stop token when generation stopped on one
    (``finish_reason == "stop"``). ``logprobs`` align one-to-one with ``token_ids``
    and are log-softmax of the logits divided by the temperature (raw logits when greedy),
    i.e. what a trainer recomputes with the same temperature.
    """

    token_ids: list[int]
    logprobs: Optional[list[float]]
    text: str
    # "stop" | "length" | "abort": the backend was told to stop early (a weight update is coming;
    # the tokens so far are valid, and ``prompt_ids + token_ids`` continues the request)
    finish_reason: str

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"GenOutput: {len(self.logprobs)} logprobs for {len(self.token_ids)} tokens"
            )


@dataclass
class ChatOutput:
    """One assistant message from a chat-speaking backend (``/v1/chat/completions`` style).

    ``message`` is ``{"role": "assistant", "content": str, "tool_calls"?: [...]}`` with tool calls
    in OpenAI form (``{"id", "type": "function", "function": {"name", "arguments": str}}``).
    ``token_ids`` / ``logprobs`` are the generated tokens when the server reports them (None
    otherwise); ``prompt_token_count`` is the server's count of the rendered prompt, if known.
    """

    message: dict
    finish_reason: str  # "stop" | "length" | "tool_calls"
    token_ids: Optional[list[int]] = None
    logprobs: Optional[list[float]] = None
    prompt_token_count: Optional[int] = None


@dataclass
class Observation:
    """What the environment says after an assistant turn.

    ``messages`` are appended to the conversation (tokenized as the chat template's delta)
    when the episode goes on; ``turn_reward`` is stored on the assistant turn it judges.
    ``metrics`` update the episode's metrics; ``info`` (JSON-serialisable facts about this turn
    only, e.g. the outcome of each of its tool calls) is stored on the assistant turn as ``info``.
    ``new_row`` (a reason, e.g. ``history_changed``): ``messages`` is a whole new conversation, not a
    continuation; the loop closes the episode's current row and starts another one whose prompt is
    ``messages`` rendered (``EpisodeState.rows`` keeps the closed rows).
    """

    messages: list[dict] = field(default_factory=list)
    done: bool = False
    turn_reward: Optional[float] = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    new_row: Optional[str] = None


@dataclass
class EpisodeResult:
    reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EpisodeError:
    type: str
    message: str

    def as_dict(self) -> dict:
        return {"type": self.type, "message": self.message}


@dataclass
class RolloutContext:
    """Per-episode context handed to ``start``: who runs the episode and with what config.

    ``task_config`` is the task's own section of the config (``task.<task_type>``).
    """

    tokenizer: Any
    task_config: dict
    sample_index: int = 0  # which of the rollout.n samples of this prompt
    max_turns: int = 1
    seed: Optional[int] = None
    max_consecutive_invalid_tool_calls: Optional[int] = None  # the rollout's default for tasks with tools
    max_total_tokens: Optional[int] = None  # the episode's context budget (prompt + response), where known


@dataclass
class Turn:
    role: str  # "assistant" | "user" | "tool"
    start: int  # index into response_ids
    end: int  # exclusive
    text: str
    reward: Optional[float] = None
    finish_reason: Optional[str] = None  # assistant turns: "stop" | "length"
    num_messages: int = 1  # injected turns: how many messages this delta holds
    info: Optional[dict] = None  # assistant turns: the Observation's ``info`` (e.g. its tool calls' outcomes)

    def as_dict(self) -> dict:
        d = {"role": self.role, "start": self.start, "end": self.end, "text": self.text}
        if self.reward is not None:
            d["reward"] = self.reward
        if self.info:
            d["info"] = self.info
        if self.finish_reason is not None:
            d["finish_reason"] = self.finish_reason
        if self.role != "assistant":
            d["num_messages"] = self.num_messages
        return d


@dataclass
class EpisodeState:
    """The state of one episode, shared by the loop and the task functions.

    The loop owns the token fields (``prompt_ids``, ``response_ids``, ``response_mask``,
    ``response_logprobs``, ``turns``); tasks read them and keep their own data in ``task``
    (any object, ideally a small dataclass of the task's own). An episode is one training row unless an
    ``Observation`` starts a new one (``new_row``): then ``rows`` holds the closed rows, each a dict of
    ``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``, ``messages``, ``turns``
    and ``split_reason`` (why the row after it started), and the token fields are the current row's.
    """

    row: dict
    messages: list[dict]
    ctx: RolloutContext
    tools: Optional[list[dict]] = None
    task: Any = None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[Optional[float]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    num_turns: int = 0  # assistant turns generated so far
    metrics: dict[str, float] = field(default_factory=dict)
    finish_reason: Optional[str] = None
    error: Optional[EpisodeError] = None
    rows: list[dict] = field(default_factory=list)

    @property
    def all_turns(self) -> list[Turn]:
        """The turns of every row of the episode, in order (the closed rows' first)."""
        return [t for r in self.rows for t in r["turns"]] + self.turns

    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def last_assistant_text(self) -> str:
        for m in reversed(self.messages):
            if m.get("role") == "assistant":
                return m.get("content") or ""
        return ""


class EpisodeFailure(Exception):
    """Raise from a task function to end the episode with a typed error. Raised from ``obs``, its
    ``info`` (facts about the turn it judged, as ``Observation.info``) is kept on that turn."""

    def __init__(self, type: str, message: str, info: Optional[dict] = None):
        if type not in ERROR_TYPES:
            raise ValueError(f"unknown error type {type!r}; one of {ERROR_TYPES}")
        super().__init__(message)
        self.type = type
        self.message = message
        self.info = info


class ConfigError(ValueError):
    """Bad user input (config, dataset, task name): raised before any work starts."""


class UnknownKeysError(ConfigError):
    """A config section with keys it does not take (raised by ``check_keys``); ``unknown``: those keys."""

    def __init__(self, message: str, unknown: Iterable[str] = ()):
        super().__init__(message)
        self.unknown = sorted(unknown)


# the weight precisions a generation backend may compute in, by every name a config accepts
WEIGHT_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                      "int8": "int8"}


def canonical_weight_dtype(name: Any, setting: str = "rollout.hf.weight_dtype") -> str:
    """``float32``, ``bfloat16`` or ``int8`` for any accepted name (or torch dtype) of one; else ``ConfigError``."""
    key = str(name).removeprefix("torch.").lower()
    if key not in WEIGHT_DTYPE_NAMES:
        raise ConfigError(f"{setting} must be one of float32 (fp32), bfloat16 (bf16), int8; got {name!r}")
    return WEIGHT_DTYPE_NAMES[key]


def check_keys(d: Any, known: Any, section: str) -> None:
    """Raise ``UnknownKeysError`` naming the keys of config section ``section`` that are not ``known``,
    with the known ones listed in the order given."""
    known = list(known)
    unknown = set(d) - set(known)
    if unknown:
        raise UnknownKeysError(f"unknown {section} keys {sorted(unknown)}; known: {known}", unknown)


def parse_section(cls: type, d: Any, section: str) -> Any:
    """The dataclass ``cls`` from config section ``section`` (a mapping; None = all defaults).

    Every config section is read this way, once: unknown keys are reported by :func:`check_keys`,
    each value is checked against its field's annotation (``bool``, ``int``, ``float`` (an int is
    accepted), ``str``, ``list``, ``dict``, ``Optional[...]`` of these, or a nested dataclass, parsed
    as section ``section.field``), and a missing key takes the field's default. ``cls`` may check
    ranges and choices in ``__post_init__``, raising ``ConfigError`` there.
    """
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise ConfigError(f"{section} must be a mapping of settings, got {type(d).__name__}: {d!r}")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    check_keys(d, [f.name for f in fields], section)
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields:
        if f.name in d:
            values[f.name] = _config_value(hints[f.name], d[f.name], f"{section}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if dataclasses.is_dataclass(hints[f.name]):
                values[f.name] = parse_section(hints[f.name], None, f"{section}.{f.name}")
            else:
                raise ConfigError(f"{section}.{f.name} is required")
    return cls(**values)


_KINDS: dict[type, tuple[str, Any]] = {  # a field's type -> (what the error asks for, check)
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    list: ("a list", lambda v: isinstance(v, (list, tuple))),
    tuple: ("a list", lambda v: isinstance(v, (list, tuple))),
    dict: ("a mapping", lambda v: isinstance(v, dict)),
}


def _config_value(kind: Any, value: Any, key: str) -> Any:
    optional = False
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[X]
        args = typing.get_args(kind)
        optional = type(None) in args
        if value is None and optional:
            return None
        (kind,) = [a for a in args if a is not type(None)]
    if dataclasses.is_dataclass(kind):
        return parse_section(kind, value, key)
    base = typing.get_origin(kind) or kind
    if base not in _KINDS:
        return value  # Any
    what, ok = _KINDS[base]
    if not ok(value):
        raise ConfigError(f"{key} must be {what}{' or null' if optional else ''}, got {value!r}")
    return base(value) if base in (float, list, tuple) else value
