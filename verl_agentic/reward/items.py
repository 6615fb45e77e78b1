"""What every reward manager and scorer speaks: the item to score, the result, the typed errors, and
turning a scorer's return value or a trajectory into them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from verl_agentic.interfaces import ConfigError

# Why a sample has no score. Counted per type in ``RewardManager.stats()``.
REWARD_ERROR_TYPES = (
    "scorer_error",  # the scorer raised (message: the exception)
    "invalid_score",  # the scorer returned NaN/inf, a string, None, or a dict without a numeric "score"
    "timeout",  # the scorer ran past timeout_s (prime/server: its worker process was killed)
    "worker_died",  # the worker process died while scoring (e.g. killed by the OOM killer, segfault)
    "unknown_scorer",  # no scorer is registered for the sample's scorer / data_source / task_type
    "service_unavailable",  # remote: the reward service could not be reached after all retries
    "bad_response",  # remote: the service answered something that is not a valid result
    "request_too_large",  # remote: one item is larger than the service accepts
    "bad_input",  # the item itself is malformed (e.g. solution_str is not a string)
)
FAILURE_POLICIES = ("mask", "zero", "penalty")
SOLUTION_MODES = ("last_assistant", "all_assistant")


@dataclass
class RewardError:
    type: str
    message: str

    def __post_init__(self) -> None:
        if self.type not in REWARD_ERROR_TYPES:
            raise ValueError(f"unknown reward error type {self.type!r}; one of {REWARD_ERROR_TYPES}")

    def as_dict(self) -> dict:
        return {"type": self.type, "message": self.message}


@dataclass
class RewardItem:
    """What a scorer needs to score one response."""

    solution_str: str
    ground_truth: Any = None
    data_source: Optional[str] = None
    task_type: Optional[str] = None
    extra_info: dict = field(default_factory=dict)
    scorer: Optional[str] = None  # an explicit scorer name (the item's or its task's); else data_source, then task_type
    episode_reward: Optional[float] = None  # the task's own reward: the score when no scorer is registered for it

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, where: str = "item") -> "RewardItem":
        """Validate a JSON object (e.g. from the reward server's request body)."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        if not isinstance(d.get("solution_str"), str):
            raise ValueError(f"{where}: field 'solution_str' must be a string")
        for key in ("data_source", "task_type", "scorer"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise ValueError(f"{where}: field {key!r} must be a string or null")
        reward = d.get("episode_reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise ValueError(f"{where}: field 'episode_reward' must be a number or null")
        if d.get("extra_info") is not None and not isinstance(d["extra_info"], dict):
            raise ValueError(f"{where}: field 'extra_info' must be an object or null")
        return cls(**{**d, "extra_info": d.get("extra_info") or {}})


@dataclass
class RewardResult:
    """The score of one sample. ``error`` is set when the scorer did not produce a valid score."""

    score: Optional[float]
    extra: dict = field(default_factory=dict)
    error: Optional[RewardError] = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict:
        return {"score": self.score, "extra": self.extra, "error": self.error.as_dict() if self.error else None}

    @classmethod
    def from_dict(cls, d: Any) -> "RewardResult":
        """Parse a result from JSON (the reward server's answer); raises ValueError when malformed."""
        if not isinstance(d, dict) or "score" not in d:
            raise ValueError(f"result must be an object with 'score', got {str(d)[:200]!r}")
        score, extra, error = d["score"], d.get("extra") or {}, d.get("error")
        if score is not None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            raise ValueError(f"result 'score' must be a number or null, got {score!r}")
        if not isinstance(extra, dict):
            raise ValueError("result 'extra' must be an object")
        err = None
        if error is not None:
            if not isinstance(error, dict) or error.get("type") not in REWARD_ERROR_TYPES:
                raise ValueError(f"result 'error' must be {{type, message}} with a known type, got {error!r}")
            err = RewardError(error["type"], str(error.get("message", "")))
        elif score is None:
            raise ValueError("result has neither a score nor an error")
        return cls(None if score is None else float(score), extra, err)


class ScoreError(Exception):
    """A typed scoring failure, raised inside scorer plumbing and turned into a RewardError."""

    def __init__(self, type: str, message: str):
        super().__init__(message)
        self.type = type
        self.message = message

    def as_error(self) -> RewardError:
        return RewardError(self.type, self.message)


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    try:  # numpy / torch scalars
        return _json_safe(value.item())
    except (AttributeError, TypeError, ValueError, RuntimeError):  # no .item(), or not a single value
        return repr(value)[:1000]


def normalize_score(out: Any) -> tuple[float, dict]:
    """A scorer's return value -> (score, extra). A float, an int, or a dict with a numeric ``score``.

    NaN/inf, strings, None, and dicts without a numeric ``score`` raise ``ScoreError('invalid_score')``.
    Extra values are made JSON-safe (NaN -> "nan", unknown objects -> repr).
    """
    extra: dict = {}
    if isinstance(out, dict):
        if "score" not in out:
            raise ScoreError("invalid_score", f"scorer returned a dict without 'score' (keys: {sorted(out)[:10]})")
        extra = {str(k): _json_safe(v) for k, v in out.items() if k != "score"}
        out = out["score"]
    if isinstance(out, str) or out is None:
        raise ScoreError("invalid_score", f"scorer returned {type(out).__name__} {str(out)[:100]!r}, not a number")
    try:
        score = float(out)
    except (TypeError, ValueError):
        raise ScoreError("invalid_score", f"scorer returned {type(out).__name__}, not a number") from None
    if not math.isfinite(score):
        raise ScoreError("invalid_score", f"scorer returned {score}")
    return score, extra


def _assistant_texts(traj: dict) -> list[str]:
    return [m.get("content") or "" for m in traj.get("messages") or [] if m.get("role") == "assistant"]


def item_from_trajectory(traj: dict, solution: str = "last_assistant", where: str = "trajectory") -> RewardItem:
    """The RewardItem of a trajectory (schema: docs/rollouts.md). Raises ConfigError naming the missing field."""
    if not isinstance(traj, dict):
        raise ConfigError(f"{where}: expected a trajectory dict, got {type(traj).__name__}")
    if "ground_truth" not in traj:
        raise ConfigError(f"{where}: no 'ground_truth' field (trajectories written before reward support "
                          "lack it: roll them out again)")
    texts = _assistant_texts(traj)
    text = (texts[-1] if texts else "") if solution == "last_assistant" else "\n".join(texts)
    extra = dict(traj.get("extra_info") or {})
    extra.setdefault("num_turns", traj.get("num_turns"))
    last = [t for t in traj.get("turns") or [] if t.get("role") == "assistant"][-1:]
    extra.setdefault("last_turn_cut", bool(last) and last[0].get("finish_reason") == "length")  # at max_new_tokens
    reward = traj.get("reward")
    return RewardItem(solution_str=text, ground_truth=traj["ground_truth"], data_source=traj.get("data_source"),
                      task_type=traj.get("task_type"), extra_info=extra, scorer=traj.get("scorer"),
                      episode_reward=None if reward is None else float(reward))
