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
import os
import time
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

from verl_agentic.interfaces import ConfigError, parse_section
from verl_agentic.registry import Registry
from verl_agentic.reward.items import (  # noqa: F401 - RewardItem, RewardResult, ... are imported from here too
    FAILURE_POLICIES,
    REWARD_ERROR_TYPES,
    SOLUTION_MODES,
    RewardError,
    RewardItem,
    RewardResult,
    ScoreError,
    item_from_trajectory,
    normalize_score,
)
from verl_agentic.reward.scorers import EPISODE_REWARD, import_scorer_modules


@dataclass
class RewardConfig:
    """Settings of every reward manager (``reward.*`` in the hydra configs)."""

    manager: str = "naive"  # naive | prime | swedev (or a registered third-party manager)
    scorer: Optional[str] = None  # force one scorer for every sample; default: by data_source, then task_type
    scorer_kwargs: Optional[dict] = None  # {scorer name: {kwarg: value}}, e.g. {gsm8k: {method: strict}}; None: {}
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
    progress: Optional[bool] = None  # a progress bar while scoring; None: off (the CLIs: on unless output.quiet)

    def __post_init__(self) -> None:
        if self.scorer_kwargs is None:
            self.scorer_kwargs = {}

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "RewardConfig":
        """The ``reward`` section: unknown keys and values of the wrong type are ``ConfigError``s naming the key."""
        cfg = parse_section(cls, dict(d or {}), "reward")
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


class RewardManager(ABC):
    """Scores samples; subclasses implement ``_score_items``. Use as a context manager or call close()."""

    name = "base"
    local_scorers = True  # scores with this process's scorer registry (config checks scorer names against it)

    def __init__(self, config: Optional[RewardConfig] = None):
        self.config = config or RewardConfig(manager=self.name)
        self.config.validate()
        if self.config.manager != self.name and self.config.manager in REWARD_MANAGERS \
                and REWARD_MANAGERS.get(self.config.manager) is type(self):
            self.name = self.config.manager  # selected by an alias: report the name the user wrote

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
            if r.extra.get("scored_by") == EPISODE_REWARD:  # no scorer registered for its task
                self._counts["scored_by_episode_reward"] += 1
        return results

    def score(self, trajectories: Sequence[dict]) -> list[RewardResult]:
        items = [item_from_trajectory(t, self.config.solution, where=f"trajectory {i}")
                 for i, t in enumerate(trajectories)]
        return self.score_items(items)

    async def ascore_items(self, items: Sequence[RewardItem]) -> list[RewardResult]:
        """Async variant; the default runs ``score_items`` in a thread so the event loop stays free."""
        return await asyncio.to_thread(self.score_items, items)

    def stats(self) -> dict:
        """Counters since creation: items, ok, error/<type>, scored_by_episode_reward (samples with no scorer
        registered, scored by their task's own reward), busy_s."""
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
    """Build the manager named by ``config.manager`` (naive | prime | remote (alias swedev) | a registered one; the
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
