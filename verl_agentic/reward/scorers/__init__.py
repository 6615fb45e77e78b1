"""Scorers: ``score(solution_str, ground_truth, extra_info, **kwargs) -> float | dict``, by name.

A scorer is picked per sample, polymorphically: the item's explicit ``scorer`` (the one its task
names, ``TaskSpec.scorer``; or the manager's ``reward.scorer``) if set, else the one registered under
its ``data_source``, else under its ``task_type``. A sample that names no scorer and has none
registered under those names is scored by its task's own episode reward (``EpisodeResult.reward``),
its result's extra saying ``scored_by: episode_reward`` (counted by the managers as
``scored_by_episode_reward``). Register your own::

    from verl_agentic.reward.scorers import register_scorer

    @register_scorer("my_task", aliases=("my-org/my-dataset",))
    def my_score(solution_str, ground_truth, extra_info=None, *, bonus=0.0):
        return {"score": float(solution_str.strip() == ground_truth) + bonus, "acc": ...}

A dict result must hold a numeric ``score``; its other keys become the result's ``extra``.
Scorers must be importable module-level functions: ``prime`` runs them in worker processes and
the reward server in its own process (list the module in ``reward.scorer_modules``, or expose it
through the ``verl_agentic.scorers`` entry-point group, as the built-in ones are: gsm8k's lives in
``verl_agentic/tasks/gsm8k/scorer.py``).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Optional

from verl_agentic.interfaces import ConfigError
from verl_agentic.registry import Registry, import_modules
from verl_agentic.reward.items import RewardItem, ScoreError, normalize_score

SCORERS: Registry[Callable[..., Any]] = Registry("scorer", "verl_agentic.scorers")
_PRELOAD: set[str] = set()
_CANONICAL: dict[str, str] = {}  # alias -> the name it was registered with
EPISODE_REWARD = "episode_reward"  # result.extra["scored_by"] of a sample scored by its task's own reward


def register_scorer(name: str, fn: Optional[Callable] = None, *, aliases: Iterable[str] = (),
                    preload: Iterable[str] = (), replace: bool = False):
    """Register ``fn`` under ``name`` and each alias (e.g. a dataset's ``data_source``); a decorator without fn.

    ``preload``: heavy modules the scorer imports lazily (e.g. ``sympy``); prime's template
    process imports them once so its workers start warm.
    """
    if fn is None:
        return lambda f: register_scorer(name, f, aliases=aliases, preload=preload, replace=replace)
    for n in (name, *aliases):
        SCORERS.register(n, fn, replace=replace)
        _CANONICAL[n] = name
    _PRELOAD.update(preload)
    return fn


def preload_modules() -> None:
    """Import the modules registered scorers asked to preload."""
    for m in sorted(_PRELOAD):
        importlib.import_module(m)


def import_scorer_modules(modules: Iterable[str]) -> None:
    """Import ``modules`` (whose import registers scorers). The built-in scorers (gsm8k's, swedev's)
    need none: ``SCORERS`` finds them through the ``verl_agentic.scorers`` entry points."""
    import_modules(modules or (), "reward.scorer_modules")


def check_scorer_names(scorer: Optional[str], scorer_kwargs: dict, modules: Iterable[str] = ()) -> None:
    """``ConfigError`` when ``reward.scorer`` or a key of ``reward.scorer_kwargs`` names no registered
    scorer (after importing ``modules``): a misspelt name would otherwise be ignored silently."""
    import_scorer_modules(modules)
    for name, key in ([(scorer, "reward.scorer")] if scorer else []) + [(k, "reward.scorer_kwargs") for k in scorer_kwargs]:
        if name not in SCORERS:
            raise ConfigError(f"{key}: no scorer {name!r} is registered; registered: {', '.join(SCORERS.names())} "
                              f"(reward.scorer_modules imports your own)")


def resolve_scorer(item: RewardItem, override: Optional[str] = None) -> str:
    """The scorer name for ``item``; ``ScoreError('unknown_scorer')`` listing the registered ones."""
    candidates = [item.scorer or override] if (item.scorer or override) else [item.data_source, item.task_type]
    for name in candidates:
        if name and name in SCORERS:
            return name
    tried = ", ".join(repr(c) for c in candidates if c) or "(the item names no scorer, data_source or task_type)"
    raise ScoreError("unknown_scorer", f"no scorer registered for {tried}; registered: {', '.join(SCORERS.names())}")


def run_scorer(item: RewardItem, override: Optional[str] = None,
               scorer_kwargs: Optional[dict] = None) -> tuple[float, dict]:
    """Resolve and call the scorer for ``item``: (score, extra), or a typed ``ScoreError``.

    This is the single place that calls scorers: every manager (and the reward server) goes
    through it, so they agree on arguments, validation and error types.
    """
    if not isinstance(item.solution_str, str):
        raise ScoreError("bad_input", f"solution_str must be a string, got {type(item.solution_str).__name__}")
    try:
        name = resolve_scorer(item, override)
    except ScoreError:
        if item.episode_reward is None or item.scorer or override:
            raise  # a scorer named but not registered is an error, never a silent fallback
        return float(item.episode_reward), {"scored_by": EPISODE_REWARD}
    fn = SCORERS[name]
    # kwargs may be keyed by the scorer's name or by the alias that selected it
    kwargs = (scorer_kwargs or {}).get(name) or (scorer_kwargs or {}).get(_CANONICAL.get(name, name)) or {}
    try:
        out = fn(item.solution_str, item.ground_truth, item.extra_info, **kwargs)
    except ScoreError:
        raise
    except MemoryError as e:
        raise ScoreError("scorer_error", f"scorer {name!r} ran out of memory (MemoryError{': ' + str(e) if str(e) else ''})") from None
    except Exception as e:
        raise ScoreError("scorer_error", f"scorer {name!r} raised {type(e).__name__}: {str(e)[:500]}") from None
    score, extra = normalize_score(out)
    return score, extra
