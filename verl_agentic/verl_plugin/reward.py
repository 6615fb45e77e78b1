"""verl_agentic's reward managers inside verl's trainer (verl 0.9 reward loop).

Registered in ``verl.experimental.reward_loop.reward_manager`` when verl loads the plugin
(``import verl``, entry point group ``verl.plugins``):

======================  ==========================================================  ==================
verl name               our manager                                                 alias
======================  ==========================================================  ==================
``agentic_naive``       ``naive``: in-process (verl already owns the name ``naive``)
``prime``               ``prime``: process pool, timeouts kill the worker            ``agentic_prime``
``agentic_remote``      ``remote``: client of ``python -m verl_agentic.reward.server``  (verl owns ``remote``)
``swedev``              the same, by its first name                                  ``agentic_swedev``
======================  ==========================================================  ==================

Select one with hydra overrides of verl's trainer, e.g.::

    python -m verl.trainer.main_ppo ... \\
        reward.reward_manager.name=prime \\
        +reward.agentic.timeout_s=10 +reward.agentic.num_workers=4 \\
        '+reward.agentic.scorer_kwargs={gsm8k: {method: strict}}'

    ... reward.reward_manager.name=agentic_remote +reward.agentic.url=http://10.0.0.5:8765

Settings: ``reward.agentic`` (a mapping; absent = all defaults; it needs the ``+`` prefix because
verl's config is in struct mode). Every key of ``verl_agentic.reward.RewardConfig`` except
``manager`` (implied by the registered name; if given it must agree):

- ``scorer`` (force one scorer), ``scorer_kwargs`` ({scorer: {kwarg: value}}), ``scorer_modules``
  (modules to import so their scorers register, also in prime workers; ``+agentic.imports`` are added)
- ``solution``: ``last_assistant`` (default) | ``all_assistant`` (see "What is scored")
- ``timeout_s`` (per sample, default 30), ``failure_policy`` (mask | zero | penalty), ``penalty``
- prime: ``num_workers`` (pool size, 0 = all CPUs), ``memory_limit_mb``, ``straggler_s``
- remote / swedev: ``url`` (required), ``batch_size``, ``concurrency``, ``max_retries``, ``retry_backoff_s``,
  ``request_timeout_s``
- ``progress``

(the authoritative list is ``RewardConfig``'s fields: an unknown key is a ``ConfigError`` that
lists the known ones). ``scorer_kwargs`` are keyed by scorer name; a sample whose scorer was
selected through an alias (``data_source=openai/gsm8k``) gets the kwargs under the alias, else
under the scorer's name (``gsm8k``).

Two more keys belong to this adapter:

- ``extra_keys`` (list, default ``[]``): scorer extra fields (e.g. ``pred``, ``answered``) to pass
  into verl's ``reward_extra_info``; every sample gets each key (``None`` when its scorer did
  not produce it), because verl gathers extra info per key across the batch.
- ``batch_window_ms`` (default 0): verl calls ``run_single`` once per sample, concurrently. Calls
  arriving in the same event-loop tick (the reward loop's ``compute_score_batch``) are sent to
  our manager as one ``ascore_items`` batch; a positive window also waits that long for more
  (useful for ``swedev`` with the streaming agent-loop reward, where samples arrive one by one).

Note that ``reward.num_workers`` is verl's: the number of reward-loop worker actors, each holding
its own manager. With ``prime`` each actor owns a pool of ``reward.agentic.num_workers``
processes, so keep the product near the CPU count (e.g. ``reward.num_workers=2
+reward.agentic.num_workers=8`` on 16 cores).

What is scored: the response is cut to its valid length (``attention_mask``, as verl does) and
decoded with ``skip_special_tokens=True``. When the sample carries a response mask, only the
model's own tokens count: ``last_assistant`` takes the LAST contiguous run of mask==1 tokens
(the final assistant turn; tool/user text injected between turns has mask 0),
``all_assistant`` joins every run with newlines. The mask comes from ``batch["response_mask"]``
(verl's post-rollout batch: ``RewardLoopManager.compute_rm_score``), else from
``tool_extra_fields["agentic_response_mask"]`` (our ``task_agent`` loop records it in its output's
``extra_fields``: verl's streaming reward path, ``AgentLoopWorker._compute_score``, sends no
mask tensor). Without a mask the whole valid response is scored, as verl's ``naive`` does.

The sample's ``data_source``, ``reward_model["ground_truth"]`` and ``extra_info`` become the
``RewardItem`` (plus ``task_type`` if the batch has that column); ``extra_info`` also gets
``num_turns`` and the agent loop's ``tool_extra_fields`` (except bulky ones: raw_prompt,
(agentic_)response_mask, reward_extra_info, teacher_*, agentic), converted to plain JSON types,
and then the ``task_agent`` episode's own ``extra_info`` (the row's plus what the task added during the
episode: a swedev episode's ``swedev_submission``, so a swedev rollout is scored inside verl).

Result: ``{"reward_score": float, "reward_extra_info": {...}}`` with always the same keys:
``acc`` (the scorer's ``acc`` extra, else its score; 0.0 for a failed sample), ``reward_failed``
(0/1), ``reward_error_type`` (``""`` or one of ``verl_agentic.reward.REWARD_ERROR_TYPES``) and
the episode metrics of ``convert.EPISODE_METRICS`` (turns, task reward, first/final correct, feedback
flips, tool calls and successes, invalid tool calls and whether they ended the episode, episode error; from the ``task_agent`` loop's ``agentic`` extra
field, 0.0 otherwise: verl logs them per data source in validation), and the ``extra_keys``. A failed sample's score follows ``failure_policy``; verl's ``rm_scores``
tensor cannot hold "no score", so ``mask`` (the default) gives 0.0 and relies on
``reward_failed=1`` to tell it apart (it is averaged into verl's validation metrics as the
failure rate; filter on it if you need to drop failed samples).

verl's ``custom_reward_function`` is rejected (``ConfigError`` at construction): our managers
score with registered scorers so that naive, prime and the remote server run the same code.
Register your function instead (``verl_agentic.reward.scorers.register_scorer``, signature
``fn(solution_str, ground_truth, extra_info, **kwargs)``) in a module listed in
``+reward.agentic.scorer_modules``, or keep verl's own ``naive`` manager.

One of our managers is built per process and configuration and shared by every adapter
instance (and closed at exit, or with ``close_shared_managers()``).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import threading
import warnings
import weakref
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.experimental.reward_loop.reward_manager.registry import register

from verl_agentic.interfaces import ConfigError
from verl_agentic.reward.base import RewardConfig, RewardItem, RewardManager, RewardResult
from verl_agentic.verl_plugin.convert import AGENTIC_FIELD, episode_metrics

logger = logging.getLogger(__name__)

ADAPTER_KEYS = ("extra_keys", "batch_window_ms")
FIXED_EXTRA_KEYS = ("acc", "reward_failed", "reward_error_type")
# tool_extra_fields entries not copied into the scorer's extra_info (bulky, or not the scorer's business)
_SKIP_TOOL_FIELDS = frozenset({"raw_prompt", "response_mask", "agentic_response_mask", "reward_extra_info",
                               "teacher_ids", "teacher_logprobs", "agentic"})

__all__ = [
    "AgenticNaiveRewardManager", "AgenticPrimeRewardManager", "AgenticSwedevRewardManager", "AdapterSettings",
    "settings_from_verl_config", "solution_token_ids", "close_shared_managers", "ADAPTER_KEYS", "FIXED_EXTRA_KEYS",
]


# --------------------------------------------------------------------------------------------
# settings


class AdapterSettings:
    """Our ``RewardConfig`` plus the adapter's own keys, read from ``config.reward.agentic``."""

    def __init__(self, reward: RewardConfig, extra_keys: tuple[str, ...] = (), batch_window_ms: float = 0.0):
        self.reward = reward
        self.extra_keys = extra_keys
        self.batch_window_ms = batch_window_ms


def _to_plain(value: Any) -> Any:
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return value


def settings_from_verl_config(config: Any, manager: str) -> AdapterSettings:
    """Parse ``config.reward.agentic`` for our manager ``manager`` (naive | prime | remote | swedev)."""
    reward_section = config.get("reward") if config is not None else None
    raw = _to_plain(reward_section.get("agentic")) if reward_section is not None else None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"reward.agentic must be a mapping of settings, got {type(raw).__name__}: {raw!r}")
    raw = dict(raw)
    given_manager = raw.pop("manager", None)
    if given_manager is not None and given_manager != manager:
        raise ConfigError(
            f"reward.agentic.manager={given_manager!r} contradicts reward.reward_manager.name, which selects our "
            f"{manager!r} manager; drop reward.agentic.manager (the registered name decides)")
    extra_keys = raw.pop("extra_keys", None) or ()
    if isinstance(extra_keys, str) or not all(isinstance(k, str) for k in extra_keys):
        raise ConfigError(f"reward.agentic.extra_keys must be a list of names, got {extra_keys!r}")
    clash = sorted(set(extra_keys) & set(FIXED_EXTRA_KEYS))
    if clash:
        raise ConfigError(f"reward.agentic.extra_keys: {clash} are always emitted; list only other scorer extras")
    window = raw.pop("batch_window_ms", 0.0) or 0.0
    if not isinstance(window, (int, float)) or isinstance(window, bool) or window < 0:
        raise ConfigError(f"reward.agentic.batch_window_ms must be a number >= 0, got {window!r}")
    unknown = set(raw) - set(RewardConfig.__dataclass_fields__)
    if unknown:
        known = sorted(set(RewardConfig.__dataclass_fields__) - {"manager"}) + list(ADAPTER_KEYS)
        raise ConfigError(f"unknown reward.agentic keys {sorted(unknown)}; known: {known}")
    # +agentic.imports (the task_agent loop's modules) may register scorers: imported as scorer modules
    agentic = _to_plain(config.get("agentic")) if config is not None else None
    imports = agentic.get("imports") if isinstance(agentic, dict) else None
    if imports:
        imports = [imports] if isinstance(imports, str) else list(imports)
        raw["scorer_modules"] = list(dict.fromkeys([*(raw.get("scorer_modules") or []), *imports]))
    reward = RewardConfig.from_dict({**raw, "manager": manager})
    if manager in ("remote", "swedev") and not reward.url:
        raise ConfigError(f"our {manager!r} reward manager needs the reward server's address: "
                          "+reward.agentic.url=http://HOST:PORT (start it with `python -m verl_agentic.reward.server`)")
    return AdapterSettings(reward, tuple(extra_keys), float(window))


def _reject_custom_reward_function(config: Any, compute_score: Any) -> None:
    path = None
    try:
        path = ((config.get("reward") or {}).get("custom_reward_function") or {}).get("path")
    except AttributeError:
        pass
    if path:
        raise ConfigError(
            f"reward.custom_reward_function.path={path!r} is set, but verl_agentic's reward managers score with "
            "registered scorers (the same code in naive, prime and the reward server). Register the function with "
            "verl_agentic.reward.scorers.register_scorer (signature fn(solution_str, ground_truth, extra_info, "
            "**kwargs)) in a module listed in +reward.agentic.scorer_modules, or use verl's naive reward manager.")
    if compute_score is None:
        return
    from verl.utils.reward_score import default_compute_score

    fn = compute_score
    while isinstance(fn, functools.partial):  # sandbox_fusion wraps verl's default in a partial
        fn = fn.func
    if fn is not default_compute_score:
        raise ConfigError(
            f"verl_agentic's reward managers do not call a compute_score function (got {compute_score!r}); "
            "register it as a scorer instead (see verl_agentic.verl_plugin.reward)")


# --------------------------------------------------------------------------------------------
# shared managers and per-event-loop batching

_SHARED: dict[str, RewardManager] = {}
_SHARED_LOCK = threading.Lock()


def _shared_manager(cfg: RewardConfig) -> RewardManager:
    key = json.dumps(asdict(cfg), sort_keys=True, default=str)
    with _SHARED_LOCK:
        manager = _SHARED.get(key)
        if manager is None:
            # the plugin is imported by `import verl` in every verl process: the rest loads on first use
            from verl_agentic.reward.base import make_reward_manager

            manager = _SHARED[key] = make_reward_manager(cfg)
        return manager


def close_shared_managers() -> None:
    """Close every manager built by the adapters in this process (prime: stops its pool)."""
    with _SHARED_LOCK:
        managers = list(_SHARED.values())
        _SHARED.clear()
    for m in managers:
        try:
            m.close()
        except Exception as e:  # closing at exit must not raise
            logger.warning("closing reward manager %s failed: %s", type(m).__name__, e)


atexit.register(close_shared_managers)


class _Batcher:
    """Collects the items submitted in one event-loop tick (or window) into one ``ascore_items`` call."""

    def __init__(self, manager: RewardManager, window_s: float, counts: dict):
        self.manager = manager
        self.window_s = window_s
        self.counts = counts  # {"batches", "items"}, shared with the adapter
        self.pending: list[tuple[RewardItem, asyncio.Future]] = []
        self.scheduled = False
        self.tasks: set[asyncio.Task] = set()

    def submit(self, item: RewardItem) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((item, fut))
        if not self.scheduled:
            self.scheduled = True
            if self.window_s > 0:
                loop.call_later(self.window_s, self._flush)
            else:  # runs after every task step already scheduled: the whole gather() of the reward loop
                loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        batch, self.pending, self.scheduled = self.pending, [], False
        batch = [(item, fut) for item, fut in batch if not fut.done()]  # drop cancelled callers
        if batch:
            self.counts["batches"] += 1
            self.counts["items"] += len(batch)
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _run(self, batch: list[tuple[RewardItem, asyncio.Future]]) -> None:
        try:
            results = await self.manager.ascore_items([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{type(self.manager).__name__}.ascore_items returned {len(results)} results "
                                   f"for {len(batch)} items")
        except BaseException as e:  # a manager bug (samples never raise): every caller sees it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for (_, fut), result in zip(batch, results):
            if not fut.done():
                fut.set_result(result)


# --------------------------------------------------------------------------------------------
# turning one verl sample into a RewardItem


def _as_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def solution_token_ids(response_ids: Any, attention_mask: Any, response_mask: Any = None,
                       solution: str = "last_assistant") -> list[list[int]]:
    """The token spans of one sample that are scored (each decoded, then joined with newlines).

    ``response_ids``: the padded response (1-D); ``attention_mask``: the sample's mask (its last
    ``len(response_ids)`` entries cover the response, as verl's naive assumes); ``response_mask``:
    1 for model tokens, 0 for injected ones, or None (then the whole valid response is one span).
    ``last_assistant`` keeps the last contiguous run of ones, ``all_assistant`` every run.
    """
    ids = _as_numpy(response_ids)
    valid = int(_as_numpy(attention_mask)[-ids.shape[-1]:].sum())
    ids = ids[:valid]
    if response_mask is None:
        return [ids.tolist()]
    ones = _as_numpy(response_mask)[:valid] != 0
    edges = np.diff(np.concatenate(([0], ones.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if solution == "last_assistant":
        starts, ends = starts[-1:], ends[-1:]
    return [ids[a:b].tolist() for a, b in zip(starts.tolist(), ends.tolist())]


def _plain_json(value: Any) -> Any:
    """numpy/torch values -> plain Python (lists, numbers), recursively; unknown objects -> repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_json(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic, torch.Tensor)):
        return _plain_json(value.tolist())
    return repr(value)[:1000]


# --------------------------------------------------------------------------------------------
# the adapter


def _agentic_field(non_tensors: dict, tool_fields: dict) -> Any:
    """The ``task_agent`` episode's ``agentic`` dict of one sample, or None: its own non-tensor column
    in a post-rollout batch (verl makes every extra field a column), inside ``tool_extra_fields`` on
    verl's streaming reward path."""
    agentic = non_tensors.get(AGENTIC_FIELD, tool_fields.get(AGENTIC_FIELD))
    return agentic if isinstance(agentic, dict) else None


class _AgenticRewardManager(RewardManagerBase):
    """Base of the registered adapters; ``manager`` names our manager (naive | prime | swedev)."""

    manager = "naive"

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None,
                 reward_model_tokenizer=None, **kwargs: Any):
        super().__init__(config, tokenizer, compute_score)
        _reject_custom_reward_function(config, compute_score)
        self.settings = settings_from_verl_config(config, self.manager)
        self.reward_manager: RewardManager = _shared_manager(self.settings.reward)
        self._batchers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batcher]" = weakref.WeakKeyDictionary()
        self._failures_logged = 0
        self._counts = {"batches": 0, "items": 0}

    # -- sample -> item --------------------------------------------------------------------
    def build_item(self, data: DataProto) -> RewardItem:
        """The RewardItem of the (last) sample of ``data``; raises ValueError naming a missing column."""
        row = len(data) - 1  # multi-sequence outputs: the last one is scored, as in verl's naive
        batch = data.batch
        keys = set(batch.keys())
        for key in ("responses", "attention_mask"):
            if key not in keys:
                raise ValueError(f"reward batch has no {key!r} tensor (has {sorted(keys)})")
        nt = {k: v[row] for k, v in data.non_tensor_batch.items()}
        reward_model = nt.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise ValueError("reward sample needs a non-tensor 'reward_model' dict with 'ground_truth' "
                             f"(got {type(reward_model).__name__}; columns: {sorted(nt)})")
        tool_fields = nt.get("tool_extra_fields")
        tool_fields = tool_fields if isinstance(tool_fields, dict) else {}
        if "response_mask" in keys:
            mask = batch["response_mask"][row]
        else:
            # streaming path: the task_agent loop records the mask as agentic_response_mask (a column
            # named response_mask would collide with verl's tensor in DataProto.to_tensordict)
            mask = tool_fields.get("agentic_response_mask", tool_fields.get("response_mask"))
        spans = solution_token_ids(batch["responses"][row], batch["attention_mask"][row], mask,
                                   self.settings.reward.solution)
        text = "\n".join(self.tokenizer.decode(s, skip_special_tokens=True) for s in spans)

        extra = dict(_plain_json(nt.get("extra_info") or {}))
        extra.update({k: _plain_json(v) for k, v in tool_fields.items() if k not in _SKIP_TOOL_FIELDS})
        # the episode's own extra_info (the row's plus what its task added, e.g. a swedev submission)
        agentic = _agentic_field(nt, tool_fields)
        if agentic is not None and isinstance(agentic.get("extra_info"), dict):
            extra.update(_plain_json(agentic["extra_info"]))
        if nt.get("__num_turns__") is not None:
            extra["num_turns"] = _plain_json(nt["__num_turns__"])
        data_source = nt.get("data_source")
        task_type = nt.get("task_type")
        # a task_agent episode: its task (which may name its scorer) and its own reward (the score when
        # no scorer is registered for it)
        agentic = agentic if isinstance(agentic, dict) else {}
        task_type = task_type if task_type is not None else agentic.get("task_type")
        reward = agentic.get("reward")
        return RewardItem(solution_str=text, ground_truth=_plain_json(reward_model["ground_truth"]),
                          data_source=None if data_source is None else str(data_source),
                          task_type=None if task_type is None else str(task_type), extra_info=extra,
                          scorer=agentic.get("scorer") or None,
                          episode_reward=None if reward is None else float(reward))

    # -- result -> verl ----------------------------------------------------------------------
    def to_verl(self, result: RewardResult, agentic: Any = None) -> dict:
        failed = result.error is not None
        score = 0.0 if result.score is None else float(result.score)
        acc = 0.0
        if not failed:
            value = result.extra.get("acc", score)
            acc = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else score
        info: dict[str, Any] = {"acc": acc, "reward_failed": int(failed),
                                "reward_error_type": result.error.type if failed else ""}
        info.update(episode_metrics(agentic))  # the task_agent episode's turns, flips, tool calls
        for key in self.settings.extra_keys:
            info[key] = result.extra.get(key)
        if failed:
            self._failures_logged += 1
            if self._failures_logged <= 10 or self._failures_logged % 1000 == 0:
                logger.warning("reward failed (%s, #%d in this process): %s -> score %s", result.error.type,
                               self._failures_logged, result.error.message[:300], score)
        return {"reward_score": score, "reward_extra_info": info}

    # -- verl entry point ----------------------------------------------------------------------
    async def run_single(self, data: DataProto) -> dict:
        item = self.build_item(data)
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = _Batcher(self.reward_manager, self.settings.batch_window_ms / 1000.0,
                                                           self._counts)
        result = await batcher.submit(item)
        nt = {k: v[len(data) - 1] for k, v in data.non_tensor_batch.items()}
        tool_fields = nt.get("tool_extra_fields")
        return self.to_verl(result, _agentic_field(nt, tool_fields if isinstance(tool_fields, dict) else {}))

    def stats(self) -> dict:
        """Our manager's counters (items, ok, error/<type>, busy_s; shared by the adapters using it) plus
        this adapter's ``adapter/batches`` and ``adapter/items`` (``ascore_items`` calls and the samples in them)."""
        return {**self.reward_manager.stats(), **{f"adapter/{k}": v for k, v in self._counts.items()}}


def _register(*names: str):
    """verl's ``register`` for each name, except a short name verl (or another plugin) already
    owns: that one is left to its owner with a warning, the ``agentic_*`` name still works, and
    ``import verl`` does not fail."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    def decorator(cls):
        for name in names:
            owner = REWARD_MANAGER.get(name)
            if owner is not None and owner is not cls and not name.startswith("agentic_"):
                warnings.warn(f"verl already has a reward manager named {name!r} ({owner.__module__}."
                              f"{owner.__qualname__}); verl_agentic's is registered as agentic_{cls.manager} only")
                continue
            register(name)(cls)
        return cls
    return decorator


@_register("agentic_naive")
class AgenticNaiveRewardManager(_AgenticRewardManager):
    """verl name ``agentic_naive``: our in-process ``naive`` manager."""

    manager = "naive"


@_register("agentic_prime", "prime")
class AgenticPrimeRewardManager(_AgenticRewardManager):
    """verl names ``prime`` / ``agentic_prime``: our process-pool ``prime`` manager."""

    manager = "prime"


@_register("agentic_remote")
class AgenticRemoteRewardManager(_AgenticRewardManager):
    """verl name ``agentic_remote``: the client of our reward server (needs ``url``); verl owns ``remote``."""

    manager = "remote"


@_register("agentic_swedev", "swedev")
class AgenticSwedevRewardManager(AgenticRemoteRewardManager):
    """verl names ``swedev`` / ``agentic_swedev``: the same client by its first name."""

    manager = "swedev"

