"""Reward managers: one interface, three strategies, the same scores.

A reward manager turns trajectories (or bare ``RewardItem``s) into ``RewardResult``s, in
input order, one per input, never raising for a bad sample::

    manager = make_reward_manager(RewardConfig(manager="prime", timeout_s=5))
    results = manager.score(trajectories)          # list[RewardResult(score, extra, error)]

Every manager calls the same registered scorers (``verl_agentic.reward.scorers``) with the
same arguments, so for the same inputs they return the same scores; they differ in where the
scorer runs (in-process, a process pool, a remote service) and how they survive faults.

A failed sample always carries a typed ``error`` (never a silent 0); its ``score`` follows
``failure_policy``: ``mask`` -> None (leave it out of training), ``zero`` -> 0.0,
``penalty`` -> ``penalty``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from verl_agentic.interfaces import ConfigError, check_keys
from verl_agentic.registry import Registry

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
    scorer: Optional[str] = None  # an explicit scorer name; else data_source, then task_type

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
    except Exception:
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


@dataclass
class RewardConfig:
    """Settings of every reward manager (``reward.*`` in the hydra configs)."""

    manager: str = "naive"  # naive | prime | swedev (or a registered third-party manager)
    scorer: Optional[str] = None  # force one scorer for every sample; default: by data_source, then task_type
    scorer_kwargs: dict = field(default_factory=dict)  # {scorer name: {kwarg: value}}, e.g. {gsm8k: {method: strict}}
    scorer_modules: list = field(default_factory=list)  # modules to import so their scorers register (also in workers)
    solution: str = "last_assistant"  # which text of a trajectory is scored: last_assistant | all_assistant
    timeout_s: Optional[float] = 30.0  # per sample; None = no limit (naive cannot stop a hung scorer: see naive.py)
    failure_policy: str = "mask"  # mask (score None) | zero (0.0) | penalty (``penalty``)
    penalty: float = -1.0
    # prime
    num_workers: int = 0  # prime: CPU slots, 0 = os.cpu_count()
    overcommit: Optional[int] = None  # prime: extra busy processes beyond num_workers (None = num_workers), so a
    # sleeping hung sample does not idle a CPU before it is caught
    memory_limit_mb: Optional[int] = 4096  # address-space limit per worker; None = unlimited
    straggler_s: Optional[float] = None  # prime: spare a worker for a sample running this long; None = auto
    # swedev (remote)
    url: Optional[str] = None  # http://host:port of `python -m verl_agentic.reward.server`
    batch_size: int = 64  # items per request
    concurrency: int = 4  # requests in flight
    max_retries: int = 5  # on connection errors, 5xx and malformed answers
    retry_backoff_s: float = 0.5  # first backoff; doubles per retry (with jitter), capped at 8 s
    request_timeout_s: Optional[float] = None  # per request; None = timeout_s * batch_size / concurrency-ish default
    progress: bool = False

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "RewardConfig":
        d = dict(d or {})
        check_keys(d, sorted(cls.__dataclass_fields__), "reward")
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.failure_policy not in FAILURE_POLICIES:
            raise ConfigError(f"reward.failure_policy must be one of {FAILURE_POLICIES}, got {self.failure_policy!r}")
        if self.solution not in SOLUTION_MODES:
            raise ConfigError(f"reward.solution must be one of {SOLUTION_MODES}, got {self.solution!r}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigError(f"reward.timeout_s must be > 0 or null, got {self.timeout_s}")
        if not isinstance(self.scorer_kwargs, dict) or not all(isinstance(v, dict) for v in self.scorer_kwargs.values()):
            raise ConfigError("reward.scorer_kwargs must map scorer names to dicts of keyword arguments")

    @property
    def workers(self) -> int:
        return self.num_workers if self.num_workers > 0 else (os.cpu_count() or 1)

    def apply_policy(self, result: RewardResult) -> RewardResult:
        """Set a failed result's score according to ``failure_policy``."""
        if result.error is None:
            return result
        result.score = {"mask": None, "zero": 0.0, "penalty": float(self.penalty)}[self.failure_policy]
        return result


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
    return RewardItem(solution_str=text, ground_truth=traj["ground_truth"], data_source=traj.get("data_source"),
                      task_type=traj.get("task_type"), extra_info=extra)


class RewardManager(ABC):
    """Scores samples; subclasses implement ``_score_items``. Use as a context manager or call close()."""

    name = "base"

    def __init__(self, config: Optional[RewardConfig] = None):
        self.config = config or RewardConfig(manager=self.name)
        self.config.validate()
        from verl_agentic.reward.scorers import import_scorer_modules

        import_scorer_modules(self.config.scorer_modules)
        self._counts: Counter = Counter()
        self._busy_s = 0.0

    @abstractmethod
    def _score_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """One result per item, in order; failures as typed errors (the policy is applied by the caller)."""

    def score_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        t0 = time.perf_counter()
        results = self._score_items(list(items))
        if len(results) != len(items):  # a manager bug, not a sample fault: say so loudly
            raise RuntimeError(f"{type(self).__name__} returned {len(results)} results for {len(items)} items")
        return self._account(results, time.perf_counter() - t0)

    def _account(self, results: list[RewardResult], seconds: float) -> list[RewardResult]:
        """Apply the failure policy and count: what every scoring entry point does last."""
        self._busy_s += seconds
        for r in results:
            self.config.apply_policy(r)
            self._counts["items"] += 1
            self._counts[f"error/{r.error.type}" if r.error else "ok"] += 1
        return results

    def score(self, trajectories: Sequence[dict]) -> list[RewardResult]:
        items = [item_from_trajectory(t, self.config.solution, where=f"trajectory {i}")
                 for i, t in enumerate(trajectories)]
        return self.score_items(items)

    async def ascore_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Async variant; the default runs ``score_items`` in a thread so the event loop stays free."""
        return await asyncio.to_thread(self.score_items, items)

    def stats(self) -> dict:
        """Counters since creation: items, ok, error/<type>, busy_s."""
        return {**dict(self._counts), "busy_s": round(self._busy_s, 4)}

    def close(self) -> None:
        pass

    def __enter__(self) -> "RewardManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


REWARD_MANAGERS: Registry[type] = Registry("reward manager", "verl_agentic.reward_managers")


def register_reward_manager(name: str):
    """Class decorator: ``@register_reward_manager("mine") class Mine(RewardManager): ...``."""
    def decorator(cls: type) -> type:
        cls.name = name
        REWARD_MANAGERS.register(name, cls)
        return cls
    return decorator


def make_reward_manager(config: RewardConfig | dict | None = None, **overrides: Any) -> RewardManager:
    """Build the manager named by ``config.manager`` (naive | prime | swedev | a registered one; the
    built-in ones come through the ``verl_agentic.reward_managers`` entry points, like a plugin's)."""
    if config is None or isinstance(config, dict):
        config = RewardConfig.from_dict({**(config or {}), **overrides})
    elif overrides:
        config = RewardConfig.from_dict({**asdict(config), **overrides})
    cls = REWARD_MANAGERS.get(config.manager)
    return cls(config)


def score_trajectories(trajectories: list[dict], manager: RewardManager) -> list[RewardResult]:
    """Score trajectories and store the result on each: ``score``, ``score_extra``, ``score_error``."""
    results = manager.score(trajectories)
    for traj, r in zip(trajectories, results):
        traj["score"] = r.score
        traj["score_extra"] = r.extra
        traj["score_error"] = r.error.as_dict() if r.error else None
    return results
